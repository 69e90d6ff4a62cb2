"""Job page: one job (the pods of one top owner over every node: dashboard/jobs.py) over the range:
who and where it is, its straggler, its GPUs' SM activity, class and SM clock on one time axis (a
row per GPU, by node then GPU index, so the GPU the others wait for stands out), and a table of its
GPUs now.

Opened from the Jobs page or a GPU's page (``/job?job=namespace/Kind/name``, ``&job_cluster=…``
where the job has a cluster, with the view's range and filters); without a job in the URL it
offers a chooser.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import definitions, jobs, ui
from dashboard.figures.jobs import job_timelines
from dashboard.frames.jobs import (
    JOB_AGE_KEYS,
    NO_CLASS,
    job_ages,
    job_from_param,
    job_gpu_table,
    job_param,
    job_timeline,
    straggler_words,
)
from dashboard.inert_text import inert
from dashboard.promql import selector
from dashboard.serving_rows import serving_row
from dashboard.sources.source import Filters, JobKey, SourceError, Window

# Cells per strip of the timelines at most (GPUs x steps): a job of many GPUs gets a coarser step,
# so the browser draws tens of thousands of cells, not millions. A comment, not a docstring:
# Streamlit's magic would draw a string statement on the page.
MAX_CELLS = 24_000


def _key(row: dict[str, object]) -> JobKey:
    cluster, namespace, kind, name = (str(row.get(k, "") or "") for k in jobs.JOB)
    return (cluster, namespace, kind, name)


def _choose(ctx: ui.PageContext, summary: pd.DataFrame) -> JobKey | None:
    """The job the URL names, or the one picked (``summary``'s jobs: by GPU-hours over the range,
    most first)."""
    table = summary
    if not table.empty:
        table = table.sort_values(["gpu_hours", "gpus"], ascending=False, kind="stable")
    options: list[JobKey] = [_key(r) for r in table.to_dict("records")]
    names = {k: jobs.job_label(dict(zip(jobs.JOB, k, strict=True))) for k in options}
    wanted = job_from_param(str(st.query_params.get("job", "")), str(st.query_params.get("job_cluster", "")))
    if wanted is not None and wanted not in names:
        options = [wanted, *options]
        names[wanted] = jobs.job_label(dict(zip(jobs.JOB, wanted, strict=True))) + " (not in view now)"
    if not options:
        return None
    key = st.selectbox(
        "Job", options, index=options.index(wanted) if wanted in options else 0, format_func=lambda k: names[k]
    )
    if key != wanted:
        st.query_params["job"] = job_param(key)
        if key[0]:
            st.query_params["job_cluster"] = key[0]
        elif "job_cluster" in st.query_params:
            del st.query_params["job_cluster"]
    return key


def body(ctx: ui.PageContext) -> None:
    try:
        summary = ui.fetch(ctx, "job_summary", ctx.filters, window=ctx.window)
    except SourceError as exc:  # e.g. a store without the jobs rules: say what to load
        st.warning(inert(exc), icon=":material/warning:")
        return
    key = _choose(ctx, summary)
    if key is None:
        st.info("No pod holds a GPU in view, so there is no job to show.")
        return
    # the job's own leaves, wherever they are: its cluster and namespace, not the sidebar's filters
    own = Filters(cluster=key[0] or None, namespace=key[1] or None)
    try:
        mine = ui.fetch(ctx, "job_leaves", own, window=ctx.window, job=key)
    except SourceError as exc:
        st.warning(inert(exc), icon=":material/warning:")
        return
    if mine.empty:
        st.info(
            f"{inert(jobs.job_label(dict(zip(jobs.JOB, key, strict=True))))} holds no GPU now: it ended, or it has not "
            "started. Pick another job above."
        )
        return
    young = _collecting(ctx, key, own)
    gpus = job_gpu_table(mine, collecting=young)
    with ui.panel("Job"):
        _header(key, mine, _gpu_hours(ctx, summary, key, own), young)
    with ui.panel("Serving"):
        # the job's pods that serve a model (nothing drawn where none does)
        leaves = selector("gpulens:job_leaf:info", dict(zip(jobs.JOB, key, strict=True)))
        serving_row(ctx, leaves, {"cluster": key[0], "namespace": key[1]})
    with ui.panel("GPUs over time"):
        _timelines(ctx, key, mine, gpus)
    with ui.panel("GPUs now"):
        _gpus(ctx, gpus)


def _gpu_hours(ctx: ui.PageContext, summary: pd.DataFrame, key: JobKey, own: Filters) -> float:
    """The job's GPU-hours over the range, as the Jobs page lists them (``job_summary``; the job's own
    cluster and namespace where the sidebar's filters leave it out); NaN where not measured."""

    def of(table: pd.DataFrame) -> pd.DataFrame:
        for k, v in zip(jobs.JOB, key, strict=True):
            table = table[table[k].astype(str) == v]
        return table

    hit = of(summary)
    if hit.empty:
        try:
            hit = of(ui.fetch(ctx, "job_summary", own, window=ctx.window))
        except SourceError:  # the header stands without its GPU-hours
            return float("nan")
    return float(hit["gpu_hours"].iloc[0]) if not hit.empty else float("nan")


def _collecting(ctx: ui.PageContext, key: JobKey, own: Filters) -> str:
    """``collecting (N s of 5 m)`` while the job's history does not fill the verdicts' window
    (frames.jobs.job_ages), else ``""``."""
    try:
        ages = job_ages(ui.fetch(ctx, "window_ages", definitions.POD_HISTORY_METRIC, JOB_AGE_KEYS, own))
    except SourceError:  # no age read: the verdicts stand as the source gives them
        return ""
    for k, v in zip(jobs.JOB, key, strict=True):
        ages = ages[ages[k].astype(str) == v]
    age = float(ages["age_s"].min()) if not ages.empty else float("nan")
    return "" if definitions.window_full(age) else definitions.collecting_words(age)


def _header(key: JobKey, mine: pd.DataFrame, hours: float, young: str = "") -> None:
    """Who and where the job is, its size, and its straggler (or why there is none to find, or
    ``young``: the window it is still collecting)."""
    cluster, namespace, kind, name = key
    st.subheader(inert(name))
    st.caption(
        inert(" · ".join(x for x in (f"{kind} in namespace {namespace}", f"cluster {cluster}" if cluster else "") if x))
    )
    row = jobs.job_table(mine).iloc[0]
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("GPUs", f"{int(row['gpus']):,}", help="whole GPUs and MIG instances its pods hold")
    c2.metric("Nodes", f"{int(row['nodes']):,}")
    c3.metric("Pods", f"{mine['pod'].nunique():,}")
    c4.metric("GPU-hours in the range", f"{hours:,.2f}" if hours == hours else "not measured")
    strays = jobs.stragglers(mine)
    classified = int(mine.drop_duplicates(["uuid", "mig_uuid"])["communication"].notna().sum())
    if young:
        st.info(
            f"Straggler: {inert(young)}: the job's verdicts wait for a full {definitions.MEAN_WINDOW} of its history.",
            icon=":material/hourglass_top:",
        )
    elif not strays.empty:
        for r in strays.to_dict("records"):
            wait = float(r["peers_communication"]) * 100
            st.warning(
                f"Straggler: {inert(straggler_words(r))}. Its peers spend {wait:.0f} % of their time waiting for it "
                "in collectives: the whole job runs at its pace.",
                icon=":material/hourglass_bottom:",
            )
    elif classified == 0:
        st.info(f"Straggler: {NO_CLASS} (its GPUs have no GPM: pre-Hopper).")
    elif classified < 2:
        st.info("Straggler: one classified GPU, no peers to wait for it.")
    else:
        st.success(f"No straggler: no GPU of the job keeps its peers waiting (last {definitions.MEAN_WINDOW}).")


def _timelines(ctx: ui.PageContext, key: JobKey, mine: pd.DataFrame, gpus: pd.DataFrame) -> None:
    """Its GPUs' SM activity, class and SM clock over the range, on one time axis."""
    st.subheader("Its GPUs over time")
    rows = len(gpus)
    window, step = ctx.window.stepped(max(ctx.step_s, ctx.window_s * rows / MAX_CELLS))
    instances = tuple(sorted(set(mine["instance"].astype(str)) - {""}))
    series = ui.fetch(ctx, "job_series", key, instances, window=Window(window), step_s=step)
    timeline = job_timeline(series, gpus)
    st.caption(
        f"A row per GPU, by node then GPU index, a cell every {ui.fmt_duration(step)}. The GPU the others wait for "
        "stands out: they wait in communication (brown) while it computes, at a lower SM clock when it is throttled."
    )
    end = ctx.at
    chart = job_timelines(timeline, list(gpus["row"]), start=end - window, end=end, step=step)
    ui.chart(chart, key="job_timelines")


def _gpus(ctx: ui.PageContext, gpus: pd.DataFrame) -> None:
    """The job's GPUs now: where, held by which pod, the figures and whether each straggles."""
    st.subheader("Its GPUs now")
    st.caption(
        f"Over the last {definitions.MEAN_WINDOW}: activity (SM activity, GPU-Util without GPM), busy (a kernel "
        "ran), communication (waiting in collectives), the peak memory used, the SM clock against its maximum "
        "and the clock events that held it down."
    )
    table = pd.DataFrame(
        {
            "uuid": gpus["uuid"],
            "mig_uuid": gpus["mig_uuid"],
            "node": gpus["node"],
            "GPU": gpus["gpu"],
            "straggler": gpus["straggler"],
            "activity": gpus["activity"] * 100.0,
            "communication": gpus["communication"],
            "SM clock": gpus["sm_clock_ratio"] * 100.0,
            "slowdown": gpus["slowdown"],
            "memory used": gpus["memory"],
            "busy": gpus["busy"] * 100.0,
            "pod": gpus["pod"],
        }
    )
    shown = ui.linked(table, ctx).drop(columns=["uuid", "mig_uuid"])
    ui.table(
        shown,
        key="job_gpus",
        column_config=GPU_CONFIG,
        missing={"activity": "not measured", "SM clock": "not measured", "busy": "not measured"},
    )


def _percent(title: str, help_text: str) -> object:
    """A 0-100 % bar column of the table's width."""
    return st.column_config.ProgressColumn(
        title, format="%.0f%%", min_value=0, max_value=100, help=inert(help_text), width=100
    )


# Column settings of the GPU table, in words, the most telling first (a comment: Streamlit's magic would
# draw a docstring).
GPU_CONFIG = {
    **ui.COLUMN_CONFIG,
    ui.GPU_LINK: st.column_config.LinkColumn(
        "GPU page", display_text="open", help="every metric of the GPU over time", width=75
    ),
    "node": st.column_config.TextColumn("Node", width=120),
    "GPU": st.column_config.TextColumn("GPU", help="its index on the node", width=45),
    "straggler": st.column_config.TextColumn("Straggler", help="whether its peers wait for it, and why", width=320),
    "activity": _percent("Activity", "SM activity (GPU-Util without GPM), mean over 5 minutes"),
    "communication": st.column_config.TextColumn(
        "Communication", help="share of its time waiting in collectives", width=105
    ),
    "SM clock": _percent("SM clock", "mean SM clock over its maximum, last 5 minutes"),
    "slowdown": st.column_config.TextColumn(
        "Clock events", help="what held its clocks down in the last 5 minutes", width=150
    ),
    "memory used": st.column_config.TextColumn("Memory used", help="peak over 5 minutes against its memory", width=190),
    "busy": _percent("Busy", "share of the time a kernel ran, mean over 5 minutes"),
    "pod": st.column_config.TextColumn("Pod"),
}


ui.page("Job", body)
