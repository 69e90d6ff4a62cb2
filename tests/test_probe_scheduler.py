"""The probe scheduler: when it probes, when it refuses to, and how it survives bad probes."""

from __future__ import annotations

import itertools
import logging
import random
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from exporter.model import (
    Allocation,
    Attribution,
    BackendSample,
    GpmSample,
    GpuSample,
    LeafSample,
    MigInstance,
    PodRef,
    ProcessSample,
    Snapshot,
)
from exporter.probe_scheduler import (
    RESULTS,
    ProbeOptions,
    ProbeOutcome,
    ProbeRequest,
    ProbeScheduler,
    parse_probe_output,
)
from exporter.render.collector import SnapshotCollector
from exporter.sampler import Sampler
from exporter.sim.probes import SimulatedProbeRunner
from tests.fakes_backend import ScriptedBackend

GiB = 1 << 30
REPO = Path(__file__).resolve().parents[1]
H200_OK = {"hbm_copy": 4.0e12, "h2d": 55e9, "d2h": 55e9}


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeRunner:
    """Records requests and answers with a fixed outcome; ``gate`` holds a run until set."""

    def __init__(self, outcome: ProbeOutcome | None = None) -> None:
        self.outcome = outcome or ProbeOutcome("ok", H200_OK)
        self.requests: list[ProbeRequest] = []
        self.gate: threading.Event | None = None
        self.cancelled = False

    def run(self, request: ProbeRequest) -> ProbeOutcome:
        self.requests.append(request)
        if self.gate is not None:
            self.gate.wait(10)
        return self.outcome

    def cancel(self) -> None:
        self.cancelled = True
        if self.gate is not None:
            self.gate.set()


def idle_gpu(index: int = 0, **kw: object) -> GpuSample:
    """An idle whole H200 with 1 GiB of 141 GiB used; keyword overrides apply to the GPU."""
    uuid = f"GPU-{index:08d}-aaaa-bbbb-cccc-000000000000"
    leaf = LeafSample(
        uuid=uuid,
        memory_used_bytes=GiB,
        memory_total_bytes=141 * GiB,
        utilization_ratio=0.0,
        gpm=GpmSample(window_seconds=1.0, sm_active=0.0, dram_active=0.0),
    )
    fields: dict[str, object] = {
        "index": index,
        "uuid": uuid,
        "name": "NVIDIA H200",
        "compute_mode": "default",
        "utilization_ratio": 0.0,
        "memory_used_bytes": GiB,
        "memory_total_bytes": 141 * GiB,
        "leaves": (leaf,),
    }
    fields.update(kw)
    return GpuSample(**fields)  # type: ignore[arg-type]


def with_leaf(gpu: GpuSample, **kw: object) -> GpuSample:
    """``gpu`` with its single leaf changed."""
    return replace(gpu, leaves=(replace(gpu.leaves[0], **kw),))  # type: ignore[arg-type]


def snap(*gpus: GpuSample, attribution: Attribution | None = None) -> Snapshot:
    return Snapshot(timestamp=0.0, backend=BackendSample(up=True, gpus=gpus), attribution=attribution)


def options(**kw: object) -> ProbeOptions:
    base: dict[str, object] = {
        "enabled": True,
        "interval_seconds": 3600.0,
        "jitter_ratio": 0.0,
        "first_delay_seconds": 0.0,
        "retry_seconds": 600.0,
        "timeout_seconds": 10.0,
    }
    base.update(kw)
    return ProbeOptions(**base)  # type: ignore[arg-type]


def make(runner: FakeRunner | SimulatedProbeRunner | None = None, **kw: object) -> tuple[ProbeScheduler, Clock]:
    clock = Clock()
    sched = ProbeScheduler(options(**kw), clock=clock, wall=lambda: 1.7e9, runner=runner, rng=random.Random(7))
    return sched, clock


def runs(sched: ProbeScheduler, uuid: str, result: str) -> int:
    return sched.results()[1].get((uuid, result), 0)


def observe_and_wait(sched: ProbeScheduler, snapshot: Snapshot) -> None:
    sched.observe(snapshot)
    assert sched.wait_until_idle(30)


# --- a healthy run ----------------------------------------------------------------------------


def test_idle_gpu_is_probed_and_its_results_cached_with_efficiency() -> None:
    runner = FakeRunner()
    sched, _ = make(runner)
    gpu = idle_gpu()
    observe_and_wait(sched, snap(gpu))
    results, counts = sched.results()
    assert counts[(gpu.uuid, "ok")] == 1
    by_probe = {r.probe: r for r in results}
    assert set(by_probe) == {"hbm_copy", "h2d", "d2h"}
    assert by_probe["hbm_copy"].bandwidth_bytes_per_second == 4.0e12
    assert by_probe["hbm_copy"].efficiency_ratio is not None
    assert 0.9 < by_probe["hbm_copy"].efficiency_ratio < 1.1
    assert by_probe["h2d"].efficiency_ratio == pytest.approx(1.0)
    assert by_probe["hbm_copy"].last_success_timestamp == 1.7e9
    assert runner.requests[0].uuid == gpu.uuid
    assert all(counts[(gpu.uuid, r)] == 0 for r in RESULTS if r != "ok"), "every result starts at 0"


def test_disabled_probes_never_run() -> None:
    runner = FakeRunner()
    sched, _ = make(runner, enabled=False)
    observe_and_wait(sched, snap(idle_gpu()))
    assert runner.requests == []
    assert sched.results() == ((), {})


def test_real_numpy_probe_runs_through_the_child_process() -> None:
    cmd = (sys.executable, "-m", "probes", "--array", "numpy", "--repeats", "2")
    sched, _ = make(None, command=cmd, timeout_seconds=60.0)
    gpu = idle_gpu()
    observe_and_wait(sched, snap(gpu))
    results, counts = sched.results()
    assert counts[(gpu.uuid, "ok")] == 1, counts
    assert {r.probe for r in results} == {"hbm_copy", "h2d", "d2h"}
    assert all(r.bandwidth_bytes_per_second and r.bandwidth_bytes_per_second > 0 for r in results)


# --- gates ------------------------------------------------------------------------------------

BUSY_CASES = {
    "a compute process": lambda g: with_leaf(g, processes=(ProcessSample(pid=42),)),
    "utilisation above threshold": lambda g: with_leaf(replace(g, utilization_ratio=0.3), utilization_ratio=0.3),
    "GPM SM activity above threshold": lambda g: with_leaf(g, gpm=GpmSample(window_seconds=1.0, sm_active=0.6)),
}


@pytest.mark.parametrize("case", list(BUSY_CASES))
def test_busy_gpu_is_skipped_as_busy(case: str) -> None:
    runner = FakeRunner()
    sched, _ = make(runner)
    gpu = BUSY_CASES[case](idle_gpu())
    observe_and_wait(sched, snap(gpu))
    assert runner.requests == []
    assert runs(sched, gpu.uuid, "skipped_busy") == 1
    assert sched.results()[0] == ()


def test_utilisation_at_the_threshold_is_not_busy() -> None:
    runner = FakeRunner()
    sched, _ = make(runner, max_utilization_ratio=0.05)
    gpu = with_leaf(replace(idle_gpu(), utilization_ratio=0.05), utilization_ratio=0.05)
    observe_and_wait(sched, snap(gpu))
    assert len(runner.requests) == 1


def test_short_free_memory_is_skipped_as_memory() -> None:
    runner = FakeRunner()
    sched, _ = make(runner, min_free_memory_bytes=4 * GiB)
    gpu = with_leaf(idle_gpu(), memory_used_bytes=138 * GiB)  # 3 GiB free
    observe_and_wait(sched, snap(gpu))
    assert runner.requests == []
    assert runs(sched, gpu.uuid, "skipped_memory") == 1


def test_unknown_free_memory_is_treated_as_short() -> None:
    runner = FakeRunner()
    sched, _ = make(runner)
    gpu = replace(
        with_leaf(idle_gpu(), memory_used_bytes=None, memory_total_bytes=None),
        memory_used_bytes=None,
    )
    observe_and_wait(sched, snap(gpu))
    assert runs(sched, gpu.uuid, "skipped_memory") == 1


def test_exclusive_process_mode_is_skipped() -> None:
    runner = FakeRunner()
    sched, _ = make(runner)
    gpu = idle_gpu(compute_mode="exclusive_process")
    observe_and_wait(sched, snap(gpu))
    assert runner.requests == []
    assert runs(sched, gpu.uuid, "skipped_exclusive") == 1


def _allocated_to_pod(uuid: str, mig_uuid: str | None = None) -> Attribution:
    pod = PodRef(namespace="ml", pod="train-0", container="main")
    return Attribution(allocations=(Allocation(pod=pod, resource="nvidia.com/gpu", uuid=uuid, mig_uuid=mig_uuid),))


def test_gpu_allocated_to_a_pod_is_skipped_unless_allowed() -> None:
    gpu = idle_gpu()
    runner = FakeRunner()
    sched, _ = make(runner)
    observe_and_wait(sched, snap(gpu, attribution=_allocated_to_pod(gpu.uuid)))
    assert runner.requests == []
    assert runs(sched, gpu.uuid, "skipped_allocated") == 1

    runner2 = FakeRunner()
    allowed, _ = make(runner2, skip_allocated=False)
    observe_and_wait(allowed, snap(gpu, attribution=_allocated_to_pod(gpu.uuid)))
    assert len(runner2.requests) == 1


def test_a_gpu_is_not_probed_while_the_kubelet_has_not_said_who_holds_it() -> None:
    """Before the kubelet's first answer, or while it fails, there are no allocations to read:
    that is not 'free'.  Before, such a GPU was probed (1.9 GiB allocated on a GPU a pod may hold)."""
    from dataclasses import replace

    from exporter.model import StageResult

    gpu = idle_gpu()
    runner = FakeRunner()
    sched, _ = make(runner)
    unknown = replace(snap(gpu, attribution=Attribution()), stages=(StageResult("podresources", False, 0.0),))
    observe_and_wait(sched, unknown)
    assert runner.requests == []
    assert runs(sched, gpu.uuid, "skipped_allocated") == 1

    answered = replace(snap(gpu, attribution=Attribution()), stages=(StageResult("podresources", True, 0.0),))
    fresh_runner = FakeRunner()
    fresh, _ = make(fresh_runner)
    observe_and_wait(fresh, answered)
    assert len(fresh_runner.requests) == 1


def _mig_gpu() -> GpuSample:
    uuid = "GPU-mig00000-aaaa-bbbb-cccc-000000000000"
    leaves = tuple(
        LeafSample(
            uuid=uuid,
            mig=MigInstance(f"MIG-{i}0000000-aaaa-bbbb-cccc-000000000000", i + 1, 0, "3g.71gb"),
            memory_used_bytes=0,
            memory_total_bytes=70 * GiB,
        )
        for i in range(2)
    )
    return GpuSample(
        index=0,
        uuid=uuid,
        name="NVIDIA H200",
        mig_mode="enabled",
        compute_mode="default",
        memory_total_bytes=141 * GiB,
        leaves=leaves,
    )


def test_mig_instances_are_probed_separately_and_only_the_allocated_one_skipped() -> None:
    gpu = _mig_gpu()
    held, free = gpu.leaves
    assert held.mig is not None and free.mig is not None
    runner = FakeRunner(ProbeOutcome("ok", {"hbm_copy": 2.0e12}))
    sched, _ = make(runner)
    attribution = _allocated_to_pod(gpu.uuid, held.mig.mig_uuid)
    observe_and_wait(sched, snap(gpu, attribution=attribution))
    assert [r.uuid for r in runner.requests] == [free.mig.mig_uuid]
    assert runs(sched, held.mig.mig_uuid, "skipped_allocated") == 1
    assert runner.requests[0].memory_fraction == pytest.approx(70 / 141)
    (result,) = sched.results()[0]
    # A 70/141 slice of the H200 is expected to reach 70/141 of the whole GPU's copy bandwidth.
    assert result.efficiency_ratio is not None and 0.9 < result.efficiency_ratio < 1.1


# --- bad probes -------------------------------------------------------------------------------


def test_hanging_probe_is_killed_and_counted_as_timeout_quickly() -> None:
    cmd = (sys.executable, "-c", "import time; time.sleep(60)")
    sched, _ = make(None, command=cmd, timeout_seconds=0.5)
    gpu = idle_gpu()
    start = time.monotonic()
    observe_and_wait(sched, snap(gpu))
    assert time.monotonic() - start < 5
    assert runs(sched, gpu.uuid, "timeout") == 1
    assert sched.results()[0] == ()


def test_crashing_probe_is_counted_as_failed() -> None:
    cmd = (sys.executable, "-c", "import os; os.abort()")
    sched, _ = make(None, command=cmd)
    gpu = idle_gpu()
    observe_and_wait(sched, snap(gpu))
    assert runs(sched, gpu.uuid, "failed") == 1
    assert runs(sched, gpu.uuid, "ok") == 0


def test_probe_out_of_memory_json_error_is_counted_as_failed() -> None:
    cmd = (sys.executable, "-m", "probes", "--array", "numpy", "--buffer-bytes", str(1 << 60))
    sched, _ = make(None, command=cmd, timeout_seconds=60.0)
    gpu = idle_gpu()
    observe_and_wait(sched, snap(gpu))
    assert runs(sched, gpu.uuid, "failed") == 1


def test_garbage_or_empty_output_is_a_failure() -> None:
    assert parse_probe_output("not json\n", 0).result == "failed"
    assert parse_probe_output("", 0).result == "failed"
    assert parse_probe_output('{"probes": {}}', 0).result == "failed"
    assert parse_probe_output('{"error": {"type": "timeout", "message": "x"}}', 3).result == "timeout"
    ok = parse_probe_output('{"probes": {"h2d": {"bytes_per_second": 5e10}}}', 0)
    assert ok.result == "ok" and ok.bandwidths == {"h2d": 5e10}


def test_failed_probe_keeps_the_last_good_result_and_retries_sooner() -> None:
    runner = FakeRunner()
    sched, clock = make(runner, retry_seconds=600.0)
    gpu = idle_gpu()
    observe_and_wait(sched, snap(gpu))
    runner.outcome = ProbeOutcome("failed", detail="boom")
    clock.now += 3600
    observe_and_wait(sched, snap(gpu))
    assert runs(sched, gpu.uuid, "failed") == 1
    assert {r.probe for r in sched.results()[0]} == {"hbm_copy", "h2d", "d2h"}
    clock.now += 601
    runner.outcome = ProbeOutcome("ok", H200_OK)
    observe_and_wait(sched, snap(gpu))
    assert runs(sched, gpu.uuid, "ok") == 2


def test_close_kills_a_running_probe_promptly_without_calling_it_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cmd = (sys.executable, "-c", "import time; time.sleep(60)")
    sched, _ = make(None, command=cmd, timeout_seconds=30.0)
    gpu = idle_gpu()
    sched.observe(snap(gpu))
    time.sleep(0.3)
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger="exporter.probe_scheduler"):
        sched.close()
    assert time.monotonic() - start < 5
    assert sched.wait_until_idle(0)
    assert runs(sched, gpu.uuid, "failed") == 0, "a shutdown is not a failed probe"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "shutting down" in caplog.text


# --- scheduling -------------------------------------------------------------------------------


def test_only_one_probe_runs_at_a_time() -> None:
    runner = FakeRunner()
    runner.gate = threading.Event()
    sched, _ = make(runner)
    a, b = idle_gpu(0), idle_gpu(1)
    sched.observe(snap(a, b))
    sched.observe(snap(a, b))
    time.sleep(0.1)
    assert len(runner.requests) == 1
    runner.gate.set()
    assert sched.wait_until_idle(5)
    sched.observe(snap(a, b))
    assert sched.wait_until_idle(5)
    assert sorted(r.uuid for r in runner.requests) == sorted([a.uuid, b.uuid])


def test_hundred_scrapes_and_result_reads_never_start_a_probe() -> None:
    runner = FakeRunner()
    clock = Clock()
    sched = ProbeScheduler(options(), clock=clock, wall=lambda: 1.7e9, runner=runner)
    gpu = idle_gpu()
    backend = ScriptedBackend(lambda _n: BackendSample(up=True, gpus=(gpu,)))
    sampler = Sampler(backend, probes=sched, clock=clock)
    sampler.run_once()
    assert sched.wait_until_idle(5)
    sampler.run_once()  # publishes the finished run
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(sampler.latest, backend="sim"))
    leaf = {"gpu": str(gpu.index), "mig_uuid": "", "gpu_instance_id": "", "compute_instance_id": "", "mig_profile": ""}
    labels = {**leaf, "uuid": gpu.uuid, "result": "ok"}
    before = reg.get_sample_value("gpulens_probe_runs_total", labels)
    assert before == 1
    clock.now += 10 * 3600  # long overdue: only a sampling cycle may act on that
    for _ in range(100):
        reg.get_sample_value("gpulens_probe_runs_total", labels)
        sched.results()
    assert reg.get_sample_value("gpulens_probe_runs_total", labels) == before
    assert len(runner.requests) == 1
    bw = reg.get_sample_value(
        "gpulens_probe_bandwidth_bytes_per_second", {**leaf, "uuid": gpu.uuid, "probe": "hbm_copy"}
    )
    assert bw == 4.0e12


def test_jittered_schedule_spreads_runs_within_bounds() -> None:
    runner = FakeRunner()
    sched, clock = make(runner, interval_seconds=100.0, jitter_ratio=0.2, first_delay_seconds=30.0)
    gpu = idle_gpu()
    started: list[float] = []
    t0 = clock.now
    for _ in range(3000):
        n = len(runner.requests)
        observe_and_wait(sched, snap(gpu))
        if len(runner.requests) > n:
            started.append(clock.now)
        clock.now += 1.0
    assert 30 * 0.8 <= started[0] - t0 <= 30 * 1.2 + 1
    gaps = [b - a for a, b in itertools.pairwise(started)]
    assert len(gaps) > 20
    assert all(80 <= g <= 121 for g in gaps), gaps
    assert len(set(gaps)) > 5, "jitter must vary the interval"


def test_first_runs_of_many_gpus_are_spread_by_jitter() -> None:
    runner = FakeRunner()
    sched, clock = make(runner, interval_seconds=1000.0, jitter_ratio=0.1, first_delay_seconds=100.0)
    gpus = [idle_gpu(i) for i in range(8)]
    starts: dict[str, float] = {}
    for _ in range(120):
        observe_and_wait(sched, snap(*gpus))
        for r in runner.requests:
            starts.setdefault(r.uuid, clock.now)
        clock.now += 1.0
    assert len(starts) == 8
    assert all(1000 + 90 <= t <= 1000 + 111 for t in starts.values()), starts
    assert max(starts.values()) - min(starts.values()) > 5


def test_vanished_gpu_loses_its_results_and_counters() -> None:
    runner = FakeRunner()
    sched, _ = make(runner)
    a, b = idle_gpu(0), idle_gpu(1)
    observe_and_wait(sched, snap(a, b))
    observe_and_wait(sched, snap(a, b))
    assert {r.uuid for r in sched.results()[0]} == {a.uuid, b.uuid}
    observe_and_wait(sched, snap(a, replace(b, up=False)))
    results, counts = sched.results()
    assert {r.uuid for r in results} == {a.uuid}
    assert all(uuid == a.uuid for uuid, _ in counts)


# --- simulated runner ---------------------------------------------------------------------------


def test_simulated_runner_is_deterministic_with_one_degraded_gpu() -> None:
    def run_fleet() -> dict[tuple[str, str], float | None]:
        sched, _clock = make(SimulatedProbeRunner())
        gpus = [idle_gpu(i) for i in range(8)]
        for _ in range(8):
            observe_and_wait(sched, snap(*gpus))
        return {(r.uuid, r.probe): r.efficiency_ratio for r in sched.results()[0]}

    first, second = run_fleet(), run_fleet()
    assert first == second
    hbm = {uuid: eff for (uuid, probe), eff in first.items() if probe == "hbm_copy"}
    assert len(hbm) == 8
    degraded = hbm.pop(idle_gpu(7).uuid)
    assert degraded == pytest.approx(0.8)
    assert all(e is not None and 0.98 <= e <= 1.0 for e in hbm.values())
