"""The exporter's trusted peers are bounded too: a kubelet or an API server that sends too much,
or too slowly, costs one bounded buffer and a failed stage, never the exporter's memory or time.

The hostile peers are the fakes' hostile modes (``tests/fakes``); ``bench/hostile_peers.py``
measures the same attacks against the exporter process.
"""

from __future__ import annotations

import json
import threading
import time
import types
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from exporter.attribution import podresources_wire
from exporter.attribution.grpc_unary import RpcError, StatusCode
from exporter.attribution.kubeapi import MAX_LIST_PAGE_BYTES, ApiBounds, BoundExceeded, KubePodSource, LineReader
from exporter.attribution.podresources import LIST, MAX_MESSAGE_BYTES, PodResourcesClient, PodResourcesSource
from exporter.attribution.podresources_wire import DEADLINE_CHECK_PODS, DecodeDeadlineError, Listed, list_reply
from tests.fakes.kube_api_server import KubeApiEmulator, make_pod
from tests.fakes.kubelet_server import FakeKubelet, PrefixPeer, small_pods_reply
from tests.support.decoding import count_decoded_strings
from tests.support.kube import client_factory, wait_for

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    with FakeKubelet() as k:
        yield k


# --- the kubelet's reply size ----------------------------------------------------------------------


def test_a_reply_over_the_cap_is_refused_at_its_length_prefix(kubelet: FakeKubelet) -> None:
    kubelet.raw_list = small_pods_reply(17 * MiB)
    size = len(kubelet.raw_list)
    assert MAX_MESSAGE_BYTES == 8 * MiB < size
    client = PodResourcesClient(kubelet.socket_path, timeout_seconds=60)
    with client.connect() as conn:
        with pytest.raises(RpcError) as info:
            client.list(conn)
        received = conn.bytes_received
    assert info.value.code == StatusCode.RESOURCE_EXHAUSTED
    assert f"{size} bytes" in info.value.details and f"cap of {MAX_MESSAGE_BYTES} bytes" in info.value.details
    assert received < MiB, f"read {received} bytes of a reply refused from its first 5"


def test_a_peer_that_only_announces_a_huge_reply_is_refused_without_waiting_for_it() -> None:
    """The prefix says 4 GiB and nothing follows: refused at once, not at the deadline."""
    with PrefixPeer(announced=2**32 - 1) as peer, pytest.raises(RpcError) as info:
        PodResourcesClient(peer.socket_path, timeout_seconds=5).list()
    assert info.value.code == StatusCode.RESOURCE_EXHAUSTED, info.value
    assert str(2**32 - 1) in info.value.details


def test_a_reply_under_the_cap_is_received_into_one_buffer_of_its_length(kubelet: FakeKubelet) -> None:
    kubelet.raw_list = small_pods_reply(3 * MiB)
    with PodResourcesClient(kubelet.socket_path, timeout_seconds=60).connect() as conn:
        payload = conn.call(LIST, b"")
    assert isinstance(payload, memoryview), "handed on without a copy"
    assert isinstance(payload.obj, bytearray) and len(payload.obj) == len(payload) == len(kubelet.raw_list)
    assert payload == kubelet.raw_list


# --- decoding inside the deadline ------------------------------------------------------------------


@pytest.mark.parametrize("holding", ["device plugin", "claim"])
def test_decoding_checks_the_deadline_every_so_many_pods(holding: str) -> None:
    claim = holding == "claim"  # claim-only pods (DRA) count as pods too
    payload = small_pods_reply(102 * (3 * DEADLINE_CHECK_PODS), with_gpu=not claim, with_claim=claim)  # >3,000 pods
    with pytest.raises(DecodeDeadlineError) as info:
        list_reply(payload, deadline=time.monotonic() - 1.0)
    assert info.value.items == DEADLINE_CHECK_PODS, "stopped at the first look at the clock"
    listed = list_reply(payload, deadline=time.monotonic() + 600)
    assert len(listed.claimed if claim else listed.devices) > 2 * DEADLINE_CHECK_PODS


def test_a_reply_that_arrives_in_time_but_decodes_past_the_deadline_fails_the_stage(
    kubelet: FakeKubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubelet.raw_list = small_pods_reply(MiB)
    # The call is in time; the decoder's clock then reads an hour later.
    late = types.SimpleNamespace(monotonic=lambda: time.monotonic() + 3600.0)
    monkeypatch.setattr(podresources_wire, "time", late)
    source = PodResourcesSource(kubelet.socket_path, timeout_seconds=30, start=False)
    assert not source.refresh()
    view, result, last_success = source.latest()
    assert view is None and not result.success and last_success is None
    error = source.last_error or ""
    assert error.startswith("DEADLINE_EXCEEDED: decoding the List reply"), error
    assert f"({len(kubelet.raw_list)} bytes)" in error and f"after {DEADLINE_CHECK_PODS} entries" in error


# --- a lean decoder --------------------------------------------------------------------------------


def test_pods_without_devices_decode_no_string(monkeypatch: pytest.MonkeyPatch) -> None:
    decoded = count_decoded_strings(monkeypatch)
    assert list_reply(small_pods_reply(MiB, with_gpu=False)) == Listed((), ())
    assert decoded == [], "no name of a pod without devices is decoded"
    entries = list_reply(small_pods_reply(102 * 10)).devices
    assert len(entries) == 10 and decoded, "pods with devices are"
    decoded.clear()
    claimed = list_reply(small_pods_reply(90 * 10, with_gpu=False, with_claim=True)).claimed
    assert len(claimed) == 10 and decoded, "pods with only a DRA claim are"


def test_names_that_repeat_across_pods_are_one_string_each() -> None:
    entries = list_reply(small_pods_reply(102 * 500)).devices
    assert len(entries) == 500
    first = entries[0]
    for e in entries[1:]:
        assert e.namespace is first.namespace and e.container is first.container and e.resource is first.resource
    assert len({id(e.pod) for e in entries}) == 500, "pod names and device IDs are each their own"


def test_claim_names_that_repeat_across_pods_are_one_string_each() -> None:
    claimed = list_reply(small_pods_reply(90 * 500, with_gpu=False, with_claim=True)).claimed
    assert len(claimed) == 500
    first = claimed[0]
    assert first.claim.claim_namespace is first.namespace, "a claim's namespace is its pod's string"
    for c in claimed[1:]:
        assert c.namespace is first.namespace and c.container is first.container
        assert c.claim.driver is first.claim.driver and c.claim.pool is first.claim.pool
    assert len({c.claim.device for c in claimed}) == 500 and len({id(c.pod) for c in claimed}) == 500


# --- the Kubernetes API ----------------------------------------------------------------------------

NODE = "gpu-node-1"


@pytest.fixture
def api() -> Iterator[KubeApiEmulator]:
    with KubeApiEmulator() as emulator:
        yield emulator


@contextmanager
def watching(api: KubeApiEmulator, **bounds: Any) -> Iterator[KubePodSource]:
    """A pod source on ``api`` with the bounds given (the rest as shipped), closed after."""
    source = KubePodSource(
        client_factory(api.url), NODE, backoff_initial_seconds=0.05, backoff_max_seconds=0.5, bounds=ApiBounds(**bounds)
    )
    try:
        yield source
    finally:
        source.close()


def pod_names(source: KubePodSource) -> set[str]:
    directory, _ = source.latest()
    return set() if directory is None else {p.name for p in directory.by_uid.values()}


def test_an_endless_watch_line_fails_the_stage_at_the_event_cap_then_lists_again(api: KubeApiEmulator) -> None:
    api.put(make_pod("a"))
    api.hostile = "endless-line"
    api.endless_line_bytes = 8 * MiB  # the stream ends after 8 MiB (without the cap it would be read whole)
    with watching(api, max_event_bytes=MiB) as source:
        assert wait_for(lambda: "cap of 1048576 bytes" in (source.last_error or "")), source.last_error
        error = source.last_error or ""
        assert error.startswith("BoundExceeded: watch event line longer than the cap of 1048576 bytes"), error
        read = int(error.rsplit("(", 1)[1].split()[0])
        assert MiB < read <= MiB + 64 * 1024, "refused within one read past the cap"
        assert wait_for(lambda: api.list_starts() >= 2), "backs off, then lists again"


class _Chunks:
    """A watch response that hands out the given chunks, one per read."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    def read1(self, amt: int) -> bytes:
        return self._chunks.pop(0) if self._chunks else b""


def test_the_line_reader_joins_lines_split_anywhere_and_keeps_only_the_unfinished_one() -> None:
    events = [b'{"type":"ADDED","n":%d}' % i for i in range(200)]
    stream = b"\n".join(events) + b"\n\n" + b'{"last":1}'
    reader = LineReader(_Chunks([stream[i : i + 7] for i in range(0, len(stream), 7)]), 64, 3600)
    assert list(reader.lines()) == [*events, b'{"last":1}']
    assert reader.ended and reader.line_started is None
    one_byte_at_a_time = LineReader(_Chunks([bytes([b]) for b in b"x" * 100 + b"\n"]), 100, 3600)
    assert list(one_byte_at_a_time.lines()) == [b"x" * 100], "a line of exactly the cap is accepted"
    with pytest.raises(BoundExceeded):
        list(LineReader(_Chunks([b"x" * 60, b"y" * 60]), 100, 3600).lines())


class _Urllib3V1:
    """A response of urllib3 1.x: ``read(amt)`` and no ``read1``."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    def read(self, amt: int) -> bytes:
        data, self._body = self._body[:amt], self._body[amt:]
        return data


def test_the_line_reader_also_reads_responses_without_read1() -> None:
    body = b'{"a":1}\n' * 20_000
    assert list(LineReader(_Urllib3V1(body), 64, 3600).lines()) == [b'{"a":1}'] * 20_000


def test_a_trickled_watch_line_fails_the_stage_while_it_is_arriving(api: KubeApiEmulator) -> None:
    """The line's first bytes came, the next one is 60 s away: the stage fails once the line is
    older than its bound, before any other byte (nothing else could have failed it)."""
    api.put(make_pod("a"))
    api.hostile = "trickle-line"
    api.trickle_interval = 60.0
    with watching(api, line_stall_seconds=1.0) as source:
        assert wait_for(lambda: api.watch_bytes_sent > 0 and api.watch_count() == 1)
        assert wait_for(lambda: not source.latest()[1].success), "a line unfinished past its bound fails the stage"
        directory, result = source.latest()
        assert directory is None and result.stage == "kube_api"
        assert source.last_error is None, "the reader is still waiting for the next byte: nothing else failed"
        assert api.list_starts() == 1


def test_a_trickled_watch_line_is_dropped_at_the_next_byte_past_its_bound(api: KubeApiEmulator) -> None:
    api.put(make_pod("a"))
    api.hostile = "trickle-line"
    api.trickle_interval = 0.05
    with watching(api, line_stall_seconds=0.5) as source:
        assert wait_for(lambda: "unfinished after 0.5 s" in (source.last_error or "")), source.last_error
        assert wait_for(lambda: api.list_starts() >= 2), "backs off, then lists again"


def test_the_list_is_read_in_pages_and_the_table_replaced_only_when_all_arrived(api: KubeApiEmulator) -> None:
    for i in range(5):
        api.put(make_pod(f"p{i}"))
    with watching(api, page_limit=2) as source:
        assert wait_for(lambda: pod_names(source) == {f"p{i}" for i in range(5)})
        pages = [q for p, q in api.requests if p == "/api/v1/pods" and q.get("watch") != "true"]
        assert [q.get("limit") for q in pages] == ["2", "2", "2"]
        assert [bool(q.get("continue")) for q in pages] == [False, True, True]
        assert source.resource_version == "105", "the list's version, on every page"
        before, _ = source.latest()

        api.continue_gate = threading.Event()
        api.expire_watches = True  # the next watch gets 410 Gone: list again
        api.drop_watches()
        assert api.continue_waiting.wait(20), "the re-list asked for its second page"
        api.expire_watches = False
        held, result = source.latest()
        assert result.success and held is before, "while page 2 is held, the whole old table is served"
        api.continue_gate.set()
        assert wait_for(lambda: api.list_starts() == 2 and api.list_count() == 6 and source.latest()[0] is not before)
        assert pod_names(source) == {f"p{i}" for i in range(5)}


def test_a_list_that_pages_on_and_on_is_refused(api: KubeApiEmulator) -> None:
    for i in range(5):
        api.put(make_pod(f"p{i}"))
    with watching(api, page_limit=1, max_pages=3) as source:
        assert wait_for(lambda: "runs past 3 pages of 1" in (source.last_error or "")), source.last_error
        assert not source.latest()[1].success


def test_watch_events_cannot_grow_the_pod_table_past_what_a_list_may_hold(api: KubeApiEmulator) -> None:
    for i in range(4):
        api.put(make_pod(f"p{i}"))
    with watching(api, page_limit=2, max_pages=2) as source:
        assert wait_for(lambda: pod_names(source) == {"p0", "p1", "p2", "p3"}), source.last_error
        api.put(make_pod("p0"))  # a pod already held may change
        api.put(make_pod("p4"))
        assert wait_for(lambda: "adds a pod past the 4 a list may hold" in (source.last_error or "")), source.last_error
        assert not source.latest()[1].success


def test_a_huge_list_is_refused_from_its_content_length_unread(api: KubeApiEmulator) -> None:
    api.hostile = "huge-list"
    api.huge_list_bytes = 40_000_000
    with watching(api) as source:
        assert wait_for(lambda: source.last_error is not None), "the stage fails"
        error = source.last_error or ""
        assert f"(Content-Length) exceeds the cap of {MAX_LIST_PAGE_BYTES} bytes" in error, error
        assert not source.latest()[1].success


def test_a_huge_list_without_a_length_is_refused_once_the_cap_was_read(api: KubeApiEmulator) -> None:
    api.hostile = "huge-list"
    api.huge_list_bytes = 40_000_000
    api.huge_list_chunked = True
    with watching(api, max_page_bytes=MiB) as source:
        assert wait_for(lambda: source.last_error is not None), "the stage fails"
        error = source.last_error or ""
        assert "pod list page exceeds the cap of 1048576 bytes" in error, error
        read = int(error.rsplit("(", 1)[1].split()[0])
        assert MiB < read <= MiB + 64 * 1024, "refused within one read past the cap"
        assert not source.latest()[1].success


def test_the_emulator_pages_from_the_lists_resource_version(api: KubeApiEmulator) -> None:
    """As the API server: later pages of a list show the pods as they were when it began."""
    for name in ("a", "b", "c"):
        api.put(make_pod(name))
    url = f"{api.url}/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}&limit=2"
    with urllib.request.urlopen(url) as resp:
        first = json.load(resp)
    api.delete("uid-default-c")
    api.put(make_pod("d"))
    with urllib.request.urlopen(url + "&continue=" + first["metadata"]["continue"]) as resp:
        second = json.load(resp)
    assert [p["metadata"]["name"] for p in first["items"] + second["items"]] == ["a", "b", "c"]
    assert first["metadata"]["resourceVersion"] == second["metadata"]["resourceVersion"] == "103"
    assert "continue" not in second["metadata"]
