"""What one sampling cycle costs on a real GPU: CPU and wall time per NVML function, and per stage.

    python3 -m bench.nvml_cost [--cycles 60] [--interval 1.0] [--quiet-seconds 30]

Needs a GPU and nvidia-ml-py. Every binding function the backend calls is wrapped before the
backend resolves it, and timed by wall clock and by the calling thread's CPU clock
(``time.thread_time``: user and system time, so the driver's ioctls count, time the thread waits
in them does not). The table lists, per function, the calls per cycle and the CPU and wall
milliseconds per cycle, largest CPU first. A second table times one whole cycle as the exporter
runs it (``exporter.cli.build`` with probes off: backend read, attribution, analysis) and one
render of the page for that snapshot. Then, with no timing wrappers, the exporter's pipeline runs
alone for ``--quiet-seconds`` at ``--interval`` (sampler thread, a page rendered each interval as
a scraper would ask) and the process's CPU per second is printed: the figure that
``bench/real_gpu.py`` compares with nvitop-exporter.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from exporter.backends.nvml.functions import NvmlFunctions


class _Timed:
    """Per-function totals: calls, CPU seconds, wall seconds (one lock, the sampler is one thread)."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = defaultdict(int)
        self.cpu: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)
        self.lock = threading.Lock()

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            c0, w0 = time.thread_time(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                c1, w1 = time.thread_time(), time.perf_counter()
                with self.lock:
                    self.calls[name] += 1
                    self.cpu[name] += c1 - c0
                    self.wall[name] += w1 - w0

        return timed

    def reset(self) -> None:
        with self.lock:
            self.calls.clear()
            self.cpu.clear()
            self.wall.clear()


def _instrument(nvml: Any) -> tuple[_Timed, dict[str, Callable[..., Any]]]:
    timed = _Timed()
    originals = {}
    for name in NvmlFunctions.names():
        fn = getattr(nvml, name, None)
        if fn is not None:
            originals[name] = fn
            setattr(nvml, name, timed.wrap(name, fn))
    return timed, originals


def _per_function(timed: _Timed, cycles: int) -> None:
    print(f"\nNVML functions, per cycle over {cycles} cycles (CPU = the sampler thread's user + system time)")
    print("| function | calls/cycle | CPU ms/cycle | wall ms/cycle | CPU µs/call |")
    print("|---|---|---|---|---|")
    rows = sorted(timed.calls, key=lambda n: -timed.cpu[n])
    total_cpu = total_wall = 0.0
    for name in rows:
        calls, cpu, wall = timed.calls[name], timed.cpu[name], timed.wall[name]
        total_cpu += cpu
        total_wall += wall
        print(
            f"| {name} | {calls / cycles:.2f} | {1e3 * cpu / cycles:.3f} | {1e3 * wall / cycles:.3f} | "
            f"{1e6 * cpu / calls:.0f} |"
        )
    print(
        f"| **all** | {sum(timed.calls.values()) / cycles:.1f} | {1e3 * total_cpu / cycles:.3f} | "
        f"{1e3 * total_wall / cycles:.3f} | |"
    )


def _stages(cycles: int, interval: float) -> None:
    from exporter.cli import build
    from exporter.config import parse_config

    sampler, exposition, _backend = build(parse_config(["--backend", "nvml", "--no-probes"]))
    cpu_cycle: list[float] = []
    cpu_render: list[float] = []
    for _ in range(cycles):
        # run_once reads the backend in its worker thread: count that thread too via process time.
        p0 = time.process_time()
        sampler.run_once()
        cpu_cycle.append(time.process_time() - p0)
        c0 = time.thread_time()
        exposition.render("")
        cpu_render.append(time.thread_time() - c0)
        time.sleep(interval)
    body, _ = exposition.render("")
    sampler.stop()
    lines = body.count(b"\n")
    print(f"\nOne cycle as the exporter runs it ({cycles} cycles, {len(body)} bytes, {lines} lines on the page)")
    print("| part | CPU ms median | CPU ms p90 |")
    print("|---|---|---|")
    for label, xs in (("sampler cycle (process CPU)", cpu_cycle), ("render of the page", cpu_render)):
        xs = sorted(xs)
        print(f"| {label} | {1e3 * statistics.median(xs):.3f} | {1e3 * xs[int(0.9 * (len(xs) - 1))]:.3f} |")


def _quiet(seconds: float, interval: float) -> None:
    from exporter.cli import build
    from exporter.config import parse_config

    sampler, exposition, _backend = build(
        parse_config(["--backend", "nvml", "--no-probes", f"--collect.interval={interval}"])
    )
    sampler.start()
    time.sleep(3 * interval)
    t0, c0 = time.monotonic(), os.times()
    end = t0 + seconds
    while time.monotonic() < end:
        exposition.render("")
        time.sleep(interval)
    c1, t1 = os.times(), time.monotonic()
    sampler.stop()
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    print(
        f"\nPipeline alone for {t1 - t0:.0f} s (sampler thread + one render per interval): "
        f"{1e3 * cpu / (t1 - t0):.2f} ms CPU per second "
        f"(user {1e3 * (c1.user - c0.user) / (t1 - t0):.2f}, system {1e3 * (c1.system - c0.system) / (t1 - t0):.2f})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=60)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--quiet-seconds", type=float, default=30.0)
    args = parser.parse_args(argv)

    import pynvml

    from exporter.backends.nvml.backend import NvmlBackend

    timed, originals = _instrument(pynvml)
    backend = NvmlBackend()
    for _ in range(3):
        backend.sample()
        time.sleep(args.interval)
    timed.reset()
    for _ in range(args.cycles):
        backend.sample()
        time.sleep(args.interval)
    backend.close()
    _per_function(timed, args.cycles)
    _stages(max(10, args.cycles // 3), args.interval)
    for name, fn in originals.items():
        setattr(pynvml, name, fn)
    _quiet(args.quiet_seconds, args.interval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
