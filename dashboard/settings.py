"""Dashboard settings: read from GPULENS_DASHBOARD_* environment variables (set by the CLI).

``streamlit run`` owns the command line, so the CLI passes its flags to the app through the
environment; the same variables work when the app runs under Streamlit directly or in tests.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from dashboard import prometheus_auth
from dashboard.prometheus_auth import PrometheusAuth

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


def parse_prices(text: str) -> dict[str, float]:
    """``H200=3.5,A100=1.2,*=2`` -> {"H200": 3.5, ...}; ValueError names the bad entry."""
    out: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        model, sep, price = item.rpartition("=")
        if not sep or not model.strip():
            raise ValueError(f"price entry {item!r} is not MODEL=USD")
        try:
            value = float(price)
        except ValueError as exc:
            raise ValueError(f"price entry {item!r}: {price!r} is not a number") from exc
        if value < 0:
            raise ValueError(f"price entry {item!r} is negative")
        out[model.strip()] = value
    return out


def _float(env: Mapping[str, str], key: str, default: float) -> float:
    raw = env.get(ENV_PREFIX + key)
    if raw is None or raw == "":
        return default
    return float(raw)


def _max_marks(raw: str | None) -> int:
    """``GPULENS_DASHBOARD_MAX_MARKS`` (unset or empty: the default); ValueError naming it."""
    if not raw:
        return DEFAULT_MAX_MARKS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{ENV_PREFIX}MAX_MARKS={raw!r}: a whole number of at least 1")
    return value


def from_env(env: Mapping[str, str] | None = None) -> DashboardSettings:
    """Settings from the environment; ValueError on malformed values."""
    env = os.environ if env is None else env
    scrape = tuple(u.strip() for u in env.get(ENV_PREFIX + "SCRAPE", "").split(",") if u.strip())
    return DashboardSettings(
        prometheus_url=env.get(ENV_PREFIX + "PROMETHEUS") or None,
        scrape_urls=scrape,
        prices_per_gpu_hour=parse_prices(env.get(ENV_PREFIX + "PRICES", "")),
        refresh_seconds=_float(env, "REFRESH_SECONDS", 30.0),
        timeout_seconds=_float(env, "TIMEOUT_SECONDS", 10.0),
        scrape_interval_seconds=_float(env, "SCRAPE_INTERVAL_SECONDS", 5.0),
        max_marks=_max_marks(env.get(ENV_PREFIX + "MAX_MARKS")),
        prometheus_auth=prometheus_auth.from_env(env, ENV_PREFIX),
    )


def to_env(settings: DashboardSettings) -> dict[str, str]:
    """The environment that makes from_env() return ``settings`` (used by the CLI)."""
    env = {
        ENV_PREFIX + "PRICES": ",".join(f"{k}={v:g}" for k, v in settings.prices_per_gpu_hour.items()),
        ENV_PREFIX + "REFRESH_SECONDS": f"{settings.refresh_seconds:g}",
        ENV_PREFIX + "TIMEOUT_SECONDS": f"{settings.timeout_seconds:g}",
        ENV_PREFIX + "SCRAPE_INTERVAL_SECONDS": f"{settings.scrape_interval_seconds:g}",
        ENV_PREFIX + "MAX_MARKS": str(settings.max_marks),
        ENV_PREFIX + "PROMETHEUS": settings.prometheus_url or "",
        ENV_PREFIX + "SCRAPE": ",".join(settings.scrape_urls),
        **prometheus_auth.to_env(settings.prometheus_auth, ENV_PREFIX),
    }
    return env
