"""Dashboard settings: read from GPULENS_DASHBOARD_* environment variables (set by the CLI).

``streamlit run`` owns the command line, so the CLI passes its flags to the app through the
environment; the same variables work when the app runs under Streamlit directly or in tests. Each
value is read by the same parser as its flag (``dashboard.inputs``), so a variable the CLI would
refuse is refused here too, with its name.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from dashboard.inputs import (
    MAX_MARKS,
    QUERY_TIMEOUT_SECONDS,
    duration_in,
    http_url,
    named,
    parse_itl_targets,
    parse_prices,
    parse_ttft_targets,
    plain,
    scrape_targets,
    whole_between,
)
from dashboard.sources import prometheus_auth
from dashboard.sources.prometheus_auth import PrometheusAuth

T = TypeVar("T")

ENV_PREFIX = "GPULENS_DASHBOARD_"

DEFAULT_MAX_MARKS = 4000
"""Most GPUs (or MIG instances) a chart draws a mark each for, by default (``--max-marks``). Above
it the Fleet heatmap and the roofline become distributions: a cell per GPU at 10,000 GPUs is a
pixel high and takes the browser about a second to draw (docs/benchmarks.md, "Fleet scale")."""


@dataclass(frozen=True)
class DashboardSettings:
    """What the app needs to know; units in the names."""

    prometheus_url: str | None = None
    scrape_urls: tuple[str, ...] = ()
    prices_per_gpu_hour: Mapping[str, float] = field(default_factory=dict)
    """USD per GPU-hour by model name (substring match, ``*`` = default)."""
    itl_targets_seconds: Mapping[str, float] = field(default_factory=dict)
    """Inter-token latency p95 target (s) by served model (the engine's model name, exactly): the
    Serving page holds each model against it and gives it to the advisor; others get today's p95
    plus the advisor's margin."""
    ttft_targets_seconds: Mapping[str, float] = field(default_factory=dict)
    """Time-to-first-token p95 target (s) by served model (the engine's model name, exactly): the
    Serving page holds each model against it and gives it to the advisor; others have no TTFT
    target (no default: prefill scales with compute, not with the decode's class mix)."""
    refresh_seconds: float = 30.0
    timeout_seconds: float = 10.0
    scrape_interval_seconds: float = 5.0
    max_marks: int = DEFAULT_MAX_MARKS
    """Most GPUs a chart draws a mark each for (:data:`DEFAULT_MAX_MARKS`)."""
    prometheus_auth: PrometheusAuth = field(default_factory=PrometheusAuth)
    """Credentials and TLS for ``prometheus_url`` (file paths, not secrets)."""

    @property
    def source_key(self) -> str:
        """Identity of the configured source, for caches."""
        if self.prometheus_url:
            return f"prom:{self.prometheus_url}:{hash(self.prometheus_auth):x}"
        return "scrape:" + ",".join(self.scrape_urls)


REFRESH_SECONDS = (1.0, 86400.0)
"""Range of the auto-refresh period (s), which may also be 0 (off)."""
SCRAPE_INTERVAL_SECONDS = (1.0, 3600.0)
"""Range of the interval between scrapes of an exporter with ``--scrape`` (s)."""
PARSE_REFRESH = duration_in(*REFRESH_SECONDS, zero=True)
"""``--refresh`` / ``REFRESH_SECONDS``: 0 (off) or 1s..1d."""
PARSE_TIMEOUT = duration_in(*QUERY_TIMEOUT_SECONDS)
"""``--timeout`` / ``TIMEOUT_SECONDS``: 100ms..1h per query."""
PARSE_SCRAPE_INTERVAL = duration_in(*SCRAPE_INTERVAL_SECONDS)
"""``--scrape-interval`` / ``SCRAPE_INTERVAL_SECONDS``: 1s..1h."""
PARSE_MAX_MARKS = whole_between(*MAX_MARKS)
"""``--max-marks`` / ``MAX_MARKS``: 1..1000000."""


def _read(env: Mapping[str, str], key: str, parse: Callable[[str], T], default: T) -> T:
    """``{ENV_PREFIX}{key}`` read by ``parse`` (unset or empty: ``default``); ValueError names it."""
    raw = env.get(ENV_PREFIX + key)
    if not raw:
        return default
    return named(parse, ENV_PREFIX + key, raw)


def from_env(env: Mapping[str, str] | None = None) -> DashboardSettings:
    """Settings from the environment; ValueError naming the variable on a malformed value."""
    env = os.environ if env is None else env
    base = DashboardSettings()
    return DashboardSettings(
        prometheus_url=_read(env, "PROMETHEUS", http_url, None),
        scrape_urls=_read(env, "SCRAPE", scrape_targets, ()),
        prices_per_gpu_hour=_read(env, "PRICES", parse_prices, {}),
        itl_targets_seconds=_read(env, "ITL_TARGETS", parse_itl_targets, {}),
        ttft_targets_seconds=_read(env, "TTFT_TARGETS", parse_ttft_targets, {}),
        refresh_seconds=_read(env, "REFRESH_SECONDS", PARSE_REFRESH, base.refresh_seconds),
        timeout_seconds=_read(env, "TIMEOUT_SECONDS", PARSE_TIMEOUT, base.timeout_seconds),
        scrape_interval_seconds=_read(
            env, "SCRAPE_INTERVAL_SECONDS", PARSE_SCRAPE_INTERVAL, base.scrape_interval_seconds
        ),
        max_marks=_read(env, "MAX_MARKS", PARSE_MAX_MARKS, base.max_marks),
        prometheus_auth=prometheus_auth.from_env(env, ENV_PREFIX),
    )


def to_env(settings: DashboardSettings) -> dict[str, str]:
    """The environment that makes from_env() return ``settings`` (used by the CLI)."""
    env = {
        ENV_PREFIX + "PRICES": ",".join(f"{k}={plain(v)}" for k, v in settings.prices_per_gpu_hour.items()),
        ENV_PREFIX + "ITL_TARGETS": ",".join(f"{k}={plain(v)}" for k, v in settings.itl_targets_seconds.items()),
        ENV_PREFIX + "TTFT_TARGETS": ",".join(f"{k}={plain(v)}" for k, v in settings.ttft_targets_seconds.items()),
        ENV_PREFIX + "REFRESH_SECONDS": plain(settings.refresh_seconds),
        ENV_PREFIX + "TIMEOUT_SECONDS": plain(settings.timeout_seconds),
        ENV_PREFIX + "SCRAPE_INTERVAL_SECONDS": plain(settings.scrape_interval_seconds),
        ENV_PREFIX + "MAX_MARKS": str(settings.max_marks),
        ENV_PREFIX + "PROMETHEUS": settings.prometheus_url or "",
        ENV_PREFIX + "SCRAPE": ",".join(settings.scrape_urls),
        **prometheus_auth.to_env(settings.prometheus_auth, ENV_PREFIX),
    }
    return env
