"""The Efficiency page's roofline: each leaf's DRAM activity against its tensor/FP pipe activity
(both 0..1), coloured by boundness class, as a point per leaf or, for many leaves, as circles per
5 % x 5 % cell."""

from __future__ import annotations

from typing import Any

import pandas as pd

from dashboard.figures.palette import class_color
from dashboard.figures.vega import BINS, Chart, dataset, empty_figure, pick, ratio_bin, rows, short_uuid


def roofline_density(points: pd.DataFrame) -> Chart:
    """The roofline's distribution form, for more leaves than ``--max-marks``: one circle per
    5 % x 5 % cell and class, at the cell's centre, its area the number of leaves there."""
    if points.empty:
        return empty_figure()
    df = points.assign(bx=ratio_bin(points["dram_active"]), by=ratio_bin(points["pipe_active"]))
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
        **dataset(rows(cells, ["dram_active", "pipe_active", "dram", "pipe", "class", "leaves"])),
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
                    "color": class_color(set(cells["class"])),
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
            short_uuid(m) if m else f"{i} GPU {g}"
            for m, i, g in zip(points["mig_uuid"], points["instance"], points["gpu"], strict=True)
        ],
        dram_active=points["dram_active"].round(4),
        pipe_active=points["pipe_active"].round(4),
    )
    axis = {"type": "quantitative", "scale": {"domain": [0, 1]}, "axis": {"format": ".0%"}}
    return {
        **dataset(rows(df, ["leaf", "uuid", "mig_uuid", "holders", "class", "dram_active", "pipe_active"])),
        "layer": [
            _diagonal(axis),
            {
                "params": [pick()],
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
                    "color": class_color(set(df["class"])),
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
