"""gpulens vs nvitop-exporter on the same real GPU: scrape latency, CPU per second and RSS.

    PYTHONPATH=. python3 -m bench.real_gpu --out DIR

Method: start both exporters (1 s collection interval each) side by side, wait until both
answer and 5 s more; then (1) 500 scrapes of each, alternating A/B so both see the same machine
state -> client-side latency p50/p99 (full body read); (2) a quiet 60 s with one scrape per second
of each (what Prometheus does) -> CPU seconds per second of each process from /proc/PID/stat
(threads included, children not); RSS at the end. ``--peer`` replaces the nvitop-exporter command
(for a dry run on a machine without a GPU); ``--load matmul`` keeps a bf16 matmul child busy
on the GPU meanwhile (so per-process utilisation is read too); ``--kubelet`` serves a real gRPC
PodResources socket (one pod holding every GPU that ``nvidia-smi -L`` lists) and points gpulens at
it, as on a Kubernetes node, so the kubelet client is loaded and refreshed during the run.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.fakes.kubelet_server import FakeKubelet, devices, pod
from tests.support.procstat import cpu_seconds, rss_bytes

REPO = Path(__file__).resolve().parents[1]
OURS = (
    f"{sys.executable} -m exporter --backend nvml --web.listen-address 127.0.0.1:9445 --collect.interval 1 --no-probes"
)
MATMUL_LOAD = """
import torch
x = torch.randn(8192, 8192, dtype=torch.bfloat16, device='cuda'); y = torch.randn_like(x)
z = x @ y; torch.cuda.synchronize(); print('ready', flush=True)
while True:
    for _ in range(10): z = x @ y
    torch.cuda.synchronize()
"""
PEER = f"{sys.executable} -m nvitop_exporter --bind-address 127.0.0.1 --port 9446 --interval 1"


@dataclass
class Exporter:
    """One exporter process under test."""

    label: str
    command: str
    url: str
    proc: subprocess.Popen[bytes] | None = None
    latencies: list[float] = field(default_factory=list)
    body: bytes = b""


@dataclass
class Figures:
    label: str
    series: int
    scrape_p50_ms: float
    scrape_p99_ms: float
    scrape_max_ms: float
    cpu_cores: float
    rss_mb: float


def start_kubelet() -> FakeKubelet:
    """A PodResources server whose one pod holds every GPU of this machine."""
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:  # a dry run without a GPU
        listing = ""
    uuids = [line.split("UUID: ")[1].rstrip(")") for line in listing.splitlines() if "UUID: GPU-" in line]
    kubelet = FakeKubelet().start()
    kubelet.pods = [pod("ml", "train-0", [("main", [("nvidia.com/gpu", uuids)])])]
    kubelet.allocatable = [devices("nvidia.com/gpu", uuids)]
    return kubelet


def scrape(url: str) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = resp.read()
    return time.perf_counter() - t0, body


def start(exp: Exporter, log_dir: Path) -> None:
    log = open(log_dir / f"{exp.label}.log", "wb")  # noqa: SIM115 - lives as long as the process
    exp.proc = subprocess.Popen(shlex.split(exp.command), cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


def wait_ready(exp: Exporter, must_contain: bytes, timeout: float = 60.0) -> None:
    """Until /metrics answers and shows the GPU (a first sample was taken)."""
    assert exp.proc is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if exp.proc.poll() is not None:
            raise SystemExit(f"{exp.label} exited with {exp.proc.returncode}")
        try:
            _, body = scrape(exp.url)
            if must_contain in body:
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"{exp.label} not ready after {timeout:.0f} s")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(ours: Exporter, peer: Exporter, scrapes: int, quiet_seconds: float) -> list[Figures]:
    pair = (ours, peer)
    for _ in range(scrapes):
        for exp in pair:
            dt, exp.body = scrape(exp.url)
            exp.latencies.append(dt)
    pids = {exp.label: exp.proc.pid for exp in pair if exp.proc is not None}
    cpu0 = {label: cpu_seconds(pid) for label, pid in pids.items()}
    t0 = time.monotonic()
    while time.monotonic() - t0 < quiet_seconds:
        tick = time.monotonic()
        for exp in pair:
            scrape(exp.url)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    elapsed = time.monotonic() - t0
    out = []
    for exp in pair:
        pid = pids[exp.label]
        series = sum(1 for line in exp.body.decode().splitlines() if line and not line.startswith("#"))
        out.append(
            Figures(
                label=exp.label,
                series=series,
                scrape_p50_ms=percentile(exp.latencies, 0.5) * 1e3,
                scrape_p99_ms=percentile(exp.latencies, 0.99) * 1e3,
                scrape_max_ms=max(exp.latencies) * 1e3,
                cpu_cores=(cpu_seconds(pid) - cpu0[exp.label]) / elapsed,
                rss_mb=rss_bytes(pid) / 1e6,
            )
        )
    return out


def stage_durations(body: bytes) -> dict[str, float]:
    """gpulens' own per-stage timings from its exposition (seconds, last cycle)."""
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("gpulens_stage_duration_seconds{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('stage="', 1)[1].split('"', 1)[0]] = float(value)
    return out


def table(figs: list[Figures]) -> str:
    a, b = figs
    rows = [
        ("series exported", "series", "{:.0f}"),
        ("scrape p50 (ms)", "scrape_p50_ms", "{:.2f}"),
        ("scrape p99 (ms)", "scrape_p99_ms", "{:.2f}"),
        ("scrape max (ms)", "scrape_max_ms", "{:.2f}"),
        ("CPU (cores, 1 s interval)", "cpu_cores", "{:.4f}"),
        ("RSS (MB)", "rss_mb", "{:.1f}"),
    ]
    lines = [f"| | {a.label} | {b.label} | ratio {a.label}/{b.label} |", "|---|---|---|---|"]
    for title, attr, fmt in rows:
        va, vb = getattr(a, attr), getattr(b, attr)
        ratio = f"{va / vb:.2f}" if vb else "-"
        lines.append(f"| {title} | {fmt.format(va)} | {fmt.format(vb)} | {ratio} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--ours", default=OURS, help="command that starts gpulens")
    parser.add_argument("--peer", default=PEER, help="command that starts the peer exporter")
    parser.add_argument("--peer-url", default="http://127.0.0.1:9446/metrics")
    parser.add_argument("--peer-label", default="nvitop-exporter")
    parser.add_argument("--peer-ready", default='uuid="GPU-', help="text in the peer's /metrics once it sampled")
    parser.add_argument("--load", choices=("none", "matmul"), default="none", help="GPU load during the run")
    parser.add_argument("--scrapes", type=int, default=500)
    parser.add_argument("--tag", default="", help="file name stem of the outputs")
    parser.add_argument("--quiet-seconds", type=float, default=60.0)
    parser.add_argument("--kubelet", action="store_true", help="serve a PodResources socket and point gpulens at it")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    kubelet = start_kubelet() if args.kubelet else None
    if kubelet is not None:
        args.ours += f" --kubernetes.podresources-socket {kubelet.socket_path}"

    ours = Exporter("gpulens", args.ours, "http://127.0.0.1:9445/metrics")
    peer = Exporter(args.peer_label, args.peer, args.peer_url)
    load = None
    try:
        if args.load == "matmul":
            load = subprocess.Popen([sys.executable, "-c", MATMUL_LOAD], stdout=subprocess.PIPE, text=True)
            assert load.stdout is not None
            if load.stdout.readline().strip() != "ready":
                raise SystemExit("matmul load did not start")
        for exp in (ours, peer):
            start(exp, args.out)
        wait_ready(ours, b"gpulens_gpu_info{")
        wait_ready(peer, args.peer_ready.encode())
        time.sleep(5.0)
        figs = run(ours, peer, args.scrapes, args.quiet_seconds)
    finally:
        if kubelet is not None:
            kubelet.close()
        if load is not None:
            load.kill()
            load.wait()
        for exp in (ours, peer):
            if exp.proc is not None and exp.proc.poll() is None:
                exp.proc.terminate()
                try:
                    exp.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    exp.proc.kill()
    report = {
        "figures": [asdict(f) for f in figs],
        "gpulens_stage_duration_seconds": stage_durations(ours.body),
        "gpulens_up": b"gpulens_up 1" in ours.body,
        "commands": {"gpulens": args.ours, args.peer_label: args.peer},
        "scrapes": args.scrapes,
        "load": args.load,
        "kubelet": args.kubelet,
        "gpulens_podresources_ok": b'gpulens_stage_success{stage="podresources"} 1' in ours.body,
        "quiet_seconds": args.quiet_seconds,
        "latency_mean_ms": {e.label: statistics.fmean(e.latencies) * 1e3 for e in (ours, peer)},
    }
    text = table(figs)
    print(text)
    print(json.dumps({k: v for k, v in report.items() if k != "figures"}, indent=1))
    tag = f"{args.tag}" if args.tag else f"real_gpu_{args.load}"
    (args.out / f"{tag}.md").write_text(text)
    (args.out / f"{tag}.json").write_text(json.dumps(report, indent=1))
    (args.out / f"{tag}_gpulens_metrics.txt").write_bytes(ours.body)
    (args.out / f"{tag}_peer_metrics.txt").write_bytes(peer.body)


if __name__ == "__main__":
    main()
