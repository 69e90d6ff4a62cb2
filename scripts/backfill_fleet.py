"""Write an OpenMetrics file of a simulated GPU fleet's history, for Prometheus backfilling.

``promtool tsdb create-blocks-from openmetrics FILE DIR`` turns it into TSDB blocks; a Prometheus
started on DIR then serves the history (the dashboard's scale test and bench/dashboard_scale.py).
Series and labels are the exporter's (exporter.metrics) plus the target labels Prometheus would
add (instance, job, cluster, node). Deterministic for a seed; the last sample is at ``--end``.

    python scripts/backfill_fleet.py --gpus 1000 --nodes 125 --hours 24 --out fleet.om
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from typing import TextIO

import numpy as np

from dashboard.openmetrics import OpenMetricsHistory
from exporter.model import BOUNDNESS_CLASSES

NAMESPACES = ("ml-training", "inference", "research", "notebooks", "batch")
KINDS = ("compute", "memory", "latency", "idle_held", "launch", "free", "mixed")
KIND_WEIGHTS = (0.30, 0.15, 0.15, 0.12, 0.05, 0.20, 0.03)
CLASSES = BOUNDNESS_CLASSES


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


def make_fleet(gpus: int, nodes: int, seed: int, clusters: int = 2) -> list[Gpu]:
    """``gpus`` GPUs on ``nodes`` nodes, the nodes split evenly over ``clusters`` clusters
    (prod-a, prod-b, ...)."""
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
    return fleet


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


def write_openmetrics(
    out: TextIO, gpus: int, nodes: int, hours: float, interval_s: float, end: float, seed: int, clusters: int = 2
) -> int:
    """Write the fleet's history; return the number of samples written."""
    fleet = make_fleet(gpus, nodes, seed, clusters)
    steps = int(hours * 3600 // interval_s) + 1
    t = end - interval_s * np.arange(steps - 1, -1, -1, dtype=float)
    stamps = [f"{x:.0f}" for x in t]
    rng = np.random.default_rng(seed + 1)
    acts = [activity(g, t, rng) for g in fleet]
    classes = [boundness(a["sm"], a["util"], a["dram"], a["pipe"]) for a in acts]
    history = OpenMetricsHistory(out)

    def target(g: Gpu) -> dict[str, str]:
        return {
            "cluster": g.cluster,
            "instance": f"node-{g.node:03d}:9445",
            "job": "gpulens",
            "node": f"node-{g.node:03d}",
        }

    for node in sorted({(g.cluster, g.node) for g in fleet}):
        first = next(g for g in fleet if g.node == node[1])
        history.series("gpulens_up", target(first), ["1"] * steps, stamps)
    for g in fleet:
        info = {**target(g), "gpu": str(g.index), "uuid": g.uuid, "name": "NVIDIA H200", "mig_mode": "disabled"}
        history.series("gpulens_gpu_info", {**info, "driver_version": "580.159.04"}, ["1"] * steps, stamps)
    for name, key in (
        ("gpulens_gpu_sm_active_ratio", "sm"),
        ("gpulens_gpu_utilization_ratio", "util"),
        ("gpulens_gpu_dram_active_ratio", "dram"),
        ("gpulens_gpu_pipe_active_max_ratio", "pipe"),
    ):
        for g, a in zip(fleet, acts, strict=True):
            labels = {**target(g), "gpu": str(g.index), "uuid": g.uuid}
            history.series(name, labels, [f"{v:.4g}" for v in a[key]], stamps)
    for g, cls in zip(fleet, classes, strict=True):
        for ci, cname in enumerate(CLASSES):
            values = ["1" if c == ci else "0" for c in cls]
            labels = {**target(g), "class": cname, "gpu": str(g.index), "uuid": g.uuid}
            history.series("gpulens_gpu_boundness", labels, values, stamps)
    for g, a in zip(fleet, acts, strict=True):
        if not g.namespace:
            continue
        last = int(a["held"].nonzero()[0].max()) + 1
        labels = {
            **target(g),
            "container": "main",
            "namespace": g.namespace,
            "pod": f"{g.workload}-{g.index}",
            "resource": "nvidia.com/gpu",
            "uuid": g.uuid,
            "workload": g.workload,
            "workload_kind": g.workload_kind,
        }
        history.series("gpulens_pod_gpu_allocation", labels, ["1"] * last + [None] * (steps - last), stamps)
    return history.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=1000)
    p.add_argument("--nodes", type=int, default=125)
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--interval", type=float, default=120.0, help="seconds between samples (<= 300 for instant queries)")
    p.add_argument("--end", type=float, default=None, help="Unix time of the last sample (default: now)")
    p.add_argument("--clusters", type=int, default=2, help="clusters the nodes are split over (prod-a, prod-b, ...)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", required=True, help="OpenMetrics file to write ('-' = stdout)")
    a = p.parse_args(argv)
    end = float(int(a.end if a.end is not None else time.time()))
    started = time.perf_counter()
    with open(a.out, "w") if a.out != "-" else sys.stdout as out:
        n = write_openmetrics(out, a.gpus, a.nodes, a.hours, a.interval, end, a.seed, a.clusters)
    print(
        f"{n} samples, {a.gpus} GPUs on {a.nodes} nodes in {a.clusters} clusters, {a.hours:g} h every {a.interval:g} s "
        f"in {time.perf_counter() - started:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
