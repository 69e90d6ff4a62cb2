"""A pod's boundness class: the leaf's class only where it describes that pod alone.

GPM (or, without GPM, NVML's GPU-Util, memory-controller utilisation and power) measures a leaf
(a whole GPU or a MIG instance), not a process, so every leaf class is handled alike: the GPM
classes, and the coarse ``busy`` of a GPU without GPM.  A leaf with no class (a MIG instance without
GPM that has processes: nothing measures its use) gives its pods none.  A pod may take its leaf's
class when nobody else can be running there: it is the leaf's only holder, or the only pod whose
processes NVML lists on it.  Where several pods run on one leaf (time-slicing, MPS) the leaf's
class is a property of their mixture, so each of them reads ``shared``; a pod with no process on
a leaf that others use runs nothing there and reads ``idle``.  This module is the one definition:
the exporter exports it as ``gpulens_pod_gpu_boundness`` and the recording rule
``gpulens:pod_gpu_boundness:class``, the alerts, the dashboard and the advisor read that.
"""

from __future__ import annotations

from collections.abc import Mapping

from exporter.model import (
    SHARED_CLASS,
    UNKNOWN_TENANT,
    Attribution,
    LeafAnalysis,
    PodBoundness,
)


def pod_class(
    leaf_class: str,
    pod: tuple[str, str],
    holders: frozenset[tuple[str, str]],
    tenants: frozenset[tuple[str, str]] | None,
) -> str:
    """The class of ``pod`` (namespace, name) on a leaf classed ``leaf_class``.

    ``holders`` are the pods the kubelet allocated the leaf to; ``tenants`` the pods with
    processes on it (``None`` when processes cannot be mapped to pods).
    """
    if len(holders) <= 1:
        return leaf_class
    if tenants is None or UNKNOWN_TENANT in tenants:
        return SHARED_CLASS  # several pods may be running here and we cannot tell which
    if pod not in tenants:
        return "idle"
    return leaf_class if len(tenants) == 1 else SHARED_CLASS


def pod_boundness(attribution: Attribution | None, analysis: Mapping[str, LeafAnalysis]) -> tuple[PodBoundness, ...]:
    """One entry per allocated container and leaf whose leaf has a class this cycle."""
    if attribution is None or not attribution.allocations:
        return ()
    holders: dict[str, set[tuple[str, str]]] = {}
    for a in attribution.allocations:
        holders.setdefault(a.mig_uuid or a.uuid, set()).add((a.pod.namespace, a.pod.pod))
    frozen = {leaf: frozenset(pods) for leaf, pods in holders.items()}
    out: dict[tuple[str, str, str, str, str], PodBoundness] = {}
    for a in attribution.allocations:
        leaf_id = a.mig_uuid or a.uuid
        leaf = analysis.get(leaf_id)
        if leaf is None or leaf.boundness is None:
            continue
        key = (a.pod.namespace, a.pod.pod, a.pod.container, a.uuid, a.mig_uuid or "")
        if key in out:
            continue
        tenants = None
        if attribution.leaf_tenants is not None:
            tenants = attribution.leaf_tenants.get(leaf_id, frozenset())
        cls = pod_class(leaf.boundness, (a.pod.namespace, a.pod.pod), frozen[leaf_id], tenants)
        out[key] = PodBoundness(pod=a.pod, uuid=a.uuid, mig_uuid=a.mig_uuid, boundness=cls)
    return tuple(out.values())
