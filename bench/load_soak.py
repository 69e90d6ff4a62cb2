"""Load and soak of the exporter's HTTP path, at full counts (figures in docs/benchmarks.md).

    .venv/bin/python -m bench.load_soak load --concurrency 100 --seconds 60   # vs a sim mig7x8 exporter process
    .venv/bin/python -m bench.load_soak soak --scrapes 20000                  # churning pods, flapping GPUs

The harness is tests/support/load_soak.py (the README test command runs it with reduced counts,
tests/test_load_soak.py): load, N client threads scraping a separate exporter process as fast as
they can; soak, one process whose pods churn and GPU flaps while it is scraped, reporting RSS and
open-FD growth after a warm-up.
"""

from __future__ import annotations

import argparse

from tests.support.load_soak import load, sim_exporter, soak
from tests.support.procstat import rss_bytes


def main() -> int:
    """CLI."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("load")
    lp.add_argument("--concurrency", type=int, default=100)
    lp.add_argument("--seconds", type=float, default=60)
    lp.add_argument("--port", type=int, default=19447)
    sp = sub.add_parser("soak")
    sp.add_argument("--scrapes", type=int, default=20000)
    a = ap.parse_args()
    if a.cmd == "load":
        with sim_exporter(a.port) as proc:
            r = load("127.0.0.1", a.port, a.concurrency, a.seconds)
            cpu_rss = f"RSS {rss_bytes(proc.pid) / 2**20:.1f} MB"
        print(
            f"load: {a.concurrency} scrapers x {a.seconds:.0f}s on sim mig7x8: {r.requests} scrapes "
            f"({r.per_second:.0f}/s), {r.errors} errors, p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms, "
            f"max {r.max_ms:.2f} ms, {cpu_rss}"
        )
    else:
        s = soak(a.scrapes)
        print(
            f"soak: {s.scrapes} scrapes, {s.errors} errors, RSS {s.rss_start_mb:.1f} -> {s.rss_end_mb:.1f} MB "
            f"(+{s.rss_end_mb - s.rss_start_mb:.2f}), open FDs {s.fds_start} -> {s.fds_end}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
