"""The attribution stage as the sampler sees it: simulated sources through the shared merge code."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from exporter.attribution.merge import PidOwner, PodMeta
from exporter.attribution.pipeline import PipelineAttributor
from exporter.attribution.podresources import PodResourcesSource
from exporter.cli import make_attributor
from exporter.config import DEFAULT_PODRESOURCES_SOCKET, parse_config
from exporter.model import (
    BackendSample,
    ClaimedDevice,
    ContainerDevices,
    GpuSample,
    LeafSample,
    MigInstance,
    ProcessSample,
    SliceDevice,
)
from exporter.render.collector import CachedExposition, SnapshotCollector
from exporter.sampler import Sampler
from exporter.sim import Simulation
from exporter.sim.attribution import simulated_attributor
from tests.fakes.kubelet_server import FakeKubelet, pod

pytestmark = pytest.mark.integration

U0 = "GPU-00000000-0000-0000-0000-000000000000"
U1 = "GPU-11111111-1111-1111-1111-111111111111"
U2 = "GPU-22222222-2222-2222-2222-222222222222"
M2A = "MIG-2a2a2a2a-0000-0000-0000-000000000000"
M2B = "MIG-2b2b2b2b-0000-0000-0000-000000000000"


def node_sample(processes: tuple[ProcessSample, ...] = ()) -> BackendSample:
    """Three GPUs: U0 exclusive, U1 time-sliced (with processes), U2 in MIG mode (two instances)."""
    return BackendSample(
        up=True,
        gpus=(
            GpuSample(index=0, uuid=U0, leaves=(LeafSample(uuid=U0),)),
            GpuSample(index=1, uuid=U1, leaves=(LeafSample(uuid=U1, processes=processes),)),
            GpuSample(
                index=2,
                uuid=U2,
                mig_mode="enabled",
                leaves=(
                    LeafSample(uuid=U2, mig=MigInstance(M2A, 1, 0, "3g.71gb")),
                    LeafSample(uuid=U2, mig=MigInstance(M2B, 2, 0, "1g.18gb")),
                ),
            ),
        ),
    )


def meta(uid: str, namespace: str, name: str, phase: str, kind: str | None, workload: str | None) -> PodMeta:
    return PodMeta(uid, namespace, name, phase=phase, workload_kind=kind, workload=workload)


class FakeSimNode:
    """A simulated node's Kubernetes side; ``fail`` names methods that raise (fault injection)."""

    def __init__(self) -> None:
        self.fail: set[str] = set()
        self.devices = [
            ContainerDevices("ml", "train-0", "main", "nvidia.com/gpu", (U0,), pod_uid="uid-train"),
            ContainerDevices("ml", "infer-a", "srv", "nvidia.com/gpu", (U1 + "::0",), pod_uid="uid-a"),
            ContainerDevices("ml", "infer-b", "srv", "nvidia.com/gpu", (U1 + "::1",), pod_uid="uid-b"),
            ContainerDevices("ml", "infer-b", "srv", "nvidia.com/gpu", (U1 + "::2",), pod_uid="uid-b"),
            ContainerDevices("dev", "nb", "jupyter", "nvidia.com/mig-1g.18gb", (M2B,), pod_uid="uid-nb"),
            ContainerDevices("old", "done", "main", "nvidia.com/gpu", (U0,), pod_uid="uid-done"),
        ]
        self.owners = {
            "uid-train": meta("uid-train", "ml", "train-0", "Running", "StatefulSet", "train"),
            "uid-a": meta("uid-a", "ml", "infer-a", "Running", "Deployment", "infer"),
            "uid-b": meta("uid-b", "ml", "infer-b", "Running", "Deployment", "infer"),
            "uid-nb": meta("uid-nb", "dev", "nb", "Running", None, None),
            "uid-done": meta("uid-done", "old", "done", "Succeeded", "Job", "done"),
        }

    def _maybe_fail(self, method: str) -> None:
        if method in self.fail:
            raise RuntimeError(f"injected {method} fault")

    def sample(self) -> BackendSample:
        return node_sample()

    def close(self) -> None:
        pass

    def pod_devices(self) -> tuple[ContainerDevices, ...]:
        self._maybe_fail("pod_devices")
        return tuple(self.devices)

    def pod_claims(self) -> tuple[ClaimedDevice, ...]:
        self._maybe_fail("pod_devices")
        return ()

    def resource_slices(self) -> tuple[SliceDevice, ...]:
        self._maybe_fail("resource_slices")
        return ()

    def pods(self) -> tuple[PodMeta, ...]:
        self._maybe_fail("pods")
        return tuple(self.owners.values())

    def pid_owners(self) -> dict[int, PidOwner]:
        self._maybe_fail("pid_owners")
        return {
            101: PidOwner("uid-a", container="srv"),
            102: PidOwner("uid-b", container="srv"),
            103: PidOwner("uid-b", container="srv"),
        }

    def sharing_replicas(self) -> dict[str, int]:
        self._maybe_fail("sharing_replicas")
        return {U1: 4}


def shared_processes() -> tuple[ProcessSample, ...]:
    return (
        ProcessSample(pid=101, used_memory_bytes=1 << 30, sm_util_ratio=0.25),
        ProcessSample(pid=102, used_memory_bytes=2 << 30, sm_util_ratio=0.25),
        ProcessSample(pid=103, used_memory_bytes=1 << 30, sm_util_ratio=0.125),
        ProcessSample(pid=999, used_memory_bytes=5 << 20, sm_util_ratio=0.01),  # not in a pod
    )


@pytest.fixture
def sim() -> FakeSimNode:
    return FakeSimNode()


def test_simulated_backend_gets_simulated_sources_and_all_three_stages(sim: FakeSimNode) -> None:
    attributor = simulated_attributor(sim)
    try:
        attribution, stages = attributor.attribute(node_sample(shared_processes()), time.time())
    finally:
        attributor.close()
    assert [(s.stage, s.success) for s in stages] == [
        ("podresources", True),
        ("kube_api", True),
        ("cgroup", True),
    ]
    held = {(a.pod.namespace, a.pod.pod, a.uuid, a.mig_uuid, a.replica) for a in attribution.allocations}
    assert held == {
        ("ml", "train-0", U0, None, None),
        ("ml", "infer-a", U1, None, "0"),
        ("ml", "infer-b", U1, None, "1"),
        ("ml", "infer-b", U1, None, "2"),
        ("dev", "nb", U2, M2B, None),
    }, "the Succeeded pod still listed by the kubelet must be dropped"
    train = next(a for a in attribution.allocations if a.pod.pod == "train-0")
    assert (train.pod.workload_kind, train.pod.workload, train.pod.uid) == ("StatefulSet", "train", "uid-train")
    assert dict(attribution.sharing_replicas) == {U1: 4}
    assert dict(attribution.sharing_pods) == {U1: 2}
    assert attribution.podresources_last_success_timestamp is not None


def test_time_sliced_gpu_usage_is_split_per_pod_from_their_processes(sim: FakeSimNode) -> None:
    attributor = simulated_attributor(sim)
    attribution, _ = attributor.attribute(node_sample(shared_processes()), time.time())
    usage = {(u.pod.pod, u.pod.container, u.uuid): u for u in attribution.usages}
    assert set(usage) == {("infer-a", "srv", U1), ("infer-b", "srv", U1)}
    assert usage[("infer-a", "srv", U1)].memory_used_bytes == 1 << 30
    assert usage[("infer-b", "srv", U1)].memory_used_bytes == 3 << 30
    assert usage[("infer-b", "srv", U1)].kernel_time_ratio == pytest.approx(0.375)


@pytest.mark.parametrize(
    ("method", "stage", "still_there"),
    [
        ("pod_devices", "podresources", "usages"),
        ("pods", "kube_api", "allocations"),
        ("pid_owners", "cgroup", "allocations"),
    ],
)
def test_one_failing_source_fails_only_its_stage_and_recovers(
    sim: FakeSimNode, method: str, stage: str, still_there: str
) -> None:
    attributor = simulated_attributor(sim)
    sample = node_sample(shared_processes())
    sim.fail.add(method)
    attribution, stages = attributor.attribute(sample, time.time())
    failed = [s.stage for s in stages if not s.success]
    assert failed == [stage]
    assert getattr(attribution, still_there), f"{still_there} must survive a {stage} failure"
    if stage == "podresources":
        assert attribution.allocations == ()
    if stage == "cgroup":
        assert attribution.usages == ()

    sim.fail.clear()
    attribution, stages = attributor.attribute(sample, time.time())
    assert all(s.success for s in stages), "recovers on the next cycle without a restart"
    assert attribution.allocations and attribution.usages


def test_simulated_replica_count_failing_does_not_fail_the_cycle(sim: FakeSimNode) -> None:
    attributor = simulated_attributor(sim)
    sim.fail.add("sharing_replicas")
    attribution, stages = attributor.attribute(node_sample(shared_processes()), time.time())
    assert all(s.success for s in stages)
    assert dict(attribution.sharing_replicas) == {}
    assert dict(attribution.sharing_pods) == {U1: 2}
    assert len(attribution.allocations) == 5


def test_without_api_phase_both_holders_of_a_device_are_shown(sim: FakeSimNode) -> None:
    attributor = simulated_attributor(sim)
    sim.fail.add("pods")
    attribution, _ = attributor.attribute(node_sample(), time.time())
    holders = {a.pod.pod for a in attribution.allocations if a.uuid == U0}
    assert holders == {"train-0", "done"}
    assert attribution.allocation_conflicts == 1, "the double claim is counted"
    sim.fail.clear()
    attribution, _ = attributor.attribute(node_sample(), time.time())
    assert attribution.allocation_conflicts == 0, "with phases the finished pod is dropped: no conflict"


def test_backend_down_gives_no_allocations_and_counts_nothing_as_unmapped(sim: FakeSimNode) -> None:
    attributor = simulated_attributor(sim)
    attribution, stages = attributor.attribute(BackendSample(up=False, error="no driver"), time.time())
    assert attribution.allocations == ()
    assert dict(attribution.unmapped_devices) == {}
    assert dict(attribution.sharing_replicas) == {}
    assert all(s.success for s in stages)


def test_unknown_devices_are_counted_once_each_by_reason(sim: FakeSimNode) -> None:
    sim.devices.append(
        ContainerDevices(
            "x",
            "weird",
            "c",
            "nvidia.com/gpu",
            ("", "GPU-99999999-9999-9999-9999-999999999999", "tpu-7", "MIG-99999999-9999-9999-9999-999999999999"),
        )
    )
    sim.devices.append(ContainerDevices("x", "nic", "c", "example.com/sriov", ("0000:3b:00.2",)))
    attributor = simulated_attributor(sim)
    for _ in range(3):
        attribution, _ = attributor.attribute(node_sample(), time.time())
    assert dict(attribution.unmapped_devices) == {
        "empty_id": 1,
        "unknown_gpu": 1,
        "unknown_shape": 1,
        "unknown_mig": 1,
    }, "non-GPU resources are ignored; each unknown GPU ID counts once, not once per cycle"


def test_allocations_are_merged_again_only_when_an_input_changes(sim: FakeSimNode) -> None:
    for i in range(1000):
        sim.devices.append(ContainerDevices("bulk", f"p{i}", "c", "nvidia.com/gpu", (U1 + f"::{i}",), pod_uid=f"u{i}"))
        sim.owners[f"u{i}"] = meta(f"u{i}", "bulk", f"p{i}", "Running", "Deployment", "bulk")
    attributor: Any = simulated_attributor(sim)
    assert isinstance(attributor, PipelineAttributor)
    sample = node_sample(shared_processes())
    first, _ = attributor.attribute(sample, time.time())
    assert len(first.allocations) == 1005
    again, _ = attributor.attribute(node_sample(shared_processes()), time.time())
    assert again.allocations is first.allocations, "same inputs: the cached merge is reused"
    sim.owners["u7"] = meta("u7", "bulk", "p7", "Failed", "Deployment", "bulk")
    changed, _ = attributor.attribute(sample, time.time())
    assert len(changed.allocations) == 1004, "a pod that finished is dropped on the next cycle"


def _stages(attributor: Any) -> list[tuple[str, bool]]:
    try:
        _attribution, stages = attributor.attribute(node_sample(), time.time())
    finally:
        attributor.close()
    return [(s.stage, s.success) for s in stages]


@pytest.mark.parametrize("socket", ["", DEFAULT_PODRESOURCES_SOCKET])
def test_the_simulator_brings_its_own_pods_unless_a_socket_is_given(socket: str) -> None:
    cfg = parse_config(["--backend", "sim", "--kubernetes.podresources-socket", socket], env={})
    attributor = make_attributor(cfg, Simulation.create("h200x8"))
    assert _stages(attributor) == [("podresources", True), ("kube_api", True), ("cgroup", True)]


def test_explicit_socket_overrides_the_simulated_kubelet(tmp_path: Any) -> None:
    missing = str(tmp_path / "missing.sock")
    cfg = parse_config(["--backend", "sim", "--kubernetes.podresources-socket", missing], env={})
    attributor = make_attributor(cfg, Simulation.create("h200x8"))
    assert isinstance(attributor, PipelineAttributor)
    assert _stages(attributor) == [("podresources", False)], "the real kubelet source, failing: no socket"


def test_without_the_simulator_the_default_socket_is_the_real_kubelet() -> None:
    attributor = make_attributor(parse_config([], env={}), None)
    assert _stages(attributor) == [("podresources", False)], "no kubelet on this machine"


def _exposition(sampler: Sampler) -> CachedExposition:
    """The metrics page of ``sampler``'s snapshots, wired as ``exporter.cli.build`` wires it."""
    collector = SnapshotCollector(sampler.latest, version="test", backend="sim", include_age=False)
    return CachedExposition(collector, sampler.latest)


def test_until_the_kubelet_first_answers_the_sampler_runs_and_shows_no_allocation() -> None:
    """The kubelet source's first refresh runs on its own thread, so building it does not wait
    for the kubelet (the exporter binds its port meanwhile); until the kubelet answers, the
    podresources stage reads 0 and the allocation series are absent: unknown, not "all free"."""
    simulation = Simulation.create("h200x8")
    uuid = simulation.backend.sample().gpus[0].uuid
    with FakeKubelet() as kubelet:
        kubelet.hold_list = threading.Event()
        built: list[PodResourcesSource] = []
        builder = threading.Thread(
            target=lambda: built.append(PodResourcesSource(kubelet.socket_path, 120, timeout_seconds=120)), daemon=True
        )
        builder.start()
        sampler: Sampler | None = None
        try:
            assert kubelet.list_waiting.wait(30), "the first List was asked at once"
            builder.join(30)
            assert built, "built while the kubelet still holds its reply"
            sampler = Sampler(simulation.backend, attributor=PipelineAttributor(built[0], None, None))
            snapshot = sampler.run_once()
            assert {s.stage: s.success for s in snapshot.stages}["podresources"] is False
            assert snapshot.attribution is not None and snapshot.attribution.allocations == ()
            assert snapshot.attribution.podresources_last_success_timestamp is None
            page = _exposition(sampler).render("text/plain")[0].decode()
            assert 'gpulens_stage_success{stage="podresources"} 0.0' in page
            assert "gpulens_pod_gpu_allocation{" not in page
            assert "gpulens_podresources_last_success_timestamp_seconds " not in page

            kubelet.pods = [pod("ml", "train-0", [("main", [("nvidia.com/gpu", [uuid])])])]
            kubelet.hold_list.set()
            assert built[0].wait_first_refresh(60)
            snapshot = sampler.run_once()
            assert snapshot.attribution is not None
            assert [(a.pod.pod, a.uuid) for a in snapshot.attribution.allocations] == [("train-0", uuid)]
            assert {s.stage: s.success for s in snapshot.stages}["podresources"] is True
        finally:
            kubelet.hold_list.set()
            builder.join(130)
            if sampler is not None:
                sampler.stop()
            for source in built:
                source.close()
