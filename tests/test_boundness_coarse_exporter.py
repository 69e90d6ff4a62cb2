"""Leaves without GPM through the exporter: the NVML backend over the fake driver (a pre-Hopper GPU,
a Hopper GPU with --no-collect.gpm, an A100's MIG instances) and the simulator with GPM off export
a busy ratio, its integral, the coarse class and ``gpulens_gpu_analysis_info{signals}``."""

from __future__ import annotations

import inspect

import pytest
from prometheus_client import CollectorRegistry

from exporter.analysis.boundness import BoundnessClassifier
from exporter.backends.nvml.backend import NvmlBackend
from exporter.cli import build
from exporter.config import parse_config
from exporter.model import COARSE_CLASSES, Snapshot
from exporter.render.collector import SnapshotCollector
from exporter.sampler import Sampler
from tests.fakes.fake_pynvml import FakeGpu, FakeMig, FakeNvml, FakeProcess
from tests.support.nvml_node import Clock, h200

SM, GRAPHICS = 2, 1


def a100(i: int = 0, **kw: object) -> FakeGpu:
    """A GPU without GPM (Ampere): NVML answers the GPM support query with 'not supported'."""
    return h200(i, name="NVIDIA A100-SXM4-80GB", compute_capability=(8, 0), gpm_supported=False, **kw)


def leaf_labels(uuid: str, mig_uuid: str = "", gi: str = "", ci: str = "", profile: str = "") -> dict[str, str]:
    return {
        "gpu": "0",
        "uuid": uuid,
        "mig_uuid": mig_uuid,
        "gpu_instance_id": gi,
        "compute_instance_id": ci,
        "mig_profile": profile,
    }


def run(backend: NvmlBackend, clock: Clock, steps: list[float]) -> tuple[Sampler, CollectorRegistry]:
    """One sampler cycle per step, the clock advanced by the step's seconds before each."""
    sampler = Sampler(backend, classifier=BoundnessClassifier(), clock=clock)
    for step in steps:
        clock.now += step
        sampler.run_once()
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(sampler.latest, backend="nvml"))
    return sampler, registry


def boundness(reg: CollectorRegistry, labels: dict[str, str]) -> str | None:
    """The class that is 1 in the leaf's state set, ``None`` when the set is absent."""
    on = [c for c in ("idle", "launch", "latency", "memory", "compute", "mixed", "transfer", "busy")
          if reg.get_sample_value("gpulens_gpu_boundness", {**labels, "class": c}) == 1]  # fmt: skip
    assert len(on) <= 1, on
    return on[0] if on else None


def test_a_gpu_without_gpm_exports_its_gpu_util_as_busy_ratio_and_integrates_it_over_each_cycle() -> None:
    clock = Clock()
    fake = FakeNvml([a100(0, util_gpu=60, util_memory=20, power_mw=300_000, power_limit_mw=400_000)])
    backend = NvmlBackend(nvml=fake, clock=clock, wall_clock=clock.wall)
    sampler, reg = run(backend, clock, [1.0, 1.0, 2.0, 0.5])
    labels = leaf_labels(fake.gpus[0].uuid)
    assert reg.get_sample_value("gpulens_gpu_busy_ratio", labels) == pytest.approx(0.6)
    # The first cycle starts the counter at 0; each later one adds 0.6 x the seconds since the last.
    assert reg.get_sample_value("gpulens_gpu_busy_seconds_total", labels) == pytest.approx(0.6 * 3.5)
    assert reg.get_sample_value("gpulens_gpu_analysis_info", {**labels, "signals": "nvml"}) == 1
    assert boundness(reg, labels) == "busy"
    assert reg.get_sample_value("gpulens_gpu_sm_active_seconds_total", labels) is None, "no GPM integral made up"
    sampler.stop()


def test_a_gpu_without_gpm_running_a_memory_heavy_load_reads_memory() -> None:
    clock = Clock()
    fake = FakeNvml([a100(0, util_gpu=100, util_memory=85, power_mw=250_000, power_limit_mw=400_000)])
    _, reg = run(NvmlBackend(nvml=fake, clock=clock, wall_clock=clock.wall), clock, [1.0] * 5)
    assert boundness(reg, leaf_labels(fake.gpus[0].uuid)) == "memory"


def test_a_gpu_without_gpm_drawing_idle_power_while_kernels_run_reads_launch() -> None:
    clock = Clock()
    gpu = a100(0, util_gpu=0, power_mw=60_000, power_limit_mw=400_000)
    fake = FakeNvml([gpu])
    backend = NvmlBackend(nvml=fake, clock=clock, wall_clock=clock.wall)
    sampler = Sampler(backend, classifier=BoundnessClassifier(), clock=clock)
    for _ in range(5):  # idle first: the exporter learns what the GPU draws doing nothing
        clock.now += 1.0
        sampler.run_once()
    gpu.util_gpu, gpu.power_mw = 25, 66_000  # tiny kernels: a quarter busy, 6 W more
    for _ in range(15):
        clock.now += 1.0
        snap = sampler.run_once()
    assert snap.analysis[gpu.uuid].boundness == "launch"
    assert snap.analysis[gpu.uuid].busy_ratio == pytest.approx(0.25)
    sampler.stop()


def test_no_collect_gpm_never_samples_gpm_on_a_hopper_gpu_and_reads_it_coarsely() -> None:
    clock = Clock()
    fake = FakeNvml([h200(0, util_gpu=100, util_memory=30, power_mw=650_000, gpm={SM: 97.0, GRAPHICS: 100.0})])
    backend = NvmlBackend(nvml=fake, clock=clock, wall_clock=clock.wall, gpm=False)
    sampler, reg = run(backend, clock, [1.0] * 4)
    snap = sampler.latest()
    assert snap is not None and snap.backend.gpm_supported is False
    labels = leaf_labels(fake.gpus[0].uuid)
    assert reg.get_sample_value("gpulens_gpu_analysis_info", {**labels, "signals": "nvml"}) == 1
    assert reg.get_sample_value("gpulens_gpu_busy_ratio", labels) == 1.0
    assert reg.get_sample_value("gpulens_gpu_sm_active_ratio", labels) is None
    assert boundness(reg, labels) == "busy"
    gpm_calls = {name: n for name, n in fake.calls.items() if "Gpm" in name}
    assert gpm_calls == {}, gpm_calls
    sampler.stop()


def test_with_gpm_the_same_gpu_reads_gpm_classes() -> None:
    # The control for the test above: the fake GPU does give GPM windows when GPM is on.
    clock = Clock()
    fake = FakeNvml([h200(0, util_gpu=100, util_memory=30, power_mw=650_000, gpm={SM: 97.0, GRAPHICS: 100.0})])
    _, reg = run(NvmlBackend(nvml=fake, clock=clock, wall_clock=clock.wall), clock, [1.0] * 4)
    labels = leaf_labels(fake.gpus[0].uuid)
    assert reg.get_sample_value("gpulens_gpu_analysis_info", {**labels, "signals": "gpm"}) == 1
    assert boundness(reg, labels) == "latency"


def test_mig_instances_without_gpm_read_idle_without_processes_and_nothing_with_them() -> None:
    clock = Clock()
    running = FakeMig(
        "MIG-run",
        gpu_instance_id=1,
        processes=[FakeProcess(pid=11, used_memory=1 << 30, gpu_instance_id=1, compute_instance_id=0)],
    )
    empty = FakeMig("MIG-empty", gpu_instance_id=2)
    fake = FakeNvml([a100(0, mig_mode=1, util_gpu=40, migs=[running, empty])])
    sampler, reg = run(NvmlBackend(nvml=fake, clock=clock, wall_clock=clock.wall), clock, [1.0] * 4)
    uuid = fake.gpus[0].uuid
    snap: Snapshot | None = sampler.latest()
    assert snap is not None
    for mig in ("MIG-run", "MIG-empty"):
        leaf = snap.analysis[mig]
        assert leaf.signals == "processes" and leaf.busy_ratio is None and leaf.busy_seconds is None, leaf
    assert snap.analysis["MIG-run"].boundness is None
    assert snap.analysis["MIG-empty"].boundness == "idle"
    assert (
        reg.get_sample_value("gpulens_gpu_analysis_info", {**_mig_labels(snap, "MIG-empty"), "signals": "processes"})
        == 1
    )
    assert reg.get_sample_value("gpulens_gpu_busy_ratio", _mig_labels(snap, "MIG-run")) is None
    assert uuid not in snap.analysis or snap.analysis[uuid].busy_ratio is None
    sampler.stop()


def _mig_labels(snap: Snapshot, mig_uuid: str) -> dict[str, str]:
    gpu = snap.backend.gpus[0]
    leaf = next(leaf for leaf in gpu.leaves if leaf.leaf_id == mig_uuid)
    assert leaf.mig is not None
    return leaf_labels(
        gpu.uuid, mig_uuid, str(leaf.mig.gpu_instance_id), str(leaf.mig.compute_instance_id), leaf.mig.profile
    )


def test_gpm_leaves_keep_no_busy_ratio_before_their_first_window() -> None:
    # The GPM path as before: a Hopper GPU's first cycle has no GPM window and exports nothing derived.
    clock = Clock()
    fake = FakeNvml([h200(0, util_gpu=100, gpm={SM: 97.0, GRAPHICS: 100.0})])
    sampler, reg = run(NvmlBackend(nvml=fake, clock=clock, wall_clock=clock.wall), clock, [1.0])
    labels = leaf_labels(fake.gpus[0].uuid)
    assert reg.get_sample_value("gpulens_gpu_busy_ratio", labels) is None
    assert reg.get_sample_value("gpulens_gpu_busy_seconds_total", labels) is None
    assert boundness(reg, labels) is None
    assert reg.get_sample_value("gpulens_gpu_analysis_info", {**labels, "signals": "gpm"}) == 1
    sampler.stop()


# --- the flag, end to end on the simulator -----------------------------------------------------------


def _sim_has_gpm_switch() -> bool:
    from exporter.sim import Simulation

    return "gpm" in inspect.signature(Simulation.create).parameters


@pytest.mark.parametrize("flag", ["--no-collect.gpm", None])
def test_the_simulated_h200_node_without_gpm_reads_every_leaf_from_nvml(flag: str | None) -> None:
    if not _sim_has_gpm_switch():
        pytest.fail("Simulation.create(..., gpm=...) is missing: exporter/sim must take the GPM switch")
    argv = ["--backend", "sim", "--sim.scenario", "h200x8", "--no-probes"] + ([flag] if flag else [])
    sampler, _, _ = build(parse_config(argv, env={}))
    try:
        for _ in range(15):
            snap = sampler.run_once()
    finally:
        sampler.stop()
    leaves = [leaf for gpu in snap.backend.gpus for leaf in gpu.leaves]
    assert len(leaves) == 8
    signals = {snap.analysis[leaf.leaf_id].signals for leaf in leaves}
    classes = {snap.analysis[leaf.leaf_id].boundness for leaf in leaves}
    if flag is None:
        assert signals == {"gpm"} and "busy" not in classes
        return
    assert signals == {"nvml"}
    assert all(leaf.gpm is None for leaf in leaves)
    assert classes <= set(COARSE_CLASSES) and {"idle", "busy"} <= classes, classes
    assert all(snap.analysis[leaf.leaf_id].busy_seconds is not None for leaf in leaves)


def test_the_simulated_a100_node_reads_its_whole_gpus_from_nvml_and_its_mig_instances_from_processes() -> None:
    sampler, _, _ = build(parse_config(["--backend", "sim", "--sim.scenario", "a100", "--no-probes"], env={}))
    try:
        for _ in range(15):
            snap = sampler.run_once()
    finally:
        sampler.stop()
    whole = [leaf for gpu in snap.backend.gpus for leaf in gpu.leaves if leaf.mig is None]
    migs = [leaf for gpu in snap.backend.gpus for leaf in gpu.leaves if leaf.mig is not None]
    assert whole and migs
    for leaf in whole:
        analysis = snap.analysis[leaf.leaf_id]
        assert analysis.signals == "nvml" and analysis.busy_ratio is not None and analysis.busy_seconds is not None
        assert analysis.boundness in COARSE_CLASSES
    for leaf in migs:
        analysis = snap.analysis[leaf.leaf_id]
        assert analysis.signals == "processes" and analysis.busy_ratio is None
        assert analysis.boundness == (None if leaf.processes else "idle"), leaf
