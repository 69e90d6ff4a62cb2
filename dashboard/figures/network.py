"""The Network page: each NIC's throughput against its line rate (bytes per second, GB/s, as every
data rate of the pages; the line rate also in Gb/s, as NICs are rated), and each leaf's
communication share (0..1: the time its pod spun in a collective)."""

from __future__ import annotations

import pandas as pd

from dashboard.figures.palette import class_color
from dashboard.figures.vega import Chart, bar_chart, dataset, empty_figure, rows, short_uuid

NIC_DIRECTION_COLORS: dict[str, str] = {"sent": "#1e88e5", "received": "#43a047"}
"""A NIC's two directions on the Network page's charts."""


def nic_throughput_bars(nics: pd.DataFrame) -> Chart:
    """Each NIC's throughput now, sent and received side by side (GB/s: bytes, as every data rate of
    the pages), against its line rate each way (a black tick, in GB/s; its rating in Gb/s in the
    tooltip): ``nics`` are frames.network.nic_table rows of one node."""
    if nics.empty:
        return empty_figure("no NICs")
    long = pd.concat(
        [nics.assign(direction=name, gBps=nics[col] / 1e9) for col, name in (("tx", "sent"), ("rx", "received"))],
        ignore_index=True,
    )
    long = long.assign(
        line_gBps=long["line_rate"] / 1e9,
        line_gbits=long["line_rate"] * 8 / 1e9,
        use=(long["gBps"] / (long["line_rate"] / 1e9)).where(long["line_rate"] > 0),
    )
    order = list(dict.fromkeys(nics["device"]))
    x = {"field": "device", "type": "nominal", "sort": order, "title": None,
         "axis": {"labelAngle": -60, "labelLimit": 160}}  # fmt: skip
    y_title = "GB/s each way"
    tooltip = [
        {"field": "device", "title": "NIC"},
        {"field": "direction"},
        {"field": "gBps", "title": "GB/s", "format": ",.2f"},
        {"field": "line_gBps", "title": "line rate, GB/s", "format": ",.1f"},
        {"field": "line_gbits", "title": "line rate, Gb/s (as rated)", "format": ",.0f"},
        {"field": "use", "title": "use", "format": ".0%"},
    ]
    return {
        **dataset(rows(long, ["device", "direction", "gBps", "line_gBps", "line_gbits", "use"])),
        "layer": [
            {
                "mark": {"type": "bar"},
                "encoding": {
                    "x": x,
                    "xOffset": {"field": "direction", "sort": list(NIC_DIRECTION_COLORS)},
                    "y": {"field": "gBps", "type": "quantitative", "title": y_title, "axis": {"format": ",.1f"}},
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
                    "y": {"field": "line_gBps", "type": "quantitative", "title": y_title},
                    "tooltip": tooltip,
                },
            },
        ],
        "height": 260,
    }


def communication_bars(leaves: pd.DataFrame) -> Chart:
    """Per GPU of the pods in view, the share of the last 5 minutes it spent in class
    ``communication`` (waiting in a collective), coloured by its class now: a straggler stands
    out as the one GPU that computes while its peers wait. ``leaves``: frames.network.pod_gpu_classes rows."""
    if leaves.empty:
        return empty_figure()
    d = leaves.assign(
        label=[
            f"{p} · GPU {g}" if g else f"{p} · {short_uuid(u)}"
            for p, g, u in zip(leaves["pod"], leaves["gpu"], leaves["uuid"], strict=True)
        ]
    )
    present = set(d["class"])
    return bar_chart(
        d,
        "label",
        "communication",
        y_title="time in communication (5 min)",
        y_format=".0%",
        x_title=None,
        color=class_color(present),
        tooltip=[
            {"field": "pod"},
            {"field": "gpu", "title": "GPU"},
            {"field": "class", "title": "class now"},
            {"field": "communication", "title": "in communication", "format": ".0%"},
        ],
        height=280,
    )
