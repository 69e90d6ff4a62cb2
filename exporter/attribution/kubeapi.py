"""Pod metadata of this node from the Kubernetes API: a node-scoped list + watch in a thread.

Gives pod UID, phase, owner workload and container IDs for the pods on ``spec.nodeName``.
Requests go through ``kube_http`` (the standard library: in-cluster or kubeconfig configuration,
auth, TLS, GET) and the list and the watch stream are read as raw JSON: the official client's
imports alone cost tens of MB (docs/benchmarks.md, "Figures moved out of docstrings"), and its
``V1Pod`` models far more than the dicts we need (docs/design.md).  Least privilege: ``pods``
list + watch; with the owner chain on
(``--kubernetes.owner-chain``, ``owners.py``) also ``get`` on the owners' resources, so that a
pod's workload is the top of its owner chain (the JobSet above a Job, the CronJob above a Job,
the LeaderWorkerSet above its StatefulSets; see docs/attribution.md).  Deployments are named from
the ReplicaSet name and the pod's ``pod-template-hash`` label, with no request.

The list + watch loop, its backoff and its bounds (``ApiBounds``: event line bytes and stall
time, list page size, bytes, count and time) are ``kube_watch.NodeWatch``'s, shared with the
ResourceSlice source; this module keeps what is pod-specific: ``PodMeta`` from a pod object, the
owner chain, and the passes that complete the walks that stopped short (``_settle``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from exporter.attribution import stages
from exporter.attribution.kube_http import ApiResponse, BoundExceeded, KubeClient, Query, load_endpoint
from exporter.attribution.kube_watch import (
    LINE_STALL_SECONDS,
    LIST_PAGE_LIMIT,
    LIST_PAGE_SECONDS,
    MAX_EVENT_BYTES,
    MAX_LIST_PAGE_BYTES,
    MAX_LIST_PAGES,
    ApiBounds,
    LineReader,
    NodeWatch,
)
from exporter.attribution.merge import PodDirectory, PodMeta
from exporter.attribution.owners import Owner, OwnerResolver, deployment_shortcut
from exporter.label_values import label_value_or_none

__all__ = [
    "LINE_STALL_SECONDS",
    "LIST_PAGE_LIMIT",
    "LIST_PAGE_SECONDS",
    "MAX_EVENT_BYTES",
    "MAX_LIST_PAGES",
    "MAX_LIST_PAGE_BYTES",
    "PODS_PATH",
    "SETTLE_SECONDS",
    "STAGE",
    "ApiBounds",
    "BoundExceeded",
    "KubePodSource",
    "LineReader",
    "controller_reference",
    "owner_of",
    "pod_meta",
    "workload_of",
]

log = logging.getLogger(__name__)

STAGE = stages.KUBE_API
PODS_PATH = "/api/v1/pods"

SETTLE_SECONDS = 10.0
"""Shortest time between two passes over the pods whose owner walk stopped short, seconds: the
kubelet refresh period, so a label completed later is no older than other attribution data.  A
pass costs nothing while the resolver's answers for them are cached (1 min after a failure)."""


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
        return workload_of(owner)
    return label_value_or_none(ref.get("kind")), label_value_or_none(ref.get("name"))


def workload_of(owner: Owner) -> tuple[str | None, str | None]:
    """(workload_kind, workload) of a walk's answer, as label values (exporter/label_values.py)."""
    return label_value_or_none(owner.kind), label_value_or_none(owner.name)


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
            name = label_value_or_none(cs.get("name"))
            if cid and name:
                containers[cid] = name
    kind, workload = owner_of(pod, resolve)
    return PodMeta(
        uid=uid,
        namespace=label_value_or_none(meta.get("namespace")) or "",
        name=label_value_or_none(meta.get("name")) or "",
        phase=status.get("phase"),
        workload_kind=kind,
        workload=workload,
        containers=MappingProxyType(containers),
    )


Unsettled = dict[str, tuple[str, Mapping[str, Any]]]
"""Pods whose owner walk stopped short, by UID: their namespace and controller reference."""


@dataclass
class _PodBatch:
    """What a list collects: the pods by UID and those whose owner walk stopped short."""

    pods: dict[str, PodMeta] = field(default_factory=dict)
    unsettled: Unsettled = field(default_factory=dict)


class KubePodSource(NodeWatch[PodDirectory, _PodBatch]):
    """Keeps this node's pods up to date from a list + watch loop in a daemon thread.

    On any error the source reports failure (its data is withheld: ``latest()`` gives ``None``),
    waits with exponential backoff and jitter, and lists again; a watch that ends normally or
    expires (410 Gone) is resumed or re-listed without counting as a failure (``NodeWatch``).
    """

    noun: ClassVar[str] = "pod"
    stage: ClassVar[str] = STAGE
    thread_name: ClassVar[str] = "gpulens-kube-api"
    rbac_hint: ClassVar[str] = "RBAC: the service account needs pods list+watch"
    log: ClassVar[logging.Logger] = log

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
        super().__init__(
            api_client_factory, node_name, watch_timeout_seconds, backoff_initial_seconds, backoff_max_seconds, bounds
        )
        self.owners: OwnerResolver | None = (owners or OwnerResolver()) if owner_chain else None
        """Follows each pod's owner chain to its top (``--kubernetes.owner-chain``); ``None``: the
        pod's own controller names its workload.  Its ``stats()`` count the walks by outcome."""
        self._unsettled: Unsettled = {}
        """Pods whose owner walk stopped short (a bound, an error, a 403 or 404), by UID: their
        namespace and controller reference, walked again by ``_settle`` (at most one entry per
        pod of the node; dropped with the pod)."""
        self._settled_at = float("-inf")
        self._pods: dict[str, PodMeta] = {}
        if start:
            self.start()

    @classmethod
    def in_cluster(cls, node_name: str, owner_chain: bool = True) -> KubePodSource:
        """Service-account credentials in a pod, else the local kubeconfig (for development); the
        configuration is read again after each failure (a configuration error fails the stage).
        ``owner_chain``: follow owners above the pod's controller (``--kubernetes.owner-chain``)."""
        return cls(lambda: KubeClient(load_endpoint()), node_name, owner_chain=owner_chain)

    def list_pod_for_all_namespaces(self, api: KubeClient, query: Query, read_timeout: float = 30) -> ApiResponse:
        """GET the node's pods with ``query`` (a list page, or a watch with ``watch``), the body
        unread.  Named after the API operation it calls, which is what the RBAC role must allow
        (pods ``list`` and ``watch``; tests/test_deploy_chart.py checks the requests sent against the role)."""
        selector = {"fieldSelector": f"spec.nodeName={self.node_name}"}
        return api.get(PODS_PATH, {**selector, **query}, read_timeout=read_timeout)

    # --- the table (NodeWatch's hooks) ---------------------------------------------------------

    def _request(self, api: KubeClient, query: Query, read_timeout: float) -> ApiResponse:
        return self.list_pod_for_all_namespaces(api, query, read_timeout)

    def _new_batch(self) -> _PodBatch:
        return _PodBatch()

    def _add_to_batch(self, api: KubeClient, batch: _PodBatch, item: Mapping[str, Any]) -> None:
        meta = self._pod_meta(api, item, batch.unsettled)
        if meta is not None:
            batch.pods[meta.uid] = meta

    def _install(self, batch: _PodBatch) -> bool:
        self._unsettled = batch.unsettled
        self._settled_at = time.monotonic()
        self._pods = batch.pods
        return True

    def _apply(self, api: KubeClient, kind: str, obj: Mapping[str, Any]) -> None:
        if kind in ("ADDED", "MODIFIED"):
            self._check_room(obj)
            meta = self._pod_meta(api, obj, self._unsettled)
            if meta is not None:
                with self._lock:
                    # Most updates (probes, restarts, conditions) change nothing the table holds:
                    # the view, and what callers cached on it, stay as they are.
                    if self._pods.get(meta.uid) != meta:
                        self._pods[meta.uid] = meta
                        self._version += 1
        elif kind == "DELETED":
            uid = str((obj.get("metadata") or {}).get("uid"))
            self._unsettled.pop(uid, None)
            with self._lock:
                if self._pods.pop(uid, None) is not None:
                    self._version += 1

    def _check_room(self, obj: Mapping[str, Any]) -> None:
        """Raise ``BoundExceeded`` before a watch event adds a pod past what a list may hold
        (``max_pages`` pages of ``page_limit``, 10,000 pods by default): the table is as bounded
        when it grows by events as when it is listed, and the walk of the new pod's owners is
        not made.  The stage fails, and the list that follows fails at its page bound while the
        node holds that many pods."""
        most = self.bounds.max_pages * self.bounds.page_limit
        uid = (obj.get("metadata") or {}).get("uid")
        with self._lock:
            full = len(self._pods) >= most and uid not in self._pods
        if full:
            raise BoundExceeded(f"a watch event adds a {self.noun} past the {most} a list may hold")

    def _after_event(self, api: KubeClient) -> None:
        self._settle(api)

    def _view(self) -> PodDirectory:
        return PodDirectory.of(self._pods.values())

    def _summary(self) -> str:
        return f"{len(self._pods)} pods"

    def _size(self) -> int:
        return len(self._pods)

    # --- the owner chain ------------------------------------------------------------------------

    def _pod_meta(self, api: KubeClient, raw: Mapping[str, Any], unsettled: Unsettled) -> PodMeta | None:
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
            kind, workload = workload_of(owner)
            if (kind, workload) != (meta.workload_kind, meta.workload):
                with self._lock:
                    if self._pods.get(uid) is meta:
                        self._pods[uid] = dataclasses.replace(meta, workload_kind=kind, workload=workload)
                        self._version += 1
            if owner.outcome == "limited":
                break
