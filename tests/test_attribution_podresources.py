"""Kubelet PodResources attribution against a real gRPC server on a temporary unix socket."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import grpc
import pytest

from exporter.attribution.grpc_unary import RpcError, StatusCode
from exporter.attribution.merge import PidOwner, PodDirectory, PodMeta
from exporter.attribution.pipeline import PipelineAttributor
from exporter.attribution.podresources import PodResourcesClient, PodResourcesSource
from exporter.cli import make_attributor
from exporter.config import parse_config
from exporter.model import Attribution, BackendSample, GpuSample, LeafSample, MigInstance, StageResult
from tests.fakes.kubelet_server import FakeKubelet, devices, pod

pytestmark = pytest.mark.integration


def gpu_uuid(i: int) -> str:
    return f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}"


def mig_uuid(gpu: int, gi: int) -> str:
    return f"MIG-{gpu:08x}-{gi:04x}-0000-0000-{gi:012x}"


def whole_gpus(n: int) -> BackendSample:
    return BackendSample(
        up=True,
        gpus=tuple(GpuSample(index=i, uuid=gpu_uuid(i), leaves=(LeafSample(uuid=gpu_uuid(i)),)) for i in range(n)),
    )


MIG_LAYOUT = ((1, "3g.71gb"), (2, "2g.35gb"), (3, "1g.18gb"), (4, "1g.18gb"))
"""(GPU instance id, profile) of GPU 1 in the MIG node: mixed profiles."""


def mig_node() -> BackendSample:
    """GPU 0 whole, GPU 1 split into mixed MIG profiles."""
    leaves = tuple(
        LeafSample(uuid=gpu_uuid(1), mig=MigInstance(mig_uuid(1, gi), gi, 0, profile)) for gi, profile in MIG_LAYOUT
    )
    return BackendSample(
        up=True,
        gpus=(
            GpuSample(index=0, uuid=gpu_uuid(0), leaves=(LeafSample(uuid=gpu_uuid(0)),)),
            GpuSample(index=1, uuid=gpu_uuid(1), mig_mode="enabled", leaves=leaves),
        ),
    )


class StaticPods:
    """A pod source with fixed metadata (stands in for the API watch)."""

    def __init__(self, pods: list[PodMeta]) -> None:
        self.directory: PodDirectory | None = PodDirectory.of(pods)

    def latest(self) -> tuple[PodDirectory | None, StageResult]:
        return self.directory, StageResult("kube_api", self.directory is not None, 0.0)

    def close(self) -> None:
        pass


class NoPids:
    def owners(self, pids: Collection[int]) -> tuple[Mapping[int, PidOwner] | None, StageResult]:
        return {}, StageResult("cgroup", True, 0.0)

    def close(self) -> None:
        pass


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    with FakeKubelet() as k:
        yield k


def attribute_once(kubelet: FakeKubelet, sample: BackendSample, **kw: object) -> tuple[Attribution, dict[str, bool]]:
    source = PodResourcesSource(kubelet.socket_path, start=False)
    source.refresh()
    attributor = PipelineAttributor(source, kw.get("pods"), None)  # type: ignore[arg-type]
    attribution, stages = attributor.attribute(sample, time.time())
    attributor.close()
    return attribution, {s.stage: s.success for s in stages}


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_eight_whole_gpus_each_attributed_to_its_pod(kubelet: FakeKubelet) -> None:
    kubelet.pods = [pod("ml", f"worker-{i}", [("main", [("nvidia.com/gpu", [gpu_uuid(i)])])]) for i in range(8)]
    kubelet.allocatable = [devices("nvidia.com/gpu", [gpu_uuid(i) for i in range(8)])]
    attribution, stages = attribute_once(kubelet, whole_gpus(8))
    assert stages == {"podresources": True}
    got = sorted(
        (a.pod.pod, a.pod.container, a.uuid, a.mig_uuid, a.replica, a.resource) for a in attribution.allocations
    )
    assert got == [(f"worker-{i}", "main", gpu_uuid(i), None, None, "nvidia.com/gpu") for i in range(8)]
    assert dict(attribution.sharing_replicas) == {} and dict(attribution.sharing_pods) == {}
    assert dict(attribution.unmapped_devices) == {}


def test_mig_mixed_profiles_and_every_id_shape_map_to_the_right_instance(kubelet: FakeKubelet) -> None:
    kubelet.pods = [
        pod("a", "big", [("c", [("nvidia.com/mig-3g.71gb", [mig_uuid(1, 1)])])]),
        pod("a", "mid", [("c", [("nvidia.com/mig-2g.35gb", [mig_uuid(1, 2)])])]),
        pod("b", "gke", [("c", [("nvidia.com/gpu", ["nvidia1/gi3"])])]),
        pod("b", "legacy", [("c", [("nvidia.com/mig-1g.18gb", [f"MIG-{gpu_uuid(1)}/4/0"])])]),
        pod("c", "whole", [("c", [("nvidia.com/a100", ["nvidia0"])])]),
        pod(
            "c",
            "ghost",
            [("c", [("nvidia.com/mig-1g.18gb", ["nvidia1/gi9", "MIG-deadbeef-0000-0000-0000-000000000000"])])],
        ),
    ]
    attribution, _ = attribute_once(kubelet, mig_node())
    got = {a.pod.pod: (a.resource, a.uuid, a.mig_uuid) for a in attribution.allocations}
    assert got == {
        "big": ("nvidia.com/mig-3g.71gb", gpu_uuid(1), mig_uuid(1, 1)),
        "mid": ("nvidia.com/mig-2g.35gb", gpu_uuid(1), mig_uuid(1, 2)),
        "gke": ("nvidia.com/gpu", gpu_uuid(1), mig_uuid(1, 3)),
        "legacy": ("nvidia.com/mig-1g.18gb", gpu_uuid(1), mig_uuid(1, 4)),
        "whole": ("nvidia.com/a100", gpu_uuid(0), None),
    }
    assert dict(attribution.unmapped_devices) == {"unknown_mig": 2}


def test_four_time_slicing_replicas_held_by_three_pods(kubelet: FakeKubelet) -> None:
    u = gpu_uuid(0)
    kubelet.allocatable = [devices("nvidia.com/gpu", [f"{u}::{r}" for r in range(4)])]
    kubelet.pods = [pod("ml", f"infer-{r}", [("srv", [("nvidia.com/gpu", [f"{u}::{r}"])])]) for r in range(3)]
    attribution, _ = attribute_once(kubelet, whole_gpus(1))
    assert sorted((a.pod.pod, a.uuid, a.replica) for a in attribution.allocations) == [
        ("infer-0", u, "0"),
        ("infer-1", u, "1"),
        ("infer-2", u, "2"),
    ]
    assert dict(attribution.sharing_replicas) == {u: 4}
    assert dict(attribution.sharing_pods) == {u: 3}


def test_finished_pod_still_listed_by_the_kubelet_is_dropped(kubelet: FakeKubelet) -> None:
    u = gpu_uuid(0)
    kubelet.pods = [
        pod("ml", "old-run", [("main", [("nvidia.com/gpu", [u])])]),
        pod("ml", "new-run", [("main", [("nvidia.com/gpu", [u])])]),
    ]
    pods = StaticPods(
        [
            PodMeta("uid-old", "ml", "old-run", "Succeeded", "Job", "old-run"),
            PodMeta("uid-new", "ml", "new-run", "Running", "Job", "new-run"),
        ]
    )
    attribution, _ = attribute_once(kubelet, whole_gpus(1), pods=pods)
    assert [(a.pod.pod, a.pod.uid, a.pod.workload_kind) for a in attribution.allocations] == [
        ("new-run", "uid-new", "Job")
    ]


def test_thousand_pods_with_a_reply_over_four_mebibytes(kubelet: FakeKubelet) -> None:
    # 1,000 pods: 8 GPUs x 125 time-slicing replicas, and each pod also holds 48 SR-IOV virtual
    # functions with long IDs, so the List reply is well over gRPC's default 4 MiB limit.
    vfs = [f"example.com/sriov-vf-{'x' * 80}-{j:03d}" for j in range(48)]
    kubelet.pods = [
        pod(
            f"team-{i % 20}",
            f"pod-{i:04d}",
            [("main", [("nvidia.com/gpu", [f"{gpu_uuid(i % 8)}::{i // 8}"]), ("example.com/sriov", vfs)])],
        )
        for i in range(1000)
    ]
    kubelet.allocatable = [devices("nvidia.com/gpu", [f"{gpu_uuid(g)}::{r}" for g in range(8) for r in range(125)])]
    size = sum(p.ByteSize() for p in kubelet.pods)
    assert size > 4 * 1024 * 1024, size
    attribution, stages = attribute_once(kubelet, whole_gpus(8))
    assert stages == {"podresources": True}
    assert len(attribution.allocations) == 1000
    assert dict(attribution.sharing_pods) == {gpu_uuid(g): 125 for g in range(8)}
    assert dict(attribution.unmapped_devices) == {}, "SR-IOV IDs are not GPUs and are not counted"


def test_missing_socket_fails_only_the_podresources_stage(tmp_path: object) -> None:
    attributor = PipelineAttributor(
        PodResourcesSource("/nonexistent/pod-resources/kubelet.sock", start=False),
        StaticPods([PodMeta("u", "ml", "p", "Running")]),
        NoPids(),
    )
    attribution, stages = attributor.attribute(whole_gpus(2), time.time())
    assert {s.stage: s.success for s in stages} == {"podresources": False, "kube_api": True, "cgroup": True}
    assert attribution.allocations == ()
    assert attribution.podresources_last_success_timestamp is None


def kubelet_attributor(socket_path: str) -> Any:
    """The attributor the exporter builds from ``--kubernetes.podresources-socket`` (no API watch)."""
    return make_attributor(parse_config(["--kubernetes.podresources-socket", socket_path], env={}), None)


def test_socket_missing_through_build_attributor_keeps_the_exporter_up() -> None:
    attributor = kubelet_attributor("/nonexistent/kubelet.sock")
    try:
        attribution, stages = attributor.attribute(whole_gpus(1), time.time())
    finally:
        attributor.close()
    assert [(s.stage, s.success) for s in stages] == [("podresources", False)]
    assert attribution.allocations == ()


def test_kubelet_restart_is_picked_up_within_one_refresh_period(kubelet: FakeKubelet) -> None:
    kubelet.pods = [pod("ml", "before", [("c", [("nvidia.com/gpu", [gpu_uuid(0)])])])]
    source = PodResourcesSource(kubelet.socket_path, refresh_seconds=1.0, stale_after_seconds=60)
    try:
        assert source.wait_first_refresh(30), "the first refresh runs on the source's thread at once"
        view, result, first_success = source.latest()
        assert result.success and view is not None and view.devices[0].pod == "before"
        kubelet.stop()
        assert wait_for(lambda: not source.latest()[1].success, 5.0), "kubelet gone -> stage fails"
        view, _, _ = source.latest()
        assert view is not None, "the last mapping is served while it is not yet stale"
        kubelet.pods = [pod("ml", "after", [("c", [("nvidia.com/gpu", [gpu_uuid(0)])])])]
        kubelet.start()  # a new socket file at the same path
        assert wait_for(lambda: source.latest()[1].success, 5.0), "recovered without a restart"
        view, _, last_success = source.latest()
        assert view is not None and view.devices[0].pod == "after"
        assert first_success is not None and last_success is not None and last_success > first_success
    finally:
        source.close()


def test_rate_limited_kubelet_serves_the_last_mapping_until_it_is_stale(kubelet: FakeKubelet) -> None:
    kubelet.pods = [pod("ml", "p", [("c", [("nvidia.com/gpu", [gpu_uuid(0)])])])]
    source = PodResourcesSource(kubelet.socket_path, start=False, stale_after_seconds=0.5)
    assert source.refresh()
    _, _, success_ts = source.latest()
    kubelet.fail_list = grpc.StatusCode.RESOURCE_EXHAUSTED
    assert not source.refresh()
    view, result, ts = source.latest()
    assert not result.success and view is not None and ts == success_ts
    time.sleep(0.6)
    view, result, _ = source.latest()
    assert view is None and not result.success, "a stale mapping is dropped"
    source.close()


def test_old_kubelet_without_get_allocatable_resources_still_attributes(kubelet: FakeKubelet) -> None:
    u = gpu_uuid(0)
    kubelet.allocatable_unimplemented = True
    kubelet.pods = [pod("ml", "p", [("c", [("nvidia.com/gpu", [f"{u}::0"])])])]
    attribution, stages = attribute_once(kubelet, whole_gpus(1))
    assert stages == {"podresources": True}
    assert [(a.pod.pod, a.replica) for a in attribution.allocations] == [("p", "0")]
    assert dict(attribution.sharing_replicas) == {}, "replicas unknown, not guessed"
    assert dict(attribution.sharing_pods) == {u: 1}
    assert kubelet.allocatable_calls == 1


def test_kubelet_is_asked_once_per_refresh_not_once_per_cycle(kubelet: FakeKubelet) -> None:
    kubelet.pods = [pod("ml", "p", [("c", [("nvidia.com/gpu", [gpu_uuid(0)])])])]
    attributor = kubelet_attributor(kubelet.socket_path)
    try:
        assert wait_for(lambda: attributor.attribute(whole_gpus(1), time.time())[1][0].success, 30)
        for _ in range(200):
            attribution, _ = attributor.attribute(whole_gpus(1), time.time())
        assert len(attribution.allocations) == 1
        assert kubelet.list_calls == 1, "200 cycles inside one refresh period: one List"
    finally:
        attributor.close()


def test_malformed_entries_never_crash_and_are_counted(kubelet: FakeKubelet) -> None:
    kubelet.pods = [
        pod("ml", "empty", [("c", [("nvidia.com/gpu", [])])]),
        pod("ml", "blank", [("c", [("nvidia.com/gpu", ["", "  "])])]),
        pod("ml", "x" * 5000, [("ç" * 300, [("nvidia.com/gpu", [gpu_uuid(0), "GPU-not-a-uuid"])])]),
        pod("", "", [("", [("", [gpu_uuid(7)])])]),
    ]
    attribution, stages = attribute_once(kubelet, whole_gpus(1))
    assert stages == {"podresources": True}
    # names past 253 characters are cut with a hash (exporter/label_values.py)
    held = [(len(a.pod.pod), len(a.pod.container), a.uuid) for a in attribution.allocations]
    assert held == [(253, 253, gpu_uuid(0))]
    assert dict(attribution.unmapped_devices) == {"empty_id": 2, "unknown_shape": 1, "unknown_gpu": 1}


def test_client_reports_unavailable_for_a_missing_socket() -> None:
    client = PodResourcesClient("/nonexistent/kubelet.sock", timeout_seconds=2)
    with pytest.raises(RpcError) as info:
        client.list()
    assert info.value.code == StatusCode.UNAVAILABLE
    client.close()
