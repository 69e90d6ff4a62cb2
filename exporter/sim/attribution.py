"""Simulated attribution sources: the simulated node's kubelet, API server and /proc views.

They implement the same source protocols as the real kubelet, API and cgroup sources and go
through the same merge code (``exporter.attribution.pipeline.PipelineAttributor``); a raising
call of the simulated node is a failed refresh of that stage, as a real outage would be.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import Protocol, TypeVar

from exporter.attribution import stages
from exporter.attribution.merge import KubeletView, PidOwner, PodDirectory, PodMeta
from exporter.attribution.pipeline import PipelineAttributor
from exporter.attribution.slices import SliceDirectory
from exporter.model import ClaimedDevice, ContainerDevices, SliceDevice, StageResult

log = logging.getLogger(__name__)

T = TypeVar("T")


class SimulatedNode(Protocol):
    """What a simulated node answers besides GPU samples (``SimulatedBackend`` implements it)."""

    def pod_devices(self) -> tuple[ContainerDevices, ...]:
        """Kubelet PodResources view: device IDs per container."""
        ...

    def pod_claims(self) -> tuple[ClaimedDevice, ...]:
        """Kubelet PodResources view of DRA: devices per container through ResourceClaims."""
        ...

    def resource_slices(self) -> tuple[SliceDevice, ...]:
        """API server view of DRA: the devices this node's drivers publish."""
        ...

    def pods(self) -> tuple[PodMeta, ...]:
        """API server view: the node's pods with phase and owner workload."""
        ...

    def pid_owners(self) -> Mapping[int, PidOwner]:
        """cgroup view: host PID -> pod UID and container."""
        ...

    def sharing_replicas(self) -> Mapping[str, int]:
        """GPU UUID -> time-slicing replicas advertised by the device plugin."""
        ...


def _timed(stage: str, fn: Callable[[], T]) -> tuple[T | None, StageResult]:
    start = time.perf_counter()
    try:
        value = fn()
    except Exception as exc:  # a simulated fault: this stage fails, the others go on
        log.debug("simulated %s source failed: %s", stage, exc)
        return None, StageResult(stage, False, time.perf_counter() - start)
    return value, StageResult(stage, True, time.perf_counter() - start)


class SimulatedKubeletSource:
    """Kubelet view from ``node.pod_devices()``; a raising call is a failed refresh."""

    def __init__(self, node: SimulatedNode) -> None:
        self._node = node
        self._last: tuple[tuple[ContainerDevices, ...], tuple[ClaimedDevice, ...], KubeletView] | None = None
        self._last_success: float | None = None

    def latest(self) -> tuple[KubeletView | None, StageResult, float | None]:
        """Ask the simulator now (it is in memory); keep the view object while it is unchanged."""
        listed, result = _timed(
            stages.PODRESOURCES, lambda: (tuple(self._node.pod_devices()), tuple(self._node.pod_claims()))
        )
        if listed is None:
            return None, result, self._last_success
        devices, claimed = listed
        self._last_success = time.time()
        if self._last is None or self._last[:2] != listed:
            self._last = (devices, claimed, KubeletView(devices=devices, allocatable=None, claimed=claimed))
        return self._last[2], result, self._last_success

    def close(self) -> None:
        """Nothing to stop."""


class SimulatedPodSource:
    """Pod metadata from ``node.pods()``."""

    def __init__(self, node: SimulatedNode) -> None:
        self._node = node
        self._last: tuple[tuple[PodMeta, ...], PodDirectory] | None = None

    def latest(self) -> tuple[PodDirectory | None, StageResult]:
        """Directory of the simulated pods; the same object while the simulator's answer is unchanged."""
        pods, result = _timed(stages.KUBE_API, lambda: tuple(self._node.pods()))
        if pods is None:
            return None, result
        if self._last is None or self._last[0] != pods:
            self._last = (pods, PodDirectory.of(pods))
        return self._last[1], result

    def close(self) -> None:
        """Nothing to stop."""


class SimulatedSliceSource:
    """ResourceSlices from ``node.resource_slices()``."""

    def __init__(self, node: SimulatedNode) -> None:
        self._node = node
        self._last: tuple[tuple[SliceDevice, ...], SliceDirectory] | None = None

    def latest(self) -> tuple[SliceDirectory | None, StageResult]:
        """The simulated node's published devices; the same object while they are unchanged."""
        devices, result = _timed(stages.RESOURCE_SLICES, lambda: tuple(self._node.resource_slices()))
        if devices is None:
            return None, result
        if self._last is None or self._last[0] != devices:
            self._last = (devices, SliceDirectory.of(devices))
        return self._last[1], result

    def close(self) -> None:
        """Nothing to stop."""


class SimulatedPidSource:
    """PID owners from ``node.pid_owners()``."""

    def __init__(self, node: SimulatedNode) -> None:
        self._node = node

    def owners(self, pids: Collection[int]) -> tuple[Mapping[int, PidOwner] | None, StageResult]:
        """Owners of the given PIDs that the simulator places in pods."""
        table, result = _timed(stages.CGROUP, self._node.pid_owners)
        if table is None:
            return None, result
        return {pid: table[pid] for pid in pids if pid in table}, result

    def close(self) -> None:
        """Nothing to release."""


def simulated_attributor(
    node: SimulatedNode, nic_ids: Callable[[], frozenset[str]] | None = None
) -> PipelineAttributor:
    """The attribution stages answered by the simulated node, merged like real ones: kubelet, API
    and cgroups, and the ResourceSlice watch on a node with DRA drivers (a scenario that publishes
    devices or has claims).  ``nic_ids``: the node's NICs, to tell claimed NICs apart."""
    dra = bool(node.resource_slices() or node.pod_claims())
    return PipelineAttributor(
        SimulatedKubeletSource(node),
        SimulatedPodSource(node),
        SimulatedPidSource(node),
        sharing_replicas=node.sharing_replicas,
        slices=SimulatedSliceSource(node) if dra else None,
        nic_ids=nic_ids,
    )
