"""Charts are pure DataFrame -> Vega-Lite spec functions: what a user sees on each chart, what a
click on it carries, and the "no data" chart when there is nothing to show; plus the CLI and
settings users type."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
import pytest

from dashboard.cli import build_parser, settings_from_args, streamlit_argv
from dashboard.figures.activity import FREE, sm_heatmap, sm_histogram
from dashboard.figures.health import probe_efficiency_bar
from dashboard.figures.palette import CLASS_COLORS, CLASS_ORDER
from dashboard.figures.roofline import roofline_density, roofline_scatter
from dashboard.figures.sharing import kernel_time_bar, mig_layout_figure
from dashboard.figures.timelines import boundness_area, state_spans, state_strip, time_lines
from dashboard.figures.vega import PICK, Chart, data_of, rows
from dashboard.figures.waste import savings_bar, waste_bar
from dashboard.frames.links import outbound
from dashboard.frames.sharing import timeslice_shares
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


def _layer(chart: Chart, mark: str) -> dict[str, Any]:
    """The layer of ``chart`` (or the chart itself) that draws ``mark``."""
    for layer in chart.get("layer", [chart]):
        kind = layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"]
        if kind == mark:
            return dict(layer)
    raise AssertionError(f"no {mark} layer")


def _colours(encoding: dict[str, Any]) -> dict[str, str]:
    scale = encoding["color"]["scale"]
    return dict(zip(scale["domain"], scale["range"], strict=True))


def test_roofline_colours_points_by_class_and_shows_pods_on_hover() -> None:
    chart = roofline_scatter(_points())
    points = _layer(chart, "point")
    assert _colours(points["encoding"]) == {c: CLASS_COLORS[c] for c in ("idle", "memory", "compute")}
    data = {r["class"]: r for r in data_of(chart)}
    assert data["memory"]["dram_active"] == 0.88
    assert data["compute"]["holders"] == "ml/train-1"
    assert "holders" in [t["field"] for t in points["encoding"]["tooltip"]]
    assert points["encoding"]["x"]["scale"]["domain"] == [0, 1]
    json.dumps(chart)  # what Streamlit sends the browser


def test_empty_frames_give_a_chart_that_says_no_data() -> None:
    for build in (roofline_scatter, boundness_area, waste_bar, sm_heatmap):
        chart = build(pd.DataFrame(columns=["value"]))
        assert chart["mark"]["type"] == "text"
        assert data_of(chart) == [{"message": "no data"}]


def test_boundness_area_stacks_one_area_per_class_in_the_class_colours() -> None:
    df = pd.DataFrame(
        {"class": ["idle", "memory", "idle", "memory"], "timestamp": [0, 0, 60, 60], "value": [3, 5, 2, 6]}
    )
    chart = boundness_area(df)
    assert chart["encoding"]["y"]["stack"] == "zero"
    assert _colours(chart["encoding"]) == {
        "idle": CLASS_COLORS["idle"],
        "memory": CLASS_COLORS["memory"],
    }
    assert [r["t"] for r in data_of(chart)] == [0, 0, 60_000, 60_000], "epoch milliseconds"
    assert chart["encoding"]["x"]["scale"] == {"type": "utc"}


def test_every_class_has_its_own_colour_and_place_transfer_included() -> None:
    """Every class the exporter can report (leaf and pod) has a colour of its own, in the order the
    exporter renders them; ``transfer`` (links busy, SMs idle) is drawn in its colour, not the
    fallback grey, on the boundness chart, the roofline and the GPU page's strip."""
    from exporter.model import POD_BOUNDNESS_CLASSES

    assert CLASS_ORDER[: len(POD_BOUNDNESS_CLASSES)] == list(POD_BOUNDNESS_CLASSES)
    assert set(CLASS_ORDER) == set(CLASS_COLORS)
    assert len(set(CLASS_COLORS.values())) == len(CLASS_COLORS), "no two classes share a colour"
    df = pd.DataFrame({"class": ["transfer", "launch"], "timestamp": [0, 0], "value": [1, 2]})
    assert _colours(boundness_area(df)["encoding"])["transfer"] == CLASS_COLORS["transfer"]
    strip = state_strip(pd.DataFrame({"timestamp": [0], "leaf": ["GPU"], "class": ["transfer"]}), "class")
    assert _colours(strip["encoding"]) == {"transfer": CLASS_COLORS["transfer"]}
    points = _points().assign(**{"class": ["transfer", "compute", "idle"]})
    roofline = _layer(roofline_scatter(points), "point")
    assert _colours(roofline["encoding"])["transfer"] == CLASS_COLORS["transfer"]


def test_link_use_lines_span_0_to_100_percent_and_throughput_reads_gb_per_second() -> None:
    df = pd.DataFrame({"timestamp": [0, 10], "series": ["PCIe", "PCIe"], "value": [0.02, 0.03]})
    use = time_lines(df, "ratio", full_scale=True)
    assert use["encoding"]["y"]["scale"] == {"domain": [0, 1]}, "a link 3 % busy does not fill the chart"
    assert "scale" not in time_lines(df, "ratio")["encoding"]["y"]
    rate = pd.DataFrame({"timestamp": [0, 10], "series": ["PCIe in", "PCIe in"], "value": [51.5e9, 50e9]})
    chart = time_lines(rate, "bytes_per_second")
    assert chart["encoding"]["y"]["title"] == "GB/s"
    assert [r["value"] for r in data_of(chart)] == [51.5, 50.0]
    assert "strokeDash" not in chart["encoding"]


def test_a_links_outbound_lines_are_dashed_and_long_legends_get_rows_of_their_own() -> None:
    """NVLink in and out carry the same bytes across a node: the out line is dashed so the in
    line does not hide it; a legend of more names than columns adds height for its rows."""
    names = ["PCIe in", "PCIe out", "NVLink in", "NVLink out", "PCIe out [1g.18gb MIG-abcdefgh]"]
    df = pd.DataFrame({"timestamp": [0] * 5, "series": names, "value": [1.0] * 5})
    assert outbound(df) == ["PCIe out", "NVLink out", "PCIe out [1g.18gb MIG-abcdefgh]"]
    chart = time_lines(df, "bytes_per_second", legend_columns=2, dashed=outbound(df))
    dash = chart["encoding"]["strokeDash"]
    assert dash["field"] == chart["encoding"]["color"]["field"], "one legend for colour and dash"
    assert dict(zip(dash["scale"]["domain"], map(tuple, dash["scale"]["range"]), strict=True)) == {
        "PCIe in": (1, 0),
        "PCIe out": (5, 3),
        "NVLink in": (1, 0),
        "NVLink out": (5, 3),
        "PCIe out [1g.18gb MIG-abcdefgh]": (5, 3),
    }
    assert chart["encoding"]["color"]["legend"]["columns"] == 2
    assert chart["height"] > time_lines(df.head(2), "bytes_per_second", legend_columns=2)["height"]


def test_sm_heatmap_has_a_row_per_node_and_a_column_per_gpu_and_opens_a_gpu() -> None:
    df = pd.DataFrame(
        {"instance": ["a:1", "a:1", "b:1"], "gpu": ["0", "1", "0"], "value": [0.5, 0.9, 0.1], "uuid": ["x", "y", "z"]}
    )
    chart = sm_heatmap(df)
    assert chart["encoding"]["y"]["sort"] == ["a:1", "b:1"]
    assert chart["encoding"]["x"]["sort"] == ["GPU 0", "GPU 1"]
    cells = {(r["node"], r["label"]): r for r in data_of(chart)}
    assert cells[("a:1", "GPU 1")]["value"] == 0.9
    assert ("b:1", "GPU 1") not in cells, "a missing GPU stays blank, not 0"
    assert cells[("b:1", "GPU 0")]["uuid"] == "z"
    assert chart["params"] == [_pick()]
    assert "stroke" not in chart["encoding"], "no allocation given: no outline"


def _pick() -> dict[str, Any]:
    return {"name": PICK, "select": {"type": "point", "fields": ["uuid", "mig_uuid"]}}


def test_sm_heatmap_outlines_the_gpus_no_pod_holds_and_names_the_pods_of_the_others() -> None:
    """A GPU is free when neither it nor any of its MIG instances is allocated: its cell is outlined,
    drawn over its neighbours, with a legend entry of its own; a held GPU's tooltip names its pods,
    at most three; the one selection (a click opens the GPU) is kept."""
    sm = pd.DataFrame(
        {
            "node": ["n"] * 4,
            "gpu": ["0", "1", "1", "2"],
            "uuid": ["A", "B", "B", "C"],
            "mig_uuid": ["", "B/1", "B/2", ""],
            "value": [0.0, 0.3, 0.0, 0.9],
        }
    )
    alloc = pd.DataFrame(
        {
            "namespace": ["ml"] * 5,
            "pod": ["p1", "p2", "p3", "p4", "p5"],
            "uuid": ["B", "C", "C", "C", "C"],
            "mig_uuid": ["B/1", "", "", "", ""],
        }
    )
    chart = sm_heatmap(sm, alloc)
    cells = {r["label"]: r for r in data_of(chart)}
    assert {k: r["allocation"] for k, r in cells.items()} == {"GPU 0": FREE, "GPU 1": None, "GPU 2": None}
    assert cells["GPU 1"]["holders"] == "ml/p1", "a GPU with one MIG instance held is not free"
    assert cells["GPU 2"]["holders"] == "ml/p2, ml/p3, ml/p4 +1 more"
    enc = chart["encoding"]
    assert enc["stroke"]["field"] == "allocation"
    assert enc["stroke"]["scale"]["domain"] == [FREE], "the legend names only what the outline means"
    assert enc["stroke"]["legend"]["orient"] == "bottom", "a legend entry, under the map where it is not cut off"
    assert enc["strokeWidth"]["condition"]["test"] == "datum.free == 1" and enc["strokeWidth"]["value"] == 0
    assert [cells[k]["free"] for k in ("GPU 0", "GPU 1", "GPU 2")] == [1, 0, 0]
    assert enc["order"]["field"] == "free", "outlined cells drawn last, not under a neighbour"
    assert chart["params"] == [_pick()]
    assert "holders" in [t["field"] for t in enc["tooltip"]]
    held_everywhere = sm_heatmap(sm, alloc.assign(uuid=["A", "B", "C", "C", "C"]))
    assert "stroke" not in held_everywhere["encoding"], "no free GPU: no outline, no legend entry"
    json.dumps(chart)


def test_sm_heatmap_takes_the_busiest_mig_slice_and_orders_gpu_10_after_9() -> None:
    df = pd.DataFrame(
        {"node": ["n"] * 4, "gpu": ["0", "0", "10", "9"], "value": [0.2, 0.7, 0.1, 0.3], "uuid": ["A", "A", "K", "J"]}
    )
    chart = sm_heatmap(df)
    assert chart["encoding"]["x"]["sort"] == ["GPU 0", "GPU 9", "GPU 10"]
    assert {r["label"]: r["value"] for r in data_of(chart)}["GPU 0"] == 0.7


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
    chart = mig_layout_figure(layout)
    data = data_of(chart)
    assert [(r["start"], r["end"]) for r in data] == [(0, 4), (4, 7)]
    assert "ml/a" in data[0]["label"] and "free" in data[1]["label"]
    assert [r["state"] for r in data] == ["held", "free"]
    bars = _layer(chart, "bar")
    colours = _colours(bars["encoding"])
    assert colours["held"] != colours["free"]
    assert data[0]["mig_uuid"] == "MIG-1" and bars["params"][0]["name"] == PICK


def test_waste_bar_and_sm_share_and_probe_charts() -> None:
    waste = pd.DataFrame(
        {"namespace": ["a", "b"], "gpu_hours": [5.0, 1.0], "cost_usd": [20.0, float("nan")], "pods": [2, 1]}
    )
    chart = waste_bar(waste)
    assert [r["gpu_hours"] for r in data_of(chart)] == [5.0, 1.0]
    assert [r["cost"] for r in data_of(chart)] == ["$20.00", "no price"]
    shares = timeslice_shares(
        pd.DataFrame({"uuid": ["G", "G"], "namespace": ["n", "n"], "pod": ["p", "q"], "value": [0.3, 0.5]}),
        pd.DataFrame({"uuid": ["G"], "value": [4.0]}),
        pd.DataFrame({"uuid": ["G"], "value": [2.0]}),
    )
    bar = kernel_time_bar(shares)
    assert sorted(r["who"] for r in data_of(bar)) == ["n/p", "n/q"]
    assert bar["encoding"]["color"]["field"] == "who"
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
    pf = probe_efficiency_bar(probes, slow_below=0.8)
    assert [r["efficiency"] for r in data_of(pf)] == [0.75]
    rules = _layer(pf, "rule")
    assert [r["y"] for r in rules["data"]["values"]] == [1.0, 0.8]
    assert data_of(pf)[0]["uuid"] == "G", "a click opens the probed GPU"


def test_savings_bar_puts_the_largest_saving_first_coloured_by_recommendation() -> None:
    table = pd.DataFrame(
        {
            "namespace": ["a", "b", "c"],
            "workload": ["x", "y", "z"],
            "gpu_hours_saved": [2.0, 9.0, 0.0],
            "recommendation": ["mig", "release", "keep"],
        }
    )
    chart = savings_bar(table)
    assert [r["who"] for r in data_of(chart)] == ["b/y", "a/x"], "nothing to save: not drawn"
    assert _colours(chart["encoding"]) == {"release": "#d62728", "mig": "#1f77b4"}


def test_nan_and_numpy_values_reach_the_browser_as_json() -> None:
    df = pd.DataFrame({"a": [np.float64(1.5), np.nan], "b": [np.int64(3), np.int64(4)], "c": ["x", None]})
    assert rows(df, ["a", "b", "c"]) == [{"a": 1.5, "b": 3, "c": "x"}, {"a": None, "b": 4, "c": None}]
    json.dumps(rows(df, ["a", "b", "c"]), allow_nan=False)


def test_prices_parse_and_reject_garbage() -> None:
    assert parse_prices("H200=3.5, A100=1.2,*=2") == {"H200": 3.5, "A100": 1.2, "*": 2.0}
    for bad in ("H200", "H200=cheap", "=3", "H200=-1"):
        with pytest.raises(ValueError):
            parse_prices(bad)


def test_cli_settings_reach_the_app_through_the_environment() -> None:
    flags = "--prometheus http://prom:9090 --price-per-gpu-hour H200=3.5 --refresh 15 --max-marks 900"
    args = build_parser().parse_args(flags.split())
    cfg = settings_from_args(args)
    assert from_env(to_env(cfg)) == DashboardSettings(
        prometheus_url="http://prom:9090",
        prices_per_gpu_hour={"H200": 3.5},
        refresh_seconds=15.0,
        max_marks=900,
    )
    for bad in ("0", "-5"):
        with pytest.raises(ValueError, match="--max-marks"):
            settings_from_args(build_parser().parse_args(["--scrape", "a", "--max-marks", bad]))
        with pytest.raises(ValueError, match="GPULENS_DASHBOARD_MAX_MARKS"):
            from_env({"GPULENS_DASHBOARD_MAX_MARKS": bad})
    with pytest.raises(ValueError, match="GPULENS_DASHBOARD_MAX_MARKS='many'"):
        from_env({"GPULENS_DASHBOARD_MAX_MARKS": "many"})
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
    assert argv[1:4] == ["-m", "dashboard.server", "run"], "Streamlit runs with TCP_NODELAY (dashboard/server.py)"
    assert "--runner.postScriptGC=false" in argv, "no full collection holding the GIL after each page run"


def test_gpu_page_lines_and_strips_name_even_a_single_series() -> None:
    lines = pd.DataFrame({"timestamp": [0.0, 60.0, 0.0, 60.0], "series": ["a", "a", "b", "b"], "value": [1, 2, 3, 4]})
    chart = time_lines(lines, "watts")
    assert chart["encoding"]["color"]["sort"] == ["a", "b"]
    assert [r["value"] for r in data_of(chart) if r["series"] == "b"] == [3, 4]
    one = time_lines(lines[lines["series"] == "a"], "ratio")
    assert one["encoding"]["color"]["legend"] is not None, "one line still says what it is"
    assert one["encoding"]["y"]["axis"]["format"] == ".0%"
    gib = time_lines(pd.DataFrame({"timestamp": [0.0], "series": ["m"], "value": [2.0 * 2**30]}), "bytes")
    assert data_of(gib)[0]["value"] == 2.0 and gib["encoding"]["y"]["title"] == "GiB"
    strip = state_strip(
        pd.DataFrame({"timestamp": [0.0, 60.0], "leaf": ["GPU", "GPU"], "class": ["memory", "memory"]}), "class"
    )
    assert _colours(strip["encoding"]) == {"memory": CLASS_COLORS["memory"]}
    assert strip["encoding"]["color"]["legend"] is not None


def test_the_class_over_time_is_a_band_of_spans_not_a_dot_per_step() -> None:
    """A GPU in memory for 4 steps, then compute for 2, a step missing, then compute again: three
    bars (a span per run of one state, broken where a step is missing), each ending a step past
    its last step; a MIG instance's runs are its own. (It drew a square per 15 s step.)"""
    t = [0.0, 15.0, 30.0, 45.0, 60.0, 75.0, 105.0]
    cls = ["memory"] * 4 + ["compute"] * 3
    timeline = pd.DataFrame({"timestamp": [*t, 0.0, 15.0], "leaf": ["GPU"] * 7 + ["3g MIG-a"] * 2,
                             "class": [*cls, "idle", "idle"]})  # fmt: skip
    spans = state_spans(timeline, "leaf", "class")
    gpu = spans[spans["leaf"] == "GPU"]
    assert gpu[["class", "start", "end", "steps"]].values.tolist() == [
        ["memory", 0.0, 60.0, 4], ["compute", 60.0, 90.0, 2], ["compute", 105.0, 120.0, 1]
    ]  # fmt: skip
    assert spans[spans["leaf"] == "3g MIG-a"][["start", "end"]].values.tolist() == [[0.0, 30.0]]
    strip = state_strip(timeline, "class")
    assert strip["mark"]["type"] == "bar" and strip["encoding"]["x2"] == {"field": "t2"}
    assert len(data_of(strip)) == 4, "a bar per span, not a mark per step"
    # a strip per state (the clock events: one row per reason, no leaf)
    events = pd.DataFrame({"timestamp": [0.0, 15.0, 30.0, 15.0], "clock event": ["power cap"] * 3 + ["thermal"]})
    bands = state_spans(events, "clock event", "clock event")
    assert bands.values.tolist() == [["power cap", 0.0, 45.0, 3], ["thermal", 15.0, 30.0, 1]]
    assert len(data_of(state_strip(events, "clock event"))) == 2


def test_time_axis_shows_dates_once_the_range_spans_days() -> None:
    hour = pd.DataFrame({"timestamp": [0.0, 3600.0], "series": ["a", "a"], "value": [1, 2]})
    week = pd.DataFrame({"timestamp": [0.0, 7 * 86400.0], "series": ["a", "a"], "value": [1, 2]})
    minutes = pd.DataFrame({"timestamp": [0.0, 300.0], "series": ["a", "a"], "value": [1, 2]})
    # five minutes: ticks seconds apart, which would all read the same HH:MM
    assert "'%H:%M:%S'" in time_lines(minutes, "watts")["encoding"]["x"]["axis"]["labelExpr"]
    assert "'%H:%M'" in time_lines(hour, "watts")["encoding"]["x"]["axis"]["labelExpr"]
    assert "'%m-%d %H:%M'" in time_lines(week, "watts")["encoding"]["x"]["axis"]["labelExpr"]


def test_clickable_charts_carry_the_gpu_of_every_mark() -> None:
    chart = roofline_scatter(_points())
    assert _layer(chart, "point")["params"] == [
        {"name": PICK, "select": {"type": "point", "fields": ["uuid", "mig_uuid"]}}
    ]
    for row in data_of(chart):
        assert str(row["uuid"]).startswith("GPU-") and row["mig_uuid"] == ""


def test_sm_histogram_counts_gpus_per_band_and_cluster_once_each() -> None:
    df = pd.DataFrame(
        {
            "cluster": ["c1", "c1", "c1", "c2", "c2", ""],
            "node": ["a", "a", "b", "c", "c", "d"],
            "gpu": ["0", "0", "0", "0", "1", "0"],
            "uuid": ["A", "A", "B", "C", "D", "E"],
            "mig_uuid": ["A/1", "A/2", "", "", "", ""],
            # A's slices 0.01 and 0.97 -> its busiest, 0.97; 1.0 and above land in the last band
            "value": [0.01, 0.97, 0.049, 1.0, 0.05, 0.5],
        }
    )
    chart = sm_histogram(df)
    bars = {(r["cluster"], r["band"]): r["gpus"] for r in data_of(chart)}
    assert bars == {
        ("c1", "95%-100%"): 1,
        ("c1", "0%-5%"): 1,
        ("c2", "95%-100%"): 1,
        ("c2", "5%-10%"): 1,
        ("(no cluster)", "50%-55%"): 1,
    }
    assert sum(bars.values()) == 5, "one count per physical GPU"
    assert chart["encoding"]["y"]["stack"] == "zero"
    assert "params" not in chart, "a bar is many GPUs: no click to open one"
    json.dumps(chart)


def test_roofline_density_sizes_a_circle_per_cell_and_class() -> None:
    pts = pd.concat([_points()] * 3, ignore_index=True)
    pts.loc[0, "dram_active"] = 0.86  # the same 85-90 % cell as the 0.88s
    chart = roofline_density(pts)
    circles = _layer(chart, "circle")
    cells = {(r["class"], r["dram"], r["pipe"]): r for r in data_of(chart)}
    assert cells[("memory", "85%-90%", "0%-5%")]["leaves"] == 3
    assert cells[("memory", "85%-90%", "0%-5%")]["dram_active"] == pytest.approx(0.875)
    assert cells[("compute", "15%-20%", "90%-95%")]["leaves"] == 3
    assert cells[("idle", "0%-5%", "0%-5%")]["leaves"] == 3
    assert sum(r["leaves"] for r in data_of(chart)) == len(pts)
    assert circles["encoding"]["size"]["field"] == "leaves"
    assert _colours(circles["encoding"]) == {c: CLASS_COLORS[c] for c in ("idle", "memory", "compute")}
    json.dumps(chart)
