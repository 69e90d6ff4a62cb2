"""The attribution stage the sampler calls every cycle: cached sources in, one ``Attribution`` out.

Each source (kubelet PodResources, Kubernetes API, /proc cgroups) refreshes on its own schedule and
can fail alone; ``attribute`` only reads their latest state and merges it, so it costs well under
a millisecond when nothing changed.  The simulated backend supplies simulated sources that go
through the same merge code (``exporter.sim.attribution``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

from exporter.attribution.deviceids import DeviceIndex
from exporter.attribution.merge import (
    Allocations,
    KubeletView,
    PidOwner,
    PodDirectory,
    UnmappedCounter,
    build_allocations,
    build_usages,
    leaf_tenants,
)
from exporter.attribution.slices import SliceDirectory
from exporter.model import Attribution, BackendSample, PodUsage, StageResult

if TYPE_CHECKING:
    from exporter.attribution.owners import OwnerResolver

log = logging.getLogger(__name__)

DROPPED_KINDS: tuple[str, ...] = ("pod", "allocation")
"""Kinds of items the attribution's ceilings leave out (``gpulens_attribution_items_dropped_total``)."""
DROPPED_LIMIT = "limit"
"""The reason of an item left out past its ceiling (``--kubernetes.max-pods``, ``--kubernetes.max-allocations``)."""


@dataclass(frozen=True)
class AttributionOptions:
    """What the command line says about attribution.

    No field has a default: the flags (``exporter.config``) are the one place that says what is
    on when nothing is given.
    """

    podresources_socket: str | None
    """Kubelet PodResources unix socket; ``None`` disables the kubelet source."""
    node_name: str | None
    """This node's name (``--kubernetes.node-name`` / ``NODE_NAME``); ``None`` = no API watch."""
    kube_api: bool
    """``--[no-]kubernetes.api``: watch pod metadata (phase, owner workload, container IDs)."""
    kube_owner_chain: bool
    """``--[no-]kubernetes.owner-chain``: a pod's workload is the top of its owner chain."""
    kube_resource_slices: bool
    """``--[no-]kubernetes.resource-slices``: watch this node's DRA ResourceSlices."""
    procfs: str
    """``--path.procfs``: where host PIDs' ``cgroup`` files are (needs hostPID or host /proc)."""
    refresh_seconds: float
    """``--kubernetes.refresh-interval``: kubelet refresh period, seconds."""
    max_pods: int
    """``--kubernetes.max-pods``: pods holding a device taken from one kubelet reply."""
    max_allocations: int
    """``--kubernetes.max-allocations``: allocation series of the node."""


class Attributor(Protocol):
    """Called by the sampler once per cycle; never blocks on I/O."""

    def attribute(self, sample: BackendSample, now: float) -> tuple[Attribution, tuple[StageResult, ...]]:
        """Merge the sources' latest state for this sample; one StageResult per enabled source."""
        ...

    def close(self) -> None:
        """Stop background refreshers; idempotent."""
        ...


class KubeletSource(Protocol):
    """Latest kubelet view (``None`` = unavailable) and the health of its last refresh."""

    def latest(self) -> tuple[KubeletView | None, StageResult, float | None]:
        """(view, stage result, unix time of the last successful refresh)."""
        ...

    def close(self) -> None:
        """Stop refreshing."""
        ...


class PodSource(Protocol):
    """Latest pod metadata of this node (``None`` = the API is not usable right now)."""

    def latest(self) -> tuple[PodDirectory | None, StageResult]:
        """(directory, stage result)."""
        ...

    def close(self) -> None:
        """Stop watching."""
        ...


class SliceSource(Protocol):
    """Latest ResourceSlices of this node (``None`` = the API is not usable right now)."""

    def latest(self) -> tuple[SliceDirectory | None, StageResult]:
        """(directory, stage result); the same directory object while nothing changed."""
        ...

    def close(self) -> None:
        """Stop watching."""
        ...


class PidSource(Protocol):
    """Host PID -> container owner (cached per PID by the real source)."""

    def owners(self, pids: Collection[int]) -> tuple[Mapping[int, PidOwner] | None, StageResult]:
        """Owners of the PIDs that run in pods (others are absent); ``None`` if it cannot read."""
        ...

    def close(self) -> None:
        """Release resources."""
        ...


class PipelineAttributor:
    """Merges whichever sources are enabled; caches the allocation part until an input changes.

    ``sharing_replicas``, when given, is a device plugin's own count of time-slicing replicas per
    GPU UUID; it replaces the count inferred from the kubelet's ``::N`` device IDs.
    ``owner_walks``, when given, reads the pod source's owner-chain walks by outcome (cumulative
    counts) into ``Attribution.owner_walks`` each cycle.  ``slices`` says what each device held
    through a DRA ResourceClaim is; ``nic_ids``, when given, gives the names and PCI addresses of
    this node's RDMA devices, so that a claimed NIC is told from a device left out.
    ``max_allocations`` is the ceiling of allocation series (``merge.build_allocations``); what
    it and the kubelet source's pod ceiling leave out is counted per kubelet refresh in
    ``Attribution.items_dropped``, with what ``kubelet_dropped`` (the source's own counts) says.
    """

    def __init__(
        self,
        kubelet: KubeletSource | None,
        pods: PodSource | None,
        pids: PidSource | None,
        sharing_replicas: Callable[[], Mapping[str, int]] | None = None,
        owner_walks: Callable[[], Mapping[str, int]] | None = None,
        slices: SliceSource | None = None,
        nic_ids: Callable[[], frozenset[str]] | None = None,
        max_allocations: int | None = None,
        kubelet_dropped: Callable[[], Mapping[tuple[str, str], int]] | None = None,
    ) -> None:
        self._kubelet = kubelet
        self._max_allocations = max_allocations
        self._kubelet_dropped = kubelet_dropped
        self._dropped: dict[tuple[str, str], int] | None = (
            None if kubelet_dropped is None else {(kind, DROPPED_LIMIT): 0 for kind in DROPPED_KINDS}
        )
        """Items the ceilings left out, cumulative; kept (from 0, every series present) only with
        the kubelet PodResources source (``kubelet_dropped``), not with the simulator's."""
        self._counted_refresh: float | None = None
        """``last_success`` of the kubelet refresh whose items left out were last counted."""
        self._pods = pods
        self._pids = pids
        self._slices = slices
        self._nic_ids = nic_ids
        self._sharing_replicas = sharing_replicas
        self._owner_walks = owner_walks
        self._unmapped = UnmappedCounter()
        self._cache_inputs: tuple[object, ...] | None = None
        self._cache: Allocations = Allocations()

    def attribute(self, sample: BackendSample, now: float) -> tuple[Attribution, tuple[StageResult, ...]]:
        """Merge the latest state of every source for this sample (no I/O except cached /proc reads)."""
        stages: list[StageResult] = []
        view: KubeletView | None = None
        last_success: float | None = None
        if self._kubelet is not None:
            view, result, last_success = self._kubelet.latest()
            stages.append(result)
        pods: PodDirectory | None = None
        if self._pods is not None:
            pods, result = self._pods.latest()
            stages.append(result)
        slices: SliceDirectory | None = None
        if self._slices is not None:
            slices, result = self._slices.latest()
            stages.append(result)
        index = DeviceIndex(sample)
        allocs = self._allocations(index, view, pods, slices)
        if self._dropped is not None and view is not None and last_success != self._counted_refresh:
            self._counted_refresh = last_success  # once per refresh, not once per cycle
            self._dropped[("pod", DROPPED_LIMIT)] += view.dropped_pods
            self._dropped[("allocation", DROPPED_LIMIT)] += allocs.dropped

        usages: tuple[PodUsage, ...] = ()
        tenants: Mapping[str, frozenset[tuple[str, str]]] | None = None
        if self._pids is not None:
            pids = [p.pid for g in sample.gpus for leaf in g.leaves for p in leaf.processes]
            owners, result = self._pids.owners(pids)
            stages.append(result)
            if owners is not None and pods is not None:
                usages = build_usages(sample, owners, pods, allocs.allocations)
                tenants = leaf_tenants(sample, owners, pods)

        replicas = allocs.sharing_replicas
        if self._sharing_replicas is not None and not index.empty:
            try:
                replicas = MappingProxyType(dict(self._sharing_replicas()))
            except Exception as exc:  # keep the kubelet's count
                log.debug("sharing_replicas source failed: %s", exc)
        attribution = Attribution(
            allocations=allocs.allocations,
            usages=usages,
            sharing_replicas=replicas,
            sharing_pods=allocs.sharing_pods,
            unmapped_devices=self._unmapped.snapshot(),
            podresources_last_success_timestamp=last_success,
            allocation_conflicts=allocs.conflicts,
            leaf_tenants=tenants,
            other_devices=allocs.other_devices,
            claim_sharing=allocs.claim_sharing,
            claims_ignored=allocs.claims_ignored,
            owner_walks=MappingProxyType(dict(self._owner_walks())) if self._owner_walks is not None else None,
            items_dropped=self._items_dropped(),
        )
        return attribution, tuple(stages)

    def _allocations(
        self, index: DeviceIndex, view: KubeletView | None, pods: PodDirectory | None, slices: SliceDirectory | None
    ) -> Allocations:
        if view is None or index.empty:
            # No kubelet data, or no GPU list to check IDs against (backend down): nothing to say.
            self._cache_inputs = None
            return Allocations()
        nic_ids = self._nics() if view.claimed else frozenset()
        inputs = (view, pods, slices, index.key, nic_ids)
        cached = self._cache_inputs
        if (
            cached is not None
            and cached[0] is view
            and cached[1] is pods
            and cached[2] is slices
            and cached[3:] == inputs[3:]
        ):
            return self._cache
        allocs = build_allocations(index, view, pods, self._unmapped, slices, nic_ids, self._max_allocations)
        if allocs.dropped and not self._cache.dropped:  # once when the ceiling starts to bite
            log.warning(
                "%d allocation series, more than --kubernetes.max-allocations=%d: keeping %d (by namespace, "
                "pod, container and GPU); the other %d are counted in "
                'gpulens_attribution_items_dropped_total{kind="allocation"} at every kubelet refresh',
                len(allocs.allocations) + allocs.dropped,
                self._max_allocations,
                len(allocs.allocations),
                allocs.dropped,
            )
        elif self._cache.dropped and not allocs.dropped:
            log.info("allocation series back under --kubernetes.max-allocations=%s", self._max_allocations)
        if allocs.conflicts != self._cache.conflicts:  # one line per change, not per cycle
            log.warning(
                "%d GPU device(s) listed by the kubelet under more than one pod%s; all holders are shown",
                allocs.conflicts,
                "" if pods is not None else " (no pod phases from the API to drop finished ones)",
            )
        self._cache = allocs
        self._cache_inputs = inputs
        return self._cache

    def _items_dropped(self) -> Mapping[tuple[str, str], int] | None:
        """The ceilings' counts and the kubelet source's own (``kubelet_dropped``), one mapping."""
        if self._dropped is None:
            return None
        counts = dict(self._dropped)
        if self._kubelet_dropped is not None:
            counts.update(self._kubelet_dropped())
        return MappingProxyType(counts)

    def _nics(self) -> frozenset[str]:
        """This node's RDMA device names and PCI addresses; empty without a NIC source or when it
        fails (a claimed device then counts as left out, not as a NIC)."""
        if self._nic_ids is None:
            return frozenset()
        try:
            return self._nic_ids()
        except Exception as exc:  # the NIC source's failure shows in its own stage
            log.debug("nic_ids source failed: %s", exc)
            return frozenset()

    def close(self) -> None:
        """Stop every source's background work."""
        for source in (self._kubelet, self._pods, self._slices, self._pids):
            if source is not None:
                try:
                    source.close()
                except Exception:  # closing must never fail the exporter's shutdown
                    log.exception("closing attribution source")


def build_attributor(
    options: AttributionOptions, nic_ids: Callable[[], frozenset[str]] | None = None
) -> PipelineAttributor:
    """Kubelet gRPC, API watch and /proc sources, each only when its option enables it (and only
    then imported: gRPC and the Kubernetes client are loaded by the sources that use them).

    The /proc source needs the API (cgroups name pod UIDs, the kubelet does not), so it is
    enabled with it; so is the ResourceSlice watch, unless ``--no-kubernetes.resource-slices``.
    With the owner chain on, each cycle also reads the API source's walks by outcome
    (``walk_outcomes``).  ``nic_ids``: this node's RDMA device names and PCI addresses (the NIC
    source's), to tell claimed NICs from devices left out.
    """
    kubelet: KubeletSource | None = None
    kubelet_dropped: Callable[[], Mapping[tuple[str, str], int]] | None = None
    pods: PodSource | None = None
    pids: PidSource | None = None
    owner_walks: Callable[[], Mapping[str, int]] | None = None
    slices: SliceSource | None = None
    if options.podresources_socket is not None:
        from exporter.attribution.podresources import PodResourcesSource

        kubelet_source = PodResourcesSource(
            options.podresources_socket, refresh_seconds=options.refresh_seconds, max_pods=options.max_pods
        )
        kubelet, kubelet_dropped = kubelet_source, kubelet_source.dropped
    if options.kube_api and options.node_name:
        from exporter.attribution.kubeapi import KubePodSource

        source = KubePodSource.in_cluster(options.node_name, owner_chain=options.kube_owner_chain)
        if source.owners is not None:
            owner_walks = partial(walk_outcomes, source.owners)
        pods = source
        from exporter.attribution.cgroup import CgroupPidSource

        pids = CgroupPidSource(options.procfs)
        if options.kube_resource_slices:
            from exporter.attribution.resourceslices import ResourceSliceSource

            slices = ResourceSliceSource.in_cluster(options.node_name)
    return PipelineAttributor(
        kubelet,
        pods,
        pids,
        owner_walks=owner_walks,
        slices=slices,
        nic_ids=nic_ids,
        max_allocations=options.max_allocations,
        kubelet_dropped=kubelet_dropped,
    )


def walk_outcomes(resolver: OwnerResolver) -> Mapping[str, int]:
    """The resolver's walks by outcome (``owners.OUTCOMES``, each present, in that order), without
    its request and cache figures: what ``gpulens_kubernetes_owner_walks_total`` exports."""
    from exporter.attribution.owners import OUTCOMES

    stats = resolver.stats()
    return {outcome: stats[outcome] for outcome in OUTCOMES}
