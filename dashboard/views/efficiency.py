"""Efficiency page: what limits each busy GPU (roofline position, boundness class over time), and
what its links move (PCIe and NVLink throughput and utilisation)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import ui
from dashboard.figures.roofline import roofline_density, roofline_scatter
from dashboard.figures.timelines import boundness_area, time_lines
from dashboard.frames.fleet import BOUNDNESS_NOW_LABELS, boundness_now, roofline_points
from dashboard.frames.links import (
    LINK_COUNTERS,
    LINK_UTILIZATION,
    TRANSFER_ACTIVE,
    busiest_links,
    leaf_links,
    link_totals,
    measured_links,
    outbound,
)
from dashboard.sources.source import RATE_WINDOW_MIN_SECONDS

# (comments, not docstrings: Streamlit's magic would draw a string under an assignment on the page)
# Most GPUs and slices the per-GPU link chart draws a line for (the busiest ones).
LINK_LINES = 8
# Most devices in view for which the page fetches each one's link use over time; over it (a
# fleet), the table's means stand in, and a cluster or node filter brings the lines back.
LINK_LINES_IN_VIEW = 64
# A device's busiest link must average this share of its capacity over the range to get a line.
LINK_BUSY_AT_LEAST = 0.01


def body(ctx: ui.PageContext) -> None:
    f = ctx.filters
    q = {
        "dram": ui.query("mean", "gpulens_gpu_dram_active_ratio", f, window=ctx.window),
        "pipe": ui.query("mean", "gpulens_gpu_pipe_active_max_ratio", f, window=ctx.window),
        # only the labels the page reads: at 10,000 GPUs an answer of 10,000 series (issue 54)
        "bound": ui.query("current_state", "gpulens_gpu_boundness", f, by=BOUNDNESS_NOW_LABELS),
        "alloc": ui.query("instant", "gpulens_pod_gpu_allocation", f),
        "series": ui.query("series", "gpulens_gpu_boundness", f, window=ctx.window, step_s=ctx.step_s, by=["class"]),
    }
    ui.prefetch(ctx, q.values())
    with ui.panel("Roofline"):
        st.subheader("Roofline: DRAM bandwidth vs busiest pipe")
        points = roofline_points(
            ui.get(ctx, q["dram"]), ui.get(ctx, q["pipe"]), ui.get(ctx, q["bound"]), ui.get(ctx, q["alloc"])
        )
        dense = len(points) > ctx.settings.max_marks
        st.caption(
            f"Means over {ui.over(ctx)}; colour = class now. Right = memory-bound, "
            "top = compute-bound, bottom-left = idle, launch-, latency- or transfer-bound (moving data over "
            "PCIe or NVLink: the links below)." + ("" if dense else " Click a point to open its GPU.")
        )
        if points.empty:
            ui.no_data("No roofline: no GPU in view reports DRAM and pipe activity, which need GPM (Hopper or newer).")
        elif dense:
            st.caption(
                f"{len(points):,} GPUs and slices, more than a point each ({ctx.settings.max_marks:,} at most): "
                "a circle per 5 % x 5 % cell and class, its size the number there. Filter by cluster or node for "
                "points."
            )
            ui.chart(roofline_density(points), key="roofline_density")
        else:
            ui.chart(roofline_scatter(points), key="roofline", clickable=True)

    with ui.panel("Boundness over time"):
        st.subheader("Boundness over time")
        series = ui.get(ctx, q["series"])
        if series.empty:
            ui.no_data(
                f"No GPU in view had a boundness class in {ui.over(ctx)}: a class needs GPM counters (Hopper or "
                "newer) and a first sample."
            )
        else:
            ui.chart(boundness_area(series), key="boundness_area")

    use_means: dict[str, pd.DataFrame] = {}
    with ui.panel("Data movement"):
        use_means = data_movement(ctx, len(boundness_now(ui.get(ctx, q["bound"]))))

    with ui.panel("Leaves by class"):
        if not points.empty:
            st.subheader("GPUs and slices by class")
            table = leaf_links(points, use_means, {})
            table = measured_links(table.sort_values(["class", "node", "instance", "gpu"]))
            # what limits each, then what it moved, then who holds it: the columns a reader compares first
            columns = ["node", "instance", "gpu", "class", "dram_active", "pipe_active", *ui.link_columns(table),
                       "holders", "uuid", "mig_uuid"]  # fmt: skip
            table = table[columns]
            if (table["mig_uuid"] == "").all():
                table = table.drop(columns=["mig_uuid"])
            if use_means:
                st.caption(f"Link use: the mean over {ui.over(ctx)}.")
            ui.table(
                ui.linked(ui.node_column(ui.humanize_bytes(ui.link_use_percent(table)))),
                key="leaf_table",
                column_config={
                    **ui.COLUMN_CONFIG,
                    **ui.LINK_COLUMN_CONFIG,
                    "dram_active": st.column_config.ProgressColumn(
                        "DRAM active", format="percent", min_value=0.0, max_value=1.0
                    ),
                    "pipe_active": st.column_config.ProgressColumn(
                        "Busiest pipe active", format="percent", min_value=0.0, max_value=1.0
                    ),
                },
                missing={"dram_active": "not measured", "pipe_active": "not measured", "class": "no class"},
            )


def data_movement(ctx: ui.PageContext, in_view: int) -> dict[str, pd.DataFrame]:
    """The view's link throughput over time and the busiest devices' link use, and each device's
    mean link use over the range (returned: link -> a value per device, for the table). Over
    ``--max-marks`` devices in view none of it: every device's link counters over the range would
    cost the store more than the rest of the page together; a cluster or node filter brings it back."""
    st.subheader("Data movement over PCIe and NVLink")
    if in_view > ctx.settings.max_marks:
        st.caption(
            f"{in_view:,} GPUs and slices in view, more than {ctx.settings.max_marks:,}: filter by cluster or node "
            "for their links."
        )
        return {}
    st.caption(
        "In = into the GPU (host to GPU over PCIe, from its peers over NVLink), out = from it (dashed). Use = the "
        "busier direction over the link's capacity. A GPU whose links are busy while its SMs idle is transfer-bound."
    )
    f = ctx.filters
    rates = {
        key: ui.query("rate", metric, f, window=ctx.window, step_s=ctx.step_s, by=[])
        for key, metric in LINK_COUNTERS.items()
    }
    use = {link: ui.query("mean", metric, f, window=ctx.window) for link, metric in LINK_UTILIZATION.items()}
    ui.prefetch(ctx, [*rates.values(), *use.values()])
    means = {link: ui.get(ctx, qq) for link, qq in use.items()}
    # counted from the links themselves: a GPU without GPM has links but no class
    measured = max((len(df) for df in means.values()), default=0)
    left, right = st.columns(2)
    with left:
        st.markdown("**Throughput of the GPUs in view, GB/s**")
        totals = link_totals({key: ui.get(ctx, qq) for key, qq in rates.items()})
        if totals.empty and measured:
            # The links are measured, but a rate needs its counters a minute apart: a fresh
            # exporter or store has none yet, which is not the same as no data.
            st.caption(
                f"Throughput appears once the byte counters span {RATE_WINDOW_MIN_SECONDS:.0f} s; "
                "the link use beside it is already measured."
            )
        else:
            chart = time_lines(totals, "bytes_per_second", legend_columns=2, dashed=outbound(totals))
            ui.chart(chart, key="link_totals")
    with right:
        st.markdown(f"**Busiest link per GPU, % of capacity (the {LINK_LINES} busiest)**")
        if measured == 0:
            ui.no_data("No link in view reports its use (PCIe and NVLink counters).")
        elif measured > LINK_LINES_IN_VIEW:
            st.caption(
                f"{measured:,} GPUs and slices in view: each one's mean is in the table below. Filter by cluster or "
                f"node (at most {LINK_LINES_IN_VIEW}) for their link use over time."
            )
        else:
            busiest_links_panel(ui.fetch(ctx, "series", TRANSFER_ACTIVE, f, window=ctx.window, step_s=ctx.step_s))
    return means


def busiest_links_panel(active: pd.DataFrame) -> None:
    """The busiest devices' busiest link over time (``active``: every device's)."""
    lines = busiest_links(active, LINK_LINES, LINK_BUSY_AT_LEAST)
    if lines.empty and not active.empty:
        st.success(f"No GPU kept a link {ui.fmt_percent(LINK_BUSY_AT_LEAST)} busy on average over the range.")
    else:
        ui.chart(time_lines(lines, "ratio", full_scale=True, legend_columns=2), key="link_busiest")


ui.page("Efficiency", body)
