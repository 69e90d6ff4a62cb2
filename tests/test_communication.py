"""The ``communication`` class (exporter/analysis/communication.py): a leaf classed ``latency``
becomes ``communication`` only when its pod communicates (two or more leaves, or a NIC) and there
is evidence it waits on others — its NVLink moves data, its pod's NICs move data, or another leaf
of the pod computes — seen within ``hold_seconds``.  Everything else keeps its class.

The inputs are built by hand (no simulator): GPUs with one leaf each, the pods' allocations, and
a network sample with NICs, GPU–NIC paths and NIC holders, so each rule is tried alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from exporter.analysis.communication import CommunicationLevels, CommunicationRefiner
from exporter.model import (
    COMMUNICATION,
    NVLINK,
    PCIE,
    Allocation,
    Attribution,
    BackendSample,
    GpuNicPath,
    GpuSample,
    LeafAnalysis,
    LeafSample,
    LinkTraffic,
    MigInstance,
    NetworkSample,
    NicHolder,
    NicPort,
    NicSample,
    PodRef,
)

NVLINK_CAPACITY = 450e9
LINE_RATE = 12.5e9  # one EFA port, 100 Gb/s


def gpu(index: int, nvlink_ratio: float | None = None, pcie_ratio: float | None = None) -> GpuSample:
    """GPU ``GPU-<index>`` with one whole-GPU leaf whose NVLink (and PCIe) moved that share of capacity."""
    links = []
    if nvlink_ratio is not None:
        links.append(LinkTraffic(NVLINK, "counter", 1.0, nvlink_ratio * NVLINK_CAPACITY, 0.0, NVLINK_CAPACITY))
    if pcie_ratio is not None:
        links.append(LinkTraffic(PCIE, "counter", 1.0, 0.0, pcie_ratio * 64e9, 64e9))
    uuid = f"GPU-{index}"
    return GpuSample(index=index, uuid=uuid, leaves=(LeafSample(uuid=uuid, links=tuple(links)),))


def sample(*gpus: GpuSample) -> BackendSample:
    return BackendSample(up=True, gpus=gpus)


def pod(name: str) -> PodRef:
    return PodRef("ml", name, "main")


def allocations(**pods: tuple[int, ...]) -> Attribution:
    """Each pod (by name) holding whole GPUs by index."""
    return Attribution(
        allocations=tuple(
            Allocation(pod(name), "nvidia.com/gpu", f"GPU-{i}") for name, indices in pods.items() for i in indices
        )
    )


def analysis(**classes: str | None) -> dict[str, LeafAnalysis]:
    """``GPU_<i>="latency"`` -> the leaf ``GPU-<i>`` classed so."""
    return {
        k.replace("_", "-"): LeafAnalysis(k.replace("_", "-"), boundness=v, busy_ratio=0.9) for k, v in classes.items()
    }


def nic(device: str, ratio: float) -> NicSample:
    """An EFA whose port sent ``ratio`` of its line rate over the last read."""
    port = NicPort(1, 4, 5, LINE_RATE, "Unknown", tx_bytes_per_second=ratio * LINE_RATE, rx_bytes_per_second=0.0)
    return NicSample(device, "efa", "efa", ports=(port,))


def network(
    nics: Mapping[str, float],
    nearest: Mapping[int, tuple[str, ...]] | None = None,
    holders: Mapping[str, tuple[str, ...]] | None = None,
) -> NetworkSample:
    """NICs by name -> utilisation; each GPU's nearest NICs; pods -> the NICs they hold (``""``: a
    shared pool naming no NIC)."""
    paths = tuple(
        GpuNicPath(f"GPU-{i}", dev, "PIX" if dev in near else "SYS", dev in near, dev in near, "efa_p2p")
        for i, near in (nearest or {}).items()
        for dev in nics
    )
    held = tuple(
        NicHolder(pod(name), "vpc.amazonaws.com/efa" if dev else "rdma/hca_shared_devices_a", dev)
        for name, devs in (holders or {}).items()
        for dev in devs
    )
    return NetworkSample(tuple(nic(d, r) for d, r in nics.items()), paths, held)


def classes_of(out: Mapping[str, LeafAnalysis]) -> dict[str, str | None]:
    return {k: v.boundness for k, v in out.items()}


def refine(
    leaves: dict[str, LeafAnalysis],
    backend: BackendSample,
    attribution: Attribution | None,
    net: NetworkSample | None = None,
    now: float = 100.0,
    refiner: CommunicationRefiner | None = None,
) -> dict[str, str | None]:
    return classes_of((refiner or CommunicationRefiner()).refine(leaves, backend, attribution, net, now))


# --- the three kinds of evidence ------------------------------------------------------------------


def test_two_leaf_pod_without_evidence_stays_latency() -> None:
    """A pod of two GPUs, both latency-bound, NVLink and NICs quiet: nothing says they wait."""
    out = refine(analysis(GPU_0="latency", GPU_1="latency"), sample(gpu(0, 0.0), gpu(1, 0.0)), allocations(job=(0, 1)))
    assert out == {"GPU-0": "latency", "GPU-1": "latency"}


@pytest.mark.parametrize(("ratio", "want"), [(0.0099, "latency"), (0.01, COMMUNICATION), (0.4, COMMUNICATION)])
def test_nvlink_moving_data_is_evidence(ratio: float, want: str) -> None:
    """(a) The leaf's NVLink moves at least 1 % of its capacity (either way): it communicates; its
    peer, whose links are quiet and who computes nothing, keeps ``latency``."""
    out = refine(
        analysis(GPU_0="latency", GPU_1="latency"), sample(gpu(0, ratio), gpu(1, 0.0)), allocations(job=(0, 1))
    )
    assert out == {"GPU-0": want, "GPU-1": "latency"}


def test_pcie_is_not_nvlink_evidence() -> None:
    """Busy PCIe (host copies) is no sign of a collective: only NVLink counts."""
    out = refine(
        analysis(GPU_0="latency", GPU_1="latency"),
        sample(gpu(0, 0.0, pcie_ratio=0.9), gpu(1)),
        allocations(job=(0, 1)),
    )
    assert out == {"GPU-0": "latency", "GPU-1": "latency"}


@pytest.mark.parametrize(("ratio", "want"), [(0.005, "latency"), (0.01, COMMUNICATION), (0.8, COMMUNICATION)])
def test_pods_nic_moving_data_is_evidence(ratio: float, want: str) -> None:
    """(b) The pod's NIC moves at least 1 % of its line rate: every latency leaf of the pod
    communicates."""
    net = network({"rdmap20s0": ratio, "rdmap21s0": 0.0}, holders={"job": ("rdmap20s0", "rdmap21s0")})
    out = refine(analysis(GPU_0="latency", GPU_1="latency"), sample(gpu(0), gpu(1)), allocations(job=(0, 1)), net)
    assert out == {"GPU-0": want, "GPU-1": want}


@pytest.mark.parametrize("peer", ["compute", "memory", "mixed"])
def test_a_working_peer_is_evidence(peer: str) -> None:
    """(c) Another leaf of the pod computes (a straggler): the latency leaf waits on it; the
    working leaf keeps its own class."""
    out = refine(analysis(GPU_0="latency", GPU_1=peer), sample(gpu(0), gpu(1)), allocations(job=(0, 1)))
    assert out == {"GPU-0": COMMUNICATION, "GPU-1": peer}


@pytest.mark.parametrize("peer", ["idle", "latency", "launch", "transfer", None])
def test_a_peer_that_does_not_work_is_no_evidence(peer: str | None) -> None:
    """A peer that idles, waits too, or has no class is not a straggler this leaf waits on."""
    out = refine(analysis(GPU_0="latency", GPU_1=peer), sample(gpu(0), gpu(1)), allocations(job=(0, 1)))
    assert out["GPU-0"] == "latency"


def test_reclassed_leaf_keeps_its_other_signals() -> None:
    """Only the class changes: busy ratio and the rest are the leaf's own; the input is not changed."""
    leaves = analysis(GPU_0="latency", GPU_1="compute")
    out = CommunicationRefiner().refine(leaves, sample(gpu(0), gpu(1)), allocations(job=(0, 1)), None, 1.0)
    assert out["GPU-0"] == replace(leaves["GPU-0"], boundness=COMMUNICATION)
    assert leaves["GPU-0"].boundness == "latency"


# --- what stays latency ---------------------------------------------------------------------------


def test_one_gpu_pod_without_nics_stays_latency_whatever_moves() -> None:
    """A lone latency-bound kernel: a one-GPU pod holding no NIC keeps ``latency`` even with its
    NVLink and its nearest NICs busy (nothing it holds says it talks to anyone)."""
    net = network({"rdmap20s0": 0.9}, nearest={0: ("rdmap20s0",)})
    out = refine(analysis(GPU_0="latency"), sample(gpu(0, 0.5)), allocations(solo=(0,)), net)
    assert out == {"GPU-0": "latency"}


def test_one_gpu_pod_holding_a_busy_nic_communicates() -> None:
    """One GPU per node of a multi-node job: the pod holds a NIC, and its traffic is the evidence."""
    net = network({"rdmap20s0": 0.3}, holders={"worker": ("rdmap20s0",)})
    out = refine(analysis(GPU_0="latency"), sample(gpu(0)), allocations(worker=(0,)), net)
    assert out == {"GPU-0": COMMUNICATION}


def test_one_gpu_pod_holding_a_shared_rdma_pool_watches_its_nearest_nics() -> None:
    """A pod holding a shared ``rdma/`` pool (IDs naming no NIC) holds a NIC: its GPU's nearest
    NICs, held by no pod by name, are the ones watched; quiet ones are no evidence."""
    leaves, backend, attribution = analysis(GPU_0="latency"), sample(gpu(0)), allocations(worker=(0,))
    busy = network({"mlx5_0": 0.2, "mlx5_1": 0.0}, nearest={0: ("mlx5_0",)}, holders={"worker": ("",)})
    assert refine(leaves, backend, attribution, busy) == {"GPU-0": COMMUNICATION}
    quiet = network({"mlx5_0": 0.0, "mlx5_1": 0.9}, nearest={0: ("mlx5_0",)}, holders={"worker": ("",)})
    assert refine(leaves, backend, attribution, quiet) == {"GPU-0": "latency"}


def test_multi_gpu_pod_with_quiet_gpus_and_nics_stays_latency() -> None:
    """Two leaves, NICs held and quiet, NVLink quiet, no peer working: no evidence."""
    net = network({"rdmap20s0": 0.001}, nearest={0: ("rdmap20s0",), 1: ("rdmap20s0",)}, holders={"job": ("rdmap20s0",)})
    out = refine(
        analysis(GPU_0="latency", GPU_1="latency"), sample(gpu(0, 0.001), gpu(1)), allocations(job=(0, 1)), net
    )
    assert out == {"GPU-0": "latency", "GPU-1": "latency"}


def test_leaf_shared_by_two_pods_stays_latency() -> None:
    """A leaf two pods hold (time-slicing): whose wait it is cannot be told, so it keeps ``latency``
    even with every kind of evidence; the unshared leaf of the same pod is reclassed."""
    attribution = Attribution(
        allocations=(
            Allocation(pod("a"), "nvidia.com/gpu", "GPU-0", replica="0"),
            Allocation(pod("b"), "nvidia.com/gpu", "GPU-0", replica="1"),
            Allocation(pod("a"), "nvidia.com/gpu", "GPU-1"),
            Allocation(pod("a"), "nvidia.com/gpu", "GPU-2"),
        )
    )
    leaves = analysis(GPU_0="latency", GPU_1="latency", GPU_2="compute")
    out = refine(leaves, sample(gpu(0, 0.5), gpu(1), gpu(2)), attribution)
    assert out == {"GPU-0": "latency", "GPU-1": COMMUNICATION, "GPU-2": "compute"}


def test_leaf_of_no_pod_and_no_attribution_stay_latency() -> None:
    """A leaf no pod holds, and any leaf when attribution is off, keeps its class."""
    leaves = analysis(GPU_0="latency", GPU_1="compute", GPU_2="latency")
    assert refine(leaves, sample(gpu(0, 0.5), gpu(1), gpu(2)), allocations(job=(1, 2)))["GPU-0"] == "latency"
    assert refine(leaves, sample(gpu(0, 0.5), gpu(1), gpu(2)), None) == classes_of(leaves)


@pytest.mark.parametrize("cls", ["compute", "memory", "mixed", "idle", "launch", "transfer", "busy", None])
def test_classes_other_than_latency_are_untouched(cls: str | None) -> None:
    """Only ``latency`` is refined: any other class (or none) stays, with every evidence present."""
    net = network({"rdmap20s0": 0.9}, holders={"job": ("rdmap20s0",)})
    out = refine(analysis(GPU_0=cls, GPU_1="compute"), sample(gpu(0, 0.9), gpu(1)), allocations(job=(0, 1)), net)
    assert out["GPU-0"] == cls


# --- whose NICs -------------------------------------------------------------------------------------


def test_pod_without_nics_watches_its_gpus_nearest_nics_only_when_no_pod_holds_them() -> None:
    """A two-GPU pod holding no NIC (host networking) uses its GPUs' nearest NICs as evidence while
    no pod holds them; once another pod holds the busy NIC, that traffic is the other pod's; a busy
    NIC that is not nearest never counts."""
    leaves, backend, attribution = (
        analysis(GPU_0="latency", GPU_1="latency"),
        sample(gpu(0), gpu(1)),
        allocations(job=(0, 1), other=()),
    )
    free = network({"rdmap20s0": 0.5, "rdmap30s0": 0.0}, nearest={0: ("rdmap20s0",), 1: ("rdmap30s0",)})
    assert refine(leaves, backend, attribution, free) == {"GPU-0": COMMUNICATION, "GPU-1": "latency"}
    taken = network(
        {"rdmap20s0": 0.5, "rdmap30s0": 0.0},
        nearest={0: ("rdmap20s0",), 1: ("rdmap30s0",)},
        holders={"other": ("rdmap20s0",)},
    )
    assert refine(leaves, backend, attribution, taken) == {"GPU-0": "latency", "GPU-1": "latency"}
    far = network({"rdmap20s0": 0.0, "rdmap90s0": 0.9}, nearest={0: ("rdmap20s0",), 1: ("rdmap20s0",)})
    assert refine(leaves, backend, attribution, far) == {"GPU-0": "latency", "GPU-1": "latency"}


def test_pod_holding_nics_watches_its_own_not_the_nearest() -> None:
    """A pod that holds NICs is judged by those: a busy free nearest NIC of its GPU is not its traffic."""
    net = network(
        {"rdmap20s0": 0.9, "rdmap21s0": 0.0},
        nearest={0: ("rdmap20s0",), 1: ("rdmap20s0",)},
        holders={"job": ("rdmap21s0",)},
    )
    out = refine(analysis(GPU_0="latency", GPU_1="latency"), sample(gpu(0), gpu(1)), allocations(job=(0, 1)), net)
    assert out == {"GPU-0": "latency", "GPU-1": "latency"}


def test_mig_instances_of_one_pod_are_peers() -> None:
    """A pod of two MIG instances: leaves are the MIG UUIDs; a working instance makes the waiting
    one ``communication``."""
    migs = tuple(MigInstance(f"MIG-{k}", k, 0, "3g.71gb") for k in (1, 2))
    backend = sample(
        GpuSample(index=0, uuid="GPU-0", leaves=tuple(LeafSample(uuid="GPU-0", mig=m) for m in migs)),
    )
    attribution = Attribution(
        allocations=tuple(Allocation(pod("job"), "nvidia.com/mig-3g.71gb", "GPU-0", m.mig_uuid) for m in migs)
    )
    leaves = {"MIG-1": LeafAnalysis("MIG-1", "latency"), "MIG-2": LeafAnalysis("MIG-2", "compute")}
    assert refine(leaves, backend, attribution) == {"MIG-1": COMMUNICATION, "MIG-2": "compute"}


# --- holding evidence ---------------------------------------------------------------------------------


def test_evidence_is_held_for_hold_seconds_then_dropped() -> None:
    """Evidence seen at t counts until t + ``hold_seconds`` (the classifier's window), then the
    leaf is ``latency`` again; fresh evidence restarts the hold."""
    refiner = CommunicationRefiner(CommunicationLevels(hold_seconds=10.0))
    leaves, attribution = analysis(GPU_0="latency", GPU_1="latency"), allocations(job=(0, 1))
    busy, quiet = sample(gpu(0, 0.5), gpu(1)), sample(gpu(0, 0.0), gpu(1))
    seen = [
        refine(leaves, backend, attribution, None, now, refiner)["GPU-0"]
        for now, backend in ((100.0, busy), (105.0, quiet), (110.0, quiet), (110.5, quiet), (111.0, busy))
    ]
    assert seen == [COMMUNICATION, COMMUNICATION, COMMUNICATION, "latency", COMMUNICATION]
    assert refine(leaves, quiet, attribution, None, 121.0, refiner)["GPU-0"] == COMMUNICATION
    assert refine(leaves, quiet, attribution, None, 121.5, refiner)["GPU-0"] == "latency"


def test_held_evidence_goes_with_the_leaf_and_with_attribution() -> None:
    """A leaf that leaves the analysis (GPU lost, MIG reconfigured) forgets its evidence; a cycle
    without attribution forgets everyone's."""
    leaves, attribution = analysis(GPU_0="latency", GPU_1="latency"), allocations(job=(0, 1))
    busy, quiet = sample(gpu(0, 0.5), gpu(1)), sample(gpu(0), gpu(1))
    refiner = CommunicationRefiner()
    assert refine(leaves, busy, attribution, None, 100.0, refiner)["GPU-0"] == COMMUNICATION
    refine(analysis(GPU_1="latency"), sample(gpu(1)), attribution, None, 101.0, refiner)
    assert refine(leaves, quiet, attribution, None, 102.0, refiner)["GPU-0"] == "latency"
    assert refine(leaves, busy, attribution, None, 103.0, refiner)["GPU-0"] == COMMUNICATION
    assert refine(leaves, quiet, None, None, 104.0, refiner)["GPU-0"] == "latency"
    assert refine(leaves, quiet, attribution, None, 105.0, refiner)["GPU-0"] == "latency"
