"""Live: GPUs without GPM (the simulated A100, L40S and A10G nodes) get the same answers as the
H200 ones, at their own precision, from every reader: a real Prometheus with the shipped rules, the
dashboard's scrape source on the same exporters, and the advisor.

Three exporters (``--sim.scenario a100``, ``l40s``, ``a10g``) run for half a minute; then the idle
verdict per leaf from the recorded ``gpulens:gpu_idle:bool`` (Prometheus source) equals the one the
scrape source computes in pandas, each node has idle allocated GPUs or MIG instances,
``GPUAllocatedButIdle`` (its ``for:`` shortened) fires for the pods holding them with the no-GPM
wording, and the advisor counts idle GPU-hours for the same pods.
"""

from __future__ import annotations

import time
from contextlib import ExitStack

import pandas as pd
import pytest

from dashboard.advisor.query import Window, measure
from dashboard.sources.prometheus import PrometheusSource
from dashboard.sources.scrape import ScrapeSource
from tests.support.exporter import run_exporter
from tests.support.prometheus import firing, query, rules_with_short_for, run_prometheus, scrape_config, wait_for_query

pytestmark = pytest.mark.integration

NODES = ("a100", "l40s", "a10g")
RUN_SECONDS = 30.0


def _idle(verdict: pd.DataFrame) -> set[tuple[str, str]]:
    return {(str(u), str(m)) for u, m, v in zip(verdict["uuid"], verdict["mig_uuid"], verdict["value"], strict=True)
            if v >= 0.5}  # fmt: skip


def test_nodes_without_gpm_read_idle_waste_and_alerts_alike_in_every_reader() -> None:
    with ExitStack() as stack:
        urls = {node: stack.enter_context(run_exporter("--sim.scenario", node, "--no-probes")) for node in NODES}
        targets = [u.removeprefix("http://") for u in urls.values()]
        config = scrape_config(targets) + "rule_files: [gpulens.rules.yml]\n"
        prom = stack.enter_context(
            run_prometheus(config, {"gpulens.rules.yml": rules_with_short_for("GPUAllocatedButIdle", "5s")})
        )
        scrape = ScrapeSource([f"{u}/metrics" for u in urls.values()], interval_s=1.0).start()
        stack.callback(scrape.stop)
        signals = wait_for_query(prom, "count by (signals) (gpulens_gpu_analysis_info)", lambda r: len(r) == 2)
        assert {r["metric"]["signals"] for r in signals} == {"nvml", "processes"}, "no GPM anywhere"
        time.sleep(RUN_SECONDS)

        # the same idle leaves, from the rules and from the pandas reader, on every node
        now = time.time()
        rules = PrometheusSource(prom).leaf_idle(end=now)
        pandas = scrape.leaf_idle(end=now)
        assert _idle(rules) == _idle(pandas)
        assert set(zip(rules["uuid"], rules["mig_uuid"], strict=True)) == set(
            zip(pandas["uuid"], pandas["mig_uuid"], strict=True)
        ), "every leaf has a verdict in both readers"
        info = query(prom, "gpulens_gpu_info")
        node_of = {r["metric"]["uuid"]: r["metric"]["instance"] for r in info}
        per_node = {t: {leaf for leaf in _idle(rules) if node_of.get(leaf[0]) == t} for t in targets}
        assert all(len(leaves) >= 2 for leaves in per_node.values()), per_node
        assert any(mig for mig_leaves in per_node.values() for _, mig in mig_leaves), "an idle A100 MIG instance"

        # the alert fires for the pods holding idle leaves, saying the activity is not SM activity
        idle_held = query(prom, "gpulens:pod_gpu_idle:bool == 1")
        pods = {r["metric"]["pod"] for r in idle_held}
        deadline = time.monotonic() + 60
        fired: set[str] = set()
        while time.monotonic() < deadline and not pods <= fired:
            fired = {a["pod"] for a in firing(prom, "GPUAllocatedButIdle")}
            time.sleep(1.0)
        assert pods and pods <= fired, (pods, fired)

        # the advisor, from raw series with the same definition inlined, counts idle hours for them
        usages = measure(PrometheusSource(prom), Window(window_s=60, step_s=5))
        idle_workloads = {u.workload for u in usages if u.device_hours_idle > 0}
        held = {r["metric"].get("workload", "") for r in idle_held}
        assert held and held <= idle_workloads, (held, idle_workloads)
