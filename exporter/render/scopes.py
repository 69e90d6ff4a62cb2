"""Scopes: where in a Snapshot a metric is read, once per what, and with which identity labels.

A scope walks one rendering of the exporter (``Frame``: the newest snapshot plus the exporter's own
facts) and yields, for each instance it covers, the instance's identity label values and the view a
catalogue entry reads its value from: a ``GpuView`` per answering GPU, a ``LeafSample`` per leaf
(whole GPU or MIG instance), a ``GpmSample`` per leaf with GPM readings, an ``Allocation`` per
device a container holds, and so on.  The label names of a scope are the first labels of every
metric in it, so an entry only names the labels it adds.  The walk order is the exposition's sample
order within a family.  No NVML and no prometheus_client here: pure reads of immutable model objects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from exporter.model import (
    Allocation,
    Attribution,
    GpmSample,
    GpuNicPath,
    GpuSample,
    LeafAnalysis,
    LeafSample,
    NetworkSample,
    NicHolder,
    NicPort,
    NicSample,
    PodBoundness,
    PodUsage,
    ProbeResult,
    Snapshot,
)

V = TypeVar("V")
LabelValues = tuple[str, ...]

GPU_LABELS: tuple[str, ...] = ("gpu", "uuid")
"""Physical-GPU identity: index and UUID."""

LEAF_LABELS: tuple[str, ...] = (
    "gpu",
    "uuid",
    "mig_uuid",
    "gpu_instance_id",
    "compute_instance_id",
    "mig_profile",
)
"""Leaf identity (whole GPU or MIG instance); the MIG labels are empty for whole GPUs."""

POD_LABELS: tuple[str, ...] = ("namespace", "pod", "container")
"""Container identity, as the kubelet lists it."""


@dataclass(frozen=True)
class Frame:
    """What one rendering reads: the snapshot (``None`` before the first one) and the exporter's
    own facts, which are not part of a snapshot."""

    snapshot: Snapshot | None
    version: str = ""
    backend: str = ""
    now: float | None = None
    """Wall time (s) of the scrape, for ``gpulens_snapshot_age_seconds``; ``None`` omits the age."""
    failed_renders: tuple[str, ...] = ()
    """Render stages that failed in this rendering (``gpulens_stage_success{stage="render_…"} 0``)."""
    render_errors: Mapping[str, int] = field(default_factory=dict)
    """Renders each family (or rendered block) failed in since the start, counted once per snapshot
    (``gpulens_render_errors_total``)."""
    label_rewrites: Mapping[str, int] | None = None
    """Label values rewritten where they entered, by reason (exporter/label_values.py); ``None``
    where the renderer is not told (``gpulens_label_values_rewritten_total`` is then absent)."""


@dataclass(frozen=True)
class GpuView:
    """One answering physical GPU with what its device-wide series need besides the sample."""

    gpu: GpuSample
    driver_version: str
    analysis: LeafAnalysis | None
    """The GPU's own analysis entry (keyed by its UUID): the monotonic energy counter."""
    last_xid: int = 0
    """The most recent Xid seen on the GPU since the exporter started (0: none)."""


@dataclass(frozen=True)
class Scope(Generic[V]):
    """A kind of instance metrics are exported once per: its name (docs), identity label names,
    and the walk that yields ``(label values, view)`` for each instance in a Frame."""

    name: str
    """What a series is exported once per, as docs/metrics.md says it (unique)."""
    labels: tuple[str, ...]
    walk: Callable[[Frame], Iterable[tuple[LabelValues, V]]]
    doc: str


def _gpu_values(gpu: GpuSample) -> LabelValues:
    return (str(gpu.index), gpu.uuid)


def _leaf_values(gpu: GpuSample, leaf: LeafSample) -> LabelValues:
    mig = leaf.mig
    if mig is None:
        return (str(gpu.index), gpu.uuid, "", "", "", "")
    return (str(gpu.index), gpu.uuid, mig.mig_uuid, str(mig.gpu_instance_id), str(mig.compute_instance_id), mig.profile)


def _up_gpus(frame: Frame) -> Iterator[GpuSample]:
    if frame.snapshot is not None:
        yield from (g for g in frame.snapshot.backend.gpus if g.up)


def _leaves(frame: Frame) -> Iterator[tuple[LabelValues, LeafSample]]:
    for gpu in _up_gpus(frame):
        for leaf in gpu.leaves:
            yield _leaf_values(gpu, leaf), leaf


def _walk_exporter(frame: Frame) -> Iterator[tuple[LabelValues, Frame]]:
    yield (), frame


def _walk_node(frame: Frame) -> Iterator[tuple[LabelValues, Snapshot]]:
    if frame.snapshot is not None:
        yield (), frame.snapshot


def _walk_device(frame: Frame) -> Iterator[tuple[LabelValues, GpuSample]]:
    if frame.snapshot is not None:
        for gpu in frame.snapshot.backend.gpus:
            yield _gpu_values(gpu), gpu


def _walk_gpu(frame: Frame) -> Iterator[tuple[LabelValues, GpuView]]:
    if frame.snapshot is None:
        return
    snap = frame.snapshot
    for gpu in _up_gpus(frame):
        yield _gpu_values(gpu), gpu_view(snap, gpu)


def gpu_view(snap: Snapshot, gpu: GpuSample) -> GpuView:
    """What a device-wide series of ``gpu`` reads in ``snap`` (the native and the DCGM ones)."""
    driver = snap.backend.driver_version or ""
    return GpuView(gpu, driver, snap.analysis.get(gpu.uuid), snap.xid_last.get(gpu.uuid, 0))


def _walk_gpm(frame: Frame) -> Iterator[tuple[LabelValues, GpmSample]]:
    for values, leaf in _leaves(frame):
        if leaf.gpm is not None:
            yield values, leaf.gpm


def _walk_leaf_analysis(frame: Frame) -> Iterator[tuple[LabelValues, LeafAnalysis]]:
    if frame.snapshot is None:
        return
    analysis = frame.snapshot.analysis
    for values, leaf in _leaves(frame):
        found = analysis.get(leaf.leaf_id)
        if found is not None:
            yield values, found


def _attribution(frame: Frame) -> Attribution | None:
    return frame.snapshot.attribution if frame.snapshot is not None else None


def _walk_attribution(frame: Frame) -> Iterator[tuple[LabelValues, Attribution]]:
    attr = _attribution(frame)
    if attr is not None:
        yield (), attr


def _walk_allocation(frame: Frame) -> Iterator[tuple[LabelValues, Allocation]]:
    attr = _attribution(frame)
    for a in attr.allocations if attr is not None else ():
        yield (a.pod.namespace, a.pod.pod, a.pod.container), a


def _walk_pod_usage(frame: Frame) -> Iterator[tuple[LabelValues, PodUsage]]:
    attr = _attribution(frame)
    for u in attr.usages if attr is not None else ():
        yield (u.pod.namespace, u.pod.pod, u.pod.container, u.uuid), u


def _walk_pod_class(frame: Frame) -> Iterator[tuple[LabelValues, PodBoundness]]:
    # A pod's class is exported only while attribution is on (its holders come from there).
    if frame.snapshot is None or frame.snapshot.attribution is None:
        return
    for pb in frame.snapshot.pod_boundness:
        yield (pb.pod.namespace, pb.pod.pod, pb.pod.container, pb.uuid, pb.mig_uuid or ""), pb


def _probe_leaves(snap: Snapshot) -> dict[str, LabelValues]:
    """Probed leaf UUID (the MIG UUID for an instance) -> the leaf labels every leaf series has."""
    leaves: dict[str, LabelValues] = {}
    for gpu in snap.backend.gpus:
        for leaf in gpu.leaves:
            leaves[leaf.leaf_id] = _leaf_values(gpu, leaf)
        leaves.setdefault(gpu.uuid, (str(gpu.index), gpu.uuid, "", "", "", ""))
    return leaves


def _probed(leaves: dict[str, LabelValues], uuid: str) -> LabelValues:
    # A leaf the backend no longer lists keeps its UUID as uuid (its other labels empty).
    return leaves.get(uuid, ("", uuid, "", "", "", ""))


def _walk_probe(frame: Frame) -> Iterator[tuple[LabelValues, ProbeResult]]:
    if frame.snapshot is None:
        return
    leaves = _probe_leaves(frame.snapshot)
    for r in frame.snapshot.probe_results:
        yield _probed(leaves, r.uuid), r


def _walk_probe_runs(frame: Frame) -> Iterator[tuple[LabelValues, tuple[str, int]]]:
    if frame.snapshot is None:
        return
    leaves = _probe_leaves(frame.snapshot)
    for (uuid, result), n in sorted(frame.snapshot.probe_runs.items()):
        yield _probed(leaves, uuid), (result, n)


@dataclass(frozen=True)
class NicView:
    """One RDMA device and how many pods hold it."""

    nic: NicSample
    pods: int


def _network(frame: Frame) -> NetworkSample | None:
    return frame.snapshot.network if frame.snapshot is not None else None


def _walk_nic(frame: Frame) -> Iterator[tuple[LabelValues, NicView]]:
    net = _network(frame)
    for nic in net.nics if net is not None else ():
        yield (nic.device,), NicView(nic, net.pods_holding(nic.device) if net is not None else 0)


def _walk_nic_port(frame: Frame) -> Iterator[tuple[LabelValues, NicPort]]:
    net = _network(frame)
    for nic in net.nics if net is not None else ():
        for port in nic.ports:
            yield (nic.device, str(port.port)), port


def _walk_gpu_nic(frame: Frame) -> Iterator[tuple[LabelValues, GpuNicPath]]:
    net = _network(frame)
    if net is None or frame.snapshot is None:
        return
    index_of = {g.uuid: str(g.index) for g in frame.snapshot.backend.gpus if g.up}
    for p in net.paths:
        if p.uuid in index_of:
            yield (index_of[p.uuid], p.uuid, p.device), p


def _walk_nic_holder(frame: Frame) -> Iterator[tuple[LabelValues, NicHolder]]:
    net = _network(frame)
    for h in net.holders if net is not None else ():
        yield (h.pod.namespace, h.pod.pod, h.pod.container), h


EXPORTER: Scope[Frame] = Scope("exporter", (), _walk_exporter, "the exporter itself, once")
NODE: Scope[Snapshot] = Scope("node", (), _walk_node, "the node's snapshot, once")
DEVICE: Scope[GpuSample] = Scope(
    "GPU, lost ones too", GPU_LABELS, _walk_device, "every GPU the backend lists, answering or lost"
)
GPU: Scope[GpuView] = Scope("GPU", GPU_LABELS, _walk_gpu, "every answering physical GPU")
LEAF: Scope[LeafSample] = Scope("leaf", LEAF_LABELS, _leaves, "every leaf: a whole GPU or a MIG instance")
GPM: Scope[GpmSample] = Scope("leaf with GPM", LEAF_LABELS, _walk_gpm, "every leaf with GPM readings")
LEAF_ANALYSIS: Scope[LeafAnalysis] = Scope(
    "analysed leaf", LEAF_LABELS, _walk_leaf_analysis, "every leaf the analysis stage covered"
)
ATTRIBUTION: Scope[Attribution] = Scope("node with attribution", (), _walk_attribution, "the node's attribution, once")
ALLOCATION: Scope[Allocation] = Scope(
    "allocated device", POD_LABELS, _walk_allocation, "every device a container holds (kubelet)"
)
POD_USAGE: Scope[PodUsage] = Scope(
    "container on a GPU", (*POD_LABELS, "uuid"), _walk_pod_usage, "every container with processes on a GPU"
)
POD_CLASS: Scope[PodBoundness] = Scope(
    "container on a leaf", (*POD_LABELS, "uuid", "mig_uuid"), _walk_pod_class, "every leaf a container holds"
)
PROBE: Scope[ProbeResult] = Scope("probe result", LEAF_LABELS, _walk_probe, "every cached probe result on a leaf")
PROBE_RUNS: Scope[tuple[str, int]] = Scope(
    "leaf and run result", LEAF_LABELS, _walk_probe_runs, "every (leaf, result) probe-run counter"
)

NIC: Scope[NicView] = Scope("RDMA device", ("device",), _walk_nic, "every RDMA NIC of the node")
NIC_PORT: Scope[NicPort] = Scope("RDMA port", ("device", "port"), _walk_nic_port, "every port of every RDMA NIC")
GPU_NIC: Scope[GpuNicPath] = Scope(
    "GPU and NIC pair", ("gpu", "uuid", "device"), _walk_gpu_nic, "every answering GPU with every NIC"
)
NIC_ALLOCATION: Scope[NicHolder] = Scope(
    "allocated NIC", POD_LABELS, _walk_nic_holder, "every NIC (or NIC pool) a container holds (kubelet)"
)

SCOPES: tuple[Scope[Any], ...] = (
    EXPORTER,
    NODE,
    DEVICE,
    GPU,
    LEAF,
    GPM,
    LEAF_ANALYSIS,
    ATTRIBUTION,
    ALLOCATION,
    POD_USAGE,
    POD_CLASS,
    PROBE,
    PROBE_RUNS,
    NIC,
    NIC_PORT,
    GPU_NIC,
    NIC_ALLOCATION,
)
