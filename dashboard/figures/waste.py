"""GPU-hours lost and saved: wasted (allocated but idle) GPU-hours per namespace, and the hours the
advisor's recommendations would save per workload."""

from __future__ import annotations

import pandas as pd

from dashboard.figures.palette import RECOMMENDATION_COLORS
from dashboard.figures.vega import Chart, bar_chart, dataset, empty_figure, rows


def waste_bar(waste: pd.DataFrame) -> Chart:
    """Wasted (allocated but idle) GPU-hours per namespace, cost on hover."""
    if waste.empty:
        return empty_figure()
    df = waste.assign(cost=[f"${c:,.2f}" if pd.notna(c) else "no price" for c in waste["cost_usd"]])
    return bar_chart(
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


def savings_bar(table: pd.DataFrame) -> Chart:
    """GPU-hours that could be saved per workload (``namespace``, ``workload``,
    ``gpu_hours_saved``, ``recommendation``), coloured by recommendation, largest on top."""
    saving = table[table["gpu_hours_saved"] > 0].sort_values("gpu_hours_saved", ascending=False)
    if saving.empty:
        return empty_figure("nothing to save")
    df = saving.assign(who=saving["namespace"] + "/" + saving["workload"])
    kinds = list(dict.fromkeys(df["recommendation"]))
    return {
        **dataset(rows(df, ["who", "gpu_hours_saved", "recommendation"])),
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
