"""Health page: slow GPUs by bandwidth probe, lost GPUs, Xid and ECC errors, throttling, exporter stages."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import ui, words
from dashboard.figures.health import clock_event_bar, probe_efficiency_bar
from dashboard.frames.columns import with_cols
from dashboard.frames.health import SLOW_EFFICIENCY, SLOW_VS_PEERS, active_clock_events, nonzero, probe_comparison
from dashboard.inert_text import inert

# thresholds in the pages' one percentage style (ui.fmt_percent), for the captions below
SLOW_BELOW = ui.fmt_percent(SLOW_EFFICIENCY)
VS_PEERS = ui.fmt_percent(SLOW_VS_PEERS)


def body(ctx: ui.PageContext) -> None:
    f = ctx.filters
    window = ui.fmt_duration(ctx.window_s)
    over = ui.over(ctx)
    q = {
        "info": ui.query("instant", "gpulens_gpu_info", f),
        "eff": ui.query("instant", "gpulens_probe_efficiency_ratio", f),
        "bw": ui.query("instant", "gpulens_probe_bandwidth_bytes_per_second", f),
        "mig": ui.query("instant", "gpulens_mig_instance_info", f),
        "gpu_up": ui.query("instant", "gpulens_gpu_up", f),
        "xid": ui.query("events", "gpulens_gpu_xid_errors_total", f, window=ctx.window),
        "ecc": ui.query("increase", "gpulens_gpu_ecc_errors_total", f, window=ctx.window),
        "means": ui.query("mean", "gpulens_gpu_clock_event_active", f, window=ctx.window),
        "stages": ui.query("instant", "gpulens_stage_success", f),
    }
    ui.prefetch(ctx, q.values())
    info = ui.get(ctx, q["info"])
    with ui.panel("Probes"):
        st.subheader("Bandwidth probes")
        st.caption(
            f"Efficiency = measured / expected for the model. vs peers = efficiency / the median of healthy peers "
            f"(other GPUs or MIG instances of the same model, profile and probe at {SLOW_BELOW} or "
            f"more). Slow: efficiency under {SLOW_BELOW} (the alert's threshold) or vs peers "
            f"≤ {VS_PEERS}. "
            "Probes run on unallocated, idle devices only, so the newest result in the range is shown."
        )
        eff = ui.get(ctx, q["eff"])
        bw = ui.get(ctx, q["bw"])
        mig = ui.get(ctx, q["mig"])
        probes = probe_comparison(eff, bw, info, mig)
        probes = probes.assign(probe=[words.probe(p) for p in probes["probe"]]) if not probes.empty else probes
        if probes.empty:
            ui.no_data(
                "No bandwidth probe result in the range: probes run on idle GPUs every --probes.interval (1 h by "
                "default) unless the exporter runs with --no-probes."
            )
        else:
            slow = probes[probes["slow"]]
            if not slow.empty:
                where = ", ".join(
                    sorted(
                        {
                            f"{n or i} GPU {g}"
                            for n, i, g in zip(slow["node"], slow["instance"], slow["gpu"], strict=True)
                        }
                    )
                )
                st.warning(f"{len(slow)} slow probe result(s): {inert(where)}", icon=":material/speed:")
            ui.chart(probe_efficiency_bar(probes, SLOW_EFFICIENCY), key="probe_bar", clickable=True)
            table = ui.ids_last(ui.linked(ui.node_column(ui.humanize_bytes(probes))))
            if (table["mig_uuid"] == "").all():
                table = table.drop(columns=["mig_uuid", "mig_profile"])
            ui.table(
                table,
                key="probe_table",
                column_config=ui.COLUMN_CONFIG,
                missing={
                    "efficiency": "no expected figure",
                    "vs_peers": "no healthy peer",
                    "mig_profile": "whole GPU",
                    "bandwidth": "not measured",
                },
            )

    with ui.panel("Lost GPUs"):
        gpu_up = ui.get(ctx, q["gpu_up"])
        down = gpu_up[gpu_up["value"] < 1] if not gpu_up.empty else gpu_up
        if not down.empty:
            st.subheader("Lost GPUs")
            st.error(f"{len(down)} GPU(s) lost or unreadable (alert GPULost)", icon=":material/error:")
            table = with_cols(down, ["node", "instance", "gpu", "uuid"])[["node", "instance", "gpu", "uuid"]]
            ui.table(ui.linked(ui.node_column(table)), key="lost_table", column_config=ui.COLUMN_CONFIG)

    with ui.panel("Xid errors"):
        st.subheader(f"Xid errors (last {inert(window)})")
        xid = ui.get(ctx, q["xid"])
        # the exporter creates an Xid counter at its first event: "events" counts that one too
        _errors(nonzero(xid, ["node", "instance", "gpu", "uuid", "xid"]), "events")
        if info.empty:
            ui.no_data("No GPU in view: no exporter has reported one (check the filters).")
        elif nonzero(xid, ["uuid"]).empty:
            st.success(f"No Xid errors in {inert(over)}.")

    with ui.panel("ECC errors"):
        st.subheader(f"ECC errors (last {inert(window)})")
        ecc = ui.get(ctx, q["ecc"])
        _errors(nonzero(ecc, ["node", "instance", "gpu", "uuid", "severity"]), "errors")
        if ecc.empty:
            ui.no_data("No ECC counters: ECC is off on these GPUs or they do not support it.")
        elif nonzero(ecc, ["uuid"]).empty:
            st.success(f"No ECC errors in {inert(over)}.")

    with ui.panel("Throttling"):
        st.subheader(f"Throttling (last {inert(window)})")
        st.caption("Share of the range each reason held the clocks down; an idle GPU's low clocks are not throttling.")
        means = ui.get(ctx, q["means"])
        events = active_clock_events(means)
        if events.empty:
            st.success(f"No throttling in {inert(over)}.")
        else:
            st.caption(
                "One row per reason, the worst first (hardware and thermal slowdowns before the power cap, which is "
                "normal near full load); a bar per GPU: the share of the range the reason held its clocks down."
            )
            ui.chart(clock_event_bar(events), key="clock_events", clickable=True)
            ranked = events.assign(_rank=[words.clock_event_rank(r) for r in events["reason"]])
            ranked = ranked.sort_values(["_rank", "share"], ascending=[True, False]).drop(columns=["_rank"])
            shown = ranked.assign(reason=[words.clock_event(r) for r in ranked["reason"]])
            ui.table(
                ui.linked(ui.node_column(shown)),
                key="throttle_table",
                column_config={
                    **ui.COLUMN_CONFIG,
                    "reason": st.column_config.TextColumn(
                        "Reason", help="as nvidia-smi -q prints it (Clocks Event Reasons)"
                    ),
                },
            )

    with ui.panel("Exporter stages"):
        stages = ui.get(ctx, q["stages"])
        failed = stages[stages["value"] < 1] if not stages.empty else stages
        if not failed.empty:
            st.subheader("Failing exporter stages")
            table = with_cols(failed, ["node", "instance", "stage"])[["node", "instance", "stage"]]
            ui.table(ui.node_column(table), key="stage_table")


def _errors(table: pd.DataFrame, unit: str) -> None:
    """An error-counter table (devices with a positive increase), linked to their GPU pages; the
    counts whole numbers."""
    if not table.empty:
        counts = table.assign(value=table["value"].round().astype("Int64")).rename(columns={"value": unit})
        ui.table(ui.linked(ui.node_column(counts)), key=f"{unit}_table", column_config=ui.COLUMN_CONFIG)


ui.page("Health", body)
