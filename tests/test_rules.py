"""The Prometheus rules: promtool accepts and unit-tests them, they use only catalogue metrics, every
alert has a test and a runbook, and the Helm chart ships the same file."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dashboard.serving.engines import RULE_LABELS as SERVING_LABELS
from exporter.render.metrics import BY_NAME
from tests.support.documents import yaml_file

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "deploy" / "rules" / "gpulens.rules.yml"
RULE_TESTS = sorted((REPO / "deploy" / "rules" / "tests").glob("*.test.yml"))
CHART_RULES = REPO / "deploy" / "helm" / "gpulens" / "files" / "gpulens.rules.yml"
RUNBOOKS = REPO / "docs" / "runbooks.md"

ALERTS = {
    "GPUAllocatedButIdle",
    "GPUUnderutilized",
    "GPULaunchBound",
    "GPUMemoryBandwidthDegraded",
    "GPUXidError",
    "GPUEccUncorrectable",
    "GPUThermalThrottling",
    "GPUExporterDown",
    "GPUExporterStageFailing",
    "GPULost",
    "GPURowRemapFailure",
    "GPURowRemapPending",
    "GPUPcieLinkDegraded",
    "GPUNvlinkErrors",
    "GPUNvlinkDown",
    "GPUTemperatureHigh",
    "GPUNodeFewerHealthyThanAllocatable",
    "GPUDirectRDMANotReady",
    "GPUJobStraggler",
    "GPUJobCommunicationBound",
}
POD_ALERTS = {"GPUAllocatedButIdle", "GPUUnderutilized", "GPULaunchBound"}
ROUTING_LABELS = {"namespace", "pod", "workload"}
# Labels Prometheus adds to every scraped series (node by the ServiceMonitor's relabelling).
TARGET_LABELS = {"instance", "job", "node", "cluster"}
"""Labels the scrape (or the store: a `cluster` label per cluster in a shared store) adds."""


def promtool() -> str:
    """Path of promtool; fails (not skips) when the test command did not install it."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed: run the README test command (scripts/test.sh)")
    return path


def rule_groups() -> list[dict[str, Any]]:
    doc = yaml_file(RULES)
    return list(doc["groups"])


def alert_rules() -> list[dict[str, Any]]:
    return [r for g in rule_groups() for r in g["rules"] if "alert" in r]


@pytest.mark.integration  # runs another program
def test_promtool_accepts_the_rules_file() -> None:
    result = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


@pytest.mark.integration  # runs another program
@pytest.mark.parametrize("test_file", RULE_TESTS, ids=[p.name for p in RULE_TESTS])
def test_rule_unit_tests_pass_in_promtool(test_file: Path) -> None:
    result = subprocess.run(
        [promtool(), "test", "rules", test_file.name],
        cwd=test_file.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_define_every_alert_the_docs_promise() -> None:
    assert {r["alert"] for r in alert_rules()} == ALERTS


def _tested_alerts() -> dict[str, list[dict[str, Any]]]:
    """Alert name -> the exp_alerts lists of every alert_rule_test case naming it."""
    seen: dict[str, list[dict[str, Any]]] = {}
    for path in RULE_TESTS:
        doc = yaml_file(path)
        for case in doc["tests"]:
            for check in case.get("alert_rule_test", []):
                seen.setdefault(check["alertname"], []).append(check)
    return seen


def test_every_alert_has_a_test_where_it_fires_and_one_where_it_does_not() -> None:
    tested = _tested_alerts()
    for alert in ALERTS:
        checks = tested.get(alert, [])
        assert any(c.get("exp_alerts") for c in checks), f"{alert}: no test expects it to fire"
        assert any(not c.get("exp_alerts") for c in checks), f"{alert}: no test expects it silent"


def test_pod_alerts_carry_the_routing_labels() -> None:
    tested = _tested_alerts()
    for alert in POD_ALERTS:
        fired = [a for c in tested[alert] for a in c.get("exp_alerts") or []]
        assert fired
        for expected in fired:
            assert set(expected["exp_labels"]) >= ROUTING_LABELS, (alert, expected["exp_labels"])


def _anchors(markdown: str) -> set[str]:
    """GitHub-style anchors of the markdown headings."""
    anchors = set()
    for line in markdown.splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            anchors.add(slug)
    return anchors


def test_every_alert_links_an_existing_runbook_section() -> None:
    anchors = _anchors(RUNBOOKS.read_text())
    for rule in alert_rules():
        url = rule["annotations"]["runbook_url"]
        assert "/docs/runbooks.md#" in url, url
        anchor = url.rsplit("#", 1)[1]
        assert anchor == rule["alert"].lower()
        assert anchor in anchors, f"{rule['alert']}: docs/runbooks.md has no section #{anchor}"


def test_every_alert_has_a_severity_summary_and_description() -> None:
    for rule in alert_rules():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"].strip()
        assert rule["annotations"]["description"].strip()


_SELECTOR = re.compile(r"(?<![:\w])(gpulens_[a-z0-9_]+)(?![:\w])(\{[^}]*\})?")
_GROUPING = re.compile(r"\b(?:by|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def test_rules_use_only_catalogue_metrics_and_their_labels() -> None:
    """A renamed metric or label in exporter/render/metrics.py must break this test, not users' alerts."""
    recorded = {r["record"] for g in rule_groups() for r in g["rules"] if "record" in r}
    for group in rule_groups():
        for rule in group["rules"]:
            expr = rule["expr"]
            for name, matchers in _SELECTOR.findall(expr):
                assert name in BY_NAME, f"{rule.get('alert') or rule.get('record')}: unknown metric {name}"
                for label in re.findall(r"([a-z_]+)\s*(?:=~|!~|!=|=)", matchers):
                    assert label in set(BY_NAME[name].labels) | TARGET_LABELS, (name, label)
            # `direction` (tx/rx) is the one label a rule adds itself (gpulens:nic_port_bytes:rate5m).
            # The serving rules' labels are the engine table's (dashboard/serving/engines.py;
            # tests/test_serving_rules.py checks their metric names against it).
            known = (
                {lab for spec in BY_NAME.values() for lab in spec.labels}
                | TARGET_LABELS
                | {"direction"}
                | SERVING_LABELS
            )
            for labels in _GROUPING.findall(expr):
                for label in filter(None, (x.strip() for x in labels.split(","))):
                    assert label in known, f"{rule.get('alert') or rule.get('record')}: unknown label {label}"
            for name in re.findall(r"\b([a-z_]+:[a-z0-9_]+:[a-z0-9_]+)\b", expr):
                assert name in recorded, f"uses recording rule {name} that no rule records"


def test_helm_chart_ships_the_same_rules_file() -> None:
    assert CHART_RULES.read_text() == RULES.read_text(), (
        "deploy/helm/gpulens/files/gpulens.rules.yml drifted: run python scripts/gen_rules.py"
    )
