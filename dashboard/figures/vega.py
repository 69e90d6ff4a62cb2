"""What every chart shares: the Vega-Lite spec's named dataset, JSON-ready rows, the time axis,
the GPU point selection (:data:`PICK`), plain bars, and the 5 % bins of the distribution charts.

Times are epoch milliseconds on a UTC scale (the sidebar's range is in UTC too). Charts whose
marks stand for a GPU or a MIG instance carry ``uuid`` and ``mig_uuid`` in their rows and a point
selection named :data:`PICK` on those fields: a click reaches the page as
``event.selection[PICK] == [{"uuid": ..., "mig_uuid": ...}]`` and opens the GPU page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

Chart = dict[str, Any]
"""A Vega-Lite specification."""


PICK = "pick"
"""Name of the point selection on charts whose marks are GPUs or MIG instances."""


_TIME_FORMAT = "%Y-%m-%d %H:%M:%S UTC"


LINE_BREAK = " · "
"""Where an axis label breaks into lines (``labelExpr`` splits on it; the tooltip shows it whole)."""


def short_uuid(uuid: str) -> str:
    """A UUID cut to its first 12 characters and ``…`` (a label's room; the tooltip has it whole)."""
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


def dataset(values: list[dict[str, Any]]) -> dict[str, Any]:
    """A spec's data as a named dataset: Streamlit ships named datasets to the browser with the
    spec, so the first render already has its rows (top-level ``data.values`` are sent after it,
    and Vega warns about the empty first pass)."""
    return {"datasets": {DATASET: values}, "data": {"name": DATASET}}


def data_of(chart: Chart) -> list[dict[str, Any]]:
    """The rows a chart draws (its named dataset)."""
    return list(chart["datasets"][DATASET])


def with_times(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with ``t`` (epoch ms, the x field) and ``time`` (its UTC text, for tooltips)."""
    ts = pd.to_datetime(df["timestamp"], unit="s", utc=True)
    return df.assign(t=(df["timestamp"].astype(float) * 1000.0).round(), time=ts.dt.strftime(_TIME_FORMAT))


def time_x(df: pd.DataFrame) -> dict[str, Any]:
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


def pick(fields: Sequence[str] = ("uuid", "mig_uuid")) -> dict[str, Any]:
    """The :data:`PICK` point selection on ``fields`` (a click on a GPU's or MIG instance's mark)."""
    return {"name": PICK, "select": {"type": "point", "fields": list(fields)}}


def empty_figure(message: str = "no data") -> Chart:
    """A blank chart that says why it is blank."""
    return {
        **dataset([{"message": message}]),
        "mark": {"type": "text", "fontSize": 16, "x": {"expr": "width / 2"}, "y": {"expr": "height / 2"}},
        "encoding": {"text": {"field": "message"}},
        "height": 120,
        "config": {"view": {"stroke": None}},
    }


BINS = 20
"""Bins across 0..100 % in the distribution charts (5 % each)."""


def ratio_bin(values: pd.Series) -> pd.Series:
    """Bin index 0..BINS-1 of ratios (1.0 and above in the last bin, below 0 in the first)."""
    return (pd.to_numeric(values, errors="coerce").fillna(0.0) * BINS).astype(int).clip(0, BINS - 1)


def bar_chart(
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
    return {**dataset(rows(df, fields)), "mark": {"type": "bar"}, "encoding": encoding, "height": height}
