"""Pure pandas transforms: source frames in, the tables the pages show out (no I/O, no Streamlit)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from dashboard import definitions
from dashboard.sources.source import ALLOCATION_KEYS, Filters
from exporter.metrics import BY_NAME
from exporter.model import LINKS, NVLINK, PCIE

LEAF = ("uuid", "mig_uuid")


def from_rows(rows: Iterable[Mapping[str, object]], *, time: bool = False) -> pd.DataFrame:
    """Rows of ``{label: value, ..., "value": float}`` as a frame; absent labels become ``""``."""
    df = pd.DataFrame(list(rows))
    base = ["timestamp", "value"] if time else ["value"]
    if df.empty:
        return pd.DataFrame(columns=base)
    labels = [c for c in df.columns if c not in ("value", "timestamp")]
    for c in labels:
        df[c] = df[c].fillna("").astype(str)
    df["value"] = pd.to_numeric(df["value"], errors="coerce")
    if time:
        df["timestamp"] = pd.to_numeric(df["timestamp"], errors="coerce")
    return df[[*sorted(labels), *base]]


def col(df: pd.DataFrame, name: str) -> pd.Series:
    """Column ``name`` or a column of ``""`` when the label never occurred."""
    if name in df.columns:
        return df[name]
    return pd.Series([""] * len(df), index=df.index, dtype=object)


def with_cols(df: pd.DataFrame, names: Iterable[str]) -> pd.DataFrame:
    """``df`` with every label in ``names`` present (``""`` where absent)."""
    out = df.copy()
    for n in names:
        if n not in out.columns:
            out[n] = ""
    return out


def aggregate(df: pd.DataFrame, by: Sequence[str] | None) -> pd.DataFrame:
    """``sum by (by)`` (plus timestamp for series); NaN values are skipped like PromQL does."""
    if by is None:
        return df
    time = "timestamp" in df.columns
    keys = [*by, "timestamp"] if time else list(by)
    if df.empty:
        return pd.DataFrame(columns=[*keys, "value"])
    out = with_cols(df, by).groupby(keys, as_index=False, dropna=False)["value"].sum(min_count=1)
    return out


def restrict(df: pd.DataFrame, filters: Filters, allocation: pd.DataFrame, device_keys: Sequence[str]) -> pd.DataFrame:
    """Apply ``filters`` to a frame in pandas (what PromQL matchers do for Prometheus).

    The namespace filter keeps a device series only where ``allocation`` (same time, if series)
    holds the device for a pod of that namespace; series without a device are kept as they are.
    """
    out = df
    for key, value in filters.target_matchers().items():
        out = out[col(out, key) == value]
    if filters.namespace and not out.empty:
        if "namespace" in out.columns and "pod" in out.columns:
            out = out[out["namespace"] == filters.namespace]
        elif device_keys:
            alloc = with_cols(allocation, device_keys)
            alloc = alloc[col(alloc, "namespace") == filters.namespace]
            keys = list(device_keys)
            if "timestamp" in out.columns and "timestamp" in alloc.columns:
                keys.append("timestamp")
            held = alloc[keys].drop_duplicates()
            out = with_cols(out, device_keys).merge(held, on=keys, how="inner")
    return out


def _leaf_index(df: pd.DataFrame) -> pd.DataFrame:
    return with_cols(df, LEAF)


def fleet_counts(
    info: pd.DataFrame, mig_info: pd.DataFrame, allocation: pd.DataFrame, idle: pd.DataFrame
) -> dict[str, int]:
    """Device counts, every one in devices (a whole GPU or a MIG instance; a GPU in MIG mode counts
    as its instances): all devices, allocated, in use (not idle by dashboard/definitions.py, so
    launch-bound ones included), allocated but idle; and the physical GPUs behind them."""
    gpus = set(col(info, "uuid")) - {""}
    mig_parents = set(col(mig_info, "uuid"))
    leaves = {(u, "") for u in gpus - mig_parents} | {
        (u, m) for u, m in zip(col(mig_info, "uuid"), col(mig_info, "mig_uuid"), strict=True) if m
    }
    alloc_leaves = {tuple(r) for r in _leaf_index(allocation)[list(LEAF)].itertuples(index=False)}
    verdict = _leaf_index(idle)
    idle_leaves = {tuple(r) for r in verdict.loc[verdict["value"] >= 0.5, list(LEAF)].itertuples(index=False)}
    busy_leaves = {tuple(r) for r in verdict.loc[verdict["value"] < 0.5, list(LEAF)].itertuples(index=False)}
    known = leaves or alloc_leaves | idle_leaves | busy_leaves
    return {
        "gpus": len(gpus),
        "devices": len(known),
        "allocated": len(alloc_leaves & known) if leaves else len(alloc_leaves),
        "in_use": len(busy_leaves & known) if leaves else len(busy_leaves),
        "allocated_idle": len(alloc_leaves & idle_leaves),
    }


def idle_allocations(
    allocation: pd.DataFrame,
    idle: pd.DataFrame,
    activity: pd.DataFrame,
    *,
    now: float,
    window_s: float,
) -> pd.DataFrame:
    """Devices allocated now whose leaf is idle now (dashboard/definitions.py), with how long.

    ``idle_seconds`` = now - the later of the last busy step and the first allocated step;
    ``idle_at_least`` is True when the device was never busy in the window (so longer than shown);
    NaN when the source has no history for the allocation yet.
    """
    cols = ["namespace", "pod", "container", "workload", "node", "instance", "uuid", "mig_uuid", "sm_active"]
    if allocation.empty or idle.empty:
        return pd.DataFrame(columns=[*cols, "idle_seconds", "idle_at_least"])
    verdict = _leaf_index(idle)
    verdict = verdict[verdict["value"] >= 0.5]
    sm = with_cols(verdict, ["sm_mean"])[[*LEAF, "sm_mean"]].rename(columns={"sm_mean": "sm_active"})
    alloc = with_cols(allocation, ALLOCATION_KEYS)
    out = alloc.merge(sm, on=list(LEAF), how="inner")
    if out.empty:
        return pd.DataFrame(columns=[*cols, "idle_seconds", "idle_at_least"])
    act = with_cols(activity, ALLOCATION_KEYS)[["namespace", "pod", "container", *LEAF, "first_allocated", "last_busy"]]
    out = out.merge(act, on=["namespace", "pod", "container", *LEAF], how="left")
    since = out[["first_allocated", "last_busy"]].astype(float).max(axis=1, skipna=True)
    out["idle_seconds"] = (now - since).clip(lower=0.0)
    window_start = now - window_s
    first = pd.to_numeric(out["first_allocated"], errors="coerce")
    out["idle_at_least"] = out["last_busy"].isna() & (first.isna() | (first - window_start < 0.05 * window_s))
    out["workload"] = [
        f"{k}/{w}" if k and w else (w or "")
        for k, w in zip(col(out, "workload_kind"), col(out, "workload"), strict=True)
    ]
    out = out[[*cols, "idle_seconds", "idle_at_least"]].drop_duplicates(["namespace", "pod", "container", *LEAF])
    return out.sort_values("idle_seconds", ascending=False).reset_index(drop=True)


def price_for(model: str, prices: Mapping[str, float]) -> float | None:
    """USD per GPU-hour for a model name: an exact key, else the longest key contained in the
    name (case-insensitive), else the ``*`` default; None when no price is configured."""
    if model in prices:
        return prices[model]
    upper = model.upper()
    matches = [k for k in prices if k != "*" and k.upper() in upper]
    if matches:
        return prices[max(matches, key=len)]
    return prices.get("*")


def waste_by_namespace(activity: pd.DataFrame, info: pd.DataFrame, prices: Mapping[str, float]) -> pd.DataFrame:
    """Wasted GPU-hours (dashboard/definitions.py) and their cost per namespace.

    Columns: namespace, gpu_hours, cost_usd (NaN when no price is known for a model), pods.
    """
    cols = ["namespace", "gpu_hours", "cost_usd", "pods"]
    if activity.empty:
        return pd.DataFrame(columns=cols)
    act = with_cols(activity, ALLOCATION_KEYS).copy()
    models = {u: n for u, n in zip(col(info, "uuid"), col(info, "name"), strict=True)}
    act["model"] = [models.get(u, "") for u in act["uuid"]]
    act["gpu_hours"] = act["wasted_gpu_hours"].astype(float)
    unit = [price_for(m, prices) for m in act["model"]]
    act["cost_usd"] = [h * p if p is not None else math.nan for h, p in zip(act["gpu_hours"], unit, strict=True)]
    out = act.groupby("namespace", as_index=False).agg(
        gpu_hours=("gpu_hours", "sum"),
        cost_usd=("cost_usd", lambda s: s.sum(min_count=1)),
        pods=("pod", "nunique"),
    )
    return out.sort_values("gpu_hours", ascending=False).reset_index(drop=True)[cols]


def holders(allocation: pd.DataFrame) -> pd.DataFrame:
    """Per leaf, who holds it: ``namespace/pod`` names joined with ", "."""
    if allocation.empty:
        return pd.DataFrame(columns=[*LEAF, "holders"])
    alloc = with_cols(allocation, [*LEAF, "namespace", "pod"])
    alloc = alloc.assign(holder=alloc["namespace"] + "/" + alloc["pod"])
    out = alloc.groupby(list(LEAF), as_index=False)["holder"].agg(lambda s: ", ".join(sorted(set(s))))
    return out.rename(columns={"holder": "holders"})


def boundness_now(boundness: pd.DataFrame) -> pd.DataFrame:
    """Per leaf, the class whose state-set value is 1 (uuid, mig_uuid, class, plus gpu/instance)."""
    if boundness.empty or "class" not in boundness.columns:
        return pd.DataFrame(columns=[*LEAF, "class"])
    b = with_cols(boundness, [*LEAF, "gpu", "instance"])
    b = b[b["value"] >= 0.5]
    return b[["instance", "gpu", *LEAF, "class"]].drop_duplicates(list(LEAF)).reset_index(drop=True)


def roofline_points(
    dram: pd.DataFrame, pipe: pd.DataFrame, boundness: pd.DataFrame, allocation: pd.DataFrame
) -> pd.DataFrame:
    """One point per leaf: x = DRAM active, y = max pipe active, its class and holders."""
    cols = ["node", "instance", "gpu", *LEAF, "dram_active", "pipe_active", "class", "holders"]
    if dram.empty or pipe.empty:
        return pd.DataFrame(columns=cols)
    d = with_cols(dram, ["node", "instance", "gpu", *LEAF]).rename(columns={"value": "dram_active"})
    p = with_cols(pipe, LEAF).rename(columns={"value": "pipe_active"})
    pts = d[["node", "instance", "gpu", *LEAF, "dram_active"]].merge(p[[*LEAF, "pipe_active"]], on=list(LEAF))
    cls = boundness_now(boundness)[[*LEAF, "class"]]
    pts = pts.merge(cls, on=list(LEAF), how="left").merge(holders(allocation), on=list(LEAF), how="left")
    pts["class"] = pts["class"].fillna(definitions.UNKNOWN_CLASS)
    pts["holders"] = pts["holders"].fillna("(unallocated)")
    return pts[cols].drop_duplicates(list(LEAF)).reset_index(drop=True)


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
    cols = ["uuid", "mode", "namespace", "pod", "sm_share", "note", "replicas", "pods"]
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
    s = s.groupby(["uuid", "namespace", "pod"], as_index=False)["value"].sum().rename(columns={"value": "sm_share"})
    holders = with_cols(allocation if allocation is not None else pd.DataFrame(), ["uuid", "namespace", "pod"])
    holders = holders[["uuid", "namespace", "pod"]].drop_duplicates()
    holders = holders[holders["uuid"].map(lambda u: modes.get(str(u)) == "mps")]
    per_pod = pd.concat([s, holders], ignore_index=True).drop_duplicates(["uuid", "namespace", "pod"])
    out = shared.merge(per_pod, on="uuid", how="left")
    out["mode"] = [modes.get(str(u), "time-slicing") for u in out["uuid"]]
    out["note"] = [MPS_SM_SHARE_NOTE if m == "mps" else "" for m in out["mode"]]
    out["namespace"] = out["namespace"].fillna("")
    out["pod"] = out["pod"].fillna("")
    for c in ("replicas", "pods"):
        out[c] = pd.to_numeric(out[c], errors="coerce").fillna(0).astype(int)
    return out[cols].sort_values(["uuid", "pod"]).reset_index(drop=True)


SLOW_EFFICIENCY = definitions.PROBE_SLOW_EFFICIENCY_BELOW
"""A probe result below this share of the model's expected bandwidth is slow (the alert's threshold)."""
SLOW_VS_PEERS = 0.90
"""A probe result at or below this share of its healthy peers' median is slow (inclusive)."""


def probe_comparison(
    efficiency: pd.DataFrame, bandwidth: pd.DataFrame, info: pd.DataFrame, mig_info: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Per device (GPU or MIG instance) and probe: bandwidth, efficiency vs expected, and
    ``vs_peers`` = efficiency / the median efficiency of its healthy peers: other devices of the same
    model, MIG profile and probe whose own efficiency is above SLOW_EFFICIENCY (NaN without such a
    peer). A slow device is never its own reference, and the slow ones do not drag the median down.
    ``slow``: efficiency < SLOW_EFFICIENCY or vs_peers <= SLOW_VS_PEERS.
    """
    cols = ["node", "instance", "gpu", "uuid", "mig_uuid", "model", "mig_profile", "probe", "bandwidth",
            "efficiency", "vs_peers", "peers", "slow"]  # fmt: skip
    if efficiency.empty and bandwidth.empty:
        return pd.DataFrame(columns=cols)
    keys = ["uuid", "mig_uuid", "probe"]
    ident_cols = ["node", "instance", "gpu"]
    e = with_cols(efficiency, [*keys, *ident_cols])[[*keys, *ident_cols, "value"]].rename(
        columns={"value": "efficiency"}
    )
    b = with_cols(bandwidth, [*keys, *ident_cols])[[*keys, *ident_cols, "value"]].rename(columns={"value": "bandwidth"})
    out = b.merge(e, on=[*keys, *ident_cols], how="outer")
    models = (
        with_cols(info, ["uuid", "name"])[["uuid", "name"]].drop_duplicates("uuid").rename(columns={"name": "model"})
    )
    out = out.merge(models, on="uuid", how="left")
    mig = with_cols(mig_info if mig_info is not None else pd.DataFrame(), ["mig_uuid", "mig_profile"])
    out = out.merge(mig[["mig_uuid", "mig_profile"]].drop_duplicates("mig_uuid"), on="mig_uuid", how="left")
    for c in ("model", "mig_profile"):
        out[c] = out[c].fillna("")
    healthy = out["efficiency"] >= SLOW_EFFICIENCY
    ref, count = [], []
    for _, r in out.iterrows():
        peers = out[
            healthy
            & (out["model"] == r["model"])
            & (out["mig_profile"] == r["mig_profile"])
            & (out["probe"] == r["probe"])
            & ((out["uuid"] != r["uuid"]) | (out["mig_uuid"] != r["mig_uuid"]))
        ]
        ref.append(float(peers["efficiency"].median()) if not peers.empty else float("nan"))
        count.append(len(peers))
    out["vs_peers"] = out["efficiency"] / pd.Series(ref, index=out.index)
    out["peers"] = count
    out["slow"] = (out["efficiency"] < SLOW_EFFICIENCY) | (out["vs_peers"] <= SLOW_VS_PEERS)
    out = out.assign(_gpu=pd.to_numeric(out["gpu"], errors="coerce"))
    return out.sort_values(["slow", "probe", "efficiency"], ascending=[False, True, True])[cols].reset_index(drop=True)


POD_KEYS = ("namespace", "pod", "container", *LEAF)

MPS_SM_SHARE_NOTE = "per-pod SM share is not reported by the driver under MPS"
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


NOT_THROTTLING = frozenset({"gpu_idle", "applications_clocks_setting"})
"""Clock event reasons that are not throttling: an idle GPU lowers its clocks by design, and an
application clock setting is the operator's choice."""


def active_clock_events(events: pd.DataFrame) -> pd.DataFrame:
    """Throttle reasons and the share of the range each held the clocks down (``events`` are the
    reasons' means over the range, or instant 0/1 values): node, instance, gpu, uuid, reason,
    share; reasons that are not throttling (NOT_THROTTLING) left out."""
    cols = ["node", "instance", "gpu", "uuid", "reason", "share"]
    if events.empty or "reason" not in events.columns:
        return pd.DataFrame(columns=cols)
    ev = with_cols(events, ["node", "instance", "gpu", "uuid"])
    ev = ev[(ev["value"] > 0) & ~ev["reason"].isin(NOT_THROTTLING)].rename(columns={"value": "share"})
    ev = ev.assign(_gpu=pd.to_numeric(ev["gpu"], errors="coerce"))
    return ev.sort_values(["share", "node", "instance", "_gpu"], ascending=[False, True, True, True])[cols].reset_index(
        drop=True
    )


def first_events(
    grown: pd.DataFrame, at_end: pd.DataFrame, at_start: pd.DataFrame, targets_at_start: pd.DataFrame
) -> pd.DataFrame:
    """Events a counter counted in a window, the first included (scrape mode's
    ``definitions.counter_events_promql``): ``grown`` (its increase per series) where the series
    existed at the window's start, its whole value at the end (``at_end``) where it did not and its
    target (``instance`` in ``targets_at_start``) was scraped then. Label columns and ``value``."""
    if at_end.empty:
        return grown
    labels = [c for c in at_end.columns if c not in ("timestamp", "value")]
    known = (
        set(map(tuple, with_cols(at_start, labels)[labels].itertuples(index=False))) if not at_start.empty else set()
    )
    scraped = set(col(targets_at_start, "instance")) if not targets_at_start.empty else set()
    end = at_end[[*labels, "value"]]
    is_new = [
        key not in known and inst in scraped
        for key, inst in zip(end[labels].itertuples(index=False, name=None), col(end, "instance"), strict=True)
    ]
    born = end[is_new]
    if born.empty:
        return grown
    keys = set(map(tuple, born[labels].itertuples(index=False, name=None)))
    rest = grown
    if not grown.empty:
        g = with_cols(grown, labels)
        rest = grown[[key not in keys for key in g[labels].itertuples(index=False, name=None)]]
    return pd.concat([rest, born], ignore_index=True)


def nonzero(df: pd.DataFrame, label_cols: Sequence[str]) -> pd.DataFrame:
    """Rows with a positive value (e.g. error increases), only ``label_cols`` + value, largest first."""
    if df.empty:
        return pd.DataFrame(columns=[*label_cols, "value"])
    out = with_cols(df, label_cols)
    out = out[out["value"] > 0]
    return out[[*label_cols, "value"]].sort_values("value", ascending=False).reset_index(drop=True)


# --- links: PCIe and NVLink -----------------------------------------------------------------
TRANSFER_CLASS = definitions.TRANSFER_CLASS
"""The class of a leaf whose links are busy while its SMs idle or wait: it is moving data (a data
loader copying host memory to the GPU)."""
LINK_NAMES: dict[str, str] = {PCIE: "PCIe", NVLINK: "NVLink"}
DIRECTION_NAMES: dict[str, str] = {"rx": "in", "tx": "out"}
"""A link's directions in words: ``rx`` is into the GPU (host to GPU over PCIe, from its peers
over NVLink), ``tx`` out of it."""
LINK_SOURCE_NAMES: dict[str, str] = {
    "counter": "NVML byte counters",
    "gpm": "GPM counters, each cycle",
    "sampled": "NVML samples (20 ms windows)",
}
"""Where the exporter read a leaf's link bytes (``gpulens_gpu_link_info{source}``), in words."""


def _catalogued(name: str) -> str:
    """``name`` as the metric catalogue has it: importing fails if the exporter stops serving it."""
    return BY_NAME[name].name


LINK_COUNTERS: dict[tuple[str, str], str] = {
    (link, d): _catalogued(f"gpulens_gpu_{link}_{d}_bytes_total") for link in LINKS for d in DIRECTION_NAMES
}
"""(link, direction) -> the leaf's byte counter (rate() gives bytes per second)."""
LINK_GAUGES: dict[tuple[str, str], str] = {
    (link, d): _catalogued(f"gpulens_gpu_{link}_{d}_bytes_per_second") for link in LINKS for d in DIRECTION_NAMES
}
"""(link, direction) -> the physical GPU's sampled throughput: what an exporter without the
counters has (a 20 ms window per cycle), drawn only where the counters are missing."""
LINK_UTILIZATION: dict[str, str] = {link: _catalogued(f"gpulens_gpu_{link}_utilization_ratio") for link in LINKS}
LINK_CAPACITY: dict[str, str] = {link: _catalogued(f"gpulens_gpu_{link}_capacity_bytes_per_second") for link in LINKS}
LINK_INFO = _catalogued("gpulens_gpu_link_info")
TRANSFER_ACTIVE = _catalogued("gpulens_gpu_transfer_active_ratio")


def _labelled(df: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """``df`` with the labels ``names`` present, ``""`` where absent or missing (a frame put
    together from sources that lack a label)."""
    out = with_cols(df, names)
    return out.assign(**{n: out[n].fillna("") for n in names})


def link_column(link: str, direction: str | None = None) -> str:
    """The column of a link's utilisation (``pcie``) or of its throughput one way
    (``pcie_in_bytes_per_second``) in the tables below."""
    return link if direction is None else f"{link}_{DIRECTION_NAMES[direction]}_bytes_per_second"


def leaf_links(
    leaves: pd.DataFrame,
    utilization: Mapping[str, pd.DataFrame],
    throughput: Mapping[tuple[str, str], pd.DataFrame],
) -> pd.DataFrame:
    """``leaves`` with each link's utilisation (``utilization``: link -> a value per leaf, 0..1)
    and throughput each way (``throughput``: (link, direction) -> bytes/s per leaf), in the
    columns :func:`link_column` names; NaN where unmeasured."""
    out = with_cols(leaves, LEAF)
    for link in LINKS:
        parts = [(link_column(link), utilization.get(link))]
        parts += [(link_column(link, d), throughput.get((link, d))) for d in DIRECTION_NAMES]
        for column, df in parts:
            if df is None or df.empty:
                out[column] = math.nan
                continue
            values = with_cols(df, LEAF).groupby(list(LEAF), as_index=False)["value"].max()
            out = out.merge(values.rename(columns={"value": column}), on=list(LEAF), how="left")
    return out


def per_second(moved: pd.DataFrame, seconds: float) -> pd.DataFrame:
    """Bytes moved over ``seconds`` (a counter's increase) as bytes per second."""
    return moved.assign(value=moved["value"] / max(seconds, 1e-9)) if not moved.empty else moved


def latest(series: pd.DataFrame) -> pd.DataFrame:
    """Each series' newest point (its labels and value, without the timestamp)."""
    if series.empty:
        return series
    labels = [c for c in series.columns if c not in ("timestamp", "value")]
    newest = series.sort_values("timestamp", kind="stable")
    newest = newest.groupby(labels, dropna=False, sort=False).tail(1) if labels else newest.tail(1)
    return newest.drop(columns=["timestamp"]).reset_index(drop=True)


def measured_links(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` without the link columns no row has a value for (a node without NVLink)."""
    columns = [link_column(link, d) for link in LINKS for d in (None, *DIRECTION_NAMES)]
    return df.drop(columns=[c for c in columns if c in df.columns and df[c].isna().all()])


def leaves_in_class(classes: pd.DataFrame, cls: str) -> pd.DataFrame:
    """The leaves whose current class (``current_state`` rows of gpulens_gpu_boundness) is ``cls``:
    node, instance, gpu, uuid, mig_uuid, mig_profile."""
    cols = ["node", "instance", "gpu", *LEAF, "mig_profile"]
    if classes.empty or "class" not in classes.columns:
        return pd.DataFrame(columns=cols)
    now = with_cols(classes, [*cols, "class"])
    now = now[(now["class"] == cls) & (now["value"] >= 0.5)]
    return now[cols].drop_duplicates(list(LEAF)).reset_index(drop=True)


def busy_but_sm_idle(util: pd.DataFrame, idle: pd.DataFrame, moving: pd.DataFrame) -> pd.DataFrame:
    """GPUs nvidia-smi calls busy (GPU-Util now at least the idle definition's kernel level) whose
    SMs idled over its window (``idle``'s ``sm_mean``, their busiest MIG instance), less those
    ``moving`` data (class transfer: the copy engines, not kernels, keep GPU-Util up): what is
    left is launch-bound or polling. node, instance, gpu, uuid, gpu_util, sm_active."""
    cols = ["node", "instance", "gpu", "uuid", "gpu_util", "sm_active"]
    if util.empty or idle.empty:
        return pd.DataFrame(columns=cols)
    sm = with_cols(idle, ["uuid"]).groupby("uuid", as_index=False)["sm_mean"].max()
    sm = sm.rename(columns={"sm_mean": "sm_active"})
    both = with_cols(util, ["node", "instance", "gpu", "uuid"]).merge(sm, on="uuid")
    both = both[
        (both["value"] >= definitions.KERNELS_UTIL_AT_LEAST) & (both["sm_active"] < definitions.IDLE_SM_ACTIVE_BELOW)
    ]
    both = both[~both["uuid"].isin(set(col(moving, "uuid")))]
    return both.rename(columns={"value": "gpu_util"})[cols].reset_index(drop=True)


def _where(df: pd.DataFrame) -> pd.Series:
    """Each row's node, or its exporter ``instance`` where Prometheus adds no node label."""
    node, instance = col(df, "node"), col(df, "instance")
    return node.where(node != "", instance)


def leaf_words(mig_uuid: object, mig_profile: object) -> str:
    """A leaf in words: ``GPU``, or a MIG instance as ``3g.71gb MIG-abcdefgh``."""
    return f"{mig_profile or 'MIG'} {str(mig_uuid)[:12]}" if mig_uuid else "GPU"


def outbound(lines: pd.DataFrame) -> list[str]:
    """The series of link lines (:func:`link_totals`, :func:`link_panels`) that are a link's
    outbound direction (drawn dashed)."""
    out = f" {DIRECTION_NAMES['tx']}"
    return [n for n in dict.fromkeys(col(lines, "series")) if str(n).endswith(out) or f"{out} [" in str(n)]


def link_totals(rates: Mapping[tuple[str, str], pd.DataFrame]) -> pd.DataFrame:
    """The throughput of every leaf in view together, per link and direction over time
    (``rates``: (link, direction) -> bytes/s summed, timestamp and value): timestamp, series
    (``PCIe in``...), value."""
    parts = [
        pd.DataFrame(
            {"timestamp": df["timestamp"], "series": f"{LINK_NAMES[link]} {DIRECTION_NAMES[d]}", "value": df["value"]}
        )
        for (link, d), df in rates.items()
        if not df.empty
    ]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["timestamp", "series", "value"])


def busiest_links(active: pd.DataFrame, top: int, at_least: float) -> pd.DataFrame:
    """The ``top`` leaves whose busiest link was the most utilised over the range, mean at least
    ``at_least`` (``active``: gpulens_gpu_transfer_active_ratio over time, a row per leaf and
    step): timestamp, series (``node GPU 3``, a MIG instance with its profile), value."""
    cols = ["timestamp", "series", "value"]
    if active.empty:
        return pd.DataFrame(columns=cols)
    df = with_cols(active, ["node", "instance", "gpu", *LEAF, "mig_profile"])
    means = df.groupby(list(LEAF))["value"].mean()
    keep = means[means >= at_least].sort_values(ascending=False).head(top)
    if keep.empty:
        return pd.DataFrame(columns=cols)
    df = df.set_index(list(LEAF)).loc[list(keep.index)].reset_index()
    names = [
        f"{w} GPU {g}" + (f" {leaf_words(m, p)}" if m else "")
        for w, g, m, p in zip(_where(df), df["gpu"], df["mig_uuid"], df["mig_profile"], strict=True)
    ]
    return pd.DataFrame({"timestamp": df["timestamp"], "series": names, "value": df["value"]})[cols]


def link_panels(series: pd.DataFrame, steps: int = 1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The GPU page's links from ``device_series`` rows: (throughput, utilisation), each a frame of
    timestamp, series (``PCIe in``, ``NVLink out``; a MIG instance's with its profile) and value.
    Throughput is bytes/s, the rate of each leaf's byte counters over the last ``steps`` steps
    (source.rate_steps: a step at a scrape interval's length reads a scrape twice, then none,
    every so often), or the physical GPU's sampled throughput where the exporter has no counters;
    utilisation is 0..1."""
    cols = ["timestamp", "series", "value"]
    if series.empty or "metric" not in series.columns:
        return pd.DataFrame(columns=cols), pd.DataFrame(columns=cols)
    df = _labelled(series, ["metric", *LEAF, "mig_profile"])
    counted = df["metric"].isin(set(LINK_COUNTERS.values())).any()
    throughput = []
    for (link, d), metric in (LINK_COUNTERS if counted else LINK_GAUGES).items():
        rows = df[df["metric"] == metric].drop(columns=["metric"]).dropna(axis=1, how="all")
        if counted:
            rows = counter_rate(with_cols(rows, [*LEAF, "mig_profile"]), steps=steps)
        if rows.empty:
            continue
        throughput.append(_link_lines(rows, f"{LINK_NAMES[link]} {DIRECTION_NAMES[d]}"))
    utilization = [
        _link_lines(df[df["metric"] == metric], LINK_NAMES[link])
        for link, metric in LINK_UTILIZATION.items()
        if (df["metric"] == metric).any()
    ]
    return (
        pd.concat(throughput, ignore_index=True) if throughput else pd.DataFrame(columns=cols),
        pd.concat(utilization, ignore_index=True) if utilization else pd.DataFrame(columns=cols),
    )


def _link_lines(rows: pd.DataFrame, name: str) -> pd.DataFrame:
    """``rows`` as lines named ``name``, a MIG instance's with its profile and UUID."""
    rows = with_cols(rows, [*LEAF, "mig_profile"])
    leaves = zip(rows["mig_uuid"], rows["mig_profile"], strict=True)
    names = [name + (f" [{leaf_words(m, p)}]" if m else "") for m, p in leaves]
    return pd.DataFrame({"timestamp": rows["timestamp"], "series": names, "value": rows["value"]})


def link_table(series: pd.DataFrame) -> pd.DataFrame:
    """Per leaf and link of ``device_series`` rows, what the range shows: device (``GPU`` or the
    MIG instance), link (``PCIe``), capacity each way (bytes/s, the newest), where the bytes come
    from (in words), the mean throughput in and out (bytes/s: the counters' growth over the time
    they cover) and the mean and peak utilisation (0..1)."""
    cols = ["device", "link", "capacity_bytes_per_second", "measured_by", "in_bytes_per_second",
            "out_bytes_per_second", "mean_utilization", "peak_utilization"]  # fmt: skip
    if series.empty or "metric" not in series.columns:
        return pd.DataFrame(columns=cols)
    df = _labelled(series, ["metric", *LEAF, "mig_profile", "link", "source"]).dropna(subset=["value"])
    out = []
    linked = {LINK_INFO, *LINK_CAPACITY.values(), *LINK_UTILIZATION.values(), *LINK_COUNTERS.values()}
    leaves = df[df["metric"].isin(linked)][[*LEAF, "mig_profile"]]
    for (uuid, mig), leaf in leaves.groupby(list(LEAF), sort=True):
        of_leaf = df[(df["uuid"] == uuid) & (df["mig_uuid"] == mig)]
        for link in LINKS:
            row = _link_row(of_leaf, link)
            if row is not None:
                out.append({"device": leaf_words(mig, leaf["mig_profile"].iloc[0]), "link": LINK_NAMES[link], **row})
    return pd.DataFrame(out, columns=cols)


def _link_row(df: pd.DataFrame, link: str) -> dict[str, object] | None:
    """One leaf's :func:`link_table` values for ``link``; None when the leaf has no such series."""
    info = df[(df["metric"] == LINK_INFO) & (df["link"] == link)]
    capacity = df[df["metric"] == LINK_CAPACITY[link]].sort_values("timestamp")
    util = df[df["metric"] == LINK_UTILIZATION[link]]["value"]
    moved = {d: _mean_rate(df[df["metric"] == LINK_COUNTERS[(link, d)]]) for d in DIRECTION_NAMES}
    if info.empty and capacity.empty and util.empty and all(math.isnan(v) for v in moved.values()):
        return None
    source = str(info.sort_values("timestamp")["source"].iloc[-1]) if not info.empty else ""
    return {
        "capacity_bytes_per_second": float(capacity["value"].iloc[-1]) if not capacity.empty else math.nan,
        "measured_by": LINK_SOURCE_NAMES.get(source, source),
        "in_bytes_per_second": moved["rx"],
        "out_bytes_per_second": moved["tx"],
        "mean_utilization": float(util.mean()) if not util.empty else math.nan,
        "peak_utilization": float(util.max()) if not util.empty else math.nan,
    }


def _mean_rate(counter: pd.DataFrame) -> float:
    """A counter's mean rate over the time its points span (a drop is a reset, as in
    :func:`counter_rate`); NaN with fewer than two points."""
    points = counter.sort_values("timestamp")
    values, times = points["value"].to_numpy(dtype=float), points["timestamp"].to_numpy(dtype=float)
    if len(values) < 2 or times[-1] <= times[0]:
        return math.nan
    steps = values[1:] - values[:-1]
    grown = steps.clip(min=0.0) + values[1:] * (steps < 0)
    return float(grown.sum() / (times[-1] - times[0]))


# --- the GPU page -----------------------------------------------------------------------
# The GPU page's charts, their titles, units and legend words are dashboard/gpu_panels.py's table.


def counter_rate(df: pd.DataFrame, key: str | None = None, steps: int = 1) -> pd.DataFrame:
    """Counters as their per-second rate at each point of each series (``key``: a column that
    tells series apart, else every label column): the growth over the last ``steps`` gaps between
    its points over the time they span (fewer at a series' start), a drop being a reset, counted
    as the new value. A series' first point has no rate and is left out.

    Over several steps a scrape read late (at two points, then none) averages out instead of
    reading 0 then twice the rate: what Prometheus' ``rate()`` over a window longer than the step
    does."""
    if df.empty:
        return df
    labels = [key] if key else [c for c in df.columns if c not in ("timestamp", "value")]
    out = df.sort_values("timestamp", kind="stable").reset_index(drop=True)
    by = [out[c] for c in labels] if labels else [pd.Series(0, index=out.index)]
    grouped = out.groupby(by, dropna=False, sort=False)
    prev, prev_t = grouped["value"].shift(), grouped["timestamp"].shift()
    # a series' first point has no growth (not its whole value: the count since the exporter started)
    grown = (out["value"] - prev).where(out["value"] >= prev, out["value"]).where(prev.notna())
    gap = out["timestamp"] - prev_t
    if steps > 1:
        series = out.groupby(by, dropna=False, sort=False).ngroup()
        window = {"window": steps, "min_periods": 1}
        grown = grown.groupby(series).rolling(**window).sum().reset_index(level=0, drop=True).sort_index()
        gap = gap.groupby(series).rolling(**window).sum().reset_index(level=0, drop=True).sort_index()
    out["value"] = (grown / gap).where(prev.notna() & (gap > 0))
    return out.dropna(subset=["value"]).reset_index(drop=True)


def state_timeline(series: pd.DataFrame, metric: str, label: str) -> pd.DataFrame:
    """When each value of ``label`` was on (value 1) for a state-set metric (boundness class,
    clock event reason): timestamp, leaf (``GPU`` or the MIG instance), and the state."""
    cols = ["timestamp", "leaf", label]
    if series.empty or "metric" not in series.columns:
        return pd.DataFrame(columns=cols)
    df = with_cols(series[series["metric"] == metric], [label, "mig_uuid", "mig_profile"])
    df = df[df["value"] >= 0.5]
    leaf = [f"{p or 'MIG'} {m[:12]}" if m else "GPU" for m, p in zip(df["mig_uuid"], df["mig_profile"], strict=True)]
    return pd.DataFrame({"timestamp": df["timestamp"], "leaf": leaf, label: df[label]})[cols].reset_index(drop=True)


def pods_over_range(series: pd.DataFrame) -> pd.DataFrame:
    """Who held the GPU in the range: one row per container and leaf, first and last step seen."""
    cols = ["namespace", "pod", "container", "workload", "mig_uuid", "replicas", "first_seen", "last_seen"]
    if series.empty or "metric" not in series.columns:
        return pd.DataFrame(columns=cols)
    a = with_cols(series[series["metric"] == "gpulens_pod_gpu_allocation"], [*cols[:3], "workload_kind", "workload",
                                                                             "mig_uuid", "replica"])  # fmt: skip
    if a.empty:
        return pd.DataFrame(columns=cols)
    a = a.assign(
        workload=[f"{k}/{w}" if k and w else w for k, w in zip(a["workload_kind"], a["workload"], strict=True)]
    )
    keys = ["namespace", "pod", "container", "workload", "mig_uuid"]
    out = a.groupby(keys, as_index=False).agg(
        replicas=("replica", "nunique"), first_seen=("timestamp", "min"), last_seen=("timestamp", "max")
    )
    return out.sort_values("first_seen").reset_index(drop=True)[cols]


# --- network: RDMA NICs, GPU–NIC paths, GPUDirect RDMA (docs/network.md) ----------------------
NIC_KEYS = ("node", "instance", "device")
"""Labels that identify one NIC: device names (``rdmap79s0``, ``mlx5_0``) repeat on every node."""
NIC_TX = "gpulens_nic_port_data_transmitted_bytes_total"
NIC_RX = "gpulens_nic_port_data_received_bytes_total"
NIC_ERROR_COUNTERS: dict[str, str] = {
    # EFA
    "rx_drops": "received packets dropped",
    "retrans_pkts": "packets retransmitted",
    "retrans_timeout_events": "retransmit timeouts",
    "unresponsive_remote_events": "unresponsive remote peers",
    "impaired_remote_conn_events": "impaired remote connections",
    "rdma_read_wr_err": "failed RDMA reads",
    "rdma_write_wr_err": "failed RDMA writes",
    # InfiniBand / RoCE
    "symbol_error": "symbol errors",
    "link_downed": "link went down",
    "link_error_recovery": "link error recoveries",
    "port_rcv_errors": "received packets with errors",
    "port_xmit_wait": "ticks waiting to send (congestion)",
    "local_ack_timeout_err": "ack timeouts",
    "out_of_sequence": "packets out of sequence",
}
"""The port counters (``gpulens_nic_port_stat_total{counter}``) that count errors, retransmits
or congestion, in words; the other counters count traffic."""
PORT_STATES: dict[int, str] = {1: "down", 2: "initialising", 3: "armed", 4: "active", 5: "active (deferred)"}
"""``gpulens_nic_port_state_id`` in words (the kernel's InfiniBand port states)."""
NIC_KINDS: dict[str, str] = {"efa": "EFA", "infiniband": "InfiniBand", "roce": "RoCE", "rdma": "RDMA"}
GDR_REASONS: dict[str, str] = {
    "peermem": "ready: peer-memory module loaded",
    "dmabuf": "ready: DMA-BUF (open GPU kernel module)",
    "efa_p2p": "ready: the EFA driver's NVIDIA peer-to-peer",
    "no_peer_memory": "no peer-memory module or DMA-BUF",
    "path_phb": "NIC not close enough to the GPU (through the host bridge)",
    "path_node": "NIC not close enough to the GPU (between host bridges of a NUMA node)",
    "path_sys": "NIC not close enough to the GPU (across NUMA nodes)",
}
"""``gpulens_gpu_nic_gdr_ready{reason}`` in words: how a ready pair works, or why a pair cannot."""
PATH_WORDS: dict[str, str] = {
    "PIX": "PIX: one PCIe switch",
    "PXB": "PXB: several PCIe switches",
    "PHB": "PHB: through the host bridge",
    "NODE": "NODE: between host bridges",
    "SYS": "SYS: across NUMA nodes",
}
"""The PCIe path classes between a GPU and a NIC (as ``nvidia-smi topo -m`` names them), in words."""


def _nic_sum(df: pd.DataFrame, name: str) -> pd.DataFrame:
    """Per NIC (NIC_KEYS), the sum of ``df``'s values over its ports, as column ``name``."""
    if df.empty:
        return pd.DataFrame(columns=[*NIC_KEYS, name])
    return (
        with_cols(df, NIC_KEYS).groupby(list(NIC_KEYS), as_index=False)["value"].sum().rename(columns={"value": name})
    )


def nic_table(
    info: pd.DataFrame, state: pd.DataFrame, line_rate: pd.DataFrame, tx: pd.DataFrame, rx: pd.DataFrame
) -> pd.DataFrame:
    """One row per NIC: node, instance, device, kind (in words), numa_node, pci_bus_id, state (its
    worst port's, in words), ports_down, tx and rx (bytes/s now, summed over its ports; ``tx``/``rx``
    are rate series, of which each series' newest point is read), line_rate (bytes/s each way,
    summed over its ports), utilization (0..1: the busier direction over the line rate; NaN when
    the rate is unknown). Sorted by where and PCI address."""
    cols = [*NIC_KEYS, "kind", "numa_node", "pci_bus_id", "state", "ports_down", "tx", "rx", "line_rate",
            "utilization"]  # fmt: skip
    if info.empty:
        return pd.DataFrame(columns=cols)
    out = with_cols(info, [*NIC_KEYS, "kind", "numa_node", "pci_bus_id"])
    out = out[[*NIC_KEYS, "kind", "numa_node", "pci_bus_id"]].drop_duplicates(list(NIC_KEYS))
    out["kind"] = [NIC_KINDS.get(str(k), str(k) or "RDMA") for k in out["kind"]]
    out["numa_node"] = [str(n) if str(n) not in ("", "-1") else "none" for n in out["numa_node"]]
    if not state.empty:
        s = with_cols(state, NIC_KEYS)
        worst = s.groupby(list(NIC_KEYS), as_index=False)["value"].min()
        down = s[s["value"] == 1].groupby(list(NIC_KEYS), as_index=False).size().rename(columns={"size": "ports_down"})
        out = out.merge(worst.rename(columns={"value": "_state"}), on=list(NIC_KEYS), how="left")
        out = out.merge(down, on=list(NIC_KEYS), how="left")
    else:
        out["_state"], out["ports_down"] = math.nan, 0
    out["state"] = [PORT_STATES.get(int(v), "unknown") if v == v else "unknown" for v in out["_state"]]
    out["ports_down"] = pd.to_numeric(out["ports_down"], errors="coerce").fillna(0).astype(int)
    for name, df in (("tx", latest(tx)), ("rx", latest(rx)), ("line_rate", line_rate)):
        out = out.merge(_nic_sum(df, name), on=list(NIC_KEYS), how="left")
    busier = out[["tx", "rx"]].max(axis=1)
    rate = out["line_rate"].where(out["line_rate"] > 0)
    out["utilization"] = (busier / rate).clip(upper=1.0)
    return out.sort_values(["node", "instance", "pci_bus_id", "device"])[cols].reset_index(drop=True)


def nic_errors(increase: pd.DataFrame) -> pd.DataFrame:
    """Error, retransmit and congestion counters (NIC_ERROR_COUNTERS) that grew, per NIC and
    counter: node, instance, device, what (in words), count (the growth over the range), largest first."""
    cols = [*NIC_KEYS, "what", "count"]
    if increase.empty or "counter" not in increase.columns:
        return pd.DataFrame(columns=cols)
    df = with_cols(increase, [*NIC_KEYS, "counter"])
    df = df[df["counter"].isin(NIC_ERROR_COUNTERS.keys())]
    df = df.groupby([*NIC_KEYS, "counter"], as_index=False)["value"].sum()
    df = df[df["value"] > 0]
    df = df.assign(what=[NIC_ERROR_COUNTERS[c] for c in df["counter"]], count=df["value"])
    return df.sort_values(["count", "device"], ascending=[False, True])[cols].reset_index(drop=True)


def gpu_nics(paths: pd.DataFrame, ready: pd.DataFrame, gpus: pd.DataFrame) -> pd.DataFrame:
    """Every GPU–NIC pair with its PCIe path and GPUDirect RDMA state: node, instance, gpu, uuid,
    device, path (class), nearest (bool), gdr_ready (bool), reason (in words). ``gpus``:
    gpulens_gpu_info rows (for node and instance when the pair series lack them)."""
    cols = ["node", "instance", "gpu", "uuid", "device", "path", "nearest", "gdr_ready", "reason"]
    if paths.empty:
        return pd.DataFrame(columns=cols)
    p = with_cols(paths, ["node", "instance", "gpu", "uuid", "device", "path", "nearest"])
    p = p.assign(nearest=p["nearest"] == "true")[["node", "instance", "gpu", "uuid", "device", "path", "nearest"]]
    r = with_cols(ready, ["uuid", "device", "reason"])
    r = r[["uuid", "device", "reason", "value"]] if not r.empty else pd.DataFrame(columns=["uuid", "device", "reason",
                                                                                           "value"])  # fmt: skip
    p = p.drop_duplicates(["instance", "uuid", "device"]).merge(
        r.drop_duplicates(["uuid", "device"]), on=["uuid", "device"], how="left"
    )
    p["gdr_ready"] = p["value"].fillna(0) >= 1
    p["reason"] = [GDR_REASONS.get(str(x), str(x)) if x == x and x else "unknown" for x in p["reason"]]
    p["_i"] = pd.to_numeric(p["gpu"], errors="coerce")
    return p.sort_values(["node", "instance", "_i", "path", "device"])[cols].reset_index(drop=True)


def gdr_by_gpu(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per GPU, GPUDirect RDMA with its nearest NICs: node, instance, gpu, uuid, nearest (how many
    NICs, and their path class), ready (True when one of them is ready), reason (how, or why not:
    the first reason of its nearest NICs, in words). From :func:`gpu_nics`."""
    cols = ["node", "instance", "gpu", "uuid", "nearest", "ready", "reason"]
    if pairs.empty:
        return pd.DataFrame(columns=cols)
    near = pairs[pairs["nearest"]]
    rows = []
    for (node, inst, gpu, uuid), g in near.groupby(["node", "instance", "gpu", "uuid"], sort=False):
        ok = g[g["gdr_ready"]]
        paths = ", ".join(sorted(set(g["path"])))
        rows.append(
            {
                "node": node,
                "instance": inst,
                "gpu": gpu,
                "uuid": uuid,
                "nearest": f"{len(g)} NIC{'s' if len(g) != 1 else ''} ({paths})",
                "ready": not ok.empty,
                "reason": str((ok if not ok.empty else g)["reason"].iloc[0]),
            }
        )
    return pd.DataFrame(rows, columns=cols)


def pod_nics(
    allocation: pd.DataFrame, holders: pd.DataFrame, nics: pd.DataFrame, communication: pd.DataFrame
) -> pd.DataFrame:
    """Per pod holding NICs: node, instance, namespace, pod, workload, nics (how many it holds),
    shared (how many of those other pods hold too; an allocation naming no NIC counts as shared),
    tx and rx (bytes/s now through the NICs it holds alone; NaN when it holds none alone), and
    communication (the pod's communication share, NaN without a class).

    ``allocation``: gpulens_pod_nic_allocation; ``holders``: gpulens_nic_pods; ``nics``:
    :func:`nic_table`; ``communication``: the per-pod frame of definitions.communication_share_frame."""
    cols = ["node", "instance", "namespace", "pod", "workload", "nics", "shared", "tx", "rx", "communication"]
    if allocation.empty:
        return pd.DataFrame(columns=cols)
    a = with_cols(allocation, [*NIC_KEYS, "namespace", "pod", "workload", "container", "resource"])
    h = with_cols(holders, ["node", "instance", "device"])
    h = h[["node", "instance", "device", "value"]].rename(columns={"value": "holders"})
    named = a[a["device"] != ""].drop_duplicates(["node", "instance", "namespace", "pod", "device"])
    named = named.merge(h, on=list(NIC_KEYS), how="left")
    named["alone"] = named["holders"].fillna(1) <= 1
    named = named.merge(nics[[*NIC_KEYS, "tx", "rx"]], on=list(NIC_KEYS), how="left")
    pool = a[a["device"] == ""].drop_duplicates(["node", "instance", "namespace", "pod", "container", "resource"])
    keys = ["node", "instance", "namespace", "pod", "workload"]
    out = pd.concat(
        [named.assign(shared=~named["alone"]), pool.assign(alone=False, shared=True, tx=math.nan, rx=math.nan)],
        ignore_index=True,
    )
    alone = out[out["alone"]]
    traffic = alone.groupby(keys, as_index=False)[["tx", "rx"]].sum(min_count=1)
    counts = out.groupby(keys, as_index=False).agg(nics=("device", "size"), shared=("shared", "sum"))
    res = counts.merge(traffic, on=keys, how="left")
    comm = communication.rename(columns={"share": "communication"})[["namespace", "pod", "communication"]]
    res = res.merge(comm, on=["namespace", "pod"], how="left")
    res["shared"] = res["shared"].astype(int)
    for c in ("tx", "rx", "communication"):
        res[c] = pd.to_numeric(res[c], errors="coerce")
    return res.sort_values(["namespace", "pod"])[cols].reset_index(drop=True)


def pod_gpu_classes(pod_boundness: pd.DataFrame, leaves: pd.DataFrame, gpus: pd.DataFrame) -> pd.DataFrame:
    """Per pod leaf (namespace, pod, node, instance, gpu, uuid, mig_uuid, class now, communication
    share): where a pod's GPUs spend their time, so a straggler (one GPU computing while its peers
    wait in ``communication``) shows. ``leaves``: the per-leaf frame of
    definitions.communication_share_frame; ``gpus``: gpulens_gpu_info (node, instance, GPU index)."""
    cols = ["namespace", "pod", "node", "instance", "gpu", "uuid", "mig_uuid", "class", "communication"]
    if leaves.empty:
        return pd.DataFrame(columns=cols)
    classes = pod_classes(pod_boundness)
    out = leaves.rename(columns={"share": "communication"}).merge(classes, on=list(POD_KEYS), how="left")
    g = with_cols(gpus, ["uuid", "node", "instance", "gpu"])[["uuid", "node", "instance", "gpu"]]
    out = with_cols(out.merge(g.drop_duplicates("uuid"), on="uuid", how="left"), cols)
    out["class"] = out["class"].fillna("unknown")
    out["communication"] = pd.to_numeric(out["communication"], errors="coerce")
    out["_i"] = pd.to_numeric(out["gpu"], errors="coerce")
    return out.sort_values(["namespace", "pod", "node", "_i"])[cols].reset_index(drop=True)


# --- jobs (dashboard/jobs.py): the sources' per-leaf figures, the Jobs and Job pages' tables --
POD_LEAF_KEYS = ("cluster", "namespace", "pod", "uuid", "mig_uuid")
"""Labels of a pod's series on one leaf (its class, its communication share) across clusters."""
SLOWDOWN_WORDS: dict[str, str] = {
    "hw_slowdown": "hardware slowdown",
    "hw_thermal_slowdown": "thermal slowdown",
    "sw_thermal_slowdown": "thermal slowdown (driver)",
    "hw_power_brake_slowdown": "power brake",
    "sw_power_cap": "power cap",
}
"""The slowdown clock events (source.SLOWDOWN_REASONS) in words."""
NO_CLASS = "no GPM: no class"
"""What a job's class, communication share and straggler read when none of its leaves is classified
(GPUs without GPM: pre-Hopper)."""


def job_leaf_rows(allocation: pd.DataFrame) -> pd.DataFrame:
    """``gpulens:job_leaf:info`` in pandas: one row per (job, pod, leaf) of allocation rows, columns
    ``jobs.JOB_LEAF``; a pod no controller owns is the job ``Pod/<pod>`` (``jobs.name_jobs``)."""
    from dashboard import jobs

    if allocation.empty:
        return pd.DataFrame(columns=list(jobs.JOB_LEAF))
    return jobs.name_jobs(allocation)[list(jobs.JOB_LEAF)].drop_duplicates().reset_index(drop=True)


def keyed(df: pd.DataFrame, keys: Sequence[str], name: str) -> pd.DataFrame:
    """``df``'s ``value`` as column ``name``, one row per ``keys`` (the highest where several: the
    rules' ``max by``); rows without a value dropped."""
    cols = [*keys, name]
    if df.empty or "value" not in df.columns:
        return pd.DataFrame(columns=cols)
    d = with_cols(df, keys)
    d = d.assign(value=pd.to_numeric(d["value"], errors="coerce")).dropna(subset=["value"])
    if d.empty:
        return pd.DataFrame(columns=cols)
    return d.groupby(list(keys), as_index=False)["value"].max().rename(columns={"value": name})[cols]


def job_summary_figures(figures: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The rows of ``MetricSource.job_summary`` (jobs.SUMMARY_COLUMNS) from one frame per column
    (JOB labels and ``value``, a row per job): the jobs of ``gpus``, each figure joined on the job
    (NaN where a job has none; 0 stragglers and classified leaves where none was counted, 0 GPU-hours
    where ``gpu_hours`` was asked and the job held no step of the range yet). ``memory_used_bytes``
    is the peak memory ratio times ``memory_total_bytes`` (the memory of the leaf of that ratio)."""
    from dashboard import jobs

    key = list(jobs.JOB)

    def by_job(df: pd.DataFrame | None) -> dict[tuple[str, ...], float]:
        # a dict per figure, not a merge per figure: 500 jobs x 12 figures joined in a few ms
        if df is None or df.empty:
            return {}
        d = with_cols(df, key)
        keys = zip(*(d[k].astype(str) for k in key), strict=True)
        return dict(zip(keys, pd.to_numeric(d["value"], errors="coerce").tolist(), strict=True))

    jobs_now = list(by_job(figures["gpus"]))
    out = pd.DataFrame(jobs_now, columns=key) if jobs_now else pd.DataFrame(columns=key)
    for name in jobs.SUMMARY_COLUMNS:
        if name not in (*jobs.JOB, "memory_used_bytes"):
            values = by_job(figures.get(name))
            out[name] = [values.get(k, math.nan) for k in jobs_now]
    for name in ("gpus", "nodes", "pods", "stragglers", "classified_leaves"):  # counts (0: none recorded)
        out[name] = pd.to_numeric(out[name], errors="coerce").fillna(0).astype(int)
    if "gpu_hours" in figures:  # asked for a range: a job held at no step of it yet held none
        out["gpu_hours"] = out["gpu_hours"].fillna(0.0)
    out["activity_spread"] = out["activity_max"] - out["activity_min"]
    # the peak ratio times the memory of the leaf it was read on
    out["memory_used_bytes"] = out["memory_used_ratio"] * out["memory_total_bytes"]
    return out[list(jobs.SUMMARY_COLUMNS)].reset_index(drop=True)


def slowdown_reasons(reasons: pd.DataFrame) -> dict[str, str]:
    """Per GPU (uuid), the slowdown events seen (``reasons``: uuid, reason rows; only SLOWDOWN_WORDS'
    reasons), sorted and comma-separated."""
    r = with_cols(reasons, ["uuid", "reason"])
    r = r[r["reason"].isin(list(SLOWDOWN_WORDS))]
    seen: dict[str, set[str]] = {}
    for u, why in zip(r["uuid"].astype(str), r["reason"].astype(str), strict=True):
        seen.setdefault(u, set()).add(why)
    return {u: ",".join(sorted(w)) for u, w in seen.items()}


def straggler_figures(
    strays: pd.DataFrame, *, busy: pd.DataFrame, sm_clock_ratio: pd.DataFrame, reasons: pd.DataFrame
) -> pd.DataFrame:
    """The rows of ``MetricSource.job_stragglers`` (source.JOB_STRAGGLER_COLUMNS): ``strays`` (the
    straggling leaves: JOB_LEAF, gpu, reason) with ``busy`` (per uuid, mig_uuid), ``sm_clock_ratio``
    (per uuid) and the slowdown ``reasons`` seen (uuid, reason rows) joined on."""
    from dashboard.sources.source import JOB_STRAGGLER_COLUMNS

    out = with_cols(strays, JOB_STRAGGLER_COLUMNS[:-3]).copy()
    leaves = list(zip(out["uuid"].astype(str), out["mig_uuid"].astype(str), strict=True))
    b = keyed(busy, list(LEAF), "v")
    by_leaf = dict(zip(zip(b["uuid"].astype(str), b["mig_uuid"].astype(str), strict=True), b["v"], strict=True))
    c = keyed(sm_clock_ratio, ["uuid"], "v")
    by_gpu = dict(zip(c["uuid"].astype(str), c["v"], strict=True))
    seen = slowdown_reasons(reasons)
    out["busy"] = [by_leaf.get(k, math.nan) for k in leaves]
    out["sm_clock_ratio"] = [by_gpu.get(u, math.nan) for u, _ in leaves]
    out["slowdown_reasons"] = [seen.get(u, "") for u, _ in leaves]
    return out[list(JOB_STRAGGLER_COLUMNS)].reset_index(drop=True)


def job_leaf_figures(
    leaves: pd.DataFrame,
    *,
    activity: pd.DataFrame,
    busy: pd.DataFrame,
    communication: pd.DataFrame,
    memory_ratio: pd.DataFrame,
    memory_total: pd.DataFrame,
    sm_clock_ratio: pd.DataFrame,
    slowdown: pd.DataFrame,
    reasons: pd.DataFrame,
    gpus: pd.DataFrame,
    shares: pd.DataFrame,
    held: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The rows of ``MetricSource.job_leaves`` (source.JOB_LEAF_COLUMNS): ``leaves`` (JOB_LEAF) with
    each figure joined on its own key. Values (``value``) per (uuid, mig_uuid): ``activity``,
    ``busy``, ``memory_ratio`` (peak used over the leaf's memory), ``memory_total`` (bytes),
    ``shares`` (share of a GPU); per (cluster, namespace, pod, uuid, mig_uuid): ``communication``;
    per uuid (the physical GPU): ``sm_clock_ratio``, ``slowdown``; ``reasons``: uuid and reason rows
    (slowdown events seen in the window); ``gpus``: uuid, gpu, name (gpulens_gpu_info); ``held``:
    hours per (cluster, namespace, pod, uuid, mig_uuid), giving ``held_hours`` (0 where absent)."""
    from dashboard import jobs
    from dashboard.sources.source import JOB_LEAF_COLUMNS

    cols = [*JOB_LEAF_COLUMNS, *(["held_hours"] if held is not None else [])]
    if leaves.empty:
        return pd.DataFrame(columns=cols)
    out = with_cols(leaves, jobs.JOB_LEAF)[list(jobs.JOB_LEAF)].drop_duplicates()
    leaf, pod = list(LEAF), list(POD_LEAF_KEYS)
    for df, keys, name in (
        (activity, leaf, "activity"),
        (busy, leaf, "busy"),
        (communication, pod, "communication"),
        (memory_ratio, leaf, "memory_used_ratio"),
        (memory_total, leaf, "memory_total_bytes"),
        (sm_clock_ratio, ["uuid"], "sm_clock_ratio"),
        (slowdown, ["uuid"], "slowdown"),
        (shares, leaf, "gpu_share"),
    ):
        out = out.merge(keyed(df, keys, name), on=keys, how="left")
    g = with_cols(gpus, ["uuid", "gpu", "name"])[["uuid", "gpu", "name"]].drop_duplicates("uuid")
    out = out.merge(g.rename(columns={"name": "model"}), on="uuid", how="left")
    words = pd.DataFrame(list(slowdown_reasons(reasons).items()), columns=["uuid", "slowdown_reasons"])
    out = out.merge(words, on="uuid", how="left")
    for c in ("gpu", "model", "slowdown_reasons"):  # a column of no match is float NaN: "" then
        out[c] = ["" if v is None or v != v else str(v) for v in out[c]]
    out["gpu_share"] = pd.to_numeric(out["gpu_share"], errors="coerce").fillna(1.0)
    out["memory_used_bytes"] = out["memory_used_ratio"] * out["memory_total_bytes"]
    if held is not None:
        out = out.merge(keyed(held, pod, "held_hours"), on=pod, how="left")
        out["held_hours"] = pd.to_numeric(out["held_hours"], errors="coerce").fillna(0.0)
    for c in cols:
        if c not in out.columns:
            out[c] = math.nan
    return out[cols].reset_index(drop=True)


def jobs_within(leaves: pd.DataFrame, filters: Filters) -> pd.DataFrame:
    """The rows of the jobs ``filters`` select (``MetricSource.job_leaves``' semantics): cluster and
    namespace by the job's own labels; node and instance keep every leaf of each job with a leaf
    there (a job is shown whole)."""
    from dashboard import jobs

    out = leaves
    for key in ("cluster", "namespace"):
        value = getattr(filters, key)
        if value:
            out = out[col(out, key) == value]
    if (filters.node or filters.instance) and not out.empty:
        hit = out
        for key in ("node", "instance"):
            value = getattr(filters, key)
            if value:
                hit = hit[col(hit, key) == value]
        out = out.merge(hit[list(jobs.JOB)].drop_duplicates(), on=list(jobs.JOB), how="inner")
    return out.reset_index(drop=True)


def job_param(key: Sequence[str]) -> str:
    """A job's URL parameter ``namespace/Kind/name`` (Kubernetes names hold no ``/``); its cluster
    travels apart (``job_cluster``)."""
    _cluster, namespace, kind, name = (str(x) for x in key)
    return f"{namespace}/{kind}/{name}"


def job_from_param(text: str, cluster: str = "") -> tuple[str, str, str, str] | None:
    """The job (cluster, namespace, workload_kind, workload) of a ``job`` URL parameter; None when it
    does not read ``namespace/Kind/name``."""
    parts = text.split("/", 2)
    if len(parts) != 3 or not all(parts):
        return None
    return (cluster, parts[0], parts[1], parts[2])


def _pct(ratio: float) -> str:
    """A share (0..1) as whole percent with a space: ``50 %``."""
    return f"{ratio * 100:.0f} %"


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f}"


def where_words(node: object, instance: object) -> str:
    """Where a leaf is, as people name it: its node, else its exporter (``instance``)."""
    return str(node or "") or str(instance or "")


def gpu_words(node: object, instance: object, gpu: object, mig_uuid: object = "") -> str:
    """A leaf of a job as rows of the Job page name it: ``node-1 · GPU 3`` (a MIG instance adds its
    short UUID)."""
    text = f"{where_words(node, instance)} · GPU {gpu}" if str(gpu or "") else where_words(node, instance)
    mig = str(mig_uuid or "")
    return f"{text} · {mig[:12]}…" if mig else text


def straggler_reason(row: Mapping[str, object]) -> str:
    """Why a straggler (a ``jobs.stragglers`` row) holds its job back, in words: ``compute: SM
    clock 50 % of max, thermal slowdown`` or ``input: idle 45 % of the time while peers wait``."""
    if row.get("reason") == "input":
        busy = _num(row.get("busy"))
        idle = f"idle {_pct(1.0 - busy)} of the time" if busy == busy else "idle"
        return f"input: {idle} while peers wait"
    parts = []
    clock = _num(row.get("sm_clock_ratio"))
    if clock == clock:
        parts.append(f"SM clock {_pct(clock)} of max")
    events = [SLOWDOWN_WORDS[r] for r in str(row.get("slowdown_reasons") or "").split(",") if r in SLOWDOWN_WORDS]
    parts += list(dict.fromkeys(events))
    return "compute: " + (", ".join(parts) if parts else "computes while its peers wait")


def _num(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def straggler_words(row: Mapping[str, object]) -> str:
    """A straggling leaf with its reason: ``node-1 · GPU 3: compute: SM clock 50 % of max, …``."""
    where = gpu_words(row.get("node"), row.get("instance"), row.get("gpu"), row.get("mig_uuid"))
    return f"{where}: {straggler_reason(row)}"


def activity_range_words(low: float, high: float) -> str:
    """A job's lowest and highest leaf activity and their spread: ``93–97 % · spread 4 pts``."""
    if low != low or high != high:
        return "no activity reading"
    return f"{low * 100:.0f}–{high * 100:.0f} % · spread {(high - low) * 100:.0f} pts"


def _memory_column(df: pd.DataFrame) -> list[str]:
    used, total = df["memory_used_bytes"].astype(float), df["memory_total_bytes"].astype(float)
    return [memory_words(u, t) for u, t in zip(used, total, strict=True)]


def _mix_words_by_job(mix: pd.DataFrame) -> dict[tuple[str, ...], str]:
    """Each job's class mix (``mix``: JOB, class, share rows) in words, largest first, classes under
    1 % left out (``communication 62 % · compute 38 %``), in one pass over the rows."""
    from dashboard import jobs

    if mix.empty:
        return {}
    m = mix.assign(share=pd.to_numeric(mix["share"], errors="coerce"))
    m = m[m["share"] >= 0.005].sort_values(["share", "class"], ascending=[False, True], kind="stable")
    out: dict[tuple[str, ...], list[str]] = {}
    cols = [m[k].astype(str).tolist() for k in jobs.JOB]
    for *k, c, v in zip(*cols, m["class"].astype(str), m["share"], strict=True):
        out.setdefault(tuple(k), []).append(f"{c} {_pct(v)}")
    return {k: " · ".join(v) for k, v in out.items()}


def memory_words(used: float, total: float) -> str:
    """The highest memory used on one leaf against its memory: ``118.0 of 140.4 GiB (84 %)``."""
    if used != used or total != total or total <= 0:
        return "no memory reading"
    return f"{_gib(used)} of {_gib(total)} GiB ({_pct(used / total)})"


JOB_OVERVIEW_COLUMNS: tuple[str, ...] = (
    "cluster",
    "namespace",
    "workload_kind",
    "workload",
    "gpus",
    "nodes",
    "pods",
    "gpu_hours",
    "activity",
    "activity_range",
    "busy",
    "communication",
    "mix",
    "memory",
    "straggler",
    "stragglers",
    "communication_bound",
    "classified",
)
"""The Jobs page's table (:func:`jobs_overview`): numbers for the bars and sorting, words for the rest."""


def jobs_overview(summary: pd.DataFrame, strays: pd.DataFrame, mix: pd.DataFrame) -> pd.DataFrame:
    """One row per job of ``summary`` (``MetricSource.job_summary``: jobs.SUMMARY_COLUMNS), with its
    straggling leaves ``strays`` (``MetricSource.job_stragglers``) and class mix ``mix`` (JOB, class,
    share), most GPU-hours first (JOB_OVERVIEW_COLUMNS): the figures, the range of activity and the
    class mix in words, the highest memory on one leaf against its capacity, the stragglers in words
    (or why there is none to find) and whether the job is communication-bound
    (``jobs.COMMUNICATION_BOUND_AT_LEAST`` and no straggler)."""
    from dashboard import jobs

    key = list(jobs.JOB)
    if summary.empty:
        return pd.DataFrame(columns=list(JOB_OVERVIEW_COLUMNS))
    out = with_cols(summary, key)
    # words per job from whole columns (a pandas operation per job costs seconds at 500 jobs)
    said: dict[tuple[str, ...], list[str]] = {}
    for r in strays.to_dict("records"):
        said.setdefault(tuple(str(r[k]) for k in key), []).append(straggler_words(r))
    mixes = _mix_words_by_job(with_cols(mix, [*key, "class", "share"]))
    keys = [tuple(str(x) for x in r) for r in out[key].itertuples(index=False)]
    n = pd.to_numeric(out["classified_leaves"], errors="coerce").fillna(0).astype(int)
    out["stragglers"] = pd.to_numeric(out["stragglers"], errors="coerce").fillna(0).astype(int)
    out["straggler"] = [
        "; ".join(said.get(k, []))
        or (f"{s:,} (its figures did not load)" if s else "")
        or (NO_CLASS if c == 0 else "one classified GPU: no peers to wait" if c < 2 else "none")
        for k, c, s in zip(keys, n, out["stragglers"], strict=True)
    ]
    out["mix"] = [mixes.get(k) or NO_CLASS for k in keys]
    out["classified"] = n > 0
    out["communication_bound"] = (out["communication"] >= jobs.COMMUNICATION_BOUND_AT_LEAST - 1e-12) & (
        out["stragglers"] == 0
    )
    out["activity_range"] = [
        activity_range_words(lo, hi) for lo, hi in zip(out["activity_min"], out["activity_max"], strict=True)
    ]
    out["memory"] = _memory_column(out)
    out = out.sort_values(["gpu_hours", "gpus", "namespace", "workload"], ascending=[False, False, True, True])
    return out[list(JOB_OVERVIEW_COLUMNS)].reset_index(drop=True)


def job_gpu_table(leaves: pd.DataFrame) -> pd.DataFrame:
    """The Job page's table: one row per leaf of one job (``MetricSource.job_leaves`` rows), by node
    then GPU index: where (``row``: :func:`gpu_words`), node, GPU, pod, activity, busy, communication
    (words where unclassified), memory in words, SM clock over its maximum, the slowdown events
    in words, and whether it straggles (the reason) or not."""
    from dashboard import jobs

    cols = ["row", "node", "gpu", "pod", "activity", "busy", "communication", "memory", "sm_clock_ratio", "slowdown",
            "straggler", "uuid", "mig_uuid"]  # fmt: skip
    if leaves.empty:
        return pd.DataFrame(columns=cols)
    one = jobs.one_per_leaf(leaves)
    strays = jobs.stragglers(leaves)
    why = {
        (str(r["uuid"]), str(r["mig_uuid"])): straggler_reason(r) for r in strays.to_dict("records")
    } if not strays.empty else {}  # fmt: skip
    n = int(one["communication"].notna().sum())
    where = zip(one["node"], one["instance"], one["gpu"], one["mig_uuid"], strict=True)
    out = one.assign(
        node=[where_words(a, b) for a, b in zip(one["node"], one["instance"], strict=True)],
        row=[gpu_words(a, b, g, m) for a, b, g, m in where],
        memory=_memory_column(one),
        slowdown=[
            ", ".join(SLOWDOWN_WORDS[r] for r in str(x).split(",") if r in SLOWDOWN_WORDS) or "none"
            for x in one["slowdown_reasons"]
        ],
        straggler=[
            why.get((str(u), str(m))) or (NO_CLASS if n == 0 else "no: one classified GPU" if n < 2 else "no")
            for u, m in zip(one["uuid"], one["mig_uuid"], strict=True)
        ],
        communication=[_pct(c) if c == c else NO_CLASS for c in one["communication"]],
        _i=pd.to_numeric(one["gpu"], errors="coerce"),
    )
    return out.sort_values(["node", "_i", "mig_uuid"])[cols].reset_index(drop=True)


def job_timeline(series: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """The Job page's timelines from ``MetricSource.job_series`` rows and the job's leaves (``rows``:
    uuid, mig_uuid, row): one frame with ``track`` (``activity``: SM activity, or the busy ratio of a
    leaf without it; ``class``; ``sm_clock``), ``row``, ``timestamp``, ``value`` and ``class``,
    only for the leaves in ``rows``."""
    cols = ["track", "row", "uuid", "mig_uuid", "timestamp", "value", "class"]
    if series.empty or rows.empty:
        return pd.DataFrame(columns=cols)
    s = with_cols(series, ["metric", "uuid", "mig_uuid", "class"])
    r = rows[["uuid", "mig_uuid", "row"]].drop_duplicates(["uuid", "mig_uuid"])
    sm = s[s["metric"] == "sm_active"]
    busy = s[s["metric"] == "busy"]
    has_sm = set(zip(sm["uuid"], sm["mig_uuid"], strict=True))
    busy = busy[[(u, m) not in has_sm for u, m in zip(busy["uuid"], busy["mig_uuid"], strict=True)]]
    activity = pd.concat([sm, busy], ignore_index=True).assign(track="activity", **{"class": ""})
    classes = s[(s["metric"] == "class") & (s["value"] >= 0.5)].drop_duplicates(["uuid", "mig_uuid", "timestamp"])
    classes = classes.assign(track="class")
    # the clock is the physical GPU's: every leaf on it reads it
    clock = s[s["metric"] == "sm_clock"].drop(columns=["mig_uuid"]).drop_duplicates(["uuid", "timestamp"])
    clock = clock.merge(r[["uuid", "mig_uuid"]], on="uuid").assign(track="sm_clock", **{"class": ""})
    parts = [p for p in (activity, classes, clock) if not p.empty]
    if not parts:
        return pd.DataFrame(columns=cols)
    out = pd.concat(parts, ignore_index=True).merge(r, on=["uuid", "mig_uuid"], how="inner")
    return out[cols].reset_index(drop=True)
