"""Health page: probe bandwidth vs expected and vs the fleet, Xid and ECC errors, throttling."""

from __future__ import annotations

import streamlit as st

from dashboard import figures, frames, ui


def body(ctx: ui.PageContext) -> None:
    f = ctx.filters
    window = ui.fmt_duration(ctx.window_s)
    with ui.panel("Probes"):
        st.subheader("Bandwidth probes")
        st.caption(
            "Efficiency = measured / expected for the model; vs fleet = measured / median of the same model and probe."
        )
        eff = ui.fetch(ctx, "instant", "gpulens_probe_efficiency_ratio", f)
        bw = ui.fetch(ctx, "instant", "gpulens_probe_bandwidth_bytes_per_second", f)
        info = ui.fetch(ctx, "instant", "gpulens_gpu_info", f)
        probes = frames.probe_comparison(eff, bw, info)
        if probes.empty:
            ui.no_data("probe results")
        else:
            slow = probes[(probes["vs_fleet"] < 0.9) | (probes["efficiency"] < 0.8)]
            if not slow.empty:
                st.warning(f"{len(slow)} probe result(s) at least 10 % below the fleet or 20 % below expected")
            st.plotly_chart(figures.probe_efficiency_bar(probes), key="probe_bar")
            st.dataframe(probes, hide_index=True)

    with ui.panel("Xid errors"):
        st.subheader(f"Xid errors (last {window})")
        xid = ui.fetch(ctx, "increase", "gpulens_gpu_xid_errors_total", f, window_s=ctx.window_s)
        table = frames.nonzero(xid, ["instance", "gpu", "uuid", "xid"])
        if not table.empty:
            st.dataframe(table.rename(columns={"value": "events"}), hide_index=True)
        elif xid.empty and info.empty:
            ui.no_data("GPUs")
        else:
            # the exporter creates an Xid counter at its first event: no counter = no Xid yet
            st.success(f"no Xid errors in the last {window}")

    with ui.panel("ECC errors"):
        st.subheader(f"ECC errors (last {window})")
        ecc = ui.fetch(ctx, "increase", "gpulens_gpu_ecc_errors_total", f, window_s=ctx.window_s)
        table = frames.nonzero(ecc, ["instance", "gpu", "uuid", "severity"])
        if not table.empty:
            st.dataframe(table.rename(columns={"value": "errors"}), hide_index=True)
        elif ecc.empty:
            ui.no_data("ECC counters (ECC off or not supported)")
        else:
            st.success(f"no ECC errors in the last {window}")

    with ui.panel("Throttling"):
        st.subheader("Clock events (throttling) now")
        events = frames.active_clock_events(ui.fetch(ctx, "instant", "gpulens_gpu_clock_event_active", f))
        if events.empty:
            st.success("no clock event holds clocks down")
        else:
            st.plotly_chart(figures.clock_event_bar(events), key="clock_events")
            st.dataframe(events, hide_index=True)

    with ui.panel("Exporter stages"):
        stages = ui.fetch(ctx, "instant", "gpulens_stage_success", f)
        failed = stages[stages["value"] < 1] if not stages.empty else stages
        if not failed.empty:
            st.subheader("Failing exporter stages")
            st.dataframe(frames.with_cols(failed, ["instance", "stage"])[["instance", "stage"]], hide_index=True)


ui.page("Health", body)
