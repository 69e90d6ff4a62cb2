"""MetricSource that scrapes exporters' /metrics itself and keeps a bounded in-memory history.

For the demo and single nodes, where no Prometheus runs. Values at a step follow Prometheus'
rules closely enough to share the pages: the newest scrape at or before the step, not older than
the lookback, and a series absent from that scrape is absent (stale) at that step.
"""

from __future__ import annotations

import bisect
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np
import pandas as pd
import requests
from prometheus_client.parser import text_string_to_metric_families

from dashboard import definitions, frames
from dashboard.source import (
    ACTIVITY_COLUMNS,
    ALLOCATION,
    ALLOCATION_KEYS,
    DEVICE_METRICS,
    LOOKBACK_SECONDS,
    NO_FILTERS,
    SM_ACTIVE,
    Filters,
    bounded_step,
    device_keys,
)

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Scrape:
    """One scrape of one target: when, and its samples by sample name (``..._total`` for counters)."""

    timestamp: float
    samples: dict[str, list[tuple[Labels, float]]] = field(default_factory=dict)


def parse_exposition(text: str, instance: str) -> dict[str, list[tuple[Labels, float]]]:
    """Samples of a Prometheus text exposition by name, with ``instance`` added as Prometheus would;
    empty label values are dropped (Prometheus treats them as absent)."""
    out: dict[str, list[tuple[Labels, float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if v != ""}
            labels.setdefault("instance", instance)
            out.setdefault(s.name, []).append((tuple(sorted(labels.items())), float(s.value)))
    return out


def instance_of(url: str) -> str:
    """``host:port`` of a scrape URL, the ``instance`` label Prometheus would give it."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def metrics_url(url: str) -> str:
    """A target given as ``host:port`` or a base URL becomes its /metrics URL."""
    full = url if "://" in url else f"http://{url}"
    return full if urlsplit(full).path not in ("", "/") else full.rstrip("/") + "/metrics"


class ScrapeSource:
    """Scrapes ``urls`` every ``interval_s`` on a daemon thread, keeping ``history`` scrapes each."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        interval_s: float = 5.0,
        history: int = 720,
        timeout_s: float = 5.0,
        fetch: Callable[[str], str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not urls:
            raise ValueError("ScrapeSource needs at least one exporter URL")
        self.urls = [metrics_url(u) for u in urls]
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._fetch = fetch or self._http_get
        self._clock = clock
        self._lock = threading.Lock()
        self._history: dict[str, deque[Scrape]] = {u: deque(maxlen=history) for u in self.urls}
        self._errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._session = requests.Session()

    @property
    def description(self) -> str:
        return f"direct scrape of {len(self.urls)} exporter(s)"

    # --- scraping ----------------------------------------------------------------------
    def _http_get(self, url: str) -> str:
        resp = self._session.get(url, timeout=self.timeout_s)
        resp.raise_for_status()
        return resp.text

    def scrape_once(self) -> None:
        """Scrape every target now; a failing target is recorded in problems(), the others kept."""
        for url in self.urls:
            now = self._clock()
            try:
                samples = parse_exposition(self._fetch(url), instance_of(url))
            except requests.ConnectionError:
                self._failed(url, now, "connection refused or host unreachable")
                continue
            except requests.Timeout:
                self._failed(url, now, f"no answer within {self.timeout_s:g} s")
                continue
            except Exception as exc:  # any failure of one target must not stop the others
                self._failed(url, now, f"{type(exc).__name__}: {str(exc)[:200]}")
                continue
            with self._lock:
                self._errors.pop(url, None)
                self._history[url].append(Scrape(now, samples))

    def _failed(self, url: str, now: float, why: str) -> None:
        with self._lock:
            self._errors[url] = why
            self._history[url].append(Scrape(now))  # an empty scrape makes its series stale

    def start(self) -> ScrapeSource:
        """Start the background scraper (idempotent); the first scrape happens before returning."""
        if self._thread is None:
            self.scrape_once()
            self._thread = threading.Thread(target=self._loop, name="gpulens-scrape", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.scrape_once()

    # --- reading -----------------------------------------------------------------------
    def _snapshot(self) -> dict[str, list[Scrape]]:
        with self._lock:
            return {u: list(h) for u, h in self._history.items()}

    def _at(self, metric: str, at: float, hist: dict[str, list[Scrape]]) -> list[dict[str, object]]:
        rows: list[dict[str, object]] = []
        for scrapes in hist.values():
            times = [s.timestamp for s in scrapes]
            i = bisect.bisect_right(times, at) - 1
            if i < 0 or at - scrapes[i].timestamp > LOOKBACK_SECONDS:
                continue
            for labels, value in scrapes[i].samples.get(metric, ()):
                rows.append({**dict(labels), "value": value})
        return rows

    def _frame_at(self, metric: str, at: float, hist: dict[str, list[Scrape]]) -> pd.DataFrame:
        return frames.from_rows(self._at(metric, at, hist))

    def _end(self, end: float | None) -> float:
        """The range's end: ``end`` (an absolute range), never later than now; None = now."""
        now = self._clock()
        return now if end is None else min(end, now)

    def _grid(self, window_s: float, step_s: float, end_at: float | None = None) -> tuple[list[float], float]:
        window, step = bounded_step(window_s, max(step_s, self.interval_s))
        # ends at now, not at a multiple of the step like Prometheus: the history may be younger
        # than one step, and the newest scrape is the one a user wants to see
        end = self._end(end_at)
        n = int(window // step)
        return [end - k * step for k in range(n, -1, -1)], step

    def _series_raw(self, metric: str, grid: list[float], hist: dict[str, list[Scrape]]) -> pd.DataFrame:
        rows: list[dict[str, object]] = []
        for t in grid:
            rows.extend({**r, "timestamp": t} for r in self._at(metric, t, hist))
        return frames.from_rows(rows, time=True)

    def instant(
        self, metric: str, filters: Filters = NO_FILTERS, *, by: Sequence[str] | None = None, end: float | None = None
    ) -> pd.DataFrame:
        hist = self._snapshot()
        now = self._end(end)
        return self._filtered(self._frame_at(metric, now, hist), metric, filters, by, now, hist)

    def series(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        window_s: float,
        step_s: float,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        hist = self._snapshot()
        grid, _ = self._grid(window_s, step_s, end)
        df = self._series_raw(metric, grid, hist)
        alloc = self._series_raw(ALLOCATION, grid, hist) if filters.namespace else pd.DataFrame()
        return frames.aggregate(frames.restrict(df, filters, alloc, device_keys(metric)), by)

    def increase(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        window_s: float,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        hist = self._snapshot()
        now = self._end(end)
        window, _ = bounded_step(window_s, 1.0)
        rows: list[dict[str, object]] = []
        for scrapes in hist.values():
            growth: dict[Labels, float] = {}
            last: dict[Labels, float] = {}
            for s in scrapes:
                if s.timestamp < now - window or s.timestamp > now:
                    continue
                for labels, value in s.samples.get(metric, ()):
                    prev = last.get(labels)
                    # a drop is a counter reset: the new value is all growth since the reset
                    growth[labels] = growth.get(labels, 0.0) + (
                        0.0 if prev is None else (value - prev if value >= prev else value)
                    )
                    last[labels] = value
            rows.extend({**dict(labels), "value": g} for labels, g in growth.items())
        return self._filtered(frames.from_rows(rows), metric, filters, by, now, hist)

    def _raw(self, metric: str, hist: dict[str, list[Scrape]], start: float, end: float) -> pd.DataFrame:
        """Every sample of ``metric`` scraped in [start, end], with its scrape's timestamp."""
        rows: list[dict[str, object]] = []
        for scrapes in hist.values():
            for s in scrapes:
                if start <= s.timestamp <= end:
                    rows.extend(
                        {**dict(labels), "timestamp": s.timestamp, "value": v}
                        for labels, v in s.samples.get(metric, ())
                    )
        return frames.from_rows(rows, time=True)

    def _idle_at(self, grid: list[float], hist: dict[str, list[Scrape]], filters: Filters) -> pd.DataFrame:
        """dashboard.definitions' idle verdict per leaf at each grid time (the rules' gpu_idle:bool)."""
        start, end = grid[0] - definitions.MEAN_WINDOW_SECONDS, grid[-1]
        target = Filters(**_targets(filters))

        def raw(metric: str) -> pd.DataFrame:
            return frames.restrict(self._raw(metric, hist, start, end), target, pd.DataFrame(), ())

        return definitions.leaf_idle_frame(
            raw(SM_ACTIVE),
            raw("gpulens_gpu_sm_active_seconds_total"),
            raw("gpulens_gpu_utilization_ratio"),
            raw("gpulens_gpu_boundness"),
            np.asarray(grid, dtype=float),
            fresh_s=max(2.5 * self.interval_s, self.interval_s + self.timeout_s),
        )

    def mean(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        window_s: float,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        hist = self._snapshot()
        now = self._end(end)
        window, _ = bounded_step(window_s, 1.0)
        raw = self._raw(metric, hist, now - window, now)
        if raw.empty:
            return pd.DataFrame(columns=["value"])
        labels = [c for c in raw.columns if c not in ("timestamp", "value")]
        df = raw.groupby(labels, as_index=False, dropna=False)["value"].mean()
        return self._filtered(df, metric, filters, by, now, hist)

    def _filtered(
        self,
        df: pd.DataFrame,
        metric: str,
        filters: Filters,
        by: Sequence[str] | None,
        now: float,
        hist: dict[str, list[Scrape]],
    ) -> pd.DataFrame:
        """``df`` (values of ``metric`` at ``now``) under ``filters``, summed ``by``."""
        alloc = self._frame_at(ALLOCATION, now, hist) if filters.namespace else pd.DataFrame()
        return frames.aggregate(frames.restrict(df, filters, alloc, device_keys(metric)), by)

    def device_series(self, uuid: str, *, window_s: float, step_s: float, end: float | None = None) -> pd.DataFrame:
        hist = self._snapshot()
        grid, _ = self._grid(window_s, step_s, end)
        pattern = re.compile(DEVICE_METRICS)
        rows: list[dict[str, object]] = []
        for scrapes in hist.values():
            times = [s.timestamp for s in scrapes]
            for t in grid:
                i = bisect.bisect_right(times, t) - 1
                if i < 0 or t - scrapes[i].timestamp > LOOKBACK_SECONDS:
                    continue
                for name, samples in scrapes[i].samples.items():
                    if not pattern.fullmatch(name):
                        continue
                    for labels, value in samples:
                        lab = dict(labels)
                        if lab.get("uuid") == uuid:
                            rows.append({**lab, "metric": name, "timestamp": t, "value": value})
        return frames.from_rows(rows, time=True)

    def leaf_idle(self, filters: Filters = NO_FILTERS, *, end: float | None = None) -> pd.DataFrame:
        hist = self._snapshot()
        idle = self._idle_at([self._end(end)], hist, filters)
        out = idle.assign(value=idle["idle"].astype(float))[[*definitions.LEAF, "sm_mean", "value"]]
        return out.reset_index(drop=True)

    def allocation_activity(
        self, filters: Filters = NO_FILTERS, *, window_s: float, step_s: float, end: float | None = None
    ) -> pd.DataFrame:
        hist = self._snapshot()
        grid, step = self._grid(window_s, step_s, end)
        # the steps of Prometheus' [window:step] subquery: the range's end back to, not including,
        # its start (so both sources integrate the same number of steps)
        grid = grid[1:] if len(grid) > 1 else grid
        target = Filters(**_targets(filters))
        alloc = frames.restrict(self._series_raw(ALLOCATION, grid, hist), target, pd.DataFrame(), ())
        if alloc.empty:
            return pd.DataFrame(columns=list(ACTIVITY_COLUMNS))
        now = grid[-1]
        info = self._frame_at("gpulens_gpu_info", now, hist)
        mig = self._frame_at("gpulens_mig_instance_info", now, hist)
        out = definitions.wasted_from_series(
            alloc,
            self._idle_at(grid, hist, filters),
            definitions.gpu_shares(info, mig),
            keys=ALLOCATION_KEYS,
            step_s=step,
        )
        if filters.namespace:
            out = out[out["namespace"] == filters.namespace].reset_index(drop=True)
        return out[list(ACTIVITY_COLUMNS)]

    def label_values(self, label: str, metric: str = "gpulens_gpu_info", within: Filters = NO_FILTERS) -> list[str]:
        df = self._frame_at(metric, self._clock(), self._snapshot())
        df = frames.restrict(df, Filters(**_targets(within)), pd.DataFrame(), ())
        return sorted(set(frames.col(df, label)) - {""})

    def problems(self) -> list[str]:
        with self._lock:
            return [f"{url}: {err}" for url, err in sorted(self._errors.items())]


def _targets(filters: Filters) -> dict[str, str]:
    return filters.target_matchers()
