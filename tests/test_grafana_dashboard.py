"""The Grafana dashboard (deploy/grafana/gpulens.json, built by scripts/grafana_dashboard.py) says
what the Streamlit dashboard says, and its tables read as tables.

- Every expression parses (promtool checks them as recording rules, the variables at "All").
- The Fleet row's counts are the Fleet page's four (Devices, Allocated, In use, Allocated but idle),
  in its words, from the recording rule of idle that dashboard/definitions.py writes; the idle,
  allocated and waste panels read only recording rules whose expressions are definitions.py's.
- Every table is instant queries aggregated by the columns it shows, with ``__name__``, ``Time`` and
  target labels hidden and every shown label renamed; "Exporters up" has a denominator; clock
  events list the throttling reasons, in words.
- One definition, live: a real Prometheus loading the shipped rules scrapes simulated h200x8, MIG and
  time-sliced nodes; at one instant the Fleet row's four counts equal ``frames.fleet.fleet_counts`` over
  the series the Streamlit page reads (PrometheusSource, the same Prometheus, the same instant).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from dashboard import definitions
from dashboard.frames.fleet import fleet_counts
from dashboard.frames.health import NOT_THROTTLING
from dashboard.sources.prometheus import PrometheusSource
from exporter.backends.nvml.device import CLOCK_EVENT_REASONS
from tests.support.exporter import run_exporter
from tests.support.prometheus import query, run_prometheus, wait_for_query

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
GRAFANA = REPO / "deploy" / "grafana" / "gpulens.json"
CHART_GRAFANA = REPO / "deploy" / "helm" / "gpulens" / "files" / "gpulens-grafana-dashboard.json"
RULES = REPO / "deploy" / "rules" / "gpulens.rules.yml"
FLEET_PAGE = ("Devices", "Allocated", "In use", "Allocated but idle")
"""The Fleet page's four counts (dashboard/views/fleet.py), in its words."""
FLEET_KEYS = {
    "Devices": "devices",
    "Allocated": "allocated",
    "In use": "in_use",
    "Allocated but idle": "allocated_idle",
}
SCENARIOS = ("h200x8", "mig", "timeslice")


def _load() -> ModuleType:
    # scripts/ is not a package: loaded from its file, as scripts/render_manifests.py loads it
    spec = importlib.util.spec_from_file_location("grafana_dashboard", REPO / "scripts" / "grafana_dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up while it loads
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


gd = _load()


def _doc() -> dict[str, Any]:
    return dict(json.loads(GRAFANA.read_text()))


def _panels(doc: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [p for p in (doc or _doc())["panels"] if p["type"] != "row"]


def _panel(title: str) -> dict[str, Any]:
    found = [p for p in _panels() if p["title"] == title]
    assert len(found) == 1, f"{len(found)} panels titled {title!r}"
    return found[0]


def _all(expr: str) -> str:
    """Template variables set to All, as Grafana sends them (allValue ``.*``)."""
    return re.sub(r"\$(cluster|node|gpu|namespace)\b", ".*", expr)


def _records() -> set[str]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}


# --- the file ------------------------------------------------------------------------------------


def test_the_shipped_json_and_the_charts_copy_are_what_the_script_builds() -> None:
    assert GRAFANA.read_text() == gd.render(), "run: python scripts/render_manifests.py"
    assert CHART_GRAFANA.read_text() == GRAFANA.read_text(), "run: python scripts/render_manifests.py"


def test_every_expression_parses_as_promql(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run the README test command (scripts/test.sh)")
    exprs = [_all(e) for e in gd.expressions(_doc()) if not e.startswith("label_values(")]
    assert len(exprs) >= 30
    rules = {
        "groups": [
            {"name": "grafana", "rules": [{"record": f"grafana:expr_{i}", "expr": e} for i, e in enumerate(exprs)]}
        ]
    }
    path = tmp_path / "grafana.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_rejects_a_broken_expression(tmp_path: Path) -> None:
    """The check above can fail: an unbalanced expression does not pass it."""
    promtool = shutil.which("promtool")
    assert promtool is not None
    path = tmp_path / "bad.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [{"record": "a:b", "expr": "count(up"}]}]}))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0


# --- one definition ------------------------------------------------------------------------------


def test_the_fleet_row_counts_what_the_fleet_page_counts_in_its_words() -> None:
    titles = [p["title"] for p in _panels()]
    for title in FLEET_PAGE:
        panel = _panel(title)
        assert panel["type"] == "stat"
        (target,) = panel["targets"]
        assert target["instant"]
        assert target["expr"] == gd.fleet_count_promql(FLEET_KEYS[title])
    assert titles.index("Devices") < titles.index("Allocated") < titles.index("In use")
    assert titles.index("In use") < titles.index("Allocated but idle")
    assert not [t for t in titles if "leaves" in t.lower()], "the Streamlit pages say devices, not leaves"


def test_idle_and_in_use_come_from_the_rule_definitions_py_writes() -> None:
    rule = gd.IDLE_RULE
    assert rule in definitions.RULES
    for title in ("In use", "Allocated but idle"):
        expr = _panel(title)["targets"][0]["expr"]
        assert f"{rule}{{" in expr
        # never a threshold of its own on a raw activity series
        assert "gpulens_gpu_sm_active" not in expr and "gpulens_gpu_utilization" not in expr
    assert "gpulens_pod_gpu_allocation" in _panel("Allocated but idle")["targets"][0]["expr"]
    assert f"{rule}" not in _panel("Allocated")["targets"][0]["expr"], "allocated is whether a pod holds it"


def test_idle_busy_allocated_and_waste_panels_read_the_rules() -> None:
    """Every panel about idle, in use, allocated or waste reads recording rules (names the rule file
    records), never a raw activity series with a threshold of its own; the per-leaf rules among them
    are the expressions of dashboard/definitions.py (the file is generated from it:
    tests/test_rules_generated.py)."""
    records = _records()
    about = re.compile(r"idle|allocat|wast|in use", re.IGNORECASE)
    panels = [p for p in _panels() if about.search(p["title"]) and "MIG" not in p["title"]]
    assert {p["title"] for p in panels} >= {"Allocated", "In use", "Allocated but idle", "Allocated but idle now"}
    for p in panels:
        for t in p["targets"]:
            used = set(re.findall(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b", t["expr"]))
            assert used <= records, (p["title"], used - records)
            if p["title"] != "Allocated":
                assert used, f"{p['title']!r} reads no recording rule"
            assert not re.search(r"gpulens_gpu_(sm_active|busy|utilization)_ratio", t["expr"]), p["title"]
    idle_rules = {"gpulens:gpu_idle:bool", "gpulens:pod_gpu_idle:bool", "namespace:gpulens_gpus_idle:count"}
    waste_rules = {"namespace:gpulens_gpu_wasted_hours:sum1h"}
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    assert all(r in exprs for r in idle_rules | waste_rules)


def test_the_fleet_counts_follow_frames_fleet_counts_definition_of_a_device() -> None:
    """Devices are the MIG instances and the whole GPUs without any; a count reads 0, not "No
    data", on an empty fleet."""
    devices = gd.fleet_count_promql("devices")
    assert 'mig_uuid!=""' in devices and "unless on (uuid) gpulens_mig_instance_info" in devices
    for key in ("devices", "allocated", "in_use", "allocated_idle"):
        assert gd.fleet_count_promql(key).endswith(" or vector(0)")
        assert f"by ({', '.join(definitions.LEAF)})" in gd.fleet_count_promql(key), "one per device"


# --- tables and stats shaped for reading ---------------------------------------------------------


def _tables() -> list[dict[str, Any]]:
    return [p for p in _panels() if p["type"] == "table"]


def _outer_by(expr: str) -> list[str]:
    m = re.match(r"^(?:max|min|sum|count|avg) by \(([^)]*)\)", expr)
    assert m, f"a table's query aggregates by the columns it shows: {expr}"
    return [label.strip() for label in m.group(1).split(",")]


def test_every_table_is_instant_and_organised() -> None:
    tables = _tables()
    assert len(tables) >= 7
    for p in tables:
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["instant"] and not t["range"], f"{p['title']!r}: a range query in a table"
            assert t["format"] == "table", p["title"]
        organize = [x for x in p.get("transformations", []) if x["id"] == "organize"]
        assert len(organize) == 1, p["title"]
        opts = organize[0]["options"]
        hidden = {k for k, v in opts["excludeByName"].items() if v}
        renamed = opts["renameByName"]
        assert {"__name__", "Time", "job", "instance"} <= hidden, p["title"]
        for t in p["targets"]:
            for label in _outer_by(t["expr"]):
                assert label in hidden or (label in renamed and renamed[label] != label), (p["title"], label)
        values = ["Value"] if len(p["targets"]) == 1 else [f"Value #{t['refId']}" for t in p["targets"]]
        for v in values:
            assert v in hidden or (v in renamed and renamed[v] != v), (p["title"], v)
        if len(p["targets"]) > 1:
            assert p["transformations"][0]["id"] == "merge", p["title"]
        shown = [k for k in opts["indexByName"] if k not in hidden]
        assert shown and all(k in renamed for k in shown), p["title"]


def test_every_table_states_its_sort_and_percent_tables_their_unit() -> None:
    for p in _tables():
        assert p["options"]["sortBy"], p["title"]
        header = p["options"]["sortBy"][0]["displayName"]
        assert header in p["transformations"][-1]["options"]["renameByName"].values(), p["title"]
    for title in (
        "Allocated but idle now",
        "Pods holding GPUs",
        "Throttling in the last hour",
        "Boundness per leaf (10 m)",
    ):
        assert _panel(title)["fieldConfig"]["defaults"]["unit"] == "percentunit", title


def test_throttling_lists_gpus_with_an_active_clock_event_one_row_per_gpu_and_reason_in_words() -> None:
    p = _panel("Throttling in the last hour")
    (t,) = p["targets"]
    assert _outer_by(t["expr"]) == ["cluster", "node", "gpu", "reason"]
    assert t["expr"].endswith(" > 0"), "only the GPUs and reasons that held the clocks"
    for reason in NOT_THROTTLING:
        assert reason in t["expr"].split("reason!~", 1)[1].split('"')[1].split("|")
    (override,) = p["fieldConfig"]["overrides"]
    assert override["matcher"] == {"id": "byName", "options": "Reason"}
    words = override["properties"][0]["value"][0]["options"]
    throttling = set(CLOCK_EVENT_REASONS.values()) - NOT_THROTTLING
    assert throttling <= set(words), throttling - set(words)
    assert all(words[r]["text"] != r for r in throttling)
    assert p["options"]["sortBy"] == [{"displayName": "Share of the hour", "desc": True}]
    assert "Clock events active (throttling)" not in [x["title"] for x in _panels()]


def test_exporters_up_has_a_denominator() -> None:
    p = _panel("Exporters up")
    assert p["type"] == "stat" and len(p["targets"]) == 2
    up, of = (t["expr"] for t in p["targets"])
    assert "gpulens_up" in up and "== 1" in up
    assert "gpulens:exporter_target:info" in of and "gpulens:exporter_target:info" in _records()
    assert [t["legendFormat"] for t in p["targets"]] == ["up", "of targets"]
    assert p["options"]["textMode"] == "value_and_name"


def test_a_table_without_column_headers_is_refused() -> None:
    bad = gd.Panel("raw", "table", (gd.Target("up", instant=True),))
    with pytest.raises(ValueError, match="no Table"):
        gd._panel_json(bad, 1, 0, 0)
    mismatched = gd.Panel("two", "table", (gd.Target("up", instant=True),) * 2, table=gd.Table((("job", "Job"),)))
    with pytest.raises(ValueError, match="value headers"):
        gd._panel_json(mismatched, 1, 0, 0)


# --- one definition, live: the Fleet row against frames.fleet.fleet_counts ------------------------------


def _config(targets: list[tuple[str, str]]) -> str:
    static = "".join(
        f"      - targets: ['{t}']\n        labels: {{cluster: test, node: {node}}}\n" for t, node in targets
    )
    return (
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "rule_files: [gpulens.rules.yml]\n"
        "scrape_configs:\n  - job_name: gpulens\n    honor_labels: true\n    static_configs:\n" + static
    )


FAULTS = {"h200x8": "nvlink_down=1:7"}
"""NVLink 7 of the h200x8 node's GPU 1 is down: the NVLinks-down table has a row."""


@pytest.fixture(scope="module")
def prom() -> Iterator[str]:
    """A Prometheus loading the shipped rules, scraping simulated h200x8 (a link down), MIG and
    time-sliced nodes, once every device has an idle verdict."""
    with ExitStack() as stack:
        targets = []
        for scenario in SCENARIOS:
            node = f"gpu-node-{scenario}"
            faults = ("--sim.faults", FAULTS[scenario]) if scenario in FAULTS else ()
            base = stack.enter_context(
                run_exporter("--sim.scenario", scenario, "--no-probes", *faults, env={"NODE_NAME": node})
            )
            targets.append((base.removeprefix("http://"), node))
        base = stack.enter_context(run_prometheus(_config(targets), {"gpulens.rules.yml": RULES.read_text()}))
        devices = _all(gd.fleet_count_promql("devices"))
        wait_for_query(base, devices, lambda r: bool(r) and float(r[0]["value"][1]) > 0, timeout=60)
        verdicts = f"count(max by (uuid, mig_uuid) ({gd.IDLE_RULE}))"
        wait_for_query(
            base,
            f"{verdicts} >= scalar({devices})",
            lambda r: bool(r),
            timeout=90,
        )
        time.sleep(3)  # every series of one scrape in
        yield base


def _grafana_counts(base: str, at: float) -> dict[str, int]:
    out = {}
    for title in FLEET_PAGE:
        (result,) = query(base, _all(_panel(title)["targets"][0]["expr"]), at=at)
        out[FLEET_KEYS[title]] = int(float(result["value"][1]))
    return out


def _page_counts(base: str, at: float) -> dict[str, int]:
    """What the Fleet page shows at ``at``: its queries through PrometheusSource, then fleet_counts."""
    src = PrometheusSource(base)
    counts = fleet_counts(
        src.instant("gpulens_gpu_info", end=at),
        src.instant("gpulens_mig_instance_info", end=at),
        src.instant("gpulens_pod_gpu_allocation", end=at),
        src.leaf_idle(end=at),
    )
    return {k: counts[k] for k in FLEET_KEYS.values()}


def test_the_fleet_row_gives_the_fleet_pages_numbers(prom: str) -> None:
    at = time.time() - 2
    page = _page_counts(prom, at)
    assert _grafana_counts(prom, at) == page
    # a fleet that tells the counts apart: idle devices nobody holds, and idle ones held
    assert page["devices"] > page["allocated"] > page["allocated_idle"] > 0
    idle_anywhere = query(prom, f"sum({gd.IDLE_RULE})", at=at)
    assert int(float(idle_anywhere[0]["value"][1])) > page["allocated_idle"], "the old 'Idle leaves' differs"


def test_every_table_returns_rows_with_only_its_columns(prom: str) -> None:
    """Live, each table's query returns exactly the labels its ``by`` names (so organize has no
    stray column to hide) and at least one row on the simulated fleet (ECC, MIG, throttling: the
    simulator has corrected ECC errors, MIG GPUs and power-capped GPUs)."""
    at = time.time() - 2
    for p in _tables():
        for t in p["targets"]:
            rows = query(prom, _all(t["expr"]), at=at)
            assert rows, f"{p['title']!r}: no rows"
            expected = set(_outer_by(t["expr"]))
            for r in rows:
                assert set(r["metric"]) <= expected, (p["title"], set(r["metric"]) - expected)
