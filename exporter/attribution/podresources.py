"""Kubelet PodResources v1 client over its unix socket, refreshed on its own period with caching.

``List`` says which device IDs each container holds; ``GetAllocatableResources`` what the node
advertises (time-slicing replicas).  The kubelet is asked once per refresh period by a background
thread, never per scrape or per sampling cycle (dcgm-exporter's per-scrape calls burnt cores on
MIG nodes).  Replies over gRPC's default 4 MiB are accepted.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import grpc

from exporter.attribution import stages
from exporter.attribution._proto import api_pb2, api_pb2_grpc
from exporter.attribution.merge import KubeletView
from exporter.model import ContainerDevices, StageResult

log = logging.getLogger(__name__)

STAGE = stages.PODRESOURCES
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""Largest reply accepted: 1,000 pods with SR-IOV NICs and CPU lists exceed the 4 MiB default."""


class PodResourcesClient:
    """Blocking v1 client; the channel is rebuilt after any failure so a recreated socket
    (kubelet restart) is picked up on the next call instead of after gRPC's reconnect backoff."""

    def __init__(self, socket_path: str, timeout_seconds: float = 5.0) -> None:
        self.socket_path = socket_path
        self.timeout_seconds = timeout_seconds
        self._channel: grpc.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None

    def _get_stub(self) -> api_pb2_grpc.PodResourcesListerStub:
        if self._stub is None:
            self._channel = grpc.insecure_channel(
                "unix://" + os.path.abspath(self.socket_path),
                options=[
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.enable_http_proxy", 0),
                ],
            )
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    def list(self) -> tuple[ContainerDevices, ...]:
        """Every container's devices, one entry per (container, resource); raises ``grpc.RpcError``."""
        try:
            reply = self._get_stub().List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_seconds)
        except grpc.RpcError:
            self.reset()
            raise
        out: list[ContainerDevices] = []
        for pod in reply.pod_resources:
            for container in pod.containers:
                for dev in container.devices:
                    out.append(
                        ContainerDevices(
                            namespace=pod.namespace,
                            pod=pod.name,
                            container=container.name,
                            resource=dev.resource_name,
                            device_ids=tuple(dev.device_ids),
                        )
                    )
        return tuple(out)

    def allocatable(self) -> tuple[str, ...] | None:
        """Device IDs the node can allocate, all resources; ``None`` on kubelets without the call
        (UNIMPLEMENTED before Kubernetes 1.23 or with the feature gate off)."""
        try:
            reply = self._get_stub().GetAllocatableResources(
                api_pb2.AllocatableResourcesRequest(), timeout=self.timeout_seconds
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None
            self.reset()
            raise
        return tuple(i for dev in reply.devices for i in dev.device_ids)

    def reset(self) -> None:
        """Drop the channel; the next call dials the socket afresh."""
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stub = None

    def close(self) -> None:
        """Close the channel; idempotent."""
        self.reset()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"


class PodResourcesSource:
    """Keeps the newest ``KubeletView``; a background thread refreshes it every ``refresh_seconds``.

    After a failed refresh the last good view is still served (stage marked failed) until it is
    ``stale_after_seconds`` old, then dropped: a short kubelet restart does not blank the
    allocation series, a dead kubelet does not leave them up for ever.
    """

    def __init__(
        self,
        socket_path: str,
        refresh_seconds: float = 10.0,
        timeout_seconds: float = 5.0,
        stale_after_seconds: float | None = None,
        start: bool = True,
    ) -> None:
        self.refresh_seconds = max(1.0, refresh_seconds)
        self.stale_after_seconds = stale_after_seconds if stale_after_seconds is not None else 3 * self.refresh_seconds
        self._client = PodResourcesClient(socket_path, min(timeout_seconds, self.refresh_seconds))
        self._lock = threading.Lock()
        self._view: KubeletView | None = None
        self._ok = False
        self._duration = 0.0
        self._last_success: float | None = None
        self._last_error: str | None = None
        self.refreshes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if start:
            self.refresh()  # the first snapshot already has allocations (bounded by the timeout)
            self._thread = threading.Thread(target=self._run, name="gpulens-podresources", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_seconds):
            self.refresh()

    def refresh(self) -> bool:
        """Ask the kubelet now; True on success.  Never raises."""
        start = time.perf_counter()
        try:
            devices = self._client.list()
            allocatable = self._client.allocatable()
        except Exception as exc:  # any failure of this source only fails this stage
            error = _describe(exc)
            with self._lock:
                self._ok = False
                self._duration = time.perf_counter() - start
                self.refreshes += 1
                changed = error != self._last_error
                self._last_error = error
            if changed:  # one line per new condition, not one per refresh
                log.warning("kubelet PodResources at %s failed: %s", self._client.socket_path, error)
            return False
        view = KubeletView(devices=devices, allocatable=allocatable)
        with self._lock:
            if self._view is not None and self._view == view:
                view = self._view  # unchanged: keep the object so the merge cache stays valid
            self._view = view
            self._ok = True
            self._duration = time.perf_counter() - start
            self._last_success = time.time()
            self.refreshes += 1
            recovered = self._last_error is not None
            self._last_error = None
        if recovered:
            log.info("kubelet PodResources at %s answers again", self._client.socket_path)
        return True

    def latest(self) -> tuple[KubeletView | None, StageResult, float | None]:
        """(view or ``None``, health of the last refresh, unix time of the last success)."""
        with self._lock:
            view = self._view
            if not self._ok and (
                self._last_success is None or time.time() - self._last_success > self.stale_after_seconds
            ):
                view = None
            return view, StageResult(STAGE, self._ok, self._duration), self._last_success

    def close(self) -> None:
        """Stop the refresher and close the channel; idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self._client.timeout_seconds + 1)
        self._client.close()
