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
        "classes": ui.query("current_state", "gpulens_gpu_boundness", f),
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
            f"< {definitions.IDLE_SM_ACTIVE_BELOW:.0%} over {definitions.MEAN_WINDOW}, no kernels running and its "
            "links idle (launch-bound and transfer-bound devices are in use): the recording rules' "
            "definition."
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
            "GPM SM activity (warps resident), not NVML GPU-Util: a stream of tiny kernels, or a copy over "
            "PCIe or NVLink, shows as busy in nvidia-smi while the SMs idle. MIG instances show their busiest."
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

    with ui.panel("Moving data"):
        moving = frames.leaves_in_class(ui.get(ctx, q["classes"]), frames.TRANSFER_CLASS)
        if not moving.empty:
            moving_data(ctx, moving, idle)

    with ui.panel("GPU-Util vs SM activity"):
        lie = frames.busy_but_sm_idle(ui.get(ctx, q["util"]), idle, moving)
        if not lie.empty:
            st.warning(
                f"{len(lie)} GPU(s) look busy in nvidia-smi but their SMs are idle (launch-bound or polling): "
                f"GPU-Util now, SM active over {definitions.MEAN_WINDOW}"
            )
            st.dataframe(
                ui.linked(ui.node_column(lie)),
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


# Throughput "now": each link's rate over the last minute (Prometheus' shortest rate() window, a
# point or two per device however many the fleet has). A comment: Streamlit's magic would draw a docstring.
LINK_NOW_SECONDS = 60.0


def moving_data(ctx: ui.PageContext, moving: pd.DataFrame, idle: pd.DataFrame) -> None:
    """The leaves in class transfer now, as what they are: moving data over PCIe or NVLink while
    their SMs idle, with each link's use and throughput now and SM activity over the idle
    definition's window."""
    f = ctx.filters
    use = {link: ui.query("instant", metric, f) for link, metric in frames.LINK_UTILIZATION.items()}
    rates = {
        key: ui.query("rate", metric, f, window_s=LINK_NOW_SECONDS, step_s=LINK_NOW_SECONDS)
        for key, metric in frames.LINK_COUNTERS.items()
    }
    ui.prefetch(ctx, [*use.values(), *rates.values()])
    table = frames.leaf_links(
        moving,
        {link: ui.get(ctx, qq) for link, qq in use.items()},
        {key: frames.latest(ui.get(ctx, qq)) for key, qq in rates.items()},
    )
    sm = frames.with_cols(idle, frames.LEAF)[[*frames.LEAF, "sm_mean"]].rename(columns={"sm_mean": "sm_active"})
    table = table.merge(sm, on=list(frames.LEAF), how="left")
    leaves = zip(table["mig_uuid"], table["mig_profile"], strict=True)
    table = frames.measured_links(table.assign(device=[frames.leaf_words(m, p) for m, p in leaves]))
    st.info(
        f"{ui.devices(table['mig_uuid'])} moving data: PCIe/NVLink busy, SMs idle (class transfer, e.g. a data "
        "loader copying to the GPU). nvidia-smi counts the copies as busy; the links, not the kernels, are the limit. "
        f"Link use now, throughput over the last minute, SM active over {definitions.MEAN_WINDOW}.",
        icon=":material/swap_horiz:",
    )
    columns = ["node", "instance", "gpu", "device", *ui.link_columns(table), "sm_active", "uuid", "mig_uuid"]
    st.dataframe(
        ui.link_table(table[[c for c in columns if c in table.columns]]),
        hide_index=True,
        column_config={**ui.COLUMN_CONFIG, **ui.LINK_COLUMN_CONFIG},
        key="moving_data",
    )


ui.page("Fleet", body)
