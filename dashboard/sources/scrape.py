"""MetricSource that scrapes exporters' /metrics itself and keeps a bounded in-memory history.

For the demo and single nodes, where no Prometheus runs. Values at a step follow Prometheus'
rules closely enough to share the pages: the newest scrape at or before the step, not older than
the lookback, and a series absent from that scrape is absent (stale) at that step.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from urllib.parse import urlsplit

import numpy as np
import pandas as pd
import requests
from prometheus_client.parser import text_string_to_metric_families

from dashboard import definitions, jobs
from dashboard.frames.columns import aggregate, col, restrict, with_cols
from dashboard.frames.health import first_events
from dashboard.frames.jobs import POD_LEAF_KEYS, job_leaf_figures, job_leaf_rows, jobs_within, keyed
from dashboard.frames.series import counter_rate
from dashboard.sources.scrape_history import (
    MAX_SAMPLES,
    Labels,
    Snapshot,
    TargetHistory,
    frame,
    of_device,
    of_metric,
    reduced,
)
from dashboard.sources.scrape_verdicts import VerdictCache, settled_before
from dashboard.sources.source import (
    ACTIVITY_COLUMNS,
    ALLOCATION,
    ALLOCATION_KEYS,
    DEVICE_METRICS,
    HISTORY_METRIC,
    IDLE_SINCE_COLUMNS,
    JOB_CLASS_COLUMNS,
    JOB_LEAF_COLUMNS,
    JOB_MIX_COLUMNS,
    JOB_SERIES_COLUMNS,
    JOB_STRAGGLER_COLUMNS,
    LOOKBACK_SECONDS,
    NO_FILTERS,
    SLOWDOWN_REASONS,
    SM_ACTIVE,
    Filters,
    JobKey,
    Window,
    device_keys,
    held_step,
    rate_steps,
)


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
    """Scrapes ``urls`` every ``interval_s`` on a daemon thread, keeping ``history`` scrapes each
    and ``max_samples`` values over all targets (dashboard.sources.scrape_history: a large fleet keeps a
    shorter history, not more memory)."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        interval_s: float = 5.0,
        history: int = 720,
        max_samples: int = MAX_SAMPLES,
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
        self._history: dict[str, TargetHistory] = {u: TargetHistory(instance_of(u), history) for u in self.urls}
        for h in self._history.values():
            h.max_samples = max(1, max_samples // len(self.urls))
        self._errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()
        self._session = requests.Session()
        self._verdicts = VerdictCache()

    @property
    def description(self) -> str:
        return f"direct scrape of {len(self.urls)} exporter(s), {self.kept()}"

    def kept(self) -> str:
        """What the bounded history holds now, e.g. ``history 14m 35s: 176 scrapes of 61,250 series``."""
        with self._lock:
            spans = [
                (h.scrapes[-1].timestamp - h.scrapes[0].timestamp, len(h.scrapes))
                for h in self._history.values()
                if h.scrapes
            ]
            series = sum(len(h.scrapes[-1].values) for h in self._history.values() if h.scrapes)
        if not spans:
            return "no scrape yet"
        span, n = min(spans)
        return f"history {_duration(span)}: {n} scrapes of {series:,} series"

    def samples_kept(self) -> int:
        """Values held over all targets (bounded by ``max_samples``)."""
        with self._lock:
            return sum(h.samples for h in self._history.values())

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
                text = self._fetch(url)
                with self._lock:
                    self._history[url].add(now, text)
                    self._errors.pop(url, None)
            except requests.ConnectionError:
                self._failed(url, now, "connection refused or host unreachable")
            except requests.Timeout:
                self._failed(url, now, f"no answer within {self.timeout_s:g} s")
            except Exception as exc:  # any failure of one target must not stop the others
                self._failed(url, now, f"{type(exc).__name__}: {str(exc)[:200]}")

    def _failed(self, url: str, now: float, why: str) -> None:
        with self._lock:
            self._errors[url] = why
            self._history[url].failed(now)  # an empty scrape makes its series stale

    def start(self) -> ScrapeSource:
        """Start the background scraper (idempotent, also when called from two threads at once:
        one scraper); the first scrape happens before returning."""
        with self._starting:
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
    def _snapshot(self) -> list[Snapshot]:
        with self._lock:
            return [Snapshot.of(h) for h in self._history.values()]

    @staticmethod
    def _on_grid(hist: list[Snapshot], grid: Sequence[float]) -> list[tuple[Snapshot, np.ndarray, np.ndarray]]:
        """Per target, the scrape each grid time reads (the newest within the lookback), stamped
        with the grid time."""
        g = np.asarray(grid, dtype=np.float64)
        out = []
        for snap in hist:
            idx = snap.at(g, LOOKBACK_SECONDS)
            ok = idx >= 0
            out.append((snap, idx[ok], g[ok]))
        return out

    @staticmethod
    def _within(hist: list[Snapshot], start: float, end: float) -> list[tuple[Snapshot, np.ndarray, np.ndarray]]:
        """Per target, every scrape taken in [start, end], stamped with its own time."""
        out = []
        for snap in hist:
            idx = np.nonzero((snap.times >= start) & (snap.times <= end))[0]
            out.append((snap, idx, snap.times[idx]))
        return out

    def _frame_at(self, metric: str, at: float, hist: list[Snapshot]) -> pd.DataFrame:
        return frame(of_metric(metric), self._on_grid(hist, [at]), time=False)

    def _end(self, end: float | None) -> float:
        """The range's end: ``end`` (an absolute range), never later than now; None = now."""
        now = self._clock()
        return now if end is None else min(end, now)

    def _grid(self, window: Window, step_s: float, end_at: float | None = None) -> tuple[list[float], float]:
        seconds, step = window.stepped(max(step_s, self.interval_s))
        # ends at now, not at a multiple of the step like Prometheus: the history may be younger
        # than one step, and the newest scrape is the one a user wants to see
        end = self._end(end_at)
        n = int(seconds // step)
        return [end - k * step for k in range(n, -1, -1)], step

    def _steps(self, window: Window, step_s: float, end: float) -> tuple[list[float], float]:
        """The steps of Prometheus' [window:step] subquery at ``end``: multiples of the step back to,
        not including, the range's start (so both sources integrate the same number of steps, and
        a range read again reads the same settled times), the last one moved to ``end`` itself
        when ``end`` is not a multiple (the newest scrape is the one a user wants to see)."""
        seconds, step = window.stepped(max(step_s, self.interval_s))
        n = max(1, int(seconds // step))
        top = math.floor(end / step)
        grid = [(top - k) * step for k in range(n - 1, -1, -1)]
        if grid[-1] < end:
            grid = [*grid[1:], end]
        return grid, step

    def _series_raw(self, metric: str, grid: list[float], hist: list[Snapshot]) -> pd.DataFrame:
        return frame(of_metric(metric), self._on_grid(hist, grid), time=True)

    def instant(
        self, metric: str, filters: Filters = NO_FILTERS, *, by: Sequence[str] | None = None, end: float | None = None
    ) -> pd.DataFrame:
        hist = self._snapshot()
        now = self._end(end)
        return self._filtered(self._frame_at(metric, now, hist), metric, filters, by, now, hist)

    def current_state(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        only: tuple[str, str] | None = None,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        df = self.instant(metric, filters, end=end)
        if df.empty:
            return df
        keep = df["value"] == 1
        if only:
            keep &= col(df, only[0]) == only[1]
        df = df[keep]
        if by is not None:  # as the store's max by: the labels present of ``by``, each set once
            labels = [k for k in by if k in df.columns]
            df = df[[*labels, "value"]].drop_duplicates(labels)
        return df.reset_index(drop=True)

    def series(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        window: Window,
        step_s: float,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        hist = self._snapshot()
        grid, _ = self._grid(window, step_s, end)
        df = self._series_raw(metric, grid, hist)
        alloc = self._series_raw(ALLOCATION, grid, hist) if filters.namespace else pd.DataFrame()
        return aggregate(restrict(df, filters, alloc, device_keys(metric)), by)

    def rate(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        window: Window,
        step_s: float,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        hist = self._snapshot()
        grid, step = self._grid(window, step_s, end)
        # each series' rate over the same window as Prometheus' (RATE_WINDOW_MIN_SECONDS at least),
        # before the filters and the sum, as Prometheus sums per-series rates: a reset on one GPU
        # must not read as a fleet-wide drop
        raw = frame(of_metric(metric), self._on_grid(hist, grid), time=True, series_id=True)
        df = counter_rate(raw, key="_series", steps=rate_steps(step)).drop(columns=["_series"], errors="ignore")
        alloc = self._series_raw(ALLOCATION, grid, hist) if filters.namespace else pd.DataFrame()
        return aggregate(restrict(df, filters, alloc, device_keys(metric)), by)

    def increase(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        window: Window,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        hist = self._snapshot()
        now = self._end(end)
        df = reduced(of_metric(metric), self._within(hist, now - window.bounded(), now), "increase")
        return self._filtered(df, metric, filters, by, now, hist)

    def events(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        window: Window,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        hist = self._snapshot()
        now = self._end(end)
        start = now - window.bounded()
        grown = reduced(of_metric(metric), self._within(hist, start, now), "increase")
        df = first_events(grown, self._frame_at(metric, now, hist), self._frame_at(metric, start, hist),
                                 self._frame_at("gpulens_up", start, hist))  # fmt: skip
        return self._filtered(df, metric, filters, by, now, hist)

    def _raw(
        self,
        metric: str,
        hist: list[Snapshot],
        start: float,
        end: float,
        labels: Sequence[str] | None = None,
        where: tuple[str, str] | None = None,
    ) -> pd.DataFrame:
        """Every sample of ``metric`` scraped in [start, end], with its scrape's timestamp (only
        the ``labels`` columns when given, only the series whose label is ``where`` says)."""
        return frame(of_metric(metric, labels, where), self._within(hist, start, end), time=True)

    def _idle_at(
        self, grid: Sequence[float], hist: list[Snapshot], filters: Filters, gpus: frozenset[str] | None = None
    ) -> pd.DataFrame:
        """dashboard.definitions' idle verdict per leaf at each grid time (the rules' gpu_idle:bool),
        settled times from the cache (dashboard.sources.scrape_verdicts); with ``gpus``, only the leaves of
        those GPU UUIDs (a leaf's verdict reads its own series only: the same as in the whole fleet's)."""
        verdict = self._verdicts.verdicts(
            lambda start, end: self._within(hist, start, end),
            grid,
            hist,
            Filters(**_targets(filters)),
            self._fresh_s(),
        )
        return _of_gpus(verdict, gpus).reset_index(drop=True)

    def mean(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        window: Window,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        hist = self._snapshot()
        now = self._end(end)
        df = reduced(of_metric(metric), self._within(hist, now - window.bounded(), now), "mean")
        if df.empty:
            return pd.DataFrame(columns=["value"])
        return self._filtered(df, metric, filters, by, now, hist)

    def _filtered(
        self,
        df: pd.DataFrame,
        metric: str,
        filters: Filters,
        by: Sequence[str] | None,
        now: float,
        hist: list[Snapshot],
    ) -> pd.DataFrame:
        """``df`` (values of ``metric`` at ``now``) under ``filters``, summed ``by``."""
        alloc = self._frame_at(ALLOCATION, now, hist) if filters.namespace else pd.DataFrame()
        return aggregate(restrict(df, filters, alloc, device_keys(metric)), by)

    def device_series(self, uuid: str, *, window: Window, step_s: float, end: float | None = None) -> pd.DataFrame:
        hist = self._snapshot()
        grid, _ = self._grid(window, step_s, end)
        return frame(of_device(_DEVICE, uuid), self._on_grid(hist, grid), time=True)

    def _evaluated(self, end: float | None, hist: list[Snapshot]) -> float:
        """When the idle verdict of a range ending at ``end`` is read: ``end`` itself when given.
        For now, the last evaluation, as a Prometheus reader sees its rules': the newest multiple
        of the scrape interval at which every target has been scraped (the time they all were, in
        a history younger than that). That verdict is settled and kept (dashboard.sources.scrape_verdicts),
        so every page of those seconds reads the same one, its counts and its names alike. Now
        itself while the scrapes lag (the last evaluation would be older than
        EVALUATION_LAG_MAX_SECONDS)."""
        now = self._end(end)
        settled = settled_before(hist)
        if end is not None or not math.isfinite(settled):
            return now
        at = math.floor(settled / self.interval_s) * self.interval_s
        first = max(float(s.times[0]) for s in hist)
        if at < first:  # before a target's first scrape: at it, so that every target's samples are in
            at = first
        return at if 0.0 <= now - at <= EVALUATION_LAG_MAX_SECONDS else now

    def leaf_idle(self, filters: Filters = NO_FILTERS, *, end: float | None = None) -> pd.DataFrame:
        hist = self._snapshot()
        idle = self._idle_at([self._evaluated(end, hist)], hist, filters)
        out = idle.assign(value=idle["idle"].astype(float))[[*definitions.LEAF, "sm_mean", "value"]]
        return out.reset_index(drop=True)

    def window_ages(
        self, metric: str, by: Sequence[str], filters: Filters = NO_FILTERS, *, end: float | None = None
    ) -> pd.DataFrame:
        hist = self._snapshot()
        at = self._evaluated(end, hist)
        # from a scrape before the window on: a series older than the window reads all of it
        start = at - definitions.MEAN_WINDOW_SECONDS - 2 * self.interval_s
        raw = self._raw(metric, hist, start, at, labels=tuple(dict.fromkeys([*by, "instance", "node", "cluster"])))
        raw = restrict(raw, Filters(**_targets(filters)), pd.DataFrame(), ())
        return definitions.window_ages_frame(raw, by, at)

    def allocation_activity(
        self, filters: Filters = NO_FILTERS, *, window: Window, step_s: float, end: float | None = None
    ) -> pd.DataFrame:
        hist = self._snapshot()
        return self._activity(filters, window, step_s, self._evaluated(end, hist), hist)[0]

    def _activity(
        self, filters: Filters, window: Window, step_s: float, end: float, hist: list[Snapshot]
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """allocation_activity over the range ending at ``end``, and the idle verdict it read (per
        held leaf and step, the range's end included)."""
        grid, step = self._steps(window, step_s, end)
        target = Filters(**_targets(filters))
        alloc = restrict(self._series_raw(ALLOCATION, grid, hist), target, pd.DataFrame(), ())
        if alloc.empty:
            return pd.DataFrame(columns=list(ACTIVITY_COLUMNS)), pd.DataFrame(
                columns=[*definitions.LEAF, "timestamp", "idle"]
            )
        now = grid[-1]
        info = self._frame_at("gpulens_gpu_info", now, hist)
        mig = self._frame_at("gpulens_mig_instance_info", now, hist)
        # the verdict of the leaves held in the range only: the others' would join no row
        verdict = self._idle_at(grid, hist, filters, frozenset(alloc["uuid"]))
        out = definitions.wasted_from_series(
            alloc, verdict, definitions.gpu_shares(info, mig), keys=ALLOCATION_KEYS, step_s=step
        )
        if filters.namespace:
            out = out[out["namespace"] == filters.namespace].reset_index(drop=True)
        return out[list(ACTIVITY_COLUMNS)], verdict

    def idle_since(
        self, filters: Filters = NO_FILTERS, *, window: Window, step_s: float, end: float | None = None
    ) -> pd.DataFrame:
        # the activity's own verdict at the range's end picks the idle leaves: one pass over the
        # history (a second verdict of every leaf at the end was a third of Fleet's time at 1,000 GPUs)
        hist = self._snapshot()
        now = self._evaluated(end, hist)
        activity, verdict = self._activity(filters, window, step_s, now, hist)
        at_end = verdict["timestamp"].to_numpy() == now
        idle = verdict.loc[at_end & verdict["idle"].astype("boolean").fillna(False).to_numpy(), ["uuid", "mig_uuid"]]
        out = activity.merge(idle.drop_duplicates(), on=["uuid", "mig_uuid"], how="inner")
        return out[list(IDLE_SINCE_COLUMNS)].reset_index(drop=True)

    # --- jobs (dashboard/jobs.py): the rules of group gpulens.jobs, from raw samples -----------
    def _fresh_s(self) -> float:
        """How old a target's newest sample may be to count as present (the rules' ``and x``)."""
        return max(2.5 * self.interval_s, self.interval_s + self.timeout_s)

    def _over_window(
        self,
        metric: str,
        hist: list[Snapshot],
        end: float,
        keys: Sequence[str],
        where: tuple[str, str] | None = None,
    ) -> pd.DataFrame:
        """Per ``keys``, the statistics of ``metric``'s samples over the rules' window ending at
        ``end`` (definitions._window_stats: mean, max, last value), only where the series is still
        scraped (``avg_over_time(x[5m]) and x``)."""
        raw = self._raw(metric, hist, end - definitions.MEAN_WINDOW_SECONDS, end, labels=tuple(keys), where=where)
        stats = definitions._window_stats(
            with_cols(raw, keys), list(keys), np.asarray([end]), definitions.MEAN_WINDOW_SECONDS, self._fresh_s()
        )
        return stats[stats["fresh"]].reset_index(drop=True)

    def _job_class_shares(self, hist: list[Snapshot], end: float) -> pd.DataFrame:
        """Per pod leaf and class, the share of the window the pod's class was that class (the
        rules' ``max by (cluster, namespace, pod, uuid, mig_uuid, class) (avg_over_time(...) and ...)``)."""
        keys = [*POD_LEAF_KEYS, "class"]
        stats = self._over_window("gpulens_pod_gpu_boundness", hist, end, keys)
        return keyed(stats.rename(columns={"mean": "value"}), keys, "value")

    def job_leaves(
        self,
        filters: Filters = NO_FILTERS,
        *,
        window: Window | None = None,
        end: float | None = None,
        job: JobKey | None = None,
    ) -> pd.DataFrame:
        out = self._job_leaves(filters, window=window, end=end)
        if job is None or out.empty:
            return out
        # scrape mode names no cluster: a job's key has cluster "" here
        mine = np.ones(len(out), dtype=bool)
        for k, v in zip(jobs.JOB, job, strict=True):
            mine &= (out[k].astype(str) == v).to_numpy()
        return out[mine].reset_index(drop=True)

    def _job_leaves(self, filters: Filters, *, window: Window | None, end: float | None) -> pd.DataFrame:
        held_over = window if window is not None and window.seconds else None  # held_hours' range
        hist = self._snapshot()
        now = self._evaluated(end, hist)  # the settled evaluation: every jobs read of these seconds agrees
        leaves = job_leaf_rows(self._frame_at(ALLOCATION, now, hist))
        if leaves.empty:
            return pd.DataFrame(columns=[*JOB_LEAF_COLUMNS, *(["held_hours"] if held_over else [])])
        leaf = list(definitions.LEAF)
        idle = self._idle_at([self._evaluated(end, hist)], hist, NO_FILTERS)
        activity = idle.rename(columns={"sm_mean": "value"})[[*leaf, "value"]]

        def raw(metric: str) -> pd.DataFrame:
            return self._raw(metric, hist, now - definitions.MEAN_WINDOW_SECONDS, now, labels=leaf)

        grid = np.asarray([now])
        busy = definitions._integral_mean_frame(
            raw("gpulens_gpu_busy_ratio"), raw("gpulens_gpu_busy_seconds_total"), leaf, grid, self._fresh_s()
        ).rename(columns={"mean": "value"})
        classes = self._job_class_shares(hist, now)
        communication = classes[classes["class"] == jobs.COMMUNICATION]
        used = self._over_window("gpulens_gpu_memory_used_bytes", hist, now, leaf)
        total = self._over_window("gpulens_gpu_memory_total_bytes", hist, now, leaf)
        memory = used[[*leaf, "max"]].merge(total[[*leaf, "v1"]], on=leaf)
        clock = self._over_window("gpulens_gpu_sm_clock_hertz", hist, now, ["uuid"])
        clock_max = self._over_window("gpulens_gpu_sm_clock_max_hertz", hist, now, ["uuid"])
        clock = clock[["uuid", "mean"]].merge(clock_max[["uuid", "v1"]], on="uuid")
        slowdown, reasons = self._slowdown(hist, now)
        info = self._frame_at("gpulens_gpu_info", now, hist)
        shares = definitions.gpu_shares(info, self._frame_at("gpulens_mig_instance_info", now, hist))
        out = job_leaf_figures(
            leaves,
            activity=activity,
            busy=busy,
            communication=communication,
            memory_ratio=memory.assign(value=memory["max"] / memory["v1"].where(memory["v1"] > 0)),
            memory_total=total.rename(columns={"v1": "value"}),
            sm_clock_ratio=clock.assign(value=clock["mean"] / clock["v1"].where(clock["v1"] > 0)),
            slowdown=slowdown,
            reasons=reasons,
            gpus=info,
            shares=pd.DataFrame(
                [{"uuid": u, "mig_uuid": m, "value": v} for (u, m), v in shares.items()], columns=[*leaf, "value"]
            ),
            held=self._held_hours(hist, held_over, now) if held_over is not None else None,
        )
        return jobs_within(out, filters)

    def job_summary(
        self, filters: Filters = NO_FILTERS, *, window: Window | None = None, end: float | None = None
    ) -> pd.DataFrame:
        leaves = self.job_leaves(filters, end=end)
        if window is None or not window.seconds or leaves.empty:
            return jobs.job_summary(leaves)
        hist = self._snapshot()
        now = self._evaluated(end, hist)  # the settled evaluation: every jobs read of these seconds agrees
        seconds, step = held_step(window)
        grid, step = self._grid(Window(seconds), step, now)
        grid = grid[1:] if len(grid) > 1 else grid
        held = jobs.name_jobs(self._series_raw(ALLOCATION, grid, hist))
        info = self._frame_at("gpulens_gpu_info", now, hist)
        shares = definitions.gpu_shares(info, self._frame_at("gpulens_mig_instance_info", now, hist))
        if not held.empty:
            keys = zip(held["uuid"].astype(str), held["mig_uuid"].astype(str), strict=True)
            held["gpu_share"] = [shares.get(k, 1.0) for k in keys]
        return jobs.job_summary(leaves, jobs.gpu_hours(held, step))

    def job_stragglers(self, filters: Filters = NO_FILTERS, *, end: float | None = None) -> pd.DataFrame:
        return jobs.stragglers(self.job_leaves(filters, end=end)).reindex(columns=list(JOB_STRAGGLER_COLUMNS))

    def _slowdown(self, hist: list[Snapshot], end: float) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Per GPU, the share of the window's scrapes in which any of SLOWDOWN_REASONS held its
        clocks down (uuid, value), and the reasons that did at some scrape (uuid, reason)."""
        start = end - definitions.MEAN_WINDOW_SECONDS
        labels = ("uuid", "reason")
        parts = [self._raw(EVENTS, hist, start, end, labels=labels, where=("reason", r)) for r in SLOWDOWN_REASONS]
        raw = _rows(parts)
        if raw.empty:
            return pd.DataFrame(columns=["uuid", "value"]), pd.DataFrame(columns=["uuid", "reason"])
        raw = with_cols(raw, ["uuid", "reason"])
        # one sample per scrape: 1 when any reason held then
        anyone = raw.groupby(["uuid", "timestamp"], as_index=False)["value"].max()
        stats = definitions._window_stats(
            anyone, ["uuid"], np.asarray([end]), definitions.MEAN_WINDOW_SECONDS, self._fresh_s()
        )
        stats = stats[stats["fresh"]].rename(columns={"mean": "value"})[["uuid", "value"]]
        held = raw[raw["value"] >= 0.5][["uuid", "reason"]].drop_duplicates()
        return stats, held

    def _held_hours(self, hist: list[Snapshot], window: Window, end: float) -> pd.DataFrame:
        """Hours each pod held each leaf over the range: the steps of a ``[window:step]`` subquery
        (sources.source.held_step) at which it held it, times the step."""
        seconds, step = held_step(window)
        grid, step = self._grid(Window(seconds), step, end)
        grid = grid[1:] if len(grid) > 1 else grid
        alloc = self._series_raw(ALLOCATION, grid, hist)
        keys = list(POD_LEAF_KEYS)
        if alloc.empty:
            return pd.DataFrame(columns=[*keys, "value"])
        named = jobs.name_jobs(alloc)
        steps = named.groupby(keys, as_index=False)["timestamp"].nunique()
        return steps.assign(value=steps["timestamp"] * step / 3600.0)[[*keys, "value"]]

    def job_classes(self, filters: Filters = NO_FILTERS, *, end: float | None = None) -> pd.DataFrame:
        hist = self._snapshot()
        now = self._evaluated(end, hist)  # the settled evaluation: every jobs read of these seconds agrees
        leaves = job_leaf_rows(self._frame_at(ALLOCATION, now, hist))
        shares = self._job_class_shares(hist, now).rename(columns={"value": "share"})
        if leaves.empty or shares.empty:
            return pd.DataFrame(columns=list(JOB_CLASS_COLUMNS))
        out = leaves.merge(shares, on=list(POD_LEAF_KEYS), how="inner")
        return jobs_within(out, filters)[list(JOB_CLASS_COLUMNS)]

    def job_mix(self, filters: Filters = NO_FILTERS, *, end: float | None = None) -> pd.DataFrame:
        mix = jobs.job_mix(self.job_classes(filters, end=end))
        return mix[list(JOB_MIX_COLUMNS)] if not mix.empty else pd.DataFrame(columns=list(JOB_MIX_COLUMNS))

    def job_series(
        self,
        job: JobKey,
        instances: Sequence[str],
        *,
        window: Window,
        step_s: float,
        end: float | None = None,
    ) -> pd.DataFrame:
        hist = self._snapshot()
        grid, _ = self._grid(window, step_s, end)
        wanted = set(instances)

        def on_grid(metric: str) -> pd.DataFrame:
            df = self._series_raw(metric, grid, hist)
            return df[col(df, "instance").isin(wanted)] if wanted and not df.empty else df

        alloc = on_grid(ALLOCATION)
        if alloc.empty:
            return pd.DataFrame(columns=list(JOB_SERIES_COLUMNS))
        # the job's leaves at each step (gpulens:job_leaf:info of the job over the range)
        sel = jobs.name_jobs(alloc)
        for key, value in zip(jobs.JOB, job, strict=True):
            sel = sel[sel[key] == value]
        held_at = sel[[*POD_LEAF, "timestamp"]].drop_duplicates()
        leaf_at = held_at[["uuid", "mig_uuid", "timestamp"]].drop_duplicates()
        parts = []
        for metric, name in ((SM_ACTIVE, "sm_active"), ("gpulens_gpu_busy_ratio", "busy")):
            df = with_cols(on_grid(metric), ["uuid", "mig_uuid"])
            parts.append(df.merge(leaf_at, on=["uuid", "mig_uuid", "timestamp"]).assign(metric=name, pod=""))
        clock = with_cols(on_grid("gpulens_gpu_sm_clock_hertz"), ["uuid"])
        top = with_cols(on_grid("gpulens_gpu_sm_clock_max_hertz"), ["uuid"])
        if not clock.empty and not top.empty:
            ratio = clock[["uuid", "timestamp", "value"]].merge(
                top[["uuid", "timestamp", "value"]].rename(columns={"value": "max"}), on=["uuid", "timestamp"]
            )
            ratio = ratio.assign(value=ratio["value"] / ratio["max"].where(ratio["max"] > 0))
            physical = leaf_at.drop(columns=["mig_uuid"]).drop_duplicates()
            parts.append(ratio.merge(physical, on=["uuid", "timestamp"]).assign(metric="sm_clock", pod="", mig_uuid=""))
        classes = with_cols(on_grid("gpulens_pod_gpu_boundness"), [*POD_LEAF, "class"])
        if not classes.empty:
            classes = classes[classes["value"] >= 0.5]
            parts.append(classes.merge(held_at, on=[*POD_LEAF, "timestamp"]).assign(metric="class"))
        out = _rows(parts)
        out = with_cols(out, JOB_SERIES_COLUMNS)
        return out[list(JOB_SERIES_COLUMNS)].reset_index(drop=True)

    def history_start(
        self,
        metric: str = HISTORY_METRIC,
        filters: Filters = NO_FILTERS,
        *,
        window: Window,
        end: float | None = None,
    ) -> float:
        # this source computes the rules from the raw series: their history is the GPUs'
        raw = HISTORY_METRIC if ":" in metric else metric
        stop = self._end(end)
        df = self._raw(raw, self._snapshot(), stop - window.seconds, stop, labels=("cluster", "node", "instance"))
        df = restrict(df, Filters(**_targets(filters)), pd.DataFrame(), ())
        return float(df["timestamp"].min()) if not df.empty else math.nan

    def label_values(self, label: str, metric: str = "gpulens_gpu_info", within: Filters = NO_FILTERS) -> list[str]:
        df = self._frame_at(metric, self._clock(), self._snapshot())
        df = restrict(df, Filters(**_targets(within)), pd.DataFrame(), ())
        return sorted(set(col(df, label)) - {""})

    def problems(self) -> list[str]:
        with self._lock:
            return [f"{url}: {err}" for url, err in sorted(self._errors.items())]


_RUNNING: dict[tuple[tuple[str, ...], float, float], ScrapeSource] = {}
_RUNNING_LOCK = threading.Lock()


def running(urls: Sequence[str], *, interval_s: float, timeout_s: float) -> ScrapeSource:
    """The process's one ScrapeSource of ``urls``, started by its first caller (the first scrape
    done when it returns). dashboard.server calls it as the dashboard starts, so that the history
    begins then, not when a browser first opens a page: a page opened then would judge the last
    5 minutes (idle, launch-bound, slow GPUs) on one scrape, and a moment between two bursts of a
    GPU reads as idle SMs. The page's source (dashboard.ui) is the same object."""
    key = (tuple(urls), float(interval_s), float(timeout_s))
    with _RUNNING_LOCK:
        src = _RUNNING.get(key)
        if src is None:
            src = _RUNNING[key] = ScrapeSource(urls, interval_s=interval_s, timeout_s=timeout_s)
    return src.start()


_DEVICE = re.compile(DEVICE_METRICS)
EVENTS = "gpulens_gpu_clock_event_active"
POD_LEAF = ["namespace", "pod", "uuid", "mig_uuid"]
"""A pod's leaf within a target (the cluster is the target's)."""


EVALUATION_LAG_MAX_SECONDS = 60.0
"""Oldest the idle verdict read as "now" may be: Prometheus' default rule evaluation interval (a
Prometheus reader's verdict is up to one evaluation old)."""


def _of_gpus(df: pd.DataFrame, gpus: frozenset[str] | None) -> pd.DataFrame:
    """``df``'s rows whose ``uuid`` is one of ``gpus`` (all of them when ``gpus`` is None)."""
    if gpus is None or df.empty or "uuid" not in df.columns:
        return df
    return df[df["uuid"].isin(gpus)]


def _rows(parts: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """The rows of ``parts`` in one frame (the empty ones left out: pandas warns on concatenating them)."""
    kept = [df for df in parts if not df.empty]
    return pd.concat(kept, ignore_index=True) if kept else pd.DataFrame(columns=["timestamp", "value"])


def _duration(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}h {m % 60:02d}m" if m >= 60 else f"{m}m {s:02d}s" if m else f"{s}s"


def _targets(filters: Filters) -> dict[str, str]:
    return filters.target_matchers()
