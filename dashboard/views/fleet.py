"""Fleet page: how many GPUs, how many are held, how many are really busy (SM activity)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import definitions, figures, frames, ui
from dashboard.source import SourceError


def body(ctx: ui.PageContext) -> None:
    f = ctx.filters
    q = {
        "info": ui.query("instant", "gpulens_gpu_info", f),
        "mig": ui.query("instant", "gpulens_mig_instance_info", f),
        "alloc": ui.query("instant", "gpulens_pod_gpu_allocation", f),
        "idle": ui.query("leaf_idle", f),
        "up": ui.query("instant", "gpulens_up", f),
        "gpu_up": ui.query("instant", "gpulens_gpu_up", f),
        "sm_mean": ui.query("mean", "gpulens_gpu_sm_active_ratio", f, window_s=ctx.window_s),
        "util": ui.query("instant", "gpulens_gpu_utilization_ratio", f),
    }
    ui.prefetch(ctx, q.values())
    with ui.panel("Device counts"):
        info = ui.get(ctx, q["info"])
        mig = ui.get(ctx, q["mig"])
        alloc = ui.get(ctx, q["alloc"])
        try:
            idle = ui.get(ctx, q["idle"])
        except SourceError as exc:  # no recording rules: the counts that need none still show
            st.error(str(exc), icon=":material/warning:")
            idle = pd.DataFrame(columns=["uuid", "mig_uuid", "sm_mean", "value"])
        counts = frames.fleet_counts(info, mig, alloc, idle)
        c1, c2, c3, c4 = st.columns(4)
        c1.metric("Devices", counts["devices"])
        c2.metric("Allocated", counts["allocated"])
        c3.metric("In use", counts["in_use"])
        c4.metric("Allocated but idle", counts["allocated_idle"])
        st.caption(
            f"{counts['gpus']} physical GPUs; a device is a whole GPU or a MIG instance. Idle = SM active "
            f"< {definitions.IDLE_SM_ACTIVE_BELOW:.0%} over {definitions.MEAN_WINDOW} and no kernels running "
            "(launch-bound devices are in use): the recording rules' definition."
        )
        if info.empty:
            ui.no_data("GPUs")

    with ui.panel("Exporters"):
        up = ui.get(ctx, q["up"])
        gpu_up = ui.get(ctx, q["gpu_up"])
        down = gpu_up[gpu_up["value"] < 1] if not gpu_up.empty else gpu_up
        bad = up[up["value"] < 1] if not up.empty else up
        if not bad.empty:
            names = frames.col(bad, "node").where(frames.col(bad, "node") != "", frames.col(bad, "instance"))
            st.error(f"{len(bad)} exporter(s) cannot read their GPUs: " + ", ".join(names))
        if not down.empty:
            st.error(f"{len(down)} GPU(s) lost or unreadable (alert GPULost)", icon=":material/error:")
            table = frames.with_cols(down, ["node", "instance", "gpu", "uuid"])[["node", "instance", "gpu", "uuid"]]
            st.dataframe(ui.linked(ui.node_column(table)), hide_index=True, column_config=ui.COLUMN_CONFIG)

    with ui.panel("SM activity"):
        st.subheader(f"SM activity per GPU (mean over the last {ui.fmt_duration(ctx.window_s)})")
        st.caption(
            "GPM SM activity (warps resident), not NVML GPU-Util: a stream of tiny kernels "
            "shows as busy in nvidia-smi while the SMs idle. MIG instances show their busiest."
        )
        sm_mean = ui.get(ctx, q["sm_mean"])
        gpus = frames.col(sm_mean, "uuid").nunique()
        if sm_mean.empty:
            ui.no_data("SM activity")
        elif gpus > ctx.settings.max_marks:
            st.caption(
                f"{gpus:,} GPUs, more than a cell each ({ctx.settings.max_marks:,} at most): GPUs per 5 % band of "
                "SM activity. Filter by cluster or node for the map of GPUs."
            )
            ui.chart(figures.sm_histogram(sm_mean), key="sm_histogram")
        else:
            ui.chart(figures.sm_heatmap(sm_mean), key="sm_heatmap", clickable=True)
        if not sm_mean.empty:
            ui.gpu_picker(info, key="fleet_gpu")

    with ui.panel("GPU-Util vs SM activity"):
        util = ui.get(ctx, q["util"])
        if not util.empty and not idle.empty:
            # SM active over the idle definition's window (leaf_idle's sm_mean), the busiest MIG instance
            sm_gpu = frames.with_cols(idle, ["uuid"]).groupby("uuid", as_index=False)["sm_mean"].max()
            both = frames.with_cols(util, ["node", "instance", "gpu", "uuid"]).merge(
                sm_gpu.rename(columns={"sm_mean": "sm_active"}), on="uuid"
            )
            lie = both[
                (both["value"] >= definitions.KERNELS_UTIL_AT_LEAST)
                & (both["sm_active"] < definitions.IDLE_SM_ACTIVE_BELOW)
            ]
            if not lie.empty:
                st.warning(
                    f"{len(lie)} GPU(s) look busy in nvidia-smi but their SMs are idle (launch-bound or polling): "
                    f"GPU-Util now, SM active over {definitions.MEAN_WINDOW}"
                )
                table = lie.rename(columns={"value": "gpu_util"})[
                    ["node", "instance", "gpu", "uuid", "gpu_util", "sm_active"]
                ]
                st.dataframe(
                    ui.linked(ui.node_column(table)),
                    hide_index=True,
                    column_config={
                        **ui.COLUMN_CONFIG,
                        "gpu_util": st.column_config.NumberColumn("GPU-Util", format="percent"),
                    },
                )

    with ui.panel("Models"):
        if not info.empty:
            st.subheader("Models")
            models = frames.with_cols(info, ["name", "driver_version", "mig_mode"])
            table = models.groupby(["name", "driver_version", "mig_mode"], as_index=False).size()
            st.dataframe(table.rename(columns={"size": "GPUs"}), hide_index=True)


ui.page("Fleet", body)
