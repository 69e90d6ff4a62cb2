"""Resident memory of an idle exporter process: what its imports and start-up cost.

``python -m bench.exporter_rss`` starts ``python -m exporter`` on a free loopback port for each
configuration, waits for ``/readyz``, scrapes ``/metrics`` once a second for ``--seconds``, then
reads the process' RSS (tests/support/procstat.py) and stops it; ``--runs`` times each, median reported.
``--source DIR`` runs the exporter of another source tree (an exported older commit) with the same
interpreter, for a before/after comparison in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.support.procstat import rss_bytes

HOST = "127.0.0.1"

CONFIGS: dict[str, tuple[str, ...]] = {
    "sim, no probes": ("--backend", "sim", "--no-probes"),
    "sim, no probes, kubelet socket": (
        "--backend",
        "sim",
        "--no-probes",
        "--kubernetes.podresources-socket",
        "/nonexistent/pod-resources/kubelet.sock",
    ),
}
"""Label -> exporter flags.  The socket need not exist: the kubelet source is built (and gRPC
loaded) and its stage fails, as on a node whose kubelet is down."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as r:
        r.read()
        return int(r.status)


def measure(source: Path, flags: tuple[str, ...], seconds: float) -> int:
    """RSS in bytes of one exporter after ``seconds`` of once-a-second scrapes."""
    port = _free_port()
    argv = [sys.executable, "-m", "exporter", *flags, "--web.listen-address", f"{HOST}:{port}"]
    env = {**os.environ, "PYTHONPATH": str(source)}
    proc = subprocess.Popen(argv, cwd=source, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if _get(f"http://{HOST}:{port}/readyz") == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"exporter {' '.join(flags)} did not get ready (exit {proc.poll()})")
            time.sleep(0.1)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            _get(f"http://{HOST}:{port}/metrics")
            time.sleep(1.0)
        return rss_bytes(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--source", action="append", type=Path, help="source tree(s) to run (default: this one)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="scraping before RSS is read")
    a = parser.parse_args(argv)
    if not 1 <= a.runs <= 20 or not 0 < a.seconds <= 600:
        parser.error("--runs must be 1..20 and --seconds 0..600")
    sources = a.source or [Path(__file__).resolve().parent.parent]
    results = []
    for label, flags in CONFIGS.items():
        for source in sources:
            rss = [measure(source, flags, a.seconds) for _ in range(a.runs)]
            results.append(
                {
                    "config": label,
                    "source": str(source),
                    "rss_mib_median": round(statistics.median(rss) / 2**20, 1),
                    "rss_mib_runs": [round(r / 2**20, 1) for r in rss],
                }
            )
            print(json.dumps(results[-1]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
