"""The metric catalogue is the contract: docs match it, names follow Prometheus conventions."""

from __future__ import annotations

import re
from pathlib import Path

from exporter import metrics

REPO = Path(__file__).resolve().parents[1]


def test_docs_metrics_md_is_generated_from_the_catalogue() -> None:
    on_disk = (REPO / "docs" / "metrics.md").read_text()
    assert on_disk == metrics.markdown(), (
        "docs/metrics.md drifted from exporter/metrics.py: run "
        "`.venv/bin/python -m exporter.metrics --markdown > docs/metrics.md`"
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
        "gpulens_pod_gpu_sm_share_ratio",
        "gpulens_probe_efficiency_ratio",
        "gpulens_stage_success",
        "gpulens_snapshot_age_seconds",
    }
    assert core <= set(metrics.BY_NAME)
