"""End to end, DRA: the exporter process with a real gRPC kubelet listing ``dynamic_resources`` and
the API emulator serving this node's pods and ResourceSlices, on the simulated p5en node (8 H200
and 32 EFAs read from its sysfs tree by the real NIC source).

A GPU claimed before its driver published it is unmapped (``no_slice``) until the slice comes; a
claim shared by two pods is time-slicing; a NIC claimed through a network driver reaches the pod's
NIC holders under that driver; a ComputeDomain channel is left out and counted; a device-plugin
pod beside them keeps its series as they were.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.kube_api_server import KubeApiEmulator, make_pod, make_resource_slice, nvidia_gpu
from tests.fakes.kubelet_server import FakeKubelet, pod
from tests.support.exporter import run_exporter
from tests.support.scrape import Samples, api_env, eventually, gpu_uuids, scrape, stage

pytestmark = pytest.mark.integration

NODE = "gpu-node-1"
GPU_DRIVER = "gpu.nvidia.com"
NIC_DRIVER = "dra.net"
CHANNEL_DRIVER = "compute-domain.nvidia.com"


def claimed(samples: Samples) -> dict[tuple[str, str], dict[str, str]]:
    """(pod, uuid) -> the allocation's labels."""
    return {(lab["pod"], lab["uuid"]): lab for lab, _ in samples.get("gpulens_pod_gpu_allocation", [])}


def value(samples: Samples, name: str, **match: str) -> float | None:
    for labels, v in samples.get(name, []):
        if all(labels.get(k) == x for k, x in match.items()):
            return v
    return None


def test_claimed_gpus_nics_and_channels_through_the_real_kubelet_and_api(tmp_path: Path) -> None:
    with KubeApiEmulator() as api, FakeKubelet() as kubelet:
        args = (
            "--sim.scenario", "p5en", "--no-probes",
            "--kubernetes.podresources-socket", kubelet.socket_path,
            "--kubernetes.refresh-interval", "1s",
            "--kubernetes.api", "--kubernetes.node-name", NODE,
        )  # fmt: skip
        with run_exporter(*args, env=api_env(api, tmp_path)) as base:
            first = eventually(base, lambda s: bool(s.get("gpulens_nic_info")) and bool(s.get("gpulens_gpu_info")))
            uuids = gpu_uuids(first)
            bus = {lab["uuid"]: lab["pci_bus_id"] for lab, _ in first["gpulens_gpu_info"]}
            nics = sorted(lab["device"] for lab, _ in first["gpulens_nic_info"])
            for name, owner in (("llm-0", "llm"), ("nb-0", "nb"), ("nb-1", "nb"), ("mnnvl-0", "mnnvl")):
                api.put(make_pod(name, "team", owner=("StatefulSet", owner)))
            api.put(make_pod("old-0", "team", owner=("Job", "old")))
            gpu = [(GPU_DRIVER, NODE, f"gpu-{i}", [f"k8s.gpu.nvidia.com/claim=u{i}-gpu-{i}"]) for i in range(3)]
            kubelet.pods = [
                pod("team", "llm-0", [("vllm", [], [("team", "llm-0-gpu", [gpu[0]])])]),
                pod("team", "nb-0", [("nb", [], [("team", "shared", [gpu[1]])])]),
                pod("team", "nb-1", [("nb", [], [("team", "shared", [gpu[1]])])]),
                pod(
                    "team",
                    "mnnvl-0",
                    [
                        (
                            "trainer",
                            [],
                            [
                                ("team", "mnnvl-0-gpu", [gpu[2]]),
                                ("team", "mnnvl-0-nic", [(NIC_DRIVER, NODE, nics[0], [])]),
                                ("team", "mnnvl-0-channel", [(CHANNEL_DRIVER, NODE, "channel-0", [])]),
                            ],
                        )
                    ],
                ),
                pod("team", "old-0", [("main", [("nvidia.com/gpu", [uuids[3]])])]),
            ]
            # the driver has not published its devices yet: the claimed GPUs are unmapped
            waiting = eventually(
                base, lambda s: (value(s, "gpulens_unmapped_devices_total", reason="no_slice") or 0) >= 3
            )
            assert set(claimed(waiting)) == {("old-0", uuids[3])}
            published = [nvidia_gpu(f"gpu-{i}", uuids[i], bus[uuids[i]], index=i) for i in range(3)]
            api.put_slice(make_resource_slice(NODE, GPU_DRIVER, NODE, published))
            api.put_slice(make_resource_slice("gpu-node-2", GPU_DRIVER, "gpu-node-2", [nvidia_gpu("gpu-0", "GPU-x")]))
            done = eventually(base, lambda s: len(claimed(s)) == 5 and stage(s, "resourceslices") == 1.0)
            got = claimed(done)
            llm = got[("llm-0", uuids[0])]
            assert (llm["claim_namespace"], llm["claim_name"], llm["driver"], llm["pool"], llm["device"]) == (
                "team", "llm-0-gpu", GPU_DRIVER, NODE, "gpu-0",
            )  # fmt: skip
            assert llm["resource"] == GPU_DRIVER and llm["workload_kind"] == "StatefulSet"
            assert {got[(p, uuids[1])]["claim_name"] for p in ("nb-0", "nb-1")} == {"shared"}
            old = got[("old-0", uuids[3])]
            assert (old["resource"], old["claim_name"], old["driver"], old["device"]) == ("nvidia.com/gpu", "", "", "")
            assert value(done, "gpulens_gpu_sharing_info", uuid=uuids[1], mode="time-slicing") == 1.0
            assert value(done, "gpulens_gpu_sharing_info", uuid=uuids[0], mode="exclusive") == 1.0
            assert value(done, "gpulens_gpu_sharing_pods", uuid=uuids[1]) == 2.0
            holders = {(lab["pod"], lab["resource"], lab["device"]) for lab, _ in done["gpulens_pod_nic_allocation"]}
            assert holders == {("mnnvl-0", NIC_DRIVER, nics[0])}
            assert value(done, "gpulens_pod_claim_devices_ignored", driver=CHANNEL_DRIVER) == 1.0
            assert value(done, "gpulens_unmapped_devices_total", reason="no_slice") == 3.0  # counted once each

            # the driver withdraws a device: its claim is unmapped again, the others stay
            api.put_slice(make_resource_slice(NODE, GPU_DRIVER, NODE, published[:2], generation=2))
            after = eventually(base, lambda s: ("mnnvl-0", uuids[2]) not in claimed(s))
            assert set(claimed(after)) == set(got) - {("mnnvl-0", uuids[2])}
            assert scrape(base)["gpulens_gpu_info"]
