"""The Health page: probe bandwidth against the expected one per GPU (a ratio), and how many
GPUs each clock-event reason holds down."""

from __future__ import annotations

import pandas as pd

from dashboard import words
from dashboard.figures.vega import DATASET, LINE_BREAK, Chart, bar_chart, dataset, empty_figure, pick, rows, short_uuid


def probe_efficiency_bar(probes: pd.DataFrame, slow_below: float) -> Chart:
    """Probe bandwidth as a fraction of the expected one per GPU, a bar per probe; a dotted line at
    1.0 (as expected) and a dashed one at ``slow_below`` (where Health calls a GPU slow)."""
    df = probes.dropna(subset=["efficiency"]) if not probes.empty else probes
    if df.empty:
        return empty_figure("no probe results")
    where = df["node"] if "node" in df.columns and (df["node"] != "").any() else df.get("instance", "")
    mig = df["mig_uuid"] if "mig_uuid" in df.columns else pd.Series([""] * len(df), index=df.index)
    df = df.assign(
        # a MIG instance on a second line, by the first 8 hex digits of its UUID (the tooltip has all)
        gpu_label=[
            (f"{w} GPU {g}" if w else short_uuid(u)) + (f"{LINE_BREAK}MIG {m.removeprefix('MIG-')[:8]}" if m else "")
            for w, g, u, m in zip(where, df["gpu"], df["uuid"], mig, strict=True)
        ],
        mig_uuid=mig,
        probe=[words.probe(p) for p in df["probe"]],
    )
    tooltip = [
        {"field": "gpu_label", "title": "GPU"},
        *([{"field": "mig_uuid", "title": "MIG instance"}] if (mig != "").any() else []),
        {"field": "probe"},
        {"field": "efficiency", "title": "measured / expected", "format": ".0%"},
    ]
    if "vs_peers" in df.columns:
        tooltip.append({"field": "vs_peers", "title": "vs peers", "format": ".0%"})
    tooltip.append({"field": "uuid"})
    bars = bar_chart(
        df,
        "gpu_label",
        "efficiency",
        y_title="measured / expected",
        y_format=".0%",
        x_title="GPU",
        color={"field": "probe", "type": "nominal"},
        tooltip=tooltip,
    )
    datasets, data, height = bars.pop("datasets"), bars.pop("data"), bars.pop("height")
    bars["encoding"]["x"]["axis"] = {
        "labelAngle": 0,
        "labelLimit": 260,
        "labelExpr": f"split(datum.label, '{LINE_BREAK}')",
    }
    bars["encoding"]["xOffset"] = {"field": "probe"}
    bars["params"] = [pick()]
    bars["mark"] = {"type": "bar", "cursor": "pointer"}
    for r in datasets[DATASET]:
        r.setdefault("mig_uuid", "")
    lines = {"values": [{"y": 1.0, "what": "expected"}, {"y": slow_below, "what": "slow"}]}
    return {
        "datasets": datasets,
        "data": data,
        "layer": [
            bars,
            {
                "data": lines,
                "mark": {"type": "rule", "strokeDash": [4, 4]},
                "encoding": {
                    "y": {"field": "y", "type": "quantitative"},
                    "color": {
                        "field": "what",
                        "type": "nominal",
                        "legend": None,
                        "scale": {"domain": ["expected", "slow"], "range": ["#555555", "#d62728"]},
                    },
                },
            },
            {
                "data": {"values": [{"y": slow_below, "text": "slow"}]},
                "mark": {"type": "text", "align": "left", "dx": 4, "dy": -6, "color": "#d62728", "x": 0},
                "encoding": {"y": {"field": "y", "type": "quantitative"}, "text": {"field": "text"}},
            },
        ],
        "resolve": {"scale": {"color": "independent"}},
        "height": height,
    }


SEVERITY_COLOURS: dict[str, str] = {"hardware": "#c62828", "thermal": "#ef6c00", "power": "#78909c", "other": "#9e9e9e"}
"""A clock event reason's colour by what it means: hardware protection red, thermal orange, the
power cap (normal near full load) grey."""


def _severity(reason: str) -> str:
    if reason.startswith("hw_"):
        return "hardware"
    if "thermal" in reason:
        return "thermal"
    if "power" in reason:
        return "power"
    return "other"


def clock_event_bar(events: pd.DataFrame) -> Chart:
    """Small multiples, one per clock-event (throttle) reason, the worst reason on top
    (dashboard/words.py's order: hardware and thermal slowdowns before the power cap): in each, a
    bar per GPU for the share of the range the reason held its clocks down. One GPU at 100 %
    thermal slowdown stands alone in its own row, never under the power-capped ones. ``events``:
    frames.health.active_clock_events' rows (node, instance, gpu, uuid, reason, share)."""
    if events.empty:
        return empty_figure("no clock events active")
    where = events["node"] if "node" in events.columns else pd.Series([""] * len(events), index=events.index)
    if "instance" in events.columns:
        where = where.where(where != "", events["instance"])
    df = events.assign(
        gpu_label=[
            f"{w} GPU {g}" if w else short_uuid(u) for w, g, u in zip(where, events["gpu"], events["uuid"], strict=True)
        ],
        reason_words=[words.clock_event(r) for r in events["reason"]],
        severity=[_severity(str(r)) for r in events["reason"]],
        rank=[words.clock_event_rank(r) for r in events["reason"]],
        mig_uuid="",
    ).sort_values(["rank", "share"], ascending=[True, False])
    order = list(dict.fromkeys(df["reason_words"]))
    data = dataset(rows(df, ["gpu_label", "reason_words", "severity", "share", "uuid", "mig_uuid"]))
    return {
        **data,
        "facet": {
            "row": {
                "field": "reason_words",
                "type": "nominal",
                "sort": order,
                "title": None,
                "header": {
                    "labelAngle": 0,
                    "labelAlign": "left",
                    "labelAnchor": "start",
                    "labelFontWeight": "bold",
                    "labelOrient": "top",
                    "labelLimit": 400,
                },
            }
        },
        "spec": {
            "width": 640,
            "mark": {"type": "bar", "cursor": "pointer"},
            "params": [pick()],
            "encoding": {
                "y": {
                    "field": "gpu_label",
                    "type": "nominal",
                    "sort": "-x",
                    "title": None,
                    "axis": {"labelLimit": 400},
                },
                "x": {
                    "field": "share",
                    "type": "quantitative",
                    "title": "share of the range the clocks were held down",
                    "scale": {"domain": [0, 1]},
                    "axis": {"format": ".0%"},
                },
                "color": {
                    "field": "severity",
                    "type": "nominal",
                    "scale": {"domain": list(SEVERITY_COLOURS), "range": list(SEVERITY_COLOURS.values())},
                    "legend": None,
                },
                "tooltip": [
                    {"field": "gpu_label", "title": "GPU"},
                    {"field": "reason_words", "title": "reason"},
                    {"field": "share", "title": "share of the range", "format": ".0%"},
                    {"field": "uuid"},
                ],
            },
        },
        "resolve": {"scale": {"y": "independent"}},
    }
