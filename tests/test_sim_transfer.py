"""The simulator's link traffic, through the sampler, the classifier and the collector.

The simulated jobs that move data over PCIe (the mps node's GPUs 4-6, exporter/sim/scenarios.py)
read what limits them while they work: a data loader copying from pinned host memory with no kernel
reads ``transfer``; an LLM server offloading its KV cache keeps its memory-bound kernels (``memory``);
training with its optimizer offloaded keeps its GEMMs (``compute``).  Idle GPUs move a few KB/s and
stay ``idle``.  The exported byte counters grow at the simulated rates.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from exporter.analysis.boundness import BoundnessClassifier, busy_signal
from exporter.model import NVLINK, PCIE, BackendSample, GpuSample, LeafSample, LinkTraffic, transfer_ratio
from exporter.render.collector import SnapshotCollector
from exporter.sampler import Sampler
from exporter.sim import SCENARIOS, SimFaults, SimulatedBackend, scenarios, workloads
from exporter.sim.attribution import simulated_attributor

PRE_HOPPER = ("a100", "l40s", "a10g")
"""Simulated nodes without GPM (their link reads: tests/test_sim_prehopper.py)."""

GEN5_X16 = 32e9 * 16 * 128 / 130 / 8
"""PCIe Gen5 x16, each way, after line encoding (~63.0 GB/s)."""
H2D_PINNED = 51.5e9
"""Pinned host-to-device copies on an H200 (0.82 of the link)."""
IDLE_LINK_BYTES_PER_SECOND = 5e3
"""A few KB/s: the most an idle GPU may move over a link."""
STAGER, KV_OFFLOAD, ZERO_OFFLOAD, FREE = 4, 5, 6, 7
"""The mps node's GPUs that move data over PCIe, and its free one."""

Classes = dict[tuple[int, str], list[str | None]]


def _key(gpu: GpuSample, leaf: LeafSample) -> tuple[int, str]:
    return gpu.index, f"{leaf.mig.profile}/{leaf.mig.gpu_instance_id}" if leaf.mig else ""


def _link(leaf: LeafSample | GpuSample, name: str) -> LinkTraffic | None:
    return next((x for x in leaf.links if x.link == name), None)


def _samples(scenario: str, cycles: int, seed: int = 1) -> Iterator[BackendSample]:
    backend = SimulatedBackend(scenario, seed=seed)
    for _ in range(cycles):
        yield backend.sample()


def classify_with_links(scenario: str, cycles: int = 240) -> Classes:
    """Play a simulated node through the classifier as the sampler does, links included."""
    clf = BoundnessClassifier()
    out: Classes = {}
    for n, sample in enumerate(_samples(scenario, cycles)):
        for gpu in sample.gpus:
            for leaf in gpu.leaves:
                util = gpu.utilization_ratio if leaf.mig is None else leaf.utilization_ratio
                cls = clf.observe(
                    leaf.leaf_id, leaf.gpm, util, bool(leaf.processes), float(n + 1), transfer_ratio(leaf.links)
                )
                out.setdefault(_key(gpu, leaf), []).append(cls)
    return out


@pytest.fixture(scope="module")
def mps_classes() -> Classes:
    return classify_with_links("mps", cycles=300)


# --- what limits each transfer-heavy job -------------------------------------------------------


def test_a_data_loader_copying_from_pinned_memory_with_no_kernel_reads_transfer(mps_classes: Classes) -> None:
    assert set(mps_classes[(STAGER, "")][15:]) == {"transfer"}


def test_an_llm_server_offloading_its_kv_cache_stays_memory_bound(mps_classes: Classes) -> None:
    assert set(mps_classes[(KV_OFFLOAD, "")][15:]) == {"memory"}


def test_training_with_its_optimizer_offloaded_stays_compute_bound(mps_classes: Classes) -> None:
    assert set(mps_classes[(ZERO_OFFLOAD, "")][15:]) == {"compute"}


def test_the_free_gpu_next_to_them_reads_idle(mps_classes: Classes) -> None:
    assert set(mps_classes[(FREE, "")][15:]) == {"idle"}


def test_the_data_loader_reads_like_the_h200_copying_from_the_host() -> None:
    # NVML GPU-Util 1.0 during copies, GPM graphics and SM activity 0, 51.5 GB/s in: 0.82 of the link.
    for sample in list(_samples("mps", 20))[1:]:
        gpu = sample.gpus[STAGER]
        leaf = gpu.leaves[0]
        pcie = _link(leaf, PCIE)
        assert leaf.gpm is not None and pcie is not None and pcie.rx_bytes_per_second is not None
        assert gpu.utilization_ratio is not None and gpu.utilization_ratio > 0.98
        assert leaf.gpm.graphics_active == 0 and leaf.gpm.sm_active == 0
        assert 0.96 * H2D_PINNED <= pcie.rx_bytes_per_second <= H2D_PINNED + IDLE_LINK_BYTES_PER_SECOND
        assert pcie.utilization_ratio() == pytest.approx(0.8, abs=0.03)
        busy = busy_signal(leaf.gpm, gpu.utilization_ratio, transfer_ratio(leaf.links))
        assert busy == pytest.approx(pcie.utilization_ratio()), "busy: the link's time, not GPU-Util"


def test_the_offload_jobs_move_heavy_pcie_traffic_next_to_their_kernels() -> None:
    samples = list(_samples("mps", 60))[1:]
    kv = [_link(s.gpus[KV_OFFLOAD].leaves[0], PCIE) for s in samples]
    assert statistics.median(x.rx_bytes_per_second or 0 for x in kv if x) > 20e9
    assert statistics.median(x.tx_bytes_per_second or 0 for x in kv if x) > 12e9
    zero = [_link(s.gpus[ZERO_OFFLOAD].leaves[0], PCIE) for s in samples]
    assert max(x.utilization_ratio() or 0 for x in zero if x) > 0.7, "the weights come back flat out"
    assert statistics.median(x.tx_bytes_per_second or 0 for x in zero if x) > 6e9, "gradients go out"


# --- nothing else changes class; idle stays idle ----------------------------------------------


def test_the_h200_node_reads_as_its_workloads_with_links() -> None:
    got = classify_with_links("h200x8")
    for gpu, expected in {0: "memory", 1: "memory", 4: "launch", 5: "idle", 7: "idle"}.items():
        assert set(got[(gpu, "")][15:]) == {expected}, f"GPU {gpu}"
    solver = got[(6, "")][15:]
    assert solver.count("compute") / len(solver) > 0.85


def test_training_data_shard_loads_move_bytes_over_pcie_and_stay_compute() -> None:
    # 50 s steps and 6 s shard loads (the checkpoint at 580 s is past this run).
    samples = list(_samples("h200x8", 240))[1:]
    for index in (2, 3):
        leaves = [s.gpus[index].leaves[0] for s in samples]
        loading = [_link_of(x.links, PCIE) for x in leaves if x.gpm and (x.gpm.tensor_active or 0.0) < 0.1]
        assert loading and all((x.rx_bytes_per_second or 0) > 15e9 for x in loading)
    got = classify_with_links("h200x8")
    for index in (2, 3):
        assert set(got[(index, "")][15:]) == {"compute"}


def _idle_leaves(scenario: str) -> set[str]:
    """Leaf ids of the scenario's leaves that run nothing: no process, or processes holding memory."""
    return {
        leaf.mig.mig_uuid if leaf.mig else gpu.uuid
        for gpu in scenarios.build(scenario).gpus
        for leaf in gpu.leaves
        if all(isinstance(p.workload, workloads.Idle) for p in leaf.processes)
    }


@pytest.mark.parametrize("scenario", ["h200x8", "mig", "mps"])
def test_idle_gpus_and_free_mig_instances_move_a_few_kb_per_second_and_read_idle(scenario: str) -> None:
    idle = _idle_leaves(scenario)
    assert idle, "every scenario here has an idle GPU or a free instance"
    clf = BoundnessClassifier()
    classes: dict[str, set[str | None]] = {leaf_id: set() for leaf_id in idle}
    for n, sample in enumerate(_samples(scenario, 60)):
        for gpu in sample.gpus:
            for leaf in (x for x in gpu.leaves if x.leaf_id in idle):
                for link in leaf.links:
                    assert (link.tx_bytes_per_second or 0) <= IDLE_LINK_BYTES_PER_SECOND, (leaf.leaf_id, link)
                    assert (link.rx_bytes_per_second or 0) <= IDLE_LINK_BYTES_PER_SECOND, (leaf.leaf_id, link)
                util = gpu.utilization_ratio if leaf.mig is None else leaf.utilization_ratio
                x = transfer_ratio(leaf.links)
                cls = clf.observe(leaf.leaf_id, leaf.gpm, util, bool(leaf.processes), float(n + 1), x)
                if n >= 15:
                    classes[leaf.leaf_id].add(cls)
    assert all(seen == {"idle"} for seen in classes.values()), classes


# --- the link reads themselves --------------------------------------------------------------------


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s not in PRE_HOPPER])
def test_every_leaf_and_gpu_has_its_link_reads_and_the_gpu_fields_are_the_same_numbers(scenario: str) -> None:
    # H200 nodes (GPM); the pre-Hopper nodes' link reads: tests/test_sim_prehopper.py
    backend = SimulatedBackend(scenario, seed=3)
    first = backend.sample()
    assert all(not g.links and not leaf.links for g in first.gpus for leaf in g.leaves), "no rate before a window"
    assert all(g.pcie_rx_bytes_per_second is None and g.nvlink_rx_bytes_per_second is None for g in first.gpus)
    for gpu in backend.sample().gpus:
        pcie, nvlink = _link(gpu, PCIE), _link(gpu, NVLINK)
        # as the NVML backend reads an H200: GPM's rates, or throughput samples for a GPU in MIG mode
        expected_source = "sampled" if gpu.mig_mode == "enabled" else "gpm"
        assert pcie is not None and pcie.source == expected_source and pcie.window_seconds == 1.0
        assert pcie.capacity_bytes_per_second == pytest.approx(63.0e9, rel=1e-3)
        assert (gpu.pcie_tx_bytes_per_second, gpu.pcie_rx_bytes_per_second) == (
            pcie.tx_bytes_per_second,
            pcie.rx_bytes_per_second,
        )
        if gpu.mig_mode == "enabled":
            assert nvlink is None and gpu.nvlink_tx_bytes_per_second is None
            shares = [_link(leaf, PCIE) for leaf in gpu.leaves]
            assert all(s is not None and s.source == "gpm" for s in shares)
            assert not any(_link(leaf, NVLINK) for leaf in gpu.leaves), "no NVLink per MIG instance"
            # The device counts every instance's bytes and the driver's own few KB/s.
            share_rx = sum(s.rx_bytes_per_second or 0 for s in shares if s)
            assert share_rx <= (pcie.rx_bytes_per_second or 0) <= share_rx + 2 * IDLE_LINK_BYTES_PER_SECOND
        else:
            assert gpu.leaves[0].links == gpu.links, "a whole GPU's leaf reads are the GPU's: one read"
            assert nvlink is not None and nvlink.source == "gpm"
            assert nvlink.capacity_bytes_per_second == 18 * 26.5625e9
            assert (gpu.nvlink_tx_bytes_per_second, gpu.nvlink_rx_bytes_per_second) == (
                nvlink.tx_bytes_per_second,
                nvlink.rx_bytes_per_second,
            )


def test_training_all_reduces_over_nvlink() -> None:
    samples = list(_samples("h200x8", 40))[1:]
    nvlink = [_link(s.gpus[2], NVLINK) for s in samples]
    assert max(x.utilization_ratio() or 0 for x in nvlink if x) > 0.15
    assert all(_link_of(s.gpus[0].links, NVLINK).tx_bytes_per_second == 0 for s in samples), "a copy loop alone"


def test_a_failed_pcie_read_leaves_that_direction_unread_on_the_gpu_and_its_leaf() -> None:
    faults = SimFaults(unsupported={"pcie_rx_bytes_per_second"})
    sample = list(_samples_with(SimulatedBackend("mps", faults=faults), 2))[-1]
    gpu = sample.gpus[STAGER]
    assert gpu.pcie_rx_bytes_per_second is None
    for links in (gpu.links, gpu.leaves[0].links):
        pcie = _link_of(links, PCIE)
        assert pcie.rx_bytes_per_second is None and pcie.tx_bytes_per_second is not None
    faults.unsupported = {"links"}
    after = SimulatedBackend("mps", faults=faults)
    sample = list(_samples_with(after, 2))[-1]
    assert all(g.links == () and all(leaf.links == () for leaf in g.leaves) for g in sample.gpus)


def _samples_with(backend: SimulatedBackend, n: int) -> Iterator[BackendSample]:
    for _ in range(n):
        yield backend.sample()


def _link_of(links: tuple[LinkTraffic, ...], name: str) -> LinkTraffic:
    found = next((x for x in links if x.link == name), None)
    assert found is not None
    return found


# --- through the sampler and the collector ---------------------------------------------------------


def _leaf_labels(gpu: GpuSample, leaf: LeafSample) -> dict[str, str]:
    mig = leaf.mig
    return {
        "gpu": str(gpu.index),
        "uuid": gpu.uuid,
        "mig_uuid": mig.mig_uuid if mig else "",
        "gpu_instance_id": str(mig.gpu_instance_id) if mig else "",
        "compute_instance_id": str(mig.compute_instance_id) if mig else "",
        "mig_profile": mig.profile if mig else "",
    }


def _run(scenario: str, cycles: int) -> Iterator[tuple[BackendSample, CollectorRegistry]]:
    """Each cycle's backend sample and a registry rendering that cycle's snapshot (a fake clock)."""
    backend = SimulatedBackend(scenario, seed=0)
    tick = [0.0]
    sampler = Sampler(
        backend,
        attributor=simulated_attributor(backend),
        classifier=BoundnessClassifier(),
        clock=lambda: tick[0],
        wall=lambda: 1.79e9 + tick[0],
    )
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(sampler.latest, backend="sim", wall=lambda: 1.79e9 + tick[0]))
    try:
        for _ in range(cycles):
            snap = sampler.run_once()
            yield snap.backend, reg
            tick[0] += 1.0
    finally:
        sampler.stop()


def test_exported_pcie_counters_grow_at_the_simulated_rates() -> None:
    expected: dict[str, float] = {}
    start: dict[str, float] = {}
    labels: dict[str, dict[str, str]] = {}
    for n, (sample, reg) in enumerate(_run("mps", 25)):
        for gpu in sample.gpus:
            leaf = gpu.leaves[0]
            labels[leaf.leaf_id] = _leaf_labels(gpu, leaf)
            value = reg.get_sample_value("gpulens_gpu_pcie_rx_bytes_total", labels[leaf.leaf_id])
            if n == 5:
                assert value is not None
                start[leaf.leaf_id] = value
            elif n > 5:
                pcie = _link(leaf, PCIE)
                assert pcie is not None and pcie.rx_bytes_per_second is not None
                expected[leaf.leaf_id] = (
                    expected.get(leaf.leaf_id, 0.0) + pcie.rx_bytes_per_second * pcie.window_seconds
                )
    stager = labels[sample.gpus[STAGER].uuid]
    for leaf_id, grown in expected.items():
        value = reg.get_sample_value("gpulens_gpu_pcie_rx_bytes_total", labels[leaf_id])
        assert value is not None and value - start[leaf_id] == pytest.approx(grown), leaf_id
    # The loader moved ~51 GB each second; the boundness and link series say why.
    assert expected[sample.gpus[STAGER].uuid] / 19 == pytest.approx(0.985 * H2D_PINNED, rel=0.02)
    assert reg.get_sample_value("gpulens_gpu_boundness", {**stager, "class": "transfer"}) == 1
    assert reg.get_sample_value("gpulens_gpu_pcie_utilization_ratio", stager) == pytest.approx(0.8, abs=0.03)
    assert reg.get_sample_value("gpulens_gpu_pcie_capacity_bytes_per_second", stager) == pytest.approx(GEN5_X16)
    assert reg.get_sample_value("gpulens_gpu_link_info", {**stager, "link": "pcie", "source": "gpm"}) == 1
    assert reg.get_sample_value("gpulens_gpu_link_info", {**stager, "link": "nvlink", "source": "gpm"}) == 1
    idle = labels[sample.gpus[FREE].uuid]
    assert reg.get_sample_value("gpulens_gpu_boundness", {**idle, "class": "idle"}) == 1
    for index, cls in ((KV_OFFLOAD, "memory"), (ZERO_OFFLOAD, "compute")):
        assert reg.get_sample_value("gpulens_gpu_boundness", {**labels[sample.gpus[index].uuid], "class": cls}) == 1


def test_mig_instances_export_their_own_pcie_share() -> None:
    sample, reg = list(_run("mig", 5))[-1]
    gpu = sample.gpus[1]  # 3g training, 2g reranker, an idle 1g notebook and a free 1g instance
    for leaf in gpu.leaves:
        lab = _leaf_labels(gpu, leaf)
        assert reg.get_sample_value("gpulens_gpu_link_info", {**lab, "link": "pcie", "source": "gpm"}) == 1
        assert reg.get_sample_value("gpulens_gpu_pcie_rx_bytes_total", lab) is not None
        assert reg.get_sample_value("gpulens_gpu_nvlink_rx_bytes_total", lab) is None
