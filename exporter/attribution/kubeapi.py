"""Pod metadata of this node from the Kubernetes API: a node-scoped list + watch in a thread.

Gives pod UID, phase, owner workload and container IDs for the pods on ``spec.nodeName``.
Requests go through ``kube_http`` (the standard library: in-cluster or kubeconfig configuration,
auth, TLS, GET) and the list and the watch stream are read as raw JSON: the official client
costs ~40 MB of imports, and 1,000 ``V1Pod`` models far more than the dicts we need (see
docs/design.md).  Least privilege: ``pods`` list + watch; optionally ``jobs`` get (``batch``) to
name the CronJob behind a Job (see docs/attribution.md).  Deployments are named from the
ReplicaSet name and the pod's ``pod-template-hash`` label, with no extra permission.

The API server is trusted, but what it sends is bounded all the same (``ApiBounds``): a watch
event line is read with a byte cap and a time bound (a line that stays unfinished fails the stage
while it lasts), and the list is read in pages (``limit`` + ``continue``), each page with a byte
cap checked on its Content-Length first, in a bounded number of pages.  Passing a bound fails the
stage like any other API error: the source backs off and lists again.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from exporter.attribution import stages
from exporter.attribution.kube_http import ApiError, ApiResponse, KubeClient, Query, load_endpoint
from exporter.attribution.merge import PodDirectory, PodMeta
from exporter.model import StageResult

log = logging.getLogger(__name__)

STAGE = stages.KUBE_API
_HTTP_GONE = 410
_HTTP_FORBIDDEN = 403
_READ_BYTES = 64 * 1024
"""Most bytes taken from the connection per read (a read returns whatever has arrived)."""
PODS_PATH = "/api/v1/pods"
JOB_PATH = "/apis/batch/v1/namespaces/{namespace}/jobs/{name}"

MAX_EVENT_BYTES = 4 * 1024 * 1024
"""Longest watch event line accepted, bytes.  An event is one object as the API server stores it
plus a few dozen bytes of envelope, and the API server stores an object only if it fits etcd's
request limit (``--max-request-bytes``, 1.5 MiB by default; managed etcd services keep it there):
a pod event of more than about 1.5 MiB cannot come from a real API server.  4 MiB leaves room
for JSON re-encoding (escapes) and a raised etcd limit."""
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
are what the list costs in memory at once."""
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


class BoundExceeded(Exception):
    """The API server sent more than a bound of ``ApiBounds`` allows (bytes, seconds, pages)."""


@dataclass(frozen=True)
class ApiBounds:
    """How much the source takes from the API server; the defaults are argued where defined."""

    max_event_bytes: int = MAX_EVENT_BYTES
    line_stall_seconds: float = LINE_STALL_SECONDS
    page_limit: int = LIST_PAGE_LIMIT
    max_page_bytes: int = MAX_LIST_PAGE_BYTES
    max_pages: int = MAX_LIST_PAGES
    page_seconds: float = LIST_PAGE_SECONDS


def _container_id(raw: str | None) -> str | None:
    """``containerd://<id>`` / ``cri-o://<id>`` / ``docker://<id>`` -> ``<id>``."""
    if not raw:
        return None
    return raw.split("://", 1)[-1] or None


def owner_of(
    pod: Mapping[str, Any], job_owner: Callable[[str, str], str | None] | None = None
) -> tuple[str | None, str | None]:
    """(workload_kind, workload) of a pod from its controller reference.

    ReplicaSet -> Deployment when the ReplicaSet is ``<deployment>-<pod-template-hash>`` (how the
    Deployment controller names them).  Job -> CronJob through ``job_owner`` (an API GET), if given.
    """
    meta = pod.get("metadata") or {}
    refs = meta.get("ownerReferences") or []
    ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    if not ref:
        return None, None
    kind, name = ref.get("kind"), ref.get("name")
    if kind == "ReplicaSet" and name:
        template_hash = (meta.get("labels") or {}).get("pod-template-hash")
        if template_hash and name.endswith("-" + template_hash):
            return "Deployment", name[: -len(template_hash) - 1]
    if kind == "Job" and name and job_owner is not None:
        cronjob = job_owner(meta.get("namespace", ""), name)
        if cronjob:
            return "CronJob", cronjob
    return kind, name


def pod_meta(pod: Mapping[str, Any], job_owner: Callable[[str, str], str | None] | None = None) -> PodMeta | None:
    """The fields we keep from one raw pod object; ``None`` if it has no UID."""
    meta = pod.get("metadata") or {}
    uid = meta.get("uid")
    if not uid:
        return None
    status = pod.get("status") or {}
    containers: dict[str, str] = {}
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key) or []:
            cid = _container_id(cs.get("containerID"))
            if cid and cs.get("name"):
                containers[cid] = cs["name"]
    kind, workload = owner_of(pod, job_owner)
    return PodMeta(
        uid=uid,
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        phase=status.get("phase"),
        workload_kind=kind,
        workload=workload,
        containers=MappingProxyType(containers),
    )


def _read_some(resp: Any, most: int) -> bytes:
    """Up to ``most`` bytes of the body, as soon as any arrived (``b""`` at its end).  A response
    without ``read1`` is read with ``read``: there a read waits for ``most`` bytes, so bytes are
    seen (and a stall noticed) only that many at a time; the caps hold alike."""
    read1 = getattr(resp, "read1", None)
    data = read1(most) if read1 is not None else resp.read(most)
    return bytes(data or b"")


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
        while chunk := _read_some(self._resp, _READ_BYTES):
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


def read_capped(resp: Any, cap: int, seconds: float, what: str) -> bytearray:
    """The whole body of ``resp``, or ``BoundExceeded`` as soon as it is known to pass ``cap``
    bytes (from its Content-Length, before reading, when it has one) or ``seconds``."""
    length = str(resp.headers.get("Content-Length") or "")
    if length.isdigit() and int(length) > cap:
        raise BoundExceeded(f"{what} of {int(length)} bytes (Content-Length) exceeds the cap of {cap} bytes")
    deadline = time.monotonic() + seconds
    body = bytearray()
    while chunk := _read_some(resp, _READ_BYTES):
        body += chunk
        if len(body) > cap:
            raise BoundExceeded(f"{what} exceeds the cap of {cap} bytes ({len(body)} bytes read without its end)")
        if time.monotonic() > deadline:
            raise BoundExceeded(f"{what} unfinished after {seconds:g} s ({len(body)} bytes read)")
    return body


class KubePodSource:
    """Keeps this node's pods up to date from a list + watch loop in a daemon thread.

    On any error the source reports failure (its data is withheld: ``latest()`` gives ``None``),
    waits with exponential backoff and jitter, and lists again; a watch that ends normally or
    expires (410 Gone) is resumed or re-listed without counting as a failure.
    """

    def __init__(
        self,
        api_client_factory: Callable[[], KubeClient],
        node_name: str,
        watch_timeout_seconds: int = 300,
        backoff_initial_seconds: float = 1.0,
        backoff_max_seconds: float = 60.0,
        resolve_cronjobs: bool = True,
        start: bool = True,
        bounds: ApiBounds | None = None,
    ) -> None:
        self._factory = api_client_factory
        self.node_name = node_name
        self.bounds = bounds or ApiBounds()
        self.watch_timeout_seconds = watch_timeout_seconds
        self.backoff_initial_seconds = backoff_initial_seconds
        self.backoff_max_seconds = backoff_max_seconds
        self._resolve_cronjobs = resolve_cronjobs
        self._lock = threading.Lock()
        self._pods: dict[str, PodMeta] = {}
        self._version = 0
        self._directory: tuple[int, PodDirectory] | None = None
        self._healthy = False
        self._duration = 0.0
        self._last_error: str | None = None
        self._job_owners: dict[tuple[str, str], str | None] = {}
        self._resp: ApiResponse | None = None
        self._reader: LineReader | None = None
        self._watch_progress = False
        """Whether a watch delivered an event since the last failure: only then does the backoff
        start over, so a server whose watches fail at once (an endless or trickled line) is
        asked with the backoff growing, as a failing list is."""
        self._stop = threading.Event()
        self.lists = 0
        self.resource_version: str | None = None
        """The last resource version seen (list, event or bookmark): where a watch resumes."""
        self.watches = 0
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._run, name="gpulens-kube-api", daemon=True)
            self._thread.start()

    @classmethod
    def in_cluster(cls, node_name: str) -> KubePodSource:
        """Service-account credentials in a pod, else the local kubeconfig (for development); the
        configuration is read again after each failure (a configuration error fails the stage)."""
        return cls(lambda: KubeClient(load_endpoint()), node_name)

    # --- the loop --------------------------------------------------------------------------

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
            hint = " (RBAC: the service account needs pods list+watch)" if "403" in error else ""
            log.warning("Kubernetes API pod watch failed: %s%s", error[:300], hint)

    def list_pod_for_all_namespaces(self, api: KubeClient, query: Query, read_timeout: float = 30) -> ApiResponse:
        """GET the node's pods with ``query`` (a list page, or a watch with ``watch``), the body
        unread.  Named after the API operation it calls, which is what the RBAC role must allow
        (pods ``list`` and ``watch``; tests/test_deploy_chart.py checks the requests sent against the role)."""
        selector = {"fieldSelector": f"spec.nodeName={self.node_name}"}
        return api.get(PODS_PATH, {**selector, **query}, read_timeout=read_timeout)

    def read_namespaced_job(self, api: KubeClient, namespace: str, name: str) -> ApiResponse:
        """GET one Job, the body unread (RBAC: jobs ``get`` in ``batch``, optional)."""
        path = JOB_PATH.format(namespace=urllib.parse.quote(namespace, safe=""), name=urllib.parse.quote(name, safe=""))
        return api.get(path, connect_timeout=5, read_timeout=10)

    def _list_page(self, api: KubeClient, token: str | None) -> dict[str, Any]:
        """One page of the node's pods (the first when ``token`` is ``None``), read within the
        page bounds."""
        resp = self.list_pod_for_all_namespaces(api, {"limit": self.bounds.page_limit, "continue": token})
        whole = False
        try:
            body = read_capped(resp, self.bounds.max_page_bytes, self.bounds.page_seconds, "pod list page")
            whole = True
        finally:
            resp.release(whole)
        page = json.loads(body)
        if not isinstance(page, dict):
            raise ApiError(resp.status, "the pod list is not a JSON object")
        return page

    def _list(self, api: KubeClient) -> str:
        """List the node's pods page by page; the table is replaced once every page arrived."""
        start = time.perf_counter()
        pods: dict[str, PodMeta] = {}
        token: str | None = None
        version = ""
        for number in range(self.bounds.max_pages):
            page = self._list_page(api, token)
            for item in page.get("items") or []:
                meta = pod_meta(item, self._job_owner_getter(api))
                if meta is not None:
                    pods[meta.uid] = meta
            metadata = page.get("metadata") or {}
            if number == 0:
                version = str(metadata.get("resourceVersion") or "")  # every page of a list has it
            token = metadata.get("continue") or None
            if token is None:
                break
        else:
            raise BoundExceeded(f"the pod list runs past {self.bounds.max_pages} pages of {self.bounds.page_limit}")
        with self._lock:
            self._pods = pods
            self._version += 1
            self._healthy = True
            self._duration = time.perf_counter() - start
            recovered = self._last_error is not None
            self._last_error = None
            self.lists += 1
        if recovered:
            log.info("Kubernetes API pod watch recovered (%d pods on %s)", len(pods), self.node_name)
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
            resp = self.list_pod_for_all_namespaces(api, query, read_timeout=self.watch_timeout_seconds + 30)
        except ApiError as exc:
            if exc.status == _HTTP_GONE:
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
                if obj.get("code") == _HTTP_GONE:
                    return None
                raise ApiError(int(obj.get("code") or 0), str(obj.get("message")))
            new_rv = (obj.get("metadata") or {}).get("resourceVersion")
            if new_rv:
                rv = self.resource_version = new_rv
            if kind in ("ADDED", "MODIFIED"):
                meta = pod_meta(obj, self._job_owner_getter(api))
                if meta is not None:
                    with self._lock:
                        self._pods[meta.uid] = meta
                        self._version += 1
            elif kind == "DELETED":
                uid = str((obj.get("metadata") or {}).get("uid"))
                with self._lock:
                    if self._pods.pop(uid, None) is not None:
                        self._version += 1
            if self._stop.is_set():
                break
        return rv

    def list_now(self) -> int:
        """One full list on the calling thread, replacing the pod table (benchmarks, tools);
        returns the number of pods.  Raises on failure."""
        api = self._factory()
        try:
            self._list(api)
        finally:
            api.close()
        with self._lock:
            return len(self._pods)

    # --- Job -> CronJob ------------------------------------------------------------------------

    def _job_owner_getter(self, api: KubeClient) -> Callable[[str, str], str | None] | None:
        if not self._resolve_cronjobs:
            return None
        return lambda namespace, job: self._job_owner(api, namespace, job)

    def _job_owner(self, api: KubeClient, namespace: str, job: str) -> str | None:
        key = (namespace, job)
        if key in self._job_owners:
            return self._job_owners[key]
        owner: str | None = None
        try:
            resp = self.read_namespaced_job(api, namespace, job)
            whole = False
            try:
                raw = read_capped(resp, self.bounds.max_event_bytes, self.bounds.page_seconds, "job")
                whole = True
            finally:
                resp.release(whole)
            body = json.loads(raw)
            refs = (body.get("metadata") or {}).get("ownerReferences") or []
            owner = next((r.get("name") for r in refs if r.get("kind") == "CronJob"), None)
        except ApiError as exc:  # the Job is gone (404) or other: remembered as no CronJob
            if exc.status == _HTTP_FORBIDDEN:
                log.info("no RBAC to get jobs: Job pods are shown as workload_kind=Job, not their CronJob")
                self._resolve_cronjobs = False
                return None
        except Exception as exc:  # metadata extra only: never fail the watch for it
            log.debug("job %s/%s owner lookup failed: %s", namespace, job, exc)
            return None
        if len(self._job_owners) >= 4096:
            self._job_owners.clear()
        self._job_owners[key] = owner
        return owner

    # --- what the pipeline reads ---------------------------------------------------------------

    def latest(self) -> tuple[PodDirectory | None, StageResult]:
        """This node's pods (``None`` while the API is failing) and the source's health; failing
        also while a watch event line has been arriving for longer than its bound."""
        reader = self._reader
        stalled = reader is not None and reader.stalled(time.monotonic())
        with self._lock:
            healthy, duration = self._healthy and not stalled, self._duration
            if not healthy:
                return None, StageResult(STAGE, False, duration)
            if self._directory is None or self._directory[0] != self._version:
                self._directory = (self._version, PodDirectory.of(self._pods.values()))
            return self._directory[1], StageResult(STAGE, True, duration)

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
