"""The top of a pod's owner chain, as the Kubernetes API gives it: what groups pods into jobs.

Role: given a namespace and a controller owner reference (``apiVersion``, ``kind``, ``name``,
``uid``: the pod's own controller), follow each object's controller reference up through the API
and name the last object reached: the JobSet above its Jobs, the TrainJob above that JobSet, the
LeaderWorkerSet above a worker StatefulSet and its leader pod, the RayJob above its RayCluster,
the CronJob above a Job.  Any kind works, custom ones included: a kind's resource path comes from
API discovery (``GET /api/v1``, ``GET /apis/<group>/<version>``), never from a table of kinds.
The pods of one job then carry one ``(workload_kind, workload)``, whatever node they run on.

Each owner is read as metadata only (``Accept: …;as=PartialObjectMetadata``: the API server then
sends ``metadata`` alone, for built-in kinds and custom resources alike) from the API server's
cache (``resourceVersion=0``: no etcd read), under a byte cap.  Reading stops, and the owner in
hand is the answer, at an object without a controller reference (``resolved``), at a 403
(``forbidden``: no RBAC to read that resource), at a 404 or an object whose UID is not the one
referenced (``not_found``), at any other failure, the depth bound or a loop (``error``), and when
a rate or time bound says no more requests now (``limited``).  ``OwnerResolver.stats()`` counts
each.  Answers other than ``resolved`` are marked incomplete (``Owner.complete``): the caller asks
again later.

Pods of a Deployment need no read of their ReplicaSet: a ReplicaSet named
``<deployment>-<pod-template-hash>`` (the pod's label; how the Deployment controller names them)
is that Deployment (``deployment_shortcut``), and the walk goes on from the Deployment.

Bounds, each argued where defined: the depth of a walk, the bytes of a reply, the time of a
request and of a walk, a share of the caller's time spent waiting on the API, requests per
second, and the entries of each cache.  The resolver is called from the pod source's watch
thread, one call at a time (it is not safe for concurrent use; ``stats()`` may be read from any
thread).
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from exporter.attribution.kube_http import JSON, ApiError, BoundExceeded, KubeClient, read_capped
from exporter.label_values import is_clean

log = logging.getLogger(__name__)

METADATA_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
"""``Accept`` of an owner read: metadata only where the server can (every API server since
Kubernetes 1.15, for built-in kinds and custom resources), else the whole object as JSON."""

OUTCOMES = ("resolved", "forbidden", "not_found", "error", "limited")
"""How a walk ended, as counted in ``OwnerResolver.stats()`` (module docstring)."""

MAX_DEPTH = 8
"""Most owner objects read in one walk.  The deepest chains known have four above the pod's
controller (LeaderWorkerSet: worker StatefulSet -> leader pod -> leader StatefulSet ->
LeaderWorkerSet; Kubeflow Trainer: Job -> JobSet -> TrainJob); 8 leaves room for layers not yet
invented and still ends a chain that loops through objects it has not seen (a loop through seen
ones is stopped at once)."""
MAX_OWNER_BYTES = 2 * 1024 * 1024
"""Largest owner reply read, bytes.  Metadata alone is usually a few KiB, but annotations may
take 256 KiB (the API's limit on their total; ``kubectl apply`` keeps the whole object in one),
``managedFields`` repeats the object's field paths per manager, and a server that cannot send
metadata alone (some aggregated APIs) sends the whole object, which etcd keeps under 1.5 MiB by
default; 2 MiB leaves room for JSON escapes.  A larger reply ends the walk (``error``)."""
MAX_DISCOVERY_BYTES = 1024 * 1024
"""Largest discovery reply read, bytes: ``/api/v1`` lists ~60 resources in ~25 KiB; a group
with 40x that is not one a controller lives in."""
CACHE_ENTRIES = 4096
"""Owners remembered (each the answer for one object of a chain; a few hundred bytes each, so at
most ~2 MiB).  A node holds at most a few hundred pods (110 by the kubelet's default), each with
a chain of a few objects, so 4,096 keeps every owner of a busy node while bounding what a tenant
creating pods with ever new owner references can make the exporter remember; the least recently
used entry goes first."""
DISCOVERY_ENTRIES = 64
"""Group-versions whose resource lists are remembered.  A cluster serves a few dozen; owners
come from a handful (core, apps, batch and the job operators' groups)."""
POSITIVE_TTL_SECONDS = 600.0
"""How long a resolved answer (and a group-version's resource list) is reused, seconds.  Owner
references do not change once set, so this only bounds how long a deleted owner's answer lingers
and how stale discovery may be; a node of 110 pods with distinct chains then costs well under
one request per second to keep its answers."""
ERROR_TTL_SECONDS = 60.0
"""How long an incomplete answer (403, 404, error) or a failed discovery is reused before the
API is asked again, seconds: a grant added to the role, an owner that appears or an API that
recovers is seen within a minute, and a denied resource costs one 403 a minute per namespace."""
REQUESTS_PER_SECOND = 20.0
"""Sustained requests per second (owner reads and discovery together).  Needed only while new
owners appear; kube-controller-manager's clients default to the same 20/s."""
REQUEST_BURST = 100
"""Requests allowed at once before ``REQUESTS_PER_SECOND`` applies: the kubelet's own default
burst (``kubeAPIBurst``), enough for the first list of a node whose pods (up to 110) have
a few dozen distinct controllers.  Past it a walk stops where it is (``limited``, no waiting) and
is asked again later."""
GET_TIMEOUT_SECONDS = 1.5
"""Longest one request may take to connect, and then to answer, seconds (each; less when the walk
has less left).  Kubernetes' API latency SLO is 1 s at the 99th percentile for single-object
reads; one slower than 1.5 s means an API server too busy to be asked for extras."""
WALK_SECONDS = 3.0
"""Longest one walk keeps requesting, seconds: no new request starts after it, and the requests'
timeouts are cut to what is left, so a walk ends within about twice this.  It runs in the pod
watch's thread between two events: 6 s stays under the watch's 10 s line-stall bound
(``kubeapi.LINE_STALL_SECONDS``)."""
TIME_SHARE = 0.1
"""Share of wall time the resolver may spend waiting on the API, over time (seconds of requests
earned per second).  With ``TIME_BURST_SECONDS``, an API that is slow or times out can hold the
pod watch up for at most 3 s at once and 10 % of the time after that; a healthy one (a few ms a
read) never gets near it."""
TIME_BURST_SECONDS = 3.0
"""Seconds of requests allowed at once before ``TIME_SHARE`` applies (one full walk)."""
MIN_GET_SECONDS = 0.05
"""Least time a request is started with, seconds: with less left (of the walk or the time share)
the walk stops (``limited``) instead of sending a request that could only time out; a metadata
read from the API server's cache takes a few milliseconds."""
_FORBIDDEN_LOGGED = 64
"""Resources whose first 403 is logged (each once); past it, 403s are only counted."""

_GROUP = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""An API group: a DNS subdomain (``batch``, ``jobset.x-k8s.io``)."""
_VERSION = re.compile(r"v[0-9]+((alpha|beta)[0-9]+)?|[a-z0-9]{1,63}")
"""An API version (``v1``, ``v1alpha2``, or another lower-case token)."""
_SEGMENT = re.compile(r"[^/%\s]{1,253}")
"""A kind or object name as one path segment: names of every resource are at most 253
characters and never hold ``/`` or ``%`` (the API refuses them), nor are ``.`` or ``..``."""

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Lru(Generic[K, V]):
    """A map of at most ``capacity`` entries, each with an expiry time (the clock's seconds); the
    least recently used entry is dropped first, an expired one when read."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K, now: float) -> V | None:
        """The value of ``key`` if present and not expired at ``now``."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= now:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, key: K, value: V, expires: float) -> None:
        """Remember ``value`` until ``expires``, dropping the least recently used past capacity."""
        self._entries[key] = (expires, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)


class _Bucket:
    """A token bucket: ``rate`` tokens a second up to ``burst``, spent by ``take``."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.level = burst
        self._at = now

    def refill(self, now: float) -> float:
        """The tokens available at ``now``."""
        self.level = min(self.burst, self.level + max(0.0, now - self._at) * self.rate)
        self._at = max(self._at, now)
        return self.level

    def take(self, amount: float, now: float) -> None:
        """Spend ``amount`` (the level may go below zero: a debt paid back before the next take)."""
        self.refill(now)
        self.level -= amount


@dataclass(frozen=True)
class Ref:
    """One owner reference, parsed: ``group`` is ``""`` for the core API; ``uid`` ``""`` when not
    known (the Deployment named from a ReplicaSet's name)."""

    group: str
    version: str
    kind: str
    name: str
    uid: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def identity(self) -> tuple[str, str, str]:
        """What tells two objects of one namespace apart (the version does not)."""
        return self.group, self.kind, self.name


@dataclass(frozen=True)
class Owner:
    """The answer of a walk: the top ``kind`` and ``name`` found, and how the walk ended
    (``OUTCOMES``)."""

    kind: str
    name: str
    outcome: str

    @property
    def complete(self) -> bool:
        """Whether the walk reached the top; otherwise the caller may ask again later."""
        return self.outcome == "resolved"


class _Stop(Exception):
    """A walk ends at the owner in hand, for ``outcome``."""

    def __init__(self, outcome: str, why: str) -> None:
        super().__init__(why)
        self.outcome = outcome


def parse_ref(raw: Mapping[str, Any]) -> Ref | None:
    """An owner reference as the API writes it (``apiVersion``, ``kind``, ``name``, ``uid``);
    ``None`` if a field is missing or could not form a request path."""
    api_version, kind, name, uid = (raw.get(k) for k in ("apiVersion", "kind", "name", "uid"))
    if not all(isinstance(v, str) for v in (api_version, kind, name)):
        return None
    assert isinstance(api_version, str) and isinstance(kind, str) and isinstance(name, str)
    group, _, version = api_version.rpartition("/")
    if (group and not _GROUP.fullmatch(group)) or not _VERSION.fullmatch(version):
        return None
    if not _SEGMENT.fullmatch(kind) or not _SEGMENT.fullmatch(name) or name in (".", ".."):
        return None
    if not is_clean(kind) or not is_clean(name):  # not UTF-8 (a lone surrogate): no API path names it
        return None
    return Ref(group, version, kind, name, uid if isinstance(uid, str) else "")


def controller_ref(metadata: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference of ``metadata`` marked ``controller: true``, else ``None``."""
    refs = metadata.get("ownerReferences")
    if not isinstance(refs, list):
        return None
    return next((r for r in refs if isinstance(r, Mapping) and r.get("controller") is True), None)


def deployment_shortcut(ref: Mapping[str, Any], labels: Mapping[str, Any]) -> Mapping[str, Any]:
    """``ref`` itself, or for a ReplicaSet named ``<x>-<pod-template-hash>`` (the pod's label)
    the reference of the Deployment ``<x>`` (apps/v1, UID unknown): read from names, no request."""
    name, template_hash = ref.get("name"), labels.get("pod-template-hash")
    if ref.get("kind") != "ReplicaSet" or not isinstance(name, str) or not isinstance(template_hash, str):
        return ref
    if not template_hash or not name.endswith("-" + template_hash) or len(name) <= len(template_hash) + 1:
        return ref
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": name[: -len(template_hash) - 1]}


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


def discovery_path(group: str, version: str) -> str:
    """Where the API lists the resources of a group-version (no RBAC needed: every
    authenticated user may read discovery, through the ``system:discovery`` role)."""
    if not group:
        return f"/api/{_quote(version)}"
    return f"/apis/{_quote(group)}/{_quote(version)}"


def object_path(ref: Ref, namespace: str, plural: str) -> str:
    """Where the API serves the namespaced object ``ref`` of resource ``plural``."""
    if not ref.group:
        return f"/api/{_quote(ref.version)}/namespaces/{_quote(namespace)}/{_quote(plural)}/{_quote(ref.name)}"
    return (
        f"/apis/{_quote(ref.group)}/{_quote(ref.version)}/namespaces/{_quote(namespace)}"
        f"/{_quote(plural)}/{_quote(ref.name)}"
    )


_Resources = dict[str, tuple[str, bool]]
"""A group-version's kinds: kind -> (resource name, namespaced)."""


class OwnerResolver:
    """Finds the top owner of an object through the API, with caches and bounds (module docstring).

    Every bound is a parameter (defaults argued where defined); ``clock`` is ``time.monotonic``
    (seconds) unless a test gives another.
    """

    def __init__(
        self,
        *,
        max_depth: int = MAX_DEPTH,
        max_owner_bytes: int = MAX_OWNER_BYTES,
        cache_entries: int = CACHE_ENTRIES,
        discovery_entries: int = DISCOVERY_ENTRIES,
        positive_ttl: float = POSITIVE_TTL_SECONDS,
        error_ttl: float = ERROR_TTL_SECONDS,
        requests_per_second: float = REQUESTS_PER_SECOND,
        request_burst: int = REQUEST_BURST,
        get_timeout: float = GET_TIMEOUT_SECONDS,
        walk_seconds: float = WALK_SECONDS,
        time_share: float = TIME_SHARE,
        time_burst: float = TIME_BURST_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_depth = max_depth
        self.max_owner_bytes = max_owner_bytes
        self.positive_ttl = positive_ttl
        self.error_ttl = error_ttl
        self.get_timeout = get_timeout
        self.walk_seconds = walk_seconds
        self._clock = clock
        now = clock()
        self._requests = _Bucket(requests_per_second, request_burst, now)
        self._time = _Bucket(time_share, time_burst, now)
        self._answers: _Lru[tuple[str, str, str, str, str], Owner] = _Lru(cache_entries)
        self._discovery: _Lru[tuple[str, str], _Resources | tuple[str, str]] = _Lru(discovery_entries)
        """Group-version -> its kinds, or (outcome, why) of a failed discovery."""
        self._forbidden: _Lru[tuple[str, str, str], str] = _Lru(cache_entries)
        """(namespace, group, resource) -> the 403's message, for ``error_ttl``."""
        self._logged: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(OUTCOMES, 0)
        self._counts.update(requests=0, cache_hits=0)

    # --- what callers read ---------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Walks by outcome (``OUTCOMES``), ``requests`` sent (owner reads and discovery) and
        ``cache_hits`` (walks answered from the cache without a request), since the start;
        ``cached`` is the number of answers held now."""
        with self._lock:
            return {**self._counts, "cached": len(self._answers)}

    def top(self, api: KubeClient, namespace: str, raw_ref: Mapping[str, Any]) -> Owner:
        """The top owner above (and including) the object ``raw_ref`` names in ``namespace``."""
        ref = parse_ref(raw_ref) if isinstance(namespace, str) and is_clean(namespace) else None
        if ref is None:
            self._count("error")
            return Owner(str(raw_ref.get("kind") or ""), str(raw_ref.get("name") or ""), "error")
        now = self._clock()
        deadline = now + self.walk_seconds
        walked: list[Ref] = []
        seen: set[tuple[str, str, str]] = set()
        current = ref
        while True:
            hit = self._answers.get(self._key(namespace, current), now)
            if hit is not None:
                self._count("cache_hits" if not walked else hit.outcome)
                self._remember(namespace, walked, hit)
                return hit
            seen.add(current.identity)
            if len(walked) >= self.max_depth:
                outcome, why = "error", f"deeper than {self.max_depth} owners"
                break
            try:
                parent = self._parent(api, namespace, current, deadline)
            except _Stop as stop:
                outcome, why = stop.outcome, str(stop)
                break
            walked.append(current)
            if parent is None:
                outcome, why = "resolved", ""
                break
            if parent.identity in seen:
                outcome, why = "error", f"owner loop at {parent.kind}/{parent.name}"
                break
            current = parent
            now = self._clock()
        answer = Owner(current.kind, current.name, outcome)
        self._count(outcome)
        if why and outcome != "limited":
            where = f"{namespace}/{ref.kind}/{ref.name}"
            log.debug("owner chain of %s stops at %s/%s: %s", where, current.kind, current.name, why)
        if outcome != "limited":  # a limited walk is not a fact about the cluster: not kept
            self._remember(namespace, [*walked, current], answer)
        return answer

    # --- one step ------------------------------------------------------------------------------

    def _parent(self, api: KubeClient, namespace: str, ref: Ref, deadline: float) -> Ref | None:
        """The controller of ``ref``'s object (``None``: it has none, or is cluster-scoped), or
        ``_Stop`` saying why the walk ends here."""
        resources, fetched = self._resources(api, ref, deadline)
        if ref.kind not in resources and not fetched:  # a list from before the kind's CRD was installed?
            resources, _ = self._resources(api, ref, deadline, again=True)
        found = resources.get(ref.kind)
        if found is None:
            raise _Stop("not_found", f"{ref.api_version} serves no kind {ref.kind}")
        plural, namespaced = found
        if not namespaced:
            return None  # a cluster-scoped owner ends the chain: the role grants no cluster-scoped read
        now = self._clock()
        denied = self._forbidden.get((namespace, ref.group, plural), now)
        if denied is not None:
            raise _Stop("forbidden", denied)
        metadata = self._read_metadata(api, object_path(ref, namespace, plural), deadline, (namespace, ref, plural))
        uid = metadata.get("uid")
        if ref.uid and uid != ref.uid:
            raise _Stop("not_found", f"{ref.kind}/{ref.name} is another object now (UID {uid!r}, not {ref.uid!r})")
        raw = controller_ref(metadata)
        if raw is None:
            return None
        parent = parse_ref(raw)
        if parent is None:
            raise _Stop("error", f"{ref.kind}/{ref.name} has an unusable controller reference")
        return parent

    def _resources(self, api: KubeClient, ref: Ref, deadline: float, again: bool = False) -> tuple[_Resources, bool]:
        """The kinds of ``ref``'s group-version, from the cache or (always when ``again``) a
        discovery request, and whether they were just requested.  A kind missing from a cached
        list costs one more discovery request per walk (walks of one owner are an answer TTL
        apart), so a CRD installed after the list was cached is found at once."""
        key = (ref.group, ref.version)
        now = self._clock()
        known = None if again else self._discovery.get(key, now)
        if isinstance(known, tuple):
            raise _Stop(*known)
        if known is not None:
            return known, False
        try:
            path = discovery_path(ref.group, ref.version)
            doc = self._get_json(api, path, deadline, MAX_DISCOVERY_BYTES, JSON, "discovery reply")
            resources: _Resources = {}
            for item in doc.get("resources") or []:
                if not isinstance(item, Mapping):
                    continue
                name, kind = item.get("name"), item.get("kind")
                if isinstance(name, str) and isinstance(kind, str) and "/" not in name and kind not in resources:
                    resources[kind] = (name, item.get("namespaced") is not False)
        except _Stop as stop:
            if stop.outcome != "limited":
                self._discovery.put(key, (stop.outcome, str(stop)), now + self.error_ttl)
            raise
        self._discovery.put(key, resources, now + self.positive_ttl)
        return resources, True

    def _read_metadata(
        self, api: KubeClient, path: str, deadline: float, what: tuple[str, Ref, str]
    ) -> Mapping[str, Any]:
        """The ``metadata`` of the object at ``path``; ``_Stop`` on any failure (a 403 is also
        remembered for its namespace and resource)."""
        namespace, ref, plural = what
        try:
            doc = self._get_json(api, path, deadline, self.max_owner_bytes, METADATA_ACCEPT, "owner reply")
        except _Stop as stop:
            if stop.outcome == "forbidden":
                self._forbidden.put((namespace, ref.group, plural), str(stop), self._clock() + self.error_ttl)
                self._log_forbidden(ref.group, plural, str(stop))
            raise
        metadata = doc.get("metadata")
        if not isinstance(metadata, Mapping):
            raise _Stop("error", f"{ref.kind}/{ref.name}: the reply has no metadata")
        return metadata

    def _get_json(
        self, api: KubeClient, path: str, deadline: float, cap: int, accept: str, what: str
    ) -> Mapping[str, Any]:
        """GET ``path`` within the bounds and decode it; ``_Stop`` with the outcome on failure.
        Owner reads (metadata ``accept``) are served from the API server's cache
        (``resourceVersion=0``); discovery is a plain GET."""
        now = self._clock()
        seconds = min(self.get_timeout, deadline - now, self._time.refill(now))
        if seconds < MIN_GET_SECONDS:
            raise _Stop("limited", "the walk's time or the time share is spent")
        if self._requests.refill(now) < 1:
            raise _Stop("limited", f"more than {self._requests.rate:g} requests a second")
        self._requests.take(1, now)
        self._count("requests")
        query = {"resourceVersion": "0"} if accept == METADATA_ACCEPT else None
        try:
            resp = api.get(path, query, connect_timeout=seconds, read_timeout=seconds, accept=accept)
            whole = False
            try:
                body = read_capped(resp, cap, seconds, what)
                whole = True
            finally:
                resp.release(whole)
            doc = json.loads(body)
        except ApiError as exc:
            outcome = {403: "forbidden", 404: "not_found"}.get(exc.status, "error")
            raise _Stop(outcome, str(exc)) from None
        except (OSError, http.client.HTTPException, BoundExceeded, ValueError) as exc:
            raise _Stop("error", f"{type(exc).__name__}: {exc}") from None
        finally:
            after = self._clock()
            self._time.take(after - now, after)
        if not isinstance(doc, Mapping):
            raise _Stop("error", "the reply is not a JSON object")
        return doc

    # --- bookkeeping ---------------------------------------------------------------------------

    @staticmethod
    def _key(namespace: str, ref: Ref) -> tuple[str, str, str, str, str]:
        """The cache key of ``ref``: its UID too, so an object deleted and made again under the
        same name is not taken for the old one."""
        return namespace, ref.group, ref.kind, ref.name, ref.uid

    def _remember(self, namespace: str, refs: list[Ref], answer: Owner) -> None:
        """Keep ``answer`` for each of ``refs`` (the objects walked through to it)."""
        expires = self._clock() + (self.positive_ttl if answer.complete else self.error_ttl)
        for ref in refs:
            self._answers.put(self._key(namespace, ref), answer, expires)

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def _log_forbidden(self, group: str, plural: str, message: str) -> None:
        key = (group, plural)
        if key in self._logged or len(self._logged) >= _FORBIDDEN_LOGGED:
            return
        self._logged.add(key)
        resource = f"{plural}.{group}" if group else plural
        log.info(
            "no RBAC to get %s: pods it owns are grouped under it, not under its owners "
            "(grant get on it, e.g. the chart's rbac.extraOwnerResources): %s",
            resource,
            message[:200],
        )
