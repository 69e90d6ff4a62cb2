"""NvmlBackend against a fake pynvml: values and units, and every NVML failure it must survive."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Iterator

import pytest

from exporter.backends.base import GpuBackend
from exporter.backends.nvml.backend import NvmlBackend
from exporter.model import BackendSample, GpuSample
from tests.fakes import fake_pynvml as fake_module
from tests.fakes.fake_pynvml import FakeGpu, FakeMig, FakeNvml, FakeProcess
from tests.support.nvml_node import Clock, h200, make

SM, OCC, TENSOR, DRAM, FP64, FP32, FP16 = 2, 3, 5, 10, 11, 12, 13
NVLINK_RX, NVLINK_TX = 60, 61


@pytest.fixture()
def clock() -> Clock:
    return Clock()


def cycles(backend: NvmlBackend, clock: Clock, n: int) -> Iterator[BackendSample]:
    for _ in range(n):
        yield backend.sample()
        clock.now += 1.0


def gpu(sample: BackendSample, index: int) -> GpuSample:
    return next(g for g in sample.gpus if g.index == index)


def test_backend_satisfies_the_protocol() -> None:
    assert isinstance(NvmlBackend(nvml=FakeNvml([])), GpuBackend)
    assert NvmlBackend.name == "nvml"


def test_every_device_metric_arrives_in_base_units(clock: Clock) -> None:
    dev = h200(
        util_gpu=99,
        util_memory=25,
        memory_used=10 << 30,
        power_mw=650_500,
        power_limit_mw=700_000,
        energy_mj=123_456_789,
        temperature=61,
        memory_temperature=70,
        fan=40,
        sm_clock_mhz=1980,
        memory_clock_mhz=3201,
        clock_reasons=fake_module.nvmlClocksEventReasonSwPowerCap,
        pcie_tx_kib=1000,
        pcie_rx_kib=250,
        pcie_replay=3,
        ecc=(5, 1),
        remapped_rows=(2, 1, 1, 0),
        gpm={SM: 96.0, OCC: 14.0, TENSOR: 93.0, DRAM: 17.0, FP64: 0.0, FP32: 0.5, FP16: 0.0},
        processes=[FakeProcess(pid=4242, used_memory=8 << 30)],
        process_util=[(4242, 97, 25)],
    )
    backend = make(FakeNvml([dev]), clock, pcie_every=1)
    first, second = cycles(backend, clock, 2)

    assert first.up and first.driver_version == "580.159.04"
    assert first.gpus[0].leaves[0].gpm is None, "GPM needs two samples: none on the first cycle"
    g = gpu(second, 0)
    assert (g.name, g.uuid, g.pci_bus_id, g.compute_capability) == (
        "NVIDIA H200",
        dev.uuid,
        "00000000:00:00.0",
        "9.0",
    )
    assert (g.mig_mode, g.compute_mode) == ("disabled", "default")
    assert g.utilization_ratio == pytest.approx(0.99)
    assert g.memory_utilization_ratio == pytest.approx(0.25)
    assert (g.memory_used_bytes, g.memory_total_bytes) == (10 << 30, dev.memory_total)
    assert g.power_watts == pytest.approx(650.5)
    assert g.power_limit_watts == pytest.approx(700.0)
    assert g.energy_joules == pytest.approx(123_456.789)
    assert (g.temperature_celsius, g.memory_temperature_celsius) == (61.0, 70.0)
    assert g.fan_speed_ratio == pytest.approx(0.40)
    assert g.sm_clock_hertz == 1.98e9 and g.sm_clock_max_hertz == 1.98e9
    assert g.memory_clock_hertz == 3.201e9
    assert g.clock_events is not None
    assert g.clock_events["sw_power_cap"] is True and g.clock_events["gpu_idle"] is False
    assert set(g.clock_events) >= {"hw_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"}
    assert (g.pcie_tx_bytes_per_second, g.pcie_rx_bytes_per_second) == (1000 * 1024, 250 * 1024)
    assert (g.pcie_link_generation, g.pcie_link_width, g.pcie_replay_errors) == (5, 16, 3)
    assert dict(g.ecc_errors or {}) == {"corrected": 5, "uncorrected": 1}
    assert dict(g.remapped_rows or {}) == {"correctable": 2, "uncorrectable": 1, "pending": 1, "failure": 0}
    assert g.nvlink_tx_bytes_per_second is None, "no NVLink on this GPU: omitted, never 0"

    (leaf,) = g.leaves
    assert leaf.uuid == dev.uuid and leaf.mig is None and leaf.utilization_ratio == pytest.approx(0.99)
    assert leaf.gpm is not None
    assert leaf.gpm.window_seconds == pytest.approx(1.0)
    assert leaf.gpm.sm_active == pytest.approx(0.96)
    assert leaf.gpm.sm_occupancy == pytest.approx(0.14)
    assert leaf.gpm.tensor_active == pytest.approx(0.93)
    assert leaf.gpm.dram_active == pytest.approx(0.17)
    assert leaf.gpm.fp32_active == pytest.approx(0.005)
    (proc,) = leaf.processes
    assert (proc.pid, proc.used_memory_bytes) == (4242, 8 << 30)
    assert proc.sm_util_ratio == pytest.approx(0.97) and proc.memory_util_ratio == pytest.approx(0.25)
    assert proc.gpu_instance_id is None and proc.compute_instance_id is None
    assert second.gpm_supported is True and dict(second.errors) == {}


def test_nvlink_throughput_comes_from_gpm_on_gpus_with_nvlink(clock: Clock) -> None:
    dev = h200(nvlink=True, gpm={SM: 10.0, NVLINK_RX: 100.0, NVLINK_TX: 50.0})
    _, second = cycles(make(FakeNvml([dev]), clock), clock, 2)
    g = gpu(second, 0)
    assert g.nvlink_rx_bytes_per_second == 100 * 1024 * 1024
    assert g.nvlink_tx_bytes_per_second == 50 * 1024 * 1024


def test_not_supported_is_asked_once_per_device_and_then_omitted(clock: Clock) -> None:
    fake = FakeNvml([h200(0, fan=None), h200(1, fan=55)])
    samples = list(cycles(make(fake, clock, slow_every=1), clock, 5))
    assert all(gpu(s, 0).fan_speed_ratio is None for s in samples)
    assert all(gpu(s, 1).fan_speed_ratio == pytest.approx(0.55) for s in samples)
    assert fake.calls["nvmlDeviceGetFanSpeed"] == 1 + 5, "GPU 0 asked once, GPU 1 every cycle"
    assert all(dict(s.errors) == {} for s in samples), "NotSupported is not an error"


def test_temperature_thresholds_are_read_once_per_gpu_by_kind(clock: Clock) -> None:
    h200_limits = {"slowdown": 89, "shutdown": 95, "gpu_max": 87, "memory_max": 95}
    dev = h200(0, temperature_thresholds=dict(h200_limits))
    fake = FakeNvml([dev, h200(1, temperature_thresholds={})])
    backend = make(fake, clock, slow_every=1)
    first = backend.sample()
    dev.temperature_thresholds["slowdown"] = 70  # a limit is static: not read again
    samples = [first, *cycles(backend, clock, 3)]
    for s in samples:
        assert dict(gpu(s, 0).temperature_thresholds or {}) == {k: float(v) for k, v in h200_limits.items()}
        assert gpu(s, 1).temperature_thresholds is None, "no kind answered: no thresholds at all"
        assert dict(s.errors) == {}
    assert fake.calls["nvmlDeviceGetTemperatureThreshold"] == 8, "4 kinds x 2 GPUs, once each"


def test_an_unsupported_temperature_threshold_is_omitted_and_never_asked_again(clock: Clock) -> None:
    dev = h200(0, temperature_thresholds={"slowdown": 89, "shutdown": 95, "gpu_max": 87, "memory_max": None})
    fake = FakeNvml([dev])
    # Lost during its first identity read, after the thresholds: the identity is read again,
    # without the threshold NVML refused.
    fake.fail("nvmlDeviceGetMaxPcieLinkGeneration", "GPU_IS_LOST")
    samples = list(cycles(make(fake, clock), clock, 4))
    expected = {"slowdown": 89.0, "shutdown": 95.0, "gpu_max": 87.0}
    assert all(dict(s.gpus[0].temperature_thresholds or {}) == expected for s in samples)
    assert all(dict(s.errors) == {} for s in samples)
    assert fake.calls["nvmlDeviceGetTemperatureThreshold"] == 4 + 3
    assert fake.calls["nvmlDeviceGetMaxPcieLinkGeneration"] == 2


def test_one_lost_gpu_of_eight_leaves_the_other_seven_intact(clock: Clock) -> None:
    fake = FakeNvml([h200(i, power_mw=100_000 + i) for i in range(8)])
    backend = make(fake, clock)
    before = backend.sample()
    fake.gpus[3].lost = True
    after = backend.sample()
    assert after.up and len(after.gpus) == 8
    lost = gpu(after, 3)
    assert lost == GpuSample(index=3, uuid=fake.gpus[3].uuid, up=False)
    for i in (0, 1, 2, 4, 5, 6, 7):
        assert gpu(after, i).up and gpu(after, i).power_watts == gpu(before, i).power_watts
    fake.gpus[3].lost = False
    assert gpu(backend.sample(), 3).up, "a GPU that answers again is read again"


def test_handle_lookup_failing_for_one_index_marks_only_that_gpu_down(clock: Clock) -> None:
    fake = FakeNvml([h200(i) for i in range(4)])
    fake.fail_always("nvmlDeviceGetHandleByIndex", "GPU_IS_LOST", gpu=fake.gpus[2].uuid)
    backend = make(fake, clock)
    sample = backend.sample()
    assert sample.up and [g.up for g in sample.gpus] == [True, True, False, True]
    assert gpu(sample, 2).index == 2
    fake.clear_failures()
    healed = backend.sample()
    assert gpu(healed, 2).up and gpu(healed, 2).uuid == fake.gpus[2].uuid


@pytest.mark.parametrize("error", ["UNKNOWN", "TIMEOUT"])
def test_transient_error_blanks_one_field_for_one_cycle_and_is_counted(clock: Clock, error: str) -> None:
    fake = FakeNvml([h200(0, power_mw=300_000)])
    backend = make(fake, clock)
    fake.fail("nvmlDeviceGetPowerUsage", error)
    failed = backend.sample()
    assert gpu(failed, 0).up and gpu(failed, 0).power_watts is None
    assert gpu(failed, 0).temperature_celsius == 30.0, "other fields are still read"
    assert dict(failed.errors) == {error.lower(): 1}
    recovered = backend.sample()
    assert gpu(recovered, 0).power_watts == pytest.approx(300.0)
    assert dict(recovered.errors) == {}


def test_missing_library_retries_with_doubling_backoff_then_recovers(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNvml([h200(0)])
    fake.init_error = fake_module.code("LIBRARY_NOT_FOUND")
    backend = make(fake, clock)
    caplog.set_level(logging.WARNING, logger="exporter.backends.nvml.backend")
    attempts_at = []
    clock.now = 0.0
    while clock.now < 40.0:
        before = fake.calls["nvmlInit"]
        sample = backend.sample()
        assert not sample.up and sample.gpus == ()
        assert sample.error is not None and "library_not_found" in sample.error
        if fake.calls["nvmlInit"] > before:
            attempts_at.append(clock.now)
        clock.now += 0.5
    assert attempts_at == [0.0, 1.0, 3.0, 7.0, 15.0, 31.0], "1 s doubling"
    assert len([r for r in caplog.records if "retrying in" in r.getMessage()]) == len(attempts_at)

    fake.init_error = None
    clock.now = 63.0
    recovered = backend.sample()
    assert recovered.up and gpu(recovered, 0).uuid == fake.gpus[0].uuid


def test_backoff_is_capped_at_sixty_seconds(clock: Clock) -> None:
    fake = FakeNvml([])
    fake.init_error = fake_module.code("DRIVER_NOT_LOADED")
    backend = make(fake, clock)
    attempts_at = []
    clock.now = 0.0
    while clock.now < 400.0:
        before = fake.calls["nvmlInit"]
        backend.sample()
        if fake.calls["nvmlInit"] > before:
            attempts_at.append(clock.now)
        clock.now += 1.0
    gaps = [b - a for a, b in itertools.pairwise(attempts_at)]
    assert gaps[:6] == [1, 2, 4, 8, 16, 32] and set(gaps[6:]) == {60}


def test_driver_version_mismatch_reports_down_with_the_reason(clock: Clock) -> None:
    fake = FakeNvml([h200(0)])
    fake.init_error = fake_module.code("LIB_RM_VERSION_MISMATCH")
    sample = make(fake, clock).sample()
    assert sample == BackendSample(up=False, error=sample.error)
    assert sample.error is not None and "lib_rm_version_mismatch" in sample.error


def test_missing_pynvml_module_reports_down_instead_of_raising(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name: str, *args: object, **kwargs: object) -> object:
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    sample = NvmlBackend(clock=clock).sample()
    assert not sample.up and sample.error is not None and "nvidia-ml-py" in sample.error


def test_enumeration_failing_right_after_init_reports_down_and_retries(clock: Clock) -> None:
    fake = FakeNvml([h200(0)])
    fake.fail("nvmlDeviceGetCount", "UNINITIALIZED")
    backend = make(fake, clock)
    failed = backend.sample()
    assert not failed.up and failed.error is not None and "during enumeration" in failed.error
    assert backend.sample() == failed, "no new attempt before the first backoff second"
    clock.now += 1.0
    recovered = backend.sample()
    assert recovered.up and gpu(recovered, 0).up and fake.calls["nvmlInit"] == 2


def test_driver_reload_reinitialises_with_the_same_uuids_and_fresh_handles(clock: Clock) -> None:
    fake = FakeNvml([h200(i) for i in range(2)])
    backend = make(fake, clock)
    before = backend.sample()
    fake.reload_driver()  # every old handle now answers Uninitialized
    after = backend.sample()
    assert after.up and all(g.up for g in after.gpus)
    assert [g.uuid for g in after.gpus] == [g.uuid for g in before.gpus]
    assert fake.calls["nvmlInit"] == 2
    again = backend.sample()
    assert again.up and all(g.up for g in again.gpus), "no stale handle survives the re-init"


def test_after_a_driver_reload_gpm_starts_afresh_and_stale_buffers_are_not_touched(clock: Clock) -> None:
    fake = FakeNvml([h200(0, gpm={SM: 40.0})])
    backend = make(fake, clock)
    warm = list(cycles(backend, clock, 2))
    assert warm[-1].gpus[0].leaves[0].gpm is not None
    fake.reload_driver()
    reloaded, settled = cycles(backend, clock, 2)
    assert reloaded.up and reloaded.gpus[0].leaves[0].gpm is None, "a new session's window needs two samples"
    assert settled.gpus[0].leaves[0].gpm is not None
    assert fake.calls["nvmlGpmSampleFree"] == 0, "buffers of the lost session are stale pointers: never freed"
    assert fake.calls["nvmlEventSetFree"] == 0


def test_each_xid_event_is_reported_exactly_once(clock: Clock) -> None:
    fake = FakeNvml([h200(0), h200(1)])
    backend = make(fake, clock)
    fake.gpus[1].xid_queue.extend([79])
    s1 = backend.sample()
    s2 = backend.sample()
    fake.gpus[1].xid_queue.extend([31, 79])
    fake.gpus[0].xid_queue.extend([48])
    s3 = backend.sample()
    assert gpu(s1, 1).xid_events == (79,) and gpu(s1, 0).xid_events == ()
    assert gpu(s2, 1).xid_events == ()
    assert gpu(s3, 1).xid_events == (31, 79) and gpu(s3, 0).xid_events == (48,)
    assert gpu(s3, 1).up, "an Xid does not mark the GPU down"
    assert dict(s3.errors) == {}, "the empty-queue Timeout is not an error"


def mig_gpu() -> FakeGpu:
    return h200(
        0,
        mig_mode=1,
        migs=[
            FakeMig(
                "MIG-aaaa",
                gpu_instance_id=7,
                compute_instance_id=0,
                name="NVIDIA H200 MIG 1g.18gb",
                memory_used=1 << 30,
                memory_total=16 << 30,
                gpm={SM: 80.0, DRAM: 70.0},
                processes=[FakeProcess(pid=11, used_memory=1 << 30, gpu_instance_id=7, compute_instance_id=0)],
            ),
            FakeMig(
                "MIG-bbbb",
                gpu_instance_id=1,
                compute_instance_id=0,
                name="NVIDIA H200 MIG 3g.71gb",
                memory_total=70 << 30,
                gpm={SM: 5.0, TENSOR: 4.0},
            ),
        ],
    )


def test_mig_instances_become_leaves_with_their_own_gpm(clock: Clock) -> None:
    fake = FakeNvml([mig_gpu()])
    backend = make(fake, clock)
    _, second = cycles(backend, clock, 2)
    g = gpu(second, 0)
    assert g.mig_mode == "enabled"
    by_id = {leaf.leaf_id: leaf for leaf in g.leaves}
    assert set(by_id) == {"MIG-aaaa", "MIG-bbbb"}
    a, b = by_id["MIG-aaaa"], by_id["MIG-bbbb"]
    assert a.uuid == g.uuid and a.mig is not None and b.mig is not None
    assert (a.mig.gpu_instance_id, a.mig.compute_instance_id, a.mig.profile) == (7, 0, "1g.18gb")
    assert b.mig.profile == "3g.71gb"
    assert (a.memory_used_bytes, a.memory_total_bytes) == (1 << 30, 16 << 30)
    assert a.gpm is not None and a.gpm.sm_active == pytest.approx(0.8) and a.gpm.dram_active == pytest.approx(0.7)
    assert b.gpm is not None and b.gpm.tensor_active == pytest.approx(0.04) and b.gpm.dram_active is None
    assert [(p.pid, p.gpu_instance_id, p.compute_instance_id) for p in a.processes] == [(11, 7, 0)]
    assert fake.calls["nvmlGpmSampleGet"] == 0, "MIG GPM goes through nvmlGpmMigSampleGet on the parent"
    assert fake.calls["nvmlGpmMigSampleGet"] == 4


def test_mig_reconfiguration_swaps_leaves_without_crashing_or_leaking(clock: Clock) -> None:
    fake = FakeNvml([mig_gpu()])
    backend = make(fake, clock)
    list(cycles(backend, clock, 2))
    fake.gpus[0].migs = [FakeMig("MIG-cccc", gpu_instance_id=2, name="NVIDIA H200 MIG 2g.35gb", gpm={SM: 1.0})]
    changed, settled = cycles(backend, clock, 2)
    assert [leaf.leaf_id for leaf in gpu(changed, 0).leaves] == ["MIG-cccc"]
    assert gpu(changed, 0).leaves[0].gpm is None, "a new instance starts a fresh GPM window"
    assert gpu(settled, 0).leaves[0].gpm is not None
    assert gpu(settled, 0).leaves[0].mig.profile == "2g.35gb"  # type: ignore[union-attr]
    live = [s for s in fake.gpm_samples if not s.freed]
    assert len(live) == 2, "only the current instance holds GPM buffers; the old ones were freed"


def test_mig_profile_comes_from_the_gpu_instance_profile_when_the_device_name_lacks_it(clock: Clock) -> None:
    # Older drivers name MIG devices without the profile; the GPU instance profile names it, or
    # failing that its slice count and memory size do.
    dev = mig_gpu()
    dev.migs[0].name = dev.migs[1].name = "NVIDIA H200 MIG"
    dev.migs[0].profile_id, dev.migs[0].profile_name = 19, "MIG 1g.18gb"
    dev.migs[1].profile_id, dev.migs[1].profile_name = 9, ""
    dev.migs[1].profile_slices, dev.migs[1].profile_memory_mib = 3, 71 * 1024
    fake = FakeNvml([dev])
    samples = list(cycles(make(fake, clock), clock, 3))
    profiles = {leaf.leaf_id: leaf.mig.profile for leaf in samples[-1].gpus[0].leaves if leaf.mig is not None}
    assert profiles == {"MIG-aaaa": "1g.18gb", "MIG-bbbb": "3g.71gb"}
    assert fake.calls["nvmlDeviceGetGpuInstanceProfileInfoById"] == 2, "asked once per instance, then remembered"
    assert all(dict(s.errors) == {} for s in samples)


def test_gpm_refused_leaves_gpm_empty_and_says_so(clock: Clock) -> None:
    fake = FakeNvml([h200(0, gpm={SM: 50.0})])
    fake.fail_always("nvmlGpmSampleGet", "NO_PERMISSION")
    samples = list(cycles(make(fake, clock), clock, 4))
    assert all(s.gpus[0].leaves[0].gpm is None for s in samples)
    assert samples[-1].gpm_supported is False
    assert fake.calls["nvmlGpmSampleGet"] == 1, "refused once, not asked again"


def test_pre_hopper_gpu_has_no_gpm_and_is_not_asked(clock: Clock) -> None:
    fake = FakeNvml([h200(0, gpm_supported=False, compute_capability=(8, 0))])
    samples = list(cycles(make(fake, clock), clock, 3))
    assert samples[-1].gpm_supported is False and samples[-1].gpus[0].leaves[0].gpm is None
    assert fake.calls["nvmlGpmSampleGet"] == 0 and fake.calls["nvmlGpmSampleAlloc"] == 0


def test_gpm_switched_off_is_never_asked_on_a_hopper_gpu(clock: Clock) -> None:
    # --no-collect.gpm: the GPU reads as one without GPM; its links come from NVML's other sources.
    fake = FakeNvml([h200(0, gpm={SM: 50.0})])
    samples = list(cycles(NvmlBackend(nvml=fake, clock=clock, wall_clock=clock.wall, gpm=False), clock, 3))
    assert samples[-1].gpm_supported is False
    assert all(s.gpus[0].leaves[0].gpm is None for s in samples)
    assert {name for name in fake.calls if "Gpm" in name} == set(), "no GPM call at all"
    links = samples[-1].gpus[0].leaves[0].links
    assert links and all(link.source != "gpm" for link in links)
    control = NvmlBackend(nvml=FakeNvml([h200(0, gpm={SM: 50.0})]), clock=clock, wall_clock=clock.wall)
    on = list(cycles(control, clock, 3))
    assert on[-1].gpm_supported is True and on[-1].gpus[0].leaves[0].gpm is not None, "the control: GPM on"


def test_process_utilisation_uses_the_previous_cycle_timestamp_and_notfound_is_empty(clock: Clock) -> None:
    fake = FakeNvml([h200(0, processes=[FakeProcess(pid=7)], process_util=[])])
    backend = make(fake, clock)
    first_at = clock.wall()
    _, s2 = cycles(backend, clock, 2)
    assert fake.process_util_timestamps == [int(first_at * 1e6)]
    (proc,) = s2.gpus[0].leaves[0].processes
    assert proc.pid == 7 and proc.sm_util_ratio is None, "no process ran: no utilisation, not an error"
    assert dict(s2.errors) == {}


def test_gpu_without_processes_skips_the_costly_process_utilisation_call(clock: Clock) -> None:
    dev = h200(0, processes=[], process_util=[(9, 50, 5)])
    fake = FakeNvml([dev])
    backend = make(fake, clock)
    list(cycles(backend, clock, 3))
    assert fake.calls["nvmlDeviceGetProcessUtilization"] == 0
    dev.processes = [FakeProcess(pid=9)]
    (proc,) = next(cycles(backend, clock, 1)).gpus[0].leaves[0].processes
    assert proc.sm_util_ratio == pytest.approx(0.5)
    assert fake.process_util_timestamps == [int((clock.wall() - 1.0) * 1e6)], "window = previous cycle"


def test_process_utilisation_is_read_every_five_seconds_over_all_samples_since_the_last_read(clock: Clock) -> None:
    """The read costs ~2 ms whatever it returns, and NVML keeps the samples between reads: one
    read per ``PROCESS_UTILIZATION_SECONDS`` while the same processes run, its answer held in
    between; a process the last read did not know is read at once."""
    dev = h200(0, processes=[FakeProcess(pid=9)], process_util=[(9, 50, 5)])
    fake = FakeNvml([dev])
    backend = make(fake, clock)
    start = clock.wall()
    shares = [s.gpus[0].leaves[0].processes[0].sm_util_ratio for s in cycles(backend, clock, 12)]
    assert shares[0] is None, "the first cycle has no window yet"
    assert shares[1:] == [pytest.approx(0.5)] * 11, "held between reads"
    assert fake.process_util_timestamps == [int((start + t) * 1e6) for t in (0.0, 1.0, 6.0)], (
        "read on the second cycle (a new process), then 5 s later, each over the samples since the last read"
    )
    dev.process_util = [(9, 20, 5), (11, 70, 7)]
    dev.processes = [FakeProcess(pid=9), FakeProcess(pid=11)]
    (s,) = cycles(backend, clock, 1)
    assert {p.pid: p.sm_util_ratio for p in s.gpus[0].leaves[0].processes} == {
        9: pytest.approx(0.2),
        11: pytest.approx(0.7),
    }, "a new tenant is read on the cycle it appears"
    assert len(fake.process_util_timestamps) == 4
    dev.processes = []
    list(cycles(backend, clock, 2))
    dev.processes = [FakeProcess(pid=9)]
    (s,) = cycles(backend, clock, 1)
    assert s.gpus[0].leaves[0].processes[0].sm_util_ratio == pytest.approx(0.2)
    assert fake.process_util_timestamps[-1] == int((clock.wall() - 2.0) * 1e6), (
        "after an idle spell the window is the last cycle, not the time since the old read"
    )


def test_absurd_values_are_dropped_and_counted(clock: Clock) -> None:
    fake = FakeNvml([h200(0, util_gpu=101, temperature=0xFFFFFFFF, power_mw=0xFFFFFFFF, gpm={SM: 250.0})])
    _, second = cycles(make(fake, clock), clock, 2)
    g = gpu(second, 0)
    assert g.utilization_ratio is None and g.temperature_celsius is None and g.power_watts is None
    assert g.leaves[0].gpm is None, "the only GPM metric was absurd"
    assert second.errors["out_of_range"] == 4
    assert g.memory_utilization_ratio == 0.0, "sane neighbours are kept"


def test_tiny_negative_gpm_values_are_clamped_to_zero(clock: Clock) -> None:
    fake = FakeNvml([h200(0, gpm={SM: -0.001, DRAM: 100.2})])
    _, second = cycles(make(fake, clock), clock, 2)
    gpm = second.gpus[0].leaves[0].gpm
    assert gpm is not None and gpm.sm_active == 0.0 and gpm.dram_active == 1.0


def test_function_not_found_is_treated_as_unsupported(clock: Clock) -> None:
    fake = FakeNvml([h200(0)])
    fake.fail_always("nvmlDeviceGetTotalEnergyConsumption", "FUNCTION_NOT_FOUND")
    samples = list(cycles(make(fake, clock), clock, 3))
    assert all(s.gpus[0].energy_joules is None for s in samples)
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1


def test_function_missing_from_an_old_binding_falls_back(clock: Clock) -> None:
    fake = FakeNvml([h200(0, clock_reasons=fake_module.nvmlClocksEventReasonHwSlowdown)])
    fake.remove("nvmlDeviceGetCurrentClocksEventReasons")
    fake.remove("nvmlDeviceGetSupportedClocksEventReasons")
    samples = list(cycles(make(fake, clock), clock, 2))
    events = samples[-1].gpus[0].clock_events
    assert events is not None and events["hw_slowdown"] is True
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 2


def test_attribute_error_inside_the_binding_is_treated_as_unsupported(clock: Clock) -> None:
    fake = FakeNvml([h200(0)])
    calls = []

    def broken(handle: object) -> int:
        calls.append(handle)
        raise AttributeError("module 'pynvml' has no attribute 'c_nvmlSomething_v9_t'")

    object.__setattr__(fake, "nvmlDeviceGetPcieReplayCounter", broken)
    samples = list(cycles(make(fake, clock), clock, 3))
    assert all(s.up and s.gpus[0].pcie_replay_errors is None for s in samples)
    assert len(calls) == 1


def test_pcie_throughput_is_read_every_nth_cycle_and_held_in_between(clock: Clock) -> None:
    # A GPU without GPM (pre-Hopper) and without 64-bit counters: the sampled read is all there is.
    dev = h200(0, pcie_tx_kib=10, pcie_rx_kib=20, gpm_supported=False)
    fake = FakeNvml([dev])
    backend = make(fake, clock, pcie_every=3)
    seen = []
    for cycle in range(7):
        dev.pcie_tx_kib = cycle
        seen.append(backend.sample().gpus[0].pcie_tx_bytes_per_second)
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 3 * 2, "cycles 0, 3, 6; tx and rx"
    assert seen == [0.0, 0.0, 0.0, 3 * 1024.0, 3 * 1024.0, 3 * 1024.0, 6 * 1024.0]


def test_energy_counter_is_read_every_nth_cycle_and_held_in_between(clock: Clock) -> None:
    dev = h200(0)
    fake = FakeNvml([dev])
    backend = make(fake, clock, energy_every=5)
    for _ in range(11):
        backend.sample()
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 3, "cycles 0, 5, 10"


def test_slow_fields_are_read_every_nth_cycle_staggered_by_gpu_and_held_in_between(clock: Clock) -> None:
    # The MIG mode, ECC, replays and the power limit change with a configuration or an error:
    # read every slow_every cycles, GPU i at cycles i, i + n, ... (and each at its first cycle).
    devs = [h200(0), h200(1)]
    fake = FakeNvml(devs)
    backend = make(fake, clock, slow_every=4)
    seen: list[tuple[int | None, float | None]] = []
    for cycle in range(9):
        devs[1].pcie_replay = cycle
        devs[1].power_limit_mw = 500_000 + cycle * 1000
        sample = backend.sample()
        seen.append((sample.gpus[1].pcie_replay_errors, sample.gpus[1].power_limit_watts))
        assert sample.gpus[1].power_watts == 75.0, "power itself is read every cycle"
    # GPU 1: first cycle 0, then its stagger 1, 5 (and 9 would be next).
    assert [r for r, _ in seen] == [0, 1, 1, 1, 1, 5, 5, 5, 5]
    assert [w for _, w in seen] == [500.0, 501.0, 501.0, 501.0, 501.0, 505.0, 505.0, 505.0, 505.0]
    # GPU 0 at 0, 4, 8; GPU 1 at 0, 1, 5.
    assert fake.calls["nvmlDeviceGetMigMode"] == 6
    assert fake.calls["nvmlDeviceGetPcieReplayCounter"] == 6
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 18


def test_a_mig_mode_change_is_seen_at_the_next_slow_cycle(clock: Clock) -> None:
    dev = h200(0)
    fake = FakeNvml([dev])
    backend = make(fake, clock, slow_every=3)
    modes = []
    for _ in range(5):
        modes.append(backend.sample().gpus[0].mig_mode)
        dev.mig_mode = 1 if dev.mig_mode == 0 else dev.mig_mode
    assert modes[:3] == ["disabled"] * 3 and modes[3:] == ["enabled"] * 2


def test_gpu_added_at_runtime_appears_and_removed_one_vanishes(clock: Clock) -> None:
    fake = FakeNvml([h200(0)])
    backend = make(fake, clock)
    assert len(backend.sample().gpus) == 1
    fake.gpus.append(h200(1))
    assert [g.uuid for g in backend.sample().gpus] == [fake.gpus[0].uuid, fake.gpus[1].uuid]
    fake.gpus.pop(0)
    assert [g.uuid for g in backend.sample().gpus] == [fake.gpus[0].uuid]


def test_close_frees_everything_once_and_is_idempotent(clock: Clock) -> None:
    fake = FakeNvml([h200(0, gpm={SM: 1.0}), mig_gpu()])
    backend = make(fake, clock)
    list(cycles(backend, clock, 2))
    assert fake.gpm_samples and fake.event_sets
    backend.close()
    backend.close()
    assert all(s.freed for s in fake.gpm_samples)
    assert all(e.freed for e in fake.event_sets)
    assert fake.calls["nvmlShutdown"] == 1
    assert backend.sample().up is False


def test_fake_mirrors_the_real_binding() -> None:
    """Every NVML name the fake offers exists in nvidia-ml-py with the same value."""
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py (extra 'nvml') not installed")
    fake = FakeNvml([])
    names = [n for n in dir(fake) if n.startswith(("nvml", "NVML"))]
    assert len(names) > 60
    for name in names:
        assert hasattr(pynvml, name), name
        value = getattr(fake, name)
        if isinstance(value, int):
            assert getattr(pynvml, name) == value, name
    for cls in ("NVMLError_NotSupported", "NVMLError_GpuIsLost", "NVMLError_Uninitialized"):
        real = getattr(pynvml, cls)(0)
        assert type(fake.NVMLError(real.value)).__name__ == cls


@pytest.mark.gpu
def test_real_gpu_answers_identity_and_gpm() -> None:
    """On a real NVIDIA GPU: every GPU up with identity; GPM windows from the second cycle on Hopper."""
    backend = NvmlBackend()
    try:
        first = backend.sample()
        time.sleep(0.5)
        second = backend.sample()
    finally:
        backend.close()
    assert first.up and second.up and second.gpus
    for g in second.gpus:
        assert g.up and g.uuid.startswith("GPU-") and g.memory_total_bytes
        if second.gpm_supported and g.mig_mode != "enabled":
            assert g.leaves[0].gpm is not None


def test_close_does_not_hang_behind_a_stuck_nvml_call(clock: Clock) -> None:
    fake = FakeNvml([h200(0)])
    release = threading.Event()
    entered = threading.Event()
    real_power = fake.nvmlDeviceGetPowerUsage

    def hung(handle: object) -> int:
        entered.set()
        release.wait(10)
        return real_power(handle)  # type: ignore[arg-type]

    object.__setattr__(fake, "nvmlDeviceGetPowerUsage", hung)
    backend = NvmlBackend(nvml=fake, clock=clock, wall_clock=clock.wall, close_timeout=0.2)
    worker = threading.Thread(target=backend.sample)
    worker.start()
    assert entered.wait(5)
    t0 = time.monotonic()
    backend.close()
    assert time.monotonic() - t0 < 2.0
    assert fake.calls["nvmlShutdown"] == 0, "NVML is left alone while a call is inside it"
    release.set()
    worker.join(5)
    assert backend.sample().up is False


def test_driver_reserved_memory_comes_from_memory_info_v2_and_is_unknown_with_v1(clock: Clock) -> None:
    fake = FakeNvml([h200(0, memory_used=8 << 30, memory_reserved=512 << 20)])
    leaf = gpu(make(fake, clock).sample(), 0).leaves[0]
    assert (leaf.memory_used_bytes, leaf.memory_reserved_bytes) == (8 << 30, 512 << 20)
    fake_v1 = FakeNvml([h200(0, memory_used=8 << 30, memory_reserved=512 << 20)])
    fake_v1.nvmlMemory_v2 = None  # type: ignore[attr-defined]  # an nvidia-ml-py without the v2 struct
    leaf = gpu(make(fake_v1, clock).sample(), 0).leaves[0]
    assert (leaf.memory_used_bytes, leaf.memory_reserved_bytes) == ((8 << 30) + (512 << 20), None)


def test_both_backends_spell_nvml_error_codes_the_same() -> None:
    # The simulator's injected failures and the NVML backend's both count lower-case NVML codes,
    # so gpulens_nvml_errors_total{code} means one thing whichever backend produced it.
    from exporter.sim import SimFaults, SimulatedBackend

    fake = FakeNvml([h200(0)])
    fake.fail_always("nvmlDeviceGetTemperature", "UNKNOWN")
    clock = Clock()
    (real,) = cycles(make(fake, clock), clock, 1)
    faults = SimFaults()
    backend = SimulatedBackend("h200x8", faults=faults)
    backend.sample()
    faults.transient["temperature_celsius"] = 1
    assert set(real.errors) == set(backend.sample().errors) == {"unknown"}


GRAPHICS = fake_module.NVML_GPM_METRIC_GRAPHICS_UTIL


def _busy_requests(fake: FakeNvml) -> list[int]:
    """Records the metric ids of each nvmlGpmMetricsGet request; returns the list it fills."""
    asked: list[int] = []
    real = fake.nvmlGpmMetricsGet

    def recording(request: fake_module._GpmMetricsGet) -> fake_module._GpmMetricsGet:
        ids = [request.metrics[slot].metricId for slot in range(request.numMetrics)]
        asked.append(int(GRAPHICS in ids))
        return real(request)

    fake.nvmlGpmMetricsGet = recording  # type: ignore[method-assign]
    return asked


@pytest.mark.parametrize(
    ("sm", "util", "asked", "busy"),
    [
        (0.0, 0, False, 0.0),  # no resident warp, no GPU-Util: no kernel ran, graphics not asked
        (0.02, 0, True, 0.3),  # tiny kernels leave SM activity just above 0
        (0.0, 20, True, 0.3),  # GPU-Util saw a kernel the SM counter rounded away
    ],
)
def test_graphics_activity_is_asked_only_for_windows_in_which_kernels_ran(
    clock: Clock, sm: float, util: int, asked: bool, busy: float
) -> None:
    # GRAPHICS_UTIL costs ~1.7 ms of CPU per call on an H200, every other GPM metric ~2 µs.
    fake = FakeNvml([h200(0, gpm={SM: sm * 100, GRAPHICS: 30.0}, util_gpu=util)])
    requests = _busy_requests(fake)
    samples = list(cycles(make(fake, clock), clock, 3))
    gpm = samples[-1].gpus[0].leaves[0].gpm
    assert gpm is not None and gpm.graphics_active == pytest.approx(busy)
    assert any(requests) is asked
    assert len(requests) == 2 * (1 + int(asked)), "one request per window, a second for graphics when asked"


def test_an_idle_mig_instance_reads_zero_busy_without_asking_graphics(clock: Clock) -> None:
    mig = FakeMig(uuid="MIG-1", gpu_instance_id=1, compute_instance_id=0, profile_id=19, gpm={SM: 0.0, GRAPHICS: 30.0})
    busy = FakeMig(uuid="MIG-2", gpu_instance_id=2, compute_instance_id=0, profile_id=19, gpm={SM: 5.0, GRAPHICS: 40.0})
    fake = FakeNvml([h200(mig_mode=1, migs=[mig, busy])])
    requests = _busy_requests(fake)
    samples = list(cycles(make(fake, clock), clock, 3))
    idle_leaf, busy_leaf = samples[-1].gpus[0].leaves
    assert idle_leaf.gpm is not None and idle_leaf.gpm.graphics_active == 0.0
    assert busy_leaf.gpm is not None and busy_leaf.gpm.graphics_active == pytest.approx(0.4)
    assert sum(requests) == 2, "graphics asked for the busy instance only, in each of its 2 windows"
