"""One contract over both backends: the simulator and the NVML backend, driven by the fake pynvml
set up as the same node, export the same series: metric families, label names and label values.

Each simulated scenario is sampled once; that sample is turned into a fake NVML driver with the
same GPUs, MIG instances, processes, GPM counters, Xid events and failing reads.  Both backends
then run through the same sampler, classifier and collector, and the expositions are compared
series by series, values aside.  A difference is either a gap in this translation or two
backends that disagree; the test names the series either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from exporter.analysis.boundness import BoundnessClassifier
from exporter.backends.base import GpuBackend
from exporter.backends.nvml.backend import NvmlBackend
from exporter.model import MPS_CLIENT, MPS_SERVER, NVLINK, PCIE, BackendSample, GpuSample, LeafSample
from exporter.render.collector import SnapshotCollector
from exporter.sampler import Sampler
from exporter.sim import SCENARIOS, SimFaults, SimulatedBackend
from tests.fakes import fake_pynvml as f
from tests.fakes.fake_pynvml import FakeFabric, FakeGpu, FakeMig, FakeNvml, FakeProcess

NOT_IN_A_FABRIC = f.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
"""What NVML's fabric state says for a GPU in no NVLink fabric (the simulator's ``fabric=None``)."""

CYCLES = 4
XID = 79
FAILING_FIELD = "temperature_celsius"
"""The simulator fails this read once per GPU; the fake driver answers UNKNOWN for its NVML call."""
FAILING_CALL = "nvmlDeviceGetTemperature"

Series = frozenset[tuple[str, frozenset[tuple[str, str]]]]

_GPM_IDS = {
    "sm_active": f.NVML_GPM_METRIC_SM_UTIL,
    "sm_occupancy": f.NVML_GPM_METRIC_SM_OCCUPANCY,
    "tensor_active": f.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    "fp64_active": f.NVML_GPM_METRIC_FP64_UTIL,
    "fp32_active": f.NVML_GPM_METRIC_FP32_UTIL,
    "fp16_active": f.NVML_GPM_METRIC_FP16_UTIL,
    "dram_active": f.NVML_GPM_METRIC_DRAM_BW_UTIL,
    "graphics_active": f.NVML_GPM_METRIC_GRAPHICS_UTIL,
}
_MIB = 1024 * 1024
_COMPUTE_MODES = {"default": 0, "exclusive_thread": 1, "prohibited": 2, "exclusive_process": 3}
_NO_INSTANCE = 0xFFFFFFFF


def _pct(ratio: float | None) -> int:
    return round((ratio or 0.0) * 100)


def _gpm(leaf: LeafSample) -> dict[int, float]:
    """The leaf's GPM counters as the fake driver answers them: ratios in percent, PCIe in MiB/s."""
    if leaf.gpm is None:
        return {}
    out = {mid: 100.0 * (getattr(leaf.gpm, name) or 0.0) for name, mid in _GPM_IDS.items()}
    for link in leaf.links:
        if link.link == PCIE and link.source == "gpm":
            out[f.NVML_GPM_METRIC_PCIE_TX_PER_SEC] = (link.tx_bytes_per_second or 0.0) / _MIB
            out[f.NVML_GPM_METRIC_PCIE_RX_PER_SEC] = (link.rx_bytes_per_second or 0.0) / _MIB
    return out


NVLINK_LINK_BYTES_PER_SECOND = 25e9
"""Per link and direction on an A100 (NVLink 3): the rate the fake answers for counter-read NVLink."""


def _nvlink_counters(g: GpuSample) -> dict[str, Any]:
    """The fake's NVLink fields for ``g``: GPM-read NVLink as before; NVLink the simulator reads
    from per-link counters (a GPU without GPM, an A100) as that many links with counters."""
    counted = [link for link in g.links if link.link == NVLINK and link.source == "counter"]
    if not counted:
        return {"nvlink": g.nvlink_tx_bytes_per_second is not None}
    links = round((counted[0].capacity_bytes_per_second or 0) / NVLINK_LINK_BYTES_PER_SECOND) or 1
    return {
        "nvlink": True,
        "nvlink_links": links,
        "nvlink_speed_mbps": 25000,
        "nvlink_tx_kib": [0] * links,
        "nvlink_rx_kib": [0] * links,
    }


def fake_node(sample: BackendSample) -> FakeNvml:
    """A fake NVML driver that answers what ``sample``'s node would (values need not be exact:
    only which series exist and their labels are compared)."""
    gpus: list[FakeGpu] = []
    for g in sample.gpus:
        whole = [leaf for leaf in g.leaves if leaf.mig is None]
        procs = [p for leaf in whole for p in leaf.processes]
        migs = [
            FakeMig(
                uuid=leaf.mig.mig_uuid,
                gpu_instance_id=leaf.mig.gpu_instance_id,
                compute_instance_id=leaf.mig.compute_instance_id,
                name=f"{g.name} MIG {leaf.mig.profile}",
                memory_used=leaf.memory_used_bytes or 0,
                memory_total=leaf.memory_total_bytes or 0,
                processes=[
                    FakeProcess(p.pid, p.used_memory_bytes, leaf.mig.gpu_instance_id, leaf.mig.compute_instance_id)
                    for p in leaf.processes
                ],
                gpm=_gpm(leaf),
            )
            for leaf in g.leaves
            if leaf.mig is not None
        ]
        reasons = {getattr(f, const, None): name for const, name in _REASON_BITS.items()}
        gpus.append(
            FakeGpu(
                uuid=g.uuid,
                name=g.name or "",
                pci_bus_id=g.pci_bus_id or "",
                compute_capability=tuple(int(x) for x in (g.compute_capability or "9.0").split(".")),  # type: ignore[arg-type]
                memory_total=g.memory_total_bytes or 0,
                memory_used=g.memory_used_bytes or 0,
                memory_reserved=(whole[0].memory_reserved_bytes or 0) if whole else 0,
                fabric=FakeFabric.of(g.fabric) if g.fabric is not None else FakeFabric(NOT_IN_A_FABRIC),
                util_gpu=_pct(g.utilization_ratio),
                util_memory=_pct(g.memory_utilization_ratio),
                power_mw=round((g.power_watts or 0) * 1000),
                power_limit_mw=round((g.power_limit_watts or 0) * 1000),
                energy_mj=round((g.energy_joules or 0) * 1000),
                temperature=round(g.temperature_celsius or 0),
                memory_temperature=(
                    None if g.memory_temperature_celsius is None else round(g.memory_temperature_celsius)
                ),
                fan=None if g.fan_speed_ratio is None else _pct(g.fan_speed_ratio),
                sm_clock_mhz=round((g.sm_clock_hertz or 0) / 1e6),
                memory_clock_mhz=round((g.memory_clock_hertz or 0) / 1e6),
                max_sm_clock_mhz=round((g.sm_clock_max_hertz or 0) / 1e6),
                clock_reasons=sum(bit for bit, name in reasons.items() if bit and (g.clock_events or {}).get(name)),
                pcie_tx_kib=round((g.pcie_tx_bytes_per_second or 0) / 1024),
                pcie_rx_kib=round((g.pcie_rx_bytes_per_second or 0) / 1024),
                pcie_gen=g.pcie_link_generation or 0,
                pcie_width=g.pcie_link_width or 0,
                pcie_max_gen=g.pcie_link_max_generation,
                pcie_max_width=g.pcie_link_max_width,
                temperature_thresholds={k: round(v) for k, v in (g.temperature_thresholds or {}).items()},
                pcie_replay=g.pcie_replay_errors,
                ecc=(g.ecc_errors["corrected"], g.ecc_errors["uncorrected"]) if g.ecc_errors else None,
                remapped_rows=tuple(  # type: ignore[arg-type]
                    (g.remapped_rows or {}).get(k, 0) for k in ("correctable", "uncorrectable", "pending", "failure")
                ),
                compute_mode=_COMPUTE_MODES[g.compute_mode or "default"],
                mig_mode=None if g.mig_mode is None else (1 if g.mig_mode == "enabled" else 0),
                gpm_supported=any(leaf.gpm is not None for leaf in g.leaves),
                **_nvlink_counters(g),
                nvlink_errors=dict(g.nvlink_errors or {}),
                gpm={**(_gpm(whole[0]) if whole else {}), **_nvlink(g)},
                processes=[
                    FakeProcess(
                        p.pid,
                        p.used_memory_bytes,
                        _NO_INSTANCE,
                        _NO_INSTANCE,
                        name="python3" if p.mps_role is None else _MPS_NAME[p.mps_role],
                        mps_client=p.mps_role == MPS_CLIENT,
                    )
                    for p in procs
                ],
                process_util=[
                    (p.pid, _pct(p.sm_util_ratio), _pct(p.memory_util_ratio))
                    for p in procs
                    if p.sm_util_ratio is not None
                ],
                migs=migs,
            )
        )
    fake = FakeNvml(gpus, driver_version=sample.driver_version or "")
    for g in sample.gpus:
        if g.utilization_ratio is None:  # MIG mode: NVML has no device-level utilisation
            fake.fail_always("nvmlDeviceGetUtilizationRates", "NOT_SUPPORTED", gpu=g.uuid)
    return fake


def _nvlink(g: GpuSample) -> dict[int, float]:
    """NVLink throughput comes from the device's GPM counters (MiB/s)."""
    if g.nvlink_rx_bytes_per_second is None:
        return {}
    return {
        f.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: g.nvlink_rx_bytes_per_second / _MIB,
        f.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: (g.nvlink_tx_bytes_per_second or 0.0) / _MIB,
    }


_MPS_NAME = {MPS_SERVER: "/usr/bin/nvidia-cuda-mps-server", MPS_CLIENT: "python3"}
_REASON_BITS = {
    "nvmlClocksEventReasonGpuIdle": "gpu_idle",
    "nvmlClocksEventReasonSwPowerCap": "sw_power_cap",
}


def _series(backend: GpuBackend, before_cycle: Callable[[int], None]) -> Series:
    """Every series (name and labels) the exporter renders after CYCLES cycles of ``backend``."""
    sampler = Sampler(backend, classifier=BoundnessClassifier(window_seconds=2.0))
    try:
        for i in range(CYCLES):
            before_cycle(i)
            sampler.run_once()
    finally:
        sampler.stop()
    registry = CollectorRegistry(auto_describe=True)
    registry.register(SnapshotCollector(sampler.latest, backend="contract"))
    # The families as the registry collects them: the names and labels a text page would carry
    # (writing the page and parsing it back gave the same sets, at twice the module's time).
    return frozenset((s.name, frozenset(s.labels.items())) for fam in registry.collect() for s in fam.samples)


class _Tampered:
    """The simulator with its samples passed through ``tamper`` (to show the contract can fail)."""

    name = "sim"

    def __init__(self, inner: SimulatedBackend, tamper: Callable[[BackendSample], BackendSample]) -> None:
        self._inner = inner
        self._tamper = tamper

    def sample(self) -> BackendSample:
        return self._tamper(self._inner.sample())

    def close(self) -> None:
        self._inner.close()


def both(scenario: str, tamper: Callable[[BackendSample], BackendSample] | None = None) -> tuple[Series, Series]:
    """(simulator's series, NVML backend's series) for the same node."""
    faults = SimFaults(xid={1: [XID]})
    sim: GpuBackend = SimulatedBackend(scenario, faults=faults)
    if tamper is not None:
        sim = _Tampered(SimulatedBackend(scenario, faults=faults), tamper)
    reference = SimulatedBackend(scenario)
    reference.sample()  # the first sample has no windowed signals (GPM, per-process utilisation)
    fake = fake_node(reference.sample())
    fake.gpus[1].xid_queue.append(XID)

    def sim_fault(i: int) -> None:
        if i == CYCLES - 1:
            faults.transient[FAILING_FIELD] = 1

    def nvml_fault(i: int) -> None:
        if i == CYCLES - 1:
            fake.fail(FAILING_CALL, "UNKNOWN", times=len(fake.gpus))

    return _series(sim, sim_fault), _series(NvmlBackend(nvml=fake, pcie_every=1, energy_every=1), nvml_fault)


def differences(a: Series, b: Series) -> list[str]:
    """Human-readable series present in one exposition only, grouped by what differs."""
    out = []
    by_a, by_b = _by_family(a), _by_family(b)  # each side grouped once, not scanned per family
    for name in sorted(by_a.keys() ^ by_b.keys()):
        out.append(f"family {name} only from the {'simulator' if name in by_a else 'NVML backend'}")
    for name in sorted(by_a.keys() & by_b.keys()):
        la = {frozenset(k for k, _ in labels) for labels in by_a[name]}
        lb = {frozenset(k for k, _ in labels) for labels in by_b[name]}
        if la != lb:
            out.append(f"{name}: label names {sorted(map(sorted, la))} vs {sorted(map(sorted, lb))}")
            continue
        for labels in sorted(by_a[name] ^ by_b[name], key=lambda labels: str((name, labels))):
            side = "simulator" if labels in by_a[name] else "NVML backend"
            out.append(f"{name}{dict(sorted(labels))} only from the {side}")
    return out


def _by_family(series: Series) -> dict[str, set[frozenset[tuple[str, str]]]]:
    out: dict[str, set[frozenset[tuple[str, str]]]] = {}
    for name, labels in series:
        out.setdefault(name, set()).add(labels)
    return out


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_both_backends_export_the_same_series(scenario: str) -> None:
    sim, nvml = both(scenario)
    assert sim and nvml
    assert differences(sim, nvml) == []


HARDWARE_HEALTH = (
    "gpulens_gpu_pcie_link_max_generation",
    "gpulens_gpu_pcie_link_max_width",
    "gpulens_gpu_temperature_threshold_celsius",
    "gpulens_gpu_nvlink_errors_total",
)


@pytest.mark.parametrize("scenario", ["h200x8", "mig"])
def test_the_hardware_health_series_are_compared_too(scenario: str) -> None:
    # Present in both, so the contract above is not met by both lacking them; NVLink errors only
    # where the GPU has NVLink (not in MIG mode), four kinds and four thresholds per GPU.
    sim, nvml = both(scenario)
    for exposition in (sim, nvml):
        for name in HARDWARE_HEALTH:
            assert any(n == name for n, _ in exposition), name
        kinds = {dict(labels)["kind"] for n, labels in exposition if n == "gpulens_gpu_nvlink_errors_total"}
        assert kinds == {"replay", "recovery", "crc_flit", "crc_data"}
        thresholds = {dict(labels)["threshold"] for n, labels in exposition if n == HARDWARE_HEALTH[2]}
        assert thresholds == {"slowdown", "shutdown", "gpu_max", "memory_max"}
    reference = SimulatedBackend(scenario).sample()
    with_nvlink = {g.uuid for g in reference.gpus if g.mig_mode != "enabled"}
    exported = {dict(labels)["uuid"] for n, labels in nvml if n == "gpulens_gpu_nvlink_errors_total"}
    assert exported == with_nvlink and (scenario == "h200x8" or len(with_nvlink) < len(reference.gpus))


def test_the_contract_catches_a_misspelled_error_code() -> None:
    # The divergence this test exists for: the simulator once counted "Unknown" where NVML says "unknown".
    def capitalised(sample: BackendSample) -> BackendSample:
        return replace(sample, errors={k.capitalize(): v for k, v in sample.errors.items()})

    found = differences(*both("h200x8", capitalised))
    assert any("gpulens_nvml_errors_total" in d and "'code': 'Unknown'" in d for d in found), found


def test_the_contract_catches_a_renamed_label_value() -> None:
    def renamed(sample: BackendSample) -> BackendSample:
        gpus: Iterable[GpuSample] = (
            replace(g, clock_events={k.replace("gpu_idle", "idle"): v for k, v in g.clock_events.items()})
            if g.clock_events
            else g
            for g in sample.gpus
        )
        return replace(sample, gpus=tuple(gpus))

    found = differences(*both("h200x8", renamed))
    assert any("gpulens_gpu_clock_event_active" in d and "'reason': 'idle'" in d for d in found), found


def test_the_contract_catches_a_series_only_one_backend_exports() -> None:
    def without_nvlink(sample: BackendSample) -> BackendSample:
        gpus = tuple(replace(g, nvlink_rx_bytes_per_second=None, nvlink_tx_bytes_per_second=None) for g in sample.gpus)
        return replace(sample, gpus=gpus)

    found = differences(*both("h200x8", without_nvlink))
    assert "family gpulens_gpu_nvlink_rx_bytes_per_second only from the NVML backend" in found, found
