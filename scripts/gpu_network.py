"""Real-GPU check of the network feature on a node (docs/network.md):

1. what the node has under /sys/class/infiniband (our H200 machine: nothing) and the host's
   GPUDirect RDMA facts;
2. the real exporter (``--backend nvml``, no kubelet) for ``--seconds``: its log must say once that
   no RDMA device exists and hold no warning or error, /metrics must hold no NIC series and no
   ``nic`` stage;
3. meanwhile a kernel of 24 spinning blocks (how a GPU waiting in an NCCL collective looks): its GPM
   readings and class; alone on a GPU held by no pod it must stay ``latency``, never
   ``communication``.

Run on a GPU machine with CuPy: ``PYTHONPATH=. python3 scripts/gpu_network.py``; prints a table.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exporter.network.gdr import host_gdr

SPIN = r"""
import sys, time, cupy as cp
src = r'''
extern "C" __global__ void spin(unsigned long long cycles, int *out) {
    unsigned long long start = clock64();
    while (clock64() - start < cycles) { }
    if (threadIdx.x == 0) out[blockIdx.x] = 1;
}
'''
k = cp.RawKernel(src, "spin")
out = cp.zeros(64, dtype=cp.int32)
k((24,), (32,), (cp.uint64(2_000_000_000), out)); cp.cuda.Device().synchronize()
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    k((24,), (32,), (cp.uint64(1_500_000_000), out))  # ~0.8 s a launch at ~1.98 GHz
    cp.cuda.Device().synchronize()
"""


CLASS = re.compile(r'class="([a-z]+)"')
NIC_PREFIXES = ("gpulens_nic_", "gpulens_gpu_nic_", "gpulens_pod_nic_")


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def value(text: str, name: str, **labels: str) -> list[tuple[str, float]]:
    out = []
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            out.append((line.rsplit(" ", 1)[0], float(line.rsplit(" ", 1)[1])))
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--port", type=int, default=9461)
    args = parser.parse_args()
    ib = "/sys/class/infiniband"
    devices = sorted(os.listdir(ib)) if os.path.isdir(ib) else []
    host = host_gdr("/sys", "/proc")
    print("| fact | value |\n|---|---|")
    print(f"| /sys/class/infiniband | {'absent' if not os.path.isdir(ib) else ', '.join(devices) or 'empty'} |")
    print(f"| peer-memory module | {host.peermem} |")
    print(f"| open kernel module (DMA-BUF) | {host.dmabuf} |")
    log_path = Path("/tmp/gpulens-network-exporter.log")
    with log_path.open("w") as log:
        exporter = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "exporter",
                "--backend",
                "nvml",
                "--no-probes",
                "--kubernetes.podresources-socket=",
                f"--web.listen-address=127.0.0.1:{args.port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        for _ in range(100):
            try:
                scrape(args.port)
                break
            except OSError:
                time.sleep(0.2)
        spin = subprocess.Popen([sys.executable, "-c", SPIN, str(args.seconds)], stdout=subprocess.PIPE, text=True)
        assert spin.stdout is not None
        spin.stdout.readline()
        classes: list[str] = []
        sm: list[float] = []
        t_end = time.time() + args.seconds - 2
        text = ""
        while time.time() < t_end:
            time.sleep(2.0)
            text = scrape(args.port)
            ones = [k for k, v in value(text, "gpulens_gpu_boundness") if v == 1]
            current = [m.group(1) for k in ones if (m := CLASS.search(k))]
            classes.append(current[0] if current else "-")
            sm += [v for _, v in value(text, "gpulens_gpu_sm_active_ratio")]
        spin.wait(timeout=60)
    finally:
        exporter.terminate()
        exporter.wait(timeout=10)
    logged = log_path.read_text()
    nic_lines = [ln for ln in logged.splitlines() if "RDMA device" in ln]
    bad = [ln for ln in logged.splitlines() if re.search(r"\b(level=)?(warn|warning|error|critical)\b", ln, re.I)]
    nic_series = [
        ln for ln in text.splitlines() if ln.startswith(("gpulens_nic_", "gpulens_gpu_nic_", "gpulens_pod_nic_"))
    ]
    nic_stage = value(text, "gpulens_stage_success", stage="nic")
    print(f"| exporter log lines about RDMA devices | {len(nic_lines)}: {nic_lines[0][-110:] if nic_lines else ''} |")
    print(f"| exporter warnings or errors | {len(bad)} {bad[:3]} |")
    print(f"| NIC series in /metrics | {len(nic_series)} |")
    print(f"| nic stage in gpulens_stage_success | {nic_stage or 'absent'} |")
    tail = classes[len(classes) // 2 :]
    median = f"{sorted(sm)[len(sm) // 2]:.3f}" if sm else "n/a"
    print(f"| 24 spinning blocks: SM activity (median) | {median} |")
    print(f"| 24 spinning blocks: classes over the run | {' '.join(classes)} |")
    ok = (
        not nic_series
        and not nic_stage
        and len(nic_lines) == 1
        and not bad
        and tail
        and all(c == "latency" for c in tail)
    )
    print(f"\nRESULT: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
