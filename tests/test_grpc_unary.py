"""The kubelet client's own gRPC framing and protobuf decoding, against the real thing.

Replies are encoded by the official protobuf runtime (the stubs generated from the kubelet's
``api.proto``) and served by a real ``grpcio`` server; hostile peers are raw unix sockets.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest

from exporter.attribution._proto import api_pb2
from exporter.attribution.grpc_unary import RpcError, StatusCode, UnaryConnection
from exporter.attribution.podresources import ALLOCATABLE, LIST, PodResourcesClient
from exporter.attribution.podresources_wire import Listed, WireError, allocatable_reply, list_reply
from exporter.model import ContainerDevices
from tests.fakes.kubelet_server import FakeKubelet, devices, official_listing, pod

pytestmark = pytest.mark.integration


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcxyz-0é漢") for _ in range(rng.randint(0, 12)))


def _topology(rng: random.Random) -> api_pb2.TopologyInfo:
    return api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=rng.randint(-3, 1 << 40)) for _ in range(rng.randint(0, 2))])


def _container_devices(rng: random.Random) -> api_pb2.ContainerDevices:
    return api_pb2.ContainerDevices(
        resource_name=_word(rng),
        device_ids=[_word(rng) for _ in range(rng.randint(0, 4))],
        topology=_topology(rng),
    )


def _random_list(rng: random.Random) -> api_pb2.ListPodResourcesResponse:
    """Every field of the v1 schema filled at random, the ones the exporter skips too."""
    pods = []
    for _ in range(rng.randint(0, 5)):
        containers = [
            api_pb2.ContainerResources(
                name=_word(rng),
                devices=[_container_devices(rng) for _ in range(rng.randint(0, 3))],
                cpu_ids=[rng.randint(0, 1 << 33) for _ in range(rng.randint(0, 6))],
                memory=[
                    api_pb2.ContainerMemory(
                        memory_type=_word(rng), size=rng.randint(0, 1 << 62), topology=_topology(rng)
                    )
                    for _ in range(rng.randint(0, 2))
                ],
                dynamic_resources=[
                    api_pb2.DynamicResource(
                        claim_name=_word(rng),
                        claim_namespace=_word(rng),
                        claim_resources=[
                            api_pb2.ClaimResource(
                                cdi_devices=[api_pb2.CDIDevice(name=_word(rng)) for _ in range(rng.randint(0, 2))],
                                driver_name=_word(rng),
                                pool_name=_word(rng),
                                device_name=_word(rng),
                            )
                            for _ in range(rng.randint(0, 2))
                        ],
                    )
                    for _ in range(rng.randint(0, 2))
                ],
            )
            for _ in range(rng.randint(0, 3))
        ]
        pods.append(api_pb2.PodResources(name=_word(rng), namespace=_word(rng), containers=containers))
    return api_pb2.ListPodResourcesResponse(pod_resources=pods)


def _expected(reply: api_pb2.ListPodResourcesResponse) -> Listed:
    """What the exporter needs, read through the official runtime."""
    return official_listing(reply)


def test_decoder_reads_what_the_official_runtime_encodes() -> None:
    rng = random.Random(7)
    for _ in range(300):
        message = _random_list(rng)
        assert list_reply(message.SerializeToString()) == _expected(message)
        allocatable = api_pb2.AllocatableResourcesResponse(
            devices=[_container_devices(rng) for _ in range(rng.randint(0, 4))],
            cpu_ids=[rng.randint(0, 300) for _ in range(rng.randint(0, 4))],
        )
        ids = tuple(i for d in allocatable.devices for i in d.device_ids)
        assert allocatable_reply(allocatable.SerializeToString()) == ids


def test_decoder_skips_fields_a_newer_kubelet_adds() -> None:
    base = api_pb2.ListPodResourcesResponse(
        pod_resources=[pod("ml", "train", [("main", [("nvidia.com/gpu", ["GPU-a", "GPU-b"])])])]
    ).SerializeToString()
    # field 9 varint, field 10 fixed64, field 11 bytes, field 12 fixed32: unknown at the top level
    extra = b"\x48\x96\x01" + b"\x51" + b"\x00" * 8 + b"\x5a\x03abc" + b"\x65" + b"\x00" * 4
    assert list_reply(extra + base + extra) == list_reply(base)
    assert list_reply(base).devices[0].device_ids == ("GPU-a", "GPU-b")


def test_malformed_replies_raise_wire_error_only() -> None:
    """Every truncation and thousands of corruptions end in a result or a WireError, nothing else."""
    rng = random.Random(11)
    good = _random_list(rng)
    while not (_expected(good).devices and _expected(good).claimed):
        good = _random_list(rng)
    payload = good.SerializeToString()
    for cut in range(len(payload)):
        with contextlib.suppress(WireError):
            list_reply(payload[:cut])
    for _ in range(3000):
        corrupt = bytearray(payload)
        for _ in range(rng.randint(1, 4)):
            corrupt[rng.randrange(len(corrupt))] = rng.randrange(256)
        with contextlib.suppress(WireError):
            list_reply(bytes(corrupt))
    with pytest.raises(WireError):
        list_reply(b"\x0a\x05ab")  # length past the end
    with pytest.raises(WireError):
        list_reply(b"\x0b")  # wire type 3 (groups) is not proto3
    with pytest.raises(WireError):
        list_reply(b"\x08" + b"\xff" * 11)  # a varint that never ends


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    with FakeKubelet() as k:
        yield k


def test_calls_a_real_grpc_server(kubelet: FakeKubelet) -> None:
    kubelet.pods = [pod("ml", "train", [("main", [("nvidia.com/gpu", ["GPU-a"])]), ("side", [])])]
    kubelet.allocatable = [devices("nvidia.com/gpu", ["GPU-a", "GPU-b"]), devices("example.com/nic", ["n0"])]
    client = PodResourcesClient(kubelet.socket_path, timeout_seconds=5)
    with client.connect() as conn:  # two calls on one connection
        assert client.list(conn) == Listed((ContainerDevices("ml", "train", "main", "nvidia.com/gpu", ("GPU-a",)),), ())
        assert client.allocatable(conn) == ("GPU-a", "GPU-b", "n0")
    assert kubelet.list_calls == 1 and kubelet.allocatable_calls == 1


def test_an_old_kubelet_without_allocatable_gives_none(kubelet: FakeKubelet) -> None:
    kubelet.allocatable_unimplemented = True
    assert PodResourcesClient(kubelet.socket_path).allocatable() is None


def test_server_status_and_message_reach_the_caller(kubelet: FakeKubelet) -> None:
    kubelet.fail_list = grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(RpcError) as info:
        PodResourcesClient(kubelet.socket_path).list()
    assert info.value.code == StatusCode.PERMISSION_DENIED
    assert info.value.details == "injected failure"


def test_a_reply_larger_than_the_window_streams_and_one_over_the_limit_is_refused(kubelet: FakeKubelet) -> None:
    ids = [f"GPU-{i:08d}-" + "x" * 200 for i in range(120_000)]  # ~25 MB: more than the 16 MiB window
    kubelet.pods = [pod("ml", "big", [("main", [("nvidia.com/gpu", ids)])])]
    reply = PodResourcesClient(kubelet.socket_path, timeout_seconds=30, max_reply_bytes=32 * 1024 * 1024).list()
    assert reply.devices[0].device_ids == tuple(ids)
    with UnaryConnection(kubelet.socket_path, 30, max_reply_bytes=1 << 20) as conn, pytest.raises(RpcError) as info:
        conn.call(LIST, b"")
    assert info.value.code == StatusCode.RESOURCE_EXHAUSTED


def test_unknown_method_is_unimplemented(kubelet: FakeKubelet) -> None:
    with UnaryConnection(kubelet.socket_path, 5, 1 << 20) as conn, pytest.raises(RpcError) as info:
        conn.call("/v1.PodResourcesLister/NoSuchMethod", b"")
    assert info.value.code == StatusCode.UNIMPLEMENTED
    with UnaryConnection(kubelet.socket_path, 5, 1 << 20) as conn:  # the server is still fine
        assert allocatable_reply(conn.call(ALLOCATABLE, b"")) == ()


@contextlib.contextmanager
def _raw_server(behave: Callable[[socket.socket], None]) -> Iterator[str]:
    """A unix socket whose one peer does ``behave``; yields the socket path."""
    path = os.path.join(tempfile.mkdtemp(prefix="raw-"), "s.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                peer, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with peer:
                behave(peer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        stop.set()
        listener.close()
        thread.join(timeout=5)
        os.unlink(path)
        os.rmdir(os.path.dirname(path))


def _silent(peer: socket.socket) -> None:
    peer.recv(65536)
    time.sleep(2)


def _http1(peer: socket.socket) -> None:
    """An HTTP/1.1 server: its status line reads as the header of a 4.7 MB frame, which is waited
    for (a frame is at most 16 MiB, so the wait is bounded in memory too) until the deadline."""
    peer.recv(65536)
    peer.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    time.sleep(2)


def _bad_frame(peer: socket.socket) -> None:
    """A DATA frame on stream 0, which HTTP/2 forbids."""
    peer.recv(65536)
    peer.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + b"\x00\x00\x01\x00\x00\x00\x00\x00\x00X")
    time.sleep(2)


def _hang_up(peer: socket.socket) -> None:
    pass


def _dribble(peer: socket.socket) -> None:
    """A byte of a valid-looking settings frame every 0.2 s: each read succeeds, the call may not last."""
    frame = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" * 50
    for byte in frame:
        try:
            peer.sendall(bytes([byte]))
        except OSError:
            return
        time.sleep(0.2)


@pytest.mark.parametrize(
    ("behave", "code"),
    [
        (_silent, StatusCode.DEADLINE_EXCEEDED),
        (_dribble, StatusCode.DEADLINE_EXCEEDED),
        (_http1, StatusCode.DEADLINE_EXCEEDED),
        (_bad_frame, StatusCode.INTERNAL),
        (_hang_up, StatusCode.UNAVAILABLE),
    ],
)
def test_a_hostile_or_broken_peer_costs_one_bounded_call(
    behave: Callable[[socket.socket], None], code: StatusCode
) -> None:
    """The code tells the deadline from the peer's own end: a silent peer hangs up after 2 s and
    the dribbler after 90 s, each of which would read UNAVAILABLE."""
    with _raw_server(behave) as path, pytest.raises(RpcError) as info:
        PodResourcesClient(path, timeout_seconds=1.0).list()
    assert info.value.code == code
