"""Compact, bounded scrape history for the scrape source: labels once, values as float64 arrays.

A target's series are registered once (their label sets interned); a scrape is then a timestamp,
a shared :class:`Layout` (which series, in which order: the same object for as long as the
target exposes the same series) and a float64 vector of values, 8 bytes a sample. The history is
bounded twice: at most ``max_scrapes`` scrapes per target, and at most ``max_samples`` values
over all targets (each target gets an equal share), so a large fleet keeps a shorter history
rather than more memory.

Parsing is on the text exposition's sample lines: a line's ``name{labels}`` text is the key of
its series, so only a series never seen before goes through prometheus_client's parser (for
escapes and label syntax); a known one costs a dict look-up and a float().
"""

from __future__ import annotations

import re
import sys
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]

MAX_SAMPLES = 16_000_000
"""Values kept over all targets (128 MB of float64); a fleet whose scrapes hold more keeps fewer
scrapes (a shorter history), shown on every page's footer."""


def sample_lines(text: str) -> Iterable[tuple[str, str]]:
    """(``name{labels}`` text, value text) for each sample line of a text exposition."""
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        key, _, value = line.strip().rpartition(" ")
        if ("{" in key and not key.endswith("}")) or ("{" not in key and " " in key):
            key, _, value = key.rpartition(" ")  # a trailing timestamp
        if key:
            yield key, value


def parse_series(key: str, instance: str) -> tuple[str, Labels]:
    """The metric name and labels of one ``name{labels}`` text (Prometheus' rules: ``instance``
    added when absent, empty values dropped); strings interned, shared by every series."""
    family = next(iter(text_string_to_metric_families(key + " 0\n")))
    sample = family.samples[0]
    labels = {k: v for k, v in sample.labels.items() if v != ""}
    labels.setdefault("instance", instance)
    return sys.intern(sample.name), tuple((sys.intern(k), sys.intern(v)) for k, v in sorted(labels.items()))


@dataclass(eq=False)
class Layout:
    """The series of a run of scrapes, in order: ``names[i]``/``labels[i]`` is value ``i``."""

    names: tuple[str, ...]
    labels: tuple[Labels, ...]
    keys: tuple[str, ...]
    _positions: dict[str, np.ndarray] = field(default_factory=dict)
    _frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    _devices: dict[str, tuple[np.ndarray, pd.DataFrame]] = field(default_factory=dict)
    _subsets: dict[tuple[object, ...], tuple[np.ndarray, pd.DataFrame]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def positions(self, metric: str) -> np.ndarray:
        """Indices of ``metric``'s series in this layout."""
        with self._lock:
            got = self._positions.get(metric)
            if got is None:
                got = np.asarray([i for i, n in enumerate(self.names) if n == metric], dtype=np.intp)
                self._positions[metric] = got
            return got

    def label_frame(self, metric: str) -> pd.DataFrame:
        """One row per series of ``metric``, one column per label (absent = ``""``); cached."""
        with self._lock:
            got = self._frames.get(metric)
        if got is None:
            got = labels_frame([self.labels[i] for i in self.positions(metric)])
            with self._lock:
                self._frames[metric] = got
        return got

    def subset(
        self, metric: str, columns: tuple[str, ...] | None, where: tuple[str, str] | None
    ) -> tuple[np.ndarray, pd.DataFrame]:
        """Positions and labels of the series of ``metric`` (only those whose label ``where[0]``
        is ``where[1]``), with only the label ``columns`` present in the layout; cached, as every
        read of a range asks the same of each target's few layouts."""
        key = (metric, columns, where)
        with self._lock:
            got = self._subsets.get(key)
        if got is None:
            pos, lab = self.positions(metric), self.label_frame(metric)
            if where is not None:
                label, value = where
                keep = (lab[label] == value).to_numpy() if label in lab.columns else np.zeros(len(lab), dtype=bool)
                pos, lab = pos[keep], lab[keep].reset_index(drop=True)
            if columns is not None:
                lab = lab[[c for c in columns if c in lab.columns]]
            got = (pos, lab)
            with self._lock:
                self._subsets[key] = got
        return got

    def device(self, pattern: re.Pattern[str], uuid: str) -> tuple[np.ndarray, pd.DataFrame]:
        """Positions and labels (with a ``metric`` column) of the series named like ``pattern``
        that carry ``uuid``; the last few asked for are cached."""
        key = f"{pattern.pattern}|{uuid}"
        with self._lock:
            got = self._devices.get(key)
        if got is None:
            pos = [
                i
                for i, (name, labels) in enumerate(zip(self.names, self.labels, strict=True))
                if ("uuid", uuid) in labels and pattern.fullmatch(name)
            ]
            lab = labels_frame([(*self.labels[i], ("metric", self.names[i])) for i in pos])
            got = (np.asarray(pos, dtype=np.intp), lab)
            with self._lock:
                if len(self._devices) >= 16:
                    self._devices.clear()
                self._devices[key] = got
        return got


def labels_frame(labels: Sequence[Labels]) -> pd.DataFrame:
    """Label sets as a frame: one column per label, sorted, absent = ``""``."""
    df = pd.DataFrame([dict(lab) for lab in labels])
    if df.empty:
        return pd.DataFrame(index=range(len(labels)))
    return df[sorted(df.columns)].fillna("").astype(str)


@dataclass(frozen=True)
class Scrape:
    """One scrape of one target: when, its layout and its values (empty for a failed scrape)."""

    timestamp: float
    layout: Layout
    values: np.ndarray


EMPTY = Layout((), (), ())
NO_VALUES = np.zeros(0, dtype=np.float64)


class TargetHistory:
    """The bounded scrapes of one target (not thread-safe: the source holds the lock)."""

    def __init__(self, instance: str, max_scrapes: int) -> None:
        self.instance = instance
        self.max_scrapes = max_scrapes
        self.max_samples = sys.maxsize
        self.scrapes: deque[Scrape] = deque()
        self.samples = 0
        self._series: dict[str, tuple[str, Labels]] = {}
        self._layout = EMPTY

    def add(self, timestamp: float, text: str) -> None:
        """Parse ``text`` and keep it as the newest scrape."""
        keys: list[str] = []
        values: list[float] = []
        for key, value in sample_lines(text):
            if key not in self._series:
                self._series[key] = parse_series(key, self.instance)
            keys.append(key)
            values.append(float(value))
        if tuple(keys) != self._layout.keys:
            # a changed set of series: a new layout; the registry keeps only what it lists, so
            # series that came and went (pods) do not pile up
            self._series = {k: self._series[k] for k in keys}
            self._layout = Layout(
                tuple(self._series[k][0] for k in keys), tuple(self._series[k][1] for k in keys), tuple(keys)
            )
        self._append(Scrape(timestamp, self._layout, np.asarray(values, dtype=np.float64)))

    def failed(self, timestamp: float) -> None:
        """An empty scrape: every series of the target is stale from here."""
        self._append(Scrape(timestamp, EMPTY, NO_VALUES))

    def _append(self, scrape: Scrape) -> None:
        self.scrapes.append(scrape)
        self.samples += len(scrape.values)
        while len(self.scrapes) > 1 and (len(self.scrapes) > self.max_scrapes or self.samples > self.max_samples):
            self.samples -= len(self.scrapes.popleft().values)


@dataclass(frozen=True)
class Snapshot:
    """A target's scrapes at one moment, for reading without the lock."""

    scrapes: tuple[Scrape, ...]
    times: np.ndarray

    @staticmethod
    def of(history: TargetHistory) -> Snapshot:
        scrapes = tuple(history.scrapes)
        return Snapshot(scrapes, np.fromiter((s.timestamp for s in scrapes), dtype=np.float64, count=len(scrapes)))

    def at(self, grid: np.ndarray, lookback_s: float) -> np.ndarray:
        """Per time of ``grid``: the index of the newest scrape at or before it, not older than
        ``lookback_s``; -1 where none."""
        idx = np.searchsorted(self.times, grid, side="right") - 1
        ok = idx >= 0
        ok[ok] = grid[ok] - self.times[idx[ok]] <= lookback_s
        return np.where(ok, idx, -1)


@dataclass(frozen=True)
class Selector:
    """Which series of a layout to read: ``pick(layout)`` gives their positions and label frame;
    ``key`` names the choice (for the cache of combined label frames)."""

    key: str
    pick: Callable[[Layout], tuple[np.ndarray, pd.DataFrame]]


def of_metric(metric: str, labels: Sequence[str] | None = None, where: tuple[str, str] | None = None) -> Selector:
    """The series of ``metric``; with ``labels``, only those label columns (fewer columns to copy
    for every sample of a long range); with ``where`` = (label, value), only the series whose
    label has that value (one class of a state set: a sixth of the boundness samples)."""

    if labels is None and where is None:
        return Selector(metric, lambda layout: (layout.positions(metric), layout.label_frame(metric)))
    columns = None if labels is None else tuple(labels)
    return Selector(f"{metric}|{columns}|{where}", lambda layout: layout.subset(metric, columns, where))


def of_device(pattern: re.Pattern[str], uuid: str) -> Selector:
    """Every series whose name matches ``pattern`` and whose ``uuid`` label is ``uuid``, with the
    name in a ``metric`` column."""
    return Selector(f"{pattern.pattern}|{uuid}", lambda layout: layout.device(pattern, uuid))


_COMBINED: OrderedDict[tuple[object, ...], tuple[pd.DataFrame, tuple[Layout, ...]]] = OrderedDict()
_COMBINED_LOCK = threading.Lock()
_COMBINED_MAX = 64


def _combined(select: Selector, layouts: list[Layout], labs: list[pd.DataFrame]) -> pd.DataFrame:
    """The label frames of ``layouts`` one under the other (columns sorted, absent = ``""``),
    cached while the fleet's layouts stay the same: most reads then cost no label work at all."""
    key = (select.key, *(id(lay) for lay in layouts))
    with _COMBINED_LOCK:
        hit = _COMBINED.get(key)
        if hit is not None:
            _COMBINED.move_to_end(key)
            return hit[0]
    df = pd.concat(labs, ignore_index=True, sort=False) if labs else pd.DataFrame()
    df = df[sorted(df.columns)].fillna("")
    with _COMBINED_LOCK:
        # the layouts ride along so their ids cannot be reused while the entry lives
        _COMBINED[key] = (df, tuple(layouts))
        while len(_COMBINED) > _COMBINED_MAX:
            _COMBINED.popitem(last=False)
    return df


def frame(
    select: Selector, picks: Iterable[tuple[Snapshot, np.ndarray, np.ndarray]], *, time: bool, series_id: bool = False
) -> pd.DataFrame:
    """The selected series' values as one frame (label columns sorted, then ``timestamp`` and
    ``value``: the layout of frames.from_rows), from each (snapshot, scrape indices, timestamps to
    stamp them with). With ``series_id``, a ``_series`` column tells series apart across targets."""
    layouts: list[Layout] = []
    labs: list[pd.DataFrame] = []
    rows: list[np.ndarray] = []
    stamps_out: list[np.ndarray] = []
    values: list[np.ndarray] = []
    ids: list[np.ndarray] = []
    known: dict[tuple[int, str], int] = {}
    offset = 0
    for target, (snap, indices, stamps) in enumerate(picks):
        groups: dict[int, tuple[Layout, np.ndarray, pd.DataFrame, list[float], list[np.ndarray]]] = {}
        for i, t in zip(indices.tolist(), stamps.tolist(), strict=True):
            scrape = snap.scrapes[i]
            group = groups.get(id(scrape.layout))
            if group is None:
                group = groups[id(scrape.layout)] = (scrape.layout, *select.pick(scrape.layout), [], [])
            if len(group[1]):
                group[3].append(t)
                group[4].append(scrape.values[group[1]])
        for layout, pos, lab, ts, vals in groups.values():
            if not ts:
                continue
            n, k = len(ts), len(lab)
            layouts.append(layout)
            labs.append(lab)
            rows.append(np.tile(np.arange(offset, offset + k), n))
            stamps_out.append(np.repeat(np.asarray(ts, dtype=np.float64), k))
            values.append(np.concatenate(vals))
            if series_id:  # one number per (target, series), whichever layout it is read from
                sid = [known.setdefault((target, layout.keys[p]), len(known)) for p in pos.tolist()]
                ids.append(np.tile(np.asarray(sid, dtype=np.int64), n))
            offset += k
    base = ["timestamp", "value"] if time else ["value"]
    if not rows:
        return pd.DataFrame(columns=base)
    labels = _combined(select, layouts, labs)
    df = labels.iloc[np.concatenate(rows)].reset_index(drop=True)
    if series_id:
        df["_series"] = np.concatenate(ids)
    df["timestamp"] = np.concatenate(stamps_out)
    df["value"] = np.concatenate(values)
    if len(layouts) > 1 or len(rows[0]) > len(labs[0]):
        df = df.sort_values("timestamp", kind="stable", ignore_index=True)
    return df if time else df.drop(columns="timestamp")


def _grouped(
    select: Selector, snap: Snapshot, indices: np.ndarray
) -> list[tuple[Layout, np.ndarray, pd.DataFrame, np.ndarray]]:
    """A target's picked scrapes by layout: (layout, positions, labels, values: scrapes x series)."""
    groups: dict[int, tuple[Layout, np.ndarray, pd.DataFrame, list[np.ndarray]]] = {}
    for i in indices.tolist():
        scrape = snap.scrapes[i]
        group = groups.get(id(scrape.layout))
        if group is None:
            group = groups[id(scrape.layout)] = (scrape.layout, *select.pick(scrape.layout), [])
        if len(group[1]):
            group[3].append(scrape.values[group[1]])
    return [(lay, pos, lab, np.vstack(vals)) for lay, pos, lab, vals in groups.values() if vals]


def _mean(v: np.ndarray) -> np.ndarray:
    """Per column, the mean of its non-NaN values (NaN when none), as pandas' groupby mean."""
    seen = ~np.isnan(v)
    count = seen.sum(axis=0)
    total = np.where(seen, v, 0.0).sum(axis=0)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _increase(v: np.ndarray) -> np.ndarray:
    """Per column, a counter's growth over its rows (oldest first); a drop is a reset, after
    which the new value is all growth."""
    if len(v) < 2:
        return np.zeros(v.shape[1])
    d = v[1:] - v[:-1]
    return np.where(d >= 0, d, v[1:]).sum(axis=0)


def _pandas_reduce(raw: pd.DataFrame, how: str) -> pd.DataFrame:
    """``how`` per series of ``raw`` (with ``_series``), for a target whose series changed layout
    within the window."""
    labels = [c for c in raw.columns if c not in ("timestamp", "value", "_series")]
    raw = raw.sort_values(["_series", "timestamp"], kind="stable")
    if how == "increase":
        first = raw["_series"].ne(raw["_series"].shift())
        prev, v = raw["value"].shift(), raw["value"]
        raw = raw.assign(value=np.where(first, 0.0, np.where(v >= prev, v - prev, v)))
        out = raw.groupby(["_series", *labels], sort=False)["value"].sum()
    else:
        out = raw.groupby(["_series", *labels], sort=False)["value"].mean()
    return out.reset_index().drop(columns="_series")


def reduced(select: Selector, picks: Iterable[tuple[Snapshot, np.ndarray, np.ndarray]], how: str) -> pd.DataFrame:
    """Per selected series, ``how`` ("mean": of its values; "increase": a counter's growth) over
    the picked scrapes: label columns and ``value``, without a row per sample."""
    layouts: list[Layout] = []
    labs: list[pd.DataFrame] = []
    values: list[np.ndarray] = []
    slow: list[pd.DataFrame] = []
    for snap, indices, stamps in picks:
        groups = _grouped(select, snap, indices)
        if len(groups) == 1:
            layout, _pos, lab, v = groups[0]
            layouts.append(layout)
            labs.append(lab)
            values.append(_increase(v) if how == "increase" else _mean(v))
        elif groups:
            raw = frame(select, [(snap, indices, stamps)], time=True, series_id=True)
            slow.append(_pandas_reduce(raw, how))
    parts = []
    if layouts:
        fast = _combined(select, layouts, labs).copy()
        fast["value"] = np.concatenate(values)
        parts.append(fast)
    if not parts and not slow:
        return pd.DataFrame(columns=["value"])
    df = pd.concat([*parts, *slow], ignore_index=True, sort=False)
    labels = sorted(c for c in df.columns if c != "value")
    df[labels] = df[labels].fillna("")
    return df[[*labels, "value"]]
