"""What the expensive NVML reads cost, and whether cheaper reads give the same figures (real GPU).

    PYTHONPATH=$PWD python3 -m bench.nvml_alternatives --out DIR

Two parts, on GPU 0, each call timed by the calling thread's CPU clock (user + system, µs):

1. **Cost per call**, idle and under a steady bf16 matmul child, ``--calls`` calls 50 ms apart:
   energy as ``nvmlDeviceGetTotalEnergyConsumption`` and as a field value; per-process
   utilisation as the binding's two-call wrapper, as its size query alone and as one call into a
   buffer sized ahead; GPU-Util samples (``nvmlDeviceGetSamples``) as wrapper and one call; a
   GPM sample with ``SM_UTIL`` and with ``GRAPHICS_UTIL``; and for scale power, PCIe replays,
   GPU-Util, memory info and the compute-process list.
2. **Agreement per 1 s window** under workload patterns (idle, steady, duty cycles, short bursts,
   launch-bound tiny kernels): GPM graphics-engine activity (the exporter's busy fraction) beside
   GPU-Util read once, the mean of GPU-Util's samples in the window, and the lone process's mean
   SM utilisation from its per-process samples.

Prints two tables and writes ``nvml_alternatives.json`` (every window) under ``--out``.

``--depth`` runs only this instead, under a load of 2 s of work every 5 s: eight rounds, 5 s
apart, of one per-process read over the span since the round before and one over the last
second; then reads over the last 1, 5, 10, 20, 40 and 80 s. It tells whether NVML averages a
process over the span it is given (the exporter reads it every 5 s on that basis).
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

LOAD = """
import os, sys, time, torch
pattern = sys.argv[1]
x = torch.randn(8192, 8192, dtype=torch.bfloat16, device='cuda'); y = torch.randn_like(x)
small = torch.zeros(1024, device='cuda')
z = x @ y; torch.cuda.synchronize(); print('ready', flush=True)
def busy(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(2): z = x @ y
        torch.cuda.synchronize()
PERIODS = {'slow40': (2.0, 3.0), 'steady': (1.0, 0.0),
           'duty50': (0.1, 0.1), 'duty20': (0.02, 0.08), 'burst30': (0.3, 0.7)}
on, off = PERIODS.get(pattern, (0, 0))
while True:
    if pattern == 'tiny':
        for _ in range(200): small.add_(1.0)
        torch.cuda.synchronize(); time.sleep(0.0005)
    elif pattern == 'idlectx':
        time.sleep(1)
    else:
        busy(on)
        if off: time.sleep(off)
"""
PATTERNS = ("idlectx", "steady", "duty50", "duty20", "burst30", "tiny")


def cpu_us(fn: Callable[[], Any]) -> tuple[float, Any]:
    """``fn()``'s CPU time on this thread (µs) and its result (an exception is returned, not raised)."""
    t0 = time.thread_time_ns()
    try:
        out = fn()
    except Exception as e:  # a bench reports what failed
        out = e
    return (time.thread_time_ns() - t0) / 1e3, out


def start_load(pattern: str) -> subprocess.Popen[str]:
    """A torch child running ``pattern``; returns once it has its context and answered 'ready'."""
    proc = subprocess.Popen([sys.executable, "-c", LOAD, pattern], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()
    time.sleep(2.0)
    return proc


def stop(proc: subprocess.Popen[str] | None) -> None:
    if proc is not None:
        proc.terminate()
        proc.wait()


class Reads:
    """The reads under test on one GPU, through nvidia-ml-py (``pynvml``)."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.n = nvml
        self.h = handle
        self.proc_fn = nvml._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
        self.samples_fn = nvml._nvmlGetFunctionPointer("nvmlDeviceGetSamples")
        self.proc_buf = (nvml.c_nvmlProcessUtilizationSample_t * 256)()
        self.sample_buf = (nvml.c_nvmlSample_t * 256)()
        self.gpm = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        nvml.nvmlGpmSampleGet(handle, self.gpm[0])

    def proc_wrapper(self, since_us: int) -> list[Any]:
        try:
            return list(self.n.nvmlDeviceGetProcessUtilization(self.h, since_us))
        except self.n.NVMLError_NotFound:
            return []

    def proc_size(self, since_us: int) -> int:
        count = ctypes.c_uint(0)
        self.proc_fn(self.h, None, ctypes.byref(count), ctypes.c_ulonglong(since_us))
        return count.value

    def proc_one_call(self, since_us: int) -> list[Any]:
        count = ctypes.c_uint(len(self.proc_buf))
        ret = self.proc_fn(self.h, self.proc_buf, ctypes.byref(count), ctypes.c_ulonglong(since_us))
        if ret == self.n.NVML_ERROR_NOT_FOUND:
            return []
        if ret != self.n.NVML_SUCCESS:
            raise self.n.NVMLError(ret)
        return [self.proc_buf[i] for i in range(count.value)]

    def samples_wrapper(self, since_us: int) -> list[Any]:
        try:
            return list(self.n.nvmlDeviceGetSamples(self.h, self.n.NVML_GPU_UTILIZATION_SAMPLES, since_us)[1])
        except self.n.NVMLError_NotFound:
            return []

    def samples_one_call(self, since_us: int) -> list[Any]:
        count = ctypes.c_uint(len(self.sample_buf))
        kind = ctypes.c_int(0)
        ret = self.samples_fn(
            self.h,
            ctypes.c_int(self.n.NVML_GPU_UTILIZATION_SAMPLES),
            ctypes.c_ulonglong(since_us),
            ctypes.byref(kind),
            ctypes.byref(count),
            self.sample_buf,
        )
        if ret == self.n.NVML_ERROR_NOT_FOUND:
            return []
        if ret != self.n.NVML_SUCCESS:
            raise self.n.NVMLError(ret)
        return [self.sample_buf[i] for i in range(count.value)]

    def gpm_window(self, metrics: tuple[int, ...]) -> list[float | None]:
        """Sample now, the metrics over (previous, now), then swap."""
        n = self.n
        n.nvmlGpmSampleGet(self.h, self.gpm[1])
        req = n.c_nvmlGpmMetricsGet_t()
        req.version = n.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(metrics)
        req.sample1, req.sample2 = self.gpm[0], self.gpm[1]
        for i, m in enumerate(metrics):
            req.metrics[i].metricId = m
        n.nvmlGpmMetricsGet(req)
        self.gpm.reverse()
        return [float(req.metrics[i].value) if req.metrics[i].nvmlReturn == 0 else None for i in range(len(metrics))]


def cost_table(r: Reads, calls: int) -> dict[str, float]:
    """Median CPU µs per call of each read."""
    n, h = r.n, r.h
    energy_fields = [n.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]
    batch_fields = [
        n.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        getattr(n, "NVML_FI_DEV_POWER_INSTANT", 186),
        getattr(n, "NVML_FI_DEV_PCIE_REPLAY_COUNTER", 94),
    ]
    since = int(time.time() * 1e6) - 1_000_000
    reads: dict[str, Callable[[], Any]] = {
        "energy nvmlDeviceGetTotalEnergyConsumption": lambda: n.nvmlDeviceGetTotalEnergyConsumption(h),
        "energy nvmlDeviceGetFieldValues(energy)": lambda: n.nvmlDeviceGetFieldValues(h, energy_fields),
        "nvmlDeviceGetFieldValues(energy, power, replays)": lambda: n.nvmlDeviceGetFieldValues(h, batch_fields),
        "nvmlDeviceGetPowerUsage": lambda: n.nvmlDeviceGetPowerUsage(h),
        "nvmlDeviceGetPcieReplayCounter": lambda: n.nvmlDeviceGetPcieReplayCounter(h),
        "nvmlDeviceGetUtilizationRates": lambda: n.nvmlDeviceGetUtilizationRates(h),
        "process util, wrapper (2 calls)": lambda: r.proc_wrapper(since),
        "process util, size query alone": lambda: r.proc_size(since),
        "process util, one call (256 slots)": lambda: r.proc_one_call(since),
        "GPU-Util samples, wrapper (2 calls)": lambda: r.samples_wrapper(since),
        "GPU-Util samples, one call (256 slots)": lambda: r.samples_one_call(since),
        "nvmlDeviceGetMemoryInfo": lambda: n.nvmlDeviceGetMemoryInfo(h),
        "nvmlDeviceGetComputeRunningProcesses": lambda: n.nvmlDeviceGetComputeRunningProcesses(h),
        "GPM sample + SM_UTIL": lambda: r.gpm_window((n.NVML_GPM_METRIC_SM_UTIL,)),
        "GPM sample + GRAPHICS_UTIL": lambda: r.gpm_window((n.NVML_GPM_METRIC_GRAPHICS_UTIL,)),
    }
    out: dict[str, float] = {}
    for name, fn in reads.items():
        times = []
        last: Any = None
        for _ in range(calls):
            time.sleep(0.05)
            us, last = cpu_us(fn)
            times.append(us)
        out[name] = statistics.median(times)
        if isinstance(last, Exception):
            print(f"  {name}: {last!r}", flush=True)
            out[name] = float("nan")
    return out


def windows(r: Reads, pattern: str, seconds: int) -> list[dict[str, Any]]:
    """One row per 1 s window: the busy estimates and what each read cost."""
    n, h = r.n, r.h
    rows = []
    r.gpm_window((n.NVML_GPM_METRIC_SM_UTIL,))
    prev_us = int(time.time() * 1e6)
    next_t = time.monotonic() + 1.0
    for _ in range(seconds):
        time.sleep(max(0.0, next_t - time.monotonic()))
        next_t += 1.0
        now_us = int(time.time() * 1e6)
        g_cost, g = cpu_us(lambda: r.gpm_window((n.NVML_GPM_METRIC_GRAPHICS_UTIL, n.NVML_GPM_METRIC_SM_UTIL)))
        u_cost, util = cpu_us(lambda: n.nvmlDeviceGetUtilizationRates(h).gpu)
        s_cost, samples = cpu_us(lambda since=prev_us: r.samples_one_call(since))  # type: ignore[misc]
        p_cost, procs = cpu_us(lambda since=prev_us: r.proc_one_call(since))  # type: ignore[misc]
        graphics, sm = g if isinstance(g, list) else (None, None)
        svals = [s.sampleValue.uiVal for s in samples] if isinstance(samples, list) else []
        stamps = [s.timeStamp for s in samples] if isinstance(samples, list) else []
        per_pid: dict[int, list[int]] = {}
        for p in procs if isinstance(procs, list) else []:
            per_pid.setdefault(int(p.pid), []).append(int(p.smUtil))
        rows.append(
            {
                "pattern": pattern,
                "graphics": graphics,
                "sm": sm,
                "gpu_util_once": util if isinstance(util, int) else None,
                "gpu_util_samples_mean": statistics.fmean(svals) if svals else None,
                "gpu_util_samples": len(svals),
                "sample_period_us": (
                    statistics.median([b - a for a, b in itertools.pairwise(stamps)]) if len(stamps) > 2 else None
                ),
                "proc_sm_mean": sum(statistics.fmean(v) for v in per_pid.values()) if per_pid else None,
                "proc_samples": sum(len(v) for v in per_pid.values()),
                "cost_gpm_us": g_cost,
                "cost_util_us": u_cost,
                "cost_samples_us": s_cost,
                "cost_proc_us": p_cost,
            }
        )
        prev_us = now_us
    return rows


def depth(r: Reads, spans: tuple[int, ...] = (1, 5, 10, 20, 40, 80)) -> list[dict[str, Any]]:
    """How far back per-process utilisation reaches: under a steady load, after ``max(spans)``
    seconds, one read per span with ``since`` that many seconds ago; the samples it returns and
    the age of the oldest (s)."""
    out = []
    for span in spans:
        now = time.time()
        got = r.proc_one_call(int((now - span) * 1e6))
        stamps = [int(p.timeStamp) for p in got]
        out.append(
            {
                "since_s": span,
                "samples": len(stamps),
                "pids": len({int(p.pid) for p in got}),
                "oldest_age_s": round(now - min(stamps) / 1e6, 2) if stamps else None,
                "mean_sm": round(statistics.fmean(int(p.smUtil) for p in got), 1) if got else None,
            }
        )
    return out


def since_test(r: Reads, reads: int = 8, every: float = 5.0) -> list[dict[str, Any]]:
    """Whether per-process utilisation averages over the span since ``since`` or over a fixed
    recent period: under a 5 s cycle (2 s busy, 3 s idle), every ``every`` s one read since the
    last read and, at once, one since 1 s ago."""
    out = []
    last = int(time.time() * 1e6)
    for _ in range(reads):
        time.sleep(every)
        now = int(time.time() * 1e6)
        long = r.proc_one_call(last)
        short = r.proc_one_call(now - 1_000_000)
        out.append(
            {
                "since_last_read": [int(p.smUtil) for p in long],
                "since_1s_ago": [int(p.smUtil) for p in short],
                "stamps_age_ms": [round((now - int(p.timeStamp)) / 1e3) for p in long],
            }
        )
        last = now
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--seconds", type=int, default=20, help="windows per pattern")
    parser.add_argument("--depth", action="store_true", help="only: how far back per-process samples reach")
    args = parser.parse_args(argv)
    import pynvml as nvml

    nvml.nvmlInit()
    r = Reads(nvml, nvml.nvmlDeviceGetHandleByIndex(0))
    if args.depth:
        load = start_load("slow40")
        try:
            for row in since_test(r):
                print(row, flush=True)
            reach = depth(r)
        finally:
            stop(load)
        print("\n| since (s ago) | samples | processes | oldest sample's age (s) | mean SM % |\n|---|---|---|---|---|")
        for d in reach:
            print(f"| {d['since_s']} | {d['samples']} | {d['pids']} | {d['oldest_age_s']} | {d['mean_sm']} |")
        return 0
    costs = {"idle": cost_table(r, args.calls)}
    load = start_load("steady")
    try:
        costs["steady matmul"] = cost_table(r, args.calls)
    finally:
        stop(load)
    print("\n| read | idle µs | busy µs |\n|---|---|---|")
    for name in costs["idle"]:
        print(f"| {name} | {costs['idle'][name]:.0f} | {costs['steady matmul'][name]:.0f} |")
    rows: list[dict[str, Any]] = []
    rows += windows(r, "idle", 8)
    for pattern in PATTERNS:
        load = start_load(pattern)
        try:
            rows += windows(r, pattern, args.seconds)
        finally:
            stop(load)

    def diff(rs: list[dict[str, Any]], key: str) -> str:
        d = [abs(x["graphics"] - x[key]) for x in rs if x["graphics"] is not None and x[key] is not None]
        return f"{statistics.fmean(d):.1f} / {max(d):.1f}" if d else "-"

    def mean(rs: list[dict[str, Any]], key: str) -> str:
        v = [x[key] for x in rs if x[key] is not None]
        return f"{statistics.fmean(v):.1f}" if v else "-"

    print("\nPercent; differences from graphics as mean / max over the 1 s windows.\n")
    print(
        "| pattern | windows | graphics | SM | GPU-Util once | samples mean | process SM | Δ once | Δ samples "
        "| Δ process | samples/window | period µs | cost µs: GPM, once, samples, process |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for pattern in ("idle", *PATTERNS):
        rs = [x for x in rows if x["pattern"] == pattern][1:]
        cost_keys = ("cost_gpm_us", "cost_util_us", "cost_samples_us", "cost_proc_us")
        costs_s = ", ".join(mean(rs, k).split(".")[0] for k in cost_keys)
        print(
            f"| {pattern} | {len(rs)} | {mean(rs, 'graphics')} | {mean(rs, 'sm')} | {mean(rs, 'gpu_util_once')} | "
            f"{mean(rs, 'gpu_util_samples_mean')} | {mean(rs, 'proc_sm_mean')} | {diff(rs, 'gpu_util_once')} | "
            f"{diff(rs, 'gpu_util_samples_mean')} | {diff(rs, 'proc_sm_mean')} | {mean(rs, 'gpu_util_samples')} | "
            f"{mean(rs, 'sample_period_us')} | {costs_s} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nvml_alternatives.json").write_text(json.dumps({"costs": costs, "windows": rows}, indent=1))
    nvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
