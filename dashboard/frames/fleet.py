"""The Fleet, Workloads and Efficiency pages' tables: devices allocated and idle, idle
allocations and the GPU-hours and dollars they waste, who holds each GPU, each leaf's class and
roofline point now (ratios 0..1, hours, USD)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from dashboard import definitions
from dashboard.frames.columns import LEAF, col, with_cols
from dashboard.sources.source import ALLOCATION_KEYS


def _leaf_index(df: pd.DataFrame) -> pd.DataFrame:
    return with_cols(df, LEAF)


def fleet_counts(
    info: pd.DataFrame,
    mig_info: pd.DataFrame,
    allocation: pd.DataFrame,
    idle: pd.DataFrame,
    ages: pd.DataFrame | None = None,
) -> dict[str, int]:
    """Device counts, every one in devices (a whole GPU or a MIG instance; a GPU in MIG mode counts
    as its instances): all devices, allocated, in use (not idle by dashboard/definitions.py, so
    launch-bound ones included, allocated or not), allocated but idle; and the physical GPUs
    behind them.

    ``ages`` (``MetricSource.window_ages`` of ``definitions.LEAF_HISTORY_METRIC`` by leaf: uuid,
    mig_uuid, age_s), where given, holds back the verdict of each leaf whose history does not fill
    the idle window yet (:func:`ready_verdicts`). Then the allocated devices split exactly:
    ``allocated`` = ``allocated_in_use`` + ``allocated_idle`` + ``collecting`` (held, no verdict
    yet: its window is filling, or it sends no activity to judge by)."""
    if ages is not None:
        idle = ready_verdicts(idle, ages)
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
    held = alloc_leaves & known if leaves else alloc_leaves
    held_idle = held & idle_leaves
    held_busy = (held & busy_leaves) - held_idle
    return {
        "gpus": len(gpus),
        "devices": len(known),
        "allocated": len(held),
        "in_use": len(busy_leaves & known) if leaves else len(busy_leaves),
        "allocated_idle": len(alloc_leaves & idle_leaves),
        "allocated_in_use": len(held_busy),
        "collecting": len(held - held_idle - held_busy),
        "unallocated_in_use": len((busy_leaves & known if leaves else busy_leaves) - alloc_leaves),
    }


def ready_verdicts(verdicts: pd.DataFrame, ages: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``verdicts`` (per leaf: uuid, mig_uuid, ...) whose leaf's history fills the
    verdicts' window (``ages``: uuid, mig_uuid, age_s; ``definitions.window_full``); a leaf with
    no age (no history read) is not ready either."""
    if verdicts.empty:
        return verdicts
    full = {
        (str(u), str(m))
        for u, m, a in zip(col(ages, "uuid"), col(ages, "mig_uuid"), _ages(ages), strict=True)
        if definitions.window_full(a)
    }
    v = _leaf_index(verdicts)
    keep = [(str(u), str(m)) in full for u, m in zip(v["uuid"], v["mig_uuid"], strict=True)]
    return verdicts[keep].reset_index(drop=True)


def _ages(ages: pd.DataFrame) -> list[float]:
    return [float(a) for a in pd.to_numeric(ages["age_s"], errors="coerce")] if "age_s" in ages.columns else []


def youngest_age(ages: pd.DataFrame, allocation: pd.DataFrame) -> float:
    """The fewest seconds of history of an allocated leaf (``ages``: uuid, mig_uuid, age_s; NaN
    where none is allocated or none has an age): how far the last of the collecting verdicts got."""
    if ages.empty or allocation.empty:
        return math.nan
    held = _leaf_index(allocation)[list(LEAF)].drop_duplicates()
    a = _leaf_index(ages).merge(held, on=list(LEAF), how="inner")
    young = pd.to_numeric(a["age_s"], errors="coerce") if not a.empty else pd.Series(dtype=float)
    young = young[[not definitions.window_full(x) for x in young]]
    return float(young.min()) if not young.empty else math.nan


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
    # one pass in plain Python, as fleet_names.holders: a groupby with a Python aggregation calls
    # it once per leaf (0.03 s at 1,000 leaves, ten times that at 10,000)
    names: dict[tuple[str, str], set[str]] = {}
    rows = zip(*(alloc[c].tolist() for c in (*LEAF, "namespace", "pod")), strict=True)
    for uuid, mig_uuid, namespace, pod in rows:
        names.setdefault((uuid, mig_uuid), set()).add(f"{namespace}/{pod}")
    leaves = sorted(names)
    return pd.DataFrame(
        {
            "uuid": [u for u, _ in leaves],
            "mig_uuid": [m for _, m in leaves],
            "holders": [", ".join(sorted(names[leaf])) for leaf in leaves],
        },
        columns=[*LEAF, "holders"],
    )


BOUNDNESS_NOW_LABELS = ("instance", "gpu", *LEAF, "class")
"""The labels :func:`boundness_now` reads of the boundness state set: a page asks the store for only
these (``current_state(by=...)``), not every label of every leaf's series."""


def boundness_now(boundness: pd.DataFrame) -> pd.DataFrame:
    """Per leaf, the class whose state-set value is 1 (uuid, mig_uuid, class, plus gpu/instance)."""
    if boundness.empty or "class" not in boundness.columns:
        return pd.DataFrame(columns=[*LEAF, "class"])
    b = with_cols(boundness, [*LEAF, "gpu", "instance"])
    b = b[b["value"] >= 0.5]
    return b[list(BOUNDNESS_NOW_LABELS)].drop_duplicates(list(LEAF)).reset_index(drop=True)


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
