"""A real gRPC kubelet PodResources v1 server on a temporary unix socket, for tests and benchmarks.

Besides the honest kubelet (``FakeKubelet``) there are three hostile ones: ``FakeKubelet.raw_list``
serves any prepared bytes as the ``List`` reply (``small_pods_reply`` builds tens of MiB of small
pods, or any number of them, once, in one buffer), ``PrefixPeer`` is an HTTP/2 server that
announces a reply of any size in the gRPC length prefix and then sends nothing more, and
``FloodPeer`` one that floods HTTP/2 frames carrying no reply (SETTINGS, PING, WINDOW_UPDATE,
empty DATA) before its reply.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import tempfile
import threading
from collections.abc import Iterable, Sequence
from concurrent import futures
from types import TracebackType
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events

from exporter.attribution._proto import api_pb2
from exporter.attribution.podresources_wire import Listed
from exporter.model import ClaimedDevice, ClaimRef, ContainerDevices

_SERVICE = "v1.PodResourcesLister"

DeviceSpec = tuple[str, Sequence[str]]
"""(resource name, device IDs): a device plugin's entry."""
ClaimDeviceSpec = tuple[str, str, str, Sequence[str]]
"""(driver, pool, device, CDI device names): one device allocated through a ResourceClaim."""
ClaimSpec = tuple[str, str, Sequence[ClaimDeviceSpec]]
"""(claim namespace, claim name, [claimed device, ...]): one DRA ``DynamicResource``."""
ContainerSpec = tuple[str, Sequence[DeviceSpec]] | tuple[str, Sequence[DeviceSpec], Sequence[ClaimSpec]]
"""(container name, [(resource name, device IDs), ...]) and optionally its DRA claims."""


def claim(namespace: str, name: str, claimed: Iterable[ClaimDeviceSpec]) -> api_pb2.DynamicResource:
    """One claim of a container as the kubelet lists it (``dynamic_resources``)."""
    return api_pb2.DynamicResource(
        claim_name=name,
        claim_namespace=namespace,
        claim_resources=[
            api_pb2.ClaimResource(
                cdi_devices=[api_pb2.CDIDevice(name=n) for n in cdi],
                driver_name=driver,
                pool_name=pool,
                device_name=device,
            )
            for driver, pool, device, cdi in claimed
        ],
    )


def _container(spec: ContainerSpec) -> api_pb2.ContainerResources:
    claims: Sequence[ClaimSpec] = spec[2] if len(spec) == 3 else ()
    return api_pb2.ContainerResources(
        name=spec[0],
        devices=[api_pb2.ContainerDevices(resource_name=r, device_ids=list(ids)) for r, ids in spec[1]],
        dynamic_resources=[claim(ns, n, claimed) for ns, n, claimed in claims],
    )


def pod(namespace: str, name: str, containers: Iterable[ContainerSpec]) -> api_pb2.PodResources:
    """One pod as the kubelet lists it; a container spec is (name, devices) or (name, devices,
    claims)."""
    return api_pb2.PodResources(name=name, namespace=namespace, containers=[_container(c) for c in containers])


def official_listing(reply: api_pb2.ListPodResourcesResponse) -> Listed:
    """What the exporter needs from ``reply``, read through the official protobuf runtime: what
    the exporter's own decoder must give for the same bytes."""
    devices = tuple(
        ContainerDevices(p.namespace, p.name, c.name, d.resource_name, tuple(d.device_ids))
        for p in reply.pod_resources
        for c in p.containers
        for d in c.devices
    )
    claimed = tuple(
        ClaimedDevice(
            p.namespace,
            p.name,
            c.name,
            ClaimRef(r.claim_namespace, r.claim_name, cr.driver_name, cr.pool_name, cr.device_name),
            tuple(cdi.name for cdi in cr.cdi_devices),
        )
        for p in reply.pod_resources
        for c in p.containers
        for r in c.dynamic_resources
        for cr in r.claim_resources
    )
    return Listed(devices, claimed)


def devices(resource: str, ids: Iterable[str]) -> api_pb2.ContainerDevices:
    """An allocatable-resources entry."""
    return api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))


_NAME_SLOT = b"pod-00000000"
_ID_SLOT = b"::00000000"


SMALL_POD_GPU = "GPU-00000000-aaaa-bbbb-cccc-000000000000"
"""The GPU whose replicas ``small_pods_reply``'s pods hold by default."""


def small_pods_reply(
    total_bytes: int, with_gpu: bool = True, with_claim: bool = False, pods: int | None = None, gpu: str = SMALL_POD_GPU
) -> bytes:
    """A serialised ``ListPodResourcesResponse`` of about ``total_bytes`` (never more), or of
    exactly ``pods`` pods when given, made of small pods ``team-a/pod-NNNNNNNN``, each one
    container ``main``; ``with_gpu`` gives each
    container one ``nvidia.com/gpu`` device with its own ID (replica ``gpu::NNNNNNNN``), else none;
    ``with_claim`` one DRA claim ``team-a/claim`` of one ``gpu.nvidia.com`` device with its own
    name (``gpu::NNNNNNNN``).

    Built in one buffer from one encoded pod whose name and device IDs are patched per pod, so
    30 MiB cost about two copies of 30 MiB while they are built and one afterwards.
    """
    held = [("nvidia.com/gpu", [gpu + _ID_SLOT.decode()])] if with_gpu else []
    claims: list[ClaimSpec] = (
        [("team-a", "claim", [("gpu.nvidia.com", "node-1", "gpu" + _ID_SLOT.decode(), [])])] if with_claim else []
    )
    one = api_pb2.ListPodResourcesResponse(
        pod_resources=[pod("team-a", _NAME_SLOT.decode(), [("main", held, claims)])]
    ).SerializeToString()
    slots = [one.index(_NAME_SLOT) + len(_NAME_SLOT) - 8]
    at = one.find(_ID_SLOT)
    while at >= 0:
        slots.append(at + len(_ID_SLOT) - 8)
        at = one.find(_ID_SLOT, at + 1)
    count = min(total_bytes // len(one), 10**8) if pods is None else pods
    out = bytearray(one) * count
    for i in range(count):
        digits = b"%08d" % i
        base = i * len(one)
        for slot in slots:
            out[base + slot : base + slot + 8] = digits
    return bytes(out)


def _serialise(message: Any) -> bytes:
    """A reply as the wire carries it: prepared bytes as they are, a protobuf message encoded."""
    return message if isinstance(message, bytes) else bytes(message.SerializeToString())


class _Servicer:
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.k = kubelet

    def List(self, request: Any, context: Any) -> Any:
        gate = self.k.hold_list
        if gate is not None:
            self.k.list_waiting.set()
            gate.wait()
        with self.k.lock:
            self.k.list_calls += 1
            if self.k.fail_list is not None:
                context.abort(self.k.fail_list, "injected failure")
            if self.k.raw_list is not None:
                return self.k.raw_list
            return api_pb2.ListPodResourcesResponse(pod_resources=list(self.k.pods))

    def GetAllocatableResources(self, request: Any, context: Any) -> api_pb2.AllocatableResourcesResponse:
        with self.k.lock:
            self.k.allocatable_calls += 1
            if self.k.allocatable_unimplemented:
                context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method GetAllocatableResources")
            return api_pb2.AllocatableResourcesResponse(devices=list(self.k.allocatable))


def _handlers(servicer: _Servicer) -> dict[str, grpc.RpcMethodHandler]:
    """The two methods the exporter calls; ``List`` may answer with prepared bytes."""
    return {
        "List": grpc.unary_unary_rpc_method_handler(
            servicer.List,
            request_deserializer=api_pb2.ListPodResourcesRequest.FromString,
            response_serializer=_serialise,
        ),
        "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(
            servicer.GetAllocatableResources,
            request_deserializer=api_pb2.AllocatableResourcesRequest.FromString,
            response_serializer=_serialise,
        ),
    }


class FakeKubelet:
    """Serves ``pods`` and ``allocatable`` (mutable attributes) on ``socket_path``.

    ``fail_list`` makes ``List`` fail with that status; ``allocatable_unimplemented`` mimics an
    old kubelet; ``restart()`` removes and recreates the socket like a kubelet restart does.
    ``raw_list`` (bytes) is sent as the ``List`` reply instead of ``pods``, as it is (see
    ``small_pods_reply``).  ``hold_list`` (an Event) holds every ``List`` call until it is set;
    ``list_waiting`` is set once a call waits there.
    """

    def __init__(self, socket_path: str | None = None) -> None:
        # unix socket paths are limited to ~107 bytes: pytest's tmp_path can be longer
        self._dir = None if socket_path else tempfile.mkdtemp(prefix="kubelet-")
        self.socket_path = socket_path or os.path.join(self._dir or "", "kubelet.sock")
        self.lock = threading.Lock()
        self.pods: list[api_pb2.PodResources] = []
        self.allocatable: list[api_pb2.ContainerDevices] = []
        self.allocatable_unimplemented = False
        self.fail_list: grpc.StatusCode | None = None
        self.raw_list: bytes | None = None
        self.hold_list: threading.Event | None = None
        self.list_waiting = threading.Event()
        self.list_calls = 0
        self.allocatable_calls = 0
        self._server: grpc.Server | None = None

    def start(self) -> FakeKubelet:
        """Listen on the socket (replacing a stale file)."""
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4),
            options=[("grpc.max_send_message_length", 512 * 1024 * 1024)],
        )
        handlers = _handlers(_Servicer(self))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))
        server.add_registered_method_handlers(_SERVICE, handlers)
        server.add_insecure_port("unix://" + self.socket_path)
        server.start()
        self._server = server
        return self

    def stop(self, remove_socket: bool = True) -> None:
        """Stop serving; the socket file goes away as when the kubelet exits."""
        if self.hold_list is not None:
            self.hold_list.set()  # a held call would keep its handler thread
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        if remove_socket and os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    def restart(self) -> None:
        """Stop, then serve again on a freshly created socket at the same path."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop and remove the temporary directory."""
        self.stop()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _server_connection() -> h2.connection.H2Connection:
    return h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))


class PrefixPeer:
    """A hostile kubelet: an HTTP/2 server on a unix socket that answers each gRPC call with
    status 200 and a DATA frame holding only the 5-byte length prefix of a message of
    ``announced`` bytes (plus ``extra`` bytes of it), then sends nothing more until it is closed.

    ``sent`` counts the DATA bytes it wrote.
    """

    def __init__(self, announced: int, extra: int = 0) -> None:
        self.announced = announced
        self.extra = extra
        self.sent = 0
        self._dir = tempfile.mkdtemp(prefix="prefix-peer-")
        self.socket_path = os.path.join(self._dir, "kubelet.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.socket_path)
        self._listener.listen(4)
        self._closed = threading.Event()
        self._peers: list[socket.socket] = []
        threading.Thread(target=self._accept, name="prefix-peer", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                peer, _ = self._listener.accept()
            except OSError:
                return
            self._peers.append(peer)
            threading.Thread(target=self._serve, args=(peer,), daemon=True).start()

    def _serve(self, peer: socket.socket) -> None:
        conn = _server_connection()
        conn.initiate_connection()
        with contextlib.suppress(OSError):
            peer.sendall(conn.data_to_send())
            while not self._closed.is_set():
                data = peer.recv(65536)
                if not data:
                    return
                for event in conn.receive_data(data):
                    if (
                        isinstance(event, h2.events.RequestReceived)
                        and event.stream_id is not None
                        and not self._on_request(conn, peer, event.stream_id)
                    ):
                        return
                peer.sendall(conn.data_to_send())

    def _on_request(self, conn: h2.connection.H2Connection, peer: socket.socket, stream: int) -> bool:
        """Answer the call on ``stream``; False ends the connection's loop (a subclass that took the
        connection over)."""
        self._answer(conn, stream)
        return True

    def _answer(self, conn: h2.connection.H2Connection, stream: int) -> None:
        conn.send_headers(stream, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        body = struct.pack(">BI", 0, self.announced) + b"\0" * self.extra
        conn.send_data(stream, body)
        self.sent += len(body)

    def close(self) -> None:
        """Stop listening, hang up on every caller and remove the socket."""
        self._closed.set()
        self._listener.close()
        for peer in self._peers:
            with contextlib.suppress(OSError):
                peer.shutdown(socket.SHUT_RDWR)
            peer.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> PrefixPeer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


FLOOD_FRAMES = {
    "settings": struct.pack(">IBBI", 0, 0x4, 0, 0)[1:],  # empty SETTINGS, stream 0
    "ping": struct.pack(">IBBI", 8, 0x6, 0, 0)[1:] + b"pingpong",
    "window_update": struct.pack(">IBBI", 4, 0x8, 0, 0)[1:] + struct.pack(">I", 1),
}
"""Frames carrying no reply, each as the wire carries it (9-byte header: 24-bit length, type,
flags, stream).  An empty DATA frame needs the reply's stream: ``FloodPeer`` builds it."""


class FloodPeer(PrefixPeer):
    """A hostile kubelet: an HTTP/2 server that answers each gRPC call with status 200, then
    ``frames`` frames carrying no reply (``kinds`` in turn, from ``FLOOD_FRAMES`` and
    ``"empty_data"``; ``None``: until the caller hangs up), then ``reply`` as the one message and
    an OK status.  What the caller sends after its request is read and dropped (its PING and
    SETTINGS acknowledgements).  ``sent`` counts the flood frames written.
    """

    def __init__(
        self,
        frames: int | None,
        reply: bytes = b"",
        kinds: Sequence[str] = ("settings", "ping", "window_update", "empty_data"),
    ) -> None:
        super().__init__(0)
        self.frames = frames
        self.reply = reply
        self.kinds = tuple(kinds)

    def _on_request(self, conn: h2.connection.H2Connection, peer: socket.socket, stream: int) -> bool:
        threading.Thread(target=self._drain, args=(peer,), daemon=True).start()
        self._flood_then_answer(conn, peer, stream)
        return False

    def _drain(self, peer: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while peer.recv(65536):
                pass

    def _flood_then_answer(self, conn: h2.connection.H2Connection, peer: socket.socket, stream: int) -> None:
        conn.send_headers(stream, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        peer.sendall(conn.data_to_send())
        frames = {**FLOOD_FRAMES, "empty_data": struct.pack(">IBBI", 0, 0x0, 0, stream)[1:]}
        cycle = b"".join(frames[k] for k in self.kinds)
        batch = cycle * max(1, 4096 // len(cycle))
        per_batch = len(self.kinds) * (len(batch) // len(cycle))
        while not self._closed.is_set() and (self.frames is None or self.sent < self.frames):
            if self.frames is not None and self.frames - self.sent < per_batch:
                rest = self.frames - self.sent
                peer.sendall(b"".join(frames[self.kinds[i % len(self.kinds)]] for i in range(rest)))
                self.sent += rest
                break
            peer.sendall(batch)
            self.sent += per_batch
        body = struct.pack(">BI", 0, len(self.reply)) + self.reply
        for at in range(0, len(body), 16384):  # the default largest frame
            conn.send_data(stream, body[at : at + 16384])
        conn.send_headers(stream, [(b"grpc-status", b"0")], end_stream=True)
        peer.sendall(conn.data_to_send())
