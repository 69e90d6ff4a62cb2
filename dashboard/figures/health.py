"""The Health page: probe bandwidth against the expected one per GPU (a ratio), and how many
GPUs each clock-event reason holds down."""

from __future__ import annotations

import pandas as pd

from dashboard.figures.vega import DATASET, LINE_BREAK, Chart, bar_chart, empty_figure, pick, short_uuid


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


def clock_event_bar(events: pd.DataFrame) -> Chart:
    """How many GPUs each clock-event (throttle) reason holds down now."""
    if events.empty:
        return empty_figure("no clock events active")
    counts = events.groupby("reason", as_index=False).size().rename(columns={"size": "gpus"})
    return bar_chart(
        counts,
        "reason",
        "gpus",
        y_title="GPUs affected",
        color={"value": "#fb8c00"},
        tooltip=[{"field": "reason"}, {"field": "gpus", "title": "GPUs"}],
        height=280,
    )
