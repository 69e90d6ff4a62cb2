#!/usr/bin/env python3
"""Device run for issue 31: NVLink counters, NCCL collectives and the ``communication`` class.

One exporter (``python -m exporter --backend nvml --collect.interval 1 --no-probes``) runs with
the chart's whole attribution chain against fakes started here: a gRPC kubelet (PodResources)
whose one pod ``ml/nccl-job`` (container ``main``) holds the GPUs, the API emulator with that pod
(reached through a kubeconfig), and a procfs folder whose ``<pid>/cgroup`` files put every load
process this script starts in that container (written the moment each load is spawned, before it
opens a CUDA context; the PIDs ``nvidia-smi --query-compute-apps`` lists are added once the load
is ready).  So the exporter sees one pod spanning the GPUs, as a training job's pod does.  Each
phase starts its loads, waits until they are ready, then scrapes ``/metrics`` once a second and
records per GPU: the GPU's class, the pod's class on it, NVLink tx/rx bytes/s and capacity, SM
activity, compute processes and the pod's memory on it.  The first ``--settle-seconds`` of a phase
(the classifier's 10 s window and the refiner's 10 s hold, plus scrape lag) are shown but not
judged: the rest are the *steady* seconds.

Phases with two or more GPUs (the first two GPUs by index; ``--phases`` picks a subset):

- ``nvlink-copy``: one torch process copies a 1 GiB buffer GPU0 -> GPU1 (peer copy) and times
  itself.  Checks: peer access; exported NVLink tx of GPU0 and rx of GPU1 (medians over the steady
  seconds) within 5 % of the copy's own bytes/s; the exported NVLink capacity equals the active
  links x link speed of ``nvidia-smi nvlink -s``; the exported per-link states
  (``gpulens_gpu_nvlink_link_active``: the same links, each active or not) match ``nvidia-smi
  nvlink -s``; the exported topology (``gpulens_gpu_nvlink_peer_links``) says the ``NV#`` that
  ``nvidia-smi topo -m`` prints between the two GPUs, both ways.
- ``allreduce-bandwidth`` / ``allreduce-latency`` / ``allreduce-straggler`` /
  ``allreduce-straggler-gemm``: torch.distributed NCCL all-reduce, one process per GPU
  (``NCCL_NVLS_ENABLE=0``: NVLink multicast stays off), of 256 MiB / 4 KiB messages / 4 GiB
  messages while rank 1 sleeps 0.5 s before each step / 256 MiB while rank 1 runs a bf16 GEMM
  for 0.5 s before each step.  Every run shows the per-second classes of both GPUs and the
  NVLink bytes against what the ranks moved.  Checks: both GPUs work (not ``idle``) in the first
  two; in the straggler runs the waiting GPU (rank 0's) reads ``communication`` (not ``latency``,
  not ``idle``) in most steady seconds, by the NVLink evidence (sleeping straggler) or by its
  peer computing (GEMM straggler), whose GPU must read ``compute``.
- ``spin``: 24 spinning blocks (``scripts/gpu_network.py``'s kernel, how a GPU waiting in NCCL
  looks) on GPU0 while GPU1 idles: the pod spans GPUs but nothing moves and no peer computes, so
  it must stay ``latency``, never ``communication``.
- ``gemm``: a bf16 matmul loop on each GPU in turn: ``compute`` (GPU and pod class).
- ``separation``: ``scripts/gpu_multi.py``'s copy loop on the last GPU only: it alone shows the
  process, SM activity and class ``memory``; every other GPU reads no process, SM ~0 and
  ``idle``.  Probes are off here; ``scripts/gpu_multi.py`` checks probe separation on its own.

With one GPU (``--dry-run-one-gpu``, or automatically when fewer than two are visible) the pod
holds that GPU and the script runs what one GPU allows: ``copy-smoke`` and ``allreduce-smoke``
(the copy and rank code on one GPU, one rank: they must run and report), ``spin`` (a pod on one
GPU without NICs: ``latency``, not ``communication``) and ``gemm`` (``compute``); the two-GPU
phases are listed "not run: needs 2 GPUs".  ``--dry-run-sim`` runs the orchestration on a machine
without a GPU: the simulator as backend and stub loads (its verdicts mean nothing).

Writes under ``--out``: ``gpu_nccl.md`` (the table, also printed), ``gpu_nccl.json`` (every
per-second row, the loads' own reports, the nvidia-smi texts, the rows), ``exporter.log``,
``loads.log`` (the loads' stderr and NCCL's INFO log) and ``metrics_last.txt`` (the last scrape).
Exit status 0 when no row reads FAIL.  Runs need the image's torch, CuPy, nvidia-ml-py and
prometheus_client, and the wheels in ``.whl/`` (grpcio, protobuf, h2 and friends, for the fake
kubelet and the exporter's kubelet client).  Device commands (device tool ``run``, ``carry``
``[".whl"]``, ``timeout_s`` 600):

    # two GPUs (kind nvidia-h200-x2), about 7 minutes:
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 \
      && python3 scripts/gpu_nccl.py --out $OUT
    # one GPU (kind nvidia-h200), the dry run, about 3 minutes:
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 \
      && python3 scripts/gpu_nccl.py --out $OUT --dry-run-one-gpu
    # overhead with two GPUs beside nvitop-exporter (scrape p99, CPU, RSS; reads every GPU),
    # on nvidia-h200-x2, its own call (not this script's job):
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 \
      && python3 -m bench.real_gpu --chain full --client prometheus --out $OUT --tag two_gpu_idle
    # without a GPU (orchestration only):
    .venv/bin/python scripts/gpu_nccl.py --dry-run-sim h200x8 --phase-seconds 17 --out /tmp/nccl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid as uuidlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from gpu_multi import COPY_LOAD  # noqa: E402  (the separation check's load: a device-local copy loop)
from gpu_network import SPIN  # noqa: E402  (24 spinning blocks: how a GPU waiting in NCCL looks)
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from exporter.analysis.communication import CommunicationLevels  # noqa: E402
from exporter.attribution import stages as stage_names  # noqa: E402
from exporter.model import COMMUNICATION, NVLINK  # noqa: E402
from tests.fakes import kube_api_server  # noqa: E402
from tests.support.net import free_port  # noqa: E402
from tests.support.process import managed_process  # noqa: E402
from tests.support.procfs import cgroup_line  # noqa: E402
from tests.support.scrape import Samples, api_env  # noqa: E402

# --- thresholds and sizes ------------------------------------------------------------------------

ANALYSIS_WINDOW_SECONDS = 10.0
"""The exporter's default ``--analysis.window``: a class covers this much of the past."""
HOLD_SECONDS = CommunicationLevels().hold_seconds
"""Evidence of communication counts this long (the refiner's own level)."""
NVLINK_EVIDENCE_RATIO = CommunicationLevels().nvlink_ratio
"""NVLink utilisation at which the refiner counts a leaf's links as moving data."""
SETTLE_SECONDS = max(ANALYSIS_WINDOW_SECONDS, HOLD_SECONDS) + 2.0
"""Seconds of a phase not judged: the window (and the hold) still cover the phase before, plus one
collection cycle and one scrape of lag."""
CLASS_SHARE = 0.8
"""'Most steady seconds': a second or two at the edges may lag (a scrape just before a cycle)."""
COPY_TOLERANCE = 0.05
"""Exported NVLink bytes/s against the copy's own bytes/s: the issue's 5 %."""
CAPACITY_TOLERANCE = 0.005
"""Exported capacity against nvidia-smi's links x speed: both read NVML's rate (26.562 vs 26.5625 GB/s)."""
IDLE_SM = 0.01
"""SM activity of a GPU nobody loads (as ``scripts/gpu_multi.py`` checks)."""
LOADED_SM = 0.5
"""SM activity of the GPU the separation copy loop loads (as ``scripts/gpu_multi.py`` checks)."""
MIN_STEADY_SECONDS = 5
"""Fewer steady seconds than this judge nothing: the phase was too short or scrapes failed."""

MiB = 1 << 20
GiB = 1 << 30
COPY_BYTES = 1 * GiB
"""Peer-copy buffer: ~2.5 ms a copy at NVLink speed, far past launch overhead and the 60 MB L2."""
BANDWIDTH_BYTES = 256 * MiB
"""Bandwidth-bound all-reduce message: a gradient bucket's order of size."""
LATENCY_BYTES = 4 * 1024
"""Latency-bound all-reduce message: a few KiB in a tight loop, NCCL's LL protocol."""
STRAGGLER_SLEEP_SECONDS = 0.5
"""The straggler's lag before each step: about two steps a second."""
STRAGGLER_BYTES = 4 * GiB
"""Message of the sleeping-straggler run: 2 steps/s x 4 GiB ~ 8.6 GB/s each way, ~1.8 % of an H200's
18 x 26.562 GB/s, above the refiner's 1 % NVLink evidence (256 MiB would move ~0.1 % and leave the
waiting GPU no evidence but its own spinning); a large gradient bucket moves as much."""
GEMM_STRAGGLER_BYTES = 256 * MiB
"""Message of the GEMM-straggler run: the straggler's GEMM, not the links, is the evidence there."""
CHECK_EVERY = {"bandwidth": 8, "latency": 512, "straggler": 1}
"""All-reduce steps between the ranks' agreement on stopping (one tiny all-reduce and a sync):
rare enough not to change a tight loop's shape, every step where steps are slow anyway."""

LOAD_MARGIN_SECONDS = 3.0
"""Loads run this much past the recorded seconds, so the last scrape still sees them."""
READY_TIMEOUT_SECONDS = 120.0
"""A load not ready by then failed (torch, CUDA and NCCL start-up take seconds to tens of seconds;
more would eat the device's 10-minute command limit)."""

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
"""NVLink multicast off in every child (the device notes: it can take the host's GPUs down)."""

NAMESPACE, POD, CONTAINER = "ml", "nccl-job", "main"
NODE = "gpu-node-1"
GPU_RESOURCE = "nvidia.com/gpu"
POD_UID = str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, "https://gpulens.invalid/scripts/gpu_nccl/nccl-job"))
CONTAINER_ID = hashlib.sha256(f"{POD_UID}/{CONTAINER}".encode()).hexdigest()
"""The container's runtime ID (64 hex digits), the same in its cgroup path and the API's status."""
CHAIN_STAGES = (stage_names.PODRESOURCES, stage_names.KUBE_API, stage_names.CGROUP)


CODES = {
    "idle": ".",
    "launch": "n",
    "latency": "l",
    COMMUNICATION: "C",
    "memory": "m",
    "compute": "c",
    "mixed": "x",
    "transfer": "t",
    "busy": "b",
    "shared": "s",
}
"""One character per class in the per-second rows (``-``: no class exported)."""

TWO_GPU_PHASES = (
    "nvlink-copy",
    "allreduce-bandwidth",
    "allreduce-latency",
    "allreduce-straggler",
    "allreduce-straggler-gemm",
    "separation",
)
"""Phases that need two GPUs: listed "not run" with one."""
DEFAULT_TWO = (*TWO_GPU_PHASES[:5], "spin", "gemm", "separation")
"""What a machine of two or more GPUs runs, in this order."""
DEFAULT_ONE = ("copy-smoke", "allreduce-smoke", "spin", "gemm", *TWO_GPU_PHASES)
"""What one GPU runs (the two-GPU phases to be listed as not run)."""
ALL_PHASES = (*DEFAULT_TWO, "copy-smoke", "allreduce-smoke")

# --- the loads (child processes; argv[1] is always how many seconds they run) -------------------

PEER_COPY = r"""
import json, sys, time, torch
seconds, nbytes, s, d = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
src = torch.ones(nbytes, dtype=torch.uint8, device=f"cuda:{s}")
dst = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{d}")
peer = s == d or torch.cuda.can_device_access_peer(d, s)
def sync():
    torch.cuda.synchronize(s); torch.cuda.synchronize(d)
for _ in range(3):
    dst.copy_(src)
sync()
print(json.dumps({"ready": True, "peer_access": peer}), flush=True)
start = last = time.time(); end = start + seconds; moved = total = 0
while time.time() < end:
    for _ in range(8):
        dst.copy_(src)
    sync()
    moved += 8 * nbytes
    now = time.time()
    if now - last >= 1.0:
        print(json.dumps({"t": now, "seconds": now - last, "bytes": moved}), flush=True)
        total += moved; last, moved = now, 0
print(json.dumps({"result": True, "bytes": total + moved, "seconds": time.time() - start}), flush=True)
"""

ALLREDUCE_RANK = r"""
import json, os, sys, time, torch
import torch.distributed as dist
seconds, nbytes, lag = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
work, every = sys.argv[4], int(sys.argv[5])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dev = torch.device("cuda", rank)
torch.cuda.set_device(dev)
dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
buf = torch.zeros(max(1, nbytes // 2), dtype=torch.bfloat16, device=dev)
flag = torch.zeros(1, dtype=torch.int32, device=dev)
straggler = lag > 0 and rank == world - 1
if straggler and work == "gemm":
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev); b = torch.randn_like(a)
def straggle():
    if work == "sleep":
        time.sleep(lag); return
    t = time.time()
    while time.time() - t < lag:
        for _ in range(4):
            a @ b
        torch.cuda.synchronize(dev)
for _ in range(3):
    dist.all_reduce(buf)
torch.cuda.synchronize(dev)
dist.barrier()
v = torch.cuda.nccl.version()
nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
print(json.dumps({"ready": True, "rank": rank, "nccl": nccl}), flush=True)
start = time.time(); end = start + seconds; steps = 0
while True:
    if straggler:
        straggle()
    dist.all_reduce(buf)
    steps += 1
    if steps % every == 0:
        flag.fill_(int(rank == 0 and time.time() >= end))
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            break
torch.cuda.synchronize(dev)
elapsed = time.time() - start
size = buf.numel() * buf.element_size()
report = {"result": True, "rank": rank, "world": world, "steps": steps, "seconds": elapsed, "message_bytes": size}
print(json.dumps(report), flush=True)
dist.destroy_process_group()
"""

GEMM = r"""
import json, sys, time, torch
x = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda"); y = torch.randn_like(x)
z = x @ y; torch.cuda.synchronize(); print("ready", flush=True)
start = time.time(); end = start + float(sys.argv[1]); n = 0
while time.time() < end:
    for _ in range(10):
        z = x @ y
    torch.cuda.synchronize(); n += 10
print(json.dumps({"result": True, "tflops": 2 * 8192**3 * n / (time.time() - start) / 1e12}), flush=True)
"""

STUB = r"""
import sys, time
print("ready", flush=True)
time.sleep(float(sys.argv[1]))
"""
"""What every load is replaced with under ``--dry-run-sim`` (no GPU)."""


# --- records -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    """A GPU as the exporter lists it (``gpulens_gpu_info``): NVML index (as a string) and UUID."""

    index: str
    uuid: str


@dataclass
class GpuSecond:
    """What one scrape says about one GPU."""

    cls: str | None = None
    pod_cls: str | None = None
    nvlink_tx: float | None = None
    nvlink_rx: float | None = None
    nvlink_capacity: float | None = None
    nvlink_source: str | None = None
    sm_active: float | None = None
    processes: float | None = None
    pod_memory: float | None = None


@dataclass
class Second:
    """One scrape during a phase: seconds since the phase's recording began, and every GPU."""

    t: float
    gpus: dict[str, GpuSecond]


@dataclass
class PhaseRun:
    """One phase as recorded: the GPUs it loads in role order (sender/receiver, rank 0/1, ...),
    the seconds, each load's JSON reports, exit codes, and why it stopped early if it did."""

    name: str
    roles: list[Gpu]
    duration: float
    settle: float
    started_at: float = 0.0
    seconds: list[Second] = field(default_factory=list)
    reports: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    error: str | None = None
    last: Samples = field(default_factory=dict)
    nccl_log: str = ""


@dataclass(frozen=True)
class Row:
    """One row of the table; ``result`` is PASS, FAIL, INFO or "NOT RUN: ..."."""

    phase: str
    gpu: str
    what: str
    measured: str
    expected: str
    result: str


def check(phase: str, gpu: str, what: str, measured: str, expected: str, ok: bool) -> Row:
    return Row(phase, gpu, what, measured, expected, "PASS" if ok else "FAIL")


def info(phase: str, gpu: str, what: str, measured: str, expected: str = "-") -> Row:
    return Row(phase, gpu, what, measured, expected, "INFO")


# --- parsing (pure) ------------------------------------------------------------------------------


def parse_exposition(text: str) -> Samples:
    """Sample name -> [(labels, value)] of a Prometheus text exposition."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def exporter_gpus(samples: Samples) -> list[Gpu]:
    """The GPUs of ``gpulens_gpu_info``, by index."""
    gpus = {lab["gpu"]: Gpu(lab["gpu"], lab["uuid"]) for lab, _ in samples.get("gpulens_gpu_info", [])}
    return [gpus[k] for k in sorted(gpus, key=int)]


def _value(samples: Samples, name: str, **match: str) -> float | None:
    for labels, value in samples.get(name, ()):
        if all(labels.get(k) == v for k, v in match.items()):
            return value
    return None


def _label_of_one(samples: Samples, name: str, label: str, **match: str) -> str | None:
    """``label`` of the series of ``name`` matching ``match`` whose value is 1 (a class, a source)."""
    for labels, value in samples.get(name, ()):
        if value == 1 and all(labels.get(k) == v for k, v in match.items()):
            return labels.get(label)
    return None


def gpu_second(samples: Samples, uuid: str) -> GpuSecond:
    """One GPU's row of one scrape: the whole-GPU leaf's series and ``nccl-job/main``'s on it."""
    leaf = {"uuid": uuid, "mig_uuid": ""}
    owner = {"namespace": NAMESPACE, "pod": POD, "container": CONTAINER, "uuid": uuid}
    return GpuSecond(
        cls=_label_of_one(samples, "gpulens_gpu_boundness", "class", **leaf),
        pod_cls=_label_of_one(samples, "gpulens_pod_gpu_boundness", "class", **owner, mig_uuid=""),
        nvlink_tx=_value(samples, "gpulens_gpu_nvlink_tx_bytes_per_second", uuid=uuid),
        nvlink_rx=_value(samples, "gpulens_gpu_nvlink_rx_bytes_per_second", uuid=uuid),
        nvlink_capacity=_value(samples, "gpulens_gpu_nvlink_capacity_bytes_per_second", **leaf),
        nvlink_source=_label_of_one(samples, "gpulens_gpu_link_info", "source", **leaf, link=NVLINK),
        sm_active=_value(samples, "gpulens_gpu_sm_active_ratio", **leaf),
        processes=_value(samples, "gpulens_gpu_compute_processes", **leaf),
        pod_memory=_value(samples, "gpulens_pod_gpu_memory_used_bytes", **owner),
    )


def second_of(samples: Samples, gpus: Sequence[Gpu], t: float) -> Second:
    return Second(round(t, 2), {g.index: gpu_second(samples, g.uuid) for g in gpus})


def parse_gpu_list(text: str) -> list[str]:
    """UUIDs of ``nvidia-smi -L``, in its order."""
    return re.findall(r"\(UUID: (GPU-[0-9a-fA-F-]+)\)", text)


@dataclass(frozen=True)
class NvlinkStatus:
    """One GPU of ``nvidia-smi nvlink -s``: link -> speed (GB/s each way), ``None`` if inactive."""

    index: int
    uuid: str
    links: Mapping[int, float | None]

    @property
    def active(self) -> int:
        return sum(1 for s in self.links.values() if s is not None)

    @property
    def speeds(self) -> set[float]:
        return {s for s in self.links.values() if s is not None}


def parse_nvlink_status(text: str) -> dict[str, NvlinkStatus]:
    """UUID -> links of ``nvidia-smi nvlink -s`` (``Link 3: 26.562 GB/s``, ``Link 4: <inactive>``)."""
    out: dict[str, NvlinkStatus] = {}
    index, uuid = -1, ""
    links: dict[int, float | None] = {}
    gpu_re = re.compile(r"^GPU (\d+): .*\(UUID: (GPU-[0-9a-fA-F-]+)\)")
    link_re = re.compile(r"^\s*Link (\d+): (.*)$")
    for line in text.splitlines():
        m = gpu_re.match(line)
        if m:
            if uuid:
                out[uuid] = NvlinkStatus(index, uuid, links)
            index, uuid, links = int(m.group(1)), m.group(2), {}
            continue
        m = link_re.match(line)
        if m and uuid:
            speed = re.match(r"([0-9.]+) GB/s", m.group(2).strip())
            links[int(m.group(1))] = float(speed.group(1)) if speed else None
    if uuid:
        out[uuid] = NvlinkStatus(index, uuid, links)
    return out


def parse_topology(text: str) -> dict[tuple[str, str], str]:
    """(row, column) -> cell of ``nvidia-smi topo -m``'s matrix, for its GPU and NIC columns
    (``("GPU0", "GPU1") -> "NV18"``); the affinity columns and the legend are left out.  The
    header row is the first naming ``GPU0`` without an ``X`` (a row has its own ``X``); nvidia-smi
    underlines it with terminal escapes, which are dropped."""
    device = re.compile(r"(GPU|NIC)\d+")
    out: dict[tuple[str, str], str] = {}
    columns: list[str] = []
    for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines():
        cells = [c.strip() for c in re.split(r"\t+|\s{2,}", line.strip())]
        if not columns:
            if "GPU0" in cells and "X" not in cells:
                columns = [c for c in cells if device.fullmatch(c)]
            continue
        if not device.fullmatch(cells[0]):
            if out:
                break  # the legend follows the matrix
            continue
        for col, cell in zip(columns, cells[1:], strict=False):
            out[(cells[0], col)] = cell
    return out


def is_ready(line: str) -> bool:
    """A load's line saying it is ready: ``ready``, or a JSON object with ``"ready": true``."""
    if line.strip() == "ready":
        return True
    try:
        obj = json.loads(line)
    except ValueError:
        return False
    return isinstance(obj, dict) and obj.get("ready") is True


def nccl_transports(log: str) -> list[str]:
    """The distinct transports NCCL's INFO log names for its channels (``P2P/CUMEM/read``, ``SHM``)."""
    return sorted({m.group(1) for m in re.finditer(r"NCCL INFO Channel \S+ : .* via (\S+)", log)})


# --- judging recorded seconds (pure) -------------------------------------------------------------


def steady(run: PhaseRun) -> list[Second]:
    """The seconds judged: past the settle time, before the recording's end."""
    return [s for s in run.seconds if run.settle <= s.t <= run.duration]


def _median(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def column(seconds: Sequence[Second], gpu: Gpu, name: str) -> list[Any]:
    """One field of ``GpuSecond`` for ``gpu``, over the seconds that have it."""
    return [getattr(s.gpus[gpu.index], name) for s in seconds if gpu.index in s.gpus]


def _classes(seconds: Sequence[Second], gpu: Gpu, pod: bool = False) -> list[str | None]:
    return column(seconds, gpu, "pod_cls" if pod else "cls")


def codes(run: PhaseRun, gpu: Gpu, pod: bool = False) -> str:
    """The per-second classes of ``gpu`` as one character each, ``|`` where the steady seconds begin."""
    out = ""
    marked = False
    for s in run.seconds:
        if not marked and s.t >= run.settle:
            out += "|"
            marked = True
        g = s.gpus.get(gpu.index)
        c = (g.pod_cls if pod else g.cls) if g else None
        out += CODES.get(c, "?") if c else "-"
    return out


def _counts(classes: Sequence[str | None]) -> str:
    tally: dict[str, int] = {}
    for c in classes:
        tally[str(c)] = tally.get(str(c), 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(tally.items(), key=lambda kv: -kv[1])) or "none"


def _gbs(v: float | None) -> str:
    return "-" if v is None else f"{v / 1e9:.1f} GB/s"


def class_check(run: PhaseRun, gpu: Gpu, wanted: set[str], pod: bool = False, never: set[str] | None = None) -> Row:
    """``gpu`` (or the pod on it) reads a class of ``wanted`` in ``CLASS_SHARE`` of the steady
    seconds, and none of ``never`` in any."""
    seconds = steady(run)
    classes = _classes(seconds, gpu, pod)
    hits = sum(1 for c in classes if c in wanted)
    bad = sum(1 for c in classes if never and c in never)
    enough = len(classes) >= MIN_STEADY_SECONDS
    ok = enough and hits >= CLASS_SHARE * len(classes) and not bad
    who = "pod class" if pod else "GPU class"
    expected = f"{' or '.join(sorted(wanted))} in >= {CLASS_SHARE:.0%} of steady seconds"
    if never:
        expected += f", never {' or '.join(sorted(never))}"
    measured = f"{hits}/{len(classes)} ({_counts(classes)})" if enough else f"only {len(classes)} steady seconds"
    return check(run.name, gpu.index, who, measured, expected, ok)


def not_idle_check(run: PhaseRun, gpu: Gpu) -> Row:
    """``gpu`` works (a class other than idle) in most steady seconds."""
    classes = _classes(steady(run), gpu)
    working = sum(1 for c in classes if c not in (None, "idle"))
    ok = len(classes) >= MIN_STEADY_SECONDS and working >= CLASS_SHARE * len(classes)
    return check(
        run.name,
        gpu.index,
        "GPU class",
        f"{working}/{len(classes)} working ({_counts(classes)})",
        f"not idle in >= {CLASS_SHARE:.0%} of steady seconds",
        ok,
    )


def per_second_rows(run: PhaseRun, gpus: Sequence[Gpu]) -> list[Row]:
    """The per-second classes (GPU, then pod) and link and SM medians of each GPU, as INFO."""
    rows = []
    for g in gpus:
        seconds = steady(run)
        tx = _median(column(seconds, g, "nvlink_tx"))
        rx = _median(column(seconds, g, "nvlink_rx"))
        sm = _median(column(seconds, g, "sm_active"))
        procs = sorted(set(column(seconds, g, "processes")), key=str)
        rows.append(
            info(run.name, g.index, "per-second class, GPU / pod", f"`{codes(run, g)}` / `{codes(run, g, True)}`")
        )
        rows.append(
            info(
                run.name,
                g.index,
                "steady medians",
                f"NVLink tx {_gbs(tx)}, rx {_gbs(rx)}; SM {_fmt(sm)}; processes {procs}",
            )
        )
    return rows


def _fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def pod_memory_check(run: PhaseRun, gpus: Sequence[Gpu]) -> list[Row]:
    """The load's processes are attributed to ``nccl-job/main`` on each loaded GPU (the cgroup
    chain mapped their PIDs): its memory series appears in a steady second."""
    rows = []
    for g in gpus:
        seen = column(steady(run), g, "pod_memory")
        mapped = [v for v in seen if v]
        rows.append(
            check(
                run.name,
                g.index,
                f"load attributed to {POD}/{CONTAINER}",
                f"pod memory in {len(mapped)}/{len(seen)} steady seconds"
                + (f", {max(mapped) / GiB:.1f} GiB" if mapped else ""),
                "in some steady second",
                bool(mapped),
            )
        )
    return rows


def loads_ran(run: PhaseRun, wants_result: Iterable[str]) -> list[Row]:
    """Each load exited 0; those of ``wants_result`` reported a result line."""
    rows = []
    if run.error:
        rows.append(check(run.name, "-", "phase ran", run.error, "no error", False))
    for name, code in run.exit_codes.items():
        reported = any(r.get("result") for r in run.reports.get(name, []))
        needs = name in set(wants_result)
        ok = code == 0 and (reported or not needs)
        measured = f"exit {code}" + ("" if not needs else ", result reported" if reported else ", no result")
        rows.append(check(run.name, "-", f"load {name}", measured, "exit 0" + (", a result" if needs else ""), ok))
    return rows


def _results(run: PhaseRun, name: str) -> dict[str, Any]:
    return next((r for r in run.reports.get(name, []) if r.get("result")), {})


def evaluate_copy(run: PhaseRun, smoke: bool = False) -> list[Row]:
    """The peer copy: its own bytes/s against the exported NVLink tx of the sender and rx of the
    receiver (steady medians); ``smoke``: a same-GPU copy that only has to run."""
    rows = loads_ran(run, ["copy"])
    ready = next((r for r in run.reports.get("copy", []) if r.get("ready")), {})
    t0, t1 = run.started_at + run.settle, run.started_at + run.duration
    rates = [r["bytes"] / r["seconds"] for r in run.reports.get("copy", []) if "t" in r and t0 <= r["t"] <= t1 + 1]
    copied = _median(rates)
    rows.append(
        info(run.name, "-", "copy's own rate (steady median)", _gbs(copied), f"{len(rates)} one-second reports")
    )
    if smoke or len(run.roles) < 2:
        return rows
    sender, receiver = run.roles[0], run.roles[1]
    rows.append(
        check(
            run.name,
            f"{sender.index}->{receiver.index}",
            "peer access",
            str(ready.get("peer_access")),
            "True",
            ready.get("peer_access") is True,
        )
    )
    seconds = steady(run)
    for gpu, attr, role in ((sender, "nvlink_tx", "tx (sender)"), (receiver, "nvlink_rx", "rx (receiver)")):
        exported = _median(column(seconds, gpu, attr))
        ok = exported is not None and copied is not None and abs(exported - copied) <= COPY_TOLERANCE * copied
        ratio = f" ({exported / copied:.3f}x)" if exported is not None and copied else ""
        rows.append(
            check(
                run.name,
                gpu.index,
                f"NVLink {role} vs copy",
                _gbs(exported) + ratio,
                f"within {COPY_TOLERANCE:.0%} of {_gbs(copied)}",
                ok,
            )
        )
    for gpu, attr, role in ((sender, "nvlink_rx", "rx (sender)"), (receiver, "nvlink_tx", "tx (receiver)")):
        back = _median(column(seconds, gpu, attr))
        rows.append(info(run.name, gpu.index, f"NVLink {role}, the way back", _gbs(back)))
    for gpu in (sender, receiver):
        sources = sorted({str(v) for v in column(seconds, gpu, "nvlink_source")})
        rows.append(info(run.name, gpu.index, "NVLink byte source (gpulens_gpu_link_info)", ", ".join(sources)))
    return rows


def evaluate_links(
    phase: str, samples: Samples, nvlink_text: str, topo_text: str, gpus: Sequence[Gpu], judge: bool = True
) -> list[Row]:
    """The exporter's NVLink capacity, link count/state and topology against nvidia-smi's; with
    ``judge`` off (one GPU) only what nvidia-smi says and what the exporter has, as INFO."""
    status = parse_nvlink_status(nvlink_text)
    topo = parse_topology(topo_text)
    rows = []
    for g in gpus:
        st = status.get(g.uuid)
        capacity = _value(samples, "gpulens_gpu_nvlink_capacity_bytes_per_second", uuid=g.uuid, mig_uuid="")
        if st is None:
            said = "no such GPU in its output" if nvlink_text.strip() else "no output"
        else:
            said = f"{st.active}/{len(st.links)} links active at {sorted(st.speeds)} GB/s"
        rows.append(info(phase, g.index, "nvidia-smi nvlink -s", said))
        if st is not None and len(st.speeds) == 1 and st.active:
            expected = st.active * next(iter(st.speeds)) * 1e9
            ok = capacity is not None and abs(capacity - expected) <= CAPACITY_TOLERANCE * expected
            measured = _gbs(capacity) + (f" = {capacity / expected * st.active:.2f} links" if capacity else "")
            row = check(
                phase, g.index, "exported NVLink capacity", measured, f"{st.active} x link speed = {_gbs(expected)}", ok
            )
            rows.append(row if judge else info(phase, g.index, row.what, row.measured, row.expected))
        else:
            rows.append(
                info(phase, g.index, "exported NVLink capacity", _gbs(capacity), "no active NVLink per nvidia-smi")
            )
    for g in gpus:
        rows.append(_link_state_row(phase, samples, g, status.get(g.uuid), judge))
    if len(gpus) >= 2:
        a, b = gpus[0], gpus[1]
        cell = topo.get((f"GPU{a.index}", f"GPU{b.index}"))
        rows.append(info(phase, f"{a.index}-{b.index}", "nvidia-smi topo -m", cell or "no output"))
        for x, y in ((a, b), (b, a)):
            links = _value(samples, "gpulens_gpu_nvlink_peer_links", uuid=x.uuid, peer_uuid=y.uuid)
            measured = f"NV{links:.0f}" if links is not None else "no series (not joined by NVLink)"
            said_nv = cell if cell and cell.startswith("NV") else f"{cell or 'no output'} (no NVLink)"
            ok = (links is not None and cell == f"NV{links:.0f}") or (
                links is None and not (cell or "").startswith("NV")
            )
            what = f"exported topology to GPU {y.index} (gpulens_gpu_nvlink_peer_links)"
            row = check(phase, x.index, what, measured, said_nv, ok and bool(cell))
            rows.append(row if judge and cell else info(phase, x.index, what, measured, said_nv))
    return rows


def _link_state_row(phase: str, samples: Samples, g: Gpu, st: NvlinkStatus | None, judge: bool) -> Row:
    """The exported per-link states of GPU ``g`` (``gpulens_gpu_nvlink_link_active``) against
    ``nvidia-smi nvlink -s``: the same links, each active or inactive alike."""
    exported = {
        int(labels["link"]): value == 1
        for labels, value in samples.get("gpulens_gpu_nvlink_link_active", ())
        if labels.get("uuid") == g.uuid and labels.get("link", "").isdigit()
    }
    measured = f"{sum(exported.values())}/{len(exported)} links active" if exported else "no link series"
    what = "exported link count and per-link state"
    if st is None:
        return info(phase, g.index, what, measured, "nvidia-smi nvlink -s lists no links")
    said = {link: speed is not None for link, speed in st.links.items()}
    differ = sorted(link for link in set(said) | set(exported) if said.get(link) != exported.get(link))
    expected = f"{st.active}/{len(st.links)} links active"
    if differ:
        measured += f"; links differing: {differ}"
    row = check(phase, g.index, what, measured, expected, not differ)
    return row if judge else info(phase, g.index, what, measured, expected)


def evaluate_allreduce(run: PhaseRun, kind: str) -> list[Row]:
    """One all-reduce run: the ranks' own rate, the per-second classes, NVLink against what the
    ranks moved, and the checks of ``kind`` (bandwidth, latency, straggler, straggler-gemm, smoke)."""
    names = [f"rank{i}" for i in range(len(run.roles))]
    rows = loads_ran(run, names)
    seconds = steady(run)
    for i, g in enumerate(run.roles):
        r = _results(run, names[i])
        if r.get("seconds"):
            steps = r["steps"] / r["seconds"]
            algbw = r["message_bytes"] * steps
            world = r.get("world", len(run.roles))
            each_way = 2 * (world - 1) / world * algbw  # a ring all-reduce sends this much per rank
            tx = _median(column(seconds, g, "nvlink_tx"))
            ratio = f", exported NVLink tx {tx / each_way:.2f}x that" if tx is not None and each_way else ""
            rows.append(
                info(
                    run.name,
                    g.index,
                    f"rank {i}: steps/s, algorithm bandwidth",
                    f"{steps:.1f}/s, {_gbs(algbw)}; sends {_gbs(each_way)} each way{ratio}",
                )
            )
        cap = _median(column(seconds, g, "nvlink_capacity"))
        each = zip(column(seconds, g, "nvlink_tx"), column(seconds, g, "nvlink_rx"), strict=True)
        busier = _median(max(tx or 0.0, rx or 0.0) for tx, rx in each)
        if cap:
            rows.append(
                info(
                    run.name,
                    g.index,
                    "NVLink utilisation (steady median)",
                    f"{(busier or 0.0) / cap:.2%}",
                    f"evidence from {NVLINK_EVIDENCE_RATIO:.0%}",
                )
            )
    transports = nccl_transports(run.nccl_log)
    if run.nccl_log:
        rows.append(info(run.name, "-", "NCCL transport (its INFO log)", ", ".join(transports) or "none logged"))
    rows += per_second_rows(run, run.roles)
    rows += pod_memory_check(run, run.roles)
    if kind in ("bandwidth", "latency"):
        rows += [not_idle_check(run, g) for g in run.roles]
    elif kind in ("straggler", "straggler-gemm"):
        waiting = run.roles[0]
        rows.append(class_check(run, waiting, {COMMUNICATION}))
        rows.append(class_check(run, waiting, {COMMUNICATION}, pod=True))
        if kind == "straggler-gemm":
            rows.append(class_check(run, run.roles[-1], {"compute"}))
            rows.append(class_check(run, run.roles[-1], {"compute"}, pod=True))
    return rows


def evaluate_spin(run: PhaseRun) -> list[Row]:
    """24 spinning blocks on one GPU of the pod: latency, never communication."""
    gpu = run.roles[0]
    rows = loads_ran(run, [])
    rows += per_second_rows(run, run.roles)
    rows += pod_memory_check(run, run.roles)
    rows.append(class_check(run, gpu, {"latency"}, never={COMMUNICATION}))
    rows.append(class_check(run, gpu, {"latency"}, pod=True, never={COMMUNICATION}))
    return rows


def evaluate_gemm(run: PhaseRun) -> list[Row]:
    """A bf16 GEMM loop on one GPU: compute (GPU and pod)."""
    gpu = run.roles[0]
    rows = loads_ran(run, ["gemm"])
    r = _results(run, "gemm")
    if r:
        rows.append(info(run.name, gpu.index, "GEMM rate", f"{r['tflops']:.0f} TFLOP/s"))
    rows += per_second_rows(run, run.roles)
    rows += pod_memory_check(run, run.roles)
    rows.append(class_check(run, gpu, {"compute"}))
    rows.append(class_check(run, gpu, {"compute"}, pod=True))
    return rows


def evaluate_separation(run: PhaseRun, gpus: Sequence[Gpu]) -> list[Row]:
    """The copy loop on the last GPU alone: it shows the load, every other GPU stays quiet."""
    loaded = run.roles[0]
    rows = loads_ran(run, [])
    rows += per_second_rows(run, gpus)
    rows += pod_memory_check(run, [loaded])
    seconds = steady(run)
    for g in gpus:
        sm = column(seconds, g, "sm_active")
        procs = set(column(seconds, g, "processes"))
        if g == loaded:
            med = _median(sm)
            rows.append(
                check(run.name, g.index, "SM active (median)", _fmt(med), f"> {LOADED_SM}", (med or 0) > LOADED_SM)
            )
            rows.append(
                check(run.name, g.index, "compute processes", str(sorted(procs, key=str)), "{1}", procs == {1.0})
            )
            rows.append(class_check(run, g, {"memory"}))
            rows.append(class_check(run, g, {"memory"}, pod=True))
        else:
            top = max((v for v in sm if v is not None), default=None)
            rows.append(
                check(
                    run.name, g.index, "SM active (max)", _fmt(top), f"< {IDLE_SM}", top is not None and top < IDLE_SM
                )
            )
            rows.append(
                check(run.name, g.index, "compute processes", str(sorted(procs, key=str)), "{0}", procs == {0.0})
            )
            rows.append(class_check(run, g, {"idle"}))
            rows.append(class_check(run, g, {"idle"}, pod=True))
    return rows


def evaluate_chain(samples: Samples, pod_gpus: Sequence[Gpu]) -> list[Row]:
    """The attribution chain at the end: every stage read 1, and the kubelet's allocation of
    each of the pod's GPUs is exported with the pod."""
    stages = {lab.get("stage"): v for lab, v in samples.get("gpulens_stage_success", [])}
    failed = [s for s in CHAIN_STAGES if stages.get(s) != 1.0]
    held = {lab.get("uuid") for lab, _ in samples.get("gpulens_pod_gpu_allocation", []) if lab.get("pod") == POD}
    missing = [g.index for g in pod_gpus if g.uuid not in held]
    return [
        check(
            "chain",
            "-",
            "attribution stages",
            ", ".join(f"{s} {stages.get(s)}" for s in CHAIN_STAGES),
            "all 1",
            not failed,
        ),
        check(
            "chain",
            "-",
            f"{NAMESPACE}/{POD} allocations",
            f"GPUs {sorted(g.index for g in pod_gpus if g.uuid in held)}",
            f"GPUs {[g.index for g in pod_gpus]}",
            not missing,
        ),
    ]


def not_run_rows(phases: Iterable[str], why: str) -> list[Row]:
    return [Row(p, "-", "every check", "-", "-", f"NOT RUN: {why}") for p in phases]


def render(rows: Sequence[Row], title: str) -> str:
    """The table (markdown), with the class legend under it."""
    lines = [
        f"## {title}",
        "",
        "| phase | GPU | what | measured | expected | result |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r.phase, r.gpu, r.what, r.measured, r.expected, r.result]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    legend = ", ".join(f"`{v}` {k}" for k, v in CODES.items())
    failed = sum(1 for r in rows if r.result == "FAIL")
    passed = sum(1 for r in rows if r.result == "PASS")
    lines += [
        "",
        f"Per-second classes, one character a second, `|` where the steady seconds begin "
        f"({SETTLE_SECONDS:.0f} s): {legend}, `-` none.",
        "",
        f"{passed} PASS, {failed} FAIL.",
    ]
    return "\n".join(lines)


# --- the machine: nvidia-smi, the fakes, the loads ----------------------------------------------


def nvidia_smi(*args: str) -> str:
    """nvidia-smi's output ('' without a driver)."""
    try:
        done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60, check=False)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return ""
    return done.stdout + done.stderr


def compute_pids() -> list[int]:
    """PIDs of the GPUs' compute processes, as NVML lists them."""
    out = nvidia_smi("--query-compute-apps=pid", "--format=csv,noheader")
    return [int(x) for x in out.split() if x.isdigit()]


def place_pids(procfs: Path, pids: Iterable[int]) -> None:
    """Put ``pids`` in ``nccl-job/main`` (each file written whole, then renamed in place)."""
    for pid in pids:
        folder = procfs / str(pid)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / "cgroup.tmp"
        tmp.write_text(cgroup_line(POD_UID, CONTAINER_ID))
        os.replace(tmp, folder / "cgroup")


@dataclass
class Chain:
    """The running fakes: the exporter's flags and environment, and the procfs folder."""

    flags: tuple[str, ...]
    env: dict[str, str]
    procfs: Path


@contextmanager
def attribution_chain(uuids: Sequence[str], folder: Path) -> Iterator[Chain]:
    """A kubelet whose one pod ``ml/nccl-job`` holds ``uuids``, the API with that pod, and an
    empty procfs folder (``place_pids`` fills it)."""
    try:
        from tests.fakes import kubelet_server
    except ImportError as exc:
        raise SystemExit(
            f"cannot import the fake kubelet ({exc}): install the wheels in .whl/ (module docstring)"
        ) from exc
    with ExitStack() as stack:
        kubelet = stack.enter_context(kubelet_server.FakeKubelet())
        kubelet.pods = [kubelet_server.pod(NAMESPACE, POD, [(CONTAINER, [(GPU_RESOURCE, list(uuids))])])]
        kubelet.allocatable = [kubelet_server.devices(GPU_RESOURCE, list(uuids))]
        api = stack.enter_context(kube_api_server.KubeApiEmulator())
        api.put(kube_api_server.make_pod(POD, NAMESPACE, uid=POD_UID, node=NODE, containers={CONTAINER: CONTAINER_ID}))
        procfs = folder / "proc"
        procfs.mkdir(parents=True, exist_ok=True)
        flags = (
            "--kubernetes.podresources-socket",
            kubelet.socket_path,
            "--kubernetes.api",
            "--kubernetes.node-name",
            NODE,
            "--path.procfs",
            str(procfs),
        )
        yield Chain(flags, api_env(api, folder), procfs)


class Load:
    """A load process: its stdout lines read by a thread, its stderr into a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path, announces_ready: bool) -> None:
        self.name = name
        self.announces_ready = announces_ready
        self.log = log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def ready(self) -> bool:
        return not self.announces_ready or any(is_ready(line) for line in list(self.lines))

    def reports(self) -> list[dict[str, Any]]:
        out = []
        for line in list(self.lines):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
        return out

    def finish(self, timeout: float) -> int | None:
        """Wait for the exit (kill after ``timeout``); the exit code."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=5)
        return self.proc.returncode


@dataclass
class Runner:
    """Starts the loads of each phase and records the exporter meanwhile."""

    url: str
    gpus: list[Gpu]
    procfs: Path
    work: Path
    seconds: float
    settle: float
    gap: float
    sim: bool
    exporter: subprocess.Popen[bytes]
    loads_log: list[str] = field(default_factory=list)
    recorded: list[PhaseRun] = field(default_factory=list)
    live: list[Load] = field(default_factory=list)
    """Loads started and not yet collected (killed if a phase breaks)."""

    def spawn(
        self,
        phase: str,
        name: str,
        code: str,
        args: Sequence[str],
        visible: Sequence[Gpu],
        env: Mapping[str, str] | None = None,
        announces_ready: bool = True,
    ) -> Load:
        """Start one load on ``visible`` and put its PID in the pod at once."""
        full_env = {
            **os.environ,
            **MULTICAST_OFF,
            "PYTHONUNBUFFERED": "1",
            "CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in visible),
            **(env or {}),
        }
        duration = str(self.seconds + LOAD_MARGIN_SECONDS)
        argv = [sys.executable, "-c", STUB, duration] if self.sim else [sys.executable, "-c", code, duration, *args]
        load = Load(name, argv, full_env, self.work / f"{phase}-{name}.log", announces_ready or self.sim)
        self.live.append(load)
        place_pids(self.procfs, [load.proc.pid])
        return load

    def kill_live(self) -> None:
        """End every load not collected yet (a phase broke between starting and collecting them)."""
        for load in self.live:
            load.finish(0.0)
        self.live.clear()

    def record(self, phase: str, roles: list[Gpu], loads: list[Load], nccl_dir: Path | None = None) -> PhaseRun:
        """Wait until ``loads`` are ready, record ``seconds`` of scrapes, collect the loads."""
        run = PhaseRun(phase, roles, self.seconds, self.settle)
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not all(load.ready for load in loads):
            dead = [load.name for load in loads if load.proc.poll() is not None and not load.ready]
            if dead or time.monotonic() > deadline:
                run.error = f"loads {dead} exited before ready" if dead else "loads not ready in time"
                break
            time.sleep(0.2)
        if run.error is None:
            place_pids(self.procfs, compute_pids())  # where NVML's PIDs are not the spawned ones
            run.started_at = time.time()
            start = time.monotonic()
            tick = start
            while time.monotonic() - start < self.seconds:
                if self.exporter.poll() is not None:
                    run.error = f"the exporter exited ({self.exporter.returncode})"
                    break
                t = time.monotonic() - start
                try:
                    run.last = parse_exposition(fetch(self.url))
                    run.seconds.append(second_of(run.last, self.gpus, t))
                except OSError as exc:
                    run.seconds.append(Second(round(t, 2), {}))
                    self.loads_log.append(f"[{phase}] scrape at {t:.1f} s failed: {exc}")
                tick += 1.0
                time.sleep(max(0.0, tick - time.monotonic()))
        for load in loads:
            wait = LOAD_MARGIN_SECONDS + 60.0 if run.error is None else 0.0
            run.exit_codes[load.name] = load.finish(wait)
            self.live.remove(load)
            run.reports[load.name] = load.reports()
            self.loads_log.append(f"===== {phase} / {load.name}: exit {run.exit_codes[load.name]}\n")
            self.loads_log.append(load.log.read_text(errors="replace")[-20000:])
        if nccl_dir is not None:
            run.nccl_log = "".join(p.read_text(errors="replace") for p in sorted(nccl_dir.glob("nccl.*")))
            self.loads_log.append(f"===== {phase} / NCCL INFO log\n{run.nccl_log[-20000:]}")
        self.recorded.append(run)
        time.sleep(self.gap)
        return run

    # the phases

    def copy(self, phase: str, src: Gpu, dst: Gpu) -> PhaseRun:
        visible = [src] if src == dst else [src, dst]
        d = 0 if src == dst else 1
        load = self.spawn(phase, "copy", PEER_COPY, [str(COPY_BYTES), "0", str(d)], visible)
        return self.record(phase, [src, dst], [load])

    def allreduce(self, phase: str, ranks: list[Gpu], nbytes: int, lag: float, work: str, every: int) -> PhaseRun:
        port = free_port()
        nccl_dir = self.work / f"{phase}-nccl"
        nccl_dir.mkdir(exist_ok=True)
        loads = []
        for rank in range(len(ranks)):
            env = {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(len(ranks)),
                "NCCL_DEBUG": "INFO",
                "NCCL_DEBUG_FILE": str(nccl_dir / "nccl.%h.%p.log"),
            }
            args = [str(nbytes), str(lag), work, str(every)]
            loads.append(self.spawn(phase, f"rank{rank}", ALLREDUCE_RANK, args, ranks, env))
        return self.record(phase, ranks, loads, nccl_dir)

    def spin(self, phase: str, gpu: Gpu) -> PhaseRun:
        return self.record(phase, [gpu], [self.spawn(phase, "spin", SPIN, [], [gpu])])

    def gemm(self, phase: str, gpu: Gpu) -> PhaseRun:
        return self.record(phase, [gpu], [self.spawn(phase, "gemm", GEMM, [], [gpu])])

    def separation(self, phase: str, gpu: Gpu) -> PhaseRun:
        load = self.spawn(phase, "copy_loop", COPY_LOAD, [], [gpu], announces_ready=False)
        return self.record(phase, [gpu], [load])


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def wait_for_exporter(url: str, gpus: int, exporter: subprocess.Popen[bytes], timeout: float = 60.0) -> Samples:
    """Until the exporter lists ``gpus`` GPUs and every chain stage reads 1 (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    samples: Samples = {}
    while time.monotonic() < deadline and exporter.poll() is None:
        try:
            samples = parse_exposition(fetch(url))
        except OSError:
            samples = {}
        stages = {lab.get("stage"): v for lab, v in samples.get("gpulens_stage_success", [])}
        if len(exporter_gpus(samples)) >= gpus and all(stages.get(s) == 1.0 for s in CHAIN_STAGES):
            return samples
        time.sleep(0.5)
    return samples


def plan(wanted: Sequence[str], gpus: int) -> tuple[list[str], list[str]]:
    """(phases to run, in order; two-GPU phases not run for want of GPUs)."""
    runnable, skipped = [], []
    for p in wanted:
        if gpus < 2 and p in TWO_GPU_PHASES:
            skipped.append(p)
        else:
            runnable.append(p)
    return runnable, skipped


def run_phase(runner: Runner, phase: str, pair: list[Gpu], nvlink_text: str, topo_text: str) -> list[Row]:
    """Run ``phase`` on ``pair`` (the first two GPUs; the first alone with one GPU) and judge it."""
    first = pair[0]
    if phase == "nvlink-copy":
        run = runner.copy(phase, first, pair[1])
        return evaluate_copy(run) + evaluate_links(phase, run.last, nvlink_text, topo_text, pair)
    if phase == "copy-smoke":
        return evaluate_copy(runner.copy(phase, first, first), smoke=True)
    if phase == "allreduce-bandwidth":
        return evaluate_allreduce(
            runner.allreduce(phase, pair, BANDWIDTH_BYTES, 0.0, "none", CHECK_EVERY["bandwidth"]), "bandwidth"
        )
    if phase == "allreduce-latency":
        return evaluate_allreduce(
            runner.allreduce(phase, pair, LATENCY_BYTES, 0.0, "none", CHECK_EVERY["latency"]), "latency"
        )
    if phase == "allreduce-straggler":
        run = runner.allreduce(phase, pair, STRAGGLER_BYTES, STRAGGLER_SLEEP_SECONDS, "sleep", CHECK_EVERY["straggler"])
        return evaluate_allreduce(run, "straggler")
    if phase == "allreduce-straggler-gemm":
        run = runner.allreduce(
            phase, pair, GEMM_STRAGGLER_BYTES, STRAGGLER_SLEEP_SECONDS, "gemm", CHECK_EVERY["straggler"]
        )
        return evaluate_allreduce(run, "straggler-gemm")
    if phase == "allreduce-smoke":  # one rank, the GEMM-straggler path: the rank code runs end to end
        return evaluate_allreduce(
            runner.allreduce(phase, [first], BANDWIDTH_BYTES, 0.2, "gemm", CHECK_EVERY["straggler"]), "smoke"
        )
    if phase == "spin":
        return evaluate_spin(runner.spin(phase, first))
    if phase == "gemm":
        return [row for g in pair for row in evaluate_gemm(runner.gemm(f"gemm-gpu{g.index}", g))]
    if phase == "separation":
        return evaluate_separation(runner.separation(phase, runner.gpus[-1]), runner.gpus)
    raise ValueError(f"unknown phase {phase!r}")


def run_phases(runner: Runner, phases: Sequence[str], pair: list[Gpu], nvlink_text: str, topo_text: str) -> list[Row]:
    """Every phase in turn, each judged as it ends; a phase that breaks is a FAIL row, its loads
    ended, and the next phase runs."""
    rows: list[Row] = []
    for phase in phases:
        print(f"[gpu_nccl] phase {phase} ({runner.seconds:.0f} s recorded)", flush=True)
        try:
            rows += run_phase(runner, phase, pair, nvlink_text, topo_text)
        except Exception as exc:  # one phase's breakage must not lose the other phases' results
            runner.kill_live()
            rows.append(check(phase, "-", "phase ran", f"{type(exc).__name__}: {exc}", "no error", False))
        if runner.exporter.poll() is not None:
            rows.append(check(phase, "-", "exporter alive", f"exited {runner.exporter.returncode}", "running", False))
            break
    return rows


def _phase_list(text: str) -> list[str]:
    names = [p for p in text.split(",") if p]
    unknown = [p for p in names if p not in ALL_PHASES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown phases {unknown}; known: {', '.join(ALL_PHASES)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--dry-run-one-gpu", action="store_true", help="run what one GPU allows (GPU 0 only)")
    parser.add_argument("--dry-run-sim", metavar="SCENARIO", default=None, help="no GPU: --backend sim, stub loads")
    parser.add_argument(
        "--phases", type=_phase_list, default=None, help=f"comma-separated among {', '.join(ALL_PHASES)}"
    )
    parser.add_argument("--phase-seconds", type=float, default=30.0, help="seconds recorded per phase")
    parser.add_argument("--settle-seconds", type=float, default=SETTLE_SECONDS, help="first seconds not judged")
    parser.add_argument("--gap-seconds", type=float, default=3.0, help="pause between phases")
    parser.add_argument("--port", type=int, default=9449)
    args = parser.parse_args(argv)
    if args.phase_seconds < args.settle_seconds + MIN_STEADY_SECONDS:
        parser.error(f"--phase-seconds must leave {MIN_STEADY_SECONDS} steady seconds past --settle-seconds")
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.update(MULTICAST_OFF)  # every process this script starts inherits it

    sim_pids: list[int] = []
    if args.dry_run_sim:
        from exporter.sim import scenarios

        sim = scenarios.build(args.dry_run_sim)
        uuids, sim_pids = [g.uuid for g in sim.gpus], sorted(sim.pid_owners)
        nvlink_text = topo_text = ""
    else:
        uuids = parse_gpu_list(nvidia_smi("-L"))
        nvlink_text, topo_text = nvidia_smi("nvlink", "-s"), nvidia_smi("topo", "-m")
        if not uuids:
            raise SystemExit("nvidia-smi -L lists no GPU (use --dry-run-sim SCENARIO on a machine without one)")
    one_gpu = args.dry_run_one_gpu or len(uuids) < 2
    pod_uuids = uuids[:1] if one_gpu else uuids
    wanted = args.phases or list(DEFAULT_ONE if one_gpu else DEFAULT_TWO)
    phases, skipped = plan(wanted, 1 if one_gpu else len(uuids))
    mode = "one GPU (dry run)" if one_gpu else f"{len(uuids)} GPUs"
    if args.dry_run_sim:
        mode += f", SIMULATED ({args.dry_run_sim}, stub loads: verdicts mean nothing)"
    print(f"[gpu_nccl] {mode}; phases: {', '.join(phases)}; not run: {', '.join(skipped) or 'none'}", flush=True)

    url = f"http://127.0.0.1:{args.port}/metrics"
    rows: list[Row] = []
    backend = ["--backend", "sim", "--sim.scenario", args.dry_run_sim] if args.dry_run_sim else ["--backend", "nvml"]
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpulens-nccl-")))
        chain = stack.enter_context(attribution_chain(pod_uuids, tmp))
        place_pids(chain.procfs, sim_pids)
        command = [
            sys.executable,
            "-m",
            "exporter",
            *backend,
            "--collect.interval",
            "1",
            "--no-probes",
            "--web.listen-address",
            f"127.0.0.1:{args.port}",
            *chain.flags,
        ]
        ready_url = f"http://127.0.0.1:{args.port}/readyz"
        exporter = stack.enter_context(
            managed_process(command, ready_url, log=args.out / "exporter.log", env=chain.env)
        )
        start = wait_for_exporter(url, len(uuids), exporter)
        by_uuid = {g.uuid: g for g in exporter_gpus(start)}
        if sorted(by_uuid) != sorted(uuids):
            raise SystemExit(f"the exporter lists GPUs {sorted(by_uuid)}, nvidia-smi {sorted(uuids)}")
        pair = sorted((by_uuid[u] for u in uuids[: 1 if one_gpu else 2]), key=lambda g: int(g.index))
        (tmp / "loads").mkdir()
        runner = Runner(
            url,
            exporter_gpus(start),
            chain.procfs,
            tmp / "loads",
            args.phase_seconds,
            args.settle_seconds,
            args.gap_seconds,
            bool(args.dry_run_sim),
            exporter,
        )
        stack.callback(runner.kill_live)  # loads never outlive the script, whatever breaks
        if one_gpu:
            rows += evaluate_links("links", start, nvlink_text, topo_text, pair, judge=False)
        rows += run_phases(runner, phases, pair, nvlink_text, topo_text)
        rows += not_run_rows(skipped, "needs 2 GPUs")
        try:
            last_text = fetch(url)
        except OSError:
            last_text = ""
        rows += evaluate_chain(parse_exposition(last_text), [by_uuid[u] for u in pod_uuids])

    title = f"gpulens on {mode}: NVLink, NCCL collectives and the communication class (issue 31)"
    text = render(rows, title)
    print(text)
    (args.out / "gpu_nccl.md").write_text(text + "\n")
    (args.out / "loads.log").write_text("\n".join(runner.loads_log))
    (args.out / "metrics_last.txt").write_text(last_text)
    report = {
        "mode": mode,
        "argv": sys.argv,
        "phases": phases,
        "not_run": skipped,
        "pod": {"namespace": NAMESPACE, "pod": POD, "container": CONTAINER, "gpus": pod_uuids},
        "constants": {
            "settle_seconds": args.settle_seconds,
            "class_share": CLASS_SHARE,
            "copy_tolerance": COPY_TOLERANCE,
            "capacity_tolerance": CAPACITY_TOLERANCE,
            "nvlink_evidence_ratio": NVLINK_EVIDENCE_RATIO,
            "hold_seconds": HOLD_SECONDS,
            "copy_bytes": COPY_BYTES,
            "bandwidth_bytes": BANDWIDTH_BYTES,
            "latency_bytes": LATENCY_BYTES,
            "straggler_bytes": STRAGGLER_BYTES,
            "gemm_straggler_bytes": GEMM_STRAGGLER_BYTES,
            "straggler_sleep_seconds": STRAGGLER_SLEEP_SECONDS,
        },
        "nvidia_smi": {"nvlink_s": nvlink_text, "topo_m": topo_text},
        "runs": [{k: v for k, v in asdict(r).items() if k not in ("last", "nccl_log")} for r in runner.recorded],
        "rows": [asdict(r) for r in rows],
    }
    (args.out / "gpu_nccl.json").write_text(json.dumps(report, indent=1))
    return 1 if any(r.result == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
