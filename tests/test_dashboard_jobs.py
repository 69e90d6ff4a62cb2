"""The Jobs pages' data: each source's per-leaf figures (``job_leaves``), class shares, mix and
series, and the pure transforms that turn them into the pages' tables and charts.

One synthetic history of two nodes (15 s samples, 7 s off the minute, 12 minutes) is read three
ways: the scrape source fed its scrapes, the Prometheus source on the same history with the jobs
rules backfilled by promtool (tests/test_dashboard_consistency.py's approach), and the exact values
the history was written with. Its jobs:

- ml-training/PyTorchJob/train: two pods on two nodes, four GPUs; three spend 3 of every 5 samples
  in ``communication``; node 1's GPU 1 never does, computes at half its SM clock under a thermal
  slowdown: the straggler (reason compute). Node 0's GPU 0 alternates a power cap and a hardware
  slowdown (each half the time, together all of it: the slowdown share is their union).
- ml-training/JobSet/loader: three GPUs; two wait half the time, the third is busy 30 % of the
  time: a straggler starved of input (reason input).
- research/MPIJob/moe: two GPUs in communication 4 samples of 5: communication-bound.
- web/Deployment/infer: one 3g.71gb MIG instance (3/7 of a GPU).
- the bare pod ml-training/debug on an L40S (no GPM: activity from the busy ratio, no class).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from dashboard import definitions, jobs
from dashboard.figures.jobs import job_mix_bars, job_timelines
from dashboard.figures.palette import CLASS_COLORS
from dashboard.frames.jobs import (
    JOB_AGE_KEYS,
    JOB_OVERVIEW_COLUMNS,
    NO_CLASS,
    job_ages,
    job_from_param,
    job_gpu_table,
    job_timeline,
    jobs_overview,
    straggler_reason,
    straggler_words,
)
from dashboard.sources.openmetrics import OpenMetricsHistory, label_text
from dashboard.sources.prometheus import PrometheusSource, _regex_selector
from dashboard.sources.scrape import ScrapeSource
from dashboard.sources.source import JOB_LEAF_COLUMNS, JOB_STRAGGLER_COLUMNS, Filters, Window
from exporter.render.metrics import spec
from tests.support.prometheus import backfill_recording_rules, run_prometheus
from tests.support.prometheus import query as prom_query

pytestmark = pytest.mark.integration

GIB = 2**30
H200 = "NVIDIA H200"
L40S = "NVIDIA L40S"
H200_BYTES = 150_754_820_096
MIG_BYTES = 71_000_000_000
MAX_HZ = 1.98e9
SAMPLE = 15.0
SAMPLES = 48
"""12 minutes of samples, 15 s apart; the rules' 5 m window at the end holds 20 of them."""
NODES = ("n0:9445", "n1:9445")
RECORDS = ("gpulens:gpu_activity:ratio_avg5m", "gpulens:leaf_gpu_share:ratio", *jobs.RULES)
"""The records the Jobs pages read (and those they are computed from)."""


@dataclass(frozen=True)
class Leaf:
    """One GPU (or MIG instance) of the history and what its pod does on it."""

    node: int
    gpu: str
    uuid: str
    namespace: str
    pod: str
    kind: str
    workload: str
    sm: float | None
    """SM activity (None: no GPM)."""
    busy: float
    comm: tuple[int, int] | None
    """In ``communication`` the first k of every n samples, else ``compute``; None: no class."""
    memory_gib: float
    clock: float = 1.0
    events: tuple[str, ...] = ()
    """Clock events held: a reason held at every sample, or ``a|b``: a at even samples, b at odd."""
    mig: str = ""
    profile: str = ""
    model: str = H200


LEAVES = (
    Leaf(0, "0", "GPU-a0", "ml-training", "train-worker-0", "PyTorchJob", "train", 0.4, 0.95, (3, 5), 100,
         events=("sw_power_cap|hw_slowdown",)),
    Leaf(0, "1", "GPU-a1", "ml-training", "train-worker-0", "PyTorchJob", "train", 0.4, 0.95, (3, 5), 100,
         events=("gpu_idle",)),
    Leaf(1, "0", "GPU-b0", "ml-training", "train-worker-1", "PyTorchJob", "train", 0.4, 0.95, (3, 5), 100),
    Leaf(1, "1", "GPU-b1", "ml-training", "train-worker-1", "PyTorchJob", "train", 0.9, 0.95, (0, 5), 110,
         clock=0.5, events=("hw_thermal_slowdown",)),
    Leaf(0, "3", "GPU-d0", "ml-training", "loader-0", "JobSet", "loader", 0.5, 0.95, (1, 2), 60),
    Leaf(1, "3", "GPU-d1", "ml-training", "loader-1", "JobSet", "loader", 0.5, 0.95, (1, 2), 60),
    Leaf(1, "4", "GPU-d2", "ml-training", "loader-1", "JobSet", "loader", 0.25, 0.3, (0, 2), 60),
    Leaf(0, "5", "GPU-e0", "research", "moe-worker-0", "MPIJob", "moe", 0.2, 0.9, (4, 5), 120),
    Leaf(1, "5", "GPU-e1", "research", "moe-worker-1", "MPIJob", "moe", 0.2, 0.9, (4, 5), 120),
    Leaf(0, "2", "GPU-m", "web", "infer-6d9f", "Deployment", "infer", 0.2, 0.3, (0, 5), 20, mig="MIG-3",
         profile="3g.71gb"),
    Leaf(1, "2", "GPU-c", "ml-training", "debug", "", "", None, 0.5, None, 10, model=L40S),
)  # fmt: skip
STRAGGLERS = {("GPU-b1", "compute"), ("GPU-d2", "input")}


def _comm_share(leaf: Leaf, ks: range) -> float:
    assert leaf.comm is not None
    k, n = leaf.comm
    return sum(1 for i in ks if i % n < k) / len(ks)


def _used(leaf: Leaf, k: int) -> float:
    return leaf.memory_gib * GIB * (1.0 if k % 4 == 0 else 0.9)


def _events(leaf: Leaf, k: int) -> set[str]:
    held = set()
    for e in leaf.events:
        a, _, b = e.partition("|")
        held.add(a if not b or k % 2 == 0 else b)
    return held


def _samples(k: int) -> dict[int, dict[str, list[tuple[dict[str, str], float]]]]:
    """Per node, every series at sample k (labels without instance/job), by metric name."""
    out: dict[int, dict[str, list[tuple[dict[str, str], float]]]] = {0: {}, 1: {}}
    elapsed = SAMPLE * k
    for leaf in LEAVES:
        node = out[leaf.node]

        def add(name: str, labels: dict[str, str], value: float, node: dict[str, Any] = node) -> None:
            node.setdefault(name, []).append((labels, value))

        phys = {"gpu": leaf.gpu, "uuid": leaf.uuid}
        lab = {**phys, "mig_uuid": leaf.mig}
        if leaf.mig:
            lab.update({"gpu_instance_id": "2", "compute_instance_id": "0", "mig_profile": leaf.profile})
            add("gpulens_mig_instance_info", lab, 1.0)
        mig_mode = "enabled" if leaf.mig else "disabled"
        add("gpulens_gpu_info", {**phys, "name": leaf.model, "mig_mode": mig_mode}, 1.0)
        add("gpulens_gpu_utilization_ratio", phys, leaf.busy)
        add("gpulens_gpu_sm_clock_hertz", phys, leaf.clock * MAX_HZ)
        add("gpulens_gpu_sm_clock_max_hertz", phys, MAX_HZ)
        held = _events(leaf, k)
        for reason in ("gpu_idle", "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown"):
            add("gpulens_gpu_clock_event_active", {**phys, "reason": reason}, 1.0 if reason in held else 0.0)
        if leaf.sm is not None:
            add("gpulens_gpu_sm_active_ratio", lab, leaf.sm)
            add("gpulens_gpu_sm_active_seconds_total", lab, leaf.sm * elapsed)
        add("gpulens_gpu_busy_ratio", lab, leaf.busy)
        add("gpulens_gpu_busy_seconds_total", lab, leaf.busy * elapsed)
        add("gpulens_gpu_memory_used_bytes", lab, _used(leaf, k))
        add("gpulens_gpu_memory_total_bytes", lab, MIG_BYTES if leaf.mig else H200_BYTES)
        who = {"namespace": leaf.namespace, "pod": leaf.pod, "container": "main"}
        owner = {"workload_kind": leaf.kind, "workload": leaf.workload}
        add("gpulens_pod_gpu_allocation", {**who, **owner, "uuid": leaf.uuid, "mig_uuid": leaf.mig,
                                           "resource": "nvidia.com/gpu"}, 1.0)  # fmt: skip
        if leaf.comm is not None:
            cls = "communication" if k % leaf.comm[1] < leaf.comm[0] else "compute"
            for c in ("communication", "compute", "idle"):
                add("gpulens_pod_gpu_boundness", {**who, "uuid": leaf.uuid, "mig_uuid": leaf.mig, "class": c},
                    1.0 if c == cls else 0.0)  # fmt: skip
    return out


def _exposition(series: dict[str, list[tuple[dict[str, str], float]]]) -> str:
    lines = []
    for name, rows in series.items():
        entry = spec(name)
        lines.append(f"# TYPE {name.removesuffix('_total') if entry.type == 'counter' else name} {entry.type}")
        lines += [f"{name}{label_text(labels)} {value!r}" for labels, value in rows]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class History:
    om: Path
    scrape: ScrapeSource
    t0: float
    end: float


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    """The history as OpenMetrics (target labels cluster c1, node node-0/1) and a ScrapeSource fed
    the same scrapes (no target labels but instance, as a direct scrape has); its end T is a whole
    minute, an hour in the past (out of the TSDB head's way)."""
    tmp = tmp_path_factory.mktemp("jobs")
    end = math.floor(time.time() / 3600) * 3600 - 3600.0
    t0 = end - SAMPLES * SAMPLE
    times = [t0 + 7.0 + SAMPLE * k for k in range(SAMPLES)]
    per_time = [_samples(k) for k in range(SAMPLES)]
    om = tmp / "history.om"
    with om.open("w") as out:
        writer = OpenMetricsHistory(out)
        names = list(dict.fromkeys(n for node in per_time[0].values() for n in node))
        for name in names:
            for node in (0, 1):
                target = {"instance": NODES[node], "job": "gpulens", "cluster": "c1", "node": f"node-{node}"}
                for i, (labels, _) in enumerate(per_time[0][node].get(name, [])):
                    values = [f"{per_time[k][node][name][i][1]!r}" for k in range(SAMPLES)]
                    writer.series(name, {**labels, **target}, values, [f"{t:.0f}" for t in times])
        writer.close()
    clock = {"t": times[0]}
    pages = {(NODES[n], t): _exposition(per_time[k][n]) for k, t in enumerate(times) for n in (0, 1)}
    src = ScrapeSource([f"http://{n}/metrics" for n in NODES], interval_s=SAMPLE, history=SAMPLES + 1,
                       fetch=lambda url: pages[(url.split("/")[2], clock["t"])], clock=lambda: clock["t"])  # fmt: skip
    for t in times:
        clock["t"] = t
        src.scrape_once()
    clock["t"] = end
    return History(om, src, t0, end)


@pytest.fixture(scope="module")
def store(history: History, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus serving the history with the jobs records backfilled by promtool."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run the README test command (scripts/test.sh)")
    tmp = tmp_path_factory.mktemp("jobs-store")
    data = tmp / "data"
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(history.om), str(data)], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    backfill_recording_rules(data, history.t0, history.end, tmp, RECORDS)
    config = "global: {scrape_interval: 1m}\nscrape_configs: []\n"
    with run_prometheus(config, storage_dir=str(data), extra_args=["--storage.tsdb.retention.time=30d"]) as base:
        yield base


def _by_leaf(leaves: pd.DataFrame) -> dict[tuple[str, str], dict[str, Any]]:
    return {(str(r["uuid"]), str(r["mig_uuid"])): r for r in leaves.to_dict("records")}


def test_the_scrape_source_gives_each_leaf_the_figures_the_history_holds(history: History) -> None:
    leaves = history.scrape.job_leaves(window=Window(600.0), end=history.end)
    assert list(leaves.columns) == [*JOB_LEAF_COLUMNS, "held_hours"]
    assert len(leaves) == len(LEAVES)
    ks = range(SAMPLES - 20, SAMPLES)  # the 20 samples in (T - 5 m, T]
    got = _by_leaf(leaves)
    for leaf in LEAVES:
        row = got[(leaf.uuid, leaf.mig)]
        where = leaf.uuid
        assert (row["namespace"], row["pod"], row["instance"], row["gpu"]) == (
            leaf.namespace, leaf.pod, NODES[leaf.node], leaf.gpu), where  # fmt: skip
        assert row["activity"] == pytest.approx(leaf.sm if leaf.sm is not None else leaf.busy), where
        assert row["busy"] == pytest.approx(leaf.busy), where
        if leaf.comm is None:
            assert math.isnan(row["communication"]), where
        else:
            assert row["communication"] == pytest.approx(_comm_share(leaf, ks)), where
        total = MIG_BYTES if leaf.mig else H200_BYTES
        assert row["memory_used_bytes"] == pytest.approx(leaf.memory_gib * GIB), where
        assert row["memory_total_bytes"] == pytest.approx(total), where
        assert row["memory_used_ratio"] == pytest.approx(leaf.memory_gib * GIB / total), where
        assert row["sm_clock_ratio"] == pytest.approx(leaf.clock), where
        slow = [_events(leaf, k) & {"sw_power_cap", "hw_slowdown", "hw_thermal_slowdown"} for k in ks]
        assert row["slowdown"] == pytest.approx(sum(1 for s in slow if s) / len(ks)), where
        assert row["slowdown_reasons"] == ",".join(sorted(set().union(*slow))), where
        assert row["model"] == leaf.model, where
        assert row["gpu_share"] == pytest.approx(3 / 7 if leaf.mig else 1.0), where
        # 10 steps of a minute over the 10-minute range, every one held
        assert row["held_hours"] == pytest.approx(10 / 60), where
    debug = got[("GPU-c", "")]
    assert (debug["workload_kind"], debug["workload"]) == (jobs.BARE_POD_KIND, "debug"), "a pod of no owner"
    # the union of two events each held half the time is the whole window
    assert got[("GPU-a0", "")]["slowdown"] == pytest.approx(1.0)
    assert got[("GPU-a1", "")]["slowdown"] == 0.0, "gpu_idle is not a slowdown"
    found = {(str(r["uuid"]), str(r["reason"])) for r in jobs.stragglers(leaves).to_dict("records")}
    assert found == STRAGGLERS


def test_the_prometheus_source_reads_what_the_rules_record_and_the_scrape_source_computes(
    history: History, store: str
) -> None:
    """At the rules' last evaluation, per leaf, the Prometheus source (recorded series plus the raw
    SM clock and slowdown events) and the scrape source (raw samples) agree; the recorded
    straggler is the one jobs.stragglers finds in the Prometheus source's leaves."""
    prom = PrometheusSource(store)
    stamp = prom_query(store, "max(timestamp(gpulens:job_leaf_busy:ratio_avg5m))", at=history.end)
    at = float(stamp[0]["value"][1])
    assert history.end - 60 <= at <= history.end
    mine, theirs = (
        prom.job_leaves(window=Window(600.0), end=at),
        history.scrape.job_leaves(window=Window(600.0), end=at),
    )
    assert len(mine) == len(theirs) == len(LEAVES)
    a, b = _by_leaf(mine), _by_leaf(theirs)
    assert set(a) == set(b)
    for leaf, row in a.items():
        other = b[leaf]
        assert (row["cluster"], row["node"]) == ("c1", f"node-{NODES.index(str(other['instance']))}"), leaf
        for k in ("namespace", "workload_kind", "workload", "pod", "instance", "gpu", "model", "slowdown_reasons"):
            assert row[k] == other[k], (leaf, k)
        for k in ("activity", "busy", "communication", "memory_used_ratio", "memory_used_bytes",
                  "memory_total_bytes", "sm_clock_ratio", "slowdown", "gpu_share"):  # fmt: skip
            x, y = float(row[k]), float(other[k])
            assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=1e-6, abs=1e-9), (leaf, k, x, y)
        # the store samples whether a leaf was held at step-aligned instants, the scrape source at
        # the range's end: at most a step apart
        assert abs(float(row["held_hours"]) - float(other["held_hours"])) <= 1 / 60 + 1e-9, leaf
    recorded = prom_query(store, "gpulens:job_straggler:info", at=at)
    assert {(r["metric"]["uuid"], r["metric"]["reason"]) for r in recorded} == STRAGGLERS
    found = {(str(r["uuid"]), str(r["reason"])) for r in jobs.stragglers(mine).to_dict("records")}
    assert found == STRAGGLERS


SUMMARY_FIGURES = ("gpus", "nodes", "activity", "activity_min", "activity_max", "activity_spread", "busy",
                   "communication", "memory_used_ratio", "stragglers", "pods", "classified_leaves",
                   "memory_used_bytes", "memory_total_bytes")  # fmt: skip


def _by_job(summary: pd.DataFrame) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(str(r["namespace"]), str(r["workload_kind"]), str(r["workload"])): r for r in summary.to_dict("records")}


def test_the_job_summary_of_the_recorded_job_series_is_the_one_of_the_leaves(history: History, store: str) -> None:
    """The Jobs page's rows: the Prometheus source reads the recorded job series (a few per job),
    the scrape source aggregates its leaves with jobs.job_summary; both give every job's figures
    alike, and the same as jobs.job_summary of the Prometheus source's own leaves. GPU-hours (both
    sources): the store samples holding at step-aligned instants, the scrape source up to the
    range's end (a step apart at most, per leaf)."""
    prom = PrometheusSource(store)
    at = float(prom_query(store, "max(timestamp(gpulens:job_gpus:count))", at=history.end)[0]["value"][1])
    assert history.end - 60 <= at <= history.end
    mine = prom.job_summary(window=Window(600.0), end=at)
    assert list(mine.columns) == list(jobs.SUMMARY_COLUMNS)
    for name, other in (
        ("scrape", history.scrape.job_summary(window=Window(600.0), end=at)),
        ("the leaves", jobs.job_summary(prom.job_leaves(window=Window(600.0), end=at))),
    ):
        a, b = _by_job(mine), _by_job(other)
        assert set(a) == set(b) == {("ml-training", "PyTorchJob", "train"), ("ml-training", "JobSet", "loader"),
                                    ("research", "MPIJob", "moe"), ("web", "Deployment", "infer"),
                                    ("ml-training", "Pod", "debug")}, name  # fmt: skip
        for job, row in a.items():
            for k in SUMMARY_FIGURES:
                x, y = float(row[k]), float(b[job][k])
                assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=1e-6, abs=1e-9), (name, job, k)
            if name == "scrape":
                leaves = float(row["gpus"])
                assert abs(float(row["gpu_hours"]) - float(b[job]["gpu_hours"])) <= leaves / 60 + 1e-9, job
    for got in (mine, history.scrape.job_summary(window=Window(600.0), end=at)):  # counts read as counts: "4 GPUs"
        assert all(got[c].dtype.kind == "i" for c in ("gpus", "nodes", "pods", "stragglers")), got.dtypes
    train = _by_job(mine)[("ml-training", "PyTorchJob", "train")]
    assert (train["gpus"], train["nodes"], train["pods"], train["stragglers"]) == (4, 2, 2, 1)
    assert train["gpu_hours"] == pytest.approx(4 * 10 / 60)
    infer = _by_job(mine)[("web", "Deployment", "infer")]
    assert infer["gpu_hours"] == pytest.approx(3 / 7 * 10 / 60), "a 3g instance weighs 3/7 of a GPU"
    assert _by_job(mine)[("ml-training", "Pod", "debug")]["classified_leaves"] == 0


def test_the_stragglers_are_the_recorded_ones_with_their_figures(history: History, store: str) -> None:
    """The Prometheus source's stragglers: gpulens:job_straggler:info with what explains them (busy
    ratio, SM clock, slowdown events; read for those GPUs only); the scrape source's:
    jobs.stragglers of its leaves. Alike, and in the same words."""
    prom = PrometheusSource(store)
    at = float(prom_query(store, "max(timestamp(gpulens:job_straggler:info))", at=history.end)[0]["value"][1])
    mine, theirs = prom.job_stragglers(end=at), history.scrape.job_stragglers(end=at)
    for got in (mine, theirs):
        assert list(got.columns) == list(JOB_STRAGGLER_COLUMNS)
        assert {(str(r["uuid"]), str(r["reason"])) for r in got.to_dict("records")} == STRAGGLERS
    a, b = _by_leaf(mine), _by_leaf(theirs)
    for leaf, row in a.items():
        for k in ("pod", "instance", "gpu", "slowdown_reasons", "reason"):
            assert row[k] == b[leaf][k], (leaf, k)
        for k in ("busy", "sm_clock_ratio"):
            assert float(row[k]) == pytest.approx(float(b[leaf][k]), rel=1e-6, abs=1e-9), (leaf, k)
    words = {straggler_words(r) for r in mine.to_dict("records")}
    # the straggler banner names the pod holding it, then where (node, GPU index)
    assert "pod train-worker-1 on node-1 · GPU 1: compute: SM clock 50 % of max, HW Thermal Slowdown" in words
    assert "pod loader-1 on node-1 · GPU 4: input: idle 70 % of the time while peers wait" in words
    assert {straggler_reason(r) for r in theirs.to_dict("records")} == {w.split(": ", 1)[1] for w in words}


def _times(history: History) -> list[float]:
    """The history's scrape times (the ``history`` fixture's)."""
    return [history.t0 + 7.0 + SAMPLE * k for k in range(SAMPLES)]


def test_both_sources_read_the_same_window_ages(history: History, store: str) -> None:
    """How far the verdicts' window has filled, per pod: 30 s after the first scrape, 30 s (Prometheus
    to within its subquery step); at the end, the whole 5 minutes. The scrape source reads every
    scrape, the Prometheus source the first sample in the window."""
    prom = PrometheusSource(store)
    times = _times(history)
    for at, want in ((times[2], 30.0), (times[10], 150.0), (history.end, 300.0)):
        got = {}
        for name, src, tol in (("scrape", history.scrape, 0.0),
                               ("prometheus", prom, definitions.WINDOW_AGE_RESOLUTION_SECONDS)):  # fmt: skip
            ages = src.window_ages(definitions.POD_HISTORY_METRIC, JOB_AGE_KEYS, end=at)
            assert not ages.empty, name
            assert all(want - tol - 1e-6 <= a <= want + 1e-6 for a in ages["age_s"]), (
                name,
                at,
                ages.to_dict("records"),
            )
            got[name] = set(zip(ages["namespace"], ages["pod"], strict=True))
        assert got["scrape"] == got["prometheus"]
        assert definitions.window_full(float(ages["age_s"].min())) == (want >= 300.0)


@pytest.mark.parametrize("source", ["scrape", "prometheus"])
def test_no_job_verdict_before_its_window(history: History, store: str, source: str) -> None:
    """Two minutes into the history the jobs have their figures but no verdict: no straggler and no
    communication-bound job, each straggler cell ``collecting (… of 5 m)``; once the window is
    full the recorded stragglers are named. (Before, the young means gave verdicts that the full
    window then changed: Jobs at 14 s named another job's straggler.)"""
    src = history.scrape if source == "scrape" else PrometheusSource(store)
    at = _times(history)[8]
    end = history.end
    if source == "prometheus":  # the rules' evaluations at or before those instants (every minute)
        at = float(prom_query(store, "max(timestamp(gpulens:job_leaf:info))", at=at)[0]["value"][1])
        end = float(prom_query(store, "max(timestamp(gpulens:job_straggler:info))", at=end)[0]["value"][1])

    def overview(when: float) -> pd.DataFrame:
        ages = job_ages(src.window_ages(definitions.POD_HISTORY_METRIC, JOB_AGE_KEYS, end=when))
        return jobs_overview(src.job_summary(end=when), src.job_stragglers(end=when), src.job_mix(end=when), ages)

    early = overview(at)
    assert not early.empty
    assert int(early["stragglers"].sum()) == 0, early[["workload", "straggler"]].to_dict("records")
    assert not early["communication_bound"].any(), early[["workload", "communication"]].to_dict("records")
    assert early["collecting"].all()
    young = at - _times(history)[0]
    for cell, age, classified in zip(early["straggler"], early["age_s"], early["classified"], strict=True):
        assert young - definitions.WINDOW_AGE_RESOLUTION_SECONDS - 1e-6 <= age <= young + 1e-6
        if classified:  # a job of no classified GPU keeps saying why it has no verdict
            assert cell == definitions.collecting_words(age) and cell.endswith(" of 5 m)"), cell
        else:
            assert cell == NO_CLASS
    late = overview(end)
    assert not late["collecting"].any()
    assert int(late["stragglers"].sum()) == len(STRAGGLERS)


def test_the_collecting_words_say_how_far_the_window_is() -> None:
    assert definitions.collecting_words(14.2) == "collecting (14 s of 5 m)"
    assert definitions.collecting_words(125.0) == "collecting (2 m 05 s of 5 m)"
    assert definitions.collecting_words(float("nan")) == "collecting (0 s of 5 m)"
    assert not definitions.window_full(294.9) and definitions.window_full(295.0) and definitions.window_full(300.0)
    assert not definitions.window_full(float("nan"))


def test_both_sources_give_the_same_class_shares_and_mix(history: History, store: str) -> None:
    prom = PrometheusSource(store)
    at = float(prom_query(store, "max(timestamp(gpulens:job_boundness:ratio_avg5m))", at=history.end)[0]["value"][1])
    recorded = prom.job_mix(end=at)
    computed = history.scrape.job_mix(end=at)
    from_classes = jobs.job_mix(prom.job_classes(end=at))

    def shares(mix: pd.DataFrame) -> dict[tuple[str, str, str], float]:
        m = mix[mix["share"] > 0]
        return {(str(r["workload"]), str(r["class"]), str(r["namespace"])): float(r["share"])
                for r in m.to_dict("records")}  # fmt: skip

    want = shares(recorded)
    assert want[("train", "communication", "ml-training")] == pytest.approx(3 * 0.6 / 4)
    assert want[("moe", "communication", "research")] == pytest.approx(0.8)
    assert ("debug", "compute", "ml-training") not in want, "a leaf without a class has no mix"
    for name, got in (("scrape", shares(computed)), ("store's per-leaf classes", shares(from_classes))):
        assert set(got) == set(want), name
        for k, v in want.items():
            assert got[k] == pytest.approx(v, abs=1e-9), (name, k)


@pytest.mark.parametrize("source", ["prometheus", "scrape"])
def test_a_node_filter_keeps_every_leaf_of_the_jobs_with_one_there(history: History, store: str, source: str) -> None:
    """Jobs are shown whole: a node filter selects the jobs with a leaf on it, with all their
    leaves (the train job's node-0 GPUs too); the MIG instance's job, only on node 0, is left out."""
    if source == "prometheus":
        src: Any = PrometheusSource(store)
        f = Filters(node="node-1")
    else:
        src, f = history.scrape, Filters(instance=NODES[1])
    leaves = src.job_leaves(f, end=history.end)
    assert {str(w) for w in leaves["workload"]} == {"train", "loader", "moe", "debug"}
    assert len(leaves[leaves["workload"] == "train"]) == 4
    summary = src.job_summary(f, window=Window(600.0), end=history.end)
    assert {str(w) for w in summary["workload"]} == {"train", "loader", "moe", "debug"}
    assert int(summary[summary["workload"] == "train"]["gpus"].iloc[0]) == 4
    assert {str(w) for w in src.job_stragglers(f, end=history.end)["workload"]} == {"train", "loader"}
    assert src.job_stragglers(Filters(namespace="web"), end=history.end).empty
    assert set(src.job_summary(Filters(namespace="web"), end=history.end)["workload"]) == {"infer"}
    # one job's leaves (the Job page), with its held hours; a job not held now: none, and no error
    cluster = "c1" if source == "prometheus" else ""
    train = src.job_leaves(
        f, window=Window(600.0), end=history.end, job=(cluster, "ml-training", "PyTorchJob", "train")
    )
    assert set(train["uuid"]) == {"GPU-a0", "GPU-a1", "GPU-b0", "GPU-b1"} and set(train["workload"]) == {"train"}
    assert np.allclose(train["held_hours"].astype(float), 10 / 60, atol=1 / 60)
    assert src.job_leaves(end=history.end, job=(cluster, "ml-training", "PyTorchJob", "gone")).empty
    assert set(src.job_leaves(Filters(namespace="web"), end=history.end)["workload"]) == {"infer"}
    mix = src.job_mix(f, end=history.end)
    assert "infer" not in set(mix["workload"])


@pytest.mark.parametrize("source", ["prometheus", "scrape"])
def test_job_series_follow_the_jobs_gpus_over_the_range(history: History, store: str, source: str) -> None:
    """The train job's GPUs over the last 10 minutes: SM activity, the pod's class and the SM clock
    of its four GPUs only; the straggler's clock at half, its class compute at every step."""
    src: Any = PrometheusSource(store) if source == "prometheus" else history.scrape
    cluster = "c1" if source == "prometheus" else ""
    series = src.job_series((cluster, "ml-training", "PyTorchJob", "train"), NODES, window=Window(600.0), step_s=60.0,
                            end=history.end)  # fmt: skip
    assert set(series["metric"]) == {"sm_active", "busy", "sm_clock", "class"}
    assert set(series["uuid"]) == {"GPU-a0", "GPU-a1", "GPU-b0", "GPU-b1"}
    b1 = series[series["uuid"] == "GPU-b1"]
    assert np.allclose(b1[b1["metric"] == "sm_clock"]["value"], 0.5)
    assert set(b1[b1["metric"] == "class"]["class"]) == {"compute"}
    a0 = series[(series["uuid"] == "GPU-a0") & (series["metric"] == "class")]
    assert set(a0["class"]) == {"communication", "compute"}
    rows = job_gpu_table(src.job_leaves(end=history.end).query("workload == 'train'"))
    timeline = job_timeline(series, rows)
    assert set(timeline["track"]) == {"activity", "class", "sm_clock"}
    assert set(timeline["row"]) == set(rows["row"])
    assert timeline[timeline["track"] == "activity"].groupby("row").size().min() >= 9


# --- the pure transforms -----------------------------------------------------------------------
def _leaf_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    base: dict[str, Any] = {c: "" for c in jobs.JOB_LEAF}
    base.update(gpu="0", activity=0.5, busy=0.9, communication=math.nan, memory_used_ratio=0.5,
                memory_used_bytes=70 * GIB, memory_total_bytes=140 * GIB, sm_clock_ratio=1.0, slowdown=0.0,
                slowdown_reasons="", model=H200, gpu_share=1.0, held_hours=1.0)  # fmt: skip
    return pd.DataFrame([{**base, **r} for r in rows])


def test_the_jobs_table_sorts_by_gpu_hours_and_says_why_a_value_is_missing() -> None:
    job = {"namespace": "ml", "workload_kind": "PyTorchJob", "workload": "big"}
    leaves = _leaf_frame(
        [
            *({**job, "pod": f"big-{i // 2}", "instance": f"n{i // 2}", "uuid": f"G{i}", "gpu": str(i % 2),
               "communication": 0.6, "held_hours": 2.0} for i in range(3)),
            {**job, "pod": "big-1", "instance": "n1", "uuid": "G3", "gpu": "1", "communication": 0.0, "busy": 0.2,
             "held_hours": 2.0},
            {"namespace": "ml", "workload_kind": "Pod", "workload": "solo", "pod": "solo", "instance": "n2",
             "uuid": "S", "held_hours": 3.0},
            {"namespace": "web", "workload_kind": "Deployment", "workload": "one", "pod": "one-1", "instance": "n2",
             "uuid": "O", "communication": 0.9, "held_hours": 0.5},
        ]
    )  # fmt: skip
    mix = pd.DataFrame(
        [
            {**job, "cluster": "", "class": "communication", "share": 0.45},
            {**job, "cluster": "", "class": "compute", "share": 0.55},
            {"cluster": "", "namespace": "web", "workload_kind": "Deployment", "workload": "one",
             "class": "communication", "share": 0.9},
        ]
    )  # fmt: skip
    hours = (leaves.assign(gpu_hours=leaves["held_hours"] * leaves["gpu_share"])
             .groupby(list(jobs.JOB), as_index=False)["gpu_hours"].sum())  # fmt: skip
    table = jobs_overview(jobs.job_summary(leaves, hours), jobs.stragglers(leaves), mix)
    assert list(table.columns) == list(JOB_OVERVIEW_COLUMNS)
    assert list(table["workload"]) == ["big", "solo", "one"], "most GPU-hours first: 8, 3, 0.5"
    big, solo, one = (table.iloc[i] for i in range(3))
    assert (big["gpus"], big["nodes"], big["pods"], big["gpu_hours"]) == (4, 2, 2, 8.0)
    assert big["straggler"] == "pod big-1 on n1 · GPU 1: input: idle 80 % of the time while peers wait"
    assert big["mix"] == "compute 55 % · communication 45 %"
    assert not big["communication_bound"], "a straggler explains its waiting"
    assert solo["straggler"] == NO_CLASS and solo["mix"] == NO_CLASS
    assert one["straggler"] == "one classified GPU: no peers to wait"
    assert bool(one["communication_bound"])
    assert big["memory"] == "70.0 of 140.0 GiB (50 %)"
    assert big["activity_range"] == "50–50 % · spread 0 pts"
    for value in table.select_dtypes(exclude=["number", "bool"]).to_numpy().ravel():
        assert value is not None and "nan" not in str(value).lower(), table
    # the stragglers' figures missing (their query failed): the count stands, said so
    lost = jobs_overview(jobs.job_summary(leaves, hours), pd.DataFrame(columns=list(JOB_STRAGGLER_COLUMNS)), mix)
    assert lost.iloc[0]["straggler"] == "1 (its figures did not load)"


def test_a_jobs_gpu_hours_count_every_gpu_it_held_in_the_range_once_per_step() -> None:
    """jobs.gpu_hours: the steps each leaf was held times the step, a MIG instance by its share, a
    GPU two of its pods share once per step, a GPU it released before the range's end included."""
    job = {"cluster": "", "namespace": "ml", "workload_kind": "JobSet", "workload": "sft"}
    rows = [
        *({**job, "pod": "sft-0", "uuid": "G0", "mig_uuid": "", "timestamp": t, "gpu_share": 1.0} for t in range(10)),
        # a second pod on G0 (time-sliced): counted once
        *({**job, "pod": "sft-1", "uuid": "G0", "mig_uuid": "", "timestamp": t, "gpu_share": 1.0} for t in range(10)),
        # G1 released after 4 steps
        *({**job, "pod": "sft-0", "uuid": "G1", "mig_uuid": "", "timestamp": t, "gpu_share": 1.0} for t in range(4)),
        # a 3g instance of an H200, all 10 steps
        *({**job, "pod": "sft-1", "uuid": "G2", "mig_uuid": "M", "timestamp": t, "gpu_share": 3 / 7}
          for t in range(10)),
    ]  # fmt: skip
    got = jobs.gpu_hours(pd.DataFrame(rows), 60.0)
    assert got["gpu_hours"].tolist() == pytest.approx([(10 + 4 + 10 * 3 / 7) / 60])
    assert jobs.gpu_hours(pd.DataFrame(columns=[*jobs.JOB, "uuid", "mig_uuid", "timestamp"]), 60.0).empty
    # job_summary takes them per job; a job without any step held reads 0, none given reads NaN
    leaves = _leaf_frame([{**job, "pod": "sft-0", "instance": "n0", "uuid": "G0"}])
    assert jobs.job_summary(leaves, got)["gpu_hours"].tolist() == pytest.approx(got["gpu_hours"].tolist())
    assert jobs.job_summary(leaves, got.iloc[0:0])["gpu_hours"].tolist() == [0.0]
    assert math.isnan(jobs.job_summary(leaves)["gpu_hours"].iloc[0])


def test_a_compute_straggler_is_explained_by_its_clock_and_its_slowdown_events() -> None:
    row = {"reason": "compute", "sm_clock_ratio": 0.5, "slowdown_reasons": "hw_thermal_slowdown,sw_power_cap",
           "node": "node-1", "instance": "10.0.0.2:9445", "gpu": "3", "mig_uuid": "", "pod": "sft-1"}  # fmt: skip
    assert straggler_words(row) == (
        "pod sft-1 on node-1 · GPU 3: compute: SM clock 50 % of max, HW Thermal Slowdown, SW Power Cap"
    )
    bare = {**row, "sm_clock_ratio": math.nan, "slowdown_reasons": "", "node": "", "pod": ""}
    assert straggler_words(bare) == "10.0.0.2:9445 · GPU 3: compute: computes while its peers wait"
    assert straggler_reason({"reason": "input", "busy": 0.55}) == "input: idle 45 % of the time while peers wait"


def test_job_urls_round_trip_and_name_the_job() -> None:
    from dashboard import ui

    key = ("prod", "ml-training", "JobSet", "mixtral-sft")
    url = ui.job_url(key, {"range": "1h"})
    assert url == "job?job=ml-training/JobSet/mixtral-sft&job_cluster=prod&range=1h"
    import re

    assert re.search(ui.JOB_IN_URL, url).group(1) == "ml-training/JobSet/mixtral-sft"  # type: ignore[union-attr]
    assert job_from_param("ml-training/JobSet/mixtral-sft", "prod") == key
    assert job_from_param("no-kind") is None and job_from_param("a//b") is None


def test_job_queries_keep_label_values_quoted_and_read_only_the_jobs_targets() -> None:
    evil = 'n1"} or vector(1) or {x="'
    sel = _regex_selector("gpulens_gpu_sm_active_ratio", {"cluster": "c1"}, "instance", [evil, "n0:9445"])
    assert sel.startswith('gpulens_gpu_sm_active_ratio{cluster="c1",instance=~"')
    assert '"} or vector(1)' not in sel.replace('\\"', "")
    src = PrometheusSource("http://unused")
    seen: list[str] = []

    def capture(promql: str, **_: object) -> pd.DataFrame:
        seen.append(promql)
        return pd.DataFrame(columns=["timestamp", "value"])

    src.query_range = capture  # type: ignore[method-assign]
    src.job_series(("c1", "ml", "JobSet", "x"), ["n0:9445", "n1:9445"], window=Window(600.0), step_s=60.0)
    assert len(seen) == 4
    for q in seen:
        assert 'instance=~"n0:9445|n1:9445"' in q, q
        assert 'gpulens:job_leaf:info{cluster="c1",namespace="ml",workload="x",workload_kind="JobSet"}' in q, q
    node = src.job_selector("gpulens:job_leaf_busy:ratio_avg5m", Filters(namespace="ml", node="n1"))
    assert node == (
        '(gpulens:job_leaf_busy:ratio_avg5m{namespace="ml"} and on (cluster,namespace,workload_kind,workload) '
        'gpulens:job_leaf:info{namespace="ml",node="n1"})'
    )


def test_the_timeline_reads_sm_activity_else_busy_and_each_gpus_clock_for_its_mig_instances() -> None:
    series = pd.DataFrame(
        [
            {"metric": "sm_active", "uuid": "G0", "mig_uuid": "", "timestamp": 1.0, "value": 0.4},
            {"metric": "busy", "uuid": "G0", "mig_uuid": "", "timestamp": 1.0, "value": 0.9},
            {"metric": "busy", "uuid": "G1", "mig_uuid": "", "timestamp": 1.0, "value": 0.7},
            {"metric": "sm_clock", "uuid": "G2", "mig_uuid": "", "timestamp": 1.0, "value": 0.5},
            {"metric": "class", "uuid": "G0", "mig_uuid": "", "class": "compute", "timestamp": 1.0, "value": 1.0},
        ]
    )
    rows = pd.DataFrame(
        [{"uuid": "G0", "mig_uuid": "", "row": "a"}, {"uuid": "G1", "mig_uuid": "", "row": "b"},
         {"uuid": "G2", "mig_uuid": "M1", "row": "c"}, {"uuid": "G2", "mig_uuid": "M2", "row": "d"}]
    )  # fmt: skip
    t = job_timeline(series, rows)
    activity = t[t["track"] == "activity"].set_index("row")["value"]
    assert activity.to_dict() == {"a": 0.4, "b": 0.7}, "SM activity where the GPU has it, else busy"
    assert set(t[t["track"] == "sm_clock"]["row"]) == {"c", "d"}, "the GPU's clock on each of its instances"
    chart = job_timelines(t, ["a", "b", "c", "d"], start=0.0, end=60.0, step=10.0)
    assert [s["transform"][0]["filter"]["equal"] for s in chart["vconcat"]] == ["activity", "class", "sm_clock"]
    assert {s["encoding"]["y"]["sort"][0] for s in chart["vconcat"]} == {"a"}
    assert chart["resolve"]["scale"]["x"] == "shared"
    json.dumps(chart)  # a plain spec


def test_the_mix_chart_keeps_the_tables_order_and_the_class_colours() -> None:
    mix = pd.DataFrame(
        [{"job": "b", "class": "communication", "share": 0.7}, {"job": "b", "class": "compute", "share": 0.3},
         {"job": "a", "class": "compute", "share": 1.0}, {"job": "c", "class": "idle", "share": 0.0}]
    )  # fmt: skip
    chart = job_mix_bars(mix, ["b", "a", "c"])
    assert chart["encoding"]["y"]["sort"] == ["b", "a"], "c has no share above 0"
    scale = chart["encoding"]["color"]["scale"]
    assert dict(zip(scale["domain"], scale["range"], strict=True))["communication"] == CLASS_COLORS["communication"]
    assert "no job has a class" in json.dumps(job_mix_bars(mix.iloc[0:0], ["a"]))


def test_a_store_without_the_jobs_rules_says_which_to_load() -> None:
    """GPUs held by pods but no gpulens:job_leaf:info (a Prometheus without the group gpulens.jobs):
    the source says what to load instead of showing no job."""
    from dashboard.sources.source import SourceError
    from tests.fixtures.dashboard.fake_prometheus import fake_prometheus

    with fake_prometheus("h200x8.prom") as (url, _state), pytest.raises(SourceError, match=r"group gpulens\.jobs"):
        PrometheusSource(url).job_leaves()
