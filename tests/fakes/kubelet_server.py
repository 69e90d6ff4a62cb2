"""A real gRPC kubelet PodResources v1 server on a temporary unix socket, for tests and benchmarks."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Sequence
from concurrent import futures
from types import TracebackType
from typing import Any

import grpc

from exporter.attribution._proto import api_pb2, api_pb2_grpc

ContainerSpec = tuple[str, Sequence[tuple[str, Sequence[str]]]]
"""(container name, [(resource name, device IDs), ...])."""


def pod(namespace: str, name: str, containers: Iterable[ContainerSpec]) -> api_pb2.PodResources:
    """One pod as the kubelet lists it."""
    return api_pb2.PodResources(
        name=name,
        namespace=namespace,
        containers=[
            api_pb2.ContainerResources(
                name=cname,
                devices=[api_pb2.ContainerDevices(resource_name=r, device_ids=list(ids)) for r, ids in devs],
            )
            for cname, devs in containers
        ],
    )


def devices(resource: str, ids: Iterable[str]) -> api_pb2.ContainerDevices:
    """An allocatable-resources entry."""
    return api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))


class _Servicer(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.k = kubelet

    def List(self, request: Any, context: Any) -> api_pb2.ListPodResourcesResponse:
        with self.k.lock:
            self.k.list_calls += 1
            if self.k.fail_list is not None:
                context.abort(self.k.fail_list, "injected failure")
            return api_pb2.ListPodResourcesResponse(pod_resources=list(self.k.pods))

    def GetAllocatableResources(self, request: Any, context: Any) -> api_pb2.AllocatableResourcesResponse:
        with self.k.lock:
            self.k.allocatable_calls += 1
            if self.k.allocatable_unimplemented:
                context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method GetAllocatableResources")
            return api_pb2.AllocatableResourcesResponse(devices=list(self.k.allocatable))


class FakeKubelet:
    """Serves ``pods`` and ``allocatable`` (mutable attributes) on ``socket_path``.

    ``fail_list`` makes ``List`` fail with that status; ``allocatable_unimplemented`` mimics an
    old kubelet; ``restart()`` removes and recreates the socket like a kubelet restart does.
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
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Servicer(self), server)
        server.add_insecure_port("unix://" + self.socket_path)
        server.start()
        self._server = server
        return self

    def stop(self, remove_socket: bool = True) -> None:
        """Stop serving; the socket file goes away as when the kubelet exits."""
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
