"""Live: a real Prometheus loads the shipped rules (with a short ``for:``), scrapes the simulated
exporter, and GPUAllocatedButIdle fires for exactly the pods whose GPUs idle, in /api/v1/alerts."""

from __future__ import annotations

import time

import pytest

from tests.support.exporter import run_exporter
from tests.support.prometheus import (
    alerts,
    firing,
    query,
    rules_with_short_for,
    run_prometheus,
    scrape_config,
    wait_firing,
    wait_for_query,
)

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("scenario", "idle_pods", "busy_pods"),
    [
        (
            "h200x8",
            {"jupyter-alice-0"},
            # a training job on two GPUs, an LLM server, and a launch-bound scorer (SMs near 0 while
            # GPU-Util reads ~20 %: busy, not idle)
            {"llama3-8b-finetune", "llm-decode", "fraud-scoring"},
        ),
        (
            "mig",
            # idle MIG notebooks beside busy siblings on the same physical GPU
            {"jupyter-dana-0", "jupyter-erin-0"},
            {"embedder", "jupyter-bob-0", "bert-pretrain", "reranker"},
        ),
    ],
)
def test_allocated_but_idle_fires_in_a_real_prometheus_scraping_the_sim(
    scenario: str, idle_pods: set[str], busy_pods: set[str]
) -> None:
    with run_exporter("--sim.scenario", scenario, "--no-probes") as exporter:
        target = exporter.removeprefix("http://")
        config = scrape_config([target]) + "rule_files: [gpulens.rules.yml]\n"
        rules = {"gpulens.rules.yml": rules_with_short_for("GPUAllocatedButIdle")}
        with run_prometheus(config, rules) as prom:
            fired = wait_firing(prom, "GPUAllocatedButIdle", idle_pods)
            # a few more evaluations: busy pods must stay silent
            time.sleep(5)
            fired = firing(prom, "GPUAllocatedButIdle")
            pods = {labels["pod"] for labels in fired}
            assert idle_pods <= pods
            for busy in busy_pods:
                assert not [p for p in pods if p.startswith(busy)], f"{busy} is busy but alerted: {fired}"
            for labels in fired:
                # routing labels from the exporter's allocation series, kept by honor_labels
                assert labels["namespace"] == "notebooks"
                assert labels["workload_kind"] == "StatefulSet"
                assert labels["workload"] and labels["uuid"].startswith("GPU-")
                assert labels["severity"] == "warning"
                if scenario == "mig":
                    assert labels["mig_uuid"].startswith("MIG-") and labels["mig_profile"]
            # the recording rules agree: the notebooks namespace holds idle GPUs
            idle = query(prom, 'namespace:gpulens_gpus_idle:count{namespace="notebooks"}')
            assert idle and float(idle[0]["value"][1]) >= len(idle_pods)


def test_a_dead_exporter_fires_and_shows_on_the_dashboard_whatever_the_job_is_called() -> None:
    """Two simulated exporters under a job that is not called gpulens; one dies. GPUExporterDown
    (scrape_failed) fires for it alone, and the dashboard's Prometheus source names it in its
    banner (a dead target no longer just vanishes)."""
    from contextlib import ExitStack

    from dashboard.sources.prometheus import PrometheusSource

    with ExitStack() as stack:
        alive = stack.enter_context(run_exporter("--sim.scenario", "h200x8", "--no-probes"))
        doomed_stack = ExitStack()
        doomed = doomed_stack.enter_context(run_exporter("--sim.scenario", "timeslice", "--no-probes"))
        targets = [alive.removeprefix("http://"), doomed.removeprefix("http://")]
        config = scrape_config(targets, job="gpu-metrics") + "rule_files: [gpulens.rules.yml]\n"
        rules = {"gpulens.rules.yml": rules_with_short_for("GPUExporterDown")}
        prom = stack.enter_context(run_prometheus(config, rules))
        wait_for_query(prom, "gpulens:exporter_target:info", lambda r: len(r) == 2)
        assert PrometheusSource(prom).problems() == []
        doomed_stack.close()  # the exporter process ends; its target stays in the config
        deadline = time.monotonic() + 90
        fired: list[dict[str, str]] = []
        while time.monotonic() < deadline and not fired:
            fired = [a for a in firing(prom, "GPUExporterDown") if a.get("reason") == "scrape_failed"]
            time.sleep(1.0)
        assert [a["instance"] for a in fired] == [targets[1]], alerts(prom)
        assert fired[0]["job"] == "gpu-metrics"
        problems = PrometheusSource(prom).problems()
        assert len(problems) == 1 and problems[0].startswith(targets[1]), problems
        assert "Prometheus cannot scrape it (job gpu-metrics)" in problems[0]
