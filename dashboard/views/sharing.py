"""Sharing page: each MIG GPU with its slices and holders; time-sliced and MPS GPUs with per-pod SM share."""

from __future__ import annotations

import streamlit as st

from dashboard import ui
from dashboard.figures.sharing import kernel_time_bar, mig_layout_figure
from dashboard.frames.columns import with_cols
from dashboard.frames.sharing import MPS_KERNEL_TIME_NOTE, mig_layout, timeslice_shares


def body(ctx: ui.PageContext) -> None:
    f = ctx.filters
    q = {
        "mig": ui.query("instant", "gpulens_mig_instance_info", f),
        "alloc": ui.query("instant", "gpulens_pod_gpu_allocation", f),
        "info": ui.query("instant", "gpulens_gpu_info", f),
        "shares": ui.kernel_time_query("mean", f, window=ctx.window),
        "replicas": ui.query("instant", "gpulens_gpu_sharing_replicas", f),
        "pods": ui.query("instant", "gpulens_gpu_sharing_pods", f),
        "sharing": ui.query("instant", "gpulens_gpu_sharing_info", f),
    }
    ui.prefetch(ctx, q.values())
    with ui.panel("MIG layout"):
        st.subheader("MIG GPUs and their slices")
        mig = ui.get(ctx, q["mig"])
        alloc = ui.get(ctx, q["alloc"])
        info = ui.get(ctx, q["info"])
        layout = mig_layout(mig, alloc, info)
        if layout.empty:
            ui.no_data("No GPU in view is split into MIG instances.")
        else:
            ui.chart(mig_layout_figure(layout), key="mig_layout", clickable=True)
            if "holders" in layout.columns:  # a slice no pod holds reads free, as on the chart
                layout = layout.assign(holders=[h if isinstance(h, str) and h else "free" for h in layout["holders"]])
            ui.table(
                # the GPU page's link names the GPU: its UUID would only widen the table
                ui.ids_last(ui.linked(ui.node_column(layout)).drop(columns=["gpu_name", "uuid"])),
                key="mig_table",
                column_config=ui.COLUMN_CONFIG,
                missing={"gpu_instance_id": "unknown"},
            )

    with ui.panel("Time-slicing and MPS"):
        st.subheader("Shared GPUs: kernel time per pod")
        st.caption(
            f"Mean share of sampled time each pod's kernels ran on the GPU over {ui.over(ctx)} "
            "(time-slicing), and the pods of MPS GPUs."
        )
        shares = ui.kernel_time(ctx, q["shares"])
        replicas = ui.get(ctx, q["replicas"])
        pods = ui.get(ctx, q["pods"])
        sharing = ui.get(ctx, q["sharing"])
        alloc = ui.get(ctx, q["alloc"])
        table = timeslice_shares(shares, replicas, pods, sharing, alloc)
        where = with_cols(info, ["uuid", "node", "instance", "gpu"])[["uuid", "node", "instance", "gpu"]]
        table = table.merge(where.drop_duplicates("uuid"), on="uuid", how="left")
        for c in ("node", "instance", "gpu"):
            table[c] = table[c].fillna("")
        if table.empty:
            ui.no_data("No GPU in view is shared by time-slicing or MPS.")
        else:
            if (table["mode"] == "mps").any():
                st.info(
                    f"MPS GPUs: {MPS_KERNEL_TIME_NOTE}. NVML reports one per-process utilisation entry "
                    "there, the MPS server's, so SM time cannot be split between the clients; each pod's "
                    "memory is still its own (Workloads).",
                    icon=":material/info:",
                )
            ui.chart(kernel_time_bar(table[table["mode"] != "mps"]), key="kernel_time")
            shown = ui.linked(ui.node_column(table))
            order = (ui.GPU_LINK, "node", "instance", "gpu", "mode", "namespace", "pod", "kernel_time", "note",
                     "replicas", "pods")  # fmt: skip
            shown = shown[[c for c in order if c in shown.columns]]
            ui.table(
                shown,
                key="shared_table",
                column_config={
                    **ui.COLUMN_CONFIG,
                    "kernel_time": st.column_config.ProgressColumn(
                        "Kernel time",
                        format="percent",
                        min_value=0.0,
                        max_value=1.0,
                        help="share of sampled time the pod's kernels ran on the GPU (NVML per-process utilisation)",
                    ),
                    "pods": st.column_config.NumberColumn("Pods on the GPU", format="localized"),
                },
                missing={"kernel_time": ["MPS: not split" if m == "mps" else "not reported" for m in shown["mode"]]},
            )


ui.page("Sharing", body)
