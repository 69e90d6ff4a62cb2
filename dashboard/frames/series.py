"""Range series as the GPU page draws them: counters as per-second rates, a state-set metric as
one state per step, and the pods that held a GPU over the range (Unix seconds). The GPU page's
charts, their titles, units and legend words are dashboard/gpu_panels.py's table."""

from __future__ import annotations

import pandas as pd

from dashboard.frames.columns import with_cols


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
