"""Workloads page: which pods hold GPUs, which hold them idle and for how long, and what it costs."""

from __future__ import annotations

import time

import streamlit as st

from dashboard import figures, frames, ui

ACTIVITY_POINTS = 80


def body(ctx: ui.PageContext) -> None:
    f = ctx.filters
    thr = ctx.settings.busy_threshold
    with ui.panel("Allocated but idle"):
        st.subheader("Allocated but idle now")
        alloc = ui.fetch(ctx, "instant", "gpulens_pod_gpu_allocation", f)
        sm = ui.fetch(ctx, "instant", "gpulens_gpu_sm_active_ratio", f)
        # a third of the chart resolution: these are subqueries over the whole range (the costly
        # part at fleet scale: bench/dashboard_scale.py), and 80 samples per range estimate the
        # idle hours of a fleet well (18 minutes apart over 24 h)
        activity = ui.fetch(
            ctx,
            "allocation_activity",
            f,
            window_s=ctx.window_s,
            step_s=max(ctx.step_s, ctx.window_s / ACTIVITY_POINTS),
            busy_threshold=thr,
        )
        idle = frames.idle_allocations(alloc, sm, activity, now=time.time(), window_s=ctx.window_s, busy_threshold=thr)
        if alloc.empty:
            ui.no_data("GPU allocations")
        elif idle.empty:
            st.success(f"Every allocated GPU is busy (SM active ≥ {thr:.0%}).")
        else:
            idle = idle.assign(
                idle_for=[
                    "" if s != s else ("> " if at_least else "") + ui.fmt_duration(s)
                    for s, at_least in zip(idle["idle_seconds"], idle["idle_at_least"], strict=True)
                ]
            )
            st.dataframe(
                idle[
                    [
                        "namespace",
                        "pod",
                        "container",
                        "workload",
                        "idle_for",
                        "sm_active",
                        "instance",
                        "uuid",
                        "mig_uuid",
                    ]
                ],
                hide_index=True,
                key="idle_table",
            )

    with ui.panel("Wasted GPU-hours"):
        st.subheader("Wasted GPU-hours by namespace")
        st.caption(
            f"Hours a device was allocated while its SM activity stayed below {thr:.0%}, over the chosen range; "
            "shared GPUs split among their pods, MIG slices weighted by size."
        )
        info = ui.fetch(ctx, "instant", "gpulens_gpu_info", f)
        mig = ui.fetch(ctx, "instant", "gpulens_mig_instance_info", f)
        waste = frames.waste_by_namespace(activity, info, mig, ctx.settings.prices_per_gpu_hour)
        if waste.empty:
            ui.no_data("wasted GPU-hours")
        else:
            c1, c2 = st.columns(2)
            total = float(waste["gpu_hours"].sum())
            c1.metric("Wasted GPU-hours", f"{total:,.1f}" if total >= 10 else f"{total:.2f}")
            cost = waste["cost_usd"].sum(min_count=1)
            c2.metric("Cost", f"${cost:,.2f}" if cost == cost else "set --price-per-gpu-hour")
            st.plotly_chart(figures.waste_bar(waste), key="waste_bar")
            st.dataframe(waste, hide_index=True)

    with ui.panel("Pods holding GPUs"):
        st.subheader("Pods holding GPUs")
        if alloc.empty:
            ui.no_data("pods")
        else:
            mem = ui.fetch(ctx, "instant", "gpulens_pod_gpu_memory_used_bytes", f)
            pods = frames.with_cols(alloc, (*frames.ALLOCATION_KEYS, "resource"))
            sm_leaf = frames.with_cols(sm, frames.LEAF).groupby(list(frames.LEAF), as_index=False)["value"].max()
            pods = pods.merge(sm_leaf.rename(columns={"value": "sm_active"}), on=list(frames.LEAF), how="left")
            if not mem.empty:
                m = frames.with_cols(mem, ["namespace", "pod", "container", "uuid"])
                m = m.groupby(["namespace", "pod", "container", "uuid"], as_index=False)["value"].sum()
                pods = pods.merge(
                    m.rename(columns={"value": "memory_used_bytes"}),
                    on=["namespace", "pod", "container", "uuid"],
                    how="left",
                )
            cols = [
                c
                for c in (
                    "namespace",
                    "pod",
                    "container",
                    "workload_kind",
                    "workload",
                    "resource",
                    "sm_active",
                    "memory_used_bytes",
                    "instance",
                    "uuid",
                    "mig_uuid",
                )
                if c in pods.columns
            ]
            st.dataframe(pods[cols].sort_values(["namespace", "pod"]), hide_index=True)


ui.page("Workloads", body)
