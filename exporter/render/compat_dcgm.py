"""DCGM-compatible series (``--compat.dcgm``): dcgm-exporter's names, units and labels, rendered
from the same immutable Snapshot as the native series, so dashboards, cost tools and autoscalers
written for dcgm-exporter keep working.  docs/dcgm-compat.md is the mapping and the differences.

Identity labels follow dcgm-exporter: ``gpu`` (index), ``UUID`` (physical GPU), ``pci_bus_id``,
``device`` (``nvidia<index>``), ``modelName``, ``GPU_I_PROFILE`` and ``GPU_I_ID`` on MIG instance
series, ``Hostname``, ``DCGM_FI_DRIVER_VERSION``, and ``namespace``/``pod``/``container`` where one
container holds the device.  Units follow DCGM: percent, MiB, MHz, W, mJ, degrees C; the profiling
fields are ratios.  Each entry of ``FIELDS`` states its scope (GPU, leaf or pod), its source series
and how its value is read from the snapshot, like the native catalogue (exporter/render/metrics.py); one
loop renders them all.

Every device field appears exactly once per device (GPU or leaf), so ``sum()`` over a field is the
devices' total and per-GPU dashboards draw one line per GPU.  On a shared GPU (time-slicing, MPS)
the device series carry no pod; each container's own share lives in the pod-scope families
(``DCGM_FI_DEV_GPU_UTIL_POD``, ``DCGM_FI_DEV_FB_USED_POD``), never under a device field's name.
DCGM's counters are typed ``counter`` in the text format, as dcgm-exporter declares them, and
``unknown`` in OpenMetrics, where a counter's samples would have to end in ``_total``.

The PCIe and NVLink rates (bytes per second) are per leaf, from the leaf's own link reads (the
ones the native ``*_bytes_total`` counters integrate), with the GPU's rate once per GPU where no
leaf has a read.  Families are built once per snapshot and reused (a scrape between two snapshots
costs nothing here); no NVML.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.utils import floatToGoString

from exporter.attribution.cgroup import STAGE as CGROUP_STAGE
from exporter.model import NVLINK, PCIE, Allocation, GpuSample, LeafAnalysis, LeafSample, PodRef, PodUsage, Snapshot
from exporter.node_label import NODE_LABEL
from exporter.render.exposition import escape_label_value
from exporter.render.scopes import GpuView, gpu_view

log = logging.getLogger(__name__)

MIB = 1024**2

Labels = tuple[tuple[str, str], ...]
"""Label pairs in dcgm-exporter's order; tuples so their encoded form can be cached."""
Value = float | int | None

GPU = "gpu"
"""Scope: once per physical GPU (device-wide readings)."""
LEAF = "leaf"
"""Scope: once per leaf, a whole GPU or a MIG instance."""
POD = "pod"
"""Scope: once per container on a shared GPU (time-slicing, MPS), from per-process readings."""


@dataclass(frozen=True)
class LeafView:
    """What a per-leaf field reads: the leaf, its GPU and the leaf's analysis entry."""

    gpu: GpuSample
    leaf: LeafSample
    analysis: LeafAnalysis | None


@dataclass(frozen=True)
class TenantView:
    """A container holding a shared GPU: its own usage there, and whether processes were mapped to
    pods this cycle (mapped with no usage: the container has no process on the GPU, so 0)."""

    usage: PodUsage | None
    mapped: bool


@dataclass(frozen=True)
class DcgmField:
    """One DCGM field gpulens renders: its name, exposition type, help, scope, source and reads."""

    name: str
    type: str
    """``gauge`` or ``counter``, as dcgm-exporter declares the field (etc/default-counters.csv); a
    counter is ``counter`` in the text format and ``unknown`` in OpenMetrics (see ``encode``)."""
    help: str
    scope: str
    source: str
    """The gpulens series (or model field) the value comes from, for docs/dcgm-compat.md."""
    read: Callable[[Any], Value]
    """The value from the scope's view (exporter/render/scopes.py's GpuView, a LeafView or a TenantView),
    in DCGM's unit."""
    extra_labels: Callable[[Any], Labels] | None = None
    """Labels after the identity labels (the Xid's ``err_code``)."""
    device: Callable[[GpuView], Value] | None = None
    """For a per-leaf field: the GPU-wide reading of the same quantity, rendered once per GPU (GPU
    labels) when none of its leaves has a value, e.g. a backend that reads a link for the whole
    GPU only."""


def _gpu(
    name: str,
    type_: str,
    help_: str,
    source: str,
    read: Callable[[GpuView], Value],
    *,
    extra_labels: Callable[[GpuView], Labels] | None = None,
) -> DcgmField:
    return DcgmField(name, type_, help_, GPU, source, read, extra_labels)


def _leaf(
    name: str,
    type_: str,
    help_: str,
    source: str,
    read: Callable[[LeafView], Value],
    *,
    device: Callable[[GpuView], Value] | None = None,
) -> DcgmField:
    return DcgmField(name, type_, help_, LEAF, source, read, device=device)


def _pod(name: str, help_: str, source: str, read: Callable[[TenantView], Value]) -> DcgmField:
    """A gauge per container holding a shared GPU: the container's own share of a device field."""
    return DcgmField(name, "gauge", help_, POD, source, read)


def _percent(ratio: float | None) -> float | None:
    return None if ratio is None else ratio * 100.0


def _mhz(hertz: float | None) -> float | None:
    return None if hertz is None else hertz / 1e6


def _mib(n: int | None) -> float | None:
    return None if n is None else n / MIB


def _energy_mj(v: GpuView) -> Value:
    joules = v.analysis.energy_joules if v.analysis is not None else None
    return None if joules is None else joules * 1000.0


def _fb_free(v: LeafView) -> Value:
    used, total, reserved = v.leaf.memory_used_bytes, v.leaf.memory_total_bytes, v.leaf.memory_reserved_bytes
    if used is None or total is None:
        return None
    # NVML v2: total = used + free + reserved; v1 (reserved unknown): total = used + free.
    return _mib(max(0, total - used - (reserved or 0)))


def _busy(v: LeafView) -> Value:
    busy = v.analysis.busy_ratio if v.analysis is not None else None
    if busy is None and v.leaf.mig is None:
        busy = v.gpu.utilization_ratio  # no GPM (pre-Hopper): NVML GPU-Util, the same duty cycle
    return busy


def _gpm(attr: str) -> Callable[[LeafView], Value]:
    """A GPM ratio of the leaf (the same definition and 0..1 unit as DCGM's profiling field)."""
    return lambda v: getattr(v.leaf.gpm, attr) if v.leaf.gpm is not None else None


def _link_rate(link: str, direction: str) -> Callable[[LeafView], Value]:
    """The leaf's bytes per second over ``link`` (``pcie``/``nvlink``) in ``direction`` (``tx`` out
    of the GPU, ``rx`` into it) during the last cycle: the same read its ``*_bytes_total`` counter
    integrates (a whole GPU: the device's; a MIG instance: its own share)."""
    attr = f"{direction}_bytes_per_second"

    def read(v: LeafView) -> Value:
        traffic = next((x for x in v.leaf.links if x.link == link), None)
        rate: Value = getattr(traffic, attr) if traffic is not None else None
        return rate

    return read


def _link_field(link: str, direction: str, help_: str) -> DcgmField:
    """``DCGM_FI_PROF_<LINK>_<DIR>_BYTES``: a gauge in bytes per second, per leaf like the other
    profiling fields, the GPU's own rate where no leaf has one."""
    native = f"gpulens_gpu_{link}_{direction}_bytes"
    return _leaf(
        f"DCGM_FI_PROF_{link.upper()}_{direction.upper()}_BYTES",
        "gauge",
        help_,
        f"the leaf's {link} link read, rate({native}_total) over one cycle; else {native}_per_second",
        _link_rate(link, direction),
        device=lambda v: getattr(v.gpu, f"{link}_{direction}_bytes_per_second"),
    )


def _tenant(value: Callable[[PodUsage], Value]) -> Callable[[TenantView], Value]:
    """A container's own reading on a shared GPU; 0 when mapped without a process there."""
    return lambda t: value(t.usage) if t.usage is not None else (0.0 if t.mapped else None)


# Field order is dcgm-exporter's default counter order where it has the field.
FIELDS: tuple[DcgmField, ...] = (
    _gpu(
        "DCGM_FI_DEV_SM_CLOCK",
        "gauge",
        "SM clock frequency (in MHz).",
        "gpulens_gpu_sm_clock_hertz / 1e6",
        lambda v: _mhz(v.gpu.sm_clock_hertz),
    ),
    _gpu(
        "DCGM_FI_DEV_MEM_CLOCK",
        "gauge",
        "Memory clock frequency (in MHz).",
        "gpulens_gpu_memory_clock_hertz / 1e6",
        lambda v: _mhz(v.gpu.memory_clock_hertz),
    ),
    _gpu(
        "DCGM_FI_DEV_MAX_SM_CLOCK",
        "gauge",
        "Maximum SM clock (in MHz).",
        "gpulens_gpu_sm_clock_max_hertz / 1e6",
        lambda v: _mhz(v.gpu.sm_clock_max_hertz),
    ),
    _gpu(
        "DCGM_FI_DEV_MEMORY_TEMP",
        "gauge",
        "Memory temperature (in C).",
        "gpulens_gpu_memory_temperature_celsius",
        lambda v: v.gpu.memory_temperature_celsius,
    ),
    _gpu(
        "DCGM_FI_DEV_GPU_TEMP",
        "gauge",
        "GPU temperature (in C).",
        "gpulens_gpu_temperature_celsius",
        lambda v: v.gpu.temperature_celsius,
    ),
    _gpu(
        "DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", "gpulens_gpu_power_watts", lambda v: v.gpu.power_watts
    ),
    _gpu(
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "gauge",
        "Power limit the driver enforces (in W).",
        "gpulens_gpu_power_limit_watts",
        lambda v: v.gpu.power_limit_watts,
    ),
    _gpu(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since the exporter first saw the GPU (in mJ; a counter).",
        "gpulens_gpu_energy_joules_total * 1000",
        _energy_mj,
    ),
    _gpu(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "counter",
        "Total number of PCIe retries (a counter).",
        "gpulens_gpu_pcie_replay_errors_total",
        lambda v: v.gpu.pcie_replay_errors,
    ),
    _gpu(
        "DCGM_FI_DEV_PCIE_LINK_GEN",
        "gauge",
        "Current PCIe link generation.",
        "gpulens_gpu_pcie_link_generation",
        lambda v: v.gpu.pcie_link_generation,
    ),
    _gpu(
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        "gauge",
        "Current PCIe link width.",
        "gpulens_gpu_pcie_link_width",
        lambda v: v.gpu.pcie_link_width,
    ),
    _gpu(
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "GPU utilization (in %).",
        "gpulens_gpu_utilization_ratio * 100",
        lambda v: _percent(v.gpu.utilization_ratio),
    ),
    _pod(
        "DCGM_FI_DEV_GPU_UTIL_POD",
        "Share of sampled time a kernel of the container's processes ran on a shared GPU (in %; NVML "
        "per-process utilisation, not SM activity; not a DCGM field).",
        "gpulens_pod_gpu_kernel_time_ratio * 100",
        _tenant(lambda u: _percent(u.kernel_time_ratio)),
    ),
    _gpu(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
        "gpulens_gpu_memory_utilization_ratio * 100",
        lambda v: _percent(v.gpu.memory_utilization_ratio),
    ),
    _gpu(
        "DCGM_FI_DEV_FAN_SPEED",
        "gauge",
        "Fan speed (in %).",
        "gpulens_gpu_fan_speed_ratio * 100",
        lambda v: _percent(v.gpu.fan_speed_ratio),
    ),
    _gpu(
        "DCGM_FI_DEV_XID_ERRORS",
        "gauge",
        "Value of the last Xid error seen since the exporter started (0: none).",
        "the newest gpulens_gpu_xid_errors_total{xid} to increase",
        lambda v: v.last_xid,
        extra_labels=lambda v: (("err_code", str(v.last_xid)),),
    ),
    _leaf(
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "Framebuffer memory free (in MiB).",
        "(gpulens_gpu_memory_total_bytes - gpulens_gpu_memory_used_bytes - reserved) / 2^20",
        _fb_free,
    ),
    _leaf(
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "Framebuffer memory used (in MiB).",
        "gpulens_gpu_memory_used_bytes / 2^20",
        lambda v: _mib(v.leaf.memory_used_bytes),
    ),
    _pod(
        "DCGM_FI_DEV_FB_USED_POD",
        "Framebuffer memory used by the container's processes on a shared GPU (in MiB; not a DCGM field).",
        "gpulens_pod_gpu_memory_used_bytes / 2^20",
        _tenant(lambda u: _mib(u.memory_used_bytes)),
    ),
    _leaf(
        "DCGM_FI_DEV_FB_RESERVED",
        "gauge",
        "Framebuffer memory reserved by the driver (in MiB).",
        "NVML memory info v2 reserved / 2^20 (not a native series)",
        lambda v: _mib(v.leaf.memory_reserved_bytes),
    ),
    _leaf(
        "DCGM_FI_DEV_FB_TOTAL",
        "gauge",
        "Framebuffer memory total (in MiB).",
        "gpulens_gpu_memory_total_bytes / 2^20",
        lambda v: _mib(v.leaf.memory_total_bytes),
    ),
    _gpu(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "counter",
        "Total number of single-bit volatile ECC errors (a counter).",
        'gpulens_gpu_ecc_errors_total{severity="corrected"}',
        lambda v: (v.gpu.ecc_errors or {}).get("corrected"),
    ),
    _gpu(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "counter",
        "Total number of double-bit volatile ECC errors (a counter).",
        'gpulens_gpu_ecc_errors_total{severity="uncorrected"}',
        lambda v: (v.gpu.ecc_errors or {}).get("uncorrected"),
    ),
    _gpu(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors (a counter).",
        'gpulens_gpu_remapped_rows{cause="uncorrectable"}',
        lambda v: (v.gpu.remapped_rows or {}).get("uncorrectable"),
    ),
    _gpu(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors (a counter).",
        'gpulens_gpu_remapped_rows{cause="correctable"}',
        lambda v: (v.gpu.remapped_rows or {}).get("correctable"),
    ),
    _gpu(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gauge",
        "Whether remapping of rows has failed.",
        "gpulens_gpu_row_remap_failure",
        lambda v: (v.gpu.remapped_rows or {}).get("failure"),
    ),
    _gpu(
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "gauge",
        "Whether rows are pending remapping (a GPU reset is needed).",
        "gpulens_gpu_row_remap_pending",
        lambda v: (v.gpu.remapped_rows or {}).get("pending"),
    ),
    _leaf(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        "gpulens_gpu_busy_ratio (GPM graphics-engine activity; NVML GPU-Util where GPM lacks it)",
        _busy,
    ),
    _leaf(
        "DCGM_FI_PROF_SM_ACTIVE",
        "gauge",
        "The ratio of cycles an SM has at least 1 warp assigned.",
        "gpulens_gpu_sm_active_ratio",
        _gpm("sm_active"),
    ),
    _leaf(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "gauge",
        "The ratio of number of warps resident on an SM.",
        "gpulens_gpu_sm_occupancy_ratio",
        _gpm("sm_occupancy"),
    ),
    _leaf(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        "gpulens_gpu_tensor_active_ratio",
        _gpm("tensor_active"),
    ),
    _leaf(
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "gauge",
        "Ratio of cycles the fp64 pipes are active.",
        "gpulens_gpu_fp64_active_ratio",
        _gpm("fp64_active"),
    ),
    _leaf(
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "gauge",
        "Ratio of cycles the fp32 pipes are active.",
        "gpulens_gpu_fp32_active_ratio",
        _gpm("fp32_active"),
    ),
    _leaf(
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "gauge",
        "Ratio of cycles the fp16 pipes are active.",
        "gpulens_gpu_fp16_active_ratio",
        _gpm("fp16_active"),
    ),
    _leaf(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        "gpulens_gpu_dram_active_ratio",
        _gpm("dram_active"),
    ),
    _link_field(
        PCIE,
        "tx",
        "The rate of data transmitted over the PCIe bus, including both protocol headers and data "
        "payloads, in bytes per second.",
    ),
    _link_field(
        PCIE,
        "rx",
        "The rate of data received over the PCIe bus, including both protocol headers and data "
        "payloads, in bytes per second.",
    ),
    _link_field(NVLINK, "tx", "The rate of data transmitted over NVLink, in bytes per second."),
    _link_field(NVLINK, "rx", "The rate of data received over NVLink, in bytes per second."),
)

MAX_CACHED_LABEL_SETS = 50_000
"""Bound of the label sets kept from one render to the next (LabelCache)."""


class LabelCache:
    """Encoded label sets by labels, in two generations as exporter.render.exposition.LabelSets keeps
    them: a set no render used since the one before is dropped, so pods that came and went do not
    stay in memory."""

    def __init__(self) -> None:
        self.current: dict[Labels, str] = {}
        self.previous: dict[Labels, str] = {}

    def next_render(self) -> None:
        """Start a render."""
        if self.current:
            self.previous, self.current = self.current, {}


"""Bound of the encoded-label cache: pods come and go, the cache must not grow with them."""


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


class _Builder:
    """Sample lines of one snapshot by family; label sets are encoded once and cached across
    snapshots (identity and holders rarely change, values do)."""

    def __init__(self, label_cache: LabelCache) -> None:
        self.lines: dict[str, list[str]] = {}
        self._cache = label_cache.current
        self._previous = label_cache.previous

    def add(self, name: str, labels: Labels, value: Value) -> bool:
        """Add one sample; False (nothing added) when the value is missing or not a number."""
        if not _valid(value):
            return False
        encoded = self._cache.get(labels)
        if encoded is None:
            encoded = self._previous.get(labels)
            if encoded is None:
                encoded = "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels) + "}"
            if len(self._cache) < MAX_CACHED_LABEL_SETS:
                self._cache[labels] = encoded
        self.lines.setdefault(name, []).append(f"{name}{encoded} {floatToGoString(value)}\n")
        return True


def _gpu_labels(gpu: GpuSample, hostname: str, driver: str, node: str = "") -> Labels:
    """dcgm-exporter's identity labels of a GPU, then gpulens' ``node`` (every series the exporter
    exports carries it; ``Hostname`` stays dcgm-exporter's) when ``node`` is not empty."""
    labels: Labels = (
        ("gpu", str(gpu.index)),
        ("UUID", gpu.uuid),
        ("pci_bus_id", gpu.pci_bus_id or ""),
        ("device", f"nvidia{gpu.index}"),
        ("modelName", gpu.name or ""),
        ("Hostname", hostname),
        ("DCGM_FI_DRIVER_VERSION", driver),
    )
    return (*labels, (NODE_LABEL, node)) if node else labels


def _leaf_labels(base: Labels, leaf: LeafSample) -> Labels:
    if leaf.mig is None:
        return base
    mig = (("GPU_I_PROFILE", leaf.mig.profile), ("GPU_I_ID", str(leaf.mig.gpu_instance_id)))
    return base[:5] + mig + base[5:]  # dcgm-exporter's order: after modelName, before Hostname


_GPU_FIELDS = tuple(f for f in FIELDS if f.scope == GPU)
_LEAF_FIELDS = tuple(f for f in FIELDS if f.scope == LEAF)
_POD_FIELDS = tuple(f for f in FIELDS if f.scope == POD)
_DEVICE_FIELDS = tuple(f for f in _LEAF_FIELDS if f.device is not None)


def _add(b: _Builder, field: DcgmField, labels: Labels, view: Any) -> bool:
    extra = field.extra_labels(view) if field.extra_labels is not None else ()
    return b.add(field.name, labels + extra, field.read(view))


def _process_mapping_ok(snap: Snapshot) -> bool:
    return any(st.stage == CGROUP_STAGE and st.success for st in snap.stages)


def _tenants(gpu: GpuSample, allocs: list[Allocation], snap: Snapshot) -> Iterator[tuple[PodRef, TenantView]]:
    """Each container holding a shared GPU once, with its own usage there."""
    usage: dict[tuple[str, str, str], PodUsage] = {}
    if snap.attribution is not None:
        for u in snap.attribution.usages:
            if u.uuid == gpu.uuid:
                usage[(u.pod.namespace, u.pod.pod, u.pod.container)] = u
    mapped = _process_mapping_ok(snap)
    seen: set[tuple[str, str, str]] = set()
    for a in allocs:
        key = (a.pod.namespace, a.pod.pod, a.pod.container)
        if key not in seen:
            seen.add(key)
            yield a.pod, TenantView(usage.get(key), mapped)


def render_lines(
    snap: Snapshot, hostname: str, label_cache: LabelCache | None = None, node: str = ""
) -> dict[str, list[str]]:
    """Sample lines of every DCGM-compatible family for ``snap``, by family name; ``node``, when
    not empty, is the ``node`` label of every series (after dcgm-exporter's own).

    One loop over FIELDS per instance of their scope: each answering GPU (device-wide fields, with
    the pod labels of the one container holding it), each of its leaves (per-leaf fields, likewise),
    and each container of a shared GPU (the pod-scope fields, the GPU's identity labels plus the
    container's).  A device field is added once per device, so no two of its series differ by pod
    alone."""
    cache = LabelCache() if label_cache is None else label_cache
    cache.next_render()
    b = _Builder(cache)
    driver = snap.backend.driver_version or ""
    holders = _holders(snap)
    for gpu in snap.backend.gpus:
        if not gpu.up:
            continue
        base = _gpu_labels(gpu, hostname, driver, node)
        holder = holders.exclusive.get(gpu.uuid)
        g = base + _pod_labels(holder) if holder is not None else base
        gview = gpu_view(snap, gpu)
        for field in _GPU_FIELDS:
            _add(b, field, g, gview)
        answered: set[str] = set()
        for leaf in gpu.leaves:
            lab = _leaf_labels(base, leaf)
            leaf_holder = holders.exclusive.get(leaf.leaf_id)
            lab = lab + _pod_labels(leaf_holder) if leaf_holder is not None else lab
            lview = LeafView(gpu, leaf, snap.analysis.get(leaf.leaf_id))
            for field in _LEAF_FIELDS:
                if _add(b, field, lab, lview) and field.device is not None:
                    answered.add(field.name)
        for field in _DEVICE_FIELDS:
            if field.name not in answered:
                assert field.device is not None
                b.add(field.name, g, field.device(gview))
        for pod, tenant in _tenants(gpu, holders.shared.get(gpu.uuid, []), snap):
            for field in _POD_FIELDS:
                b.add(field.name, base + _pod_labels(pod), field.read(tenant))
    return b.lines


def encode(lines: dict[str, list[str]], openmetrics: bool) -> str:
    """Exposition text of the families in FIELDS order (no ``# EOF``: the caller's body ends it).

    A counter is ``counter`` in the text format, as dcgm-exporter writes it.  OpenMetrics requires a
    counter's samples to be named ``<family>_total``; DCGM's names have no such suffix and renaming
    them would break every query, so there they are ``unknown`` (the type OpenMetrics gives a
    sample it does not describe; PromQL's ``rate()`` and ``increase()`` work on it the same)."""
    out: list[str] = []
    for spec in FIELDS:
        samples = lines.get(spec.name)
        if samples:
            kind = "unknown" if openmetrics and spec.type == "counter" else spec.type
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

    def __init__(self, hostname: str, node: str = "") -> None:
        self.hostname = hostname
        self.node = node
        """The ``node`` label of every series (``exporter.node_label``); empty: none."""
        self._lock = threading.Lock()
        self._labels = LabelCache()
        self._snapshot: Snapshot | None = None
        self._lines: dict[str, list[str]] | None = None
        self._text: dict[bool, bytes] = {}

    def _render(self, snap: Snapshot) -> dict[str, list[str]] | None:
        if snap is not self._snapshot:
            self._snapshot, self._text = snap, {}
            try:
                self._lines = render_lines(snap, self.hostname, self._labels, self.node)
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
                try:
                    body = encode(lines, openmetrics).encode()
                except UnicodeEncodeError:  # a label value that is not valid UTF-8: the block, not the page
                    log.exception("writing the DCGM-compatible series failed")
                    self._lines = None
                    return b""
                self._text[openmetrics] = body
            return body

    def ok(self, snap: Snapshot) -> bool:
        """Whether the compat block of ``snap`` rendered (``gpulens_stage_success{stage=...}``)."""
        with self._lock:
            return self._render(snap) is not None
