"""The sampler -> collector path: what a scrape shows when GPUs are healthy, lost, missing or hung."""

from __future__ import annotations

import time
from dataclasses import replace

from prometheus_client import CollectorRegistry, generate_latest

from exporter.model import BackendSample, GpmSample, GpuSample, LeafSample, MigInstance
from exporter.render.collector import SnapshotCollector
from exporter.render.metrics import CATALOGUE
from exporter.sampler import Sampler, SamplerOptions
from tests.fakes_backend import ScriptedBackend, gpu, healthy


def _registry(sampler: Sampler) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(sampler.latest, backend="sim"))
    return reg


def test_before_the_first_snapshot_only_up_zero_is_served() -> None:
    sampler = Sampler(ScriptedBackend(healthy()))
    reg = _registry(sampler)
    assert reg.get_sample_value("gpulens_up") == 0
    assert reg.get_sample_value("gpulens_gpu_up", {"gpu": "0", "uuid": gpu(0).uuid}) is None


def test_healthy_gpus_render_device_and_leaf_series() -> None:
    sampler = Sampler(ScriptedBackend(healthy(2)))
    sampler.run_once()
    reg = _registry(sampler)
    g0 = {"gpu": "0", "uuid": gpu(0).uuid}
    leaf0 = {**g0, "mig_uuid": "", "gpu_instance_id": "", "compute_instance_id": "", "mig_profile": ""}
    assert reg.get_sample_value("gpulens_up") == 1
    assert reg.get_sample_value("gpulens_gpu_up", g0) == 1
    assert reg.get_sample_value("gpulens_gpu_power_watts", g0) == 300
    assert reg.get_sample_value("gpulens_gpu_sm_active_ratio", leaf0) == 0.5
    assert reg.get_sample_value("gpulens_gpu_pipe_active_max_ratio", leaf0) == 0.1
    assert reg.get_sample_value("gpulens_gpu_memory_used_bytes", leaf0) == 1 << 30
    assert reg.get_sample_value("gpulens_stage_success", {"stage": "nvml"}) == 1


def test_unavailable_fields_are_omitted_not_zero() -> None:
    backend = ScriptedBackend(lambda _n: BackendSample(up=True, gpus=(gpu(0, power_watts=None),)))
    sampler = Sampler(backend)
    sampler.run_once()
    text = generate_latest(_registry(sampler)).decode()
    assert "gpulens_gpu_power_watts" not in text
    assert "NaN" not in text
    assert "gpulens_gpu_temperature_celsius" not in text


def test_lost_gpu_reports_down_and_keeps_the_others() -> None:
    def make(_n: int) -> BackendSample:
        gpus = tuple(gpu(i) for i in range(8))
        lost = GpuSample(index=3, uuid=gpus[3].uuid, up=False)
        return BackendSample(up=True, gpus=(*gpus[:3], lost, *gpus[4:]))

    sampler = Sampler(ScriptedBackend(make))
    sampler.run_once()
    reg = _registry(sampler)
    assert reg.get_sample_value("gpulens_gpu_up", {"gpu": "3", "uuid": gpu(3).uuid}) == 0
    assert reg.get_sample_value("gpulens_gpu_power_watts", {"gpu": "3", "uuid": gpu(3).uuid}) is None
    for i in (0, 1, 2, 4, 5, 6, 7):
        assert reg.get_sample_value("gpulens_gpu_power_watts", {"gpu": str(i), "uuid": gpu(i).uuid}) == 300
    assert reg.get_sample_value("gpulens_up") == 1


def test_no_driver_keeps_serving_with_up_zero() -> None:
    sampler = Sampler(ScriptedBackend(lambda _n: BackendSample(up=False, error="NVML library not found")))
    sampler.run_once()
    reg = _registry(sampler)
    assert reg.get_sample_value("gpulens_up") == 0
    assert reg.get_sample_value("gpulens_stage_success", {"stage": "nvml"}) == 0
    assert "gpulens_gpu_up" not in generate_latest(reg).decode()


def test_hung_backend_call_misses_its_deadline_and_is_not_duplicated() -> None:
    backend = ScriptedBackend(healthy())
    sampler = Sampler(backend, SamplerOptions(interval_seconds=0.1, deadline_seconds=0.2))
    sampler.run_once()
    backend.hang = True
    t0 = time.monotonic()
    snap = sampler.run_once()
    assert time.monotonic() - t0 < 1.0
    assert snap.backend.up is False
    sampler.run_once()
    sampler.run_once()
    assert backend.calls == 2, "a hung call must not be stacked with new ones"
    reg = _registry(sampler)
    assert reg.get_sample_value("gpulens_stage_success", {"stage": "nvml"}) == 0
    backend.hang = False
    backend.release.set()
    time.sleep(0.05)
    snap = sampler.run_once()
    assert snap.backend.up is True


def test_scrapes_never_call_the_backend() -> None:
    backend = ScriptedBackend(healthy())
    sampler = Sampler(backend)
    sampler.run_once()
    reg = _registry(sampler)
    for _ in range(100):
        generate_latest(reg)
    assert backend.calls == 1


def test_snapshot_age_grows_while_sampling_is_stuck() -> None:
    clock = [1000.0]
    sampler = Sampler(ScriptedBackend(healthy()), wall=lambda: clock[0])
    sampler.run_once()
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(sampler.latest, wall=lambda: clock[0] + 42))
    assert reg.get_sample_value("gpulens_snapshot_age_seconds") == 42


def test_activity_integrals_are_exact_over_windows() -> None:
    sampler = Sampler(ScriptedBackend(healthy(1)))
    for _ in range(10):
        sampler.run_once()
    reg = _registry(sampler)
    leaf = {"gpu": "0", "uuid": gpu(0).uuid, "mig_uuid": "", "gpu_instance_id": "", "compute_instance_id": ""}
    leaf["mig_profile"] = ""
    assert reg.get_sample_value("gpulens_gpu_sm_active_seconds_total", leaf) == 5.0
    assert reg.get_sample_value("gpulens_gpu_dram_active_seconds_total", leaf) == 2.5


def test_a_leaf_without_gpm_integrates_its_busy_ratio_over_the_time_since_the_last_read() -> None:
    # GPU-Util 0.5 and no GPM window (a GPU without GPM). Cycle 3 cannot read the GPUs: cycle 4's
    # reading stands for the time since cycle 2, as a GPM window would span the gap.
    def make(n: int) -> BackendSample:
        if n == 3:
            return BackendSample(up=False, error="driver busy")
        leaf = replace(gpu(0).leaves[0], gpm=None, utilization_ratio=0.5)
        return BackendSample(up=True, gpus=(gpu(0, leaves=(leaf,)),), gpm_supported=False)

    clock = [100.0]
    sampler = Sampler(ScriptedBackend(make), clock=lambda: clock[0])
    busy = []
    for step in (0.0, 1.0, 1.0, 2.0):
        clock[0] += step
        snap = sampler.run_once()
        leaf = snap.analysis.get(gpu(0).uuid)
        busy.append(None if leaf is None else (leaf.busy_ratio, leaf.busy_seconds, leaf.signals))
    assert busy == [(0.5, 0.0, "nvml"), (0.5, 0.5, "nvml"), None, (0.5, 2.0, "nvml")]
    reg = _registry(sampler)
    leaf_labels = {"gpu": "0", "uuid": gpu(0).uuid, "mig_uuid": "", "gpu_instance_id": "", "compute_instance_id": ""}
    leaf_labels["mig_profile"] = ""
    assert reg.get_sample_value("gpulens_gpu_busy_seconds_total", leaf_labels) == 2.0
    assert reg.get_sample_value("gpulens_gpu_busy_ratio", leaf_labels) == 0.5


def test_energy_counter_survives_a_driver_counter_reset() -> None:
    readings = [1000.0, 1100.0, 50.0, 80.0]
    sampler = Sampler(ScriptedBackend(lambda n: BackendSample(up=True, gpus=(gpu(0, energy_joules=readings[n - 1]),))))
    for _ in readings:
        sampler.run_once()
    reg = _registry(sampler)
    # 1000 is the origin; +100, then a reset (+50), then +30.
    assert reg.get_sample_value("gpulens_gpu_energy_joules_total", {"gpu": "0", "uuid": gpu(0).uuid}) == 180


def test_xid_events_are_counted_once_and_never_reset() -> None:
    events = [(79,), (), (79, 31), ()]
    sampler = Sampler(ScriptedBackend(lambda n: BackendSample(up=True, gpus=(gpu(0, xid_events=events[n - 1]),))))
    for _ in events:
        sampler.run_once()
    reg = _registry(sampler)
    g0 = {"gpu": "0", "uuid": gpu(0).uuid}
    assert reg.get_sample_value("gpulens_gpu_xid_errors_total", {**g0, "xid": "79"}) == 2
    assert reg.get_sample_value("gpulens_gpu_xid_errors_total", {**g0, "xid": "31"}) == 1
    assert reg.get_sample_value("gpulens_gpu_up", g0) == 1


def test_mig_leaves_carry_their_identity_labels() -> None:
    base = gpu(0, mig_mode="enabled")
    mig = MigInstance(mig_uuid="MIG-aaaa", gpu_instance_id=1, compute_instance_id=0, profile="1g.18gb")
    leaf = LeafSample(uuid=base.uuid, mig=mig, memory_total_bytes=18 << 30, gpm=GpmSample(1.0, sm_active=0.7))
    sampler = Sampler(ScriptedBackend(lambda _n: BackendSample(up=True, gpus=(replace(base, leaves=(leaf,)),))))
    sampler.run_once()
    sampler.run_once()
    reg = _registry(sampler)
    lab = {
        "gpu": "0",
        "uuid": base.uuid,
        "mig_uuid": "MIG-aaaa",
        "gpu_instance_id": "1",
        "compute_instance_id": "0",
        "mig_profile": "1g.18gb",
    }
    assert reg.get_sample_value("gpulens_mig_instance_info", lab) == 1
    assert reg.get_sample_value("gpulens_gpu_sm_active_ratio", lab) == 0.7
    assert reg.get_sample_value("gpulens_gpu_sm_active_seconds_total", lab) == 1.4
    assert reg.get_sample_value("gpulens_gpu_energy_joules_total", {"gpu": "0", "uuid": base.uuid}) == 0


def test_a_failing_family_drops_only_itself() -> None:
    sampler = Sampler(ScriptedBackend(healthy(1)))
    sampler.run_once()

    def broken(_view: object) -> list[tuple[tuple[str, ...], float]]:
        raise RuntimeError("boom")

    catalogue = [replace(s, read=broken) if s.name == "gpulens_gpu_power_watts" else s for s in CATALOGUE]
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(sampler.latest, catalogue=catalogue))
    g0 = {"gpu": "0", "uuid": gpu(0).uuid}
    assert reg.get_sample_value("gpulens_stage_success", {"stage": "render_gpulens_gpu_power_watts"}) == 0
    assert reg.get_sample_value("gpulens_gpu_power_watts", g0) is None
    # The rest of the GPU's device series, same scope included, still render.
    assert reg.get_sample_value("gpulens_gpu_up", g0) == 1
    assert reg.get_sample_value("gpulens_gpu_utilization_ratio", g0) == 0.5
    assert reg.get_sample_value("gpulens_gpu_energy_joules_total", g0) == 0


def test_cached_exposition_encodes_once_per_snapshot_and_keeps_age_fresh() -> None:
    from exporter.render.collector import CachedExposition

    backend = ScriptedBackend(healthy(2))
    clock = [2000.0]
    sampler = Sampler(backend, wall=lambda: clock[0])
    calls = [0]

    class CountingCollector(SnapshotCollector):
        def exposition(self, openmetrics: bool) -> str:
            calls[0] += 1
            return super().exposition(openmetrics)

    expo = CachedExposition(CountingCollector(sampler.latest, include_age=False), sampler.latest, wall=lambda: clock[0])
    sampler.run_once()
    first, _ = expo.render("")
    clock[0] += 0.5
    second, ctype = expo.render("")
    assert calls[0] == 1
    assert ctype.startswith("text/plain")
    assert b"gpulens_snapshot_age_seconds 0.0\n" in first
    assert b"gpulens_snapshot_age_seconds 0.5\n" in second
    assert first.replace(b"age_seconds 0.0", b"") == second.replace(b"age_seconds 0.5", b"")
    om, om_type = expo.render("application/openmetrics-text; version=1.0.0")
    assert om_type.startswith("application/openmetrics-text")
    assert om.endswith(b"gpulens_snapshot_age_seconds 0.5\n# EOF\n")
    sampler.run_once()
    expo.render("")
    assert calls[0] == 3


def test_prepare_encodes_ahead_only_the_formats_the_last_snapshot_was_scraped_in() -> None:
    from exporter.render.collector import CachedExposition

    sampler = Sampler(ScriptedBackend(healthy(1)))
    encoded: list[bool] = []

    class CountingCollector(SnapshotCollector):
        def exposition(self, openmetrics: bool) -> str:
            encoded.append(openmetrics)
            return super().exposition(openmetrics)

    expo = CachedExposition(CountingCollector(sampler.latest, include_age=False), sampler.latest)
    expo.prepare(sampler.run_once())
    assert encoded == [], "nobody scraped yet: nothing encoded ahead"
    expo.render("")
    assert encoded == [False]
    expo.prepare(sampler.run_once())
    assert encoded == [False, False], "the next snapshot, encoded ahead in the format asked"
    expo.render("")
    assert encoded == [False, False], "the scrape found it encoded"
    expo.render("application/openmetrics-text; version=1.0.0")
    expo.prepare(sampler.run_once())
    assert encoded[:3] == [False, False, True] and sorted(encoded[3:]) == [False, True], "both asked: both ahead"
    expo.prepare(sampler.run_once())
    assert len(encoded) == 5, "a snapshot encoded ahead but never scraped does not carry on (rare scrapes)"
    snap = sampler.latest()
    expo.prepare(snap)  # type: ignore[arg-type]
    assert len(encoded) == 5, "the same snapshot twice: nothing new"
