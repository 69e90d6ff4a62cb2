#!/usr/bin/env python3
"""Device run for MPS: an MPS control daemon, two MPS clients, and what the real exporter exports.

Starts ``nvidia-cuda-mps-control -d`` with its pipe and log directories in a temporary folder (no
device setting changes: the compute mode stays as it is), runs a device-to-device copy loop and a
bf16 GEMM loop as MPS clients on GPU 0, and reads NVML directly and the exporter
(``python3 -m exporter --backend nvml``) while they run; then stops the clients and the daemon.
Prints one JSON object and a table; writes both under --out. Needs: an NVIDIA GPU, pynvml, torch.

    python3 scripts/gpu_mps.py --out "$OUT" [--seconds 80]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.process import managed_process  # noqa: E402

_LINE = re.compile(r"^(gpulens_[a-z_]+)\{([^}]*)\}\s+(\S+)\s*$")


def metrics(url: str) -> list[tuple[str, dict[str, str], float]]:
    """Every gpulens sample on /metrics as (name, labels, value)."""
    with urllib.request.urlopen(url, timeout=3) as resp:
        text = resp.read().decode()
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            out.append((m.group(1), labels, float(m.group(3))))
    return out


def nvml_view() -> dict[str, Any]:
    """What NVML itself says on GPU 0: compute processes, MPS clients, per-process utilisation."""
    import pynvml as nv

    nv.nvmlInit()
    try:
        h = nv.nvmlDeviceGetHandleByIndex(0)
        running = nv.nvmlDeviceGetComputeRunningProcesses(h)
        try:
            mps = nv.nvmlDeviceGetMPSComputeRunningProcesses(h)
        except nv.NVMLError as exc:
            mps = []
            mps_error = str(exc)
        else:
            mps_error = ""
        names = {}
        for p in running:
            try:
                names[p.pid] = nv.nvmlSystemGetProcessName(p.pid)
            except nv.NVMLError as exc:
                names[p.pid] = f"<{exc}>"
        try:
            util = [(u.pid, u.smUtil, u.memUtil) for u in nv.nvmlDeviceGetProcessUtilization(h, 0)]
        except nv.NVMLError as exc:
            util = [("error", str(exc), "")]
        mode = nv.nvmlDeviceGetComputeMode(h)
        return {
            "compute_mode": int(mode),
            "compute_processes": [(p.pid, names.get(p.pid), p.usedGpuMemory) for p in running],
            "mps_clients": [(p.pid, p.usedGpuMemory) for p in mps],
            "mps_error": mps_error,
            "process_utilization": util,
        }
    finally:
        nv.nvmlShutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "mps-out"))
    ap.add_argument("--seconds", type=float, default=80.0, help="how long the clients run (probe starts at ~60 s)")
    ap.add_argument("--port", type=int, default=9445)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        print("nvidia-cuda-mps-control not found", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="gpulens-mps-"))
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(tmp / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(tmp / "log")}
    (tmp / "pipe").mkdir()
    (tmp / "log").mkdir()
    subprocess.run([control, "-d"], env=env, check=True, timeout=30)
    report: dict[str, Any] = {"nvml_before": nvml_view()}
    clients: list[subprocess.Popen[bytes]] = []
    cmd = [
        sys.executable, "-m", "exporter", "--backend", "nvml", "--web.listen-address", f"127.0.0.1:{args.port}",
        "--collect.interval", "1s", "--no-kubernetes.api", "--probes",
    ]  # fmt: skip
    try:
        # The exporter and its probe children run without the MPS pipe: a probe would open its own
        # context, which is why the scheduler must refuse to start one while MPS clients run.
        with managed_process(cmd, cwd=ROOT, ready_url=f"http://127.0.0.1:{args.port}/readyz", log=out / "exporter.log"):
            for load in ("d2d_copy", "bf16_gemm"):
                clients.append(
                    subprocess.Popen(
                        [sys.executable, str(ROOT / "scripts" / "gpu_boundness.py"), "--child", load],
                        env=env,
                        stdout=subprocess.DEVNULL,
                    )
                )
            started = time.monotonic()
            samples = []
            while time.monotonic() - started < args.seconds:
                time.sleep(5.0)
                samples.append((round(time.monotonic() - started, 1), metrics(f"http://127.0.0.1:{args.port}/metrics")))
            report["nvml_during"] = nvml_view()
            last = samples[-1][1]

            def pick(name: str) -> list[tuple[dict[str, str], float]]:
                return [(lab, v) for n, lab, v in last if n == name and lab.get("gpu", "0") == "0"]

            report["exported"] = {
                "sharing_mode": [lab["mode"] for lab, _ in pick("gpulens_gpu_sharing_info")],
                "compute_processes": [v for _, v in pick("gpulens_gpu_compute_processes")],
                "class": [lab["class"] for lab, v in pick("gpulens_gpu_boundness") if v == 1],
                "busy_ratio": [v for _, v in pick("gpulens_gpu_busy_ratio")],
                "memory_used_bytes": [v for _, v in pick("gpulens_gpu_memory_used_bytes")],
                "probe_runs": [(lab["result"], v) for n, lab, v in last if n == "gpulens_probe_runs_total"],
            }
            report["class_trace"] = [
                (t, [lab["class"] for n, lab, v in m if n == "gpulens_gpu_boundness" and v == 1]) for t, m in samples
            ]
    finally:
        for c in clients:
            c.kill()
            c.wait()
        quit_ = subprocess.run([control], input=b"quit\n", env=env, timeout=30, check=False)
        report["daemon_quit_rc"] = quit_.returncode
        time.sleep(2.0)
        report["nvml_after"] = nvml_view()
        shutil.rmtree(tmp, ignore_errors=True)
    text = json.dumps(report, indent=1, default=str)
    print(text)
    (out / "mps.json").write_text(text + "\n")
    e = report["exported"]
    ok = e["sharing_mode"] == ["mps"] and e["compute_processes"] == [2.0] and not report["nvml_after"]["mps_clients"]
    print(f"mps recognised, 2 tenants, daemon stopped: {'YES' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
