"""Fleet page: how many GPUs, how many are held, how many are really busy (SM activity)."""

from __future__ import annotations

import streamlit as st

from dashboard import figures, frames, ui


def body(ctx: ui.PageContext) -> None:
    f = ctx.filters
    thr = ctx.settings.busy_threshold
    with ui.panel("GPU counts"):
        info = ui.fetch(ctx, "instant", "gpulens_gpu_info", f)
        alloc = ui.fetch(ctx, "instant", "gpulens_pod_gpu_allocation", f)
        sm = ui.fetch(ctx, "instant", "gpulens_gpu_sm_active_ratio", f)
        counts = frames.fleet_counts(info, alloc, sm, thr)
        c1, c2, c3, c4 = st.columns(4)
        c1.metric("GPUs", counts["gpus"])
        c2.metric("Allocated", counts["allocated"])
        c3.metric(f"Busy (SM active ≥ {thr:.0%})", counts["busy"])
        c4.metric("Allocated but idle (GPUs/slices)", counts["allocated_idle"])
        if info.empty:
            ui.no_data("GPUs")

    with ui.panel("Exporters"):
        up = ui.fetch(ctx, "instant", "gpulens_up", f)
        gpu_up = ui.fetch(ctx, "instant", "gpulens_gpu_up", f)
        down = gpu_up[gpu_up["value"] < 1] if not gpu_up.empty else gpu_up
        bad = up[up["value"] < 1] if not up.empty else up
        if not bad.empty:
            st.error(f"{len(bad)} exporter(s) cannot read their GPUs: " + ", ".join(frames.col(bad, "instance")))
        if not down.empty:
            st.error(f"{len(down)} GPU(s) lost or unreadable", icon=":material/error:")
            st.dataframe(frames.with_cols(down, ["instance", "gpu", "uuid"])[["instance", "gpu", "uuid"]])

    with ui.panel("SM activity"):
        st.subheader("SM activity per GPU")
        st.caption(
            "GPM SM activity (warps resident), not NVML GPU-Util: a stream of tiny kernels "
            "shows as busy in nvidia-smi while the SMs idle."
        )
        if sm.empty:
            ui.no_data("SM activity")
        else:
            st.plotly_chart(figures.sm_heatmap(sm), key="sm_heatmap")

    with ui.panel("GPU-Util vs SM activity"):
        util = ui.fetch(ctx, "instant", "gpulens_gpu_utilization_ratio", f)
        if not util.empty and not sm.empty:
            sm_gpu = frames.with_cols(sm, ["uuid"]).groupby("uuid", as_index=False)["value"].max()
            both = frames.with_cols(util, ["instance", "gpu", "uuid"]).merge(
                sm_gpu.rename(columns={"value": "sm_active"}), on="uuid"
            )
            lie = both[(both["value"] >= 0.1) & (both["sm_active"] < thr)]
            if not lie.empty:
                st.warning(
                    f"{len(lie)} GPU(s) look busy in nvidia-smi but their SMs are idle (launch-bound or polling)"
                )
                st.dataframe(
                    lie.rename(columns={"value": "gpu_util"})[["instance", "gpu", "uuid", "gpu_util", "sm_active"]],
                    hide_index=True,
                )

    with ui.panel("Models"):
        if not info.empty:
            st.subheader("Models")
            models = frames.with_cols(info, ["name", "driver_version", "mig_mode"])
            table = models.groupby(["name", "driver_version", "mig_mode"], as_index=False).size()
            st.dataframe(table.rename(columns={"size": "GPUs"}), hide_index=True)


ui.page("Fleet", body)
