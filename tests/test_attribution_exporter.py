"""End to end: the exporter process with a fake kubelet socket and a fake API server, faults included."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.kube_api_server import KubeApiEmulator, make_pod, reference_to
from tests.fakes.kubelet_server import FakeKubelet, pod
from tests.support.exporter import run_exporter
from tests.support.scrape import NO_API_ENV, Samples, api_env, eventually, gpu_uuids, scrape, stage

pytestmark = pytest.mark.integration


def allocations(samples: Samples) -> set[tuple[str, str, str]]:
    return {(lab["pod"], lab["uuid"], lab["workload_kind"]) for lab, _ in samples.get("gpulens_pod_gpu_allocation", [])}


OWNER_WALKS = "gpulens_kubernetes_owner_walks_total"


def test_kubelet_missing_then_restarted_with_device_metrics_unaffected() -> None:
    kubelet = FakeKubelet()  # created, not yet serving: the socket is missing at start
    try:
        args = ("--kubernetes.podresources-socket", kubelet.socket_path, "--kubernetes.refresh-interval", "1s")
        with run_exporter(*args, "--no-kubernetes.api", env=NO_API_ENV) as base:
            first = eventually(base, lambda s: stage(s, "podresources") == 0.0)
            uuids = gpu_uuids(first)
            assert uuids, "device metrics are served without the kubelet"
            assert "gpulens_pod_gpu_allocation" not in first
            assert OWNER_WALKS not in first, "no API source: no owner walks"
            assert stage(first, "kube_api") is None, "a disabled source reports no stage"

            kubelet.pods = [pod("ml", "train-0", [("main", [("nvidia.com/gpu", [uuids[0]])])])]
            kubelet.start()
            up = eventually(base, lambda s: stage(s, "podresources") == 1.0 and bool(allocations(s)))
            assert allocations(up) == {("train-0", uuids[0], "")}
            assert up["gpulens_podresources_last_success_timestamp_seconds"][0][1] > 0

            kubelet.stop()  # kubelet restarts: the socket disappears ...
            down = eventually(base, lambda s: stage(s, "podresources") == 0.0)
            assert gpu_uuids(down) == uuids
            gone = eventually(base, lambda s: not allocations(s), timeout=10)
            assert gpu_uuids(gone) == uuids, "allocations age out (3 refresh periods); GPUs stay"

            kubelet.pods.append(pod("ml", "train-1", [("main", [("nvidia.com/gpu", [uuids[1]])])]))
            kubelet.start()  # ... and comes back on a new socket: picked up without an exporter restart
            back = eventually(base, lambda s: stage(s, "podresources") == 1.0 and len(allocations(s)) == 2)
            assert allocations(back) == {("train-0", uuids[0], ""), ("train-1", uuids[1], "")}
    finally:
        kubelet.close()


def test_api_outage_leaves_kubelet_allocations_and_names_the_failing_stage(tmp_path: Path) -> None:
    with KubeApiEmulator() as api, FakeKubelet() as kubelet:
        env = api_env(api, tmp_path)
        args = (
            "--kubernetes.podresources-socket",
            kubelet.socket_path,
            "--kubernetes.refresh-interval",
            "1s",
            "--kubernetes.api",
            "--kubernetes.node-name",
            "gpu-node-1",
        )
        with run_exporter(*args, env=env) as base:
            uuids = gpu_uuids(scrape(base))
            api.put(make_pod("train-0", "ml", owner=("StatefulSet", "train")))
            api.put(make_pod("old", "ml", phase="Failed", owner=("Job", "old")))
            kubelet.pods = [
                pod("ml", "train-0", [("main", [("nvidia.com/gpu", [uuids[0]])])]),
                pod("ml", "old", [("main", [("nvidia.com/gpu", [uuids[0]])])]),
            ]
            healthy = eventually(
                base, lambda s: stage(s, "kube_api") == 1.0 and ("train-0", uuids[0], "StatefulSet") in allocations(s)
            )
            assert allocations(healthy) == {("train-0", uuids[0], "StatefulSet")}, "the Failed pod is dropped"
            assert stage(healthy, "podresources") == 1.0 and stage(healthy, "cgroup") is not None

            api.stop()  # API server unreachable
            down = eventually(base, lambda s: stage(s, "kube_api") == 0.0)
            assert stage(down, "podresources") == 1.0
            assert gpu_uuids(down) == uuids
            assert {p for p, _, _ in allocations(down)} >= {"train-0"}, "kubelet allocations stay"
            assert all(kind == "" for _, _, kind in allocations(down)), "API-derived labels are absent"

            api.start()  # same port: the watch reconnects with backoff, no exporter restart
            eventually(
                base, lambda s: stage(s, "kube_api") == 1.0 and allocations(s) == {("train-0", uuids[0], "StatefulSet")}
            )


def owner_walks(samples: Samples) -> dict[str, float]:
    return {labels["outcome"]: value for labels, value in samples.get(OWNER_WALKS, [])}


def workloads(samples: Samples) -> set[tuple[str, str, str]]:
    return {
        (lab["pod"], lab["workload_kind"], lab["workload"]) for lab, _ in samples.get("gpulens_pod_gpu_allocation", [])
    }


def test_a_forbidden_owner_is_counted_in_the_exposition_and_the_family_is_absent_without_the_chain(
    tmp_path: Path,
) -> None:
    """A Job of a JobSet whose resource the role does not grant: the pod is labelled with the
    JobSet the Job names (the walk stops there) and the walk counts as ``forbidden``; with
    ``--no-kubernetes.owner-chain`` the pod's own controller names it and the family is absent."""
    with KubeApiEmulator() as api, FakeKubelet() as kubelet:
        jobset = api.add_object("jobset.x-k8s.io/v1alpha2", "JobSet", "jobsets", "ml", "train")
        job = api.add_object("batch/v1", "Job", "jobs", "ml", "train-workers-0", owner=reference_to(jobset))
        api.forbidden.add(("jobset.x-k8s.io", "jobsets"))
        api.put(make_pod("train-workers-0-0-abcde", "ml", owner=reference_to(job)))
        env = api_env(api, tmp_path)
        args = (
            *("--kubernetes.podresources-socket", kubelet.socket_path, "--kubernetes.refresh-interval", "1s"),
            *("--kubernetes.api", "--kubernetes.node-name", "gpu-node-1"),
        )
        with run_exporter(*args, env=env) as base:
            uuid = gpu_uuids(scrape(base))[0]
            kubelet.pods = [pod("ml", "train-workers-0-0-abcde", [("main", [("nvidia.com/gpu", [uuid])])])]
            held = eventually(base, lambda s: any(k == "JobSet" for _, k, _ in workloads(s)) and bool(owner_walks(s)))
            assert workloads(held) == {("train-workers-0-0-abcde", "JobSet", "train")}
            walks = owner_walks(held)
            assert set(walks) == {"resolved", "forbidden", "not_found", "error", "limited"}, "every outcome, 0 too"
            assert walks["forbidden"] >= 1
            assert walks["resolved"] == walks["not_found"] == walks["error"] == walks["limited"] == 0
            assert api.object_gets("jobsets") == ["/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets/train"]

        with run_exporter(*args, "--no-kubernetes.owner-chain", env=env) as base:
            off = eventually(base, lambda s: any(kind for _, kind, _ in workloads(s)))
            assert workloads(off) == {("train-workers-0-0-abcde", "Job", "train-workers-0")}
            assert OWNER_WALKS not in off


def nic_holders(samples: Samples) -> set[tuple[str, str, str]]:
    return {(lab["pod"], lab["resource"], lab["device"]) for lab, _ in samples.get("gpulens_pod_nic_allocation", [])}


def test_nics_held_through_the_real_kubelet_reach_their_pods() -> None:
    """The p5en node's sysfs tree read by the real NIC source, its pods listed by a real gRPC kubelet:
    EFA devices by name and an SR-IOV-style PCI address name their NIC, a shared rdma/ pool holds
    no named NIC (device ""), an FPGA's PCI address is no NIC; gpulens_nic_pods counts holders."""
    kubelet = FakeKubelet()
    try:
        kubelet.start()
        args = ("--sim.scenario", "p5en", "--no-probes", "--kubernetes.podresources-socket", kubelet.socket_path)
        with run_exporter(*args, "--kubernetes.refresh-interval", "1s", "--no-kubernetes.api", env=NO_API_ENV) as base:
            first = eventually(base, lambda s: bool(s.get("gpulens_nic_info")) and bool(s.get("gpulens_gpu_info")))
            nics = {lab["device"]: lab["pci_bus_id"] for lab, _ in first["gpulens_nic_info"]}
            assert len(nics) == 32
            names = sorted(nics)
            assert "0000:e0:1f.7" not in nics.values()
            uuids = gpu_uuids(first)
            kubelet.pods = [
                pod(
                    "ml",
                    "train-0",
                    [("main", [("nvidia.com/gpu", uuids[:2]), ("vpc.amazonaws.com/efa", names[:2])])],
                ),
                pod("ml", "sriov-0", [("main", [("intel.com/sriov_rdma", [nics[names[2]]])])]),
                pod("ml", "pool-0", [("main", [("rdma/hca_shared_devices_a", ["1"])])]),
                pod("ml", "pool-1", [("main", [("rdma/hca_shared_devices_a", ["2"])])]),
                pod("fpga", "synth-0", [("main", [("xilinx.com/fpga", ["0000:e0:1f.7"])])]),
            ]
            held = eventually(base, lambda s: len(nic_holders(s)) >= 5)
            assert nic_holders(held) == {
                ("train-0", "vpc.amazonaws.com/efa", names[0]),
                ("train-0", "vpc.amazonaws.com/efa", names[1]),
                ("sriov-0", "intel.com/sriov_rdma", names[2]),
                ("pool-0", "rdma/hca_shared_devices_a", ""),
                ("pool-1", "rdma/hca_shared_devices_a", ""),
            }
            pods_per_nic = {lab["device"]: v for lab, v in held["gpulens_nic_pods"]}
            assert pods_per_nic[names[0]] == pods_per_nic[names[2]] == 1.0
            assert pods_per_nic[names[3]] == 0.0
            assert stage(held, "nic") == 1.0
    finally:
        kubelet.stop()
