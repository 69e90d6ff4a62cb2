"""The exporter's trusted peers are bounded too: a kubelet or an API server that sends too much,
or too slowly, costs one bounded buffer and a failed stage, never the exporter's memory or time.

The hostile peers are the fakes' hostile modes (``tests/fakes``); ``bench/hostile_peers.py``
measures the same attacks against the exporter process.
"""

from __future__ import annotations

import time
import types
from collections.abc import Iterator

import pytest

from exporter.attribution import podresources_wire
from exporter.attribution.grpc_unary import RpcError, StatusCode
from exporter.attribution.podresources import LIST, MAX_MESSAGE_BYTES, PodResourcesClient, PodResourcesSource
from exporter.attribution.podresources_wire import DEADLINE_CHECK_PODS, DecodeDeadlineError, list_reply
from tests.fakes.kubelet_server import FakeKubelet, PrefixPeer, small_pods_reply

MiB = 1024 * 1024


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    with FakeKubelet() as k:
        yield k


# --- the kubelet's reply size ----------------------------------------------------------------------


def test_a_reply_over_the_cap_is_refused_at_its_length_prefix(kubelet: FakeKubelet) -> None:
    kubelet.raw_list = small_pods_reply(17 * MiB)
    size = len(kubelet.raw_list)
    assert MAX_MESSAGE_BYTES == 16 * MiB < size
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


def test_decoding_checks_the_deadline_every_so_many_pods() -> None:
    payload = small_pods_reply(102 * (3 * DEADLINE_CHECK_PODS))  # about 3,000 pods
    with pytest.raises(DecodeDeadlineError) as info:
        list_reply(payload, deadline=time.monotonic() - 1.0)
    assert info.value.items == DEADLINE_CHECK_PODS, "stopped at the first look at the clock"
    assert len(list_reply(payload, deadline=time.monotonic() + 600)) > 2 * DEADLINE_CHECK_PODS


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
    decoded: list[int] = []
    real = podresources_wire._text

    def counting(buf: memoryview, start: int, end: int) -> str:
        decoded.append(end - start)
        return real(buf, start, end)

    monkeypatch.setattr(podresources_wire, "_text", counting)
    assert list_reply(small_pods_reply(MiB, with_gpu=False)) == ()
    assert decoded == [], "no name of a pod without devices is decoded"
    entries = list_reply(small_pods_reply(102 * 10))
    assert len(entries) == 10 and decoded, "pods with devices are"


def test_names_that_repeat_across_pods_are_one_string_each() -> None:
    entries = list_reply(small_pods_reply(102 * 500))
    assert len(entries) == 500
    first = entries[0]
    for e in entries[1:]:
        assert e.namespace is first.namespace and e.container is first.container and e.resource is first.resource
    assert len({id(e.pod) for e in entries}) == 500, "pod names and device IDs are each their own"
