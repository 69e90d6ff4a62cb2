"""The metric catalogue is the contract: docs match it, names follow Prometheus conventions, and
what renders is the catalogue: a read whose label values do not match its entry is caught."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporter.model import BackendSample, GpuSample, Snapshot
from exporter.render import metrics
from exporter.render.collector import LabelMismatch, SnapshotCollector, render_family
from exporter.render.scopes import GPU, SCOPES, Frame
from exporter.sampler import Sampler
from exporter.sim import SCENARIOS
from tests.fakes_backend import ScriptedBackend, gpu, healthy
from tests.support.sim_exposition import DASHBOARD_FIXTURES
from tests.support.sim_exposition import render as render_sim

REPO = Path(__file__).resolve().parents[1]
EMPTY_MIG = {"mig_uuid": "", "gpu_instance_id": "", "compute_instance_id": "", "mig_profile": ""}


def test_docs_metrics_md_is_generated_from_the_catalogue() -> None:
    on_disk = (REPO / "docs" / "metrics.md").read_text()
    assert on_disk == metrics.markdown(), (
        "docs/metrics.md drifted from exporter/render/metrics.py: run "
        "`.venv/bin/python -m exporter.render.metrics --markdown > docs/metrics.md`"
    )


def test_names_follow_the_conventions() -> None:
    for m in metrics.CATALOGUE:
        assert re.fullmatch(r"gpulens_[a-z0-9_]+", m.name), m.name
        assert m.name.endswith("_total") == (m.type == "counter"), m.name
        assert not re.search(r"_(percent|percentage|mb|mib|kb|ms)(_|$)", m.name), m.name
        if m.unit == "ratio":
            assert m.name.endswith("_ratio"), m.name
        if m.unit and m.unit != "ratio":
            assert f"_{m.unit}" in m.name, m.name
        assert m.help.strip(), m.name
        assert "node" not in m.labels and "hostname" not in m.labels, m.name
        # exporter/render/exposition.py writes label names as they are, unchecked: they must be legal.
        assert all(re.fullmatch(r"[a-z_][a-z0-9_]*", label) and not label.startswith("__") for label in m.labels)


def test_design_core_names_are_present() -> None:
    core = {
        "gpulens_up",
        "gpulens_gpu_info",
        "gpulens_gpu_up",
        "gpulens_gpu_utilization_ratio",
        "gpulens_gpu_sm_active_ratio",
        "gpulens_gpu_sm_occupancy_ratio",
        "gpulens_gpu_tensor_active_ratio",
        "gpulens_gpu_dram_active_ratio",
        "gpulens_gpu_sm_active_seconds_total",
        "gpulens_gpu_memory_used_bytes",
        "gpulens_gpu_energy_joules_total",
        "gpulens_gpu_clock_event_active",
        "gpulens_gpu_ecc_errors_total",
        "gpulens_gpu_xid_errors_total",
        "gpulens_gpu_boundness",
        "gpulens_mig_instance_info",
        "gpulens_pod_gpu_allocation",
        "gpulens_pod_gpu_kernel_time_ratio",
        "gpulens_pod_gpu_sm_share_ratio",  # deprecated, one release more
        "gpulens_probe_efficiency_ratio",
        "gpulens_stage_success",
        "gpulens_snapshot_age_seconds",
    }
    assert core <= set(metrics.BY_NAME)


# --- the catalogue is what renders: one loop, label values checked per entry ----------------------


def _healthy_snapshot() -> Snapshot:
    sampler = Sampler(ScriptedBackend(healthy(2)))
    sampler.run_once()
    snap = sampler.latest()
    assert snap is not None
    return snap


def _scrape(catalogue: list[metrics.MetricSpec]) -> CollectorRegistry:
    snap = _healthy_snapshot()
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(lambda: snap, backend="sim", catalogue=catalogue))
    return reg


def _with(name: str, **changes: object) -> list[metrics.MetricSpec]:
    assert name in metrics.BY_NAME
    return [replace(s, **changes) if s.name == name else s for s in metrics.CATALOGUE]  # type: ignore[arg-type]


def test_every_entry_declares_its_scope_and_its_labels_extend_the_scopes() -> None:
    for m in metrics.CATALOGUE:
        assert m.scope in SCOPES, m.name
        assert m.labels[: len(m.scope.labels)] == m.scope.labels, m.name
        assert len(set(m.labels)) == len(m.labels), f"{m.name}: a label twice"
    assert len(metrics.BY_NAME) == len(metrics.CATALOGUE), "two entries share a name"


def test_a_label_count_mismatch_raises_naming_the_family() -> None:
    snap = _healthy_snapshot()
    bad = replace(metrics.spec("gpulens_gpu_clock_event_active"), own_labels=("reason", "extra"))
    frame = Frame(
        replace(
            snap,
            backend=replace(snap.backend, gpus=(replace(snap.backend.gpus[0], clock_events={"hw_slowdown": True}),)),
        )
    )
    with pytest.raises(LabelMismatch, match="gpulens_gpu_clock_event_active"):
        render_family(bad, list(bad.scope.walk(frame)))


def test_a_label_count_mismatch_drops_only_that_family_and_reports_it() -> None:
    # Too few values for the labels: prometheus_client alone would export the sample truncated.
    reg = _scrape(_with("gpulens_gpu_power_watts", own_labels=("extra",)))
    g0 = {"gpu": "0", "uuid": gpu(0).uuid}
    assert reg.get_sample_value("gpulens_stage_success", {"stage": "render_gpulens_gpu_power_watts"}) == 0
    assert "# TYPE gpulens_gpu_power_watts " not in generate_latest(reg).decode()
    # Its scope's other families and every other section still render.
    assert reg.get_sample_value("gpulens_gpu_utilization_ratio", g0) == 0.5
    assert reg.get_sample_value("gpulens_gpu_sm_active_ratio", {**g0, **EMPTY_MIG}) == 0.5
    assert reg.get_sample_value("gpulens_up") == 1


def test_too_many_label_values_are_caught_too() -> None:
    too_many = _with("gpulens_gpu_temperature_celsius", read=lambda _v: [(("x",), 40.0)])
    reg = _scrape(too_many)
    assert reg.get_sample_value("gpulens_stage_success", {"stage": "render_gpulens_gpu_temperature_celsius"}) == 0
    assert reg.get_sample_value("gpulens_gpu_power_watts", {"gpu": "0", "uuid": gpu(0).uuid}) == 300


def test_an_unknown_metric_name_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="unknown metric 'gpulens_gpu_power_wats'"):
        metrics.spec("gpulens_gpu_power_wats")


def test_no_simulated_scenario_makes_any_family_fail() -> None:
    for scenario in SCENARIOS:
        text = render_sim(scenario, cycles=3, probes=True)
        assert 'stage="render_' not in text, (scenario, [x for x in text.splitlines() if 'stage="render_' in x])


def test_compat_sources_name_real_families() -> None:
    from exporter.render.compat_dcgm import FIELDS

    for field in FIELDS:
        for name in re.findall(r"gpulens_[a-z0-9_]+", field.source):
            assert name in metrics.BY_NAME, (field.name, name)


NOT_SIMULATED = {
    "gpulens_gpu_fan_speed_ratio": "the simulated H200 boards are passively cooled (NVML: not supported)",
    "gpulens_unmapped_devices_total": "the simulated kubelet lists only devices of its own node",
    "gpulens_kubernetes_owner_walks_total": "the simulator has no Kubernetes API source",
    "gpulens_render_errors_total": "no family of a simulated node fails to render",
    "gpulens_label_values_rewritten_total": "the exporter's wiring counts rewrites (cli.build), not a bare collector",
    "gpulens_nic_items_dropped": "the simulated NIC trees fit within every ceiling: nothing is left out",
    "gpulens_attribution_items_dropped_total": "the ceilings are the kubelet source's, not the simulator's",
}
"""Families no dashboard fixture has, and why: every other family must be in one."""


def test_every_family_reaches_the_dashboard_fixtures() -> None:
    """A metric without a simulator value would be missing from every dashboard test: add the value
    to the simulator (exporter/sim/), then regenerate with --update-golden."""
    found = set()
    for scenario in DASHBOARD_FIXTURES:
        text = (REPO / "tests" / "fixtures" / "dashboard" / f"{scenario}.prom").read_text()
        found |= {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    missing = {m.name for m in metrics.CATALOGUE} - found - set(NOT_SIMULATED)
    assert not missing, f"no dashboard fixture has {sorted(missing)}"
    assert not set(NOT_SIMULATED) & found, "a family listed as not simulated is simulated now: drop it from the list"


def _scrape_gpus(*gpus: GpuSample) -> CollectorRegistry:
    sampler = Sampler(ScriptedBackend(lambda _n: BackendSample(up=True, driver_version="580.159.04", gpus=gpus)))
    sampler.run_once()
    snap = sampler.latest()
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(lambda: snap, backend="sim"))
    return reg


def test_row_remap_pending_and_failure_are_0_1_gauges_an_alert_can_compare_directly() -> None:
    for name in ("gpulens_gpu_row_remap_pending", "gpulens_gpu_row_remap_failure"):
        m = metrics.spec(name)
        assert (m.type, m.own_labels, m.scope) == ("gauge", (), GPU), name
    rows = {"correctable": 3, "uncorrectable": 1, "pending": 1, "failure": 0}
    reg = _scrape_gpus(gpu(0, remapped_rows=rows), gpu(1))
    g0, g1 = ({"gpu": str(i), "uuid": gpu(i).uuid} for i in (0, 1))
    assert reg.get_sample_value("gpulens_gpu_row_remap_pending", g0) == 1.0
    assert reg.get_sample_value("gpulens_gpu_row_remap_failure", g0) == 0.0
    assert reg.get_sample_value("gpulens_gpu_row_remap_pending", g1) is None, "unknown is absent, never 0"


def test_link_health_and_temperature_limits_render_one_sample_per_kind_and_nothing_when_unknown() -> None:
    health = gpu(
        0,
        pcie_link_generation=4,
        pcie_link_width=16,
        pcie_link_max_generation=5,
        pcie_link_max_width=16,
        temperature_thresholds={"memory_max": 95.0, "slowdown": 89.0},
        nvlink_errors={"crc_data": 7, "replay": 2},
    )
    reg = _scrape_gpus(health, gpu(1))
    g0 = {"gpu": "0", "uuid": gpu(0).uuid}
    assert reg.get_sample_value("gpulens_gpu_pcie_link_max_generation", g0) == 5
    assert reg.get_sample_value("gpulens_gpu_pcie_link_max_width", g0) == 16
    assert reg.get_sample_value("gpulens_gpu_temperature_threshold_celsius", {**g0, "threshold": "slowdown"}) == 89
    assert reg.get_sample_value("gpulens_gpu_nvlink_errors_total", {**g0, "kind": "crc_data"}) == 7
    assert reg.get_sample_value("gpulens_gpu_nvlink_errors_total", {**g0, "kind": "recovery"}) is None
    text = generate_latest(reg).decode()
    assert text.index('threshold="slowdown"') < text.index('threshold="memory_max"'), "in the kinds' order"
    assert text.index('kind="replay"') < text.index('kind="crc_data"')
    new = ("gpulens_gpu_pcie_link_max", "gpulens_gpu_temperature_threshold", "gpulens_gpu_nvlink_errors")
    assert [line for line in text.splitlines() if line.startswith(new) and 'gpu="0"' in line]
    assert not [line for line in text.splitlines() if line.startswith(new) and 'gpu="1"' in line], "unknown: absent"
