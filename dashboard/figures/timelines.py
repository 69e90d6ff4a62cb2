"""Values over time: the boundness mix as stacked areas, lines in a readable unit (GiB, GB/s,
MHz, %) and a state strip (one state per step)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import pandas as pd

from dashboard.figures.palette import class_scale
from dashboard.figures.vega import Chart, dataset, empty_figure, rows, time_x, with_times

_UNIT_SCALE: dict[str, tuple[float, str, str]] = {
    # unit -> (divide by, axis title, number format)
    "ratio": (1.0, "", ".0%"),
    "bytes": (2**30, "GiB", ",.1f"),
    "bytes_per_second": (1e9, "GB/s", ",.1~f"),
    "watts": (1.0, "W", ",.0f"),
    "celsius": (1.0, "°C", ",.0f"),
    "hertz": (1e6, "MHz", ",.0f"),
    "": (1.0, "", ",.3~g"),
}


def boundness_area(series: pd.DataFrame) -> Chart:
    """How many GPUs/slices are in each boundness class over time (stacked)."""
    if series.empty or "class" not in series.columns:
        return empty_figure()
    df = with_times(series).sort_values("t", kind="stable")
    scale = class_scale(set(df["class"]))
    order = {c: i for i, c in enumerate(scale["domain"])}
    df = df.assign(order=[order[c] for c in df["class"]])
    return {
        **dataset(rows(df, ["t", "time", "class", "value", "order"])),
        "mark": {"type": "area", "interpolate": "linear"},
        "encoding": {
            "x": time_x(df),
            "y": {"field": "value", "type": "quantitative", "stack": "zero", "title": "GPUs / MIG slices"},
            "color": {"field": "class", "type": "nominal", "scale": scale, "legend": {"title": "bound by"}},
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [{"field": "time"}, {"field": "class"}, {"field": "value", "format": ",.2~f"}],
        },
        "height": 340,
    }


def time_lines(
    df: pd.DataFrame, unit: str, *, full_scale: bool = False, legend_columns: int = 4, dashed: Iterable[str] = ()
) -> Chart:
    """Lines over time (timestamp, series, value) in a readable unit (GiB, GB/s, MHz, %), a legend
    naming every line, even a single one, in a grid of ``legend_columns`` (fewer for a half-width
    chart). ``full_scale``: a ratio's axis spans 0-100 % whatever the values (a link 2 % busy must
    not fill the chart). ``dashed``: the series drawn dashed (a link's outbound direction, which
    NVLink's inbound one would hide: every byte a GPU sends, a peer receives)."""
    if df.empty:
        return empty_figure()
    scale, title, fmt = _UNIT_SCALE.get(unit, (1.0, unit, ",.3~g"))
    d = with_times(df.assign(value=df["value"] / scale, series=df["series"].astype(str))).sort_values(
        "t", kind="stable"
    )
    names = list(dict.fromkeys(d["series"]))
    y: dict[str, Any] = {"field": "value", "type": "quantitative", "title": title or None, "axis": {"format": fmt}}
    if full_scale:
        y["scale"] = {"domain": [0, 1]}
    columns = max(1, min(len(names), legend_columns))
    encoding: dict[str, Any] = {
        "x": time_x(d),
        "y": y,
        "color": {
            "field": "series",
            "type": "nominal",
            "sort": names,
            # a grid, not one row: a row of eight names runs off the chart's edge
            "legend": {"title": None, "orient": "bottom", "columns": columns, "labelLimit": 260},
        },
        "tooltip": [
            {"field": "time"},
            {"field": "series"},
            {"field": "value", "title": title or "value", "format": fmt},
        ],
    }
    dashes = set(dashed) & set(names)
    if dashes:  # the same field as the colour: one legend, its symbols dashed too
        encoding["strokeDash"] = {
            "field": "series",
            "type": "nominal",
            "sort": names,
            "scale": {"domain": names, "range": [[5, 3] if n in dashes else [1, 0] for n in names]},
        }
    return {
        **dataset(rows(d, ["t", "time", "series", "value"])),
        "mark": {"type": "line", "interpolate": "linear", "point": False},
        "encoding": encoding,
        # the page fits axes and legend into the height: each further row of names adds its own
        "height": 240 + 20 * (math.ceil(len(names) / columns) - 1),
    }


def state_spans(timeline: pd.DataFrame, y: str, label: str) -> pd.DataFrame:
    """A state timeline (timestamp, ``y``, ``label``: one row per step a state was on) as
    contiguous spans: per ``y`` (a leaf; or the state itself, ``y == label``, for a strip per
    state), each run of steps in one state, from its first step to a step past its last (start,
    end: Unix s; steps). A run breaks where the state changes or a step is missing (more than 1.5
    steps between samples: no data is not the state going on)."""
    keys = list(dict.fromkeys([y, label]))
    cols = [*keys, "start", "end", "steps"]
    if timeline.empty:
        return pd.DataFrame(columns=cols)
    d = timeline[[*keys, "timestamp"]].sort_values([*keys, "timestamp"], kind="stable").reset_index(drop=True)
    ts = d["timestamp"].astype(float)
    gaps = ts.groupby([d[k] for k in keys]).diff()
    step = float(gaps.median()) if gaps.notna().any() else 1.0
    step = step if step > 0 else 1.0
    same = ts - ts.shift() <= 1.5 * step
    for k in keys:
        same &= d[k] == d[k].shift()
    run = (~same).cumsum()
    out = (
        d.assign(_run=run, _t=ts)
        .groupby("_run", sort=False)
        .agg(**{k: (k, "first") for k in keys}, start=("_t", "min"), end=("_t", "max"), steps=("_t", "size"))
    )
    out["end"] = out["end"] + step
    return out.sort_values([y, "start"]).reset_index(drop=True)[cols]


def state_strip(timeline: pd.DataFrame, label: str) -> Chart:
    """Which state (boundness class, throttle reason) each leaf was in over time, as a band per
    leaf: a bar per contiguous span of one state (:func:`state_spans`), not a mark per step;
    boundness classes in their page-wide colours."""
    if timeline.empty:
        return empty_figure("never")
    y = "leaf" if label == "class" else label
    spans = state_spans(timeline, y, label)
    states = list(dict.fromkeys(timeline[label]))
    legend = {"title": label, "orient": "bottom", "columns": 4}
    color: dict[str, Any] = {"field": label, "type": "nominal", "legend": legend}
    if label == "class":
        color["scale"] = class_scale(set(states))
    else:
        color["sort"] = states
    d = with_times(spans.rename(columns={"start": "timestamp"}))
    d = d.assign(t2=(spans["end"].astype(float) * 1000.0).round().to_numpy(),
                 until=with_times(spans.rename(columns={"end": "timestamp"}))["time"].to_numpy())  # fmt: skip
    x = time_x(d)
    # the axis' label format over the spans' whole extent (their ends included)
    span_ms = float(max(d["t2"].max(), d["t"].max()) - d["t"].min()) if len(d) else 0.0
    fmt = "%m-%d %H:%M" if span_ms > 86_400_000 else "%H:%M" if span_ms > 1_800_000 else "%H:%M:%S"
    x["axis"] = {"labelExpr": f"utcFormat(datum.value, '{fmt}')", "labelOverlap": True}
    rows_ = max(1, d[y].nunique())
    return {
        **dataset(rows(d, list(dict.fromkeys(["t", "t2", "time", "until", y, label, "steps"])))),
        "mark": {"type": "bar", "cornerRadius": 0},
        "encoding": {
            "x": x,
            "x2": {"field": "t2"},
            "y": {"field": y, "type": "nominal", "title": None, "axis": {"labelLimit": 260}},
            "color": color,
            "tooltip": [
                {"field": y},
                {"field": label},
                {"field": "time", "title": "from"},
                {"field": "until", "title": "until"},
            ],
        },
        # the height holds the axis and the legend below too (the page fits the whole chart in it)
        "height": 80 + 30 * rows_ + 20 * math.ceil(len(states) / 4),
    }
