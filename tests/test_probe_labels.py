"""Probe series carry the leaf labels every other leaf series has: gpu, the parent uuid and, for a
MIG instance, mig_uuid (plus its ids and profile), so a slow MIG probe row can be located."""

from __future__ import annotations

from types import MappingProxyType

from prometheus_client import CollectorRegistry

from exporter.model import BackendSample, GpuSample, LeafSample, MigInstance, ProbeResult, Snapshot
from exporter.render.collector import SnapshotCollector

PARENT = "GPU-11111111-2222-3333-4444-555555555555"
MIG = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
WHOLE = "GPU-99999999-2222-3333-4444-555555555555"


def _registry() -> CollectorRegistry:
    mig_gpu = GpuSample(
        index=3,
        uuid=PARENT,
        name="NVIDIA H200",
        mig_mode="enabled",
        leaves=(LeafSample(uuid=PARENT, mig=MigInstance(MIG, 2, 0, "3g.71gb")),),
    )
    whole = GpuSample(index=7, uuid=WHOLE, name="NVIDIA H200", leaves=(LeafSample(uuid=WHOLE),))
    snap = Snapshot(
        timestamp=1.0,
        backend=BackendSample(up=True, gpus=(mig_gpu, whole)),
        probe_results=(
            ProbeResult(MIG, "hbm_copy", 1.4e12, 0.97, 1.0),
            ProbeResult(WHOLE, "hbm_copy", 3.38e12, 0.80, 1.0),
            ProbeResult("GPU-gone", "h2d", 5e10, 0.9, 1.0),
        ),
        probe_runs=MappingProxyType({(MIG, "ok"): 1, (WHOLE, "ok"): 2}),
    )
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(lambda: snap, backend="sim"))
    return reg


def _labels(reg: CollectorRegistry, name: str) -> list[dict[str, str]]:
    return [dict(s.labels) for fam in reg.collect() for s in fam.samples if s.name == name]


def test_a_mig_probe_names_its_gpu_parent_and_instance() -> None:
    rows = {r["mig_uuid"] or r["uuid"]: r for r in _labels(_registry(), "gpulens_probe_efficiency_ratio")}
    assert rows[MIG] == {
        "gpu": "3",
        "uuid": PARENT,
        "mig_uuid": MIG,
        "gpu_instance_id": "2",
        "compute_instance_id": "0",
        "mig_profile": "3g.71gb",
        "probe": "hbm_copy",
    }
    assert rows[WHOLE]["gpu"] == "7" and rows[WHOLE]["mig_uuid"] == ""
    # a result for a GPU the backend no longer lists keeps its UUID, without a gpu index
    assert rows["GPU-gone"]["uuid"] == "GPU-gone" and rows["GPU-gone"]["gpu"] == ""


def test_every_probe_series_has_the_leaf_labels() -> None:
    reg = _registry()
    for name in (
        "gpulens_probe_bandwidth_bytes_per_second",
        "gpulens_probe_efficiency_ratio",
        "gpulens_probe_last_success_timestamp_seconds",
        "gpulens_probe_runs_total",
    ):
        rows = _labels(reg, name)
        assert rows, name
        mig = [r for r in rows if r["mig_uuid"] == MIG]
        assert mig and all(r["uuid"] == PARENT and r["gpu"] == "3" for r in mig), name
