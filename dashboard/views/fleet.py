"""Fleet page: how many GPUs, how many are held, how many are really busy (SM activity)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import definitions, fleet_names, ui
from dashboard.figures.activity import sm_heatmap, sm_histogram
from dashboard.frames.columns import LEAF, col, with_cols
from dashboard.frames.fleet import fleet_counts, ready_verdicts, youngest_age
from dashboard.frames.jobs import JOB_AGE_KEYS, job_ages, jobs_overview
from dashboard.frames.links import (
    LINK_COUNTERS,
    LINK_UTILIZATION,
    TRANSFER_CLASS,
    busy_but_sm_idle,
    latest,
    leaf_links,
    leaf_words,
    leaves_in_class,
    measured_links,
)
from dashboard.frames.network import gdr_by_gpu, gpu_nics
from dashboard.frames.status import (
    ALL_CLEAR,
    alert_lines,
    gdr_lines,
    gdr_off_nodes,
    job_lines,
    job_nodes,
    lost_lines,
    status_lines,
)
from dashboard.inert_text import inert
from dashboard.sources.prometheus import PrometheusSource
from dashboard.sources.source import JOB_STRAGGLER_COLUMNS, SourceError, Window

# thresholds in the pages' one percentage style (ui.fmt_percent), for the captions below
IDLE_BELOW = ui.fmt_percent(definitions.IDLE_SM_ACTIVE_BELOW)
HELD_BELOW = ui.fmt_percent(fleet_names.CLOCK_HELD_BELOW)
PEERS_GAP = ui.fmt_percent(fleet_names.PEERS_GAP_AT_LEAST)

# A comment, not a docstring (Streamlit's magic would draw one): the history behind "idle for" is
# sampled at the Workloads page's resolution (its allocation activity: the same steps).
ACTIVITY_POINTS = 80


def body(ctx: ui.PageContext) -> None:
    f = ctx.filters
    q = {
        "info": ui.query("instant", "gpulens_gpu_info", f),
        "mig": ui.query("instant", "gpulens_mig_instance_info", f),
        "alloc": ui.query("instant", "gpulens_pod_gpu_allocation", f),
        "idle": ui.query("leaf_idle", f),
        "up": ui.query("instant", "gpulens_up", f),
        "gpu_up": ui.query("instant", "gpulens_gpu_up", f),
        "sm_mean": ui.query("mean", "gpulens_gpu_sm_active_ratio", f, window=ctx.window),
        "util": ui.query("instant", "gpulens_gpu_utilization_ratio", f),
        "classes": ui.query("current_state", "gpulens_gpu_boundness", f, only=("class", TRANSFER_CLASS)),
        "idle_since": ui.query(
            "idle_since", f, window=ctx.window, step_s=max(ctx.step_s, ctx.window_s / ACTIVITY_POINTS)
        ),
        "events": ui.query("mean", "gpulens_gpu_clock_event_active", f, window=ctx.window),
        "clock": ui.query("mean", "gpulens_gpu_sm_clock_hertz", f, window=Window(definitions.MEAN_WINDOW_SECONDS)),
        "clock_max": ui.query("instant", "gpulens_gpu_sm_clock_max_hertz", f),
        "ages": ui.query("window_ages", definitions.LEAF_HISTORY_METRIC, definitions.LEAF, f),
        "alerts": ui.query("instant", "ALERTS", f),
        "paths": ui.query("instant", "gpulens_gpu_nic_path_info", f),
        "ready": ui.query("instant", "gpulens_gpu_nic_gdr_ready", f),
        "jobs": ui.query("job_summary", f),
        "stragglers": ui.query("job_stragglers", f),
        "job_ages": ui.query("window_ages", definitions.POD_HISTORY_METRIC, JOB_AGE_KEYS, f),
    }
    ui.prefetch(ctx, q.values())
    info = ui.get(ctx, q["info"])
    mig = ui.get(ctx, q["mig"])
    alloc = ui.get(ctx, q["alloc"])
    with ui.panel("Status"):
        status_summary(ctx, q, alloc, youngest_age(ui.get(ctx, q["ages"]), alloc))
    with ui.panel("Device counts"):
        try:
            verdicts = ui.get(ctx, q["idle"])
        except SourceError as exc:  # no recording rules: the counts that need none still show
            st.error(inert(exc), icon=":material/warning:")
            verdicts = pd.DataFrame(columns=["uuid", "mig_uuid", "sm_mean", "value"])
        ages = ui.get(ctx, q["ages"])
        # a verdict over the window is given once the leaf's history fills it (collecting before)
        idle = ready_verdicts(verdicts, ages)
        counts = fleet_counts(info, mig, alloc, verdicts, ages)
        c1, c2, c3, c4, c5 = st.columns(5)
        c1.metric("Devices", f"{counts['devices']:,}")
        c2.metric("Allocated", f"{counts['allocated']:,}")
        c3.metric("In use", f"{counts['allocated_in_use']:,}", help="allocated and not idle")
        c4.metric("Allocated but idle", f"{counts['allocated_idle']:,}")
        c5.metric(
            "Collecting",
            f"{counts['collecting']:,}",
            help=f"allocated, with less than {definitions.MEAN_WINDOW} of history to judge by: no verdict yet",
        )
        young = youngest_age(ages, alloc)
        st.caption(
            f"{counts['gpus']:,} physical GPUs; a device is a whole GPU or a MIG instance. Allocated = in use + idle "
            f"+ collecting. Idle = SM active < {IDLE_BELOW} over {definitions.MEAN_WINDOW}, "
            "no kernels running and its links idle (launch-bound and transfer-bound devices are in use): the "
            "recording rules' definition. Collecting: no verdict until the device has "
            f"{definitions.MEAN_WINDOW} of history, as an alert waits out its for: duration"
            + (f" (the youngest: {definitions.collecting_words(young)})" if young == young else "")
            + "."
            + (
                f" {counts['unallocated_in_use']:,} device(s) no pod holds are in use too."
                if counts["unallocated_in_use"]
                else ""
            )
        )
        if info.empty:
            ui.no_data("No GPU in view: no exporter has reported one (check the filters).")

    with ui.panel("Allocated but idle"):
        if counts["allocated_idle"]:
            allocated_idle(ctx, ready_since(ui.get(ctx, q["idle_since"]), idle), info, mig, alloc, idle)

    with ui.panel("Slowest GPUs"):
        slow = fleet_names.slow_gpus(
            info,
            alloc,
            ui.get(ctx, q["events"]),
            ui.get(ctx, q["clock"]),
            ui.get(ctx, q["clock_max"]),
            idle,
        )
        slowest_gpus(ctx, slow, info)

    with ui.panel("Exporters"):
        up = ui.get(ctx, q["up"])
        gpu_up = ui.get(ctx, q["gpu_up"])
        down = gpu_up[gpu_up["value"] < 1] if not gpu_up.empty else gpu_up
        bad = up[up["value"] < 1] if not up.empty else up
        if not bad.empty:
            names = col(bad, "node").where(col(bad, "node") != "", col(bad, "instance"))
            st.error(f"{len(bad)} exporter(s) cannot read their GPUs: " + inert(", ".join(names)))
        if not down.empty:
            st.error(f"{len(down)} GPU(s) lost or unreadable (alert GPULost)", icon=":material/error:")
            table = with_cols(down, ["node", "instance", "gpu", "uuid"])[["node", "instance", "gpu", "uuid"]]
            ui.dataframe(ui.linked(ui.node_column(table)), hide_index=True, column_config=COLUMNS)

    with ui.panel("SM activity"):
        st.subheader(f"SM activity per GPU (mean over {ui.over(ctx)})")
        sm_mean = ui.get(ctx, q["sm_mean"])
        gpus = col(sm_mean, "uuid").nunique()
        cells = not sm_mean.empty and gpus <= ctx.settings.max_marks
        st.caption(
            "GPM SM activity (warps resident), not NVML GPU-Util: a stream of tiny kernels, or a copy over "
            "PCIe or NVLink, shows as busy in nvidia-smi while the SMs idle. MIG instances show their busiest."
            + (
                " A dashed white outline marks a GPU that no pod holds now (free); hover a cell for its pods."
                if cells
                else ""
            )
        )
        if sm_mean.empty:
            ui.no_data(f"No SM activity in {ui.over(ctx)}: the GPUs in view sent no activity series.")
        elif gpus > ctx.settings.max_marks:
            st.caption(
                f"{gpus:,} GPUs, more than a cell each ({ctx.settings.max_marks:,} at most): GPUs per 5 % band of "
                "SM activity. Filter by cluster or node for the map of GPUs."
            )
            ui.chart(sm_histogram(sm_mean), key="sm_histogram")
        else:
            ui.chart(sm_heatmap(sm_mean, alloc), key="sm_heatmap", clickable=True)
        if not sm_mean.empty:
            ui.gpu_picker(info, key="fleet_gpu")

    with ui.panel("Moving data"):
        moving = leaves_in_class(ui.get(ctx, q["classes"]), TRANSFER_CLASS)
        if not moving.empty:
            # SM activity beside the links is a figure (a mean over the history there is), not a verdict
            moving_data(ctx, moving, verdicts)

    with ui.panel("GPU-Util vs SM activity"):
        lie = fleet_names.with_holders(busy_but_sm_idle(ui.get(ctx, q["util"]), idle, moving), alloc)
        if not lie.empty:
            st.warning(
                f"{len(lie)} GPU(s) look busy in nvidia-smi but their SMs are idle (launch-bound or polling): "
                f"GPU-Util now, SM active over {definitions.MEAN_WINDOW}"
            )
            ui.dataframe(
                ui.linked(ui.node_column(lie)),
                hide_index=True,
                column_config={
                    **COLUMNS,
                    "gpu_util": st.column_config.NumberColumn("GPU-Util", format="percent", help="NVML GPU-Util now"),
                },
                column_order=[c for c in LIE_COLUMNS if c in lie.columns or c == ui.GPU_LINK],
            )

    with ui.panel("Models"):
        if not info.empty:
            st.subheader("Models")
            models = with_cols(info, MODEL_COLUMNS)
            # a label an old exporter does not set reads as such, not as a blank cell
            models = models.assign(**{c: models[c].replace("", "not reported") for c in MODEL_COLUMNS})
            table = models.groupby(list(MODEL_COLUMNS), as_index=False).size()
            ui.dataframe(
                table.rename(columns={"size": "gpus"}),
                hide_index=True,
                column_config={
                    "name": st.column_config.TextColumn("Model", help="the NVML name"),
                    "driver_version": st.column_config.TextColumn("Driver"),
                    "mig_mode": st.column_config.TextColumn("MIG mode", help="enabled: split into MIG instances"),
                    "gpus": st.column_config.NumberColumn("GPUs", format="localized"),
                },
            )


def ready_since(since: pd.DataFrame, idle: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``since`` (MetricSource.idle_since) whose leaf has a verdict in ``idle`` (the
    verdicts whose window is full): a device still collecting is not listed as idle."""
    if since.empty:
        return since
    ok = set(zip(col(idle, "uuid"), col(idle, "mig_uuid"), strict=True))
    keep = [(u, m) in ok for u, m in zip(col(since, "uuid"), col(since, "mig_uuid"), strict=True)]
    return since[keep].reset_index(drop=True)


def status_summary(ctx: ui.PageContext, q: dict[str, ui.Query], alloc: pd.DataFrame, young: float) -> None:
    """What is wrong now, one line each with a link to the page that explains it, or all clear:
    firing alerts (Prometheus), lost GPUs and exporters, GPUDirect RDMA not ready, stragglers and
    communication-bound jobs (their verdicts held back while their window fills: ``young``, the
    youngest held device's history in seconds, NaN when none is collecting, says so)."""
    st.subheader("Status")
    problems: list[str] = []

    def read(name: str) -> pd.DataFrame:
        try:
            return ui.get(ctx, q[name])
        except SourceError as exc:  # the summary stands without that check, and says so
            problems.append(f"{name}: {exc}")
            return pd.DataFrame()

    per_gpu = gdr_by_gpu(gpu_nics(read("paths"), read("ready"), pd.DataFrame()))
    summary, strays = read("jobs"), read("stragglers")
    overview = (
        jobs_overview(summary, strays if not strays.empty else pd.DataFrame(columns=list(JOB_STRAGGLER_COLUMNS)),
                      pd.DataFrame(), job_ages(read("job_ages")))
        if not summary.empty
        else pd.DataFrame()
    )  # fmt: skip
    lines = status_lines(
        alerts=alert_lines(read("alerts")),
        gdr=gdr_lines(per_gpu),
        lost=lost_lines(read("gpu_up"), read("up")),
        jobs_=job_lines(overview, job_nodes(alloc), gdr_off_nodes(per_gpu)),
    )
    if not lines:
        st.success(
            f"{ALL_CLEAR}{' so far' if young == young else ''}: no alert firing, no GPU lost, GPUDirect RDMA ready "
            "where there are RDMA NICs, no straggler and no communication-bound job."
            + ("" if isinstance(ctx.source, PrometheusSource) else " (Alerts: Prometheus evaluates them; not here.)"),
            icon=":material/check_circle:",
        )
    if young == young:
        st.caption(
            f"Verdicts over {definitions.MEAN_WINDOW} (idle, launch-bound, slow, straggler, communication-bound) wait "
            f"for that much history: {definitions.collecting_words(young)} for the youngest device."
        )
    for line in lines:
        show = st.error if line.level == "error" else st.warning
        if line.page in ui.PAGES:
            c1, c2 = st.columns([6, 1], vertical_alignment="center")
            with c1:
                show(inert(line.text), icon=":material/error:" if line.level == "error" else ":material/warning:")
            c2.page_link(ui.PAGES[line.page], label="Explain", icon=":material/arrow_forward:",
                         query_params=ctx.link_params())  # fmt: skip
        else:  # a page script run on its own (tests): the line without its link
            show(inert(line.text))
    if problems:
        st.caption(inert("Not checked: " + "; ".join(problems)))


# Throughput "now": each link's rate over the last minute (Prometheus' shortest rate() window, a
# point or two per device however many the fleet has). A comment: Streamlit's magic would draw a docstring.
LINK_NOW_SECONDS = 60.0


def moving_data(ctx: ui.PageContext, moving: pd.DataFrame, idle: pd.DataFrame) -> None:
    """The leaves in class transfer now, as what they are: moving data over PCIe or NVLink while
    their SMs idle, with each link's use and throughput now and SM activity over the idle
    definition's window."""
    f = ctx.filters
    use = {link: ui.query("instant", metric, f) for link, metric in LINK_UTILIZATION.items()}
    rates = {
        key: ui.query("rate", metric, f, window=Window(LINK_NOW_SECONDS), step_s=LINK_NOW_SECONDS)
        for key, metric in LINK_COUNTERS.items()
    }
    ui.prefetch(ctx, [*use.values(), *rates.values()])
    table = leaf_links(
        moving,
        {link: ui.get(ctx, qq) for link, qq in use.items()},
        {key: latest(ui.get(ctx, qq)) for key, qq in rates.items()},
    )
    sm = with_cols(idle, LEAF)[[*LEAF, "sm_mean"]].rename(columns={"sm_mean": "sm_active"})
    table = table.merge(sm, on=list(LEAF), how="left")
    leaves = zip(table["mig_uuid"], table["mig_profile"], strict=True)
    table = measured_links(table.assign(device=[leaf_words(m, p) for m, p in leaves]))
    st.info(
        f"{ui.devices(table['mig_uuid'])} moving data: PCIe/NVLink busy, SMs idle (class transfer, e.g. a data "
        "loader copying to the GPU). nvidia-smi counts the copies as busy; the links, not the kernels, are the limit. "
        f"Link use now, throughput over the last minute, SM active over {definitions.MEAN_WINDOW}.",
        icon=":material/swap_horiz:",
    )
    columns = ["node", "instance", "gpu", "device", *ui.link_columns(table), "sm_active", "uuid", "mig_uuid"]
    shown = ui.link_table(table[[c for c in columns if c in table.columns]])
    ui.dataframe(
        shown,
        hide_index=True,
        # the UUID is not drawn (the links take the width; the GPU's page, the link, shows it)
        column_order=[c for c in shown.columns if c != "uuid"],
        column_config={**COLUMNS, **ui.LINK_COLUMN_CONFIG, "device": COLUMNS["device"]},
        key="moving_data",
    )


# Column headers of every table on this page (the GPU-page link reads "Page": "GPU" is the index).
COLUMNS = {
    **ui.COLUMN_CONFIG,
    ui.GPU_LINK: st.column_config.LinkColumn(
        "Page", display_text="open", help="the GPU's page: every metric over time", width="small"
    ),
    "node": st.column_config.TextColumn("Node", help="its node (or its exporter, where no node label is set)"),
    "instance": st.column_config.TextColumn("Exporter", help="the exporter's scrape address"),
    "gpu": st.column_config.TextColumn("GPU", help="the GPU's index on its node, and the MIG instance where it is one"),
    "device": st.column_config.TextColumn("Device", help="the whole GPU, or the MIG instance"),
    "pods": st.column_config.TextColumn("Pod", help="namespace/pod of each pod holding it"),
    "owners": st.column_config.TextColumn("Owner", help="the workload owning each pod: Kind/name"),
    "idle_for": st.column_config.TextColumn(
        "Idle for", help="since its last busy moment in the range, or since its pod got it"
    ),
    "why": st.column_config.TextColumn(
        "Slowed by (share of range)", help="each clock event that held its clocks down, and for what share of the range"
    ),
    "sm_clock": st.column_config.TextColumn(
        "SM clock / max",
        help=f"mean SM clock over its maximum, last {definitions.MEAN_WINDOW}; an idle GPU lowers its clocks by design",
    ),
    "sm_active": st.column_config.NumberColumn(
        "SM active", format="percent", help=f"mean SM activity over the last {definitions.MEAN_WINDOW}"
    ),
    "uuid": st.column_config.TextColumn(
        "UUID", help="the GPU's UUID (the MIG instance's where it is one)", width="large"
    ),
}
MODEL_COLUMNS = ("name", "driver_version", "mig_mode")
LIE_COLUMNS = (ui.GPU_LINK, "node", "instance", "gpu", "pods", "owners", "gpu_util", "sm_active")


def allocated_idle(
    ctx: ui.PageContext,
    activity: pd.DataFrame,
    info: pd.DataFrame,
    mig: pd.DataFrame,
    alloc: pd.DataFrame,
    idle: pd.DataFrame,
) -> None:
    """The devices behind the "Allocated but idle" count, by name: where, whose, for how long,
    the longest idle first, at most fleet_names.ROWS_SHOWN of them."""
    table = fleet_names.allocated_idle(info, mig, alloc, idle, activity, now=ctx.at, window_s=ctx.window_s)
    if table.empty:
        return
    head, more = fleet_names.shown(table)
    st.subheader("Allocated but idle")
    st.caption(
        f"{ui.devices(table['mig_uuid'])} held by a pod with idle SMs (the definition above), the longest idle first. "
        "Idle for: since its last busy moment in the range; a device never busy in the range reads the whole "
        "range, not a time it cannot know."
    )
    # no UUID column: node and index name the device, and its page (the link) shows its UUID
    columns = [ui.GPU_LINK, "node", "gpu", "pods", "owners", "idle_for", "sm_active"]
    ui.table(ui.linked(head, ctx)[columns], key="idle_names", column_config=COLUMNS)
    if more:
        _more(more, "workloads", "Workloads")


def slowest_gpus(ctx: ui.PageContext, slow: pd.DataFrame, info: pd.DataFrame) -> None:
    """The GPUs running below their clocks (fleet_names.slow_gpus), the slowest first, or one
    sentence saying there are none."""
    window = ui.over(ctx)
    if info.empty:
        return
    st.subheader("Slowest GPUs")
    if slow.empty:
        st.success(
            f"No GPU ran slow in {inert(window)}: no thermal, power-brake or hardware slowdown, and every GPU in "
            f"use kept its SM clock at {HELD_BELOW} of its maximum or more and within "
            f"{PEERS_GAP} of its peers' (a power cap near the maximum clock is normal "
            "under load).",
            icon=":material/speed:",
        )
        return
    head, more = fleet_names.shown(slow)
    st.caption(
        f"{len(slow):,} GPU(s) held down by a thermal, power-brake or hardware slowdown in {inert(window)}, or in "
        f"use with the SM clock under {HELD_BELOW} of its maximum or "
        f"{PEERS_GAP} or more behind its peers' (the other GPUs of its model in use); the "
        "slowest first. A power cap near the maximum clock is not listed: that is a GPU working at its limit. A job "
        "runs at its slowest GPU's pace (stragglers: Jobs page)."
    )
    columns = [ui.GPU_LINK, "node", "gpu", "sm_clock", "why", "pods", "owners"]
    ui.table(ui.linked(head, ctx)[columns], key="slow_names", column_config=COLUMNS)
    if more:
        _more(more, "health", "Health")


def _more(count: int, page: str, title: str) -> None:
    """``and K more: see <page>`` under a capped table, linking the page with this view's range and filters."""
    if page in ui.PAGES:
        st.page_link(
            ui.PAGES[page],
            label=f"and {count:,} more: see {inert(title)}",
            icon=":material/arrow_forward:",
            query_params=ui.context().link_params(),
        )
    else:
        st.caption(f"and {count:,} more: see {inert(title)}")


ui.page("Fleet", body)
