"""Ceilings on what one kubelet can make the exporter hold and export (issue 51, defect 6 and
"Kubelet and peers"): pods and allocations per node, decoding work per refresh, the backoff after
a refresh that cost work and failed, and HTTP/2 frames that carry no reply.

Through the real seams: a gRPC kubelet on a unix socket (``tests/fakes/kubelet_server.py``), the
exporter process scraped over HTTP.
"""

from __future__ import annotations

import random
import time
import types
import urllib.request
from collections.abc import Iterator

import pytest

from exporter.attribution import grpc_unary, podresources, podresources_wire
from exporter.attribution.grpc_unary import RpcError, StatusCode
from exporter.attribution.pipeline import PipelineAttributor
from exporter.attribution.podresources import PodResourcesClient, PodResourcesSource
from exporter.attribution.podresources_wire import list_reply
from exporter.model import BackendSample, GpuSample, LeafSample
from tests.fakes.kubelet_server import FakeKubelet, FloodPeer, pod, small_pods_reply
from tests.support.decoding import count_decoded_strings
from tests.support.exporter import run_exporter
from tests.support.scrape import NO_API_ENV, Samples, eventually, gpu_uuids, scrape, stage

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
DROPPED = "gpulens_attribution_items_dropped_total"
GPU0 = "GPU-00000000-aaaa-bbbb-cccc-000000000000"


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    with FakeKubelet() as k:
        yield k


def one_gpu() -> BackendSample:
    return BackendSample(up=True, gpus=(GpuSample(index=0, uuid=GPU0, leaves=(LeafSample(uuid=GPU0),)),))


def dropped(samples: Samples) -> dict[tuple[str, str], float]:
    return {(lab["kind"], lab["reason"]): value for lab, value in samples.get(DROPPED, [])}


# --- 50,000 GPU-holding pods, end to end -----------------------------------------------------------


def test_fifty_thousand_gpu_pods_give_the_ceiling_of_series_and_count_the_rest(kubelet: FakeKubelet) -> None:
    # 3 s: the refresh's deadline is at most its period, and a busy test machine needs more than 1 s
    args = ("--kubernetes.podresources-socket", kubelet.socket_path, "--kubernetes.refresh-interval", "3s")
    with run_exporter(*args, "--no-kubernetes.api", env=NO_API_ENV) as base:
        uuid = gpu_uuids(scrape(base))[0]
        # Each pod holds its own time-slicing replica of the node's first GPU: every one resolves.
        kubelet.raw_list = small_pods_reply(0, pods=50_000, gpu=uuid)
        samples = eventually(
            base, lambda s: "gpulens_pod_gpu_allocation" in s and stage(s, "podresources") == 1.0, timeout=60
        )
        with urllib.request.urlopen(f"{base}/metrics", timeout=30) as resp:
            page = resp.read()
    held = samples.get("gpulens_pod_gpu_allocation", [])
    assert len(held) == 1024, "the default --kubernetes.max-pods"
    assert {lab["pod"] for lab, _ in held} == {f"pod-{i:08d}" for i in range(1024)}, "the first by name"
    counts = dropped(samples)
    assert counts[("pod", "limit")] % (50_000 - 1024) == 0, "the true count, once per refresh"
    assert counts[("allocation", "limit")] == 0 and counts[("kubelet_connection", "control_frame_flood")] == 0
    assert stage(samples, "podresources") == 1.0, "a node past the ceiling is served, not failed"
    assert len(page) < 4 * MiB, len(page)  # 2.1 MB: 11 series a pod (allocation, boundness classes)


# --- which pods are kept, and what decoding costs ---------------------------------------------------


def test_past_the_pod_ceiling_gpu_pods_come_first_then_by_name_whatever_the_kubelets_order(
    kubelet: FakeKubelet,
) -> None:
    gpu_pods = [pod("zz", f"gpu-{i:03d}", [("main", [("nvidia.com/gpu", [f"{GPU0}::{i}"])])]) for i in range(300)]
    nic_pods = [pod("aa", f"nic-{i:03d}", [("main", [("example.com/vf", [f"vf-{i}"])])]) for i in range(300)]
    idle = [pod("aa", f"idle-{i:03d}", [("main", [])]) for i in range(300)]
    source = PodResourcesSource(kubelet.socket_path, start=False, max_pods=400)
    kept = []
    for seed in (1, 2):
        kubelet.pods = gpu_pods + nic_pods + idle
        random.Random(seed).shuffle(kubelet.pods)
        assert source.refresh(), source.last_error
        view, _, _ = source.latest()
        assert view is not None and view.dropped_pods == 200, "idle pods are not counted"
        kept.append({(d.namespace, d.pod) for d in view.devices})
    assert kept[0] == kept[1], "the same pods at every refresh"
    assert kept[0] == {("zz", f"gpu-{i:03d}") for i in range(300)} | {("aa", f"nic-{i:03d}") for i in range(100)}


def test_decoding_past_the_ceiling_makes_objects_of_the_pods_kept_only(monkeypatch: pytest.MonkeyPatch) -> None:
    decoded = count_decoded_strings(monkeypatch)
    listed = list_reply(small_pods_reply(0, pods=20_000), max_pods=10)
    assert [d.pod for d in listed.devices] == [f"pod-{i:08d}" for i in range(10)]
    assert listed.dropped_pods == 19_990
    assert len(decoded) <= 10 * 4, "a pod name and a device ID a pod (and the shared names once)"


def test_a_seven_mebibyte_reply_is_decoded_in_linear_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    # The whole reply is walked (to rank the pods) but only max_pods are decoded; twice the
    # reply costs about twice the field reads, not four times.
    calls = {"n": 0}
    real = podresources_wire._next_field

    def counting(buf: memoryview, pos: int, end: int) -> tuple[int, int, int]:
        calls["n"] += 1
        return real(buf, pos, end)

    monkeypatch.setattr(podresources_wire, "_next_field", counting)
    reads = []
    for size in (MiB, 2 * MiB):
        calls["n"] = 0
        list_reply(small_pods_reply(size), max_pods=1024)
        reads.append(calls["n"])
    assert reads[1] < 2.2 * reads[0], reads


# --- allocations ----------------------------------------------------------------------------------


def test_past_the_allocation_ceiling_the_first_by_pod_are_kept_and_counted_once_per_refresh(
    kubelet: FakeKubelet,
) -> None:
    kubelet.pods = [pod("ml", f"p-{i:03d}", [("main", [("nvidia.com/gpu", [f"{GPU0}::{i}"])])]) for i in range(300)]
    random.Random(3).shuffle(kubelet.pods)
    source = PodResourcesSource(kubelet.socket_path, start=False)
    attributor = PipelineAttributor(source, None, None, max_allocations=100, kubelet_dropped=source.dropped)
    assert source.refresh()
    attribution, _ = attributor.attribute(one_gpu(), time.time())
    assert sorted(a.pod.pod for a in attribution.allocations) == [f"p-{i:03d}" for i in range(100)]
    assert attribution.sharing_pods == {GPU0: 300}, "the GPU's own counts are of every holder"
    assert attribution.items_dropped is not None
    assert attribution.items_dropped[("allocation", "limit")] == 200
    again, _ = attributor.attribute(one_gpu(), time.time())
    assert again.items_dropped is not None and again.items_dropped[("allocation", "limit")] == 200, "per refresh"
    time.sleep(0.01)  # the next refresh's time differs from the first's
    assert source.refresh()
    third, _ = attributor.attribute(one_gpu(), time.time())
    assert third.items_dropped is not None and third.items_dropped[("allocation", "limit")] == 400


# --- backoff --------------------------------------------------------------------------------------


def test_a_reply_that_cannot_be_decoded_in_time_backs_off_and_recovers(
    kubelet: FakeKubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubelet.raw_list = small_pods_reply(MiB)
    source = PodResourcesSource(kubelet.socket_path, refresh_seconds=10, timeout_seconds=30, start=False)
    assert source.next_wait() == 10
    late = types.SimpleNamespace(monotonic=lambda: time.monotonic() + 3600.0)
    monkeypatch.setattr(podresources_wire, "time", late)  # every decoding runs past its deadline
    waits = []
    for _ in range(6):
        assert not source.refresh()
        waits.append(source.next_wait())
    assert (source.last_error or "").startswith("DEADLINE_EXCEEDED: decoding the List reply")
    assert waits == [20, 40, 80, 160, 160, 160] and podresources.BACKOFF_MAX_PERIODS == 16
    _, result, _ = source.latest()
    assert not result.success
    monkeypatch.undo()
    assert source.refresh() and source.next_wait() == 10, "a success ends the backoff"


def test_a_kubelet_that_is_not_there_is_asked_again_after_one_period(kubelet: FakeKubelet) -> None:
    kubelet.stop()  # restarting: no socket, nothing received, nothing spent
    source = PodResourcesSource(kubelet.socket_path, refresh_seconds=10, start=False)
    for _ in range(3):
        assert not source.refresh()
    assert source.next_wait() == 10


# --- HTTP/2 frames carrying no reply --------------------------------------------------------------


def test_a_kubelet_flooding_control_frames_is_cut_off_and_the_next_refresh_backs_off() -> None:
    with FloodPeer(None, small_pods_reply(0, pods=3)) as peer:
        with pytest.raises(RpcError) as info:
            PodResourcesClient(peer.socket_path, timeout_seconds=3).list()
        assert info.value.code == StatusCode.RESOURCE_EXHAUSTED, info.value
        assert isinstance(info.value, grpc_unary.ControlFloodError)
        assert "HTTP/2 frames carrying no reply" in info.value.details
        source = PodResourcesSource(peer.socket_path, refresh_seconds=10, timeout_seconds=3, start=False)
        assert not source.refresh()
        _, result, _ = source.latest()
        assert not result.success
        assert source.dropped() == {("kubelet_connection", "control_frame_flood"): 1}
        assert source.next_wait() == 20


@pytest.mark.parametrize("kind", ["settings", "ping", "window_update", "empty_data"])
def test_each_kind_of_control_frame_counts_and_a_few_are_fine(kind: str) -> None:
    with FloodPeer(12, small_pods_reply(0, pods=3), kinds=(kind,)) as peer:
        assert len(PodResourcesClient(peer.socket_path, timeout_seconds=3).list().devices) == 3
    flood = FloodPeer(50 * 64, small_pods_reply(0, pods=3), kinds=(kind,))  # 50 times the burst allowed
    with flood as peer, pytest.raises(RpcError) as info:
        PodResourcesClient(peer.socket_path, timeout_seconds=3).list()
    assert info.value.code == StatusCode.RESOURCE_EXHAUSTED, info.value
