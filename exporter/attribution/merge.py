"""Merge kubelet allocations, API pod metadata and PID owners into one ``Attribution``.

Pure functions over immutable inputs: the real sources (gRPC, API watch, /proc) and the simulated
ones feed the same code, so the demo exercises exactly what production runs.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from exporter.attribution import claims
from exporter.attribution.deviceids import DeviceIndex, DeviceRef
from exporter.attribution.slices import SliceDirectory
from exporter.model import (
    UNKNOWN_TENANT,
    Allocation,
    BackendSample,
    ClaimedDevice,
    ClaimRef,
    ContainerDevices,
    PodRef,
    PodUsage,
)

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
"""Pod phases whose devices are free again even if an old kubelet still lists them (k8s #119423)."""

GPU_RESOURCE_PREFIX = "nvidia.com/"
"""Resources under this prefix are GPUs by definition: their unresolvable IDs are counted.
IDs of other resources are attributed only when they have a GPU shape (custom plugins)."""

_EMPTY_NAMES: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class PodMeta:
    """What the Kubernetes API says about one pod on this node."""

    uid: str
    namespace: str
    name: str
    phase: str | None = None
    workload_kind: str | None = None
    """Top-level owner kind: Deployment, StatefulSet, DaemonSet, Job, CronJob, ReplicaSet, …"""
    workload: str | None = None
    containers: Mapping[str, str] = field(default_factory=lambda: _EMPTY_NAMES)
    """Container runtime ID (hex, no ``containerd://`` scheme) -> container name."""


@dataclass(frozen=True)
class PodDirectory:
    """Pods of this node by UID and by (namespace, name); an immutable snapshot."""

    by_uid: Mapping[str, PodMeta]
    by_name: Mapping[tuple[str, str], PodMeta]

    @staticmethod
    def of(pods: Iterable[PodMeta]) -> PodDirectory:
        """Index the pods both ways."""
        by_uid = {p.uid: p for p in pods}
        by_name = {(p.namespace, p.name): p for p in by_uid.values()}
        return PodDirectory(MappingProxyType(by_uid), MappingProxyType(by_name))


@dataclass(frozen=True)
class KubeletView:
    """One PodResources refresh: who holds which device, and what the node advertises."""

    devices: tuple[ContainerDevices, ...]
    allocatable: tuple[str, ...] | None = None
    """Device IDs of every resource the kubelet can allocate; ``None`` if it cannot say
    (``GetAllocatableResources`` UNIMPLEMENTED on old kubelets)."""
    claimed: tuple[ClaimedDevice, ...] = ()
    """Devices containers hold through DRA ResourceClaims (``dynamic_resources``), one entry per
    (container, claim, device)."""
    dropped_pods: int = 0
    """Pods holding a device that the refresh left out, past ``--kubernetes.max-pods``."""


@dataclass(frozen=True)
class PidOwner:
    """The container a host PID runs in: from /proc/<pid>/cgroup, or the simulator."""

    pod_uid: str
    container_id: str | None = None
    container: str | None = None
    """Container name when the source knows it; else resolved through ``PodMeta.containers``."""


class UnmappedCounter:
    """Cumulative count of distinct device IDs that named no GPU here, by reason (bounded memory)."""

    def __init__(self, max_remembered: int = 10_000) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._max = max_remembered
        self.counts: dict[str, int] = {}

    def add(self, device_id: str, reason: str) -> None:
        """Count the ID once per reason; after ``max_remembered`` IDs, stop deduplicating new ones."""
        key = (device_id[:256], reason)
        if key in self._seen:
            return
        if len(self._seen) < self._max:
            self._seen.add(key)
        self.counts[reason] = self.counts.get(reason, 0) + 1

    def snapshot(self) -> Mapping[str, int]:
        """An immutable copy for the snapshot."""
        return MappingProxyType(dict(self.counts))


@dataclass(frozen=True)
class Allocations:
    """The part of an ``Attribution`` that depends only on the kubelet, the API and the GPU set."""

    allocations: tuple[Allocation, ...] = ()
    sharing_replicas: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    sharing_pods: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    conflicts: int = 0
    """Exclusive devices listed under more than one pod (all holders are kept)."""
    other_devices: tuple[tuple[PodRef, ContainerDevices], ...] = ()
    """Entries of resources that are not GPUs (NICs among them), of pods still running."""
    claim_sharing: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """GPU UUID -> pods holding the whole GPU through ResourceClaims, where more than one does."""
    claims_ignored: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """DRA driver -> claimed devices left out (neither a GPU nor a NIC of this node)."""
    dropped: int = 0
    """Allocations left out, past ``max_allocations`` (0 under the ceiling)."""


MAX_OTHER_DEVICE_ENTRIES = 4096
"""Non-GPU (container, resource) entries kept per refresh: a node lists a few dozen (one per NIC
resource a container holds); the bound keeps a kubelet listing thousands from costing memory."""


def allocation_rank(a: Allocation) -> tuple[str, ...]:
    """How allocations rank for the ceiling (``--kubernetes.max-allocations``): by pod (namespace,
    name), container, GPU, MIG instance, replica (as a number), resource and claim, so the ones
    kept are the same at every refresh whatever order the kubelet listed them in, and a pod's
    allocations are kept or left out together as far as the ceiling allows."""
    replica = a.replica or ""
    claim = a.claim or ClaimRef("", "", "", "", "")
    return (
        a.pod.namespace,
        a.pod.pod,
        a.pod.container,
        a.uuid,
        a.mig_uuid or "",
        f"{len(replica):04d}{replica}",
        a.resource,
        claim.claim_namespace,
        claim.claim_name,
        claim.driver,
        claim.pool,
        claim.device,
    )


def _within(allocations: Iterable[Allocation], most: int | None) -> tuple[tuple[Allocation, ...], int]:
    """``allocations``, or their first ``most`` by ``allocation_rank``; and how many were left out."""
    kept = tuple(allocations)
    if most is None or len(kept) <= most:
        return kept, 0
    return tuple(sorted(kept, key=allocation_rank)[:most]), len(kept) - most


def _pod_ref(cd: ContainerDevices | ClaimedDevice, pods: PodDirectory | None) -> tuple[PodRef, PodMeta | None]:
    meta = None
    if pods is not None:
        meta = pods.by_uid.get(cd.pod_uid) if cd.pod_uid else None
        if meta is None:
            meta = pods.by_name.get((cd.namespace, cd.pod))
    ref = PodRef(
        namespace=cd.namespace,
        pod=cd.pod,
        container=cd.container,
        uid=meta.uid if meta is not None else cd.pod_uid,
        workload_kind=meta.workload_kind if meta is not None else None,
        workload=meta.workload if meta is not None else None,
    )
    return ref, meta


def build_allocations(
    index: DeviceIndex,
    kubelet: KubeletView,
    pods: PodDirectory | None,
    unmapped: UnmappedCounter,
    slices: SliceDirectory | None = None,
    nic_ids: Collection[str] = (),
    max_allocations: int | None = None,
) -> Allocations:
    """Allocation series, time-slicing replica counts and pods per shared GPU.

    At most ``max_allocations`` allocation series (``None``: all), the first by
    ``allocation_rank``; the rest are counted in ``Allocations.dropped``.  The counts (replicas,
    pods per shared GPU, conflicts) are of every allocation, kept or not: they are one series per
    GPU, and a GPU shared by more pods than the ceiling keeps should say so.

    Devices come from the device plugin (``kubelet.devices``) and from DRA ResourceClaims
    (``kubelet.claimed``, resolved through this node's ResourceSlices ``slices`` and its NICs'
    names and PCI addresses ``nic_ids``: see ``claims.py``).  Pods the API reports as finished are
    dropped.  Without the API (``pods is None``) a device listed under two pods is shown under
    both: we cannot tell which one is finished.
    """
    allocations: dict[tuple[PodRef, str, str, str | None, str | None, ClaimRef | None], Allocation] = {}
    pods_per_gpu: dict[str, set[tuple[str, str]]] = {}
    holders: dict[tuple[str, str | None], set[tuple[str, str]]] = {}
    others: list[tuple[PodRef, ContainerDevices]] = []
    for cd in kubelet.devices:
        ref, meta = _pod_ref(cd, pods)
        if meta is not None and meta.phase in FINISHED_PHASES:
            continue
        is_gpu_resource = cd.resource.startswith(GPU_RESOURCE_PREFIX)
        if not is_gpu_resource and len(others) < MAX_OTHER_DEVICE_ENTRIES:
            others.append((ref, cd))
        for device_id in cd.device_ids:
            found = index.resolve(device_id)
            if isinstance(found, str):
                if is_gpu_resource or index.looks_like_gpu(device_id):
                    unmapped.add(device_id, found)
                continue
            key: tuple[PodRef, str, str, str | None, str | None, ClaimRef | None]
            key = (ref, cd.resource, found.uuid, found.mig_uuid, found.replica, None)
            allocations[key] = Allocation(ref, cd.resource, found.uuid, found.mig_uuid, found.replica)
            if found.replica is not None:
                pods_per_gpu.setdefault(found.uuid, set()).add((cd.namespace, cd.pod))
            else:
                holders.setdefault((found.uuid, found.mig_uuid), set()).add((cd.namespace, cd.pod))
    claim_holders: dict[str, set[tuple[str, str]]] = {}
    ignored: dict[str, int] = {}
    for cl in kubelet.claimed:
        ref, meta = _pod_ref(cl, pods)
        if meta is not None and meta.phase in FINISHED_PHASES:
            continue
        what = claims.resolve(cl, slices, index, nic_ids)
        if what.ref is not None:
            found = what.ref
            allocations[(ref, cl.claim.driver, found.uuid, found.mig_uuid, None, cl.claim)] = Allocation(
                ref, cl.claim.driver, found.uuid, found.mig_uuid, None, cl.claim
            )
            if found.mig_uuid is None:
                claim_holders.setdefault(found.uuid, set()).add((cl.namespace, cl.pod))
        elif what.nic is not None:
            if len(others) < MAX_OTHER_DEVICE_ENTRIES:
                others.append((ref, claims.nic_entry(cl, what.nic)))
        elif what.reason is not None:
            unmapped.add(claims.device_id(cl), what.reason)
        else:
            claims.count_ignored(ignored, cl.claim.driver)
    replicas: dict[str, int] = {}
    for device_id in kubelet.allocatable or ():
        found = index.resolve(device_id)
        if isinstance(found, DeviceRef) and found.replica is not None:
            replicas[found.uuid] = replicas.get(found.uuid, 0) + 1
    claim_sharing = {uuid: len(held) for uuid, held in claim_holders.items() if len(held) > 1}
    for uuid in claim_sharing:
        pods_per_gpu.setdefault(uuid, set()).update(claim_holders[uuid])
    kept, dropped = _within(allocations.values(), max_allocations)
    return Allocations(
        allocations=kept,
        sharing_replicas=MappingProxyType(replicas),
        sharing_pods=MappingProxyType({u: len(p) for u, p in pods_per_gpu.items()}),
        conflicts=sum(1 for pods_of in holders.values() if len(pods_of) > 1),
        other_devices=tuple(others),
        claim_sharing=MappingProxyType(claim_sharing),
        claims_ignored=MappingProxyType(ignored),
        dropped=dropped,
    )


def _container_name(
    owner: PidOwner, meta: PodMeta, allocations: tuple[Allocation, ...], held_by: dict[str, set[str]]
) -> str | None:
    if owner.container:
        return owner.container
    if owner.container_id:
        name = meta.containers.get(owner.container_id)
        if name is not None:
            return name
    # Unknown container ID (API not synced yet): if one container of the pod holds GPUs, it is it.
    if not held_by:
        for a in allocations:
            if a.pod.uid:
                held_by.setdefault(a.pod.uid, set()).add(a.pod.container)
        held_by.setdefault("", set())  # built, even if empty
    holders = held_by.get(meta.uid, set())
    return next(iter(holders)) if len(holders) == 1 else None


def build_usages(
    sample: BackendSample,
    pid_owners: Mapping[int, PidOwner],
    pods: PodDirectory,
    allocations: tuple[Allocation, ...],
) -> tuple[PodUsage, ...]:
    """Per container and physical GPU: memory and kernel time (NVML per-process utilisation) summed
    over the container's processes."""
    held_by: dict[str, set[str]] = {}
    # keyed on plain strings: hashing a PodRef per process cost more than the rest together
    acc: dict[tuple[str, str, str], list[Any]] = {}
    for gpu in sample.gpus:
        for leaf in gpu.leaves:
            for proc in leaf.tenants:  # the MPS server's utilisation is its clients', not its own
                owner = pid_owners.get(proc.pid)
                if owner is None:
                    continue
                meta = pods.by_uid.get(owner.pod_uid)
                if meta is None or meta.phase in FINISHED_PHASES:
                    continue
                container = _container_name(owner, meta, allocations, held_by) or ""
                key = (meta.uid, container, gpu.uuid)
                slot = acc.get(key)
                if slot is None:
                    slot = acc[key] = [None, None, meta]
                if proc.used_memory_bytes is not None:
                    slot[0] = (slot[0] or 0) + proc.used_memory_bytes
                if proc.sm_util_ratio is not None:
                    slot[1] = (slot[1] or 0.0) + proc.sm_util_ratio
    usages = []
    for (_, container, uuid), (memory, share, meta) in acc.items():
        ref = PodRef(meta.namespace, meta.name, container, meta.uid, meta.workload_kind, meta.workload)
        usages.append(
            PodUsage(
                pod=ref,
                uuid=uuid,
                memory_used_bytes=memory,
                kernel_time_ratio=None if share is None else min(1.0, share),
            )
        )
    return tuple(usages)


def leaf_tenants(
    sample: BackendSample, pid_owners: Mapping[int, PidOwner], pods: PodDirectory
) -> Mapping[str, frozenset[tuple[str, str]]]:
    """Leaf id -> (namespace, pod) of each pod with compute processes on it.

    A process whose PID maps to no pod of this node (a host process, an unread cgroup, a pod the
    API has not shown yet) adds ``UNKNOWN_TENANT``: somebody runs there, we cannot say who.
    """
    out: dict[str, set[tuple[str, str]]] = {}
    for gpu in sample.gpus:
        for leaf in gpu.leaves:
            for proc in leaf.tenants:
                owner = pid_owners.get(proc.pid)
                meta = pods.by_uid.get(owner.pod_uid) if owner is not None else None
                key = (meta.namespace, meta.name) if meta is not None else UNKNOWN_TENANT
                out.setdefault(leaf.leaf_id, set()).add(key)
    return MappingProxyType({leaf: frozenset(t) for leaf, t in out.items()})
