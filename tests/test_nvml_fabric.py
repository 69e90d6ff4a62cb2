"""The NVLink fabric registration: NVML's fabric info read by NvmlBackend over the fake binding
(what an H200 answered replayed from tests/fixtures/nvml_fabric/h200.json), exported as
``gpulens_gpu_fabric_info``, and the simulated ``jobs`` nodes whose GPUs share a clique."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from exporter.backends.nvml.backend import NvmlBackend
from exporter.backends.nvml.fabric import FABRIC_STATE_CONSTANTS, cluster_uuid_text
from exporter.model import FABRIC_STATES, BackendSample, GpuFabric
from exporter.render.collector import SnapshotCollector
from exporter.sampler import Sampler
from exporter.sim import SCENARIOS, SimulatedBackend
from exporter.sim.scenarios import build
from tests.fakes import fake_pynvml as fake_module
from tests.fakes.fake_pynvml import ZERO_CLUSTER_UUID, FakeFabric, FakeGpu, FakeNvml, code
from tests.support.nvml_node import Clock, h200, make

FIXTURE = Path(__file__).parent / "fixtures" / "nvml_fabric" / "h200.json"
FAMILY = "gpulens_gpu_fabric_info"
V, OLDER = "nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo"
CLUSTER = "5f0c2a9e-7d41-4b8e-9a63-0e2d4c6b8f17"
COMPLETED = fake_module.NVML_GPU_FABRIC_STATE_COMPLETED
IN_PROGRESS = fake_module.NVML_GPU_FABRIC_STATE_IN_PROGRESS


def in_clique(clique: int = 4, **kw: Any) -> FakeFabric:
    return FakeFabric(cluster_uuid=CLUSTER, clique_id=clique, **kw)


def run(backend: NvmlBackend, clock: Clock, n: int) -> list[BackendSample]:
    out = []
    for _ in range(n):
        out.append(backend.sample())
        clock.now += 1.0
    return out


def rendered(sampler: Sampler) -> list[Sample]:
    """Every sample the exporter renders for ``sampler``'s latest snapshot."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(SnapshotCollector(sampler.latest, backend="nvml"))
    text = generate_latest(registry).decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def exposition(backend: NvmlBackend) -> list[Sample]:
    """What the exporter renders after one sampler cycle of ``backend`` (then closed)."""
    sampler = Sampler(backend)
    try:
        sampler.run_once()
        return rendered(sampler)
    finally:
        sampler.stop()


def fabric_series(samples: list[Sample]) -> dict[str, dict[str, str]]:
    """GPU UUID -> the fabric labels of its ``gpulens_gpu_fabric_info`` series (value checked to be 1)."""
    out = {}
    for s in samples:
        if s.name == FAMILY:
            assert s.value == 1.0
            labels = dict(s.labels)
            uuid = labels.pop("uuid")
            out[uuid] = {k: v for k, v in labels.items() if k != "gpu"}
    return out


# --- what the H200 answered ---------------------------------------------------------------------


def h200_answer() -> dict[str, Any]:
    """The v2 struct the H200 filled in for ``nvmlDeviceGetGpuFabricInfoV``."""
    (gpu,) = json.loads(FIXTURE.read_text())["gpus"]
    return dict(gpu["answers"]["nvmlDeviceGetGpuFabricInfoV(c_nvmlGpuFabricInfo_v2_t)"]["struct"])


def test_the_h200_answers_success_with_the_state_not_supported_and_the_fake_does_the_same() -> None:
    answer = h200_answer()
    assert answer["status_name"] == "SUCCESS", "no NVML error: the struct comes back filled"
    assert answer["state"] == fake_module.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
    assert (answer["clusterUuid"], answer["cliqueId"], answer["healthMask"]) == ("0" * 32, 0, 0)
    replayed = FakeFabric(
        answer["state"], str(cluster_uuid_text(bytes.fromhex(answer["clusterUuid"]))), answer["cliqueId"], 0
    )
    assert FakeGpu(uuid="GPU-x").fabric == replayed, "the fake's default GPU answers as the H200 did"


def test_a_gpu_outside_any_fabric_has_no_series_and_is_asked_once() -> None:
    # The H200's answer, replayed: state NOT_SUPPORTED is no fabric, and it cannot change.
    clock = Clock()
    fake = FakeNvml([h200(0)])
    backend = make(fake, clock, slow_every=1)
    samples = run(backend, clock, 12)
    assert all(s.gpus[0].fabric is None for s in samples)
    assert all(dict(s.errors) == {} for s in samples)
    assert (fake.calls[V], fake.calls[OLDER]) == (1, 0), "one call, never repeated, even if due every cycle"
    assert FAMILY not in {s.name for s in exposition(make(FakeNvml([h200(0)]), clock))}


def test_not_supported_raised_by_both_calls_is_asked_once_each() -> None:
    clock = Clock()
    fake = FakeNvml([h200(0, fabric=None), h200(1, fabric=None)])
    samples = run(make(fake, clock, slow_every=1), clock, 12)
    assert all(g.fabric is None for s in samples for g in s.gpus)
    assert all(dict(s.errors) == {} for s in samples), "NotSupported is not an error"
    assert (fake.calls[V], fake.calls[OLDER]) == (2, 2), "per GPU: the versioned call, then the older one, once"


# --- a GPU in a fabric ----------------------------------------------------------------------------


def test_a_completed_registration_is_exported_with_its_cluster_clique_and_status() -> None:
    fake = FakeNvml([h200(0, fabric=in_clique()), h200(1, fabric=in_clique()), h200(2)])
    series = fabric_series(exposition(make(fake, Clock())))
    expected = {"state": "completed", "cluster_uuid": CLUSTER, "clique_id": "4", "status": "success"}
    assert series == {fake.gpus[0].uuid: expected, fake.gpus[1].uuid: expected}, "GPU 2 is outside the fabric"


@pytest.mark.parametrize(("error", "status"), [("IN_USE", "in_use"), ("UNKNOWN", "unknown"), ("NO_DATA", "no_data")])
def test_a_failed_registration_names_nvmls_status(error: str, status: str) -> None:
    fake = FakeNvml([h200(0, fabric=in_clique(status=code(error)))])
    sample = make(fake, Clock()).sample()
    assert sample.gpus[0].fabric == GpuFabric("completed", CLUSTER, 4, status)
    assert dict(sample.errors) == {}, "the registration's status is data, not a failed call"


def test_a_registration_in_progress_is_seen_completed_at_the_next_slow_cycle() -> None:
    clock = Clock()
    dev0 = h200(0, fabric=FakeFabric(IN_PROGRESS))
    dev1 = h200(1, fabric=FakeFabric(IN_PROGRESS))
    fake = FakeNvml([dev0, dev1])
    backend = make(fake, clock, slow_every=4)
    states: list[tuple[str | None, str | None]] = []
    first: BackendSample | None = None
    for cycle in range(10):
        if cycle == 2:  # the fabric manager finishes registering both GPUs
            dev0.fabric = dev1.fabric = in_clique(state=COMPLETED)
        sample = backend.sample()
        first = first or sample
        gpu0, gpu1 = (g.fabric.state if g.fabric else None for g in sample.gpus)
        states.append((gpu0, gpu1))
        clock.now += 1.0
    # GPU 0 is read at cycles 0, 4, 8; GPU 1 at 0 and, staggered, 1, 5, 9.
    assert [s[0] for s in states] == ["in_progress"] * 4 + ["completed"] * 6
    assert [s[1] for s in states] == ["in_progress"] * 5 + ["completed"] * 5
    assert fake.calls[V] == 3 + 4
    assert first is not None and first.gpus[0].fabric == GpuFabric("in_progress", ZERO_CLUSTER_UUID, 0, "success")
    assert sample.gpus[0].fabric == GpuFabric("completed", CLUSTER, 4, "success")


def test_an_nvml_error_is_counted_blanks_that_gpus_fabric_for_one_cycle_and_loses_nothing_else() -> None:
    clock = Clock()
    fake = FakeNvml([h200(0, fabric=in_clique(), power_mw=300_000), h200(1, fabric=in_clique())])
    fake.fail(V, "UNKNOWN", gpu=fake.gpus[0].uuid)
    both = {"state": "completed", "cluster_uuid": CLUSTER, "clique_id": "4", "status": "success"}
    sampler = Sampler(make(fake, clock, slow_every=10))
    try:
        sampler.run_once()
        failed = rendered(sampler)
        clock.now += 1.0
        sampler.run_once()  # cycle 1: GPU 1's staggered slow cycle; GPU 0 is read again as it failed
        retried = rendered(sampler)
    finally:
        sampler.stop()
    assert fabric_series(failed) == {fake.gpus[1].uuid: both}
    errors = {dict(s.labels)["code"]: s.value for s in failed if s.name == "gpulens_nvml_errors_total"}
    assert errors == {"unknown": 1.0}
    power = {dict(s.labels)["uuid"]: s.value for s in failed if s.name == "gpulens_gpu_power_watts"}
    assert power[fake.gpus[0].uuid] == pytest.approx(300.0), "the GPU's other series stay"
    assert fabric_series(retried) == {fake.gpus[0].uuid: both, fake.gpus[1].uuid: both}
    assert fake.calls[V] == 2 + 2, "GPU 0 retried at the next cycle, not at its next slow one (10)"


def test_an_unknown_state_is_dropped_and_counted() -> None:
    fake = FakeNvml([h200(0, fabric=in_clique(state=7))])
    sample = make(fake, Clock()).sample()
    assert sample.gpus[0].fabric is None
    assert dict(sample.errors) == {"out_of_range": 1}


# --- older bindings and drivers ---------------------------------------------------------------------


def test_a_binding_without_the_versioned_call_uses_the_older_one() -> None:
    fake = FakeNvml([h200(0, fabric=in_clique())])
    fake.remove(V)
    clock = Clock()
    samples = run(make(fake, clock, slow_every=5), clock, 6)
    assert all(s.gpus[0].fabric == GpuFabric("completed", CLUSTER, 4, "success") for s in samples)
    assert (fake.calls[V], fake.calls[OLDER]) == (0, 2)


def test_a_driver_without_the_versioned_call_falls_back_once_and_stays() -> None:
    fake = FakeNvml([h200(0, fabric=in_clique())])
    fake.fail_always(V, "FUNCTION_NOT_FOUND")
    clock = Clock()
    samples = run(make(fake, clock, slow_every=5), clock, 6)
    assert all(s.gpus[0].fabric == GpuFabric("completed", CLUSTER, 4, "success") for s in samples)
    assert all(dict(s.errors) == {} for s in samples)
    assert (fake.calls[V], fake.calls[OLDER]) == (1, 2)


class _Uuid80(ctypes.Structure):
    """nvidia-ml-py 13.610's ``c_nvmlGpuFabricInfo_t``: an 80-byte cluster UUID (NVML writes 16)."""

    _fields_ = (
        ("clusterUuid", ctypes.c_uint8 * 80),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
    )


def test_the_older_call_is_not_used_with_a_struct_laid_out_wrong() -> None:
    fake = FakeNvml([h200(0, fabric=in_clique()), h200(1, fabric=in_clique())])
    fake.remove(V)
    object.__setattr__(fake, "c_nvmlGpuFabricInfo_t", _Uuid80)
    clock = Clock()
    samples = run(make(fake, clock, slow_every=1), clock, 3)
    assert all(g.up and g.fabric is None for s in samples for g in s.gpus)
    assert all(dict(s.errors) == {} for s in samples)
    assert fake.calls[OLDER] == 0


def test_the_fake_insists_on_a_struct_passed_by_reference() -> None:
    # nvidia-ml-py hands the argument to C as is: a struct passed by value would not be filled.
    fake = FakeNvml([h200(0, fabric=in_clique())])
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    info = fake.c_nvmlGpuFabricInfo_v2_t()
    with pytest.raises(AssertionError, match="byref"):
        fake.nvmlDeviceGetGpuFabricInfoV(handle, info)
    fake.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    assert (cluster_uuid_text(info.clusterUuid), info.cliqueId, info.state) == (CLUSTER, 4, COMPLETED)


# --- decoding -------------------------------------------------------------------------------------


def test_state_constants_follow_the_models_order_and_the_bindings_values() -> None:
    assert tuple(FABRIC_STATE_CONSTANTS.values()) == FABRIC_STATES
    assert [getattr(fake_module, c) for c in FABRIC_STATE_CONSTANTS] == list(range(len(FABRIC_STATES)))
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py (extra 'nvml') not installed")
    assert [getattr(pynvml, c) for c in FABRIC_STATE_CONSTANTS] == list(range(len(FABRIC_STATES)))


def test_cluster_uuid_bytes_become_lower_case_8_4_4_4_12_text() -> None:
    raw = bytes.fromhex("5F0C2A9E7D414B8E9A630E2D4C6B8F17")
    assert cluster_uuid_text(raw) == CLUSTER
    assert cluster_uuid_text((ctypes.c_uint8 * 16)(*raw)) == CLUSTER
    assert cluster_uuid_text(bytes(16)) == "00000000-0000-0000-0000-000000000000"
    assert cluster_uuid_text(bytes(80)) is None


@pytest.mark.parametrize(
    "fabric",
    [GpuFabric("completed", CLUSTER, 4026), GpuFabric("in_progress", "00000000-0000-0000-0000-000000000000", 0),
     GpuFabric("completed", CLUSTER, 2, "insufficient_resources")],
)  # fmt: skip
def test_the_fakes_answer_for_a_model_fabric_reads_back_as_that_fabric(fabric: GpuFabric) -> None:
    fake = FakeNvml([h200(0, fabric=FakeFabric.of(fabric))])
    assert make(fake, Clock()).sample().gpus[0].fabric == fabric


# --- the simulator ----------------------------------------------------------------------------------


def test_each_simulated_jobs_node_is_one_clique_of_its_own() -> None:
    gpus = SimulatedBackend("jobs-0").sample().gpus
    fabrics = {g.fabric for g in gpus}
    assert len(gpus) == 8 and len(fabrics) == 1, "every GPU of the node: one cluster, one clique"
    (fabric,) = fabrics
    assert fabric is not None and (fabric.state, fabric.status) == ("completed", "success")
    assert fabric.cluster_uuid == cluster_uuid_text(bytes.fromhex(fabric.cluster_uuid.replace("-", "")))
    assert fabric.cluster_uuid != ZERO_CLUSTER_UUID
    other = {g.fabric for g in build("jobs-1").gpus}
    assert len(other) == 1 and fabric not in other, "the two nodes talk over EFA, not NVLink: two domains"


def test_only_the_jobs_nodes_simulate_a_fabric() -> None:
    with_fabric = {name for name in SCENARIOS if any(g.fabric for g in build(name).gpus)}
    assert with_fabric == {"jobs-0", "jobs-1"}
