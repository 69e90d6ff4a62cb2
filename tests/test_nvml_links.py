"""PCIe and NVLink traffic from NVML: the source chosen, the rates, the capacity, and the exported series."""

from __future__ import annotations

import pytest

from exporter.backends.nvml.backend import NvmlBackend
from exporter.backends.nvml.links import pcie_capacity
from exporter.model import NVLINK, PCIE, BackendSample, LinkTraffic
from tests.fakes import fake_pynvml as fake_module
from tests.fakes.fake_pynvml import FakeMig, FakeNvml
from tests.support.nvml_node import Clock, h200, make

MIB = 1024 * 1024
GEN5_X16 = 32e9 * 16 * (128 / 130) / 8
PCIE_TX, PCIE_RX = fake_module.NVML_GPM_METRIC_PCIE_TX_PER_SEC, fake_module.NVML_GPM_METRIC_PCIE_RX_PER_SEC
NVLINK_RX, NVLINK_TX = 60, 61
SM, DRAM, GRAPHICS = 2, 10, 1


def _links(sample: BackendSample, index: int = 0) -> dict[str, LinkTraffic]:
    gpu = next(g for g in sample.gpus if g.index == index)
    return {link.link: link for link in gpu.leaves[0].links}


def _run(backend: NvmlBackend, clock: Clock, n: int, step: float = 1.0) -> list[BackendSample]:
    out = []
    for _ in range(n):
        out.append(backend.sample())
        clock.now += step
    return out


def test_gen5_x16_carries_63_gb_per_second_each_way() -> None:
    assert pcie_capacity(32000, 5, 16) == pytest.approx(GEN5_X16)
    assert pytest.approx(63.0e9, rel=1e-3) == GEN5_X16
    # Without NVML's lane rate, the generation's: Gen4 x8 is a quarter of Gen5 x16.
    assert pcie_capacity(None, 4, 8) == pytest.approx(GEN5_X16 / 4)
    assert pcie_capacity(None, 3, 16) == pytest.approx(8e9 * 16 * (128 / 130) / 8)
    assert pcie_capacity(None, 2, 16) == pytest.approx(5e9 * 16 * 0.8 / 8)
    assert pcie_capacity(32000, None, 16) is None


def test_h200_32_bit_pcie_counters_are_skipped_for_gpm_rates() -> None:
    # The H200 (driver 580): PCIe byte counters are 32-bit and wrap every 68 ms at line rate; GPM
    # measured 59,300 MiB/s of host-to-device traffic in the copy loop.
    clock = Clock()
    rx_mib = 56_553.0
    dev = h200(
        pcie_tx_bytes=4_291_119_336,
        pcie_rx_bytes=3_518_321_500,
        gpm={PCIE_TX: 3_380.0, PCIE_RX: rx_mib, GRAPHICS: 0.006, SM: 0.0, DRAM: 1.1},
    )
    fake = FakeNvml([dev])
    samples = _run(make(fake, clock), clock, 3)
    link = _links(samples[-1])[PCIE]
    assert link.source == "gpm"
    assert link.rx_bytes_per_second == pytest.approx(rx_mib * MIB)
    assert link.capacity_bytes_per_second == pytest.approx(GEN5_X16)
    assert link.utilization_ratio() == pytest.approx(rx_mib * MIB / GEN5_X16)
    gpu = samples[-1].gpus[0]
    assert gpu.pcie_rx_bytes_per_second == pytest.approx(rx_mib * MIB), "the gauge comes from the same read"
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 0, "no 21 ms sampled read while GPM answers"


def test_64_bit_pcie_counters_are_preferred_and_give_exact_rates() -> None:
    clock = Clock()
    dev = h200(pcie_tx_bytes=10_000, pcie_rx_bytes=2**40, pcie_counter_bits=64, gpm={PCIE_RX: 1.0, PCIE_TX: 1.0})
    fake = FakeNvml([dev])
    backend = make(fake, clock)
    backend.sample()
    rx, tx = 2**40, 10_000
    for _ in range(3):
        clock.now += 0.5
        rx += 25_000_000_000  # 50 GB/s over 0.5 s
        tx += 1_000_000_000
        dev.pcie_rx_bytes, dev.pcie_tx_bytes = rx, tx
        sample = backend.sample()
    link = _links(sample)[PCIE]
    assert link.source == "counter"
    assert link.window_seconds == pytest.approx(0.5)
    assert link.rx_bytes_per_second == pytest.approx(50e9)
    assert link.tx_bytes_per_second == pytest.approx(2e9)


def test_a_counter_that_goes_back_drops_that_window_only() -> None:
    clock = Clock()
    dev = h200(pcie_tx_bytes=5 * 10**12, pcie_rx_bytes=5 * 10**12, pcie_counter_bits=64, pcie_tx_kib=7, pcie_rx_kib=9)
    fake = FakeNvml([dev])
    backend = make(fake, clock, pcie_every=1)
    backend.sample()
    clock.now += 1.0
    dev.pcie_rx_bytes = 1_000  # driver reload: the counter restarts
    after_reset = _links(backend.sample())[PCIE]
    assert after_reset.source != "counter", "no rate from a counter that went back"
    clock.now += 1.0
    dev.pcie_rx_bytes = 1_000 + 3_000_000_000
    link = _links(backend.sample())[PCIE]
    assert link.source == "counter"
    assert link.rx_bytes_per_second == pytest.approx(3e9)


def test_without_counters_or_gpm_pcie_the_sampled_throughput_is_read_staggered() -> None:
    clock = Clock()
    devs = [h200(i, pcie_tx_kib=1000, pcie_rx_kib=2000) for i in range(2)]
    fake = FakeNvml(devs)
    samples = _run(make(fake, clock, pcie_every=10), clock, 20)
    link = _links(samples[-1], 1)[PCIE]
    assert link.source == "sampled"
    assert link.rx_bytes_per_second == pytest.approx(2000 * 1024)
    assert _links(samples[0], 0) == {}, "GPM's first window is pending: no slow read on the first cycle"
    # two directions, two GPUs: once as soon as GPM turns out to have no PCIe rates (cycle 1),
    # then every 10th cycle staggered by index (GPU 0 at 10, GPU 1 at 11): 8 calls in 20 cycles
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 8


def test_nvlink_counters_sum_the_active_links_and_capacity_is_links_times_rate() -> None:
    clock = Clock()
    dev = h200(nvlink=True, nvlink_links=18, nvlink_tx_kib=[0] * 18, nvlink_rx_kib=[0] * 18)
    fake = FakeNvml([dev])
    backend = make(fake, clock)
    backend.sample()
    clock.now += 1.0
    assert dev.nvlink_tx_kib is not None and dev.nvlink_rx_kib is not None
    for i in range(18):
        dev.nvlink_tx_kib[i] += 10 * 1024 * 1024  # 10 GiB/s per link
        dev.nvlink_rx_kib[i] += 5 * 1024 * 1024
    traffic = _links(backend.sample())[NVLINK]
    assert traffic.source == "counter"
    assert traffic.tx_bytes_per_second == pytest.approx(18 * 10 * 2**30)
    assert traffic.rx_bytes_per_second == pytest.approx(18 * 5 * 2**30)
    assert traffic.capacity_bytes_per_second == pytest.approx(18 * 26_562e6)


def test_32_bit_nvlink_counters_that_wrap_once_still_give_the_right_rate() -> None:
    clock = Clock()
    start = 2**32 - 1024  # KiB, just below the wrap
    dev = h200(nvlink=True, nvlink_links=2, nvlink_tx_kib=[start, start], nvlink_rx_kib=[0, 0], nvlink_counter_bits=32)
    fake = FakeNvml([dev])
    backend = make(fake, clock)
    backend.sample()
    clock.now += 1.0
    assert dev.nvlink_tx_kib is not None
    dev.nvlink_tx_kib = [start + 20 * 1024 * 1024, start + 20 * 1024 * 1024]  # 20 GiB each, past the wrap
    link = _links(backend.sample())[NVLINK]
    assert link.tx_bytes_per_second == pytest.approx(2 * 20 * 2**30)


def test_nvlink_falls_back_to_gpm_and_a_gpu_without_nvlink_has_none() -> None:
    clock = Clock()
    with_links = h200(0, nvlink=True, gpm={NVLINK_TX: 1000.0, NVLINK_RX: 500.0, GRAPHICS: 0.0})
    without = h200(1, gpm={GRAPHICS: 0.0})
    samples = _run(make(FakeNvml([with_links, without]), clock), clock, 3)
    link = _links(samples[-1], 0)[NVLINK]
    assert (link.source, link.tx_bytes_per_second) == ("gpm", pytest.approx(1000.0 * MIB))
    assert NVLINK not in _links(samples[-1], 1)


def test_mig_instances_get_their_own_pcie_traffic_from_gpm() -> None:
    clock = Clock()
    migs = [
        FakeMig(
            uuid=f"MIG-{gi}",
            gpu_instance_id=gi,
            compute_instance_id=0,
            profile_id=19,
            gpm={PCIE_RX: 1000.0 * gi, PCIE_TX: 10.0, GRAPHICS: 0.0},
        )
        for gi in (1, 2)
    ]
    dev = h200(mig_mode=1, migs=migs, pcie_tx_kib=1, pcie_rx_kib=1)
    samples = _run(make(FakeNvml([dev]), clock), clock, 3)
    leaves = {leaf.mig.gpu_instance_id: leaf for leaf in samples[-1].gpus[0].leaves if leaf.mig is not None}
    for gi, leaf in leaves.items():
        (link,) = leaf.links
        assert (link.link, link.source) == (PCIE, "gpm")
        assert link.rx_bytes_per_second == pytest.approx(1000.0 * gi * MIB)
        assert link.capacity_bytes_per_second == pytest.approx(GEN5_X16)


def test_link_metrics_a_mig_instance_does_not_have_are_asked_once() -> None:
    clock = Clock()
    mig = FakeMig(uuid="MIG-1", gpu_instance_id=1, compute_instance_id=0, profile_id=19, gpm={GRAPHICS: 0.0})
    fake = FakeNvml([h200(mig_mode=1, migs=[mig], pcie_tx_kib=1, pcie_rx_kib=1)])
    asked: list[int] = []
    real = fake.nvmlGpmMetricsGet

    def recording(request: object) -> object:
        asked.append(request.numMetrics)  # type: ignore[attr-defined]
        return real(request)  # type: ignore[arg-type]

    fake.nvmlGpmMetricsGet = recording  # type: ignore[method-assign,assignment]
    samples = _run(make(fake, clock), clock, 4)
    assert samples[-1].gpus[0].leaves[0].links == ()
    main = [n for n in asked if n > 1]  # graphics activity is a request of its own
    assert main[0] - main[-1] == 2, "PCIe tx and rx dropped from the request after NVML said NotSupported"


def test_pcie_width_is_read_when_the_generation_changes_and_every_slow_cycle() -> None:
    clock = Clock()
    dev = h200(0)
    fake = FakeNvml([dev])
    backend = make(fake, clock, slow_every=5)
    widths = []
    for cycle in range(7):
        if cycle == 2:
            dev.pcie_width = 8  # degraded, same generation: seen at the next slow cycle (5)
        if cycle == 6:
            dev.pcie_gen, dev.pcie_width = 4, 4  # retrained: seen at once
        widths.append(_run(backend, clock, 1)[0].gpus[0].pcie_link_width)
    assert widths == [16, 16, 16, 16, 16, 8, 4]
    assert fake.calls["nvmlDeviceGetCurrPcieLinkWidth"] == 3


# --- link health: PCIe maximums and NVLink errors ------------------------------------------------

NVLINK_ERROR_IDS = {
    fake_module.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: "replay",
    fake_module.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: "recovery",
    fake_module.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: "crc_flit",
    fake_module.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: "crc_data",
}


def _asked_nvlink_errors(fake: FakeNvml) -> list[list[str]]:
    """Records, per field-values call that asks for NVLink errors, the kinds it asks for."""
    asked: list[list[str]] = []
    real = fake.nvmlDeviceGetFieldValues

    def recording(handle: object, ids: list[object]) -> object:
        kinds = [NVLINK_ERROR_IDS[i] for i in ids if isinstance(i, int) and i in NVLINK_ERROR_IDS]
        if kinds:
            asked.append(kinds)
        return real(handle, ids)  # type: ignore[arg-type]

    fake.nvmlDeviceGetFieldValues = recording  # type: ignore[method-assign,assignment]
    return asked


def test_pcie_link_maximums_are_read_once_beside_the_current_link() -> None:
    clock = Clock()
    degraded = h200(0, pcie_gen=4, pcie_width=8)  # a link that trained down from Gen5 x16
    unknown = h200(1, pcie_max_gen=None, pcie_max_width=None)
    fake = FakeNvml([degraded, unknown])
    samples = _run(make(fake, clock, slow_every=2), clock, 5)
    for s in samples:
        g0, g1 = s.gpus
        assert (g0.pcie_link_generation, g0.pcie_link_width) == (4, 8)
        assert (g0.pcie_link_max_generation, g0.pcie_link_max_width) == (5, 16)
        assert (g1.pcie_link_max_generation, g1.pcie_link_max_width) == (None, None)
        assert g1.pcie_link_generation == 5
        assert dict(s.errors) == {}
    # Identity: once per GPU (the unsupported GPU too: NotSupported is an answer).
    assert fake.calls["nvmlDeviceGetMaxPcieLinkGeneration"] == 2
    assert fake.calls["nvmlDeviceGetMaxPcieLinkWidth"] == 2


def test_nvlink_errors_are_totals_over_the_links_by_kind_read_on_the_slow_cadence() -> None:
    clock = Clock()
    dev = h200(0, nvlink=True, gpm={GRAPHICS: 0.0})
    fake = FakeNvml([h200(1), dev])  # GPU index 1: its slow cycles are 0 (first), 1, 4, 7
    asked = _asked_nvlink_errors(fake)
    backend = make(fake, clock, slow_every=3)
    seen = []
    for cycle in range(8):
        dev.nvlink_errors = {"replay": cycle, "recovery": 1, "crc_flit": 0, "crc_data": 2 * cycle}
        seen.append(dict(_run(backend, clock, 1)[0].gpus[1].nvlink_errors or {}))
    assert [e["replay"] for e in seen] == [0, 1, 1, 1, 4, 4, 4, 7]
    assert [e["crc_data"] for e in seen] == [0, 2, 2, 2, 8, 8, 8, 14]
    assert seen[-1] == {"replay": 7, "recovery": 1, "crc_flit": 0, "crc_data": 14}
    assert asked == [["replay", "recovery", "crc_flit", "crc_data"]] * 4, "one batched call per read, GPU 1 only"


def test_a_gpu_without_nvlink_has_no_nvlink_errors_and_is_never_asked() -> None:
    clock = Clock()
    fake = FakeNvml([h200(0)])  # a single H200: NVLink state answers NotSupported
    asked = _asked_nvlink_errors(fake)
    backend = make(fake, clock, slow_every=1)
    samples = _run(backend, clock, 1)
    state_calls = fake.calls["nvmlDeviceGetNvLinkState"]
    samples += _run(backend, clock, 3)
    assert all(s.gpus[0].nvlink_errors is None for s in samples)
    assert asked == []
    assert fake.calls["nvmlDeviceGetNvLinkState"] == state_calls, "NotSupported remembered from the first cycle"


def test_an_nvlink_error_kind_nvml_does_not_count_is_omitted_and_not_asked_again() -> None:
    clock = Clock()
    dev = h200(0, nvlink=True, nvlink_errors={"replay": 3, "recovery": None, "crc_flit": 1, "crc_data": 0})
    fake = FakeNvml([dev])
    asked = _asked_nvlink_errors(fake)
    samples = _run(make(fake, clock, slow_every=1), clock, 3)
    assert dict(samples[-1].gpus[0].nvlink_errors or {}) == {"replay": 3, "crc_flit": 1, "crc_data": 0}
    assert asked == [["replay", "recovery", "crc_flit", "crc_data"]] + [["replay", "crc_flit", "crc_data"]] * 2
    assert all(dict(s.errors) == {} for s in samples), "NotSupported is not an error"
    dev.nvlink_errors = {}  # no kind counted at all: the series go, and the call is no longer made
    samples = _run(make(FakeNvml([dev]), clock, slow_every=1), clock, 2)
    assert all(s.gpus[0].nvlink_errors is None for s in samples)


def test_a_transient_nvlink_error_read_is_counted_and_retried() -> None:
    clock = Clock()
    fake = FakeNvml([h200(0, nvlink=True, nvlink_errors={"replay": 5})])
    backend = make(fake, clock, slow_every=1)
    _run(backend, clock, 1)
    fake.fail_always("nvmlDeviceGetFieldValues", "UNKNOWN")
    failed = _run(backend, clock, 1)[0]
    fake.clear_failures()
    again = _run(backend, clock, 1)[0]
    assert failed.gpus[0].nvlink_errors is None and failed.errors.get("unknown", 0) >= 1
    assert dict(again.gpus[0].nvlink_errors or {}) == {"replay": 5}
