"""Workloads page: which pods hold GPUs, which hold them idle and for how long, and what it costs."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import definitions, fleet_names, ui
from dashboard.figures.waste import waste_bar
from dashboard.frames.columns import LEAF, with_cols
from dashboard.frames.fleet import idle_allocations, ready_verdicts, waste_by_namespace, youngest_age
from dashboard.frames.sharing import MPS_KERNEL_TIME_NOTE, POD_KEYS, launch_bound, pod_classes, sharing_modes
from dashboard.sources.source import ALLOCATION_KEYS, SourceError, Window

# thresholds in the pages' one percentage style (ui.fmt_percent), for the captions below
IDLE_BELOW = ui.fmt_percent(definitions.IDLE_SM_ACTIVE_BELOW)

ACTIVITY_POINTS = 80
# the recorded series the wasted hours integrate (dashboard/definitions.py RULES); a comment, not a
# docstring: Streamlit's magic would draw one
WASTED_RULE = "gpulens:pod_gpu_wasted:gpus"


def body(ctx: ui.PageContext) -> None:
    f = ctx.filters
    q = {
        "activity": ui.query(
            "allocation_activity",
            f,
            window=ctx.window,
            step_s=max(ctx.step_s, ctx.window_s / ACTIVITY_POINTS),
        ),
        "alloc": ui.query("instant", "gpulens_pod_gpu_allocation", f),
        "idle_now": ui.query("leaf_idle", f),
        "ages": ui.query("window_ages", definitions.LEAF_HISTORY_METRIC, definitions.LEAF, f),
        "pod_bound": ui.query("current_state", "gpulens_pod_gpu_boundness", f),
        "info": ui.query("instant", "gpulens_gpu_info", f),
        "mem": ui.query("instant", "gpulens_pod_gpu_memory_used_bytes", f),
        "share": ui.kernel_time_query("instant", f),
        "sharing": ui.query("instant", "gpulens_gpu_sharing_info", f),
        "class_means": ui.query("mean", "gpulens_pod_gpu_boundness", f, window=Window(definitions.MEAN_WINDOW_SECONDS)),
        # how much of the range the rules cover (read by ui.history_s below, fetched beside the rest)
        "recorded": ui.query("history_start", WASTED_RULE, f, window=ctx.window),
    }
    ui.prefetch(ctx, q.values())
    with ui.panel("Allocated but idle"):
        st.subheader("Allocated but idle now")
        st.caption(
            f"Idle = SM active < {IDLE_BELOW} over {definitions.MEAN_WINDOW}, no kernels "
            "running and its links idle: the definition the recording rules and the advisor use. "
            "Launch-bound devices are listed below; transfer-bound ones (moving data) on the Fleet page."
        )
        alloc = ui.get(ctx, q["alloc"])
        ages = ui.get(ctx, q["ages"])
        # a verdict over the window once the device's history fills it (Fleet counts the same)
        idle_now = ready_verdicts(ui.get(ctx, q["idle_now"]), ages)
        held = ui.history_s(ctx)
        young = youngest_age(ages, alloc)
        if young == young:
            st.info(
                f"Allocated devices with less than {definitions.MEAN_WINDOW} of history are not judged yet (the "
                f"youngest: {definitions.collecting_words(young)}): they are listed once their window is full.",
                icon=":material/hourglass_top:",
            )
        # a third of the chart resolution: these are subqueries over the whole range (the costly
        # part at fleet scale: bench/dashboard_scale.py), and 80 samples per range estimate the
        # wasted hours of a fleet well (18 minutes apart over 24 h)
        activity = ui.get(ctx, q["activity"])
        idle = idle_allocations(alloc, idle_now, activity, now=ctx.at, window_s=ctx.window_s)
        if alloc.empty:
            ui.no_data("No pod holds a GPU or MIG instance now.")
        elif idle.empty:
            st.success("Every allocated GPU and MIG instance is in use.")
        else:
            idle = idle.assign(
                workload=[w if isinstance(w, str) and w else fleet_names.BARE_POD_OWNER for w in idle["workload"]],
                idle_for=[
                    "" if s != s else ("> " if at_least else "") + ui.fmt_duration(s)
                    for s, at_least in zip(idle["idle_seconds"], idle["idle_at_least"], strict=True)
                ],
            )
            index = with_cols(ui.get(ctx, q["info"]), ["uuid", "gpu"])[["uuid", "gpu"]].drop_duplicates("uuid")
            idle = idle.merge(index, on="uuid", how="left").assign(gpu=lambda d: d["gpu"].fillna(""))
            columns = ["namespace", "pod", "container", "workload", "idle_for", "sm_active", "node", "instance", "gpu",
                       "uuid", "mig_uuid"]  # fmt: skip
            ui.table(
                ui.linked(ui.node_column(idle[columns])),
                key="idle_table",
                column_config=ui.COLUMN_CONFIG,
                missing={"sm_active": "not measured"},
            )

    with ui.panel("Launch-bound"):
        st.subheader("Launch-bound now")
        pod_bound = ui.get(ctx, q["pod_bound"])
        launch = launch_bound(pod_bound, alloc, ui.get(ctx, q["info"]))
        if launch.empty:
            st.success("No allocated device is launch-bound.")
        else:
            st.caption(
                "Kernels run, but so briefly that the SMs stay idle: not idle (nothing to release) but a misuse "
                "of its own kind: batch the work, use CUDA graphs (alert GPULaunchBound)."
            )
            ui.table(ui.linked(ui.node_column(launch)), key="launch_table", column_config=ui.COLUMN_CONFIG)

    with ui.panel("Wasted GPU-hours"):
        st.subheader("Wasted GPU-hours by namespace")
        st.caption(
            "Hours a device was allocated while idle (as above), over the chosen range; a time-sliced GPU split among "
            "its pods by the replicas each holds, a MIG instance weighted by its compute slices (3g = 3/7 of a GPU)."
        )
        info = ui.get(ctx, q["info"])
        waste = waste_by_namespace(activity, info, ctx.settings.prices_per_gpu_hour)
        if held < definitions.MEAN_WINDOW_SECONDS:
            st.info(
                f"Wasted GPU-hours start once the history holds a full idle window ({definitions.MEAN_WINDOW}): "
                f"{ui.fmt_duration(held)} so far.",
                icon=":material/hourglass_top:",
            )
        else:
            recorded = ui.history_s(ctx, WASTED_RULE)
            if held - recorded > ui.history_slack(ctx):
                st.warning(
                    f"The recording rules hold wasted hours for only {ui.fmt_duration(recorded)} of the "
                    f"{ui.fmt_duration(held)} of history in this range (the rules were loaded after the history "
                    "began, or it was backfilled): the hours below count only that part. Right-sizing reads the raw "
                    "series over its whole window.",
                    icon=":material/warning:",
                )
            wasted_hours(ctx, waste)

    with ui.panel("Pods holding GPUs"):
        st.subheader("Pods holding GPUs")
        if alloc.empty:
            ui.no_data("No pod holds a GPU or MIG instance now.")
        else:
            mem = ui.get(ctx, q["mem"])
            pods = with_cols(alloc, (*ALLOCATION_KEYS, "resource"))
            # the GPU's index beside its node: who holds what is read as node, GPU, pod
            index = with_cols(ui.get(ctx, q["info"]), ["uuid", "gpu"])[["uuid", "gpu"]].drop_duplicates("uuid")
            pods = pods.merge(index, on="uuid", how="left").assign(gpu=lambda d: d["gpu"].fillna(""))
            # SM active over the idle definition's window, as in the idle table above
            try:
                verdict = ui.get(ctx, q["idle_now"])
            except SourceError:  # no recording rules: the panel above says so; the pods still list
                verdict = pd.DataFrame(columns=[*LEAF, "sm_mean"])
            sm_leaf = with_cols(verdict, ["sm_mean"])[[*LEAF, "sm_mean"]]
            sm_leaf = sm_leaf.drop_duplicates(list(LEAF))
            pods = pods.merge(sm_leaf.rename(columns={"sm_mean": "sm_active"}), on=list(LEAF), how="left")
            classes = pod_classes(ui.get(ctx, q["pod_bound"]))
            pods = pods.merge(classes, on=list(POD_KEYS), how="left")
            # each device's share of the last 5 minutes waiting in collectives (the pod's figure,
            # gpulens:pod_gpu_communication:ratio_avg5m, is the mean of its devices')
            leaves, _pods = definitions.communication_share_frame(ui.get(ctx, q["class_means"]))
            if not leaves.empty and (leaves["share"] > 0).any():
                pods = pods.merge(leaves.rename(columns={"share": "communication"}), on=list(POD_KEYS), how="left")
                pods["communication"] = pd.to_numeric(pods["communication"], errors="coerce") * 100.0
                st.caption(
                    f"Communication: the share of the last {definitions.MEAN_WINDOW} the device spent waiting in "
                    "collectives (NCCL); one device of a pod far below its peers is a straggler (Network page)."
                )
            # kernel time only where several pods share a GPU: on a GPU of one pod it is NVML's GPU-Util,
            # which SM active above already reads better
            modes = sharing_modes(ui.get(ctx, q["sharing"]))
            holders = pods.assign(_who=pods["namespace"].astype(str) + "/" + pods["pod"].astype(str))
            shared = holders.groupby("uuid")["_who"].transform("nunique") > 1
            shared = shared | pods["uuid"].map(lambda u: modes.get(str(u)) in ("time-slicing", "mps"))
            on_mps = pods["uuid"].map(lambda u: modes.get(str(u)) == "mps")
            share = ui.kernel_time(ctx, q["share"])
            if shared.any():
                sh = with_cols(share, ["namespace", "pod", "container", "uuid", "value"])
                sh = sh.groupby(["namespace", "pod", "container", "uuid"], as_index=False)["value"].sum()
                pods = pods.merge(
                    sh.rename(columns={"value": "kernel_time"}),
                    on=["namespace", "pod", "container", "uuid"],
                    how="left",
                )
                pods["kernel_time"] = pods["kernel_time"].where(shared.to_numpy())
                st.caption(
                    "Kernel time: the share of sampled time the pod's kernels ran on a GPU it shares with other pods "
                    "(NVML per-process utilisation); blank on a GPU of one pod, where SM active says more."
                    + (f" On MPS GPUs it is not split ({MPS_KERNEL_TIME_NOTE})." if on_mps.any() else "")
                )
            if not mem.empty:
                m = with_cols(mem, ["namespace", "pod", "container", "uuid"])
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
                    "class",
                    "communication",
                    "sm_active",
                    "kernel_time",
                    "memory_used_bytes",
                    "node",
                    "instance",
                    "gpu",
                    "uuid",
                    "mig_uuid",
                )
                if c in pods.columns
            ]
            table = ui.linked(ui.node_column(ui.humanize_bytes(pods[cols].sort_values(["namespace", "pod"]))))
            mps = table["uuid"].map(lambda u: modes.get(str(u)) == "mps")
            alone = ~table["uuid"].isin(set(pods.loc[shared.to_numpy(), "uuid"]))
            ui.table(
                table,
                key="pod_table",
                column_config=POD_TABLE_CONFIG,
                missing={
                    "class": "no class",
                    "communication": "no class",
                    "sm_active": "not measured",
                    "kernel_time": [
                        "MPS: not split" if m else "one pod" if a else "not reported"
                        for m, a in zip(mps, alone, strict=True)
                    ],
                    "memory_used": "not reported",
                },
            )


POD_TABLE_CONFIG = {
    **ui.COLUMN_CONFIG,
    "communication": ui.COMMUNICATION_COLUMN,
}


def wasted_hours(ctx: ui.PageContext, waste: pd.DataFrame) -> None:
    """The range's wasted GPU-hours and their cost, by namespace (frames.fleet.waste_by_namespace), or a
    sentence when there are none."""
    if waste.empty:
        ui.no_data(f"No pod held a GPU or MIG instance in {ui.over(ctx)}: nothing was wasted.")
        return
    c1, c2 = st.columns(2)
    total = float(waste["gpu_hours"].sum())
    c1.metric("Wasted GPU-hours", f"{total:,.1f}" if total >= 10 else f"{total:.2f}")
    cost = waste["cost_usd"].sum(min_count=1)
    if cost == cost:
        c2.metric("Cost", f"${cost:,.2f}")
    else:  # a hint, not a figure
        c2.caption(f"Cost: {ui.NO_PRICE}.")
    if waste["gpu_hours"].max() > 0:
        ui.chart(waste_bar(waste), key="waste_bar")
        ui.table(waste, key="waste_table", missing={"cost_usd": "no price set"})
    else:
        st.success(f"No allocated GPU or MIG instance was idle in {ui.over(ctx)}.")


ui.page("Workloads", body)
