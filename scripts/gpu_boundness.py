#!/usr/bin/env python3
"""Device run for boundness (issue 3): six loads, one at a time, under the real exporter.

For each load a child process runs it (torch) while this script records GPM over 1 s windows with
raw pynvml, feeds the trace through exporter.analysis.boundness, and reads the class the exporter
(``python3 -m exporter --backend nvml``) exports on /metrics each second.  It prints
``workload | expected class | exported class | seconds to settle`` and writes the traces (JSON
lines, the test fixtures' format) under --out.  Needs: an NVIDIA GPU with GPM, pynvml, torch.

    python3 scripts/gpu_boundness.py --out "$OUT"              # all loads, 30 s each
    python3 scripts/gpu_boundness.py --make-fixtures RUN_DIR   # traces -> tests/fixtures/gpm_traces
    python3 scripts/gpu_boundness.py --child bf16_gemm         # (internal) run one load
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.analysis.boundness import BoundnessClassifier  # noqa: E402
from exporter.model import GpmSample  # noqa: E402

GIB = 1 << 30
LOADS: tuple[tuple[str, str], ...] = (
    ("nothing", "idle"),
    ("d2d_copy", "memory"),
    ("bf16_gemm", "compute"),
    ("tiny_kernels", "launch"),
    ("fp32_gemm_no_tf32", "compute"),
    ("hold_40gib", "idle"),
)
GPM_FIELDS = (
    ("sm_active", "NVML_GPM_METRIC_SM_UTIL"),
    ("sm_occupancy", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("tensor", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("fp64", "NVML_GPM_METRIC_FP64_UTIL"),
    ("fp32", "NVML_GPM_METRIC_FP32_UTIL"),
    ("fp16", "NVML_GPM_METRIC_FP16_UTIL"),
    ("dram", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
    # Not used by the classifier (not in GpmSample): recorded to study duty-cycle normalisation.
    ("graphics_util", "NVML_GPM_METRIC_GRAPHICS_UTIL"),
)
_BOUNDNESS_LINE = re.compile(r'^gpulens_gpu_boundness\{(?=[^}]*gpu="0")[^}]*class="(\w+)"[^}]*\}\s+1(\.0)?\s*$')


# --- child: one load ----------------------------------------------------------------------------


def run_child(load: str) -> None:
    """Run one load until killed; print ``ready`` once it is in its steady loop."""
    import torch

    dev = torch.device("cuda")
    step: Any
    if load == "d2d_copy":
        src = torch.empty(2 * GIB // 4, dtype=torch.float32, device=dev).fill_(1.0)
        dst = torch.empty_like(src)

        def step() -> None:
            dst.copy_(src)
    elif load == "bf16_gemm":
        a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
        b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
        c = torch.empty_like(a)

        def step() -> None:
            torch.matmul(a, b, out=c)
    elif load == "fp32_gemm_no_tf32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        a = torch.randn(4096, 4096, dtype=torch.float32, device=dev)
        b = torch.randn(4096, 4096, dtype=torch.float32, device=dev)
        c = torch.empty_like(a)

        def step() -> None:
            torch.matmul(a, b, out=c)
    elif load == "tiny_kernels":
        x = torch.zeros(1024, dtype=torch.float32, device=dev)

        def step() -> None:
            for _ in range(1000):  # back to back, never synchronised
                x.add_(1.0)
    elif load == "hold_40gib":
        held = torch.empty(40 * GIB, dtype=torch.uint8, device=dev)
        held.zero_()

        def step() -> None:
            time.sleep(0.5)
    else:
        raise SystemExit(f"unknown load {load}")
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    print("ready", flush=True)
    while True:  # the parent kills this process; a full launch queue just blocks the loop
        step()


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
        row["nvml_util"] = nv.nvmlDeviceGetUtilizationRates(self.handle).gpu / 100.0
        row["has_processes"] = bool(nv.nvmlDeviceGetComputeRunningProcesses(self.handle))
        row["memory_used_bytes"] = nv.nvmlDeviceGetMemoryInfo(self.handle).used
        self.prev, self.cur = self.cur, self.prev
        self.prev_t = now
        return row


def scrape_class(url: str) -> tuple[str | None, str]:
    """The class the exporter exports for GPU 0 (MIG off), or None, plus a short error."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            text = resp.read().decode()
    except OSError as exc:
        return None, type(exc).__name__
    for line in text.splitlines():
        m = _BOUNDNESS_LINE.match(line)
        if m:
            return m.group(1), ""
    return None, "no boundness series"


def start_exporter(port: int, window: float, log_path: Path) -> subprocess.Popen[bytes] | None:
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


def settle(rows: list[dict[str, Any]], key: str, ready_t: float, expected: str) -> float | None:
    """Seconds from ``ready_t`` until rows[key] == expected for the rest of the load."""
    settled: float | None = None
    for r in rows:
        if r["t"] < ready_t:
            continue
        if r.get(key) == expected:
            if settled is None:
                settled = max(0.0, r["t"] - ready_t)
        else:
            settled = None
    return settled


def run_parent(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rec = GpmRecorder()
    exporter = start_exporter(args.port, args.window, out / "exporter.log")
    url = f"http://127.0.0.1:{args.port}/metrics"
    clf = BoundnessClassifier(window_seconds=args.window)
    print(f"GPU 0: {rec.name}; exporter {'running' if exporter else 'NOT running (in-script class only)'}")
    loads = [x for x in LOADS if not args.loads or x[0] in args.loads]
    results: list[dict[str, Any]] = []
    traces = open(out / "traces.jsonl", "w")  # noqa: SIM115
    time.sleep(1.0)
    rec.read()  # align the first window
    try:
        for load, expected in loads:
            child = None
            ready: list[float] = []
            t_spawn = time.monotonic()
            if load != "nothing":
                child = subprocess.Popen(
                    [sys.executable, str(Path(__file__).resolve()), "--child", load],
                    stdout=subprocess.PIPE,
                    text=True,
                )

                def wait_ready(p: subprocess.Popen[str] = child, got: list[float] = ready) -> None:
                    assert p.stdout is not None
                    for line in p.stdout:
                        if line.strip() == "ready":
                            got.append(time.monotonic())
                            return

                threading.Thread(target=wait_ready, daemon=True).start()
            else:
                ready.append(t_spawn)
            rows: list[dict[str, Any]] = []
            next_tick = time.monotonic() + 1.0
            while True:
                time.sleep(max(0.0, next_tick - time.monotonic()))
                next_tick += 1.0
                row = rec.read()
                gpm = GpmSample(
                    window_seconds=row["window_s"],
                    sm_active=row["sm_active"],
                    sm_occupancy=row["sm_occupancy"],
                    tensor_active=row["tensor"],
                    fp64_active=row["fp64"],
                    fp32_active=row["fp32"],
                    fp16_active=row["fp16"],
                    dram_active=row["dram"],
                )
                row["in_script_class"] = clf.observe("gpu0", gpm, row["nvml_util"], row["has_processes"], row["t"])
                row["exported_class"], err = scrape_class(url) if exporter else (None, "no exporter")
                if err:
                    row["scrape_error"] = err
                row["load"] = load
                row["phase"] = "run" if ready and row["t"] >= ready[0] else "warmup"
                rows.append(row)
                traces.write(json.dumps(row) + "\n")
                traces.flush()
                if ready and row["t"] >= ready[0] + args.seconds:
                    break
                if not ready and row["t"] - t_spawn > 120:
                    print(f"{load}: child never became ready", flush=True)
                    break
                if child is not None and child.poll() is not None and not ready:
                    print(f"{load}: child exited rc={child.returncode}", flush=True)
                    break
            if child is not None:
                child.kill()
                child.wait()
            ready_t = ready[0] if ready else float("inf")
            run_rows = [r for r in rows if r["t"] >= ready_t]
            key = "exported_class" if exporter else "in_script_class"
            res = {
                "load": load,
                "expected": expected,
                "exported": run_rows[-1].get(key) if run_rows else None,
                "in_script": run_rows[-1].get("in_script_class") if run_rows else None,
                "settle_s": settle(rows, key, ready_t, expected),
                "settle_in_script_s": settle(rows, "in_script_class", ready_t, expected),
                "warmup_s": round(ready_t - t_spawn, 2) if ready else None,
                "ready_t": round(ready_t, 4) if ready else None,
                "changes_after_settle": 0,
                "source": "exporter" if exporter else "in-script classifier (exporter not running)",
            }
            if res["settle_s"] is not None:
                tail = [r.get(key) for r in run_rows if r["t"] - ready_t >= res["settle_s"]]
                res["changes_after_settle"] = sum(1 for a, b in itertools.pairwise(tail) if a != b)
            means = {
                f: round(sum(r[f] or 0.0 for r in run_rows[-10:]) / max(1, len(run_rows[-10:])), 4)
                for f in ("sm_active", "sm_occupancy", "tensor", "fp32", "dram", "nvml_util")
            }
            res["last10s_means"] = means
            results.append(res)
            print(json.dumps(res), flush=True)
    finally:
        traces.close()
        if exporter is not None:
            exporter.terminate()
            try:
                exporter.wait(10)
            except subprocess.TimeoutExpired:
                exporter.kill()
    ok = all(
        r["exported"] == r["expected"] and r["settle_s"] is not None and r["settle_s"] <= 2 * args.window
        for r in results
    )
    lines = [
        f"GPU: {rec.name}, driver {rec.driver}, nvidia-ml-py {_version('nvidia-ml-py')}, torch {_version('torch')}",
        f"window {args.window:g} s, GPM 1 s; class source: {results[0]['source'] if results else '-'}",
        "",
        "| workload | expected class | exported class | seconds to settle | in-script class (settle s) "
        "| last-10 s means sm / dram / max pipe / GPU-Util |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r["last10s_means"]
        s = "never" if r["settle_s"] is None else f"{r['settle_s']:.1f}"
        si = "never" if r["settle_in_script_s"] is None else f"{r['settle_in_script_s']:.1f}"
        lines.append(
            f"| {r['load']} | {r['expected']} | {r['exported']} | {s} | {r['in_script']} ({si}) | "
            f"{m['sm_active']:.4f} / {m['dram']:.3f} / {max(m['tensor'], m['fp32']):.3f} / {m['nvml_util']:.2f} |"
        )
    lines.append("")
    lines.append(f"every row matches within two windows: {'YES' if ok else 'NO'}")
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
    for order, (load, expected) in enumerate(LOADS):
        mine = [r for r in rows if r["load"] == load]
        if not mine or load not in summary:
            continue
        keep = (*FIXTURE_KEYS, "has_processes", "graphics_util", "exported_class")
        t0 = mine[0]["t"]
        with open(dest / f"{load}.jsonl", "w") as f:
            for r in mine:
                out = {k: r.get(k) for k in keep}
                out["t"] = round(r["t"] - t0, 4)  # seconds since this load's recording began
                f.write(json.dumps(out) + "\n")
        manifest[load] = {
            "file": f"{load}.jsonl",
            "order": order,
            "expected": expected,
            "load_started_s": round(summary[load]["ready_t"] - t0, 3),
            "exported_settle_s": summary[load]["settle_s"],
        }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {len(manifest)} traces to {dest}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.environ.get("OUT", "boundness-out"))
    ap.add_argument("--seconds", type=float, default=30.0, help="run time of each load after warm-up")
    ap.add_argument("--window", type=float, default=10.0, help="classifier window (s)")
    ap.add_argument("--port", type=int, default=9445)
    ap.add_argument("--loads", nargs="*", help="subset of: " + " ".join(n for n, _ in LOADS))
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
