"""The Jobs and Job pages: each job's boundness class mix (shares, 0..1) and one job's leaves over
time, a track per figure (times in epoch milliseconds, UTC)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from dashboard.figures.palette import class_scale
from dashboard.figures.vega import Chart, dataset, empty_figure, rows, time_x, with_times


def job_mix_bars(mix: pd.DataFrame, order: Sequence[str]) -> Chart:
    """Each job's class mix as one bar across 0-100 %, split by class in the class colours, a row
    per job in ``order`` (the Jobs page's order: most GPU-hours first). ``mix``: job (its label),
    class, share (0..1, ``gpulens:job_boundness:ratio_avg5m``)."""
    df = mix[pd.to_numeric(mix["share"], errors="coerce") > 0] if not mix.empty else mix
    df = df[df["job"].isin(list(order))] if not df.empty else df
    if df.empty:
        return empty_figure("no job has a class (needs GPM: Hopper or newer)")
    scale = class_scale(set(df["class"]))
    rank = {c: i for i, c in enumerate(scale["domain"])}
    df = df.assign(order=[rank[c] for c in df["class"]])
    shown = [j for j in order if j in set(df["job"])]
    return {
        **dataset(rows(df, ["job", "class", "share", "order"])),
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
"""The Job page's strips, top to bottom: (track of frames.jobs.job_timeline, title)."""


JOB_ROW_PX = 26
"""Height of one GPU's row in each strip, in pixels (less for jobs of more than 40 GPUs)."""


def job_timelines(timeline: pd.DataFrame, order: Sequence[str], *, start: float, end: float, step: float) -> Chart:
    """The Job page's GPUs over one time axis: a strip per track (JOB_TRACKS), each a row per GPU in
    ``order`` (node, then GPU index) and a cell per step from ``start`` to ``end`` (Unix s): SM
    activity and SM clock in two scales of one hue each, the class in the class colours. A
    straggler's row stands out in all three: its peers wait (class communication, activity down)
    while it computes at a lower clock. ``timeline``: frames.jobs.job_timeline rows."""
    if timeline.empty:
        return empty_figure("no sample of the job's GPUs in the range")
    d = with_times(timeline.assign(value=pd.to_numeric(timeline["value"], errors="coerce")))
    d = d.assign(t2=[min(t + step * 1000.0, end * 1000.0) for t in d["t"]], pct=d["value"])
    rows_px = max(4, min(JOB_ROW_PX, 880 // max(1, len(order))))
    x = time_x(pd.DataFrame({"t": [start * 1000.0, end * 1000.0]}))
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
        "class": {"field": "class", "type": "nominal", "scale": class_scale(set(d["class"]) - {""}),
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
        **dataset(rows(d, ["track", "row", "t", "t2", "time", "value", "class"])),
        "vconcat": strips,
        "spacing": 14,
        "resolve": {"scale": {"x": "shared", "color": "independent"}, "legend": {"color": "independent"}},
    }
