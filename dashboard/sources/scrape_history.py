"""Compact, bounded scrape history for the scrape source: labels once, values as float64 arrays.

A target's series are registered once (their label sets interned); a scrape is then a timestamp,
a shared :class:`Layout` (which series, in which order: the same object for as long as the
target exposes the same series) and a float64 vector of values, 8 bytes a sample. The history is
bounded twice: at most ``max_scrapes`` scrapes per target, and at most ``max_samples`` values
over all targets (each target gets an equal share), so a large fleet keeps a shorter history
rather than more memory.

Parsing is on the text exposition's sample lines: a line's ``name{labels}`` text is the key of
its series, so only a series never seen before is parsed (a plain key by a regular expression,
one with escapes or another syntax by prometheus_client's parser); a known one costs a dict
look-up and a float().
"""

from __future__ import annotations

import itertools
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


_PLAIN_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*"'
_PLAIN_SERIES = re.compile(rf"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{{({_PLAIN_LABEL}(?:,{_PLAIN_LABEL})*),?\}})?")
"""A ``name{labels}`` text with no escape, quoted name or space outside a value: what the exporter
writes.  Read directly; anything else goes through prometheus_client's parser."""
_PLAIN_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\]*)"')


def parse_series(key: str, instance: str) -> tuple[str, Labels]:
    """The metric name and labels of one ``name{labels}`` text (Prometheus' rules: ``instance``
    added when absent, empty values dropped); strings interned, shared by every series.

    A plain key (``_PLAIN_SERIES``) is split by a regular expression, 5 times faster than the
    full parser and the same result (tests/test_dashboard_scrape_history.py compares them)."""
    plain = _PLAIN_SERIES.fullmatch(key)
    pairs: list[tuple[str, str]] = _PLAIN_PAIR.findall(plain.group(2) or "") if plain is not None else []
    if plain is not None and len(dict(pairs)) == len(pairs):
        name = plain.group(1)
    else:  # not plain, or a label given twice (which the parser refuses)
        sample = next(iter(text_string_to_metric_families(key + " 0\n"))).samples[0]
        name, pairs = sample.name, list(sample.labels.items())
    labels = {k: v for k, v in pairs if v != ""}
    labels.setdefault("instance", instance)
    return sys.intern(name), tuple((sys.intern(k), sys.intern(v)) for k, v in sorted(labels.items()))


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
    """One scrape of one target: when, its layout and its values (empty for a failed scrape; a
    row of its :class:`Block`)."""

    timestamp: float
    layout: Layout
    values: np.ndarray


EMPTY = Layout((), (), ())
NO_VALUES = np.zeros(0, dtype=np.float64)

BLOCK_ROWS = 32
"""Most scrapes a :class:`Block` holds."""


class Block:
    """Consecutive scrapes of one layout in one float64 matrix (a row a scrape) and their times:
    a read of a window then gathers a few series' values with one index per block, not one per
    scrape. Rows are written once, in order (``filled`` of them so far): a reader that saw
    ``filled`` rows may read them without the lock."""

    __slots__ = ("filled", "layout", "times", "values")

    def __init__(self, layout: Layout, width: int, rows: int) -> None:
        self.layout = layout
        self.values = np.empty((rows, width), dtype=np.float64)
        self.times = np.empty(rows, dtype=np.float64)
        self.filled = 0

    @property
    def full(self) -> bool:
        return self.filled == len(self.times)


class TargetHistory:
    """The bounded scrapes of one target (not thread-safe: the source holds the lock).

    Bounded by ``max_scrapes`` and ``max_samples`` values, the oldest scrape out first. A block's
    memory is freed when its last scrape goes, so up to two blocks' worth of rows (the evicted head
    of the oldest, the unfilled tail of the newest) is held beyond the kept scrapes: a block is a
    sixteenth of the scrapes the budgets allow (BLOCK_ROWS at most), an eighth of the budget."""

    def __init__(self, instance: str, max_scrapes: int) -> None:
        self.instance = instance
        self.max_scrapes = max_scrapes
        self.max_samples = sys.maxsize
        self.scrapes: deque[Scrape] = deque()
        self.blocks: deque[Block] = deque()
        self.head_row = 0
        """The first kept row of ``blocks[0]`` (the rows before it are evicted)."""
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
        self._append(timestamp, self._layout, np.asarray(values, dtype=np.float64))

    def failed(self, timestamp: float) -> None:
        """An empty scrape: every series of the target is stale from here."""
        self._append(timestamp, EMPTY, NO_VALUES)

    def block_rows(self, width: int) -> int:
        """Rows of a new block of ``width`` series: a sixteenth of the scrapes the budgets keep."""
        kept = min(self.max_scrapes, self.max_samples // max(width, 1))
        return max(1, min(BLOCK_ROWS, kept // 16))

    def _append(self, timestamp: float, layout: Layout, values: np.ndarray) -> None:
        tail = self.blocks[-1] if self.blocks else None
        if tail is None or tail.layout is not layout or tail.full:
            tail = Block(layout, len(values), self.block_rows(len(values)))
            self.blocks.append(tail)
        row = tail.filled
        tail.values[row] = values
        tail.times[row] = timestamp
        tail.filled += 1
        self.scrapes.append(Scrape(timestamp, layout, tail.values[row]))
        self.samples += len(values)
        while len(self.scrapes) > 1 and (len(self.scrapes) > self.max_scrapes or self.samples > self.max_samples):
            self.samples -= len(self.scrapes.popleft().values)
            self.head_row += 1
            if self.head_row >= self.blocks[0].filled and len(self.blocks) > 1:
                self.blocks.popleft()
                self.head_row = 0


@dataclass(frozen=True)
class Snapshot:
    """A target's scrapes at one moment, for reading without the lock: ``scrapes[i]`` was taken at
    ``times[i]``; block ``k`` holds scrapes ``starts[k]`` on, from row ``blocks[k][2]`` of its
    matrix ``blocks[k][1]`` (layout ``blocks[k][0]``)."""

    scrapes: tuple[Scrape, ...]
    times: np.ndarray
    starts: np.ndarray
    blocks: tuple[tuple[Layout, np.ndarray, int], ...]

    @staticmethod
    def of(history: TargetHistory) -> Snapshot:
        first = [history.head_row] + [0] * (len(history.blocks) - 1)
        blocks = tuple((b.layout, b.values, f) for b, f in zip(history.blocks, first, strict=True))
        counts = [b.filled - f for b, f in zip(history.blocks, first, strict=True)]
        starts = np.cumsum([0, *counts[:-1]]) if counts else np.zeros(0, dtype=np.int64)
        times = [b.times[f : b.filled] for b, f in zip(history.blocks, first, strict=True)]
        return Snapshot(
            tuple(history.scrapes),
            np.concatenate(times) if times else np.zeros(0, dtype=np.float64),
            np.asarray(starts, dtype=np.int64),
            blocks,
        )

    def at(self, grid: np.ndarray, lookback_s: float) -> np.ndarray:
        """Per time of ``grid``: the index of the newest scrape at or before it, not older than
        ``lookback_s``; -1 where none."""
        idx = np.searchsorted(self.times, grid, side="right") - 1
        ok = idx >= 0
        ok[ok] = grid[ok] - self.times[idx[ok]] <= lookback_s
        return np.where(ok, idx, -1)

    def runs(self, indices: np.ndarray) -> Iterable[tuple[Layout, np.ndarray, np.ndarray, np.ndarray]]:
        """``indices`` (of scrapes, in order) by block: (layout, matrix, rows of the matrix, the
        positions in ``indices`` they are)."""
        if not len(indices):
            return
        which = np.searchsorted(self.starts, indices, side="right") - 1
        cuts = [0, *(np.flatnonzero(which[1:] != which[:-1]) + 1).tolist(), len(indices)]
        for a, b in itertools.pairwise(cuts):
            k = int(which[a])
            layout, matrix, first = self.blocks[k]
            yield layout, matrix, indices[a:b] - self.starts[k] + first, np.arange(a, b)


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


@dataclass
class _Gathered:
    """The picked samples of a selector, before any label is copied: per (target, layout) group its
    layout and label frame; per sample the row of its series in those frames stacked (``rows``),
    its timestamp, its value and (on request) a series number unique across targets."""

    layouts: list[Layout]
    labs: list[pd.DataFrame]
    rows: list[np.ndarray]
    stamps: list[np.ndarray]
    values: list[np.ndarray]
    ids: list[np.ndarray]


_Group = tuple[Layout, list[tuple[np.ndarray, pd.DataFrame]], np.ndarray, list[np.ndarray], list[np.ndarray]]
"""A target's picked scrapes of one layout: the layout, each selector's (positions, labels), the
union of the positions, and per block the picked rows' times and values (rows x union)."""


def _gather(
    selects: Sequence[Selector], picks: Iterable[tuple[Snapshot, np.ndarray, np.ndarray]], series_id: bool
) -> list[_Gathered]:
    """The samples of each of ``selects`` over the same picks, in one pass: a block's picked rows
    are gathered once for all the selectors (one fancy index of the union of their series)."""
    out = [_Gathered([], [], [], [], [], []) for _ in selects]
    known: list[dict[tuple[int, str], int]] = [{} for _ in selects]
    offsets = [0] * len(selects)
    for target, (snap, indices, stamps) in enumerate(picks):
        groups: dict[int, _Group] = {}
        for layout, matrix, rows, at in snap.runs(indices):
            group = groups.get(id(layout))
            if group is None:
                chosen = [select.pick(layout) for select in selects]
                union = np.concatenate([pos for pos, _lab in chosen]).astype(np.intp, copy=False)
                group = groups[id(layout)] = (layout, chosen, union, [], [])
            if len(group[2]):
                group[3].append(stamps[at])
                group[4].append(matrix[rows[:, None], group[2][None, :]])
        for layout, chosen, _union, ts, blocks in groups.values():
            if not ts:
                continue
            times = np.concatenate(ts).astype(np.float64, copy=False)
            values = np.vstack(blocks)
            n, col = len(times), 0
            for j, (pos, lab) in enumerate(chosen):
                k = len(pos)
                if not k:
                    continue
                got = out[j]
                got.layouts.append(layout)
                got.labs.append(lab)
                got.rows.append(np.tile(np.arange(offsets[j], offsets[j] + k), n))
                got.stamps.append(np.repeat(times, k))
                got.values.append(values[:, col : col + k].ravel())
                if series_id:  # one number per (target, series), whichever layout it is read from
                    sid = [known[j].setdefault((target, layout.keys[p]), len(known[j])) for p in pos.tolist()]
                    got.ids.append(np.tile(np.asarray(sid, dtype=np.int64), n))
                offsets[j] += k
                col += k
    return out


def frame(
    select: Selector, picks: Iterable[tuple[Snapshot, np.ndarray, np.ndarray]], *, time: bool, series_id: bool = False
) -> pd.DataFrame:
    """The selected series' values as one frame (label columns sorted, then ``timestamp`` and
    ``value``: the layout of frames.columns.from_rows), from each (snapshot, scrape indices, timestamps to
    stamp them with). With ``series_id``, a ``_series`` column tells series apart across targets."""
    got = _gather([select], picks, series_id)[0]
    base = ["timestamp", "value"] if time else ["value"]
    if not got.rows:
        return pd.DataFrame(columns=base)
    labels = _combined(select, got.layouts, got.labs)
    df = labels.iloc[np.concatenate(got.rows)].reset_index(drop=True)
    if series_id:
        df["_series"] = np.concatenate(got.ids)
    df["timestamp"] = np.concatenate(got.stamps)
    df["value"] = np.concatenate(got.values)
    if len(got.layouts) > 1 or len(got.rows[0]) > len(got.labs[0]):
        df = df.sort_values("timestamp", kind="stable", ignore_index=True)
    return df if time else df.drop(columns="timestamp")


def coded(
    selects: Sequence[Selector], picks: Iterable[tuple[Snapshot, np.ndarray, np.ndarray]]
) -> list[tuple[pd.DataFrame, pd.DataFrame]]:
    """Per selector, the selected samples without their labels copied: ``series``, one row per
    series (its label columns, as :func:`frame` gives them), and ``samples`` with ``_row`` (the row
    of ``series`` each sample belongs to), ``timestamp`` and ``value``. For reads of many samples of
    few series (a window of a whole fleet), where copying label strings per sample is most of the
    cost; the selectors are read in one pass over the picks."""
    out = []
    for select, got in zip(selects, _gather(selects, list(picks), False), strict=True):
        if not got.rows:
            out.append((pd.DataFrame(), pd.DataFrame({"_row": np.zeros(0, np.int64), "timestamp": [], "value": []})))
            continue
        samples = pd.DataFrame(
            {
                "_row": np.concatenate(got.rows).astype(np.int64),
                "timestamp": np.concatenate(got.stamps),
                "value": np.concatenate(got.values),
            }
        )
        out.append((_combined(select, got.layouts, got.labs), samples))
    return out


def _grouped(
    select: Selector, snap: Snapshot, indices: np.ndarray
) -> list[tuple[Layout, np.ndarray, pd.DataFrame, np.ndarray]]:
    """A target's picked scrapes by layout: (layout, positions, labels, values: scrapes x series)."""
    groups: dict[int, tuple[Layout, np.ndarray, pd.DataFrame, list[np.ndarray]]] = {}
    for layout, matrix, rows, _at in snap.runs(indices):
        group = groups.get(id(layout))
        if group is None:
            group = groups[id(layout)] = (layout, *select.pick(layout), [])
        if len(group[1]):
            group[3].append(matrix[rows[:, None], group[1][None, :]])
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
