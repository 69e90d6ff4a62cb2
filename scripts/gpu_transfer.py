#!/usr/bin/env python3
"""Device run for data movement: PCIe copy loads under the real exporter, on GPU 0.

Each load runs in a child process (torch) that counts the bytes it copies and reports them; this
script records, once a second, GPM (SM, DRAM, graphics, PCIe and NVLink rates), NVML's cumulative
PCIe byte counters, NVML's sampled PCIe throughput and GPU-Util with raw pynvml, and scrapes what
the exporter (``python3 -m exporter --backend nvml``) exports: class, busy ratio, link bytes and
link utilisation.  It prints one table: per load the class expected and exported, the seconds to
settle, and the exported PCIe bytes per second beside what the load measured; for two-phase loads
(copy, then nothing) the per-second class from the stop.  Traces go under --out as JSON lines
(the test fixtures' format).  Needs: an NVIDIA GPU, pynvml, torch.

    python3 scripts/gpu_transfer.py --out "$OUT"                # every load
    python3 scripts/gpu_transfer.py --out "$OUT" --loads h2d_pinned h2d_then_idle
    python3 scripts/gpu_transfer.py --make-fixtures RUN_DIR     # traces -> tests/fixtures/transfer_traces
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from gpu_boundness import settle, start_exporter  # noqa: E402  (the boundness run's exporter and settle time)
from gpu_child import duty, run_phases  # noqa: E402  (the child loop shared with gpu_boundness.py)

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class Load:
    """One row: a child kind, the class expected per phase, and the classes allowed in between."""

    name: str
    child: str | None
    expected: tuple[str, ...]
    transit: frozenset[str] = frozenset()


LOADS: tuple[Load, ...] = (
    Load("nothing", None, ("idle",)),
    Load("h2d_pinned", "h2d_pinned", ("transfer",)),
    Load("d2h_pinned", "d2h_pinned", ("transfer",)),
    Load("bidir_pinned", "bidir_pinned", ("transfer",)),
    Load("h2d_pageable", "h2d_pageable", ("transfer",)),
    Load("d2h_pageable", "d2h_pageable", ("transfer",)),
    # A bf16 GEMM loop on one stream and pinned host-to-device copies on another: the copies hide
    # behind the GEMM, which is what limits the job.
    Load("h2d_overlap_gemm", "h2d_overlap_gemm", ("compute",)),
    # Further transfer shapes: small copies (per-copy overhead, not bandwidth), a data loader that
    # copies half of every second, device-to-device plus host-to-device at once.
    Load("small_h2d", "small_h2d", ("transfer",)),
    Load("stalled_h2d", "stalled_h2d", ("transfer",)),
    Load("d2d_and_h2d", "d2d_and_h2d", ("memory",)),
    # Kernels that saturate nothing while the link is full: the SMs wait on the link.
    Load("tiny_kernels_and_h2d", "tiny_kernels_and_h2d", ("transfer",)),
    Load("spin_kernel_and_h2d", "spin_kernel_and_h2d", ("transfer",)),
    # Stops: the class must read idle within 3 s of the stop, passing through no other class.
    Load("h2d_then_idle", "h2d_then_idle", ("transfer", "idle")),
    Load("copy_then_idle", "copy_then_idle", ("memory", "idle")),
    Load("gemm_then_idle", "gemm_then_idle", ("compute", "idle")),
)

GPM_FIELDS = (
    ("sm_active", "NVML_GPM_METRIC_SM_UTIL"),
    ("sm_occupancy", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("tensor", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("fp64", "NVML_GPM_METRIC_FP64_UTIL"),
    ("fp32", "NVML_GPM_METRIC_FP32_UTIL"),
    ("fp16", "NVML_GPM_METRIC_FP16_UTIL"),
    ("dram", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
    ("graphics_util", "NVML_GPM_METRIC_GRAPHICS_UTIL"),
)
GPM_RATES = (  # MiB/s
    ("gpm_pcie_tx", "NVML_GPM_METRIC_PCIE_TX_PER_SEC"),
    ("gpm_pcie_rx", "NVML_GPM_METRIC_PCIE_RX_PER_SEC"),
    ("gpm_nvlink_tx", "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC"),
    ("gpm_nvlink_rx", "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC"),
)
FIELD_COUNTERS = (("pcie_tx_count", 197), ("pcie_rx_count", 198))
_LINE = re.compile(r"^(gpulens_gpu_[a-z_]+)\{([^}]*)\}\s+(\S+)\s*$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


# --- child: one load ----------------------------------------------------------------------------


class _Counter:
    """Bytes copied so far each way; a thread prints them (``bytes H2D D2H T``) five times a second."""

    def __init__(self) -> None:
        self.h2d = 0
        self.d2h = 0
        threading.Thread(target=self._report, daemon=True).start()

    def _report(self) -> None:
        while True:
            print(f"bytes {self.h2d} {self.d2h} {time.monotonic():.4f}", flush=True)
            time.sleep(0.2)


def _copy_step(kind: str, counter: _Counter) -> Any:
    """One step of a copy kind (synchronised, so bytes are counted when they have moved)."""
    import torch

    dev = torch.device("cuda")
    if kind in ("h2d", "d2h", "bidir", "h2d_pageable", "d2h_pageable"):
        pinned = not kind.endswith("pageable")
        n = GIB if pinned else 256 * MIB
        host = torch.empty(n, dtype=torch.uint8, pin_memory=pinned).fill_(1)
        host2 = torch.empty(n, dtype=torch.uint8, pin_memory=pinned)
        gpu = torch.empty(n, dtype=torch.uint8, device=dev)
        gpu2 = torch.empty(n, dtype=torch.uint8, device=dev).fill_(2)
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

        def step() -> None:
            if kind in ("h2d", "h2d_pageable"):
                gpu.copy_(host, non_blocking=pinned)
                torch.cuda.synchronize()
                counter.h2d += n
            elif kind in ("d2h", "d2h_pageable"):
                host2.copy_(gpu2, non_blocking=pinned)
                torch.cuda.synchronize()
                counter.d2h += n
            else:
                with torch.cuda.stream(s1):
                    gpu.copy_(host, non_blocking=True)
                with torch.cuda.stream(s2):
                    host2.copy_(gpu2, non_blocking=True)
                torch.cuda.synchronize()
                counter.h2d += n
                counter.d2h += n

        return step
    if kind == "small_h2d":
        n = 64 * 1024
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True).fill_(1)
        gpu = torch.empty(n, dtype=torch.uint8, device=dev)

        def small() -> None:
            for _ in range(200):
                gpu.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
            counter.h2d += 200 * n

        return small
    if kind == "tiny":
        x = torch.zeros(1024, dtype=torch.float32, device=dev)

        def tiny() -> None:
            for _ in range(200):  # back to back, never synchronised: launch-bound
                x.add_(1.0)

        return tiny
    if kind == "sleep":
        # One thread spinning on the clock: the GPU "runs" a kernel while its SMs do nothing,
        # as a kernel waiting on data (or a collective) does.
        return lambda: torch.cuda._sleep(2_500_000)  # ~1.3 ms at 1.98 GHz, four per 256 MiB copy
    if kind in ("copy", "bf16", "idle"):
        if kind == "idle":
            return lambda: time.sleep(0.2)
        if kind == "copy":
            src = torch.empty(2 * GIB // 4, dtype=torch.float32, device=dev).fill_(1.0)
            dst = torch.empty_like(src)
            return lambda: dst.copy_(src)
        a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
        b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
        c = torch.empty_like(a)
        return lambda: torch.matmul(a, b, out=c)
    raise SystemExit(f"unknown step kind {kind}")


def _overlapped(kernel: str, counter: _Counter) -> Any:
    """A kernel loop (``bf16`` GEMM or ``copy`` d2d) on one stream, pinned H2D copies on another."""
    import torch

    n = 256 * MIB
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True).fill_(1)
    gpu = torch.empty(n, dtype=torch.uint8, device="cuda")
    work = _copy_step(kernel, counter)
    s_kernel, s_copy = torch.cuda.Stream(), torch.cuda.Stream()

    def step() -> None:
        with torch.cuda.stream(s_copy):
            gpu.copy_(host, non_blocking=True)
        with torch.cuda.stream(s_kernel):
            for _ in range(4):
                work()
        s_copy.synchronize()
        counter.h2d += n
        s_kernel.synchronize()

    return step


CHILD_PHASES: dict[str, tuple[str, ...]] = {
    "h2d_pinned": ("h2d",),
    "d2h_pinned": ("d2h",),
    "bidir_pinned": ("bidir",),
    "h2d_pageable": ("h2d_pageable",),
    "d2h_pageable": ("d2h_pageable",),
    "h2d_overlap_gemm": ("overlap:bf16",),
    "small_h2d": ("small_h2d",),
    "stalled_h2d": ("h2d@0.5/1",),
    "d2d_and_h2d": ("overlap:copy",),
    "tiny_kernels_and_h2d": ("overlap:tiny",),
    "spin_kernel_and_h2d": ("overlap:sleep",),
    "h2d_then_idle": ("h2d", "idle"),
    "copy_then_idle": ("copy", "idle"),
    "gemm_then_idle": ("bf16", "idle"),
}


def run_child(load: str) -> None:
    """Run one load until killed: ``ready`` once steady, ``switched`` after the second phase began."""

    counter = _Counter()
    steps = []
    for phase in CHILD_PHASES[load]:
        spec, _, duty_spec = phase.partition("@")
        kernel = spec.removeprefix("overlap:")
        step = _overlapped(kernel, counter) if kernel != spec else _copy_step(spec, counter)
        if duty_spec:
            on, period = (float(x) for x in duty_spec.split("/"))
            step = duty(step, on, period)
        steps.append((spec, step))
    run_phases(steps, warm=2)


# --- parent -------------------------------------------------------------------------------------


class Recorder:
    """Raw pynvml on GPU 0 over consecutive windows: GPM ratios and rates, PCIe counters, GPU-Util."""

    def __init__(self) -> None:
        import pynvml

        self.nv = nv = pynvml
        nv.nvmlInit()
        self.h = nv.nvmlDeviceGetHandleByIndex(0)
        self.name = nv.nvmlDeviceGetName(self.h)
        self.driver = nv.nvmlSystemGetDriverVersion()
        self.prev = nv.nvmlGpmSampleAlloc()
        self.cur = nv.nvmlGpmSampleAlloc()
        nv.nvmlGpmSampleGet(self.h, self.prev)
        self.prev_t = time.monotonic()
        self.prev_counts = self._counts()

    def facts(self) -> dict[str, Any]:
        """Once: link generation, width and speed, and what NVML answers for NVLink."""
        nv, h = self.nv, self.h
        out: dict[str, Any] = {}
        for key, fn in (
            ("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
            ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth"),
            ("pcie_max_gen", "nvmlDeviceGetMaxPcieLinkGeneration"),
            ("pcie_max_width", "nvmlDeviceGetMaxPcieLinkWidth"),
            ("pcie_gpu_max_gen", "nvmlDeviceGetGpuMaxPcieLinkGeneration"),
            ("pcie_speed", "nvmlDeviceGetPcieSpeed"),
            ("pcie_link_max_speed", "nvmlDeviceGetPcieLinkMaxSpeed"),
        ):
            try:
                out[key] = getattr(nv, fn)(h)
            except Exception as exc:
                out[key] = f"error: {exc}"
        try:
            out["nvlink_state_0"] = nv.nvmlDeviceGetNvLinkState(h, 0)
        except Exception as exc:
            out["nvlink_state_0"] = f"error: {exc}"
        for fid in (90, 91, 138, 139, 164, 165, 197, 198):
            try:
                v = nv.nvmlDeviceGetFieldValues(h, [fid])[0]
                out[f"field_{fid}"] = (v.nvmlReturn, v.valueType, v.value.ullVal)
            except Exception as exc:
                out[f"field_{fid}"] = f"error: {exc}"
        return out

    def _counts(self) -> dict[str, int | None]:
        nv = self.nv
        try:
            values = nv.nvmlDeviceGetFieldValues(self.h, [fid for _, fid in FIELD_COUNTERS])
        except Exception:
            return {k: None for k, _ in FIELD_COUNTERS}
        return {
            k: (int(v.value.ullVal) if v.nvmlReturn == nv.NVML_SUCCESS else None)
            for (k, _), v in zip(FIELD_COUNTERS, values, strict=True)
        }

    def read(self) -> dict[str, Any]:
        nv = self.nv
        nv.nvmlGpmSampleGet(self.h, self.cur)
        counts = self._counts()
        now = time.monotonic()
        fields = [(f, getattr(nv, c)) for f, c in (*GPM_FIELDS, *GPM_RATES) if isinstance(getattr(nv, c, None), int)]
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(fields)
        req.sample1 = self.prev
        req.sample2 = self.cur
        for i, (_, metric_id) in enumerate(fields):
            req.metrics[i].metricId = metric_id
        nv.nvmlGpmMetricsGet(req)
        dt = now - self.prev_t
        row: dict[str, Any] = {"t": round(now, 4), "window_s": round(dt, 4)}
        rates = {f for f, _ in GPM_RATES}
        for i, (field, _) in enumerate(fields):
            m = req.metrics[i]
            if m.nvmlReturn != nv.NVML_SUCCESS:
                row[field] = None
            elif field in rates:
                row[field] = round(m.value * MIB, 1)  # bytes/s
            else:
                row[field] = round(m.value / 100.0, 6)
        for k, _ in FIELD_COUNTERS:
            a, b = self.prev_counts.get(k), counts.get(k)
            row[k.replace("_count", "_counter_bps")] = (
                round((b - a) / dt, 1) if a is not None and b is not None else None
            )
        self.prev_counts = counts
        for key, counter in (
            ("sampled_pcie_tx", nv.NVML_PCIE_UTIL_TX_BYTES),
            ("sampled_pcie_rx", nv.NVML_PCIE_UTIL_RX_BYTES),
        ):
            try:
                row[key] = nv.nvmlDeviceGetPcieThroughput(self.h, counter) * 1024.0
            except Exception:
                row[key] = None
        row["nvml_util"] = nv.nvmlDeviceGetUtilizationRates(self.h).gpu / 100.0
        row["has_processes"] = bool(nv.nvmlDeviceGetComputeRunningProcesses(self.h))
        self.prev, self.cur = self.cur, self.prev
        self.prev_t = now
        return row


def scrape(url: str) -> dict[str, Any]:
    """GPU 0's (MIG off) gpulens_gpu_* series: the class, and every other series by name[:link,direction]."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            text = resp.read().decode()
    except OSError as exc:
        return {"scrape_error": type(exc).__name__}
    out: dict[str, Any] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group(2)))
        if labels.get("gpu") != "0" and labels.get("uuid") is None:
            continue
        if labels.get("gpu") not in (None, "0") or labels.get("mig_uuid"):
            continue
        name, value = m.group(1), float(m.group(3))
        if name == "gpulens_gpu_boundness":
            if value == 1.0:
                out["exported_class"] = labels.get("class")
            continue
        key = name.removeprefix("gpulens_gpu_")
        for extra in ("link", "source"):
            if extra in labels:
                key += f":{labels[extra]}"
        out[key] = value
    out["exported_busy"] = out.get("busy_ratio")
    return out


class Child:
    """One load's child process, with its ready/switch times and its byte reports."""

    def __init__(self, kind: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.ready: float | None = None
        self.switched: float | None = None
        self.reports: list[tuple[float, int, int]] = []
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "ready":
                self.ready = time.monotonic()
            elif parts[0] == "switched":
                self.switched = float(parts[1])
            elif parts[0] == "bytes" and len(parts) == 4:
                self.reports.append((float(parts[3]), int(parts[1]), int(parts[2])))

    def rate(self, start: float, end: float) -> tuple[float, float] | None:
        """Measured (H2D, D2H) bytes/s between the reports nearest ``start`` and ``end``."""
        inside = [r for r in self.reports if start <= r[0] <= end]
        if len(inside) < 2 or inside[-1][0] - inside[0][0] < 1.0:
            return None
        (t0, h0, d0), (t1, h1, d1) = inside[0], inside[-1]
        return (h1 - h0) / (t1 - t0), (d1 - d0) / (t1 - t0)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def _exported_rate(rows: list[dict[str, Any]], key: str) -> float | None:
    """Bytes/s from an exported ``*_bytes_total`` counter over the rows (first to last scrape)."""
    pts = [(r["scraped_at"], r[key]) for r in rows if r.get(key) is not None and r.get("scraped_at")]
    if len(pts) < 2 or pts[-1][0] - pts[0][0] < 1.0:
        return None
    return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])


def run_load(load: Load, rec: Recorder, url: str | None, seconds: float, traces: Any) -> dict[str, Any]:
    child = Child(load.child) if load.child else None
    t_spawn = time.monotonic()
    ready = None if child else t_spawn
    next_sent: float | None = None
    rows: list[dict[str, Any]] = []
    next_tick = time.monotonic() + 1.0
    while True:
        time.sleep(max(0.0, next_tick - time.monotonic()))
        next_tick += 1.0
        if ready is None and child is not None and child.ready is not None:
            ready = child.ready
        row = rec.read()
        if url:
            row.update(scrape(url))
            row["scraped_at"] = time.monotonic()
        row["load"] = load.name
        row["phase"] = "warmup" if ready is None or row["t"] < ready else ("run" if next_sent is None else "second")
        rows.append(row)
        traces.write(json.dumps(row) + "\n")
        traces.flush()
        if ready is None:
            if row["t"] - t_spawn > 120 or (child and child.proc.poll() is not None):
                print(f"{load.name}: child never became ready", flush=True)
                break
            continue
        if len(load.expected) > 1 and next_sent is None and row["t"] >= ready + seconds:
            assert child is not None and child.proc.stdin is not None
            child.proc.stdin.write("next\n")
            child.proc.stdin.flush()
            next_sent = time.monotonic()
            continue
        end_at = (next_sent or ready) + seconds
        if (len(load.expected) == 1 or next_sent is not None) and row["t"] >= end_at:
            break
    if child:
        child.stop()
    res: dict[str, Any] = {"load": load.name, "expected": "->".join(load.expected)}
    if ready is None:
        res["ok"] = False
        return res
    switch = child.switched if child and child.switched else None
    bounds = [(ready, switch if switch is not None else float("inf"))]
    if switch is not None:
        bounds.append((switch, float("inf")))
    res["settle_s"] = [
        settle(rows, "exported_class", a, e, b) for (a, b), e in zip(bounds, load.expected, strict=False)
    ]
    res["exported"] = rows[-1].get("exported_class")
    steady = [r for r in rows if bounds[0][0] + 3.0 <= r["t"] < bounds[0][1]]
    measured = child.rate(steady[0]["t"], steady[-1]["t"]) if child and len(steady) > 1 else None
    res["measured_h2d_bps"], res["measured_d2h_bps"] = measured if measured else (None, None)
    for key in (
        "pcie_rx_counter_bps",
        "pcie_tx_counter_bps",
        "gpm_pcie_rx",
        "gpm_pcie_tx",
        "sampled_pcie_rx",
        "sampled_pcie_tx",
        "nvml_util",
        "graphics_util",
        "sm_active",
        "dram",
        "tensor",
        "exported_busy",
    ):
        v = _mean(steady, key)
        res[f"steady_{key}"] = round(v, 4) if v is not None else None
    res["exported_pcie_rx_bps"] = _exported_rate(steady, "pcie_rx_bytes_total")
    res["exported_pcie_tx_bps"] = _exported_rate(steady, "pcie_tx_bytes_total")
    for key in ("pcie_utilization_ratio", "transfer_active_ratio"):
        v = _mean(steady, key)
        res[f"steady_{key}"] = round(v, 4) if v is not None else None
    res["link_source"] = next((k.split(":")[-1] for r in steady for k in r if k.startswith("link_info:pcie")), None)
    for way, measured in (("rx", res["measured_h2d_bps"]), ("tx", res["measured_d2h_bps"])):
        exported = res[f"exported_pcie_{way}_bps"]
        res[f"{way}_exported_over_measured"] = (
            round(exported / measured, 4) if exported is not None and measured and measured > 1e9 else None
        )
    ok = res["exported"] == load.expected[-1]
    ok = ok and all(s is not None and s <= 20.0 for s in res["settle_s"])
    if switch is not None:
        after = [(round(r["t"] - switch, 2), r.get("exported_class")) for r in rows if r["t"] >= switch - 2.0]
        res["from_stop"] = after
        to_idle = next((t for t, c in after if t > 0 and c == load.expected[-1]), None)
        res["stop_to_final_s"] = to_idle
        between = {c for t, c in after if 0 < t < (to_idle or 1e9)} - {load.expected[0], load.expected[-1]}
        res["between"] = sorted(c for c in between if c)
        ok = ok and to_idle is not None and to_idle <= 3.0 and not res["between"]
    res["ok"] = ok
    return res


def _gbs(v: float | None) -> str:
    return "-" if v is None else f"{v / 1e9:.2f}"


def run_parent(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rec = Recorder()
    facts = rec.facts()
    print("facts:", json.dumps(facts, default=str), flush=True)
    exporter = None if args.no_exporter else start_exporter(args.port, 10.0, out / "exporter.log")
    url = f"http://127.0.0.1:{args.port}/metrics" if exporter else None
    loads = [x for x in LOADS if not args.loads or x.name in args.loads]
    results = []
    time.sleep(1.0)
    rec.read()
    with open(out / "traces.jsonl", "w") as traces:
        try:
            for load in loads:
                res = run_load(load, rec, url, args.seconds, traces)
                results.append(res)
                print(json.dumps(res, default=str), flush=True)
        finally:
            if exporter is not None:
                exporter.terminate()
                exporter.wait(10)
    lines = [
        f"GPU: {rec.name}, driver {rec.driver}; PCIe gen {facts.get('pcie_gen')} x{facts.get('pcie_width')}",
        "",
        "| load | expected | exported | settle s | busy | PCIe util | measured H2D / D2H GB/s "
        "| exported PCIe rx / tx GB/s (source) | exported / measured | NVML counters rx / tx | GPM rx / tx "
        "| sampled rx / tx | NVML util | GPM graphics / SM / DRAM |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s = " / ".join("never" if x is None else f"{x:.1f}" for x in r.get("settle_s", []))
        ratios = " / ".join(
            "-" if r.get(k) is None else f"{r[k]:.3f}"
            for k in ("rx_exported_over_measured", "tx_exported_over_measured")
        )
        lines.append(
            f"| {r['load']} | {r['expected']} | {r.get('exported')} | {s} | {r.get('steady_exported_busy')} "
            f"| {r.get('steady_pcie_utilization_ratio')} "
            f"| {_gbs(r.get('measured_h2d_bps'))} / {_gbs(r.get('measured_d2h_bps'))} "
            f"| {_gbs(r.get('exported_pcie_rx_bps'))} / {_gbs(r.get('exported_pcie_tx_bps'))} ({r.get('link_source')}) "
            f"| {ratios} "
            f"| {_gbs(r.get('steady_pcie_rx_counter_bps'))} / {_gbs(r.get('steady_pcie_tx_counter_bps'))} "
            f"| {_gbs(r.get('steady_gpm_pcie_rx'))} / {_gbs(r.get('steady_gpm_pcie_tx'))} "
            f"| {_gbs(r.get('steady_sampled_pcie_rx'))} / {_gbs(r.get('steady_sampled_pcie_tx'))} "
            f"| {r.get('steady_nvml_util')} | {r.get('steady_graphics_util')} / {r.get('steady_sm_active')} / "
            f"{r.get('steady_dram')} |"
        )
    lines.append("")
    for r in results:
        if "from_stop" in r:
            lines.append(
                f"{r['load']}: stop -> {r['expected'].split('->')[-1]} in {r.get('stop_to_final_s')} s; "
                f"other classes between: {r.get('between') or 'none'}"
            )
            lines.append("  " + " ".join(f"{t:g}:{c}" for t, c in r["from_stop"]))
    ok = all(r.get("ok") for r in results)
    lines.append("")
    lines.append(f"every load classed right, every stop idle within 3 s: {'YES' if ok else 'NO'}")
    table = "\n".join(lines)
    print(table)
    (out / "table.md").write_text(table + "\n")
    (out / "summary.json").write_text(json.dumps({"facts": facts, "results": results}, indent=1, default=str) + "\n")
    return 0 if ok else 1


FIXTURE_KEYS = (
    "t",
    "window_s",
    "sm_active",
    "sm_occupancy",
    "tensor",
    "fp64",
    "fp32",
    "fp16",
    "dram",
    "graphics_util",
    "nvml_util",
    "has_processes",
    "pcie_tx_counter_bps",
    "pcie_rx_counter_bps",
    "gpm_pcie_tx",
    "gpm_pcie_rx",
    "sampled_pcie_tx",
    "sampled_pcie_rx",
    "exported_class",
    "exported_busy",
    "phase",
)


def make_fixtures(src: Path, dest: Path) -> int:
    """Split a run's traces.jsonl into one JSON-lines fixture per load, plus manifest.json."""
    rows = [json.loads(x) for x in (src / "traces.jsonl").read_text().splitlines() if x.strip()]
    summary = json.loads((src / "summary.json").read_text())
    by_load = {r["load"]: r for r in summary["results"]}
    dest.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {"facts": summary["facts"], "loads": {}}
    for load in LOADS:
        mine = [r for r in rows if r["load"] == load.name]
        if not mine or load.name not in by_load:
            continue
        t0 = mine[0]["t"]
        with open(dest / f"{load.name}.jsonl", "w") as f:
            for r in mine:
                row = {k: r.get(k) for k in FIXTURE_KEYS}
                row["t"] = round(r["t"] - t0, 4)
                f.write(json.dumps(row) + "\n")
        res = by_load[load.name]
        first_run = next((r["t"] for r in mine if r["phase"] != "warmup"), None)
        first_second = None
        if res.get("from_stop"):
            # from_stop lists (row time - stop, class) from the first row at most 2 s before the stop
            # for the load's last rows, from the first one at most 2 s before the stop
            rel0 = float(res["from_stop"][0][0])
            first_second = mine[-len(res["from_stop"])]["t"] - rel0
        manifest["loads"][load.name] = {
            "file": f"{load.name}.jsonl",
            "expected": list(load.expected),
            "load_started_s": round(first_run - t0, 3) if first_run is not None else None,
            "stop_s": round(first_second - t0, 3) if first_second is not None else None,
            "measured_h2d_bps": res.get("measured_h2d_bps"),
            "measured_d2h_bps": res.get("measured_d2h_bps"),
        }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    print(f"wrote {len(manifest['loads'])} traces to {dest}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.environ.get("OUT", "transfer-out"))
    ap.add_argument("--seconds", type=float, default=20.0, help="run time of each load (of each phase) after warm-up")
    ap.add_argument("--port", type=int, default=9445)
    ap.add_argument("--no-exporter", action="store_true", help="record only (no exporter started)")
    ap.add_argument("--loads", nargs="*", help="subset of: " + " ".join(x.name for x in LOADS))
    ap.add_argument("--make-fixtures", metavar="RUN_DIR", help="turn a run's output into test fixtures")
    ap.add_argument("--fixtures-dir", default=str(ROOT / "tests" / "fixtures" / "transfer_traces"))
    args = ap.parse_args()
    if args.make_fixtures:
        return make_fixtures(Path(args.make_fixtures), Path(args.fixtures_dir))
    if args.child:
        run_child(args.child)
        return 0
    return run_parent(args)


if __name__ == "__main__":
    sys.exit(main())
