"""Pod metadata of this node from the Kubernetes API: a node-scoped list + watch in a thread.

Gives pod UID, phase, owner workload and container IDs for the pods on ``spec.nodeName``.
Uses the official ``kubernetes`` client (auth, TLS, in-cluster config) but reads the list and
the watch stream as raw JSON: deserialising 1,000 ``V1Pod`` models costs far more than the dicts
we need.  Least privilege: ``pods`` list + watch; optionally ``jobs`` get (``batch``) to name the
CronJob behind a Job (see docs/attribution.md).  Deployments are named from the ReplicaSet name
and the pod's ``pod-template-hash`` label, with no extra permission.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from exporter.attribution import stages
from exporter.attribution.merge import PodDirectory, PodMeta
from exporter.model import StageResult

log = logging.getLogger(__name__)

STAGE = stages.KUBE_API
_HTTP_GONE = 410
_HTTP_FORBIDDEN = 403


class ApiError(Exception):
    """The API server answered with an error status (kept apart from transport errors)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


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


def _iter_lines(resp: Any) -> Iterator[str]:
    """Lines of a chunked watch response (events may be split across chunks)."""
    buf = b""
    for chunk in resp.stream(64 * 1024, decode_content=False):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield line.decode("utf-8", errors="replace")
    if buf.strip():
        yield buf.decode("utf-8", errors="replace")


class KubePodSource:
    """Keeps this node's pods up to date from a list + watch loop in a daemon thread.

    On any error the source reports failure (its data is withheld: ``latest()`` gives ``None``),
    waits with exponential backoff and jitter, and lists again; a watch that ends normally or
    expires (410 Gone) is resumed or re-listed without counting as a failure.
    """

    def __init__(
        self,
        api_client_factory: Callable[[], Any],
        node_name: str,
        watch_timeout_seconds: int = 300,
        backoff_initial_seconds: float = 1.0,
        backoff_max_seconds: float = 60.0,
        resolve_cronjobs: bool = True,
        start: bool = True,
    ) -> None:
        self._factory = api_client_factory
        self.node_name = node_name
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
        self._resp: Any = None
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
        """Service-account credentials in a pod, else the local kubeconfig (for development)."""

        def factory() -> Any:
            from kubernetes import client, config

            cfg = client.Configuration()
            try:
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException:
                config.load_kube_config(client_configuration=cfg)
            return client.ApiClient(cfg)

        return cls(factory, node_name)

    # --- the loop --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            import kubernetes.client  # noqa: F401  (slow first import: keep it out of timings)
        except ImportError as exc:  # the k8s extra is not installed: this stage fails, others go on
            self._fail(exc)
            return
        backoff = self.backoff_initial_seconds
        api: Any = None
        while not self._stop.is_set():
            try:
                if api is None:
                    api = self._factory()
                rv: str | None = self._list(api)
                backoff = self.backoff_initial_seconds
                while rv is not None and not self._stop.is_set():
                    rv = self._watch(api, rv)  # None = expired (410): list again
            except Exception as exc:  # this source fails alone; retry with backoff
                if self._stop.is_set():
                    break  # close() cut the stream: not an API failure
                self._fail(exc)
                api = None
                delay = backoff * random.uniform(0.8, 1.2)
                backoff = min(self.backoff_max_seconds, backoff * 2)
                self._stop.wait(delay)

    def _fail(self, exc: BaseException) -> None:
        error = str(exc) if isinstance(exc, ApiError) else f"{type(exc).__name__}: {exc}"
        with self._lock:
            self._healthy = False
            changed = error != self._last_error
            self._last_error = error
        if changed:
            hint = " (RBAC: the service account needs pods list+watch)" if "403" in error else ""
            log.warning("Kubernetes API pod watch failed: %s%s", error[:300], hint)

    def _request(self, api: Any, **params: Any) -> Any:
        from kubernetes import client

        core = client.CoreV1Api(api)
        timeout = params.pop("_read_timeout", 30)
        resp: Any = core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name}",
            _preload_content=False,
            _request_timeout=(10, timeout),
            **params,
        )
        if not 200 <= resp.status <= 299:
            body = resp.data.decode("utf-8", errors="replace") if resp.data else ""
            resp.release_conn()
            raise ApiError(resp.status, body[:300])
        return resp

    def _list(self, api: Any) -> str:
        from kubernetes.client.exceptions import ApiException

        start = time.perf_counter()
        try:
            resp = self._request(api)
        except ApiException as exc:
            raise ApiError(exc.status or 0, str(exc.reason)) from None
        try:
            body = json.loads(resp.data)
        finally:
            resp.release_conn()
        pods = {}
        for item in body.get("items") or []:
            meta = pod_meta(item, self._job_owner_getter(api))
            if meta is not None:
                pods[meta.uid] = meta
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
        self.resource_version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        return self.resource_version

    def _watch(self, api: Any, rv: str) -> str | None:
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self._request(
                api,
                watch=True,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=self.watch_timeout_seconds,
                _read_timeout=self.watch_timeout_seconds + 30,
            )
        except ApiException as exc:
            if exc.status == _HTTP_GONE:
                return None
            raise ApiError(exc.status or 0, str(exc.reason)) from None
        self._resp = resp
        self.watches += 1
        try:
            for line in _iter_lines(resp):
                event = json.loads(line)
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
        finally:
            self._resp = None
            resp.release_conn()
        return rv

    def list_now(self) -> int:
        """One full list on the calling thread, replacing the pod table (benchmarks, tools);
        returns the number of pods.  Raises on failure."""
        import kubernetes.client  # noqa: F401  (import cost is not list cost)

        self._list(self._factory())
        with self._lock:
            return len(self._pods)

    # --- Job -> CronJob ------------------------------------------------------------------------

    def _job_owner_getter(self, api: Any) -> Callable[[str, str], str | None] | None:
        if not self._resolve_cronjobs:
            return None
        return lambda namespace, job: self._job_owner(api, namespace, job)

    def _job_owner(self, api: Any, namespace: str, job: str) -> str | None:
        key = (namespace, job)
        if key in self._job_owners:
            return self._job_owners[key]
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        owner: str | None = None
        try:
            resp: Any = client.BatchV1Api(api).read_namespaced_job(
                job, namespace, _preload_content=False, _request_timeout=(5, 10)
            )
            body = json.loads(resp.data) if 200 <= resp.status <= 299 else {}
            resp.release_conn()
            refs = (body.get("metadata") or {}).get("ownerReferences") or []
            owner = next((r.get("name") for r in refs if r.get("kind") == "CronJob"), None)
        except ApiException as exc:
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
        """This node's pods (``None`` while the API is failing) and the source's health."""
        with self._lock:
            healthy, duration = self._healthy, self._duration
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
            conn = getattr(resp, "connection", None) or getattr(resp, "_connection", None)
            sock = getattr(conn, "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):  # already closed by the reader
                    sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
