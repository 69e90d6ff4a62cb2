"""A small Kubernetes API emulator on loopback: pod and DRA ResourceSlice list + watch (chunked
JSON lines), API discovery and GET of any object it holds.

Written instead of using ``kmock`` (PyPI 0.8): kmock is asyncio/aiohttp-based (three new test
dependencies, and an event loop thread next to our synchronous client), ignores ``fieldSelector``
(so a node-scoped watch cannot be verified), answers lists with ``resourceVersion: "..."`` (so
resuming a watch from a version and 410 Gone cannot be exercised), and calls itself early v0.
This one does exactly what the real API server does for the calls gpulens makes, plus faults.

Lists are paged as the real server pages them: ``limit`` items per page (after the field
selector), ``metadata.continue`` an opaque token naming the list's resource version and the last
key served, every page of one list read from that same version (the emulator replays its event
log up to it, as etcd serves an old revision), and ``metadata.resourceVersion`` that version.
Field selectors are the real server's for each resource (pods: ``spec.nodeName``,
``metadata.name``, ``metadata.namespace``, ``status.phase``; ResourceSlices: ``spec.nodeName``,
``spec.driver``, ``metadata.name``; ``=``, ``==`` or ``!=``, joined by commas); another field is
refused (400), as there.  Pods and ResourceSlices share one resource version counter, as all
objects of an etcd do; each resource has its own event log.

ResourceSlices (``resource.k8s.io/v1``, cluster-scoped, ``SLICES_PATH``) are made with
``make_resource_slice`` (devices from ``nvidia_gpu``, ``nvidia_mig`` or any dict) and held with
``put_slice`` / ``delete_slice``; ``GET …/resourceslices/<name>`` answers one.

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
sends them); ``"huge-list"`` answers lists with about ``huge_list_bytes`` of pods (of slices
for a ResourceSlice list), ignoring ``limit``, with a Content-Length or, with
``huge_list_chunked``, chunked without one; each mode for pods and ResourceSlices alike.  The
bodies are streamed from one encoded object, never built whole.  ``list_bytes_sent`` /
``watch_bytes_sent`` count what the emulator managed to write.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
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
    "resource.k8s.io/v1": {
        "ResourceSlice": ("resourceslices", False),
        "ResourceClaim": ("resourceclaims", True),
        "ResourceClaimTemplate": ("resourceclaimtemplates", True),
        "DeviceClass": ("deviceclasses", False),
    },
}
"""Resources discovery lists before any is registered: apiVersion -> kind -> (plural, namespaced)."""

WITHOUT_STATUS = frozenset({"ResourceSlice", "ResourceClaimTemplate", "DeviceClass"})
"""Kinds served without a ``status`` subresource (discovery lists one for every other kind)."""

PODS_PATH = "/api/v1/pods"
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
SLICE_API_VERSION = "resource.k8s.io/v1"

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


def make_object(
    api_version: str,
    kind: str,
    namespace: str,
    name: str,
    owner: dict[str, Any] | None = None,
    uid: str | None = None,
    created: str = CREATED,
) -> dict[str, Any]:
    """A namespaced object of any kind with an empty spec and status, controlled by the object
    ``owner`` names; its UID is ``object_uid``'s unless given."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid or object_uid(kind, namespace, name),
        "creationTimestamp": created,
        "resourceVersion": "1",
        "generation": 1,
    }
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": {}, "status": {}}


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


def _attributes(
    strings: dict[str, str], ints: dict[str, int] | None = None, versions: dict[str, str] | None = None
) -> dict[str, dict[str, str | int]]:
    """Device attributes as the API holds them: each value under its kind (``string``, ``int``,
    ``version``)."""
    out: dict[str, dict[str, str | int]] = {name: {"string": value} for name, value in strings.items()}
    out.update({name: {"int": value} for name, value in (ints or {}).items()})
    out.update({name: {"version": value} for name, value in (versions or {}).items()})
    return out


def nvidia_gpu(name: str, uuid: str, pci_bus_id: str | None = None, index: int = 0) -> dict[str, Any]:
    """A whole GPU as NVIDIA's DRA driver (``gpu.nvidia.com``) publishes it: unqualified
    attributes (``type`` ``gpu``, ``uuid``, product, architecture, versions), the standard
    qualified PCI ones when ``pci_bus_id`` is given, and its memory as capacity."""
    strings = {"type": "gpu", "uuid": uuid, "productName": "NVIDIA H200", "brand": "Nvidia", "architecture": "Hopper"}
    if pci_bus_id is not None:
        strings["resource.kubernetes.io/pciBusID"] = pci_bus_id
        strings["resource.kubernetes.io/pcieRoot"] = "pci0000:00"
    versions = {"cudaComputeCapability": "9.0.0", "driverVersion": "570.124.6", "cudaDriverVersion": "12.8.0"}
    attributes = _attributes(strings, {"index": index, "minor": index}, versions)
    return {"name": name, "attributes": attributes, "capacity": {"memory": {"value": "143771Mi"}}}


def nvidia_mig(name: str, uuid: str, parent_uuid: str, profile: str = "1g.18gb", index: int = 0) -> dict[str, Any]:
    """A MIG device as NVIDIA's DRA driver publishes it: ``type`` ``mig``, its ``uuid``, its GPU's
    (``parentUUID``) and its ``profile``, and its share of the GPU as capacity."""
    strings = {"type": "mig", "uuid": uuid, "parentUUID": parent_uuid, "profile": profile}
    strings.update(productName="NVIDIA H200", architecture="Hopper")
    attributes = _attributes(strings, {"index": index}, {"driverVersion": "570.124.6"})
    capacity = {"memory": {"value": "16384Mi"}, "multiprocessors": {"value": "16"}}
    return {"name": name, "attributes": attributes, "capacity": capacity}


def make_resource_slice(
    node: str,
    driver: str,
    pool: str,
    devices: list[dict[str, Any]],
    generation: int = 1,
    name: str | None = None,
    slice_count: int = 1,
) -> dict[str, Any]:
    """A ResourceSlice (``resource.k8s.io/v1``) as a DRA driver's kubelet plugin publishes it:
    node-local (``spec.nodeName``), owned by its Node, ``devices`` in the pool ``pool`` of
    ``generation`` (one of ``slice_count`` slices).  Named ``<node>-<driver>-<pool>-<generation>``
    unless ``name`` is given (the real plugin uses ``generateName``)."""
    slice_name = name or f"{node}-{driver}-{pool}-{generation}".replace("/", "-")
    meta = {
        "name": slice_name,
        "uid": object_uid("ResourceSlice", "", slice_name),
        "creationTimestamp": CREATED,
        "generation": 1,
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": object_uid("Node", "", node), "controller": True}
        ],
    }
    spec = {
        "driver": driver,
        "pool": {"name": pool, "generation": generation, "resourceSliceCount": slice_count},
        "nodeName": node,
        "devices": devices,
    }
    return {"apiVersion": SLICE_API_VERSION, "kind": "ResourceSlice", "metadata": meta, "spec": spec}


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
    """Where the API server's storage keeps an object (``/registry/pods/<namespace>/<name>``; a
    cluster-scoped one has no namespace): the order of a list and the position a continue token
    names."""
    meta = pod["metadata"]
    return meta.get("namespace", ""), meta.get("name", "")


def _field(obj: dict[str, Any], path: str) -> str:
    """The value of a dotted field (``spec.nodeName``) as a field selector compares it: text,
    ``""`` when absent."""
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


@dataclass
class _Collection:
    """One resource the emulator lists and watches: its objects by key, its event log, and what
    its lists and field selectors are."""

    path: str
    api_version: str
    list_kind: str
    kind: str
    key_field: str
    """The metadata field objects are held by (``uid`` for pods, ``name`` for slices)."""
    fields: frozenset[str]
    """Fields its field selectors may name (the real server refuses others)."""
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)

    def key(self, obj: dict[str, Any]) -> str | None:
        """Where ``obj`` is held; ``None`` for a bookmark."""
        return obj["metadata"].get(self.key_field)

    def matcher(self, selector: str) -> Callable[[dict[str, Any]], bool]:
        """Whether an object passes ``selector`` (bookmarks always do); ValueError naming a field
        the resource does not support."""
        terms: list[tuple[str, str, bool]] = []
        for term in filter(None, (t.strip() for t in selector.split(","))):
            negate = "!=" in term
            name, value = term.split("!=" if negate else "=", 1)
            if not negate and value.startswith("="):
                value = value[1:]
            if name not in self.fields:
                raise ValueError(f"field label not supported: {name}")
            terms.append((name, value, negate))

        def matches(obj: dict[str, Any]) -> bool:
            if "spec" not in obj:
                return True  # a bookmark: every watcher gets it
            return all((_field(obj, name) == value) != negate for name, value, negate in terms)

        return matches


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
    """Pods and ResourceSlices with resource versions and event logs; watches stream events after
    a version.

    Faults: ``fail_status`` answers every list and watch (pods and ResourceSlices; only those of
    ``fail_path`` when it is set) with that HTTP status; ``expire_watches`` answers watches with
    a 410 Gone ERROR event; ``drop_watches()`` cuts open
    streams; ``forbidden`` holds (group, resource) pairs whose GETs are denied (403), and
    ``jobs_forbidden`` adds or removes batch jobs there.  ``stop()``/``start()`` keep the port.
    ``continue_gate`` (an Event) holds every continue page until it is set (``continue_waiting``
    is set while one waits).  ``hostile`` selects a hostile mode (module docstring).
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.rv = 100
        pods = _Collection(
            PODS_PATH,
            "v1",
            "PodList",
            "Pod",
            "uid",
            frozenset({"spec.nodeName", "metadata.name", "metadata.namespace", "status.phase"}),
        )
        slices = _Collection(
            SLICES_PATH,
            SLICE_API_VERSION,
            "ResourceSliceList",
            "ResourceSlice",
            "name",
            frozenset({"spec.nodeName", "spec.driver", "metadata.name"}),
        )
        self._collections = {c.path: c for c in (pods, slices)}
        self.pods = pods.objects
        """Pods by UID."""
        self.events = pods.events
        """The pods' event log: (resource version, type, object)."""
        self.slices = slices.objects
        """ResourceSlices by name."""
        self.slice_events = slices.events
        """The ResourceSlices' event log."""
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
        self.fail_path: str | None = None
        """Where ``fail_status`` applies (``PODS_PATH``, ``SLICES_PATH``); ``None``: everywhere."""
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
        self._record(self._collections[PODS_PATH], kind, pod)

    def _record(self, collection: _Collection, kind: str, obj: dict[str, Any]) -> None:
        """Store a copy of ``obj`` at the next resource version and log its event (lock held)."""
        self.rv += 1
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["resourceVersion"] = str(self.rv)
        key = collection.key(obj)
        if kind != "DELETED" and key is not None:
            collection.objects[key] = obj
        collection.events.append((self.rv, kind, obj))
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

    def put_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or update a ResourceSlice (``make_resource_slice``; ADDED / MODIFIED event, the
        object's ``metadata.generation`` moving on an update, as the API server moves it); returns
        it as stored."""
        collection = self._collections[SLICES_PATH]
        with self.cond:
            name = obj["metadata"]["name"]
            old = collection.objects.get(name)
            if old is not None:
                obj = json.loads(json.dumps(obj))
                obj["metadata"]["generation"] = int(old["metadata"].get("generation") or 1) + 1
            self._record(collection, "MODIFIED" if old is not None else "ADDED", obj)
            return collection.objects[name]

    def delete_slice(self, name: str) -> None:
        """Delete a ResourceSlice (DELETED event)."""
        collection = self._collections[SLICES_PATH]
        with self.cond:
            self._record(collection, "DELETED", collection.objects.pop(name))

    def bookmark(self) -> int:
        """Advance the resource version without a change and send a BOOKMARK event to every
        watch (of pods and of ResourceSlices)."""
        with self.cond:
            self.rv += 1
            for collection in self._collections.values():
                obj = {
                    "kind": collection.kind,
                    "apiVersion": collection.api_version,
                    "metadata": {"resourceVersion": str(self.rv)},
                }
                collection.events.append((self.rv, "BOOKMARK", obj))
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
        return self.put_object(make_object(api_version, kind, namespace, name, owner), plural)

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

    def watch_count(self, path: str | None = None) -> int:
        """Watch requests so far (of ``path`` only, if given: ``PODS_PATH``, ``SLICES_PATH``)."""
        return sum(1 for p, q in self.requests if q.get("watch") == "true" and path in (None, p))

    def list_count(self, path: str = PODS_PATH) -> int:
        """List requests of ``path`` (pods unless told) so far, each page counted."""
        return sum(1 for p, q in self.requests if p == path and q.get("watch") != "true")

    def list_starts(self, path: str = PODS_PATH) -> int:
        """Lists of ``path`` (pods unless told) begun so far (first pages: requests without a
        continue token)."""
        return sum(1 for p, q in self.requests if p == path and q.get("watch") != "true" and not q.get("continue"))

    def pods_at(self, rv: int) -> dict[str, dict[str, Any]]:
        """The pods as they were at resource version ``rv`` (the event log replayed up to it)."""
        return self._objects_at(self._collections[PODS_PATH], rv)

    def _objects_at(self, collection: _Collection, rv: int) -> dict[str, dict[str, Any]]:
        """``collection``'s objects as they were at resource version ``rv``, by key."""
        with self.cond:
            objects: dict[str, dict[str, Any]] = {}
            for event_rv, kind, obj in collection.events:
                if event_rv > rv:
                    break
                key = collection.key(obj)
                if key is None:
                    continue  # a bookmark
                if kind == "DELETED":
                    objects.pop(key, None)
                else:
                    objects[key] = obj
            return objects

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
        collection = self._collections.get(parsed.path)
        if parts[:1] == ["apis"] and len(parts) == 5 and collection is None:
            self._get_cluster_object(h, parts[1], parts[2], parts[3], parts[4])
            return
        if collection is None:
            self._send_json(h, 404, self._status(404, "NotFound", "the server could not find the requested resource"))
            return
        watch = query.get("watch") == "true"
        if self.fail_status is not None and self.fail_path in (None, collection.path):
            reason = {403: "Forbidden", 404: "NotFound", 500: "InternalError"}.get(self.fail_status, "Error")
            if self.fail_status == 404:  # the resource is not served (an API group turned off)
                msg = "the server could not find the requested resource"
            elif collection.path == PODS_PATH:
                msg = 'pods is forbidden: User "system:serviceaccount:gpulens:gpulens" cannot list resource "pods"'
            else:
                msg = (
                    'resourceslices.resource.k8s.io is forbidden: User "system:serviceaccount:gpulens:gpulens" '
                    f'cannot {"watch" if watch else "list"} resource "resourceslices" in API group '
                    '"resource.k8s.io" at the cluster scope'
                )
            self._send_json(h, self.fail_status, self._status(self.fail_status, reason, msg))
            return
        try:
            matches = collection.matcher(query.get("fieldSelector", ""))
        except ValueError as exc:
            self._send_json(h, 400, self._status(400, "BadRequest", str(exc)))
            return
        if not watch:
            if self.hostile == "huge-list":
                self._send_huge_list(h, collection)
                return
            try:
                body = self._list_page(query, collection, matches)
            except ValueError as exc:
                self._send_json(h, 400, self._status(400, "BadRequest", str(exc)))
                return
            self._count("list", self._send_json(h, 200, body))
            return
        if self.hostile in ("endless-line", "trickle-line"):
            self._stream_hostile_line(h)
            return
        self._stream_watch(
            h,
            collection,
            int(query.get("resourceVersion") or 0),
            float(query.get("timeoutSeconds") or 300),
            matches,
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
            if kind in WITHOUT_STATUS:
                continue
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

    def _get_cluster_object(self, h: BaseHTTPRequestHandler, group: str, version: str, plural: str, name: str) -> None:
        """One cluster-scoped object of a resource the emulator lists (a ResourceSlice by name):
        403 for a denied resource, 404 for an unknown resource or object, else the object."""
        collection = self._collections.get(f"/apis/{group}/{version}/{plural}")
        if (group, plural) in self.forbidden:
            msg = (
                f'{plural}.{group} "{name}" is forbidden: User "system:serviceaccount:gpulens:gpulens" cannot get '
                f'resource "{plural}" in API group "{group}" at the cluster scope'
            )
            self._send_json(h, 403, self._status(403, "Forbidden", msg))
            return
        if collection is None:
            self._send_json(h, 404, self._status(404, "NotFound", "the server could not find the requested resource"))
            return
        with self.cond:
            obj = collection.objects.get(name)
        if obj is None:
            self._send_json(h, 404, self._status(404, "NotFound", f'{plural}.{group} "{name}" not found'))
            return
        self._send_json(h, 200, obj)

    def _list_page(
        self, query: dict[str, str], collection: _Collection, matches: Callable[[dict[str, Any]], bool]
    ) -> dict[str, Any]:
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
            objects = self._objects_at(collection, rv)
        else:
            with self.cond:
                rv, objects = self.rv, dict(collection.objects)
        items = sorted((o for o in objects.values() if matches(o)), key=_pod_key)
        if after is not None:
            items = [o for o in items if _pod_key(o) > after]
        limit = int(query.get("limit") or 0)
        metadata: dict[str, Any] = {"resourceVersion": str(rv)}
        if 0 < limit < len(items):
            items = items[:limit]
            metadata["continue"] = _continue_token(rv, _pod_key(items[-1]))
        return {
            "kind": collection.list_kind,
            "apiVersion": collection.api_version,
            "metadata": metadata,
            "items": items,
        }

    def _stream_watch(
        self,
        h: BaseHTTPRequestHandler,
        collection: _Collection,
        since: int,
        timeout: float,
        matches: Callable[[dict[str, Any]], bool],
    ) -> None:
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
                        pending = [(rv, k, o) for rv, k, o in collection.events if rv > sent]
                        if not pending and generation == self._generation:
                            if not self.cond.wait(timeout=min(deadline, 0.1)):
                                deadline -= 0.1
                            pending = [(rv, k, o) for rv, k, o in collection.events if rv > sent]
                        if generation != self._generation or deadline <= 0:
                            break
                    for rv, kind, obj in pending:
                        sent = rv
                        if matches(obj):
                            chunk({"type": kind, "object": obj})
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        h.close_connection = True

    # --- hostile modes ---------------------------------------------------------------------

    def _huge_item(self, collection: _Collection) -> bytes:
        """One object of this node with a 16 KiB annotation, as a list item: a pod, or a slice
        for a ResourceSlice list."""
        if collection.path == PODS_PATH:
            obj = make_pod("bulky", "bulk")
        else:
            obj = make_resource_slice("gpu-node-1", "gpu.nvidia.com", "gpu-node-1", [nvidia_gpu("gpu-0", "GPU-bulky")])
        obj["metadata"]["annotations"] = {"example.com/blob": "x" * 16384}
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return json.dumps(obj).encode()

    def _send_huge_list(self, h: BaseHTTPRequestHandler, collection: _Collection) -> None:
        """A list of about ``huge_list_bytes``, streamed from one encoded item."""
        head = b'{"kind":"%s","apiVersion":"%s","metadata":{"resourceVersion":"%d"},"items":[' % (
            collection.list_kind.encode(),
            collection.api_version.encode(),
            self.rv,
        )
        tail = b"]}"
        item = self._huge_item(collection)
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
