"""MPS: recognised per leaf, the server is not a tenant, per-pod SM share absent for a reason,
pods never take a shared leaf's class, probes never disturb MPS tenants."""

from __future__ import annotations

import random
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from exporter.analysis.boundness import BoundnessClassifier
from exporter.analysis.sharing import SHARING_MODES
from exporter.backends.nvml.backend import NvmlBackend
from exporter.model import MPS_CLIENT, MPS_SERVER, Snapshot
from exporter.probe_scheduler import ProbeOptions, ProbeScheduler
from exporter.render.collector import SnapshotCollector
from exporter.render.metrics import spec
from exporter.sampler import Sampler
from exporter.sim import SimulatedBackend
from exporter.sim.attribution import simulated_attributor
from tests.fakes.fake_pynvml import FakeGpu, FakeNvml, FakeProcess

GiB = 1 << 30
SERVER, DECODE, RERANK = 7001, 7102, 7203


def _mps_gpu(**kw: object) -> FakeGpu:
    """An H200 under MPS as NVML shows it: the server and two clients in the compute list, the
    clients in the MPS list too, per-process utilisation for the server only."""
    base: dict[str, object] = {
        "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "pci_bus_id": "00000000:00:00.0",
        "processes": [
            FakeProcess(pid=SERVER, used_memory=300 << 20, name="/usr/bin/nvidia-cuda-mps-server"),
            FakeProcess(pid=DECODE, used_memory=40 * GiB, mps_client=True),
            FakeProcess(pid=RERANK, used_memory=12 * GiB, mps_client=True),
        ],
        "process_util": [(SERVER, 100, 82)],
    }
    base.update(kw)
    return FakeGpu(**base)  # type: ignore[arg-type]


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _sample_twice(fake: FakeNvml) -> Snapshot:
    clock = _Clock()
    backend = NvmlBackend(nvml=fake, clock=clock, wall_clock=lambda: 1.7e9 + clock.now)
    sampler = Sampler(backend, classifier=BoundnessClassifier(), clock=clock)
    sampler.run_once()
    clock.now += 1.0
    return sampler.run_once()


def _registry(snapshot: Snapshot) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(lambda: snapshot))
    return reg


def test_nvml_backend_tells_the_mps_server_from_its_clients() -> None:
    snap = _sample_twice(FakeNvml([_mps_gpu()]))
    leaf = snap.backend.gpus[0].leaves[0]
    roles = {p.pid: p.mps_role for p in leaf.processes}
    assert roles == {SERVER: MPS_SERVER, DECODE: MPS_CLIENT, RERANK: MPS_CLIENT}
    assert [p.pid for p in leaf.tenants] == [DECODE, RERANK]
    assert leaf.mps


def test_compute_processes_counts_the_clients_and_the_leaf_is_exported_as_mps() -> None:
    reg = _registry(_sample_twice(FakeNvml([_mps_gpu()])))
    labels = {"gpu": "0", "uuid": "GPU-00000000-0000-0000-0000-000000000000", "mig_uuid": ""}
    labels |= {"gpu_instance_id": "", "compute_instance_id": "", "mig_profile": ""}
    assert reg.get_sample_value("gpulens_gpu_compute_processes", labels) == 2
    assert reg.get_sample_value("gpulens_gpu_sharing_info", {**labels, "mode": "mps"}) == 1
    assert reg.get_sample_value("gpulens_gpu_sharing_info", {**labels, "mode": "exclusive"}) is None


def test_clients_listed_only_as_mps_processes_are_still_tenants() -> None:
    gpu = _mps_gpu()
    hidden = FakeProcess(pid=7304, used_memory=GiB, mps_client=True)
    gpu.processes.append(hidden)
    # Some drivers list MPS clients only through the MPS call: the backend adds them.
    fake = FakeNvml([gpu])
    original = fake.nvmlDeviceGetComputeRunningProcesses

    def without_hidden(h: Any) -> list[Any]:
        return [p for p in original(h) if p.pid != hidden.pid]

    fake.nvmlDeviceGetComputeRunningProcesses = without_hidden  # type: ignore[method-assign]
    leaf = _sample_twice(fake).backend.gpus[0].leaves[0]
    assert sorted(p.pid for p in leaf.tenants) == [DECODE, RERANK, hidden.pid]


def test_a_gpu_without_mps_asks_no_process_names() -> None:
    plain = _mps_gpu(processes=[FakeProcess(pid=42, used_memory=GiB)], process_util=[(42, 90, 10)])
    fake = FakeNvml([plain])
    leaf = _sample_twice(fake).backend.gpus[0].leaves[0]
    assert not leaf.mps and leaf.processes[0].mps_role is None
    assert fake.calls["nvmlSystemGetProcessName"] == 0


# --- the simulated MPS node, through attribution, as a user sees it --------------------------------


@pytest.fixture(scope="module")
def mps_snapshot() -> Snapshot:
    backend = SimulatedBackend("mps", seed=1)
    sampler = Sampler(backend, attributor=simulated_attributor(backend), classifier=BoundnessClassifier())
    for _ in range(20):
        snap = sampler.run_once()
    return snap


def _values(reg: CollectorRegistry, name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for m in reg.collect() for s in m.samples if s.name == name]


def test_simulated_mps_gpu_has_the_nvml_shapes(mps_snapshot: Snapshot) -> None:
    leaf = mps_snapshot.backend.gpus[0].leaves[0]
    server = [p for p in leaf.processes if p.mps_role == MPS_SERVER]
    clients = [p for p in leaf.processes if p.mps_role == MPS_CLIENT]
    assert len(server) == 1 and len(clients) == 2
    assert server[0].sm_util_ratio is not None and server[0].sm_util_ratio > 0.5
    assert all(p.sm_util_ratio is None for p in clients), "NVML reports per-process util for the server only"
    assert mps_snapshot.backend.gpus[0].compute_mode == "exclusive_process"


def test_mps_pods_get_their_own_memory_no_sm_share_and_no_leaf_class(mps_snapshot: Snapshot) -> None:
    reg = _registry(mps_snapshot)
    gpu0 = mps_snapshot.backend.gpus[0].uuid
    leaf = mps_snapshot.backend.gpus[0].leaves[0]
    memory = {lab["pod"]: v for lab, v in _values(reg, "gpulens_pod_gpu_memory_used_bytes") if lab["uuid"] == gpu0}
    clients = sorted(p.used_memory_bytes or 0 for p in leaf.tenants)
    assert sorted(memory.values()) == clients, "each client pod's memory exactly; the server belongs to nobody"
    for name in ("gpulens_pod_gpu_kernel_time_ratio", "gpulens_pod_gpu_sm_share_ratio"):
        assert not any(lab["uuid"] == gpu0 for lab, _ in _values(reg, name))
    assert "Absent under MPS" in spec("gpulens_pod_gpu_kernel_time_ratio").help
    classes = {lab["pod"]: lab["class"] for lab, v in _values(reg, "gpulens_pod_gpu_boundness") if v == 1}
    on_gpu0 = {p: c for p, c in classes.items() if p in memory}
    assert on_gpu0 and set(on_gpu0.values()) == {"shared"}
    leaf_class = {lab["uuid"]: lab["class"] for lab, v in _values(reg, "gpulens_gpu_boundness") if v == 1}
    gpu1 = mps_snapshot.backend.gpus[1].uuid
    alone = [lab["class"] for lab, v in _values(reg, "gpulens_pod_gpu_boundness") if v == 1 and lab["uuid"] == gpu1]
    assert alone == [leaf_class[gpu1]], "a single MPS client alone on its GPU takes the GPU's class"


def test_the_mps_daemon_pod_is_not_a_tenant(mps_snapshot: Snapshot) -> None:
    reg = _registry(mps_snapshot)
    pods = {lab["pod"] for lab, _ in _values(reg, "gpulens_pod_gpu_memory_used_bytes")}
    assert not any(p.startswith("nvidia-device-plugin-mps") for p in pods)


def test_sharing_modes_of_the_simulated_node(mps_snapshot: Snapshot) -> None:
    modes = {lab["gpu"]: lab["mode"] for lab, _ in _values(_registry(mps_snapshot), "gpulens_gpu_sharing_info")}
    assert modes == {"0": "mps", "1": "mps", "2": "time-slicing", **{str(i): "exclusive" for i in range(3, 8)}}
    assert set(modes.values()) <= set(SHARING_MODES)


# --- probes never disturb MPS tenants --------------------------------------------------------------


def _probe_results(snapshot: Snapshot, skip_allocated: bool) -> dict[tuple[str, str], int]:
    class Never:
        def run(self, request: object) -> object:
            raise AssertionError("a probe must not start on an MPS GPU")

        def cancel(self) -> None:
            return None

    opts = ProbeOptions(
        enabled=True, first_delay_seconds=0.0, jitter_ratio=0.0, skip_allocated=skip_allocated, timeout_seconds=5.0
    )
    sched = ProbeScheduler(opts, clock=lambda: 1000.0, wall=lambda: 1.7e9, runner=Never(), rng=random.Random(1))  # type: ignore[arg-type]
    gpus = tuple(g for g in snapshot.backend.gpus if g.index in (0, 1))
    sched.observe(Snapshot(timestamp=0.0, backend=type(snapshot.backend)(up=True, gpus=gpus), attribution=None))
    assert sched.wait_until_idle(10)
    return dict(sched.results()[1])


def test_probe_reports_skipped_exclusive_where_only_the_mps_server_may_run(mps_snapshot: Snapshot) -> None:
    runs = _probe_results(mps_snapshot, skip_allocated=False)
    gpu0, gpu1 = (mps_snapshot.backend.gpus[i].uuid for i in (0, 1))
    assert runs.get((gpu0, "skipped_exclusive")) == 1
    assert runs.get((gpu1, "skipped_busy")) == 1, "MPS clients running: never probed"
