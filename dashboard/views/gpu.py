"""GPU page: one GPU over the range, every device series the exporter has, and who held it.

Opened from any table or chart that names a GPU (``/gpu?uuid=GPU-…``, with the view's range and
filters); without a GPU in the URL it offers a picker.
"""

from __future__ import annotations

import streamlit as st

from dashboard import figures, frames, ui


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
            )
            st.dataframe(pods, hide_index=True)

    with ui.panel("Boundness"):
        st.subheader("Boundness class over time")
        classes = frames.state_timeline(series, "gpulens_gpu_boundness", "class")
        if classes.empty:
            st.info("No boundness class in the range (needs GPM: Hopper or newer).")
        else:
            ui.chart(figures.state_strip(classes, "class"), key="gpu_class")

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


ui.page("GPU", body)
