"""The Sharing page: each MIG GPU as a row of its slices with who holds them, and each pod's
kernel time (0..1: the share of sampled time its kernels ran) on a time-sliced GPU."""

from __future__ import annotations

import re

import pandas as pd

from dashboard.figures.palette import distinct_colours
from dashboard.figures.vega import Chart, bar_chart, dataset, empty_figure, pick, rows, short_uuid


def _fit(text: str, slices: int) -> str:
    """``text`` cut to what fits in a MIG layout bar of ``slices`` compute slices (of 7 across the
    page): about 12 characters a slice; the full text is in the tooltip."""
    room = 12 * max(1, slices)
    return text if len(text) <= room else text[: room - 1] + "…"


FULL_LABEL_PX = 600
"""An axis label's room in pixels: a node name and GPU index in full (Vega cuts at 180 px)."""


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
    # the whole label (a node name and GPU index), never cut: Vega's default limit is 180 px
    y = {"field": "row", "type": "nominal", "sort": order, "title": None, "axis": {"labelLimit": FULL_LABEL_PX}}
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
        **dataset(rows(df, fields)),
        "layer": [
            {
                "params": [pick()],
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


def kernel_time_bar(shares: pd.DataFrame) -> Chart:
    """Per time-sliced GPU, each pod's kernel time (stacked; the gap to 1 is idle time), a
    colour per pod no other pod has; the GPU named by its node (or exporter) and index where
    ``shares`` has ``node``/``instance`` and ``gpu``, else by its shortened UUID."""
    df = shares[shares["pod"] != ""] if not shares.empty else shares
    if df.empty:
        return empty_figure("no per-pod kernel time")
    if "gpu" in df.columns:
        where = df["node"] if "node" in df.columns else pd.Series([""] * len(df), index=df.index)
        if "instance" in df.columns:
            where = where.where(where != "", df["instance"])
        names = [
            f"{w} GPU {g}" if g != "" else short_uuid(u) for w, g, u in zip(where, df["gpu"], df["uuid"], strict=True)
        ]
    else:
        names = [short_uuid(u) for u in df["uuid"]]
    df = df.assign(gpu=names, who=df["namespace"] + "/" + df["pod"])
    pods = sorted(set(df["who"]))
    chart = bar_chart(
        df,
        "gpu",
        "kernel_time",
        y_title="kernel time, share of sampled time",
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
            {"field": "kernel_time", "title": "kernel time", "format": ".0%"},
        ],
        height=340,
    )
    chart["encoding"]["y"]["scale"] = {"domain": [0, 1]}
    return chart
