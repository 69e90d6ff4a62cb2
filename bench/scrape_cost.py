"""Scrape latency, CPU and RSS of an exporter process: gpulens on the simulator (here) or any URL.

    .venv/bin/python -m bench.scrape_cost                       # gpulens sim h200x8 and mig7x8
    .venv/bin/python -m bench.scrape_cost --url http://H:P/metrics --pid PID --label other

Method: start the exporter (1 s collection interval), wait 5 s, then (1) N sequential scrapes ->
latency p50/p99/max (client-side, full body read); (2) a quiet 30 s with one scrape per second (what
Prometheus does) -> CPU seconds per second from /proc/PID/stat; RSS (10^6 bytes) at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from bench.procstat import cpu_seconds, rss_bytes
from bench.real_gpu import Figures, percentile, scrape
from tests.support.net import free_port
from tests.support.process import managed_process


def measure(url: str, pid: int, label: str, scrapes: int = 500, quiet_seconds: float = 30.0) -> Figures:
    """Measure an already running exporter."""
    lat = []
    body = b""
    for _ in range(scrapes):
        dt, body = scrape(url)
        lat.append(dt)
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    c0, t0 = cpu_seconds(pid), time.monotonic()
    while time.monotonic() - t0 < quiet_seconds:
        scrape(url)
        time.sleep(1.0)
    cpu = (cpu_seconds(pid) - c0) / (time.monotonic() - t0)
    return Figures(
        label=label,
        series=series,
        scrape_p50_ms=percentile(lat, 0.5) * 1e3,
        scrape_p99_ms=percentile(lat, 0.99) * 1e3,
        scrape_max_ms=max(lat) * 1e3,
        cpu_cores=cpu,
        rss_mb=rss_bytes(pid) / 1e6,
    )


def run_gpulens(args: list[str], label: str, scrapes: int, quiet: float) -> Figures:
    """Start ``python -m exporter`` with ``args`` on a free port and measure it."""
    port = free_port()
    argv = [sys.executable, "-m", "exporter", "--web.listen-address", f"127.0.0.1:{port}", *args]
    with managed_process(argv, f"http://127.0.0.1:{port}/readyz") as proc:
        time.sleep(5)
        return measure(f"http://127.0.0.1:{port}/metrics", proc.pid, label, scrapes, quiet)


def table(results: list[Figures]) -> str:
    """Markdown table of results."""
    rows = [
        "| exporter | series | scrape p50 ms | scrape p99 ms | scrape max ms | CPU (cores) | RSS MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r.label} | {r.series} | {r.scrape_p50_ms:.2f} | {r.scrape_p99_ms:.2f} | {r.scrape_max_ms:.2f} | "
            f"{r.cpu_cores:.4f} | {r.rss_mb:.1f} |"
        )
    return "\n".join(rows)


def main() -> int:
    """CLI."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url")
    ap.add_argument("--pid", type=int)
    ap.add_argument("--label", default="exporter")
    ap.add_argument("--scrapes", type=int, default=500)
    ap.add_argument("--quiet-seconds", type=float, default=30.0)
    ap.add_argument("--json", help="also write results here")
    a = ap.parse_args()
    if a.url:
        results = [measure(a.url, a.pid, a.label, a.scrapes, a.quiet_seconds)]
    else:
        results = [
            run_gpulens(
                ["--backend", "sim", "--sim.scenario", "h200x8"],
                "gpulens sim h200x8",
                a.scrapes,
                a.quiet_seconds,
            ),
            run_gpulens(
                ["--backend", "sim", "--sim.scenario", "mig7x8"],
                "gpulens sim mig7x8 (8x7 MIG, 200 procs)",
                a.scrapes,
                a.quiet_seconds,
            ),
        ]
    print(table(results))
    if a.json:
        Path(a.json).write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
