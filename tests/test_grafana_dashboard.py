"""Every query of every Grafana dashboard (deploy/grafana/*.json) on one real Prometheus.

A Prometheus loading the shipped rules scrapes simulated exporters of every capability: h200x8 (an
NVLink down), MIG, time-slicing, MPS, the two ``jobs`` nodes (four multi-node jobs, a straggler, EFAs
with GPUDirect RDMA), p5en-nogdr (EFAs without GPUDirect RDMA) and the serving node with its
inference engines (docs/serving.md's scrape job). Every target carries the ``node``
label (the scrape config sets it, as the chart's ServiceMonitor does, where the exporter does not put
it on its series itself). Then:

- every expression of every board, with the variables at All, answers without error, and returns
  data unless its panel says in words what nothing means ("No throttling in the last hour.");
- every variable has values, the GPU variable GPU indices;
- the one-GPU board, for one node and one GPU index, has data in every panel that must have some;
- every table returns exactly the labels its ``by`` names (organize has no stray column);
- the Fleet row's four counts are the Streamlit Fleet page's (``frames.fleet.fleet_counts``) on the
  same Prometheus at the same instant;
- promtool parses every expression.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml

from dashboard import definitions
from dashboard.frames.fleet import fleet_counts
from dashboard.sources.prometheus import PrometheusSource
from tests.support.engines import engines_job, run_engines
from tests.support.exporter import run_exporter
from tests.support.grafana import docs, gp, panels
from tests.support.prometheus import query, run_prometheus, wait_for_query

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "deploy" / "rules" / "gpulens.rules.yml"
FLEET_KEYS = {
    "Devices": "devices",
    "Allocated": "allocated",
    "In use": "allocated_in_use",
    "Allocated but idle": "allocated_idle",
    "Collecting": "collecting",
}
"""The Fleet page's five counts (dashboard/views/fleet.py), in its words."""
NODES = {
    "gpu-node-h200x8": ("h200x8", ("--sim.faults", "nvlink_down=1:7;lost=6;xid=2:79;pcie_link=4:4:8")),
    "gpu-node-mig": ("mig", ()),
    "gpu-node-timeslice": ("timeslice", ()),
    "gpu-node-mps": ("mps", ()),
    "jobs-0": ("jobs-0", ()),
    "jobs-1": ("jobs-1", ()),
    "p5en-nogdr": ("p5en-nogdr", ()),
    "p5en-serving": ("serving", ()),
}
"""Node name -> (scenario, extra flags). On the h200x8 node: NVLink 7 of GPU 1 is down, GPU 6 is lost,
GPU 2 had Xid 79 and GPU 4's PCIe link trained at Gen4 x8 (the tables of faults have rows). The
serving node's inference engines (``python -m exporter.sim.engines``) are scraped beside it with
docs/serving.md's relabelling, so the Serving board's rules have data."""
ONE_GPU = {"node": "jobs-1", "gpu": "3"}
"""The one-GPU board's pick: the straggler of the jobs scenario (throttled, held by a pod)."""
DATA_TIMEOUT_S = 150.0


def substitute(expr: str, picks: dict[str, str] | None = None) -> str:
    """Template variables as Grafana sends them: All (``.*``), or the value picked (a plain name)."""
    picks = picks or {}
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+", v) for v in picks.values()), "no regex escaping here"
    return re.sub(r"\$(cluster|node|gpu|namespace)\b", lambda m: picks.get(m.group(1), ".*"), expr)


def _config(targets: list[tuple[str, str]], engine_sd: Path) -> str:
    static = [{"targets": [t], "labels": {"cluster": "test", "node": node}} for t, node in targets]
    exporters = {"job_name": "gpulens", "honor_labels": True, "static_configs": static}
    return yaml.safe_dump(
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["gpulens.rules.yml"],
            "scrape_configs": [exporters, engines_job(engine_sd, cluster="test")],
        }
    )


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One Prometheus with the shipped rules over every scenario and the serving node's engines,
    once every device has an idle verdict and the jobs' stragglers are recorded."""
    with ExitStack() as stack:
        engine_sd = stack.enter_context(run_engines(tmp_path_factory.mktemp("engines")))
        targets = []
        for node, (scenario, flags) in NODES.items():
            base = stack.enter_context(
                run_exporter("--sim.scenario", scenario, "--no-probes", *flags, env={"NODE_NAME": node})
            )
            targets.append((base.removeprefix("http://"), node))
        base = stack.enter_context(
            run_prometheus(_config(targets, engine_sd), {"gpulens.rules.yml": RULES.read_text()})
        )
        devices = substitute(gp.fleet_count_promql("devices"))
        wait_for_query(base, devices, lambda r: bool(r) and float(r[0]["value"][1]) > 0, timeout=90)
        verdicts = f"count(max by (uuid, mig_uuid) ({gp.IDLE_RULE}))"
        wait_for_query(base, f"{verdicts} >= scalar({devices})", bool, timeout=90)
        time.sleep(3)  # every series of one scrape in
        yield base


def _targets(picks: dict[str, str] | None = None, uids: tuple[str, ...] = ()) -> dict[str, tuple[str, bool]]:
    """``board / panel / refId`` -> (expression with the variables substituted, may be empty)."""
    out = {}
    for uid, doc in docs().items():
        if uids and uid not in uids:
            continue
        for p in panels(doc):
            may_be_empty = bool(p["fieldConfig"]["defaults"].get("noValue"))
            for t in p["targets"]:
                out[f"{uid} / {p['title']} / {t['refId']}"] = (substitute(t["expr"], picks), may_be_empty)
    return out


def _until_data(prom: str, targets: dict[str, tuple[str, bool]]) -> list[str]:
    """Evaluate every target (an error fails at once); poll those that must have data until they
    do or DATA_TIMEOUT_S passes; return the keys still without data."""
    pending = {}
    for key, (expr, may_be_empty) in targets.items():
        try:
            rows = query(prom, expr)
        except Exception as exc:
            pytest.fail(f"{key}: {exc}")
        if not rows and not may_be_empty:
            pending[key] = expr
    deadline = time.monotonic() + DATA_TIMEOUT_S
    while pending and time.monotonic() < deadline:
        time.sleep(3.0)
        pending = {k: e for k, e in pending.items() if not query(prom, e)}
    return sorted(pending)


def test_every_query_of_every_dashboard_answers_and_has_data(prom: str) -> None:
    targets = _targets()
    assert len(targets) >= 150
    missing = _until_data(prom, targets)
    assert not missing, "no data:\n" + "\n".join(missing)


_SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^{}]*)\}")
_VARIABLE = re.compile(r'(\w+)=~"\$(\w+)"')


def test_every_variable_filters_a_label_its_series_has(prom: str) -> None:
    """A matcher ``node=~"$node"`` on a series without ``node`` matches at All ("" matches ``.*``)
    and nothing once a node is picked: each selector's variable labels are on every series it reads."""
    selectors = set()
    for uid, doc in docs().items():
        for p in panels(doc):
            for t in p["targets"]:
                for name, body in _SELECTOR.findall(t["expr"]):
                    selectors |= {(uid, p["title"], name, label) for label, _ in _VARIABLE.findall(body)}
    assert len(selectors) > 200
    lacking = sorted(
        f"{uid} / {title}: {name} has no {label}"
        for uid, title, name, label in selectors
        if query(prom, f'count({name}{{{label}=""}})')
    )
    assert not lacking, "\n".join(lacking)


def _label_values(base: str, label: str, match: str) -> list[str]:
    url = f"{base}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": match})
    with urllib.request.urlopen(url, timeout=10) as resp:
        return list(json.load(resp)["data"])


def test_every_variable_has_values_and_the_gpu_variable_gpu_indices(prom: str) -> None:
    for uid, doc in docs().items():
        for var in doc["templating"]["list"]:
            if var["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", var["query"])
            assert m, var["query"]
            values = _label_values(prom, m.group(2), substitute(m.group(1)))
            assert values, f"{uid}: variable {var['name']} has no values"
            if var["name"] == "gpu":
                assert set(values) == {str(i) for i in range(8)}, values
            if var["name"] == "node":
                assert set(NODES) <= set(values), "the node names, not addresses"


def test_the_one_gpu_board_for_a_node_and_gpu_index(prom: str) -> None:
    targets = _targets(ONE_GPU, uids=(gp.GPU,))
    missing = _until_data(prom, targets)
    assert not missing, "no data:\n" + "\n".join(missing)
    (holder,) = {r["metric"]["pod"] for r in query(prom, targets[f"{gp.GPU} / Pods holding it / A"][0])}
    assert holder.startswith("mixtral-sft-workers-0-1-"), "the straggler's pod"
    temperature = [k for k in targets if k.startswith(f"{gp.GPU} / Temperature /")]
    assert len(temperature) == 3, "the GPU's temperature and its two limits"
    for key in temperature:
        rows = query(prom, targets[key][0])
        assert {r["metric"].get("gpu") for r in rows} == {"3"} and {r["metric"].get("node") for r in rows} == {"jobs-1"}


def _outer_by(expr: str) -> list[str]:
    m = re.match(r"^(?:max|min|sum|count|avg) by \(([^)]*)\)", expr)
    assert m, expr
    return [label.strip() for label in m.group(1).split(",")]


def test_every_table_returns_rows_with_only_its_columns(prom: str) -> None:
    at = time.time() - 2
    for uid, doc in docs().items():
        for p in panels(doc):
            if p["type"] != "table":
                continue
            for t in p["targets"]:
                rows = query(prom, substitute(t["expr"]), at=at)
                expected = set(_outer_by(t["expr"]))
                for r in rows:
                    assert set(r["metric"]) <= expected, (uid, p["title"], set(r["metric"]) - expected)


def test_the_straggler_table_names_the_node_gpu_and_pod(prom: str) -> None:
    p = next(p for p in panels(docs()[gp.JOBS]) if p["title"] == "Stragglers" and p["type"] == "table")
    rows = wait_for_query(prom, substitute(p["targets"][0]["expr"]), bool, timeout=DATA_TIMEOUT_S)
    names = {(r["metric"]["node"], r["metric"]["gpu"], r["metric"]["pod"]) for r in rows}
    assert any(node == "jobs-1" and gpu == "3" and pod.startswith("mixtral-sft") for node, gpu, pod in names), names


def test_the_fleet_row_gives_the_fleet_pages_numbers(prom: str) -> None:
    fleet = {p["title"]: p for p in panels(docs()[gp.FLEET])}
    at = time.time() - 2
    src = PrometheusSource(prom)
    page = fleet_counts(
        src.instant("gpulens_gpu_info", end=at),
        src.instant("gpulens_mig_instance_info", end=at),
        src.instant("gpulens_pod_gpu_allocation", end=at),
        src.leaf_idle(end=at),
        src.window_ages(definitions.LEAF_HISTORY_METRIC, definitions.LEAF, end=at),
    )
    grafana = {}
    for title, key in FLEET_KEYS.items():
        (result,) = query(prom, substitute(fleet[title]["targets"][0]["expr"]), at=at)
        grafana[key] = int(float(result["value"][1]))
    assert grafana == {k: page[k] for k in FLEET_KEYS.values()}
    assert page["devices"] > page["allocated"] > 0
    assert page["allocated"] == page["allocated_in_use"] + page["allocated_idle"] + page["collecting"]


def _all_expressions() -> list[str]:
    out = []
    for doc in docs().values():
        out += [substitute(t["expr"]) for p in panels(doc) for t in p["targets"]]
    return out


def test_every_expression_parses_as_promql(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run the README test command (scripts/test.sh)")
    exprs = _all_expressions()
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
