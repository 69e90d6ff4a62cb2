"""The Sharing page's tables and each pod's own class: MIG layouts, time-sliced GPUs' SM shares
(0..1), launch-bound containers and each GPU's sharing mode."""

from __future__ import annotations

import pandas as pd

from dashboard import definitions
from dashboard.frames.columns import LEAF, with_cols
from dashboard.frames.fleet import holders
from dashboard.sources.source import ALLOCATION_KEYS


def mig_layout(mig_info: pd.DataFrame, allocation: pd.DataFrame, info: pd.DataFrame) -> pd.DataFrame:
    """One row per MIG slice: parent GPU, profile, slice size (compute slices) and holders."""
    cols = [
        "node", "instance", "gpu", "uuid", "gpu_name", "mig_uuid", "mig_profile", "gpu_instance_id", "slices", "holders"
    ]  # fmt: skip
    if mig_info.empty:
        return pd.DataFrame(columns=cols)
    mig = with_cols(mig_info, ["node", "instance", "gpu", *LEAF, "mig_profile", "gpu_instance_id"])
    names = (
        with_cols(info, ["uuid", "name"])[["uuid", "name"]].drop_duplicates("uuid").rename(columns={"name": "gpu_name"})
    )
    out = mig.merge(names, on="uuid", how="left").merge(holders(allocation), on=list(LEAF), how="left")
    out["gpu_name"] = out["gpu_name"].fillna("")
    out["holders"] = out["holders"].fillna("")
    out["slices"] = [
        max(1, round(definitions.gpu_share(p, n) * definitions.compute_slices(n)))
        for p, n in zip(out["mig_profile"], out["gpu_name"], strict=True)
    ]
    out["gpu_instance_id"] = pd.to_numeric(out["gpu_instance_id"], errors="coerce")
    out["_gpu"] = pd.to_numeric(out["gpu"], errors="coerce")
    return out.sort_values(["instance", "_gpu", "uuid", "gpu_instance_id"]).reset_index(drop=True)[cols]


def timeslice_shares(
    shares: pd.DataFrame,
    replicas: pd.DataFrame,
    pods: pd.DataFrame,
    sharing: pd.DataFrame | None = None,
    allocation: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Per shared GPU and pod: SM share (0..1), plus the GPU's replicas, holding pods, sharing mode
    and a note where the share cannot exist.

    Only GPUs the device plugin shares (more than one replica advertised), that more than one pod
    holds, or that run MPS: an exclusively held GPU also has a per-pod SM share, but it is not
    shared. Under MPS the driver reports no per-pod SM share; its pods are listed from the
    allocations with the reason in ``note`` instead of a blank.
    """
    cols = ["uuid", "mode", "namespace", "pod", "kernel_time", "note", "replicas", "pods"]
    r = (
        with_cols(replicas, ["uuid"])
        .groupby("uuid", as_index=False)["value"]
        .max()
        .rename(columns={"value": "replicas"})
    )
    p = with_cols(pods, ["uuid"]).groupby("uuid", as_index=False)["value"].max().rename(columns={"value": "pods"})
    modes = sharing_modes(sharing if sharing is not None else pd.DataFrame())
    shared = r.merge(p, on="uuid", how="outer")
    extra = [u for u, m in modes.items() if m == "mps" and u not in set(shared["uuid"])]
    if extra:
        shared = pd.concat([shared, pd.DataFrame({"uuid": extra})], ignore_index=True)
    is_mps = shared["uuid"].map(lambda u: modes.get(str(u)) == "mps").astype(bool)
    shared = shared[(shared["replicas"].fillna(0) > 1) | (shared["pods"].fillna(0) > 1) | is_mps]
    if shared.empty:
        return pd.DataFrame(columns=cols)
    s = with_cols(shares, ["uuid", "namespace", "pod"])
    s = s.groupby(["uuid", "namespace", "pod"], as_index=False)["value"].sum().rename(columns={"value": "kernel_time"})
    holders = with_cols(allocation if allocation is not None else pd.DataFrame(), ["uuid", "namespace", "pod"])
    holders = holders[["uuid", "namespace", "pod"]].drop_duplicates()
    holders = holders[holders["uuid"].map(lambda u: modes.get(str(u)) == "mps")]
    per_pod = pd.concat([s, holders], ignore_index=True).drop_duplicates(["uuid", "namespace", "pod"])
    out = shared.merge(per_pod, on="uuid", how="left")
    out["mode"] = [modes.get(str(u), "time-slicing") for u in out["uuid"]]
    out["note"] = [MPS_KERNEL_TIME_NOTE if m == "mps" else "" for m in out["mode"]]
    out["namespace"] = out["namespace"].fillna("")
    out["pod"] = out["pod"].fillna("")
    for c in ("replicas", "pods"):
        out[c] = pd.to_numeric(out[c], errors="coerce").fillna(0).astype(int)
    return out[cols].sort_values(["uuid", "pod"]).reset_index(drop=True)


POD_KEYS = ("namespace", "pod", "container", *LEAF)


MPS_KERNEL_TIME_NOTE = "per-pod kernel time is not reported by the driver under MPS"
"""Why a pod on an MPS GPU has no SM share: NVML's per-process utilisation has one entry under
MPS, the server's, so nothing splits SM time between the clients (docs/attribution.md)."""


def pod_classes(pod_boundness: pd.DataFrame) -> pd.DataFrame:
    """Per allocated container and leaf, its own class now (``gpulens_pod_gpu_boundness``, the
    exporter's one definition: the leaf's class only where the pod is alone there, ``shared``
    where several pods run): namespace, pod, container, uuid, mig_uuid, class."""
    cols = [*POD_KEYS, "class"]
    if pod_boundness.empty or "class" not in pod_boundness.columns:
        return pd.DataFrame(columns=cols)
    b = with_cols(pod_boundness, cols)
    return b[b["value"] >= 0.5][cols].drop_duplicates(list(POD_KEYS)).reset_index(drop=True)


def launch_bound(pod_boundness: pd.DataFrame, allocation: pd.DataFrame, gpus: pd.DataFrame) -> pd.DataFrame:
    """Allocated containers whose own class is ``launch`` now, with where they run (``gpus``: any
    series with ``uuid`` and ``gpu``, e.g. gpulens_gpu_info, for the GPU index). A pod on a leaf
    other pods run on reads ``shared``, so a neighbour's tiny kernels never list it."""
    cols = ["namespace", "pod", "container", "workload", "node", "instance", "gpu", "uuid", "mig_uuid"]
    classes = pod_classes(pod_boundness)
    if classes.empty or allocation.empty:
        return pd.DataFrame(columns=cols)
    launch = classes[classes["class"] == "launch"][list(POD_KEYS)]
    a = with_cols(allocation, ALLOCATION_KEYS)
    out = a.merge(launch, on=list(POD_KEYS), how="inner")
    gpu = with_cols(gpus, ["uuid", "gpu"])[["uuid", "gpu"]].drop_duplicates("uuid")  # the physical GPU's index
    out = out.merge(gpu, on="uuid", how="left")
    out["gpu"] = out["gpu"].fillna("")
    out["workload"] = [
        f"{k}/{w}" if k and w else (w or "") for k, w in zip(out["workload_kind"], out["workload"], strict=True)
    ]
    return out[cols].drop_duplicates().reset_index(drop=True)


def sharing_modes(sharing: pd.DataFrame) -> dict[str, str]:
    """Physical GPU uuid -> its sharing mode (``gpulens_gpu_sharing_info``); MPS wins over the rest
    when a GPU's MIG instances differ."""
    if sharing.empty or "mode" not in sharing.columns:
        return {}
    out: dict[str, str] = {}
    for uuid, mode in zip(with_cols(sharing, ["uuid", "mode"])["uuid"], sharing["mode"], strict=True):
        if out.get(str(uuid)) != "mps":
            out[str(uuid)] = str(mode)
    return out
