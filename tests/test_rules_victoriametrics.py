"""Every expression of deploy/rules/gpulens.rules.yml gives the same answer on Prometheus (PromQL) and
on VictoriaMetrics (MetricsQL) over the same data, and vmalert records what the expressions say.

The data: six simulated nodes (8 whole H200s with a lost GPU and a link down, a MIG node, a time-sliced
node, a p5en node without GPUDirect RDMA, the two nodes of four two-node jobs, ``jobs-0`` and
``jobs-1``, with a straggler and a communication-bound job, and the ``serving`` node with its
inference engines' own pages, exporter/sim/engines.py), each rendered SCRAPES times, one
page a simulated cycle (what a scrape reads); the pages are stamped SAMPLE seconds apart (12
minutes of history with every gpulens series the exporters serve) with the target labels a
scrape adds (instance, job, cluster, node) and an ``up`` series. Prometheus gets it through
promtool (OpenMetrics blocks) and records the rules with ``promtool tsdb create-blocks-from rules`` (one
dependency level at a time: it cannot read its own output). A VictoriaMetrics gets the same history
through its import API plus promtool's recorded samples, copied: so at a few instants every rule's
expression, recording and alerting alike, reads identical inputs on both stores, and must give the
same series (label sets) with the same values, within TOLERANCE (RATE_TOLERANCE where rate() or
increase() is involved: the dialects differ there). A second VictoriaMetrics gets the history and
``vmalert``'s replay of the rules: each recorded value is the expression's value at its
evaluation (Prometheus' for rules on raw series).
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboard.serving.engines import ROLE_POD_LABELS
from exporter.sim import engines as sim_engines
from exporter.sim import serving as sim_serving
from tests.support.prometheus import backfill_recording_rules, run_prometheus
from tests.support.prometheus import query as prom_query
from tests.support.sim_exposition import render_cycles
from tests.support.victoriametrics import RULES_FILE, force_flush, import_openmetrics, replay_rules, run_victoriametrics
from tests.support.victoriametrics import query as vm_query

pytestmark = pytest.mark.integration

SCENARIOS = ("h200x8", "mig", "timeslice", "p5en-nogdr", "jobs-0", "jobs-1", "serving")
SCRAPES = 48
SAMPLE = 15.0
"""History: SCRAPES scrapes of each exporter stamped SAMPLE s apart (12 minutes)."""
WARMUP = 3
"""Cycles rendered before the first scrape: GPM windows and a first probe result. Each scrape is
the page after one more simulated cycle (tests/support/sim_exposition.py), so counters grow by one
cycle from stamp to stamp whatever this machine's speed: exporters scraped in real time could see
two cycles or none between scrapes on a slow machine, and the NIC rates then differed between the
dialects by more than RATE_TOLERANCE (a CI run read 11 %)."""
FAULTS = {"h200x8": "lost=3;nvlink_down=2:5"}
"""GPU 3 of the first node is lost (gpulens_gpu_up 0) and NVLink 5 of its GPU 2 is down: GPULost
and GPUNvlinkDown have series to compare."""
EXTRA = {"jobs-0": ("--no-collect.nic",), "jobs-1": ("--no-collect.nic",)}
"""The jobs nodes without their NICs: their all-reduce bursts make the NIC rates' extrapolation
differ between the dialects beyond RATE_TOLERANCE (p5en-nogdr's steady traffic covers the NIC
rules); their classes still see the collectives through NVLink."""
TOLERANCE = 0.02
"""Relative difference allowed between the two stores' values (absolute 1e-3 near 0)."""
RATE_TOLERANCE = 0.1
"""The same for expressions with rate() or increase(). Prometheus extrapolates the first and last
sample in the window to its edges; VictoriaMetrics takes the increase from the last sample before
the window to the last in it (no extrapolation). On a counter growing at a steady rate both give
that rate; where the rate changes within the window they differ by up to one scrape interval's share
of the window (1/20 at 15 s in 5 m) of the change: on a bursty notebook at 0.6 % SM activity, 0.1 %
(absolute, allowed up to RATE_ABSOLUTE). A 0/1 verdict must still agree exactly."""
RATE_ABSOLUTE = 2e-3
RULES = [r for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"]]
RECORDS = [r["record"] for r in RULES if "record" in r]


@dataclass(frozen=True)
class Stores:
    prometheus: str
    """Prometheus: the history (promtool) and the rules promtool recorded over it."""
    victoriametrics: str
    """VictoriaMetrics: the same history and the same recorded samples."""
    vmalert: str
    """VictoriaMetrics: the same history and the rules vmalert's replay recorded."""
    rules_from: float
    """The first rule evaluation (a whole minute)."""


_SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)$")


def _levels() -> list[list[str]]:
    """The recording rules in dependency levels: a rule's level is one above the highest level of
    the recorded series its expression reads (raw series only: level 0)."""
    level: dict[str, int] = {}
    for rule in RULES:
        if "record" in rule:
            used = [level[r] for r in level if re.search(rf"(?<![\w:]){re.escape(r)}(?![\w:])", rule["expr"])]
            level[rule["record"]] = 1 + max(used, default=-1)
    return [[r for r in RECORDS if level[r] == n] for n in range(max(level.values()) + 1)]


def _stamp(exposition: str, target: dict[str, str], t: float) -> dict[str, list[str]]:
    """The exposition's samples with the target labels added and timestamp ``t`` (seconds), by metric.
    A label the sample already has (the exporter's ``node``) is kept, as the chart's ``honorLabels``
    keeps it."""
    out: dict[str, list[str]] = {}
    for line in exposition.splitlines():
        m = _SAMPLE_LINE.match(line)
        if not m or line.startswith("#"):
            continue
        name, labels, value = m.groups()
        inner = labels[1:-1] if labels else ""
        own = set(re.findall(r'(?:^|,)([A-Za-z_]\w*)="', inner))
        extra = ",".join(f'{k}="{v}"' for k, v in target.items() if k not in own)
        joined = ",".join(p for p in (extra, inner) if p)
        out.setdefault(name, []).append(f"{name}{{{joined}}} {value} {t:.0f}")
    return out


def _engine_pages(cluster: str, t: float) -> list[tuple[str, dict[str, str]]]:
    """The serving node's engine pages (exporter/sim/engines.py) after ``t`` seconds, each with the
    labels the scrape of docs/serving.md gives: namespace, pod, and the role its pod's labels declare
    (the last of ``ROLE_POD_LABELS`` present wins); plus the small model's page scraped a second
    time by a static job without them (``gpulens:serving_unjoinable_series:count``)."""
    out = []
    for i, target in enumerate(sim_engines.targets()):
        labels = {"cluster": cluster, "instance": f"10.0.3.{i + 10}:8000", "job": "serving-engines"}
        labels |= {"namespace": target.namespace, "pod": target.pod}
        declared = [target.deployment.pod_labels[k] for k in ROLE_POD_LABELS if k in target.deployment.pod_labels]
        if declared:
            labels["role"] = declared[-1]
        page = sim_engines.render(target, t)
        out.append((page + "up 1\n", labels))
        if target.deployment.workload == sim_serving.SMALL:
            out.append((page, {"cluster": cluster, "instance": "10.0.9.9:8000", "job": "static-vllm"}))
    return out


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float, float]:
    """(the OpenMetrics file, its first and last sample time)."""
    tmp = tmp_path_factory.mktemp("rules-vm")
    end = math.floor(time.time() / 60) * 60 - 3600.0  # a whole minute, an hour ago: out of the TSDB head's way
    # samples 7 s off the 15 s grid: no instant, rule evaluation or window edge falls on a sample
    # (Prometheus 2 counts a sample on a range's left edge, VictoriaMetrics and Prometheus 3 do not)
    t0 = end - (SCRAPES - 1) * SAMPLE - 7.0
    by_metric: dict[str, dict[str, list[str]]] = {}
    for i, sc in enumerate(SCENARIOS):
        pages = render_cycles(sc, WARMUP + SCRAPES, probes=True, faults=FAULTS.get(sc, ""), volatile="0.001",
                              args=EXTRA.get(sc, ()))  # fmt: skip
        target = {
            "cluster": "c1" if i < 2 else "c2",
            "instance": f"node-{i}:9445",
            "job": "gpulens",
            "node": f"node-{i}",
        }
        for k, text in enumerate(pages):
            if k < WARMUP:
                continue
            stamped = [(text + "\nup 1\n", target)]
            if sc == "serving":
                stamped += _engine_pages(target["cluster"], k * SAMPLE)
            for page, labels in stamped:
                for name, lines in _stamp(page, labels, t0 + (k - WARMUP) * SAMPLE).items():
                    for line in lines:
                        key = line.rsplit(" ", 2)[0]
                        by_metric.setdefault(name, {}).setdefault(key, []).append(line)
    om = tmp / "history.om"
    with om.open("w") as out:
        for series in by_metric.values():
            for lines in series.values():
                out.write("\n".join(lines) + "\n")
        out.write("# EOF\n")
    return om, t0, end


RECORDED = '{__name__=~"gpulens:.+|namespace:.+|class:.+"}'
"""Every series the recording rules write."""


def _copy_recorded(prom: str, vm: str, start: float, end: float) -> int:
    """Copy every recorded series sample of Prometheus in [start, end] into VictoriaMetrics as is."""
    lines = []
    for item in prom_query(prom, f"{RECORDED}[{end - start + 60:.0f}s]", at=end):
        labels = dict(item["metric"])
        name = labels.pop("__name__")
        text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        lines += [f"{name}{{{text}}} {v} {round(float(t) * 1000)}\n" for t, v in item["values"]]
    req = urllib.request.Request(f"{vm}/api/v1/import/prometheus", data="".join(lines).encode(), method="POST")
    urllib.request.urlopen(req, timeout=60).read()
    force_flush(vm)
    return len(lines)


@pytest.fixture(scope="module")
def stores(history: tuple[Path, float, float], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    """Prometheus with the history and the rules promtool recorded over it; VictoriaMetrics with the
    same history and the same recorded samples (copied: the dialect comparison reads identical
    inputs); a second VictoriaMetrics with the history and the rules vmalert's replay recorded."""
    om, t0, end = history
    tmp = tmp_path_factory.mktemp("stores")
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run the README test command (scripts/test.sh)")
    data = tmp / "data"
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    start = math.ceil(t0 / 60) * 60.0
    for n, level in enumerate(_levels()):
        work = tmp / f"level-{n}"
        work.mkdir()
        backfill_recording_rules(data, start, end, work, level)
    config = "global: {scrape_interval: 15s}\nscrape_configs: []\n"
    with (
        run_prometheus(config, storage_dir=str(data), extra_args=["--storage.tsdb.retention.time=30d"]) as prom,
        run_victoriametrics() as vm,
        run_victoriametrics() as vmalert_vm,
    ):
        import_openmetrics(vm, om)
        assert _copy_recorded(prom, vm, start, end) > 0
        import_openmetrics(vmalert_vm, om)
        replay_rules(vmalert_vm, start, end, tmp)
        yield Stores(prom, vm, vmalert_vm, start)


def _instants(history: tuple[Path, float, float]) -> list[float]:
    """Half a minute after three rule evaluations (both tools evaluate on the whole minute), within
    the history: a reader sees the same evaluation on both stores, and the raw series still have
    samples at the instant (past a series' end, Prometheus' rate() extrapolates less and reads low)."""
    _om, _t0, end = history
    return [end - 390.0, end - 210.0, end - 30.0]


def _series(result: list[dict[str, Any]]) -> dict[tuple[tuple[str, str], ...], float]:
    """Label set -> value. A label whose value is empty is no label (PromQL's rule, and neither store
    keeps one); VictoriaMetrics returns the one a label_replace left empty (the serving rules' role
    of a pod that declares none), Prometheus drops it."""
    out = {}
    for item in result:
        labels = tuple(sorted((k, v) for k, v in item["metric"].items() if k != "__name__" and v != ""))
        out[labels] = float(item["value"][1])
    return out


def _tolerance(expr: str) -> tuple[float, float]:
    """(relative, absolute) difference allowed for ``expr``'s values."""
    return (RATE_TOLERANCE, RATE_ABSOLUTE) if re.search(r"\b(?:rate|increase)\(", expr) else (TOLERANCE, 1e-3)


def _differences(expr: str, prom: str, vm: str, at: float) -> list[str]:
    if re.fullmatch(r"[A-Za-z_:][\w:]*", expr.strip()):
        # a bare recorded series (an alert on a record): the two stores keep a series that stopped at
        # an evaluation visible for different times (staleness), and a straggler's reason can flip
        # while the simulated history's classes settle; compare what the last evaluation before
        # ``at`` (the instants lie 30 s after one) wrote, on both stores
        expr = f"last_over_time({expr.strip()}[31s])"
    p, v = _series(prom_query(prom, expr, at=at)), _series(vm_query(vm, expr, at=at))
    return _compare(p, v, _tolerance(expr))


def _compare(
    p: dict[tuple[tuple[str, str], ...], float],
    v: dict[tuple[tuple[str, str], ...], float],
    tolerance: tuple[float, float],
) -> list[str]:
    """What differs between a Prometheus answer ``p`` and a VictoriaMetrics answer ``v``."""
    out = []
    for labels in sorted(set(p) ^ set(v)):
        where = "Prometheus only" if labels in p else "VictoriaMetrics only"
        out.append(f"{where}: {dict(labels)} = {p.get(labels, v.get(labels))}")
    for labels in sorted(set(p) & set(v)):
        a, b = p[labels], v[labels]
        if math.isnan(a) and math.isnan(b):
            continue
        if not abs(a - b) <= max(tolerance[1], tolerance[0] * max(abs(a), abs(b))):
            out.append(f"{dict(labels)}: Prometheus {a:g}, VictoriaMetrics {b:g}")
    return out


def test_the_history_exercises_the_rules(stores: Stores, history: tuple[Path, float, float]) -> None:
    """Not a vacuous comparison: most rules have series on the data (those that need hours of
    history, kube-state-metrics or a stalled sampler have none on either store)."""
    at = _instants(history)[-1]
    empty = [r.get("record") or r["alert"] for r in RULES if not prom_query(stores.prometheus, r["expr"], at=at)]
    print("rules without a series on the test history:", empty)
    assert len(empty) <= len(RULES) // 2, f"rules without a series on the test history: {empty}"
    for record in RECORDS:
        assert prom_query(stores.prometheus, f"count({record})", at=at), f"promtool recorded nothing for {record}"
        assert vm_query(stores.vmalert, f"count({record})", at=at), f"vmalert recorded nothing for {record}"


@pytest.mark.parametrize("rule", RULES, ids=[r.get("record") or r["alert"] + "-" + str(i) for i, r in enumerate(RULES)])
def test_every_rule_expression_is_the_same_on_both_stores(
    rule: dict[str, Any], stores: Stores, history: tuple[Path, float, float]
) -> None:
    problems = [
        f"t={at:.0f}: {d}"
        for at in _instants(history)
        for d in _differences(rule["expr"], stores.prometheus, stores.victoriametrics, at)
    ]
    assert problems == [], "\n".join(problems[:20])


@pytest.mark.parametrize("record", RECORDS)
def test_vmalert_records_what_the_expression_says(
    record: str, stores: Stores, history: tuple[Path, float, float]
) -> None:
    """vmalert's replay wrote, at each evaluation, the expression's value at that instant: for
    rules on raw series the value Prometheus computes there; for rules on other rules (vmalert's own
    records are their input) the value VictoriaMetrics computes from them."""
    expr = next(r["expr"] for r in RULES if r.get("record") == record)
    raw_only = record in _levels()[0]
    _om, _t0, end = history
    problems = []
    for at in (end - 360.0, end - 180.0, end):  # evaluations (whole minutes) within the history
        reference = stores.prometheus if raw_only else stores.vmalert
        # only what this evaluation wrote: a series the expression no longer yields gets no staleness
        # marker from a replay, and a plain selector would still see the previous evaluation's sample
        recorded = _series(vm_query(stores.vmalert, f"last_over_time({record}[1s])", at=at))
        expected = _series((prom_query if raw_only else vm_query)(reference, expr, at=at))
        problems += [f"t={at:.0f}: {d}" for d in _compare(expected, recorded, _tolerance(expr))]
    assert problems == [], "\n".join(problems[:20])


@pytest.mark.parametrize("record", RECORDS)
def test_every_recorded_series_keeps_the_cluster(
    record: str, stores: Stores, history: tuple[Path, float, float]
) -> None:
    """A store holding several clusters keeps them apart in every recorded series: per leaf, per
    pod, per namespace and the fleet mix are all per cluster (the history has two)."""
    at = _instants(history)[-1]
    for url, query in ((stores.prometheus, prom_query), (stores.vmalert, vm_query)):
        result = query(url, record, at=at)
        clusters = {item["metric"].get("cluster", "") for item in result}
        assert result and "" not in clusters, (url, record, clusters)
