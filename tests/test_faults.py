"""Injected faults end in HTTP 200 with only the affected series gone, then recover without a restart."""

from __future__ import annotations

import re
import time

import pytest
from prometheus_client import CollectorRegistry

from exporter.render.collector import SnapshotCollector
from exporter.sampler import Sampler, SamplerOptions
from exporter.sim import SimFaults, SimulatedBackend
from tests.support.exporter import run_exporter
from tests.support.net import get

pytestmark = pytest.mark.integration


def _pipeline(faults: SimFaults, deadline: float = 5.0) -> tuple[Sampler, CollectorRegistry]:
    sampler = Sampler(
        SimulatedBackend("h200x8", seed=0, faults=faults),
        SamplerOptions(interval_seconds=0.1, deadline_seconds=deadline),
    )
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(sampler.latest, backend="sim"))
    return sampler, reg


def _gpu(reg: CollectorRegistry, name: str, index: int) -> float | None:
    for metric in reg.collect():
        for s in metric.samples:
            if s.name == name and s.labels.get("gpu") == str(index):
                return s.value
    return None


def test_lost_gpu_then_back() -> None:
    faults = SimFaults()
    sampler, reg = _pipeline(faults)
    sampler.run_once()
    before = {i: _gpu(reg, "gpulens_gpu_memory_total_bytes", i) for i in range(8)}
    faults.lost = {3}
    sampler.run_once()
    assert _gpu(reg, "gpulens_gpu_up", 3) == 0
    assert _gpu(reg, "gpulens_gpu_temperature_celsius", 3) is None
    for i in (0, 1, 2, 4, 5, 6, 7):
        assert _gpu(reg, "gpulens_gpu_up", i) == 1
        assert _gpu(reg, "gpulens_gpu_memory_total_bytes", i) == before[i]
    assert reg.get_sample_value("gpulens_up") == 1
    faults.lost = set()
    sampler.run_once()
    assert _gpu(reg, "gpulens_gpu_up", 3) == 1
    assert _gpu(reg, "gpulens_gpu_temperature_celsius", 3) is not None


def test_nvml_unavailable_then_appears() -> None:
    faults = SimFaults()
    faults.unavailable = True
    sampler, reg = _pipeline(faults)
    sampler.run_once()
    assert reg.get_sample_value("gpulens_up") == 0
    assert reg.get_sample_value("gpulens_stage_success", {"stage": "nvml"}) == 0
    assert _gpu(reg, "gpulens_gpu_up", 0) is None
    faults.unavailable = False
    sampler.run_once()
    assert reg.get_sample_value("gpulens_up") == 1
    assert _gpu(reg, "gpulens_gpu_up", 0) == 1


def test_unsupported_field_is_omitted_only_for_itself() -> None:
    faults = SimFaults()
    faults.unsupported = {"fan_speed_ratio", "power_watts"}
    sampler, reg = _pipeline(faults)
    sampler.run_once()
    assert _gpu(reg, "gpulens_gpu_power_watts", 0) is None
    assert _gpu(reg, "gpulens_gpu_temperature_celsius", 0) is not None


def test_transient_error_is_counted_and_the_field_returns() -> None:
    faults = SimFaults()
    faults.transient = {"power_watts": 1}
    sampler, reg = _pipeline(faults)
    sampler.run_once()
    assert _gpu(reg, "gpulens_gpu_power_watts", 0) is None
    assert (reg.get_sample_value("gpulens_nvml_errors_total", {"code": "unknown"}) or 0) >= 1
    sampler.run_once()
    assert _gpu(reg, "gpulens_gpu_power_watts", 0) is not None


def test_hanging_call_does_not_stall_scrapes_of_the_real_process() -> None:
    with run_exporter("--sim.faults", "hang=30", "--collect.deadline", "2s") as base:
        for _ in range(5):
            t0 = time.monotonic()
            status, body = get(f"{base}/metrics", timeout=5)
            assert status == 200
            assert time.monotonic() - t0 < 1.0
            time.sleep(0.3)
        assert re.search(r'^gpulens_(stage_success\{[^}]*stage="nvml"[^}]*\}|up\{[^}]*\}) 0\.0$', body, re.M), body
