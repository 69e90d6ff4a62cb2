#!/usr/bin/env python3
"""Device run for boundness: loads one after another under the real exporter, on GPU 0.

Each load runs in one or two child processes (torch) while this script records GPM over 1 s
windows with raw pynvml, feeds the trace through exporter.analysis.boundness, and reads the class
and busy ratio the exporter (``python3 -m exporter --backend nvml``) exports on /metrics each
second.  Two-phase loads (copy then GEMM, copy then nothing, ...) switch when this script tells
the child to, and their per-second class trace is printed.  It prints ``workload | expected |
exported | seconds to settle | busy`` and writes the traces (JSON lines, the test fixtures'
format) under --out.  Needs: an NVIDIA GPU with GPM, pynvml, torch.

    python3 scripts/gpu_boundness.py --out "$OUT"              # every load
    python3 scripts/gpu_boundness.py --out "$OUT" --loads d2d_copy stalled_gemm
    python3 scripts/gpu_boundness.py --make-fixtures RUN_DIR   # traces -> tests/fixtures/gpm_traces
    python3 scripts/gpu_boundness.py --child bf16_gemm         # (internal) run one load
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

from gpu_child import duty, run_phases  # noqa: E402  (the child loop shared with gpu_transfer.py)

from exporter.analysis.boundness import BoundnessClassifier  # noqa: E402
from exporter.model import BOUNDNESS_CLASSES  # noqa: E402
from tests.support.gpm_traces import recorded_gpm  # noqa: E402  (the same row -> sample as the replays)

GIB = 1 << 30


@dataclass(frozen=True)
class Load:
    """One row of the run: child processes started together, and the class expected per phase.

    A two-phase load switches from its first to its second phase when the parent tells every
    child to (a line on its stdin); ``transit`` lists the classes allowed in between besides the
    two phases' own (the memory -> compute step may show ``mixed`` for up to one window).
    """

    name: str
    children: tuple[str, ...]
    expected: tuple[str, ...]
    transit: frozenset[str] = frozenset()

    @property
    def final(self) -> str:
        return self.expected[-1]


LOADS: tuple[Load, ...] = (
    Load("nothing", (), ("idle",)),
    Load("d2d_copy", ("d2d_copy",), ("memory",)),
    Load("bf16_gemm", ("bf16_gemm",), ("compute",)),
    Load("tiny_kernels", ("tiny_kernels",), ("launch",)),
    Load("fp32_gemm_no_tf32", ("fp32_gemm_no_tf32",), ("compute",)),
    Load("hold_40gib", ("hold_40gib",), ("idle",)),
    # Two tenants time-sliced on one GPU, both flat out: memory half the time, tensor the other.
    Load("copy_and_gemm_timesliced", ("d2d_copy", "bf16_gemm"), ("mixed",)),
    # A GEMM job that waits on its input half the time (0.5 s of GEMMs, then 0.5 s of nothing).
    Load("stalled_gemm", ("stalled_gemm",), ("compute",)),
    Load("copy_then_idle", ("copy_then_idle",), ("memory", "idle")),
    Load("copy_then_gemm", ("copy_then_gemm",), ("memory", "compute"), frozenset({"mixed"})),
    # Further loads of the same kinds, to check the classifier is right for the reason.
    Load("copy_and_fp32_timesliced", ("d2d_copy", "fp32_gemm_no_tf32"), ("mixed",)),
    Load("stalled_copy_slow", ("stalled_copy_slow",), ("memory",)),
    Load("gemm_then_copy", ("gemm_then_copy",), ("compute", "memory"), frozenset({"mixed"})),
    Load("gemm_then_idle", ("gemm_then_idle",), ("compute", "idle")),
    Load("copy_and_copy_timesliced", ("d2d_copy", "d2d_copy"), ("memory",)),
)
GPM_FIELDS = (
    ("sm_active", "NVML_GPM_METRIC_SM_UTIL"),
    ("sm_occupancy", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("tensor", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("fp64", "NVML_GPM_METRIC_FP64_UTIL"),
    ("fp32", "NVML_GPM_METRIC_FP32_UTIL"),
    ("fp16", "NVML_GPM_METRIC_FP16_UTIL"),
    ("dram", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
    # The busy ratio: fraction of time a context ran work on the GPU.
    ("graphics_util", "NVML_GPM_METRIC_GRAPHICS_UTIL"),
)
_SERIES = re.compile(r'^(gpulens_gpu_boundness|gpulens_gpu_busy_ratio)\{(?=[^}]*gpu="0")([^}]*)\}\s+(\S+)\s*$')
_CLASS = re.compile(r'class="(\w+)"')


# --- child: one load ----------------------------------------------------------------------------


def _steps(kind: str) -> Any:
    """(step function, stop-after-sync) for one steady loop kind; allocates its tensors."""
    import torch

    dev = torch.device("cuda")
    if kind == "copy":
        src = torch.empty(2 * GIB // 4, dtype=torch.float32, device=dev).fill_(1.0)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)
    if kind == "bf16":
        a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
        b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
        c = torch.empty_like(a)
        return lambda: torch.matmul(a, b, out=c)
    if kind == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        a = torch.randn(4096, 4096, dtype=torch.float32, device=dev)
        b = torch.randn(4096, 4096, dtype=torch.float32, device=dev)
        c = torch.empty_like(a)
        return lambda: torch.matmul(a, b, out=c)
    if kind == "tiny":
        x = torch.zeros(1024, dtype=torch.float32, device=dev)

        def tiny() -> None:
            for _ in range(1000):  # back to back, never synchronised
                x.add_(1.0)

        return tiny
    if kind == "idle":
        return lambda: time.sleep(0.2)
    raise SystemExit(f"unknown step kind {kind}")


CHILD_PHASES: dict[str, tuple[str, ...]] = {
    "d2d_copy": ("copy",),
    "bf16_gemm": ("bf16",),
    "fp32_gemm_no_tf32": ("fp32",),
    "tiny_kernels": ("tiny",),
    "hold_40gib": ("idle",),
    "stalled_gemm": ("bf16@0.5/1",),
    "stalled_copy_slow": ("copy@2/4",),
    "copy_then_idle": ("copy", "idle"),
    "copy_then_gemm": ("copy", "bf16"),
    "gemm_then_copy": ("bf16", "copy"),
    "gemm_then_idle": ("bf16", "idle"),
}


def run_child(load: str) -> None:
    """Run one child kind until killed; print ``ready`` once in its steady loop, ``switched`` after
    moving to its second phase (on a line from the parent)."""
    import torch

    if load not in CHILD_PHASES:
        raise SystemExit(f"unknown load {load}")
    held = None
    if load == "hold_40gib":
        held = torch.empty(40 * GIB, dtype=torch.uint8, device="cuda")
        held.zero_()
    steps = []
    for phase in CHILD_PHASES[load]:
        kind, _, duty_spec = phase.partition("@")
        step = _steps(kind)
        if duty_spec:
            on, period = (float(x) for x in duty_spec.split("/"))
            step = duty(step, on, period, after=torch.cuda.synchronize)
        steps.append((kind, step))
    run_phases(steps, warm=3)


# --- parent: GPM recorder -------------------------------------------------------------------------


class GpmRecorder:
    """Raw pynvml GPM over consecutive windows on GPU 0, plus NVML util and process presence."""

    def __init__(self) -> None:
        import pynvml

        self.nv = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.name = pynvml.nvmlDeviceGetName(self.handle)
        self.driver = pynvml.nvmlSystemGetDriverVersion()
        if not pynvml.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice:
            raise SystemExit("GPM not supported on GPU 0")
        self.prev = pynvml.nvmlGpmSampleAlloc()
        self.cur = pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(self.handle, self.prev)
        self.prev_t = time.monotonic()
        self.last_proc_ts = 0

    def read(self) -> dict[str, Any]:
        nv = self.nv
        nv.nvmlGpmSampleGet(self.handle, self.cur)
        now = time.monotonic()
        fields = [(f, getattr(nv, c)) for f, c in GPM_FIELDS if isinstance(getattr(nv, c, None), int)]
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(fields)
        req.sample1 = self.prev
        req.sample2 = self.cur
        for i, (_, metric_id) in enumerate(fields):
            req.metrics[i].metricId = metric_id
        nv.nvmlGpmMetricsGet(req)
        row: dict[str, Any] = {"t": round(now, 4), "window_s": round(now - self.prev_t, 4)}
        row.update({f: None for f, _ in GPM_FIELDS})
        for i, (field, _) in enumerate(fields):
            m = req.metrics[i]
            row[field] = round(m.value / 100.0, 6) if m.nvmlReturn == nv.NVML_SUCCESS else None
        rates = nv.nvmlDeviceGetUtilizationRates(self.handle)
        row["nvml_util"] = rates.gpu / 100.0
        # what the coarse classes (GPUs without GPM) read: memory-controller busy time and power
        row["nvml_mem_util"] = rates.memory / 100.0
        row["power_ratio"] = round(
            nv.nvmlDeviceGetPowerUsage(self.handle) / nv.nvmlDeviceGetEnforcedPowerLimit(self.handle), 4
        )
        row["has_processes"] = bool(nv.nvmlDeviceGetComputeRunningProcesses(self.handle))
        row["memory_used_bytes"] = nv.nvmlDeviceGetMemoryInfo(self.handle).used
        try:  # per-process SM utilisation (the pods' shares on a time-sliced GPU come from it)
            samples = nv.nvmlDeviceGetProcessUtilization(self.handle, self.last_proc_ts)
            row["process_sm_util"] = {str(x.pid): x.smUtil / 100.0 for x in samples}
            self.last_proc_ts = max([self.last_proc_ts, *(x.timeStamp for x in samples)])
        except nv.NVMLError:
            row["process_sm_util"] = {}
        self.prev, self.cur = self.cur, self.prev
        self.prev_t = now
        return row


def scrape(url: str) -> tuple[str | None, float | None, str]:
    """The class and busy ratio the exporter exports for GPU 0 (MIG off), plus a short error."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            text = resp.read().decode()
    except OSError as exc:
        return None, None, type(exc).__name__
    cls: str | None = None
    busy: float | None = None
    for line in text.splitlines():
        m = _SERIES.match(line)
        if not m:
            continue
        if m.group(1) == "gpulens_gpu_busy_ratio":
            busy = float(m.group(3))
        elif float(m.group(3)) == 1.0:
            c = _CLASS.search(m.group(2))
            cls = c.group(1) if c else None
    return cls, busy, "" if cls is not None else "no boundness series"


def start_exporter(
    port: int, window: float, log_path: Path, extra: tuple[str, ...] = ()
) -> subprocess.Popen[bytes] | None:
    if not (ROOT / "exporter" / "cli.py").exists():
        return None
    cmd = [
        sys.executable,
        "-m",
        "exporter",
        "--backend",
        "nvml",
        "--web.listen-address",
        f"127.0.0.1:{port}",
        "--collect.interval",
        "1s",
        "--analysis.window",
        f"{window:g}s",
        "--no-probes",
        "--no-kubernetes.api",
        *extra,
    ]
    log = open(log_path, "wb")  # noqa: SIM115 - lives as long as the child
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.3)
    print(f"exporter did not become ready (rc={proc.poll()}); see {log_path.name}", flush=True)
    proc.kill()
    return None


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def settle(rows: list[dict[str, Any]], key: str, ready_t: float, expected: str, until: float) -> float | None:
    """Seconds from ``ready_t`` until rows[key] == expected for the rest of [ready_t, until)."""
    settled: float | None = None
    for r in rows:
        if r["t"] < ready_t or r["t"] >= until:
            continue
        if r.get(key) == expected:
            if settled is None:
                settled = max(0.0, r["t"] - ready_t)
        else:
            settled = None
    return settled


def _spawn(kind: str) -> tuple[subprocess.Popen[str], list[float], list[float]]:
    """Start one child; its ``ready`` and ``switched`` times land in the two lists."""
    child = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--child", kind],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    ready: list[float] = []
    switched: list[float] = []

    def watch() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            word = line.strip().partition(" ")[0]  # "switched <t>": the time read here is kept
            if word == "ready":
                ready.append(time.monotonic())
            elif word == "switched":
                switched.append(time.monotonic())

    threading.Thread(target=watch, daemon=True).start()
    return child, ready, switched


def _phase_summary(
    load: Load, rows: list[dict[str, Any]], key: str, bounds: list[tuple[float, float]], window: float
) -> dict[str, Any]:
    """Per phase: settle time and the classes seen from the phase start to its settle point."""
    phases = []
    for i, ((start, end), expected) in enumerate(zip(bounds, load.expected, strict=True)):
        s = settle(rows, key, start, expected, end)
        seen = [r.get(key) for r in rows if start <= r["t"] < end]
        before = seen[: int(s)] if s is not None else seen
        allowed = {expected, *load.transit} | ({load.expected[i - 1]} if i else set())
        if i == 0 and load.name != "nothing":
            allowed |= set(BOUNDNESS_CLASSES)  # from the previous load
        wrong = sorted({c for c in before if c not in allowed and c is not None})
        phases.append(
            {
                "expected": expected,
                "settle_s": s,
                "ok": s is not None and s <= 2 * window and (i == 0 or not wrong),
                "wrong_in_transit": wrong if i else [],
                "transit_classes": sorted({c for c in before if c is not None}),
                "mixed_s": sum(1 for c in before if c == "mixed"),
            }
        )
    return {"phases": phases}


def run_parent(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rec = GpmRecorder()
    exporter = start_exporter(args.port, args.window, out / "exporter.log")
    url = f"http://127.0.0.1:{args.port}/metrics"
    # the same exporter with GPM switched off: the coarse classes a pre-Hopper GPU gets
    coarse = (
        start_exporter(args.port + 1, args.window, out / "exporter-nogpm.log", ("--no-collect.gpm",))
        if args.compare_without_gpm
        else None
    )
    coarse_url = f"http://127.0.0.1:{args.port + 1}/metrics"
    clf = BoundnessClassifier(window_seconds=args.window)
    print(f"GPU 0: {rec.name}; exporter {'running' if exporter else 'NOT running (in-script class only)'}")
    loads = [x for x in LOADS if not args.loads or x.name in args.loads]
    results: list[dict[str, Any]] = []
    traces = open(out / "traces.jsonl", "w")  # noqa: SIM115
    time.sleep(1.0)
    rec.read()  # align the first window
    key = "exported_class" if exporter else "in_script_class"
    try:
        for load in loads:
            t_spawn = time.monotonic()
            children = [_spawn(kind) for kind in load.children]
            two_phase = len(load.expected) > 1
            rows: list[dict[str, Any]] = []
            ready_t: float | None = t_spawn if not children else None
            next_sent: float | None = None
            next_tick = time.monotonic() + 1.0
            while True:
                time.sleep(max(0.0, next_tick - time.monotonic()))
                next_tick += 1.0
                if ready_t is None and all(r for _, r, _ in children):
                    ready_t = max(r[0] for _, r, _ in children)
                row = rec.read()
                gpm = recorded_gpm(row, row["window_s"])
                row["in_script_class"] = clf.observe("gpu0", gpm, row["nvml_util"], row["has_processes"], row["t"])
                if exporter:
                    row["exported_class"], row["exported_busy"], err = scrape(url)
                else:
                    row["exported_class"], row["exported_busy"], err = None, None, "no exporter"
                if err:
                    row["scrape_error"] = err
                if coarse is not None:
                    row["coarse_class"], row["coarse_busy"], _ = scrape(coarse_url)
                row["load"] = load.name
                if ready_t is None or row["t"] < ready_t:
                    row["phase"] = "warmup"
                elif next_sent is None or row["t"] < next_sent:
                    row["phase"] = "run"
                else:
                    row["phase"] = "second"
                rows.append(row)
                traces.write(json.dumps(row) + "\n")
                traces.flush()
                if ready_t is None:
                    if row["t"] - t_spawn > 120 or any(c.poll() is not None for c, _, _ in children):
                        print(f"{load.name}: a child never became ready", flush=True)
                        break
                    continue
                if two_phase and next_sent is None and row["t"] >= ready_t + args.seconds:
                    for c, _, _ in children:
                        assert c.stdin is not None
                        c.stdin.write("next\n")
                        c.stdin.flush()
                    next_sent = time.monotonic()
                    continue
                end_at = (next_sent if next_sent is not None else ready_t) + args.seconds
                if (not two_phase or next_sent is not None) and row["t"] >= end_at:
                    break
            for c, _, _ in children:
                c.kill()
                c.wait()
            if ready_t is None:
                results.append({"load": load.name, "expected": load.final, "exported": None, "ok": False})
                continue
            switched = [sw[0] for _, _, sw in children if sw]
            switch_t = max(switched) if switched else next_sent
            bounds = [(ready_t, switch_t if switch_t is not None else float("inf"))]
            if two_phase and switch_t is not None:
                bounds.append((switch_t, float("inf")))
            summary = _phase_summary(load, rows, key, bounds, args.window)
            last = [r for r in rows if r["t"] >= bounds[-1][0]][-10:]
            busy = [r["exported_busy"] for r in last if r.get("exported_busy") is not None]
            gr = [r["graphics_util"] for r in last if r.get("graphics_util") is not None]
            res = {
                "load": load.name,
                "expected": "->".join(load.expected),
                "exported": rows[-1].get(key),
                "coarse": rows[-1].get("coarse_class"),
                "coarse_last10": sorted({str(r.get("coarse_class")) for r in last}),
                "in_script": rows[-1].get("in_script_class"),
                "ok": all(p["ok"] for p in summary["phases"]) and rows[-1].get(key) == load.final,
                "settle_s": [p["settle_s"] for p in summary["phases"]],
                "phases": summary["phases"],
                "busy_last10": round(sum(busy) / len(busy), 3) if busy else None,
                "graphics_last10": round(sum(gr) / len(gr), 3) if gr else None,
                "warmup_s": round(ready_t - t_spawn, 2),
                "ready_t": round(ready_t, 4),
                "switch_t": round(switch_t, 4) if switch_t is not None else None,
                "source": "exporter" if exporter else "in-script classifier (exporter not running)",
                "last10s_means": {
                    f: round(sum(r[f] or 0.0 for r in last) / max(1, len(last)), 4)
                    for f in (
                        "sm_active",
                        "sm_occupancy",
                        "tensor",
                        "fp32",
                        "dram",
                        "nvml_util",
                        "graphics_util",
                        "nvml_mem_util",
                        "power_ratio",
                    )
                },
            }
            if len(load.children) > 1:
                shares = [r.get("process_sm_util", {}) for r in last]
                res["process_sm_util_last10"] = {
                    pid: round(sum(s.get(pid, 0.0) for s in shares) / len(shares), 3)
                    for pid in sorted({p for s in shares for p in s})
                }
            if two_phase:
                res["trace"] = [
                    (round(r["t"] - bounds[-1][0], 1), r.get(key), r.get("exported_busy"))
                    for r in rows
                    if bounds[-1][0] - 3 <= r["t"]
                ]
            results.append(res)
            print(json.dumps(res), flush=True)
    finally:
        traces.close()
        if coarse is not None:
            coarse.terminate()
            coarse.wait(10)
        if exporter is not None:
            exporter.terminate()
            try:
                exporter.wait(10)
            except subprocess.TimeoutExpired:
                exporter.kill()
    ok = all(r["ok"] for r in results)
    lines = [
        f"GPU: {rec.name}, driver {rec.driver}, nvidia-ml-py {_version('nvidia-ml-py')}, torch {_version('torch')}",
        f"window {args.window:g} s, GPM 1 s; class source: {results[0].get('source', '-') if results else '-'}",
        "",
        "| workload | expected | exported | seconds to settle (per phase) | classes in transit | busy ratio "
        "| last-10 s means sm / dram / max pipe / GPM graphics |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r.get("last10s_means", {})
        settles = " / ".join("never" if x is None else f"{x:.1f}" for x in r.get("settle_s", []))
        transit = " / ".join(",".join(p["transit_classes"]) for p in r.get("phases", [])[1:]) or "-"
        lines.append(
            f"| {r['load']} | {r['expected']} | {r['exported']} | {settles} | {transit} | {r.get('busy_last10')} | "
            f"{m.get('sm_active', 0):.4f} / {m.get('dram', 0):.3f} / {max(m.get('tensor', 0), m.get('fp32', 0)):.3f}"
            f" / {m.get('graphics_util', 0):.3f} |"
        )
    lines.append("")
    for r in results:
        if "trace" in r:
            lines.append(f"{r['load']}, per second from the switch (s, class, busy):")
            lines.append("  " + " ".join(f"{t:g}:{c}:{b}" for t, c, b in r["trace"]))
        if "process_sm_util_last10" in r:
            lines.append(f"{r['load']}: NVML per-process SM util, last 10 s: {r['process_sm_util_last10']}")
    if coarse is not None:
        lines += [
            "",
            "Without GPM (the same loads, a second exporter with --no-collect.gpm: the coarse classes):",
            "",
            "| workload | GPM class | coarse class (GPM off) | coarse classes, last 10 s "
            "| NVML util / mem util / power ratio |",
            "|---|---|---|---|---|",
        ]
        for r in results:
            m = r.get("last10s_means", {})
            lines.append(
                f"| {r['load']} | {r['exported']} | {r.get('coarse')} | {', '.join(r.get('coarse_last10', []))} | "
                f"{m.get('nvml_util', 0):.2f} / {m.get('nvml_mem_util', 0):.2f} / {m.get('power_ratio', 0):.2f} |"
            )
    lines.append("")
    lines.append(f"every row right within two windows, no wrong class in a transition: {'YES' if ok else 'NO'}")
    table = "\n".join(lines)
    print(table)
    (out / "table.md").write_text(table + "\n")
    (out / "summary.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0 if ok else 1


FIXTURE_KEYS = ("t", "sm_active", "sm_occupancy", "tensor", "fp64", "fp32", "fp16", "dram", "nvml_util")


def make_fixtures(src: Path, dest: Path) -> int:
    """Split a run's traces.jsonl into one JSON-lines fixture per load, plus manifest.json."""
    rows = [json.loads(line) for line in (src / "traces.jsonl").read_text().splitlines() if line.strip()]
    summary = {r["load"]: r for r in json.loads((src / "summary.json").read_text())}
    dest.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {}
    for order, load in enumerate(LOADS):
        mine = [r for r in rows if r["load"] == load.name]
        res = summary.get(load.name)
        if not mine or res is None or res.get("ready_t") is None:
            continue
        keep: tuple[str, ...] = (
            *FIXTURE_KEYS,
            "has_processes",
            "graphics_util",
            "exported_class",
            "exported_busy",
            "phase",
        )
        if "power_ratio" in mine[0]:  # the coarse path's inputs (recorded since the GPM-off comparison)
            keep = (*keep, "nvml_mem_util", "power_ratio", "coarse_class")
        t0 = mine[0]["t"]
        with open(dest / f"{load.name}.jsonl", "w") as f:
            for r in mine:
                out = {k: r.get(k) for k in keep}
                out["t"] = round(r["t"] - t0, 4)  # seconds since this load's recording began
                f.write(json.dumps(out) + "\n")
        manifest[load.name] = {
            "file": f"{load.name}.jsonl",
            "order": order,
            "processes": len(load.children),
            "expected": list(load.expected),
            "load_started_s": round(res["ready_t"] - t0, 3),
            "switch_s": round(res["switch_t"] - t0, 3) if res.get("switch_t") is not None else None,
            "exported_settle_s": res["settle_s"],
        }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {len(manifest)} traces to {dest}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.environ.get("OUT", "boundness-out"))
    ap.add_argument("--seconds", type=float, default=30.0, help="run time of each load (of each phase) after warm-up")
    ap.add_argument("--window", type=float, default=10.0, help="classifier window (s)")
    ap.add_argument("--port", type=int, default=9445)
    ap.add_argument(
        "--compare-without-gpm",
        action="store_true",
        help="also run an exporter with --no-collect.gpm on --port + 1 and report its coarse classes",
    )
    ap.add_argument("--loads", nargs="*", help="subset of: " + " ".join(x.name for x in LOADS))
    ap.add_argument("--make-fixtures", metavar="RUN_DIR", help="turn a run's output into test fixtures")
    ap.add_argument("--fixtures-dir", default=str(ROOT / "tests" / "fixtures" / "gpm_traces"))
    args = ap.parse_args()
    if args.make_fixtures:
        return make_fixtures(Path(args.make_fixtures), Path(args.fixtures_dir))
    if args.child:
        run_child(args.child)
        return 0
    return run_parent(args)


if __name__ == "__main__":
    sys.exit(main())
