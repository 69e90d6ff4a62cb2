"""Kubelet PodResources v1 client over its unix socket, refreshed on its own period with caching.

``List`` says which device IDs each container holds through device plugins, and which devices
it holds through DRA ResourceClaims (``dynamic_resources``: claim, driver, pool, device, CDI
names); ``GetAllocatableResources`` what the node advertises through device plugins
(time-slicing replicas).  That reply carries no DRA devices: upstream's
``AllocatableResourcesResponse`` has only ``devices``, ``cpu_ids`` and ``memory`` (kubelet
``pkg/apis/podresources/v1/api.proto`` as of Kubernetes 1.35 and master, mid 2026), so the
allocatable view of DRA devices is this node's ResourceSlices, read by their own source
(``resourceslices.py``, whose snapshot is ``slices.py``).  The kubelet is asked once per refresh period by a background
thread, never per scrape or per sampling cycle (dcgm-exporter's per-scrape calls burnt cores on
MIG nodes); the first time as soon as the thread starts, so building the source never waits for
the kubelet (the exporter binds its port and serves meanwhile, the stage reading 0).  Replies
over gRPC's default 4 MiB are accepted, up to ``MAX_MESSAGE_BYTES``; one refresh, both calls and
their decoding, is bounded by one deadline.

The calls go through :mod:`exporter.attribution.grpc_unary` (``h2``) rather than ``grpcio``;
that module says why.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from exporter.attribution import stages
from exporter.attribution.grpc_unary import ControlFloodError, RpcError, StatusCode, UnaryConnection
from exporter.attribution.merge import KubeletView
from exporter.attribution.podresources_wire import DecodeDeadlineError, Listed, allocatable_reply, list_reply
from exporter.model import StageResult

log = logging.getLogger(__name__)

STAGE = stages.PODRESOURCES
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
"""Largest reply message accepted, bytes; a reply whose length prefix says more is refused
before any of it is kept (``RESOURCE_EXHAUSTED``), so a refresh holds at most this much.

gRPC's default of 4 MiB is too small: 1,000 pods whose containers hold SR-IOV virtual functions
and CPU lists make a 5 MiB ``List`` (``tests/test_attribution_podresources.py``), and a node's
``List`` names every pod on it, GPU or not.  The Kubernetes project gives its own PodResources
clients 16 MiB (``defaultPodResourcesMaxSize`` in the node e2e tests), but decoding that much is
what the chart's 128 Mi limit cannot hold: 16 MiB of small GPU pods (164,000 of them) took the
exporter's RSS past it in ``bench/hostile.py``'s ``kubelet-big`` (MB before and after:
docs/benchmarks.md, "Figures moved out of docstrings").  8 MiB still holds 1.6x
that 1,000-pod node and 16x a node at the default 110-pod limit with the same heavy pods, and
its decoding peaks near half of that; the refresh's deadline bounds the time."""
BACKOFF_MAX_PERIODS = 16
"""Longest wait after refreshes that failed in a row once the kubelet had sent something, in
refresh periods (160 s at the default 10 s): a reply that takes the whole 5 s deadline to fail
then costs at most 5 s in 160 s, 3 % of a core, instead of half of one."""
FLOOD_KIND, FLOOD_REASON = "kubelet_connection", "control_frame_flood"
"""Labels of a kubelet connection closed for a flood (``gpulens_attribution_items_dropped_total``)."""
LIST = "/v1.PodResourcesLister/List"
ALLOCATABLE = "/v1.PodResourcesLister/GetAllocatableResources"
EMPTY_REQUEST = b""
"""Both requests are empty messages, whose protobuf encoding is no bytes."""


def _decode_deadline(method: str, payload: memoryview, exc: DecodeDeadlineError) -> RpcError:
    """The error of a reply whose decoding ran past the call's deadline."""
    return RpcError(
        StatusCode.DEADLINE_EXCEEDED,
        f"decoding the {method.rsplit('/', 1)[-1]} reply ({len(payload)} bytes) ran past the deadline "
        f"after {exc.items} entries",
    )


class PodResourcesClient:
    """Blocking v1 client.  Each refresh dials the socket afresh (one connection for both calls),
    so a recreated socket (kubelet restart) is used at once, with no reconnect backoff.

    A call and the decoding of its reply share one deadline (``time.monotonic()`` seconds): the
    caller's, else ``timeout_seconds`` from the call's start.  ``max_reply_bytes`` caps a reply.
    """

    def __init__(
        self, socket_path: str, timeout_seconds: float = 5.0, max_reply_bytes: int = MAX_MESSAGE_BYTES
    ) -> None:
        self.socket_path = socket_path
        self.timeout_seconds = timeout_seconds
        self.max_reply_bytes = max_reply_bytes

    def connect(self) -> UnaryConnection:
        """A connection for one refresh; each call on it is bounded by ``timeout_seconds``."""
        return UnaryConnection(os.path.abspath(self.socket_path), self.timeout_seconds, self.max_reply_bytes)

    def list(
        self, conn: UnaryConnection | None = None, deadline: float | None = None, max_pods: int | None = None
    ) -> Listed:
        """Every container's devices: device plugin entries, one per (container, resource), and
        claimed devices, one per (container, claim, device), of at most ``max_pods`` pods
        (``podresources_wire.list_reply``); raises ``RpcError`` (``DEADLINE_EXCEEDED`` also when
        decoding passes the deadline) or ``WireError``."""
        if conn is None:
            with self.connect() as own:
                return self.list(own, deadline, max_pods)
        if deadline is None:
            deadline = time.monotonic() + self.timeout_seconds
        payload = conn.call(LIST, EMPTY_REQUEST, deadline)
        try:
            return list_reply(payload, deadline, max_pods)
        except DecodeDeadlineError as exc:
            raise _decode_deadline(LIST, payload, exc) from None

    def allocatable(self, conn: UnaryConnection | None = None, deadline: float | None = None) -> tuple[str, ...] | None:
        """Device IDs the node can allocate, all device plugin resources (no DRA devices: see the
        module docstring); ``None`` on kubelets without the call
        (UNIMPLEMENTED before Kubernetes 1.23 or with the feature gate off)."""
        if conn is None:
            with self.connect() as own:
                return self.allocatable(own, deadline)
        if deadline is None:
            deadline = time.monotonic() + self.timeout_seconds
        try:
            payload = conn.call(ALLOCATABLE, EMPTY_REQUEST, deadline)
        except RpcError as exc:
            if exc.code == StatusCode.UNIMPLEMENTED:
                return None
            raise
        try:
            return allocatable_reply(payload, deadline)
        except DecodeDeadlineError as exc:
            raise _decode_deadline(ALLOCATABLE, payload, exc) from None

    def close(self) -> None:
        """Nothing stays open between refreshes; kept so owners can close uniformly."""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RpcError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class PodResourcesSource:
    """Keeps the newest ``KubeletView``; a background thread refreshes it every ``refresh_seconds``,
    the first time as soon as it starts.

    Until the first refresh succeeds, ``latest()`` has no view and a failed stage: nothing is
    said about allocations (their series are absent), rather than every GPU looking free.  After
    a failed refresh the last good view is still served (stage marked failed) until it is
    ``stale_after_seconds`` old, then dropped: a short kubelet restart does not blank the
    allocation series, a dead kubelet does not leave them up for ever.  One refresh (both calls
    and their decoding) is bounded by ``timeout_seconds``, at most the refresh period.

    A refresh that failed after the kubelet sent something (a reply too slow to receive or
    decode, one over a bound, an HTTP/2 flood) backs off: the next one waits ``refresh_seconds``
    times 2, 4, 8... up to ``BACKOFF_MAX_PERIODS`` periods, so a reply that cannot be decoded in
    time costs at most one deadline in that many periods, not one in every period.  A kubelet
    that cannot be reached (restarting: the socket is gone or refuses) costs nothing and is asked
    again after one period.  At most ``max_pods`` pods holding a device are taken from a reply
    (``podresources_wire``); past that the view says how many were left out
    (``KubeletView.dropped_pods``), logged once when it starts with the true count.
    """

    def __init__(
        self,
        socket_path: str,
        refresh_seconds: float = 10.0,
        timeout_seconds: float = 5.0,
        stale_after_seconds: float | None = None,
        start: bool = True,
        max_pods: int | None = None,
    ) -> None:
        self.refresh_seconds = max(1.0, refresh_seconds)
        self.stale_after_seconds = stale_after_seconds if stale_after_seconds is not None else 3 * self.refresh_seconds
        self.max_pods = max_pods
        self._client = PodResourcesClient(socket_path, min(timeout_seconds, self.refresh_seconds))
        self._lock = threading.Lock()
        self._view: KubeletView | None = None
        self._ok = False
        self._duration = 0.0
        self._last_success: float | None = None
        self._last_error: str | None = None
        self._floods = 0
        """Connections closed for a flood of HTTP/2 frames carrying no reply (``grpc_unary``)."""
        self._costly_failures = 0
        """Refreshes in a row that failed after the kubelet sent something (the backoff's exponent)."""
        self.refreshes = 0
        self._first_done = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._run, name="gpulens-podresources", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        self.refresh()  # at once: the constructor does not wait for the kubelet
        while not self._stop.wait(self.next_wait()):
            self.refresh()

    def next_wait(self) -> float:
        """Seconds until the next refresh: the period, times ``2**n`` after ``n`` costly failures
        in a row, at most ``BACKOFF_MAX_PERIODS`` periods."""
        with self._lock:
            failures = self._costly_failures
        return self.refresh_seconds * min(BACKOFF_MAX_PERIODS, 2 ** min(failures, 16))

    def dropped(self) -> dict[tuple[str, str], int]:
        """(kind, reason) -> what this source left out, cumulative: kubelet connections closed for
        a flood of HTTP/2 control frames (``gpulens_attribution_items_dropped_total``)."""
        with self._lock:
            return {(FLOOD_KIND, FLOOD_REASON): self._floods}

    def wait_first_refresh(self, timeout: float | None = None) -> bool:
        """Block until the first refresh ended, successful or not (tools and tests); False if it
        had not within ``timeout`` seconds."""
        return self._first_done.wait(timeout)

    @property
    def last_error(self) -> str | None:
        """Why the last refresh failed, in words; ``None`` after a success (or before any)."""
        with self._lock:
            return self._last_error

    def refresh(self) -> bool:
        """Ask the kubelet now; True on success.  Never raises."""
        try:
            return self._refresh()
        finally:
            self._first_done.set()

    def _refresh(self) -> bool:
        start = time.perf_counter()
        deadline = time.monotonic() + self._client.timeout_seconds
        conn = self._client.connect()
        try:
            with conn:
                listed = self._client.list(conn, deadline, self.max_pods)
                allocatable = self._client.allocatable(conn, deadline)
        except Exception as exc:  # any failure of this source only fails this stage
            error = _describe(exc)
            with self._lock:
                self._ok = False
                self._duration = time.perf_counter() - start
                self.refreshes += 1
                if conn.bytes_received:  # the kubelet answered something: back off
                    self._costly_failures += 1
                if isinstance(exc, ControlFloodError):
                    self._floods += 1
                changed = error != self._last_error
                self._last_error = error
            if changed:  # one line per new condition, not one per refresh
                log.warning("kubelet PodResources at %s failed: %s", self._client.socket_path, error)
            return False
        view = KubeletView(
            devices=listed.devices, allocatable=allocatable, claimed=listed.claimed, dropped_pods=listed.dropped_pods
        )
        with self._lock:
            previous = self._view
            if previous is not None and previous == view:
                view = previous  # unchanged: keep the object so the merge cache stays valid
            self._view = view
            self._ok = True
            self._duration = time.perf_counter() - start
            self._last_success = time.time()
            self.refreshes += 1
            self._costly_failures = 0
            recovered = self._last_error is not None
            self._last_error = None
        if recovered:
            log.info("kubelet PodResources at %s answers again", self._client.socket_path)
        self._log_ceiling(previous.dropped_pods if previous is not None else 0, listed)
        return True

    def _log_ceiling(self, before: int, listed: Listed) -> None:
        """One line when the pod ceiling starts to leave pods out (with their true count), one
        when it stops; nothing for the refreshes between."""
        if listed.dropped_pods and not before:
            log.warning(
                "kubelet PodResources lists %d pods holding devices, more than --kubernetes.max-pods=%d: "
                "keeping %d (pods holding a GPU first, then by namespace and name); the other %d are "
                'counted in gpulens_attribution_items_dropped_total{kind="pod"} at every refresh',
                self.max_pods + listed.dropped_pods if self.max_pods is not None else listed.dropped_pods,
                self.max_pods or 0,
                self.max_pods or 0,
                listed.dropped_pods,
            )
        elif before and not listed.dropped_pods:
            log.info("kubelet PodResources lists no more pods than --kubernetes.max-pods=%s", self.max_pods)

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
