"""GPUs handed out through DRA ResourceClaims read exactly as the same GPUs from the device plugin.

The simulator's ``dra`` node hands its GPUs out through ResourceClaims (a whole GPU, one claim
shared by two pods, MIG instances, one published without a UUID, an idle claimed GPU, a
ComputeDomain channel beside a GPU); its twin ``dra-plugin`` gives the same pods the same GPUs
through the device plugin (replicas for the shared one), with the same processes and the same
noise.  One history of each, scraped SCRAPES times SAMPLE s apart, then every reader (one store
per route: the twins' GPUs have the same UUIDs, which the rules join on):

- the recording rules, recorded by ``promtool tsdb create-blocks-from rules`` on Prometheus:
  allocation, idle, holding share, waste and the per-namespace records are equal on both routes;
- the dashboard's source in Prometheus mode and in scrape mode (fed the same pages): each
  allocated device's activity and wasted GPU-hours, the per-namespace waste and the idle verdict
  per leaf are equal on both routes;
- and the exporter itself: allocation series carry the claim's labels only on the claims route,
  the shared claim reads ``time-slicing``, the channel is left out and counted.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from dashboard.frames.fleet import waste_by_namespace
from dashboard.sources.prometheus import PrometheusSource
from dashboard.sources.scrape import ScrapeSource
from dashboard.sources.source import Filters, Window
from tests.support.om_history import LABEL, without_integrals, write_history
from tests.support.prometheus import backfill_recording_rules, inline_records, rule_expressions, run_prometheus
from tests.support.prometheus import query as prom_query
from tests.support.sim_exposition import render_cycles

pytestmark = pytest.mark.integration

ROUTES = {"claims": "dra", "plugin": "dra-plugin"}
"""Route -> the simulator scenario that hands the GPUs out that way."""
SCRAPES = 40
SAMPLE = 15.0
"""History: SCRAPES scrapes of each node stamped SAMPLE s apart (10 minutes), one cycle each."""
RECORDS = (
    "gpulens:gpu_idle:bool",
    "gpulens:leaf_gpu_share:ratio",
    "gpulens:pod_gpu_idle:bool",
    "gpulens:pod_gpu_holding:ratio",
    "gpulens:pod_gpu_wasted:gpus",
    "gpulens:gpu_holder:info",
    "gpulens:pod_gpu_boundness:class",
    "namespace:gpulens_gpus_allocated:count",
    "namespace:gpulens_gpus_busy:count",
    "namespace:gpulens_gpus_idle:count",
    "namespace:gpulens_gpu_wasted_hours:sum1h",
)
"""The records of allocation, idle, waste and per namespace (and what they read)."""
ROUTE_LABELS = ("cluster", "resource", "replica", "claim_namespace", "claim_name", "driver", "pool", "device")
"""Labels that say which route a device came by; everything else must match."""


@dataclass(frozen=True)
class History:
    om: dict[str, Path]
    """Route -> its OpenMetrics history."""
    pages: dict[str, list[str]]
    times: list[float]
    scrape: dict[str, ScrapeSource]
    """Route -> a scrape-mode source fed its pages."""


def _scraped(texts: list[str], times: list[float]) -> ScrapeSource:
    """A scrape-mode source that read ``texts`` one by one at ``times``."""
    at = [0]
    source = ScrapeSource(["http://node-1:9445/metrics"], interval_s=SAMPLE, history=SCRAPES + 1,
                          fetch=lambda url: texts[at[0]], clock=lambda: times[min(at[0], SCRAPES - 1)])  # fmt: skip
    for k in range(SCRAPES):
        at[0] = k
        source.scrape_once()
    return source


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    tmp = tmp_path_factory.mktemp("dra")
    end = math.floor(time.time() / 60) * 60 - 3600.0
    t0 = end - (SCRAPES - 1) * SAMPLE - 7.0
    times = [t0 + k * SAMPLE for k in range(SCRAPES)]
    # one node seen through two routes: both exporters name it alike (the scenario names differ)
    same_node = ("--kubernetes.node-name", "dra-node-1")
    pages = {
        route: [without_integrals(p) for p in render_cycles(scenario, SCRAPES, volatile="0", args=same_node)]
        for route, scenario in ROUTES.items()
    }
    om: dict[str, Path] = {}
    scrape: dict[str, ScrapeSource] = {}
    target = {"cluster": "c1", "instance": "node-1:9445", "job": "gpulens", "node": "node-1"}
    for route, texts in pages.items():
        om[route] = tmp / f"{route}.om"
        write_history(om[route], [(target, texts)], times)
        scrape[route] = _scraped(texts, times)
    return History(om, pages, times, scrape)


@pytest.fixture(scope="module")
def prometheus(history: History, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Route -> a Prometheus over its history with the records written by promtool, as one that
    had the rules loaded all along would hold them."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: run the README test command (scripts/test.sh)"
    config = "global: {scrape_interval: 1m}\nscrape_configs: []\n"
    with ExitStack() as es:
        bases: dict[str, str] = {}
        for route, om in history.om.items():
            tmp = tmp_path_factory.mktemp(f"dra-{route}")
            data = tmp / "data"
            subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)], check=True,
                           stdout=subprocess.DEVNULL)  # fmt: skip
            backfill_recording_rules(data, history.times[0] - 60.0, history.times[-1], tmp, RECORDS)
            args = ["--storage.tsdb.retention.time=30d"]
            bases[route] = es.enter_context(run_prometheus(config, storage_dir=str(data), extra_args=args))
        yield bases


def _at(history: History) -> float:
    """T: the last whole minute of the history (a rule evaluation)."""
    return math.floor(history.times[-1] / 60) * 60


def _key(metric: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in metric.items() if k not in ROUTE_LABELS))


def _by_route(bases: dict[str, str], expr: str, at: float) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    return {
        route: {_key(r["metric"]): float(r["value"][1]) for r in prom_query(base, expr, at=at)}
        for route, base in bases.items()
    }


@pytest.mark.parametrize("record", RECORDS)
def test_the_records_are_the_same_on_both_routes(prometheus: dict[str, str], history: History, record: str) -> None:
    """Each record as recorded (the same series on both routes) and as its rule computes it at T
    from raw series (the same values: promtool evaluates each pass at its own offset from the
    minute, so recorded samples of records that read records are not comparable value by value)."""
    at = _at(history)
    recorded = _by_route(prometheus, record, at)
    assert recorded["plugin"], f"{record} recorded nothing: the comparison would be empty"
    assert set(recorded["claims"]) == set(recorded["plugin"]), record
    exprs = rule_expressions()
    got = _by_route(prometheus, inline_records(exprs[record], exprs), at)
    assert got["plugin"], f"{record}'s rule gives nothing at T"
    assert got["claims"] == pytest.approx(got["plugin"], abs=1e-9), record


def test_the_history_has_waste_idle_and_busy_to_compare(prometheus: dict[str, str], history: History) -> None:
    """The comparison means something: the node wastes, idles and works, in several namespaces."""
    at = _at(history)
    wasted = _by_route(prometheus, "namespace:gpulens_gpu_wasted_hours:sum1h > 0", at)["claims"]
    assert {dict(k)["namespace"] for k in wasted} >= {"research", "notebooks"}
    busy = _by_route(prometheus, "namespace:gpulens_gpus_busy:count", at)["claims"]
    assert {dict(k)["namespace"] for k in busy} >= {"ml-training", "inference"}
    allocated = _by_route(prometheus, "sum(namespace:gpulens_gpus_allocated:count)", at)
    # GPU 0, 1, 2, three MIG instances of GPU 3, 4 and 5: eight leaves on either route
    assert allocated["claims"] == allocated["plugin"] == {(): 8.0}


def _activity(frame: pd.DataFrame) -> list[dict[str, Any]]:
    keep = [c for c in frame.columns if c not in ROUTE_LABELS and c != "instance"]
    rows = frame[keep].sort_values(["namespace", "pod", "container", "uuid", "mig_uuid"]).to_dict("records")
    return [{k: _plain(v) for k, v in r.items()} for r in rows]


def _plain(value: Any) -> Any:
    """A cell as a comparable value: NaN as ``None`` (NaN equals nothing), floats to 1e-9."""
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 9)
    return value


def _leaf_idle(frame: pd.DataFrame) -> list[tuple[str, str, float]]:
    return sorted((str(r["uuid"]), str(r["mig_uuid"]), float(r["value"])) for r in frame.to_dict("records"))


@pytest.mark.parametrize("mode", ["prometheus", "scrape"])
def test_the_dashboard_source_reads_the_same_on_both_routes(
    prometheus: dict[str, str], history: History, mode: str
) -> None:
    at = _at(history) if mode == "prometheus" else history.times[-1]
    sources: dict[str, Any] = {
        route: PrometheusSource(prometheus[route]) if mode == "prometheus" else history.scrape[route]
        for route in ROUTES
    }
    step = 60.0 if mode == "prometheus" else SAMPLE
    activity = {
        route: source.allocation_activity(Filters(), window=Window(300.0), step_s=step, end=at)
        for route, source in sources.items()
    }
    assert len(activity["plugin"]) == 9  # nine (pod, leaf) allocations: the shared GPU's two pods
    assert _activity(activity["claims"]) == _activity(activity["plugin"])
    assert activity["claims"]["wasted_gpu_hours"].astype(float).sum() > 0
    info = sources["plugin"].current_state("gpulens_gpu_info", end=at)
    waste = {route: waste_by_namespace(a, info, {}) for route, a in activity.items()}
    pd.testing.assert_frame_equal(
        waste["claims"].reset_index(drop=True), waste["plugin"].reset_index(drop=True), check_exact=False, atol=1e-9
    )
    idle = {route: _leaf_idle(source.leaf_idle(Filters(), end=at)) for route, source in sources.items()}
    assert idle["claims"] == idle["plugin"] and len(idle["plugin"]) == 11  # 7 whole GPUs, GPU 3's 4 instances


def _series(text: str, name: str) -> list[dict[str, str]]:
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            out.append(dict(LABEL.findall(line)))
    return out


def test_the_exporter_says_which_claim_each_device_came_through(history: History) -> None:
    claims, plugin = history.pages["claims"][-1], history.pages["plugin"][-1]
    claimed = _series(claims, "gpulens_pod_gpu_allocation")
    assert {a["driver"] for a in claimed} == {"", "gpu.nvidia.com"}
    shared = [a for a in claimed if a["claim_name"] == "team-shared-gpu"]
    assert {(a["claim_namespace"], a["device"], a["pool"], a["resource"]) for a in shared} == {
        ("notebooks", "gpu-2", "dra-node-1", "gpu.nvidia.com")
    }
    assert len({a["pod"] for a in shared}) == 2
    # the MIG device published without a UUID is the one 2g.35gb instance of its parent
    reranker = next(a for a in claimed if a["device"] == "gpu-3-mig-2g35gb-4")
    assert reranker["mig_uuid"].startswith("MIG-") and reranker["pod"].startswith("reranker-")
    # device-plugin pods keep their series as they were: the five claim labels empty
    for a in _series(plugin, "gpulens_pod_gpu_allocation"):
        assert (a["claim_namespace"], a["claim_name"], a["driver"], a["pool"], a["device"]) == ("",) * 5
    # the claim shared by two pods is time-sliced, as the twin's two replicas are
    for text in (claims, plugin):
        modes = {s["gpu"]: s["mode"] for s in _series(text, "gpulens_gpu_sharing_info") if s["gpu"] == "2"}
        assert modes == {"2": "time-slicing"}
        assert re.search(r'^gpulens_gpu_sharing_pods\{[^}]*\buuid="', text, re.M)
    ignored = _series(claims, "gpulens_pod_claim_devices_ignored")
    assert ignored == [{"driver": "compute-domain.nvidia.com", "node": "dra-node-1"}], ignored
    assert 'gpulens_pod_claim_devices_ignored{driver="compute-domain.nvidia.com",node="dra-node-1"} 1.0' in claims
    assert "gpulens_pod_claim_devices_ignored{" not in plugin
    assert re.search(r'^gpulens_stage_success\{[^}]*stage="resourceslices"\} 1\.0$', claims, re.M)
    assert "gpulens_unmapped_devices_total{" not in claims
