"""Scrape latency, CPU and RSS of an exporter process: gpulens on the simulator (here) or any URL.

    .venv/bin/python -m bench.scrape_cost                       # gpulens sim h200x8 and mig7x8
    .venv/bin/python -m bench.scrape_cost --url http://H:P/metrics --pid PID --label other

Method: start the exporter (1 s collection interval), wait 5 s, then (1) N sequential scrapes ->
latency p50/p99 (client-side, full body read); (2) a quiet 30 s with one scrape per second (what
Prometheus does) -> CPU seconds per second from /proc/PID/stat; RSS at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.procstat import cpu_seconds, rss_bytes

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    """One exporter's figures."""

    label: str
    series: int
    scrape_p50_ms: float
    scrape_p99_ms: float
    cpu_cores: float
    rss_mb: float


def _scrape(url: str) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = resp.read()
    return time.perf_counter() - t0, body


def measure(url: str, pid: int, label: str, scrapes: int = 500, quiet_seconds: float = 30.0) -> Result:
    """Measure an already running exporter."""
    lat = []
    body = b""
    for _ in range(scrapes):
        dt, body = _scrape(url)
        lat.append(dt)
    lat.sort()
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    c0, t0 = cpu_seconds(pid), time.monotonic()
    while time.monotonic() - t0 < quiet_seconds:
        _scrape(url)
        time.sleep(1.0)
    cpu = (cpu_seconds(pid) - c0) / (time.monotonic() - t0)
    return Result(
        label=label,
        series=series,
        scrape_p50_ms=statistics.median(lat) * 1e3,
        scrape_p99_ms=lat[int(len(lat) * 0.99) - 1] * 1e3,
        cpu_cores=cpu,
        rss_mb=rss_bytes(pid) / 2**20,
    )


def run_gpulens(args: list[str], port: int, label: str, scrapes: int, quiet: float) -> Result:
    """Start ``python -m exporter`` with ``args`` and measure it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--web.listen-address", f"127.0.0.1:{port}", *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(5)
        return measure(url, proc.pid, label, scrapes, quiet)
    finally:
        proc.terminate()
        proc.wait(10)


def table(results: list[Result]) -> str:
    """Markdown table of results."""
    rows = ["| exporter | series | scrape p50 ms | scrape p99 ms | CPU (cores) | RSS MB |", "|---|---|---|---|---|---|"]
    for r in results:
        rows.append(
            f"| {r.label} | {r.series} | {r.scrape_p50_ms:.2f} | {r.scrape_p99_ms:.2f} | "
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
                19445,
                "gpulens sim h200x8",
                a.scrapes,
                a.quiet_seconds,
            ),
            run_gpulens(
                ["--backend", "sim", "--sim.scenario", "mig7x8"],
                19446,
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
