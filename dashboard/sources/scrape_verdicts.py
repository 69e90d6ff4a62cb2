"""The idle verdict of the scrape source: dashboard.definitions' ``gpulens:gpu_idle:bool`` per leaf
and time, computed from the in-memory history and kept once settled.

The scrape source is its own rule evaluator (no Prometheus records the verdict for it). Two things
keep that affordable on a fleet of a thousand GPUs read over an hour, page after page:

- **Reads without labels per sample.** A window of the idle definition's series is tens of thousands
  of samples of a few thousand series. They are read as (series row, time, value) and the leaf is an
  integer code (:func:`leaf_idle`), so no label string is copied or grouped per sample.
- **Settled verdicts are kept.** A verdict at time t reads the samples stamped in (t - 5 m, t]. Once
  every target has been scraped after t, no sample stamped at or before t can still arrive (a
  target's scrapes are stamped in order), so the verdict at t is final: :class:`VerdictCache`
  keeps it, and a range read again (the next page, the next rerun) computes only its newest steps.
  Ranges are read at step-aligned times (as Prometheus' subqueries), so that their steps recur.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from dashboard import definitions
from dashboard.frames.columns import col, with_cols
from dashboard.sources.scrape_history import Snapshot, coded, of_metric
from dashboard.sources.source import SM_ACTIVE, Filters

Picks = list[tuple[Snapshot, np.ndarray, np.ndarray]]
PicksFor = Callable[[float, float], Picks]
"""Each target's scrapes stamped in [start, end] (ScrapeSource._within of one snapshot)."""

VERDICT_COLUMNS: tuple[str, ...] = (*definitions.LEAF, "timestamp", "sm_mean", "idle")

IDLE_LABELS: tuple[str, ...] = ("cluster", "node", "instance", *definitions.LEAF, "class")
"""The labels the idle verdict reads: the target's (for filters), the leaf's and the class."""

CACHE_ROWS = 400_000
"""Most verdict rows kept (a leaf at a time each, about 70 bytes with its UUID: 28 MB): 400 times
of a thousand-GPU fleet, five ranges of 80 steps; the least recently read go first."""

_LEAF_CODE = "_leaf"


def settled_before(hist: Sequence[Snapshot]) -> float:
    """The latest time whose samples have all arrived: the oldest of the targets' newest scrape
    times (a target's next scrape is stamped later than its last); -inf while a target has none."""
    if not hist or any(not len(s.times) for s in hist):
        return -np.inf
    return float(min(s.times[-1] for s in hist))


def leaf_idle(picks: Picks, grid: np.ndarray, target: Filters, fresh_s: float) -> pd.DataFrame:
    """:func:`dashboard.definitions.leaf_idle_frame` at each time of ``grid`` for every leaf whose
    series match ``target``'s target matchers (cluster, node, instance), from ``picks`` (each
    target's scrapes that cover the grid's windows). Columns VERDICT_COLUMNS."""
    matchers = target.target_matchers()
    # the definition's eight series families, read in one pass over the window's scrapes
    metrics = (
        SM_ACTIVE,
        "gpulens_gpu_sm_active_seconds_total",
        "gpulens_gpu_utilization_ratio",
        "gpulens_gpu_busy_ratio",
        "gpulens_gpu_busy_seconds_total",
        "gpulens_gpu_compute_processes",
    )
    selects = [of_metric(m, IDLE_LABELS) for m in metrics]
    selects += [of_metric("gpulens_gpu_boundness", IDLE_LABELS, ("class", c)) for c in definitions.IN_USE_CLASSES]
    reads = coded(selects, picks)
    # one integer per leaf over all the families' series (numbered in order of first appearance)
    named = pd.concat([with_cols(series, definitions.LEAF)[list(definitions.LEAF)] for series, _ in reads])
    leaf_of_row = named.groupby(list(definitions.LEAF), sort=False).ngroup().to_numpy(dtype=np.int64)
    leaves = named.drop_duplicates()
    bounds = np.cumsum([0, *(len(series) for series, _ in reads)])

    def coded_leaves(k: int, cls: str = "") -> pd.DataFrame:
        series, samples = reads[k]
        if series.empty:
            return pd.DataFrame({_LEAF_CODE: np.zeros(0, np.int64), "timestamp": [], "value": []})
        leaf = leaf_of_row[bounds[k] : bounds[k + 1]].copy()
        for label, value in matchers.items():
            leaf[(col(series, label) != value).to_numpy()] = -1
        code = leaf[samples["_row"].to_numpy()]
        ok = code >= 0
        at, value = samples["timestamp"].to_numpy()[ok], samples["value"].to_numpy()[ok]
        out = pd.DataFrame({_LEAF_CODE: code[ok], "timestamp": at, "value": value})
        return out.assign(**{"class": cls}) if cls else out

    sm, sm_s, util, busy, busy_s, procs = (coded_leaves(k) for k in range(len(metrics)))
    classes = [coded_leaves(len(metrics) + i, c) for i, c in enumerate(definitions.IN_USE_CLASSES)]
    verdict = definitions.leaf_idle_frame(
        sm,
        sm_s,
        util,
        pd.concat(classes, ignore_index=True),
        grid,
        fresh_s=fresh_s,
        busy_ratio=busy,
        busy_seconds=busy_s,
        processes=procs,
        keys=[_LEAF_CODE],
    )
    leaf = verdict[_LEAF_CODE].to_numpy(dtype=np.int64)
    out = leaves.iloc[leaf].reset_index(drop=True)
    for c in ("timestamp", "sm_mean", "idle"):
        out[c] = verdict[c].to_numpy()
    return out.astype({"timestamp": float, "sm_mean": float, "idle": bool})


class VerdictCache:
    """Settled verdicts per (target filters, time): see the module docstring. Bounded by
    CACHE_ROWS, the least recently read out first; safe to share between threads."""

    def __init__(self, max_rows: int = CACHE_ROWS) -> None:
        self.max_rows = max_rows
        self._rows = 0
        self._kept: OrderedDict[tuple[object, float], pd.DataFrame] = OrderedDict()
        self._lock = threading.Lock()

    def verdicts(
        self, picks_for: PicksFor, grid: Iterable[float], hist: Sequence[Snapshot], target: Filters, fresh_s: float
    ) -> pd.DataFrame:
        """The verdicts at every time of ``grid``: kept ones looked up, the rest computed at once
        (``picks_for(start, end)``: each target's scrapes stamped in [start, end]) and kept where
        settled."""
        times = sorted({float(t) for t in grid})
        scope = tuple(sorted(target.target_matchers().items()))
        with self._lock:
            found = {t: self._kept[(scope, t)] for t in times if (scope, t) in self._kept}
            for t in found:
                self._kept.move_to_end((scope, t))
        need = np.asarray([t for t in times if t not in found], dtype=float)
        if len(need):
            start = float(need[0]) - definitions.MEAN_WINDOW_SECONDS
            computed = leaf_idle(picks_for(start, float(need[-1])), need, target, fresh_s)
            at = computed["timestamp"].to_numpy()
            order = np.argsort(at, kind="stable")
            bounds = np.searchsorted(at[order], need, side="left"), np.searchsorted(at[order], need, side="right")
            settled = settled_before(hist)
            fresh: list[tuple[float, pd.DataFrame]] = []
            for t, lo, hi in zip(need.tolist(), bounds[0].tolist(), bounds[1].tolist(), strict=True):
                part = computed.iloc[order[lo:hi]].reset_index(drop=True)
                found[t] = part
                if t <= settled:
                    fresh.append((t, part))
            self._keep(scope, fresh)
        parts = [found[t] for t in times if len(found[t])]
        if not parts:
            dtypes = {c: object if c in definitions.LEAF else float for c in VERDICT_COLUMNS}
            return pd.DataFrame({c: pd.Series(dtype=d) for c, d in dtypes.items()})
        return pd.concat(parts, ignore_index=True)

    def _keep(self, scope: tuple[object, ...], parts: list[tuple[float, pd.DataFrame]]) -> None:
        with self._lock:
            for t, part in parts:
                if (scope, t) not in self._kept:
                    self._kept[(scope, t)] = part
                    self._rows += max(1, len(part))
            while self._rows > self.max_rows and self._kept:
                _, dropped = self._kept.popitem(last=False)
                self._rows -= max(1, len(dropped))
