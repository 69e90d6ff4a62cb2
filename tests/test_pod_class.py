"""A pod's class: the leaf's class only where it describes that pod alone; shared or idle elsewhere."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from prometheus_client import CollectorRegistry

from exporter.analysis.boundness import BoundnessClassifier
from exporter.analysis.pod_class import pod_boundness, pod_class
from exporter.attribution.merge import PidOwner, PodDirectory, PodMeta, leaf_tenants
from exporter.model import (
    BOUNDNESS_CLASSES,
    POD_BOUNDNESS_CLASSES,
    UNKNOWN_TENANT,
    Allocation,
    Attribution,
    BackendSample,
    GpuSample,
    LeafAnalysis,
    LeafSample,
    MigInstance,
    PodRef,
    ProcessSample,
)
from exporter.render.collector import SnapshotCollector
from exporter.sampler import Sampler

A = ("ml", "trainer-a")
B = ("ml", "trainer-b")
C = ("ml", "notebook-c")


def test_a_pod_alone_on_its_leaf_takes_the_leafs_class() -> None:
    assert pod_class("memory", A, frozenset({A}), None) == "memory"
    assert pod_class("memory", A, frozenset({A}), frozenset({A, UNKNOWN_TENANT})) == "memory"


def test_pods_sharing_a_leaf_where_both_run_read_shared_not_the_leafs_class() -> None:
    both = frozenset({A, B})
    assert pod_class("memory", A, both, both) == "shared"
    assert pod_class("memory", B, both, both) == "shared"


def test_the_only_pod_with_processes_on_a_shared_leaf_takes_its_class_and_the_others_read_idle() -> None:
    holders = frozenset({A, B, C})
    assert pod_class("compute", A, holders, frozenset({A})) == "compute"
    assert pod_class("compute", B, holders, frozenset({A})) == "idle"
    assert pod_class("compute", C, holders, frozenset({A})) == "idle"


def test_without_pid_attribution_a_leaf_held_by_several_pods_is_shared_for_each() -> None:
    assert pod_class("memory", A, frozenset({A, B}), None) == "shared"


def test_a_process_nobody_can_place_makes_a_shared_leaf_shared() -> None:
    # One pod's process plus one unknown: it may be the other pod's, so nobody gets the class.
    holders = frozenset({A, B})
    assert pod_class("memory", A, holders, frozenset({A, UNKNOWN_TENANT})) == "shared"
    assert pod_class("memory", B, holders, frozenset({A, UNKNOWN_TENANT})) == "shared"


def _ref(key: tuple[str, str], container: str = "main") -> PodRef:
    return PodRef(key[0], key[1], container, uid=key[1])


def test_pod_boundness_covers_every_allocation_with_a_classified_leaf() -> None:
    allocs = (
        Allocation(_ref(A), "nvidia.com/gpu.shared", "GPU-0", replica="0"),
        Allocation(_ref(B), "nvidia.com/gpu.shared", "GPU-0", replica="1"),
        Allocation(_ref(C), "nvidia.com/gpu", "GPU-1"),
        Allocation(_ref(C, "side"), "nvidia.com/mig-1g.18gb", "GPU-2", mig_uuid="MIG-2a"),
        Allocation(_ref(A, "other"), "nvidia.com/gpu", "GPU-3"),  # leaf without GPM: no class
    )
    attr = Attribution(allocations=allocs, leaf_tenants=MappingProxyType({"GPU-0": frozenset({A, B})}))
    analysis = {
        "GPU-0": LeafAnalysis("GPU-0", boundness="memory"),
        "GPU-1": LeafAnalysis("GPU-1", boundness="idle"),
        "MIG-2a": LeafAnalysis("MIG-2a", boundness="compute"),
        "GPU-3": LeafAnalysis("GPU-3", boundness=None, signals="nvml"),
    }
    got = {(p.pod.pod, p.pod.container, p.uuid, p.mig_uuid): p.boundness for p in pod_boundness(attr, analysis)}
    assert got == {
        ("trainer-a", "main", "GPU-0", None): "shared",
        ("trainer-b", "main", "GPU-0", None): "shared",
        ("notebook-c", "main", "GPU-1", None): "idle",
        ("notebook-c", "side", "GPU-2", "MIG-2a"): "compute",
    }


def test_the_coarse_busy_class_of_a_leaf_without_gpm_is_a_pods_class_like_any_other() -> None:
    assert pod_class("busy", A, frozenset({A}), None) == "busy"
    holders = frozenset({A, B})
    assert pod_class("busy", A, holders, frozenset({A})) == "busy"
    assert pod_class("busy", B, holders, frozenset({A})) == "idle"
    assert pod_class("busy", A, holders, holders) == "shared"
    assert "busy" in BOUNDNESS_CLASSES and POD_BOUNDNESS_CLASSES[-1] == "shared"
    assert set(POD_BOUNDNESS_CLASSES) == {*BOUNDNESS_CLASSES, "shared"}


def test_pods_on_leaves_without_gpm_get_the_coarse_class_or_none_where_nothing_measures_use() -> None:
    allocs = (
        Allocation(_ref(A), "nvidia.com/gpu", "GPU-0"),  # a whole A100: coarse class
        Allocation(_ref(B), "nvidia.com/mig-1g.10gb", "GPU-1", mig_uuid="MIG-1a"),  # processes: unknown
        Allocation(_ref(C), "nvidia.com/mig-1g.10gb", "GPU-1", mig_uuid="MIG-1b"),  # no process: idle
    )
    attr = Attribution(
        allocations=allocs, leaf_tenants=MappingProxyType({"GPU-0": frozenset({A}), "MIG-1a": frozenset({B})})
    )
    analysis = {
        "GPU-0": LeafAnalysis("GPU-0", boundness="busy", signals="nvml", busy_ratio=0.7),
        "MIG-1a": LeafAnalysis("MIG-1a", boundness=None, signals="processes"),
        "MIG-1b": LeafAnalysis("MIG-1b", boundness="idle", signals="processes"),
    }
    got = {(p.pod.pod, p.mig_uuid): p.boundness for p in pod_boundness(attr, analysis)}
    assert got == {("trainer-a", None): "busy", ("notebook-c", "MIG-1b"): "idle"}


def test_leaf_tenants_maps_processes_to_pods_and_marks_the_unplaced() -> None:
    mig = MigInstance("MIG-x", 1, 0, "1g.18gb")
    sample = BackendSample(
        up=True,
        gpus=(
            GpuSample(0, "GPU-0", leaves=(LeafSample("GPU-0", processes=(ProcessSample(10), ProcessSample(11))),)),
            GpuSample(1, "GPU-1", leaves=(LeafSample("GPU-1", mig=mig, processes=(ProcessSample(12),)),)),
            GpuSample(2, "GPU-2", leaves=(LeafSample("GPU-2"),)),
        ),
    )
    pods = PodDirectory.of([PodMeta("uid-a", *A), PodMeta("uid-b", *B)])
    owners = {10: PidOwner("uid-a"), 12: PidOwner("uid-b")}
    got = leaf_tenants(sample, owners, pods)
    assert dict(got) == {"GPU-0": frozenset({A, UNKNOWN_TENANT}), "MIG-x": frozenset({B})}


# --- end to end on the simulated time-sliced node ----------------------------------------------


def _series(reg: CollectorRegistry, name: str) -> list[dict[str, str]]:
    return [s.labels for m in reg.collect() for s in m.samples if s.name == name and s.value == 1.0]


@pytest.fixture(scope="module")
def timeslice_registry() -> CollectorRegistry:
    from exporter.sim import SimulatedBackend
    from exporter.sim.attribution import simulated_attributor

    backend = SimulatedBackend("timeslice", seed=1)
    attributor = simulated_attributor(backend)
    sampler = Sampler(backend, attributor=attributor, classifier=BoundnessClassifier())
    for _ in range(30):
        sampler.run_once()
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(sampler.latest))
    return reg


def test_time_sliced_pods_never_inherit_their_gpus_class(timeslice_registry: CollectorRegistry) -> None:
    leaf_class = {s["uuid"]: s["class"] for s in _series(timeslice_registry, "gpulens_gpu_boundness")}
    pods = _series(timeslice_registry, "gpulens_pod_gpu_boundness")
    holders: dict[str, set[str]] = {}
    for s in pods:
        holders.setdefault(s["uuid"], set()).add(s["pod"])
    assert any(len(h) > 1 for h in holders.values()), "the scenario has shared GPUs"
    for s in pods:
        if len(holders[s["uuid"]]) > 1:
            assert s["class"] in {"shared", "idle"}, s
        else:
            assert s["class"] == leaf_class[s["uuid"]], s
