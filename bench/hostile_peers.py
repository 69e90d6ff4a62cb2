"""Hostile trusted peers: a kubelet and a Kubernetes API server that answer too much or too slowly.

    .venv/bin/python -m bench.hostile_peers                       # every attack, 20 s each
    .venv/bin/python -m bench.hostile_peers --attacks kubelet-huge,api-huge-list --seconds 15
    .venv/bin/python -m bench.hostile_peers --attacks kubelet-50k-pods,kubelet-flood --seconds 30

The exporter trusts two peers on its node: the kubelet's PodResources socket and the Kubernetes
API.  Each attack starts a misbehaving fake of one of them (``tests/fakes``) and tells how to
point the exporter at it; ``bench/hostile.py`` imports ``PEER_ATTACKS`` and ``hostile_peer`` to
run these next to its client attacks.  The exporter is started as
``python -m exporter --backend sim --web.listen-address 127.0.0.1:PORT <argv>`` with ``env``
added.  With the simulator a non-default ``--kubernetes.podresources-socket`` selects the real
attribution pipeline (``exporter/cli.py:make_attributor``), so the API attacks also get an honest
kubelet of their own.

Run as a script, it starts the exporter against each peer (and against honest ones, for the
baseline) for ``--seconds`` and prints a Markdown table: time to ``/readyz``, RSS when ready,
peak RSS (``VmHWM``, from the process start), RSS and CPU seconds at the end, and for each
attribution stage the seconds it read 0 out of the seconds scraped (once a second).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from exporter.attribution import stages as stage_names
from exporter.sim.scenarios import build as build_scenario
from tests.fakes.kube_api_server import KubeApiEmulator, make_pod
from tests.fakes.kubelet_server import FakeKubelet, FloodPeer, small_pods_reply
from tests.support.exposition_labels import stage_success
from tests.support.net import free_port
from tests.support.process import managed_process
from tests.support.procstat import cpu_seconds, rss_bytes

MiB = 1024 * 1024
NODE = "gpu-node-1"
"""The node the exporter says it runs on (``--kubernetes.node-name``); the emulator's pods are on it."""

KUBELET_HUGE_BYTES = 30 * MiB
"""A ``List`` reply of small pods, each with one GPU: about 300,000 pods."""
KUBELET_BIG_BYTES = 8 * MiB - 64 * 1024
"""Just under the exporter's reply cap (``exporter.attribution.podresources.MAX_MESSAGE_BYTES``,
8 MiB): accepted, so its decoding must fit in the refresh's deadline and the chart's memory."""
KUBELET_PODS = 50_000
"""GPU-holding pods of ``kubelet-50k-pods``: each holds its own time-slicing replica of the
simulated node's first GPU, so every one resolves to an allocation (issue 51, defect 6)."""
API_HUGE_LIST_BYTES = 200_000_000
"""A pod list that ignores ``limit``, streamed with its Content-Length."""

PEER_ATTACKS: dict[str, str] = {
    "kubelet-huge": f"kubelet List reply of {KUBELET_HUGE_BYTES // MiB} MiB of small pods (one GPU each)",
    "kubelet-big": f"kubelet List reply of {KUBELET_BIG_BYTES / MiB:.2f} MiB of small pods, just under the cap",
    "kubelet-50k-pods": f"kubelet List reply of {KUBELET_PODS:,} pods, each holding a replica of a GPU of the node",
    "kubelet-flood": "kubelet answering each call with HTTP/2 SETTINGS, PING, WINDOW_UPDATE and empty DATA "
    "frames for as long as the caller listens",
    "api-endless-line": "API watch whose first event line never ends (64 KiB chunks as fast as read)",
    "api-trickle-line": "API watch whose first event line grows by one byte every 0.1 s",
    "api-huge-list": f"API pod list of {API_HUGE_LIST_BYTES // 1_000_000} MB in one page (limit ignored)",
}
"""Attack name -> what the peer does."""


@dataclass
class PeerSetup:
    """How to point the exporter at the peers: extra flags and extra environment."""

    argv: list[str]
    env: dict[str, str]


def _kubeconfig(folder: Path, server: str) -> Path:
    """A kubeconfig naming ``server`` (``KubePodSource.in_cluster`` falls back to it)."""
    path = folder / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: peer, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: peer, user: u}}]\n"
        "current-context: c\n"
    )
    return path


@contextmanager
def _kubelet(reply_bytes: int | None, pods: int | None = None) -> Iterator[FakeKubelet]:
    """A kubelet on a short temporary socket path; ``reply_bytes`` of small pods, or ``pods`` pods
    holding replicas of the simulated node's first GPU, or no pods."""
    kubelet = FakeKubelet()
    if pods is not None:
        kubelet.raw_list = small_pods_reply(0, pods=pods, gpu=build_scenario("h200x8").gpus[0].uuid)
    elif reply_bytes is not None:
        kubelet.raw_list = small_pods_reply(reply_bytes)
    with kubelet:
        yield kubelet


@contextmanager
def _api(hostile: str | None) -> Iterator[KubeApiEmulator]:
    """An API emulator with a few pods on ``NODE``, in the hostile mode given."""
    with KubeApiEmulator() as api:
        for i in range(3):
            api.put(make_pod(f"train-{i}", "ml", owner=("StatefulSet", "train")))
        api.hostile = hostile
        api.huge_list_bytes = API_HUGE_LIST_BYTES
        yield api


_API_MODES: dict[str, str | None] = {
    "api-endless-line": "endless-line",
    "api-trickle-line": "trickle-line",
    "api-huge-list": "huge-list",
    "honest-api": None,
}
"""Attack name -> the emulator's hostile mode."""


@contextmanager
def _peers(name: str, folder: Path) -> Iterator[PeerSetup]:
    """The peers of attack ``name``, or honest ones for ``honest-kubelet`` / ``honest-api``."""
    no_api = {"NODE_NAME": "", "GPULENS_KUBERNETES_NODE_NAME": "", "KUBERNETES_SERVICE_HOST": ""}
    with ExitStack() as stack:
        if name in ("kubelet-huge", "kubelet-big", "kubelet-50k-pods", "honest-kubelet"):
            size = {"kubelet-huge": KUBELET_HUGE_BYTES, "kubelet-big": KUBELET_BIG_BYTES}.get(name)
            pods = KUBELET_PODS if name == "kubelet-50k-pods" else None
            kubelet = stack.enter_context(_kubelet(size, pods))
            yield PeerSetup(["--kubernetes.podresources-socket", kubelet.socket_path, "--no-kubernetes.api"], no_api)
            return
        if name == "kubelet-flood":
            flood = stack.enter_context(FloodPeer(None))
            yield PeerSetup(["--kubernetes.podresources-socket", flood.socket_path, "--no-kubernetes.api"], no_api)
            return
        if name not in _API_MODES:
            raise ValueError(f"unknown peer attack {name!r}; known: {', '.join(PEER_ATTACKS)}")
        kubelet = stack.enter_context(_kubelet(None))
        api = stack.enter_context(_api(_API_MODES[name]))
        argv = ["--kubernetes.podresources-socket", kubelet.socket_path, "--kubernetes.api"]
        argv += ["--kubernetes.node-name", NODE]
        env = {**no_api, "KUBECONFIG": str(_kubeconfig(folder, api.url))}
        yield PeerSetup(argv, env)


@contextmanager
def hostile_peer(name: str, folder: Path) -> Iterator[PeerSetup]:
    """Start the misbehaving fake peer(s) of attack ``name`` (a key of ``PEER_ATTACKS``), write
    what they need into ``folder`` (a kubeconfig), and stop them on exit."""
    if name not in PEER_ATTACKS:
        raise ValueError(f"unknown peer attack {name!r}; known: {', '.join(PEER_ATTACKS)}")
    with _peers(name, folder) as setup:
        yield setup


# --- the smoke run ---------------------------------------------------------------------------------


@dataclass
class Run:
    """One exporter process against one set of peers."""

    attack: str
    ready_s: float
    rss_ready_mb: float
    rss_peak_mb: float
    """VmHWM: the highest RSS since the process started (startup included)."""
    rss_end_mb: float
    cpu_s: float
    failing: dict[str, int]
    """Stage -> scrapes (one a second) in which it read 0."""
    scrapes: int
    page_mb: float = 0.0
    """The largest /metrics page scraped."""
    scrape_max_s: float = 0.0
    """The slowest scrape (wall seconds, the page read whole)."""


def _peak_rss_bytes(pid: int) -> int:
    """VmHWM: the process' peak resident set size, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def _stages(port: int) -> tuple[dict[str, float], int, float]:
    """``gpulens_stage_success`` of the attribution stages, from one scrape; the page's bytes and
    the scrape's seconds."""
    started = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    took = time.perf_counter() - started
    found = stage_success(text.encode())
    return (
        {stage: v for stage, v in found.items() if stage in (stage_names.PODRESOURCES, stage_names.KUBE_API)},
        len(text),
        took,
    )


def run_one(name: str, seconds: float) -> Run:
    """Start the exporter against ``name``'s peers, let it run ``seconds`` after it is ready."""
    with tempfile.TemporaryDirectory(prefix="gpulens-peers-") as tmp, _peers(name, Path(tmp)) as setup:
        port = free_port()
        argv = [sys.executable, "-m", "exporter", "--backend", "sim", "--web.listen-address", f"127.0.0.1:{port}"]
        started = time.monotonic()
        with managed_process(
            [*argv, *setup.argv], f"http://127.0.0.1:{port}/readyz", env=setup.env, timeout=180
        ) as proc:
            ready_s = time.monotonic() - started
            rss_ready = rss_bytes(proc.pid)
            failing: dict[str, int] = {}
            scrapes = page = 0
            slowest = 0.0
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                time.sleep(1.0)
                scrapes += 1
                stages, size, took = _stages(port)
                page, slowest = max(page, size), max(slowest, took)
                for stage, value in stages.items():
                    failing[stage] = failing.get(stage, 0) + (value == 0)
            return Run(
                attack=name,
                ready_s=ready_s,
                rss_ready_mb=rss_ready / MiB,
                rss_peak_mb=_peak_rss_bytes(proc.pid) / MiB,
                rss_end_mb=rss_bytes(proc.pid) / MiB,
                cpu_s=cpu_seconds(proc.pid),
                failing=failing,
                scrapes=scrapes,
                page_mb=page / 1e6,
                scrape_max_s=slowest,
            )


def table(runs: list[Run]) -> str:
    """The runs as a Markdown table; a stage column reads "seconds at 0 / seconds scraped"."""
    lines = [
        "| peer | ready (s) | RSS ready (MB) | peak RSS (MB) | RSS end (MB) | CPU (s) | page (MB) | slowest scrape (s) "
        "| podresources 0 | kube_api 0 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        cells = [
            f"{r.failing[s]}/{r.scrapes}" if s in r.failing else "-"
            for s in (stage_names.PODRESOURCES, stage_names.KUBE_API)
        ]
        lines.append(
            f"| {r.attack} | {r.ready_s:.1f} | {r.rss_ready_mb:.1f} | {r.rss_peak_mb:.1f} | {r.rss_end_mb:.1f} "
            f"| {r.cpu_s:.1f} | {r.page_mb:.2f} | {r.scrape_max_s:.2f} | {cells[0]} | {cells[1]} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the chosen attacks (and the honest baselines) one after another; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attacks", default=",".join(["honest-kubelet", "honest-api", *PEER_ATTACKS]))
    parser.add_argument("--seconds", type=float, default=20.0, help="how long each exporter runs once ready")
    args = parser.parse_args(argv)
    runs = []
    for name in args.attacks.split(","):
        run = run_one(name, args.seconds)
        sys.stderr.write(f"{name}: ready in {run.ready_s:.1f} s, peak RSS {run.rss_peak_mb:.0f} MB\n")
        runs.append(run)
    sys.stdout.write(table(runs) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
