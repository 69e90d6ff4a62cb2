"""Resident memory of an exporter process: what its imports, start-up and attribution chain cost.

    .venv/bin/python -m bench.exporter_rss                                   # --chain none,kubelet
    .venv/bin/python -m bench.exporter_rss --chain none,full --pods 110,250 --seconds 30 --bytecode image,compiled

``python -m exporter`` is started on a free loopback port for each configuration, ``/readyz``
is awaited, ``/metrics`` is scraped once a second for ``--seconds`` (the settle time), then the
process' RSS and its peak since start (``VmHWM``) are read and it is stopped; ``--runs`` times
each, medians reported.  ``--source DIR`` runs the exporter of another source tree (an exported
older commit) with the same interpreter, for a before/after comparison in one run.

Chains (``--chain``, comma-separated):

- ``none``: ``--backend sim --no-probes``, the simulator's own in-process attribution (no
  kubelet, API or procfs reads);
- ``kubelet``: the same with a kubelet socket that does not exist (the client is loaded, its
  stage fails, as on a node whose kubelet is down);
- ``full``: the chart's attribution chain against fakes started here, once per ``--pods``: a
  real gRPC kubelet (``tests/fakes/kubelet_server.py``) listing every pod, the sim's GPU holders
  with their GPUs; the API emulator (``tests/fakes/kube_api_server.py``, reached through a
  kubeconfig) with the same pods as realistic objects of about ``--pod-bytes`` each (labels,
  owner references, managed fields, container statuses) and one pod update a second on the
  watch; and a procfs folder whose ``<pid>/cgroup`` files put the simulator's GPU processes in
  their pods' containers (what ``hostPID`` gives).  All three stages must read 1 at the end,
  else the run fails.  The chart's own flags that cost nothing here (``--log.format json``) are
  left out so that the rows differ only in the chain; probes are off, as in the chart's
  ``exporter.resources`` (probes on raise the limits to the probe child's).  Unlike a pod, which
  uses its service account, the exporter reads a kubeconfig here and so imports PyYAML.

``--bytecode`` (``BYTECODE_MODES``) chooses which compiled modules the exporter finds; ``image``
is how the exporter image runs it.  Prints one JSON line per configuration, source and bytecode
mode, then a Markdown table and the commands.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from exporter.attribution import stages as stage_names
from tests.support.exposition_labels import stage_success, unresolved_walks
from tests.support.procfs import cgroup_line
from tests.support.procstat import cpu_seconds, rss_bytes

if TYPE_CHECKING:
    from tests.fakes.kube_api_server import KubeApiEmulator

HOST = "127.0.0.1"
MiB = 2**20
NODE = "gpu-node-1"
"""The node the exporter says it runs on (``--kubernetes.node-name``); every pod is on it."""
GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_PODS = 110
"""The kubelet's default ``maxPods``."""
DEFAULT_POD_BYTES = 10 * 1024
"""Size of one pod object as the API server sends it (compact JSON), bytes: a typical pod with
its ``managedFields`` is 8-20 KiB."""

CONFIGS: dict[str, tuple[str, ...]] = {
    "sim, no probes": ("--backend", "sim", "--no-probes"),
    "sim, no probes, kubelet socket": (
        "--backend",
        "sim",
        "--no-probes",
        "--kubernetes.podresources-socket",
        "/nonexistent/pod-resources/kubelet.sock",
    ),
}
"""Label -> exporter flags of the chains ``none`` and ``kubelet``.  The socket need not exist: the
kubelet source is built (and its client loaded) and its stage fails, as on a node whose kubelet
is down."""
CHAIN_CONFIGS = {"none": "sim, no probes", "kubelet": "sim, no probes, kubelet socket"}
"""``--chain`` name -> label in ``CONFIGS``; ``full`` is built per run (``full_chain``)."""
FULL_LABEL = "sim, no probes, full chain"
CHAIN_STAGES = (stage_names.PODRESOURCES, stage_names.KUBE_API, stage_names.CGROUP)
"""The attribution stages of the full chain (``gpulens_stage_success``)."""
NEWER_STAGES = (stage_names.RESOURCE_SLICES,)
"""Chain stages an older source tree (``--source``) may not have: checked and shown where present."""
NO_IN_CLUSTER = {"NODE_NAME": "", "GPULENS_KUBERNETES_NODE_NAME": "", "KUBERNETES_SERVICE_HOST": ""}
"""Environment that keeps the exporter from taking this machine for a pod (the kubeconfig is used)."""

FAKES_HELP = (
    "the full chain runs the test fakes in this process: tests/fakes/kubelet_server.py needs grpcio, "
    "protobuf and h2 (with hpack and hyperframe), tests/fakes/kube_api_server.py only the standard "
    "library, and the exporter itself needs h11 and h2 (PyYAML to read the kubeconfig): install the "
    "wheels (`pip install --target SITE .whl/*.whl`) and run with PYTHONPATH=SITE:$PWD"
)


# --- the node: its pods as the kubelet, the API server and /proc show them ---------------------


@dataclass(frozen=True)
class NodePod:
    """One pod of the simulated node.

    ``owner`` is the controller reference as the API shows it (kind, name): a Deployment's pod
    is owned by its ReplicaSet ``<deployment>-<template_hash>``; ``cronjob`` names the CronJob
    that owns the pod's Job.  ``devices`` maps a container to the ``nvidia.com/gpu`` device IDs
    the kubelet allocated to it.
    """

    namespace: str
    name: str
    uid: str
    owner: tuple[str, str] | None
    containers: tuple[str, ...]
    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    template_hash: str | None = None
    cronjob: str | None = None
    app: str = ""
    """The workload's name (``app.kubernetes.io/name``)."""


@dataclass(frozen=True)
class NodePlan:
    """Everything the fakes serve: the pods, the GPU device IDs the kubelet can allocate, and
    host PID -> (pod UID, container name) for the procfs folder."""

    pods: tuple[NodePod, ...]
    allocatable: tuple[str, ...]
    pids: Mapping[int, tuple[str, str]]


def container_id(pod_uid: str, container: str) -> str:
    """A container runtime ID (64 hex digits) derived from the pod and container name."""
    return hashlib.sha256(f"{pod_uid}/{container}".encode()).hexdigest()


def _uid(namespace: str, name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"https://gpulens.invalid/bench/pod/{namespace}/{name}"))


_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet Kubernetes uses for generated names


def _suffix(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_NAME_CHARS) for _ in range(n))


def _owned(rng: random.Random, namespace: str, kind: str, workload: str, ordinal: int) -> dict[str, Any]:
    """Name, owner, template hash and CronJob of a ``kind`` pod of ``workload``, as its
    controller names it."""
    if kind == "Deployment":
        template_hash = _suffix(rng, 10)
        return {
            "name": f"{workload}-{template_hash}-{_suffix(rng, 5)}",
            "owner": ("ReplicaSet", f"{workload}-{template_hash}"),
            "template_hash": template_hash,
        }
    if kind == "StatefulSet":
        return {"name": f"{workload}-{ordinal}", "owner": ("StatefulSet", workload)}
    if kind == "CronJob":
        job = f"{workload}-{29_410_000 + rng.randrange(90_000)}"
        return {"name": f"{job}-{_suffix(rng, 5)}", "owner": ("Job", job), "cronjob": workload}
    return {"name": f"{workload}-{_suffix(rng, 5)}", "owner": (kind, workload)}


_DAEMONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("kube-system", "kube-proxy", ("kube-proxy",)),
    ("kube-system", "cilium", ("cilium-agent",)),
    ("kube-system", "ebs-csi-node", ("ebs-plugin", "node-driver-registrar", "liveness-probe")),
    ("monitoring", "node-exporter", ("node-exporter",)),
    ("logging", "fluent-bit", ("fluent-bit",)),
    ("gpu-operator", "nvidia-device-plugin-daemonset", ("nvidia-device-plugin",)),
    ("gpu-operator", "gpu-feature-discovery", ("gpu-feature-discovery", "toolkit-validation")),
    ("gpulens", "gpulens-exporter", ("exporter",)),
)
"""The DaemonSets of a GPU node: one pod each."""
_WORKLOAD_NAMESPACES = ("inference", "ml-training", "research", "notebooks", "data", "web", "batch")
_WORDS = ("feature", "embed", "rank", "ingest", "score", "etl", "api", "cache", "queue", "search", "audit", "sync")
_KINDS = ("Deployment", "Deployment", "Deployment", "StatefulSet", "Job", "CronJob")
"""Controller kinds of the CPU pods, weighted as on a shared node."""


def filler_pods(count: int, seed: str = "gpulens-bench/node") -> list[NodePod]:
    """``count`` pods without GPUs: the node's DaemonSets first, then Deployment, StatefulSet,
    Job and CronJob pods across a few namespaces, one or two containers each (deterministic)."""
    rng = random.Random(seed)
    pods: list[NodePod] = []
    for namespace, workload, containers in _DAEMONS[:count]:
        owned = _owned(rng, namespace, "DaemonSet", workload, 0)
        pods.append(
            NodePod(namespace, owned["name"], _uid(namespace, owned["name"]), owned["owner"], containers, app=workload)
        )
    ordinals: dict[tuple[str, str], int] = {}
    taken = {(p.namespace, p.name) for p in pods}
    while len(pods) < count:
        namespace = rng.choice(_WORKLOAD_NAMESPACES)
        workload = f"{rng.choice(_WORDS)}-{rng.choice(_WORDS)}"
        kind = rng.choice(_KINDS)
        ordinal = ordinals.get((namespace, workload), 0)
        ordinals[(namespace, workload)] = ordinal + 1
        owned = _owned(rng, namespace, kind, workload, ordinal)
        if (namespace, owned["name"]) in taken:
            continue
        taken.add((namespace, owned["name"]))
        containers = ("main", "sidecar") if rng.random() < 0.3 else ("main",)
        pods.append(
            NodePod(
                namespace,
                owned["name"],
                _uid(namespace, owned["name"]),
                owned["owner"],
                containers,
                template_hash=owned.get("template_hash"),
                cronjob=owned.get("cronjob"),
                app=workload,
            )
        )
    return pods


def sim_plan(total_pods: int, scenario: str = "h200x8") -> NodePlan:
    """The simulated node ``scenario`` (what ``--backend sim --sim.scenario`` plays) with
    ``total_pods`` pods: the sim's pods hold its GPUs, with its UIDs, and its GPU processes run in
    them; the rest are ``filler_pods``."""
    from exporter.sim import scenarios

    sim = scenarios.build(scenario)
    devices: dict[str, dict[str, tuple[str, ...]]] = {}
    for d in sim.pod_devices:
        if d.pod_uid is not None:
            devices.setdefault(d.pod_uid, {})[d.container] = d.device_ids
    holders = []
    for meta in sim.pods:
        containers = tuple(devices.get(meta.uid, {})) or ("main",)
        owner, template_hash, cronjob = _sim_owner(meta.name, meta.workload_kind, meta.workload)
        holders.append(
            NodePod(
                meta.namespace,
                meta.name,
                meta.uid,
                owner,
                containers,
                devices.get(meta.uid, {}),
                template_hash,
                cronjob,
                app=meta.workload or meta.name,
            )
        )
    pids = {pid: (o.pod_uid, o.container or "main") for pid, o in sim.pid_owners.items()}
    uuids = tuple(g.uuid for g in sim.gpus)
    return NodePlan(tuple(holders + filler_pods(max(0, total_pods - len(holders)))), uuids, pids)


def _sim_owner(
    name: str, kind: str | None, workload: str | None
) -> tuple[tuple[str, str] | None, str | None, str | None]:
    """(controller reference, pod-template-hash, CronJob) of a simulated pod, from its name as
    its controller made it (``exporter/sim/scenarios.py``, ``_NodeBuilder.pod``)."""
    if kind is None or workload is None:
        return None, None, None
    if kind == "Deployment":
        replica_set = name.rsplit("-", 1)[0]
        return ("ReplicaSet", replica_set), replica_set.rsplit("-", 1)[1], None
    if kind == "CronJob":
        return ("Job", name.rsplit("-", 1)[0]), None, workload
    return (kind, workload), None, None


def shared_gpu_plan(total_pods: int, uuids: Sequence[str], pids: Sequence[int]) -> NodePlan:
    """A node whose GPUs ``uuids`` are time-sliced between two pods (device IDs ``<uuid>::0`` and
    ``<uuid>::1``), a training StatefulSet pod and an inference Deployment pod, whose first
    container runs ``pids``; the rest are ``filler_pods``."""
    rng = random.Random("gpulens-bench/shared")
    holders = []
    for replica, (namespace, kind, workload, container) in enumerate(
        (("ml-training", "StatefulSet", "train", "trainer"), ("inference", "Deployment", "llm-decode", "vllm"))
    ):
        owned = _owned(rng, namespace, kind, workload, 0)
        ids = tuple(f"{u}::{replica}" for u in uuids)
        holders.append(
            NodePod(
                namespace,
                owned["name"],
                _uid(namespace, owned["name"]),
                owned["owner"],
                (container,),
                {container: ids},
                owned.get("template_hash"),
                app=workload,
            )
        )
    allocatable = tuple(f"{u}::{r}" for u in uuids for r in range(2))
    owner = (holders[0].uid, holders[0].containers[0])
    return NodePlan(tuple(holders + filler_pods(max(0, total_pods - 2))), allocatable, dict.fromkeys(pids, owner))


# --- pod objects as the API server sends them ----------------------------------------------------

_STARTED = "2026-11-28T09:14:07Z"


def _fields_v1(obj: Any) -> Any:
    """The ``fieldsV1`` form of a managed object: ``f:<key>`` per field, ``k:{"name":...}`` per
    item of a list keyed by name, ``{}`` for a leaf (what server-side apply records)."""
    if isinstance(obj, dict):
        return {f"f:{k}": _fields_v1(v) for k, v in obj.items()}
    if isinstance(obj, list) and obj and all(isinstance(i, dict) and "name" in i for i in obj):
        return {'k:{"name":"%s"}' % i["name"]: {".": {}, **_fields_v1(i)} for i in obj}  # noqa: UP031
    return {}


def _container_spec(p: NodePod, name: str, env_count: int) -> dict[str, Any]:
    gpus = len(p.devices.get(name, ()))
    limits = {"cpu": "4", "memory": "16Gi", **({GPU_RESOURCE: str(gpus)} if gpus else {})}
    return {
        "name": name,
        "image": f"registry.example.com/{p.namespace}/{p.app}:v1.{len(p.app)}.3",
        "imagePullPolicy": "IfNotPresent",
        "args": ["--config=/etc/app/config.yaml", "--log-format=json", f"--name={p.app}"],
        "env": [
            {"name": f"APP_SETTING_{i:02d}", "value": f"{p.app}-value-{i:02d}-{'x' * (i % 7)}"}
            for i in range(env_count)
        ],
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "500m", "memory": "2Gi", **limits}, "limits": limits},
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/app", "readOnly": True},
            {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True},
        ],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http", "scheme": "HTTP"}, "periodSeconds": 10},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }


def _container_status(p: NodePod, name: str) -> dict[str, Any]:
    digest = hashlib.sha256(f"{p.namespace}/{p.app}".encode()).hexdigest()
    return {
        "name": name,
        "containerID": f"containerd://{container_id(p.uid, name)}",
        "image": f"registry.example.com/{p.namespace}/{p.app}:v1.{len(p.app)}.3",
        "imageID": f"registry.example.com/{p.namespace}/{p.app}@sha256:{digest}",
        "lastState": {},
        "ready": True,
        "restartCount": 0,
        "started": True,
        "state": {"running": {"startedAt": _STARTED}},
    }


def _metadata(p: NodePod) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": p.app, "app.kubernetes.io/part-of": p.namespace, "team": p.namespace}
    if p.template_hash:
        labels["pod-template-hash"] = p.template_hash
    if p.owner is not None and p.owner[0] in ("StatefulSet", "DaemonSet"):
        labels["controller-revision-hash"] = f"{p.owner[1]}-{p.uid[:10]}"
    if p.owner is not None and p.owner[0] == "Job":
        labels["batch.kubernetes.io/job-name"] = p.owner[1]
    meta: dict[str, Any] = {
        "name": p.name,
        "namespace": p.namespace,
        "uid": p.uid,
        "creationTimestamp": _STARTED,
        "labels": labels,
        "annotations": {"kubectl.kubernetes.io/default-container": p.containers[0], "prometheus.io/scrape": "true"},
    }
    if p.owner is not None:
        api_version = {"Job": "batch/v1"}.get(p.owner[0], "apps/v1")
        owner_uid = _owner_uid(p.namespace, *p.owner)
        meta["ownerReferences"] = [
            {
                "apiVersion": api_version,
                "kind": p.owner[0],
                "name": p.owner[1],
                "uid": owner_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        meta["generateName"] = p.name.rsplit("-", 1)[0] + "-"
    return meta


def _owner_uid(namespace: str, kind: str, name: str) -> str:
    """The UID of the controller ``kind``/``name``, as the pods' owner references carry it."""
    return _uid(namespace, f"{kind}/{name}")


def owner_objects(pods: Sequence[NodePod], fakes: Any) -> list[tuple[dict[str, Any], str]]:
    """The controllers above ``pods`` as (object, plural), so that every owner walk ends
    ``resolved``, as in a cluster: the ReplicaSet and the Deployment above a Deployment's pods,
    the StatefulSet, DaemonSet or Job (and the CronJob above it) of the others.  Each carries the
    UID the reference below it names; without them every walk read 404 and was retried each
    minute, which no cluster does.  ``fakes`` is the API emulator's module (``load_fakes``)."""
    out: dict[tuple[str, str, str], tuple[dict[str, Any], str]] = {}

    def put(namespace: str, kind: str, name: str, owner: dict[str, Any] | None = None) -> None:
        uid = _owner_uid(namespace, kind, name)
        obj = fakes.make_object(fakes.OWNER_API_VERSIONS[kind], kind, namespace, name, owner, uid, _STARTED)
        out[(namespace, kind, name)] = (obj, f"{kind.lower()}s")

    for p in pods:
        if p.owner is None:
            continue
        kind, name = p.owner
        if kind == "ReplicaSet":
            deployment = name.rsplit("-", 1)[0]
            put(p.namespace, "Deployment", deployment)
            ref = {**fakes.owner_reference("Deployment", deployment, p.namespace)}
            put(p.namespace, kind, name, {**ref, "uid": _owner_uid(p.namespace, "Deployment", deployment)})
        elif kind == "Job":
            job = fakes.make_job(p.namespace, name, p.cronjob)
            job["metadata"]["uid"] = _owner_uid(p.namespace, kind, name)
            out[(p.namespace, kind, name)] = (job, "jobs")
            if p.cronjob:
                out[(p.namespace, "CronJob", p.cronjob)] = (fakes.make_cronjob(p.namespace, p.cronjob), "cronjobs")
        else:
            put(p.namespace, kind, name)
    return list(out.values())


def _pod_object(p: NodePod, node: str, env_count: int) -> dict[str, Any]:
    """The pod with ``env_count`` environment variables per container."""
    meta = _metadata(p)
    spec = {
        "containers": [_container_spec(p, c, env_count) for c in p.containers],
        "volumes": [
            {"name": "config", "configMap": {"name": f"{p.app}-config", "defaultMode": 420}},
            {
                "name": "kube-api-access",
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    ],
                },
            },
        ],
        "nodeName": node,
        "restartPolicy": "OnFailure" if p.owner and p.owner[0] == "Job" else "Always",
        "dnsPolicy": "ClusterFirst",
        "schedulerName": "default-scheduler",
        "serviceAccountName": "default",
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        ],
        "priority": 0,
        "enableServiceLinks": True,
    }
    status = {
        "phase": "Running",
        "conditions": [
            {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": _STARTED}
            for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
        "hostIP": "10.0.12.7",
        "hostIPs": [{"ip": "10.0.12.7"}],
        "podIP": f"10.244.3.{int(p.uid[:2], 16)}",
        "podIPs": [{"ip": f"10.244.3.{int(p.uid[:2], 16)}"}],
        "startTime": _STARTED,
        "qosClass": "Burstable",
        "containerStatuses": [_container_status(p, c) for c in p.containers],
    }
    meta["managedFields"] = [
        {
            "manager": "kube-controller-manager",
            "operation": "Update",
            "apiVersion": "v1",
            "time": _STARTED,
            "fieldsType": "FieldsV1",
            "fieldsV1": _fields_v1(
                {"metadata": {k: meta[k] for k in ("labels", "annotations") if k in meta}, "spec": spec}
            ),
        },
        {
            "manager": "kubelet",
            "operation": "Update",
            "apiVersion": "v1",
            "time": _STARTED,
            "fieldsType": "FieldsV1",
            "fieldsV1": _fields_v1({"status": status}),
            "subresource": "status",
        },
    ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def compact_size(obj: Any) -> int:
    """Bytes of ``obj`` as compact JSON (how the API server writes it)."""
    return len(json.dumps(obj, separators=(",", ":")))


def api_pod(p: NodePod, node: str = NODE, target_bytes: int = DEFAULT_POD_BYTES) -> dict[str, Any]:
    """``p`` as the API server returns it, at least ``target_bytes`` of compact JSON: the
    environment of its containers grows until it is (a pod bigger without any is left so)."""
    smallest = _pod_object(p, node, 0)
    size0 = compact_size(smallest)
    if size0 >= target_bytes:
        return smallest
    per_var = max(1, compact_size(_pod_object(p, node, 1)) - size0)
    count = -(-(target_bytes - size0) // per_var)
    pod = _pod_object(p, node, count)
    while compact_size(pod) < target_bytes:
        count += 1
        pod = _pod_object(p, node, count)
    return pod


def cgroup_text(pod_uid: str, container: str) -> str:
    """``/proc/<pid>/cgroup`` of a process in ``container`` of a Burstable pod (tests.support.procfs)."""
    return cgroup_line(pod_uid, container_id(pod_uid, container))


def write_procfs(folder: Path, pids: Mapping[int, tuple[str, str]]) -> Path:
    """A procfs root in ``folder`` with ``<pid>/cgroup`` for each PID (its pod UID and container)."""
    root = folder / "proc"
    for pid, (pod_uid, container) in pids.items():
        (root / str(pid)).mkdir(parents=True, exist_ok=True)
        (root / str(pid) / "cgroup").write_text(cgroup_text(pod_uid, container))
    root.mkdir(parents=True, exist_ok=True)
    return root


# --- the fakes -----------------------------------------------------------------------------------


EXPORTER_CHAIN_MODULES = ("h11", "h2", "yaml")
"""What the exporter imports with the full chain besides the standard library and
``prometheus_client``: its HTTP front, its kubelet client and its kubeconfig reader."""


def load_fakes() -> tuple[ModuleType, ModuleType, ModuleType]:
    """The fake kubelet, the API emulator and ``bench.hostile_peers`` (its kubeconfig writer);
    exits with what to install when one of their imports, or one the exporter will need with
    the chain (same interpreter and path), is missing."""
    try:
        from bench import hostile_peers
        from tests.fakes import kube_api_server, kubelet_server
    except ImportError as exc:
        raise SystemExit(f"cannot import the fakes ({exc}): {FAKES_HELP}") from exc
    missing = [m for m in EXPORTER_CHAIN_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f"the exporter could not import {', '.join(missing)}: {FAKES_HELP}")
    return kubelet_server, kube_api_server, hostile_peers


@dataclass
class Chain:
    """The running fakes of a full chain and how the exporter reaches them."""

    flags: tuple[str, ...]
    env: dict[str, str]
    api: KubeApiEmulator
    objects: list[dict[str, Any]]
    """The API's pod objects (``tick`` updates them)."""
    ticks: int = 0

    def tick(self) -> None:
        """One pod update on the watch: a container of the next pod restarts (MODIFIED event)."""
        pod = self.objects[self.ticks % len(self.objects)]
        status = pod["status"]["containerStatuses"][0]
        status["restartCount"] += 1
        status["lastState"] = {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": _STARTED}}
        self.api.put(pod)
        self.ticks += 1


@contextmanager
def full_chain(plan: NodePlan, folder: Path, pod_bytes: int = DEFAULT_POD_BYTES, node: str = NODE) -> Iterator[Chain]:
    """Start a kubelet and an API server serving ``plan`` and write its procfs and a kubeconfig
    into ``folder``; stop them on exit."""
    kubelet_server, kube_api_server, hostile_peers = load_fakes()
    with ExitStack() as stack:
        kubelet = stack.enter_context(kubelet_server.FakeKubelet())
        kubelet.pods = [
            kubelet_server.pod(
                p.namespace,
                p.name,
                [(c, [(GPU_RESOURCE, p.devices[c])] if c in p.devices else []) for c in p.containers],
            )
            for p in plan.pods
        ]
        kubelet.allocatable = [kubelet_server.devices(GPU_RESOURCE, plan.allocatable)]
        api = stack.enter_context(kube_api_server.KubeApiEmulator())
        objects = [api_pod(p, node, pod_bytes) for p in plan.pods]
        for obj in objects:
            api.put(obj)
        for owner, plural in owner_objects(plan.pods, kube_api_server):
            api.put_object(owner, plural)
        procfs = write_procfs(folder, plan.pids)
        flags = (
            "--kubernetes.podresources-socket",
            kubelet.socket_path,
            "--kubernetes.api",
            "--kubernetes.node-name",
            node,
            "--path.procfs",
            str(procfs),
        )
        env = {**NO_IN_CLUSTER, "KUBECONFIG": str(hostile_peers._kubeconfig(folder, api.url))}
        yield Chain(flags, env, api, objects)


# --- compiled modules ----------------------------------------------------------------------------

BYTECODE_MODES = ("found", "image", "compiled")
"""Which compiled modules (``.pyc``) the exporter finds:

- ``found``: whatever the ``__pycache__`` folders of this machine hold;
- ``image``: as in the exporter image, where ``uv pip install`` writes no ``.pyc`` and
  ``PYTHONDONTWRITEBYTECODE`` with a read-only root keeps it so: the standard library compiled
  (Debian's python3 ships it so), every other module compiled from source at every start;
- ``compiled``: every module the exporter imports compiled ahead (``uv pip install
  --compile-bytecode`` would give that).

``image`` and ``compiled`` point ``PYTHONPYCACHEPREFIX`` at a folder of their own that an
unmeasured first run of each configuration fills."""


class Bytecode:
    """The ``.pyc`` folder of one ``BYTECODE_MODES`` mode, under ``folder``."""

    def __init__(self, mode: str, folder: Path) -> None:
        if mode not in BYTECODE_MODES:
            raise ValueError(f"unknown bytecode mode {mode!r}; known: {', '.join(BYTECODE_MODES)}")
        self.mode = mode
        self.prefix = folder / f"pyc-{mode}"

    @property
    def needs_warm_up(self) -> bool:
        """Whether a configuration's first run only fills the folder (and is not measured)."""
        return self.mode != "found"

    def env(self, writing: bool = False) -> dict[str, str]:
        """The environment that makes the exporter read (``writing``: also write) this folder."""
        if self.mode == "found":
            return {}
        return {"PYTHONPYCACHEPREFIX": str(self.prefix), "PYTHONDONTWRITEBYTECODE": "" if writing else "1"}

    def after_warm_up(self) -> None:
        """``image``: keep only the standard library's compiled modules."""
        if self.mode != "image":
            return
        paths = sysconfig.get_paths()
        stdlib = Path(paths["stdlib"]).resolve()
        installed = {Path(paths[k]).resolve() for k in ("purelib", "platlib")}  # a venv's are not the stdlib
        for pyc in self.prefix.rglob("*.pyc"):
            where = Path("/", pyc.parent.relative_to(self.prefix)).resolve()
            if not _within(where, stdlib) or any(_within(where, p) for p in installed):
                pyc.unlink()


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


# --- measuring -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """One exporter run: RSS after the settle time and its peak since start (``VmHWM``), bytes;
    ``gpulens_stage_success`` and the series of pods' GPU allocations and of their measured GPU
    memory (from the processes' cgroups) in the last scrape; CPU seconds it took to get ready
    (start-up: imports, compiling, first cycle)."""

    rss: int
    peak: int
    stages: Mapping[str, float]
    allocations: int
    usages: int
    ready_cpu_s: float = 0.0
    unresolved_walks: int = 0
    """Owner walks that ended ``not_found``, ``forbidden`` or ``error``: none where the API serves
    every pod's controllers (``owner_objects``), as a cluster does."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return int(r.status), r.read()


def peak_rss_bytes(pid: int) -> int:
    """VmHWM: the process' peak resident set size since it started, bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def series_count(body: bytes, metric: bytes) -> int:
    """Series of ``metric`` (with labels) in an exposition."""
    return sum(1 for line in body.splitlines() if line.startswith(metric + b"{"))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def measure(
    source: Path,
    flags: Sequence[str],
    seconds: float,
    env: Mapping[str, str] | None = None,
    tick: Callable[[], None] | None = None,
) -> Reading:
    """Start the exporter of ``source`` with ``flags`` (and ``env`` added), scrape it once a
    second for ``seconds`` after it is ready (calling ``tick`` each second), then read it."""
    port = _free_port()
    argv = [sys.executable, "-m", "exporter", *flags, "--web.listen-address", f"{HOST}:{port}"]
    full_env = {**os.environ, **(env or {}), "PYTHONPATH": str(source)}
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, cwd=source, env=full_env, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_ready(proc, port, log)
            ready_cpu = cpu_seconds(proc.pid)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                if tick is not None:
                    tick()
                _get(f"http://{HOST}:{port}/metrics")
                time.sleep(1.0)
            _, body = _get(f"http://{HOST}:{port}/metrics")
            return Reading(
                rss_bytes(proc.pid),
                peak_rss_bytes(proc.pid),
                stage_success(body),
                series_count(body, b"gpulens_pod_gpu_allocation"),
                series_count(body, b"gpulens_pod_gpu_memory_used_bytes"),
                ready_cpu,
                unresolved_walks(body),
            )
        finally:
            _stop(proc)


def _wait_ready(proc: subprocess.Popen[bytes], port: int, log: Any) -> None:
    """Until ``/readyz`` answers 200; RuntimeError with the exporter's log tail if it exits or
    takes a minute."""
    deadline = time.monotonic() + 60
    while True:
        try:
            if _get(f"http://{HOST}:{port}/readyz")[0] == 200:
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"exporter did not get ready (exit {proc.poll()}):\n{tail}")
        time.sleep(0.1)


def command_line(flags: Sequence[str], env: Mapping[str, str]) -> str:
    """How to run one configuration by hand (the environment the bench adds, then the command)."""
    assignments = [f"{k}={shlex.quote(v)}" for k, v in env.items() if v]
    return " ".join([*assignments, "python -m exporter", *map(shlex.quote, flags)])


@dataclass(frozen=True)
class Config:
    """One configuration: its label, the chain (``none``, ``kubelet``, ``full``), pods (full
    chain only) and the exporter flags besides the chain's."""

    label: str
    chain: str
    pods: int | None
    flags: tuple[str, ...]


@contextmanager
def _peers(config: Config, pod_bytes: int) -> Iterator[Chain | None]:
    """Fresh fakes for one run of ``config`` (``None`` unless it is a full chain)."""
    if config.chain != "full" or config.pods is None:
        yield None
        return
    with (
        tempfile.TemporaryDirectory(prefix="gpulens-rss-") as tmp,
        full_chain(sim_plan(config.pods), Path(tmp), pod_bytes) as chain,
    ):
        yield chain


@dataclass(frozen=True)
class Result:
    """The median of ``--runs`` readings of one configuration, source and bytecode mode (MiB)."""

    config: str
    chain: str
    pods: int | None
    bytecode: str
    source: str
    rss_mib: float
    peak_mib: float
    rss_mib_runs: list[float]
    peak_mib_runs: list[float]
    stages: Mapping[str, float]
    allocations: int
    usages: int
    ready_cpu_s: float
    command: str


def run_config(
    config: Config, source: Path, bytecode: Bytecode, runs: int, seconds: float, pod_bytes: int = DEFAULT_POD_BYTES
) -> Result:
    """``runs`` exporters of ``config`` (after a warm-up run where ``bytecode`` needs one), each
    with fresh fakes; a full chain must have worked in every run (``check_chain``)."""
    readings: list[Reading] = []
    command = ""
    for i in range(runs + bytecode.needs_warm_up):
        warming = bytecode.needs_warm_up and i == 0
        with _peers(config, pod_bytes) as chain:
            flags = (*config.flags, *(chain.flags if chain else ()))
            env = {**(chain.env if chain else {}), **bytecode.env(writing=warming)}
            reading = measure(source, flags, 1.0 if warming else seconds, env, chain.tick if chain else None)
            command = command_line(flags, env)
        if warming:
            bytecode.after_warm_up()
        else:
            readings.append(reading)
    if config.chain == "full" and config.pods is not None:
        plan = sim_plan(config.pods)
        check_chain(readings, sum(len(ids) for p in plan.pods for ids in p.devices.values()))
    return Result(
        config=config.label,
        chain=config.chain,
        pods=config.pods,
        bytecode=bytecode.mode,
        source=str(source),
        rss_mib=round(statistics.median(r.rss for r in readings) / MiB, 1),
        peak_mib=round(statistics.median(r.peak for r in readings) / MiB, 1),
        rss_mib_runs=[round(r.rss / MiB, 1) for r in readings],
        peak_mib_runs=[round(r.peak / MiB, 1) for r in readings],
        stages=dict(readings[-1].stages),
        allocations=readings[-1].allocations,
        usages=readings[-1].usages,
        ready_cpu_s=round(statistics.median(r.ready_cpu_s for r in readings), 2),
        command=command,
    )


def check_chain(readings: list[Reading], expected_allocations: int) -> None:
    """RuntimeError unless, in every run, every chain stage read 1, every allocated GPU device
    was exported with its pod and some pod's GPU memory was measured through the cgroups: a
    footprint without the chain at work would measure nothing; and every owner walk resolved, as
    in a cluster (walks that keep failing are retried, a cost no cluster imposes)."""
    for r in readings:
        failed = [s for s in CHAIN_STAGES if r.stages.get(s) != 1.0]
        failed += [s for s in NEWER_STAGES if r.stages.get(s, 1.0) != 1.0]
        if failed or r.allocations < expected_allocations or r.usages == 0 or r.unresolved_walks:
            raise RuntimeError(
                f"the full chain did not work: stages {dict(r.stages)}, {r.allocations} pod allocation series "
                f"(expected {expected_allocations}), {r.usages} pod memory series (expected some), "
                f"{r.unresolved_walks} owner walks unresolved (expected none)"
            )


def configs(chains: Sequence[str], pods: Sequence[int]) -> list[Config]:
    """The configurations of ``--chain`` (a full chain once per ``--pods``)."""
    out = []
    for chain in chains:
        if chain == "full":
            out += [Config(FULL_LABEL, chain, n, CONFIGS[CHAIN_CONFIGS["none"]]) for n in pods]
        else:
            out.append(Config(CHAIN_CONFIGS[chain], chain, None, CONFIGS[CHAIN_CONFIGS[chain]]))
    return out


def table(results: Sequence[Result]) -> str:
    """The results as a Markdown table (MiB of 2^20 bytes)."""
    lines = [
        "| configuration | pods | .pyc | RSS (MiB) | peak RSS (MiB) | CPU to ready (s) | runs: RSS / peak (MiB) "
        "| chain stages |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        runs = ", ".join(f"{a} / {b}" for a, b in zip(r.rss_mib_runs, r.peak_mib_runs, strict=True))
        if r.chain == "none":
            stages = "simulated"
        else:
            stages = " ".join(f"{s} {r.stages[s]:g}" for s in (*CHAIN_STAGES, *NEWER_STAGES) if s in r.stages) or "-"
        pods = "-" if r.pods is None else str(r.pods)
        lines.append(
            f"| {r.config} | {pods} | {r.bytecode} | {r.rss_mib} | {r.peak_mib} | {r.ready_cpu_s} | {runs} | {stages} |"
        )
    return "\n".join(lines)


def _names(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def _int_list(text: str) -> list[int]:
    return [int(x) for x in _names(text)]


def main(argv: list[str] | None = None) -> int:
    """Measure every chosen configuration for every source; print JSON lines, then the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--source", action="append", type=Path, help="source tree(s) to run (default: this one)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="settle time: scraping before RSS is read")
    parser.add_argument(
        "--chain", type=_names, default=["none", "kubelet"], help="comma-separated: none, kubelet, full"
    )
    parser.add_argument("--pods", type=_int_list, default=[DEFAULT_PODS], help="pods on the node (full chain): 110,250")
    parser.add_argument("--pod-bytes", type=int, default=DEFAULT_POD_BYTES, help="size of one API pod object")
    parser.add_argument(
        "--bytecode", type=_names, default=["found"], help=f"comma-separated: {', '.join(BYTECODE_MODES)}"
    )
    a = parser.parse_args(argv)
    if not 1 <= a.runs <= 20 or not 0 < a.seconds <= 600:
        parser.error("--runs must be 1..20 and --seconds 0..600")
    if not a.chain or any(c not in ("none", "kubelet", "full") for c in a.chain):
        parser.error("--chain takes none, kubelet and full")
    if not a.bytecode or any(b not in BYTECODE_MODES for b in a.bytecode):
        parser.error(f"--bytecode takes {', '.join(BYTECODE_MODES)}")
    if not a.pods or any(not 1 <= n <= 10_000 for n in a.pods) or not 1024 <= a.pod_bytes <= 1_000_000:
        parser.error("--pods must be 1..10000 and --pod-bytes 1024..1000000")
    sources = a.source or [Path(__file__).resolve().parent.parent]
    results = []
    with tempfile.TemporaryDirectory(prefix="gpulens-pyc-") as pyc:
        for mode in a.bytecode:
            bytecode = Bytecode(mode, Path(pyc))
            for config in configs(a.chain, a.pods):
                for source in sources:
                    result = run_config(config, source, bytecode, a.runs, a.seconds, a.pod_bytes)
                    print(json.dumps(asdict(result)), flush=True)
                    results.append(result)
    print()
    print(table(results))
    print()
    for r in results:
        print(f"- {r.config}" + (f", {r.pods} pods" if r.pods else "") + f", .pyc {r.bytecode}: `{r.command}`")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
