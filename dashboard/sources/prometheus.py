"""MetricSource over the Prometheus HTTP API (works with any PromQL backend: Thanos, Mimir, VM).

Queries are built only from catalogue metric names, validated label names and quoted label
values (dashboard.promql); windows and steps are bounded; every call has a timeout.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pandas as pd
import requests

from dashboard import definitions, jobs
from dashboard.frames.columns import col, from_rows, with_cols
from dashboard.frames.jobs import POD_LEAF_KEYS, job_leaf_figures, job_summary_figures, straggler_figures
from dashboard.promql import by_clause, duration, label_name, quote, selector, subquery_range
from dashboard.sources.prometheus_auth import PrometheusAuth
from dashboard.sources.source import (
    ACTIVITY_COLUMNS,
    ALLOCATION,
    ALLOCATION_KEYS,
    DEVICE_METRICS,
    HISTORY_METRIC,
    HISTORY_STEPS,
    IDLE_SINCE_COLUMNS,
    JOB_CLASS_COLUMNS,
    JOB_LEAF_COLUMNS,
    JOB_MIX_COLUMNS,
    JOB_SERIES_COLUMNS,
    JOB_STRAGGLER_COLUMNS,
    NO_FILTERS,
    POD_DEVICE_KEYS,
    RATE_WINDOW_MIN_SECONDS,
    SLOWDOWN_REASONS,
    SLOWDOWN_SAMPLE_SECONDS,
    SM_ACTIVE,
    Filters,
    JobKey,
    SourceError,
    Window,
    device_keys,
    has_namespace,
    held_step,
)


class PrometheusSource:
    """Reads gpulens series from a Prometheus-compatible HTTP API at ``base_url``, authenticating
    as ``auth`` says (bearer token, basic auth, TLS CA, client certificate, extra headers)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 10.0,
        auth: PrometheusAuth | None = None,
        session: requests.Session | None = None,
        clock: Any = time.time,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        auth = auth or PrometheusAuth()
        self._session = session or auth.session()
        self._tls = auth.tls_options()
        self._clock = clock
        self.cooldown_s = min(timeout_s, 10.0)
        self._down_until = 0.0
        self._down_reason = ""

    @property
    def description(self) -> str:
        return f"Prometheus {self.base_url}"

    # --- query text ------------------------------------------------------------------
    def expr(self, metric: str, filters: Filters = NO_FILTERS, own: dict[str, str] | None = None) -> str:
        """The filtered selector for ``metric`` (namespace applied through the allocation join);
        ``own``: matchers of the series' own labels besides."""
        matchers = filters.target_matchers()
        if filters.namespace and has_namespace(metric):
            return selector(metric, {**matchers, **(own or {}), "namespace": filters.namespace})
        keys = device_keys(metric)
        if filters.namespace and keys:
            alloc = selector(ALLOCATION, {**matchers, "namespace": filters.namespace})
            return f"({selector(metric, {**matchers, **(own or {})})} and on{by_clause(keys)} {alloc})"
        return selector(metric, {**matchers, **(own or {})})

    @staticmethod
    def _sum_by(expr: str, by: Sequence[str] | None) -> str:
        return expr if by is None else f"sum by {by_clause(by)} ({expr})"

    # --- HTTP --------------------------------------------------------------------------
    def _call(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        # After a timeout or a refused connection, fail fast for a short cooldown: a page sends
        # a dozen queries and should show its banner after one timeout, not after twelve.
        if time.monotonic() < self._down_until:
            raise SourceError(self._down_reason)
        url = f"{self.base_url}{path}"
        try:
            resp = self._session.post(url, data=params, timeout=self.timeout_s, **self._tls)
        except requests.Timeout as exc:
            raise self._down(f"Prometheus at {self.base_url} did not answer within {self.timeout_s:g} s") from exc
        except requests.exceptions.SSLError as exc:
            raise self._down(f"TLS with Prometheus at {self.base_url} failed: {_reason(exc)}") from exc
        except requests.RequestException as exc:
            raise self._down(f"Prometheus at {self.base_url} is unreachable: {type(exc).__name__}") from exc
        except (OSError, ValueError) as exc:  # a credentials file that vanished or emptied
            raise SourceError(f"cannot read the Prometheus credentials: {exc}") from exc
        if resp.status_code in (401, 403):
            raise SourceError(
                f"Prometheus at {self.base_url} refused the request (HTTP {resp.status_code}): check the "
                "--prometheus-* authentication flags"
            )
        try:
            body = resp.json()
        except ValueError as exc:
            raise SourceError(f"Prometheus at {self.base_url} answered HTTP {resp.status_code} without JSON") from exc
        if resp.status_code != 200 or body.get("status") != "success":
            err = str(body.get("error", "")) or f"HTTP {resp.status_code}"
            raise SourceError(f"Prometheus query failed: {err[:300]}")
        data = body.get("data")
        if not isinstance(data, dict):
            raise SourceError("Prometheus answered without a data object")
        return data

    def _down(self, reason: str) -> SourceError:
        self._down_reason = reason
        self._down_until = time.monotonic() + self.cooldown_s
        return SourceError(reason)

    def query(self, promql: str, at: float | None = None) -> pd.DataFrame:
        """An instant query; a frame of labels + value (``__name__`` dropped)."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._call("/api/v1/query", params)
        kind = data.get("resultType")
        result = data.get("result") or []
        if kind == "scalar":
            return from_rows([{"value": _num(result[1])}])
        rows = []
        for item in result:
            labels = {k: v for k, v in (item.get("metric") or {}).items() if k != "__name__"}
            rows.append({**labels, "value": _num(item["value"][1])})
        return from_rows(rows)

    def query_labels(self, promql: str, labels: Sequence[str], at: float | None = None) -> pd.DataFrame:
        """An instant query read into ``labels`` (``""`` where a series lacks one) and ``value``,
        column by column: the per-leaf queries of a 10,000-GPU fleet answer 10,000 series each,
        and a frame built from one dict per series costs several times more."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._call("/api/v1/query", params)
        result = data.get("result") or [] if data.get("resultType") == "vector" else []
        metrics = [item.get("metric") or {} for item in result]
        cols: dict[str, object] = {name: [m.get(name, "") for m in metrics] for name in labels}
        cols["value"] = pd.to_numeric([_num(item["value"][1]) for item in result], errors="coerce")
        return pd.DataFrame(cols, columns=[*labels, "value"])

    def _end(self, end: float | None) -> float:
        """The range's end: ``end`` (an absolute range), never later than now; None = now."""
        now = float(self._clock())
        return now if end is None else min(end, now)

    def query_range(self, promql: str, *, window: Window, step_s: float, end: float | None = None) -> pd.DataFrame:
        """A range query over ``window`` (bounded) ending at ``end`` (None: now), aligned to the
        step; labels + timestamp + value."""
        seconds, step = window.stepped(step_s)
        end = math.floor(self._end(end) / step) * step
        params = {"query": promql, "start": f"{end - seconds:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        data = self._call("/api/v1/query_range", params)
        rows = []
        for item in data.get("result") or []:
            labels = {k: v for k, v in (item.get("metric") or {}).items() if k != "__name__"}
            for ts, val in item.get("values") or []:
                rows.append({**labels, "timestamp": float(ts), "value": _num(val)})
        return from_rows(rows, time=True)

    # --- MetricSource --------------------------------------------------------------------
    def instant(
        self, metric: str, filters: Filters = NO_FILTERS, *, by: Sequence[str] | None = None, end: float | None = None
    ) -> pd.DataFrame:
        return self.query(self._sum_by(self.expr(metric, filters), by), None if end is None else self._end(end))

    def current_state(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        only: tuple[str, str] | None = None,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        # filtered in the store: at 10,000 GPUs the boundness state set is 60,000 series, 10,000 of
        # them 1; of one state, 10,000 series (the Fleet page's moving data: issue 54)
        expr = f"{self.expr(metric, filters, dict([only]) if only else None)} == 1"
        if by is not None:  # the labels the page reads: a smaller answer to decode and frame
            expr = f"max by {by_clause(by)} ({expr})"
        return self.query(expr, None if end is None else self._end(end))

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
        expr = self._sum_by(self.expr(metric, filters), by)
        if metric == BOUNDNESS and by is not None and list(by) == ["class"] and _fleet_wide(filters):
            # the fleet's mix over time: the recorded per-cluster sum, not every leaf's 6 series
            expr = f"sum by (class) ({selector(FLEET_BOUNDNESS_MIX, filters.target_matchers())})"
        return self.query_range(expr, window=window, step_s=step_s, end=end)

    @staticmethod
    def _own(metric: str, filters: Filters) -> str:
        """The selector of ``metric`` under the filters its own labels can take (target, and the
        namespace where the series has one)."""
        matchers = filters.target_matchers()
        if filters.namespace and has_namespace(metric):
            matchers = {**matchers, "namespace": filters.namespace}
        return selector(metric, matchers)

    def _windowed(self, func: str, metric: str, filters: Filters, over_s: float) -> str:
        """``func(metric[over_s])`` under ``filters`` (namespace through the allocation join)."""
        return self._allocated(f"{func}({self._own(metric, filters)}[{duration(over_s)}])", metric, filters)

    @staticmethod
    def _allocated(inner: str, metric: str, filters: Filters) -> str:
        """``inner`` (an expression over ``metric``'s own selector) kept to the devices allocated in
        the namespace filter, where ``metric`` is a device series without a namespace label."""
        keys = device_keys(metric)
        if filters.namespace and keys and not has_namespace(metric):
            alloc = selector(ALLOCATION, {**filters.target_matchers(), "namespace": filters.namespace})
            return f"({inner} and on{by_clause(keys)} {alloc})"
        return inner

    def _over_time(
        self, func: str, metric: str, filters: Filters, window: Window, by: Sequence[str] | None, end: float | None
    ) -> pd.DataFrame:
        inner = self._windowed(func, metric, filters, window.bounded())
        return self.query(self._sum_by(inner, by), None if end is None else self._end(end))

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
        _, step = window.stepped(step_s)
        # each point the mean over its step, and never over fewer than four scrapes at 15 s
        # (a window of one scrape has no rate): Grafana's $__rate_interval, without asking the
        # store for its scrape interval. Only where the series is a window old (the rules' own
        # "and x offset w"): rate() over a younger one reads its growth over the whole window, a
        # ramp up from 0 in the first minute of every new GPU and of a new Prometheus
        over = max(step, RATE_WINDOW_MIN_SECONDS)
        inner = self._windowed("rate", metric, filters, over)
        inner = f"({inner} and {self._own(metric, filters)} offset {duration(over)})"
        return self.query_range(self._sum_by(inner, by), window=window, step_s=step_s, end=end)

    def increase(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        window: Window,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        return self._over_time("increase", metric, filters, window, by, end)

    def events(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        window: Window,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        events = definitions.counter_events_promql(self._own(metric, filters), duration(window.bounded()))
        inner = self._allocated(events, metric, filters)
        return self.query(self._sum_by(inner, by), None if end is None else self._end(end))

    def mean(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        window: Window,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        return self._over_time("avg_over_time", metric, filters, window, by, end)

    def rule(self, record: str, filters: Filters = NO_FILTERS, *, per_pod: bool) -> str:
        """A selector for the recorded series ``record`` under ``filters``. Per-pod records keep
        node and instance but not cluster: the cluster filter joins through the target's
        ``gpulens_up``."""
        matchers = filters.target_matchers()
        if not per_pod:
            return selector(record, matchers)
        own = {k: v for k, v in matchers.items() if k != "cluster"}
        if filters.namespace:
            own["namespace"] = filters.namespace
        sel = selector(record, own)
        if "cluster" in matchers:
            sel = f"({sel} and on (instance) {selector('gpulens_up', {'cluster': matchers['cluster']})})"
        return sel

    def _held_and_busy(
        self, filters: Filters, window: float, step: float, keep: str = "", uuids: Sequence[str] = ()
    ) -> tuple[str, str]:
        """The PromQL of allocation_activity's ``first_allocated`` (per container and leaf, the
        first step of the [window:step] subquery it held the leaf) and ``last_busy`` (per leaf,
        the last step its idle verdict was 0); ``keep``: an ``on (...) (...)`` set that both are
        cut to (once, at the query's instant: inside the subquery Prometheus would evaluate it at
        every step); ``uuids``: the GPUs whose series the subqueries select (all where empty), so
        that the store reads only theirs."""
        target = filters.target_matchers()
        own = {**target, **({"namespace": filters.namespace} if filters.namespace else {})}
        of = {"uuid": uuids} if uuids else {}
        mine = _regexes_selector(ALLOCATION, own, of)
        idle = _regexes_selector("gpulens:gpu_idle:bool", target, of)
        pod = by_clause(POD_DEVICE_KEYS)
        rng = subquery_range(window, step)
        cut = f" and {keep}" if keep else ""
        return (
            f"min by {pod} (min_over_time(timestamp(max by {pod} ({mine})){rng})){cut}",
            f"max by (uuid,mig_uuid) (max_over_time(timestamp({idle} == 0){rng})){cut}",
        )

    def _at_step(self, queries: Sequence[str], end: float | None, step: float) -> list[pd.DataFrame]:
        """``queries`` side by side (the backend can evaluate them in parallel), at the range's
        step-aligned instant, so that their subqueries' steps are the range query's steps (less
        its first one)."""
        at = math.floor(self._end(end) / step) * step
        with ThreadPoolExecutor(max_workers=min(len(queries), MAX_PARALLEL)) as pool:
            return list(pool.map(lambda q: self.query(q, at), queries))

    def allocation_activity(
        self, filters: Filters = NO_FILTERS, *, window: Window, step_s: float, end: float | None = None
    ) -> pd.DataFrame:
        seconds, step = window.stepped(step_s)
        target = filters.target_matchers()
        mine = selector(ALLOCATION, {**target, **({"namespace": filters.namespace} if filters.namespace else {})})
        # The recording rules hold the definition (dashboard/definitions.py): wasted GPU-equivalents
        # per container and the leaf idle verdict; this only integrates them over the range.
        wasted = self.rule("gpulens:pod_gpu_wasted:gpus", filters, per_pod=True)
        queries = (
            f"max by {by_clause(ALLOCATION_KEYS)} (last_over_time({mine}[{duration(seconds)}]))",
            f"sum by {by_clause(POD_DEVICE_KEYS)} (sum_over_time({wasted}{subquery_range(seconds, step)})) "
            f"* {step:g} / 3600",
            *self._held_and_busy(filters, seconds, step),
        )
        meta, hours, first, last_busy = self._at_step(queries, end, step)
        if meta.empty:
            return pd.DataFrame(columns=list(ACTIVITY_COLUMNS))
        keys = list(POD_DEVICE_KEYS)
        out = with_cols(meta, ALLOCATION_KEYS).drop_duplicates(keys)[list(ALLOCATION_KEYS)]
        hours = with_cols(hours, keys).rename(columns={"value": "wasted_gpu_hours"})
        out = out.merge(hours[[*keys, "wasted_gpu_hours"]], on=keys, how="left")
        out = _with_held_and_busy(out, first, last_busy, how="left")
        out["wasted_gpu_hours"] = out["wasted_gpu_hours"].fillna(0.0)
        return out[list(ACTIVITY_COLUMNS)]

    def idle_since(
        self, filters: Filters = NO_FILTERS, *, window: Window, step_s: float, end: float | None = None
    ) -> pd.DataFrame:
        seconds, step = window.stepped(step_s)
        at = self._end(end)
        target = filters.target_matchers()
        # The GPUs with a leaf idle at the range's end first (an instant query); then the
        # subqueries read only their series, MAX_UUIDS_SELECTED GPUs a query (in parallel), not
        # every GPU's over the whole range: at 1,000 GPUs over 24 h, 0.3-0.6 s of Prometheus' time
        # against 0.03-0.1 s a batch (issue 54, docs/benchmarks.md)
        now = self.query_labels(f"{self.rule('gpulens:gpu_idle:bool', filters, per_pod=False)} == 1", ["uuid"], at)
        uuids = sorted(set(now["uuid"].astype(str)))
        if not uuids:
            return pd.DataFrame(columns=list(IDLE_SINCE_COLUMNS))
        batches = [uuids[i : i + MAX_UUIDS_SELECTED] for i in range(0, len(uuids), MAX_UUIDS_SELECTED)]
        queries: list[str] = []
        for batch in batches:
            # only the leaves idle at the range's end itself (``@``: the step-aligned instant may
            # precede it): a MIG instance in use beside an idle one of its GPU is left out
            idle_now = _regexes_selector("gpulens:gpu_idle:bool", target, {"uuid": batch})
            queries += self._held_and_busy(filters, seconds, step, f"on (uuid,mig_uuid) ({idle_now} @ {at:.3f} == 1)",
                                           batch)  # fmt: skip
        answers = self._at_step(queries, end, step)
        first, last_busy = _stacked(answers[0::2], POD_DEVICE_KEYS), _stacked(answers[1::2], _LEAF)
        if first.empty:
            return pd.DataFrame(columns=list(IDLE_SINCE_COLUMNS))
        keys = with_cols(first, POD_DEVICE_KEYS)[list(POD_DEVICE_KEYS)]
        return _with_held_and_busy(keys, first, last_busy, how="inner")[list(IDLE_SINCE_COLUMNS)]

    def device_series(self, uuid: str, *, window: Window, step_s: float, end: float | None = None) -> pd.DataFrame:
        seconds, step = window.stepped(step_s)
        stop = math.floor(self._end(end) / step) * step
        promql = f"{{__name__=~{quote(DEVICE_METRICS)},uuid={quote(uuid)}}}"
        params = {"query": promql, "start": f"{stop - seconds:.3f}", "end": f"{stop:.3f}", "step": f"{step:g}"}
        data = self._call("/api/v1/query_range", params)
        rows = []
        for item in data.get("result") or []:
            labels = dict(item.get("metric") or {})
            labels["metric"] = labels.pop("__name__", "")
            for ts, val in item.get("values") or []:
                rows.append({**labels, "timestamp": float(ts), "value": _num(val)})
        return from_rows(rows, time=True)

    def leaf_idle(self, filters: Filters = NO_FILTERS, *, end: float | None = None) -> pd.DataFrame:
        at = None if end is None else self._end(end)
        idle = self.query(f"max by (uuid,mig_uuid) ({self.rule('gpulens:gpu_idle:bool', filters, per_pod=False)})", at)
        sm = self.query(
            f"max by (uuid,mig_uuid) ({self.rule('gpulens:gpu_activity:ratio_avg5m', filters, per_pod=False)})", at
        )
        if idle.empty:
            if not self.query("count(gpulens_gpu_info)").empty:
                raise SourceError(
                    "Prometheus has GPUs but no gpulens:gpu_idle:bool: load the recording rules "
                    "(deploy/rules/gpulens.rules.yml; the Helm chart's PrometheusRule)"
                )
            return pd.DataFrame(columns=["uuid", "mig_uuid", "sm_mean", "value"])
        idle = with_cols(idle, ("uuid", "mig_uuid"))
        sm = with_cols(sm, ("uuid", "mig_uuid")).rename(columns={"value": "sm_mean"})
        out = idle.merge(sm[["uuid", "mig_uuid", "sm_mean"]], on=["uuid", "mig_uuid"], how="left")
        return out[["uuid", "mig_uuid", "sm_mean", "value"]]

    def window_ages(
        self, metric: str, by: Sequence[str], filters: Filters = NO_FILTERS, *, end: float | None = None
    ) -> pd.DataFrame:
        at = self._end(end)
        promql = definitions.window_age_promql(selector(metric, filters.target_matchers()), by, at)
        df = self.query_labels(promql, by, at)
        return df.rename(columns={"value": "age_s"})[[*by, "age_s"]]

    # --- jobs (dashboard/jobs.py): the recorded series of group gpulens.jobs ------------------
    @staticmethod
    def job_selector(
        record: str | Sequence[str],
        filters: Filters,
        matchers: dict[str, str] | None = None,
        uuids: Sequence[str] | None = None,
    ) -> str:
        """The series of job record ``record`` (or of several, a sequence: labels JOB or JOB_LEAF;
        ``matchers`` besides, and of the GPUs ``uuids`` where given) of the jobs ``filters`` select:
        cluster and namespace by the job's own labels; node and instance keep the jobs with a leaf
        there, whole (``and on (JOB)`` the leaves there)."""
        own = {k: v for k, v in (("cluster", filters.cluster), ("namespace", filters.namespace)) if v}
        regexes: dict[str, Sequence[str]] = {"uuid": uuids} if uuids else {}
        if not isinstance(record, str):
            regexes["__name__"], record = list(record), ""
        sel = _regexes_selector(record, {**own, **(matchers or {})}, regexes)
        there = {k: v for k, v in (("node", filters.node), ("instance", filters.instance)) if v}
        if not there:
            return sel
        return f"({sel} and on {by_clause(jobs.JOB)} {selector('gpulens:job_leaf:info', {**own, **there})})"

    def _job_queries(
        self, filters: Filters, uuids: Sequence[str] | None = None, job: JobKey | None = None
    ) -> dict[str, str]:
        """The instant queries of :meth:`job_leaves`: the recorded per-leaf figures (a few label-light
        series per leaf), and from raw series what the rules do not record (the SM clock, the
        slowdown events, each within the rules' window), each kept to the leaves of the jobs in view
        (of ``job`` only, where given; and of the GPUs ``uuids``, selected by UUID, where given)."""
        mine = dict(zip(jobs.JOB, job, strict=True)) if job else None
        leaf = self.job_selector("gpulens:job_leaf:info", filters, mine, uuids)
        cl = {"cluster": filters.cluster} if filters.cluster else {}
        of = {"uuid": uuids} if uuids else {}
        w = definitions.MEAN_WINDOW

        def rec(record: str, by: str) -> str:
            return f"max by ({by}) ({self.job_selector(record, filters, mine, uuids)})"

        clock = _regexes_selector("gpulens_gpu_sm_clock_hertz", cl, of)
        top = _regexes_selector("gpulens_gpu_sm_clock_max_hertz", cl, of)
        events = _regexes_selector("gpulens_gpu_clock_event_active", cl, {**of, "reason": SLOWDOWN_REASONS})
        step = duration(SLOWDOWN_SAMPLE_SECONDS)
        pod_leaf = "cluster, namespace, pod, uuid, mig_uuid"

        narrowed = bool(filters.namespace or filters.node or filters.instance or job)

        def kept(expr: str, on: str) -> str:
            # kept to the leaves in view where a filter narrows them (the cluster's matcher does the
            # rest): unfiltered, the join would only drop the GPUs no job holds, at a second look-up
            return f"{expr} and on ({on}) {leaf}" if narrowed else expr

        total = _regexes_selector("gpulens_gpu_memory_total_bytes", cl, of)
        share = _regexes_selector("gpulens:leaf_gpu_share:ratio", cl, of)
        info = _regexes_selector("gpulens_gpu_info", cl, of)
        return {
            "leaves": leaf,
            "activity": rec("gpulens:job_leaf_activity:ratio_avg5m", "uuid, mig_uuid"),
            "busy": rec("gpulens:job_leaf_busy:ratio_avg5m", "uuid, mig_uuid"),
            "communication": rec("gpulens:job_leaf_communication:ratio_avg5m", pod_leaf),
            "memory_ratio": rec("gpulens:job_leaf_memory_used:ratio_max5m", "uuid, mig_uuid"),
            "memory_total": kept(f"max by (uuid, mig_uuid) ({total})", "uuid, mig_uuid"),
            "sm_clock_ratio": kept(
                f"(max by (uuid) (avg_over_time({clock}[{w}]) and {clock}) / on (uuid) max by (uuid) ({top}))", "uuid"
            ),
            # any of the events at each sample: the max over the reasons, then its mean over the window
            "slowdown": kept(f"avg_over_time((max by (uuid) ({events}))[{w}:{step}])", "uuid"),
            "reasons": kept(f"(max by (uuid, reason) (max_over_time({events}[{w}])) > 0)", "uuid"),
            "shares": kept(f"max by (uuid, mig_uuid) ({share})", "uuid, mig_uuid"),
            "gpus": kept(f"max by (uuid, gpu, name) ({info})", "uuid"),
        }

    def job_leaves(
        self,
        filters: Filters = NO_FILTERS,
        *,
        window: Window | None = None,
        end: float | None = None,
        job: JobKey | None = None,
    ) -> pd.DataFrame:
        return self._job_leaves(filters, window=window, end=end, job=job)

    def _job_leaves(
        self,
        filters: Filters,
        *,
        window: Window | None = None,
        end: float | None = None,
        uuids: Sequence[str] | None = None,
        job: JobKey | None = None,
    ) -> pd.DataFrame:
        """:meth:`job_leaves`, of the GPUs ``uuids`` where given."""
        held_over = window if window is not None and window.seconds else None  # held_hours' range
        at = None if end is None else self._end(end)
        queries = self._job_queries(filters, uuids, job)
        calls = [(q, _JOB_QUERY_LABELS[name], at) for name, q in queries.items()]
        if held_over is not None:
            # held_hours: the recorded leaf per step of a [range:step] subquery, at a step-aligned
            # instant (as allocation_activity): one point query per step however long the range
            seconds, step = held_step(held_over)
            leaf = self.job_selector(
                "gpulens:job_leaf:info", filters, dict(zip(jobs.JOB, job, strict=True)) if job else None
            )
            held = f"count_over_time({leaf}{subquery_range(seconds, step)}) * {step:g} / 3600"
            calls.append((f"max by (cluster, namespace, pod, uuid, mig_uuid) ({held})", POD_LEAF_KEYS,
                          math.floor(self._end(end) / step) * step))  # fmt: skip
        with ThreadPoolExecutor(max_workers=len(calls)) as pool:
            answers = list(pool.map(lambda c: self.query_labels(*c), calls))
        got = dict(zip([*queries, *(["held"] if held_over else [])], answers, strict=True))
        if got["leaves"].empty:
            held = selector(ALLOCATION, {k: v for k, v in (("cluster", filters.cluster),) if v})
            # none of some GPUs or of one job is no sign of missing rules: a job ends
            if not (uuids or job) and not self.query(f"count({held})", at).empty:
                raise SourceError(MISSING_JOB_RULES)
            return pd.DataFrame(columns=[*JOB_LEAF_COLUMNS, *(["held_hours"] if held_over else [])])
        return job_leaf_figures(
            got["leaves"],
            activity=got["activity"],
            busy=got["busy"],
            communication=got["communication"],
            memory_ratio=got["memory_ratio"],
            memory_total=got["memory_total"],
            sm_clock_ratio=got["sm_clock_ratio"],
            slowdown=got["slowdown"],
            reasons=got["reasons"],
            gpus=got["gpus"],
            shares=got["shares"],
            held=got.get("held"),
        )

    def job_summary(
        self, filters: Filters = NO_FILTERS, *, window: Window | None = None, end: float | None = None
    ) -> pd.DataFrame:
        # the job records in one query (a few series per job, told apart by name), the class mix's
        # communication share, the stragglers counted, and the GPU-hours over the range
        at = None if end is None else self._end(end)
        job = ", ".join(jobs.JOB)
        comm = self.job_selector("gpulens:job_boundness:ratio_avg5m", filters, {"class": jobs.COMMUNICATION})
        calls: dict[str, tuple[str, Sequence[str], float | None]] = {
            "records": (self.job_selector(list(_JOB_RECORDS), filters), [*jobs.JOB, "__name__"], at),
            "communication": (f"max by ({job}) ({comm})", jobs.JOB, at),
            "stragglers": (f"count by ({job}) ({self.job_selector('gpulens:job_straggler:info', filters)})",
                           jobs.JOB, at),
        }  # fmt: skip
        if window is not None and window.seconds:  # at a step-aligned instant, as job_leaves' held_hours
            seconds, step = held_step(window)
            share = self.job_selector("gpulens:job_gpu_share:sum", filters)
            hours = f"max by ({job}) ({jobs.gpu_hours_promql(share, seconds, step)})"
            calls["gpu_hours"] = (hours, jobs.JOB, math.floor(self._end(end) / step) * step)
        with ThreadPoolExecutor(max_workers=len(calls)) as pool:
            got = dict(zip(calls, pool.map(lambda c: self.query_labels(*c), calls.values()), strict=True))
        records = got.pop("records")
        figures = {
            col: records[records["__name__"] == name].drop(columns=["__name__"]) for name, col in _JOB_RECORDS.items()
        }
        if figures["gpus"].empty:
            held = selector(ALLOCATION, {k: v for k, v in (("cluster", filters.cluster),) if v})
            if not self.query(f"count({held})", at).empty:
                raise SourceError(MISSING_JOB_RULES)
            return pd.DataFrame(columns=list(jobs.SUMMARY_COLUMNS))
        return job_summary_figures({**figures, **got})

    def job_stragglers(self, filters: Filters = NO_FILTERS, *, end: float | None = None) -> pd.DataFrame:
        at = None if end is None else self._end(end)
        record = self.job_selector("gpulens:job_straggler:info", filters)
        strays = self.query_labels(record, [*jobs.JOB_LEAF, "gpu", "reason"], at)
        if strays.empty:
            return pd.DataFrame(columns=list(JOB_STRAGGLER_COLUMNS))
        # what explains them, of the straggling GPUs only (selected by UUID: a few series each)
        uuids = sorted(set(strays["uuid"].astype(str)))
        queries = self._job_queries(filters, uuids if len(uuids) <= MAX_UUIDS_SELECTED else None)
        calls = {name: (queries[name], _JOB_QUERY_LABELS[name], at) for name in ("busy", "sm_clock_ratio", "reasons")}
        with ThreadPoolExecutor(max_workers=len(calls)) as pool:
            got = dict(zip(calls, pool.map(lambda c: self.query_labels(*c), calls.values()), strict=True))
        return straggler_figures(strays, busy=got["busy"], sm_clock_ratio=got["sm_clock_ratio"],
                                        reasons=got["reasons"])  # fmt: skip

    def job_classes(self, filters: Filters = NO_FILTERS, *, end: float | None = None) -> pd.DataFrame:
        leaf = self.job_selector("gpulens:job_leaf:info", filters)
        own = {k: v for k, v in (("cluster", filters.cluster), ("namespace", filters.namespace)) if v}
        pods = selector("gpulens_pod_gpu_boundness", own)
        keys = "cluster, namespace, pod, uuid, mig_uuid"
        shares = f"max by ({keys}, class) (avg_over_time({pods}[{definitions.MEAN_WINDOW}]) and {pods})"
        promql = f"{leaf} * on ({keys}) group_right (workload_kind, workload, instance, node) {shares}"
        df = self.query_labels(promql, [*jobs.JOB_LEAF, "class"], None if end is None else self._end(end))
        return df.rename(columns={"value": "share"})[list(JOB_CLASS_COLUMNS)]

    def job_mix(self, filters: Filters = NO_FILTERS, *, end: float | None = None) -> pd.DataFrame:
        # the recorded mix: a few series per job (its classes), not a few per leaf
        mix = self.job_selector("gpulens:job_boundness:ratio_avg5m", filters)
        df = self.query_labels(f"{mix} > 0", [*jobs.JOB, "class"], None if end is None else self._end(end))
        return df.rename(columns={"value": "share"})[list(JOB_MIX_COLUMNS)]

    def job_series(
        self,
        job: JobKey,
        instances: Sequence[str],
        *,
        window: Window,
        step_s: float,
        end: float | None = None,
    ) -> pd.DataFrame:
        held = selector("gpulens:job_leaf:info", dict(zip(jobs.JOB, job, strict=True)))
        cluster, namespace = job[0], job[1]
        target = {"cluster": cluster} if cluster else {}
        where = sorted(set(instances))

        def sel(metric: str, extra: dict[str, str] | None = None) -> str:
            # the job's targets only: a store selects those series, not every GPU's
            return (
                _regex_selector(metric, {**target, **(extra or {})}, "instance", where)
                if where
                else selector(metric, {**target, **(extra or {})})
            )

        queries = {
            "sm_active": f"{sel(SM_ACTIVE)} and on (uuid, mig_uuid) {held}",
            "busy": f"{sel('gpulens_gpu_busy_ratio')} and on (uuid, mig_uuid) {held}",
            "sm_clock": (
                f"({sel('gpulens_gpu_sm_clock_hertz')} / on (uuid) group_left () "
                f"max by (uuid) ({sel('gpulens_gpu_sm_clock_max_hertz')})) and on (uuid) {held}"
            ),
            "class": (
                f"({sel('gpulens_pod_gpu_boundness', {'namespace': namespace})} == 1)"
                f" and on (cluster, namespace, pod, uuid, mig_uuid) {held}"
            ),
        }
        with ThreadPoolExecutor(max_workers=len(queries)) as pool:
            answers = list(
                pool.map(lambda q: self.query_range(q, window=window, step_s=step_s, end=end), queries.values())
            )
        parts = [df.assign(metric=name) for name, df in zip(queries, answers, strict=True) if not df.empty]
        if not parts:
            return pd.DataFrame(columns=list(JOB_SERIES_COLUMNS))
        out = with_cols(pd.concat(parts, ignore_index=True), JOB_SERIES_COLUMNS)
        return out[list(JOB_SERIES_COLUMNS)]

    def history_start(
        self,
        metric: str = HISTORY_METRIC,
        filters: Filters = NO_FILTERS,
        *,
        window: Window,
        end: float | None = None,
    ) -> float:
        # the first subquery step at which any such series had a sample (count() drops the labels,
        # so the answer is one series however large the fleet); a history younger than a step has
        # no step yet, and begins no earlier than its newest sample
        at = self._end(end)
        step = max(15.0, window.seconds / HISTORY_STEPS)
        sel = selector(metric, filters.target_matchers())
        search = f"min_over_time(timestamp(count({sel}))[{duration(window.seconds)}:{duration(step)}])"
        df = self.query(f"{search} or min(timestamp({sel}))", at)
        return float(df["value"].min()) if not df.empty else math.nan

    def label_values(self, label: str, metric: str = "gpulens_gpu_info", within: Filters = NO_FILTERS) -> list[str]:
        df = self.query(f"count by {by_clause([label])} ({selector(metric, within.target_matchers())})")
        values = set(col(df, label)) - {""}
        return sorted(values)

    def problems(self) -> list[str]:
        """The gpulens exporters Prometheus cannot scrape now (a dead target would otherwise just
        vanish from every page); nothing when Prometheus itself does not answer (the page says so)."""
        try:
            down = self.query(definitions.EXPORTERS_DOWN_PROMQL)
        except SourceError:
            return []
        if down.empty:
            return []
        out = []
        for _, row in with_cols(down, ["instance", "node", "job"]).sort_values("instance").iterrows():
            where = f" on node {row['node']}" if row["node"] else ""
            out.append(f"{row['instance']}{where}: Prometheus cannot scrape it (job {row['job']})")
        if len(out) > MAX_PROBLEMS:
            out = [*out[:MAX_PROBLEMS], f"and {len(out) - MAX_PROBLEMS} more exporters"]
        return out


_JOB_RECORDS: dict[str, str] = {
    "gpulens:job_gpus:count": "gpus",
    "gpulens:job_nodes:count": "nodes",
    "gpulens:job_pods:count": "pods",
    "gpulens:job_activity:ratio_avg5m": "activity",
    "gpulens:job_activity_min:ratio_avg5m": "activity_min",
    "gpulens:job_activity_max:ratio_avg5m": "activity_max",
    "gpulens:job_busy:ratio_avg5m": "busy",
    "gpulens:job_memory_used_max:ratio_max5m": "memory_used_ratio",
    "gpulens:job_memory_at_max:bytes": "memory_total_bytes",
    "gpulens:job_leaves_classified:count": "classified_leaves",
}
"""The job records :meth:`PrometheusSource.job_summary` reads in one query, and the column of each."""
MAX_UUIDS_SELECTED = 200
"""Most GPUs :meth:`PrometheusSource.job_stragglers` and :meth:`PrometheusSource.idle_since` select
by UUID (a regex matcher each query); more, and they read every job leaf, every GPU."""
MAX_PARALLEL = 8
"""Most queries one source call sends at once (the page's prefetch sends up to 8 calls at once)."""
MISSING_JOB_RULES = (
    "Prometheus has GPUs held by pods but no gpulens:job_leaf:info: load the recording rules' group "
    "gpulens.jobs (deploy/rules/gpulens.rules.yml; the Helm chart's PrometheusRule)"
)
"""Why the Jobs pages are empty on a store without the jobs rules."""
MAX_PROBLEMS = 10
"""Down exporters named one by one in the banner; more are counted."""
BOUNDNESS = "gpulens_gpu_boundness"
FLEET_BOUNDNESS_MIX = "class:gpulens_gpu_boundness:sum"
"""Recording rule: leaves per boundness class (time-weighted over 10 m), per cluster."""


_LEAF = ("uuid", "mig_uuid")
_JOB_QUERY_LABELS: dict[str, tuple[str, ...]] = {
    "leaves": jobs.JOB_LEAF,
    "activity": _LEAF,
    "busy": _LEAF,
    "communication": POD_LEAF_KEYS,
    "memory_ratio": _LEAF,
    "memory_total": _LEAF,
    "sm_clock_ratio": ("uuid",),
    "slowdown": ("uuid",),
    "reasons": ("uuid", "reason"),
    "shares": _LEAF,
    "gpus": ("uuid", "gpu", "name"),
}
"""The labels each query of ``PrometheusSource._job_queries`` answers with (all its ``by`` keeps)."""


def _regex_selector(metric: str, matchers: dict[str, str], label: str, values: Sequence[str]) -> str:
    """``metric{matchers..., label=~"v1|v2"}``: ``label`` one of ``values`` (each matched literally:
    regex characters escaped, then quoted as every value is)."""
    return _regexes_selector(metric, matchers, {label: values})


def _regexes_selector(metric: str, matchers: dict[str, str], regexes: dict[str, Sequence[str]]) -> str:
    """``metric{matchers..., label=~"v1|v2", ...}``: each label of ``regexes`` one of its values
    (matched literally); no regex matchers: :func:`selector`. ``metric`` ``""`` with a ``__name__``
    regex: the series of several metrics."""
    if not regexes:
        return selector(metric, matchers)
    inner = selector("x", matchers)[1:]
    inner = inner[1:-1] + "," if inner else ""
    res = ",".join(
        f"{_regex_label(k)}=~{quote('|'.join(re.escape(v) for v in vs))}" for k, vs in sorted(regexes.items())
    )
    return f"{selector(metric) if metric else ''}{{{inner}{res}}}"


def _regex_label(name: str) -> str:
    """A label name for a regex matcher: ``__name__`` (several metrics in one selector) or a
    validated label name."""
    return name if name == "__name__" else label_name(name)


def _fleet_wide(filters: Filters) -> bool:
    """True when ``filters`` select whole clusters (or everything): what the fleet rules cover."""
    return not (filters.node or filters.instance or filters.namespace)


def _reason(exc: BaseException) -> str:
    """The innermost cause's message (requests wraps urllib3 wraps ssl), shortened."""
    for _ in range(8):  # a bounded walk: cause chains are short, and must not loop
        inner = exc.__cause__ or (exc.args[0] if exc.args and isinstance(exc.args[0], BaseException) else None)
        if inner is None:
            break
        exc = inner
    return str(exc)[:200]


def _num(text: object) -> float:
    """Prometheus sends sample values as strings ("NaN", "+Inf" included)."""
    try:
        return float(str(text))
    except ValueError:
        return math.nan


def _stacked(frames: Sequence[pd.DataFrame], keys: Sequence[str]) -> pd.DataFrame:
    """The answers of one query sent in batches, as one frame of ``keys`` (``""`` where a batch's
    series lack one) and ``value``; empty where every batch is."""
    full = [with_cols(f, keys) for f in frames if not f.empty]
    return pd.concat(full, ignore_index=True) if full else pd.DataFrame(columns=[*keys, "value"])


def _with_held_and_busy(out: pd.DataFrame, first: pd.DataFrame, last_busy: pd.DataFrame, how: str) -> pd.DataFrame:
    """``out`` (per container and leaf) with the answers of PrometheusSource._held_and_busy
    joined: ``first_allocated`` per container and leaf (``how``), ``last_busy`` per leaf (left)."""
    keys = list(POD_DEVICE_KEYS)
    first = with_cols(first, keys).rename(columns={"value": "first_allocated"})
    last_busy = with_cols(last_busy, ("uuid", "mig_uuid")).rename(columns={"value": "last_busy"})
    out = out.merge(first[[*keys, "first_allocated"]], on=keys, how=how)
    return out.merge(last_busy[["uuid", "mig_uuid", "last_busy"]], on=["uuid", "mig_uuid"], how="left")
