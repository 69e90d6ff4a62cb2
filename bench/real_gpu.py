"""gpulens vs nvitop-exporter on the same real GPU: scrape latency, CPU per second and RSS.

    PYTHONPATH=. python3 -m bench.real_gpu --out DIR
    PYTHONPATH=<site>:$PWD python3 -m bench.real_gpu --chain full --out DIR     # as the chart runs it
    .venv/bin/python -m bench.real_gpu --chain full --dry-run-sim --scrapes 50 --quiet-seconds 10

Method: start the exporters (1 s collection interval each) side by side, wait until all answer
and 5 s more; then (1) ``--scrapes`` scrapes of each, in turn, so all see the same machine state
-> client-side latency p50/p99 (full body read); (2) a quiet ``--quiet-seconds`` with one scrape
of each every ``--scrape-interval`` seconds (default: the chart's ServiceMonitor interval, 15 s,
what Prometheus does as the chart deploys it; ``1`` for a scraper as eager as the collection),
counted after ``--settle-seconds`` of the same scrapes and pod updates (default 30 s: the steady
state, without the start-up work the first pod updates set off) -> CPU seconds per second of
each process from /proc/PID/stat (threads included, children not); RSS at the end.

``--client`` chooses how both phases scrape: ``urllib`` (the default, as every run before
2026-12-03: a new connection per scrape, no ``Accept``, no compression) or ``prometheus`` (as
Prometheus 3 does: one kept-alive connection per exporter, reopened when the server closes it,
Prometheus' ``Accept`` and ``Accept-Encoding: gzip``, the body decompressed before the clock
stops).  Each exporter then serves what it would serve Prometheus, gzip included.

gpulens runs once per configuration (``--configs``, comma-separated), each its own process on
its own port, beside the peer:

- ``nvml-only``: no kubelet, no API, no procfs ("gpulens, NVML only"; the kubelet socket is
  set empty, since the default one loads the kubelet client even where no kubelet answers);
- ``kubelet``: pointed at a real gRPC PodResources server (one pod holding every GPU that
  ``nvidia-smi -L`` lists), so the kubelet client is loaded and refreshed during the run;
- ``full-chain``: the chart's whole attribution chain ("gpulens, full chain"): a gRPC kubelet
  listing ``--pods`` pods, two of which time-slice every GPU (``<uuid>::0``, ``<uuid>::1``), the
  API emulator with the same pods as realistic objects (reached through a kubeconfig, so PyYAML
  is loaded, which a pod's service-account configuration does not) and one pod update a second
  during the quiet period, and a procfs folder putting the GPU's compute processes (``nvidia-smi
  --query-compute-apps``, and the ``--load`` child) in the first pod's container.  The fakes and
  the pods are ``bench/exporter_rss.py``'s.

``--chain none|kubelet|full`` is short for ``--configs nvml-only``, ``kubelet`` and
``nvml-only,full-chain``; ``--kubelet`` for ``--chain kubelet``.  ``--ours`` replaces the
command that starts gpulens (the bench appends ``--web.listen-address`` and each configuration's
flags), ``--peer`` the nvitop-exporter command; ``--load matmul`` keeps a bf16 matmul child busy
on the GPU meanwhile (so per-process utilisation is read too).  ``--dry-run-sim`` runs gpulens
with ``--backend sim`` against a second simulated gpulens as the peer (unless ``--peer`` is
given), to exercise the bench on a machine without a GPU.

The kubelet and full-chain configurations need the test fakes' imports (grpcio, protobuf, h2);
the bench exits at once, naming what is missing, when they cannot be imported.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from exporter.attribution import stages as stage_names
from tests.support.procstat import cpu_seconds, rss_bytes

if TYPE_CHECKING:
    from bench.exporter_rss import Chain
    from tests.fakes.kubelet_server import FakeKubelet

REPO = Path(__file__).resolve().parents[1]
CHART_VALUES = REPO / "deploy" / "helm" / "gpulens" / "values.yaml"
"""The chart's values: its ServiceMonitor interval is the quiet period's default scrape interval."""
OURS = f"{sys.executable} -m exporter --backend nvml --collect.interval 1 --no-probes"
"""gpulens without its listen address (the bench adds it, and each configuration's flags)."""
MATMUL_LOAD = """
import torch
x = torch.randn(8192, 8192, dtype=torch.bfloat16, device='cuda'); y = torch.randn_like(x)
z = x @ y; torch.cuda.synchronize(); print('ready', flush=True)
while True:
    for _ in range(10): z = x @ y
    torch.cuda.synchronize()
"""
PEER = f"{sys.executable} -m nvitop_exporter --bind-address 127.0.0.1 --port 9446 --interval 1"
SIM_PEER = f"{sys.executable} -m exporter --backend sim --no-probes --web.listen-address 127.0.0.1:9446"
"""The peer of ``--dry-run-sim``: another simulated gpulens."""

CONFIG_LABELS = {"nvml-only": "gpulens, NVML only", "kubelet": "gpulens, kubelet", "full-chain": "gpulens, full chain"}
"""``--configs`` name -> row label."""
CONFIG_PORTS = {"nvml-only": 9445, "kubelet": 9447, "full-chain": 9448}
CHAINS = {"none": "nvml-only", "kubelet": "kubelet", "full": "nvml-only,full-chain"}
"""``--chain`` -> the ``--configs`` it stands for."""


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
    """One exporter's figures in one run: series in its last exposition, client-side scrape
    latency (ms), CPU cores used during the quiet period, RSS at the end (MB of 10^6 bytes)."""

    label: str
    series: int
    scrape_p50_ms: float
    scrape_p99_ms: float
    scrape_max_ms: float
    cpu_cores: float
    rss_mb: float


def gpu_uuids() -> list[str]:
    """The UUIDs ``nvidia-smi -L`` lists (none without a driver)."""
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:  # a dry run without a GPU
        listing = ""
    return [line.split("UUID: ")[1].rstrip(")") for line in listing.splitlines() if "UUID: GPU-" in line]


def compute_pids() -> list[int]:
    """Host PIDs of the GPUs' compute processes, as NVML reports them (none without a driver)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    except FileNotFoundError:
        return []
    return [int(line) for line in out.split() if line.strip().isdigit()]


def start_kubelet(uuids: Sequence[str]) -> FakeKubelet:
    """A PodResources server whose one pod holds every GPU of ``uuids``."""
    from bench.exporter_rss import GPU_RESOURCE, load_fakes

    kubelet_server = load_fakes()[0]
    kubelet: FakeKubelet = kubelet_server.FakeKubelet().start()
    kubelet.pods = [kubelet_server.pod("ml", "train-0", [("main", [(GPU_RESOURCE, list(uuids))])])]
    kubelet.allocatable = [kubelet_server.devices(GPU_RESOURCE, list(uuids))]
    return kubelet


def _sim_gpus() -> tuple[list[str], list[int]]:
    """The simulated node's GPU UUIDs and GPU process PIDs (what ``--backend sim`` reports)."""
    from exporter.sim import scenarios

    sim = scenarios.build("h200x8")
    return [g.uuid for g in sim.gpus], sorted(sim.pid_owners)


@contextmanager
def gpu_chain(pods: int, dry_run: bool, load_pid: int | None) -> Iterator[Chain]:
    """The full chain's fakes for this machine's GPUs (the simulated ones in a dry run)."""
    from bench.exporter_rss import full_chain, shared_gpu_plan

    if dry_run:
        uuids, pids = _sim_gpus()
    else:
        uuids, pids = gpu_uuids(), compute_pids()
    if load_pid is not None:
        pids.append(load_pid)
    plan = shared_gpu_plan(pods, uuids, sorted(set(pids)))
    with tempfile.TemporaryDirectory(prefix="gpulens-chain-") as tmp, full_chain(plan, Path(tmp)) as chain:
        yield chain


def scrape(url: str) -> tuple[float, bytes]:
    """One scrape by ``urllib``: a new connection, no ``Accept`` header, no compression."""
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = resp.read()
    return time.perf_counter() - t0, body


PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=1.0.0;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)
"""What Prometheus 3 sends by default (its scrape protocols, best first)."""


class PrometheusLikeScraper:
    """Scrapes as Prometheus does: one kept-alive HTTP/1.1 connection per target (opened again when
    the server closes it, as an HTTP/1.0 server does after each reply), Prometheus' ``Accept`` and
    ``Accept-Encoding: gzip``; the body is read whole and decompressed, as Prometheus does before it
    parses.  The latency is the client's from sending the request to the decompressed page."""

    def __init__(self) -> None:
        self._conns: dict[str, http.client.HTTPConnection] = {}

    def __call__(self, url: str) -> tuple[float, bytes]:
        parts = urllib.parse.urlsplit(url)
        t0 = time.perf_counter()
        conn = self._conns.get(url)
        if conn is None:
            conn = self._conns[url] = http.client.HTTPConnection(parts.netloc, timeout=10)
        headers = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip", "User-Agent": "Prometheus/3.0.0"}
        try:
            conn.request("GET", parts.path, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        except (http.client.HTTPException, ConnectionError):
            conn.close()
            del self._conns[url]
            raise
        if resp.status != 200:
            raise ConnectionError(f"{url}: HTTP {resp.status}")
        body = gzip.decompress(raw) if resp.getheader("Content-Encoding") == "gzip" else raw
        return time.perf_counter() - t0, body


CLIENTS = ("urllib", "prometheus")
"""``--client``: how the latency phase and the quiet period scrape (``scrape``, ``PrometheusLikeScraper``)."""


def _log_path(exp: Exporter, log_dir: Path) -> Path:
    return log_dir / (re.sub(r"[^A-Za-z0-9.-]+", "_", exp.label).strip("_") + ".log")


def start(exp: Exporter, log_dir: Path, env: dict[str, str] | None = None) -> None:
    """Start ``exp`` with ``env`` added, its output in ``<log_dir>/<label>.log``."""
    log = open(_log_path(exp, log_dir), "wb")  # noqa: SIM115 - lives as long as the process
    exp.proc = subprocess.Popen(
        shlex.split(exp.command), cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
    )


def _log_tail(exp: Exporter, log_dir: Path) -> str:
    return _log_path(exp, log_dir).read_text(errors="replace")[-3000:]


def wait_ready(exp: Exporter, must_contain: bytes, log_dir: Path, timeout: float = 60.0) -> None:
    """Until /metrics answers and shows the GPU (a first sample was taken); exits with the
    exporter's log tail if it ends or never does."""
    assert exp.proc is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if exp.proc.poll() is not None:
            raise SystemExit(f"{exp.label} exited with {exp.proc.returncode}:\n{_log_tail(exp, log_dir)}")
        try:
            _, body = scrape(exp.url)
            if must_contain in body:
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"{exp.label} not ready after {timeout:.0f} s:\n{_log_tail(exp, log_dir)}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _quiet(
    exporters: Sequence[Exporter],
    seconds: float,
    tick: Callable[[], None] | None,
    client: Callable[[str], tuple[float, bytes]],
    scrape_every: int,
) -> float:
    """``seconds`` of one scrape of each exporter every ``scrape_every`` seconds, the first at
    once, and ``tick`` once a second; returns the seconds it took."""
    t0 = time.monotonic()
    second = 0
    while time.monotonic() - t0 < seconds:
        tick_at = time.monotonic()
        if tick is not None:
            tick()
        if second % scrape_every == 0:
            for exp in exporters:
                _, exp.body = client(exp.url)
        second += 1
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick_at)))
    return time.monotonic() - t0


def run(
    exporters: Sequence[Exporter],
    scrapes: int,
    quiet_seconds: float,
    tick: Callable[[], None] | None = None,
    client: Callable[[str], tuple[float, bytes]] = scrape,
    scrape_every: int = 1,
    settle_seconds: float = 0.0,
) -> list[Figures]:
    """Latency of ``scrapes`` scrapes of each exporter in turn, then CPU and RSS over a quiet
    period of one scrape every ``scrape_every`` seconds each, the first at its start (``tick``
    called once a second meanwhile), all by ``client``.  The quiet period's CPU is counted only
    after its first ``settle_seconds``: start-up work that the first pod updates set off (the
    owner walks the API's request bound deferred at the first list) is not the steady state."""
    for _ in range(scrapes):
        for exp in exporters:
            dt, exp.body = client(exp.url)
            exp.latencies.append(dt)
    pids = {exp.label: exp.proc.pid for exp in exporters if exp.proc is not None}
    if settle_seconds > 0:
        _quiet(exporters, settle_seconds, tick, client, scrape_every)
    cpu0 = {label: cpu_seconds(pid) for label, pid in pids.items()}
    elapsed = _quiet(exporters, quiet_seconds, tick, client, scrape_every)
    out = []
    for exp in exporters:
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


def chart_scrape_interval(values: Path = CHART_VALUES) -> int:
    """The chart's ServiceMonitor ``interval`` in whole seconds: how often Prometheus scrapes the
    exporter as the chart deploys it (``serviceMonitor.interval`` in its values, e.g. ``15s``)."""
    import yaml  # lazy: only a run that takes the chart's default needs it

    interval = str((yaml.safe_load(values.read_text()).get("serviceMonitor") or {}).get("interval", ""))
    if not re.fullmatch(r"\d+s", interval):
        raise SystemExit(f"{values}: serviceMonitor.interval {interval!r} is not in whole seconds")
    return int(interval[:-1])


def stage_durations(body: bytes) -> dict[str, float]:
    """gpulens' own per-stage timings from its exposition (seconds, last cycle)."""
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("gpulens_stage_duration_seconds{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('stage="', 1)[1].split('"', 1)[0]] = float(value)
    return out


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def table(figs: Sequence[Figures]) -> str:
    """One row per exporter, the peer (last) included; the ratios are to the peer's figures."""
    peer = figs[-1]
    lines = [
        "| exporter | series | scrape p50 (ms) | scrape p99 (ms) | scrape max (ms) | CPU (cores) | RSS (MB) "
        f"| RSS / {peer.label} | p99 / {peer.label} | CPU / {peer.label} |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in figs:
        lines.append(
            f"| {f.label} | {f.series} | {f.scrape_p50_ms:.2f} | {f.scrape_p99_ms:.2f} | {f.scrape_max_ms:.2f} "
            f"| {f.cpu_cores:.4f} | {f.rss_mb:.1f} | {_ratio(f.rss_mb, peer.rss_mb)} "
            f"| {_ratio(f.scrape_p99_ms, peer.scrape_p99_ms)} | {_ratio(f.cpu_cores, peer.cpu_cores)} |"
        )
    return "\n".join(lines) + "\n"


def chain_health(body: bytes) -> dict[str, object]:
    """What one gpulens' last exposition says about its attribution: stage success, pod
    allocation and pod memory series."""
    from bench.exporter_rss import series_count, stage_success, unresolved_walks

    return {
        "stages": stage_success(body),
        "pod_allocations": series_count(body, b"gpulens_pod_gpu_allocation"),
        "pod_memory_series": series_count(body, b"gpulens_pod_gpu_memory_used_bytes"),
        "unresolved_owner_walks": unresolved_walks(body),
    }


def chain_broken(health: dict[str, object], config: str) -> str | None:
    """Why a configuration's attribution did not work in the run, or None."""
    stages = health["stages"]
    assert isinstance(stages, dict)
    wanted = {
        "kubelet": (stage_names.PODRESOURCES,),
        "full-chain": (stage_names.PODRESOURCES, stage_names.KUBE_API, stage_names.CGROUP),
    }.get(config, ())
    failed = [s for s in wanted if stages.get(s) != 1.0]
    if failed:
        return f"stages {', '.join(failed)} not 1 at the end"
    if config == "full-chain" and not health["pod_allocations"]:
        return "no gpulens_pod_gpu_allocation series"
    if config == "full-chain" and health["unresolved_owner_walks"]:
        return f"{health['unresolved_owner_walks']} owner walks unresolved: the API lacks the pods' controllers"
    return None


def parse_configs(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The configurations to run, from ``--configs``, ``--chain`` or ``--kubelet``."""
    given = [x for x in (args.configs, args.chain, args.kubelet or None) if x]
    if len(given) > 1:
        parser.error("give one of --configs, --chain and --kubelet")
    text = args.configs or CHAINS[args.chain or ("kubelet" if args.kubelet else "none")]
    configs = [c for c in text.split(",") if c]
    unknown = [c for c in configs if c not in CONFIG_LABELS]
    if unknown or not configs or len(set(configs)) != len(configs):
        parser.error(f"--configs takes distinct names among {', '.join(CONFIG_LABELS)}")
    return configs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--ours", default=OURS, help="command that starts gpulens, without its listen address")
    parser.add_argument("--peer", default=None, help="command that starts the peer exporter")
    parser.add_argument("--peer-url", default="http://127.0.0.1:9446/metrics")
    parser.add_argument("--peer-label", default=None, help="default: nvitop-exporter (peer gpulens with --dry-run-sim)")
    parser.add_argument("--peer-ready", default=None, help="text in the peer's /metrics once it sampled")
    parser.add_argument("--load", choices=("none", "matmul"), default="none", help="GPU load during the run")
    parser.add_argument("--scrapes", type=int, default=500)
    parser.add_argument("--tag", default="", help="file name stem of the outputs")
    parser.add_argument("--quiet-seconds", type=float, default=60.0)
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=30.0,
        help="seconds of the quiet period's scrapes and pod updates before its CPU is counted "
        "(0 for the runs before 2026-12-03, night)",
    )
    parser.add_argument(
        "--scrape-interval",
        type=int,
        default=None,
        help="seconds between the quiet period's scrapes (default: the chart's ServiceMonitor interval, "
        "read from its values; 1 for the runs before 2026-12-03, night)",
    )
    parser.add_argument("--configs", default=None, help=f"comma-separated: {', '.join(CONFIG_LABELS)}")
    parser.add_argument("--chain", choices=tuple(CHAINS), default=None, help="short for --configs (module doc)")
    parser.add_argument("--kubelet", action="store_true", help="short for --chain kubelet")
    parser.add_argument("--pods", type=int, default=110, help="pods on the node of the full chain")
    parser.add_argument("--dry-run-sim", action="store_true", help="gpulens with --backend sim; a sim peer")
    parser.add_argument(
        "--client",
        choices=CLIENTS,
        default="urllib",
        help="urllib: a new connection per scrape, no Accept or gzip (the runs before); "
        "prometheus: kept-alive, Prometheus' Accept and gzip",
    )
    args = parser.parse_args()
    configs = parse_configs(args, parser)
    if not 2 <= args.pods <= 10_000:
        parser.error("--pods must be 2..10000")
    scrape_every = chart_scrape_interval() if args.scrape_interval is None else args.scrape_interval
    if not 1 <= scrape_every <= 300:
        parser.error("--scrape-interval must be 1..300 seconds")
    if not 0 <= args.settle_seconds <= 3600:
        parser.error("--settle-seconds must be 0..3600")
    if any(c != "nvml-only" for c in configs):
        from bench.exporter_rss import load_fakes

        load_fakes()  # fail now, naming what is missing, not after the exporters started
    dry = args.dry_run_sim
    peer_command = args.peer or (SIM_PEER if dry else PEER)
    peer_label = args.peer_label or ("peer gpulens (sim)" if dry and not args.peer else "nvitop-exporter")
    peer_ready = args.peer_ready or ("gpulens_gpu_info{" if dry and not args.peer else 'uuid="GPU-')
    args.out.mkdir(parents=True, exist_ok=True)

    peer = Exporter(peer_label, peer_command, args.peer_url)
    ours: dict[str, Exporter] = {}
    chain: Chain | None = None
    load = None
    with ExitStack() as stack:
        if args.load == "matmul":
            load = subprocess.Popen([sys.executable, "-c", MATMUL_LOAD], stdout=subprocess.PIPE, text=True)
            stack.callback(_kill, load)
            assert load.stdout is not None
            if load.stdout.readline().strip() != "ready":
                raise SystemExit("matmul load did not start")
        envs: dict[str, dict[str, str]] = {}
        for config in configs:
            port = CONFIG_PORTS[config]
            flags: Sequence[str] = ("--backend", "sim") if dry else ()
            if config == "kubelet":
                kubelet = start_kubelet(_sim_gpus()[0] if dry else gpu_uuids())
                stack.callback(kubelet.close)
                flags = (*flags, "--kubernetes.podresources-socket", kubelet.socket_path)
            elif config == "full-chain":
                chain = stack.enter_context(gpu_chain(args.pods, dry, load.pid if load else None))
                flags = (*flags, *chain.flags)
                envs[config] = chain.env
            else:
                flags = (*flags, "--kubernetes.podresources-socket=")  # else the default socket's client loads
            command = " ".join([args.ours, "--web.listen-address", f"127.0.0.1:{port}", *map(shlex.quote, flags)])
            ours[config] = Exporter(CONFIG_LABELS[config], command, f"http://127.0.0.1:{port}/metrics")
        everyone = [*ours.values(), peer]
        for exp in everyone:
            stack.callback(_stop, exp)
        for config, exp in ours.items():
            start(exp, args.out, envs.get(config))
        start(peer, args.out)
        for exp in ours.values():
            wait_ready(exp, b"gpulens_gpu_info{", args.out)
        wait_ready(peer, peer_ready.encode(), args.out)
        time.sleep(5.0)
        client = PrometheusLikeScraper() if args.client == "prometheus" else scrape
        figs = run(
            everyone,
            args.scrapes,
            args.quiet_seconds,
            chain.tick if chain else None,
            client,
            scrape_every,
            args.settle_seconds,
        )

    health = {config: chain_health(exp.body) for config, exp in ours.items()}
    broken = {config: why for config in configs if (why := chain_broken(health[config], config))}
    report = {
        "figures": [asdict(f) for f in figs],
        "gpulens_stage_duration_seconds": {c: stage_durations(exp.body) for c, exp in ours.items()},
        "gpulens_up": {c: b"gpulens_up 1" in exp.body for c, exp in ours.items()},
        "attribution": health,
        "attribution_broken": broken,
        "commands": {**{exp.label: exp.command for exp in ours.values()}, peer.label: peer.command},
        "chain_env": envs,
        "configs": configs,
        "pods": args.pods if "full-chain" in configs else None,
        "dry_run_sim": dry,
        "scrapes": args.scrapes,
        "load": args.load,
        "client": args.client,
        "quiet_seconds": args.quiet_seconds,
        "scrape_interval_seconds": scrape_every,
        "settle_seconds": args.settle_seconds,
        "latency_mean_ms": {e.label: statistics.fmean(e.latencies) * 1e3 for e in everyone},
    }
    text = table(figs)
    print(text)
    print(json.dumps({k: v for k, v in report.items() if k != "figures"}, indent=1))
    tag = args.tag or f"real_gpu_{args.load}"
    (args.out / f"{tag}.md").write_text(text)
    (args.out / f"{tag}.json").write_text(json.dumps(report, indent=1))
    for config, exp in ours.items():
        (args.out / f"{tag}_gpulens_{config}_metrics.txt").write_bytes(exp.body)
    (args.out / f"{tag}_peer_metrics.txt").write_bytes(peer.body)
    if broken:
        raise SystemExit(f"ATTRIBUTION DID NOT WORK in this run, its figures do not measure the chain: {broken}")


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()


def _stop(exp: Exporter) -> None:
    """Terminate ``exp`` if it runs (SIGKILL after 10 s)."""
    if exp.proc is not None and exp.proc.poll() is None:
        exp.proc.terminate()
        try:
            exp.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            exp.proc.kill()
            exp.proc.wait()


if __name__ == "__main__":
    main()
