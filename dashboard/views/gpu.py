"""GPU page: one GPU over the range, every device series the exporter has, and who held it.

Opened from any table or chart that names a GPU (``/gpu?uuid=GPU-…``, with the view's range and
filters); without a GPU in the URL it offers a picker.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import figures, frames, ui
from dashboard.source import Filters, bounded_step, rate_steps


def body(ctx: ui.PageContext) -> None:
    info = ui.fetch(ctx, "instant", "gpulens_gpu_info", ctx.filters)
    gpus = frames.with_cols(info, ["uuid", "gpu", "node", "instance", "name"])
    where = gpus["node"].where(gpus["node"] != "", gpus["instance"])
    names = {
        u: f"{w} · GPU {g} · {n} · {u}"
        for u, g, w, n in zip(gpus["uuid"], gpus["gpu"], where, gpus["name"], strict=True)
    }
    wanted = str(st.query_params.get("uuid", ""))
    options = sorted(names, key=lambda u: names[u])
    if wanted and wanted not in names:
        options = [wanted, *options]
        names[wanted] = f"{wanted} (not exported now)"
    if not options:
        ui.no_data("GPUs")
        return
    uuid = st.selectbox(
        "GPU", options, index=options.index(wanted) if wanted in options else 0, format_func=lambda u: names[u]
    )
    if uuid != wanted:
        st.query_params["uuid"] = uuid
        if "mig_uuid" in st.query_params:
            del st.query_params["mig_uuid"]
    mig = str(st.query_params.get("mig_uuid", ""))

    with ui.panel("Identity"):
        ident = frames.with_cols(
            info[frames.col(info, "uuid") == uuid], ["name", "driver_version", "mig_mode", "pci_bus_id"]
        )
        if not ident.empty:
            row = ident.iloc[0]
            c1, c2, c3, c4 = st.columns(4)
            c1.metric("Model", str(row["name"]) or "?")
            c2.metric("Driver", str(row["driver_version"]) or "?")
            c3.metric("MIG", str(row["mig_mode"]) or "disabled")
            c4.metric("PCI", str(row["pci_bus_id"]) or "?")
        if mig:
            st.caption(f"Opened for MIG instance {mig}; the charts show the GPU and every instance on it.")

    with ui.panel("NICs"):
        nics(ctx, uuid, info)

    series = ui.fetch(ctx, "device_series", uuid, window_s=ctx.window_s, step_s=ctx.step_s)
    with ui.panel("Pods that held it"):
        st.subheader("Pods that held this GPU in the range")
        pods = frames.pods_over_range(series)
        if pods.empty:
            st.info("No pod held this GPU in the range.")
        else:
            pods = pods.assign(
                first_seen=[ui.fmt_time(t) for t in pods["first_seen"]],
                last_seen=[ui.fmt_time(t) for t in pods["last_seen"]],
                workload=_job_links(ctx, pods, info[frames.col(info, "uuid") == uuid]),
            )
            st.dataframe(pods, hide_index=True, column_config=PODS_CONFIG)

    with ui.panel("Boundness"):
        st.subheader("Boundness class over time")
        classes = frames.state_timeline(series, "gpulens_gpu_boundness", "class")
        if classes.empty:
            st.info("No boundness class in the range (needs GPM: Hopper or newer).")
        else:
            ui.chart(figures.state_strip(classes, "class"), key="gpu_class")

    with ui.panel("Links"):
        links(series, rate_steps(bounded_step(ctx.window_s, ctx.step_s)[1]))

    with ui.panel("Clock events"):
        st.subheader("Clock events (throttle reasons) over time")
        events = frames.state_timeline(series, "gpulens_gpu_clock_event_active", "reason")
        if events.empty:
            st.success("No clock event held the clocks down in the range.")
        else:
            ui.chart(figures.state_strip(events, "reason"), key="gpu_events")

    panels = frames.device_panels(series)
    if not panels:
        ui.no_data("device series in the range")
    for i, (title, unit, df) in enumerate(panels):
        with ui.panel(title):
            st.subheader(title)
            ui.chart(figures.time_lines(df, unit), key=f"gpu_panel_{i}")


def _job_links(ctx: ui.PageContext, pods: pd.DataFrame, info: pd.DataFrame) -> list[str]:
    """Each holder's job page (frames.pods_over_range's ``workload`` is ``Kind/name``; a pod of no
    owner is the job ``Pod/<pod>``), in the GPU's cluster; ``""`` where the owner has no kind."""
    cluster = str(frames.col(info, "cluster").iloc[0]) if not info.empty else ""
    params = ctx.link_params()
    out = []
    for ns, pod, workload in zip(pods["namespace"], pods["pod"], pods["workload"], strict=True):
        kind, _, name = str(workload).rpartition("/") if workload else ("Pod", "/", str(pod))
        out.append(ui.job_url((cluster, str(ns), kind, name), params) if kind and name else "")
    return out


def nics(ctx: ui.PageContext, uuid: str, info: pd.DataFrame) -> None:
    """The GPU's nearest RDMA NICs (docs/network.md): device, PCIe path, GPUDirect RDMA state and
    reason in words, and each NIC's throughput now (Gb/s each way); the others are on the Network page."""
    row = frames.with_cols(info[frames.col(info, "uuid") == uuid], ["instance"])
    if row.empty:
        return
    on_node = Filters(cluster=ctx.filters.cluster, instance=str(row["instance"].iloc[0]) or None)
    paths = ui.fetch(ctx, "instant", "gpulens_gpu_nic_path_info", on_node)
    paths = paths[frames.col(paths, "uuid") == uuid]
    if paths.empty:
        return  # a node without RDMA NICs: nothing to say on every GPU page
    ready = ui.fetch(ctx, "instant", "gpulens_gpu_nic_gdr_ready", on_node)
    pairs = frames.gpu_nics(paths, ready[frames.col(ready, "uuid") == uuid], info)
    near = pairs[pairs["nearest"]]
    st.subheader("Nearest NICs")
    by = list(frames.NIC_KEYS)
    tx = ui.fetch(ctx, "rate", frames.NIC_TX, on_node, window_s=ctx.window_s, step_s=ctx.step_s, by=by)
    rx = ui.fetch(ctx, "rate", frames.NIC_RX, on_node, window_s=ctx.window_s, step_s=ctx.step_s, by=by)
    rates = frames.nic_table(near.assign(kind="", numa_node="", pci_bus_id=""), pd.DataFrame(), pd.DataFrame(), tx, rx)
    table = near.merge(rates[["device", "tx", "rx"]], on="device", how="left")
    ok = bool(table["gdr_ready"].any())
    st.caption(
        f"{len(table)} of the node's {len(pairs)} NICs are nearest to this GPU. GPUDirect RDMA "
        + (
            "is ready: they read and write its memory directly."
            if ok
            else "is not ready: its RDMA traffic is staged through host memory."
        )
        + " The Network page has every NIC, its errors and the pods holding it."
    )
    shown = table.assign(
        path=[frames.PATH_WORDS.get(str(p), str(p)) for p in table["path"]],
        gdr_ready=["ready" if r else "not ready" for r in table["gdr_ready"]],
        tx=[ui.fmt_bitrate(v) for v in table["tx"]],
        rx=[ui.fmt_bitrate(v) for v in table["rx"]],
    )[["device", "path", "gdr_ready", "reason", "tx", "rx"]]
    st.dataframe(shown, hide_index=True, key="gpu_nics", column_config=NIC_TABLE_CONFIG)


def links(series: pd.DataFrame, steps: int) -> None:
    """PCIe and NVLink: what each link carries (capacity) and where its bytes are read from, the
    range's means, and throughput each way (the rate over ``steps`` steps) and use over time."""
    st.subheader("Links: PCIe and NVLink")
    throughput, use = frames.link_panels(series, steps)
    table = frames.link_table(series)
    if throughput.empty and use.empty and table.empty:
        st.info("No link series in the range (an exporter older than the link counters, or a driver without them).")
        return
    st.caption(
        "In = into the GPU (host to GPU over PCIe, from its peers over NVLink), out = from it (dashed); throughput "
        "is the rate of the exporter's byte counters over each step, or over a minute where the step is shorter. "
        "Use = the busier direction over the link's capacity. Links busy while the SMs idle read class transfer: "
        "the GPU is moving data."
    )
    if not table.empty:
        st.dataframe(
            ui.humanize_bytes(ui.link_use_percent(table, ["mean_utilization", "peak_utilization"])),
            hide_index=True,
            column_config=LINK_TABLE_CONFIG,
            key="gpu_links",
        )
    left, right = st.columns(2)
    with left:
        st.markdown("**Throughput, GB/s**")
        ui.chart(
            figures.time_lines(throughput, "bytes_per_second", legend_columns=2, dashed=frames.outbound(throughput)),
            key="gpu_link_throughput",
        )
    with right:
        st.markdown("**Use, % of capacity**")
        ui.chart(figures.time_lines(use, "ratio", full_scale=True, legend_columns=2), key="gpu_link_use")


# The link table (frames.link_table) in words (a comment: Streamlit's magic would draw a docstring).
LINK_TABLE_CONFIG = {
    "device": st.column_config.TextColumn("device", help="the whole GPU, or the MIG instance"),
    "capacity_bytes_per_second": st.column_config.TextColumn(
        "capacity each way", help="PCIe: generation x lanes, after line encoding; NVLink: the active links together"
    ),
    "measured_by": st.column_config.TextColumn("bytes read from"),
    "in_bytes_per_second": st.column_config.TextColumn("in (mean)", help="into the GPU, mean over the range"),
    "out_bytes_per_second": st.column_config.TextColumn("out (mean)", help="out of the GPU, mean over the range"),
    "mean_utilization": st.column_config.ProgressColumn("use (mean)", format="%.0f%%", min_value=0, max_value=100),
    "peak_utilization": st.column_config.ProgressColumn("use (peak)", format="%.0f%%", min_value=0, max_value=100),
}

PODS_CONFIG = {
    "workload": st.column_config.LinkColumn(
        "job", display_text=ui.JOB_IN_URL, help="the job the pod belongs to (namespace/kind/name): its page"
    ),
}

NIC_TABLE_CONFIG = {
    "device": st.column_config.TextColumn("NIC"),
    "path": st.column_config.TextColumn("PCIe path", help="as nvidia-smi topo -m names it"),
    "gdr_ready": st.column_config.TextColumn("GPUDirect RDMA"),
    "reason": st.column_config.TextColumn("how, or why not"),
    "tx": st.column_config.TextColumn("sent now"),
    "rx": st.column_config.TextColumn("received now"),
}


ui.page("GPU", body)
