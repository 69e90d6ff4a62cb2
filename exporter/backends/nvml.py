"""NVML backend: reads every physical GPU and leaf (whole GPU or MIG instance) through NVML.

The only module that imports ``pynvml`` (nvidia-ml-py), lazily, so the exporter runs without it.
Every call goes through :class:`NvmlQuery`, which turns NVML errors into ``None`` fields, lost
GPUs and re-initialisation; see ``docs/gpu-validation.md`` for what an H200 answers.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from exporter.backends.nvml_gpm import GpmReading, GpmTracker
from exporter.backends.nvml_query import GpuLost, NeedsReinit, NvmlQuery
from exporter.model import (
    MPS_CLIENT,
    MPS_SERVER,
    BackendSample,
    GpuSample,
    LeafSample,
    MigInstance,
    ProcessSample,
)

_log = logging.getLogger(__name__)

#: Clock event (throttle) reason bits, by the binding's constant name -> our reason label.
CLOCK_EVENT_REASONS: dict[str, str] = {
    "nvmlClocksEventReasonGpuIdle": "gpu_idle",
    "nvmlClocksEventReasonApplicationsClocksSetting": "applications_clocks_setting",
    "nvmlClocksEventReasonSwPowerCap": "sw_power_cap",
    "nvmlClocksEventReasonHwSlowdown": "hw_slowdown",
    "nvmlClocksEventReasonSyncBoost": "sync_boost",
    "nvmlClocksEventReasonSwThermalSlowdown": "sw_thermal_slowdown",
    "nvmlClocksEventReasonHwThermalSlowdown": "hw_thermal_slowdown",
    "nvmlClocksEventReasonHwPowerBrakeSlowdown": "hw_power_brake_slowdown",
    "nvmlClocksEventReasonDisplayClockSetting": "display_clock_setting",
}
_COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
_MHZ = 1e6
_KIB = 1024  # NVML's PCIe throughput unit "KB/s" is KiB/s
_NOT_AVAILABLE_U32 = 0xFFFFFFFF
_MIG_PROFILE = re.compile(r"(?:\d+c\.)?\d+g\.\d+gb")
MPS_SERVER_PROCESS = "nvidia-cuda-mps-server"
"""Executable name of the MPS server (the control daemon starts one per GPU set and user)."""
_BACKOFF_FIRST_SECONDS = 1.0
_BACKOFF_MAX_SECONDS = 60.0
_MAX_EVENTS_PER_CYCLE = 1024

#: Plausible ranges; anything outside is a sentinel or a glitch, dropped and counted.
_MAX_POWER_WATTS = 5_000.0
_MAX_TEMPERATURE_CELSIUS = 200.0


@dataclass
class _Leaf:
    """Identity of one MIG device found this cycle."""

    handle: Any
    mig: MigInstance


@dataclass
class _Gpu:
    """Per-GPU state cached between cycles; rebuilt after every (re-)initialisation."""

    index: int
    handle: Any
    uuid: str
    name: str | None = None
    pci_bus_id: str | None = None
    compute_capability: str | None = None
    sm_clock_max_hertz: float | None = None
    clock_reason_mask: int | None = None
    event_set: Any = None
    gpm_capable: bool = False
    has_nvlink: bool = False
    max_mig_devices: int | None = None
    identity_read: bool = False
    pcie: tuple[float | None, float | None] = (None, None)
    energy_mj: float | None = None
    process_util_since_us: int | None = None
    mig_profiles: dict[str, str] = field(default_factory=dict)


class NvmlBackend:
    """GpuBackend over NVML (``pynvml``), safe against missing drivers and failing GPUs.

    ``nvml`` is the binding module (default: ``pynvml``, imported on first use); tests inject a
    fake. ``clock`` (monotonic seconds) paces init retries and GPM windows; ``wall_clock`` (Unix
    seconds) supplies the timestamps NVML's per-process utilisation expects.

    PCIe throughput costs ~21 ms per direction per call on an H200 (NVML samples a window), so it
    is read every ``pcie_every`` cycles per GPU, staggered by index so the GPUs of a node do not
    all pay in the same cycle; cycles in between repeat the last value.  Total energy (~4.7 ms
    per call there, the largest per-cycle cost) is a counter, so it is read every
    ``energy_every`` cycles the same way: ``rate()`` over any window longer than that is unchanged.
    """

    name = "nvml"

    def __init__(
        self,
        nvml: Any = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        pcie_every: int = 10,
        energy_every: int = 5,
        close_timeout: float = 5.0,
    ) -> None:
        self._nvml = nvml
        self._clock = clock
        self._wall_clock = wall_clock
        self._pcie_every = max(1, pcie_every)
        self._energy_every = max(1, energy_every)
        self._close_timeout = close_timeout
        self._lock = threading.Lock()
        self._q: NvmlQuery | None = None
        self._gpm: GpmTracker | None = None
        self._initialized = False
        self._closed = False
        self._next_init_at = 0.0
        self._backoff = _BACKOFF_FIRST_SECONDS
        self._init_error: str | None = None
        self._driver_version: str | None = None
        self._gpus: list[_Gpu | None] = []
        self._known_uuids: dict[int, str] = {}
        self._failed_once: set[str] = set()
        self._cycle = 0

    # ------------------------------------------------------------------ lifecycle

    def sample(self) -> BackendSample:
        """Read every GPU once; GPM and per-process utilisation cover the time since the last call."""
        with self._lock:
            if self._closed:
                return BackendSample(up=False, error="backend closed")
            error = self._ensure_initialized()
            if error is not None:
                return BackendSample(up=False, error=error)
            assert self._q is not None
            self._q.errors.clear()
            try:
                gpus = self._sample_all()
            except NeedsReinit as exc:
                # Driver reload / GPU reset: handles are stale. Re-init now, once, then retry.
                _log.warning("nvml reported %s; re-initialising", exc)
                self._teardown(free=False)
                error = self._ensure_initialized(force=True)
                if error is not None:
                    return BackendSample(up=False, error=error)
                try:
                    gpus = self._sample_all()
                except NeedsReinit as again:
                    self._teardown(free=False)
                    return BackendSample(up=False, error=f"nvml {again} right after re-init")
            self._cycle += 1
            return BackendSample(
                up=True,
                driver_version=self._driver_version,
                gpus=tuple(gpus),
                errors=MappingProxyType(dict(self._q.errors)),
                gpm_supported=self._gpm_supported(),
            )

    def close(self) -> None:
        """Free GPM buffers and event sets, then shut NVML down; safe to call twice.

        If a ``sample()`` is stuck inside a hung NVML call, waits at most ``close_timeout``
        seconds and then leaves NVML as it is, so shutdown on SIGTERM stays bounded.
        """
        if not self._lock.acquire(timeout=self._close_timeout):
            _log.warning(
                "an NVML call is still running after %.0f s; closing without nvmlShutdown", self._close_timeout
            )
            self._closed = True
            return
        try:
            if self._closed:
                return
            self._closed = True
            if self._initialized:
                self._teardown(free=True)
        finally:
            self._lock.release()

    def _ensure_initialized(self, force: bool = False) -> str | None:
        """Initialise NVML if needed; returns why it is unavailable, or ``None`` when ready."""
        if self._initialized:
            return None
        now = self._clock()
        if not force and now < self._next_init_at:
            return self._init_error
        try:
            nvml = self._module()
            nvml.nvmlInit()
        except Exception as exc:
            reason = self._describe_init_failure(exc)
            self._init_error = f"nvml unavailable: {reason}"
            self._next_init_at = now + self._backoff
            _log.warning("%s; retrying in %.0f s", self._init_error, self._backoff)
            self._backoff = min(self._backoff * 2, _BACKOFF_MAX_SECONDS)
            return self._init_error
        self._initialized = True
        self._backoff = _BACKOFF_FIRST_SECONDS
        self._init_error = None
        self._q = NvmlQuery(nvml)
        self._gpm = GpmTracker(nvml, self._q)
        try:
            self._driver_version = _text(self._q.call("system", "nvmlSystemGetDriverVersion"))
            self._gpus = self._enumerate()
        except (NeedsReinit, GpuLost) as exc:
            self._teardown(free=False)
            self._init_error = f"nvml unavailable: {exc} during enumeration"
            self._next_init_at = now + self._backoff
            return self._init_error
        _log.info("nvml ready: driver %s, %d GPU(s)", self._driver_version, len(self._gpus))
        return None

    def _module(self) -> Any:
        if self._nvml is None:
            import pynvml  # nvidia-ml-py; optional extra "nvml"

            self._nvml = pynvml
        return self._nvml

    def _describe_init_failure(self, exc: BaseException) -> str:
        if isinstance(exc, ImportError):
            return "nvidia-ml-py is not installed"
        value = getattr(exc, "value", None)
        nvml = self._nvml
        if nvml is not None and isinstance(value, int):
            for attr in dir(nvml):
                if attr.startswith("NVML_ERROR_") and getattr(nvml, attr) == value:
                    return attr[len("NVML_ERROR_") :].lower()
        return f"{type(exc).__name__}: {exc}"

    def _teardown(self, free: bool) -> None:
        """Forget handles and per-GPU state; ``free`` releases NVML objects and shuts NVML down."""
        if self._gpm is not None:
            self._gpm.forget(free=free)
        if free and self._q is not None:
            for gpu in self._gpus:
                if gpu is not None and gpu.event_set is not None:
                    with contextlib.suppress(GpuLost, NeedsReinit):
                        self._q.call(gpu.uuid, "nvmlEventSetFree", gpu.event_set)
            try:
                self._module().nvmlShutdown()
            except Exception as exc:
                _log.debug("nvmlShutdown failed: %s", exc)
        self._gpus = []
        self._initialized = False

    # ------------------------------------------------------------------ enumeration

    def _enumerate(self) -> list[_Gpu | None]:
        assert self._q is not None
        count = self._q.call("system", "nvmlDeviceGetCount")
        return [self._open_gpu(index) for index in range(int(count or 0))]

    def _open_gpu(self, index: int) -> _Gpu | None:
        """Handle + static identity of one GPU; ``None`` when its handle cannot be had now."""
        q = self._q
        assert q is not None
        scope = f"index:{index}"
        try:
            handle = q.call(scope, "nvmlDeviceGetHandleByIndex", index)
            uuid = _text(q.call(scope, "nvmlDeviceGetUUID", handle)) if handle is not None else None
        except GpuLost:
            return None
        if handle is None or not uuid:
            return None
        self._known_uuids[index] = uuid
        gpu = _Gpu(index=index, handle=handle, uuid=uuid)
        # If it is lost mid-way, it is sampled as lost and its identity re-read on the next cycle.
        with contextlib.suppress(GpuLost):
            self._read_identity(gpu)
        return gpu

    def _read_identity(self, gpu: _Gpu) -> None:
        q, nvml, h, u = self._q, self._nvml, gpu.handle, gpu.uuid
        assert q is not None
        gpu.name = _text(q.call(u, "nvmlDeviceGetName", h))
        pci = q.call(u, "nvmlDeviceGetPciInfo", h)
        if pci is not None:
            gpu.pci_bus_id = _text(getattr(pci, "busId", None))
        cc = q.call(u, "nvmlDeviceGetCudaComputeCapability", h)
        if cc is not None:
            gpu.compute_capability = f"{cc[0]}.{cc[1]}"
        max_sm = q.call(u, "nvmlDeviceGetMaxClockInfo", h, nvml.NVML_CLOCK_SM)
        gpu.sm_clock_max_hertz = max_sm * _MHZ if max_sm else None
        mask = q.call(u, "nvmlDeviceGetSupportedClocksEventReasons", h)
        if mask is None:
            mask = q.call(u, "nvmlDeviceGetSupportedClocksThrottleReasons", h)
        gpu.clock_reason_mask = mask
        support = q.call(u, "nvmlGpmQueryDeviceSupport", h)
        gpu.gpm_capable = bool(support is not None and getattr(support, "isSupportedDevice", 0))
        gpu.has_nvlink = q.call(u, "nvmlDeviceGetNvLinkState", h, 0) is not None
        self._register_xid_events(gpu)
        gpu.identity_read = True

    def _register_xid_events(self, gpu: _Gpu) -> None:
        q, nvml = self._q, self._nvml
        assert q is not None
        xid = nvml.nvmlEventTypeXidCriticalError
        supported = q.call(gpu.uuid, "nvmlDeviceGetSupportedEventTypes", gpu.handle)
        if supported is None or not supported & xid:
            return
        event_set = q.call(gpu.uuid, "nvmlEventSetCreate")
        if event_set is None:
            return
        registered = q.call(gpu.uuid, "nvmlDeviceRegisterEvents", gpu.handle, xid, event_set, default=False)
        if registered is False:
            q.call(gpu.uuid, "nvmlEventSetFree", event_set)
            return
        gpu.event_set = event_set

    # ------------------------------------------------------------------ per cycle

    def _sample_all(self) -> list[GpuSample]:
        q = self._q
        assert q is not None and self._gpm is not None
        count = q.call("system", "nvmlDeviceGetCount")
        if count is not None and count != len(self._gpus):
            _log.info("GPU count changed from %d to %d; re-enumerating", len(self._gpus), count)
            self._gpm.forget(free=True)
            self._free_event_sets()
            self._gpus = self._enumerate()
        samples = []
        for index, gpu in enumerate(self._gpus):
            if gpu is None:
                gpu = self._open_gpu(index)
                self._gpus[index] = gpu
            if gpu is None:
                samples.append(GpuSample(index=index, uuid=self._known_uuids.get(index, ""), up=False))
                continue
            try:
                samples.append(self._sample_gpu(gpu))
            except GpuLost:
                samples.append(GpuSample(index=index, uuid=gpu.uuid, up=False))
            except NeedsReinit:
                raise
            except Exception:
                # A bug or binding surprise on one GPU must not take the others down.
                if gpu.uuid not in self._failed_once:
                    self._failed_once.add(gpu.uuid)
                    _log.exception("reading GPU %s failed", gpu.uuid)
                q.count("exception")
                samples.append(GpuSample(index=index, uuid=gpu.uuid, up=False))
        live = [leaf.leaf_id for s in samples for leaf in s.leaves]
        self._gpm.retain(live)
        return samples

    def _free_event_sets(self) -> None:
        assert self._q is not None
        for gpu in self._gpus:
            if gpu is not None and gpu.event_set is not None:
                self._q.call(gpu.uuid, "nvmlEventSetFree", gpu.event_set)
                gpu.event_set = None

    def _sample_gpu(self, gpu: _Gpu) -> GpuSample:
        q, nvml, h, u = self._q, self._nvml, gpu.handle, gpu.uuid
        assert q is not None
        if not gpu.identity_read:
            self._read_identity(gpu)
        now = self._clock()

        util = q.call(u, "nvmlDeviceGetUtilizationRates", h)
        util_gpu = self._percent(util.gpu) if util is not None else None
        util_mem = self._percent(util.memory) if util is not None else None
        memory = self._memory_info(u, h)
        mig_state = q.call(u, "nvmlDeviceGetMigMode", h)
        mig_mode = None if mig_state is None else ("enabled" if mig_state[0] else "disabled")
        compute_mode = q.call(u, "nvmlDeviceGetComputeMode", h)

        power = self._milli(q.call(u, "nvmlDeviceGetPowerUsage", h), _MAX_POWER_WATTS)
        limit = self._milli(q.call(u, "nvmlDeviceGetEnforcedPowerLimit", h), _MAX_POWER_WATTS)
        if gpu.energy_mj is None or (self._cycle - gpu.index) % self._energy_every == 0:
            gpu.energy_mj = q.call(u, "nvmlDeviceGetTotalEnergyConsumption", h)
        energy_mj = gpu.energy_mj
        temperature = self._temperature(q.call(u, "nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU))
        memory_temperature = self._memory_temperature(gpu)
        fan = q.call(u, "nvmlDeviceGetFanSpeed", h)
        sm_clock = q.call(u, "nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM, key="clock_sm")
        mem_clock = q.call(u, "nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_MEM, key="clock_mem")

        if (self._cycle - gpu.index) % self._pcie_every == 0:
            gpu.pcie = (self._pcie(gpu, "TX"), self._pcie(gpu, "RX"))

        leaves, nvlink = self._leaves(gpu, mig_mode == "enabled", now, util_gpu, memory)
        return GpuSample(
            index=gpu.index,
            uuid=u,
            name=gpu.name,
            pci_bus_id=gpu.pci_bus_id,
            compute_capability=gpu.compute_capability,
            mig_mode=mig_mode,
            compute_mode=_COMPUTE_MODES.get(compute_mode) if compute_mode is not None else None,
            utilization_ratio=util_gpu,
            memory_utilization_ratio=util_mem,
            memory_used_bytes=memory[0],
            memory_total_bytes=memory[1],
            power_watts=power,
            power_limit_watts=limit,
            energy_joules=energy_mj / 1000.0 if energy_mj is not None else None,
            temperature_celsius=temperature,
            memory_temperature_celsius=memory_temperature,
            fan_speed_ratio=self._percent(fan),
            sm_clock_hertz=sm_clock * _MHZ if sm_clock is not None else None,
            memory_clock_hertz=mem_clock * _MHZ if mem_clock is not None else None,
            sm_clock_max_hertz=gpu.sm_clock_max_hertz,
            clock_events=self._clock_events(gpu),
            pcie_tx_bytes_per_second=gpu.pcie[0],
            pcie_rx_bytes_per_second=gpu.pcie[1],
            pcie_link_generation=q.call(u, "nvmlDeviceGetCurrPcieLinkGeneration", h),
            pcie_link_width=q.call(u, "nvmlDeviceGetCurrPcieLinkWidth", h),
            pcie_replay_errors=q.call(u, "nvmlDeviceGetPcieReplayCounter", h),
            nvlink_tx_bytes_per_second=nvlink[0],
            nvlink_rx_bytes_per_second=nvlink[1],
            ecc_errors=self._ecc(gpu),
            remapped_rows=self._remapped_rows(gpu),
            xid_events=self._drain_xid(gpu),
            leaves=leaves,
        )

    # ------------------------------------------------------------------ fields

    def _memory_info(self, scope: str, handle: Any) -> tuple[int | None, int | None, int | None]:
        """(used, total, reserved) bytes; v2 (used excludes driver-reserved memory) when the driver
        has it, else v1 (reserved ``None``: v1's used includes it)."""
        q, nvml = self._q, self._nvml
        assert q is not None
        version = getattr(nvml, "nvmlMemory_v2", None)
        info = None
        if version is not None:
            info = q.call(scope, "nvmlDeviceGetMemoryInfo", handle, version, key="memory_info_v2")
        if info is None and (version is None or q.is_unsupported(scope, "memory_info_v2")):
            info = q.call(scope, "nvmlDeviceGetMemoryInfo", handle)
        if info is None:
            return None, None, None
        reserved = getattr(info, "reserved", None)
        return int(info.used), int(info.total), None if reserved is None else int(reserved)

    def _memory_temperature(self, gpu: _Gpu) -> float | None:
        q, nvml = self._q, self._nvml
        assert q is not None
        field_id = getattr(nvml, "NVML_FI_DEV_MEMORY_TEMP", None)
        if field_id is None:
            return None
        values = q.call(gpu.uuid, "nvmlDeviceGetFieldValues", gpu.handle, [field_id], key="memory_temp")
        if not values:
            return None
        entry = values[0]
        code = entry.nvmlReturn
        if code != nvml.NVML_SUCCESS:
            if code == nvml.NVML_ERROR_NOT_SUPPORTED:
                q.unsupported.add((gpu.uuid, "memory_temp"))
            else:
                q.count(q.code(nvml.NVMLError(code)).lower())
            return None
        return self._temperature(_field_value(nvml, entry))

    def _clock_events(self, gpu: _Gpu) -> Mapping[str, bool] | None:
        q, nvml = self._q, self._nvml
        assert q is not None
        active = q.call(gpu.uuid, "nvmlDeviceGetCurrentClocksEventReasons", gpu.handle)
        if active is None and q.is_unsupported(gpu.uuid, "nvmlDeviceGetCurrentClocksEventReasons"):
            active = q.call(gpu.uuid, "nvmlDeviceGetCurrentClocksThrottleReasons", gpu.handle)
        if active is None:
            return None
        reasons = {}
        for const, label in CLOCK_EVENT_REASONS.items():
            bit = getattr(nvml, const, None)
            if bit is None or (gpu.clock_reason_mask is not None and not gpu.clock_reason_mask & bit):
                continue
            reasons[label] = bool(active & bit)
        return MappingProxyType(reasons)

    def _pcie(self, gpu: _Gpu, direction: str) -> float | None:
        assert self._q is not None
        counter = getattr(self._nvml, f"NVML_PCIE_UTIL_{direction}_BYTES")
        kib = self._q.call(gpu.uuid, "nvmlDeviceGetPcieThroughput", gpu.handle, counter, key="pcie_" + direction)
        return float(kib) * _KIB if kib is not None else None

    def _ecc(self, gpu: _Gpu) -> Mapping[str, int] | None:
        q, nvml = self._q, self._nvml
        assert q is not None
        counts = {}
        for severity, const in (
            ("corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
            ("uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
        ):
            value = q.call(
                gpu.uuid,
                "nvmlDeviceGetTotalEccErrors",
                gpu.handle,
                getattr(nvml, const),
                nvml.NVML_VOLATILE_ECC,
                key="ecc_" + severity,
            )
            if value is not None:
                counts[severity] = int(value)
        return MappingProxyType(counts) if counts else None

    def _remapped_rows(self, gpu: _Gpu) -> Mapping[str, int] | None:
        assert self._q is not None
        rows = self._q.call(gpu.uuid, "nvmlDeviceGetRemappedRows", gpu.handle)
        if rows is None:
            return None
        correctable, uncorrectable, pending, failure = rows
        return MappingProxyType(
            {
                "correctable": int(correctable),
                "uncorrectable": int(uncorrectable),
                "pending": int(bool(pending)),
                "failure": int(bool(failure)),
            }
        )

    def _drain_xid(self, gpu: _Gpu) -> tuple[int, ...]:
        """Every Xid event queued since the last cycle (wait timeout 0 ms: never blocks)."""
        q, nvml = self._q, self._nvml
        assert q is not None
        if gpu.event_set is None:
            return ()
        xids = []
        for _ in range(_MAX_EVENTS_PER_CYCLE):
            data = q.call(gpu.uuid, "nvmlEventSetWait", gpu.event_set, 0, expect=("TIMEOUT",))
            if data is None:
                break
            if data.eventType & nvml.nvmlEventTypeXidCriticalError:
                xids.append(int(data.eventData))
        return tuple(xids)

    # ------------------------------------------------------------------ leaves

    def _leaves(
        self,
        gpu: _Gpu,
        mig_enabled: bool,
        now: float,
        util: float | None,
        memory: tuple[int | None, int | None, int | None],
    ) -> tuple[tuple[LeafSample, ...], tuple[float | None, float | None]]:
        """Leaves of one GPU and its NVLink (tx, rx) bytes/s from the GPU-level GPM window."""
        nvlink: tuple[float | None, float | None] = (None, None)
        if not mig_enabled:
            running = self._running(gpu.uuid, gpu.handle)
            roles = self._mps_roles(gpu.uuid, gpu.handle, running)
            proc_util = self._process_utilization(gpu, wanted=bool(running))
            reading = self._gpm_read(gpu, gpu.uuid, None, now)
            if reading is not None:
                nvlink = (reading.nvlink_tx_bytes_per_second, reading.nvlink_rx_bytes_per_second)
            leaf = LeafSample(
                uuid=gpu.uuid,
                memory_used_bytes=memory[0],
                memory_total_bytes=memory[1],
                memory_reserved_bytes=memory[2],
                utilization_ratio=util,
                gpm=reading.sample if reading is not None else None,
                processes=self._process_samples(running, proc_util, roles=roles),
            )
            return (leaf,), nvlink
        found = self._mig_devices(gpu)
        running_per_mig = [self._running(m.mig.mig_uuid, m.handle) for m in found]
        roles_per_mig = [
            self._mps_roles(m.mig.mig_uuid, m.handle, r) for m, r in zip(found, running_per_mig, strict=True)
        ]
        proc_util = self._process_utilization(gpu, wanted=any(running_per_mig))
        leaves = []
        for mig, running, roles in zip(found, running_per_mig, roles_per_mig, strict=True):
            mig_uuid = mig.mig.mig_uuid
            used, total, reserved = self._memory_info(mig_uuid, mig.handle)
            reading = self._gpm_read(gpu, mig_uuid, mig.mig.gpu_instance_id, now)
            leaves.append(
                LeafSample(
                    uuid=gpu.uuid,
                    mig=mig.mig,
                    memory_used_bytes=used,
                    memory_total_bytes=total,
                    memory_reserved_bytes=reserved,
                    gpm=reading.sample if reading is not None else None,
                    processes=self._process_samples(running, proc_util, mig.mig, roles),
                )
            )
        return tuple(leaves), nvlink

    def _mig_devices(self, gpu: _Gpu) -> list[_Leaf]:
        """MIG devices present now; enumerated every cycle so a reconfiguration is seen at once."""
        q = self._q
        assert q is not None
        if gpu.max_mig_devices is None:
            gpu.max_mig_devices = q.call(gpu.uuid, "nvmlDeviceGetMaxMigDeviceCount", gpu.handle) or 0
        found = []
        for slot in range(gpu.max_mig_devices):
            handle = q.call(gpu.uuid, "nvmlDeviceGetMigDeviceHandleByIndex", gpu.handle, slot, expect=("NOT_FOUND",))
            if handle is None:
                continue
            mig_uuid = _text(q.call(gpu.uuid, "nvmlDeviceGetUUID", handle, key="mig_uuid"))
            gi = q.call(gpu.uuid, "nvmlDeviceGetGpuInstanceId", handle)
            ci = q.call(gpu.uuid, "nvmlDeviceGetComputeInstanceId", handle)
            if not mig_uuid or gi is None or ci is None:
                continue
            profile = gpu.mig_profiles.get(mig_uuid)
            if profile is None:
                profile = self._mig_profile(gpu, handle, gi)
                gpu.mig_profiles[mig_uuid] = profile
            found.append(_Leaf(handle, MigInstance(mig_uuid, int(gi), int(ci), profile)))
        return found

    def _mig_profile(self, gpu: _Gpu, handle: Any, gpu_instance_id: int) -> str:
        """``1g.18gb``-style name: from the MIG device's name, else from its GPU instance profile."""
        q = self._q
        assert q is not None
        name = _text(q.call(gpu.uuid, "nvmlDeviceGetName", handle, key="mig_name")) or ""
        match = _MIG_PROFILE.search(name)
        if match:
            return match.group(0)
        instance = q.call(gpu.uuid, "nvmlDeviceGetGpuInstanceById", gpu.handle, gpu_instance_id)
        info = q.call(gpu.uuid, "nvmlGpuInstanceGetInfo", instance) if instance is not None else None
        profile = (
            q.call(gpu.uuid, "nvmlDeviceGetGpuInstanceProfileInfoById", gpu.handle, info.profileId)
            if info is not None
            else None
        )
        if profile is not None:
            match = _MIG_PROFILE.search(_text(profile.name) or "")
            if match:
                return match.group(0)
            return f"{profile.sliceCount}g.{round(profile.memorySizeMB / 1024)}gb"
        return "unknown"

    def _gpm_read(self, gpu: _Gpu, leaf_id: str, gpu_instance_id: int | None, now: float) -> GpmReading | None:
        q, gpm = self._q, self._gpm
        assert q is not None and gpm is not None
        if not gpu.gpm_capable or q.is_unsupported(gpu.uuid, "gpm"):
            return None
        if gpu_instance_id is None:

            def fetch(buffer: Any) -> bool:
                return q.call(gpu.uuid, "nvmlGpmSampleGet", gpu.handle, buffer, key="gpm") is not None

        else:
            if q.is_unsupported(gpu.uuid, "gpm_mig"):
                return None

            def fetch(buffer: Any) -> bool:
                return (
                    q.call(gpu.uuid, "nvmlGpmMigSampleGet", gpu.handle, gpu_instance_id, buffer, key="gpm_mig")
                    is not None
                )

        return gpm.read(gpu.uuid, leaf_id, fetch, now, nvlink=gpu.has_nvlink and gpu_instance_id is None)

    def _process_utilization(self, gpu: _Gpu, wanted: bool) -> dict[int, tuple[float | None, float | None]]:
        """pid -> (sm, memory) ratios since the previous cycle; empty on the first cycle.

        Skipped (``wanted=False``) when no compute process runs: the call costs ~2.4 ms on an
        H200 even when it answers NotFound, and most GPUs in a fleet sit idle.
        """
        q = self._q
        assert q is not None
        since = gpu.process_util_since_us
        gpu.process_util_since_us = int(self._wall_clock() * 1e6)
        if since is None or not wanted:
            return {}
        # NotFound means no process ran in the window: an empty answer, not an error.
        samples = q.call(
            gpu.uuid, "nvmlDeviceGetProcessUtilization", gpu.handle, since, expect=("NOT_FOUND",), default=[]
        )
        sums: dict[int, list[float]] = {}
        for s in samples or []:
            acc = sums.setdefault(int(s.pid), [0.0, 0.0, 0.0])
            acc[0] += s.smUtil
            acc[1] += s.memUtil
            acc[2] += 1
        return {pid: (self._percent(sm / n), self._percent(mem / n)) for pid, (sm, mem, n) in sums.items()}

    def _running(self, scope: str, handle: Any) -> list[Any]:
        """Compute processes on a whole GPU or MIG device (host PIDs)."""
        assert self._q is not None
        return list(self._q.call(scope, "nvmlDeviceGetComputeRunningProcesses", handle) or [])

    def _mps_roles(self, scope: str, handle: Any, running: list[Any]) -> dict[int, str]:
        """pid -> MPS role on one leaf; adds MPS clients missing from ``running`` to it.

        NVML lists MPS clients apart (``nvmlDeviceGetMPSComputeRunningProcesses``); the compute
        process list holds them and the MPS server. The server is told by its process name
        (``nvidia-cuda-mps-server``), asked only while the leaf has MPS clients.
        """
        assert self._q is not None
        clients = list(
            self._q.call(scope, "nvmlDeviceGetMPSComputeRunningProcesses", handle, expect=("NOT_FOUND",)) or []
        )
        if not clients:
            return {}
        roles = {int(p.pid): MPS_CLIENT for p in clients}
        listed = {int(p.pid) for p in running}
        running.extend(p for p in clients if int(p.pid) not in listed)
        for p in running:
            pid = int(p.pid)
            if pid in roles:
                continue
            name = _text(self._q.call(scope, "nvmlSystemGetProcessName", pid, expect=("NOT_FOUND",))) or ""
            if name.rsplit("/", 1)[-1] == MPS_SERVER_PROCESS:
                roles[pid] = MPS_SERVER
        return roles

    @staticmethod
    def _process_samples(
        running: list[Any],
        utilization: Mapping[int, tuple[float | None, float | None]],
        mig: MigInstance | None = None,
        roles: Mapping[int, str] | None = None,
    ) -> tuple[ProcessSample, ...]:
        out = []
        for p in running:
            sm, mem = utilization.get(int(p.pid), (None, None))
            gi = getattr(p, "gpuInstanceId", None)
            ci = getattr(p, "computeInstanceId", None)
            out.append(
                ProcessSample(
                    pid=int(p.pid),
                    used_memory_bytes=int(p.usedGpuMemory) if p.usedGpuMemory is not None else None,
                    sm_util_ratio=sm,
                    memory_util_ratio=mem,
                    gpu_instance_id=mig.gpu_instance_id if mig else _id_or_none(gi),
                    compute_instance_id=mig.compute_instance_id if mig else _id_or_none(ci),
                    mps_role=(roles or {}).get(int(p.pid)),
                )
            )
        return tuple(out)

    # ------------------------------------------------------------------ validation

    def _gpm_supported(self) -> bool | None:
        assert self._q is not None
        present = [g for g in self._gpus if g is not None]
        if not present:
            return None
        return any(g.gpm_capable and not self._q.is_unsupported(g.uuid, "gpm") for g in present)

    def _percent(self, value: float | None) -> float | None:
        """NVML percent -> ratio 0..1; values above 100 % are glitches, dropped and counted."""
        if value is None:
            return None
        if not 0 <= value <= 100:
            assert self._q is not None
            self._q.count("out_of_range")
            return None
        return value / 100.0

    def _milli(self, value: float | None, maximum: float) -> float | None:
        """milli-units (mW, mJ) -> base units, dropping sentinels above ``maximum``."""
        if value is None:
            return None
        base = value / 1000.0
        if not 0 <= base <= maximum:
            assert self._q is not None
            self._q.count("out_of_range")
            return None
        return base

    def _temperature(self, value: float | None) -> float | None:
        if value is None:
            return None
        if math.isnan(value) or value >= _NOT_AVAILABLE_U32 or not -50 <= value <= _MAX_TEMPERATURE_CELSIUS:
            assert self._q is not None
            self._q.count("out_of_range")
            return None
        return float(value)


def _text(value: Any) -> str | None:
    """NVML strings arrive as ``str`` or ``bytes`` depending on the call; ``None`` stays ``None``."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _id_or_none(value: Any) -> int | None:
    """GI/CI ids are 0xFFFFFFFF (or absent) for processes outside MIG."""
    if value is None or value == _NOT_AVAILABLE_U32:
        return None
    return int(value)


def _field_value(nvml: Any, entry: Any) -> float | None:
    """Decode a ``nvmlFieldValue_t`` union by its value type."""
    members = {
        nvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        nvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    }
    member = members.get(entry.valueType)
    if member is None:
        return None
    return float(getattr(entry.value, member))
