"""Pure pandas transforms: source frames in, the tables the pages show out (no I/O, no Streamlit)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from dashboard.source import ACTIVITY_COLUMNS, ALLOCATION_KEYS, Filters

LEAF = ("uuid", "mig_uuid")

_MIG_SLICES = re.compile(r"^(\d+)g\.")


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


def activity_from_series(
    allocation: pd.DataFrame, sm_active: pd.DataFrame, *, step_s: float, busy_threshold: float
) -> pd.DataFrame:
    """ACTIVITY_COLUMNS from aligned range series of allocation and leaf SM activity.

    Same definition as PrometheusSource's server-side query: at each step an allocated device is
    idle when its SM activity is below the threshold; its idle step is split among the pods that
    hold the device at that step in proportion to the time-slicing replicas each holds, and steps
    without an SM value do not count.
    """
    if allocation.empty:
        return pd.DataFrame(columns=list(ACTIVITY_COLUMNS))
    keys = list(ALLOCATION_KEYS)
    rows = with_cols(allocation, [*keys, "replica"])[[*keys, "replica", "timestamp"]].drop_duplicates()
    alloc = rows.groupby([*keys, "timestamp"], as_index=False).size().rename(columns={"size": "held"})
    alloc["replicas"] = alloc.groupby([*LEAF, "timestamp"])["held"].transform("sum")
    sm = with_cols(sm_active, LEAF)
    if sm.empty:
        sm_leaf = pd.DataFrame(columns=[*LEAF, "timestamp", "value"])
    else:
        sm_leaf = sm.groupby([*LEAF, "timestamp"], as_index=False)["value"].max()
    joined = alloc.merge(sm_leaf, on=[*LEAF, "timestamp"], how="left")
    idle = joined["value"].notna() & (joined["value"] < busy_threshold)
    joined["idle_gpu_hours"] = idle.astype(float) * joined["held"] / joined["replicas"] * step_s / 3600.0
    out = joined.groupby(keys, as_index=False).agg(
        idle_gpu_hours=("idle_gpu_hours", "sum"), first_allocated=("timestamp", "min")
    )
    busy = sm_leaf[sm_leaf["value"] >= busy_threshold]
    last_busy = busy.groupby(list(LEAF), as_index=False)["timestamp"].max().rename(columns={"timestamp": "last_busy"})
    out = out.merge(last_busy, on=list(LEAF), how="left")
    out["last_busy"] = pd.to_numeric(out["last_busy"], errors="coerce")
    return out[list(ACTIVITY_COLUMNS)]


def _leaf_index(df: pd.DataFrame) -> pd.DataFrame:
    return with_cols(df, LEAF)


def fleet_counts(
    info: pd.DataFrame, allocation: pd.DataFrame, sm_active: pd.DataFrame, busy_threshold: float
) -> dict[str, int]:
    """Physical GPUs; GPUs with at least one allocated device; GPUs with a leaf whose SM activity
    reaches the threshold; leaves (GPUs or MIG slices) allocated but below it."""
    gpus = set(col(info, "uuid")) - {""}
    allocated = set(col(allocation, "uuid")) - {""}
    sm = _leaf_index(sm_active)
    busy = set(sm.loc[sm["value"] >= busy_threshold, "uuid"]) if not sm.empty else set()
    alloc_leaves = {tuple(r) for r in _leaf_index(allocation)[list(LEAF)].itertuples(index=False)}
    idle_leaves = {tuple(r) for r in sm.loc[sm["value"] < busy_threshold, list(LEAF)].itertuples(index=False)}
    return {
        "gpus": len(gpus),
        "allocated": len(allocated & gpus) if gpus else len(allocated),
        "busy": len(busy),
        "allocated_idle": len(alloc_leaves & idle_leaves),
    }


def idle_allocations(
    allocation: pd.DataFrame,
    sm_active: pd.DataFrame,
    activity: pd.DataFrame,
    *,
    now: float,
    window_s: float,
    busy_threshold: float,
) -> pd.DataFrame:
    """Devices allocated now whose SM activity is below the threshold now, with how long.

    ``idle_seconds`` = now - the later of the last busy step and the first allocated step;
    ``idle_at_least`` is True when the device was never busy in the window (so longer than shown);
    NaN when the source has no history for the allocation yet.
    """
    cols = ["namespace", "pod", "container", "workload", "instance", "uuid", "mig_uuid", "sm_active"]
    if allocation.empty or sm_active.empty:
        return pd.DataFrame(columns=[*cols, "idle_seconds", "idle_at_least"])
    sm = _leaf_index(sm_active).groupby(list(LEAF), as_index=False)["value"].max()
    sm = sm[sm["value"] < busy_threshold].rename(columns={"value": "sm_active"})
    alloc = with_cols(allocation, ALLOCATION_KEYS)
    idle = alloc.merge(sm, on=list(LEAF), how="inner")
    if idle.empty:
        return pd.DataFrame(columns=[*cols, "idle_seconds", "idle_at_least"])
    act = with_cols(activity, ALLOCATION_KEYS)[["namespace", "pod", "container", *LEAF, "first_allocated", "last_busy"]]
    idle = idle.merge(act, on=["namespace", "pod", "container", *LEAF], how="left")
    since = idle[["first_allocated", "last_busy"]].astype(float).max(axis=1, skipna=True)
    idle["idle_seconds"] = (now - since).clip(lower=0.0)
    window_start = now - window_s
    first = pd.to_numeric(idle["first_allocated"], errors="coerce")
    idle["idle_at_least"] = idle["last_busy"].isna() & (first.isna() | (first - window_start < 0.05 * window_s))
    idle["workload"] = [
        f"{k}/{w}" if k and w else (w or "")
        for k, w in zip(col(idle, "workload_kind"), col(idle, "workload"), strict=True)
    ]
    out = idle[[*cols, "idle_seconds", "idle_at_least"]].drop_duplicates(["namespace", "pod", "container", *LEAF])
    return out.sort_values("idle_seconds", ascending=False).reset_index(drop=True)


def mig_fraction(profile: str, model: str = "") -> float:
    """Share of a physical GPU a MIG profile holds, by compute slices (``3g.71gb`` -> 3/7).

    A30 GPUs have 4 compute slices, the other MIG-capable models 7. Unknown shapes count whole.
    """
    m = _MIG_SLICES.match(profile or "")
    if not m:
        return 1.0
    total = 4 if "A30" in model.upper() else 7
    return min(1.0, int(m.group(1)) / total)


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


def waste_by_namespace(
    activity: pd.DataFrame, info: pd.DataFrame, mig_info: pd.DataFrame, prices: Mapping[str, float]
) -> pd.DataFrame:
    """Wasted GPU-hours and cost per namespace: idle allocated hours, MIG slices weighted by size.

    Columns: namespace, gpu_hours, cost_usd (NaN when no price is known for a model), pods.
    """
    cols = ["namespace", "gpu_hours", "cost_usd", "pods"]
    if activity.empty:
        return pd.DataFrame(columns=cols)
    act = with_cols(activity, ALLOCATION_KEYS).copy()
    models = {u: n for u, n in zip(col(info, "uuid"), col(info, "name"), strict=True)}
    profiles = {m: p for m, p in zip(col(mig_info, "mig_uuid"), col(mig_info, "mig_profile"), strict=True)}
    act["model"] = [models.get(u, "") for u in act["uuid"]]
    act["fraction"] = [
        mig_fraction(profiles.get(m, ""), mdl) if m else 1.0
        for m, mdl in zip(act["mig_uuid"], act["model"], strict=True)
    ]
    act["gpu_hours"] = act["idle_gpu_hours"].astype(float) * act["fraction"]
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
    cols = ["instance", "gpu", *LEAF, "dram_active", "pipe_active", "class", "holders"]
    if dram.empty or pipe.empty:
        return pd.DataFrame(columns=cols)
    d = with_cols(dram, ["instance", "gpu", *LEAF]).rename(columns={"value": "dram_active"})
    p = with_cols(pipe, LEAF).rename(columns={"value": "pipe_active"})
    pts = d[["instance", "gpu", *LEAF, "dram_active"]].merge(p[[*LEAF, "pipe_active"]], on=list(LEAF))
    cls = boundness_now(boundness)[[*LEAF, "class"]]
    pts = pts.merge(cls, on=list(LEAF), how="left").merge(holders(allocation), on=list(LEAF), how="left")
    pts["class"] = pts["class"].fillna("unknown")
    pts["holders"] = pts["holders"].fillna("(unallocated)")
    return pts[cols].drop_duplicates(list(LEAF)).reset_index(drop=True)


def mig_layout(mig_info: pd.DataFrame, allocation: pd.DataFrame, info: pd.DataFrame) -> pd.DataFrame:
    """One row per MIG slice: parent GPU, profile, slice size (compute slices) and holders."""
    cols = ["instance", "gpu", "uuid", "gpu_name", "mig_uuid", "mig_profile", "gpu_instance_id", "slices", "holders"]
    if mig_info.empty:
        return pd.DataFrame(columns=cols)
    mig = with_cols(mig_info, ["instance", "gpu", *LEAF, "mig_profile", "gpu_instance_id"])
    names = (
        with_cols(info, ["uuid", "name"])[["uuid", "name"]].drop_duplicates("uuid").rename(columns={"name": "gpu_name"})
    )
    out = mig.merge(names, on="uuid", how="left").merge(holders(allocation), on=list(LEAF), how="left")
    out["gpu_name"] = out["gpu_name"].fillna("")
    out["holders"] = out["holders"].fillna("")
    out["slices"] = [
        max(1, round(mig_fraction(p, n) * (4 if "A30" in n.upper() else 7)))
        for p, n in zip(out["mig_profile"], out["gpu_name"], strict=True)
    ]
    out["gpu_instance_id"] = pd.to_numeric(out["gpu_instance_id"], errors="coerce")
    out["_gpu"] = pd.to_numeric(out["gpu"], errors="coerce")
    return out.sort_values(["instance", "_gpu", "uuid", "gpu_instance_id"]).reset_index(drop=True)[cols]


def timeslice_shares(shares: pd.DataFrame, replicas: pd.DataFrame, pods: pd.DataFrame) -> pd.DataFrame:
    """Per shared GPU and pod: SM share (0..1), plus the GPU's replicas and holding pods."""
    cols = ["uuid", "namespace", "pod", "sm_share", "replicas", "pods"]
    if shares.empty and replicas.empty:
        return pd.DataFrame(columns=cols)
    s = with_cols(shares, ["uuid", "namespace", "pod"])
    s = s.groupby(["uuid", "namespace", "pod"], as_index=False)["value"].sum().rename(columns={"value": "sm_share"})
    r = (
        with_cols(replicas, ["uuid"])
        .groupby("uuid", as_index=False)["value"]
        .max()
        .rename(columns={"value": "replicas"})
    )
    p = with_cols(pods, ["uuid"]).groupby("uuid", as_index=False)["value"].max().rename(columns={"value": "pods"})
    shared = r.merge(p, on="uuid", how="outer")
    out = shared.merge(s, on="uuid", how="left") if not shared.empty else s.assign(replicas=math.nan, pods=math.nan)
    out["namespace"] = out["namespace"].fillna("")
    out["pod"] = out["pod"].fillna("")
    return out[cols].sort_values(["uuid", "pod"]).reset_index(drop=True)


def probe_comparison(efficiency: pd.DataFrame, bandwidth: pd.DataFrame, info: pd.DataFrame) -> pd.DataFrame:
    """Per GPU and probe: bandwidth, efficiency vs expected, and bandwidth vs the median of the
    same model and probe across the fleet (``vs_fleet`` 1.0 = typical, 0.8 = 20 % slower)."""
    cols = ["instance", "gpu", "uuid", "model", "probe", "bandwidth", "efficiency", "vs_fleet"]
    if efficiency.empty and bandwidth.empty:
        return pd.DataFrame(columns=cols)
    e = with_cols(efficiency, ["uuid", "probe"])[["uuid", "probe", "value"]].rename(columns={"value": "efficiency"})
    b = with_cols(bandwidth, ["uuid", "probe"])[["uuid", "probe", "value"]].rename(columns={"value": "bandwidth"})
    out = b.merge(e, on=["uuid", "probe"], how="outer")
    ident = with_cols(info, ["uuid", "name", "instance", "gpu"])[["uuid", "name", "instance", "gpu"]]
    ident = ident.drop_duplicates("uuid").rename(columns={"name": "model"})
    out = out.merge(ident, on="uuid", how="left")
    for c in ("model", "instance", "gpu"):
        out[c] = out[c].fillna("")
    median = out.groupby(["model", "probe"])["bandwidth"].transform("median")
    out["vs_fleet"] = out["bandwidth"] / median.where(median > 0)
    return out[cols].sort_values(["probe", "vs_fleet"]).reset_index(drop=True)


def active_clock_events(events: pd.DataFrame) -> pd.DataFrame:
    """Clock event (throttle) reasons holding clocks down now: instance, gpu, uuid, reason."""
    if events.empty or "reason" not in events.columns:
        return pd.DataFrame(columns=["instance", "gpu", "uuid", "reason"])
    ev = with_cols(events, ["instance", "gpu", "uuid"])
    ev = ev[ev["value"] >= 0.5]
    return ev[["instance", "gpu", "uuid", "reason"]].sort_values(["instance", "gpu"]).reset_index(drop=True)


def nonzero(df: pd.DataFrame, label_cols: Sequence[str]) -> pd.DataFrame:
    """Rows with a positive value (e.g. error increases), only ``label_cols`` + value, largest first."""
    if df.empty:
        return pd.DataFrame(columns=[*label_cols, "value"])
    out = with_cols(df, label_cols)
    out = out[out["value"] > 0]
    return out[[*label_cols, "value"]].sort_values("value", ascending=False).reset_index(drop=True)
