"""gpulens's Grafana dashboards (deploy/grafana/*.json, built by scripts/grafana_dashboard.py with
Grafana's typed SDK) cover every capability, read only what exists, and are valid for Grafana's schema.

- The files, and the chart's copies, are what the script builds; none is left over.
- Each board round-trips through the SDK's models (Grafana's schema, generated): a field the schema
  does not know, or a value of the wrong type, fails.
- Coverage: every recording rule a Streamlit page reads has a Grafana panel, and every rule of the
  rule file is on a panel (none is internal today); every series a panel reads is exported (the
  exporter's catalogue) or a recording rule (or one of the few Prometheus makes: ``ALERTS``).
- Shape: every board has the cluster, node, GPU index and namespace variables and links to every
  other board; tables name node, GPU and pod, are instant, organised and sorted; threshold lines
  are series of the GPU's own limits; one unit per quantity.
The live half (every query on a real Prometheus) is tests/test_grafana_dashboard.py.
"""

from __future__ import annotations

import enum
import functools
import json
import re
import types
import typing
from typing import Any

import pytest
import yaml
from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dash_m

from dashboard import definitions
from dashboard.frames.health import NOT_THROTTLING
from exporter.backends.nvml.device import CLOCK_EVENT_REASONS
from exporter.render.metrics import BY_NAME
from tests.support.grafana import CHART_GRAFANA, GRAFANA, REPO, docs, gd, gp, panels

RULES = REPO / "deploy" / "rules" / "gpulens.rules.yml"
PROMETHEUS_SERIES = frozenset({"ALERTS"})
"""Series Prometheus itself makes that a panel may read (the rule file's firing alerts)."""
INTERNAL_RULES: frozenset[str] = frozenset()
"""Recording rules no panel needs to show (none today: every rule is on a panel)."""
AWAITING_PANELS: frozenset[str] = frozenset()
"""Recording rules whose Grafana board is not built yet (none: the Serving board shows the
gpulens.serving group)."""
RULE_DEFINITIONS = ("dashboard/definitions.py", "dashboard/jobs.py", "dashboard/serving/rules.py")
"""Where the rules are written (not read): left out of what the pages use."""


def all_panels() -> list[tuple[str, dict[str, Any]]]:
    return [(uid, p) for uid, doc in docs().items() for p in panels(doc)]


@functools.cache
def records() -> frozenset[str]:
    """Every recording rule of the rule file (parsed once: the YAML costs 70 ms a read)."""
    doc = yaml.safe_load(RULES.read_text())
    return frozenset(r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r)


# --- the files ---------------------------------------------------------------------------------------


def test_the_shipped_dashboards_and_the_charts_copies_are_what_the_script_builds() -> None:
    built = gd.render_all()
    assert len(built) == 9
    for directory in (GRAFANA, CHART_GRAFANA):
        assert sorted(p.name for p in directory.glob("*.json")) == sorted(built), (
            "run: python scripts/render_manifests.py"
        )
        for name, text in built.items():
            assert (directory / name).read_text() == text, f"{directory / name}: run python scripts/render_manifests.py"


# --- Grafana's schema, as the SDK's models know it -----------------------------------------------------


def _type_errors(value: Any, hint: Any, path: str) -> list[str]:
    """Where ``value`` (an SDK model decoded from JSON) does not have the type its annotation says."""
    origin = typing.get_origin(hint)
    if hint is Any or hint is object:
        return []
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return []
        tries = [_type_errors(value, h, path) for h in options if h is not type(None)]
        return [] if any(not t for t in tries) else tries[0]
    if origin is typing.Literal:
        return [] if value in typing.get_args(hint) else [f"{path}: {value!r} not one of {typing.get_args(hint)}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: {type(value).__name__}, not a list"]
        (item,) = typing.get_args(hint) or (Any,)
        return [e for i, v in enumerate(value) for e in _type_errors(v, item, f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, not an object"]
        _, item = typing.get_args(hint) or (Any, Any)
        return [e for k, v in value.items() for e in _type_errors(v, item, f"{path}.{k}")]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return (
            []
            if isinstance(value, hint) or value in {m.value for m in hint}
            else [f"{path}: {value!r} not a {hint.__name__}"]
        )
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return [] if ok else [f"{path}: {value!r} is not a number"]
    if hint in (int, str, bool):
        ok = isinstance(value, hint) and not (hint is int and isinstance(value, bool))
        return [] if ok else [f"{path}: {value!r} is not {hint.__name__}"]
    if isinstance(hint, type) and hint.__module__.startswith("grafana_foundation_sdk.models"):
        if isinstance(value, dict) and hasattr(hint, "from_json"):
            value = hint.from_json(value)  # a few decoders keep the raw JSON (a panel's links)
        if not isinstance(value, hint):
            return [f"{path}: {type(value).__name__}, not {hint.__name__}"]
        return _model_errors(value, path)
    return []


def _model_errors(obj: Any, path: str = "") -> list[str]:
    """Type errors in every field of an SDK model object and the models below it."""
    hints = typing.get_type_hints(type(obj))
    return [
        e
        for name, hint in hints.items()
        if hasattr(obj, name)
        for e in _type_errors(getattr(obj, name), hint, f"{path}.{name}")
    ]


def schema_errors(doc: dict[str, Any]) -> list[str]:
    """What Grafana's schema (the SDK's models) finds wrong in a dashboard JSON model: fields it
    drops on decoding (unknown to the schema) and values of the wrong type."""
    plugins.register_default_plugins()
    model = dash_m.Dashboard.from_json(doc)
    errors = _model_errors(model)
    back = json.loads(json.dumps(model, cls=JSONEncoder))

    def diff(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            errors.extend(f"{path}.{k}: not in the schema" for k in a.keys() - b.keys())
            errors.extend(f"{path}.{k}: added by the schema" for k in b.keys() - a.keys())
            for k in a.keys() & b.keys():
                diff(a[k], b[k], f"{path}.{k}")
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                diff(x, y, f"{path}[{i}]")
        elif a != b:
            errors.append(f"{path}: {a!r} decodes as {b!r}")

    diff(doc, back, "")
    return errors


def test_every_dashboard_is_valid_for_grafanas_schema() -> None:
    for uid, doc in docs().items():
        assert schema_errors(doc) == [], uid


def test_the_schema_check_fails_on_an_unknown_field_and_a_wrong_type() -> None:
    doc = docs()["gpulens-health"]
    unknown = json.loads(json.dumps(doc))
    panels(unknown)[0]["colour"] = "red"
    assert any("colour: not in the schema" in e for e in schema_errors(unknown))
    unknown_option = json.loads(json.dumps(doc))
    next(p for p in panels(unknown_option) if p["type"] == "timeseries")["options"]["legend"]["placment"] = "right"
    assert any("placment: not in the schema" in e for e in schema_errors(unknown_option))
    wrong = json.loads(json.dumps(doc))
    panels(wrong)[0]["gridPos"]["w"] = "12"
    assert any("grid_pos.w: '12' is not int" in e for e in schema_errors(wrong))
    wrong_enum = json.loads(json.dumps(doc))
    wrong_enum["graphTooltip"] = 7
    assert schema_errors(wrong_enum)


# --- coverage ----------------------------------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_RULE = re.compile(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b")
_SELECTED = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{")
_OURS = re.compile(r"\bgpulens_[a-z0-9_]+\b")


def series_read(expr: str) -> set[str]:
    """The series an expression reads: recording rules, gpulens series and any name with a selector
    (string literals left out, so that label values and regexes are not taken for names)."""
    bare = _STRING.sub('""', expr)
    rules = set(_RULE.findall(bare))
    bare = _RULE.sub("", bare)
    return rules | set(_OURS.findall(bare)) | set(_SELECTED.findall(bare))


def unknown_series(board_docs: dict[str, dict[str, Any]]) -> list[str]:
    """``board / panel: name`` for each series a panel or variable reads that is neither exported nor
    a recording rule (nor one Prometheus makes)."""
    known = set(BY_NAME) | records() | PROMETHEUS_SERIES
    out = []
    for uid, doc in board_docs.items():
        for p in panels(doc):
            out += [f"{uid} / {p['title']}: {n}" for t in p["targets"] for n in sorted(series_read(t["expr"]) - known)]
        for v in doc["templating"]["list"]:
            if v["type"] == "query":
                out += [f"{uid} / variable {v['name']}: {n}" for n in sorted(series_read(v["query"]) - known)]
    return out


def rules_on_panels(board_docs: dict[str, dict[str, Any]]) -> set[str]:
    return {
        r for doc in board_docs.values() for p in panels(doc) for t in p["targets"] for r in _RULE.findall(t["expr"])
    }


def rules_pages_read() -> set[str]:
    """The recording rules the Streamlit dashboard reads: named in dashboard/ outside the modules
    that write them (its sources, views, frames, advisor)."""
    found: set[str] = set()
    for path in sorted((REPO / "dashboard").rglob("*.py")):
        if str(path.relative_to(REPO)) in RULE_DEFINITIONS:
            continue
        found |= set(_RULE.findall(path.read_text())) & records()
    return found


def missing_rules(board_docs: dict[str, dict[str, Any]]) -> set[str]:
    """Rules the pages read that no panel shows (the advisor's serving records await their board)."""
    return rules_pages_read() - rules_on_panels(board_docs) - AWAITING_PANELS


def test_every_rule_a_page_reads_has_a_grafana_panel() -> None:
    pages = rules_pages_read()
    assert {"gpulens:gpu_idle:bool", "gpulens:job_straggler:info", "gpulens:pod_gpu_wasted:gpus"} <= pages
    assert missing_rules(docs()) == set()


def test_every_recording_rule_is_on_a_panel_or_said_to_be_internal() -> None:
    unused = records() - rules_on_panels(docs()) - INTERNAL_RULES - AWAITING_PANELS
    assert unused == set(), f"{len(unused)} of {len(records())} rules on no panel: {sorted(unused)}"
    assert records() >= INTERNAL_RULES


def test_every_series_a_panel_reads_is_exported_or_a_rule() -> None:
    assert unknown_series(docs()) == []


def test_the_coverage_checks_fail_on_a_missing_panel_and_an_unexported_series() -> None:
    broken = docs()
    for p in panels(broken["gpulens-jobs"]):
        for t in p["targets"]:
            t["expr"] = t["expr"].replace("gpulens:job_straggler:info", "gpulens:job_leaf:info")
    for p in panels(broken["gpulens-fleet"]):
        for t in p["targets"]:
            t["expr"] = t["expr"].replace("gpulens:job_straggler:info", "gpulens:job_leaf:info")
    assert "gpulens:job_straggler:info" in missing_rules(broken)
    temperature = next(p for p in panels(broken["gpulens-health"]) if p["title"] == "Temperature")
    temperature["targets"][0]["expr"] = 'gpulens_gpu_temp_celsius{node=~"$node"}'
    assert unknown_series(broken) == ["gpulens-health / Temperature: gpulens_gpu_temp_celsius"]
    assert series_read('label_replace(x{a="gpulens_nope"}, "b", "c:d:e", "a", "f")') == {"x"}


# --- shape -------------------------------------------------------------------------------------------


def test_every_board_has_the_four_variables_the_gpu_by_index_and_links_to_the_others() -> None:
    uids = set(docs())
    assert uids == {b.uid for b in gd.BOARDS}
    for uid, doc in docs().items():
        variables = {v["name"]: v for v in doc["templating"]["list"]}
        assert list(variables) == ["datasource", "cluster", "node", "gpu", "namespace"], uid
        assert variables["gpu"]["query"].endswith(", gpu)"), "the GPU index, as 12239 users pick it, not the UUID"
        assert "$node" in variables["gpu"]["query"], "node first, then its GPUs"
        for v in list(variables.values())[1:]:
            if uid == gp.GPU and v["name"] in ("node", "gpu"):
                assert not v["includeAll"] and not v["multi"], "one GPU: one node, one index"
            else:
                assert v["includeAll"] and v["multi"] and v["allValue"] == ".*", (uid, v["name"])
        linked = {re.match(r"/d/([^?]+)", link["url"]).group(1) for link in doc["links"]}  # type: ignore[union-attr]
        assert linked == uids - {uid}, uid
        assert all(link["keepTime"] and link["includeVars"] for link in doc["links"])
        uids_written = set(re.findall(r'"uid":\s*"([^"]*)"', json.dumps(doc))) - {uid}
        assert uids_written == {"${datasource}"}, "no data source UID is written"


def test_panel_titles_are_unique_within_a_board() -> None:
    for uid, doc in docs().items():
        titles = [p["title"] for p in panels(doc)]
        assert len(titles) == len(set(titles)), (uid, sorted(t for t in titles if titles.count(t) > 1))


def test_every_panel_but_a_gpu_free_one_filters_by_the_variables() -> None:
    """A device panel filters by cluster, node and GPU; a panel about namespaces or jobs by cluster
    and namespace; nothing reads the whole store regardless of the variables."""
    for uid, p in all_panels():
        for t in p["targets"]:
            assert "$cluster" in t["expr"], (uid, p["title"], t["expr"][:80])
            raw = {n for n in series_read(t["expr"]) if n.startswith("gpulens_gpu_") and n != "gpulens_gpu_info"}
            if raw and "gpulens_gpu_sharing_" not in " ".join(raw):
                assert "$gpu" in t["expr"] and "$node" in t["expr"], (uid, p["title"])


def _outer_by(expr: str) -> list[str]:
    m = re.match(r"^(?:max|min|sum|count|avg) by \(([^)]*)\)", expr)
    assert m, f"a table's query aggregates by the columns it shows: {expr}"
    return [label.strip() for label in m.group(1).split(",")]


def test_every_table_is_instant_organised_sorted_and_names_node_gpu_and_pod() -> None:
    tables = [(uid, p) for uid, p in all_panels() if p["type"] == "table"]
    assert len(tables) >= 30
    for uid, p in tables:
        where = (uid, p["title"])
        organize = [x for x in p["transformations"] if x["id"] == "organize"]
        assert len(organize) == 1, where
        opts = organize[0]["options"]
        hidden = {k for k, v in opts["excludeByName"].items() if v}
        renamed = opts["renameByName"]
        assert {"__name__", "Time", "job", "instance", "uuid", "mig_uuid"} <= hidden, where
        for t in p["targets"]:
            assert t["instant"] and not t["range"] and t["format"] == "table", where
            by = _outer_by(t["expr"])
            for label in by:
                assert label in hidden or renamed.get(label, label) != label, (where, label)
            if "gpu" in by:
                assert "node" in by, f"{where}: a GPU index without its node"
            if "pod" in by:
                assert "namespace" in by, f"{where}: a pod without its namespace"
            assert "uuid" not in by, f"{where}: a UUID where node and GPU index say it"
        if len(p["targets"]) > 1:
            assert p["transformations"][0]["id"] == "merge", where
        assert p["options"]["sortBy"], where
        assert p["options"]["sortBy"][0]["displayName"] in renamed.values(), where


def test_threshold_lines_are_the_gpus_own_limits_drawn_dashed() -> None:
    limits: dict[str, set[str]] = {
        "Temperature": {"gpulens_gpu_temperature_threshold_celsius"},
        "HBM temperature": {"gpulens_gpu_temperature_threshold_celsius"},
        "Power": {"gpulens_gpu_power_limit_watts"},
        "SM clock": {"gpulens_gpu_sm_clock_max_hertz"},
    }
    for series in set().union(*limits.values()):
        assert series in BY_NAME, f"{series} is not exported"
    for uid in ("gpulens-health", "gpulens-gpu"):
        by_title = {p["title"]: p for p in panels(docs()[uid])}
        for title, of_limit in limits.items():
            p = by_title[title]
            dashed = {
                o["matcher"]["options"] for o in p["fieldConfig"]["overrides"] if o["matcher"]["id"] == "byFrameRefID"
            }
            lines = [t for t in p["targets"] if t["refId"] in dashed]
            assert lines, (uid, title)
            for t in lines:
                assert series_read(t["expr"]) & of_limit, (uid, title, t["expr"])
                assert not re.fullmatch(r"[\d.]+", t["expr"]), "a limit is the GPU's series, not a constant"
        temperature = " ".join(t["expr"] for t in by_title["Temperature"]["targets"])
        assert 'threshold="slowdown"' in temperature and 'threshold="shutdown"' in temperature


def test_idle_in_use_waste_and_job_verdicts_come_from_the_rules() -> None:
    about = re.compile(r"idle|allocat|wast|in use|straggl|communication-bound|launch-bound", re.IGNORECASE)
    found = [(uid, p) for uid, p in all_panels() if about.search(p["title"]) and "MIG" not in p["title"]]
    assert len(found) >= 10
    for uid, p in found:
        for t in p["targets"]:
            assert not re.search(r"gpulens_gpu_(sm_active|busy|utilization)_ratio", t["expr"]), (uid, p["title"])
            if p["title"] != "Allocated":
                assert _RULE.search(t["expr"]) or "ALERTS" in t["expr"], f"{uid} / {p['title']} reads no rule"
    fleet = {p["title"]: p for p in panels(docs()["gpulens-fleet"])}
    for title, key in (("Devices", "devices"), ("Allocated", "allocated"), ("In use", "allocated_in_use"),
                       ("Allocated but idle", "allocated_idle"), ("Collecting", "collecting")):  # fmt: skip
        assert fleet[title]["targets"][0]["expr"] == gp.fleet_count_promql(key)
    assert f"{gp.IDLE_RULE}{{" in fleet["In use"]["targets"][0]["expr"]
    assert gp.IDLE_RULE in definitions.RULES


def test_one_unit_per_quantity_bytes_per_second_and_bits_only_for_line_rates() -> None:
    for uid, p in all_panels():
        units = {p["fieldConfig"]["defaults"].get("unit")} | {
            prop["value"] for o in p["fieldConfig"]["overrides"] for prop in o["properties"] if prop["id"] == "unit"
        }
        assert not {"bytes/sec", "binBps", "decbytes/sec", "Bps/s"} & units, (uid, p["title"])
        if "bps" in units:
            assert "Line rate" in json.dumps(p["transformations"]), f"{uid} / {p['title']}: bits only for line rates"


def test_throttling_is_in_words_and_leaves_out_what_is_not_throttling() -> None:
    p = next(p for p in panels(docs()["gpulens-health"]) if p["title"] == "Throttling in the last hour")
    (t,) = p["targets"]
    assert _outer_by(t["expr"]) == ["cluster", "node", "gpu", "reason"]
    for reason in NOT_THROTTLING:
        assert reason in t["expr"].split("reason!~", 1)[1].split('"')[1].split("|")
    words = p["fieldConfig"]["overrides"][0]["properties"][0]["value"][0]["options"]
    throttling = set(CLOCK_EVENT_REASONS.values()) - NOT_THROTTLING
    assert throttling <= set(words) and all(words[r]["text"] != r for r in throttling)
    legend = next(p for p in panels(docs()["gpulens-health"]) if p["title"] == "What holds the clocks down")
    for raw in throttling:
        assert f'"{gp.REASON_WORDS[raw]}", "reason", "{raw}"' in legend["targets"][0]["expr"], raw


def test_a_table_without_column_headers_is_refused() -> None:
    bad = gp.Panel("raw", "table", (gp.Target("up", instant=True),))
    with pytest.raises(ValueError, match="no Table"):
        gd.panel_builder(bad, 1, {})
    mismatched = gp.Panel("two", "table", (gp.Target("up", instant=True),) * 2, table=gp.Table((("job", "Job"),)))
    with pytest.raises(ValueError, match="value headers"):
        gd.panel_builder(mismatched, 1, {})


def test_docs_list_every_dashboard_and_panel_as_the_script_prints_them() -> None:
    text = (REPO / "docs" / "grafana.md").read_text()
    start, end = "<!-- generated by: python scripts/grafana_dashboard.py --markdown -->\n", "<!-- end generated -->"
    assert start in text and end in text
    assert text.split(start, 1)[1].split(end, 1)[0] == gd.markdown(), (
        "run: python scripts/grafana_dashboard.py --markdown, into docs/grafana.md"
    )


def test_every_alert_a_panel_names_is_an_alert_of_the_rule_file() -> None:
    doc = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r}
    named = set()
    for _, p in all_panels():
        for t in p["targets"]:
            named |= set(re.findall(r'alertname="([^"]+)"', t["expr"]))
            for regex in re.findall(r'alertname=~"([^"]+)"', t["expr"]):
                named |= set(regex.split("|"))
    assert named and named <= alerts, named - alerts
    assert alerts <= named, "the firing-alerts panels list every alert"
