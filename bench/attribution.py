"""Cost of one attribution refresh for a node with N pods (default 1,000), median of R runs.

    .venv/bin/python -m bench.attribution [--pods 1000] [--repeat 21] [--no-owner-chain] [--json FILE]

Every part runs against real transports on loopback, as in production: a real gRPC kubelet
PodResources server on a temporary unix socket (tests/fakes/kubelet_server.py), the exporter's
own API client (exporter/attribution/kube_http.py) against the loopback API emulator
(tests/fakes/kube_api_server.py), and
/proc/<pid>/cgroup files in a temporary procfs.  Parts measured:
  kubelet refresh    List + GetAllocatableResources over the socket, into a KubeletView
  kubelet >4 MiB     the same with 48 SR-IOV device IDs per pod (a 5 MiB reply)
  API list           node-scoped pod list, raw JSON -> PodMeta (owner, phase, container IDs)
  API list, owners cold  the same with every owner read (the first list after a start)
  merge              allocations, replicas and sharing for N pods (what a changed input costs)
  cgroup cold        N PIDs read from /proc for the first time
  attribute cached   the sampler's per-cycle call with unchanged inputs, N or 8 GPU processes

The API list runs as the chart runs it: with the owner chain on (``--kubernetes.owner-chain``,
chart value ``exporter.kubernetesOwnerChain``), so each pod's workload is the top of its owner
chain.  Half the pods belong to Deployments (two per namespace, named from their ReplicaSets:
one metadata read of the Deployment), half to the Jobs of JobSets (two Jobs of one JobSet per
namespace: Job -> JobSet, two reads); the emulator holds every owner, so each walk resolves.
``API list`` is a list with the resolver's answers cached (a re-list within their 10 minutes);
``API list, owners cold`` starts each run with a new resolver: 3 discovery and 50 owner reads
at 20 namespaces, under the request burst of 100, so no walk is ``limited``.
``--no-owner-chain`` measures the list alone (the pod's own controller, no owner read).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from exporter.attribution import stages  # noqa: E402
from exporter.attribution.cgroup import CgroupPidSource  # noqa: E402
from exporter.attribution.deviceids import DeviceIndex  # noqa: E402
from exporter.attribution.kube_http import KubeClient, endpoint_for  # noqa: E402
from exporter.attribution.kubeapi import KubePodSource  # noqa: E402
from exporter.attribution.merge import (  # noqa: E402
    KubeletView,
    PidOwner,
    PodDirectory,
    UnmappedCounter,
    build_allocations,
)
from exporter.attribution.owners import OUTCOMES  # noqa: E402
from exporter.attribution.pipeline import PipelineAttributor  # noqa: E402
from exporter.attribution.podresources import PodResourcesSource  # noqa: E402
from exporter.model import (  # noqa: E402
    BackendSample,
    ContainerDevices,
    GpuSample,
    LeafSample,
    ProcessSample,
    StageResult,
)
from tests.fakes.kube_api_server import KubeApiEmulator, make_pod, reference_to  # noqa: E402
from tests.fakes.kubelet_server import FakeKubelet, devices, pod  # noqa: E402
from tests.support.procfs import cgroup_line  # noqa: E402

GPUS = 8
NAMESPACES = 20
TEMPLATE_HASH = "5d8f7c"
JOBSET = "jobset.x-k8s.io/v1alpha2"


def gpu_uuid(i: int) -> str:
    return f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}"


def pod_uid(i: int) -> str:
    return f"{i:08x}-1111-4222-8333-{i:012x}"


def container_id(i: int) -> str:
    return f"{i:064x}"


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up: imports, channel set-up, first allocation of buffers
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def node_pods(n: int, nics: int) -> list[Any]:
    vfs = [f"example.com/sriov-vf-{'x' * 80}-{j:03d}" for j in range(nics)]
    out = []
    for i in range(n):
        devs: list[tuple[str, list[str]]] = [("nvidia.com/gpu", [f"{gpu_uuid(i % GPUS)}::{i // GPUS}"])]
        if nics:
            devs.append(("example.com/sriov", vfs))
        out.append(pod(f"team-{i % 20}", f"pod-{i:05d}", [("main", devs)]))
    return out


def sample_with_processes(n: int) -> BackendSample:
    gpus = []
    for g in range(GPUS):
        procs = tuple(
            ProcessSample(pid=10_000 + i, used_memory_bytes=1 << 30, sm_util_ratio=0.01) for i in range(g, n, GPUS)
        )
        gpus.append(GpuSample(index=g, uuid=gpu_uuid(g), leaves=(LeafSample(uuid=gpu_uuid(g), processes=procs),)))
    return BackendSample(up=True, gpus=tuple(gpus))


class _FixedPods:
    def __init__(self, directory: PodDirectory) -> None:
        self.directory = directory

    def latest(self) -> tuple[PodDirectory, StageResult]:
        return self.directory, StageResult(stages.KUBE_API, True, 0.0)

    def close(self) -> None:
        pass


class _FixedKubelet:
    def __init__(self, view: KubeletView) -> None:
        self.view = view

    def latest(self) -> tuple[KubeletView, StageResult, float]:
        return self.view, StageResult(stages.PODRESOURCES, True, 0.0), 0.0

    def close(self) -> None:
        pass


def put_pods(api: KubeApiEmulator, n: int) -> None:
    """``n`` pods in ``NAMESPACES`` namespaces, each namespace with either two Deployments (even
    namespaces) or one JobSet of two Jobs (odd ones), every owner held by ``api`` (module docstring)."""
    jobs: dict[tuple[str, int], dict[str, Any]] = {}
    for i in range(n):
        namespace, which = f"team-{i % NAMESPACES}", (i // NAMESPACES) % 2
        owner: tuple[str, str] | dict[str, Any]
        labels: dict[str, str] = {}
        if i % 2 == 0:
            deployment = f"serve{which}"
            if ("apps/v1", "deployments", namespace, deployment) not in api.objects:
                api.add_object("apps/v1", "Deployment", "deployments", namespace, deployment)
            owner, labels = ("ReplicaSet", f"{deployment}-{TEMPLATE_HASH}"), {"pod-template-hash": TEMPLATE_HASH}
        else:
            if (namespace, which) not in jobs:
                key = (JOBSET, "jobsets", namespace, "train")
                jobset = api.objects.get(key) or api.add_object(JOBSET, "JobSet", "jobsets", namespace, "train")
                jobs[namespace, which] = api.add_object(
                    "batch/v1", "Job", "jobs", namespace, f"train-workers-{which}", owner=reference_to(jobset)
                )
            owner = reference_to(jobs[namespace, which])
        api.put(
            make_pod(
                f"pod-{i:05d}",
                namespace,
                uid=pod_uid(i),
                owner=owner,
                labels=labels,
                containers={"main": container_id(i)},
            )
        )


def run(n: int, repeat: int, owner_chain: bool = True) -> dict[str, float]:
    results: dict[str, float] = {}
    replicas = -(-n // GPUS)
    with FakeKubelet() as kubelet:
        kubelet.pods = node_pods(n, nics=0)
        kubelet.allocatable = [
            devices("nvidia.com/gpu", [f"{gpu_uuid(g)}::{r}" for g in range(GPUS) for r in range(replicas)])
        ]
        source = PodResourcesSource(kubelet.socket_path, start=False)
        results["kubelet refresh"] = median_ms(source.refresh, repeat)
        view, _, _ = source.latest()
        assert view is not None and len(view.devices) == n
        kubelet.pods = node_pods(n, nics=48)
        results["kubelet >4 MiB reply"] = median_ms(source.refresh, repeat)
        source.close()

    with KubeApiEmulator() as api:
        put_pods(api, n)

        def pod_source() -> KubePodSource:
            """A new API source (its own owner resolver, caches empty), not started."""
            return KubePodSource(
                lambda: KubeClient(endpoint_for(api.url)), "gpu-node-1", owner_chain=owner_chain, start=False
            )

        watcher = pod_source()
        results["API list"] = median_ms(watcher.list_now, repeat)
        directory, _ = watcher.latest()
        assert directory is not None and len(directory.by_uid) == n
        tops = {p.workload_kind for p in directory.by_uid.values()}
        assert tops == ({"Deployment", "JobSet"} if owner_chain else {"Deployment", "Job"}), tops
        if owner_chain:
            assert watcher.owners is not None
            walks = watcher.owners.stats()
            assert walks["resolved"] > 0 and walks["resolved"] == sum(walks[o] for o in OUTCOMES), walks
            results["API list, owners cold"] = median_ms(lambda: pod_source().list_now(), repeat)

    sample = sample_with_processes(n)
    index = DeviceIndex(sample)
    kubelet_view = KubeletView(
        devices=tuple(
            ContainerDevices(
                f"team-{i % 20}", f"pod-{i:05d}", "main", "nvidia.com/gpu", (f"{gpu_uuid(i % GPUS)}::{i // GPUS}",)
            )
            for i in range(n)
        ),
        allocatable=tuple(f"{gpu_uuid(g)}::{r}" for g in range(GPUS) for r in range(replicas)),
    )
    results["merge"] = median_ms(lambda: build_allocations(index, kubelet_view, directory, UnmappedCounter()), repeat)

    with tempfile.TemporaryDirectory() as proc:
        for i in range(n):
            os.makedirs(f"{proc}/{10_000 + i}")
            Path(f"{proc}/{10_000 + i}/cgroup").write_text(cgroup_line(pod_uid(i), container_id(i)))
        pids = [10_000 + i for i in range(n)]

        def cold() -> Mapping[int, PidOwner] | None:
            owners, _ = CgroupPidSource(proc).owners(pids)
            return owners

        results["cgroup cold"] = median_ms(cold, repeat)

        attributor = PipelineAttributor(_FixedKubelet(kubelet_view), _FixedPods(directory), CgroupPidSource(proc))
        attribution, stages = attributor.attribute(sample, time.time())
        assert all(s.success for s in stages), stages
        assert len(attribution.allocations) == n and len(attribution.usages) == n, (
            len(attribution.allocations),
            len(attribution.usages),
        )
        results[f"attribute cached, {n} processes"] = median_ms(
            lambda: attributor.attribute(sample, time.time()), repeat
        )
        few = sample_with_processes(GPUS)
        results[f"attribute cached, {GPUS} processes"] = median_ms(
            lambda: attributor.attribute(few, time.time()), repeat
        )
    return results


def main(argv: Collection[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument(
        "--owner-chain",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="follow each pod's owner chain in the API list, as the chart does (default: on)",
    )
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(list(argv) if argv is not None else None)
    results = run(args.pods, args.repeat, args.owner_chain)
    chain = "owner chain on" if args.owner_chain else "owner chain off"
    print(f"| part ({args.pods} pods, {chain}, median of {args.repeat}) | ms |")
    print("|---|---|")
    for part, ms in results.items():
        print(f"| {part} | {ms:.2f} |")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"pods": args.pods, "repeat": args.repeat, "owner_chain": args.owner_chain, "median_ms": results},
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
