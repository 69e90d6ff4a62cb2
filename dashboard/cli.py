"""``gpulens-dashboard``: parse flags, then run ``streamlit run dashboard/app.py`` headless.

Flags reach the app as GPULENS_DASHBOARD_* environment variables (dashboard.settings), because
``streamlit run`` owns the command line. Every value flag has such a twin, read when the flag is not
given. A bad value (dashboard.inputs says how each is written) exits 2 with a message naming the
flag or the variable. Prints the URL to open.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dashboard.inputs import (
    ITL_TARGET_SECONDS,
    MAX_MARKS,
    PORT,
    PRICE_USD,
    QUERY_TIMEOUT_SECONDS,
    TTFT_TARGET_SECONDS,
    duration_span,
    http_url,
    listen_host,
    named,
    parse_itl_targets,
    parse_prices,
    parse_ttft_targets,
    plain,
    scrape_targets,
    whole_between,
)
from dashboard.settings import (
    ENV_PREFIX,
    PARSE_MAX_MARKS,
    PARSE_REFRESH,
    PARSE_SCRAPE_INTERVAL,
    PARSE_TIMEOUT,
    REFRESH_SECONDS,
    SCRAPE_INTERVAL_SECONDS,
    DashboardSettings,
    to_env,
)
from dashboard.sources import prometheus_auth

APP = Path(__file__).with_name("app.py")


@dataclass(frozen=True)
class Option:
    """A value flag with its ``GPULENS_DASHBOARD_*`` twin: how its text is read, and its default."""

    flag: str
    env_key: str
    """The twin's name after ``GPULENS_DASHBOARD_``."""
    parse: Callable[[str], Any]
    default: str
    metavar: str
    help: str
    """What it means and the range it takes (the help text adds the twin and the default)."""

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.env_key


_BASE = DashboardSettings()
OPTIONS: tuple[Option, ...] = (
    Option("--port", "PORT", whole_between(*PORT), "8501", "PORT", f"port to listen on; {PORT[0]}..{PORT[1]}"),
    Option("--address", "ADDRESS", listen_host, "0.0.0.0", "ADDRESS", "IP address or host name to listen on"),
    Option(
        "--price-per-gpu-hour",
        "PRICES",
        parse_prices,
        "",
        "MODEL=USD,...",
        "cost of a GPU-hour per model name (substring match, '*' = any other), e.g. 'H200=3.5,*=2'; "
        f"USD {plain(PRICE_USD[0])}..{plain(PRICE_USD[1])}, plain decimals",
    ),
    Option(
        "--itl-target",
        "ITL_TARGETS",
        parse_itl_targets,
        "",
        "MODEL=DURATION,...",
        "inter-token latency p95 target per served model (the engine's model name), e.g. "
        f"'llama-3-8b=50ms'; {duration_span(*ITL_TARGET_SECONDS)}; the Serving page holds each model against "
        "it, others against today's p95 + 25%%",
    ),
    Option(
        "--ttft-target",
        "TTFT_TARGETS",
        parse_ttft_targets,
        "",
        "MODEL=DURATION,...",
        "time-to-first-token p95 target per served model (the engine's model name), e.g. "
        f"'llama-3-8b=800ms'; {duration_span(*TTFT_TARGET_SECONDS)}; the Serving page holds each model against "
        "it; others have no TTFT target",
    ),
    Option(
        "--refresh",
        "REFRESH_SECONDS",
        PARSE_REFRESH,
        plain(_BASE.refresh_seconds),
        "DURATION",
        f"auto-refresh period: seconds or 30s, 2m, 1h; 0 = off, else {duration_span(*REFRESH_SECONDS)}",
    ),
    Option(
        "--timeout",
        "TIMEOUT_SECONDS",
        PARSE_TIMEOUT,
        plain(_BASE.timeout_seconds),
        "DURATION",
        f"per-query timeout: seconds or 500ms, 1m; {duration_span(*QUERY_TIMEOUT_SECONDS)}",
    ),
    Option(
        "--scrape-interval",
        "SCRAPE_INTERVAL_SECONDS",
        PARSE_SCRAPE_INTERVAL,
        plain(_BASE.scrape_interval_seconds),
        "DURATION",
        f"with --scrape: how often each exporter is scraped; {duration_span(*SCRAPE_INTERVAL_SECONDS)}",
    ),
    Option(
        "--max-marks",
        "MAX_MARKS",
        PARSE_MAX_MARKS,
        str(_BASE.max_marks),
        "N",
        "most GPUs a chart draws a mark each for; above it the Fleet heatmap and the roofline show "
        f"distributions; {MAX_MARKS[0]}..{MAX_MARKS[1]}",
    ),
)
"""Every value flag: read from the command line, else from its twin (unset or empty: the default)."""


def build_parser() -> argparse.ArgumentParser:
    """The parser; value flags keep their text (None when not given): :func:`settings_from_args` and
    :func:`listen_from_args` read them, so a bad one is a ValueError naming the flag or its twin."""
    p = argparse.ArgumentParser(
        prog="gpulens-dashboard",
        description="gpulens dashboard: fleet, efficiency, workloads, sharing and health of GPUs.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--prometheus", metavar="URL", help="Prometheus-compatible HTTP API base URL (http:// or https://)"
    )
    src.add_argument(
        "--scrape",
        metavar="URL[,URL...]",
        help="scrape these exporters' /metrics directly, keeping an in-memory history (demo, single node); "
        "http[s]://HOST[:PORT][/PATH], or HOST:PORT",
    )
    for o in OPTIONS:
        p.add_argument(o.flag, metavar=o.metavar, default=None, help=f"{o.help} (env {o.env}; default {o.default!r})")
    prometheus_auth.add_arguments(p, ENV_PREFIX)
    return p


def _value(args: argparse.Namespace, option: Option, env: Mapping[str, str]) -> Any:
    """``option`` from the command line, else its twin in ``env`` (unset or empty: the default)."""
    given = getattr(args, option.dest)
    if given is not None:
        return named(option.parse, option.flag, given)
    if env.get(option.env):
        return named(option.parse, option.env, env[option.env])
    return option.parse(option.default)


def _option(flag: str) -> Option:
    return next(o for o in OPTIONS if o.flag == flag)


def settings_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> DashboardSettings:
    """Validated settings; ValueError names a bad flag, or the environment variable it came from."""
    env = os.environ if env is None else env
    prometheus = None if args.prometheus is None else named(http_url, "--prometheus", args.prometheus)
    scrape = () if args.scrape is None else named(scrape_targets, "--scrape", args.scrape)
    auth = prometheus_auth.from_args(args)
    if auth.configured and not args.prometheus:
        raise ValueError("the --prometheus-* authentication flags need --prometheus")
    return DashboardSettings(
        prometheus_url=prometheus,
        scrape_urls=scrape,
        prices_per_gpu_hour=_value(args, _option("--price-per-gpu-hour"), env),
        itl_targets_seconds=_value(args, _option("--itl-target"), env),
        ttft_targets_seconds=_value(args, _option("--ttft-target"), env),
        refresh_seconds=_value(args, _option("--refresh"), env),
        timeout_seconds=_value(args, _option("--timeout"), env),
        scrape_interval_seconds=_value(args, _option("--scrape-interval"), env),
        max_marks=_value(args, _option("--max-marks"), env),
        prometheus_auth=auth,
    )


def listen_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> tuple[str, int]:
    """Where Streamlit listens: (address, port); ValueError names a bad flag or variable."""
    env = os.environ if env is None else env
    return _value(args, _option("--address"), env), _value(args, _option("--port"), env)


def streamlit_argv(address: str, port: int) -> list[str]:
    """The ``streamlit run`` command (through dashboard.server, which turns Nagle's algorithm off on
    Streamlit's connections): headless, no usage statistics, no browser."""
    return [
        sys.executable,
        "-m",
        "dashboard.server",
        "run",
        str(APP),
        "--server.headless=true",
        "--browser.gatherUsageStats=false",
        f"--server.address={address}",
        f"--server.port={port}",
        "--server.runOnSave=false",
        "--server.fileWatcherType=none",
        # no full garbage collection after every page run: it holds the GIL while it walks the
        # scrape history (0.1-0.2 s), which stalls the server's websocket and file replies in
        # the middle of a first load; Python's own collector still runs
        "--runner.postScriptGC=false",
        "--client.toolbarMode=minimal",
        "--theme.base=light",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = settings_from_args(args)
        address, port = listen_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    env = {**os.environ, **to_env(cfg)}
    shown = "localhost" if address in ("0.0.0.0", "::") else f"[{address}]" if ":" in address else address
    print(f"gpulens dashboard: http://{shown}:{port}/  (source: {cfg.prometheus_url or ','.join(cfg.scrape_urls)})")
    sys.stdout.flush()
    # exec, not a child: signals (Ctrl-C, SIGTERM from Kubernetes) then reach Streamlit itself
    cmd = streamlit_argv(address, port)
    os.execve(cmd[0], cmd, env)
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
