"""How a leaf is shared: exclusive, time-slicing, MPS or MIG (``gpulens_gpu_sharing_info``).

One definition for the rules and the dashboard. MPS is recognised from NVML itself (an MPS server
or MPS clients listed on the leaf), time-slicing from the replicas the device plugin advertises
(kubelet PodResources) or from several pods holding the GPU through one DRA ResourceClaim (how
NVIDIA's DRA driver shares a GPU between the pods of a claim), MIG from the leaf being a MIG
instance.

A claim's own sharing settings (its opaque ``GpuConfig``) are not read: that needs ``get`` on
ResourceClaims, which the chart does not grant, and NVIDIA's driver gives every claim a
time-slicing setting by default, so the setting alone does not say that anyone shares the GPU.
Under MPS the driver starts an MPS server for the claim, which NVML shows (``mps``).
"""

from __future__ import annotations

from exporter.model import Attribution, LeafSample

SHARING_MODES: tuple[str, ...] = ("exclusive", "time-slicing", "mps", "mig")


def sharing_mode(leaf: LeafSample, attribution: Attribution | None) -> str:
    """The leaf's sharing mode; MPS wins (it can run on a MIG instance or a replicated GPU)."""
    if leaf.mps:
        return "mps"
    if leaf.mig is not None:
        return "mig"
    if attribution is not None and (
        attribution.sharing_replicas.get(leaf.uuid, 0) > 1 or attribution.claim_sharing.get(leaf.uuid, 0) > 1
    ):
        return "time-slicing"
    return "exclusive"
