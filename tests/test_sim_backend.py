"""The simulated backend: deterministic, realistic H200 roles, consistent pods, and every fault."""

from __future__ import annotations

import itertools
import re
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import pytest

from exporter.attribution import claims
from exporter.attribution.deviceids import DeviceIndex
from exporter.attribution.slices import SliceDirectory
from exporter.backends.base import GpuBackend
from exporter.backends.nvml.links import pcie_capacity
from exporter.model import NVLINK, PCIE, BackendSample, GpmSample, GpuSample, LeafSample
from exporter.sim import SCENARIOS, SimFaults, SimulatedBackend
from exporter.sim.scenarios import MIG_PROFILES

MIB = 1024**2
GIB = 1024**3
UUID_RE = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def run(backend: SimulatedBackend, n: int) -> list[BackendSample]:
    return [backend.sample() for _ in range(n)]


def series(samples: list[BackendSample], index: int, get: Callable[[GpuSample], float | None]) -> list[float]:
    """Values of ``get`` for GPU ``index`` over ``samples`` (skipping None)."""
    out = []
    for s in samples:
        value = get(s.gpus[index])
        if value is not None:
            out.append(value)
    return out


def gpm(gpu: GpuSample) -> GpmSample:
    assert gpu.leaves[0].gpm is not None
    return gpu.leaves[0].gpm


def val(x: float | None) -> float:
    assert x is not None
    return x


@pytest.fixture(scope="module")
def h200x8() -> list[BackendSample]:
    """Ten simulated minutes of the h200x8 node (covers training data loads and a checkpoint)."""
    return run(SimulatedBackend("h200x8", seed=0), 600)[1:]


# --- contract and determinism ------------------------------------------------------------


def test_is_a_gpu_backend_named_sim_and_close_is_idempotent() -> None:
    backend = SimulatedBackend()
    assert isinstance(backend, GpuBackend)
    assert backend.name == "sim"
    assert backend.scenario == "h200x8"
    backend.close()
    backend.close()


def test_unknown_scenario_names_it_and_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError) as err:
        SimulatedBackend("a100x4")
    assert "a100x4" in str(err.value)
    for name in ("h200x8", "mig", "mig7x8", "timeslice"):
        assert name in SCENARIOS
        assert name in str(err.value)


def test_same_seed_gives_the_same_samples_whatever_the_pace() -> None:
    a, b = SimulatedBackend("timeslice", seed=7), SimulatedBackend("timeslice", seed=7)
    first = run(a, 30)
    second = []
    for _ in range(30):
        second.append(b.sample())
        time.sleep(0.001)
    assert first == second


def test_different_seed_gives_different_values_but_the_same_identities() -> None:
    a = run(SimulatedBackend("h200x8", seed=1), 5)[-1]
    b = run(SimulatedBackend("h200x8", seed=2), 5)[-1]
    assert a != b
    assert [g.uuid for g in a.gpus] == [g.uuid for g in b.gpus]
    assert [g.power_watts for g in a.gpus] != [g.power_watts for g in b.gpus]


def test_windowed_signals_are_absent_on_the_first_sample_only() -> None:
    backend = SimulatedBackend("timeslice")
    first, second = backend.sample(), backend.sample()
    assert all(leaf.gpm is None for g in first.gpus for leaf in g.leaves)
    assert all(p.sm_util_ratio is None for g in first.gpus for leaf in g.leaves for p in leaf.processes)
    assert first.gpus[0].utilization_ratio is not None  # NVML GPU-Util is not windowed
    assert all(leaf.gpm is not None for g in second.gpus for leaf in g.leaves)
    assert all(p.sm_util_ratio is not None for g in second.gpus for leaf in g.leaves for p in leaf.processes)


def test_step_seconds_sets_the_window_and_energy_integrates_power() -> None:
    backend = SimulatedBackend("h200x8", step_seconds=5.0)
    samples = run(backend, 4)
    assert gpm(samples[-1].gpus[0]).window_seconds == 5.0
    for i in range(8):
        e0, e1 = samples[-2].gpus[i].energy_joules, samples[-1].gpus[i].energy_joules
        power = samples[-1].gpus[i].power_watts
        assert e0 is not None and e1 is not None and power is not None
        assert e1 - e0 == pytest.approx(power * 5.0, abs=0.01)
    assert backend.simulated_seconds == 15.0
    with pytest.raises(ValueError, match="step_seconds"):
        SimulatedBackend(step_seconds=0)


# --- realistic H200 values ------------------------------------------------------------------


def test_every_gpu_reads_like_an_h200_sxm() -> None:
    sample = run(SimulatedBackend("h200x8"), 2)[-1]
    assert sample.up and sample.driver_version == "580.159.04" and sample.gpm_supported
    assert len(sample.gpus) == 8
    for g in sample.gpus:
        assert g.name == "NVIDIA H200" and g.compute_capability == "9.0"
        assert g.memory_total_bytes == 143771 * MIB
        assert g.power_limit_watts == 700.0
        assert g.sm_clock_max_hertz == 1980e6 and g.memory_clock_hertz == 3201e6
        assert g.pcie_link_generation == 5 and g.pcie_link_width == 16
        assert re.fullmatch("GPU-" + UUID_RE, g.uuid)
        assert g.pci_bus_id is not None and re.fullmatch(r"00000000:[0-9A-F]{2}:00\.0", g.pci_bus_id)
        assert g.fan_speed_ratio is None  # passively cooled: NVML says NotSupported
        assert g.power_watts is not None and 60 < g.power_watts <= 700
    assert len({g.uuid for g in sample.gpus}) == 8


def test_link_health_and_temperature_limits_read_like_an_h200() -> None:
    for g in run(SimulatedBackend("h200x8"), 2)[-1].gpus:
        assert (g.pcie_link_max_generation, g.pcie_link_max_width) == (5, 16)
        assert dict(g.temperature_thresholds or {}) == {
            "slowdown": 89.0,
            "shutdown": 95.0,
            "gpu_max": 87.0,
            "memory_max": 95.0,
        }
        assert dict(g.nvlink_errors or {}) == {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0}
    for g in run(SimulatedBackend("mig"), 2)[-1].gpus:
        # NVLink is read only where its throughput is: not on a GPU in MIG mode.
        assert (g.nvlink_errors is None) == (g.mig_mode == "enabled") == (g.nvlink_rx_bytes_per_second is None)


def test_memory_bound_gpus_keep_dram_above_70_percent(h200x8: list[BackendSample]) -> None:
    for i in (0, 1):
        dram = series(h200x8, i, lambda g: gpm(g).dram_active)
        assert min(dram) > 0.7
        assert max(series(h200x8, i, lambda g: gpm(g).tensor_active)) < 0.3


def test_inference_server_load_follows_a_daily_curve(h200x8: list[BackendSample]) -> None:
    util = series(h200x8, 1, lambda g: g.utilization_ratio)
    assert max(util) - min(util) > 0.08


def test_training_gpus_are_tensor_bound_with_data_loading_stalls(h200x8: list[BackendSample]) -> None:
    for i in (2, 3):
        tensor = series(h200x8, i, lambda g: gpm(g).tensor_active)
        assert statistics.median(tensor) > 0.85
        assert statistics.median(series(h200x8, i, lambda g: gpm(g).dram_active)) < 0.3
        assert min(tensor) < 0.1  # the data loader stalls the GPU now and then
        stalled = [s.gpus[i] for s in h200x8 if val(gpm(s.gpus[i]).tensor_active) < 0.1]
        assert any((g.pcie_rx_bytes_per_second or 0) > 10e9 for g in stalled)
        capped = [s.gpus[i] for s in h200x8 if (s.gpus[i].clock_events or {}).get("sw_power_cap")]
        assert capped and all((g.sm_clock_hertz or 0) < 1980e6 for g in capped)
        assert max(series(h200x8, i, lambda g: g.nvlink_tx_bytes_per_second)) > 50e9
    # Data-parallel ranks step in lock step.
    assert series(h200x8, 2, lambda g: val(gpm(g).tensor_active) < 0.5) == series(
        h200x8, 3, lambda g: val(gpm(g).tensor_active) < 0.5
    )


def test_launch_bound_gpu_looks_busy_to_nvidia_smi_but_its_sms_are_idle(h200x8: list[BackendSample]) -> None:
    util = series(h200x8, 4, lambda g: g.utilization_ratio)
    assert all(0.19 <= u <= 0.27 for u in util)
    assert max(series(h200x8, 4, lambda g: gpm(g).sm_active)) < 0.01


def test_fp32_gpu_uses_the_fp32_pipe_not_tensor_cores(h200x8: list[BackendSample]) -> None:
    assert statistics.median(series(h200x8, 6, lambda g: gpm(g).fp32_active)) > 0.7
    assert max(series(h200x8, 6, lambda g: gpm(g).tensor_active)) == 0
    assert h200x8[-1].gpus[6].ecc_errors == {"corrected": 3, "uncorrected": 0}


def test_allocated_but_idle_gpu_holds_40_gib_held_by_a_pod_and_does_nothing(h200x8: list[BackendSample]) -> None:
    backend = SimulatedBackend("h200x8")
    for s in h200x8:
        g = s.gpus[5]
        assert g.memory_used_bytes == 40 * GIB
        assert g.utilization_ratio == 0 and gpm(g).sm_active == 0 and gpm(g).dram_active == 0
        assert (g.clock_events or {}).get("gpu_idle") is True
    (proc,) = h200x8[-1].gpus[5].leaves[0].processes
    assert proc.used_memory_bytes == 40 * GIB
    uid = backend.pid_owners()[proc.pid].pod_uid
    holders = [d for d in backend.pod_devices() if h200x8[0].gpus[5].uuid in d.device_ids]
    assert [d.pod_uid for d in holders] == [uid]
    assert {p.uid: p for p in backend.pods()}[uid].namespace == "notebooks"


def test_unallocated_gpu_is_idle_and_held_by_nobody(h200x8: list[BackendSample]) -> None:
    backend = SimulatedBackend("h200x8")
    g = h200x8[-1].gpus[7]
    assert g.leaves[0].processes == () and g.memory_used_bytes == 0
    assert g.utilization_ratio == 0 and gpm(g).sm_active == 0
    assert not any(g.uuid in d.device_ids for d in backend.pod_devices())
    busy = h200x8[-1].gpus[2]
    assert (g.power_watts or 0) < 100 < (busy.power_watts or 0)
    assert (g.temperature_celsius or 0) < (busy.temperature_celsius or 0)
    assert (g.sm_clock_hertz or 0) < (busy.sm_clock_hertz or 0)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_counters_only_grow_and_ratios_stay_in_range(scenario: str) -> None:
    samples = run(SimulatedBackend(scenario, seed=3), 120)[1:]
    for a, b in itertools.pairwise(samples):
        for ga, gb in zip(a.gpus, b.gpus, strict=True):
            assert (gb.energy_joules or 0) > (ga.energy_joules or 0)
    for s in samples:
        for g in s.gpus:
            for leaf in g.leaves:
                # Only the H200 has GPM; the pre-Hopper nodes have none (tests/test_sim_prehopper.py).
                assert (leaf.gpm is not None) == (g.name == "NVIDIA H200"), (scenario, g.name)
                window = leaf.gpm.window_seconds if leaf.gpm else None
                for value in (leaf.utilization_ratio, *(vars(leaf.gpm).values() if leaf.gpm else ())):
                    assert value is None or 0 <= value <= 1 or value == window
                assert (leaf.memory_used_bytes or 0) <= (leaf.memory_total_bytes or 0)
                for p in leaf.processes:
                    assert p.sm_util_ratio is None or 0 <= p.sm_util_ratio <= 1


# --- pods -------------------------------------------------------------------------------


def _device_targets(sample: BackendSample, replicas: dict[str, int]) -> set[str]:
    """Every device ID the kubelet could legitimately hand out on this node."""
    ids: set[str] = set()
    for g in sample.gpus:
        for leaf in g.leaves:
            if leaf.mig is not None:
                ids.add(leaf.mig.mig_uuid)
            elif g.uuid in replicas:
                ids.update(f"{g.uuid}::{n}" for n in range(replicas[g.uuid]))
            else:
                ids.add(g.uuid)
    return ids


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_pod_devices_owners_and_pids_are_consistent_with_the_gpus(scenario: str) -> None:
    backend = SimulatedBackend(scenario)
    sample = run(backend, 2)[-1]
    devices, owners, pids = backend.pod_devices(), {p.uid: p for p in backend.pods()}, backend.pid_owners()
    targets = _device_targets(sample, backend.sharing_replicas())
    held: dict[str, set[tuple[str | None, str]]] = {}
    # devices held through ResourceClaims, resolved through the node's published devices as the
    # exporter does (one claim may be shared by several pods: a time-sliced GPU)
    index, published = DeviceIndex(sample), SliceDirectory.of(backend.resource_slices())
    for c in backend.pod_claims():
        assert c.pod_uid in owners and (owners[c.pod_uid].namespace, owners[c.pod_uid].name) == (c.namespace, c.pod)
        what = claims.resolve(c, published, index, ())
        if c.claim.driver != "gpu.nvidia.com":
            assert what == claims.Resolved(), f"{c.claim} is left out"
            continue
        assert what.ref is not None, f"{c.claim} resolves to no GPU: {what.reason}"
        held.setdefault(what.ref.mig_uuid or what.ref.uuid, set()).add((c.pod_uid, c.container))
    for d in devices:
        assert d.pod_uid in owners
        o = owners[d.pod_uid]
        namespace, pod, phase, kind, workload = o.namespace, o.name, o.phase, o.workload_kind, o.workload
        assert (d.namespace, d.pod) == (namespace, pod)
        assert phase == "Running" and kind in {
            "Deployment",
            "Job",
            "StatefulSet",
            "CronJob",
            "PyTorchJob",
            "JobSet",
            "MPIJob",
            "DynamoGraphDeployment",  # the serving node's Dynamo pair (the top of its owner chain)
        }
        assert namespace in {"ml-training", "inference", "research", "notebooks", "etl"}
        assert workload is not None and pod.startswith(workload)
        if d.resource == "vpc.amazonaws.com/efa":  # the p5en nodes' NICs (tests/test_sim_network.py)
            assert d.device_ids and all(re.fullmatch(r"rdmap[0-9]+s[0-9]+", n) for n in d.device_ids)
            continue
        assert d.resource.startswith("nvidia.com/")
        for device in d.device_ids:
            assert device in targets, f"{device} matches no GPU, MIG instance or replica"
            assert device not in held, f"{device} allocated twice"
            held[device] = {(d.pod_uid, d.container)}
            if device.startswith("MIG-"):
                assert re.fullmatch("MIG-" + UUID_RE, device)
                assert d.resource.startswith("nvidia.com/mig-")
    # Every process belongs to a container that holds the device it runs on, except the MPS
    # server, which runs in the MPS control daemon's pod (that pod holds no GPU).
    procs = [(g, leaf, p) for g in sample.gpus for leaf in g.leaves for p in leaf.processes]
    assert procs and {p.pid for _, _, p in procs} == set(pids)
    for g, leaf, p in procs:
        owner = (pids[p.pid].pod_uid, pids[p.pid].container)
        if p.mps_role == "server":
            assert owners[owner[0]].name.startswith("nvidia-device-plugin-mps")
            continue
        if leaf.mig is not None:
            assert owner in held[leaf.mig.mig_uuid]
        else:
            assert any(owner in held[t] for t in held if t.split("::")[0] == g.uuid)
    # Role of the profile name in the resource.
    for d in devices:
        for device in d.device_ids:
            if device.startswith("MIG-"):
                leaf = next(lf for g in sample.gpus for lf in g.leaves if lf.mig and lf.mig.mig_uuid == device)
                assert leaf.mig is not None and d.resource == f"nvidia.com/mig-{leaf.mig.profile}"


def test_h200x8_pods_cover_the_owner_kinds_and_a_two_gpu_training_pod() -> None:
    backend = SimulatedBackend("h200x8")
    kinds = {o.workload_kind for o in backend.pods()}
    assert kinds == {"Deployment", "Job", "StatefulSet", "CronJob"}
    assert sorted(len(d.device_ids) for d in backend.pod_devices()) == [1, 1, 1, 1, 1, 2]
    assert backend.sharing_replicas() == {}


# --- MIG ---------------------------------------------------------------------------------


def test_mig_node_mixes_profiles_and_whole_gpus() -> None:
    sample = run(SimulatedBackend("mig"), 3)[-1]
    modes = [g.mig_mode for g in sample.gpus]
    assert modes.count("enabled") >= 4 and "disabled" in modes
    profiles = {leaf.mig.profile for g in sample.gpus for leaf in g.leaves if leaf.mig}
    assert profiles == set(MIG_PROFILES)
    for g in sample.gpus:
        if g.mig_mode == "disabled":
            assert len(g.leaves) == 1 and g.leaves[0].mig is None and g.utilization_ratio is not None
            continue
        assert g.utilization_ratio is None  # NVML: NotSupported in MIG mode
        slices = sum(MIG_PROFILES[leaf.mig.profile].compute_slices for leaf in g.leaves if leaf.mig)
        assert slices <= 7
        assert sum(leaf.memory_total_bytes or 0 for leaf in g.leaves) <= (g.memory_total_bytes or 0)
        assert g.memory_used_bytes == sum(leaf.memory_used_bytes or 0 for leaf in g.leaves)
        gis = [leaf.mig.gpu_instance_id for leaf in g.leaves if leaf.mig]
        assert len(set(gis)) == len(gis)
        for leaf in g.leaves:
            assert leaf.mig is not None and leaf.uuid == g.uuid
            assert leaf.memory_total_bytes == MIG_PROFILES[leaf.mig.profile].memory_bytes
            assert leaf.utilization_ratio is None and leaf.gpm is not None
            for p in leaf.processes:
                assert (p.gpu_instance_id, p.compute_instance_id) == (
                    leaf.mig.gpu_instance_id,
                    leaf.mig.compute_instance_id,
                )
                assert p.sm_util_ratio is None  # no per-process utilisation on MIG
    # 1g.18gb really is about 18 GB.
    assert 16 * GIB < MIG_PROFILES["1g.18gb"].memory_bytes < 19e9


def test_mig_leaves_carry_their_own_activity() -> None:
    samples = run(SimulatedBackend("mig"), 60)[1:]
    by_profile: dict[str, list[float]] = {}
    for s in samples:
        for g in s.gpus:
            for leaf in g.leaves:
                if leaf.mig and leaf.gpm and leaf.gpm.sm_active is not None:
                    by_profile.setdefault(leaf.mig.mig_uuid, []).append(leaf.gpm.sm_active)
    means = [statistics.mean(v) for v in by_profile.values()]
    assert min(means) == 0 and max(means) > 0.8  # idle instances next to busy ones


def test_mig7x8_has_56_one_slice_instances_and_200_processes() -> None:
    # How fast it samples is measured in bench/ (no timing asserts in tests: they fail on a busy CI).
    backend = SimulatedBackend("mig7x8")
    sample = run(backend, 2)[-1]
    leaves = [leaf for g in sample.gpus for leaf in g.leaves]
    assert len(sample.gpus) == 8 and len(leaves) == 56
    assert {leaf.mig.profile for leaf in leaves if leaf.mig} == {"1g.18gb"}
    assert 190 <= sum(len(leaf.processes) for leaf in leaves) <= 210


# --- time-slicing ------------------------------------------------------------------------


def test_timeslice_gpu0_has_four_replicas_held_by_three_pods_each_with_its_own_share() -> None:
    backend = SimulatedBackend("timeslice")
    samples = run(backend, 40)[1:]
    gpu0 = samples[-1].gpus[0].uuid
    assert backend.sharing_replicas()[gpu0] == 4
    holders = [d for d in backend.pod_devices() if any(i.startswith(gpu0 + "::") for i in d.device_ids)]
    assert len({d.pod_uid for d in holders}) == 3
    assert sorted(i for d in holders for i in d.device_ids) == [f"{gpu0}::{n}" for n in range(4)]
    assert all(d.resource == "nvidia.com/gpu.shared" for d in holders)
    for s in samples:
        leaf = s.gpus[0].leaves[0]
        assert len(leaf.processes) == 3
        shares = [p.sm_util_ratio or 0.0 for p in leaf.processes]
        assert sum(shares) <= (leaf.utilization_ratio or 0) + 1e-6
    # The processes' shares differ over time: each has its own load.
    per_pid = [[s.gpus[0].leaves[0].processes[k].sm_util_ratio for s in samples] for k in range(3)]
    assert per_pid[0] != per_pid[1] != per_pid[2]
    # Exclusive GPUs are plain GPU-<uuid> devices.
    exclusive = {i for d in backend.pod_devices() for i in d.device_ids if "::" not in i}
    assert {samples[-1].gpus[i].uuid for i in (4, 5, 6, 7)} == exclusive


# --- faults ------------------------------------------------------------------------------


def test_lost_gpu_reports_only_identity_and_the_others_do_not_change() -> None:
    faults = SimFaults()
    faulty, clean = SimulatedBackend("h200x8", faults=faults), SimulatedBackend("h200x8")
    run(faulty, 3), run(clean, 3)
    faults.lost.add(3)
    a, b = faulty.sample(), clean.sample()
    assert a.gpus[3] == GpuSample(index=3, uuid=b.gpus[3].uuid, up=False)
    # The others reach one GPU fewer over NVLink, and are otherwise unchanged.
    assert all([p.index for p in g.nvlink_peers or ()] == [i for i in range(8) if i not in (3, g.index)]
               for g in a.gpus if g.index != 3)  # fmt: skip
    assert [replace(g, nvlink_peers=None) for g in a.gpus if g.index != 3] == [
        replace(g, nvlink_peers=None) for g in b.gpus if g.index != 3
    ]
    faults.lost.clear()
    back = faulty.sample()
    assert back.gpus[3].up and back.gpus[3].leaves[0].gpm is None  # a fresh GPM window after loss
    clean.sample()
    a, b = faulty.sample(), clean.sample()
    assert a == b  # energy kept integrating while the GPU was lost


def test_unsupported_fields_read_none_on_gpus_leaves_and_gpm() -> None:
    faults = SimFaults(unsupported={"power_watts", "memory_used_bytes", "dram_active"})
    sample = run(SimulatedBackend("mig", faults=faults), 2)[-1]
    assert not sample.errors
    for g in sample.gpus:
        assert g.power_watts is None and g.memory_used_bytes is None
        assert g.temperature_celsius is not None
        for leaf in g.leaves:
            assert leaf.memory_used_bytes is None and leaf.gpm is not None
            assert leaf.gpm.dram_active is None and leaf.gpm.sm_active is not None
    faults.unsupported = {"gpm"}
    backend = SimulatedBackend("h200x8", faults=faults)
    sample = run(backend, 2)[-1]
    assert sample.gpm_supported is False
    assert all(leaf.gpm is None for g in sample.gpus for leaf in g.leaves)


def test_unknown_fault_fields_are_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="fan_speed"):
        SimFaults(unsupported={"fan_speed"})
    with pytest.raises(ValueError, match="bogus"):
        SimFaults(transient={"bogus": 2})


def test_transient_error_fails_for_n_cycles_counts_unknown_then_recovers() -> None:
    faults = SimFaults()
    backend = SimulatedBackend("h200x8", faults=faults)
    backend.sample()
    faults.transient["temperature_celsius"] = 2
    for _ in range(2):
        s = backend.sample()
        assert all(g.temperature_celsius is None for g in s.gpus)
        assert s.errors == {"unknown": 8}
    s = backend.sample()
    assert all(g.temperature_celsius is not None for g in s.gpus)
    assert not s.errors
    assert faults.transient == {}


def test_transient_leaf_field_counts_one_error_per_leaf_that_has_it() -> None:
    faults = SimFaults()
    backend = SimulatedBackend("mig", faults=faults)
    sample = run(backend, 2)[-1]
    leaves = sum(len(g.leaves) for g in sample.gpus)
    faults.transient = {"sm_active": 1}
    s = backend.sample()
    assert s.errors == {"unknown": leaves}
    assert all(leaf.gpm is not None and leaf.gpm.sm_active is None for g in s.gpus for leaf in g.leaves)


def test_hang_blocks_sample_and_clearing_it_releases_the_call() -> None:
    faults = SimFaults(hang_seconds=0.3)
    backend = SimulatedBackend("h200x8", faults=faults)
    t0 = time.monotonic()
    assert backend.sample().up
    assert time.monotonic() - t0 >= 0.29
    faults.hang_seconds = 30.0
    done = threading.Event()

    def blocked_sample() -> None:
        backend.sample()
        done.set()

    threading.Thread(target=blocked_sample, daemon=True).start()
    assert not done.wait(0.2)
    faults.hang_seconds = 0.0
    assert done.wait(2.0)


def test_unavailable_answers_up_false_then_recovers_with_a_fresh_window() -> None:
    faults = SimFaults(unavailable=True)
    backend = SimulatedBackend("h200x8", faults=faults)
    down = backend.sample()
    assert down == BackendSample(up=False, error="NVML library not found (simulated)")
    faults.unavailable = False
    up = backend.sample()
    assert up.up and len(up.gpus) == 8
    assert up.gpus[0].leaves[0].gpm is None
    assert backend.sample().gpus[0].leaves[0].gpm is not None


def test_xid_is_delivered_once_and_waits_while_the_gpu_is_lost() -> None:
    faults = SimFaults(xid={2: [79, 48]}, lost={5})
    faults.xid[5] = [31]
    backend = SimulatedBackend("h200x8", faults=faults)
    s = backend.sample()
    assert s.gpus[2].xid_events == (79, 48)
    assert all(g.xid_events == () for g in s.gpus if g.index != 2)
    assert backend.sample().gpus[2].xid_events == ()
    faults.lost.clear()
    assert backend.sample().gpus[5].xid_events == (31,)
    assert backend.sample().gpus[5].xid_events == ()


def test_a_degraded_pcie_link_reads_its_trained_generation_and_width_and_capacity() -> None:
    faults = SimFaults()
    faulty, clean = SimulatedBackend("h200x8", faults=faults), SimulatedBackend("h200x8")
    run(faulty, 2), run(clean, 2)
    faults.pcie_link[2] = (4, 8)
    a, b = faulty.sample(), clean.sample()
    g = a.gpus[2]
    assert (g.pcie_link_generation, g.pcie_link_width) == (4, 8)
    assert (g.pcie_link_max_generation, g.pcie_link_max_width) == (5, 16)
    gen4_x8 = pcie_capacity(None, 4, 8)
    pcie = [x for x in (*g.links, *g.leaves[0].links) if x.link == PCIE]
    assert len(pcie) == 2 and all(x.capacity_bytes_per_second == gen4_x8 for x in pcie)
    assert [x for x in g.links if x.link != PCIE] == [x for x in b.gpus[2].links if x.link != PCIE]
    assert [x for x in a.gpus if x.index != 2] == [x for x in b.gpus if x.index != 2]
    faults.pcie_link.clear()
    assert faulty.sample() == clean.sample()


def test_nvlink_errors_grow_by_the_fault_each_cycle_and_stay_after_it() -> None:
    faults = SimFaults.parse("nvlink_errors=1:crc_data:5,1:replay:1")
    backend = SimulatedBackend("h200x8", faults=faults)
    counts = [dict(s.gpus[1].nvlink_errors or {}) for s in run(backend, 3)]
    assert [c["crc_data"] for c in counts] == [5, 10, 15]
    assert [c["replay"] for c in counts] == [1, 2, 3]
    assert counts[-1]["recovery"] == counts[-1]["crc_flit"] == 0
    faults.lost.add(1)
    backend.sample()  # counted while lost, like energy
    faults.lost.clear()
    faults.nvlink_errors.clear()
    last = backend.sample()
    assert dict(last.gpus[1].nvlink_errors or {})["crc_data"] == 20, "a counter: it stays after the fault"
    assert all(set((g.nvlink_errors or {}).values()) == {0} for g in last.gpus if g.index != 1)


def test_fault_spec_parses_every_kind() -> None:
    f = SimFaults.parse(
        "lost=3,5; unsupported=fan_speed_ratio,pcie_tx_bytes_per_second;hang=30;"
        "transient=power_watts:3,gpm;unavailable;xid=2:79,2:48,4:31;pcie_link=2:4:16,3:5:8;"
        "nvlink_errors=1:crc_data:5,1:recovery:1;nvlink_down=2:5,2:11"
    )
    assert f.pcie_link == {2: (4, 16), 3: (5, 8)}
    assert f.nvlink_down == {(2, 5), (2, 11)}
    assert f.nvlink_errors == {(1, "crc_data"): 5, (1, "recovery"): 1}
    assert f.lost == {3, 5}
    assert f.unsupported == {"fan_speed_ratio", "pcie_tx_bytes_per_second"}
    assert f.hang_seconds == 30.0
    assert f.transient == {"power_watts": 3, "gpm": 1}
    assert f.unavailable is True
    assert f.xid == {2: [79, 48], 4: [31]}
    assert SimFaults.parse("unavailable=false").unavailable is False
    empty = SimFaults.parse("")
    assert (empty.lost, empty.unsupported, empty.transient, empty.hang_seconds, empty.xid) == (set(), set(), {}, 0, {})


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("lost=x", "lost=x"),
        ("lost=3;unsupported=fan", "unsupported=fan"),
        ("hang=-1", "hang=-1"),
        ("explode=1", "explode=1"),
        ("xid=79", "xid=79"),
        ("transient=power_watts:many", "transient=power_watts:many"),
        ("unavailable=maybe", "unavailable=maybe"),
        ("pcie_link=2:4", "pcie_link=2:4"),
        ("nvlink_errors=1:crc:5", "nvlink_errors=1:crc:5"),
        ("nvlink_down=2:x", "nvlink_down=2:x"),
    ],
)
def test_bad_fault_spec_names_the_bad_part(spec: str, named: str) -> None:
    with pytest.raises(ValueError) as err:
        SimFaults.parse(spec)
    assert named in str(err.value)


def test_faults_can_be_flipped_from_another_thread_while_sampling() -> None:
    faults = SimFaults()
    backend = SimulatedBackend("h200x8", faults=faults)
    stop = threading.Event()

    def flip() -> None:
        n = 0
        while not stop.is_set():
            faults.lost = {n % 8}
            faults.unsupported.symmetric_difference_update({"power_watts"})
            faults.transient["dram_active"] = 1
            faults.xid.setdefault(n % 8, []).append(13)
            n += 1
            # Yield the interpreter between flips: a loop that never sleeps takes the GIL from the
            # sampler for whole switch intervals (2 s of CPU for nothing more than this tests).
            stop.wait(0.0005)

    thread = threading.Thread(target=flip, daemon=True)
    thread.start()
    try:
        samples = run(backend, 200)
    finally:
        stop.set()
        thread.join(2.0)
    assert all(s.up and len(s.gpus) == 8 for s in samples)
    assert sum(1 for s in samples for g in s.gpus if not g.up) >= 100


def test_leaf_sample_fields_are_valid_fault_targets() -> None:
    # Every LeafSample and GpmSample value field can be switched off by name.
    backend = SimulatedBackend(
        "timeslice", faults=SimFaults(unsupported={"utilization_ratio", "sm_occupancy", "memory_total_bytes"})
    )
    leaf: LeafSample = run(backend, 2)[-1].gpus[0].leaves[0]
    assert leaf.utilization_ratio is None and leaf.memory_total_bytes is None
    assert leaf.gpm is not None and leaf.gpm.sm_occupancy is None and leaf.gpm.tensor_active is not None


@pytest.mark.parametrize(("scenario", "links"), [("h200x8", 18), ("a100", 12), ("l40s", 0), ("mig", 18)])
def test_nvlink_states_and_peers_follow_the_model(scenario: str, links: int) -> None:
    """Every GPU of an NVSwitch board trains all its links and reaches every other over all of
    them (NV18 on an H200, NV12 on an A100); a PCIe card has none; a GPU in MIG mode shows none."""
    gpus = run(SimulatedBackend(scenario), 2)[-1].gpus
    linked = [g for g in gpus if g.nvlinks]
    for g in gpus:
        if g.mig_mode == "enabled" or not links:
            assert g.nvlinks == () and g.nvlink_peers is None
            continue
        assert [(x.link, x.active, x.remote) for x in g.nvlinks] == [(i, True, "switch") for i in range(links)]
        assert [(p.uuid, p.links) for p in g.nvlink_peers or ()] == [(o.uuid, links) for o in linked if o is not g]
    assert bool(linked) == bool(links)


def test_an_nvlink_down_reads_inactive_narrows_the_capacity_and_the_peers_see_one_link_fewer() -> None:
    faults = SimFaults.parse("nvlink_down=2:5,2:11")
    backend = SimulatedBackend("h200x8", faults=faults)
    gpus = run(backend, 3)[-1].gpus
    two = gpus[2]
    assert [x.link for x in two.nvlinks if not x.active] == [5, 11]
    assert sum(x.active for x in two.nvlinks) == 16 and len(two.nvlinks) == 18
    nvlink = {x.link: x for x in two.links}[NVLINK]
    whole = {x.link: x for x in gpus[0].links}[NVLINK]
    assert whole.capacity_bytes_per_second is not None
    assert nvlink.capacity_bytes_per_second == pytest.approx(whole.capacity_bytes_per_second * 16 / 18)
    assert {p.index: p.links for p in two.nvlink_peers or ()} == {i: 16 for i in range(8) if i != 2}
    assert {p.index: p.links for p in gpus[0].nvlink_peers or ()}[2] == 18  # its own 18 links reach GPU 2
    faults.nvlink_down.clear()
    back = run(backend, 1)[-1].gpus[2]
    assert all(x.active for x in back.nvlinks) and {p.links for p in back.nvlink_peers or ()} == {18}
