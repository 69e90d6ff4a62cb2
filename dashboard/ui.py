"""Shared page plumbing: the configured source, the sidebar's filters, cached queries and banners.

Every panel runs inside :func:`panel`, so a failed query becomes an ``st.error`` banner for that
panel only (never a traceback) and the rest of the page still renders.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pandas as pd
import streamlit as st

from dashboard.prometheus_source import PrometheusSource
from dashboard.scrape_source import ScrapeSource
from dashboard.settings import DashboardSettings, from_env
from dashboard.source import Filters, MetricSource, SourceError

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
POINTS_PER_CHART = 240

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


@st.cache_resource(show_spinner=False)
def _source(key: str, settings: DashboardSettings) -> MetricSource:
    if settings.prometheus_url:
        try:
            auth = settings.prometheus_auth.validate()
        except ValueError as exc:
            raise SourceError(f"bad Prometheus authentication setting: {exc}") from exc
        return PrometheusSource(settings.prometheus_url, timeout_s=settings.timeout_seconds, auth=auth)
    if settings.scrape_urls:
        return ScrapeSource(
            settings.scrape_urls, interval_s=settings.scrape_interval_seconds, timeout_s=settings.timeout_seconds
        ).start()
    raise SourceError("no data source configured: start with --prometheus URL or --scrape URL[,URL...]")


def settings() -> DashboardSettings:
    return from_env()


def source(cfg: DashboardSettings) -> MetricSource:
    """The process-wide source for ``cfg`` (one scraping thread per configuration)."""
    return _source(cfg.source_key, cfg)


@st.cache_data(ttl=10, show_spinner=False, max_entries=512)
def _cached(key: str, method: str, args: tuple[Any, ...], kwargs: tuple[tuple[str, Any], ...], _src: Any) -> Any:
    return getattr(_src, method)(*args, **dict(kwargs))


def fetch(ctx: PageContext, method: str, *args: Any, **kwargs: Any) -> Any:
    """``ctx.source.<method>(*args, **kwargs)`` through a short cache shared by all sessions
    (10 s; Filters and lists hash by value); failures are never cached."""
    result = _cached(ctx.settings.source_key, method, args, tuple(sorted(kwargs.items())), ctx.source)
    return result.copy() if isinstance(result, pd.DataFrame) else result


@contextmanager
def panel(what: str) -> Iterator[None]:
    """Run one panel; a SourceError or any other failure becomes a banner naming the panel."""
    try:
        yield
    except SourceError as exc:
        st.error(f"{what}: {exc}", icon=":material/warning:")
    except Exception as exc:  # a broken panel must not take the page down
        st.error(f"{what} could not be drawn: {type(exc).__name__}: {str(exc)[:300]}", icon=":material/warning:")


def no_data(what: str = "") -> None:
    """The standard empty-result message."""
    st.info(f"{what}: no data" if what else "no data")


def set_context(ctx: PageContext) -> None:
    st.session_state[_CTX] = ctx


def context() -> PageContext:
    ctx: PageContext = st.session_state[_CTX]
    return ctx


def page(title: str, body: Callable[[PageContext], None]) -> None:
    """Render a page: title, source banner or body (auto-refreshing when enabled), footer."""
    ctx = context()
    st.title(title)
    if ctx.source_error:
        st.error(ctx.source_error, icon=":material/cloud_off:")
        st.caption("The data source did not answer; pick another page or press Retry in the sidebar.")
        return

    def run() -> None:
        started = time.perf_counter()
        for problem in ctx.source.problems():
            st.warning(f"exporter not answering: {problem}", icon=":material/warning:")
        body(ctx)
        st.caption(f"gpulens · {ctx.source.description} · rendered in {time.perf_counter() - started:.2f} s")

    if ctx.refresh_s:
        st.fragment(run_every=ctx.refresh_s)(run)()
    else:
        run()


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
