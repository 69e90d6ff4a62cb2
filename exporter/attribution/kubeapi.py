"""Pod metadata of this node from the Kubernetes API: a node-scoped list + watch in a thread.

Gives pod UID, phase, owner workload and container IDs for the pods on ``spec.nodeName``.
Requests go through ``kube_http`` (the standard library: in-cluster or kubeconfig configuration,
auth, TLS, GET) and the list and the watch stream are read as raw JSON: the official client
costs ~40 MB of imports, and 1,000 ``V1Pod`` models far more than the dicts we need (see
docs/design.md).  Least privilege: ``pods`` list + watch; with the owner chain on
(``--kubernetes.owner-chain``, ``owners.py``) also ``get`` on the owners' resources, so that a
pod's workload is the top of its owner chain (the JobSet above a Job, the CronJob above a Job,
the LeaderWorkerSet above its StatefulSets; see docs/attribution.md).  Deployments are named from
the ReplicaSet name and the pod's ``pod-template-hash`` label, with no request.

The API server is trusted, but what it sends is bounded all the same (``ApiBounds``): a watch
event line is read with a byte cap and a time bound (a line that stays unfinished fails the stage
while it lasts), and the list is read in pages (``limit`` + ``continue``), each page with a byte
cap checked on its Content-Length first, in a bounded number of pages.  Passing a bound fails the
stage like any other API error: the source backs off and lists again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from exporter.attribution import stages
from exporter.attribution.kube_http import (
    READ_BYTES,
    ApiError,
    ApiResponse,
    BoundExceeded,
    KubeClient,
    Query,
    load_endpoint,
    read_capped,
    read_some,
)
from exporter.attribution.merge import PodDirectory, PodMeta
from exporter.attribution.owners import Owner, OwnerResolver, deployment_shortcut
from exporter.model import StageResult

log = logging.getLogger(__name__)

STAGE = stages.KUBE_API
_HTTP_GONE = 410
PODS_PATH = "/api/v1/pods"

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
SETTLE_SECONDS = 10.0
"""Shortest time between two passes over the pods whose owner walk stopped short, seconds: the
kubelet refresh period, so a label completed later is no older than other attribution data.  A
pass costs nothing while the resolver's answers for them are cached (1 min after a failure)."""


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


Resolve = Callable[[str, Mapping[str, Any]], Owner]
"""Given a namespace and an owner reference, the top owner above it (``OwnerResolver.top`` with
the client bound)."""


def controller_reference(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod's controller reference (else its first owner reference), with a ReplicaSet named
    ``<deployment>-<pod-template-hash>`` read as that Deployment (``owners.deployment_shortcut``:
    no request, no RBAC); ``None`` for a pod without owners."""
    meta = pod.get("metadata") or {}
    refs = meta.get("ownerReferences") or []
    ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    if not ref:
        return None
    return deployment_shortcut(ref, meta.get("labels") or {})


def owner_of(pod: Mapping[str, Any], resolve: Resolve | None = None) -> tuple[str | None, str | None]:
    """(workload_kind, workload) of a pod: the top of its owner chain through ``resolve`` when
    given (``--kubernetes.owner-chain``), else its own controller (a Deployment for a ReplicaSet
    named after one, without a request)."""
    ref = controller_reference(pod)
    if ref is None:
        return None, None
    if resolve is not None:
        owner = resolve((pod.get("metadata") or {}).get("namespace", ""), ref)
        return owner.kind, owner.name
    return ref.get("kind"), ref.get("name")


def pod_meta(pod: Mapping[str, Any], resolve: Resolve | None = None) -> PodMeta | None:
    """The fields we keep from one raw pod object; ``None`` if it has no UID.  The workload is
    ``owner_of(pod, resolve)``."""
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
    kind, workload = owner_of(pod, resolve)
    return PodMeta(
        uid=uid,
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        phase=status.get("phase"),
        workload_kind=kind,
        workload=workload,
        containers=MappingProxyType(containers),
    )


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
        owner_chain: bool = True,
        start: bool = True,
        bounds: ApiBounds | None = None,
        owners: OwnerResolver | None = None,
    ) -> None:
        self._factory = api_client_factory
        self.node_name = node_name
        self.bounds = bounds or ApiBounds()
        self.watch_timeout_seconds = watch_timeout_seconds
        self.backoff_initial_seconds = backoff_initial_seconds
        self.backoff_max_seconds = backoff_max_seconds
        self.owners: OwnerResolver | None = (owners or OwnerResolver()) if owner_chain else None
        """Follows each pod's owner chain to its top (``--kubernetes.owner-chain``); ``None``: the
        pod's own controller names its workload.  Its ``stats()`` count the walks by outcome."""
        self._unsettled: dict[str, tuple[str, Mapping[str, Any]]] = {}
        """Pods whose owner walk stopped short (a bound, an error, a 403 or 404), by UID: their
        namespace and controller reference, walked again by ``_settle`` (at most one entry per
        pod of the node; dropped with the pod)."""
        self._settled_at = float("-inf")
        self._lock = threading.Lock()
        self._pods: dict[str, PodMeta] = {}
        self._version = 0
        self._directory: tuple[int, PodDirectory] | None = None
        self._healthy = False
        self._duration = 0.0
        self._last_error: str | None = None
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
    def in_cluster(cls, node_name: str, owner_chain: bool = True) -> KubePodSource:
        """Service-account credentials in a pod, else the local kubeconfig (for development); the
        configuration is read again after each failure (a configuration error fails the stage).
        ``owner_chain``: follow owners above the pod's controller (``--kubernetes.owner-chain``)."""
        return cls(lambda: KubeClient(load_endpoint()), node_name, owner_chain=owner_chain)

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
        unsettled: dict[str, tuple[str, Mapping[str, Any]]] = {}
        token: str | None = None
        version = ""
        for number in range(self.bounds.max_pages):
            page = self._list_page(api, token)
            for item in page.get("items") or []:
                meta = self._pod_meta(api, item, unsettled)
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
        self._unsettled = unsettled
        self._settled_at = time.monotonic()
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
                meta = self._pod_meta(api, obj, self._unsettled)
                if meta is not None:
                    with self._lock:
                        self._pods[meta.uid] = meta
                        self._version += 1
            elif kind == "DELETED":
                uid = str((obj.get("metadata") or {}).get("uid"))
                self._unsettled.pop(uid, None)
                with self._lock:
                    if self._pods.pop(uid, None) is not None:
                        self._version += 1
            if self._stop.is_set():
                break
            self._settle(api)
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

    # --- the owner chain ------------------------------------------------------------------------

    def _pod_meta(
        self, api: KubeClient, raw: Mapping[str, Any], unsettled: dict[str, tuple[str, Mapping[str, Any]]]
    ) -> PodMeta | None:
        """``pod_meta`` of ``raw``, its workload the top of its owner chain when that is on; a pod
        whose walk stopped short is put in ``unsettled`` (and taken out once a walk completes)."""
        owners = self.owners
        if owners is None:
            return pod_meta(raw)
        walked: list[tuple[str, Mapping[str, Any], Owner]] = []

        def resolve(namespace: str, ref: Mapping[str, Any]) -> Owner:
            owner = owners.top(api, namespace, ref)
            walked.append((namespace, ref, owner))
            return owner

        meta = pod_meta(raw, resolve)
        if meta is not None:
            if walked and not walked[0][2].complete:
                unsettled[meta.uid] = walked[0][:2]
            else:
                unsettled.pop(meta.uid, None)
        return meta

    def _settle(self, api: KubeClient) -> None:
        """Walk again the chains of pods whose last walk stopped short, at most once every
        ``SETTLE_SECONDS``, and relabel the pods whose answer changed.  Runs between watch events
        (a real API server also sends a bookmark about once a minute), so the extra time is the
        resolver's, bounded there; a pass ends at the first walk the rate bound limits."""
        owners = self.owners
        now = time.monotonic()
        if owners is None or not self._unsettled or now - self._settled_at < SETTLE_SECONDS:
            return
        self._settled_at = now
        for uid, (namespace, ref) in list(self._unsettled.items()):
            with self._lock:
                meta = self._pods.get(uid)
            if meta is None:
                self._unsettled.pop(uid, None)
                continue
            owner = owners.top(api, namespace, ref)
            if owner.complete:
                self._unsettled.pop(uid, None)
            if (owner.kind, owner.name) != (meta.workload_kind, meta.workload):
                with self._lock:
                    if self._pods.get(uid) is meta:
                        self._pods[uid] = dataclasses.replace(meta, workload_kind=owner.kind, workload=owner.name)
                        self._version += 1
            if owner.outcome == "limited":
                break

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
