"""Pure chart builders: a DataFrame in, a Vega-Lite specification out (no I/O, no Streamlit).

Each function returns a plain Vega-Lite v5 spec (a dict) with its rows inline under
``data.values``; the pages draw it with ``st.vega_lite_chart`` (dashboard/ui.py ``chart``).
Vega-Lite, not Plotly: Streamlit ships both, but a browser that opens a page with a Plotly chart
first downloads and evaluates a bundle several times the size of Vega-Lite's, before anything is
drawn; docs/benchmarks.md ("Vega-Lite charts, a page's queries sent at once") has the MB and the
seconds.

Times are epoch milliseconds on a UTC scale (the sidebar's range is in UTC too). Charts whose
marks stand for a GPU or a MIG instance carry ``uuid`` and ``mig_uuid`` in their rows and a point
selection named :data:`PICK` on those fields: a click reaches the page as
``event.selection[PICK] == [{"uuid": ..., "mig_uuid": ...}]`` and opens the GPU page.
"""

from __future__ import annotations

import colorsys
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from dashboard.definitions import UNKNOWN_CLASS
from exporter.model import POD_BOUNDNESS_CLASSES

Chart = dict[str, Any]
"""A Vega-Lite specification."""

PICK = "pick"
"""Name of the point selection on charts whose marks are GPUs or MIG instances."""

CLASS_COLORS: dict[str, str] = {
    "idle": "#9e9e9e",
    "launch": "#ff9800",
    "latency": "#ffd54f",
    "communication": "#6d4c41",
    "memory": "#1e88e5",
    "compute": "#43a047",
    "mixed": "#8e24aa",
    "transfer": "#d81b60",
    "busy": "#90a4ae",
    "shared": "#00897b",
    "unknown": "#d7ccc8",
}
"""One colour per boundness class, the same on every page (``transfer``, links busy while the
SMs idle or wait: a magenta none of the kernel classes is near; ``busy``, the coarse class of a GPU
without GPM whose limit cannot be told: a blue-grey between idle's grey and the kernel classes;
``communication``, latency-like kernels waiting on peers or the network: a brown beside latency's
yellow)."""

CLASS_ORDER = [*POD_BOUNDNESS_CLASSES, UNKNOWN_CLASS]
"""The exporter's classes (``shared``: a pod's class when several pods have processes on its leaf,
the recording rule gpulens:pod_gpu_boundness:class; a leaf itself never has it), then ``unknown``."""

RECOMMENDATION_COLORS: dict[str, str] = {
    "release": "#d62728",
    "mig": "#1f77b4",
    "time-slice": "#9467bd",
    "higher-bandwidth": "#ff7f0e",
}
"""One colour per kind of advisor recommendation (Right-sizing page)."""

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
_TIME_FORMAT = "%Y-%m-%d %H:%M:%S UTC"


def _fit(text: str, slices: int) -> str:
    """``text`` cut to what fits in a MIG layout bar of ``slices`` compute slices (of 7 across the
    page): about 12 characters a slice; the full text is in the tooltip."""
    room = 12 * max(1, slices)
    return text if len(text) <= room else text[: room - 1] + "…"


_LINE = " · "
"""Where an axis label breaks into lines (``labelExpr`` splits on it; the tooltip shows it whole)."""


def _short(uuid: str) -> str:
    return uuid[:12] + "…" if len(uuid) > 13 else uuid


def _value(v: Any) -> Any:
    """A cell as JSON: numpy scalars as Python numbers, NaN and NA as null."""
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return None
    if hasattr(v, "item"):
        v = v.item()
        if isinstance(v, float) and math.isnan(v):
            return None
    return v


def rows(df: pd.DataFrame, columns: Sequence[str]) -> list[dict[str, Any]]:
    """``df``'s ``columns`` as a list of JSON-ready records (the spec's inline data)."""
    cols = [df[c].tolist() for c in columns]
    return [{c: _value(v) for c, v in zip(columns, values, strict=True)} for values in zip(*cols, strict=True)]


DATASET = "rows"
"""Name of a chart's dataset (``spec["datasets"][DATASET]``, the chart's rows)."""


def _data(values: list[dict[str, Any]]) -> dict[str, Any]:
    """A spec's data as a named dataset: Streamlit ships named datasets to the browser with the
    spec, so the first render already has its rows (top-level ``data.values`` are sent after it,
    and Vega warns about the empty first pass)."""
    return {"datasets": {DATASET: values}, "data": {"name": DATASET}}


def data_of(chart: Chart) -> list[dict[str, Any]]:
    """The rows a chart draws (its named dataset)."""
    return list(chart["datasets"][DATASET])


def _times(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with ``t`` (epoch ms, the x field) and ``time`` (its UTC text, for tooltips)."""
    ts = pd.to_datetime(df["timestamp"], unit="s", utc=True)
    return df.assign(t=(df["timestamp"].astype(float) * 1000.0).round(), time=ts.dt.strftime(_TIME_FORMAT))


def _time_x(df: pd.DataFrame) -> dict[str, Any]:
    """The x encoding of a time chart: UTC, with dates on the ticks once the rows span a day and
    seconds while they span half an hour or less (ticks a minute or less apart)."""
    span_ms = float(df["t"].max() - df["t"].min()) if len(df) else 0.0
    fmt = "%m-%d %H:%M" if span_ms > 86_400_000 else "%H:%M" if span_ms > 1_800_000 else "%H:%M:%S"
    return {
        "field": "t",
        "type": "temporal",
        "scale": {"type": "utc"},
        "title": None,
        # labelExpr, not format: Streamlit's Vega-Lite ignores an axis format on a utc time scale
        "axis": {"labelExpr": f"utcFormat(datum.value, '{fmt}')", "labelOverlap": True},
    }


def _class_scale(present: set[str]) -> dict[str, Any]:
    domain = [c for c in CLASS_ORDER if c in present] + sorted(present - set(CLASS_ORDER))
    return {"domain": domain, "range": [CLASS_COLORS.get(c, "#757575") for c in domain]}


def _pick(fields: Sequence[str] = ("uuid", "mig_uuid")) -> dict[str, Any]:
    return {"name": PICK, "select": {"type": "point", "fields": list(fields)}}


def empty_figure(message: str = "no data") -> Chart:
    """A blank chart that says why it is blank."""
    return {
        **_data([{"message": message}]),
        "mark": {"type": "text", "fontSize": 16, "x": {"expr": "width / 2"}, "y": {"expr": "height / 2"}},
        "encoding": {"text": {"field": "message"}},
        "height": 120,
        "config": {"view": {"stroke": None}},
    }


FREE = "free now: no pod holds it"
"""The heatmap's legend entry for a GPU that no pod holds (none of its MIG instances either)."""
HOLDERS_SHOWN = 3
"""Most pods a heatmap tooltip names; more read ``+N more``."""


def _gpu_holders(allocation: pd.DataFrame) -> dict[str, str]:
    """Per physical GPU (uuid), the pods holding it or any of its MIG instances (allocation rows:
    uuid, namespace, pod), as ``namespace/pod`` names, at most HOLDERS_SHOWN then ``+N more``."""
    if allocation.empty or "uuid" not in allocation.columns:
        return {}
    names: dict[str, set[str]] = {}
    ns = allocation["namespace"] if "namespace" in allocation.columns else pd.Series("", index=allocation.index)
    pods = allocation["pod"] if "pod" in allocation.columns else pd.Series("", index=allocation.index)
    for u, n, p in zip(allocation["uuid"].astype(str), ns.astype(str), pods.astype(str), strict=True):
        names.setdefault(u, set()).add(f"{n}/{p}" if n else p)
    out = {}
    for u, held in names.items():
        listed = sorted(held)
        more = len(listed) - HOLDERS_SHOWN
        out[u] = ", ".join(listed[:HOLDERS_SHOWN]) + (f" +{more} more" if more > 0 else "")
    return out


FREE_OUTLINE = "white"
"""The dashed outline of a free GPU's cell: white shows on the dark cells of idle GPUs, as free
ones mostly are, and on every other colour of the viridis scale but its palest yellow."""


def sm_heatmap(sm: pd.DataFrame, allocation: pd.DataFrame | None = None) -> Chart:
    """SM activity (0..1) per node (rows) and GPU index (columns); MIG slices take their max. A
    missing GPU stays blank (no cell), not 0. Clicking a cell opens its GPU.

    With ``allocation`` (gpulens_pod_gpu_allocation rows now: uuid, namespace, pod), each cell's
    tooltip names the pods holding the GPU, and a GPU that none holds (free: neither it nor any of
    its MIG instances) is outlined, dashed, drawn over its neighbours, with a legend entry
    (:data:`FREE`) saying what the outline means."""
    if sm.empty:
        return empty_figure()
    cells = per_gpu_sm(sm)
    cells = cells.assign(label=[f"GPU {g}" for g in cells["gpu"]], mig_uuid="")
    columns = [f"GPU {g}" for g in sorted(set(cells["gpu"]), key=lambda g: (len(str(g)), str(g)))]
    nodes = sorted(set(cells["node"]))
    fields = ["node", "label", "value", "uuid", "mig_uuid"]
    tooltip: list[dict[str, Any]] = [
        {"field": "node"},
        {"field": "label", "title": "GPU"},
        {"field": "value", "title": "SM active", "format": ".0%"},
    ]
    marks: dict[str, Any] = {}
    if allocation is not None:
        held = _gpu_holders(allocation)
        free = [str(u) not in held for u in cells["uuid"]]
        cells = cells.assign(
            holders=[held.get(str(u), "no pod (free)") for u in cells["uuid"]],
            allocation=[FREE if f else None for f in free],
            free=[int(f) for f in free],
        )
        fields += ["holders", "allocation", "free"]
        tooltip.append({"field": "holders", "title": "held by"})
        if any(free):
            marks = {
                "stroke": {
                    "field": "allocation",
                    "type": "nominal",
                    "scale": {"domain": [FREE], "range": [FREE_OUTLINE]},
                    "legend": {
                        "title": None,
                        "orient": "bottom",  # under the map: beside it, under the colour scale, it is cut off
                        "symbolType": "square",
                        "symbolFillColor": "#440154",  # an idle cell, as the map shows most free GPUs
                        "symbolStrokeWidth": 2,
                        "symbolDash": [3, 2],
                        "symbolSize": 260,
                        "labelFontSize": 12,
                    },
                },
                "strokeWidth": {"condition": {"test": "datum.free == 1", "value": 3}, "value": 0},
                "order": {"field": "free", "type": "quantitative"},  # outlined cells last, over their neighbours
            }
    return {
        **_data(rows(cells, fields)),
        "params": [_pick()],
        "mark": {"type": "rect", "cursor": "pointer", "strokeDash": [5, 3]},
        "encoding": {
            "x": {
                "field": "label",
                "type": "ordinal",
                "sort": columns,
                "title": None,
                "axis": {"orient": "top", "labelAngle": 0},
            },
            "y": {"field": "node", "type": "ordinal", "sort": nodes, "title": None, "axis": {"labelOverlap": True}},
            "color": {
                "field": "value",
                "type": "quantitative",
                "scale": {"scheme": "viridis", "domain": [0, 1]},
                "legend": {"title": "SM active", "format": ".0%", "gradientLength": 120},
            },
            **marks,
            "tooltip": tooltip,
        },
        # the height holds the legend under the map too (Streamlit fits the whole chart in it)
        "height": max(160, min(1600, 22 * len(nodes) + 40)) + (HEATMAP_LEGEND_HEIGHT if marks else 0),
    }


HEATMAP_LEGEND_HEIGHT = 36
"""Pixels the free-GPU legend under the heatmap takes (a row of one entry and its margin)."""


BINS = 20
"""Bins across 0..100 % in the distribution charts (5 % each)."""


def _bin(values: pd.Series) -> pd.Series:
    """Bin index 0..BINS-1 of ratios (1.0 and above in the last bin, below 0 in the first)."""
    return (pd.to_numeric(values, errors="coerce").fillna(0.0) * BINS).astype(int).clip(0, BINS - 1)


def per_gpu_sm(sm: pd.DataFrame) -> pd.DataFrame:
    """One row per physical GPU (``node``, ``gpu``, ``uuid``, ``cluster``, ``value``): MIG
    instances take their busiest, ``node`` falls back to ``instance``."""
    df = sm.assign(node=sm["node"] if "node" in sm.columns and sm["node"].any() else sm.get("instance", ""))
    df = df.assign(
        gpu=df["gpu"] if "gpu" in df.columns else "",
        uuid=df["uuid"] if "uuid" in df.columns else "",
        cluster=df["cluster"] if "cluster" in df.columns else "",
    )
    return df.groupby(["node", "gpu"], as_index=False, sort=False).agg(
        value=("value", "max"), uuid=("uuid", "first"), cluster=("cluster", "first")
    )


def sm_histogram(sm: pd.DataFrame) -> Chart:
    """The Fleet heatmap's distribution form, for fleets too large for a cell each
    (``--max-marks``, dashboard/settings.py): how many
    GPUs have each 5 % band of SM activity, stacked by cluster."""
    if sm.empty:
        return empty_figure()
    gpus = per_gpu_sm(sm)
    gpus = gpus.assign(b=_bin(gpus["value"]), cluster=gpus["cluster"].fillna("").replace("", "(no cluster)"))
    counts = gpus.groupby(["cluster", "b"], as_index=False).size().rename(columns={"size": "gpus"})
    counts = counts.assign(lo=counts["b"] / BINS, hi=(counts["b"] + 1) / BINS)
    counts = counts.assign(band=[f"{lo:.0%}-{hi:.0%}" for lo, hi in zip(counts["lo"], counts["hi"], strict=True)])
    return {
        **_data(rows(counts, ["cluster", "lo", "hi", "band", "gpus"])),
        "mark": {"type": "bar", "binSpacing": 1},
        "encoding": {
            "x": {
                "field": "lo",
                "type": "quantitative",
                "bin": {"binned": True, "step": 1 / BINS},
                "scale": {"domain": [0, 1]},
                "axis": {"format": ".0%"},
                "title": "SM active (mean over the range)",
            },
            "x2": {"field": "hi"},
            "y": {"field": "gpus", "type": "quantitative", "stack": "zero", "title": "GPUs"},
            "color": {"field": "cluster", "type": "nominal", "legend": {"title": "cluster"}},
            "tooltip": [
                {"field": "cluster"},
                {"field": "band", "title": "SM active"},
                {"field": "gpus", "title": "GPUs", "format": ","},
            ],
        },
        "height": 320,
    }


def roofline_density(points: pd.DataFrame) -> Chart:
    """The roofline's distribution form, for more leaves than ``--max-marks``: one circle per
    5 % x 5 % cell and class, at the cell's centre, its area the number of leaves there."""
    if points.empty:
        return empty_figure()
    df = points.assign(bx=_bin(points["dram_active"]), by=_bin(points["pipe_active"]))
    cells = df.groupby(["bx", "by", "class"], as_index=False).size().rename(columns={"size": "leaves"})
    cells = cells.sort_values("leaves", ascending=False, kind="stable")  # small circles drawn last, on top
    cells = cells.assign(
        dram_active=(cells["bx"] + 0.5) / BINS,
        pipe_active=(cells["by"] + 0.5) / BINS,
        dram=[f"{b / BINS:.0%}-{(b + 1) / BINS:.0%}" for b in cells["bx"]],
        pipe=[f"{b / BINS:.0%}-{(b + 1) / BINS:.0%}" for b in cells["by"]],
    )
    axis = {"type": "quantitative", "scale": {"domain": [0, 1]}, "axis": {"format": ".0%"}}
    return {
        **_data(rows(cells, ["dram_active", "pipe_active", "dram", "pipe", "class", "leaves"])),
        "layer": [
            _diagonal(axis),
            {
                "mark": {"type": "circle", "opacity": 0.75, "stroke": "white"},
                "encoding": {
                    **_roofline_xy(axis),
                    "size": {
                        "field": "leaves",
                        "type": "quantitative",
                        "scale": {"range": [20, 1200], "zero": False},
                        "legend": {"title": "GPUs and slices"},
                    },
                    "color": _class_color(set(cells["class"])),
                    "tooltip": [
                        {"field": "class"},
                        {"field": "leaves", "title": "GPUs and slices", "format": ","},
                        {"field": "dram", "title": "DRAM bandwidth active"},
                        {"field": "pipe", "title": "busiest pipe active"},
                    ],
                },
            },
        ],
        "height": 460,
    }


def _roofline_xy(axis: dict[str, Any]) -> dict[str, Any]:
    """The roofline's x (DRAM bandwidth active) and y (busiest pipe active) encodings."""
    return {
        "x": {"field": "dram_active", **axis, "title": "DRAM bandwidth active"},
        "y": {"field": "pipe_active", **axis, "title": "busiest pipe active (tensor/FP)"},
    }


def _class_color(present: set[str]) -> dict[str, Any]:
    """Colour by boundness class, in the class colours, with the "bound by" legend."""
    return {"field": "class", "type": "nominal", "scale": _class_scale(present), "legend": {"title": "bound by"}}


def _diagonal(axis: dict[str, Any]) -> Chart:
    """The roofline's dashed x = y guide."""
    return {
        "data": {"values": [{"d": 0.0}, {"d": 1.0}]},
        "mark": {"type": "line", "strokeDash": [2, 4], "color": "#bbbbbb"},
        "encoding": {"x": {"field": "d", **axis}, "y": {"field": "d", **axis}},
    }


def roofline_scatter(points: pd.DataFrame) -> Chart:
    """x = DRAM bandwidth active, y = busiest pipe active, colour = boundness class, pods on hover;
    each point carries ``uuid`` and ``mig_uuid`` (a click opens its GPU)."""
    if points.empty:
        return empty_figure()
    df = points.assign(
        leaf=[
            _short(m) if m else f"{i} GPU {g}"
            for m, i, g in zip(points["mig_uuid"], points["instance"], points["gpu"], strict=True)
        ],
        dram_active=points["dram_active"].round(4),
        pipe_active=points["pipe_active"].round(4),
    )
    axis = {"type": "quantitative", "scale": {"domain": [0, 1]}, "axis": {"format": ".0%"}}
    return {
        **_data(rows(df, ["leaf", "uuid", "mig_uuid", "holders", "class", "dram_active", "pipe_active"])),
        "layer": [
            _diagonal(axis),
            {
                "params": [_pick()],
                "mark": {
                    "type": "point",
                    "filled": True,
                    "size": 120,
                    "opacity": 0.9,
                    "stroke": "white",
                    "cursor": "pointer",
                },
                "encoding": {
                    **_roofline_xy(axis),
                    "color": _class_color(set(df["class"])),
                    "tooltip": [
                        {"field": "leaf", "title": "GPU"},
                        {"field": "holders"},
                        {"field": "uuid"},
                        {"field": "dram_active", "title": "DRAM bandwidth active", "format": ".0%"},
                        {"field": "pipe_active", "title": "busiest pipe active", "format": ".0%"},
                        {"field": "class"},
                    ],
                },
            },
        ],
        "height": 460,
    }


def boundness_area(series: pd.DataFrame) -> Chart:
    """How many GPUs/slices are in each boundness class over time (stacked)."""
    if series.empty or "class" not in series.columns:
        return empty_figure()
    df = _times(series).sort_values("t", kind="stable")
    scale = _class_scale(set(df["class"]))
    order = {c: i for i, c in enumerate(scale["domain"])}
    df = df.assign(order=[order[c] for c in df["class"]])
    return {
        **_data(rows(df, ["t", "time", "class", "value", "order"])),
        "mark": {"type": "area", "interpolate": "linear"},
        "encoding": {
            "x": _time_x(df),
            "y": {"field": "value", "type": "quantitative", "stack": "zero", "title": "GPUs / MIG slices"},
            "color": {"field": "class", "type": "nominal", "scale": scale, "legend": {"title": "bound by"}},
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [{"field": "time"}, {"field": "class"}, {"field": "value", "format": ",.2~f"}],
        },
        "height": 340,
    }


def _bars(
    df: pd.DataFrame,
    x: str,
    y: str,
    *,
    y_title: str,
    tooltip: Sequence[dict[str, Any]],
    color: dict[str, Any] | None = None,
    y_format: str | None = None,
    height: int = 320,
    x_title: str | None = None,
) -> Chart:
    """Vertical bars of ``y`` per ``x`` (stacked when ``color`` is a field)."""
    color_field = [color["field"]] if color and "field" in color else []
    fields = list(dict.fromkeys([x, y, *(t["field"] for t in tooltip), *color_field]))
    y_enc: dict[str, Any] = {"field": y, "type": "quantitative", "title": y_title}
    if y_format:
        y_enc["axis"] = {"format": y_format}
    encoding: dict[str, Any] = {
        "x": {
            "field": x,
            "type": "nominal",
            "sort": None,
            "title": x_title,
            "axis": {"labelAngle": -30, "labelLimit": 260},
        },
        "y": y_enc,
        "tooltip": list(tooltip),
    }
    if color:
        encoding["color"] = color
    return {**_data(rows(df, fields)), "mark": {"type": "bar"}, "encoding": encoding, "height": height}


def waste_bar(waste: pd.DataFrame) -> Chart:
    """Wasted (allocated but idle) GPU-hours per namespace, cost on hover."""
    if waste.empty:
        return empty_figure()
    df = waste.assign(cost=[f"${c:,.2f}" if pd.notna(c) else "no price" for c in waste["cost_usd"]])
    return _bars(
        df,
        "namespace",
        "gpu_hours",
        y_title="idle GPU-hours while allocated",
        color={"value": "#e53935"},
        tooltip=[
            {"field": "namespace"},
            {"field": "gpu_hours", "title": "GPU-hours", "format": ",.2f"},
            {"field": "cost"},
            {"field": "pods"},
        ],
    )


def mig_layout_figure(layout: pd.DataFrame) -> Chart:
    """Each MIG GPU as a row of its slices (width = compute slices), labelled with the profile and
    who holds it; free slices are grey."""
    if layout.empty:
        return empty_figure("no MIG GPUs")
    where = layout["node"] if "node" in layout.columns and (layout["node"] != "").any() else layout["instance"]
    df = layout.assign(row=[f"{i} GPU {g}" for i, g in zip(where, layout["gpu"], strict=True)])
    end = df.groupby("row", sort=False)["slices"].cumsum()
    df = df.assign(
        start=end - df["slices"],
        end=end,
        mid=end - df["slices"] / 2.0,
        holder=[h or "free" for h in df["holders"]],
        state=["held" if h else "free" for h in df["holders"]],
        label=[
            "\n".join([str(p), *_wrap(h or "free", int(n))])
            for p, h, n in zip(df["mig_profile"], df["holders"], df["slices"], strict=True)
        ],
    )
    order = list(dict.fromkeys(df["row"]))
    y = {"field": "row", "type": "nominal", "sort": order, "title": None}
    fields = [
        "row",
        "start",
        "end",
        "mid",
        "state",
        "holder",
        "label",
        "mig_profile",
        "gpu_instance_id",
        "mig_uuid",
        "uuid",
    ]
    return {
        **_data(rows(df, fields)),
        "layer": [
            {
                "params": [_pick()],
                "mark": {"type": "bar", "stroke": "white", "strokeWidth": 2, "cursor": "pointer"},
                "encoding": {
                    "y": y,
                    "x": {"field": "start", "type": "quantitative", "title": "compute slices"},
                    "x2": {"field": "end"},
                    "color": {
                        "field": "state",
                        "type": "nominal",
                        "legend": None,
                        "scale": {"domain": ["held", "free"], "range": ["#43a047", "#cfd8dc"]},
                    },
                    "tooltip": [
                        {"field": "row", "title": "GPU"},
                        {"field": "mig_profile", "title": "profile"},
                        {"field": "gpu_instance_id", "title": "GPU instance"},
                        {"field": "mig_uuid"},
                        {"field": "holder", "title": "held by"},
                    ],
                },
            },
            {
                "mark": {"type": "text", "lineBreak": "\n", "fontSize": 11},
                "encoding": {"y": y, "x": {"field": "mid", "type": "quantitative"}, "text": {"field": "label"}},
            },
        ],
        "height": max(120, 72 * len(order)),
    }


MIG_LABEL_CHARS = 18
"""Characters of a MIG layout label that fit across one compute slice (of 7 across the page)."""
MIG_LABEL_LINES = 3
"""Lines of a MIG layout bar's holder label at most (under its profile)."""


def _wrap(text: str, slices: int) -> list[str]:
    """``text`` in lines that fit a MIG layout bar of ``slices`` compute slices, broken after a
    ``/``, ``-``, ``,`` or space (pod names: ``inference/asr-stream-fx5qr9vj7p-kg8fn``); cut with
    ``…`` only past :data:`MIG_LABEL_LINES` lines (the full text is in the tooltip)."""
    room = MIG_LABEL_CHARS * max(1, slices)
    parts = re.findall(r"[^/\-, ]*(?:[/\-, ]+|$)", text)
    lines: list[str] = []
    line = ""
    for part in (p for p in parts if p):
        while len(part) > room:  # a piece longer than a line: split it
            if line:
                lines.append(line)
                line = ""
            lines.append(part[:room])
            part = part[room:]
        if len(line) + len(part) > room:
            lines.append(line)
            line = ""
        line += part
    if line:
        lines.append(line)
    lines = [x.rstrip() for x in lines]
    if len(lines) > MIG_LABEL_LINES:
        lines = [*lines[: MIG_LABEL_LINES - 1], _fit(" ".join(lines[MIG_LABEL_LINES - 1 :]), slices)]
    return lines


def distinct_colours(n: int) -> list[str]:
    """``n`` colours no two alike, for a legend of as many names (pods): hues a golden angle apart,
    every other one darker, so neighbours in the legend differ in hue and lightness."""
    out = []
    for i in range(n):
        hue = (0.58 + i * 0.381966) % 1.0
        light = 0.42 if i % 2 == 0 else 0.62
        r, g, b = colorsys.hls_to_rgb(hue, light, 0.7)
        out.append(f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}")
    return out


def sm_share_bar(shares: pd.DataFrame) -> Chart:
    """Per time-sliced GPU, each pod's share of SM time (stacked; the gap to 1 is idle time), a
    colour per pod no other pod has; the GPU named by its node (or exporter) and index where
    ``shares`` has ``node``/``instance`` and ``gpu``, else by its shortened UUID."""
    df = shares[shares["pod"] != ""] if not shares.empty else shares
    if df.empty:
        return empty_figure("no per-pod SM share")
    if "gpu" in df.columns:
        where = df["node"] if "node" in df.columns else pd.Series([""] * len(df), index=df.index)
        if "instance" in df.columns:
            where = where.where(where != "", df["instance"])
        names = [f"{w} GPU {g}" if g != "" else _short(u) for w, g, u in zip(where, df["gpu"], df["uuid"], strict=True)]
    else:
        names = [_short(u) for u in df["uuid"]]
    df = df.assign(gpu=names, who=df["namespace"] + "/" + df["pod"])
    pods = sorted(set(df["who"]))
    chart = _bars(
        df,
        "gpu",
        "sm_share",
        y_title="share of SM time",
        y_format=".0%",
        x_title="GPU",
        color={
            "field": "who",
            "type": "nominal",
            "scale": {"domain": pods, "range": distinct_colours(len(pods))},
            "legend": {"title": "pod", "labelLimit": 1000},
        },
        tooltip=[
            {"field": "who", "title": "pod"},
            {"field": "gpu", "title": "GPU"},
            {"field": "uuid"},
            {"field": "sm_share", "title": "share of SM time", "format": ".0%"},
        ],
        height=340,
    )
    chart["encoding"]["y"]["scale"] = {"domain": [0, 1]}
    return chart


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
            (f"{w} GPU {g}" if w else _short(u)) + (f"{_LINE}MIG {m.removeprefix('MIG-')[:8]}" if m else "")
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
    bars = _bars(
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
    bars["encoding"]["x"]["axis"] = {"labelAngle": 0, "labelLimit": 260, "labelExpr": f"split(datum.label, '{_LINE}')"}
    bars["encoding"]["xOffset"] = {"field": "probe"}
    bars["params"] = [_pick()]
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
    return _bars(
        counts,
        "reason",
        "gpus",
        y_title="GPUs affected",
        color={"value": "#fb8c00"},
        tooltip=[{"field": "reason"}, {"field": "gpus", "title": "GPUs"}],
        height=280,
    )


def savings_bar(table: pd.DataFrame) -> Chart:
    """GPU-hours that could be saved per workload (``namespace``, ``workload``,
    ``gpu_hours_saved``, ``recommendation``), coloured by recommendation, largest on top."""
    saving = table[table["gpu_hours_saved"] > 0].sort_values("gpu_hours_saved", ascending=False)
    if saving.empty:
        return empty_figure("nothing to save")
    df = saving.assign(who=saving["namespace"] + "/" + saving["workload"])
    kinds = list(dict.fromkeys(df["recommendation"]))
    return {
        **_data(rows(df, ["who", "gpu_hours_saved", "recommendation"])),
        "mark": {"type": "bar"},
        "encoding": {
            # the whole namespace/kind/name on the axis (a workload's name is what a reader scans)
            "y": {
                "field": "who",
                "type": "nominal",
                "sort": list(dict.fromkeys(df["who"])),
                "title": None,
                "axis": {"labelLimit": 320},
            },
            "x": {"field": "gpu_hours_saved", "type": "quantitative", "title": "GPU-hours saved over the window"},
            "color": {
                "field": "recommendation",
                "type": "nominal",
                "scale": {"domain": kinds, "range": [RECOMMENDATION_COLORS.get(k, "#757575") for k in kinds]},
                "legend": {"title": "Advice"},
            },
            "tooltip": [
                {"field": "who", "title": "Workload"},
                {"field": "recommendation", "title": "Advice"},
                {"field": "gpu_hours_saved", "title": "GPU-hours saved", "format": ",.1f"},
            ],
        },
        "height": max(120, 30 * df["who"].nunique() + 40),
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
    d = _times(df.assign(value=df["value"] / scale, series=df["series"].astype(str))).sort_values("t", kind="stable")
    names = list(dict.fromkeys(d["series"]))
    y: dict[str, Any] = {"field": "value", "type": "quantitative", "title": title or None, "axis": {"format": fmt}}
    if full_scale:
        y["scale"] = {"domain": [0, 1]}
    columns = max(1, min(len(names), legend_columns))
    encoding: dict[str, Any] = {
        "x": _time_x(d),
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
        **_data(rows(d, ["t", "time", "series", "value"])),
        "mark": {"type": "line", "interpolate": "linear", "point": False},
        "encoding": encoding,
        # the page fits axes and legend into the height: each further row of names adds its own
        "height": 240 + 20 * (math.ceil(len(names) / columns) - 1),
    }


def state_strip(timeline: pd.DataFrame, label: str) -> Chart:
    """Which state (boundness class, throttle reason) each leaf was in over time, as coloured marks;
    boundness classes in their page-wide colours."""
    if timeline.empty:
        return empty_figure("never")
    d = _times(timeline)
    y = "leaf" if label == "class" else label
    states = list(dict.fromkeys(d[label]))
    color: dict[str, Any] = {"field": label, "type": "nominal", "legend": {"title": label}}
    if label == "class":
        color["scale"] = _class_scale(set(states))
    else:
        color["sort"] = states
    return {
        **_data(rows(d, list(dict.fromkeys(["t", "time", y, label])))),
        "mark": {"type": "square", "size": 70, "opacity": 1},
        "encoding": {
            "x": _time_x(d),
            "y": {"field": y, "type": "nominal", "title": None},
            "color": color,
            "tooltip": [{"field": "time"}, {"field": y}, {"field": label}],
        },
        "height": max(60, 32 * d[y].nunique() + 20),
    }


NIC_DIRECTION_COLORS: dict[str, str] = {"sent": "#1e88e5", "received": "#43a047"}
"""A NIC's two directions on the Network page's charts."""


def nic_throughput_bars(nics: pd.DataFrame) -> Chart:
    """Each NIC's throughput now, sent and received side by side (Gb/s), against its line rate
    each way (a black tick): ``nics`` are frames.nic_table rows of one node."""
    if nics.empty:
        return empty_figure("no NICs")
    long = pd.concat(
        [nics.assign(direction=name, gbps=nics[col] * 8 / 1e9) for col, name in (("tx", "sent"), ("rx", "received"))],
        ignore_index=True,
    )
    long = long.assign(
        line_gbps=long["line_rate"] * 8 / 1e9,
        use=(long["gbps"] / (long["line_rate"] * 8 / 1e9)).where(long["line_rate"] > 0),
    )
    order = list(dict.fromkeys(nics["device"]))
    x = {"field": "device", "type": "nominal", "sort": order, "title": None,
         "axis": {"labelAngle": -60, "labelLimit": 160}}  # fmt: skip
    y_title = "Gb/s each way"
    tooltip = [
        {"field": "device", "title": "NIC"},
        {"field": "direction"},
        {"field": "gbps", "title": "Gb/s", "format": ",.1f"},
        {"field": "line_gbps", "title": "line rate, Gb/s", "format": ",.0f"},
        {"field": "use", "title": "use", "format": ".0%"},
    ]
    return {
        **_data(rows(long, ["device", "direction", "gbps", "line_gbps", "use"])),
        "layer": [
            {
                "mark": {"type": "bar"},
                "encoding": {
                    "x": x,
                    "xOffset": {"field": "direction", "sort": list(NIC_DIRECTION_COLORS)},
                    "y": {"field": "gbps", "type": "quantitative", "title": y_title, "axis": {"format": ",.0f"}},
                    "color": {
                        "field": "direction",
                        "type": "nominal",
                        "scale": {"domain": list(NIC_DIRECTION_COLORS), "range": list(NIC_DIRECTION_COLORS.values())},
                        "legend": {"title": None, "orient": "top"},
                    },
                    "tooltip": tooltip,
                },
            },
            {
                "mark": {"type": "tick", "color": "#212121", "thickness": 2},
                "encoding": {
                    "x": x,
                    "y": {"field": "line_gbps", "type": "quantitative", "title": y_title},
                    "tooltip": tooltip,
                },
            },
        ],
        "height": 260,
    }


def communication_bars(leaves: pd.DataFrame) -> Chart:
    """Per GPU of the pods in view, the share of the last 5 minutes it spent in class
    ``communication`` (waiting in a collective), coloured by its class now: a straggler stands
    out as the one GPU that computes while its peers wait. ``leaves``: frames.pod_gpu_classes rows."""
    if leaves.empty:
        return empty_figure()
    d = leaves.assign(
        label=[
            f"{p} · GPU {g}" if g else f"{p} · {_short(u)}"
            for p, g, u in zip(leaves["pod"], leaves["gpu"], leaves["uuid"], strict=True)
        ]
    )
    present = set(d["class"])
    return _bars(
        d,
        "label",
        "communication",
        y_title="time in communication (5 min)",
        y_format=".0%",
        x_title=None,
        color=_class_color(present),
        tooltip=[
            {"field": "pod"},
            {"field": "gpu", "title": "GPU"},
            {"field": "class", "title": "class now"},
            {"field": "communication", "title": "in communication", "format": ".0%"},
        ],
        height=280,
    )


def job_mix_bars(mix: pd.DataFrame, order: Sequence[str]) -> Chart:
    """Each job's class mix as one bar across 0-100 %, split by class in the class colours, a row
    per job in ``order`` (the Jobs page's order: most GPU-hours first). ``mix``: job (its label),
    class, share (0..1, ``gpulens:job_boundness:ratio_avg5m``)."""
    df = mix[pd.to_numeric(mix["share"], errors="coerce") > 0] if not mix.empty else mix
    df = df[df["job"].isin(list(order))] if not df.empty else df
    if df.empty:
        return empty_figure("no job has a class (needs GPM: Hopper or newer)")
    scale = _class_scale(set(df["class"]))
    rank = {c: i for i, c in enumerate(scale["domain"])}
    df = df.assign(order=[rank[c] for c in df["class"]])
    shown = [j for j in order if j in set(df["job"])]
    return {
        **_data(rows(df, ["job", "class", "share", "order"])),
        "mark": {"type": "bar"},
        "encoding": {
            "y": {"field": "job", "type": "nominal", "sort": shown, "title": None, "axis": {"labelLimit": 420}},
            "x": {
                "field": "share",
                "type": "quantitative",
                "stack": "zero",
                "scale": {"domain": [0, 1]},
                "axis": {"format": ".0%"},
                "title": "share of the job's GPU time by class, last 5 minutes",
            },
            "color": {"field": "class", "type": "nominal", "scale": scale, "legend": {"title": "bound by"}},
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [
                {"field": "job"},
                {"field": "class"},
                {"field": "share", "title": "share", "format": ".0%"},
            ],
        },
        # the page fits the x axis and its title into the height too
        "height": 28 * len(shown) + 70,
    }


JOB_TRACKS: tuple[tuple[str, str], ...] = (
    ("activity", "SM activity (busy ratio where a GPU has no GPM)"),
    ("class", "Class (what bounds the pod on the GPU)"),
    ("sm_clock", "SM clock, share of its maximum"),
)
"""The Job page's strips, top to bottom: (track of frames.job_timeline, title)."""
JOB_ROW_PX = 26
"""Height of one GPU's row in each strip, in pixels (less for jobs of more than 40 GPUs)."""


def job_timelines(timeline: pd.DataFrame, order: Sequence[str], *, start: float, end: float, step: float) -> Chart:
    """The Job page's GPUs over one time axis: a strip per track (JOB_TRACKS), each a row per GPU in
    ``order`` (node, then GPU index) and a cell per step from ``start`` to ``end`` (Unix s): SM
    activity and SM clock in two scales of one hue each, the class in the class colours. A
    straggler's row stands out in all three: its peers wait (class communication, activity down)
    while it computes at a lower clock. ``timeline``: frames.job_timeline rows."""
    if timeline.empty:
        return empty_figure("no sample of the job's GPUs in the range")
    d = _times(timeline.assign(value=pd.to_numeric(timeline["value"], errors="coerce")))
    d = d.assign(t2=[min(t + step * 1000.0, end * 1000.0) for t in d["t"]], pct=d["value"])
    rows_px = max(4, min(JOB_ROW_PX, 880 // max(1, len(order))))
    x = _time_x(pd.DataFrame({"t": [start * 1000.0, end * 1000.0]}))
    x["scale"] = {"type": "utc", "domain": [start * 1000.0, end * 1000.0]}
    if end - start >= 600:  # minutes are enough, and a tick every minute or so crowds the axis
        x["axis"] = {**x["axis"], "labelExpr": "utcFormat(datum.value, '%H:%M')", "tickCount": 10}
    y = {
        "field": "row",
        "type": "nominal",
        "sort": list(order),
        "scale": {"domain": list(order)},
        "title": None,
        "axis": {"labelLimit": 300, "labelOverlap": True},
    }
    ratio = {"type": "quantitative", "field": "value"}
    colors: dict[str, dict[str, Any]] = {
        "activity": {**ratio, "scale": {"scheme": "viridis", "domain": [0, 1]},
                     "legend": {"title": "SM activity", "format": ".0%", "orient": "right", "gradientLength": 80}},
        "class": {"field": "class", "type": "nominal", "scale": _class_scale(set(d["class"]) - {""}),
                  "legend": {"title": "class", "orient": "right"}},
        "sm_clock": {**ratio, "scale": {"scheme": "blues", "domain": [0, 1]},
                     "legend": {"title": "SM clock", "format": ".0%", "orient": "right", "gradientLength": 80}},
    }  # fmt: skip
    tips = {
        "activity": {"field": "value", "title": "activity", "format": ".0%"},
        "class": {"field": "class"},
        "sm_clock": {"field": "value", "title": "SM clock / max", "format": ".0%"},
    }
    strips = [
        {
            "title": {"text": title, "anchor": "start", "fontSize": 13, "fontWeight": "normal"},
            "transform": [{"filter": {"field": "track", "equal": track}}],
            "mark": {"type": "rect", "clip": True},
            "encoding": {
                "x": x,
                "x2": {"field": "t2"},
                "y": y,
                "color": colors[track],
                "tooltip": [{"field": "row", "title": "GPU"}, {"field": "time"}, tips[track]],
            },
            "height": rows_px * len(order),
        }
        for track, title in JOB_TRACKS
    ]
    return {
        **_data(rows(d, ["track", "row", "t", "t2", "time", "value", "class"])),
        "vconcat": strips,
        "spacing": 14,
        "resolve": {"scale": {"x": "shared", "color": "independent"}, "legend": {"color": "independent"}},
    }
