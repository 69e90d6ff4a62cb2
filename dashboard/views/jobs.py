"""Jobs page: every job holding GPUs now (the pods of one top owner over every node:
dashboard/jobs.py), most GPU-hours over the range first, with its GPUs, nodes, activity, busy
ratio, communication share, class mix, memory headroom and straggler; the multi-node jobs, the jobs
with a straggler and the communication-bound ones named at the top. Each job links to its Job page."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import streamlit as st

from dashboard import definitions, jobs, ui
from dashboard.figures.jobs import job_mix_bars
from dashboard.frames.columns import with_cols
from dashboard.frames.jobs import JOB_AGE_KEYS, NO_CLASS, job_ages, job_param, jobs_overview
from dashboard.frames.network import gdr_by_gpu, gpu_nics
from dashboard.frames.status import gdr_off_nodes, gdr_words, job_nodes
from dashboard.inert_text import inert
from dashboard.sources.source import JOB_STRAGGLER_COLUMNS, SourceError

# thresholds in the pages' one percentage style (ui.fmt_percent), for the captions below
PEERS_WAIT = ui.fmt_percent(jobs.STRAGGLER_PEERS_WAIT_AT_LEAST)
GAP = ui.fmt_percent(jobs.STRAGGLER_GAP_AT_LEAST)
BOUND_AT = ui.fmt_percent(jobs.COMMUNICATION_BOUND_AT_LEAST)

# Names listed under each count at the top; more are counted. Jobs drawn in the class-mix chart,
# the most GPU-hours first (the table lists them all). Comments, not docstrings: Streamlit's magic
# would draw a string statement on the page.
MAX_NAMES = 8
MAX_MIX_BARS = 30


def body(ctx: ui.PageContext) -> None:
    f = ctx.filters
    q = {
        "summary": ui.query("job_summary", f, window=ctx.window),
        "stragglers": ui.query("job_stragglers", f),
        "mix": ui.query("job_mix", f),
        "ages": ui.query("window_ages", definitions.POD_HISTORY_METRIC, JOB_AGE_KEYS, f),
        "alloc": ui.query("instant", "gpulens_pod_gpu_allocation", f),
        "paths": ui.query("instant", "gpulens_gpu_nic_path_info", f),
        "ready": ui.query("instant", "gpulens_gpu_nic_gdr_ready", f),
    }
    ui.prefetch(ctx, q.values())
    shown: tuple[pd.DataFrame, pd.DataFrame] | None = None
    with ui.panel("Jobs"):
        try:
            summary = ui.get(ctx, q["summary"])
        except SourceError as exc:  # e.g. a store without the jobs rules: say what to load
            st.warning(inert(exc), icon=":material/warning:")
            return
        if summary.empty:
            st.info("No pod holds a GPU in view, so there is no job to show.")
            return
        try:
            strays = ui.get(ctx, q["stragglers"])
        except SourceError as exc:  # the table stands without the stragglers' words
            st.warning(f"Stragglers: {inert(exc)}", icon=":material/warning:")
            strays = pd.DataFrame(columns=list(JOB_STRAGGLER_COLUMNS))
        try:
            mix = ui.get(ctx, q["mix"])
        except SourceError as exc:  # the table stands without the mix
            st.warning(f"Class mix: {inert(exc)}", icon=":material/warning:")
            mix = pd.DataFrame(columns=[*jobs.JOB, "class", "share"])
        table = jobs_overview(summary, strays, mix, job_ages(ui.get(ctx, q["ages"])))
        gdr_off = gdr_off_nodes(gdr_by_gpu(gpu_nics(ui.get(ctx, q["paths"]), ui.get(ctx, q["ready"]), pd.DataFrame())))
        nodes = job_nodes(ui.get(ctx, q["alloc"]))
        table["gdr"] = [gdr_words(tuple(str(r[k]) for k in jobs.JOB), nodes, gdr_off) for r in table.to_dict("records")]
        _summary(ctx, table)
        _table(ctx, table)
        shown = (table, mix)
    if shown is not None:
        with ui.panel("Class mix"):
            _mix_chart(*shown)


def _labels(table: pd.DataFrame) -> list[str]:
    return [jobs.job_label(r) for r in table.to_dict("records")]


def _names(ctx: ui.PageContext, table: pd.DataFrame, why: Sequence[str]) -> None:
    """The jobs of ``table``, each a link to its Job page (``namespace/Kind/name``) with its cluster
    and ``why`` under it; the first MAX_NAMES, the rest counted."""
    params = ctx.link_params()
    for i, row in enumerate(table.head(MAX_NAMES).to_dict("records")):
        key = tuple(str(row[k]) for k in jobs.JOB)
        name = job_param(key)
        query = {"job": name, **({"job_cluster": key[0]} if key[0] else {}), **params}
        if "job" in ui.PAGES:
            st.page_link(ui.PAGES["job"], label=inert(name), query_params=query, width="stretch")
        else:  # a page script run on its own (tests): the name without its link
            st.markdown(inert(name))
        st.caption(inert(" · ".join(x for x in (f"cluster {key[0]}" if key[0] else "", why[i]) if x)))
    if len(table) > MAX_NAMES:
        st.caption(f"and {len(table) - MAX_NAMES:,} more (the table has them all)")


def _summary(ctx: ui.PageContext, table: pd.DataFrame) -> None:
    """The counts at the top, each with the jobs' names."""
    multi = table[table["nodes"] > 1]
    strays = table[table["stragglers"] > 0]
    bound = table[table["communication_bound"]]
    young = table[table["collecting"]]
    if not young.empty:
        st.info(
            f"{len(young):,} job(s) still collecting their {definitions.MEAN_WINDOW} window (the youngest: "
            f"{definitions.collecting_words(float(young['age_s'].min()))}): no straggler or communication-bound "
            "verdict for them until it is full, as an alert waits out its for: duration.",
            icon=":material/hourglass_top:",
        )
    c1, c2, c3 = st.columns(3)
    with c1:
        st.metric("Multi-node jobs", f"{len(multi):,}", help="jobs whose GPUs sit on more than one node")
        if multi.empty:
            st.caption("No job spans more than one node.")
        else:
            _names(
                ctx, multi, [f"{g:,} GPUs on {n:,} nodes" for g, n in zip(multi["gpus"], multi["nodes"], strict=True)]
            )
    with c2:
        st.metric(
            "Jobs with a straggler",
            f"{len(strays):,}",
            help=(
                f"a GPU whose peers spend at least {PEERS_WAIT} of their time waiting in "
                f"collectives while it spends {GAP} less: the job runs at its pace"
            ),
        )
        if strays.empty:
            st.caption("No job waits on one of its GPUs.")
        else:
            _names(ctx, strays, list(strays["straggler"]))
    with c3:
        st.metric(
            "Communication-bound jobs",
            f"{len(bound):,}",
            help=(
                f"at least {BOUND_AT} of the job's GPU time in collectives, with no "
                "straggler to explain it: the interconnect sets its pace"
            ),
        )
        if bound.empty:
            st.caption("No job spends most of its time communicating.")
        else:
            _names(
                ctx,
                bound,
                [
                    f"communication {c * 100:.0f} %" + (f": {g} (NCCL copies through host memory)" if g else "")
                    for c, g in zip(bound["communication"], bound["gdr"], strict=True)
                ],
            )


def _table(ctx: ui.PageContext, table: pd.DataFrame) -> None:
    """Every job, most GPU-hours first, in people's words."""
    st.subheader("Jobs by GPU-hours")
    st.caption(
        f"Jobs holding GPUs now (a job = the pods of one owner: a PyTorchJob, a JobSet, a Deployment…; a pod of "
        f"no owner is its own job), most GPU-hours over the range first. Activity, busy, communication, class "
        f"mix and memory are over the last {definitions.MEAN_WINDOW}: activity is SM activity (GPU-Util without "
        "GPM), its range the job's least and most active GPU; memory is the highest peak used on one GPU against "
        "its capacity. A straggler is the GPU the others wait for, with why: compute (slow clocks, throttling) "
        "or input (its GPU idles while its peers spin)."
    )
    params = ctx.link_params()
    keys = [tuple(str(x) for x in r) for r in table[list(jobs.JOB)].itertuples(index=False)]
    shown = pd.DataFrame(
        {
            "job": [ui.job_url(k, params) for k in keys],
            "cluster": table["cluster"],
            "GPUs": table["gpus"].astype(int),
            "nodes": table["nodes"].astype(int),
            "GPU-hours": table["gpu_hours"].astype(float),
            "straggler": table["straggler"],
            "activity": table["activity"] * 100.0,
            "activity range": table["activity_range"],
            "communication": [
                definitions.collecting_words(a) if young else f"{c * 100:.0f} %" if c == c else NO_CLASS
                for c, young, a in zip(table["communication"], table["collecting"], table["age_s"], strict=True)
            ],
            "class mix": table["mix"],
            "memory headroom": table["memory"],
            "busy": table["busy"] * 100.0,
            "pods": table["pods"].astype(int),
        }
    )
    if not (shown["cluster"] != "").any():
        shown = shown.drop(columns=["cluster"])
    ui.table(
        shown,
        key="jobs_table",
        column_config=TABLE_CONFIG,
        missing={"GPU-hours": "not measured", "activity": "not measured", "busy": "not measured"},
    )


def _mix_chart(table: pd.DataFrame, mix: pd.DataFrame) -> None:
    st.subheader("Class mix per job")
    top = table.head(MAX_MIX_BARS)
    st.caption(
        "What bounds each job's GPUs over the last "
        f"{definitions.MEAN_WINDOW}: its classes' shares of its classified GPUs' time (communication = waiting "
        "in collectives). Jobs on GPUs without GPM have no class."
        + (
            f" The {MAX_MIX_BARS} jobs with the most GPU-hours; the table has the rest."
            if len(table) > len(top)
            else ""
        )
    )
    m = with_cols(mix, [*jobs.JOB, "class", "share"])
    m = m.assign(job=[jobs.job_label(r) for r in m.to_dict("records")])
    ui.chart(job_mix_bars(m, _labels(top)), key="jobs_mix")


# Column settings of the jobs table, in words, the most telling first (a comment: Streamlit's magic would draw a
# docstring).
TABLE_CONFIG = {
    "job": st.column_config.LinkColumn(
        "Job",
        display_text=ui.JOB_IN_URL,
        help="namespace/kind/name (kind Pod: a pod of no owner); its page has its GPUs over time",
        width=260,
    ),
    "cluster": st.column_config.TextColumn("Cluster", width=90),
    "GPUs": st.column_config.NumberColumn(
        "GPUs", format="localized", help="whole GPUs and MIG instances it holds", width=55
    ),
    "nodes": st.column_config.NumberColumn("Nodes", format="localized", width=55),
    "GPU-hours": st.column_config.NumberColumn(
        "GPU-hours",
        format="accounting",
        help="hours each GPU was held over the range, a MIG instance weighted by its share of the GPU (3g = 3/7)",
        width=85,
    ),
    "activity": st.column_config.ProgressColumn(
        "Activity",
        format="%.0f%%",
        min_value=0,
        max_value=100,
        width=100,
        help="mean over its GPUs of SM activity (GPU-Util without GPM)",
    ),
    "activity range": st.column_config.TextColumn(
        "Activity range", help="its least and most active GPU, and the gap between them", width=150
    ),
    "communication": st.column_config.TextColumn(
        "Communication", help="share of its GPUs' time waiting in collectives (NCCL)", width=105
    ),
    "straggler": st.column_config.TextColumn("Straggler", help="the GPU its peers wait for, and why", width=440),
    "class mix": st.column_config.TextColumn("Class mix", help="what bounds its GPUs, by share of their time"),
    "memory headroom": st.column_config.TextColumn(
        "Memory headroom", help="the highest peak memory used on one of its GPUs against that GPU's memory"
    ),
    "busy": st.column_config.ProgressColumn(
        "Busy",
        format="%.0f%%",
        min_value=0,
        max_value=100,
        width=100,
        help="mean share of the time a kernel ran on its GPUs (NVML busy)",
    ),
    "pods": st.column_config.NumberColumn("Pods", format="localized", width=55),
}


ui.page("Jobs", body)
