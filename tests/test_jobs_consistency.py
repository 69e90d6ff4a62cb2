"""One history of two nodes running four two-node jobs, every reader, one answer: the jobs rules
(recorded by promtool on Prometheus and by vmalert on VictoriaMetrics), the dashboard's Jobs page
source in both modes (Prometheus, and scrape mode fed the same scrapes) aggregated by
dashboard/jobs.py, and the advisor (raw series over the window) name the same jobs, with the same
GPUs, nodes, figures, straggler and communication-bound verdicts.

The history: the simulator's ``jobs-0`` and ``jobs-1`` nodes (exporter/sim/scenarios.py ``_jobs``),
each exporter scraped SCRAPES times, the scrapes stamped SAMPLE s apart with the target labels a
scrape adds (cluster, instance, job, node): ml-training/PyTorchJob/gpt-13b-finetune (healthy),
ml-training/JobSet/mixtral-sft (node 1's GPU 3 straggles: compute), research/MPIJob/moe-pretrain
(communication-bound), research/Job/embedding-train (over-provisioned). Every figure is taken at T,
the end of the history, over the rules' 5 m window.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from dashboard import definitions, jobs
from dashboard.advisor.engine import Policy
from dashboard.advisor.job_query import measure_jobs
from dashboard.advisor.jobs import advise_jobs
from dashboard.advisor.query import Window
from dashboard.sources.prometheus import PrometheusSource
from dashboard.sources.scrape import ScrapeSource
from tests.support.exporter import run_exporter
from tests.support.om_history import without_integrals, write_history
from tests.support.prometheus import backfill_recording_rules, inline_records, run_prometheus
from tests.support.prometheus import query as prom_query
from tests.support.victoriametrics import import_openmetrics, replay_rules, run_victoriametrics
from tests.support.victoriametrics import query as vm_query

pytestmark = [pytest.mark.integration, pytest.mark.long]

NODES = ("jobs-0", "jobs-1")
SCRAPES = 40
SAMPLE = 15.0
"""History: SCRAPES scrapes of each exporter stamped SAMPLE s apart (10 minutes)."""
PERIOD = 0.5
"""Real seconds between scrapes (the exporters' collection interval too)."""
WARMUP = 25.0
"""Real seconds the exporters run before the first scrape: 50 cycles, past the classifier's
windows, dwell and the communication evidence's hold, so the 5 m window at T (20 scrapes, 20
cycles of the compressed history) sees each GPU's settled class."""
CLUSTER = "c1"
JOB_RECORDS = tuple(jobs.RULES)
PRE = ("gpulens:gpu_activity:ratio_avg5m", "gpulens:leaf_gpu_share:ratio")
"""The leaf records the jobs rules and the Jobs pages read."""
TOLERANCE = 0.02
"""Absolute difference allowed between two readers' ratios (0..1). The stores differ in rate()
extrapolation at a window's edge (the busy ratio's counter) by about a scrape's share of 5 m."""
STRAGGLER = ("ml-training", "JobSet", "mixtral-sft", "node-1", "3", "compute")
JOBS = {
    ("ml-training", "PyTorchJob", "gpt-13b-finetune"),
    ("ml-training", "JobSet", "mixtral-sft"),
    ("research", "MPIJob", "moe-pretrain"),
    ("research", "Job", "embedding-train"),
}


@dataclass(frozen=True)
class History:
    om: Path
    scrape: ScrapeSource
    t0: float
    end: float


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    tmp = tmp_path_factory.mktemp("jobs-consistency")
    end = math.floor(time.time() / 60) * 60 - 3600.0
    t0 = end - (SCRAPES - 1) * SAMPLE - 7.0
    times = [t0 + k * SAMPLE for k in range(SCRAPES)]
    pages: dict[tuple[int, int], str] = {}
    with ExitStack() as es:
        urls = [  # named as the targets below: the exporter labels every series with its NODE_NAME
            es.enter_context(
                run_exporter("--sim.scenario", n, "--collect.interval", f"{PERIOD:g}s", env={"NODE_NAME": f"node-{i}"})
            )
            for i, n in enumerate(NODES)
        ]
        time.sleep(WARMUP)
        start = time.monotonic()
        for k in range(SCRAPES):
            time.sleep(max(0.0, start + k * PERIOD - time.monotonic()))
            for i, url in enumerate(urls):
                pages[(i, k)] = without_integrals(urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode())
    om = tmp / "history.om"
    targets = [
        ({"cluster": CLUSTER, "instance": f"node-{i}:9445", "job": "gpulens", "node": f"node-{i}"},
         [pages[(i, k)] for k in range(SCRAPES)])
        for i in range(len(NODES))
    ]  # fmt: skip
    write_history(om, targets, times)
    clock = {"k": 0}
    hosts = {f"http://node-{i}:9445/metrics": i for i in range(len(NODES))}
    scrape = ScrapeSource(list(hosts), interval_s=SAMPLE, history=SCRAPES + 1,
                          fetch=lambda url: pages[(hosts[url], clock["k"])],
                          clock=lambda: times[min(clock["k"], SCRAPES - 1)])  # fmt: skip
    for k in range(SCRAPES):
        clock["k"] = k
        scrape.scrape_once()
    return History(om, scrape, t0, times[-1])


@pytest.fixture(scope="module", params=("prometheus", "victoriametrics"))
def store(
    request: pytest.FixtureRequest, history: History, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Any]]:
    """(a store's base URL with the history and the jobs rules recorded over it, its query function)."""
    tmp = tmp_path_factory.mktemp(str(request.param))
    start = history.t0 - 60.0
    if request.param == "victoriametrics":
        with run_victoriametrics() as base:
            import_openmetrics(base, history.om)
            replay_rules(base, start, history.end, tmp, PRE + JOB_RECORDS)
            yield base, vm_query
        return
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: run the README test command (scripts/test.sh)"
    data = tmp / "data"
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(history.om), str(data)], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    backfill_recording_rules(data, start, history.end, tmp, PRE + JOB_RECORDS)
    config = "global: {scrape_interval: 1m}\nscrape_configs: []\n"
    with run_prometheus(config, storage_dir=str(data), extra_args=["--storage.tsdb.retention.time=30d"]) as base:
        yield base, prom_query


def _at(history: History) -> float:
    """T: the last whole minute of the history (a rule evaluation)."""
    return math.floor(history.end / 60) * 60


def _job(metric: dict[str, str]) -> tuple[str, str, str]:
    return (metric.get("namespace", ""), metric.get("workload_kind", ""), metric.get("workload", ""))


ALL_RULES = {**definitions.RULES, **jobs.RULES}


def inline(expr: str) -> str:
    """``expr`` down to raw series through the dashboard's and the jobs' rules."""
    return inline_records(expr, ALL_RULES)


def _recorded(
    store: tuple[str, Any], record: str, at: float, evaluate: bool = False, raw: bool = False
) -> dict[tuple[str, ...], float]:
    """``record``'s series at ``at`` by (job, class); ``evaluate``: its rule's expression instead
    (``raw``: inlined down to raw series)."""
    base, query = store
    name, _, matcher = record.partition("{")
    expr = record
    if evaluate:
        expr = f"({inline(jobs.RULES[name]) if raw else jobs.RULES[name]})"
        if matcher:  # the matcher as a filter on the expression's result
            label, value = matcher.rstrip("}").split("=")
            expr += f' and on ({label}) label_replace(vector(1), "{label}", {value}, "", "")'
    return {(*_job(r["metric"]), r["metric"].get("class", "")): float(r["value"][1]) for r in query(base, expr, at=at)}


def rules_table(store: tuple[str, Any], at: float, evaluate: bool = False, raw: bool = False) -> pd.DataFrame:
    """The job-level records at ``at`` as one frame (namespace, workload_kind, workload + figures).
    ``evaluate``: the job-level rules' expressions evaluated at ``at`` over the per-leaf records
    instead of their recorded samples: promtool backfills each dependency level in its own pass, at
    its own offset from the minute, so a job record may read the previous minute's leaf records
    (a live Prometheus evaluates a group's rules at one instant); the pages read the leaf records
    at ``at``, as the expressions do then. ``raw``: the whole chain evaluated at ``at`` from raw
    series (what scrape mode computes at ``at``; the leaf records themselves were evaluated up to a
    minute earlier)."""
    cols = {
        "gpus": "gpulens:job_gpus:count",
        "nodes": "gpulens:job_nodes:count",
        "activity": "gpulens:job_activity:ratio_avg5m",
        "activity_min": "gpulens:job_activity_min:ratio_avg5m",
        "activity_max": "gpulens:job_activity_max:ratio_avg5m",
        "busy": "gpulens:job_busy:ratio_avg5m",
        "memory_used_ratio": "gpulens:job_memory_used_max:ratio_max5m",
    }
    rows: dict[tuple[str, str, str], dict[str, float]] = {}
    for col, record in cols.items():
        for key, value in _recorded(store, record, at, evaluate, raw).items():
            rows.setdefault((key[0], key[1], key[2]), {})[col] = value
    comm = 'gpulens:job_boundness:ratio_avg5m{class="communication"}'
    for key, value in _recorded(store, comm, at, evaluate, raw).items():
        rows.setdefault((key[0], key[1], key[2]), {})["communication"] = value
    return pd.DataFrame([{"namespace": k[0], "workload_kind": k[1], "workload": k[2], **v} for k, v in rows.items()])


def stragglers_of(store: tuple[str, Any], at: float) -> set[tuple[str, ...]]:
    base, query = store
    return {
        (*_job(r["metric"]), r["metric"].get("node", ""), r["metric"].get("gpu", ""), r["metric"].get("reason", ""))
        for r in query(base, "gpulens:job_straggler:info", at=at)
    }


def test_the_rules_name_the_four_jobs_with_their_shapes(store: tuple[str, Any], history: History) -> None:
    at = _at(history)
    table = rules_table(store, at)
    assert {(r.namespace, r.workload_kind, r.workload) for r in table.itertuples()} == JOBS
    assert set(table["gpus"]) == {4.0} and set(table["nodes"]) == {2.0}
    assert stragglers_of(store, at) == {STRAGGLER}
    base, query = store
    bound = {_job(r["metric"]) for r in query(base, jobs.communication_bound_promql(), at=at)}
    # moe-pretrain and the over-provisioned embedding-train wait in collectives most of the time;
    # mixtral-sft's waiting is its straggler's doing
    assert bound == {("research", "MPIJob", "moe-pretrain"), ("research", "Job", "embedding-train")}


def _by_job(table: pd.DataFrame) -> dict[tuple[str, str, str], dict[str, float]]:
    return {
        (str(r["namespace"]), str(r["workload_kind"]), str(r["workload"])): {
            k: float(r[k]) for k in FIGURES if k in r and pd.notna(r[k])
        }
        for r in table.to_dict("records")
    }


FIGURES = ("gpus", "nodes", "activity", "activity_min", "activity_max", "busy", "communication", "memory_used_ratio")
"""The job figures every reader gives (dashboard/jobs.py JOB_COLUMNS)."""


def _same(
    a: dict[tuple[str, str, str], dict[str, float]], b: dict[tuple[str, str, str], dict[str, float]], tol: float
) -> list[str]:
    problems = [] if set(a) == set(b) else [f"jobs differ: {sorted(set(a) ^ set(b))}"]
    for job in set(a) & set(b):
        for k in FIGURES:
            x, y = a[job].get(k), b[job].get(k)
            if x is None or y is None:
                if (x is None) != (y is None):
                    problems.append(f"{job} {k}: {x} vs {y}")
            elif abs(x - y) > tol:
                problems.append(f"{job} {k}: {x:.4f} vs {y:.4f}")
    return problems


def _stragglers(leaves: pd.DataFrame) -> set[tuple[str, ...]]:
    """The straggling leaves of ``leaves`` (jobs.stragglers), or ``leaves`` themselves where they are
    already the stragglers (``MetricSource.job_stragglers``, with ``reason``)."""
    found = leaves if "reason" in leaves.columns else jobs.stragglers(leaves)
    return {
        (
            str(r["namespace"]),
            str(r["workload_kind"]),
            str(r["workload"]),
            str(r["node"] or str(r["instance"]).split(":")[0]),  # the exporters' node label
            str(r["gpu"]),
            str(r["reason"]),
        )
        for r in found.to_dict("records")
    }


def test_the_jobs_pages_read_what_the_rules_record_in_both_modes(store: tuple[str, Any], history: History) -> None:
    """The Jobs page's source, Prometheus mode on this store and scrape mode on the same scrapes,
    aggregated by dashboard/jobs.py, gives the rules' jobs, figures and straggler."""
    at = _at(history)
    prom_leaves = PrometheusSource(store[0]).job_leaves(end=at)
    scrape_leaves = history.scrape.job_leaves(end=at)
    for name, leaves, rules in (
        ("prometheus mode", prom_leaves, _by_job(rules_table(store, at, evaluate=True))),
        ("scrape mode", scrape_leaves, _by_job(rules_table(store, at, evaluate=True, raw=True))),
    ):
        assert _same(rules, _by_job(jobs.job_table(leaves)), TOLERANCE) == [], name
        assert _stragglers(leaves) == {STRAGGLER}, name
    # the Jobs page's rows: the recorded job series in Prometheus mode, the leaves' in scrape mode
    for name, summary, strays, rules in (
        ("prometheus mode", PrometheusSource(store[0]).job_summary(end=at),
         PrometheusSource(store[0]).job_stragglers(end=at), _by_job(rules_table(store, at))),
        ("scrape mode", history.scrape.job_summary(end=at), history.scrape.job_stragglers(end=at),
         _by_job(rules_table(store, at, evaluate=True, raw=True))),
    ):  # fmt: skip
        assert _same(rules, _by_job(summary), TOLERANCE) == [], name
        assert _stragglers(strays) == {STRAGGLER}, name
    mix = PrometheusSource(store[0]).job_mix(end=at)
    comm = mix[mix["class"] == jobs.COMMUNICATION]
    assert {
        (r.namespace, r.workload_kind, r.workload)
        for r in comm.itertuples()
        if r.share >= jobs.COMMUNICATION_BOUND_AT_LEAST
    } >= {("research", "MPIJob", "moe-pretrain")}


def test_the_advisor_measures_the_same_jobs_and_advises_on_them(store: tuple[str, Any], history: History) -> None:
    """The advisor, from raw series over the rules' window at T, measures the jobs the rules
    record (GPUs, nodes, communication share, straggler) and advises scale-in for the
    over-provisioned job only, and a compute straggler for mixtral-sft."""
    at = _at(history)
    report = measure_jobs(PrometheusSource(store[0]), Window(window_s=300.0, end=at))
    rules = _by_job(rules_table(store, at))
    measured = {
        (u.namespace, u.workload_kind, u.workload): {
            "gpus": float(u.gpus),
            "nodes": float(u.nodes),
            "communication": u.communication,
        }
        for u in report.usages
    }
    assert set(measured) == set(rules)
    for job, figures in measured.items():
        assert figures["gpus"] == rules[job]["gpus"] and figures["nodes"] == rules[job]["nodes"], job
        assert figures["communication"] is not None
        assert abs(figures["communication"] - rules[job]["communication"]) <= 0.1, job
    strays = {
        (u.namespace, u.workload_kind, u.workload, s.leaf.node, s.leaf.gpu, s.reason)
        for u in report.usages
        for s in u.stragglers
    }
    assert strays == {STRAGGLER}
    # the window is 5 minutes: the evidence floor (Policy.min_hours, an hour) set aside
    advice = {(a.usage.workload, str(a.action)) for a in advise_jobs(report.usages, Policy(min_hours=0.0))}
    assert ("embedding-train", "scale-in") in advice
    assert ("mixtral-sft", "straggler") in advice
    assert not {w for w, act in advice if act == "scale-in"} - {"embedding-train"}
