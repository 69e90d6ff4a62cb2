"""The sidebar filters narrow each other: a real Prometheus scrapes two simulated exporters that
relabelling places in two clusters, and the dashboard offers only the chosen cluster's nodes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.sources.prometheus import PrometheusSource
from dashboard.sources.source import Filters
from tests.support.exporter import run_exporter
from tests.support.prometheus import run_prometheus, wait_for_query

pytestmark = pytest.mark.integration

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")
RULES = Path(__file__).resolve().parents[1] / "deploy" / "rules" / "gpulens.rules.yml"


def _two_cluster_config(east: str, west: str) -> str:
    """Static target labels stand in for the relabelling a ServiceMonitor does (cluster, node)."""
    return (
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "rule_files: [gpulens.rules.yml]\n"
        "scrape_configs:\n  - job_name: gpulens\n    honor_labels: true\n    static_configs:\n"
        f"      - targets: ['{east}']\n        labels: {{cluster: east, node: gpu-east-1}}\n"
        f"      - targets: ['{west}']\n        labels: {{cluster: west, node: gpu-west-1}}\n"
    )


@pytest.fixture(scope="module")
def two_clusters() -> Iterator[str]:
    with (
        run_exporter("--sim.scenario", "h200x8", env={"NODE_NAME": "gpu-east-1"}) as east,
        run_exporter("--sim.scenario", "timeslice", env={"NODE_NAME": "gpu-west-1"}) as west,
        run_prometheus(
            _two_cluster_config(east.removeprefix("http://"), west.removeprefix("http://")),
            {"gpulens.rules.yml": RULES.read_text()},
        ) as prom,
    ):
        wait_for_query(prom, "count by (node) (gpulens_gpu_info)", lambda r: len(r) == 2)
        wait_for_query(prom, "count by (node) (gpulens_pod_gpu_allocation)", lambda r: len(r) == 2)
        yield prom


def test_label_values_are_limited_to_the_chosen_targets(two_clusters: str) -> None:
    src = PrometheusSource(two_clusters)
    assert src.label_values("node") == ["gpu-east-1", "gpu-west-1"]
    assert src.label_values("node", within=Filters(cluster="east")) == ["gpu-east-1"]
    assert src.label_values("cluster", within=Filters(node="gpu-west-1")) == ["west"]
    assert src.label_values("node", within=Filters(cluster="north")) == []
    # the namespace filter never narrows label lists: it applies to device series only
    assert src.label_values("node", within=Filters(namespace="inference")) == ["gpu-east-1", "gpu-west-1"]


def test_choosing_a_cluster_offers_only_its_nodes(two_clusters: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPULENS_DASHBOARD_SCRAPE", raising=False)
    monkeypatch.setenv("GPULENS_DASHBOARD_PROMETHEUS", two_clusters)
    monkeypatch.setenv("GPULENS_DASHBOARD_REFRESH_SECONDS", "0")
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.sidebar.selectbox(key="f_node").options == ["All", "gpu-east-1", "gpu-west-1"]
    at.sidebar.selectbox(key="f_node").select("gpu-west-1").run()
    at.sidebar.selectbox(key="f_cluster").select("east").run()
    assert not at.exception, [e.value for e in at.exception]
    node = at.sidebar.selectbox(key="f_node")
    assert node.options == ["All", "gpu-east-1"]
    assert node.value == "All", "a node of the other cluster is no longer selected"
    assert {m.label: m.value for m in at.metric}["Devices"] == "8", "the fleet page counts the east cluster only"
