"""Writes an OpenMetrics history of known workloads, for backfilling a Prometheus that the
advisor's tests and demo read (``promtool tsdb create-blocks-from openmetrics FILE DIR``).

Each simulated workload is built to get one recommendation (see WORKLOADS); series and labels are
the exporter's plus the target labels Prometheus adds (instance, job, node). Deterministic.

    python -m dashboard.advisor.backfill --days 7 --out advisor.om
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

import numpy as np

from dashboard.sources.openmetrics import OpenMetricsHistory
from exporter.analysis.pod_class import pod_class
from exporter.model import BOUNDNESS_CLASSES, POD_BOUNDNESS_CLASSES

GIB = 2**30
CLASSES = BOUNDNESS_CLASSES
H200, H100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"


@dataclass(frozen=True)
class Holder:
    """A container holding a device: who, and (shared GPUs only) its own memory and kernel time."""

    namespace: str
    kind: str
    """Owner kind; ``""`` = a bare pod (the advisor names the workload after the pod)."""
    workload: str
    pods: tuple[str, ...]
    """Pod names in turn: the first for the first part of the window, the next after a rollout."""
    pod_memory_bytes: float | None = None
    pod_kernel_time: float | None = None


@dataclass(frozen=True)
class Device:
    """One GPU (or MIG instance), what runs on it and what the advisor should say about it."""

    node: str
    gpu: int
    model: str
    memory_bytes: float
    sm: Callable[[np.random.Generator, int], np.ndarray]
    dram: float
    klass: str
    """Boundness class while busy (idle when SM activity is 0; for ``transfer``, the class while
    SM activity is 0, its short kernels in between reading ``compute``)."""
    holders: tuple[Holder, ...]
    mig_profile: str = ""
    pcie: float = 0.0
    """PCIe utilisation (0..1 of the link) while the class is ``transfer``; 0 otherwise."""
    expect: str = field(default="", compare=False)

    @property
    def uuid(self) -> str:
        return f"GPU-ad715e00-0000-4000-8000-00000000{self.node[-1]}{self.gpu:03d}"

    @property
    def mig_uuid(self) -> str:
        return f"MIG-{self.uuid[4:]}" if self.mig_profile else ""


def _steady(mean: float, spread: float) -> Callable[[np.random.Generator, int], np.ndarray]:
    return lambda rng, n: np.clip(rng.uniform(mean - spread, mean + spread, n), 0, 1)


def _bursty(rng: np.random.Generator, n: int) -> np.ndarray:
    """A notebook: off 32 % of the time, light background work, bursts of 50 % SM 8 % of the time."""
    u = rng.random(n)
    return np.where(u < 0.32, 0.0, np.where(u < 0.92, 0.015, 0.5))


def _zero(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.zeros(n)


def _ingest(rng: np.random.Generator, n: int) -> np.ndarray:
    """A loader copying host memory to the GPU: SMs wait on PCIe 85 % of the time, 30 % busy otherwise."""
    return np.where(rng.random(n) < 0.85, 0.0, 0.3)


DEVICES: tuple[Device, ...] = (
    Device("node-a", 0, H200, 9 * GIB, _steady(0.10, 0.02), 0.05, "latency",
           (Holder("inference", "Deployment", "embedder", ("embedder-7d9f-a1", "embedder-5c8b-b2")),),
           expect="mig 1g.18gb"),
    Device("node-a", 1, H200, 120 * GIB, _steady(0.95, 0.02), 0.2, "compute",
           (Holder("ml-training", "Job", "llm-pretrain", ("llm-pretrain-0",)),), expect="keep"),
    Device("node-b", 0, H100, 60 * GIB, _steady(0.97, 0.02), 0.87, "memory",
           (Holder("inference", "Deployment", "kv-decode", ("kv-decode-1",)),), expect="higher-bandwidth H200"),
    Device("node-b", 1, H100, 60 * GIB, _steady(0.97, 0.02), 0.87, "memory",
           (Holder("inference", "Deployment", "kv-decode", ("kv-decode-2",)),), expect="higher-bandwidth H200"),
    Device("node-a", 2, H200, 2 * GIB, _zero, 0.0, "idle",
           (Holder("research", "", "", ("debug-shell",)),), expect="release"),
    Device("node-a", 3, H200, 30 * GIB, _bursty, 0.1, "latency",
           (Holder("notebooks", "StatefulSet", "alice", ("alice-0",)),), expect="time-slice"),
    Device("node-a", 4, H200, 100 * GIB, _steady(0.30, 0.05), 0.3, "latency",
           (Holder("research", "Job", "big-embed", ("big-embed-0",)),), expect="keep"),
    Device("node-c", 0, H200, 10 * GIB, _steady(0.20, 0.02), 0.1, "latency",
           (Holder("inference", "Deployment", "reranker", ("reranker-1",)),), mig_profile="3g.71gb",
           expect="mig 1g.18gb"),
    Device("node-c", 1, H200, 14 * GIB, _steady(0.30, 0.02), 0.1, "latency",
           (Holder("notebooks", "StatefulSet", "bob", ("bob-0",), 5 * GIB, 0.1),
            Holder("notebooks", "StatefulSet", "carol", ("carol-0",), 7 * GIB, 0.2)),
           expect="keep (shared)"),
    # SM activity alone reads it light and bursty (time-slicing) or, under the old idle verdict,
    # idle 85 % of the time; its class says its PCIe link is the limit
    Device("node-c", 2, H200, 20 * GIB, _ingest, 0.01, "transfer",
           (Holder("etl", "Job", "ingest", ("ingest-0",)),), pcie=0.8,
           expect="reduce-transfers"),
)  # fmt: skip


def write_openmetrics(out: TextIO, days: float, interval_s: float, end: float, seed: int = 7) -> int:
    """Write ``days`` (plus one hour, so a window of ``days`` is fully covered) of history ending
    at ``end``; return the number of samples written."""
    steps = int((days * 86400 + 3600) // interval_s) + 1
    stamps = [f"{x:.0f}" for x in end - interval_s * np.arange(steps - 1, -1, -1, dtype=float)]
    rng = np.random.default_rng(seed)
    sm = [d.sm(rng, steps) for d in DEVICES]
    by_metric: dict[str, list[tuple[dict[str, str], list[str | None]]]] = {}

    def add(name: str, labels: dict[str, str], values: list[str | None]) -> None:
        # a pod replaced by a rollout is absent after it ends
        by_metric.setdefault(name, []).append((labels, [*values, *[None] * (steps - len(values))]))

    for node in sorted({d.node for d in DEVICES}):  # each exporter says it reads its GPUs
        add("gpulens_up", {"instance": f"{node}:9445", "job": "gpulens", "node": node}, ["1"] * steps)
    for d, s in zip(DEVICES, sm, strict=True):
        target = {"instance": f"{d.node}:9445", "job": "gpulens", "node": d.node}
        phys = {**target, "gpu": str(d.gpu), "uuid": d.uuid}
        leaf = {**phys, "mig_uuid": d.mig_uuid}
        add("gpulens_gpu_info", {**phys, "name": d.model, "mig_mode": "enabled" if d.mig_profile else "disabled"},
            ["1"] * steps)  # fmt: skip
        if d.mig_profile:
            add("gpulens_mig_instance_info", {**leaf, "mig_profile": d.mig_profile, "gpu_instance_id": "2",
                                              "compute_instance_id": "0"}, ["1"] * steps)  # fmt: skip
        add("gpulens_gpu_sm_active_ratio", leaf, [f"{v:.4g}" for v in s])
        add("gpulens_gpu_dram_active_ratio", leaf, [f"{d.dram if v > 0 else 0.0:.4g}" for v in s])
        # memory rises to its peak once a day for a few samples; otherwise sits at 80 % of it
        daily = (np.arange(steps) % max(1, int(86400 // interval_s))) < 3
        mem = np.where(daily, d.memory_bytes, 0.8 * d.memory_bytes)
        add("gpulens_gpu_memory_used_bytes", leaf, [f"{v:.0f}" for v in mem])
        cls = [d.klass if v > 0 else "idle" for v in s]
        if d.klass == "latency":  # bursts are tensor work
            cls = ["compute" if v >= 0.5 else c for v, c in zip(s, cls, strict=True)]
        if d.klass == "transfer":  # copies while the SMs wait, short kernels in between
            cls = ["compute" if v > 0 else "transfer" for v in s]
        add("gpulens_gpu_pcie_utilization_ratio", leaf, [f"{d.pcie if c == 'transfer' else 0.0:.4g}" for c in cls])
        for c in CLASSES:
            add("gpulens_gpu_boundness", {**leaf, "class": c}, ["1" if x == c else "0" for x in cls])
        holders = frozenset((h.namespace, p) for h in d.holders for p in h.pods)
        # shared holders run processes there (they have their own memory and kernel time)
        tenants = frozenset((h.namespace, p) for h in d.holders if h.pod_kernel_time is not None for p in h.pods)
        for h in d.holders:
            for i, pod in enumerate(h.pods):
                lo, hi = steps * i // len(h.pods), steps * (i + 1) // len(h.pods)
                pad: list[str | None] = [None] * lo  # absent before this pod existed
                pod_labels = {**target, "namespace": h.namespace, "pod": pod, "container": "main", "uuid": d.uuid}
                resource = f"nvidia.com/mig-{d.mig_profile}" if d.mig_profile else "nvidia.com/gpu"
                alloc = {**pod_labels, "mig_uuid": d.mig_uuid, "workload_kind": h.kind, "workload": h.workload,
                         "resource": resource}  # fmt: skip
                if len(d.holders) > 1:
                    alloc["replica"] = str(d.holders.index(h))
                add("gpulens_pod_gpu_allocation", alloc, [*pad, *["1"] * (hi - lo)])
                if h.pod_memory_bytes is not None:
                    add("gpulens_pod_gpu_memory_used_bytes", pod_labels,
                        [*pad, *[f"{v * h.pod_memory_bytes / d.memory_bytes:.0f}" for v in mem[lo:hi]]])  # fmt: skip
                if h.pod_kernel_time is not None:
                    add(
                        "gpulens_pod_gpu_kernel_time_ratio", pod_labels, [*pad, *[f"{h.pod_kernel_time:g}"] * (hi - lo)]
                    )
                mine = [
                    pod_class(c, (h.namespace, pod), holders, tenants if len(d.holders) > 1 else None)
                    for c in cls[lo:hi]
                ]
                for c in POD_BOUNDNESS_CLASSES:
                    add("gpulens_pod_gpu_boundness", {**pod_labels, "mig_uuid": d.mig_uuid, "class": c},
                        [*pad, *["1" if x == c else "0" for x in mine]])  # fmt: skip
    history = OpenMetricsHistory(out)
    for name, series in by_metric.items():
        for labels, values in series:
            history.series(name, labels, values, stamps)
    return history.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--days", type=float, default=7.0)
    p.add_argument("--interval", type=float, default=240.0, help="seconds between samples (< 300)")
    p.add_argument("--end", type=float, default=None, help="Unix time of the last sample (default: now)")
    p.add_argument("--out", required=True, help="OpenMetrics file to write ('-' = stdout)")
    a = p.parse_args(argv)
    end = float(int(a.end if a.end is not None else time.time()))
    with open(a.out, "w") if a.out != "-" else sys.stdout as out:
        n = write_openmetrics(out, a.days, a.interval, end)
    print(f"{n} samples over {a.days:g} days every {a.interval:g} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
