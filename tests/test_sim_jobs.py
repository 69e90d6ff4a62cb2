"""The simulator's ``jobs-0`` / ``jobs-1`` nodes: four two-node jobs whose classes read as the
scenario says (exporter/sim/scenarios.py ``_jobs``), through the exporter's own classifier and
attribution, so the jobs rules, pages and advisor have the cases the jobs issue asks for: a healthy
job, a straggler, a communication-bound job and an over-provisioned one."""

from __future__ import annotations

import collections
import re

import pytest

from exporter.cli import make_attributor, make_classifier, make_network
from exporter.config import parse_config
from exporter.render.collector import SnapshotCollector
from exporter.render.metrics import CATALOGUE
from exporter.sampler import Sampler
from exporter.sim import Simulation
from exporter.sim.scenarios import EFA_RESOURCE, JOBS, JOBS_STRAGGLER_GPU, JOBS_STRAGGLER_NODE, build

WARMUP = 40
CYCLES = 100
_BOUNDNESS = re.compile(r"^gpulens_pod_gpu_boundness\{(.*)\} 1\.0$")
_ALLOCATION = re.compile(r"^gpulens_pod_gpu_allocation\{(.*)\} 1\.0$")
READ = tuple(spec for spec in CATALOGUE if spec.name in ("gpulens_pod_gpu_boundness", "gpulens_pod_gpu_allocation"))
"""The two families the runs read: the page is rendered through the exporter's own collector and
encoder, but only these two (rendering the other families every cycle was half the module's time)."""


def _label(labels: str, name: str) -> str:
    m = re.search(rf'(?:^|,){name}="([^"]*)"', labels)
    return m.group(1) if m else ""


def _run(scenario: str) -> tuple[dict[str, collections.Counter[str]], dict[str, tuple[str, str, str]]]:
    """Per GPU UUID: how many cycles its pod's class was each class (after WARMUP), and its holder's
    (namespace, workload_kind, workload)."""
    cfg = parse_config(["--backend", "sim", "--sim.scenario", scenario, "--no-probes"], env={})
    sim = Simulation.create(scenario, seed=0)
    tick = [0.0]
    sampler = Sampler(
        sim.backend,
        attributor=make_attributor(cfg, sim),
        classifier=make_classifier(cfg),
        network=make_network(cfg, sim),
        clock=lambda: tick[0],
        wall=lambda: 1.79e9 + tick[0],
    )
    collector = SnapshotCollector(sampler.latest, backend="sim", wall=lambda: 1.79e9 + tick[0], catalogue=READ)
    classes: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    owners: dict[str, tuple[str, str, str]] = {}
    try:
        for k in range(WARMUP + CYCLES):
            sampler.run_once()
            tick[0] += 1.0
            if k < WARMUP:
                continue
            for line in collector.exposition(openmetrics=False).splitlines():
                if not line.startswith("gpulens_pod_gpu_"):
                    continue
                if m := _BOUNDNESS.match(line):
                    classes[_label(m.group(1), "uuid")][_label(m.group(1), "class")] += 1
                elif m := _ALLOCATION.match(line):
                    labels = m.group(1)
                    owners[_label(labels, "uuid")] = tuple(  # type: ignore[assignment]
                        _label(labels, k) for k in ("namespace", "workload_kind", "workload")
                    )
    finally:
        sampler.stop()
    return classes, owners


@pytest.fixture(scope="module")
def runs() -> dict[int, tuple[dict[str, collections.Counter[str]], dict[str, tuple[str, str, str]]]]:
    return {node: _run(f"jobs-{node}") for node in (0, 1)}


def _by_gpu(node: int) -> list[str]:
    """The node's GPU UUIDs by index."""
    return [g.uuid for g in build(f"jobs-{node}").gpus]


@pytest.mark.parametrize("node", [0, 1])
def test_each_node_runs_one_pod_of_each_job_with_two_gpus_and_their_nearest_efas(node: int) -> None:
    sim = Simulation.create(f"jobs-{node}")
    try:
        pods = {p.uid: p for p in sim.backend.pods()}
        assert sorted((p.namespace, p.workload_kind, p.workload) for p in pods.values()) == sorted(
            (j.namespace, j.kind, j.name) for j in JOBS
        )
        held: dict[tuple[str, str], tuple[str, ...]] = {}
        for d in sim.backend.pod_devices():
            held[(pods[d.pod_uid or ""].workload or "", d.resource)] = d.device_ids
        gpus = _by_gpu(node)
        for j, job in enumerate(JOBS):
            assert held[(job.name, "nvidia.com/gpu")] == (gpus[2 * j], gpus[2 * j + 1])
            assert len(held[(job.name, EFA_RESOURCE)]) == 8
    finally:
        sim.backend.close()


def test_the_jobs_classes_read_as_the_scenario_says(runs: dict[int, tuple[dict, dict]]) -> None:
    """Per job and node, each GPU's dominant class: the healthy job computes; the straggler (node 1,
    GPU 3) computes while its three peers on both nodes wait (communication); the MoE job and the
    over-provisioned one spend most of their time communicating."""
    expect = {
        "gpt-13b-finetune": "compute",
        "mixtral-sft": "communication",
        "moe-pretrain": "communication",
        "embedding-train": "communication",
    }
    for node, (classes, owners) in runs.items():
        gpus = _by_gpu(node)
        for index, uuid in enumerate(gpus):
            job = owners[uuid][2]
            dominant, n = classes[uuid].most_common(1)[0]
            straggler = node == JOBS_STRAGGLER_NODE and index == JOBS_STRAGGLER_GPU
            assert dominant == ("compute" if straggler else expect[job]), (node, index, job, classes[uuid])
            assert n >= 0.9 * CYCLES, (node, index, classes[uuid])
