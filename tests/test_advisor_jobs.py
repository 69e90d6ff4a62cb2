"""Job advice (dashboard/advisor/jobs.py): the engine's rules on hand-made jobs, each with its
boundary, the query layer's aggregation by the one job definition (dashboard/jobs.py), and the
whole advisor against a real Prometheus backfilled with a history of the simulated ``jobs-0`` and
``jobs-1`` nodes (four two-node jobs of 4 H200s each: healthy, a straggler, communication-bound,
over-provisioned) read by the measurement layer, the CLI and the Right-sizing page."""

from __future__ import annotations

import json
import math
import multiprocessing
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from dashboard import definitions, jobs
from dashboard.advisor import cli
from dashboard.advisor.engine import Policy
from dashboard.advisor.job_query import job_usages, leaf_frame, measure_jobs, queries, touching
from dashboard.advisor.jobs import JobAction, JobAdvice, JobLeaf, JobUsage, Straggler, advise_job, advise_jobs
from dashboard.advisor.profiles import H100, H200
from dashboard.advisor.query import Window, measure
from dashboard.sources.openmetrics import OpenMetricsHistory
from dashboard.sources.prometheus import PrometheusSource
from dashboard.sources.source import Filters
from exporter.render.metrics import spec
from exporter.sim import scenarios
from tests.support.markdown import shown
from tests.support.prometheus import run_prometheus

pytestmark = [pytest.mark.integration, pytest.mark.long]

REPO = Path(__file__).resolve().parents[1]
GB = 1e9
GIB = 2**30
HOURS = 24.0
"""Hours each leaf of a hand-made job was held."""
PRICES = {"H200": 3.5, "H100": 2.5}
PRICE_FLAGS = ["--price", "H200=3.5", "--price", "H100=2.5"]


def leaves(n: int, nodes: int = 2, peak: float | None = 38 * GB, **kw: object) -> tuple[JobLeaf, ...]:
    """``n`` whole H200s spread evenly over ``nodes`` nodes, each held HOURS with ``peak`` bytes."""
    per = n // nodes
    return tuple(
        JobLeaf(
            uuid=f"GPU-{i:04d}",
            gpu=str(i % per),
            node=f"node-{i // per}",
            instance=f"node-{i // per}:9445",
            pod=f"job-worker-{i // per}",
            hours_held=HOURS,
            memory_peak_bytes=peak,
            memory_total_bytes=150_754_820_096.0,
            **kw,  # type: ignore[arg-type]
        )
        for i in range(n)
    )


def job(n: int = 4, nodes: int = 2, **kw: object) -> JobUsage:
    """A data-parallel job of ``n`` H200s over ``nodes`` nodes of 8 GPUs (fields overridable)."""
    leaf_kw = {k: kw.pop(k) for k in ("peak",) if k in kw}
    base: dict[str, object] = dict(
        cluster="c1",
        namespace="research",
        workload_kind="Job",
        workload="train",
        gpu_model="NVIDIA H200",
        leaves=leaves(n, nodes, **leaf_kw),  # type: ignore[arg-type]
        gpus_per_node={f"node-{i}:9445": 8 for i in range(nodes)},
        activity=0.55,
        busy=0.99,
        communication=0.45,
        mix={"communication": 0.45, "compute": 0.55},
    )
    base.update(kw)
    return JobUsage(**base)  # type: ignore[arg-type]


def only(advice: list[JobAdvice]) -> JobAdvice:
    assert len(advice) == 1, [(a.action, a.reason) for a in advice]
    return advice[0]


# --- scale-in ---------------------------------------------------------------------------------


def test_over_provisioned_communicating_job_scales_in_to_one_node() -> None:
    # 4 x 38 GB x 1.2 = 182.4 GB: two H200s of 141 GB (the profile's figure, below NVML's 150.7e9)
    a = only(advise_job(job(), prices=PRICES))
    assert (a.action, a.target) == (JobAction.SCALE_IN, "2 GPUs on one node")
    assert a.gpu_hours_saved == pytest.approx(2 * HOURS)
    assert a.cost_saved_usd == pytest.approx(2 * HOURS * 3.5)
    assert a.reason.startswith("uses 38.0 GB of 141 GB per GPU and spends 45 % communicating: 2 GPUs on one node")
    assert a.evidence["gpus_needed"] == 2 and a.evidence["memory_per_gpu_bytes"] == H200.memory_bytes


def test_needed_equal_to_held_gets_no_scale_in_and_an_exact_fit_on_fewer_does() -> None:
    # exactly 3 GPUs' worth of peak x headroom: 3 of the 4 held; a byte more per GPU needs all 4
    exact = 3 * H200.memory_bytes / 1.2 / 4
    a = only(advise_job(job(peak=exact)))
    assert (a.action, a.target, a.gpu_hours_saved) == (JobAction.SCALE_IN, "3 GPUs on one node", HOURS)
    k = only(advise_job(job(peak=exact + 1.0)))
    assert (k.action, k.gpu_hours_saved) == (JobAction.KEEP, 0.0)
    assert "needs 4 GPUs: it holds 4" in k.reason


def test_compute_bound_data_parallel_job_is_not_scaled_in_however_little_memory_it_uses() -> None:
    # 10 GB per GPU would fit one GPU, but each rank computes 90 % of the time: on fewer GPUs each
    # step takes longer and the GPU-hours stay the same
    a = only(
        advise_job(job(peak=10 * GB, activity=0.9, communication=0.05, mix={"compute": 0.95, "communication": 0.05}))
    )
    assert a.action == JobAction.KEEP and a.gpu_hours_saved == 0.0
    assert "compute-bound" in a.reason and "save no GPU-hours" in a.reason


@pytest.mark.parametrize(
    ("communication", "activity", "scales_in"),
    [
        (0.25, 0.9, True),  # at the communication threshold
        (0.2499, 0.9, False),
        (0.0, 0.4999, True),  # below the activity threshold: light
        (0.0, 0.5, False),
        (None, None, False),  # nothing measured: no claim
    ],
)
def test_scale_in_thresholds(communication: float | None, activity: float | None, scales_in: bool) -> None:
    a = only(advise_job(job(communication=communication, activity=activity)))
    assert (a.action == JobAction.SCALE_IN) is scales_in, a.reason


def test_a_job_wider_than_a_node_packs_onto_fewer_nodes() -> None:
    # 16 GPUs on 4 nodes, 60 GB each: 16 x 60 x 1.2 / 141 = 8.2 -> 9 GPUs, 2 nodes of 8
    a = only(advise_job(job(n=16, nodes=4, peak=60 * GB)))
    assert (a.action, a.target) == (JobAction.SCALE_IN, "9 GPUs on 2 nodes")
    assert a.gpu_hours_saved == pytest.approx(7 * HOURS)


def test_one_node_job_scales_in_without_naming_a_node() -> None:
    a = only(advise_job(job(n=8, nodes=1)))
    assert (a.action, a.target) == (JobAction.SCALE_IN, "3 GPUs")


def test_single_leaf_jobs_get_no_job_advice() -> None:
    solo = job(n=1, nodes=1)
    assert advise_jobs([solo]) == []
    assert [a.usage.name for a in advise_jobs([solo, job()])] == ["research/Job/train @ c1"]


def test_unmeasured_memory_mig_leaves_and_short_history_are_kept() -> None:
    assert "not measured" in only(advise_job(job(peak=None))).reason
    mig = job(leaves=tuple(replace(x, mig_uuid=f"MIG-{i}") for i, x in enumerate(leaves(4))))
    assert "MIG" in only(advise_job(mig)).reason
    short = job(leaves=tuple(replace(x, hours_held=0.2) for x in leaves(4)))
    a = only(advise_job(short))
    assert a.action == JobAction.KEEP and "too little history" in a.reason


def test_wasted_gpu_hours_are_the_measured_waste_figure_not_a_new_one() -> None:
    a = only(advise_job(job(wasted_gpu_hours=12.5)))
    assert a.wasted_gpu_hours == 12.5 and a.evidence["wasted_gpu_hours"] == 12.5


# --- stragglers -------------------------------------------------------------------------------


def straggling(reason: str, busy: float = 0.95, **kw: object) -> JobUsage:
    """A 4-GPU job whose jobs-1 GPU 3 (``busy`` of the time) its three peers wait for (75 %)."""
    ls = list(leaves(4, peak=120 * GIB, busy=0.95, communication=0.75))
    ls[3] = replace(ls[3], node="jobs-1", gpu="3", uuid="GPU-slow", pod="train-1", communication=0.05, busy=busy)
    s = Straggler(ls[3], reason, peers_communication=0.75, peers_busy=0.95, **kw)  # type: ignore[arg-type]
    return job(leaves=tuple(ls), stragglers=(s,), communication=0.58, mix={"communication": 0.58, "compute": 0.42})


def test_compute_straggler_names_its_gpu_and_its_clock_evidence() -> None:
    a = only(advise_job(straggling("compute", sm_clock_ratio=0.5, slowdown=1.0, slowdown_reason="hw_thermal_slowdown")))
    assert (a.action, a.target) == (JobAction.STRAGGLER, "drain or replace jobs-1 GPU 3")
    assert "GPU-slow" in a.reason and "SM clock 50 % of its maximum" in a.reason
    assert "clocks held down by HW Thermal Slowdown 100 % of the time" in a.reason
    assert "its 3 peers spend 75 % of their time communicating (waiting), it 5 %" in a.reason
    # (peers' communication share - its own) x the peers' GPU-hours held
    assert a.gpu_hours_saved == pytest.approx((0.75 - 0.05) * 3 * HOURS)
    assert a.evidence["straggler_uuid"] == "GPU-slow" and a.evidence["straggler_reason"] == "compute"


def test_input_straggler_points_at_its_pipeline_with_the_busy_gap() -> None:
    a = only(advise_job(straggling("input", busy=0.4)))
    assert (a.action, a.target) == (JobAction.STRAGGLER, "fix the input pipeline of train-1")
    assert "busy 40 % of the time against its peers' 95 %" in a.reason


def test_a_job_with_a_straggler_is_not_judged_for_scale_in() -> None:
    # 4 x 10 GB would fit one GPU and it communicates 58 %: but that is the wait for the straggler
    s = straggling("compute", sm_clock_ratio=0.5)
    small = replace(s, leaves=tuple(replace(x, memory_peak_bytes=10 * GB) for x in s.leaves))
    assert [a.action for a in advise_job(small)] == [JobAction.STRAGGLER]


# --- higher bandwidth ----------------------------------------------------------------------------


def test_memory_bound_h100_job_moves_to_h200_with_the_profiles_percentages() -> None:
    more_bw = H200.bandwidth_bytes_per_second / H100.bandwidth_bytes_per_second - 1
    more_mem = H200.memory_bytes / H100.memory_bytes - 1
    assert (f"{more_bw:.0%}", f"{more_mem:.0%}") == ("43%", "76%"), "the issue's figures, from the tables"
    h100 = job(
        gpu_model="NVIDIA H100 80GB HBM3",
        leaves=tuple(replace(x, memory_peak_bytes=50 * GIB, memory_total_bytes=85e9) for x in leaves(4)),
        activity=0.95,
        communication=0.0,
        mix={"memory": 0.9, "idle": 0.1},
    )
    a = only(advise_job(h100, prices=PRICES))
    assert (a.action, a.target) == (JobAction.BANDWIDTH, "H200")
    more = f"H200 has {more_bw * 100:.0f} % more bandwidth and {more_mem * 100:.0f} % more"
    assert f"memory-bound 100 % of its busy time: {more}" in a.reason
    # 4 x 50 GiB x 1.2 = 257.7 GB: two H200s hold it
    assert "2 H200 would hold its peak" in a.reason and a.evidence["gpus_needed_on_faster_model"] == 2
    new_hours = 4 * HOURS * (1 - 0.9 * (1 - 1 / (1 + more_bw)))
    assert a.gpu_hours_saved == pytest.approx(4 * HOURS - new_hours)
    assert a.cost_saved_usd == pytest.approx(4 * HOURS * 2.5 - new_hours * 3.5)


def test_memory_bound_below_the_threshold_or_on_the_fastest_model_gets_no_bandwidth_advice() -> None:
    half = job(gpu_model="NVIDIA H100 80GB HBM3", mix={"memory": 0.44, "compute": 0.46, "idle": 0.1}, activity=0.9,
               communication=0.0, peak=70 * GB)  # fmt: skip
    assert only(advise_job(half)).action == JobAction.KEEP, "0.44 / 0.9 = 49 % of busy time"
    h200 = job(mix={"memory": 1.0}, activity=0.9, communication=0.0, peak=120 * GB)
    assert only(advise_job(h200)).action == JobAction.KEEP, "no known model is faster than an H200"


def test_advice_is_ordered_by_saving() -> None:
    big = job(workload="big", n=8, nodes=2)
    small = job(workload="small")
    keep = job(workload="busy", peak=130 * GB)
    order = [(a.usage.workload, a.action) for a in advise_jobs([keep, small, big])]
    assert order == [("big", JobAction.SCALE_IN), ("small", JobAction.SCALE_IN), ("busy", JobAction.KEEP)]


# --- the query layer: PromQL and the one job definition's arithmetic ------------------------------


def test_queries_read_raw_series_only_and_inline_the_waste_definition() -> None:
    qs = queries(Filters(cluster="c1"), Window(window_s=86400))
    assert not [k for k, q in qs.items() if "gpulens:" in q], "recorded series: absent from older history"
    assert definitions.leaf_idle_promql({"cluster": "c1"}) in qs["wasted"]
    assert definitions.gpu_share_promql({"cluster": "c1"}) in qs["wasted"]
    # the holding share is definitions.holding_share_promql's when no namespace is filtered
    unfiltered = queries(Filters(), Window(window_s=86400))["wasted"]
    assert definitions.holding_share_promql("gpulens_pod_gpu_allocation") in unfiltered
    assert all('cluster="c1"' in q for k, q in qs.items()), "every query keeps to the cluster filtered"
    assert 'gpulens_pod_gpu_boundness{cluster="c1"}' in qs["classes"]


def _frame(rows: list[dict[str, object]]) -> pd.DataFrame:
    return pd.DataFrame(rows)


def test_leaf_rows_aggregate_by_the_job_definition_and_keep_clusters_apart() -> None:
    # the same job name in two clusters is two jobs; a bare pod is its own job
    base = {"namespace": "ml", "workload_kind": "JobSet", "workload": "sft", "mig_uuid": ""}
    leaves_ = []
    for cluster in ("a", "b"):
        for i in range(4):
            leaves_.append({**base, "cluster": cluster, "pod": f"sft-{i // 2}", "instance": f"n{i // 2}:9445",
                            "node": f"n{i // 2}", "uuid": f"GPU-{cluster}{i}"})  # fmt: skip
    bare = {"namespace": "ml", "workload_kind": "", "workload": "", "mig_uuid": "", "cluster": "a", "pod": "dbg",
            "instance": "n2:9445", "node": "n2", "uuid": "GPU-a9"}  # fmt: skip
    every = [*leaves_, bare]

    def result(value: object) -> pd.DataFrame:
        return _frame([{**x, "value": value(x) if callable(value) else value} for x in every])

    slow = "GPU-a3"
    comm = {x["uuid"]: (0.0 if x["uuid"] == slow else 0.8) for x in every}
    classes = _frame(
        [
            {**x, "class": c, "value": comm[x["uuid"]] if c == "communication" else 1 - comm[x["uuid"]]}
            for x in every
            for c in ("communication", "compute")
        ]
    )
    results = {
        "held": result(10.0),
        "activity": result(0.6),
        "busy": result(0.95),
        "memory_used_bytes": result(40 * GB),
        "sm_clock_ratio": result(lambda x: 0.5 if x["uuid"] == slow else 1.0),
        "slowdown": result(lambda x: 0.9 if x["uuid"] == slow else 0.0),
        "wasted": result(lambda x: 1.5 if x["uuid"] == "GPU-b0" else 0.0),
        "classes": classes,
        "memory_total_bytes": _frame(
            [{"cluster": x["cluster"], "uuid": x["uuid"], "mig_uuid": "", "value": 150e9} for x in every]
        ),
        "info": _frame(
            [
                {"cluster": x["cluster"], "uuid": x["uuid"], "gpu": x["uuid"][-1], "name": "NVIDIA H200", "value": 1}
                for x in every
            ]
        ),
        "mig": pd.DataFrame(),
    }
    rows, cls = leaf_frame(results)
    assert set(rows.columns) >= set(jobs.LEAF_COLUMNS)
    # a store without clock series (an older exporter) gives the same jobs, without that evidence
    bare_rows, _ = leaf_frame({**results, "sm_clock_ratio": pd.DataFrame(), "slowdown": pd.DataFrame()})
    assert bare_rows["sm_clock_ratio"].isna().all() and len(bare_rows) == len(rows)
    usages = {u.name: u for u in job_usages(rows, cls, {("a", "n0:9445"): 8, ("a", "n1:9445"): 8},
                                             {("a", slow): "hw_thermal_slowdown"})}  # fmt: skip
    assert set(usages) == {"ml/JobSet/sft @ a", "ml/JobSet/sft @ b", "ml/Pod/dbg @ a"}
    a, b = usages["ml/JobSet/sft @ a"], usages["ml/JobSet/sft @ b"]
    table = jobs.job_table(rows).set_index(list(jobs.JOB))
    assert a.communication == pytest.approx(table.loc[("a", "ml", "JobSet", "sft"), "communication"]) == 0.6
    assert (a.gpus, a.nodes, a.held) == (4, 2, 40.0)
    assert a.mix == pytest.approx({"communication": 0.6, "compute": 0.4})
    assert [(s.leaf.uuid, s.reason, s.sm_clock_ratio, s.slowdown_reason) for s in a.stragglers] == [
        (slow, "compute", 0.5, "hw_thermal_slowdown")
    ]
    assert b.stragglers == () and b.wasted_gpu_hours == 1.5 and a.wasted_gpu_hours == 0.0
    assert a.gpus_per_node == {"n0:9445": 8, "n1:9445": 8} and b.gpus_per_node == {"n0:9445": 0, "n1:9445": 0}
    # a node filter keeps the jobs with a GPU there, whole
    assert [u.name for u in touching(list(usages.values()), Filters(node="n2"))] == ["ml/Pod/dbg @ a"]
    on_n1 = touching(list(usages.values()), Filters(instance="n1:9445"))
    assert sorted(u.name for u in on_n1) == ["ml/JobSet/sft @ a", "ml/JobSet/sft @ b"] and on_n1[0].gpus == 4


# --- a real Prometheus over the simulated jobs nodes ----------------------------------------------

SIM_SECONDS = 1200
"""Simulated seconds of the jobs nodes: 20 minutes, 4 GPUs = 1.33 GPU-hours per job (> min_hours)."""
SCRAPE_EVERY = 10
"""Seconds between the scrapes written to the history."""
KEPT = ("gpulens_gpu_", "gpulens_pod_gpu_", "gpulens_mig_")
"""The families the history keeps (the NIC families, most of a p5en's series, are not read here)."""


def _node_history(scenario: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], dict[int, float]]:
    """One simulated node's exporter, sampled every simulated second and scraped every SCRAPE_EVERY:
    (name, labels) -> {second: value} for the KEPT families (run in a worker process)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from dashboard.sources.scrape import parse_exposition
    from exporter.cli import make_attributor, make_classifier, make_network
    from exporter.config import parse_config
    from exporter.render.collector import SnapshotCollector
    from exporter.sampler import Sampler
    from exporter.sim import Simulation

    cfg = parse_config(["--backend", "sim", "--sim.scenario", scenario, "--no-probes"], env={})
    simulation = Simulation.create(scenario, seed=0)
    tick = [0.0]
    sampler = Sampler(
        simulation.backend,
        attributor=make_attributor(cfg, simulation),
        classifier=make_classifier(cfg),
        network=make_network(cfg, simulation),
        clock=lambda: tick[0],
        wall=lambda: tick[0],
    )
    out: dict[tuple[str, tuple[tuple[str, str], ...]], dict[int, float]] = {}
    try:
        for second in range(1, SIM_SECONDS + 1):
            sampler.run_once()
            if second % SCRAPE_EVERY == 0:
                reg = CollectorRegistry()
                reg.register(SnapshotCollector(sampler.latest, backend="sim", wall=lambda: tick[0]))
                text = "\n".join(
                    line
                    for line in generate_latest(reg).decode().splitlines()
                    if line.startswith(KEPT) or (line.startswith("# ") and line.split(" ", 3)[2].startswith(KEPT))
                )
                for name, samples in parse_exposition(text + "\n", "").items():
                    for labels, value in samples:
                        out.setdefault((name, tuple(kv for kv in labels if kv[0] != "instance")), {})[second] = value
            tick[0] += 1.0
    finally:
        sampler.stop()
    return out


Scrapes = list[dict[tuple[str, tuple[tuple[str, str], ...]], dict[int, float]]]


def _simulate() -> Scrapes:
    """Both nodes' scrapes, the nodes simulated side by side (in lock step: the same clock)."""
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(_node_history, ["jobs-0", "jobs-1"]))


def _write_history(nodes: Scrapes, path: Path, end: float) -> None:
    """The nodes' scrapes as OpenMetrics ending at ``end``, each stamped with the target labels a
    Prometheus scraping them would add (instance, job, node, cluster)."""
    seconds = sorted({s for node in nodes for values in node.values() for s in values})
    stamps = [f"{end - SIM_SECONDS + s:.0f}" for s in seconds]
    by_name: dict[str, list[tuple[dict[str, str], dict[int, float]]]] = {}
    for i, node in enumerate(nodes):
        target = {"instance": f"jobs-{i}:9445", "job": "gpulens", "node": f"jobs-{i}", "cluster": "sim"}
        for (name, labels), values in node.items():
            by_name.setdefault(name, []).append(({**dict(labels), **target}, values))
    with path.open("w") as out:
        history = OpenMetricsHistory(out)
        for name in sorted(by_name, key=lambda n: (n.removesuffix("_total"), n)):
            try:
                spec(name)
            except KeyError:
                continue  # not a catalogued family (the exposition's own, e.g. _created)
            for target_labels, values in by_name[name]:
                text = [None if s not in values or math.isnan(values[s]) else repr(values[s]) for s in seconds]
                history.series(name, target_labels, text, stamps)
        history.close()


@pytest.fixture(scope="module")
def jobs_nodes() -> Scrapes:
    """The simulated jobs nodes' 20 minutes (the costly part: once per module)."""
    return _simulate()


@pytest.fixture()
def jobs_prom(jobs_nodes: Scrapes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    """A Prometheus serving 20 minutes of the jobs nodes, ending a few seconds ago: (URL, end).
    Stamped for each test: the CLI and the page ask for "now", and on a busy machine the module's
    tests run minutes apart, past the 5 minutes an instant query looks back."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run the README test command (scripts/test.sh)")
    root = tmp_path_factory.mktemp("jobs")
    nodes = jobs_nodes
    # stamped after the simulation ran, so the history ends now: the CLI and the page ask for "now"
    end = float(int(time.time()))
    _write_history(nodes, root / "jobs.om", end)
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=240h",
                    str(root / "jobs.om"), str(root / "data")], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    config = "global: {scrape_interval: 1m}\nscrape_configs: []\n"
    with run_prometheus(
        config, storage_dir=str(root / "data"), extra_args=["--storage.tsdb.retention.time=30d"]
    ) as base:
        yield base, end


def _straggler_uuid() -> str:
    """The UUID of the GPU the scenario throttles (node 1's GPU 3)."""
    node = scenarios.build(f"jobs-{scenarios.JOBS_STRAGGLER_NODE}")
    return next(g.uuid for g in node.gpus if g.index == scenarios.JOBS_STRAGGLER_GPU)


def _by_job(advice: list[JobAdvice]) -> dict[str, list[JobAdvice]]:
    out: dict[str, list[JobAdvice]] = {}
    for a in advice:
        out.setdefault(a.usage.workload, []).append(a)
    return out


def test_the_simulated_jobs_get_the_advice_their_scenario_was_built_for(jobs_prom: tuple[str, float]) -> None:
    base, end = jobs_prom
    src = PrometheusSource(base, timeout_s=60)
    report = measure_jobs(src, Window(window_s=SIM_SECONDS, end=end))
    assert report.covered_s == pytest.approx(SIM_SECONDS, abs=61)
    usages = {u.workload: u for u in report.usages}
    assert set(usages) == {spec_.name for spec_ in scenarios.JOBS}
    for u in usages.values():
        assert (u.cluster, u.gpus, u.nodes, u.gpu_model) == ("sim", 4, 2, "NVIDIA H200"), u.name
        assert u.gpus_per_node == {"jobs-0:9445": 8, "jobs-1:9445": 8}
        assert u.held == pytest.approx(4 * SIM_SECONDS / 3600, rel=0.06), u.name
    advice = _by_job(advise_jobs(report.usages, Policy(), PRICES))

    # over-provisioned: 4 x 38 GB x 1.2 = 182 GB fits two H200s, and it communicates all the time
    [embed] = advice["embedding-train"]
    assert (embed.action, embed.target) == (JobAction.SCALE_IN, "2 GPUs on one node"), embed.reason
    per_gpu = usages["embedding-train"].held / 4
    assert embed.gpu_hours_saved == pytest.approx(2 * per_gpu) and embed.cost_saved_usd == pytest.approx(7 * per_gpu)
    assert embed.reason.startswith("uses 38.0 GB of 141 GB per GPU and spends 100 % communicating")

    # node 1's GPU 3 at half clock: its three peers wait for it in NCCL
    [sft] = advice["mixtral-sft"]
    assert (sft.action, sft.target) == (JobAction.STRAGGLER, "drain or replace jobs-1 GPU 3"), sft.reason
    ev = sft.evidence
    assert (ev["straggler_node"], ev["straggler_gpu"], ev["straggler_uuid"]) == ("jobs-1", "3", _straggler_uuid())
    assert ev["straggler_reason"] == "compute" and ev["slowdown_reason"] == "hw_thermal_slowdown"
    assert ev["sm_clock_ratio"] == pytest.approx(scenarios.P5EN_STRAGGLER_CLOCK_RATIO, abs=0.02)
    assert float(ev["peers_communication"] or 0) >= jobs.STRAGGLER_PEERS_WAIT_AT_LEAST
    assert sft.gpu_hours_saved > 0

    # healthy (compute-bound) and communication-bound, both with their memory nearly full: keep
    for name in ("gpt-13b-finetune", "moe-pretrain"):
        assert [a.action for a in advice[name]] == [JobAction.KEEP], [a.reason for a in advice[name]]
        assert "needs 5 GPUs: it holds 4" in advice[name][0].reason
        assert usages[name].stragglers == ()

    # the wasted GPU-hours beside each job are the waste definition's, as the per-workload advisor
    # measures them (idle GPU-hours): a busy job wastes none
    workloads = {u.workload: u for u in measure(src, Window(window_s=SIM_SECONDS, end=end))}
    for name, u in usages.items():
        assert u.wasted_gpu_hours == pytest.approx(workloads[name].device_hours_idle, abs=1e-9) == 0.0


def test_the_cli_shows_a_jobs_section_in_every_format_but_csv(
    jobs_prom: tuple[str, float], capsys: pytest.CaptureFixture[str]
) -> None:
    base, _ = jobs_prom
    assert cli.main(["--prometheus", base, "--window", "1h", "--format", "json", *PRICE_FLAGS]) == 0
    doc = json.loads(capsys.readouterr().out)
    got = {(j["workload"], j["recommendation"]): j for j in doc["jobs"]}
    assert set(got) == {
        ("Job/embedding-train", "scale-in"),
        ("JobSet/mixtral-sft", "straggler"),
        ("PyTorchJob/gpt-13b-finetune", "keep"),
        ("MPIJob/moe-pretrain", "keep"),
    }
    embed = got[("Job/embedding-train", "scale-in")]
    assert embed["target"] == "2 GPUs on one node" and embed["job"] == "research/Job/embedding-train @ sim"
    assert embed["cost_saved_usd"] == pytest.approx(2 * embed["evidence"]["gpu_hours_per_gpu"] * 3.5, abs=0.01)
    assert embed["wasted_gpu_hours"] == 0.0 and embed["evidence"]["gpus_needed"] == 2
    # the data covers the 20 simulated minutes of the hour asked
    assert doc["covered"]["seconds"] == pytest.approx(SIM_SECONDS, abs=181)
    assert doc["window_seconds"] == 3600

    assert cli.main(["--prometheus", base, "--window", "1h"]) == 0
    text = capsys.readouterr().out
    # the 20 simulated minutes, give or take the step the window's end falls in (the JSON's 181 s)
    covered = re.search(r"Jobs \(multi-GPU\), data from .*: (\d+) min of data in the last 1 h", text)
    assert covered and abs(int(covered.group(1)) - SIM_SECONDS / 60) <= 3, text[-2000:]
    assert "research/Job/embedding-train @ sim: scale-in: uses 38.0 GB of 141 GB per GPU" in text
    assert text.splitlines()[-1].startswith("4 workloads over 1 h:")

    assert cli.main(["--prometheus", base, "--window", "1h", "--format", "markdown"]) == 0
    md = capsys.readouterr().out
    assert "## Jobs (multi-GPU), data from " in md and "| job | gpu_model | gpus |" in md
    assert "- ml-training/JobSet/mixtral-sft @ sim: straggler: jobs-1 GPU 3" in md

    assert cli.main(["--prometheus", base, "--window", "1h", "--format", "csv"]) == 0
    assert "Jobs" not in capsys.readouterr().out, "csv is the workloads' table"


def test_the_page_lists_job_advice_for_people(jobs_prom: tuple[str, float], monkeypatch: pytest.MonkeyPatch) -> None:
    from streamlit.testing.v1 import AppTest

    base, _ = jobs_prom
    monkeypatch.delenv("GPULENS_DASHBOARD_SCRAPE", raising=False)
    monkeypatch.setenv("GPULENS_DASHBOARD_PROMETHEUS", base)
    monkeypatch.setenv("GPULENS_DASHBOARD_REFRESH_SECONDS", "0")
    monkeypatch.setenv("GPULENS_DASHBOARD_PRICES", "H200=3.5")
    at = AppTest.from_file(str(REPO / "dashboard" / "app.py"), default_timeout=90)
    at.run()
    at.switch_page("views/rightsizing.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [shown(e.value) for e in at.error]
    assert "Jobs" in [shown(h.value) for h in at.subheader]
    assert any("of data in the last 7 days" in shown(c.value) for c in at.caption), [shown(c.value) for c in at.caption]
    table = next(d.value for d in at.dataframe if "Job" in d.value.columns)
    assert list(table.columns) == list(cli.job_display(advise_job(job())[0]))
    rows = {r["Job"]: r for r in table.to_dict("records")}
    embed = rows["research/Job/embedding-train @ sim"]
    assert (embed["Advice"], embed["Target"], embed["GPUs"]) == (
        "Scale in",
        "2 GPUs on one node",
        "4 on 2 nodes (H200)",
    )
    assert embed["Saving"].startswith("$") and embed["Wasted GPU-hours"] == "0.0"
    sft = rows["ml-training/JobSet/mixtral-sft @ sim"]
    assert sft["Advice"] == "Straggler" and "jobs-1 GPU 3" in sft["Target"]
    cells = [str(v) for r in rows.values() for v in r.values()]
    assert not [c for c in cells if c in ("", "None", "nan", "NaN") or "{" in c], cells
