"""CPU cost of ``nvmlGpmMetricsGet`` on a real GPU, by metric and by how many are asked at once.

    python3 -m bench.gpm_cost [--calls 40] [--gpu 0]

Needs a Hopper or newer GPU and nvidia-ml-py. Two GPM samples are taken 0.5 s apart; then the
metrics call is timed (the calling thread's CPU clock, user + system) over that same pair, for
each metric the exporter asks alone, for the exporter's whole request, and for the request
without the metrics of each group; medians over ``--calls`` calls. The exporter's request is
``exporter/backends/nvml/gpm.py``'s ratio and PCIe metrics (and NVLink where a GPU has links).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any

from exporter.backends.nvml.gpm import NVLINK_METRICS, PCIE_METRICS, RATIO_METRICS


def _time(nvml: Any, s1: Any, s2: Any, ids: Sequence[int], calls: int) -> tuple[float, float]:
    """(median CPU µs, median wall µs) of one metrics call asking ``ids``."""
    cpu, wall = [], []
    for _ in range(calls):
        req = nvml.c_nvmlGpmMetricsGet_t()
        req.version = nvml.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(ids)
        req.sample1, req.sample2 = s1, s2
        for slot, metric_id in enumerate(ids):
            req.metrics[slot].metricId = metric_id
        c0, w0 = time.thread_time(), time.perf_counter()
        nvml.nvmlGpmMetricsGet(req)
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    return 1e6 * statistics.median(cpu), 1e6 * statistics.median(wall)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--gpu", type=int, default=0)
    args = parser.parse_args(argv)
    import pynvml as nvml

    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(args.gpu)
    s1, s2 = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    nvml.nvmlGpmSampleGet(handle, s1)
    time.sleep(0.5)
    nvml.nvmlGpmSampleGet(handle, s2)
    named = {**RATIO_METRICS, **PCIE_METRICS, **NVLINK_METRICS}
    ids = {field: getattr(nvml, const) for field, const in named.items() if hasattr(nvml, const)}
    rows: list[tuple[str, int, float, float]] = []
    for field, metric_id in ids.items():
        rows.append((field, 1, *_time(nvml, s1, s2, [metric_id], args.calls)))
    request = [i for f, i in ids.items() if f in RATIO_METRICS or f in PCIE_METRICS]
    rows.append(("exporter's request (ratios + PCIe)", len(request), *_time(nvml, s1, s2, request, args.calls)))
    for group, names in (("ratios", RATIO_METRICS), ("PCIe", PCIE_METRICS)):
        rest = [i for f, i in ids.items() if (f in RATIO_METRICS or f in PCIE_METRICS) and f not in names]
        rows.append((f"request without {group}", len(rest), *_time(nvml, s1, s2, rest, args.calls)))
    core = [ids[f] for f in ("sm_active", "tensor_active", "dram_active") if f in ids]
    rows.append(("sm + tensor + dram", len(core), *_time(nvml, s1, s2, core, args.calls)))
    c0 = time.thread_time()
    for _ in range(args.calls):
        nvml.nvmlGpmSampleGet(handle, s2)
    sample_us = 1e6 * (time.thread_time() - c0) / args.calls
    print(f"nvmlGpmSampleGet: {sample_us:.0f} µs CPU per call")
    print("| metrics asked | count | CPU µs per call (median) | wall µs per call (median) |")
    print("|---|---|---|---|")
    for label, count, cpu, wall in rows:
        print(f"| {label} | {count} | {cpu:.0f} | {wall:.0f} |")
    nvml.nvmlGpmSampleFree(s1)
    nvml.nvmlGpmSampleFree(s2)
    nvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
