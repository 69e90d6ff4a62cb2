"""Kubelet PodResources v1 client over its unix socket, refreshed on its own period with caching.

``List`` says which device IDs each container holds; ``GetAllocatableResources`` what the node
advertises (time-slicing replicas).  The kubelet is asked once per refresh period by a background
thread, never per scrape or per sampling cycle (dcgm-exporter's per-scrape calls burnt cores on
MIG nodes).  Replies over gRPC's default 4 MiB are accepted.

The calls go through :mod:`exporter.attribution.grpc_unary` (``h2``) rather than ``grpcio``;
that module says why.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from exporter.attribution import stages
from exporter.attribution.grpc_unary import RpcError, StatusCode, UnaryConnection
from exporter.attribution.merge import KubeletView
from exporter.attribution.podresources_wire import allocatable_reply, list_reply
from exporter.model import ContainerDevices, StageResult

log = logging.getLogger(__name__)

STAGE = stages.PODRESOURCES
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""Largest reply accepted: 1,000 pods with SR-IOV NICs and CPU lists exceed gRPC's 4 MiB default."""
LIST = "/v1.PodResourcesLister/List"
ALLOCATABLE = "/v1.PodResourcesLister/GetAllocatableResources"
EMPTY_REQUEST = b""
"""Both requests are empty messages, whose protobuf encoding is no bytes."""


class PodResourcesClient:
    """Blocking v1 client.  Each refresh dials the socket afresh (one connection for both calls),
    so a recreated socket (kubelet restart) is used at once, with no reconnect backoff."""

    def __init__(self, socket_path: str, timeout_seconds: float = 5.0) -> None:
        self.socket_path = socket_path
        self.timeout_seconds = timeout_seconds

    def connect(self) -> UnaryConnection:
        """A connection for one refresh; each call on it is bounded by ``timeout_seconds``."""
        return UnaryConnection(os.path.abspath(self.socket_path), self.timeout_seconds, MAX_MESSAGE_BYTES)

    def list(self, conn: UnaryConnection | None = None) -> tuple[ContainerDevices, ...]:
        """Every container's devices, one entry per (container, resource); raises ``RpcError``
        or ``WireError``."""
        if conn is None:
            with self.connect() as own:
                return list_reply(own.call(LIST, EMPTY_REQUEST))
        return list_reply(conn.call(LIST, EMPTY_REQUEST))

    def allocatable(self, conn: UnaryConnection | None = None) -> tuple[str, ...] | None:
        """Device IDs the node can allocate, all resources; ``None`` on kubelets without the call
        (UNIMPLEMENTED before Kubernetes 1.23 or with the feature gate off)."""
        try:
            if conn is None:
                with self.connect() as own:
                    payload = own.call(ALLOCATABLE, EMPTY_REQUEST)
            else:
                payload = conn.call(ALLOCATABLE, EMPTY_REQUEST)
        except RpcError as exc:
            if exc.code == StatusCode.UNIMPLEMENTED:
                return None
            raise
        return allocatable_reply(payload)

    def close(self) -> None:
        """Nothing stays open between refreshes; kept so owners can close uniformly."""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RpcError):
        return str(exc)
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
            with self._client.connect() as conn:
                devices = self._client.list(conn)
                allocatable = self._client.allocatable(conn)
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
