"""The metric catalogue: every series gpulens exports, and how each is read from a snapshot.

Each entry states its name, type, unit, help, the scope it is exported once per (a GPU, a leaf, a
pod's device, a probe... see exporter/render/scopes.py), the labels it adds to the scope's identity labels,
and the function that reads its value (or values) from the scope's view of the snapshot.  The
collector renders every entry with one generic loop (exporter/render/collector.py), docs/metrics.md is
generated from here (``python -m exporter.render.metrics --markdown``), and the dashboard imports names from
here.  Renaming an entry breaks users' dashboards and alerts: change it only on purpose.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from exporter.model import (
    BOUNDNESS_CLASSES,
    LINKS,
    NVLINK,
    NVLINK_ERROR_KINDS,
    PCIE,
    POD_BOUNDNESS_CLASSES,
    TEMPERATURE_THRESHOLDS,
    GpmSample,
    LeafAnalysis,
    LeafSample,
    LinkTraffic,
    Snapshot,
)
from exporter.render.scopes import (
    ALLOCATION,
    ATTRIBUTION,
    DEVICE,
    EXPORTER,
    GPM,
    GPU,
    GPU_LABELS,
    GPU_NIC,
    LEAF,
    LEAF_ANALYSIS,
    LEAF_LABELS,
    NIC,
    NIC_ALLOCATION,
    NIC_PORT,
    NODE,
    POD_CLASS,
    POD_LABELS,
    POD_USAGE,
    PROBE,
    PROBE_RUNS,
    SCOPES,
    Frame,
    LabelValues,
    Scope,
)

__all__ = ["BY_NAME", "CATALOGUE", "GPU_LABELS", "LEAF_LABELS", "POD_LABELS", "MetricSpec", "spec"]

MetricType = Literal["gauge", "counter"]
Value = float | None
"""A reading; ``None`` (and NaN or infinity) means "not available" and is omitted, never 0."""
Sample = tuple[LabelValues, Value]
"""The values of an entry's own labels (after its scope's) and the reading."""
V = TypeVar("V")


@dataclass(frozen=True)
class MetricSpec:
    """One metric family of the public contract, and where its samples come from."""

    name: str
    type: MetricType
    unit: str
    """Base unit (``bytes``, ``seconds``, ``watts``, ``joules``, ``hertz``, ``celsius``,
    ``ratio``) or ``""`` for counts, states and info series."""
    help: str
    scope: Scope[Any]
    """What the family is exported once per; its label names come first in ``labels``."""
    own_labels: tuple[str, ...]
    """The labels this entry adds after its scope's identity labels."""
    read: Callable[[Any], Iterable[Sample]]
    """The samples of one scope instance: its own label values and the reading."""
    section: str = "device"
    """Which part of the exporter produces it (docs grouping)."""

    @property
    def labels(self) -> tuple[str, ...]:
        """Every label name of the family, in order: the scope's, then the entry's own."""
        return (*self.scope.labels, *self.own_labels)


class OneSample(Generic[V]):
    """A read of one sample per instance that adds no label; ``value`` gives the reading alone, so
    the renderer can skip building a sample tuple per instance."""

    __slots__ = ("value",)

    def __init__(self, value: Callable[[V], Value]) -> None:
        self.value = value

    def __call__(self, view: V) -> Iterable[Sample]:
        return (((), self.value(view)),)


def _one(value: Callable[[V], Value]) -> Callable[[V], Iterable[Sample]]:
    """A read of one sample per instance that adds no label."""
    return OneSample(value)


def _m(
    kind: MetricType,
    name: str,
    unit: str,
    help_: str,
    scope: Scope[V],
    value: Callable[[V], Value] | None = None,
    *,
    each: Callable[[V], Iterable[Sample]] | None = None,
    labels: tuple[str, ...] = (),
    section: str = "device",
) -> MetricSpec:
    """One entry: ``value`` reads one sample per scope instance; ``each`` reads several and gives
    the values of the ``labels`` the entry adds (a counter's name ends in ``_total``)."""
    if (value is None) == (each is None):
        raise ValueError(f"{name}: give exactly one of value= (one sample) or each= (several)")
    if value is not None and labels:
        raise ValueError(f"{name}: an entry that adds labels {labels} reads its samples with each=")
    read = _one(value) if value is not None else each
    assert read is not None
    return MetricSpec(name, kind, unit, help_, scope, labels, read, section)


def _flag(on: bool) -> float:
    return 1.0 if on else 0.0


def _stages(frame: Frame) -> Iterable[Sample]:
    """Each pipeline stage of the snapshot once, then every render stage that failed."""
    seen: set[str] = set()
    if frame.snapshot is not None:
        for st in frame.snapshot.stages:
            if st.stage not in seen:
                seen.add(st.stage)
                yield (st.stage,), _flag(st.success)
    for stage in sorted(frame.failed_renders):
        yield (f"render_{stage}",), 0.0


def _stage_durations(frame: Frame) -> Iterable[Sample]:
    seen: set[str] = set()
    if frame.snapshot is not None:
        for st in frame.snapshot.stages:
            if st.stage not in seen:
                seen.add(st.stage)
                yield (st.stage,), st.duration_seconds


def _age(frame: Frame) -> Value:
    if frame.snapshot is None or frame.now is None:
        return None
    return max(0.0, frame.now - frame.snapshot.timestamp)


def _gpm(attr: str) -> Callable[[GpmSample], Value]:
    """The GPM ratio ``attr`` of a leaf."""
    return lambda gpm: getattr(gpm, attr)


def _classes(classes: tuple[str, ...], current: str | None) -> Iterable[Sample]:
    """A state set: one sample per class, 1 for the current one; nothing without a class."""
    if current is None:
        return ()
    return (((cls,), _flag(cls == current)) for cls in classes)


def _link(leaf: LeafSample, name: str) -> LinkTraffic | None:
    return next((x for x in leaf.links if x.link == name), None)


def _link_ratio(name: str) -> Callable[[LeafSample], Value]:
    """The leaf's utilisation of link ``name`` (busier direction over capacity)."""

    def read(leaf: LeafSample) -> Value:
        link = _link(leaf, name)
        return link.utilization_ratio() if link is not None else None

    return read


def _link_bytes(name: str, direction: str) -> Callable[[LeafAnalysis], Value]:
    """Bytes the leaf moved over link ``name`` in ``direction`` since the exporter first saw it."""
    return lambda a: a.link_bytes.get((name, direction))


def _link_sources(leaf: LeafSample) -> Iterable[Sample]:
    return (((link.link, link.source), 1.0) for link in leaf.links if link.link in LINKS)


def _by_kind(kinds: tuple[str, ...], values: Mapping[str, float] | None) -> Iterable[Sample]:
    """One sample per kind in ``values``, in the order of ``kinds``; nothing for ``None``."""
    if not values:
        return ()
    return (((kind,), float(values[kind])) for kind in kinds if kind in values)


NO_XID = ""
"""The ``xid`` label of each GPU's series that stays at 0 (Prometheus stores it without the label):
present from the first scrape, so a GPU without Xid reads 0, not "no data" (as dcgm-exporter
always exports its Xid field), and never taken for an Xid code (there is no Xid 0 in NVIDIA's
catalogue, but a ``xid="0"`` would read as one)."""


def _xids(snap: Snapshot) -> Iterable[Sample]:
    """Xid counts by GPU and code, after a series at 0 per GPU (``NO_XID``); a GPU the backend no
    longer lists keeps its UUID (index empty)."""
    index_of = {g.uuid: str(g.index) for g in snap.backend.gpus}
    by_gpu: dict[str, list[tuple[int, int]]] = {uuid: [] for uuid in index_of}  # in the backend's order
    for (uuid, xid), n in sorted(snap.xid_totals.items()):
        by_gpu.setdefault(uuid, []).append((xid, n))  # then GPUs no longer listed, by UUID
    for uuid in by_gpu:
        index = index_of.get(uuid, "")
        yield (index, uuid, NO_XID), 0.0
        for xid, n in by_gpu[uuid]:
            yield (index, uuid, str(xid)), float(n)


CATALOGUE: tuple[MetricSpec, ...] = (
    # --- self-health -------------------------------------------------------------------
    _m(
        "gauge",
        "gpulens_up",
        "",
        "1 when the GPU backend (NVML or simulator) answers, else 0.",
        EXPORTER,
        lambda f: _flag(f.snapshot is not None and f.snapshot.backend.up),
        section="self",
    ),
    _m(
        "gauge",
        "gpulens_build_info",
        "",
        "Exporter build: version and the backend in use (nvml or sim); always 1.",
        EXPORTER,
        each=lambda f: (((f.version, f.backend), 1.0),),
        labels=("version", "backend"),
        section="self",
    ),
    _m(
        "gauge",
        "gpulens_stage_success",
        "",
        "1 if the pipeline stage succeeded in the newest snapshot, 0 if it failed (its series are absent).",
        EXPORTER,
        each=_stages,
        labels=("stage",),
        section="self",
    ),
    _m(
        "gauge",
        "gpulens_stage_duration_seconds",
        "seconds",
        "Wall time the pipeline stage took in the newest snapshot.",
        EXPORTER,
        each=_stage_durations,
        labels=("stage",),
        section="self",
    ),
    _m(
        "counter",
        "gpulens_render_errors_total",
        "",
        "Snapshots in which the family could not be rendered (a read that raised, label values that do "
        "not match its labels, a value that cannot be written), counted once per snapshot; the family is "
        "left out of that page alone, and /readyz names it. family is the family's name, or compat_dcgm "
        "for the DCGM-compatible block. Absent while nothing failed.",
        EXPORTER,
        each=lambda f: (((family,), float(n)) for family, n in sorted(f.render_errors.items())),
        labels=("family",),
        section="self",
    ),
    _m(
        "counter",
        "gpulens_label_values_rewritten_total",
        "",
        "Names rewritten where they entered the exporter (sysfs, Kubernetes API, kubelet, DRA) to be valid "
        "label values, by reason: invalid_utf8 (bytes that are not UTF-8 or lone surrogates, escaped as "
        "\\xHH or \\uHHHH), too_long (over 253 characters: cut, with a hash of the whole name). Counted "
        "each time a value is read in, so it grows while a source keeps offering the value (docs/labels.md).",
        EXPORTER,
        each=lambda f: (((reason,), float(n)) for reason, n in (f.label_rewrites or {}).items()),
        labels=("reason",),
        section="self",
    ),
    _m(
        "gauge",
        "gpulens_snapshot_age_seconds",
        "seconds",
        "Age of the snapshot this scrape rendered; grows if sampling is stuck.",
        EXPORTER,
        _age,
        section="self",
    ),
    _m(
        "counter",
        "gpulens_nvml_errors_total",
        "",
        "NVML calls that failed with a transient error, by NVML error code.",
        NODE,
        each=lambda s: (((str(code),), float(n)) for code, n in sorted(s.nvml_errors.items())),
        labels=("code",),
        section="self",
    ),
    # --- identity ----------------------------------------------------------------------
    _m(
        "gauge",
        "gpulens_gpu_info",
        "",
        "Identity of a physical GPU; always 1. Join on uuid.",
        GPU,
        each=lambda v: (
            (
                (
                    v.gpu.name or "",
                    v.gpu.pci_bus_id or "",
                    v.driver_version,
                    v.gpu.compute_capability or "",
                    v.gpu.mig_mode or "",
                ),
                1.0,
            ),
        ),
        labels=("name", "pci_bus_id", "driver_version", "compute_capability", "mig_mode"),
    ),
    _m(
        "gauge",
        "gpulens_gpu_up",
        "",
        "1 if the GPU answers, 0 if it is lost or unreadable.",
        DEVICE,
        lambda g: _flag(g.up),
    ),
    _m(
        "gauge",
        "gpulens_mig_instance_info",
        "",
        "Identity of a MIG instance on its physical GPU; always 1.",
        LEAF,
        lambda leaf: 1.0 if leaf.mig is not None else None,
    ),
    # --- utilisation (NVML) ------------------------------------------------------------
    _m(
        "gauge",
        "gpulens_gpu_utilization_ratio",
        "ratio",
        "NVML GPU-Util: fraction of time one or more kernels ran (what nvidia-smi shows). "
        "Not SM activity: see gpulens_gpu_sm_active_ratio.",
        GPU,
        lambda v: v.gpu.utilization_ratio,
    ),
    _m(
        "gauge",
        "gpulens_gpu_memory_utilization_ratio",
        "ratio",
        "NVML util.mem: fraction of time the memory controller was busy (not capacity used).",
        GPU,
        lambda v: v.gpu.memory_utilization_ratio,
    ),
    # --- GPM profiling (per leaf) ------------------------------------------------------
    _m(
        "gauge",
        "gpulens_gpu_sm_active_ratio",
        "ratio",
        "GPM: fraction of SM cycles with a warp resident.",
        GPM,
        _gpm("sm_active"),
    ),
    _m(
        "gauge",
        "gpulens_gpu_sm_occupancy_ratio",
        "ratio",
        "GPM: resident warps as a fraction of the SMs' maximum.",
        GPM,
        _gpm("sm_occupancy"),
    ),
    _m(
        "gauge",
        "gpulens_gpu_tensor_active_ratio",
        "ratio",
        "GPM: tensor pipe activity (any precision).",
        GPM,
        _gpm("tensor_active"),
    ),
    _m("gauge", "gpulens_gpu_fp64_active_ratio", "ratio", "GPM: FP64 pipe activity.", GPM, _gpm("fp64_active")),
    _m("gauge", "gpulens_gpu_fp32_active_ratio", "ratio", "GPM: FP32 pipe activity.", GPM, _gpm("fp32_active")),
    _m("gauge", "gpulens_gpu_fp16_active_ratio", "ratio", "GPM: FP16 pipe activity.", GPM, _gpm("fp16_active")),
    _m(
        "gauge",
        "gpulens_gpu_dram_active_ratio",
        "ratio",
        "GPM: DRAM bandwidth used as a fraction of peak (roofline x).",
        GPM,
        _gpm("dram_active"),
    ),
    _m(
        "gauge",
        "gpulens_gpu_pipe_active_max_ratio",
        "ratio",
        "Highest of the tensor/FP64/FP32/FP16 pipe activities (roofline y).",
        GPM,
        lambda gpm: gpm.max_pipe_active(),
    ),
    _m(
        "gauge",
        "gpulens_gpu_busy_ratio",
        "ratio",
        "Busy ratio: fraction of time the leaf worked: kernels ran (GPM graphics-engine activity; "
        "NVML GPU-Util where GPM lacks it or the GPU has no GPM) or its links moved data (the busiest link's "
        "utilisation), whichever is larger. Absent for a MIG instance without GPM (no GPU-Util). The "
        "boundness class says what limits the leaf during this time.",
        LEAF_ANALYSIS,
        lambda a: a.busy_ratio,
    ),
    _m(
        "counter",
        "gpulens_gpu_busy_seconds_total",
        "seconds",
        "Integral of gpulens_gpu_busy_ratio over time; rate() gives the exact busy ratio of any window.",
        LEAF_ANALYSIS,
        lambda a: a.busy_seconds,
    ),
    _m(
        "counter",
        "gpulens_gpu_sm_active_seconds_total",
        "seconds",
        "Integral of gpulens_gpu_sm_active_ratio over time; rate() gives the exact mean.",
        LEAF_ANALYSIS,
        lambda a: a.sm_active_seconds,
    ),
    _m(
        "counter",
        "gpulens_gpu_tensor_active_seconds_total",
        "seconds",
        "Integral of gpulens_gpu_tensor_active_ratio over time.",
        LEAF_ANALYSIS,
        lambda a: a.tensor_active_seconds,
    ),
    _m(
        "counter",
        "gpulens_gpu_dram_active_seconds_total",
        "seconds",
        "Integral of gpulens_gpu_dram_active_ratio over time.",
        LEAF_ANALYSIS,
        lambda a: a.dram_active_seconds,
    ),
    # --- memory (per leaf) -------------------------------------------------------------
    _m(
        "gauge",
        "gpulens_gpu_memory_used_bytes",
        "bytes",
        "Device memory in use on the leaf.",
        LEAF,
        lambda leaf: leaf.memory_used_bytes,
    ),
    _m(
        "gauge",
        "gpulens_gpu_memory_total_bytes",
        "bytes",
        "Device memory of the leaf.",
        LEAF,
        lambda leaf: leaf.memory_total_bytes,
    ),
    _m(
        "gauge",
        "gpulens_gpu_compute_processes",
        "",
        "Compute processes running work on the leaf (tenants; an MPS server is not counted).",
        LEAF,
        lambda leaf: float(len(leaf.tenants)),
    ),
    # --- physical ----------------------------------------------------------------------
    _m("gauge", "gpulens_gpu_power_watts", "watts", "Power draw.", GPU, lambda v: v.gpu.power_watts),
    _m(
        "gauge",
        "gpulens_gpu_power_limit_watts",
        "watts",
        "Enforced power limit.",
        GPU,
        lambda v: v.gpu.power_limit_watts,
    ),
    _m(
        "counter",
        "gpulens_gpu_energy_joules_total",
        "joules",
        "Energy used since the exporter first saw the GPU (monotonic across driver counter resets).",
        GPU,
        lambda v: v.analysis.energy_joules if v.analysis is not None else None,
    ),
    _m(
        "gauge",
        "gpulens_gpu_temperature_celsius",
        "celsius",
        "GPU die temperature.",
        GPU,
        lambda v: v.gpu.temperature_celsius,
    ),
    _m(
        "gauge",
        "gpulens_gpu_memory_temperature_celsius",
        "celsius",
        "HBM temperature.",
        GPU,
        lambda v: v.gpu.memory_temperature_celsius,
    ),
    _m(
        "gauge",
        "gpulens_gpu_temperature_threshold_celsius",
        "celsius",
        "The GPU's own temperature limits, read once per GPU, by threshold: slowdown (hardware slows the "
        "clocks), shutdown (the GPU turns off to protect itself) and gpu_max (clocks may drop below base), "
        "to compare with gpulens_gpu_temperature_celsius; memory_max (software slows the GPU to protect "
        "its HBM), to compare with gpulens_gpu_memory_temperature_celsius.",
        GPU,
        each=lambda v: _by_kind(TEMPERATURE_THRESHOLDS, v.gpu.temperature_thresholds),
        labels=("threshold",),
    ),
    _m(
        "gauge",
        "gpulens_gpu_fan_speed_ratio",
        "ratio",
        "Fan speed as a fraction of maximum.",
        GPU,
        lambda v: v.gpu.fan_speed_ratio,
    ),
    _m("gauge", "gpulens_gpu_sm_clock_hertz", "hertz", "SM clock.", GPU, lambda v: v.gpu.sm_clock_hertz),
    _m(
        "gauge", "gpulens_gpu_sm_clock_max_hertz", "hertz", "Maximum SM clock.", GPU, lambda v: v.gpu.sm_clock_max_hertz
    ),
    _m("gauge", "gpulens_gpu_memory_clock_hertz", "hertz", "Memory clock.", GPU, lambda v: v.gpu.memory_clock_hertz),
    _m(
        "gauge",
        "gpulens_gpu_clock_event_active",
        "",
        "1 while the clock event (throttle) reason holds the clocks down, else 0.",
        GPU,
        each=lambda v: (((reason,), _flag(on)) for reason, on in sorted((v.gpu.clock_events or {}).items())),
        labels=("reason",),
    ),
    _m(
        "gauge",
        "gpulens_gpu_pcie_tx_bytes_per_second",
        "bytes",
        "PCIe transmit throughput (bytes/s) over the last cycle, TLP headers included; the same read as "
        "gpulens_gpu_pcie_tx_bytes_total.",
        GPU,
        lambda v: v.gpu.pcie_tx_bytes_per_second,
    ),
    _m(
        "gauge",
        "gpulens_gpu_pcie_rx_bytes_per_second",
        "bytes",
        "PCIe receive throughput (bytes/s) over the last cycle, TLP headers included; the same read as "
        "gpulens_gpu_pcie_rx_bytes_total.",
        GPU,
        lambda v: v.gpu.pcie_rx_bytes_per_second,
    ),
    _m(
        "gauge",
        "gpulens_gpu_pcie_link_generation",
        "",
        "Current PCIe link generation.",
        GPU,
        lambda v: v.gpu.pcie_link_generation,
    ),
    _m(
        "gauge",
        "gpulens_gpu_pcie_link_width",
        "",
        "Current PCIe link width (lanes).",
        GPU,
        lambda v: v.gpu.pcie_link_width,
    ),
    _m(
        "gauge",
        "gpulens_gpu_pcie_link_max_generation",
        "",
        "Highest PCIe generation the link can train to (the GPU and its slot together, read once per "
        "GPU). gpulens_gpu_pcie_link_generation below it under load is a link that trained down; at "
        "idle some GPUs lower the generation on purpose to save power.",
        GPU,
        lambda v: v.gpu.pcie_link_max_generation,
    ),
    _m(
        "gauge",
        "gpulens_gpu_pcie_link_max_width",
        "",
        "Most PCIe lanes the link can train to (the GPU and its slot together, read once per GPU); "
        "gpulens_gpu_pcie_link_width below it is a degraded link.",
        GPU,
        lambda v: v.gpu.pcie_link_max_width,
    ),
    _m(
        "counter",
        "gpulens_gpu_pcie_replay_errors_total",
        "",
        "PCIe replay counter.",
        GPU,
        lambda v: v.gpu.pcie_replay_errors,
    ),
    _m(
        "gauge",
        "gpulens_gpu_nvlink_tx_bytes_per_second",
        "bytes",
        "NVLink transmit throughput (bytes/s) over the last cycle; the same read as gpulens_gpu_nvlink_tx_bytes_total.",
        GPU,
        lambda v: v.gpu.nvlink_tx_bytes_per_second,
    ),
    _m(
        "gauge",
        "gpulens_gpu_nvlink_rx_bytes_per_second",
        "bytes",
        "NVLink receive throughput (bytes/s) over the last cycle; the same read as gpulens_gpu_nvlink_rx_bytes_total.",
        GPU,
        lambda v: v.gpu.nvlink_rx_bytes_per_second,
    ),
    # --- data movement (per leaf) ----------------------------------------------------------
    *(
        _m(
            "counter",
            f"gpulens_gpu_{name}_{direction}_bytes_total",
            "bytes",
            f"Bytes the leaf {verb} over {label} since the exporter first saw it (NVML's cumulative "
            "counters where the driver has them, else GPM or sampled rates integrated over each "
            "cycle; gpulens_gpu_link_info says which). rate() gives bytes per second.",
            LEAF_ANALYSIS,
            _link_bytes(name, direction),
        )
        for name, label in ((PCIE, "PCIe"), (NVLINK, "NVLink"))
        for direction, verb in (("tx", "sent"), ("rx", "received"))
    ),
    _m(
        "gauge",
        "gpulens_gpu_pcie_utilization_ratio",
        "ratio",
        "PCIe bytes per second of the busier direction over the link's capacity (current generation "
        "x lanes, after line encoding), last cycle. A saturated Gen5 x16 link reads ~0.8-0.85.",
        LEAF,
        _link_ratio(PCIE),
    ),
    _m(
        "gauge",
        "gpulens_gpu_nvlink_utilization_ratio",
        "ratio",
        "NVLink bytes per second of the busier direction over the capacity of the active links, last cycle.",
        LEAF,
        _link_ratio(NVLINK),
    ),
    _m(
        "gauge",
        "gpulens_gpu_pcie_capacity_bytes_per_second",
        "bytes",
        "What the PCIe link carries each way at most (bytes/s): current generation x lanes, after line encoding.",
        LEAF,
        lambda leaf: x.capacity_bytes_per_second if (x := _link(leaf, PCIE)) is not None else None,
    ),
    _m(
        "gauge",
        "gpulens_gpu_nvlink_capacity_bytes_per_second",
        "bytes",
        "What the active NVLink links carry each way at most together (bytes/s).",
        LEAF,
        lambda leaf: x.capacity_bytes_per_second if (x := _link(leaf, NVLINK)) is not None else None,
    ),
    _m(
        "gauge",
        "gpulens_gpu_link_info",
        "",
        "Where the leaf's link bytes come from: source=counter (NVML cumulative byte counters), gpm "
        "(GPM rates over each cycle) or sampled (NVML throughput calls, a 20 ms window). Always 1.",
        LEAF,
        each=_link_sources,
        labels=("link", "source"),
    ),
    _m(
        "gauge",
        "gpulens_gpu_transfer_active_ratio",
        "ratio",
        "The busiest link's utilisation (PCIe or NVLink), last cycle: the transfer signal the "
        "boundness class and the busy ratio count as work.",
        LEAF_ANALYSIS,
        lambda a: a.transfer_ratio,
        section="analysis",
    ),
    # --- health ------------------------------------------------------------------------
    _m(
        "counter",
        "gpulens_gpu_ecc_errors_total",
        "",
        "Volatile ECC errors since the driver loaded, by severity (corrected, uncorrected).",
        GPU,
        each=lambda v: (((severity,), float(n)) for severity, n in sorted((v.gpu.ecc_errors or {}).items())),
        labels=("severity",),
    ),
    _m(
        "counter",
        "gpulens_gpu_nvlink_errors_total",
        "",
        "NVLink data-link errors since the driver loaded, summed over the GPU's links, by kind: replay "
        "(a packet sent again), recovery (a link retrained), crc_flit and crc_data (a flow-control unit "
        "or a data packet received with a bad CRC). Read every 10 cycles, like ECC; absent on a GPU without "
        "NVLink.",
        GPU,
        each=lambda v: _by_kind(NVLINK_ERROR_KINDS, v.gpu.nvlink_errors),
        labels=("kind",),
    ),
    _m(
        "gauge",
        "gpulens_gpu_fabric_info",
        "",
        "The GPU's NVLink fabric registration (NVML GPU fabric info), always 1: state (not_supported, "
        "not_started, in_progress, completed), the fabric's cluster_uuid and clique_id, and status (NVML's "
        "result of the registration). GPUs with one cluster_uuid and clique_id reach each other over "
        "NVLink: the domain NVIDIA's DRA driver builds a ComputeDomain on; an all-zero cluster_uuid groups "
        "nothing (some single-node boards report it). Absent where NVML has no fabric information for the "
        "GPU, or says the GPU is in none (state not_supported, as a lone H200 answers).",
        GPU,
        each=lambda v: (
            (((v.gpu.fabric.state, v.gpu.fabric.cluster_uuid, str(v.gpu.fabric.clique_id), v.gpu.fabric.status), 1.0),)
            if v.gpu.fabric is not None
            else ()
        ),
        labels=("state", "cluster_uuid", "clique_id", "status"),
        section="network",
    ),
    _m(
        "gauge",
        "gpulens_gpu_nvlink_link_active",
        "",
        "Each NVLink of the GPU: 1 while it is trained (nvidia-smi nvlink -s prints its speed), 0 while "
        "it is down (<inactive>). One series per link NVML answers a state for, so count() is the GPU's "
        "link count and sum() its active links; re-read every minute. Absent on a GPU without NVLink "
        "and on one in MIG mode.",
        GPU,
        each=lambda v: (((str(x.link),), 1.0 if x.active else 0.0) for x in v.gpu.nvlinks),
        labels=("link",),
        section="network",
    ),
    _m(
        "gauge",
        "gpulens_gpu_nvlink_peer_links",
        "",
        "NVLinks joining the GPU to another GPU of the node (peer_gpu, peer_uuid): the NV# of nvidia-smi "
        "topo -m. Its links straight to the peer plus, on NVSwitch boards (HGX: 18 a GPU), its active "
        "links to the switches when NVML says the pair can do peer-to-peer over NVLink. No series for a "
        "pair NVLink does not join; read with the link states.",
        GPU,
        each=lambda v: (((str(p.index), p.uuid), float(p.links)) for p in v.gpu.nvlink_peers or ()),
        labels=("peer_gpu", "peer_uuid"),
        section="network",
    ),
    _m(
        "gauge",
        "gpulens_gpu_remapped_rows",
        "",
        "HBM rows remapped, by cause (correctable, uncorrectable).",
        GPU,
        each=lambda v: (
            ((cause,), (v.gpu.remapped_rows or {}).get(cause)) for cause in ("correctable", "uncorrectable")
        ),
        labels=("cause",),
    ),
    _m(
        "gauge",
        "gpulens_gpu_row_remap_pending",
        "",
        "1 if a row remap waits for a GPU reset.",
        GPU,
        lambda v: (v.gpu.remapped_rows or {}).get("pending"),
    ),
    _m(
        "gauge",
        "gpulens_gpu_row_remap_failure",
        "",
        "1 if a row remap failed.",
        GPU,
        lambda v: (v.gpu.remapped_rows or {}).get("failure"),
    ),
    _m(
        "counter",
        "gpulens_gpu_xid_errors_total",
        "",
        "Xid events seen since the exporter started, by Xid code; each GPU also has a series without "
        "xid that stays 0 from the first scrape, so a GPU without Xid reads 0, not no data.",
        NODE,
        each=lambda s: _xids(s),
        labels=(*GPU_LABELS, "xid"),
    ),
    # --- analysis ----------------------------------------------------------------------
    _m(
        "gauge",
        "gpulens_gpu_boundness",
        "",
        "What limits the leaf while it works, over the analysis window: exactly one class is 1 "
        "(idle, launch, latency, memory, compute, mixed, transfer, busy). With GPM every class but busy; "
        "without GPM (gpulens_gpu_analysis_info signals=nvml) only idle, busy (kernels ran, what limits "
        "them unknown), memory, launch and transfer, coarser; a MIG instance without GPM "
        "(signals=processes) reads idle when no compute process ran on it over the window, else the "
        "class is absent. How much of the time it works is gpulens_gpu_busy_ratio.",
        LEAF_ANALYSIS,
        each=lambda a: _classes(BOUNDNESS_CLASSES, a.boundness),
        labels=("class",),
        section="analysis",
    ),
    _m(
        "gauge",
        "gpulens_pod_gpu_boundness",
        "",
        "The container's class on a leaf it holds: exactly one class is 1 (idle, launch, latency, "
        "memory, compute, mixed, transfer, busy, shared). The leaf's class while the pod is its only holder or the "
        "only pod with processes on it; shared when several pods run there (the leaf's class "
        "describes none of them alone); idle for a pod with no process on a leaf others use. "
        "Absent when the leaf has no class.",
        POD_CLASS,
        each=lambda pb: _classes(POD_BOUNDNESS_CLASSES, pb.boundness),
        labels=("class",),
        section="analysis",
    ),
    _m(
        "gauge",
        "gpulens_gpu_analysis_info",
        "",
        "Which source the leaf's analysis has, and so its precision: signals=gpm (GPM, Hopper and newer: "
        "every class), nvml (no GPM, a whole GPU: coarse classes idle, busy, memory, launch, transfer from "
        "NVML GPU-Util, memory-controller utilisation and power) or processes (a MIG instance without GPM: "
        "idle or no class). Always 1.",
        LEAF_ANALYSIS,
        each=lambda a: (((a.signals,), 1.0),),
        labels=("signals",),
        section="analysis",
    ),
    # --- attribution -------------------------------------------------------------------
    _m(
        "gauge",
        "gpulens_pod_gpu_allocation",
        "",
        "1 per device the kubelet allocated to a container; the join key for per-pod views. A device "
        "from a DRA ResourceClaim carries the claim (claim_namespace, claim_name) and the driver, pool "
        "and device that its driver published; resource is then the driver. These five labels are "
        "empty for a device plugin's device.",
        ALLOCATION,
        each=lambda a: (
            (
                (
                    a.uuid,
                    a.mig_uuid or "",
                    a.replica or "",
                    a.resource,
                    a.pod.workload_kind or "",
                    a.pod.workload or "",
                    *(
                        (a.claim.claim_namespace, a.claim.claim_name, a.claim.driver, a.claim.pool, a.claim.device)
                        if a.claim is not None
                        else ("", "", "", "", "")
                    ),
                ),
                1.0,
            ),
        ),
        labels=(
            "uuid",
            "mig_uuid",
            "replica",
            "resource",
            "workload_kind",
            "workload",
            "claim_namespace",
            "claim_name",
            "driver",
            "pool",
            "device",
        ),
        section="attribution",
    ),
    _m(
        "gauge",
        "gpulens_pod_gpu_memory_used_bytes",
        "bytes",
        "Device memory used by the container's processes on the GPU.",
        POD_USAGE,
        lambda u: u.memory_used_bytes,
        section="attribution",
    ),
    _m(
        "gauge",
        "gpulens_pod_gpu_kernel_time_ratio",
        "ratio",
        "Share of sampled time a kernel of the container's processes was running on the GPU (NVML "
        "per-process utilisation, summed over its processes): the mean of the driver's samples since the "
        "previous read, at most 5 s old while the same processes run. Time, not SM activity: one small "
        "kernel counts as much as one that fills every SM (that is gpulens_gpu_sm_active_ratio). "
        "Absent under MPS: the driver reports per-process utilisation only for the MPS server, so it "
        "cannot be split between the clients.",
        POD_USAGE,
        lambda u: u.kernel_time_ratio,
        section="attribution",
    ),
    _m(
        "gauge",
        "gpulens_pod_gpu_sm_share_ratio",
        "ratio",
        "Deprecated: use gpulens_pod_gpu_kernel_time_ratio (the same value under its true name; this "
        "name goes in the next release). It was never a share of SM time: it is the share of sampled "
        "time a kernel of the container's processes ran.",
        POD_USAGE,
        lambda u: u.kernel_time_ratio,
        section="attribution",
    ),
    _m(
        "gauge",
        "gpulens_gpu_sharing_info",
        "",
        "How the leaf is shared, always 1: mode is exclusive, time-slicing (the device plugin "
        "advertises replicas, or several pods hold the GPU through one ResourceClaim), mps (NVML "
        "lists an MPS server or MPS clients on it) or mig.",
        LEAF_ANALYSIS,
        each=lambda a: (((a.sharing_mode,), 1.0),) if a.sharing_mode is not None else (),
        labels=("mode",),
        section="attribution",
    ),
    _m(
        "gauge",
        "gpulens_gpu_sharing_replicas",
        "",
        "Time-slicing replicas the device plugin advertises for the GPU.",
        ATTRIBUTION,
        each=lambda at: (((uuid,), float(n)) for uuid, n in sorted(at.sharing_replicas.items())),
        labels=("uuid",),
        section="attribution",
    ),
    _m(
        "gauge",
        "gpulens_gpu_sharing_pods",
        "",
        "Pods holding a time-slicing replica of the GPU, or sharing it through a ResourceClaim.",
        ATTRIBUTION,
        each=lambda at: (((uuid,), float(n)) for uuid, n in sorted(at.sharing_pods.items())),
        labels=("uuid",),
        section="attribution",
    ),
    _m(
        "gauge",
        "gpulens_pod_claim_devices_ignored",
        "",
        "Devices that running containers hold through DRA ResourceClaims and that gpulens leaves "
        "out, by driver: neither a GPU or MIG instance of this node nor one of its NICs (a "
        "ComputeDomain channel, an FPGA). Claimed devices of a GPU driver that name no GPU here "
        "are counted in gpulens_unmapped_devices_total instead.",
        ATTRIBUTION,
        each=lambda at: (((driver,), float(n)) for driver, n in sorted(at.claims_ignored.items())),
        labels=("driver",),
        section="attribution",
    ),
    _m(
        "counter",
        "gpulens_unmapped_devices_total",
        "",
        "Device IDs from the kubelet that matched no GPU on this node, by reason.",
        ATTRIBUTION,
        each=lambda at: (((reason,), float(n)) for reason, n in sorted(at.unmapped_devices.items())),
        labels=("reason",),
        section="attribution",
    ),
    _m(
        "counter",
        "gpulens_attribution_items_dropped_total",
        "",
        "Attribution items left out past a ceiling, by kind and reason, counted at every kubelet "
        "refresh that leaves them out: kind pod (pods holding a device past --kubernetes.max-pods), "
        "allocation (gpulens_pod_gpu_allocation series past --kubernetes.max-allocations); reason "
        "limit; kubelet_connection (closed for a flood of HTTP/2 frames carrying no reply), reason "
        "control_frame_flood. Absent without the kubelet PodResources source.",
        ATTRIBUTION,
        each=lambda at: (((kind, reason), float(n)) for (kind, reason), n in sorted((at.items_dropped or {}).items())),
        labels=("kind", "reason"),
        section="attribution",
    ),
    _m(
        "gauge",
        "gpulens_pod_gpu_allocation_conflicts",
        "",
        "Exclusive devices the kubelet lists under more than one pod (all holders are shown); non-zero "
        "when an old kubelet still lists a finished pod and the API cannot say which one runs.",
        ATTRIBUTION,
        lambda at: float(at.allocation_conflicts),
        section="attribution",
    ),
    _m(
        "counter",
        "gpulens_kubernetes_owner_walks_total",
        "",
        "Owner-chain walks through the Kubernetes API (--kubernetes.owner-chain) by how they ended: "
        "resolved (the top reached), or stopped short, naming the last owner reached: forbidden (no "
        "RBAC get on the next owner's resource), not_found, error, limited (a rate or time bound). "
        "Walks answered from the cache alone are not counted; a chain that stopped short is walked "
        "again later (about once a minute while it keeps stopping). Absent without the owner chain.",
        ATTRIBUTION,
        each=lambda at: (((outcome,), float(n)) for outcome, n in (at.owner_walks or {}).items()),
        labels=("outcome",),
        section="attribution",
    ),
    _m(
        "gauge",
        "gpulens_podresources_last_success_timestamp_seconds",
        "seconds",
        "Unix time of the last successful kubelet PodResources refresh.",
        ATTRIBUTION,
        lambda at: at.podresources_last_success_timestamp,
        section="attribution",
    ),
    # --- probes ------------------------------------------------------------------------
    _m(
        "gauge",
        "gpulens_probe_bandwidth_bytes_per_second",
        "bytes",
        "Cached result of the last successful bandwidth probe (bytes/s); see "
        "gpulens_probe_last_success_timestamp_seconds for when it ran.",
        PROBE,
        each=lambda r: (((r.probe,), r.bandwidth_bytes_per_second),),
        labels=("probe",),
        section="probes",
    ),
    _m(
        "gauge",
        "gpulens_probe_efficiency_ratio",
        "ratio",
        "Cached probe bandwidth divided by what a healthy GPU of this model reaches (probes/expected.py). "
        "Leaf labels as on every leaf series: uuid is the physical GPU, mig_uuid the probed MIG instance.",
        PROBE,
        each=lambda r: (((r.probe,), r.efficiency_ratio),),
        labels=("probe",),
        section="probes",
    ),
    _m(
        "gauge",
        "gpulens_probe_last_success_timestamp_seconds",
        "seconds",
        "Unix time of the probe's last successful run.",
        PROBE,
        each=lambda r: (((r.probe,), r.last_success_timestamp),),
        labels=("probe",),
        section="probes",
    ),
    _m(
        "counter",
        "gpulens_probe_runs_total",
        "",
        "Probe runs by result (ok, skipped_busy, skipped_memory, skipped_allocated, "
        "skipped_exclusive, failed, timeout).",
        PROBE_RUNS,
        each=lambda run: (((run[0],), float(run[1])),),
        labels=("result",),
        section="probes",
    ),
    # --- network: RDMA NICs, GPU-NIC paths, NIC holders (docs/network.md) -----------------
    _m(
        "gauge",
        "gpulens_nic_info",
        "",
        "Identity of an RDMA NIC (EFA, InfiniBand, RoCE) under /sys/class/infiniband; always 1. kind: efa, "
        "infiniband, roce or rdma; p2p: an EFA driver's GPU peer-to-peer provider (empty: none).",
        NIC,
        each=lambda v: (
            (
                (
                    v.nic.kind,
                    v.nic.driver,
                    v.nic.pci_bus_id,
                    "" if v.nic.numa_node is None else str(v.nic.numa_node),
                    v.nic.link_layer,
                    v.nic.p2p or "",
                ),
                1.0,
            ),
        ),
        labels=("kind", "driver", "pci_bus_id", "numa_node", "link_layer", "p2p"),
        section="network",
    ),
    _m(
        "gauge",
        "gpulens_nic_pods",
        "",
        "Pods holding the NIC through the kubelet (0: none); a pod's NIC bytes count only NICs it holds alone.",
        NIC,
        lambda v: float(v.pods),
        section="network",
    ),
    _m(
        "counter",
        "gpulens_nic_stat_total",
        "",
        "Device-level counters of the NIC by their sysfs file name (EFA admin-queue and error counters), "
        "since the exporter first read them.",
        NIC,
        each=lambda v: (((name,), value) for name, value in sorted(v.nic.counters.items())),
        labels=("counter",),
        section="network",
    ),
    _m(
        "gauge",
        "gpulens_nic_port_state_id",
        "",
        "Logical port state: 1 down, 2 init, 3 armed, 4 active, 5 active-defer.",
        NIC_PORT,
        lambda p: p.state_id,
        section="network",
    ),
    _m(
        "gauge",
        "gpulens_nic_port_physical_state_id",
        "",
        "Physical port state: 1 sleep, 2 polling, 3 disabled, 4 training, 5 link up, 6 error recovery, 7 test.",
        NIC_PORT,
        lambda p: p.physical_state_id,
        section="network",
    ),
    _m(
        "gauge",
        "gpulens_nic_port_rate_bytes_per_second",
        "bytes",
        "Line rate of the port each way, bytes per second (100 Gb/s is 12.5e9).",
        NIC_PORT,
        lambda p: p.rate_bytes_per_second,
        section="network",
    ),
    _m(
        "counter",
        "gpulens_nic_port_data_transmitted_bytes_total",
        "bytes",
        "Bytes the port sent (EFA tx_bytes; InfiniBand port_xmit_data x 4), since the exporter first read it.",
        NIC_PORT,
        lambda p: p.tx_bytes,
        section="network",
    ),
    _m(
        "counter",
        "gpulens_nic_port_data_received_bytes_total",
        "bytes",
        "Bytes the port received (EFA rx_bytes; InfiniBand port_rcv_data x 4), since the exporter first read it.",
        NIC_PORT,
        lambda p: p.rx_bytes,
        section="network",
    ),
    _m(
        "counter",
        "gpulens_nic_port_packets_transmitted_total",
        "",
        "Packets the port sent, since the exporter first read it.",
        NIC_PORT,
        lambda p: p.tx_packets,
        section="network",
    ),
    _m(
        "counter",
        "gpulens_nic_port_packets_received_total",
        "",
        "Packets the port received, since the exporter first read it.",
        NIC_PORT,
        lambda p: p.rx_packets,
        section="network",
    ),
    _m(
        "counter",
        "gpulens_nic_port_stat_total",
        "",
        "Every other port counter by its sysfs file name, in its own unit (bytes where the name says so): EFA "
        "RDMA, SRD retransmit and error counters, InfiniBand errors and waits, mlx5 congestion counters.",
        NIC_PORT,
        each=lambda p: (((name,), value) for name, value in sorted(p.counters.items())),
        labels=("counter",),
        section="network",
    ),
    _m(
        "gauge",
        "gpulens_nic_items_dropped",
        "",
        "RDMA devices, ports and counter files the NIC source's last discovery (once a minute) left out, by "
        "kind (device, port, counter) and reason: over_limit (past --collect.nic.max-devices or "
        "--collect.nic.max-counters), over_bound (past a fixed bound of one directory: 8 ports a device, 512 "
        "files a counter directory), outside_tree (a link out of the sysfs root). Absent when nothing was.",
        NODE,
        each=lambda s: (
            (((kind, reason), float(n)) for (kind, reason), n in sorted(s.network.dropped.items()) if n)
            if s.network is not None
            else ()
        ),
        labels=("kind", "reason"),
        section="network",
    ),
    _m(
        "gauge",
        "gpulens_gpu_nic_path_info",
        "",
        "The PCIe path between a GPU and a NIC (PIX one switch, PXB several, PHB the host bridge, NODE one "
        "NUMA node, SYS across); nearest is true for the GPU's closest NICs. Always 1.",
        GPU_NIC,
        each=lambda p: (((p.path, "true" if p.nearest else "false"), 1.0),),
        labels=("path", "nearest"),
        section="network",
    ),
    _m(
        "gauge",
        "gpulens_gpu_nic_gdr_ready",
        "",
        "1 when GPUDirect RDMA can work between the GPU and the NIC, 0 when not; reason: how (peermem, "
        "dmabuf, efa_p2p) or why not (no_peer_memory, path_phb, path_node, path_sys).",
        GPU_NIC,
        each=lambda p: (((p.gdr_reason,), 1.0 if p.gdr_ready else 0.0),),
        labels=("reason",),
        section="network",
    ),
    _m(
        "gauge",
        "gpulens_pod_nic_allocation",
        "",
        "1 per NIC the kubelet allocated to a container; device is empty where the device plugin's ID "
        "names no NIC (a shared pool such as rdma/hca_shared_devices_a).",
        NIC_ALLOCATION,
        each=lambda h: (((h.resource, h.device, h.pod.workload_kind or "", h.pod.workload or ""), 1.0),),
        labels=("resource", "device", "workload_kind", "workload"),
        section="network",
    ),
)

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in CATALOGUE}


def spec(name: str) -> MetricSpec:
    """The catalogue entry for ``name``; an unknown name raises KeyError naming it."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown metric {name!r}: not in exporter/render/metrics.py CATALOGUE") from None


def markdown() -> str:
    """docs/metrics.md: the catalogue as a table per section (generated; do not edit by hand)."""
    titles = {
        "self": "Exporter self-health",
        "device": "Devices (NVML and GPM)",
        "analysis": "Analysis",
        "attribution": "Pod attribution",
        "probes": "Probes",
        "network": "Network (RDMA NICs)",
    }
    out = [
        "# Metrics",
        "",
        "Generated from `exporter/render/metrics.py` by",
        "`python -m exporter.render.metrics --markdown > docs/metrics.md`;",
        "a test fails when this file and the catalogue drift. Ratios are 0..1; unsupported values are",
        "omitted, never 0 or NaN. MIG labels (`mig_uuid`, `gpu_instance_id`, `compute_instance_id`,",
        "`mig_profile`) are empty on whole-GPU series. The *per* column says what a series is",
        "exported once per (its scope, in `exporter/render/scopes.py`).",
        "",
        "Every series, the `--compat.dcgm` ones included, also carries `node`, this node's name:",
        "`--kubernetes.node-name` / `NODE_NAME` (the chart sets it from the pod's `spec.nodeName`),",
        "else a simulated node's scenario (`jobs-0`), else the host name (`exporter/node_label.py`).",
        "It is not listed in the tables below. Under `honor_labels` Prometheus keeps it as it is",
        '(docs/deploy.md, "The `node` label").',
        "",
    ]
    out += ["## Scopes", "", "| per | covers | identity labels |", "|---|---|---|"]
    for scope in SCOPES:
        labels = ", ".join(f"`{label}`" for label in scope.labels) or "-"
        out.append(f"| {scope.name} | {scope.doc} | {labels} |")
    out.append("")
    for section, title in titles.items():
        rows = [m for m in CATALOGUE if m.section == section]
        if not rows:
            continue
        out += [f"## {title}", "", "| name | type | unit | per | labels | help |", "|---|---|---|---|---|---|"]
        for m in rows:
            labels = ", ".join(f"`{label}`" for label in m.labels)
            out.append(f"| `{m.name}` | {m.type} | {m.unit or '-'} | {m.scope.name} | {labels} | {m.help} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """CLI: print the catalogue as markdown."""
    parser = argparse.ArgumentParser(prog="python -m exporter.render.metrics")
    parser.add_argument("--markdown", action="store_true", help="print docs/metrics.md")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown())
        return 0
    parser.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
