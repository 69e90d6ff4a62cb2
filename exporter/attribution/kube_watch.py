"""A node-scoped list + watch of one Kubernetes resource, kept up to date in a daemon thread.

The machinery the pod source (``kubeapi.KubePodSource``) and the ResourceSlice source
(``resourceslices.ResourceSliceSource``) share: list the objects of this node (``fieldSelector
spec.nodeName=<node>``) page by page, then watch from the list's resource version, applying each
ADDED / MODIFIED / DELETED event; resume a watch that ends from the last version seen (events and
bookmarks move it), list again when the version expired (410 Gone), and on any other failure
withhold the data (``latest()`` gives ``None``), back off with jitter and list again.  What is
kept of each object, and what ``latest()`` hands out, is the subclass's (``NodeWatch``'s hooks).

The API server is trusted, but what it sends is bounded all the same (``ApiBounds``): a watch
event line is read with a byte cap and a time bound (``LineReader``; a line that stays unfinished
fails the stage while it lasts), and the list is read in pages (``limit`` + ``continue``), each
page with a byte cap checked on its Content-Length first, in a bounded number of pages.  Passing
a bound fails the stage like any other API error: the source backs off and lists again.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from exporter.attribution.kube_http import (
    READ_BYTES,
    ApiError,
    ApiResponse,
    BoundExceeded,
    KubeClient,
    Query,
    read_capped,
    read_some,
)
from exporter.model import StageResult

HTTP_GONE = 410
"""The status (and watch ERROR code) of a resource version the API server no longer holds."""

MAX_EVENT_BYTES = 4 * 1024 * 1024
"""Longest watch event line accepted, bytes.  An event is one object as the API server stores it
plus a few dozen bytes of envelope, and the API server stores an object only if it fits etcd's
request limit (``--max-request-bytes``, 1.5 MiB by default; managed etcd services keep it there):
an event (a pod, a ResourceSlice) of more than about 1.5 MiB cannot come from a real API server.
4 MiB leaves room for JSON re-encoding (escapes) and a raised etcd limit."""
LINE_STALL_SECONDS = 10.0
"""Longest a watch event line may take from its first byte to its newline, seconds.  The API
server writes and flushes each event whole: the largest possible one (1.5 MiB) takes about 10 ms
at 1 Gbit/s and 1.2 s at 10 Mbit/s; a line still unfinished after 10 s means a peer trickling
bytes (or a connection retransmitting for 10 s, as good as dead).  The stage reads failed from
then on, and the watch is dropped when the next byte comes.  10 s is also the kubelet refresh
period: no attribution input is older than that unnoticed."""
LIST_PAGE_LIMIT = 100
"""Pods asked per list page (``limit``): a node at the Kubernetes default of 110 pods lists in
two pages; each page is decoded on its own, so a page's JSON objects (several times its bytes)
are what the list costs in memory at once.  (ResourceSlices, which hold up to 128 devices each,
ask fewer: ``resourceslices.SLICE_PAGE_LIMIT``.)"""
MAX_LIST_PAGE_BYTES = 4 * 1024 * 1024
"""Largest list page accepted, bytes: 100 pods of 40 KiB each, 2-5x a typical pod with its
``managedFields`` (8-20 KiB), and a page whose decoding stays well inside the chart's 128 Mi
(JSON objects take several times the bytes they came in).  A page announced larger
(Content-Length) is refused unread; one without a length is refused once this much arrived
without its end.  A server that ignores ``limit`` on a node of 110 such pods (about 2 MiB) still
fits."""
MAX_LIST_PAGES = 100
"""Most pages one list may take: 10,000 pods of one node, 40x the most a node runs."""
LIST_PAGE_SECONDS = 60.0
"""Longest one page may take to arrive whole, seconds (a trickled page fails like a large one)."""


@dataclass(frozen=True)
class ApiBounds:
    """How much a source takes from the API server; the defaults are argued where defined."""

    max_event_bytes: int = MAX_EVENT_BYTES
    line_stall_seconds: float = LINE_STALL_SECONDS
    page_limit: int = LIST_PAGE_LIMIT
    max_page_bytes: int = MAX_LIST_PAGE_BYTES
    max_pages: int = MAX_LIST_PAGES
    page_seconds: float = LIST_PAGE_SECONDS


class LineReader:
    """Event lines of a watch response, read as bytes arrive, each at most ``max_line_bytes``.

    Buffering is linear: new bytes are appended to one ``bytearray`` and only they are scanned
    for newlines.  ``line_started`` is when the first byte of the line now arriving came
    (``time.monotonic()``), ``None`` between lines; ``stalled()`` says whether that line has been
    arriving for longer than ``stall_seconds``.  Raises ``BoundExceeded`` once a line passes
    either bound.
    """

    def __init__(self, resp: Any, max_line_bytes: int, stall_seconds: float) -> None:
        self._resp = resp
        self.max_line_bytes = max_line_bytes
        self.stall_seconds = stall_seconds
        self.line_started: float | None = None
        self.ended = False
        """Whether the response was read to its end."""

    def stalled(self, now: float) -> bool:
        """Whether a line has been arriving for longer than the bound at ``now``."""
        started = self.line_started
        return started is not None and now - started > self.stall_seconds

    def lines(self) -> Iterator[bytes]:
        """Each non-blank line, without its newline; a last line without one at the end too."""
        buf = bytearray()
        while chunk := read_some(self._resp, READ_BYTES):
            now = time.monotonic()
            scanned = len(buf)
            buf += chunk
            start = 0
            while (newline := buf.find(b"\n", scanned)) >= 0:
                line = bytes(buf[start:newline])
                start = scanned = newline + 1
                if line.strip():
                    yield line
            if start:
                del buf[:start]
                self.line_started = now if buf else None
            elif self.line_started is None:
                self.line_started = now
            self._check(len(buf), now)
        self.line_started = None
        self.ended = True
        if buf.strip():
            yield bytes(buf)

    def _check(self, pending: int, now: float) -> None:
        if pending > self.max_line_bytes:
            raise BoundExceeded(
                f"watch event line longer than the cap of {self.max_line_bytes} bytes ({pending} bytes without its end)"
            )
        if self.stalled(now):
            raise BoundExceeded(f"watch event line unfinished after {self.stall_seconds:g} s ({pending} bytes so far)")


View = TypeVar("View")
"""What ``latest()`` hands out: an immutable snapshot of the table (a ``PodDirectory``...)."""
Batch = TypeVar("Batch")
"""What a list collects before it replaces the table at once."""


class NodeWatch(ABC, Generic[View, Batch]):
    """One resource's objects on this node, kept up to date by a list + watch loop in a thread.

    On any error the source reports failure (its data is withheld: ``latest()`` gives ``None``),
    waits with exponential backoff and jitter, and lists again; a watch that ends normally or
    expires (410 Gone) is resumed or re-listed without counting as a failure.

    A subclass names its resource (the class attributes), sends the request (``_request``, which
    calls the method named after the API operation, the name RBAC is checked against), and keeps
    its table: a list collects every page into a fresh ``Batch`` (``_new_batch``,
    ``_add_to_batch``) that ``_install`` then puts in place; events change the table
    (``_apply``); ``_view`` makes the snapshot ``latest()`` hands out, made again only after
    ``_version`` moved (a subclass adds 1, under ``_lock``, whenever its table changed).  The
    table belongs to the watch thread; ``_lock`` guards what ``latest()`` reads of it.
    """

    noun: ClassVar[str]
    """The resource in messages: "pod" ("the pod list", "Kubernetes API pod watch failed")."""
    stage: ClassVar[str]
    """The stage whose health ``latest()`` reports (``stages``)."""
    thread_name: ClassVar[str]
    rbac_hint: ClassVar[str]
    """Said after a 403: the grants the service account needs."""
    log: ClassVar[logging.Logger]
    """Where failures and recoveries are told (the subclass's module logger)."""

    def __init__(
        self,
        api_client_factory: Callable[[], KubeClient],
        node_name: str,
        watch_timeout_seconds: int = 300,
        backoff_initial_seconds: float = 1.0,
        backoff_max_seconds: float = 60.0,
        bounds: ApiBounds | None = None,
    ) -> None:
        self._factory = api_client_factory
        self.node_name = node_name
        self.bounds = bounds or ApiBounds()
        self.watch_timeout_seconds = watch_timeout_seconds
        """How long one watch request lasts before the server ends it (``timeoutSeconds``), s."""
        self.backoff_initial_seconds = backoff_initial_seconds
        self.backoff_max_seconds = backoff_max_seconds
        self._lock = threading.Lock()
        self._version = 0
        """Moves whenever the table changed: ``latest()`` makes its view again."""
        self._view_made: tuple[int, View] | None = None
        self._healthy = False
        self._duration = 0.0
        """Seconds the last complete list took (the stage's duration)."""
        self._last_error: str | None = None
        self._resp: ApiResponse | None = None
        self._reader: LineReader | None = None
        self._watch_progress = False
        """Whether a watch delivered an event since the last failure: only then does the backoff
        start over, so a server whose watches fail at once (an endless or trickled line) is
        asked with the backoff growing, as a failing list is."""
        self._stop = threading.Event()
        self.lists = 0
        """Lists completed."""
        self.resource_version: str | None = None
        """The last resource version seen (list, event or bookmark): where a watch resumes."""
        self.watches = 0
        """Watch requests answered."""
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the list + watch thread (a subclass calls it once its own state is set)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()

    # --- what a subclass provides --------------------------------------------------------------

    @abstractmethod
    def _request(self, api: KubeClient, query: Query, read_timeout: float) -> ApiResponse:
        """GET this node's objects with ``query`` (a list page, or a watch), the body unread."""

    @abstractmethod
    def _new_batch(self) -> Batch:
        """An empty table for a list to fill."""

    @abstractmethod
    def _add_to_batch(self, api: KubeClient, batch: Batch, item: Mapping[str, Any]) -> None:
        """Keep what is needed of one listed object (may raise ``BoundExceeded``)."""

    @abstractmethod
    def _install(self, batch: Batch) -> bool:
        """Replace the table with a complete list's (called with ``_lock`` held); whether the
        table changed (else ``latest()`` goes on handing out the same view)."""

    @abstractmethod
    def _apply(self, api: KubeClient, kind: str, obj: Mapping[str, Any]) -> None:
        """Apply one ADDED, MODIFIED or DELETED event to the table (may raise ``BoundExceeded``)."""

    @abstractmethod
    def _view(self) -> View:
        """An immutable snapshot of the table (called with ``_lock`` held)."""

    @abstractmethod
    def _summary(self) -> str:
        """How much the table holds, in words ("5 pods"; called with ``_lock`` held)."""

    @abstractmethod
    def _size(self) -> int:
        """How much the table holds, as ``list_now`` reports it (called with ``_lock`` held)."""

    def _after_event(self, api: KubeClient) -> None:
        """Called after each watch event (bookmarks too), on the watch thread; nothing here."""

    def _hint(self, error: str) -> str:
        """Words added to a failure's log line: what the service account needs, after a 403."""
        return f" ({self.rbac_hint})" if "403" in error else ""

    # --- the loop ------------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = self.backoff_initial_seconds
        api: KubeClient | None = None
        while not self._stop.is_set():
            self._watch_progress = False
            try:
                if api is None:
                    api = self._factory()
                rv: str | None = self._list(api)
                while rv is not None and not self._stop.is_set():
                    rv = self._watch(api, rv)  # None = expired (410): list again
                    backoff = self.backoff_initial_seconds
            except Exception as exc:  # this source fails alone; retry with backoff
                if self._stop.is_set():
                    break  # close() cut the stream: not an API failure
                self._fail(exc)
                if api is not None:
                    api.close()
                api = None
                if self._watch_progress:  # events flowed before this failure: start over at 1 s
                    backoff = self.backoff_initial_seconds
                delay = backoff * random.uniform(0.8, 1.2)
                backoff = min(self.backoff_max_seconds, backoff * 2)
                self._stop.wait(delay)
        if api is not None:
            api.close()

    @property
    def last_error(self) -> str | None:
        """Why the source last failed, in words; ``None`` once it recovered (or before any)."""
        with self._lock:
            return self._last_error

    def _fail(self, exc: BaseException) -> None:
        error = str(exc) if isinstance(exc, ApiError) else f"{type(exc).__name__}: {exc}"
        with self._lock:
            self._healthy = False
            changed = error != self._last_error
            self._last_error = error
        if changed:
            self.log.warning("Kubernetes API %s watch failed: %s%s", self.noun, error[:300], self._hint(error))

    def _list_page(self, api: KubeClient, token: str | None) -> dict[str, Any]:
        """One page of the node's objects (the first when ``token`` is ``None``), read within the
        page bounds."""
        resp = self._request(api, {"limit": self.bounds.page_limit, "continue": token}, 30)
        whole = False
        try:
            body = read_capped(resp, self.bounds.max_page_bytes, self.bounds.page_seconds, f"{self.noun} list page")
            whole = True
        finally:
            resp.release(whole)
        page = json.loads(body)
        if not isinstance(page, dict):
            raise ApiError(resp.status, f"the {self.noun} list is not a JSON object")
        return page

    def _list(self, api: KubeClient) -> str:
        """List the node's objects page by page; the table is replaced once every page arrived.
        Returns the list's resource version."""
        start = time.perf_counter()
        batch = self._new_batch()
        token: str | None = None
        version = ""
        for number in range(self.bounds.max_pages):
            page = self._list_page(api, token)
            for item in page.get("items") or []:
                self._add_to_batch(api, batch, item)
            metadata = page.get("metadata") or {}
            if number == 0:
                version = str(metadata.get("resourceVersion") or "")  # every page of a list has it
            token = metadata.get("continue") or None
            if token is None:
                break
        else:
            raise BoundExceeded(
                f"the {self.noun} list runs past {self.bounds.max_pages} pages of {self.bounds.page_limit}"
            )
        with self._lock:
            if self._install(batch):
                self._version += 1
            self._healthy = True
            self._duration = time.perf_counter() - start
            recovered = self._last_error is not None
            self._last_error = None
            self.lists += 1
            summary = self._summary()
        if recovered:
            self.log.info("Kubernetes API %s watch recovered (%s on %s)", self.noun, summary, self.node_name)
        self.resource_version = version
        return self.resource_version

    def _watch(self, api: KubeClient, rv: str) -> str | None:
        query: Query = {
            "watch": True,
            "resourceVersion": rv,
            "allowWatchBookmarks": True,
            "timeoutSeconds": self.watch_timeout_seconds,
        }
        try:
            resp = self._request(api, query, self.watch_timeout_seconds + 30)
        except ApiError as exc:
            if exc.status == HTTP_GONE:
                return None
            raise
        reader = LineReader(resp, self.bounds.max_event_bytes, self.bounds.line_stall_seconds)
        self._resp, self._reader = resp, reader
        self.watches += 1
        try:
            return self._follow(api, reader, rv)
        finally:
            self._resp = self._reader = None
            resp.release(reader.ended)

    def _follow(self, api: KubeClient, reader: LineReader, rv: str | None) -> str | None:
        """Apply the watch's events to the table; the resource version to resume from, ``None``
        when the watch expired (410: list again)."""
        for line in reader.lines():
            event = json.loads(line)
            self._watch_progress = True
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == HTTP_GONE:
                    return None
                raise ApiError(int(obj.get("code") or 0), str(obj.get("message")))
            new_rv = (obj.get("metadata") or {}).get("resourceVersion")
            if new_rv:
                rv = self.resource_version = new_rv
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._apply(api, kind, obj)
            if self._stop.is_set():
                break
            self._after_event(api)
        return rv

    def list_now(self) -> int:
        """One full list on the calling thread, replacing the table (benchmarks, tools); returns
        how much the table holds (``_size``).  Raises on failure."""
        api = self._factory()
        try:
            self._list(api)
        finally:
            api.close()
        with self._lock:
            return self._size()

    # --- what the pipeline reads ---------------------------------------------------------------

    def latest(self) -> tuple[View | None, StageResult]:
        """This node's objects (``None`` while the API is failing) and the source's health;
        failing also while a watch event line has been arriving for longer than its bound.  The
        same object while the table did not change, so a caller may cache on its identity."""
        reader = self._reader
        stalled = reader is not None and reader.stalled(time.monotonic())
        with self._lock:
            healthy, duration = self._healthy and not stalled, self._duration
            if not healthy:
                return None, StageResult(self.stage, False, duration)
            if self._view_made is None or self._view_made[0] != self._version:
                self._view_made = (self._version, self._view())
            return self._view_made[1], StageResult(self.stage, True, duration)

    def close(self) -> None:
        """Stop the watch thread (interrupts a blocked read); idempotent."""
        self._stop.set()
        resp = self._resp
        if resp is not None:
            # resp.close() would wait for the reader's buffer lock until the next event; shutting
            # the socket down makes the blocked read return at once.
            resp.shutdown()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
