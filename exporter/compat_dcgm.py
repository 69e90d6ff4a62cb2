"""DCGM-compatible series (``--compat.dcgm``): dcgm-exporter's names, units and labels, rendered
from the same immutable Snapshot as the native series, so dashboards, cost tools and autoscalers
written for dcgm-exporter keep working.  docs/dcgm-compat.md is the mapping and the differences.

Identity labels follow dcgm-exporter: ``gpu`` (index), ``UUID`` (physical GPU), ``pci_bus_id``,
``device`` (``nvidia<index>``), ``modelName``, ``GPU_I_PROFILE`` and ``GPU_I_ID`` on MIG instance
series, ``Hostname``, ``DCGM_FI_DRIVER_VERSION``, and ``namespace``/``pod``/``container`` where one
container holds the device.  Units follow DCGM: percent, MiB, MHz, W, mJ, degrees C; the profiling
fields are ratios.  Families are built once per snapshot and reused (a scrape between two
snapshots costs nothing here); no NVML.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass

from prometheus_client.utils import floatToGoString

from exporter.attribution.cgroup import STAGE as CGROUP_STAGE
from exporter.model import Allocation, GpuSample, LeafSample, PodRef, PodUsage, Snapshot

log = logging.getLogger(__name__)

MIB = 1024**2

GPU = "gpu"
"""Scope: once per physical GPU (device-wide readings)."""
LEAF = "leaf"
"""Scope: once per leaf, a whole GPU or a MIG instance."""
POD = "pod"
"""Scope: once per container on a shared GPU (time-slicing), from per-process readings."""


@dataclass(frozen=True)
class DcgmField:
    """One DCGM field gpulens renders: its name, exposition type, help, scope and source."""

    name: str
    type: str
    """``gauge`` or ``unknown``: DCGM's counters keep their names without ``_total``, which only
    an untyped family can carry in both exposition formats (see docs/dcgm-compat.md)."""
    help: str
    scope: str
    source: str
    """The gpulens series (or model field) the value comes from, for docs/dcgm-compat.md."""


# Field order is dcgm-exporter's default counter order where it has the field.
FIELDS: tuple[DcgmField, ...] = (
    DcgmField("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", GPU, "gpulens_gpu_sm_clock_hertz / 1e6"),
    DcgmField(
        "DCGM_FI_DEV_MEM_CLOCK",
        "gauge",
        "Memory clock frequency (in MHz).",
        GPU,
        "gpulens_gpu_memory_clock_hertz / 1e6",
    ),
    DcgmField(
        "DCGM_FI_DEV_MAX_SM_CLOCK", "gauge", "Maximum SM clock (in MHz).", GPU, "gpulens_gpu_sm_clock_max_hertz / 1e6"
    ),
    DcgmField(
        "DCGM_FI_DEV_MEMORY_TEMP",
        "gauge",
        "Memory temperature (in C).",
        GPU,
        "gpulens_gpu_memory_temperature_celsius",
    ),
    DcgmField("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", GPU, "gpulens_gpu_temperature_celsius"),
    DcgmField("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", GPU, "gpulens_gpu_power_watts"),
    DcgmField(
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "gauge",
        "Power limit the driver enforces (in W).",
        GPU,
        "gpulens_gpu_power_limit_watts",
    ),
    DcgmField(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "unknown",
        "Total energy consumption since the exporter first saw the GPU (in mJ; a counter).",
        GPU,
        "gpulens_gpu_energy_joules_total * 1000",
    ),
    DcgmField(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "unknown",
        "Total number of PCIe retries (a counter).",
        GPU,
        "gpulens_gpu_pcie_replay_errors_total",
    ),
    DcgmField(
        "DCGM_FI_DEV_PCIE_LINK_GEN", "gauge", "Current PCIe link generation.", GPU, "gpulens_gpu_pcie_link_generation"
    ),
    DcgmField("DCGM_FI_DEV_PCIE_LINK_WIDTH", "gauge", "Current PCIe link width.", GPU, "gpulens_gpu_pcie_link_width"),
    DcgmField(
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "GPU utilization (in %).",
        GPU,
        "gpulens_gpu_utilization_ratio * 100 (per pod on a shared GPU: gpulens_pod_gpu_sm_share_ratio * 100)",
    ),
    DcgmField(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
        GPU,
        "gpulens_gpu_memory_utilization_ratio * 100",
    ),
    DcgmField("DCGM_FI_DEV_FAN_SPEED", "gauge", "Fan speed (in %).", GPU, "gpulens_gpu_fan_speed_ratio * 100"),
    DcgmField(
        "DCGM_FI_DEV_XID_ERRORS",
        "gauge",
        "Value of the last Xid error seen since the exporter started (0: none).",
        GPU,
        "the newest gpulens_gpu_xid_errors_total{xid} to increase",
    ),
    DcgmField(
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "Framebuffer memory free (in MiB).",
        LEAF,
        "(gpulens_gpu_memory_total_bytes - gpulens_gpu_memory_used_bytes - reserved) / 2^20",
    ),
    DcgmField(
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "Framebuffer memory used (in MiB).",
        LEAF,
        "gpulens_gpu_memory_used_bytes / 2^20 (per pod on a shared GPU: gpulens_pod_gpu_memory_used_bytes / 2^20)",
    ),
    DcgmField(
        "DCGM_FI_DEV_FB_RESERVED",
        "gauge",
        "Framebuffer memory reserved by the driver (in MiB).",
        LEAF,
        "NVML memory info v2 reserved / 2^20 (not a native series)",
    ),
    DcgmField(
        "DCGM_FI_DEV_FB_TOTAL",
        "gauge",
        "Framebuffer memory total (in MiB).",
        LEAF,
        "gpulens_gpu_memory_total_bytes / 2^20",
    ),
    DcgmField(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "unknown",
        "Total number of single-bit volatile ECC errors (a counter).",
        GPU,
        'gpulens_gpu_ecc_errors_total{severity="corrected"}',
    ),
    DcgmField(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "unknown",
        "Total number of double-bit volatile ECC errors (a counter).",
        GPU,
        'gpulens_gpu_ecc_errors_total{severity="uncorrected"}',
    ),
    DcgmField(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "unknown",
        "Number of remapped rows for uncorrectable errors (a counter).",
        GPU,
        'gpulens_gpu_remapped_rows{cause="uncorrectable"}',
    ),
    DcgmField(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "unknown",
        "Number of remapped rows for correctable errors (a counter).",
        GPU,
        'gpulens_gpu_remapped_rows{cause="correctable"}',
    ),
    DcgmField(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gauge",
        "Whether remapping of rows has failed.",
        GPU,
        "gpulens_gpu_row_remap_failure",
    ),
    DcgmField(
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "gauge",
        "Whether rows are pending remapping (a GPU reset is needed).",
        GPU,
        "gpulens_gpu_row_remap_pending",
    ),
    DcgmField(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        LEAF,
        "gpulens_gpu_busy_ratio (GPM graphics-engine activity; NVML GPU-Util where GPM lacks it)",
    ),
    DcgmField(
        "DCGM_FI_PROF_SM_ACTIVE",
        "gauge",
        "The ratio of cycles an SM has at least 1 warp assigned.",
        LEAF,
        "gpulens_gpu_sm_active_ratio",
    ),
    DcgmField(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "gauge",
        "The ratio of number of warps resident on an SM.",
        LEAF,
        "gpulens_gpu_sm_occupancy_ratio",
    ),
    DcgmField(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        LEAF,
        "gpulens_gpu_tensor_active_ratio",
    ),
    DcgmField(
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "gauge",
        "Ratio of cycles the fp64 pipes are active.",
        LEAF,
        "gpulens_gpu_fp64_active_ratio",
    ),
    DcgmField(
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "gauge",
        "Ratio of cycles the fp32 pipes are active.",
        LEAF,
        "gpulens_gpu_fp32_active_ratio",
    ),
    DcgmField(
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "gauge",
        "Ratio of cycles the fp16 pipes are active.",
        LEAF,
        "gpulens_gpu_fp16_active_ratio",
    ),
    DcgmField(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        LEAF,
        "gpulens_gpu_dram_active_ratio",
    ),
    DcgmField(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus (in bytes per second).",
        GPU,
        "gpulens_gpu_pcie_tx_bytes_per_second",
    ),
    DcgmField(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus (in bytes per second).",
        GPU,
        "gpulens_gpu_pcie_rx_bytes_per_second",
    ),
    DcgmField(
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "gauge",
        "The rate of data transmitted over NVLink (in bytes per second).",
        GPU,
        "gpulens_gpu_nvlink_tx_bytes_per_second",
    ),
    DcgmField(
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "gauge",
        "The rate of data received over NVLink (in bytes per second).",
        GPU,
        "gpulens_gpu_nvlink_rx_bytes_per_second",
    ),
)

Labels = tuple[tuple[str, str], ...]
"""Label pairs in dcgm-exporter's order; tuples so their encoded form can be cached."""
Value = float | int | None

MAX_CACHED_LABEL_SETS = 50_000
"""Bound of the encoded-label cache: pods come and go, the cache must not grow with them."""


def _percent(ratio: float | None) -> float | None:
    return None if ratio is None else ratio * 100.0


def _mhz(hertz: float | None) -> float | None:
    return None if hertz is None else hertz / 1e6


def _mib(n: int | None) -> float | None:
    return None if n is None else n / MIB


def _valid(value: Value) -> bool:
    return value is not None and value == value and value not in (float("inf"), float("-inf"))


def default_hostname(node_name: str) -> str:
    """The ``Hostname`` label as dcgm-exporter sets it: the node name, else the host's name."""
    return node_name or socket.gethostname()


def _pod_labels(ref: PodRef) -> Labels:
    return (("namespace", ref.namespace), ("pod", ref.pod), ("container", ref.container))


@dataclass(frozen=True)
class _Holders:
    """Who holds each device in one snapshot: the one container holding it alone, or shared."""

    exclusive: dict[str, PodRef]
    """GPU uuid or MIG uuid -> the single container holding it (no time-slicing replica)."""
    shared: dict[str, list[Allocation]]
    """GPU uuid -> allocations of a whole GPU that several containers hold or that is time-sliced."""


def _holders(snap: Snapshot) -> _Holders:
    on_gpu: dict[str, list[Allocation]] = {}
    on_mig: dict[str, list[Allocation]] = {}
    if snap.attribution is not None:
        for a in snap.attribution.allocations:
            on_gpu.setdefault(a.uuid, []).append(a)
            if a.mig_uuid:
                on_mig.setdefault(a.mig_uuid, []).append(a)
    exclusive: dict[str, PodRef] = {}
    shared: dict[str, list[Allocation]] = {}
    for device, allocs in (*on_gpu.items(), *on_mig.items()):
        containers = {(a.pod.namespace, a.pod.pod, a.pod.container) for a in allocs}
        if len(containers) == 1 and not any(a.replica for a in allocs):
            exclusive[device] = allocs[0].pod
    for uuid, allocs in on_gpu.items():
        whole = [a for a in allocs if not a.mig_uuid]
        if whole and uuid not in exclusive:
            shared[uuid] = whole  # time-sliced, or a whole GPU listed under several containers
    return _Holders(exclusive, shared)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Builder:
    """Sample lines of one snapshot by family; label sets are encoded once and cached across
    snapshots (identity and holders rarely change, values do)."""

    def __init__(self, label_cache: dict[Labels, str]) -> None:
        self.lines: dict[str, list[str]] = {}
        self._cache = label_cache

    def add(self, name: str, labels: Labels, value: Value) -> None:
        if not _valid(value):
            return
        encoded = self._cache.get(labels)
        if encoded is None:
            if len(self._cache) >= MAX_CACHED_LABEL_SETS:
                self._cache.clear()
            encoded = self._cache[labels] = "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"
        self.lines.setdefault(name, []).append(f"{name}{encoded} {floatToGoString(value)}\n")


def _gpu_labels(gpu: GpuSample, hostname: str, driver: str) -> Labels:
    return (
        ("gpu", str(gpu.index)),
        ("UUID", gpu.uuid),
        ("pci_bus_id", gpu.pci_bus_id or ""),
        ("device", f"nvidia{gpu.index}"),
        ("modelName", gpu.name or ""),
        ("Hostname", hostname),
        ("DCGM_FI_DRIVER_VERSION", driver),
    )


def _leaf_labels(base: Labels, leaf: LeafSample) -> Labels:
    if leaf.mig is None:
        return base
    mig = (("GPU_I_PROFILE", leaf.mig.profile), ("GPU_I_ID", str(leaf.mig.gpu_instance_id)))
    return base[:5] + mig + base[5:]  # dcgm-exporter's order: after modelName, before Hostname


def _render_gpu(b: _Builder, gpu: GpuSample, g: Labels, snap: Snapshot) -> None:
    b.add("DCGM_FI_DEV_SM_CLOCK", g, _mhz(gpu.sm_clock_hertz))
    b.add("DCGM_FI_DEV_MEM_CLOCK", g, _mhz(gpu.memory_clock_hertz))
    b.add("DCGM_FI_DEV_MAX_SM_CLOCK", g, _mhz(gpu.sm_clock_max_hertz))
    b.add("DCGM_FI_DEV_MEMORY_TEMP", g, gpu.memory_temperature_celsius)
    b.add("DCGM_FI_DEV_GPU_TEMP", g, gpu.temperature_celsius)
    b.add("DCGM_FI_DEV_POWER_USAGE", g, gpu.power_watts)
    b.add("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", g, gpu.power_limit_watts)
    energy = snap.analysis.get(gpu.uuid)
    if energy is not None and energy.energy_joules is not None:
        b.add("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", g, energy.energy_joules * 1000.0)
    b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", g, gpu.pcie_replay_errors)
    b.add("DCGM_FI_DEV_PCIE_LINK_GEN", g, gpu.pcie_link_generation)
    b.add("DCGM_FI_DEV_PCIE_LINK_WIDTH", g, gpu.pcie_link_width)
    b.add("DCGM_FI_DEV_GPU_UTIL", g, _percent(gpu.utilization_ratio))
    b.add("DCGM_FI_DEV_MEM_COPY_UTIL", g, _percent(gpu.memory_utilization_ratio))
    b.add("DCGM_FI_DEV_FAN_SPEED", g, _percent(gpu.fan_speed_ratio))
    xid = snap.xid_last.get(gpu.uuid, 0)
    b.add("DCGM_FI_DEV_XID_ERRORS", (*g, ("err_code", str(xid))), xid)
    ecc = gpu.ecc_errors or {}
    b.add("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", g, ecc.get("corrected"))
    b.add("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", g, ecc.get("uncorrected"))
    rows = gpu.remapped_rows or {}
    b.add("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", g, rows.get("uncorrectable"))
    b.add("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", g, rows.get("correctable"))
    b.add("DCGM_FI_DEV_ROW_REMAP_FAILURE", g, rows.get("failure"))
    b.add("DCGM_FI_DEV_ROW_REMAP_PENDING", g, rows.get("pending"))
    b.add("DCGM_FI_PROF_PCIE_TX_BYTES", g, gpu.pcie_tx_bytes_per_second)
    b.add("DCGM_FI_PROF_PCIE_RX_BYTES", g, gpu.pcie_rx_bytes_per_second)
    b.add("DCGM_FI_PROF_NVLINK_TX_BYTES", g, gpu.nvlink_tx_bytes_per_second)
    b.add("DCGM_FI_PROF_NVLINK_RX_BYTES", g, gpu.nvlink_rx_bytes_per_second)


_GPM_FIELDS: tuple[tuple[str, str], ...] = (
    ("DCGM_FI_PROF_SM_ACTIVE", "sm_active"),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "sm_occupancy"),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_active"),
    ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "fp64_active"),
    ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "fp32_active"),
    ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "fp16_active"),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "dram_active"),
)
"""DCGM profiling field -> the GpmSample ratio it is (same definition, same 0..1 unit)."""


def _render_leaf(b: _Builder, gpu: GpuSample, leaf: LeafSample, lab: Labels, snap: Snapshot) -> None:
    used, total, reserved = leaf.memory_used_bytes, leaf.memory_total_bytes, leaf.memory_reserved_bytes
    b.add("DCGM_FI_DEV_FB_USED", lab, _mib(used))
    if used is not None and total is not None:
        # NVML v2: total = used + free + reserved; v1 (reserved unknown): total = used + free.
        b.add("DCGM_FI_DEV_FB_FREE", lab, _mib(max(0, total - used - (reserved or 0))))
    b.add("DCGM_FI_DEV_FB_RESERVED", lab, _mib(reserved))
    b.add("DCGM_FI_DEV_FB_TOTAL", lab, _mib(total))
    analysis = snap.analysis.get(leaf.leaf_id)
    busy = analysis.busy_ratio if analysis is not None else None
    if busy is None and leaf.mig is None:
        busy = gpu.utilization_ratio  # no GPM (pre-Hopper): NVML GPU-Util, the same duty cycle
    b.add("DCGM_FI_PROF_GR_ENGINE_ACTIVE", lab, busy)
    gpm = leaf.gpm
    if gpm is not None:
        for name, attr in _GPM_FIELDS:
            b.add(name, lab, getattr(gpm, attr))


def _process_mapping_ok(snap: Snapshot) -> bool:
    return any(st.stage == CGROUP_STAGE and st.success for st in snap.stages)


def _render_shared(b: _Builder, g: Labels, gpu: GpuSample, allocs: list[Allocation], snap: Snapshot) -> None:
    """Per-container GPU_UTIL and FB_USED on a shared GPU, as dcgm-exporter's virtual-GPU mode."""
    usage: dict[tuple[str, str, str], PodUsage] = {}
    if snap.attribution is not None:
        for u in snap.attribution.usages:
            if u.uuid == gpu.uuid:
                usage[(u.pod.namespace, u.pod.pod, u.pod.container)] = u
    mapped = _process_mapping_ok(snap)
    seen: set[tuple[str, str, str]] = set()
    for a in allocs:
        key = (a.pod.namespace, a.pod.pod, a.pod.container)
        if key in seen:
            continue
        seen.add(key)
        lab = g + _pod_labels(a.pod)
        found = usage.get(key)
        if found is not None:
            b.add("DCGM_FI_DEV_GPU_UTIL", lab, _percent(found.sm_share_ratio))
            b.add("DCGM_FI_DEV_FB_USED", lab, _mib(found.memory_used_bytes))
        elif mapped:
            # The process table was read and this container has no process on the GPU.
            b.add("DCGM_FI_DEV_GPU_UTIL", lab, 0.0)
            b.add("DCGM_FI_DEV_FB_USED", lab, 0.0)


def render_lines(snap: Snapshot, hostname: str, label_cache: dict[Labels, str] | None = None) -> dict[str, list[str]]:
    """Sample lines of every DCGM-compatible family for ``snap``, by family name."""
    b = _Builder({} if label_cache is None else label_cache)
    driver = snap.backend.driver_version or ""
    holders = _holders(snap)
    for gpu in snap.backend.gpus:
        if not gpu.up:
            continue
        base = _gpu_labels(gpu, hostname, driver)
        holder = holders.exclusive.get(gpu.uuid)
        _render_gpu(b, gpu, base + _pod_labels(holder) if holder is not None else base, snap)
        for leaf in gpu.leaves:
            lab = _leaf_labels(base, leaf)
            leaf_holder = holders.exclusive.get(leaf.leaf_id)
            _render_leaf(b, gpu, leaf, lab + _pod_labels(leaf_holder) if leaf_holder is not None else lab, snap)
        allocs = holders.shared.get(gpu.uuid)
        if allocs:
            _render_shared(b, base, gpu, allocs, snap)
    return b.lines


def encode(lines: dict[str, list[str]], openmetrics: bool) -> str:
    """Exposition text of the families in FIELDS order (no ``# EOF``: the caller's body ends it)."""
    untyped = "unknown" if openmetrics else "untyped"
    out: list[str] = []
    for spec in FIELDS:
        samples = lines.get(spec.name)
        if samples:
            kind = untyped if spec.type == "unknown" else spec.type
            out.append(f"# HELP {spec.name} {spec.help}\n# TYPE {spec.name} {kind}\n")
            out.extend(samples)
    return "".join(out)


class DcgmCompatRenderer:
    """The compat block of an exposition, built once per snapshot and format.

    prometheus_client's encoder escapes and checks every label of every sample on each render;
    dcgm-exporter's label sets are wide (7 to 12 labels) and almost never change, so the encoded
    label sets are cached across snapshots and each snapshot only formats its values. A failure
    while rendering drops the compat block for that snapshot (``ok`` says so), never the scrape.
    """

    def __init__(self, hostname: str) -> None:
        self.hostname = hostname
        self._lock = threading.Lock()
        self._labels: dict[Labels, str] = {}
        self._snapshot: Snapshot | None = None
        self._lines: dict[str, list[str]] | None = None
        self._text: dict[bool, bytes] = {}

    def _render(self, snap: Snapshot) -> dict[str, list[str]] | None:
        if snap is not self._snapshot:
            self._snapshot, self._text = snap, {}
            try:
                self._lines = render_lines(snap, self.hostname, self._labels)
            except Exception:
                log.exception("rendering the DCGM-compatible series failed")
                self._lines = None
        return self._lines

    def text(self, snap: Snapshot, openmetrics: bool) -> bytes:
        """The compat families for ``snap`` in the text (0.0.4) or OpenMetrics format."""
        with self._lock:
            lines = self._render(snap)
            if lines is None:
                return b""
            body = self._text.get(openmetrics)
            if body is None:
                body = self._text[openmetrics] = encode(lines, openmetrics).encode()
            return body

    def ok(self, snap: Snapshot) -> bool:
        """Whether the compat block of ``snap`` rendered (``gpulens_stage_success{stage=...}``)."""
        with self._lock:
            return self._render(snap) is not None
