"""Scrape latency, CPU and RSS of an exporter process: gpulens on the simulator (here) or any URL.

    .venv/bin/python -m bench.scrape_cost                       # gpulens sim h200x8 and mig7x8
    .venv/bin/python -m bench.scrape_cost --url http://H:P/metrics --pid PID --label other
    .venv/bin/python -m bench.scrape_cost --compat              # --compat.dcgm on vs off, side by side

Method: start the exporter (1 s collection interval), wait 5 s, then (1) N sequential scrapes ->
latency p50/p99/max (client-side, full body read); (2) a quiet 30 s with one scrape per second (what
Prometheus does) -> CPU seconds per second from /proc/PID/stat; RSS (10^6 bytes) at the end.

``--compat``: two exporters of one scenario run at once, one with ``--compat.dcgm``, and are
scraped alternately: back-to-back scrapes (which mostly reuse the body cached for the current
snapshot), then one scrape per second each for the quiet period. A scrape a second is what
Prometheus does, and each of those meets a new snapshot, so its latency includes rendering and
encoding the whole exposition: that is the figure the compat rendering adds to. Before both, the
rendering of 300 new snapshots is timed in-process (no HTTP, no scheduling between processes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.real_gpu import Figures, percentile, scrape
from tests.support.net import free_port
from tests.support.process import managed_process
from tests.support.procstat import cpu_seconds, rss_bytes


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


@dataclass
class CompatFigures:
    """One exporter of a compat on/off pair."""

    label: str
    series: int
    cached_p50_ms: float
    cached_p99_ms: float
    fresh_p50_ms: float
    fresh_p99_ms: float
    fresh_max_ms: float
    cpu_cores: float
    rss_mb: float


@contextmanager
def _exporter(args: list[str]) -> Iterator[tuple[str, int]]:
    port = free_port()
    argv = [sys.executable, "-m", "exporter", "--web.listen-address", f"127.0.0.1:{port}", *args]
    with managed_process(argv, f"http://127.0.0.1:{port}/readyz") as proc:
        yield f"http://127.0.0.1:{port}/metrics", proc.pid


def compare_compat(scenario: str, scrapes: int, quiet_seconds: float) -> list[CompatFigures]:
    """``--compat.dcgm`` on vs off on one simulated scenario, side by side in one run."""
    base = ["--backend", "sim", "--sim.scenario", scenario]
    variants = {f"{scenario} compat on": [*base, "--compat.dcgm"], f"{scenario} compat off": base}
    with ExitStack() as stack:
        procs = {label: stack.enter_context(_exporter(args)) for label, args in variants.items()}
        time.sleep(5)
        cached: dict[str, list[float]] = {label: [] for label in procs}
        fresh: dict[str, list[float]] = {label: [] for label in procs}
        bodies: dict[str, bytes] = {}
        for _ in range(scrapes):
            for label, (url, _pid) in procs.items():
                dt, bodies[label] = scrape(url)
                cached[label].append(dt)
        cpu0 = {label: cpu_seconds(pid) for label, (_url, pid) in procs.items()}
        t0 = time.monotonic()
        flip = False
        while time.monotonic() - t0 < quiet_seconds:
            tick = time.monotonic()
            order = list(procs.items())
            for label, (url, _pid) in reversed(order) if flip else order:
                fresh[label].append(scrape(url)[0])
            flip = not flip
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        elapsed = time.monotonic() - t0
        return [
            CompatFigures(
                label=label,
                series=sum(1 for line in bodies[label].decode().splitlines() if line and not line.startswith("#")),
                cached_p50_ms=percentile(cached[label], 0.5) * 1e3,
                cached_p99_ms=percentile(cached[label], 0.99) * 1e3,
                fresh_p50_ms=percentile(fresh[label], 0.5) * 1e3,
                fresh_p99_ms=percentile(fresh[label], 0.99) * 1e3,
                fresh_max_ms=max(fresh[label]) * 1e3,
                cpu_cores=(cpu_seconds(pid) - cpu0[label]) / elapsed,
                rss_mb=rss_bytes(pid) / 1e6,
            )
            for label, (_url, pid) in procs.items()
        ]


def compare_compat_render(scenario: str, cycles: int = 300) -> str:
    """In-process: the time to render one new snapshot's exposition, compat on vs off.

    Two pipelines (``exporter.cli.build``, probes off) take a cycle each in turn; after each cycle
    the OpenMetrics body of the new snapshot is rendered and timed. No HTTP and no other process in
    the loop, so the figure is the rendering work alone; the order alternates every cycle.
    """
    from exporter.cli import build
    from exporter.config import parse_config

    accept = "application/openmetrics-text; version=1.0.0"
    base = ["--backend", "sim", "--sim.scenario", scenario, "--no-probes"]
    pipelines = {
        "compat on": build(parse_config([*base, "--compat.dcgm"], env={}))[:2],
        "compat off": build(parse_config(base, env={}))[:2],
    }
    times: dict[str, list[float]] = {label: [] for label in pipelines}
    for i in range(cycles):
        order = list(pipelines.items())
        for label, (sampler, exposition) in order if i % 2 else reversed(order):
            sampler.run_once()
            t0 = time.perf_counter()
            exposition.render(accept)
            times[label].append(time.perf_counter() - t0)
    on, off = times["compat on"], times["compat off"]
    rows = ["| render of a new snapshot (ms) | compat on | compat off | on / off |", "|---|---|---|---|"]
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        a, b = percentile(on, q) * 1e3, percentile(off, q) * 1e3
        rows.append(f"| {scenario} {name} | {a:.2f} | {b:.2f} | {a / b:.2f} |")
    return "\n".join(rows)


def compat_table(on: CompatFigures, off: CompatFigures) -> str:
    """Markdown: the pair and the on/off ratio of every figure."""
    rows = [
        ("series", "series", "{:.0f}"),
        ("back-to-back scrape p50 ms", "cached_p50_ms", "{:.2f}"),
        ("back-to-back scrape p99 ms", "cached_p99_ms", "{:.2f}"),
        ("1/s scrape (new snapshot) p50 ms", "fresh_p50_ms", "{:.2f}"),
        ("1/s scrape (new snapshot) p99 ms", "fresh_p99_ms", "{:.2f}"),
        ("1/s scrape (new snapshot) max ms", "fresh_max_ms", "{:.2f}"),
        ("CPU (cores)", "cpu_cores", "{:.4f}"),
        ("RSS MB", "rss_mb", "{:.1f}"),
    ]
    lines = [f"| | {on.label} | {off.label} | on / off |", "|---|---|---|---|"]
    for title, attr, fmt in rows:
        a, b = getattr(on, attr), getattr(off, attr)
        lines.append(f"| {title} | {fmt.format(a)} | {fmt.format(b)} | {a / b if b else float('nan'):.2f} |")
    return "\n".join(lines)


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
    ap.add_argument("--compat", action="store_true", help="compare --compat.dcgm on vs off")
    ap.add_argument("--scenario", action="append", help="with --compat: scenarios (default h200x8, mig7x8)")
    a = ap.parse_args()
    if a.compat:
        scenarios = a.scenario or ["h200x8", "mig7x8"]
        # The machine's other work moves tail latencies; say how busy it was.
        print(f"load average at start: {os.getloadavg()[0]:.2f}\n")
        for sc in scenarios:
            print(compare_compat_render(sc) + "\n")
        pairs = [compare_compat(sc, a.scrapes, a.quiet_seconds) for sc in scenarios]
        for on, off in pairs:
            print(compat_table(on, off) + "\n")
        print(f"load average at end: {os.getloadavg()[0]:.2f} (1 min; {os.cpu_count()} CPUs)")
        if a.json:
            Path(a.json).write_text(json.dumps([asdict(f) for pair in pairs for f in pair], indent=2))
        return 0
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
