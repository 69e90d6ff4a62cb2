"""Efficiency page: what limits each busy GPU (roofline position, boundness class over time)."""

from __future__ import annotations

import streamlit as st

from dashboard import figures, frames, ui


def body(ctx: ui.PageContext) -> None:
    f = ctx.filters
    q = {
        "dram": ui.query("mean", "gpulens_gpu_dram_active_ratio", f, window_s=ctx.window_s),
        "pipe": ui.query("mean", "gpulens_gpu_pipe_active_max_ratio", f, window_s=ctx.window_s),
        "bound": ui.query("current_state", "gpulens_gpu_boundness", f),
        "alloc": ui.query("instant", "gpulens_pod_gpu_allocation", f),
        "series": ui.query(
            "series", "gpulens_gpu_boundness", f, window_s=ctx.window_s, step_s=ctx.step_s, by=["class"]
        ),
    }
    ui.prefetch(ctx, q.values())
    with ui.panel("Roofline"):
        st.subheader("Roofline: DRAM bandwidth vs busiest pipe")
        points = frames.roofline_points(
            ui.get(ctx, q["dram"]), ui.get(ctx, q["pipe"]), ui.get(ctx, q["bound"]), ui.get(ctx, q["alloc"])
        )
        dense = len(points) > ctx.settings.max_marks
        st.caption(
            f"Means over the last {ui.fmt_duration(ctx.window_s)}; colour = class now. Right = memory-bound, "
            "top = compute-bound, bottom-left = idle, launch- or latency-bound."
            + ("" if dense else " Click a point to open its GPU.")
        )
        if points.empty:
            ui.no_data("roofline (needs GPM: Hopper or newer)")
        elif dense:
            st.caption(
                f"{len(points):,} GPUs and slices, more than a point each ({ctx.settings.max_marks:,} at most): "
                "a circle per 5 % x 5 % cell and class, its size the number there. Filter by cluster or node for "
                "points."
            )
            ui.chart(figures.roofline_density(points), key="roofline_density")
        else:
            ui.chart(figures.roofline_scatter(points), key="roofline", clickable=True)

    with ui.panel("Boundness over time"):
        st.subheader("Boundness over time")
        series = ui.get(ctx, q["series"])
        if series.empty:
            ui.no_data("boundness")
        else:
            ui.chart(figures.boundness_area(series), key="boundness_area")

    with ui.panel("Leaves by class"):
        if not points.empty:
            st.subheader("GPUs and slices by class")
            st.dataframe(
                ui.linked(ui.node_column(points.sort_values(["class", "node", "instance", "gpu"]))),
                hide_index=True,
                column_config={
                    **ui.COLUMN_CONFIG,
                    "dram_active": st.column_config.ProgressColumn("DRAM active", min_value=0.0, max_value=1.0),
                    "pipe_active": st.column_config.ProgressColumn("pipe active", min_value=0.0, max_value=1.0),
                },
            )


ui.page("Efficiency", body)
