"""The Fleet page's SM activity (0..1): a heatmap cell per GPU with who holds it, or, for fleets
too large for a cell each, its distribution in 5 % bands."""

from __future__ import annotations

from typing import Any

import pandas as pd

from dashboard.figures.vega import BINS, Chart, dataset, empty_figure, pick, ratio_bin, rows

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
        **dataset(rows(cells, fields)),
        "params": [pick()],
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
    gpus = gpus.assign(b=ratio_bin(gpus["value"]), cluster=gpus["cluster"].fillna("").replace("", "(no cluster)"))
    counts = gpus.groupby(["cluster", "b"], as_index=False).size().rename(columns={"size": "gpus"})
    counts = counts.assign(lo=counts["b"] / BINS, hi=(counts["b"] + 1) / BINS)
    counts = counts.assign(band=[f"{lo:.0%}-{hi:.0%}" for lo, hi in zip(counts["lo"], counts["hi"], strict=True)])
    return {
        **dataset(rows(counts, ["cluster", "lo", "hi", "band", "gpus"])),
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
