"""Rendering cost of a new snapshot, this tree against another git revision, side by side.

    .venv/bin/python -m bench.render_cost --ref main                 # sim h200x8 and mig7x8
    .venv/bin/python -m bench.render_cost --ref HEAD~3 --rounds 8 --cycles 200

Method: the other revision's ``exporter/`` is extracted (``git archive``) to a temporary directory.
In each round, one child process per tree (order alternating between rounds) wires the pipeline
as the CLI does (``exporter.cli.build``, simulator, probes off, no DCGM block), runs ``--cycles``
sampling cycles and times the rendering of each new snapshot's OpenMetrics body (what the first
scrape after a snapshot pays; later scrapes reuse the cached bytes).  No HTTP.  The p50 and p99
are over every cycle of every round, and the table gives this tree / the other.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from bench.real_gpu import percentile

REPO = Path(__file__).resolve().parents[1]

_CHILD = """
import json, sys, time
from exporter.cli import build
from exporter.config import parse_config
scenario, cycles = sys.argv[1], int(sys.argv[2])
cfg = parse_config(["--backend", "sim", "--sim.scenario", scenario, "--no-probes"], env={})
sampler, exposition, _ = build(cfg)
times = []
for _ in range(cycles):
    sampler.run_once()
    t0 = time.perf_counter()
    exposition.render("application/openmetrics-text; version=1.0.0")
    times.append(time.perf_counter() - t0)
sampler.stop()
print(json.dumps(times))
"""


def _extract(ref: str, into: Path) -> None:
    """``exporter/`` and ``probes/`` of ``ref`` under ``into``."""
    data = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", ref, "exporter", "probes"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")


def _times(tree: Path, scenario: str, cycles: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, scenario, str(cycles)],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    return [float(x) for x in json.loads(out)]


def compare(ref: str, scenarios: list[str], rounds: int, cycles: int) -> str:
    """Markdown table: render p50/p99 (ms) per tree and scenario, and this / other."""
    rows = [f"| render of a new snapshot (ms) | this tree | {ref} | this / {ref} |", "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp)
        _extract(ref, other)
        for scenario in scenarios:
            mine: list[float] = []
            theirs: list[float] = []
            for r in range(rounds):
                order = [(REPO, mine), (other, theirs)]
                for tree, sink in order if r % 2 == 0 else reversed(order):
                    sink.extend(_times(tree, scenario, cycles))
            for name, q in (("p50", 0.5), ("p99", 0.99)):
                a, b = percentile(mine, q) * 1e3, percentile(theirs, q) * 1e3
                rows.append(f"| {scenario} {name} | {a:.2f} | {b:.2f} | {a / b:.2f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """CLI: print the comparison table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="main", help="the git revision to compare with")
    ap.add_argument("--scenario", action="append", help="sim scenario (repeatable; default h200x8 and mig7x8)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--cycles", type=int, default=150)
    a = ap.parse_args(argv)
    print(compare(a.ref, a.scenario or ["h200x8", "mig7x8"], a.rounds, a.cycles))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
