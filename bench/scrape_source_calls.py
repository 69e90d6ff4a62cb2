"""The Fleet page's source calls in scrape mode, timed in one process (no browser, no Streamlit).

    PYTHONPATH=TREE .venv/bin/python -m bench.scrape_source_calls --nodes 125 --scrapes 120

``--nodes`` copies of a simulated h200x8 node's exposition (each with its own UUIDs) are scraped
``--scrapes`` times, 5 s apart on a simulated clock, into a ``ScrapeSource``; then each of the Fleet
page's calls (1 h range, its 80-point activity steps) is timed ``--repeats`` times, the clock moving
2 s between repeats. Prints the median of the repeats after the first, per call. Run it with
PYTHONPATH set to another tree to compare commits (a call that tree lacks is skipped).
"""

from __future__ import annotations

import argparse
import statistics
import time
import urllib.request
from typing import Any

from dashboard.sources.scrape import ScrapeSource
from dashboard.sources.source import NO_FILTERS, Window
from tests.support.exporter import run_exporter

WINDOW_S = 3600.0
STEP_S = max(60.0, WINDOW_S / 80)


def calls() -> dict[str, tuple[str, tuple[Any, ...], dict[str, Any]]]:
    """The Fleet page's queries (dashboard/views/fleet.py) as (method, args, kwargs)."""
    return {
        "info": ("instant", ("gpulens_gpu_info",), {}),
        "mig": ("instant", ("gpulens_mig_instance_info",), {}),
        "alloc": ("instant", ("gpulens_pod_gpu_allocation",), {}),
        "leaf_idle": ("leaf_idle", (), {}),
        "up": ("instant", ("gpulens_up",), {}),
        "gpu_up": ("instant", ("gpulens_gpu_up",), {}),
        "sm_mean": ("mean", ("gpulens_gpu_sm_active_ratio",), {"window": Window(WINDOW_S)}),
        "util": ("instant", ("gpulens_gpu_utilization_ratio",), {}),
        "classes": ("current_state", ("gpulens_gpu_boundness",), {}),
        "idle_since": ("idle_since", (), {"window": Window(WINDOW_S), "step_s": STEP_S}),
        "events": ("mean", ("gpulens_gpu_clock_event_active",), {"window": Window(WINDOW_S)}),
        "clock": ("mean", ("gpulens_gpu_sm_clock_hertz",), {"window": Window(300.0)}),
        "clock_max": ("instant", ("gpulens_gpu_sm_clock_max_hertz",), {}),
        "allocation_activity": ("allocation_activity", (), {"window": Window(WINDOW_S), "step_s": STEP_S}),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=125)
    p.add_argument("--scrapes", type=int, default=120)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    with run_exporter("--sim.scenario", "h200x8") as exporter:
        time.sleep(6)  # a first probe result and GPM windows
        template = urllib.request.urlopen(f"{exporter}/metrics", timeout=10).read().decode()
    pages = {
        f"http://n{n}:9445/metrics": template.replace("GPU-", f"GPU-n{n:03d}-").replace("MIG-", f"MIG-n{n:03d}-")
        for n in range(a.nodes)
    }
    clock = [1_000_000.0]
    src = ScrapeSource(list(pages), fetch=lambda url: pages[url], clock=lambda: clock[0], interval_s=5)
    for _ in range(a.scrapes):
        src.scrape_once()
        clock[0] += 5.0
    clock[0] -= 4.0
    took: dict[str, list[float]] = {}
    for _ in range(a.repeats):
        for name, (method, args, kwargs) in calls().items():
            fn = getattr(src, method, None)
            if fn is None:
                continue
            started = time.perf_counter()
            fn(*args, NO_FILTERS, **kwargs)
            took.setdefault(name, []).append(time.perf_counter() - started)
        clock[0] += 2.0
    print(f"{a.nodes} nodes ({8 * a.nodes} GPUs), {src.kept()}; median of {a.repeats - 1} after the first, ms")
    fleet = 0.0
    for name, times in took.items():
        median = statistics.median(times[1:]) if len(times) > 1 else times[0]
        fleet += median if name != "allocation_activity" else 0.0
        print(f"{name:<20} {median * 1e3:8.0f}")
    print(f"{'Fleet (all but activity)':<20} {fleet * 1e3:8.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
