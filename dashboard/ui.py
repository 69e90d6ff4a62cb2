"""Shared page plumbing: the configured source, the sidebar's filters, cached queries and banners.

Every panel runs inside :func:`panel`, so a failed query becomes an ``st.error`` banner for that
panel only (never a traceback) and the rest of the page still renders.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import pandas as pd
import streamlit as st

from dashboard import definitions
from dashboard.figures.vega import PICK, Chart
from dashboard.frames.jobs import job_param
from dashboard.frames.links import DIRECTION_NAMES, LINK_NAMES, link_column
from dashboard.inert_text import inert
from dashboard.settings import DashboardSettings, from_env
from dashboard.sources import scrape
from dashboard.sources.prometheus import PrometheusSource
from dashboard.sources.source import HISTORY_METRIC, HISTORY_STEPS, Filters, MetricSource, SourceError, Window

WINDOWS: dict[str, float] = {
    "Last 15 minutes": 900.0,
    "Last hour": 3600.0,
    "Last 6 hours": 6 * 3600.0,
    "Last 24 hours": 86400.0,
    "Last 7 days": 7 * 86400.0,
}
RANGE_PARAM: dict[str, str] = {
    "15m": "Last 15 minutes",
    "1h": "Last hour",
    "6h": "Last 6 hours",
    "24h": "Last 24 hours",
    "7d": "Last 7 days",
}
"""``?range=24h`` in the URL preselects the time range (bookmarkable views, the scale bench)."""
ABSOLUTE = "Absolute range…"
POINTS_PER_CHART = 240
FILTER_PARAMS = ("cluster", "node", "instance", "namespace")
"""Sidebar filters kept in the URL (``?node=gpu-3``), so a view can be shared."""
RANGE_PARAMS = ("range", "from", "to")
"""``range=1h``, or ``from``/``to`` as UTC ``YYYY-MM-DDTHH:MM`` for an absolute range."""
_END_AWARE = {
    "history_start",
    "instant",
    "current_state",
    "series",
    "rate",
    "increase",
    "events",
    "mean",
    "allocation_activity",
    "idle_since",
    "leaf_idle",
    "window_ages",
    "job_leaves",
    "job_summary",
    "job_stragglers",
    "job_classes",
    "job_mix",
    "job_series",
}

STEP_ALIGNED = frozenset({"allocation_activity", "series", "rate", "device_series", "job_series"})
"""Source methods whose answer over a range ending now is a function of the range's step-aligned
end alone (their range queries and subqueries are evaluated there): against Prometheus they are
cached by that instant (:func:`_call`), for the rest of the step."""
STEP_SETTLE_SECONDS = 60.0
"""How old a step-aligned end must be before its answer is cached for the rest of the step: a
scrape or a rule evaluation (every minute) may still land on it before."""
STEP_CACHE_MAX_SECONDS = 3600
"""Longest an answer cached by its step-aligned end is kept (a step is shorter at every range the
sidebar offers but 7 days)."""
clock: Callable[[], float] = time.time
"""Now, as :func:`_call` reads it for a range's step-aligned end (Unix s; tests set it)."""

_CTX = "gpulens_ctx"


@dataclass(frozen=True)
class PageContext:
    """What every page needs for this run."""

    settings: DashboardSettings
    source: MetricSource
    filters: Filters
    window_s: float
    step_s: float
    refresh_s: float | None
    source_error: str | None = None
    started: float = 0.0
    end_s: float | None = None
    """End of an absolute range (Unix s); None = a range ending now."""
    nonce: int = 0
    """Bumped by "Refresh now": part of every cache key, so the next run queries afresh."""

    @property
    def window(self) -> Window:
        """The range as the sources read it (``window_s`` seconds before :attr:`at`)."""
        return Window(self.window_s)

    @property
    def at(self) -> float:
        """The range's end as Unix seconds (now for a relative range)."""
        return time.time() if self.end_s is None else self.end_s

    def link_params(self) -> dict[str, str]:
        """The URL parameters of this view's range and filters, for links to other pages."""
        out = {k: v for k, v in url_state().items() if k in (*RANGE_PARAMS, *FILTER_PARAMS)}
        return out


@st.cache_resource(show_spinner=False)
def _source(key: str, settings: DashboardSettings) -> MetricSource:
    if settings.prometheus_url:
        try:
            auth = settings.prometheus_auth.validate()
        except ValueError as exc:
            raise SourceError(f"bad Prometheus authentication setting: {exc}") from exc
        return PrometheusSource(settings.prometheus_url, timeout_s=settings.timeout_seconds, auth=auth)
    if settings.scrape_urls:
        # the one started at the dashboard's start (dashboard.server), its history as old as the
        # process; under a bare ``streamlit run``, started here by the first page
        return scrape.running(
            settings.scrape_urls, interval_s=settings.scrape_interval_seconds, timeout_s=settings.timeout_seconds
        )
    raise SourceError("no data source configured: start with --prometheus URL or --scrape URL[,URL...]")


def settings() -> DashboardSettings:
    return from_env()


def source(cfg: DashboardSettings) -> MetricSource:
    """The process-wide source for ``cfg`` (one scraping thread per configuration)."""
    return _source(cfg.source_key, cfg)


@st.cache_data(ttl=10, show_spinner=False, max_entries=512)
def _cached(
    key: str, nonce: int, method: str, args: tuple[Any, ...], kwargs: tuple[tuple[str, Any], ...], _src: Any
) -> tuple[Any, float]:
    return getattr(_src, method)(*args, **dict(kwargs)), time.time()


_AS_OF = "gpulens_as_of"


@st.cache_data(ttl=STEP_CACHE_MAX_SECONDS, show_spinner=False, max_entries=256)
def _cached_at_step(
    key: str, nonce: int, method: str, args: tuple[Any, ...], kwargs: tuple[tuple[str, Any], ...], _src: Any
) -> tuple[Any, float]:
    return getattr(_src, method)(*args, **dict(kwargs)), time.time()


def settled_step_end(window: Window, step_s: float, now: float) -> float | None:
    """The step-aligned end of a range ending ``now`` (a method of STEP_ALIGNED evaluates there
    whatever later instant asks), once it is ``STEP_SETTLE_SECONDS`` old (its samples and the
    rules' evaluations have landed); None while it is younger."""
    _seconds, step = window.stepped(step_s)
    end = math.floor(now / step) * step
    return end if now - end >= STEP_SETTLE_SECONDS else None


def _call(ctx: PageContext, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, float]:
    if method in _END_AWARE and "end" not in kwargs:
        kwargs = {**kwargs, "end": ctx.end_s}
    if (
        method in STEP_ALIGNED
        and ctx.end_s is None
        and kwargs.get("end") is None
        and isinstance(ctx.source, PrometheusSource)
        and isinstance(kwargs.get("window"), Window)
        and (end := settled_step_end(kwargs["window"], float(kwargs.get("step_s", 0.0)), clock())) is not None
    ):
        # keyed by the instant it is evaluated at, not by "now": every session asking within the
        # step gets the one answer (issue 54; the footer's "data as of" says when it was fetched)
        aligned = tuple(sorted({**kwargs, "end": end}.items()))
        return _cached_at_step(ctx.settings.source_key, ctx.nonce, method, args, aligned, ctx.source)
    return _cached(ctx.settings.source_key, ctx.nonce, method, args, tuple(sorted(kwargs.items())), ctx.source)


def fetch(ctx: PageContext, method: str, *args: Any, **kwargs: Any) -> Any:
    """``ctx.source.<method>(*args, **kwargs)`` through a short cache shared by all sessions
    (10 s; Filters and lists hash by value); failures are never cached. Range-aware methods get
    the context's range end; the time each answer was fetched feeds the page's "data as of"."""
    result, fetched = _call(ctx, method, args, kwargs)
    seen = st.session_state.get(_AS_OF)
    st.session_state[_AS_OF] = fetched if seen is None else min(seen, fetched)
    return result.copy() if isinstance(result, pd.DataFrame) else result


Query = tuple[str, tuple[Any, ...], dict[str, Any]]
"""A source call for :func:`prefetch`: (method, args, kwargs), as :func:`fetch` takes them."""


def query(method: str, *args: Any, **kwargs: Any) -> Query:
    """A :data:`Query` written like a :func:`fetch` call."""
    return method, args, kwargs


def get(ctx: PageContext, q: Query) -> Any:
    """:func:`fetch` of a :data:`Query` (a page lists its queries once, prefetches them, then
    reads each in its panel)."""
    method, args, kwargs = q
    return fetch(ctx, method, *args, **kwargs)


def kernel_time_query(method: str, *args: Any, **kwargs: Any) -> Query:
    """A :data:`Query` of the per-process kernel time (``method`` as :func:`query` takes it, the
    metric's name left out): :func:`kernel_time` reads it."""
    return query(method, definitions.KERNEL_TIME_METRICS[0], *args, **kwargs)


def kernel_time(ctx: PageContext, q: Query) -> pd.DataFrame:
    """The answer to ``q`` (:func:`kernel_time_query`) under the figure's name, else under its
    deprecated name (``definitions.KERNEL_TIME_METRICS``: an exporter from before the rename): the
    one place the pages read the per-process figure."""
    method, args, kwargs = q
    out: pd.DataFrame = get(ctx, q)
    for older in definitions.KERNEL_TIME_METRICS[1:]:
        if not out.empty:
            break
        out = fetch(ctx, method, older, *args[1:], **kwargs)
    return out


PREFETCH_THREADS = 8
"""At most this many of a page's queries in flight at once (Prometheus mode)."""


def prefetch(ctx: PageContext, queries: Iterable[Query]) -> None:
    """Run a page's independent queries at once, so that its :func:`fetch` calls find them in the
    cache: against Prometheus a page then waits for its slowest query, not for their sum. Only
    for the Prometheus source (the direct-scrape source computes in this process, where threads
    would only take turns). A query that fails is not cached; its :func:`fetch` runs it again and
    its panel shows the error."""
    # every page reads them: its banner (history_note) and the exporters Prometheus cannot scrape
    queries = [*queries, _history_query(ctx), query("problems")]
    if not isinstance(ctx.source, PrometheusSource) or len(queries) < 2:
        return
    from concurrent.futures import ThreadPoolExecutor

    from streamlit.runtime.scriptrunner import add_script_run_ctx, get_script_run_ctx

    script_ctx = get_script_run_ctx()

    def run(q: Query) -> None:
        add_script_run_ctx(ctx=script_ctx)  # st.cache_data's per-session bookkeeping needs it
        try:
            _call(ctx, *q)
        except Exception:  # fetch() runs it again and its panel reports it
            return

    with ThreadPoolExecutor(max_workers=min(PREFETCH_THREADS, len(queries))) as pool:
        list(pool.map(run, queries))


@contextmanager
def panel(what: str) -> Iterator[None]:
    """Run one panel; a SourceError or any other failure becomes a banner naming the panel."""
    try:
        yield
    except SourceError as exc:
        st.error(f"{inert(what)}: {inert(exc)}", icon=":material/warning:")
    except Exception as exc:  # a broken panel must not take the page down
        st.error(
            f"{inert(what)} could not be drawn: {inert(type(exc).__name__)}: {inert(str(exc)[:300])}",
            icon=":material/warning:",
        )


def no_data(why: str) -> None:
    """An empty panel's message: ``why`` is a sentence saying what is missing and, where known,
    why (a chart or table left blank without one reads as broken). Plain text, drawn as it is."""
    st.info(inert(why), icon=":material/info:")


def set_context(ctx: PageContext) -> None:
    st.session_state[_CTX] = ctx


def context() -> PageContext:
    ctx: PageContext = st.session_state[_CTX]
    return ctx


def page(title: str, body: Callable[[PageContext], None]) -> None:
    """Render a page: title, source banner or body (auto-refreshing when enabled), footer."""
    ctx = context()
    st.title(inert(title))
    if ctx.source_error:
        st.error(inert(ctx.source_error), icon=":material/cloud_off:")
        st.caption("The data source did not answer; pick another page or press Retry in the sidebar.")
        return

    def run() -> None:
        started = time.perf_counter()
        st.session_state[_AS_OF] = None
        st.session_state[_HELD] = None
        # the exporters down and the banner go on top but are filled last: their queries run
        # beside the page's own (prefetch adds them), not before them
        down = st.empty()
        banner = st.empty()
        body(ctx)
        problems = fetch(ctx, "problems")
        if problems:
            with down.container():
                for problem in problems:
                    st.warning(f"exporter not answering: {inert(problem)}", icon=":material/warning:")
        with banner.container():
            try:
                history_note(ctx)
            except SourceError as exc:  # the panels say what failed
                st.caption(f"How much history the range holds is unknown: {inert(exc)}")
        as_of = st.session_state.get(_AS_OF)
        shown = f"data as of {fmt_time(as_of)}" if as_of else "no data fetched"
        span = (
            f"{fmt_time(ctx.at - ctx.window_s)} – {fmt_time(ctx.at)}"
            if ctx.end_s
            else f"last {fmt_duration(ctx.window_s)}"
        )
        st.caption(
            f"gpulens · {inert(ctx.source.description)} · {inert(span)} · {inert(shown)} · "
            f"rendered in {time.perf_counter() - started:.2f} s"
        )

    if ctx.refresh_s:
        st.fragment(run_every=ctx.refresh_s)(run)()
    else:
        run()


HISTORY_SLACK_STEPS = 2
"""History reaching within this many of :meth:`MetricSource.history_start`'s steps (or a minute)
of the range's start covers the whole range."""


_HELD = "gpulens_history_s"
"""Session key of this run's :func:`history_s` of the GPUs (one figure for the whole page)."""


def history_s(ctx: PageContext, metric: str = HISTORY_METRIC) -> float:
    """Seconds of the range the source holds ``metric`` for (under the page's cluster and node
    filters): ``ctx.window_s`` when its history reaches the range's start, less for a younger
    history (a new install, an exporter started minutes ago, rules loaded after a backfill), 0
    when the range holds none. The GPUs' figure is taken once per run, so that every sentence of
    a page quotes the same span."""
    mine = metric == HISTORY_METRIC
    if mine and st.session_state.get(_HELD) is not None:
        return float(st.session_state[_HELD])
    held = _history_s(ctx, metric)
    if mine:
        st.session_state[_HELD] = held
    return held


def _history_query(ctx: PageContext, metric: str = HISTORY_METRIC) -> Query:
    return query("history_start", metric, ctx.filters, window=ctx.window)


def _history_s(ctx: PageContext, metric: str) -> float:
    start = get(ctx, _history_query(ctx, metric))
    if start != start:
        return 0.0
    span = max(1.0, ctx.at - start)  # one scrape is a moment of history, not none
    return ctx.window_s if span >= ctx.window_s - history_slack(ctx) else span


def history_slack(ctx: PageContext) -> float:
    """Seconds within which two :func:`history_s` answers are the same history (the search's
    resolution, a rule's first evaluation after the first scrape)."""
    return max(60.0, HISTORY_SLACK_STEPS * ctx.window_s / HISTORY_STEPS)


def over(ctx: PageContext) -> str:
    """What a figure over the page's range is over, in words: ``the last 1h 00m``, or ``the 4m 10s
    of history in the last 1h 00m`` when the history is younger than the range."""
    held = history_s(ctx)
    whole = f"the last {fmt_duration(ctx.window_s)}"
    if held >= ctx.window_s:
        return whole
    if held <= 0:
        return f"{whole} (no data in it yet)"
    return f"the {fmt_duration(held)} of history in {whole}"


def history_note(ctx: PageContext) -> None:
    """A banner when the history is younger than the range: figures over the range cover less."""
    held = history_s(ctx)
    if held >= ctx.window_s:
        return
    if held <= 0:
        st.info(f"No GPU data in the last {fmt_duration(ctx.window_s)} of this range.", icon=":material/history:")
        return
    st.info(
        f"History covers {fmt_duration(held)} of the {fmt_duration(ctx.window_s)} asked: means, totals and "
        f"wasted hours below are over those {fmt_duration(held)} only.",
        icon=":material/history:",
    )


def fmt_duration(seconds: float) -> str:
    """``3h 20m`` style."""
    s = int(max(0, seconds))
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    if d:
        return f"{d}d {h}h"
    if h:
        return f"{h}h {m:02d}m"
    if m:
        return f"{m}m {sec:02d}s"
    return f"{sec}s"


def fmt_time(ts: float) -> str:
    """Unix seconds as ``2026-11-30 11:20:05 UTC``."""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_bytes(n: float) -> str:
    """Bytes in binary units: ``80.0 GiB``; ``""`` for a missing value."""
    if n != n:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def fmt_rate(bps: float) -> str:
    """Bandwidth in decimal units as datasheets give it: ``3.38 TB/s``, ``55.1 GB/s``."""
    if bps != bps:
        return ""
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6)):
        if abs(bps) >= scale:
            return f"{bps / scale:.3g} {unit}" if unit == "TB/s" else f"{bps / scale:.1f} {unit}"
    return f"{bps:.0f} B/s"


def fmt_bitrate(bytes_per_second: float) -> str:
    """A NIC's throughput or line rate in bits per second, as NICs are rated: ``93.0 Gb/s``,
    ``400 Gb/s``, ``1.2 Mb/s``; ``""`` for a missing value."""
    if bytes_per_second != bytes_per_second:
        return ""
    bits = bytes_per_second * 8.0
    for unit, scale in (("Tb/s", 1e12), ("Gb/s", 1e9), ("Mb/s", 1e6), ("kb/s", 1e3)):
        if abs(bits) >= scale:
            v = bits / scale
            return f"{v:,.0f} {unit}" if v >= 100 else f"{v:.1f} {unit}"
    return f"{bits:,.0f} b/s"


def fmt_line_rate(bytes_per_second: float) -> str:
    """A NIC's line rate as it is rated, in bits per second, with the same in bytes per second (the
    unit of every data rate on the pages): ``400 Gb/s (50.0 GB/s)``; ``""`` for a missing value. Bits
    per second appear on the pages only here, labelled."""
    if bytes_per_second != bytes_per_second:
        return ""
    return f"{fmt_bitrate(bytes_per_second)} ({fmt_rate(bytes_per_second)})"


def humanize_bytes(df: pd.DataFrame) -> pd.DataFrame:
    """``*_bytes`` columns as ``GiB`` strings, ``*_bytes_per_second`` as ``GB/s``/``TB/s``."""
    out = df.copy()
    for c in out.columns:
        if c.endswith("_bytes_per_second") or c == "bandwidth":
            out[c] = [fmt_rate(float(v)) for v in out[c]]
        elif c.endswith("_bytes"):
            out[c] = [fmt_bytes(float(v)) for v in out[c]]
    return out.rename(columns={c: c.removesuffix("_bytes") for c in out.columns if c.endswith("_bytes")})


def node_column(df: pd.DataFrame) -> pd.DataFrame:
    """Keep ``node`` and drop ``instance`` (a pod IP in Kubernetes) where a node label exists;
    otherwise keep ``instance`` (exporters scraped without relabelling)."""
    if "node" in df.columns and (df["node"].astype(str) != "").any():
        return df.drop(columns=[c for c in ("instance",) if c in df.columns])
    return df.drop(columns=[c for c in ("node",) if c in df.columns])


GPU_LINK = "gpu_page"


def gpu_url(uuid: str, mig_uuid: str = "", params: dict[str, str] | None = None) -> str:
    """The GPU page's URL for a device, keeping the view's range and filters."""
    q = {**(params or {}), "uuid": uuid, **({"mig_uuid": mig_uuid} if mig_uuid else {})}
    return "gpu?" + urlencode(q)


def job_url(key: Iterable[str], params: dict[str, str] | None = None) -> str:
    """The Job page's URL for a job (cluster, namespace, workload_kind, workload), keeping the view's
    range and filters: ``job?job=namespace/Kind/name`` first (its name is what the Jobs table's link
    shows), then ``job_cluster`` where the job has a cluster."""
    cluster, *rest = (str(x) for x in key)
    q = {"job": job_param((cluster, *rest)), **({"job_cluster": cluster} if cluster else {}), **(params or {})}
    return "job?" + urlencode(q, safe="/")


JOB_IN_URL = r"job=([^&]+)"
"""The job's ``namespace/Kind/name`` within a :func:`job_url` (a LinkColumn's ``display_text``:
Kubernetes names need no URL escaping)."""


def linked(df: pd.DataFrame, ctx: PageContext | None = None) -> pd.DataFrame:
    """``df`` with a first column linking each row's GPU (uuid, mig_uuid) to its GPU page."""
    if "uuid" not in df.columns or df.empty:
        return df
    params = (ctx or context()).link_params()
    mig = df["mig_uuid"] if "mig_uuid" in df.columns else pd.Series([""] * len(df), index=df.index)
    urls = [gpu_url(str(u), str(m), params) if u else "" for u, m in zip(df["uuid"], mig, strict=True)]
    return df.assign(**{GPU_LINK: urls})[[GPU_LINK, *df.columns]]


ID_COLUMNS = ("uuid", "mig_uuid")
"""Columns of long device identifiers (GPU and MIG UUIDs, 40 characters)."""


def ids_last(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its UUID columns moved to the end, so that the figures a reader came for fit the
    page before them (the GPU page link and node/GPU already name the device)."""
    ids = [c for c in ID_COLUMNS if c in df.columns]
    return df[[*(c for c in df.columns if c not in ids), *ids]]


COLUMN_CONFIG: dict[str, Any] = {
    GPU_LINK: st.column_config.LinkColumn(
        "GPU page", display_text="open", help="the GPU's page: every metric over time"
    ),
    "sm_active": st.column_config.NumberColumn(
        "SM active", format="percent", help="share of the SMs' time with a warp resident (DCGM SM active)"
    ),
    "kernel_time": st.column_config.NumberColumn(
        "Kernel time",
        format="percent",
        help="share of sampled time the pod's kernels ran on the shared GPU (NVML per-process utilisation); "
        "shown only where several pods share a GPU",
    ),
}
"""Column settings shared by the tables that name a GPU."""


PERCENT_FORMAT = "%.0f %%"
"""The pages' one percentage style, as a table column's printf format of a 0..100 value: whole
percent and a space, as nvidia-smi prints utilisation (``96 %``); :func:`fmt_percent` in text."""


def fmt_percent(ratio: float) -> str:
    """A 0..1 ratio in the pages' one percentage style: ``96 %`` (:data:`PERCENT_FORMAT`); ``""``
    for a missing value."""
    if ratio != ratio:
        return ""
    text = f"{ratio * 100:.0f} %"
    return "0 %" if text == "-0 %" else text


def percent_column(title: str, help_text: str) -> Any:
    """A 0-100 % progress column (a share shown as a bar and a whole percent)."""
    return st.column_config.ProgressColumn(
        title, format=PERCENT_FORMAT, min_value=0, max_value=100, help=inert(help_text)
    )


COMMUNICATION_COLUMN = percent_column(
    "Communication",
    f"share of its GPUs' time over the last {definitions.MEAN_WINDOW} in collectives, waiting on peers or the network",
)
"""The pod tables' communication share (dashboard/definitions.py, ``communication_share``)."""


LINK_COLUMN_CONFIG: dict[str, Any] = {
    **{
        link_column(link): st.column_config.ProgressColumn(
            f"{name} use",
            format=PERCENT_FORMAT,
            min_value=0.0,
            max_value=100.0,
            help=f"{inert(name)} bytes per second of the busier direction over the link's capacity",
        )
        for link, name in LINK_NAMES.items()
    },
    **{
        link_column(link, d): st.column_config.TextColumn(
            f"{name} {way}", help=f"{inert(name)} throughput {'into' if way == 'in' else 'out of'} the GPU"
        )
        for link, name in LINK_NAMES.items()
        for d, way in DIRECTION_NAMES.items()
    },
    "device": st.column_config.TextColumn("device", help="the whole GPU, or the MIG instance"),
}
"""Column settings of the tables with a leaf's links (frames.links.leaf_links' columns, use in percent:
:func:`link_use_percent`)."""


def link_use_percent(df: pd.DataFrame, columns: Iterable[str] | None = None) -> pd.DataFrame:
    """``df`` with link use (0..1) in percent, for a progress column that reads ``80%``, not
    ``79.85%`` (Streamlit's ``percent`` format keeps two decimals); ``columns`` default to each
    link's use column."""
    names = [link_column(link) for link in LINK_NAMES] if columns is None else list(columns)
    return df.assign(**{c: df[c] * 100.0 for c in names if c in df.columns})


def devices(mig_uuids: Iterable[str]) -> str:
    """How many whole GPUs and MIG slices a list of leaves holds, in words: ``1 GPU``,
    ``2 GPUs and 1 MIG slice`` (``mig_uuids``: each leaf's, ``""`` for a whole GPU)."""
    migs = [bool(m) for m in mig_uuids]
    parts = [
        f"{n} {what}{'' if n == 1 else 's'}"
        for n, what in ((migs.count(False), "GPU"), (migs.count(True), "MIG slice"))
        if n
    ]
    return " and ".join(parts) or "no GPU"


def link_columns(df: pd.DataFrame) -> list[str]:
    """The link columns of ``df`` (frames.links.leaf_links), each link's use then its throughput in and out."""
    names = [link_column(link, d) for link in LINK_NAMES for d in (None, *DIRECTION_NAMES)]
    return [c for c in names if c in df.columns]


def link_table(df: pd.DataFrame) -> pd.DataFrame:
    """A table of leaves with their links, as the pages show it: throughput as ``51.5 GB/s``, the
    GPU page linked, ``node`` or ``instance``, and the device column only where a MIG instance is
    among the rows (whole GPUs all read ``GPU``)."""
    out = linked(node_column(humanize_bytes(link_use_percent(df))))
    if "device" in out.columns and (out["device"] == "GPU").all():
        out = out.drop(columns=["device"])
    return out.drop(columns=[c for c in ("mig_uuid",) if c in out.columns])


def url_state() -> dict[str, str]:
    """The range and filters as URL parameters, as set by the sidebar in this run."""
    state: dict[str, str] = st.session_state.get("gpulens_url", {})
    return dict(state)


def set_url_state(params: dict[str, str]) -> None:
    """Remember ``params`` and write them to the address bar, keeping page-own parameters."""
    st.session_state["gpulens_url"] = dict(params)
    for key in (*RANGE_PARAMS, *FILTER_PARAMS):
        value = params.get(key)
        if value:
            if st.query_params.get(key) != value:
                st.query_params[key] = value
        elif key in st.query_params:
            del st.query_params[key]


PAGES: dict[str, Any] = {}
"""url path -> st.Page, registered by app.py each run (for st.switch_page)."""


def chart(spec: Chart, key: str, *, clickable: bool = False) -> None:
    """Draw a Vega-Lite ``spec`` (dashboard/figures/) across the page; with ``clickable``, a
    click on a mark of a GPU or MIG instance (the spec's :data:`PICK` selection) opens
    that GPU's page."""
    if not clickable:
        st.vega_lite_chart(spec, width="stretch", key=key)
        return
    event = st.vega_lite_chart(spec, width="stretch", key=key, on_select="rerun", selection_mode=PICK)
    open_selected_gpu(event)


def open_selected_gpu(event: Any) -> None:
    """Open the GPU page for the first mark selected on a chart whose rows carry ``uuid`` and
    ``mig_uuid``; nothing when no mark is selected."""
    picked = list(((event or {}).get("selection") or {}).get(PICK) or [])
    if not picked or "gpu" not in PAGES:
        return
    first = picked[0] if isinstance(picked[0], dict) else {}
    uuid, mig = str(first.get("uuid") or ""), str(first.get("mig_uuid") or "")
    if not uuid:
        return
    params = {**context().link_params(), "uuid": uuid}
    if mig:
        params["mig_uuid"] = mig
    st.switch_page(PAGES["gpu"], query_params=params)


def gpu_picker(info: pd.DataFrame, key: str) -> None:
    """A "open a GPU's page" chooser under a chart of many GPUs (node and index from
    gpulens_gpu_info): one list of GPUs, or above ``--max-marks`` GPUs a node first,
    then its GPUs (a list of 10,000 options is a quarter of a second of a page's first load)."""
    if info.empty or "gpu" not in PAGES:
        return
    g = info.copy()
    for c in ("uuid", "gpu", "node", "instance"):
        if c not in g.columns:
            g[c] = ""
    g = g.assign(where=g["node"].where(g["node"] != "", g["instance"]), _i=pd.to_numeric(g["gpu"], errors="coerce"))
    g = g.sort_values(["where", "_i"]).drop_duplicates("uuid")
    c1, c2 = st.columns([3, 1])
    if len(g) > context().settings.max_marks:
        n1, n2 = c1.columns(2)
        where = n1.selectbox("Open a GPU's page: node", g["where"].unique().tolist(), key=f"{key}_node", index=None)
        g = g[g["where"] == where]
        labels = {u: f"GPU {i}" for u, i in zip(g["uuid"], g["gpu"], strict=True)}
        uuid = n2.selectbox("GPU", list(labels), format_func=lambda u: labels[u], key=key, index=None)
    else:
        labels = {u: f"{w} GPU {i}" for u, w, i in zip(g["uuid"], g["where"], g["gpu"], strict=True)}
        uuid = c1.selectbox("Open a GPU's page", list(labels), format_func=lambda u: labels[u], key=key, index=None)
    if uuid:
        c2.page_link(PAGES["gpu"], label="Open", icon=":material/open_in_new:",
                     query_params={**context().link_params(), "uuid": uuid})  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Tables a person reads: headers in words, numbers with thousands separators, missing values in
# words (ui.table). Streamlit draws st.dataframe on a canvas: what it shows is what these settings
# say, so every table of the pages goes through here.

HEADERS: dict[str, str] = {
    # who
    "cluster": "Cluster",
    "namespace": "Namespace",
    "pod": "Pod",
    "container": "Container",
    "workload": "Workload",
    "workload_kind": "Owner kind",
    "resource": "Resource",
    "holders": "Held by",
    "job": "Job",
    # where
    "node": "Node",
    "instance": "Exporter",
    "gpu": "GPU",
    "uuid": "GPU UUID",
    "mig_uuid": "MIG instance",
    "mig_profile": "MIG profile",
    "gpu_instance_id": "GPU instance",
    "gpu_name": "Model",
    "gpu_model": "GPU model",
    "model": "Model",
    "slices": "Compute slices",
    "device": "Device",
    "devices": "Devices",
    "current": "Holds now",
    # what it does
    "class": "Bound by",
    "communication": "Communication",
    "sm_active": "SM active",
    "kernel_time": "Kernel time",
    "kernel_time_note": "Kernel time note",
    "memory_used": "Memory used",
    "dram_active": "DRAM active",
    "pipe_active": "Busiest pipe active",
    "idle_for": "Idle for",
    "idle_share": "Idle share",
    "first_seen": "First seen",
    "last_seen": "Last seen",
    "mode": "Sharing",
    "note": "Note",
    "replicas": "Replicas",
    "pods": "Pods",
    # money and time
    "gpu_hours": "GPU-hours",
    "gpu_hours_held": "GPU-hours held",
    "gpu_hours_saved": "GPU-hours saveable",
    "cost_usd": "Cost (USD)",
    "cost_saved_usd": "Saving (USD)",
    # advice
    "recommendation": "Advice",
    "target": "Target",
    "reason": "Reason",
    "memory_peak_gib": "Peak memory (GiB)",
    "sm_p95": "SM active p95",
    "sm_mean": "SM active mean",
    "dram_p95": "DRAM active p95",
    # health
    "probe": "Probe",
    "bandwidth": "Bandwidth",
    "expected": "Expected",
    "efficiency": "Efficiency",
    "vs_peers": "vs peers",
    "slow": "Slow",
    "xid": "Xid",
    "events": "Events",
    "errors": "Errors",
    "severity": "Severity",
    "reasons": "Reasons",
    "share": "Share of the range",
    "stage": "Exporter stage",
    # serving (dashboard/advisor/serving_figures.py)
    "role": "Role",
    "gpu_equivalents": "GPUs",
    "output_tokens_per_second": "Out tok/s",
    "input_tokens_per_second": "In tok/s",
    "output_tokens_per_gpu_second": "Out tok/s per GPU",
    "input_tokens_per_gpu_second": "In tok/s per GPU",
    "energy_per_million": "Energy per M tok",
    "usd_per_million": "Cost per M tok",
    "ttft_p50_ms": "TTFT p50",
    "ttft_p95_ms": "TTFT p95",
    "itl_p50_ms": "ITL p50",
    "itl_p95_ms": "ITL p95",
    "itl_target_ms": "ITL p95 target",
    "itl_target_source": "ITL target from",
    "itl_p95_window_ms": "ITL p95 (window)",
    "itl_target_status": "ITL against target",
    "ttft_target_ms": "TTFT p95 target",
    "ttft_p95_window_ms": "TTFT p95 (window)",
    "ttft_target_status": "TTFT against target",
    "kv_cache_mean": "KV cache (mean)",
    "kv_cache_max": "KV cache (fullest pod)",
    "running": "Running",
    "queued": "Queued",
    "requests_per_second": "Requests/s",
    "class_mix": "Pods by class now",
    "serving_engine": "Engine",
    "nvlink_kv": "NVLink (sent + received)",
    "nvlink_utilization": "NVLink use",
    "nic_kv": "NICs (sent + received)",
    "nic_utilization": "NIC use",
}
"""The header of every column name the pages show (:func:`header`); a name not here reads as its
words (:func:`default_header`)."""

FORMATS: dict[str, str] = {
    "gpu_hours": "%,.2f",
    "gpu_hours_held": "%,.1f",
    "gpu_hours_saved": "%,.1f",
    "cost_usd": "dollar",
    "cost_saved_usd": "dollar",
    "memory_peak_gib": "%,.1f GiB",
    "sm_active": "percent",
    "kernel_time": "percent",
    "idle_share": "percent",
    "sm_p95": "percent",
    "sm_mean": "percent",
    "dram_p95": "percent",
    "efficiency": "percent",
    "vs_peers": "percent",
    "share": "percent",
    "gpu_equivalents": "%,.2f",
    "output_tokens_per_second": "%,.0f",
    "input_tokens_per_second": "%,.0f",
    "output_tokens_per_gpu_second": "%,.0f",
    "input_tokens_per_gpu_second": "%,.0f",
    "energy_per_million": "%,.2f MJ",
    "usd_per_million": "dollar",
    "ttft_p50_ms": "%,.0f ms",
    "ttft_p95_ms": "%,.0f ms",
    "itl_p50_ms": "%,.1f ms",
    "itl_p95_ms": "%,.1f ms",
    "itl_target_ms": "%,.1f ms",
    "itl_p95_window_ms": "%,.1f ms",
    "ttft_target_ms": "%,.0f ms",
    "ttft_p95_window_ms": "%,.0f ms",
    "kv_cache_mean": "percent",
    "kv_cache_max": "percent",
    "running": "%,.1f",
    "queued": "%,.1f",
    "requests_per_second": "%,.2f",
    "nvlink_utilization": "percent",
    "nic_utilization": "percent",
}
"""How a known numeric column's values read (Streamlit NumberColumn formats: ``percent`` of a 0..1
ratio, ``dollar``, or printf style with ``,`` for thousands separators); other numbers ``localized``
(thousands separators, at most three decimals)."""

NO_PRICE = "no price per GPU-hour is set (start the dashboard with --price-per-gpu-hour MODEL=USD)"
"""What a cost reads as without a price: a hint in a caption beside the KPIs, never a KPI's value."""

DEFAULT_MISSING = "–"
"""What a missing value reads as where the caller gives no reason (an en dash, never ``None``)."""

_WORDS = {
    "gpu": "GPU",
    "gpus": "GPUs",
    "mig": "MIG",
    "sm": "SM",
    "uuid": "UUID",
    "id": "ID",
    "pci": "PCI",
    "nic": "NIC",
    "nics": "NICs",
    "numa": "NUMA",
    "dram": "DRAM",
    "ecc": "ECC",
    "usd": "(USD)",
    "gib": "(GiB)",
    "mps": "MPS",
    "rdma": "RDMA",
    "gdr": "GPUDirect RDMA",
    "pcie": "PCIe",
    "nvlink": "NVLink",
}


def default_header(name: str) -> str:
    """A column name the map does not know, in words: ``memory_used_bytes`` → ``Memory used bytes``,
    ``pci_bus_id`` → ``PCI bus ID`` (acronyms in capitals, the first letter capitalised)."""
    words = [_WORDS.get(w.lower(), w) for w in str(name).replace("-", "_").split("_") if w]
    if not words:
        return str(name)
    first = words[0]
    words[0] = first if first[:1].isupper() else first[:1].upper() + first[1:]
    return " ".join(words)


def header(name: str) -> str:
    """The header a person reads for column ``name`` (:data:`HEADERS`, else :func:`default_header`)."""
    return HEADERS.get(name) or default_header(name)


_PRINTF = re.compile(r"%(?P<flags>[-+ 0,']*)(?P<width>\d*)(?:\.(?P<prec>\d+))?(?P<kind>[dfegsi])")


def format_number(value: float, fmt: str | None) -> str:
    """``value`` as Streamlit's NumberColumn ``fmt`` would draw it (en locale), for a column that
    becomes text because it has missing values: ``localized``/None (``12,884,901,888``, at most
    three decimals), ``percent`` of a ratio (``42.5%``), ``dollar`` (``$1,234.50``),
    ``accounting``, ``plain``, or printf style with ``,`` for thousands (``%,.2f GiB``)."""
    v = float(value)
    if fmt in (None, "localized", "accounting") or not fmt:
        if fmt == "accounting":
            return f"{v:,.2f}"
        text = f"{v:,.3f}".rstrip("0").rstrip(".")
        return "0" if text == "-0" else text
    if fmt == "percent":
        return fmt_percent(v)
    if fmt == "dollar":
        return f"-${-v:,.2f}" if v < 0 else f"${v:,.2f}"
    if fmt == "plain":
        return f"{v:g}"
    m = _PRINTF.search(fmt)
    if m is None:
        return f"{v:,.3f}".rstrip("0").rstrip(".")
    comma = "," if ("," in m["flags"] or "'" in m["flags"]) else ""
    kind = m["kind"]
    if kind in ("d", "i"):
        body = f"{round(v):{comma}d}"
    elif kind == "s":
        body = f"{v:g}"
    else:
        prec = m["prec"] if m["prec"] is not None else "6"
        body = f"{v:{comma}.{prec}{kind}}"
    return (fmt[: m.start()] + body + fmt[m.end() :]).replace("%%", "%")


def _config_type(config: Any) -> str:
    """The column type of a Streamlit column setting (``number``, ``progress``, ``text``…), "" for none."""
    if not isinstance(config, dict):
        return ""
    return str((config.get("type_config") or {}).get("type") or "")


Missing = dict[str, str | Sequence[str]]
"""Why values are missing, per column: one word for the column, or one per row."""


def _one_percent_style(setting: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """``setting`` with its percentage in the pages' one style (:data:`PERCENT_FORMAT`), and the
    factor its values need: 100 for a 0..1 ratio (Streamlit's ``percent`` format), 1 for a column
    already in percent (a ``%…f%%`` printf format)."""
    tc = dict(setting.get("type_config") or {})
    fmt = str(tc.get("format") or "")
    if fmt == "percent":
        scale = 100.0
        if tc.get("type") == "progress":
            tc["min_value"] = 100.0 * float(tc.get("min_value") or 0.0)
            tc["max_value"] = 100.0 * float(1.0 if tc.get("max_value") is None else tc["max_value"])
    elif fmt.endswith("%%") and fmt != PERCENT_FORMAT:
        scale = 1.0
    else:
        return setting, 1.0
    tc["format"] = PERCENT_FORMAT
    return {**setting, "type_config": tc}, scale


def table_frame(
    df: pd.DataFrame, column_config: dict[str, Any] | None = None, missing: Missing | None = None
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """What :func:`table` draws: ``df`` with its missing values in words, and a setting for every
    column (the caller's first; else one with the column's :func:`header` and its number format).

    A numeric column with a missing value becomes text (its numbers as its format draws them, right
    aligned), since a number column can only draw ``None`` there; ``missing`` names the word per
    column (why it is missing: ``{"cost_usd": "no price set"}``, or a word per row), :data:`DEFAULT_MISSING`
    otherwise."""
    given = dict(column_config or {})
    words = dict(missing or {})
    out = df.copy()
    config: dict[str, Any] = {}
    for name in out.columns:
        col = str(name)
        setting = given.get(col, ...)
        if setting is None:  # the caller hides it
            config[col] = None
            continue
        if isinstance(setting, str):
            setting = st.column_config.Column(setting)
        values = out[name]
        numeric = pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
        if setting is ...:
            if numeric:
                setting = st.column_config.NumberColumn(header(col), format=FORMATS.get(col, "localized"))
            else:
                setting = st.column_config.Column(header(col))
        else:
            setting = dict(setting)
            if not setting.get("label"):
                setting["label"] = header(col)
        setting, scale = _one_percent_style(setting)
        if scale != 1.0 and numeric:
            out[name] = values = values * scale
        gaps = values.isna()
        if not gaps.any():
            config[col] = setting
            continue
        why = words.get(col, DEFAULT_MISSING)
        word = [why] * len(out) if isinstance(why, str) else [str(w) for w in why]
        kind = _config_type(setting)
        if numeric or kind in ("number", "progress"):
            fmt = (setting.get("type_config") or {}).get("format")
            if kind == "progress" and not fmt:
                top = (setting.get("type_config") or {}).get("max_value")
                fmt = "percent" if top in (None, 1, 1.0) else "localized"
            nums = pd.to_numeric(values, errors="coerce")
            out[name] = [w if g else format_number(float(v), fmt) for v, g, w in zip(nums, gaps, word, strict=True)]
            setting = st.column_config.TextColumn(
                setting.get("label"),
                help=setting.get("help"),  # inert: the caller's setting, checked where it is written
                width=setting.get("width"),
                alignment="right",
            )
        else:
            out[name] = [w if g else v for v, g, w in zip(values, gaps, word, strict=True)]
        config[col] = setting
    return out, config


def dataframe(df: pd.DataFrame, *, column_config: dict[str, Any] | None = None, **kwargs: Any) -> None:
    """``st.dataframe(df, column_config=..., **kwargs)`` with its percentages in the pages' one style
    (:data:`PERCENT_FORMAT`): for the tables drawn without :func:`table`."""
    config = dict(column_config or {})
    out = df
    for name, setting in list(config.items()):
        if not isinstance(setting, dict):
            continue
        config[name], scale = _one_percent_style(setting)
        if scale != 1.0 and name in out.columns and pd.api.types.is_numeric_dtype(out[name]):
            out = out.assign(**{name: out[name] * scale})
    st.dataframe(out, column_config=config, **kwargs)


@dataclass(frozen=True)
class TableLayout:
    """How a table is laid out so that it reads on a 1,440 px screen: its ``primary`` columns (who and
    how much: the GPU page link, node, GPU index, pod or job, the key figure) first, in this order;
    its ``detail`` columns not in the table but in an expander under it, each row named again by its
    ``primary`` who-columns (:data:`WHO`). Other columns follow the primary ones."""

    primary: tuple[str, ...]
    detail: tuple[str, ...] = ()
    then: tuple[str, ...] | None = None
    """The columns that follow the primary ones in the table; None: every column neither primary
    nor detail. With a tuple, every other column goes to the expander too."""


WHO = (
    GPU_LINK,
    "job",
    "node",
    "instance",
    "gpu",
    "GPU",
    "namespace",
    "pod",
    "device",
    "probe",
    "reason",
    "model",
    "role",
)
"""Columns that say whose a row is: the ones a detail table repeats from the primary columns (a
served model's rows are its model's and role's)."""

TABLES: dict[str, TableLayout] = {
    # Fleet
    "idle_names": TableLayout((GPU_LINK, "node", "gpu", "pods", "idle_for", "sm_active"), ("owners",)),
    "slow_names": TableLayout((GPU_LINK, "node", "gpu", "sm_clock", "why", "pods"), ("owners",)),
    # Workloads
    "idle_table": TableLayout(
        (GPU_LINK, "node", "gpu", "namespace", "pod", "idle_for", "sm_active"),
        ("container", "workload", "uuid", "mig_uuid"),
    ),
    "launch_table": TableLayout((GPU_LINK, "node", "gpu", "namespace", "pod"), ("container", "uuid", "mig_uuid")),
    "pod_table": TableLayout(
        (GPU_LINK, "node", "gpu", "namespace", "pod", "sm_active", "kernel_time", "memory_used", "class"),
        ("container", "workload_kind", "resource", "uuid", "mig_uuid"),
    ),
    "waste_table": TableLayout(("namespace", "gpu_hours", "cost_usd")),
    # Efficiency
    "leaf_table": TableLayout(
        (GPU_LINK, "node", "gpu", "holders", "class", "dram_active", "pipe_active"), ("uuid", "mig_uuid")
    ),
    # Jobs
    "jobs_table": TableLayout(
        ("job", "GPUs", "nodes", "GPU-hours", "activity", "busy", "communication"),
        ("cluster", "activity range", "class mix", "memory headroom", "pods"),
    ),
    # Sharing
    "mig_table": TableLayout((GPU_LINK, "node", "gpu", "mig_profile", "holders"), ("mig_uuid",)),
    "shared_table": TableLayout((GPU_LINK, "node", "gpu", "mode", "namespace", "pod", "kernel_time")),
    # Health
    "probe_table": TableLayout(
        (GPU_LINK, "node", "gpu", "probe", "bandwidth", "efficiency", "vs_peers", "slow"),
        ("gpu_name", "mig_profile", "peers", "uuid", "mig_uuid"),
    ),
    "throttle_table": TableLayout((GPU_LINK, "node", "gpu", "reason", "share"), ("uuid",)),
    # GPU page
    "gpu_pods": TableLayout(("namespace", "pod", "workload", "first_seen", "last_seen", "current")),
    # Right-sizing
    "rs_table": TableLayout(
        ("namespace", "workload", "recommendation", "target", "gpu_hours_saved", "cost_saved_usd"), then=("reason",)
    ),
    # Job
    "job_gpus": TableLayout(
        (GPU_LINK, "node", "GPU", "pod", "activity", "busy", "communication", "SM clock"),
        ("slowdown", "memory used"),
    ),
    # Network
    "nic_table": TableLayout(("node", "device", "state", "tx", "rx", "line_rate", "utilization")),
    "pod_nics": TableLayout(("node", "namespace", "pod", "nics", "tx", "rx", "communication")),
    "gdr_table": TableLayout((GPU_LINK, "node", "gpu", "ready", "nearest", "reason"), ("uuid",)),
    # Serving
    "serving_models": TableLayout(
        (
            "model",
            "role",
            "replicas",
            "gpu_equivalents",
            "gpu_model",
            "output_tokens_per_second",
            "output_tokens_per_gpu_second",
            "energy_per_million",
            "usd_per_million",
        ),
        ("namespace", "input_tokens_per_second", "input_tokens_per_gpu_second"),
    ),
    "serving_latency": TableLayout(
        ("namespace", "model", "role", "ttft_p95_ms", "itl_p95_ms", "kv_cache_max", "queued", "class_mix"),
        ("ttft_p50_ms", "itl_p50_ms", "kv_cache_mean", "running", "requests_per_second"),
    ),
    "serving_links": TableLayout(
        ("namespace", "model", "role", "nvlink_kv", "nvlink_utilization", "nic_kv", "nic_utilization")
    ),
    # Job and GPU pages: their serving pods (dashboard/serving_rows.py)
    "serving_pods": TableLayout(
        (
            "pod",
            "model",
            "role",
            "output_tokens_per_second",
            "output_tokens_per_gpu_second",
            "itl_p95_ms",
            "kv_cache_mean",
        ),
        (
            "energy_per_million",
            "ttft_p95_ms",
            "namespace",
            "serving_engine",
            "input_tokens_per_second",
            "input_tokens_per_gpu_second",
        ),
    ),
    "serving_advice": TableLayout(
        (
            "model",
            "role",
            "recommendation",
            "itl_p95_window_ms",
            "itl_target_ms",
            "itl_target_status",
            "ttft_target_ms",
            "ttft_target_status",
        ),
        # where the ITL target comes from, and the TTFT p95 the TTFT status holds: in the expander,
        # so that the targets and their met or missed fit 1,440 px
        ("itl_target_source", "ttft_p95_window_ms"),
    ),
}
"""Every table's :class:`TableLayout`, by its ``key``: the one place a page declares the columns that
must fit 1,440 px (the browser tests check each primary column is drawn inside the first 1,440 px)."""

TABLE_CONTAINER = "gpulens-table-{key}-p{columns}"
"""The key of the container :func:`table` draws a table in: its ``key`` and where its primary
columns are among the drawn ones (0-based, ``_``-separated: ``p0_1_2``); ``st-key-…`` on the page,
which the browser tests read."""


def table(
    df: pd.DataFrame,
    *,
    key: str | None = None,
    column_config: dict[str, Any] | None = None,
    missing: Missing | None = None,
) -> None:
    """Draw ``df`` as a table a person reads (:func:`table_frame`): every header in words, numbers
    with thousands separators, missing values as the word ``missing`` gives for the column (else
    :data:`DEFAULT_MISSING`), the caller's ``column_config`` kept; no index. A table with a
    :data:`TABLES` layout shows its primary columns first and its detail columns in an expander."""
    layout = TABLES.get(key or "")
    if layout is None:
        shown, config = table_frame(df, column_config, missing)
        st.dataframe(shown, hide_index=True, key=key, column_config=config)
        return
    hidden = {c for c, v in (column_config or {}).items() if v is None}
    primary = [c for c in layout.primary if c in df.columns and c not in hidden]
    detail = [c for c in layout.detail if c in df.columns and c not in hidden]
    rest = [c for c in df.columns if c not in primary and c not in detail]
    if layout.then is not None:
        detail += [c for c in rest if c not in layout.then and c not in hidden and c not in WHO]
        rest = [c for c in layout.then if c in rest]
    main = df[[*primary, *rest]]
    shown, config = table_frame(main, column_config, _rows_missing(missing, main))
    drawn = [c for c in shown.columns if config.get(str(c)) is not None]
    marks = "_".join(str(drawn.index(c)) for c in primary if c in drawn)
    with st.container(key=TABLE_CONTAINER.format(key=key, columns=marks)):
        st.dataframe(shown, hide_index=True, key=key, column_config=config)
    if detail and len(df):
        who = [c for c in primary if c in WHO]
        more = df[[*who, *detail]]
        words = ", ".join(header(c) if not isinstance((column_config or {}).get(c), dict) else
                          str((column_config or {})[c].get("label") or header(c)) for c in detail)  # fmt: skip
        with st.expander(f"More columns: {inert(words)}"):
            shown, config = table_frame(more, column_config, _rows_missing(missing, more))
            st.dataframe(shown, hide_index=True, key=f"{key}_more", column_config=config)


def _rows_missing(missing: Missing | None, df: pd.DataFrame) -> Missing | None:
    """``missing`` for the columns of ``df`` only."""
    return None if missing is None else {c: w for c, w in missing.items() if c in df.columns}


EVIDENCE_WORDS: dict[str, tuple[str, str]] = {
    # evidence key -> (what it is, how its value reads: text, count, gib, percent, times, hours)
    "gpu_model": ("GPU model", "text"),
    "mig_profile": ("Holds", "profile"),
    "devices": ("Devices held", "count"),
    "memory_peak_bytes": ("Peak GPU memory used", "gib"),
    "memory_needed_bytes": ("Memory needed (peak x headroom)", "gib"),
    "sm_active_p95": ("SM active, 95th percentile", "percent"),
    "sm_active_mean": ("SM active, mean", "percent"),
    "sm_needed_fraction": ("SMs needed (p95 x headroom), share of the GPU", "percent"),
    "dram_active_p95": ("DRAM active, 95th percentile", "percent"),
    "pcie_utilization_p95": ("PCIe use, 95th percentile", "percent"),
    "nvlink_utilization_p95": ("NVLink use, 95th percentile", "percent"),
    "idle_share": ("Idle, share of the time held", "percent"),
    "transfer_bound_share_of_busy": ("Transfer-bound, share of busy time", "percent"),
    "memory_bound_share_of_busy": ("Memory-bound, share of busy time", "percent"),
    "new_gpu_share": ("Share of a GPU it would hold", "percent"),
    "gpu_hours_held": ("GPU-hours held", "hours"),
    "gpu_hours_idle": ("GPU-hours idle", "hours"),
    "headroom": ("Memory headroom", "times"),
    "compute_headroom": ("Compute headroom", "times"),
    "bandwidth_ratio": ("HBM bandwidth of the faster GPU", "times"),
    "no_mig_because": ("Why no MIG slice", "text"),
}
"""The right-sizing evidence (dashboard/advisor/engine.py ``Recommendation.evidence``) in words and
units; ``boundness_<class>`` keys read as "Bound by <class>, share of the time held"."""


def evidence_table(evidence: dict[str, Any]) -> pd.DataFrame:
    """One workload's right-sizing evidence as rows a person reads (``What``, ``Value``): memory in
    GiB, shares in %, headroom as ``1.2x``, the MIG profile by name or ``whole GPU``, an unmeasured
    figure as ``not measured``; never the raw dictionary."""
    rows: list[tuple[str, str]] = []
    for key, value in evidence.items():
        if key == "workload":
            continue
        what, kind = EVIDENCE_WORDS.get(key, ("", "text"))
        if key.startswith("boundness_"):
            what, kind = f"Bound by {key.removeprefix('boundness_')}, share of the time held", "percent"
        elif not what:
            what, kind = default_header(key), ("text" if isinstance(value, str) else "number")
        rows.append((what, _evidence_value(value, kind)))
    return pd.DataFrame(rows, columns=["What", "Value"])


def _evidence_value(value: Any, kind: str) -> str:
    """One evidence figure as :func:`evidence_table` shows it."""
    if kind == "profile":
        return str(value) if value else "whole GPU"
    if value is None or (isinstance(value, float) and value != value):
        return "not measured"
    if kind == "text":
        return str(value)
    v = float(value)
    if kind == "gib":
        return f"{v / 2**30:,.1f} GiB"
    if kind == "percent":
        return fmt_percent(v)
    if kind == "times":
        return f"{v:,.2f}x"
    if kind == "hours":
        return f"{v:,.1f}"
    if kind == "count":
        return f"{v:,.0f}"
    return format_number(v, "localized")
