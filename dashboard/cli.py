"""``gpulens-dashboard``: parse flags, then run ``streamlit run dashboard/app.py`` headless.

Flags reach the app as GPULENS_DASHBOARD_* environment variables (dashboard.settings), because
``streamlit run`` owns the command line. Prints the URL to open.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from dashboard import prometheus_auth
from dashboard.settings import DEFAULT_MAX_MARKS, ENV_PREFIX, DashboardSettings, parse_prices, to_env

APP = Path(__file__).with_name("app.py")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpulens-dashboard",
        description="gpulens dashboard: fleet, efficiency, workloads, sharing and health of GPUs.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prometheus", metavar="URL", help="Prometheus-compatible HTTP API base URL (PromQL source)")
    src.add_argument(
        "--scrape",
        metavar="URL[,URL...]",
        help="scrape these exporters' /metrics directly, keeping an in-memory history (demo, single node)",
    )
    p.add_argument("--port", type=int, default=int(os.environ.get("GPULENS_DASHBOARD_PORT", "8501")))
    p.add_argument("--address", default=os.environ.get("GPULENS_DASHBOARD_ADDRESS", "0.0.0.0"))
    p.add_argument(
        "--price-per-gpu-hour",
        metavar="MODEL=USD,...",
        default=os.environ.get("GPULENS_DASHBOARD_PRICES", ""),
        help="cost of a GPU-hour per model name (substring match, '*' = any other), e.g. 'H200=3.5,*=2'",
    )
    p.add_argument("--refresh", type=float, default=30.0, metavar="SECONDS", help="auto-refresh period; 0 = off")
    p.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS", help="per-query timeout")
    p.add_argument("--scrape-interval", type=float, default=5.0, metavar="SECONDS")
    p.add_argument(
        "--max-marks",
        type=int,
        default=DEFAULT_MAX_MARKS,
        metavar="N",
        help="most GPUs a chart draws a mark each for; above it the Fleet heatmap and the roofline show distributions",
    )
    prometheus_auth.add_arguments(p, ENV_PREFIX)
    return p


def settings_from_args(args: argparse.Namespace) -> DashboardSettings:
    """Validated settings; ValueError explains a bad flag."""
    if args.timeout <= 0 or args.scrape_interval <= 0 or args.refresh < 0:
        raise ValueError("--timeout and --scrape-interval must be > 0, --refresh >= 0")
    if args.max_marks < 1:
        raise ValueError(f"--max-marks must be at least 1, not {args.max_marks}")
    scrape = tuple(u.strip() for u in (args.scrape or "").split(",") if u.strip())
    if args.scrape is not None and not scrape:
        raise ValueError("--scrape needs at least one URL")
    auth = prometheus_auth.from_args(args)
    if auth.configured and not args.prometheus:
        raise ValueError("the --prometheus-* authentication flags need --prometheus")
    return DashboardSettings(
        prometheus_url=args.prometheus,
        scrape_urls=scrape,
        prices_per_gpu_hour=parse_prices(args.price_per_gpu_hour),
        refresh_seconds=args.refresh,
        timeout_seconds=args.timeout,
        scrape_interval_seconds=args.scrape_interval,
        max_marks=args.max_marks,
        prometheus_auth=auth,
    )


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
    except ValueError as exc:
        parser.error(str(exc))
    env = {**os.environ, **to_env(cfg)}
    shown = "localhost" if args.address in ("0.0.0.0", "::", "") else args.address
    print(
        f"gpulens dashboard: http://{shown}:{args.port}/  (source: {cfg.prometheus_url or ','.join(cfg.scrape_urls)})"
    )
    sys.stdout.flush()
    # exec, not a child: signals (Ctrl-C, SIGTERM from Kubernetes) then reach Streamlit itself
    cmd = streamlit_argv(args.address, args.port)
    os.execve(cmd[0], cmd, env)
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
