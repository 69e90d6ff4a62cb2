"""The ``communication`` class: a leaf classed ``latency`` that is waiting on its peers or its network.

A GPU spinning in a collective runs NCCL kernels of one CUDA block per channel; on an H200 a kernel
of 24 spinning blocks reads SM activity 0.18, graphics busy 1.0, DRAM 0 and tensor 0, which the GPM
classes call ``latency``.  What tells the two apart is outside the leaf: whether its pod spans
GPUs or holds NICs, and whether, within the last ``hold_seconds``, its NVLink or its pod's NICs moved
data or another leaf of the pod computed (this one waits on a straggler).  A lone latency-bound
kernel keeps ``latency``.  docs/network.md defines it; this module is the one place it is decided.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from exporter.model import (
    COMMUNICATION,
    NVLINK,
    Attribution,
    BackendSample,
    LeafAnalysis,
    NetworkSample,
)

WORKING_CLASSES = frozenset({"compute", "memory", "mixed"})
"""Classes of a peer leaf that is doing the work the others wait for."""


@dataclass(frozen=True)
class CommunicationLevels:
    """Evidence levels (ratios 0..1) and how long evidence counts (seconds)."""

    nvlink_ratio: float = 0.01
    """NVLink utilisation (busier direction over capacity) at which the leaf's links move data."""
    nic_ratio: float = 0.01
    """A NIC port's utilisation (busier direction over line rate) at which it moves data."""
    hold_seconds: float = 10.0
    """Evidence seen this recently counts (the classifier's window: its class covers as much)."""


class CommunicationRefiner:
    """Turns ``latency`` into ``communication`` where the evidence says so; keeps per-leaf state
    (when evidence was last seen) for the leaves of the latest cycle only."""

    def __init__(self, levels: CommunicationLevels | None = None) -> None:
        self.levels = levels or CommunicationLevels()
        self._evidence_at: dict[str, float] = {}

    def refine(
        self,
        analysis: Mapping[str, LeafAnalysis],
        sample: BackendSample,
        attribution: Attribution | None,
        network: NetworkSample | None,
        now: float,
    ) -> dict[str, LeafAnalysis]:
        """``analysis`` with the leaves that wait on communication reclassed."""
        out = dict(analysis)
        pods = _pods_of_leaves(attribution)
        if not pods:
            self._evidence_at.clear()
            return out
        leaf_pods: dict[str, set[tuple[str, str]]] = {}
        for pod, held in pods.items():
            for held_leaf in held:
                leaf_pods.setdefault(held_leaf, set()).add(pod)
        nvlink = _nvlink_ratios(sample)
        gpu_of = {gl.leaf_id: gpu.uuid for gpu in sample.gpus for gl in gpu.leaves}
        busy_nics = _busy_nics(network, self.levels.nic_ratio)
        pod_nics = _pod_nics(network)
        pool_pods = _pool_pods(network)
        free_nearest = _free_nearest(network)
        for leaf_id, leaf in analysis.items():
            if leaf.boundness != "latency" or len(leaf_pods.get(leaf_id, ())) != 1:
                continue
            (pod,) = leaf_pods[leaf_id]
            peers = pods[pod] - {leaf_id}
            nics = pod_nics.get(pod, set())
            if not peers and not nics and pod not in pool_pods:
                continue  # a lone kernel: latency stays latency
            watched = nics or free_nearest.get(gpu_of.get(leaf_id, ""), set())
            evidence = (
                nvlink.get(leaf_id, 0.0) >= self.levels.nvlink_ratio
                or bool(watched & busy_nics)
                or any(getattr(analysis.get(p), "boundness", None) in WORKING_CLASSES for p in peers)
            )
            if evidence:
                self._evidence_at[leaf_id] = now
            seen = self._evidence_at.get(leaf_id)
            if seen is not None and now - seen <= self.levels.hold_seconds:
                out[leaf_id] = replace(leaf, boundness=COMMUNICATION)
        for gone in [k for k in self._evidence_at if k not in analysis]:
            del self._evidence_at[gone]
        return out


def _pods_of_leaves(attribution: Attribution | None) -> dict[tuple[str, str], set[str]]:
    """(namespace, pod) -> the leaves it holds."""
    out: dict[tuple[str, str], set[str]] = {}
    for a in attribution.allocations if attribution is not None else ():
        out.setdefault((a.pod.namespace, a.pod.pod), set()).add(a.mig_uuid or a.uuid)
    return out


def _nvlink_ratios(sample: BackendSample) -> dict[str, float]:
    out: dict[str, float] = {}
    for gpu in sample.gpus:
        for leaf in gpu.leaves:
            for link in leaf.links:
                ratio = link.utilization_ratio() if link.link == NVLINK else None
                if ratio is not None:
                    out[leaf.leaf_id] = max(out.get(leaf.leaf_id, 0.0), ratio)
    return out


def _busy_nics(network: NetworkSample | None, level: float) -> set[str]:
    out: set[str] = set()
    for nic in network.nics if network is not None else ():
        if any((p.utilization_ratio() or 0.0) >= level for p in nic.ports):
            out.add(nic.device)
    return out


def _pod_nics(network: NetworkSample | None) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for h in network.holders if network is not None else ():
        if h.device:
            out.setdefault((h.pod.namespace, h.pod.pod), set()).add(h.device)
    return out


def _pool_pods(network: NetworkSample | None) -> set[tuple[str, str]]:
    """Pods holding a NIC of a shared pool (``rdma/hca_shared_devices_a``: an ID naming no device):
    they hold a NIC, which one is not known, so their GPUs' nearest NICs are watched."""
    return {(h.pod.namespace, h.pod.pod) for h in network.holders if not h.device} if network is not None else set()


def _free_nearest(network: NetworkSample | None) -> dict[str, set[str]]:
    """GPU UUID -> its nearest NICs that no pod holds (host-network jobs use them unallocated)."""
    if network is None:
        return {}
    held = {h.device for h in network.holders if h.device}
    out: dict[str, set[str]] = {}
    for p in network.paths:
        if p.nearest and p.device not in held:
            out.setdefault(p.uuid, set()).add(p.device)
    return out
