"""Figures are pure DataFrame -> plotly functions: what a user sees on each chart, and the
"no data" figure when there is nothing to show; plus the CLI and settings users type."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import pytest

from dashboard import figures, frames
from dashboard.cli import build_parser, settings_from_args, streamlit_argv
from dashboard.settings import DashboardSettings, from_env, parse_prices, to_env


def _points() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "instance": ["n1:9445"] * 3,
            "gpu": ["0", "1", "2"],
            "uuid": ["GPU-a", "GPU-b", "GPU-c"],
            "mig_uuid": ["", "", ""],
            "dram_active": [0.88, 0.17, 0.0],
            "pipe_active": [0.0, 0.93, 0.0],
            "class": ["memory", "compute", "idle"],
            "holders": ["ml/train-0", "ml/train-1", "(unallocated)"],
        }
    )


def test_roofline_colours_points_by_class_and_shows_pods_on_hover() -> None:
    fig = figures.roofline_scatter(_points())
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {"memory", "compute", "idle"}
    assert by_name["memory"].marker.color == figures.CLASS_COLORS["memory"]
    assert list(by_name["memory"].x) == [0.88]
    assert "ml/train-1" in str(by_name["compute"].customdata)
    assert fig.layout.xaxis.range == (-0.02, 1.02)


def test_empty_frames_give_a_figure_that_says_no_data() -> None:
    for build in (
        figures.roofline_scatter,
        figures.boundness_area,
        figures.waste_bar,
        figures.sm_heatmap,
    ):
        fig = build(pd.DataFrame(columns=["value"]))
        assert isinstance(fig, go.Figure)
        assert fig.layout.annotations[0].text == "no data"
        assert not fig.data


def test_boundness_area_stacks_one_trace_per_class() -> None:
    df = pd.DataFrame(
        {"class": ["idle", "memory", "idle", "memory"], "timestamp": [0, 0, 60, 60], "value": [3, 5, 2, 6]}
    )
    fig = figures.boundness_area(df)
    assert [t.name for t in fig.data] == ["idle", "memory"]
    assert fig.data[1].line.color == figures.CLASS_COLORS["memory"]


def test_sm_heatmap_has_a_row_per_node_and_a_column_per_gpu() -> None:
    df = pd.DataFrame(
        {"instance": ["a:1", "a:1", "b:1"], "gpu": ["0", "1", "0"], "value": [0.5, 0.9, 0.1], "uuid": ["x", "y", "z"]}
    )
    fig = figures.sm_heatmap(df)
    hm = fig.data[0]
    assert list(hm.y) == ["a:1", "b:1"]
    assert list(hm.x) == ["GPU 0", "GPU 1"]
    assert hm.z[0][1] == 0.9
    assert pd.isna(hm.z[1][1]), "a missing GPU stays blank, not 0"


def test_mig_layout_draws_each_slice_with_its_holder() -> None:
    layout = pd.DataFrame(
        {
            "instance": ["n"] * 2,
            "gpu": ["0", "0"],
            "uuid": ["GPU-a"] * 2,
            "gpu_name": ["NVIDIA H200"] * 2,
            "mig_uuid": ["MIG-1", "MIG-2"],
            "mig_profile": ["4g.71gb", "3g.71gb"],
            "gpu_instance_id": [1, 2],
            "slices": [4, 3],
            "holders": ["ml/a", ""],
        }
    )
    fig = figures.mig_layout_figure(layout)
    assert [t.x[0] for t in fig.data] == [4, 3]
    assert "ml/a" in fig.data[0].text[0]
    assert "free" in fig.data[1].text[0]
    assert fig.data[0].marker.color != fig.data[1].marker.color


def test_waste_bar_and_sm_share_and_probe_charts() -> None:
    waste = pd.DataFrame(
        {"namespace": ["a", "b"], "gpu_hours": [5.0, 1.0], "cost_usd": [20.0, float("nan")], "pods": [2, 1]}
    )
    fig = figures.waste_bar(waste)
    assert list(fig.data[0].y) == [5.0, 1.0]
    assert "no price" in str(fig.data[0].customdata)
    shares = frames.timeslice_shares(
        pd.DataFrame({"uuid": ["G", "G"], "namespace": ["n", "n"], "pod": ["p", "q"], "value": [0.3, 0.5]}),
        pd.DataFrame({"uuid": ["G"], "value": [4.0]}),
        pd.DataFrame({"uuid": ["G"], "value": [2.0]}),
    )
    bar = figures.sm_share_bar(shares)
    assert sorted(t.name for t in bar.data) == ["n/p", "n/q"]
    probes = pd.DataFrame(
        {
            "instance": ["n"],
            "gpu": ["7"],
            "uuid": ["G"],
            "model": ["H200"],
            "probe": ["hbm_copy"],
            "bandwidth": [3e12],
            "efficiency": [0.75],
            "vs_peers": [0.8],
        }
    )
    pf = figures.probe_efficiency_bar(probes)
    assert list(pf.data[0].y) == [0.75]
    assert pf.layout.shapes[0].y0 == 1.0


def test_prices_parse_and_reject_garbage() -> None:
    assert parse_prices("H200=3.5, A100=1.2,*=2") == {"H200": 3.5, "A100": 1.2, "*": 2.0}
    for bad in ("H200", "H200=cheap", "=3", "H200=-1"):
        with pytest.raises(ValueError):
            parse_prices(bad)


def test_cli_settings_reach_the_app_through_the_environment() -> None:
    args = build_parser().parse_args(
        ["--prometheus", "http://prom:9090", "--price-per-gpu-hour", "H200=3.5", "--refresh", "15"]
    )
    cfg = settings_from_args(args)
    assert from_env(to_env(cfg)) == DashboardSettings(
        prometheus_url="http://prom:9090",
        prices_per_gpu_hour={"H200": 3.5},
        refresh_seconds=15.0,
    )
    scrape = settings_from_args(build_parser().parse_args(["--scrape", "a:9445, b:9445"]))
    assert scrape.scrape_urls == ("a:9445", "b:9445")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--prometheus", "x", "--scrape", "y"])
    with pytest.raises(ValueError):
        settings_from_args(build_parser().parse_args(["--scrape", "a", "--refresh", "-1"]))
    # one idle definition for rules, dashboard and advisor: no flag to move the dashboard's alone
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--scrape", "a", "--busy-threshold", "0.1"])
    argv = streamlit_argv("127.0.0.1", 8600)
    assert "--server.headless=true" in argv and "--browser.gatherUsageStats=false" in argv
    assert "--server.port=8600" in argv


def test_gpu_page_lines_and_strips_name_even_a_single_series() -> None:
    lines = pd.DataFrame({"timestamp": [0.0, 60.0, 0.0, 60.0], "series": ["a", "a", "b", "b"], "value": [1, 2, 3, 4]})
    fig = figures.time_lines(lines, "watts")
    assert [t.name for t in fig.data] == ["a", "b"]
    assert list(fig.data[1].y) == [3, 4]
    one = figures.time_lines(lines[lines["series"] == "a"], "ratio")
    assert one.layout.showlegend is True, "one line still says what it is"
    assert one.layout.yaxis.tickformat == ".0%"
    strip = figures.state_strip(
        pd.DataFrame({"timestamp": [0.0, 60.0], "leaf": ["GPU", "GPU"], "class": ["memory", "memory"]}), "class"
    )
    assert [t.name for t in strip.data] == ["memory"]
    assert strip.data[0].marker.color == figures.CLASS_COLORS["memory"]
    assert strip.layout.showlegend is True


def test_roofline_points_carry_uuid_and_mig_uuid_first_for_the_click() -> None:
    fig = figures.roofline_scatter(_points())
    for trace in fig.data:
        for row in trace.customdata:
            assert str(row[0]).startswith("GPU-") or row[0] == ""
    assert fig.layout.showlegend is True
