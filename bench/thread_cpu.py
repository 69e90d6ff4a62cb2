"""Where an exporter's CPU goes, thread by thread, scraped as Prometheus scrapes; source trees side by side.

    .venv/bin/python -m bench.thread_cpu --source /tmp/before --source . --scenario h200x8

Each source tree's exporter (``--backend sim --sim.scenario S --no-probes``, 1 s interval) runs,
all of them at once (the VM's speed drifts by half between minutes: only figures taken together
compare), under a small wrapper that starts ``exporter.__main__`` from that tree and, after
``--settle`` s, reads every thread's CPU time from ``/proc/self/task/<tid>/schedstat`` (ns on a
CPU, user and system) at the start and the end of ``--seconds`` s, naming each thread by
``threading.enumerate()``.  Meanwhile the bench scrapes it once a second over one kept-alive
connection with Prometheus' ``Accept`` and gzip (``bench.real_gpu.PrometheusLikeScraper``).
``--runs`` rounds; the medians per thread, in ms of CPU per second.

Only the simulator: what the NVML calls cost needs the GPU (``bench/real_gpu.py`` takes the same
wrapper through ``--ours``).  The wrapper's own thread is left out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from bench.real_gpu import PrometheusLikeScraper
from tests.support.net import free_port
from tests.support.process import managed_process

WRAPPER = r"""
import json, os, runpy, sys, threading, time
sys.path.insert(0, os.environ["THREAD_CPU_TREE"])
def snap():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as fh:
                out[int(tid)] = int(fh.read().split()[0])
        except OSError:
            pass
    return out
def watch():
    time.sleep(float(os.environ["THREAD_CPU_SETTLE"]))
    a, t0 = snap(), time.monotonic()
    time.sleep(float(os.environ["THREAD_CPU_SECONDS"]))
    b, dt = snap(), time.monotonic() - t0
    names = {t.native_id: t.name for t in threading.enumerate()}
    ms = {}
    for tid, ns in b.items():
        name = names.get(tid, "other")
        if name != "thread-cpu":
            ms[name] = ms.get(name, 0.0) + (ns - a.get(tid, 0)) / 1e6 / dt
    with open(os.environ["THREAD_CPU_OUT"], "w") as fh:
        json.dump(ms, fh)
threading.Thread(target=watch, name="thread-cpu", daemon=True).start()
sys.argv = ["exporter", *sys.argv[1:]]
runpy.run_module("exporter", run_name="__main__", alter_sys=True)
"""
"""Runs the exporter of ``THREAD_CPU_TREE`` and writes ``{thread name: ms of CPU per s}``."""


def measure(trees: list[Path], scenario: str, settle: float, seconds: float, folder: Path) -> list[dict[str, float]]:
    """One exporter per tree, all at once (so that they share the machine's speed, which drifts
    on a shared VM): each one's threads' CPU over the same ``seconds`` s after ``settle`` s, each
    scraped once a second as Prometheus scrapes."""
    flags = ["--backend", "sim", "--sim.scenario", scenario, "--no-probes", "--collect.interval", "1"]
    scrape = PrometheusLikeScraper()
    with ExitStack() as stack:
        outs, urls = [], []
        for tree in trees:
            port = free_port()
            out = folder / f"threads-{port}.json"
            env = {
                **os.environ,
                "THREAD_CPU_TREE": str(tree.resolve()),
                "THREAD_CPU_SETTLE": str(settle),
                "THREAD_CPU_SECONDS": str(seconds),
                "THREAD_CPU_OUT": str(out),
            }
            argv = [sys.executable, "-c", WRAPPER, *flags, "--web.listen-address", f"127.0.0.1:{port}"]
            ready = f"http://127.0.0.1:{port}/readyz"
            stack.enter_context(managed_process(argv, ready, env=env, cwd=tree, timeout=60))
            outs.append(out)
            urls.append(f"http://127.0.0.1:{port}/metrics")
        deadline = time.monotonic() + settle + seconds + 30
        while not all(o.exists() and o.stat().st_size for o in outs) and time.monotonic() < deadline:
            tick = time.monotonic()
            for url in urls:
                scrape(url)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    return [dict(json.loads(o.read_text())) for o in outs]


def table(labels: list[str], medians: list[dict[str, float]]) -> str:
    """Threads (rows) by source tree (columns), ms of CPU per second, and the total."""
    threads = sorted({t for m in medians for t in m}, key=lambda t: -max(m.get(t, 0.0) for m in medians))
    lines = [f"| thread | {' | '.join(labels)} |", "|---" * (len(labels) + 1) + "|"]
    for t in threads:
        lines.append(f"| {t} | {' | '.join(f'{m.get(t, 0.0):.2f}' for m in medians)} |")
    lines.append(f"| **all** | {' | '.join(f'**{sum(m.values()):.2f}**' for m in medians)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", action="append", type=Path, help="source tree(s) (default: this one)")
    parser.add_argument("--scenario", default="h200x8")
    parser.add_argument("--settle", type=float, default=8.0, help="seconds before the window")
    parser.add_argument("--seconds", type=float, default=20.0, help="the window, s")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="also write the figures here (JSON)")
    args = parser.parse_args()
    trees = args.source or [Path(".")]
    for tree in trees:
        if not (tree / "exporter" / "__main__.py").is_file():
            parser.error(f"--source: {tree} holds no exporter/__main__.py")
    if args.runs < 1 or args.seconds <= 0 or args.settle < 0:
        parser.error("--runs must be >= 1, --seconds > 0 and --settle >= 0")
    runs: list[list[dict[str, float]]] = [[] for _ in trees]
    with tempfile.TemporaryDirectory(prefix="gpulens-threads-") as tmp:
        for _ in range(args.runs):
            for i, figures in enumerate(measure(trees, args.scenario, args.settle, args.seconds, Path(tmp))):
                runs[i].append(figures)
    medians = [{t: statistics.median(r.get(t, 0.0) for r in rs) for t in {t for r in rs for t in r}} for rs in runs]
    labels = [str(t) for t in trees]
    print(table(labels, medians))
    if args.out is not None:
        args.out.write_text(json.dumps({"scenario": args.scenario, "sources": labels, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
