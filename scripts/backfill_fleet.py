"""Write a simulated GPU fleet's history: OpenMetrics for Prometheus backfilling, or the same samples
in VictoriaMetrics' native import format.

``promtool tsdb create-blocks-from openmetrics FILE DIR`` turns the OpenMetrics file into TSDB blocks;
a Prometheus started on DIR then serves the history (the dashboard's scale test and
bench/dashboard_scale.py). ``--format vm-json`` writes one JSON line per series for
VictoriaMetrics' ``/api/v1/import`` (tests/support/victoriametrics.py:import_json_stream): about a
tenth of the text, and no per-sample parsing on our side (bench/fleet_scale.py streams it).
Series and labels are the exporter's (exporter.render.metrics) plus the target labels Prometheus would
add (instance, job, cluster, node). Deterministic for a seed; the last sample is at ``--end``.

    python scripts/backfill_fleet.py --gpus 1000 --nodes 125 --hours 24 --out fleet.om
    python scripts/backfill_fleet.py --gpus 1000 --nodes 125 --hours 24 --format vm-json --out - | ...
    python scripts/backfill_fleet.py --gpus 10000 --nodes 1250 --jobs 500 --hours 2 --out fleet.om

``--jobs N`` groups the held GPUs into N multi-node jobs (consecutive GPUs, so a job of 20 GPUs spans
three nodes), each of one namespace, owner kind and workload: computing, memory-bound, or waiting in
collectives (class ``communication``), a twentieth of them with a straggler (one GPU computing while
its peers wait); and adds what the jobs rules read: the pods' own classes
(``gpulens_pod_gpu_boundness``), the busy ratio and memory used and total.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, TextIO

import numpy as np

from dashboard.sources.openmetrics import TARGET_LABELS, OpenMetricsHistory
from exporter.model import BOUNDNESS_CLASSES
from exporter.render.metrics import spec

NAMESPACES = ("ml-training", "inference", "research", "notebooks", "batch")
KINDS = ("compute", "memory", "latency", "idle_held", "launch", "free", "mixed")
KIND_WEIGHTS = (0.30, 0.15, 0.15, 0.12, 0.05, 0.20, 0.03)
CLASSES = BOUNDNESS_CLASSES
JOB_KINDS = ("PyTorchJob", "JobSet", "MPIJob", "Job", "LeaderWorkerSet", "Deployment")
"""Owner kinds the ``--jobs`` fleet's jobs have (the top of each pod's owner chain)."""
JOB_ACTIVITY = ("compute", "compute", "memory", "communication")
"""What a job's GPUs do (``--jobs``): each job draws one."""
STRAGGLER_EVERY = 20
"""One job in this many (``--jobs``) has a straggler: its first GPU computes while the others wait."""
H200_MEMORY_BYTES = 150_754_820_096


@dataclass(frozen=True)
class Gpu:
    node: int
    index: int
    uuid: str
    cluster: str
    kind: str
    namespace: str
    workload: str
    workload_kind: str
    ends_at: float
    """Fraction of the window after which the pod is gone (1.0 = held to the end)."""


def make_fleet(gpus: int, nodes: int, seed: int, clusters: int = 2, jobs: int = 0) -> list[Gpu]:
    """``gpus`` GPUs on ``nodes`` nodes, the nodes split evenly over ``clusters`` clusters
    (prod-a, prod-b, ...); with ``jobs``, the held GPUs grouped into that many multi-node jobs."""
    rng = np.random.default_rng(seed)
    per_node = math.ceil(gpus / nodes)
    fleet = []
    for i in range(gpus):
        node, index = divmod(i, per_node)
        kind = str(rng.choice(KINDS, p=KIND_WEIGHTS))
        ns = {"idle_held": "notebooks", "launch": "inference", "free": ""}.get(kind, str(rng.choice(NAMESPACES)))
        wk = {"ml-training": "Job", "batch": "Job", "notebooks": "StatefulSet"}.get(ns, "Deployment")
        fleet.append(
            Gpu(
                node=node,
                index=index,
                uuid=f"GPU-{seed:04x}{i:04x}-5eed-4a11-9000-{i:012x}",
                cluster=f"prod-{chr(ord('a') + node * clusters // nodes)}",
                kind=kind,
                namespace=ns,
                workload=f"{ns[:5]}-{kind[:4]}-{i // 4:03d}" if ns else "",
                workload_kind=wk if ns else "",
                ends_at=0.5 if kind == "compute" and rng.random() < 0.1 else 1.0,
            )
        )
    return group_into_jobs(fleet, jobs, seed) if jobs else fleet


def group_into_jobs(fleet: list[Gpu], jobs: int, seed: int) -> list[Gpu]:
    """The fleet with its held GPUs (every kind but ``free``) grouped into ``jobs`` jobs of
    consecutive GPUs: one namespace, owner and activity per job (``JOB_ACTIVITY``; the first GPU of
    every ``STRAGGLER_EVERY``-th job computes while its peers wait: ``communication``), held to the end."""
    held = [i for i, g in enumerate(fleet) if g.kind != "free"]
    rng = np.random.default_rng(seed + 2)
    plans = [
        (str(rng.choice(NAMESPACES)), JOB_KINDS[j % len(JOB_KINDS)], JOB_ACTIVITY[int(rng.integers(len(JOB_ACTIVITY)))])
        for j in range(jobs)
    ]
    out = list(fleet)
    first: dict[int, int] = {}
    for rank, i in enumerate(held):
        j = rank * jobs // len(held)
        ns, owner, kind = plans[j]
        if j % STRAGGLER_EVERY == STRAGGLER_EVERY - 1:
            kind = "compute" if j not in first else "communication"
        first.setdefault(j, i)
        g = fleet[i]
        out[i] = Gpu(g.node, g.index, g.uuid, g.cluster, kind, ns, f"{owner.lower()}-{j:04d}", owner, 1.0)
    return out


def activity(g: Gpu, t: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Ratios (0..1) over time for one GPU: sm, util, dram, pipe."""
    n = len(t)
    phase = 2 * math.pi * (t / 86400.0) + g.node
    diurnal = 0.7 + 0.3 * np.sin(phase)
    noise = rng.normal(0, 0.03, n)
    held = t <= t[0] + g.ends_at * (t[-1] - t[0])
    base = {
        "compute": (0.95, 0.99, 0.18, 0.85),
        "memory": (0.97, 1.0, 0.82, 0.05),
        "latency": (0.35, 0.6, 0.12, 0.08),
        "mixed": (0.97, 1.0, 0.6, 0.6),
        "communication": (0.18, 1.0, 0.01, 0.0),  # spinning in a collective (NCCL's blocks)
        "launch": (0.0003, 0.25, 0.0, 0.0),
        "idle_held": (0.0, 0.0, 0.0, 0.0),
        "free": (0.0, 0.0, 0.0, 0.0),
    }[g.kind]
    scale = diurnal if g.kind == "latency" else np.ones(n)
    sm, util, dram, pipe = (np.clip(b * scale + (noise if b > 0.01 else 0), 0, 1) * held for b in base)
    return {"sm": sm, "util": util, "dram": dram, "pipe": pipe, "held": held.astype(float)}


def boundness(sm: np.ndarray, util: np.ndarray, dram: np.ndarray, pipe: np.ndarray) -> np.ndarray:
    """Class index per step, with the exporter's rule of thumb (docs/boundness.md)."""
    cls = np.full(len(sm), CLASSES.index("latency"))
    cls[(dram >= 0.5) & (pipe < 0.5)] = CLASSES.index("memory")
    cls[(pipe >= 0.5) & (dram < 0.5)] = CLASSES.index("compute")
    cls[(pipe >= 0.5) & (dram >= 0.5)] = CLASSES.index("mixed")
    cls[(util >= 0.05) & (sm < 0.05)] = CLASSES.index("launch")
    cls[(util < 0.01) & (sm < 0.01)] = CLASSES.index("idle")
    return cls


Series = tuple[str, dict[str, str], list[str | None]]
"""One series of the history: metric name, labels (target labels included), formatted values
(``None`` = no sample at that step)."""


def fleet_series(
    gpus: int, nodes: int, hours: float, interval_s: float, end: float, seed: int, clusters: int = 2, jobs: int = 0
) -> tuple[list[str], Iterator[Series]]:
    """The fleet's history: the Unix times (s, formatted) of every step, and every series, one
    metric's series together (as OpenMetrics wants them). Both writers below read this one
    stream, so the OpenMetrics file and the VictoriaMetrics import hold the same samples."""
    fleet = make_fleet(gpus, nodes, seed, clusters, jobs)
    steps = int(hours * 3600 // interval_s) + 1
    t = end - interval_s * np.arange(steps - 1, -1, -1, dtype=float)
    stamps = [f"{x:.0f}" for x in t]
    rng = np.random.default_rng(seed + 1)
    acts = [activity(g, t, rng) for g in fleet]

    def target(g: Gpu) -> dict[str, str]:
        return {
            "cluster": g.cluster,
            "instance": f"node-{g.node:03d}:9445",
            "job": "gpulens",
            "node": f"node-{g.node:03d}",
        }

    def series() -> Iterator[Series]:
        ones: list[str | None] = ["1"] * steps
        for node in sorted({(g.cluster, g.node) for g in fleet}):
            first = next(g for g in fleet if g.node == node[1])
            yield "gpulens_up", target(first), ones
        for g in fleet:
            info = {**target(g), "gpu": str(g.index), "uuid": g.uuid, "name": "NVIDIA H200", "mig_mode": "disabled"}
            yield "gpulens_gpu_info", {**info, "driver_version": "580.159.04"}, ones
        for name, key in (
            ("gpulens_gpu_sm_active_ratio", "sm"),
            ("gpulens_gpu_utilization_ratio", "util"),
            ("gpulens_gpu_dram_active_ratio", "dram"),
            ("gpulens_gpu_pipe_active_max_ratio", "pipe"),
        ):
            for g, a in zip(fleet, acts, strict=True):
                yield name, {**target(g), "gpu": str(g.index), "uuid": g.uuid}, [f"{v:.4g}" for v in a[key]]
        classes = []
        for g, a in zip(fleet, acts, strict=True):
            cls = boundness(a["sm"], a["util"], a["dram"], a["pipe"])
            if g.kind == "communication":
                cls[cls == CLASSES.index("latency")] = CLASSES.index("communication")
            classes.append(cls)
            for ci, cname in enumerate(CLASSES):
                values: list[str | None] = np.where(cls == ci, "1", "0").tolist()
                labels = {**target(g), "class": cname, "gpu": str(g.index), "uuid": g.uuid}
                yield "gpulens_gpu_boundness", labels, values
        if jobs:
            yield from job_series(fleet, acts, classes, target, steps)
        for g, a in zip(fleet, acts, strict=True):
            if not g.namespace:
                continue
            last = int(a["held"].nonzero()[0].max()) + 1
            labels = {
                **target(g),
                "container": "main",
                "namespace": g.namespace,
                "pod": f"{g.workload}-{g.node}" if jobs else f"{g.workload}-{g.index}",
                "resource": "nvidia.com/gpu",
                "uuid": g.uuid,
                "workload": g.workload,
                "workload_kind": g.workload_kind,
            }
            yield "gpulens_pod_gpu_allocation", labels, ["1"] * last + [None] * (steps - last)

    return stamps, series()


def job_series(
    fleet: list[Gpu],
    acts: list[dict[str, np.ndarray]],
    classes: list[np.ndarray],
    target: Callable[[Gpu], dict[str, str]],
    steps: int,
) -> Iterator[Series]:
    """What the jobs rules read besides the allocation (``--jobs``): each held GPU's busy ratio
    (GPU-Util's series), memory used and total, and its pod's own class (the GPU's)."""
    ones: list[str | None] = [f"{H200_MEMORY_BYTES}"] * steps
    for g, a in zip(fleet, acts, strict=True):
        yield (
            "gpulens_gpu_busy_ratio",
            {**target(g), "gpu": str(g.index), "uuid": g.uuid},
            [f"{v:.4g}" for v in a["util"]],
        )
    for g in fleet:
        yield "gpulens_gpu_memory_total_bytes", {**target(g), "gpu": str(g.index), "uuid": g.uuid}, ones
    for g, a in zip(fleet, acts, strict=True):
        used = (0.25 + 0.6 * (g.node % 3) / 2) * H200_MEMORY_BYTES if g.namespace else 0.0
        yield (
            "gpulens_gpu_memory_used_bytes",
            {**target(g), "gpu": str(g.index), "uuid": g.uuid},
            [f"{used * h:.0f}" for h in a["held"]],
        )
    for g, cls in zip(fleet, classes, strict=True):
        if not g.namespace:
            continue
        pod = {
            **target(g),
            "namespace": g.namespace,
            "pod": f"{g.workload}-{g.node}",
            "container": "main",
            "uuid": g.uuid,
        }
        for ci, cname in enumerate(CLASSES):
            yield "gpulens_pod_gpu_boundness", {**pod, "class": cname}, np.where(cls == ci, "1", "0").tolist()


def write_openmetrics(
    out: TextIO,
    gpus: int,
    nodes: int,
    hours: float,
    interval_s: float,
    end: float,
    seed: int,
    clusters: int = 2,
    jobs: int = 0,
) -> int:
    """Write the fleet's history as OpenMetrics (for promtool); return the number of samples written."""
    stamps, series = fleet_series(gpus, nodes, hours, interval_s, end, seed, clusters, jobs)
    history = OpenMetricsHistory(out)
    for name, labels, values in series:
        history.series(name, labels, values, stamps)
    return history.close()


def write_vm_json(
    out: BinaryIO,
    gpus: int,
    nodes: int,
    hours: float,
    interval_s: float,
    end: float,
    seed: int,
    clusters: int = 2,
    jobs: int = 0,
) -> int:
    """Write the same history as :func:`write_openmetrics` in VictoriaMetrics' native import format
    (``/api/v1/import``): one JSON line per series with its values and its timestamps in
    milliseconds; return the number of samples written. Values keep their OpenMetrics text, so the
    stored floats are the same; labels with an empty value are left out, as in OpenMetrics."""
    stamps, series = fleet_series(gpus, nodes, hours, interval_s, end, seed, clusters, jobs)
    millis = [f"{s}000" for s in stamps]
    all_millis = ",".join(millis)
    checked: set[str] = set()
    samples = 0
    for name, labels, values in series:
        if name not in checked:
            check_labels(name, labels)
            checked.add(name)
        metric = json.dumps({"__name__": name, **{k: v for k, v in sorted(labels.items()) if v}})
        kept = [i for i, v in enumerate(values) if v is not None]
        if len(kept) == len(values):
            vals, times = ",".join(v for v in values if v is not None), all_millis
        else:
            vals, times = ",".join(str(values[i]) for i in kept), ",".join(millis[i] for i in kept)
        out.write(f'{{"metric":{metric},"values":[{vals}],"timestamps":[{times}]}}\n'.encode())
        samples += len(kept)
    return samples


def check_labels(name: str, labels: dict[str, str]) -> None:
    """Refuse a metric or label the exporter does not export (the OpenMetrics writer's check)."""
    unknown = set(labels) - set(spec(name).labels) - TARGET_LABELS
    if unknown:
        raise ValueError(f"{name} has no label {sorted(unknown)}; its labels are {spec(name).labels}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=1000)
    p.add_argument("--nodes", type=int, default=125)
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--interval", type=float, default=120.0, help="seconds between samples (<= 300 for instant queries)")
    p.add_argument("--end", type=float, default=None, help="Unix time of the last sample (default: now)")
    p.add_argument("--clusters", type=int, default=2, help="clusters the nodes are split over (prod-a, prod-b, ...)")
    p.add_argument("--jobs", type=int, default=0, help="group the held GPUs into this many multi-node jobs")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", required=True, help="file to write ('-' = stdout)")
    p.add_argument(
        "--format",
        choices=("openmetrics", "vm-json"),
        default="openmetrics",
        help="openmetrics (promtool's backfill) or vm-json (VictoriaMetrics' /api/v1/import)",
    )
    a = p.parse_args(argv)
    end = float(int(a.end if a.end is not None else time.time()))
    started = time.perf_counter()
    args = (a.gpus, a.nodes, a.hours, a.interval, end, a.seed, a.clusters, a.jobs)
    if a.format == "openmetrics":
        with open(a.out, "w") if a.out != "-" else sys.stdout as out:
            n = write_openmetrics(out, *args)
    else:
        with open(a.out, "wb") if a.out != "-" else sys.stdout.buffer as bout:
            n = write_vm_json(bout, *args)
    print(
        f"{n} samples, {a.gpus} GPUs on {a.nodes} nodes in {a.clusters} clusters, {a.hours:g} h every {a.interval:g} s "
        f"in {time.perf_counter() - started:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
