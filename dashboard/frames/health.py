"""The Health page's tables: probe bandwidth against the expected one and against peers (ratios),
clock events that throttle, first events of a counter, and counters that moved."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from dashboard import definitions
from dashboard.frames.columns import col, with_cols

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
