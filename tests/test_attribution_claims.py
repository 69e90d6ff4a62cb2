"""Devices held through DRA ResourceClaims, resolved and merged (exporter/attribution/claims.py and
merge.build_allocations): GPUs and MIG instances by what their driver published, NICs by this
node's RDMA devices, the rest left out and counted; sharing from a claim several pods hold."""

from __future__ import annotations

from types import MappingProxyType

from exporter.analysis.sharing import sharing_mode
from exporter.attribution import claims
from exporter.attribution.deviceids import DeviceIndex, DeviceRef
from exporter.attribution.merge import (
    Allocations,
    KubeletView,
    PodDirectory,
    PodMeta,
    UnmappedCounter,
    build_allocations,
)
from exporter.attribution.pipeline import PipelineAttributor
from exporter.attribution.slices import SliceDirectory
from exporter.model import (
    Attribution,
    BackendSample,
    ClaimedDevice,
    ClaimRef,
    ContainerDevices,
    GpuSample,
    LeafSample,
    MigInstance,
    NicSample,
    SliceDevice,
    StageResult,
)
from exporter.network.pods import nic_holders

G0 = "GPU-00000000-0000-4000-8000-000000000000"
G1 = "GPU-11111111-1111-4111-8111-111111111111"
G2 = "GPU-22222222-2222-4222-8222-222222222222"
M_3G = "MIG-33333333-3333-4333-8333-333333333333"
M_1G_A = "MIG-44444444-4444-4444-8444-444444444444"
M_1G_B = "MIG-55555555-5555-4555-8555-555555555555"
GPU_DRIVER = "gpu.nvidia.com"
POOL = "node-a"


def node() -> BackendSample:
    """Two whole H200s and one in MIG mode: a 3g.71gb and two 1g.18gb instances."""
    migs = (
        MigInstance(M_3G, 2, 0, "3g.71gb"),
        MigInstance(M_1G_A, 9, 0, "1g.18gb"),
        MigInstance(M_1G_B, 10, 0, "1g.18gb"),
    )
    return BackendSample(
        up=True,
        gpus=(
            GpuSample(0, G0, leaves=(LeafSample(G0),)),
            GpuSample(1, G1, leaves=(LeafSample(G1),)),
            GpuSample(2, G2, mig_mode="enabled", leaves=tuple(LeafSample(G2, mig=m) for m in migs)),
        ),
    )


def published() -> SliceDirectory:
    return SliceDirectory.of(
        [
            SliceDevice(GPU_DRIVER, POOL, "gpu-0", "gpu", G0, pci_bus_id="0000:18:00.0"),
            SliceDevice(GPU_DRIVER, POOL, "gpu-1", "gpu", G1.lower().replace("gpu-", "GPU-")),
            SliceDevice(GPU_DRIVER, POOL, "gpu-2-mig-3g71gb-0", "mig", M_3G, G2, "3g.71gb"),
            SliceDevice(GPU_DRIVER, POOL, "gpu-2-mig-3g71gb-dyn", "mig", None, G2, "3g.71gb"),
            SliceDevice(GPU_DRIVER, POOL, "gpu-2-mig-1g18gb-dyn", "mig", None, G2, "1g.18gb"),
            SliceDevice(GPU_DRIVER, POOL, "gpu-9", "gpu", "GPU-99999999-9999-4999-8999-999999999999"),
            SliceDevice("dra.net", "node-a", "eth3", None, None, pci_bus_id="0000:4f:00.1"),
            SliceDevice("fpga.example.com", "node-a", "fpga-0", None, None, pci_bus_id="0000:9a:00.0"),
        ]
    )


def held(
    pod: str, device: str, driver: str = GPU_DRIVER, claim: str | None = None, namespace: str = "team"
) -> ClaimedDevice:
    ref = ClaimRef(namespace, claim or f"{pod}-claim", driver, POOL, device)
    return ClaimedDevice(namespace, pod, "main", ref, (f"k8s.{driver}/claim=uid-{device}",))


NICS = frozenset({"rdmap79s0", "0000:4f:00.1", "eth3"})


def resolve(c: ClaimedDevice, nic_ids: frozenset[str] = NICS) -> claims.Resolved:
    return claims.resolve(c, published(), DeviceIndex(node()), nic_ids)


def test_a_published_gpu_or_mig_uuid_names_the_leaf() -> None:
    assert resolve(held("p", "gpu-0")).ref == DeviceRef(G0)
    assert resolve(held("p", "gpu-1")).ref == DeviceRef(G1)
    assert resolve(held("p", "gpu-2-mig-3g71gb-0")).ref == DeviceRef(G2, M_3G)


def test_a_mig_device_published_without_uuid_is_the_one_instance_of_its_profile() -> None:
    assert resolve(held("p", "gpu-2-mig-3g71gb-dyn")).ref == DeviceRef(G2, M_3G)
    # two 1g.18gb instances: which one the claim holds cannot be told
    assert resolve(held("p", "gpu-2-mig-1g18gb-dyn")) == claims.Resolved(reason=claims.AMBIGUOUS_MIG)


def test_a_gpu_drivers_device_naming_no_gpu_here_is_unmapped_with_its_reason() -> None:
    assert resolve(held("p", "gpu-9")) == claims.Resolved(reason="unknown_gpu")
    assert resolve(held("p", "gpu-7")) == claims.Resolved(reason=claims.NO_SLICE)  # not published
    no_slices = claims.resolve(held("p", "gpu-0"), None, DeviceIndex(node()), NICS)
    assert no_slices == claims.Resolved(reason=claims.NO_SLICE)


def test_other_drivers_devices_are_nics_when_they_name_one_else_left_out() -> None:
    assert resolve(held("p", "eth3", "dra.net")).nic == ("eth3", "0000:4f:00.1")
    assert resolve(held("p", "eth3", "dra.net"), frozenset({"0000:4f:00.1"})).nic == ("0000:4f:00.1",)
    # a PCI device that is not one of this node's NICs, and a channel with no identity at all
    assert resolve(held("p", "fpga-0", "fpga.example.com")) == claims.Resolved()
    assert resolve(held("p", "channel-0", "compute-domain.nvidia.com")) == claims.Resolved()
    # without any NIC on the node, the NIC driver's device is left out too
    assert resolve(held("p", "eth3", "dra.net"), frozenset()) == claims.Resolved()


def merge(
    listed: tuple[ClaimedDevice, ...],
    devices: tuple[ContainerDevices, ...] = (),
    pods: PodDirectory | None = None,
    unmapped: UnmappedCounter | None = None,
) -> Allocations:
    return build_allocations(
        DeviceIndex(node()),
        KubeletView(devices=devices, claimed=listed),
        pods,
        unmapped or UnmappedCounter(),
        published(),
        NICS,
    )


def test_allocations_carry_the_claim_and_the_driver_as_resource() -> None:
    allocs = merge((held("llm", "gpu-0"), held("trainer", "gpu-2-mig-3g71gb-0")))
    got = {(a.pod.pod, a.uuid, a.mig_uuid, a.resource, a.claim) for a in allocs.allocations}
    assert got == {
        ("llm", G0, None, GPU_DRIVER, ClaimRef("team", "llm-claim", GPU_DRIVER, POOL, "gpu-0")),
        ("trainer", G2, M_3G, GPU_DRIVER, ClaimRef("team", "trainer-claim", GPU_DRIVER, POOL, "gpu-2-mig-3g71gb-0")),
    }
    assert allocs.claim_sharing == {} and allocs.conflicts == 0


def test_one_claim_held_by_two_pods_is_time_slicing_not_a_conflict() -> None:
    listed = (held("nb-0", "gpu-1", claim="shared"), held("nb-1", "gpu-1", claim="shared"))
    allocs = merge(listed)
    assert allocs.claim_sharing == {G1: 2}
    assert allocs.sharing_pods == {G1: 2}
    assert allocs.conflicts == 0 and allocs.sharing_replicas == {}
    attribution = Attribution(allocations=allocs.allocations, claim_sharing=allocs.claim_sharing)
    assert sharing_mode(LeafSample(G1), attribution) == "time-slicing"
    # one pod alone on its claim is exclusive; a MIG instance stays mig
    alone = merge((held("llm", "gpu-0"),))
    assert sharing_mode(LeafSample(G0), Attribution(claim_sharing=alone.claim_sharing)) == "exclusive"
    mig = merge((held("a", "gpu-2-mig-3g71gb-0", claim="m"), held("b", "gpu-2-mig-3g71gb-0", claim="m")))
    assert mig.claim_sharing == {}
    leaf = LeafSample(G2, mig=MigInstance(M_3G, 2, 0, "3g.71gb"))
    assert sharing_mode(leaf, Attribution(claim_sharing=mig.claim_sharing)) == "mig"


def test_finished_pods_claims_are_dropped() -> None:
    pods = PodDirectory.of(
        [PodMeta("u-done", "team", "done", phase="Succeeded"), PodMeta("u-run", "team", "run", phase="Running")]
    )
    allocs = merge(
        (held("done", "gpu-0"), held("run", "gpu-1"), held("done", "channel-0", "compute-domain.nvidia.com")), pods=pods
    )
    assert {a.pod.pod for a in allocs.allocations} == {"run"}
    assert allocs.claims_ignored == {}


def test_left_out_devices_are_counted_by_driver_and_the_count_is_bounded() -> None:
    listed = [held("p", "channel-0", "compute-domain.nvidia.com"), held("q", "channel-1", "compute-domain.nvidia.com")]
    listed += [held("p", "fpga-0", "fpga.example.com")]
    listed += [held("p", f"d{i}", f"driver-{i}.example.com") for i in range(100)]
    listed += [held("p", "x", "a" * 64)]
    allocs = merge(tuple(listed))
    assert allocs.claims_ignored["compute-domain.nvidia.com"] == 2
    assert allocs.claims_ignored["fpga.example.com"] == 1
    assert len(allocs.claims_ignored) == claims.MAX_IGNORED_DRIVERS + 1
    assert (
        allocs.claims_ignored[claims.OTHER_DRIVER] == 102 - claims.MAX_IGNORED_DRIVERS + 1
    )  # 102 drivers, and the too long one
    assert sum(allocs.claims_ignored.values()) == len(listed)


def test_unmapped_claimed_gpus_count_once_per_device_and_reason() -> None:
    unmapped = UnmappedCounter()
    for _ in range(3):
        merge((held("p", "gpu-9"), held("p", "gpu-7"), held("p", "gpu-2-mig-1g18gb-dyn")), unmapped=unmapped)
    assert unmapped.snapshot() == {"unknown_gpu": 1, claims.NO_SLICE: 1, claims.AMBIGUOUS_MIG: 1}


def test_a_claimed_nic_reaches_the_network_stage_as_a_holder_under_its_driver() -> None:
    allocs = merge((held("trainer", "eth3", "dra.net"),))
    nics = (NicSample("mlx5_3", "roce", pci_bus_id="0000:4f:00.1"), NicSample("rdmap79s0", "efa"))
    holders = nic_holders(nics, allocs.other_devices)
    assert [(h.pod.pod, h.resource, h.device) for h in holders] == [("trainer", "dra.net", "mlx5_3")]


def test_device_plugin_and_claims_mix_on_one_node() -> None:
    plugin = (ContainerDevices("team", "old", "main", "nvidia.com/gpu", (G0,)),)
    allocs = merge((held("new", "gpu-1"),), devices=plugin)
    assert {(a.pod.pod, a.uuid, a.claim is not None) for a in allocs.allocations} == {
        ("old", G0, False),
        ("new", G1, True),
    }


class _Slices:
    def __init__(self) -> None:
        self.directory: SliceDirectory | None = published()

    def latest(self) -> tuple[SliceDirectory | None, StageResult]:
        return self.directory, StageResult("resourceslices", self.directory is not None, 0.0)

    def close(self) -> None:
        pass


class _Kubelet:
    def __init__(self, view: KubeletView) -> None:
        self.view = view

    def latest(self) -> tuple[KubeletView | None, StageResult, float | None]:
        return self.view, StageResult("podresources", True, 0.0), 1.0

    def close(self) -> None:
        pass


def test_the_pipeline_recomputes_when_the_slices_or_the_nics_change() -> None:
    slices = _Slices()
    nic_ids = {"ids": frozenset[str]()}
    view = KubeletView(devices=(), claimed=(held("p", "gpu-0"), held("t", "eth3", "dra.net")))
    pipeline = PipelineAttributor(_Kubelet(view), None, None, slices=slices, nic_ids=lambda: nic_ids["ids"])
    attribution, stages = pipeline.attribute(node(), 0.0)
    assert [s.stage for s in stages] == ["podresources", "resourceslices"]
    assert [a.uuid for a in attribution.allocations] == [G0]
    assert attribution.claims_ignored == MappingProxyType({"dra.net": 1})
    nic_ids["ids"] = NICS
    attribution, _ = pipeline.attribute(node(), 1.0)
    assert attribution.claims_ignored == {} and len(attribution.other_devices) == 1
    slices.directory = None  # the slice watch fails: the GPU cannot be told any more
    attribution, stages = pipeline.attribute(node(), 2.0)
    assert attribution.allocations == () and not stages[1].success
