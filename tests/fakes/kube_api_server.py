"""A small Kubernetes API emulator on loopback: pod list + watch (chunked JSON lines), API
discovery and GET of any object it holds.

Written instead of using ``kmock`` (PyPI 0.8): kmock is asyncio/aiohttp-based (three new test
dependencies, and an event loop thread next to our synchronous client), ignores ``fieldSelector``
(so a node-scoped watch cannot be verified), answers lists with ``resourceVersion: "..."`` (so
resuming a watch from a version and 410 Gone cannot be exercised), and calls itself early v0.
This one does exactly what the real API server does for the calls gpulens makes, plus faults.

Lists are paged as the real server pages them: ``limit`` items per page (after the field
selector), ``metadata.continue`` an opaque token naming the list's resource version and the last
key served, every page of one list read from that same version (the emulator replays its event
log up to it, as etcd serves an old revision), and ``metadata.resourceVersion`` that version.

Objects other than pods are registered with ``add_object`` (any kind, custom ones too, each with
an optional controller reference) or ``add_job``.  Discovery (``/api/v1``, ``/apis/<group>/<version>``)
lists the built-in resources an owner chain meets (``BUILTIN_RESOURCES``) and every kind
registered; ``GET /apis/<group>/<version>/namespaces/<ns>/<plural>/<name>`` (and
``/api/v1/namespaces/<ns>/pods/<name>`` for any pod held, whatever its node) answers the object,
or only its metadata as a ``PartialObjectMetadata`` when the Accept header asks for that, as the
real server does; 404 for what it does not hold, 403 for resources in ``forbidden`` (RBAC denies
before existence is looked at, as on a real server).  ``raw_bodies`` answers a path with prepared
bytes (malformed or huge replies), ``object_delay`` makes every single-object GET wait (a slow
server).  ``accepts`` logs each request's Accept header.

Hostile modes (``hostile``), for the exporter's bounds: ``"endless-line"`` answers watches with
one event line that never ends (64 KiB HTTP chunks as fast as the client reads, up to
``endless_line_bytes`` if set); ``"trickle-line"`` with one line that grows by a byte every
``trickle_interval`` seconds (each byte its own HTTP chunk, as a server flushing every write
sends them); ``"huge-list"`` answers lists with about ``huge_list_bytes`` of pods, ignoring
``limit``, with a Content-Length or, with ``huge_list_chunked``, chunked without one.  The bodies
are streamed from one encoded pod, never built whole.  ``list_bytes_sent`` / ``watch_bytes_sent``
count what the emulator managed to write.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

CREATED = "2026-01-01T00:00:00Z"
"""``metadata.creationTimestamp`` of every object the emulator makes (RFC 3339, UTC)."""

IMAGE = "registry.example/app:1"
"""Image of every container the emulator makes."""

OWNER_API_VERSIONS = {
    "Pod": "v1",
    "ReplicaSet": "apps/v1",
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "DaemonSet": "apps/v1",
    "Job": "batch/v1",
    "CronJob": "batch/v1",
    "JobSet": "jobset.x-k8s.io/v1alpha2",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1",
    "PyTorchJob": "kubeflow.org/v1",
    "MPIJob": "kubeflow.org/v1",
    "TFJob": "kubeflow.org/v1",
    "XGBoostJob": "kubeflow.org/v1",
    "PaddleJob": "kubeflow.org/v1",
    "JAXJob": "kubeflow.org/v1",
    "TrainJob": "trainer.kubeflow.org/v1alpha1",
    "RayCluster": "ray.io/v1",
    "RayJob": "ray.io/v1",
    "RayService": "ray.io/v1",
}
"""``apiVersion`` of an owner reference, by the owner's kind, as the controllers of these kinds
write it; other kinds need ``api_version`` given."""

BUILTIN_RESOURCES: dict[str, dict[str, tuple[str, bool]]] = {
    "v1": {"Pod": ("pods", True), "Namespace": ("namespaces", False), "Node": ("nodes", False)},
    "apps/v1": {
        "Deployment": ("deployments", True),
        "ReplicaSet": ("replicasets", True),
        "StatefulSet": ("statefulsets", True),
        "DaemonSet": ("daemonsets", True),
    },
    "batch/v1": {"Job": ("jobs", True), "CronJob": ("cronjobs", True)},
}
"""Resources discovery lists before any is registered: apiVersion -> kind -> (plural, namespaced)."""

METADATA_MEDIA = ("as=partialobjectmetadata", "g=meta.k8s.io", "v=v1")
"""Parameters of an Accept media range asking for metadata only (compared in lower case)."""


def object_uid(kind: str, namespace: str, name: str) -> str:
    """The UID the emulator gives an object it makes (pods: ``make_pod``'s own)."""
    return f"uid-{namespace}-{kind.lower()}-{name}"


def owner_reference(kind: str, name: str, namespace: str, api_version: str | None = None) -> dict[str, Any]:
    """A controller reference as the owning controller writes it: ``apiVersion``, ``kind``,
    ``name`` and ``uid`` (all four required by the API), ``controller`` and ``blockOwnerDeletion``.
    ``apiVersion`` from ``OWNER_API_VERSIONS`` unless given; the UID is ``object_uid``'s."""
    version = api_version or OWNER_API_VERSIONS.get(kind)
    if version is None:
        raise ValueError(f"no apiVersion known for kind {kind!r}: pass api_version")
    return {
        "apiVersion": version,
        "kind": kind,
        "name": name,
        "uid": object_uid(kind, namespace, name),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def reference_to(obj: dict[str, Any]) -> dict[str, Any]:
    """The controller reference naming ``obj`` (a pod or any object the emulator made)."""
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def container_status(name: str, runtime_id: str, phase: str) -> dict[str, Any]:
    """One ``status.containerStatuses`` entry as the kubelet reports it.

    With a ``runtime_id`` the container was created: ``containerID``, the resolved ``imageID``, and
    a running state (terminated, exit code 0 or 1, once ``phase`` is Succeeded or Failed).  Without
    one it is still being created: no ``containerID``, an empty ``imageID``, a waiting state.
    ``image``, ``imageID``, ``name``, ``ready`` and ``restartCount`` are always there.
    """
    status: dict[str, Any] = {"name": name, "image": IMAGE, "imageID": "", "restartCount": 0}
    if not runtime_id:
        status.update(ready=False, started=False, state={"waiting": {"reason": "ContainerCreating"}})
        return status
    status.update(containerID=f"containerd://{runtime_id}", imageID=f"{IMAGE.split(':')[0]}@sha256:{'0' * 64}")
    if phase in ("Succeeded", "Failed"):
        code = 0 if phase == "Succeeded" else 1
        terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "startedAt": CREATED}
        status.update(ready=False, started=False, state={"terminated": terminated})
    else:
        status.update(ready=phase == "Running", started=True, state={"running": {"startedAt": CREATED}})
    return status


def make_pod(
    name: str,
    namespace: str = "default",
    uid: str | None = None,
    node: str = "gpu-node-1",
    phase: str = "Running",
    owner: tuple[str, str] | dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    containers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod object as the API returns it (every field the API server always sets);
    ``containers`` maps container name -> runtime ID (``""``: not created yet), ``owner`` is the
    controller's (kind, name) or its whole reference (``reference_to``)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{namespace}-{name}",
        "creationTimestamp": CREATED,
        "labels": labels or {},
    }
    if isinstance(owner, dict):
        meta["ownerReferences"] = [owner]
    elif owner is not None:
        meta["ownerReferences"] = [owner_reference(owner[0], owner[1], namespace)]
    specs = containers or {"main": ""}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": c, "image": IMAGE} for c in specs]},
        "status": {
            "phase": phase,
            "containerStatuses": [container_status(c, cid, phase) for c, cid in specs.items()],
        },
    }


def make_job(namespace: str, name: str, cronjob: str | None) -> dict[str, Any]:
    """A Job object as the API returns it: metadata (owned by the CronJob ``cronjob`` if given),
    the spec the Job controller defaults (selector, one-container pod template) and a status."""
    uid = object_uid("Job", namespace, name)
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid, "creationTimestamp": CREATED}
    if cronjob:
        meta["ownerReferences"] = [owner_reference("CronJob", cronjob, namespace)]
    selector = {"batch.kubernetes.io/controller-uid": uid}
    template = {
        "metadata": {"labels": {**selector, "batch.kubernetes.io/job-name": name}},
        "spec": {"containers": [{"name": "main", "image": IMAGE}], "restartPolicy": "Never"},
    }
    spec = {"parallelism": 1, "completions": 1, "backoffLimit": 6, "selector": {"matchLabels": selector}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {**spec, "template": template},
        "status": {"active": 1, "startTime": CREATED},
    }


def make_cronjob(namespace: str, name: str) -> dict[str, Any]:
    """A CronJob object as the API returns it: metadata, the schedule and the Job template the
    API requires, and an empty status."""
    template = {"spec": {"template": {"spec": {"containers": [{"name": "main", "image": IMAGE}]}}}}
    meta = {
        "name": name,
        "namespace": namespace,
        "uid": object_uid("CronJob", namespace, name),
        "creationTimestamp": CREATED,
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": meta,
        "spec": {"schedule": "0 3 * * *", "jobTemplate": template, "concurrencyPolicy": "Allow", "suspend": False},
        "status": {},
    }


HOSTILE_MODES = ("endless-line", "trickle-line", "huge-list")
"""Values of ``KubeApiEmulator.hostile``."""

_STREAM_PIECE = 64 * 1024
"""Bytes per HTTP chunk of the hostile streams."""


def _wants_metadata(accept: str) -> bool:
    """Whether the first media range of ``accept`` the emulator can serve asks for
    ``PartialObjectMetadata`` (meta.k8s.io/v1) rather than the object."""
    for media in accept.split(","):
        kind, *params = (part.strip().lower() for part in media.split(";"))
        if kind not in ("application/json", "*/*", "application/*"):
            continue
        return set(METADATA_MEDIA) <= set(params)
    return False


def _pod_key(pod: dict[str, Any]) -> tuple[str, str]:
    """Where the API server's storage keeps a pod (``/registry/pods/<namespace>/<name>``): the
    order of a list and the position a continue token names."""
    meta = pod["metadata"]
    return meta.get("namespace", ""), meta.get("name", "")


def _continue_token(rv: int, key: tuple[str, str]) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": "/".join(key) + "\x00"}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _parse_continue(token: str) -> tuple[int, tuple[str, str]]:
    """(resource version, key after which the page starts); ValueError if malformed."""
    try:
        doc = json.loads(base64.urlsafe_b64decode(token.encode()))
        namespace, name = str(doc["start"]).rstrip("\x00").split("/", 1)
        return int(doc["rv"]), (namespace, name)
    except (binascii.Error, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"invalid continue token: {exc}") from None


class KubeApiEmulator:
    """Pods with resource versions and an event log; watches stream events after a version.

    Faults: ``fail_status`` answers every pod list and watch with that HTTP status;
    ``expire_watches`` answers watches with a 410 Gone ERROR event; ``drop_watches()`` cuts open
    streams; ``forbidden`` holds (group, resource) pairs whose GETs are denied (403), and
    ``jobs_forbidden`` adds or removes batch jobs there.  ``stop()``/``start()`` keep the port.
    ``continue_gate`` (an Event) holds every continue page until it is set (``continue_waiting``
    is set while one waits).  ``hostile`` selects a hostile mode (module docstring).
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.rv = 100
        self.pods: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        self.resources: dict[str, dict[str, tuple[str, bool]]] = {
            version: dict(kinds) for version, kinds in BUILTIN_RESOURCES.items()
        }
        """What discovery lists: apiVersion -> kind -> (plural, namespaced)."""
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        """Objects other than pods, by (apiVersion, plural, namespace, name)."""
        self.forbidden: set[tuple[str, str]] = set()
        self.raw_bodies: dict[str, bytes] = {}
        self.object_delay = 0.0
        """Seconds each single-object GET waits before its answer (a slow API server; any change
        to the pods or ``stop()`` ends the wait early)."""
        self.fail_status: int | None = None
        self.expire_watches = False
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.accepts: list[tuple[str, str]] = []
        """(path, Accept header) of each request, in order."""
        self.continue_gate: threading.Event | None = None
        self.continue_waiting = threading.Event()
        self.hostile: str | None = None
        self.endless_line_bytes: int | None = None
        self.trickle_interval = 0.1
        self.huge_list_bytes = 200_000_000
        self.huge_list_chunked = False
        self.list_bytes_sent = 0
        self.watch_bytes_sent = 0
        self._count_lock = threading.Lock()
        self._generation = 0
        self._server: ThreadingHTTPServer | None = None
        self.port = 0

    # --- state ---------------------------------------------------------------------------

    def _bump(self, kind: str, pod: dict[str, Any]) -> None:
        self.rv += 1
        pod = json.loads(json.dumps(pod))
        pod["metadata"]["resourceVersion"] = str(self.rv)
        if kind != "DELETED":
            self.pods[pod["metadata"]["uid"]] = pod
        self.events.append((self.rv, kind, pod))
        self.cond.notify_all()

    def put(self, pod: dict[str, Any]) -> None:
        """Create or update a pod (ADDED / MODIFIED event)."""
        with self.cond:
            kind = "MODIFIED" if pod["metadata"]["uid"] in self.pods else "ADDED"
            self._bump(kind, pod)

    def delete(self, uid: str) -> None:
        """Delete a pod (DELETED event)."""
        with self.cond:
            pod = self.pods.pop(uid)
            self._bump("DELETED", pod)

    def bookmark(self) -> int:
        """Advance the resource version without a pod change and send a BOOKMARK event."""
        with self.cond:
            self.rv += 1
            obj = {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.rv)}}
            self.events.append((self.rv, "BOOKMARK", obj))
            self.cond.notify_all()
            return self.rv

    def add_resource(self, api_version: str, kind: str, plural: str, namespaced: bool = True) -> None:
        """Serve ``kind`` as ``plural`` under ``api_version`` (in discovery and by path), as a CRD's
        installation does."""
        with self.cond:
            self.resources.setdefault(api_version, {})[kind] = (plural, namespaced)

    def put_object(self, obj: dict[str, Any], plural: str) -> dict[str, Any]:
        """Hold ``obj`` (a whole object: apiVersion, kind, metadata) as one of ``plural``."""
        meta = obj["metadata"]
        self.add_resource(obj["apiVersion"], obj["kind"], plural)
        with self.cond:
            self.objects[(obj["apiVersion"], plural, meta.get("namespace", ""), meta["name"])] = obj
        return obj

    def add_object(
        self,
        api_version: str,
        kind: str,
        plural: str,
        namespace: str,
        name: str,
        owner: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A namespaced object of any kind (its resource served from now on), controlled by the
        object ``owner`` names (a reference: ``owner_reference``, ``reference_to``); returns it."""
        meta: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "uid": object_uid(kind, namespace, name),
            "creationTimestamp": CREATED,
            "resourceVersion": "1",
            "generation": 1,
        }
        if owner is not None:
            meta["ownerReferences"] = [owner]
        obj = {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": {}, "status": {}}
        return self.put_object(obj, plural)

    def add_job(self, namespace: str, name: str, cronjob: str | None) -> None:
        """A Job, owned by ``cronjob`` if given (the CronJob is made too unless already held)."""
        self.put_object(make_job(namespace, name, cronjob), "jobs")
        if cronjob and ("batch/v1", "cronjobs", namespace, cronjob) not in self.objects:
            self.put_object(make_cronjob(namespace, cronjob), "cronjobs")

    @property
    def jobs(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The Jobs held, by (namespace, name)."""
        return {(ns, name): obj for (version, plural, ns, name), obj in self.objects.items() if plural == "jobs"}

    @property
    def jobs_forbidden(self) -> bool:
        """Whether GETs of batch jobs are denied (403)."""
        return ("batch", "jobs") in self.forbidden

    @jobs_forbidden.setter
    def jobs_forbidden(self, value: bool) -> None:
        if value:
            self.forbidden.add(("batch", "jobs"))
        else:
            self.forbidden.discard(("batch", "jobs"))

    def object_gets(self, plural: str | None = None) -> list[str]:
        """Paths of the single-object GETs so far (of ``plural`` only, if given)."""
        found = []
        for path, _ in self.requests:
            parts = path.strip("/").split("/")
            single = "namespaces" in parts and len(parts) - parts.index("namespaces") == 4
            if single and (plural is None or parts[-2] == plural):
                found.append(path)
        return found

    def discovery_gets(self) -> list[str]:
        """Paths of the discovery requests so far."""
        return [p for p, _ in self.requests if len(p.strip("/").split("/")) == (2 if p.startswith("/api/") else 3)]

    def drop_watches(self) -> None:
        """End every open watch stream (like an API server restart or a load balancer idle cut)."""
        with self.cond:
            self._generation += 1
            self.cond.notify_all()

    def watch_count(self) -> int:
        """Watch requests so far."""
        return sum(1 for _, q in self.requests if q.get("watch") == "true")

    def list_count(self) -> int:
        """List requests so far, each page counted."""
        return sum(1 for p, q in self.requests if p == "/api/v1/pods" and q.get("watch") != "true")

    def list_starts(self) -> int:
        """Lists begun so far (first pages: requests without a continue token)."""
        return sum(
            1 for p, q in self.requests if p == "/api/v1/pods" and q.get("watch") != "true" and not q.get("continue")
        )

    def pods_at(self, rv: int) -> dict[str, dict[str, Any]]:
        """The pods as they were at resource version ``rv`` (the event log replayed up to it)."""
        with self.cond:
            pods: dict[str, dict[str, Any]] = {}
            for event_rv, kind, pod in self.events:
                if event_rv > rv:
                    break
                uid = pod["metadata"].get("uid")
                if uid is None:
                    continue  # a bookmark
                if kind == "DELETED":
                    pods.pop(uid, None)
                else:
                    pods[uid] = pod
            return pods

    def _count(self, kind: str, sent: int) -> None:
        with self._count_lock:
            if kind == "list":
                self.list_bytes_sent += sent
            else:
                self.watch_bytes_sent += sent

    # --- server --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> KubeApiEmulator:
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                emulator._handle(self)

        ThreadingHTTPServer.allow_reuse_address = True
        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="kube-api-emulator", daemon=True
        ).start()
        return self

    def stop(self) -> None:
        """Stop listening (the port refuses connections) and cut open watches."""
        self.drop_watches()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> KubeApiEmulator:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- request handling ----------------------------------------------------------------

    @staticmethod
    def _send_json(h: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> int:
        """Send ``body``; returns the bytes of the body written."""
        data = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
        return len(data)

    @staticmethod
    def _status(code: int, reason: str, message: str) -> dict[str, Any]:
        """A failure ``Status`` object as the API server sends it (body of an error reply, object
        of a watch ERROR event)."""
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "code": code,
            "reason": reason,
            "message": message,
        }

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        parsed = urllib.parse.urlsplit(h.path)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        self.requests.append((parsed.path, query))
        self.accepts.append((parsed.path, h.headers.get("Accept") or ""))
        parts = [urllib.parse.unquote(p) for p in parsed.path.strip("/").split("/")]
        if (parts[:1] == ["api"] and len(parts) == 2) or (parts[:1] == ["apis"] and len(parts) == 3):
            self._discovery(h, "/".join(parts[1:]))
            return
        if parts[:1] == ["api"] and len(parts) == 6 and parts[2] == "namespaces" and parsed.path != "/api/v1/pods":
            self._get_object(h, parsed.path, "", parts[1], parts[3], parts[4], parts[5])
            return
        if parts[:1] == ["apis"] and len(parts) == 7 and parts[3] == "namespaces":
            self._get_object(h, parsed.path, parts[1], parts[2], parts[4], parts[5], parts[6])
            return
        if parsed.path != "/api/v1/pods":
            self._send_json(h, 404, self._status(404, "NotFound", "the server could not find the requested resource"))
            return
        if self.fail_status is not None:
            reason = {403: "Forbidden", 500: "InternalError"}.get(self.fail_status, "Error")
            msg = 'pods is forbidden: User "system:serviceaccount:gpulens:gpulens" cannot list resource "pods"'
            self._send_json(h, self.fail_status, self._status(self.fail_status, reason, msg))
            return
        node = None
        selector = query.get("fieldSelector", "")
        if selector.startswith("spec.nodeName="):
            node = selector.split("=", 1)[1]

        def on_node(pod: dict[str, Any]) -> bool:
            if "spec" not in pod:
                return True  # a bookmark: every watcher gets it
            return node is None or pod["spec"].get("nodeName") == node

        if query.get("watch") != "true":
            if self.hostile == "huge-list":
                self._send_huge_list(h)
                return
            try:
                body = self._list_page(query, on_node)
            except ValueError as exc:
                self._send_json(h, 400, self._status(400, "BadRequest", str(exc)))
                return
            self._count("list", self._send_json(h, 200, body))
            return
        if self.hostile in ("endless-line", "trickle-line"):
            self._stream_hostile_line(h)
            return
        self._stream_watch(
            h, int(query.get("resourceVersion") or 0), float(query.get("timeoutSeconds") or 300), on_node
        )

    def _discovery(self, h: BaseHTTPRequestHandler, api_version: str) -> None:
        """The APIResourceList of ``api_version`` (each resource with its status subresource, as
        the real lists have them), or 404 if it serves none."""
        with self.cond:
            kinds = dict(self.resources.get(api_version) or {})
        if not kinds:
            self._send_json(h, 404, self._status(404, "NotFound", "the server could not find the requested resource"))
            return
        resources: list[dict[str, Any]] = []
        for kind, (plural, namespaced) in sorted(kinds.items()):
            verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
            singular = kind.lower()
            resources.append(
                {"name": plural, "singularName": singular, "namespaced": namespaced, "kind": kind, "verbs": verbs}
            )
            status_verbs = ["get", "patch", "update"]
            resources.append(
                {
                    "name": f"{plural}/status",
                    "singularName": "",
                    "namespaced": namespaced,
                    "kind": kind,
                    "verbs": status_verbs,
                }
            )
        body = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": api_version, "resources": resources}
        self._send_json(h, 200, body)

    def _get_object(
        self, h: BaseHTTPRequestHandler, path: str, group: str, version: str, namespace: str, plural: str, name: str
    ) -> None:
        """One namespaced object: the prepared bytes for ``path``, else 403 for a denied resource,
        404 for an unknown resource or object, the object, or its metadata alone when asked."""
        if self.object_delay:
            with self.cond:  # stop() wakes it
                self.cond.wait(self.object_delay)
        if path in self.raw_bodies:
            data = self.raw_bodies[path]
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            try:
                h.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                h.close_connection = True  # the client refused the rest
            return
        api_version = f"{group}/{version}" if group else version
        resource = f"{plural}.{group}" if group else plural
        if (group, plural) in self.forbidden:
            msg = (
                f'{resource} "{name}" is forbidden: User "system:serviceaccount:gpulens:gpulens" cannot get '
                f'resource "{plural}" in API group "{group}" in the namespace "{namespace}"'
            )
            self._send_json(h, 403, self._status(403, "Forbidden", msg))
            return
        with self.cond:
            served = any(
                p == plural and namespaced for p, namespaced in (self.resources.get(api_version) or {}).values()
            )
            if api_version == "v1" and plural == "pods":
                obj = next(
                    (
                        p
                        for p in self.pods.values()
                        if (p["metadata"].get("namespace"), p["metadata"]["name"]) == (namespace, name)
                    ),
                    None,
                )
            else:
                obj = self.objects.get((api_version, plural, namespace, name))
        if not served:
            self._send_json(h, 404, self._status(404, "NotFound", "the server could not find the requested resource"))
            return
        if obj is None:
            self._send_json(h, 404, self._status(404, "NotFound", f'{resource} "{name}" not found'))
            return
        if _wants_metadata(h.headers.get("Accept") or ""):
            obj = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}
        self._send_json(h, 200, obj)

    def _list_page(self, query: dict[str, str], on_node: Any) -> dict[str, Any]:
        """One page of a list: ``limit`` items after the continue token's key, all read at the
        list's resource version; ``metadata.continue`` set while items remain."""
        token = query.get("continue")
        after: tuple[str, str] | None = None
        if token:
            rv, after = _parse_continue(token)
            gate = self.continue_gate
            if gate is not None:
                self.continue_waiting.set()
                gate.wait()
            pods = self.pods_at(rv)
        else:
            with self.cond:
                rv, pods = self.rv, dict(self.pods)
        items = sorted((p for p in pods.values() if on_node(p)), key=_pod_key)
        if after is not None:
            items = [p for p in items if _pod_key(p) > after]
        limit = int(query.get("limit") or 0)
        metadata: dict[str, Any] = {"resourceVersion": str(rv)}
        if 0 < limit < len(items):
            items = items[:limit]
            metadata["continue"] = _continue_token(rv, _pod_key(items[-1]))
        return {"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": items}

    def _stream_watch(self, h: BaseHTTPRequestHandler, since: int, timeout: float, on_node: Any) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

        def chunk(obj: dict[str, Any]) -> None:
            data = (json.dumps(obj) + "\n").encode()
            h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            h.wfile.flush()
            self._count("watch", len(data))

        try:
            if self.expire_watches:
                chunk({"type": "ERROR", "object": self._status(410, "Expired", "too old resource version")})
            else:
                with self.cond:
                    generation = self._generation
                sent = since
                deadline = timeout
                while True:
                    with self.cond:
                        pending = [(rv, k, p) for rv, k, p in self.events if rv > sent]
                        if not pending and generation == self._generation:
                            if not self.cond.wait(timeout=min(deadline, 0.1)):
                                deadline -= 0.1
                            pending = [(rv, k, p) for rv, k, p in self.events if rv > sent]
                        if generation != self._generation or deadline <= 0:
                            break
                    for rv, kind, pod in pending:
                        sent = rv
                        if on_node(pod):
                            chunk({"type": kind, "object": pod})
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        h.close_connection = True

    # --- hostile modes ---------------------------------------------------------------------

    def _huge_item(self) -> bytes:
        """One pod of this node with a 16 KiB annotation, as a list item."""
        pod = make_pod("bulky", "bulk")
        pod["metadata"]["annotations"] = {"example.com/blob": "x" * 16384}
        pod["metadata"]["resourceVersion"] = str(self.rv)
        return json.dumps(pod).encode()

    def _send_huge_list(self, h: BaseHTTPRequestHandler) -> None:
        """A PodList of about ``huge_list_bytes``, streamed from one encoded item."""
        head = b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"%d"},"items":[' % self.rv
        tail = b"]}"
        item = self._huge_item()
        count = max(1, (self.huge_list_bytes - len(head) - len(tail)) // (len(item) + 1))
        per_piece = max(1, _STREAM_PIECE // (len(item) + 1))
        piece = (item + b",") * per_piece
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        if self.huge_list_chunked:
            h.send_header("Transfer-Encoding", "chunked")
        else:
            h.send_header("Content-Length", str(len(head) + count * (len(item) + 1) - 1 + len(tail)))
        h.end_headers()
        generation = self._generation
        try:
            self._write(h, head, "list")
            left = count
            while left > per_piece:
                if generation != self._generation:
                    return  # stop(): hang up mid-list
                self._write(h, piece, "list")
                left -= per_piece
            self._write(h, (item + b",") * (left - 1) + item + tail, "list")
            if self.huge_list_chunked:
                h.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            h.close_connection = True

    def _write(self, h: BaseHTTPRequestHandler, data: bytes, kind: str) -> None:
        """Write ``data`` as it is, or as one HTTP chunk when the response is chunked."""
        chunked = kind == "watch" or self.huge_list_chunked
        h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
        h.wfile.flush()
        self._count(kind, len(data))

    def _stream_hostile_line(self, h: BaseHTTPRequestHandler) -> None:
        """A watch whose first event line never ends: sent fast (endless) or a byte at a time."""
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        generation = self._generation
        endless = self.hostile == "endless-line"
        piece = b"x" * _STREAM_PIECE
        limit = self.endless_line_bytes
        try:
            self._write(h, b'{"type":"ADDED","object":{"metadata":{"name":"', "watch")
            sent = 0
            while generation == self._generation and (limit is None or sent < limit):
                if endless:
                    self._write(h, piece, "watch")
                    sent += len(piece)
                else:
                    self._write(h, b"x", "watch")
                    with self.cond:  # drop_watches() and stop() wake it
                        self.cond.wait(self.trickle_interval)
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        h.close_connection = True
