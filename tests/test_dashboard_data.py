"""Dashboard data layer: PromQL escaping, both sources' semantics, and the pandas transforms that
turn series into the numbers users read (counts, idle time, wasted GPU-hours and cost)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dashboard import definitions
from dashboard.frames.columns import from_rows
from dashboard.frames.fleet import fleet_counts, holders, idle_allocations, price_for, waste_by_namespace
from dashboard.frames.health import probe_comparison
from dashboard.frames.links import (
    LINK_COUNTERS,
    LINK_INFO,
    LINK_UTILIZATION,
    TRANSFER_CLASS,
    busiest_links,
    busy_but_sm_idle,
    latest,
    leaf_links,
    leaves_in_class,
    link_panels,
    link_table,
    measured_links,
    per_second,
)
from dashboard.frames.series import counter_rate
from dashboard.frames.sharing import mig_layout
from dashboard.promql import label_name, quote, selector
from dashboard.sources.prometheus import PrometheusSource
from dashboard.sources.scrape import ScrapeSource, instance_of, metrics_url, parse_exposition
from dashboard.sources.source import MAX_POINTS, Filters, SourceError, Window, bounded_step
from tests.fixtures.dashboard.fake_prometheus import fake_prometheus
from tests.support.net import free_port

FIX = Path(__file__).parent / "fixtures" / "dashboard"
H200 = (FIX / "h200x8.prom").read_text()
TIMESLICE = (FIX / "timeslice.prom").read_text()


# --- PromQL text -----------------------------------------------------------------------
def test_label_values_cannot_break_out_of_their_quotes() -> None:
    assert quote('a"b') == '"a\\"b"'
    assert quote("a\\b") == '"a\\\\b"'
    assert quote("x\ny") == '"x\\ny"'
    evil = 'prod"} or vector(1) or up{a="'
    sel = selector("gpulens_up", {"namespace": evil})
    assert sel == 'gpulens_up{namespace="prod\\"} or vector(1) or up{a=\\""}'


def test_label_and_metric_names_are_validated_not_quoted() -> None:
    with pytest.raises(ValueError):
        label_name("namespace) or (up")
    with pytest.raises(ValueError):
        selector("gpulens_up{} or vector(1) #", {})


def test_namespace_filter_joins_device_series_on_the_allocation() -> None:
    src = PrometheusSource("http://unused")
    ns = Filters(namespace="ml", cluster="c1")
    leaf = src.expr("gpulens_gpu_sm_active_ratio", ns)
    assert leaf == (
        '(gpulens_gpu_sm_active_ratio{cluster="c1"} and on(uuid,mig_uuid) '
        'gpulens_pod_gpu_allocation{cluster="c1",namespace="ml"})'
    )
    assert "and on(uuid) " in src.expr("gpulens_gpu_power_watts", ns)
    assert src.expr("gpulens_pod_gpu_sm_share_ratio", ns) == (
        'gpulens_pod_gpu_sm_share_ratio{cluster="c1",namespace="ml"}'
    )
    assert src.expr("gpulens_up", ns) == 'gpulens_up{cluster="c1"}'


def test_ranges_are_bounded_in_points_and_length() -> None:
    window, step = bounded_step(90 * 86400, 1)
    assert window == 31 * 86400
    assert window / step <= MAX_POINTS
    assert bounded_step(3600, 15) == (3600, 15)


# --- PrometheusSource over HTTP ----------------------------------------------------------
def test_prometheus_source_reads_instant_and_range_answers() -> None:
    with fake_prometheus("h200x8.prom") as (url, _state):
        src = PrometheusSource(url)
        info = src.instant("gpulens_gpu_info")
        series = src.series("gpulens_gpu_sm_active_ratio", window=Window(30 * 86400), step_s=1)
    assert len(info) == 8
    assert set(info["name"]) == {"NVIDIA H200"}
    assert series.groupby("uuid").size().max() <= MAX_POINTS + 1
    assert {"timestamp", "value", "uuid"} <= set(series.columns)


def test_the_fleet_boundness_mix_reads_the_recorded_per_cluster_sum() -> None:
    """Fleet-wide (or one cluster) the mix over time comes from class:gpulens_gpu_boundness:sum, a
    few series per cluster, not from every leaf's six class series; narrower filters need the raw
    series."""
    with fake_prometheus("h200x8.prom") as (url, state):
        src = PrometheusSource(url)
        for filters in (Filters(), Filters(cluster="prod-a")):
            df = src.series("gpulens_gpu_boundness", filters, window=Window(600), step_s=60, by=["class"])
            assert state.queries[-1].startswith("sum by (class) (class:gpulens_gpu_boundness:sum")
            assert ("cluster" in state.queries[-1]) == (filters.cluster is not None)
            assert set(df["class"]) >= {"compute", "idle"} and len(set(df["class"])) == len(df.groupby("class"))
        for filters in (Filters(node="node-a"), Filters(namespace="ml")):
            src.series("gpulens_gpu_boundness", filters, window=Window(600), step_s=60, by=["class"])
            assert "class:gpulens_gpu_boundness:sum" not in state.queries[-1], filters


def test_prometheus_failures_become_source_errors_with_a_reason() -> None:
    with pytest.raises(SourceError, match="unreachable"):
        PrometheusSource(f"http://127.0.0.1:{free_port()}").instant("gpulens_up")
    with fake_prometheus() as (url, state):
        state.mode = "error"
        with pytest.raises(SourceError, match="parse error"):
            PrometheusSource(url).instant("gpulens_up")
        state.mode, state.delay_s = "slow", 2.0
        slow = PrometheusSource(url, timeout_s=0.3)
        with pytest.raises(SourceError, match=r"did not answer within 0\.3 s"):
            slow.instant("gpulens_up")
        # the page's next queries fail at once with the same reason instead of waiting again
        started = time.perf_counter()
        for _ in range(5):
            with pytest.raises(SourceError, match="did not answer"):
                slow.instant("gpulens_gpu_info")
        assert time.perf_counter() - started < 0.3
        sent = len(state.queries)
        state.mode = "ok"
        slow._down_until = 0.0  # cooldown over
        assert len(slow.instant("gpulens_gpu_info")) == 8
        assert len(state.queries) == sent + 1


# --- ScrapeSource ------------------------------------------------------------------------
class _Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _scraper(pages: dict[str, list[str]], clock: _Clock, history: int = 720) -> ScrapeSource:
    def fetch(url: str) -> str:
        page = pages[url].pop(0) if len(pages[url]) > 1 else pages[url][0]
        if page == "DOWN":
            raise ConnectionError("refused")
        return page

    return ScrapeSource(list(pages), fetch=fetch, clock=clock, history=history, interval_s=1)


def test_target_urls_get_prometheus_style_instance_labels() -> None:
    assert metrics_url("node1:9445") == "http://node1:9445/metrics"
    assert instance_of("http://node1:9445/metrics") == "node1:9445"
    samples = parse_exposition(H200, "node1:9445")
    labels = dict(samples["gpulens_gpu_sm_active_ratio"][0][0])
    assert labels["instance"] == "node1:9445"
    assert "mig_uuid" not in labels, "empty labels are absent, as in Prometheus"


def test_scrape_source_serves_the_newest_scrape_and_keeps_a_bounded_history() -> None:
    clock = _Clock()
    alt = H200.replace('gpulens_up{node="h200x8"} 1.0', 'gpulens_up{node="h200x8"} 0.0')
    assert alt != H200
    src = _scraper({"http://a:1/metrics": [H200, alt, H200]}, clock, history=2)
    src.scrape_once()
    clock.t += 5
    src.scrape_once()
    assert src.instant("gpulens_up")["value"].tolist() == [0.0]
    clock.t += 5
    src.scrape_once()
    assert src.instant("gpulens_up")["value"].tolist() == [1.0]
    series = src.series("gpulens_up", window=Window(60), step_s=5)
    assert len(series) == 2, "only two scrapes are kept"


def test_a_failed_scrape_is_reported_and_its_series_go_stale() -> None:
    clock = _Clock()
    src = _scraper({"http://a:1/metrics": [H200, "DOWN"], "http://b:2/metrics": [TIMESLICE]}, clock)
    src.scrape_once()
    clock.t += 5
    src.scrape_once()
    assert src.problems() and "a:1" in src.problems()[0]
    info = src.instant("gpulens_gpu_info")
    assert set(info["instance"]) == {"b:2"}, "the failed target's series are stale, the other's kept"
    assert len(src.series("gpulens_gpu_info", window=Window(10), step_s=5).query("instance == 'a:1'")) > 0


def test_scrape_source_filters_devices_by_namespace_through_allocations() -> None:
    clock = _Clock()
    src = _scraper({"http://b:2/metrics": [TIMESLICE]}, clock)
    src.scrape_once()
    alloc = src.instant("gpulens_pod_gpu_allocation")
    ns = "notebooks"
    held = set(alloc.loc[alloc["namespace"] == ns, "uuid"])
    sm = src.instant("gpulens_gpu_sm_active_ratio", Filters(namespace=ns))
    assert held and set(sm["uuid"]) == held
    shares = src.instant("gpulens_pod_gpu_sm_share_ratio", Filters(namespace=ns))
    assert set(shares["namespace"]) == {ns}
    assert src.instant("gpulens_gpu_info", Filters(instance="nope")).empty


def test_counter_increase_survives_a_reset() -> None:
    clock = _Clock()
    line = 'gpulens_gpu_xid_errors_total{{gpu="0",uuid="GPU-1",xid="79"}} {v}\n'
    head = "# TYPE gpulens_gpu_xid_errors_total counter\n"
    pages = [head + line.format(v=v) for v in (2, 5, 1, 3)]
    src = _scraper({"http://a:1/metrics": pages}, clock)
    for _ in range(4):
        src.scrape_once()
        clock.t += 10
    inc = src.increase("gpulens_gpu_xid_errors_total", window=Window(3600))
    assert inc["value"].tolist() == [3 + 1 + 2]


# --- transforms --------------------------------------------------------------------------
def _alloc_rows(ts: list[float], pod: str, uuid: str, ns: str = "ml") -> list[dict[str, object]]:
    return [{"namespace": ns, "pod": pod, "container": "c", "uuid": uuid, "timestamp": t, "value": 1.0} for t in ts]


def _idle_rows(verdicts: dict[str, list[bool]], ts: list[float]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"uuid": u, "mig_uuid": "", "timestamp": t, "sm_mean": 0.0, "idle": v}
            for u, vs in verdicts.items()
            for t, v in zip(ts, vs, strict=True)
        ]
    )


def test_wasted_hours_count_idle_steps_split_shared_gpus_and_weigh_mig_slices() -> None:
    ts = [0.0, 900.0, 1800.0, 2700.0]
    alloc = from_rows(
        _alloc_rows(ts, "p1", "GPU-A") + _alloc_rows(ts, "p2", "GPU-B") + _alloc_rows(ts, "p3", "GPU-B", "other"),
        time=True,
    )
    # GPU-C: p4 holds two time-slicing replicas, p5 one; MIG-m: a 3g.71gb instance of GPU-M
    replicas = [
        {"namespace": "ml", "pod": pod, "container": "c", "uuid": "GPU-C", "replica": r, "timestamp": t, "value": 1}
        for pod, r in (("p4", "0"), ("p4", "1"), ("p5", "2"))
        for t in ts
    ]
    mig = [{**r, "mig_uuid": "MIG-m"} for r in _alloc_rows(ts, "p6", "GPU-M")]
    alloc = pd.concat([alloc, from_rows(replicas, time=True), from_rows(mig, time=True)], ignore_index=True).fillna("")
    idle = _idle_rows({"GPU-A": [False, True, True, True], "GPU-B": [True] * 4, "GPU-C": [True] * 4}, ts)
    idle = pd.concat([idle, _idle_rows({"GPU-M": [True] * 4}, ts).assign(mig_uuid="MIG-m")], ignore_index=True)
    info = from_rows([{"uuid": u, "name": "NVIDIA H200", "value": 1} for u in ("GPU-A", "GPU-B", "GPU-C", "GPU-M")])
    mig_info = from_rows([{"uuid": "GPU-M", "mig_uuid": "MIG-m", "mig_profile": "3g.71gb", "value": 1}])
    keys = ("namespace", "pod", "container", "uuid", "mig_uuid")
    act = definitions.wasted_from_series(
        alloc, idle, definitions.gpu_shares(info, mig_info), keys=keys, step_s=900
    ).set_index("pod")
    assert act.loc["p1", "wasted_gpu_hours"] == pytest.approx(3 * 0.25)
    assert act.loc["p2", "wasted_gpu_hours"] == pytest.approx(4 * 0.25 / 2)
    assert act.loc["p4", "wasted_gpu_hours"] == pytest.approx(1.0 * 2 / 3)
    assert act.loc["p5", "wasted_gpu_hours"] == pytest.approx(1.0 / 3)
    assert act.loc["p6", "wasted_gpu_hours"] == pytest.approx(1.0 * 3 / 7)
    assert act.loc["p1", "last_busy"] == 0.0
    assert math.isnan(act.loc["p2", "last_busy"])
    assert act.loc["p1", "first_allocated"] == 0.0


def test_leaf_idle_frame_is_the_rules_definition() -> None:
    """SM mean < 1 % over 5 m and no kernels: GPU-Util >= 5 % or the launch class keep a GPU busy."""
    ts = np.arange(0.0, 601.0, 10.0)

    def raw(metric_rows: list[tuple[str, float]]) -> pd.DataFrame:
        return from_rows([{"uuid": u, "timestamp": t, "value": v} for u, v in metric_rows for t in ts], time=True)

    sm = raw([("GPU-idle", 0.0), ("GPU-busy", 0.5), ("GPU-launch", 0.001), ("GPU-util", 0.002), ("GPU-edge", 0.01)])
    util = raw([("GPU-idle", 0.0), ("GPU-busy", 0.9), ("GPU-launch", 0.0), ("GPU-util", 0.05), ("GPU-edge", 0.0)])
    launch = from_rows(
        [{"uuid": "GPU-launch", "class": "launch", "timestamp": t, "value": 1.0 if t == 500 else 0.0} for t in ts],
        time=True,
    )
    out = definitions.leaf_idle_frame(sm, pd.DataFrame(), util, launch, np.array([600.0]), fresh_s=15.0)
    verdict = dict(zip(out["uuid"], out["idle"], strict=True))
    assert verdict == {
        "GPU-idle": True,
        "GPU-busy": False,
        "GPU-launch": False,  # launch-bound is in use, not idle
        "GPU-util": False,  # GPU-Util at the threshold (inclusive) means kernels ran
        "GPU-edge": False,  # SM active at the threshold is not below it
    }
    # a leaf whose series went stale drops out, as the rules' "and x" makes it
    stale = definitions.leaf_idle_frame(sm, pd.DataFrame(), util, launch, np.array([700.0]), fresh_s=15.0)
    assert stale.empty


def test_idle_allocations_say_who_and_for_how_long() -> None:
    alloc = from_rows(
        [
            {
                "namespace": "ml",
                "pod": "p1",
                "container": "c",
                "uuid": "GPU-A",
                "workload_kind": "Job",
                "workload": "j",
            },
            {"namespace": "ml", "pod": "p2", "container": "c", "uuid": "GPU-B", "value": 1.0},
        ]
    )
    idle_now = from_rows(
        [{"uuid": "GPU-A", "sm_mean": 0.0, "value": 1.0}, {"uuid": "GPU-B", "sm_mean": 0.7, "value": 0.0}]
    )
    act = from_rows(
        [
            {
                "namespace": "ml",
                "pod": "p1",
                "container": "c",
                "uuid": "GPU-A",
                "first_allocated": 0.0,
                "last_busy": 6400.0,
                "value": 0,
            }
        ]
    )
    idle = idle_allocations(alloc, idle_now, act, now=10000.0, window_s=10000.0)
    assert idle["pod"].tolist() == ["p1"]
    assert idle.loc[0, "idle_seconds"] == pytest.approx(3600.0)
    assert idle.loc[0, "workload"] == "Job/j"
    assert not idle.loc[0, "idle_at_least"]


def test_fleet_counts_devices_by_the_one_idle_definition() -> None:
    clock = _Clock()
    src = _scraper({"http://a:1/metrics": [H200]}, clock)
    src.scrape_once()
    counts = fleet_counts(
        src.instant("gpulens_gpu_info"),
        src.instant("gpulens_mig_instance_info"),
        src.instant("gpulens_pod_gpu_allocation"),
        src.leaf_idle(),
    )
    # fixture: GPUs 0-3 run kernels with SMs active; GPU 4 is launch-bound (GPU-Util high, SM ~0):
    # in use, not idle, as in the rules; GPU 6 has SMs 4.7 % active: in use (the old 5 % threshold
    # called it idle); GPU 5 is the one allocated idle device, GPU 7 is unallocated
    assert counts == {"gpus": 8, "devices": 8, "allocated": 7, "in_use": 6, "allocated_idle": 1,
                      "allocated_in_use": 6, "collecting": 0, "unallocated_in_use": 0}  # fmt: skip


def test_waste_by_namespace_sums_wasted_hours_and_prices_them_by_model() -> None:
    act = from_rows(
        [
            {"namespace": "a", "pod": "p1", "uuid": "GPU-1", "wasted_gpu_hours": 2.0, "value": 0},
            {"namespace": "a", "pod": "p2", "uuid": "GPU-2", "mig_uuid": "MIG-x", "wasted_gpu_hours": 3.0, "value": 0},
            {"namespace": "b", "pod": "p3", "uuid": "GPU-3", "wasted_gpu_hours": 1.0, "value": 0},
        ]
    )
    info = from_rows(
        [
            {"uuid": "GPU-1", "name": "NVIDIA H200", "value": 1},
            {"uuid": "GPU-2", "name": "NVIDIA H200", "value": 1},
            {"uuid": "GPU-3", "name": "Tesla T4", "value": 1},
        ]
    )
    waste = waste_by_namespace(act, info, {"H200": 4.0}).set_index("namespace")
    assert waste.loc["a", "gpu_hours"] == pytest.approx(2.0 + 3.0)
    assert waste.loc["a", "cost_usd"] == pytest.approx(20.0)
    assert math.isnan(waste.loc["b", "cost_usd"]), "no price for T4: unknown, not $0"
    assert price_for("NVIDIA A100-SXM4-80GB", {"A100": 1.0, "*": 2.0}) == 1.0
    assert price_for("Tesla T4", {"A100": 1.0, "*": 2.0}) == 2.0


def test_probe_comparison_flags_the_slow_gpu_against_healthy_peers() -> None:
    effs = [0.97, 0.99, 0.98, 0.80]  # GPU-3 exactly at the threshold: slow (inclusive)
    bw = from_rows(
        [{"uuid": f"GPU-{i}", "gpu": str(i), "probe": "hbm_copy", "value": e * 4.2e12} for i, e in enumerate(effs)]
    )
    eff = from_rows([{"uuid": f"GPU-{i}", "gpu": str(i), "probe": "hbm_copy", "value": e} for i, e in enumerate(effs)])
    info = from_rows([{"uuid": f"GPU-{i}", "name": "NVIDIA H200", "value": 1} for i in range(4)])
    out = probe_comparison(eff, bw, info).set_index("uuid")
    # the reference is the healthy peers' median (0.98), not a median over the probed set with itself in it
    assert out.loc["GPU-3", "vs_peers"] == pytest.approx(0.80 / 0.98)
    assert out.loc["GPU-0", "vs_peers"] == pytest.approx(0.97 / 0.985)
    assert out["slow"].tolist() == [True, False, False, False] and out.index[0] == "GPU-3"
    # only the slow GPU probed (the others are busy): no peer to compare with, still slow by efficiency
    alone = probe_comparison(eff[eff["uuid"] == "GPU-3"], bw[bw["uuid"] == "GPU-3"], info)
    assert alone["slow"].tolist() == [True] and math.isnan(alone.loc[0, "vs_peers"])
    # MIG instances are compared with instances of the same profile only
    mig_eff = from_rows(
        [
            {"uuid": "GPU-0", "mig_uuid": "MIG-a", "probe": "hbm_copy", "value": 0.95},
            {"uuid": "GPU-0", "mig_uuid": "MIG-b", "probe": "hbm_copy", "value": 0.70},
            {"uuid": "GPU-1", "mig_uuid": "MIG-c", "probe": "hbm_copy", "value": 0.90},
        ]
    )
    mig_info = from_rows(
        [
            {"uuid": "GPU-0", "mig_uuid": "MIG-a", "mig_profile": "1g.18gb", "value": 1},
            {"uuid": "GPU-0", "mig_uuid": "MIG-b", "mig_profile": "1g.18gb", "value": 1},
            {"uuid": "GPU-1", "mig_uuid": "MIG-c", "mig_profile": "3g.71gb", "value": 1},
        ]
    )
    m = probe_comparison(mig_eff, pd.DataFrame(columns=["value"]), info, mig_info).set_index("mig_uuid")
    assert m.loc["MIG-b", "vs_peers"] == pytest.approx(0.70 / 0.95)
    assert math.isnan(m.loc["MIG-c", "vs_peers"])


def test_mig_layout_lists_every_slice_with_its_holder() -> None:
    text = (FIX / "mig.prom").read_text()
    s = parse_exposition(text, "n:1")

    def df(name: str) -> pd.DataFrame:
        return from_rows({**dict(lbl), "value": v} for lbl, v in s.get(name, []))

    layout = mig_layout(df("gpulens_mig_instance_info"), df("gpulens_pod_gpu_allocation"), df("gpulens_gpu_info"))
    assert len(layout) == len(s["gpulens_mig_instance_info"])
    full = layout[layout["mig_profile"] == "7g.141gb"]
    assert full["slices"].tolist() == [7]
    held = layout[layout["holders"] != ""]
    assert len(held) == len({dict(lbl).get("mig_uuid") for lbl, _ in s["gpulens_pod_gpu_allocation"]} - {None})


def test_nan_values_count_neither_as_busy_nor_as_idle() -> None:
    info = from_rows([{"uuid": u, "value": 1} for u in ("GPU-A", "GPU-B")])
    alloc = from_rows([{"namespace": "n", "pod": "p", "uuid": "GPU-A", "value": 1}])
    ts = np.array([0.0, 10.0, 20.0])
    sm = from_rows(
        [{"uuid": "GPU-A", "timestamp": t, "value": "NaN"} for t in ts]
        + [{"uuid": "GPU-B", "timestamp": t, "value": 0.9} for t in ts],
        time=True,
    )
    verdict = definitions.leaf_idle_frame(sm, pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), ts[-1:], 15.0)
    idle_now = verdict.assign(value=verdict["idle"].astype(float))
    counts = fleet_counts(info, pd.DataFrame(), alloc, idle_now)
    # GPU-A is held with no verdict (no activity to judge by): collecting, so allocated still adds up
    assert counts == {"gpus": 2, "devices": 2, "allocated": 1, "in_use": 1, "allocated_idle": 0,
                      "allocated_in_use": 0, "collecting": 1, "unallocated_in_use": 1}  # fmt: skip
    idle = idle_allocations(alloc, idle_now, pd.DataFrame(), now=0.0, window_s=60.0)
    assert idle.empty


def test_every_device_series_is_placed_on_the_gpu_page_or_left_out_on_purpose() -> None:
    """Each device series of the catalogue (what the GPU page's one query brings) is a line of a
    panel of dashboard/gpu_panels.py's table, or shown elsewhere on the page (the header, a strip,
    the links' section) or left out on purpose (an integral of one that is drawn), never both; a new
    family must be placed before it lands on a chart titled by its name in the "other" section."""
    import re

    from dashboard import gpu_panels
    from dashboard.sources.source import DEVICE_METRICS
    from exporter.render.metrics import CATALOGUE

    placed = gpu_panels.metrics_of()
    device = {
        spec.name
        for spec in CATALOGUE
        if re.fullmatch(DEVICE_METRICS, spec.name)
        and "uuid" in spec.labels
        and not spec.name.startswith("gpulens_pod_")
    }
    unplaced = device - placed - set(gpu_panels.ELSEWHERE)
    assert not unplaced, f"place these on the GPU page (gpu_panels.PANELS) or say where they are: {sorted(unplaced)}"
    assert not placed & set(gpu_panels.ELSEWHERE)
    assert not (placed | set(gpu_panels.ELSEWHERE)) - device, "the table names no family the exporter lacks"
    assert {*LINK_COUNTERS.values(), *LINK_UTILIZATION.values(), LINK_INFO} <= set(gpu_panels.ELSEWHERE)
    assert all(line.words for panel in gpu_panels.PANELS for line in panel.lines), "every line is named in words"


def _link_rows(metric: str, t: list[float], values: list[float], **labels: str) -> pd.DataFrame:
    return pd.DataFrame({"metric": metric, "timestamp": t, "value": values, "uuid": "GPU-1", **labels})


def test_counter_rate_is_per_second_per_series_and_survives_a_reset() -> None:
    df = pd.DataFrame(
        {
            "uuid": ["a", "a", "a", "a", "b", "b"],
            "timestamp": [0.0, 10.0, 20.0, 30.0, 0.0, 5.0],
            "value": [100.0, 300.0, 50.0, 150.0, 0.0, 10.0],
        }
    )
    rates = counter_rate(df)
    by_uuid = {u: g.sort_values("timestamp")["value"].tolist() for u, g in rates.groupby("uuid")}
    assert by_uuid == {"a": [20.0, 5.0, 10.0], "b": [2.0]}, "a drop is a reset: the new value over the gap"
    # over two steps: a scrape read late (the same value twice, then the catch-up) averages out
    late = pd.DataFrame({"timestamp": [0.0, 5.0, 10.0, 15.0, 20.0], "value": [0.0, 50.0, 50.0, 150.0, 200.0]})
    assert counter_rate(late)["value"].tolist() == [10.0, 0.0, 20.0, 10.0]
    assert counter_rate(late, steps=2)["value"].tolist() == [10.0, 5.0, 10.0, 15.0]
    # a counter that starts high (the bytes since the exporter started) starts no window with that count
    steady = pd.DataFrame({"timestamp": [100.0, 104.0, 108.0], "value": [250.0, 450.0, 650.0]})
    assert counter_rate(steady, steps=15)["value"].tolist() == [50.0, 50.0]


def test_gpu_page_links_in_words_throughput_from_the_counters_use_and_capacity() -> None:
    """The links' panel: each way's throughput from the byte counters (rate per step), each link's
    use, and a table with capacity, where the bytes come from and the range's means; a MIG
    instance's lines carry its profile; without counters the sampled throughput stands in."""
    t = [0.0, 10.0, 20.0]
    pcie = {"link": ""}
    series = pd.concat(
        [
            _link_rows("gpulens_gpu_pcie_rx_bytes_total", t, [0.0, 500e9, 1000e9]),
            _link_rows("gpulens_gpu_pcie_tx_bytes_total", t, [0.0, 10e9, 20e9]),
            _link_rows("gpulens_gpu_nvlink_rx_bytes_total", t, [0.0, 0.0, 0.0]),
            _link_rows("gpulens_gpu_pcie_utilization_ratio", t, [0.8, 0.8, 0.78]),
            _link_rows("gpulens_gpu_pcie_capacity_bytes_per_second", t, [63e9] * 3),
            _link_rows("gpulens_gpu_link_info", t, [1.0] * 3, link="pcie", source="counter"),
            _link_rows("gpulens_gpu_link_info", t, [1.0] * 3, link="nvlink", source="gpm"),
            _link_rows("gpulens_gpu_pcie_rx_bytes_per_second", t, [1.0] * 3),  # sampled: not drawn beside counters
            _link_rows(
                "gpulens_gpu_pcie_rx_bytes_total",
                t,
                [0.0, 1e9, 2e9],
                mig_uuid="MIG-abcdefghijkl",
                mig_profile="1g.18gb",
            ),
            _link_rows("gpulens_gpu_power_watts", t, [100.0] * 3, **pcie),
        ],
        ignore_index=True,
    )
    throughput, use = link_panels(series)
    lines = {n: sorted(g["value"]) for n, g in throughput.groupby("series")}
    assert lines == {
        "PCIe in": [50e9, 50e9],
        "PCIe out": [1e9, 1e9],
        "NVLink in": [0.0, 0.0],
        "PCIe in [1g.18gb MIG-abcdefgh]": [1e8, 1e8],
    }
    assert set(use["series"]) == {"PCIe"}
    table = link_table(series).set_index(["device", "link"])
    gpu_pcie = table.loc[("GPU", "PCIe")]
    assert gpu_pcie["capacity_bytes_per_second"] == 63e9
    assert gpu_pcie["measured_by"] == "NVML byte counters"
    assert gpu_pcie["in_bytes_per_second"] == pytest.approx(50e9)
    assert gpu_pcie["out_bytes_per_second"] == pytest.approx(1e9)
    assert gpu_pcie["mean_utilization"] == pytest.approx(0.79333, abs=1e-4)
    assert gpu_pcie["peak_utilization"] == 0.8
    assert table.loc[("GPU", "NVLink")]["measured_by"] == "GPM counters, each cycle"
    assert table.loc[("1g.18gb MIG-abcdefgh", "PCIe")]["in_bytes_per_second"] == pytest.approx(1e8)
    # over a minute's worth of steps where the step is shorter (a late scrape averages out)
    smooth, _use = link_panels(series, steps=2)
    assert sorted(smooth[smooth["series"] == "PCIe in"]["value"]) == [50e9, 50e9]
    # an exporter without the counters: the physical GPU's sampled throughput
    old = series[~series["metric"].str.endswith("_bytes_total")]
    throughput, _use = link_panels(old)
    assert set(throughput["series"]) == {"PCIe in"}
    assert link_panels(pd.DataFrame())[0].empty


def test_fleet_tells_gpus_moving_data_from_launch_bound_ones() -> None:
    """GPU-Util high and SMs idle: a GPU in class transfer is moving data and is left out of the
    launch-bound-or-polling list, with its links' use and throughput; the others stay in it."""
    classes = pd.DataFrame(
        {
            "uuid": ["GPU-0", "GPU-1", "GPU-2"],
            "gpu": ["0", "1", "2"],
            "node": "n",
            "class": ["transfer", "launch", "compute"],
            "value": 1.0,
        }
    )
    util = pd.DataFrame({"uuid": ["GPU-0", "GPU-1", "GPU-2"], "gpu": ["0", "1", "2"], "node": "n", "value": 1.0})
    idle = pd.DataFrame({"uuid": ["GPU-0", "GPU-1", "GPU-2"], "mig_uuid": "", "sm_mean": [0.0, 0.002, 0.9]})
    moving = leaves_in_class(classes, TRANSFER_CLASS)
    assert moving["uuid"].tolist() == ["GPU-0"]
    lie = busy_but_sm_idle(util, idle, moving)
    assert lie["uuid"].tolist() == ["GPU-1"], "the transfer-bound GPU is not called launch-bound"
    moved = pd.DataFrame({"uuid": ["GPU-0"], "value": [51.5e9 * 300]})
    links = leaf_links(
        moving,
        {"pcie": pd.DataFrame({"uuid": ["GPU-0"], "mig_uuid": "", "value": [0.82]})},
        {("pcie", "rx"): per_second(moved, 300.0)},
    )
    row = links.iloc[0]
    assert row["pcie"] == 0.82 and row["pcie_in_bytes_per_second"] == pytest.approx(51.5e9)
    assert math.isnan(row["nvlink"])
    shown = measured_links(links)
    assert "pcie" in shown.columns and "nvlink" not in shown.columns, "a link nothing measured is left out"


def test_a_rate_spans_a_step_or_a_minute_whichever_is_longer() -> None:
    from dashboard.sources.source import rate_steps

    assert [rate_steps(s) for s in (1.0, 4.0, 15.0, 60.0, 360.0)] == [60, 15, 4, 1, 1]


def test_latest_keeps_each_series_newest_point() -> None:
    df = pd.DataFrame({"uuid": ["a", "a", "b"], "timestamp": [20.0, 10.0, 5.0], "value": [2.0, 1.0, 7.0]})
    assert latest(df).sort_values("uuid").to_dict("list") == {"uuid": ["a", "b"], "value": [2.0, 7.0]}


def test_busiest_links_draw_the_top_devices_that_moved_data() -> None:
    rows = [
        {"node": "n", "gpu": str(g), "uuid": f"GPU-{g}", "timestamp": t, "value": level}
        for g, level in ((0, 0.8), (1, 0.3), (2, 0.001), (3, 0.5))
        for t in (0.0, 10.0)
    ]
    lines = busiest_links(pd.DataFrame(rows), top=2, at_least=0.01)
    assert list(dict.fromkeys(lines["series"])) == ["n GPU 0", "n GPU 3"]
    assert busiest_links(pd.DataFrame(rows), top=8, at_least=0.9).empty


def test_both_sources_give_a_counter_rate_summed_as_asked() -> None:
    """rate(): Prometheus sums per-series rates over at least a minute (never one scrape) in the
    store; the scrape source takes each series' rate between steps, then sums."""
    with fake_prometheus("h200x8.prom") as (url, state):
        src = PrometheusSource(url)
        src.rate("gpulens_gpu_pcie_rx_bytes_total", window=Window(900), step_s=4, by=[])
        assert state.queries[-1] == (
            "sum by () ((rate(gpulens_gpu_pcie_rx_bytes_total[60s]) and gpulens_gpu_pcie_rx_bytes_total offset 60s))"
        ), "a window of a minute at least, and only over series that old (no ramp up from 0)"
        src.rate("gpulens_gpu_pcie_rx_bytes_total", Filters(namespace="ml"), window=Window(86400), step_s=360)
        assert state.queries[-1] == (
            "((rate(gpulens_gpu_pcie_rx_bytes_total[360s]) and on(uuid,mig_uuid) "
            'gpulens_pod_gpu_allocation{namespace="ml"}) and gpulens_gpu_pcie_rx_bytes_total offset 360s)'
        )
    clock = _Clock()
    head = "# TYPE gpulens_gpu_pcie_rx_bytes_total counter\n"
    line = 'gpulens_gpu_pcie_rx_bytes_total{{gpu="{g}",uuid="GPU-{g}"}} {v}\n'
    pages = [head + line.format(g=0, v=a) + line.format(g=1, v=b) for a, b in ((0, 0), (50, 10), (100, 5))]
    scrape = _scraper({"http://a:1/metrics": pages}, clock)
    for _ in range(3):
        scrape.scrape_once()
        clock.t += 5
    clock.t -= 5
    total = scrape.rate("gpulens_gpu_pcie_rx_bytes_total", window=Window(10), step_s=5, by=[])
    # over a minute at least, as Prometheus: at the 2nd scrape GPU 0 moved 10/s and GPU 1 2/s; at the 3rd,
    # over both steps, GPU 0 100 in 10 s and GPU 1 10 + 5 (a reset: its new value) in 10 s
    assert total.sort_values("timestamp")["value"].tolist() == [12.0, 11.5]


def test_events_count_the_first_event_that_creates_a_counter_as_the_alert_does() -> None:
    """An Xid counter is created by its first event: ``increase`` cannot see that one, ``events``
    (dashboard/definitions.py's counter_events_promql in scrape mode) does, but only for a target
    that was scraped at the window's start (a target first seen inside the window does not count
    its whole history), as the alert's ``up offset`` does."""
    clock = _Clock()
    head = "# TYPE gpulens_up gauge\ngpulens_up 1.0\n# TYPE gpulens_gpu_xid_errors_total counter\n"
    xid = 'gpulens_gpu_xid_errors_total{{gpu="0",uuid="GPU-1",xid="{code}"}} {v}\n'
    before = head + xid.format(code="31", v=2)
    after = head + xid.format(code="31", v=5) + xid.format(code="79", v=1)
    a = [before] * 5 + [after] * 2  # Xid 31 twice before the window, 3 more and Xid 79's first in it
    b = ["DOWN"] * 5 + [head + xid.format(code="13", v=4)] * 2  # first answers inside the window
    src = _scraper({"http://a:1/metrics": a, "http://b:2/metrics": b}, clock)
    for _ in range(7):
        src.scrape_once()
        clock.t += 60
    clock.t -= 60
    ev = src.events("gpulens_gpu_xid_errors_total", window=Window(300)).set_index("xid")["value"]
    inc = src.increase("gpulens_gpu_xid_errors_total", window=Window(300)).set_index("xid")["value"]
    assert inc["79"] == 0 and ev["79"] == 1, "the first event counts"
    assert ev["31"] == inc["31"] == 3, "an old counter grows as increase() says"
    assert ev["13"] == 0, "a target first scraped inside the window: its history is not counted"


def test_holders_name_each_leafs_pods_once_sorted() -> None:
    """Per leaf (a whole GPU, or each MIG instance of one on its own) the pods holding it as
    ``namespace/pod``, each once (two containers of a pod hold it twice), sorted; none: no row."""
    alloc = pd.DataFrame(
        {
            "uuid": ["GPU-a", "GPU-a", "GPU-a", "GPU-m", "GPU-m"],
            "mig_uuid": ["", "", "", "MIG-1", "MIG-2"],
            "namespace": ["web", "ml", "ml", "ml", "ml"],
            "pod": ["w-0", "t-1", "t-1", "m-0", "m-1"],
            "value": [1.0] * 5,
        }
    )
    got = holders(alloc)
    assert list(got.columns) == ["uuid", "mig_uuid", "holders"]
    assert {(u, m): h for u, m, h in got.itertuples(index=False)} == {
        ("GPU-a", ""): "ml/t-1, web/w-0",
        ("GPU-m", "MIG-1"): "ml/m-0",
        ("GPU-m", "MIG-2"): "ml/m-1",
    }
    assert holders(alloc.iloc[0:0]).empty
    no_mig = holders(alloc.drop(columns=["mig_uuid"]).iloc[:1])  # a store answer without the label
    assert no_mig.to_dict("records") == [{"uuid": "GPU-a", "mig_uuid": "", "holders": "web/w-0"}]
