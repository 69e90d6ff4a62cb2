"""A fake ``pynvml`` module: configurable GPUs (MIG, GPM, events, processes) and per-call failures.

Names, constant values and error classes mirror nvidia-ml-py 13.x (a test checks each name exists
in the real binding), so ``NvmlBackend(nvml=FakeNvml(...))`` runs the same code paths as on a GPU.
"""

from __future__ import annotations

import ctypes
import itertools
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from exporter.backends.nvml.functions import NvmlFunctions
from exporter.model import FABRIC_STATES, GpuFabric

# --- constants (values as in nvidia-ml-py) -------------------------------------------------------
NVML_SUCCESS = 0
_ERROR_CODES = {
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "ALREADY_INITIALIZED": 5,
    "NOT_FOUND": 6,
    "INSUFFICIENT_SIZE": 7,
    "INSUFFICIENT_POWER": 8,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "IRQ_ISSUE": 11,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "CORRUPTED_INFOROM": 14,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "OPERATING_SYSTEM": 17,
    "LIB_RM_VERSION_MISMATCH": 18,
    "IN_USE": 19,
    "MEMORY": 20,
    "NO_DATA": 21,
    "INSUFFICIENT_RESOURCES": 23,
    "UNKNOWN": 999,
}

NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_TEMPERATURE_THRESHOLD_MEM_MAX = 2
NVML_TEMPERATURE_THRESHOLD_GPU_MAX = 3
NVML_CLOCK_SM = 1
NVML_NVLINK_DEVICE_TYPE_GPU = 0
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 1
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
NVML_P2P_CAPS_INDEX_NVLINK = 2
NVML_P2P_STATUS_OK = 0
NVML_P2P_STATUS_NOT_SUPPORTED = 5
NVML_CLOCK_MEM = 2
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 38
NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL = 45
NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL = 52
NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 59
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON = 90
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
nvmlMemory_v2 = 0x02000028
nvmlEventTypeXidCriticalError = 0x8
nvmlEventTypeSingleBitEccError = 0x1

nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonApplicationsClocksSetting = 0x2
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonHwSlowdown = 0x8
nvmlClocksEventReasonSyncBoost = 0x10
nvmlClocksEventReasonSwThermalSlowdown = 0x20
nvmlClocksEventReasonHwThermalSlowdown = 0x40
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80
nvmlClocksEventReasonDisplayClockSetting = 0x100

NVML_GPM_METRIC_GRAPHICS_UTIL = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRIC_FP64_UTIL = 11
NVML_GPM_METRIC_FP32_UTIL = 12
NVML_GPM_METRIC_FP16_UTIL = 13
NVML_GPM_METRIC_PCIE_TX_PER_SEC = 20
NVML_GPM_METRIC_PCIE_RX_PER_SEC = 21
NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC = 60
NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC = 61
NVML_GPM_METRIC_MAX = 477
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPU_FABRIC_UUID_LEN = 16
NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_STATE_NOT_STARTED = 1
NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2
NVML_GPU_FABRIC_STATE_COMPLETED = 3
nvmlGpuFabricInfo_v2 = 0x02000024


# --- errors: NVMLError(code) returns the subclass, like the real binding ---------------------------
class NVMLError(Exception):
    """Base NVML error; ``NVMLError(3)`` is an ``NVMLError_NotSupported``."""

    _by_value: dict[int, type[NVMLError]] = {}  # noqa: RUF012 - filled once below
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._by_value.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return type(self).__name__


for _name, _value in _ERROR_CODES.items():
    _class_name = "NVMLError_" + "".join(part.capitalize() for part in _name.split("_"))
    _cls = type(_class_name, (NVMLError,), {})
    NVMLError._by_value[_value] = _cls
    globals()[_class_name] = _cls
    globals()["NVML_ERROR_" + _name] = _value


def code(name: str) -> int:
    """Numeric NVML error code for a name like ``NOT_SUPPORTED``."""
    return _ERROR_CODES[name]


# --- configuration ---------------------------------------------------------------------------------
ZERO_CLUSTER_UUID = "00000000-0000-0000-0000-000000000000"


@dataclass
class FakeFabric:
    """What ``nvmlDeviceGetGpuFabricInfo(V)`` fills in for a GPU that NVML knows a fabric for:
    raw NVML values (the state constant, the status return code), the cluster UUID as text."""

    state: int = NVML_GPU_FABRIC_STATE_COMPLETED
    cluster_uuid: str = ZERO_CLUSTER_UUID
    clique_id: int = 0
    status: int = NVML_SUCCESS
    """An NVML return code: ``NVML_SUCCESS``, or why the registration failed (``code("IN_USE")``)."""
    health_mask: int = 0
    """``NVML_GPU_FABRIC_HEALTH_MASK_*`` bits (v2 struct only); 0: every health field not supported."""

    @classmethod
    def of(cls, fabric: GpuFabric) -> FakeFabric:
        """What the driver would fill in for a GPU whose sample says ``fabric`` (the inverse of the
        backend's decoding: state label -> constant, status name -> return code)."""
        status = NVML_SUCCESS if fabric.status == "success" else code(fabric.status.upper())
        return cls(FABRIC_STATES.index(fabric.state), fabric.cluster_uuid, fabric.clique_id, status)


@dataclass
class FakeProcess:
    pid: int
    used_memory: int | None = 1 << 30
    gpu_instance_id: int = 0xFFFFFFFF
    compute_instance_id: int = 0xFFFFFFFF
    name: str = "python3"
    """What ``nvmlSystemGetProcessName`` answers (the MPS server: ``nvidia-cuda-mps-server``)."""
    mps_client: bool = False
    """Listed by ``nvmlDeviceGetMPSComputeRunningProcesses`` too."""


@dataclass
class FakeMig:
    """A MIG device: ``gpm`` maps NVML GPM metric id -> percent for its windows."""

    uuid: str
    gpu_instance_id: int
    compute_instance_id: int = 0
    name: str = "NVIDIA H200 MIG 1g.18gb"
    """The MIG device's name; older drivers leave the profile out of it."""
    profile_id: int = 0
    """NVML GPU instance profile id of its GPU instance (``nvmlGpuInstanceGetInfo``)."""
    profile_name: str = "MIG 1g.18gb"
    profile_slices: int = 1
    profile_memory_mib: int = 16_384
    memory_used: int = 1 << 30
    memory_total: int = 18 << 30
    processes: list[FakeProcess] = field(default_factory=list)
    gpm: dict[int, float] = field(default_factory=dict)


@dataclass
class FakeGpu:
    """One physical GPU as NVML would report it; ``None`` values answer NotSupported."""

    uuid: str
    name: str = "NVIDIA H200"
    pci_bus_id: str = "00000000:18:00.0"
    compute_capability: tuple[int, int] = (9, 0)
    memory_total: int = 150_754_820_096
    memory_used: int = 4 << 20
    memory_reserved: int = 0
    """Driver-reserved memory, reported only by the v2 memory info (v1's ``used`` includes it)."""
    util_gpu: int = 0
    util_memory: int = 0
    power_mw: int | None = 75_000
    power_limit_mw: int | None = 700_000
    energy_mj: int | None = 1_000_000
    temperature: int | None = 30
    memory_temperature: int | None = 40
    temperature_thresholds: dict[str, int | None] = field(
        default_factory=lambda: {"slowdown": 89, "shutdown": 95, "gpu_max": 87, "memory_max": 95}
    )
    """``nvmlDeviceGetTemperatureThreshold`` by kind (an H200 on driver 580, docs/gpu-validation.md);
    a kind absent or ``None`` answers NOT_SUPPORTED."""
    fan: int | None = None
    sm_clock_mhz: int = 345
    memory_clock_mhz: int = 3201
    max_sm_clock_mhz: int = 1980
    clock_reasons: int = 0x1
    supported_clock_reasons: int = 0x1FF
    pcie_tx_kib: int | None = 1000
    pcie_rx_kib: int | None = 2000
    pcie_gen: int = 5
    pcie_width: int = 16
    pcie_max_gen: int | None = 5
    pcie_max_width: int | None = 16
    """The most the link trains to (``nvmlDeviceGetMaxPcieLinkGeneration/Width``); ``None``: NOT_SUPPORTED."""
    pcie_speed_mbps: int | None = 32000
    """Lane rate nvmlDeviceGetPcieSpeed answers (32000 on the H200's Gen5 link)."""
    pcie_tx_bytes: int | None = None
    pcie_rx_bytes: int | None = None
    """Cumulative PCIe byte counters (field values 197/198); ``None`` answers NOT_SUPPORTED."""
    pcie_counter_bits: int = 32
    """Width of those counters: 32 on the H200 (driver 580), where they wrap every 68 ms at line rate."""
    pcie_replay: int | None = 0
    ecc: tuple[int, int] | None = (0, 0)
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    compute_mode: int = 0
    mig_mode: int | None = 0
    nvlink: bool = False
    nvlink_links: int = 18
    """NVLinks when ``nvlink`` is set (a state past the last answers INVALID_ARGUMENT)."""
    nvlink_inactive: frozenset[int] = frozenset()
    """Links among those that are down (state 0, ``<inactive>`` in ``nvidia-smi nvlink -s``)."""
    nvlink_remote: int | None = 2
    """What every active link reaches (``NVML_NVLINK_DEVICE_TYPE_*``: 2 an NVSwitch); ``None``
    answers NOT_SUPPORTED."""
    nvlink_remote_bus: dict[int, str] = field(default_factory=dict)
    """The far end's PCI bus ID by link (a direct link's peer GPU); others answer an NVSwitch's."""
    nvlink_p2p: bool = True
    """Whether NVML lets this GPU do peer-to-peer over NVLink (a pair is OK when both may)."""
    nvlink_speed_mbps: int | None = 26562
    nvlink_tx_kib: list[int] | None = None
    nvlink_rx_kib: list[int] | None = None
    """Cumulative per-link NVLink KiB counters (fields 138/139 by link); ``None`` answers NOT_SUPPORTED."""
    nvlink_counter_bits: int = 64
    nvlink_errors: dict[str, int | None] = field(
        default_factory=lambda: {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0}
    )
    """NVLink error totals over the links by kind (fields 52, 59, 38, 45), answered only when
    ``nvlink`` is set; a kind absent or ``None`` answers NOT_SUPPORTED."""
    gpm_supported: bool = True
    gpm: dict[int, float] = field(default_factory=dict)
    processes: list[FakeProcess] = field(default_factory=list)
    process_util: list[tuple[int, int, int]] = field(default_factory=list)
    """(pid, smUtil %, memUtil %) samples; empty answers NotFound like NVML."""
    xid_queue: deque[int] = field(default_factory=deque)
    migs: list[FakeMig] = field(default_factory=list)
    max_mig_devices: int = 7
    lost: bool = False
    fabric: FakeFabric | None = field(default_factory=lambda: FakeFabric(NVML_GPU_FABRIC_STATE_NOT_SUPPORTED))
    """What the fabric info calls fill in. By default what an H200 outside any NVLink fabric answers
    on driver 580: SUCCESS, state NOT_SUPPORTED, an all-zero cluster UUID and clique 0
    (tests/fixtures/nvml_fabric/h200.json); ``None`` raises NOT_SUPPORTED instead, as other GPUs or
    drivers may."""
    answers: dict[str, Any] = field(default_factory=dict)
    """Raw answers of plain device getters the backend declares and the fake has no method for
    (``nvmlDeviceGetX(handle)`` -> value); one absent here answers NOT_SUPPORTED, as a GPU without
    the feature does."""


@dataclass
class FakeHandle:
    gpu: FakeGpu
    generation: int
    mig: FakeMig | None = None


@dataclass
class FakeGpmSample:
    values: dict[int, float] = field(default_factory=dict)
    filled: bool = False
    freed: bool = False


@dataclass
class FakeEventSet:
    handles: list[FakeHandle] = field(default_factory=list)
    freed: bool = False


class _Metric:
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = NVML_SUCCESS
        self.value = 0.0


class _MetricArray(dict[int, _Metric]):
    """The struct's ``metrics[NVML_GPM_METRIC_MAX]`` array; entries are made on first use, so a
    request costs what the few metrics asked cost (a ctypes struct is one allocation)."""

    def __missing__(self, slot: int) -> _Metric:
        if not 0 <= slot < NVML_GPM_METRIC_MAX:
            raise IndexError(slot)
        metric = self[slot] = _Metric()
        return metric


class _GpmMetricsGet:
    """Mirror of the ctypes struct: version, numMetrics, sample1, sample2, metrics[]."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = _MetricArray()


c_nvmlGpmMetricsGet_t = _GpmMetricsGet


class c_nvmlGpuFabricInfo_t(ctypes.Structure):
    """The older fabric info struct (``nvmlDeviceGetGpuFabricInfo``), laid out as nvidia-ml-py's."""

    _fields_ = (
        ("clusterUuid", ctypes.c_uint8 * NVML_GPU_FABRIC_UUID_LEN),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
    )


class c_nvmlGpuFabricInfo_v2_t(ctypes.Structure):
    """The versioned fabric info struct (``nvmlDeviceGetGpuFabricInfoV``); its constructor sets
    the version, as nvidia-ml-py's does."""

    _fields_ = (
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_uint8 * NVML_GPU_FABRIC_UUID_LEN),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
        ("healthMask", ctypes.c_uint32),
    )

    def __init__(self) -> None:
        super().__init__(version=nvmlGpuFabricInfo_v2)


_BY_REFERENCE = type(ctypes.byref(ctypes.c_int()))
"""What ``ctypes.byref`` returns: nvidia-ml-py's fabric calls hand their argument to C as is, so
the caller must pass the struct this way."""


def _referenced(ref: Any, struct: type[ctypes.Structure]) -> Any:
    """The ``struct`` instance ``ref`` (a ``ctypes.byref``) points at; a struct passed by value, or
    one of another type, is a caller's bug the real binding would not survive."""
    assert isinstance(ref, _BY_REFERENCE), f"pass ctypes.byref({struct.__name__}()), not {type(ref).__name__}"
    target = ref._obj  # type: ignore[attr-defined]  # the referenced object, undeclared in typeshed
    assert isinstance(target, struct), f"expected a {struct.__name__}, got {type(target).__name__}"
    return target


_THRESHOLD_KINDS = {
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: "slowdown",
    NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "shutdown",
    NVML_TEMPERATURE_THRESHOLD_GPU_MAX: "gpu_max",
    NVML_TEMPERATURE_THRESHOLD_MEM_MAX: "memory_max",
}
_NVLINK_ERROR_FIELDS = {
    NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: "replay",
    NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: "recovery",
    NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: "crc_flit",
    NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: "crc_data",
}


class FakeNvml:
    """Stand-in for the ``pynvml`` module; pass as ``NvmlBackend(nvml=fake)``.

    ``calls`` counts calls by function name. ``fail(name, code, times, gpu)`` queues failures;
    ``remove(name)`` makes a function missing from the binding; ``reload_driver()`` invalidates
    every handle (calls answer Uninitialized until ``nvmlInit`` runs again).
    """

    NVMLError = NVMLError
    c_nvmlGpmMetricsGet_t = _GpmMetricsGet
    c_nvmlGpuFabricInfo_t = c_nvmlGpuFabricInfo_t
    c_nvmlGpuFabricInfo_v2_t = c_nvmlGpuFabricInfo_v2_t

    def __init__(self, gpus: list[FakeGpu], driver_version: str = "580.159.04") -> None:
        self.gpus = gpus
        self.driver_version = driver_version
        self.calls: Counter[str] = Counter()
        self.init_error: int | None = None
        self.initialized = False
        self.generation = 0
        self.process_util_timestamps: list[int] = []
        self.gpm_samples: list[FakeGpmSample] = []
        self.event_sets: list[FakeEventSet] = []
        self._failures: dict[tuple[str, str | None], deque[int]] = {}
        self._forever: dict[tuple[str, str | None], int] = {}
        self._ids = itertools.count()

    def __getattr__(self, name: str) -> Any:
        # Constants and error classes live at module level, as in pynvml.
        if name.startswith(("NVML", "nvml")) and name in globals():
            return globals()[name]
        if name.startswith("nvmlDeviceGet") and name in NvmlFunctions.names():
            return self._plain_getter(name)
        raise AttributeError(name)

    def _plain_getter(self, name: str) -> Any:
        """``nvmlDeviceGetX(handle)`` answered from ``FakeGpu.answers``, for a getter the backend
        declares (exporter/backends/nvml/functions.py) and the fake has no method for: a new NVML
        read needs no new method here, only its answer where a test wants one.  A name the backend
        does not declare (a misspelling) stays absent, as from the real binding."""

        def getter(h: FakeHandle) -> Any:
            self._enter(name, h)
            return self._value(h.gpu.answers.get(name))

        return getter

    def __dir__(self) -> list[str]:
        names = set(super().__dir__())
        names.update(n for n in globals() if n.startswith(("NVML", "nvml")))
        return sorted(names)

    # -- test controls ---------------------------------------------------------------------------
    def fail(self, name: str, error: str, times: int = 1, gpu: str | None = None) -> None:
        """Make the next ``times`` calls of ``name`` (for GPU uuid ``gpu``, or any) raise ``error``."""
        self._failures.setdefault((name, gpu), deque()).extend([code(error)] * times)

    def fail_always(self, name: str, error: str, gpu: str | None = None) -> None:
        self._forever[(name, gpu)] = code(error)

    def clear_failures(self) -> None:
        self._failures.clear()
        self._forever.clear()

    def remove(self, name: str) -> None:
        """Make ``name`` absent from the binding (older nvidia-ml-py)."""
        object.__setattr__(self, name, None)

    def reload_driver(self) -> None:
        """Driver reload / GPU reset: old handles become stale and NVML must be initialised again."""
        self.initialized = False
        self.generation += 1

    # -- plumbing --------------------------------------------------------------------------------
    def _enter(
        self, name: str, handle: FakeHandle | None = None, *, needs_init: bool = True, uuid: str | None = None
    ) -> None:
        self.calls[name] += 1
        uuid = handle.gpu.uuid if handle is not None else uuid
        for key in ((name, uuid), (name, None)):
            queue = self._failures.get(key)
            if queue:
                raise NVMLError(queue.popleft())
            if key in self._forever:
                raise NVMLError(self._forever[key])
        if needs_init and not self.initialized:
            raise NVMLError(code("UNINITIALIZED"))
        if handle is not None:
            if handle.generation != self.generation:
                raise NVMLError(code("UNINITIALIZED"))
            if handle.gpu.lost:
                raise NVMLError(code("GPU_IS_LOST"))

    @staticmethod
    def _value(value: Any) -> Any:
        if value is None:
            raise NVMLError(code("NOT_SUPPORTED"))
        return value

    # -- library ---------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._enter("nvmlInit", needs_init=False)
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        gpu = self.gpus[index]
        self._enter("nvmlDeviceGetHandleByIndex", uuid=gpu.uuid)
        return FakeHandle(gpu, self.generation)

    # -- identity --------------------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, h: FakeHandle) -> str:
        self._enter("nvmlDeviceGetUUID", h)
        return h.mig.uuid if h.mig else h.gpu.uuid

    def nvmlDeviceGetName(self, h: FakeHandle) -> str:
        self._enter("nvmlDeviceGetName", h)
        return h.mig.name if h.mig else h.gpu.name

    def nvmlDeviceGetPciInfo(self, h: FakeHandle) -> Any:
        self._enter("nvmlDeviceGetPciInfo", h)
        return SimpleNamespace(busId=h.gpu.pci_bus_id.encode())  # a c_char array reads as bytes

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeHandle) -> tuple[int, int]:
        self._enter("nvmlDeviceGetCudaComputeCapability", h)
        return h.gpu.compute_capability

    def nvmlDeviceGetMaxClockInfo(self, h: FakeHandle, clock: int) -> int:
        self._enter("nvmlDeviceGetMaxClockInfo", h)
        return h.gpu.max_sm_clock_mhz

    def nvmlDeviceGetSupportedClocksEventReasons(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetSupportedClocksEventReasons", h)
        return h.gpu.supported_clock_reasons

    def nvmlDeviceGetSupportedClocksThrottleReasons(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetSupportedClocksThrottleReasons", h)
        return h.gpu.supported_clock_reasons

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetMaxPcieLinkGeneration", h)
        return self._value(h.gpu.pcie_max_gen)

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetMaxPcieLinkWidth", h)
        return self._value(h.gpu.pcie_max_width)

    def nvmlDeviceGetTemperatureThreshold(self, h: FakeHandle, threshold: int) -> int:
        self._enter("nvmlDeviceGetTemperatureThreshold", h)
        return self._value(h.gpu.temperature_thresholds.get(_THRESHOLD_KINDS.get(threshold, "")))

    @staticmethod
    def _nvlink(h: FakeHandle, link: int) -> None:
        """NOT_SUPPORTED on a GPU without NVLink, INVALID_ARGUMENT past its last link."""
        if not h.gpu.nvlink:
            raise NVMLError(code("NOT_SUPPORTED"))
        if link >= h.gpu.nvlink_links:
            raise NVMLError(code("INVALID_ARGUMENT"))

    def nvmlDeviceGetNvLinkState(self, h: FakeHandle, link: int) -> int:
        self._enter("nvmlDeviceGetNvLinkState", h)
        self._nvlink(h, link)
        return 0 if link in h.gpu.nvlink_inactive else 1

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: FakeHandle, link: int) -> int:
        self._enter("nvmlDeviceGetNvLinkRemoteDeviceType", h)
        self._nvlink(h, link)
        return self._value(h.gpu.nvlink_remote)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: FakeHandle, link: int) -> Any:
        self._enter("nvmlDeviceGetNvLinkRemotePciInfo", h)
        self._nvlink(h, link)
        return SimpleNamespace(busId=h.gpu.nvlink_remote_bus.get(link, f"00000000:{0xC0 + link % 4:02x}:00.0").encode())

    def nvmlDeviceGetP2PStatus(self, a: FakeHandle, b: FakeHandle, index: int) -> int:
        self._enter("nvmlDeviceGetP2PStatus", a)
        if index != NVML_P2P_CAPS_INDEX_NVLINK:
            raise NVMLError(code("INVALID_ARGUMENT"))
        return NVML_P2P_STATUS_OK if a.gpu.nvlink_p2p and b.gpu.nvlink_p2p else NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlDeviceGetMigMode(self, h: FakeHandle) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", h)
        mode = self._value(h.gpu.mig_mode)
        return [mode, mode]

    def nvmlDeviceGetComputeMode(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetComputeMode", h)
        return h.gpu.compute_mode

    # -- telemetry -------------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, h: FakeHandle) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=h.gpu.util_gpu, memory=h.gpu.util_memory)

    def nvmlDeviceGetMemoryInfo(self, h: FakeHandle, version: int | None = None) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo", h)
        reserved = 0
        if h.mig is not None:
            used, total = h.mig.memory_used, h.mig.memory_total
        else:
            used, total, reserved = h.gpu.memory_used, h.gpu.memory_total, h.gpu.memory_reserved
        if version is None:  # v1: no reserved field, and used includes the reserved memory
            return SimpleNamespace(total=total, used=used + reserved, free=total - used - reserved)
        return SimpleNamespace(version=version, total=total, used=used, free=total - used - reserved, reserved=reserved)

    def nvmlDeviceGetPowerUsage(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetPowerUsage", h)
        return self._value(h.gpu.power_mw)

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetEnforcedPowerLimit", h)
        return self._value(h.gpu.power_limit_mw)

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetTotalEnergyConsumption", h)
        return self._value(h.gpu.energy_mj)

    def nvmlDeviceGetTemperature(self, h: FakeHandle, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", h)
        return self._value(h.gpu.temperature)

    def nvmlDeviceGetFieldValues(self, h: FakeHandle, field_ids: list[Any]) -> list[Any]:
        """Field values by (field id, scope id) or bare field id, as nvidia-ml-py takes them."""
        self._enter("nvmlDeviceGetFieldValues", h)
        out = []
        for requested in field_ids:
            field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
            value, value_type = self._field(h.gpu, field_id, scope)
            member = {
                NVML_VALUE_TYPE_SIGNED_INT: "siVal",
                NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
                NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
            }[value_type]
            out.append(
                SimpleNamespace(
                    fieldId=field_id,
                    scopeId=scope,
                    valueType=value_type,
                    nvmlReturn=NVML_SUCCESS if value is not None else code("NOT_SUPPORTED"),
                    value=SimpleNamespace(**{member: value or 0}),
                )
            )
        return out

    @staticmethod
    def _field(gpu: FakeGpu, field_id: int, scope: int) -> tuple[int | None, int]:
        """(value or None for NOT_SUPPORTED, NVML value type) of one field on the fake GPU."""
        if field_id == NVML_FI_DEV_MEMORY_TEMP:
            return gpu.memory_temperature, NVML_VALUE_TYPE_SIGNED_INT
        if field_id in (NVML_FI_DEV_PCIE_COUNT_TX_BYTES, NVML_FI_DEV_PCIE_COUNT_RX_BYTES):
            raw = gpu.pcie_tx_bytes if field_id == NVML_FI_DEV_PCIE_COUNT_TX_BYTES else gpu.pcie_rx_bytes
            wide = gpu.pcie_counter_bits == 64
            kind = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG if wide else NVML_VALUE_TYPE_UNSIGNED_INT
            return (None if raw is None else raw % (1 << gpu.pcie_counter_bits)), kind
        if field_id in _NVLINK_ERROR_FIELDS:
            count = gpu.nvlink_errors.get(_NVLINK_ERROR_FIELDS[field_id]) if gpu.nvlink else None
            return count, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        if field_id == NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON:
            return (gpu.nvlink_speed_mbps if gpu.nvlink else None), NVML_VALUE_TYPE_UNSIGNED_INT
        if field_id in (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
            per_link = gpu.nvlink_tx_kib if field_id == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else gpu.nvlink_rx_kib
            wide = gpu.nvlink_counter_bits == 64
            kind = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG if wide else NVML_VALUE_TYPE_UNSIGNED_INT
            if not gpu.nvlink or per_link is None or not 0 <= scope < len(per_link):
                return None, kind
            return per_link[scope] % (1 << gpu.nvlink_counter_bits), kind
        return None, NVML_VALUE_TYPE_SIGNED_INT

    def nvmlDeviceGetFanSpeed(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetFanSpeed", h)
        return self._value(h.gpu.fan)

    def nvmlDeviceGetClockInfo(self, h: FakeHandle, clock: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", h)
        return h.gpu.sm_clock_mhz if clock == NVML_CLOCK_SM else h.gpu.memory_clock_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", h)
        return h.gpu.clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return h.gpu.clock_reasons

    def nvmlDeviceGetPcieThroughput(self, h: FakeHandle, counter: int) -> int:
        self._enter("nvmlDeviceGetPcieThroughput", h)
        return self._value(h.gpu.pcie_tx_kib if counter == NVML_PCIE_UTIL_TX_BYTES else h.gpu.pcie_rx_kib)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetCurrPcieLinkGeneration", h)
        return h.gpu.pcie_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetCurrPcieLinkWidth", h)
        return h.gpu.pcie_width

    def nvmlDeviceGetPcieSpeed(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetPcieSpeed", h)
        return self._value(h.gpu.pcie_speed_mbps)

    def nvmlDeviceGetPcieReplayCounter(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetPcieReplayCounter", h)
        return self._value(h.gpu.pcie_replay)

    def nvmlDeviceGetTotalEccErrors(self, h: FakeHandle, error_type: int, counter_type: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors", h)
        return self._value(h.gpu.ecc)[error_type]

    def nvmlDeviceGetRemappedRows(self, h: FakeHandle) -> tuple[int, int, int, int]:
        self._enter("nvmlDeviceGetRemappedRows", h)
        return self._value(h.gpu.remapped_rows)

    def nvmlDeviceGetGpuFabricInfoV(self, h: FakeHandle, ref: Any) -> int:
        """Fills the v2 struct ``ref`` points at; NOT_SUPPORTED where the GPU has no fabric."""
        self._enter("nvmlDeviceGetGpuFabricInfoV", h)
        info = _referenced(ref, c_nvmlGpuFabricInfo_v2_t)
        assert info.version == nvmlGpuFabricInfo_v2, hex(info.version)
        fabric = self._value(h.gpu.fabric)
        self._fill_fabric(info, fabric)
        info.healthMask = fabric.health_mask
        return NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfo(self, h: FakeHandle, ref: Any) -> int:
        """The older call: the same fields without a version or health mask."""
        self._enter("nvmlDeviceGetGpuFabricInfo", h)
        self._fill_fabric(_referenced(ref, c_nvmlGpuFabricInfo_t), self._value(h.gpu.fabric))
        return NVML_SUCCESS

    @staticmethod
    def _fill_fabric(info: Any, fabric: FakeFabric) -> None:
        info.clusterUuid[:] = list(uuid.UUID(fabric.cluster_uuid).bytes)
        info.status = fabric.status
        info.cliqueId = fabric.clique_id
        info.state = fabric.state

    # -- events ----------------------------------------------------------------------------------
    def nvmlDeviceGetSupportedEventTypes(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetSupportedEventTypes", h)
        return nvmlEventTypeXidCriticalError | nvmlEventTypeSingleBitEccError

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._enter("nvmlEventSetCreate")
        event_set = FakeEventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, h: FakeHandle, types: int, event_set: FakeEventSet) -> None:
        self._enter("nvmlDeviceRegisterEvents", h)
        event_set.handles.append(h)

    def nvmlEventSetWait(self, event_set: FakeEventSet, timeout_ms: int) -> Any:
        self._enter("nvmlEventSetWait")
        for h in event_set.handles:
            if h.gpu.xid_queue:
                xid = h.gpu.xid_queue.popleft()
                return SimpleNamespace(
                    device=h, eventType=nvmlEventTypeXidCriticalError, eventData=xid, gpuInstanceId=0
                )
        raise NVMLError(code("TIMEOUT"))

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        self._enter("nvmlEventSetFree")
        event_set.freed = True

    # -- processes -------------------------------------------------------------------------------
    @staticmethod
    def _process_infos(h: FakeHandle, mps_only: bool = False) -> list[Any]:
        procs = h.mig.processes if h.mig is not None else h.gpu.processes
        return [
            SimpleNamespace(
                pid=p.pid,
                usedGpuMemory=p.used_memory,
                gpuInstanceId=p.gpu_instance_id,
                computeInstanceId=p.compute_instance_id,
            )
            for p in procs
            if p.mps_client or not mps_only
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeHandle) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", h)
        return self._process_infos(h)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, h: FakeHandle) -> list[Any]:
        self._enter("nvmlDeviceGetMPSComputeRunningProcesses", h)
        return self._process_infos(h, mps_only=True)

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._enter("nvmlSystemGetProcessName")
        for g in self.gpus:
            for p in [*g.processes, *(q for m in g.migs for q in m.processes)]:
                if p.pid == pid:
                    return p.name
        raise NVMLError(code("NOT_FOUND"))

    def nvmlDeviceGetProcessUtilization(self, h: FakeHandle, timestamp: int) -> list[Any]:
        self._enter("nvmlDeviceGetProcessUtilization", h)
        self.process_util_timestamps.append(timestamp)
        if not h.gpu.process_util:
            raise NVMLError(code("NOT_FOUND"))
        return [
            SimpleNamespace(pid=pid, timeStamp=timestamp + 1, smUtil=sm, memUtil=mem, encUtil=0, decUtil=0)
            for pid, sm, mem in h.gpu.process_util
        ]

    # -- MIG -------------------------------------------------------------------------------------
    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", h)
        return h.gpu.max_mig_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeHandle, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if index >= len(h.gpu.migs):
            raise NVMLError(code("NOT_FOUND"))
        return FakeHandle(h.gpu, self.generation, h.gpu.migs[index])

    def nvmlDeviceGetGpuInstanceId(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId", h)
        if h.mig is None:
            raise NVMLError(code("INVALID_ARGUMENT"))
        return h.mig.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetComputeInstanceId", h)
        if h.mig is None:
            raise NVMLError(code("INVALID_ARGUMENT"))
        return h.mig.compute_instance_id

    def nvmlDeviceGetGpuInstanceById(self, h: FakeHandle, gpu_instance_id: int) -> FakeHandle:
        """A GPU instance, modelled as a handle on its first MIG device."""
        self._enter("nvmlDeviceGetGpuInstanceById", h)
        for mig in h.gpu.migs:
            if mig.gpu_instance_id == gpu_instance_id:
                return FakeHandle(h.gpu, self.generation, mig)
        raise NVMLError(code("NOT_FOUND"))

    def nvmlGpuInstanceGetInfo(self, instance: FakeHandle) -> Any:
        self._enter("nvmlGpuInstanceGetInfo", instance)
        assert instance.mig is not None
        return SimpleNamespace(device=instance, id=instance.mig.gpu_instance_id, profileId=instance.mig.profile_id)

    def nvmlDeviceGetGpuInstanceProfileInfoById(self, h: FakeHandle, profile_id: int) -> Any:
        self._enter("nvmlDeviceGetGpuInstanceProfileInfoById", h)
        for mig in h.gpu.migs:
            if mig.profile_id == profile_id:
                return SimpleNamespace(
                    id=profile_id,
                    sliceCount=mig.profile_slices,
                    memorySizeMB=mig.profile_memory_mib,
                    name=mig.profile_name.encode(),  # a c_char array reads as bytes
                )
        raise NVMLError(code("INVALID_ARGUMENT"))

    # -- GPM -------------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, h: FakeHandle) -> Any:
        self._enter("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(version=1, isSupportedDevice=int(h.gpu.gpm_supported))

    def nvmlGpmSampleAlloc(self) -> FakeGpmSample:
        self._enter("nvmlGpmSampleAlloc")
        sample = FakeGpmSample()
        self.gpm_samples.append(sample)
        return sample

    def nvmlGpmSampleFree(self, sample: FakeGpmSample) -> None:
        self._enter("nvmlGpmSampleFree")
        sample.freed = True

    def nvmlGpmSampleGet(self, h: FakeHandle, sample: FakeGpmSample) -> FakeGpmSample:
        self._enter("nvmlGpmSampleGet", h)
        assert not sample.freed, "GPM sample used after free"
        sample.values, sample.filled = dict(h.gpu.gpm), True
        return sample

    def nvmlGpmMigSampleGet(self, h: FakeHandle, gpu_instance_id: int, sample: FakeGpmSample) -> FakeGpmSample:
        self._enter("nvmlGpmMigSampleGet", h)
        assert not sample.freed, "GPM sample used after free"
        for mig in h.gpu.migs:
            if mig.gpu_instance_id == gpu_instance_id:
                sample.values, sample.filled = dict(mig.gpm), True
                return sample
        raise NVMLError(code("NOT_FOUND"))

    def nvmlGpmMetricsGet(self, request: _GpmMetricsGet) -> _GpmMetricsGet:
        """The window's value is what the second sample's leaf was configured with."""
        self._enter("nvmlGpmMetricsGet")
        assert request.version == NVML_GPM_METRICS_GET_VERSION
        assert request.sample1.filled and request.sample2.filled
        assert request.sample1 is not request.sample2
        for metric in (request.metrics[slot] for slot in range(request.numMetrics)):
            if metric.metricId in request.sample2.values:
                metric.value = request.sample2.values[metric.metricId]
                metric.nvmlReturn = NVML_SUCCESS
            else:
                metric.nvmlReturn = code("NOT_SUPPORTED")
        return request
