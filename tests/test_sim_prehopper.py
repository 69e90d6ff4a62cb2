"""The simulated pre-Hopper nodes (a100, l40s, a10g) and the switch that turns GPM off.

Pre-Hopper GPUs have no GPM: NVML's GPU-Util and memory-controller utilisation (whole GPUs only),
per-process utilisation, power, clocks, temperatures and links are all there is.  Each node has
GPUs that read busy, under-used, idle while allocated, and (across the nodes) launch-bound,
memory-bound and unallocated, through those NVML numbers alone.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from exporter.model import NVLINK, PCIE, BackendSample, GpuSample, LeafSample, LinkTraffic
from exporter.sampler import Sampler
from exporter.sim import SCENARIOS, SimulatedBackend, Simulation, scenarios, workloads
from exporter.sim.attribution import simulated_attributor

MIB = 1024**2
GIB = 1024**3
PREHOPPER = ("a100", "l40s", "a10g")
UNDER_USED = 0.2
"""GPU-Util an under-used GPU stays below all the time."""


def run(scenario: str, n: int, gpm: bool = True) -> list[BackendSample]:
    """``n`` samples of ``scenario`` after the first (which has no window)."""
    backend = SimulatedBackend(scenario, gpm=gpm)
    return [backend.sample() for _ in range(n + 1)][1:]


def series(samples: list[BackendSample], index: int, get: Callable[[GpuSample], float | None]) -> list[float]:
    """Values of ``get`` for GPU ``index`` over ``samples``; all must be present."""
    out = []
    for s in samples:
        value = get(s.gpus[index])
        assert value is not None, (index, s.gpus[index])
        out.append(value)
    return out


def link(links: tuple[LinkTraffic, ...], name: str) -> LinkTraffic | None:
    return next((x for x in links if x.link == name), None)


@pytest.fixture(scope="module")
def minutes() -> dict[str, list[BackendSample]]:
    """Five simulated minutes of each pre-Hopper node (covers the training data loads)."""
    return {scenario: run(scenario, 300) for scenario in PREHOPPER}


# --- the nodes and their NVML shape --------------------------------------------------------------


def test_the_prehopper_nodes_are_scenarios() -> None:
    assert set(PREHOPPER) <= set(SCENARIOS)
    assert SCENARIOS[:5] == ("h200x8", "mig", "mig7x8", "timeslice", "mps"), "the H200 nodes keep their order"


@pytest.mark.parametrize(
    ("scenario", "gpus", "name", "memory_mib", "limit", "sm_mhz", "memory_mhz", "cc", "thresholds"),
    [
        ("a100", 8, "NVIDIA A100-SXM4-80GB", 81920, 400.0, 1410, 1593, "8.0",
         {"slowdown": 89.0, "shutdown": 92.0, "gpu_max": 85.0, "memory_max": 95.0}),
        ("l40s", 4, "NVIDIA L40S", 46068, 350.0, 2520, 9001, "8.9",
         {"slowdown": 89.0, "shutdown": 92.0, "gpu_max": 87.0}),
        ("a10g", 4, "NVIDIA A10G", 23028, 300.0, 1710, 6251, "8.6",
         {"slowdown": 95.0, "shutdown": 98.0, "gpu_max": 88.0}),
    ],
)  # fmt: skip
def test_every_gpu_reads_like_its_model(
    minutes: dict[str, list[BackendSample]],
    scenario: str,
    gpus: int,
    name: str,
    memory_mib: int,
    limit: float,
    sm_mhz: int,
    memory_mhz: int,
    cc: str,
    thresholds: dict[str, float],
) -> None:
    samples = minutes[scenario]
    assert len({g.uuid for g in samples[0].gpus}) == len(samples[0].gpus) == gpus
    assert len({g.pci_bus_id for g in samples[0].gpus}) == gpus
    hbm = "memory_max" in thresholds
    for s in samples:
        assert s.up and s.driver_version == "580.159.04"
        for g in s.gpus:
            assert (g.name, g.compute_capability, g.memory_total_bytes) == (name, cc, memory_mib * MIB)
            assert g.power_limit_watts == limit and g.power_watts is not None and 0 < g.power_watts <= limit
            assert g.sm_clock_max_hertz == sm_mhz * 1e6 and g.memory_clock_hertz == memory_mhz * 1e6
            assert g.sm_clock_hertz is not None and 200e6 <= g.sm_clock_hertz <= sm_mhz * 1e6
            assert g.sm_clock_hertz % 15e6 == 0
            assert dict(g.temperature_thresholds or {}) == thresholds
            assert g.temperature_celsius is not None and 25 <= g.temperature_celsius < thresholds["gpu_max"]
            # HBM has a temperature sensor; GDDR6 boards answer NotSupported.
            assert (g.memory_temperature_celsius is not None) == hbm
            assert (g.pcie_link_generation, g.pcie_link_width) == (4, 16)
            assert (g.pcie_link_max_generation, g.pcie_link_max_width) == (4, 16)
            assert (g.memory_used_bytes or 0) <= memory_mib * MIB
    # The g5's A10G answers a 0 % fan; the passively cooled A100 SXM and L40S answer NotSupported.
    assert {g.fan_speed_ratio for g in samples[0].gpus} == ({0.0} if scenario == "a10g" else {None})


@pytest.mark.parametrize("scenario", PREHOPPER)
def test_no_gpm_anywhere(minutes: dict[str, list[BackendSample]], scenario: str) -> None:
    for s in minutes[scenario]:
        assert s.gpm_supported is False
        for g in s.gpus:
            assert all(leaf.gpm is None for leaf in g.leaves)
            links = (*g.links, *(x for leaf in g.leaves for x in leaf.links))
            assert links and all(x.source != "gpm" for x in links), "no GPM-derived link rate"


@pytest.mark.parametrize("scenario", PREHOPPER)
def test_gpu_util_and_memory_util_on_whole_gpus_only(minutes: dict[str, list[BackendSample]], scenario: str) -> None:
    for s in minutes[scenario]:
        for g in s.gpus:
            whole = g.mig_mode != "enabled"
            assert (g.utilization_ratio is not None) == whole == (g.memory_utilization_ratio is not None)
            for leaf in g.leaves:
                assert (leaf.utilization_ratio is not None) == (leaf.mig is None) == whole
                if whole:
                    assert leaf.utilization_ratio == g.utilization_ratio
                for p in leaf.processes:
                    # NVML's per-process utilisation: whole GPUs only, never per MIG instance.
                    assert (p.sm_util_ratio is not None) == whole == (p.memory_util_ratio is not None)


def test_mig_only_on_the_a100_with_a100_profiles(minutes: dict[str, list[BackendSample]]) -> None:
    profiles = scenarios.A100_80GB_MIG_PROFILES
    a100 = minutes["a100"][-1]
    assert [g.mig_mode for g in a100.gpus] == ["disabled"] * 4 + ["enabled"] * 2 + ["disabled"] * 2
    seen = set()
    for g in a100.gpus:
        if g.mig_mode != "enabled":
            assert len(g.leaves) == 1 and g.leaves[0].mig is None
            continue
        migs = [leaf.mig for leaf in g.leaves if leaf.mig]
        assert len(migs) == len(g.leaves) and all(leaf.uuid == g.uuid for leaf in g.leaves)
        assert sum(profiles[m.profile].compute_slices for m in migs) == 7
        assert len({m.gpu_instance_id for m in migs}) == len(migs)
        for leaf in g.leaves:
            assert leaf.mig is not None and leaf.memory_total_bytes == profiles[leaf.mig.profile].memory_bytes
            assert leaf.memory_reserved_bytes is None and (leaf.memory_used_bytes or 0) <= leaf.memory_total_bytes
            assert leaf.links == (), "NVML has no per-instance link bytes without GPM"
            seen.add(leaf.mig.profile)
        assert sum(leaf.memory_total_bytes or 0 for leaf in g.leaves) <= (g.memory_total_bytes or 0)
        assert g.memory_used_bytes == sum(leaf.memory_used_bytes or 0 for leaf in g.leaves)
    assert seen == {"3g.40gb", "2g.20gb", "1g.10gb"}
    assert 9 * GIB < profiles["1g.10gb"].memory_bytes < 10 * GIB
    for scenario in ("l40s", "a10g"):
        for g in minutes[scenario][-1].gpus:
            # No MIG on the L40S or the A10G: NVML answers NotSupported for the mode.
            assert g.mig_mode is None and len(g.leaves) == 1 and g.leaves[0].mig is None


# --- links -------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", PREHOPPER)
def test_pcie_is_nvml_throughput_sampled_every_ten_cycles_in_whole_kib(scenario: str) -> None:
    backend = SimulatedBackend(scenario)
    first = backend.sample()
    assert all(not g.links for g in first.gpus), "no rate before a window"
    samples = [backend.sample() for _ in range(40)]
    for index in range(len(samples[0].gpus)):
        reads = [link(s.gpus[index].links, PCIE) for s in samples]
        for cycle, (before, now) in enumerate(itertools.pairwise(reads), start=2):
            assert now is not None and before is not None and now.source == "sampled"
            assert now.capacity_bytes_per_second == pytest.approx(31.5e9, rel=1e-3), "Gen4 x16"
            assert (now.tx_bytes_per_second or 0) % 1024 == 0 and (now.rx_bytes_per_second or 0) % 1024 == 0
            if (cycle - index) % 10:
                assert (now.tx_bytes_per_second, now.rx_bytes_per_second) == (
                    before.tx_bytes_per_second,
                    before.rx_bytes_per_second,
                ), "the last read repeats until the next one"
            g = samples[cycle - 1].gpus[index]
            assert (g.pcie_tx_bytes_per_second, g.pcie_rx_bytes_per_second) == (
                now.tx_bytes_per_second,
                now.rx_bytes_per_second,
            )


def test_a100_nvlink_bytes_come_from_the_per_link_counters(minutes: dict[str, list[BackendSample]]) -> None:
    samples = minutes["a100"]
    for s in samples:
        for g in s.gpus:
            nvlink = link(g.links, NVLINK)
            if g.mig_mode == "enabled":
                assert nvlink is None and g.nvlink_errors is None, "NVML finds no NVLink in MIG mode"
                continue
            assert nvlink is not None and nvlink.source == "counter"
            assert nvlink.capacity_bytes_per_second == 12 * 25e9
            assert (nvlink.tx_bytes_per_second or 0) % (12 * 1024) == 0, "12 links, whole KiB each"
            assert g.nvlink_tx_bytes_per_second == nvlink.tx_bytes_per_second
            assert dict(g.nvlink_errors or {}) == {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0}
            assert g.leaves[0].links == g.links
    # Data-parallel training all-reduces over NVLink while it computes; nothing else uses it.
    for index in (0, 1):
        assert max(series(samples, index, lambda g: g.nvlink_tx_bytes_per_second)) > 40e9
    for index in (2, 3, 6, 7):
        assert set(series(samples, index, lambda g: g.nvlink_tx_bytes_per_second)) == {0.0}
    for scenario in ("l40s", "a10g"):
        for g in minutes[scenario][-1].gpus:
            assert link(g.links, NVLINK) is None and g.nvlink_errors is None and g.nvlink_rx_bytes_per_second is None


# --- what each workload reads through NVML ------------------------------------------------------


def _held_idle_leaves(scenario: str) -> list[str]:
    """Leaves held by a pod whose processes all run nothing."""
    node = scenarios.build(scenario)
    held = {d.split("::")[0] for c in node.pod_devices for d in c.device_ids}
    out = []
    for gpu in node.gpus:
        for leaf in gpu.leaves:
            leaf_id = leaf.mig.mig_uuid if leaf.mig else gpu.uuid
            idle = all(isinstance(p.workload, workloads.Idle) for p in leaf.processes)
            if leaf_id in held and leaf.processes and idle:
                out.append(leaf_id)
    return out


@pytest.mark.parametrize("scenario", PREHOPPER)
def test_each_node_has_two_allocated_idle_leaves_and_an_under_used_gpu(
    minutes: dict[str, list[BackendSample]], scenario: str
) -> None:
    samples = minutes[scenario]
    idle = _held_idle_leaves(scenario)
    assert len(idle) >= 2
    for s in samples:
        for g in s.gpus:
            for leaf in g.leaves:
                if leaf.leaf_id in idle:
                    assert leaf.utilization_ratio in (0.0, None) and (leaf.memory_used_bytes or 0) >= 2 * GIB
                    assert all(p.sm_util_ratio in (0.0, None) for p in leaf.processes)
    under_used = [
        g.index
        for g in samples[0].gpus
        if g.utilization_ratio is not None
        and min(series(samples, g.index, lambda x: x.utilization_ratio)) > 0
        and max(series(samples, g.index, lambda x: x.utilization_ratio)) < UNDER_USED
    ]
    assert under_used, "a GPU whose GPU-Util stays well under 20 %"


def test_a100_busy_training_launch_bound_idle_under_used_and_unallocated(
    minutes: dict[str, list[BackendSample]],
) -> None:
    samples = minutes["a100"]
    backend = SimulatedBackend("a100")
    for index in (0, 1):
        util = series(samples, index, lambda g: g.utilization_ratio)
        assert statistics.median(util) > 0.9 and min(util) < 0.1, "busy, with data-loading stalls"
        assert statistics.median(series(samples, index, lambda g: g.power_watts)) > 380
        capped = [s.gpus[index] for s in samples if (s.gpus[index].clock_events or {}).get("sw_power_cap")]
        assert capped and all((g.sm_clock_hertz or 0) < 1410e6 for g in capped)
        assert statistics.median(series(samples, index, lambda g: g.memory_utilization_ratio)) < 0.3

    # Lock-step ranks.
    def working(g: GpuSample) -> float:
        return float((g.utilization_ratio or 0.0) > 0.5)

    assert series(samples, 0, working) == series(samples, 1, working)
    # Tiny kernels back to back: nvidia-smi says ~23 % busy, the board stays near its idle power.
    assert all(0.19 <= u <= 0.27 for u in series(samples, 2, lambda g: g.utilization_ratio))
    assert max(series(samples, 2, lambda g: g.power_watts)) < 0.3 * 400
    assert set(series(samples, 2, lambda g: g.memory_utilization_ratio)) == {0.0}
    # An idle notebook holding 30 GiB.
    for s in samples:
        g = s.gpus[3]
        assert g.utilization_ratio == 0 and g.memory_used_bytes == 30 * GIB
        assert (g.clock_events or {}).get("gpu_idle") is True and g.sm_clock_hertz == 210e6
    # Under-used, unallocated.
    assert max(series(samples, 6, lambda g: g.utilization_ratio)) < 0.15
    free = samples[-1].gpus[7]
    assert free.leaves[0].processes == () and free.utilization_ratio == 0 and (free.power_watts or 0) < 65
    assert not any(free.uuid in d.device_ids for d in backend.pod_devices())


def test_l40s_memory_bound_server_under_used_and_idle(minutes: dict[str, list[BackendSample]]) -> None:
    samples = minutes["l40s"]
    assert statistics.median(series(samples, 0, lambda g: g.utilization_ratio)) > 0.8
    assert min(series(samples, 0, lambda g: g.memory_utilization_ratio)) > 0.7, "memory-controller bound"
    assert 250 < statistics.median(series(samples, 0, lambda g: g.power_watts)) < 350
    util = series(samples, 1, lambda g: g.utilization_ratio)
    assert min(util) > 0 and max(util) < 0.15
    assert max(series(samples, 1, lambda g: g.memory_utilization_ratio)) < 0.1
    for index in (2, 3):
        assert set(series(samples, index, lambda g: g.utilization_ratio)) == {0.0}
        assert max(series(samples, index, lambda g: g.power_watts)) < 100, "P0 with a context, no work"
    assert samples[-1].gpus[3].memory_used_bytes == int(0.9 * 46068 * MIB) // (2 * MIB) * 2 * MIB


def test_a10g_fine_tune_at_the_power_limit_under_used_and_idle_shared(
    minutes: dict[str, list[BackendSample]],
) -> None:
    samples = minutes["a10g"]
    assert statistics.median(series(samples, 0, lambda g: g.utilization_ratio)) > 0.9
    assert statistics.median(series(samples, 0, lambda g: g.power_watts)) > 290
    # Data shard loads (GPU-Util near 0) pull ~11 GB/s over the Gen4 link, seen where NVML's
    # throughput sample (every 10th cycle of GPU 0) falls in one; the cycles between repeat the
    # last sample, so most of a 4 s load goes unseen, as on a real node.
    loading = {n + 1: s.gpus[0] for n, s in enumerate(samples) if (s.gpus[0].utilization_ratio or 0) < 0.1}
    read = [g for cycle, g in loading.items() if cycle % 10 == 0]
    assert read and all(5e9 < (g.pcie_rx_bytes_per_second or 0) < 31.5e9 for g in read), "shard loads"
    assert any((g.pcie_rx_bytes_per_second or 0) < 1e9 for cycle, g in loading.items() if cycle % 10 > 1)
    assert max(series(samples, 1, lambda g: g.utilization_ratio)) < 0.15
    backend = SimulatedBackend("a10g")
    shared = samples[0].gpus[3].uuid
    assert backend.sharing_replicas() == {shared: 4}
    holders = [d for d in backend.pod_devices() if any(i.startswith(shared + "::") for i in d.device_ids)]
    assert len(holders) == 2 and {d.resource for d in holders} == {"nvidia.com/gpu.shared"}
    for s in samples:
        for index in (2, 3):
            g = s.gpus[index]
            assert g.utilization_ratio == 0 and (g.memory_used_bytes or 0) >= 6 * GIB
        assert len(s.gpus[3].leaves[0].processes) == 2


# --- attribution of the A100's MIG instances -------------------------------------------------------


def test_a100_mig_instances_are_attributed_to_the_pods_holding_them() -> None:
    backend = SimulatedBackend("a100")
    sampler = Sampler(backend, attributor=simulated_attributor(backend))
    try:
        snap = sampler.run_once()
        snap = sampler.run_once()
    finally:
        sampler.stop()
    assert snap.attribution is not None
    leaves = {leaf.mig.mig_uuid: (g.uuid, leaf) for g in snap.backend.gpus for leaf in g.leaves if leaf.mig}
    mig_allocations = [a for a in snap.attribution.allocations if a.mig_uuid is not None]
    assert {a.mig_uuid for a in mig_allocations} == {m for m, (_, leaf) in leaves.items() if leaf.processes}, (
        "every instance with a pod, and no free one"
    )
    for a in mig_allocations:
        uuid, leaf = leaves[a.mig_uuid or ""]
        assert leaf.mig is not None
        assert a.uuid == uuid and a.resource == f"nvidia.com/mig-{leaf.mig.profile}" and a.replica is None
        assert a.pod.workload_kind in {"Deployment", "Job", "StatefulSet"}
        assert a.pod.pod.startswith(a.pod.workload or "?")
    got = {(a.resource, a.pod.workload) for a in mig_allocations}
    assert got == {
        ("nvidia.com/mig-3g.40gb", "llm-decode-small"),
        ("nvidia.com/mig-2g.20gb", "jupyter-frank"),
        ("nvidia.com/mig-1g.10gb", "tokenizer"),
        ("nvidia.com/mig-3g.40gb", "whisper-batch"),
        ("nvidia.com/mig-2g.20gb", "reranker"),
    }
    # The processes on each instance belong to the pod that holds it.
    tenants = snap.attribution.leaf_tenants
    assert tenants is not None
    for a in mig_allocations:
        assert tenants[a.mig_uuid or ""] == frozenset({(a.pod.namespace, a.pod.pod)})


# --- the GPM switch ------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", ["h200x8", "mig", "mps"])
def test_gpm_false_removes_gpm_from_an_h200_node_and_nothing_else_changes(scenario: str) -> None:
    on, off = run(scenario, 30), run(scenario, 30, gpm=False)
    assert all(s.gpm_supported for s in on) and not any(s.gpm_supported for s in off)
    assert any(leaf.gpm is not None for g in on[-1].gpus for leaf in g.leaves)
    for a, b in zip(on, off, strict=True):
        for ga, gb in zip(a.gpus, b.gpus, strict=True):
            assert all(leaf.gpm is None for leaf in gb.leaves)
            links = (*gb.links, *(x for leaf in gb.leaves for x in leaf.links))
            assert all(x.source == "sampled" for x in links) and all(x.link == PCIE for x in links)
            assert all(leaf.links == () for leaf in gb.leaves if leaf.mig), "no GPM, no per-instance bytes"
            # NVLink is there (its errors are read) but the H200's bytes came from GPM only.
            assert gb.nvlink_rx_bytes_per_second is None and gb.nvlink_errors == ga.nvlink_errors
            # The same random stream: every NVML reading but the links is gpm=True's.
            unlinked: dict[str, Any] = {
                "links": (),
                "pcie_tx_bytes_per_second": None,
                "pcie_rx_bytes_per_second": None,
                "nvlink_tx_bytes_per_second": None,
                "nvlink_rx_bytes_per_second": None,
            }

            def bare(leaf: LeafSample) -> LeafSample:
                return replace(leaf, gpm=None, links=())

            assert replace(ga, **unlinked, leaves=tuple(map(bare, ga.leaves))) == replace(
                gb, **unlinked, leaves=tuple(map(bare, gb.leaves))
            )


def test_gpm_switch_reaches_the_backend_from_simulation_create() -> None:
    assert Simulation.create("h200x8").backend.gpm is True
    off = Simulation.create("mig", seed=2, gpm=False).backend
    assert off.gpm is False and off.seed == 2
    off.sample()
    assert all(leaf.gpm is None for g in off.sample().gpus for leaf in g.leaves)
    # A pre-Hopper node has no GPM whichever way the switch is set.
    assert SimulatedBackend("a100", gpm=True).sample().gpm_supported is False
