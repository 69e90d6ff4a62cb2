"""GPU page: one GPU over the range, as a Grafana GPU dashboard reads: a header (model, node, who
holds it, how it is shared, whether the exporter can read it, what limits it now), then a section per
question (activity, memory, power and clocks, links, errors, probes, sharing), every chart titled and
named in words with its unit on the axis (dashboard/gpu_panels.py's table).

Opened from any table or chart that names a GPU (``/gpu?uuid=GPU-…``, with the view's range and
filters); without a GPU in the URL it offers a picker.
"""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from dashboard import gpu_panels, ui
from dashboard.figures.timelines import state_strip, time_lines
from dashboard.frames.columns import col, with_cols
from dashboard.frames.jobs import where_words
from dashboard.frames.links import link_panels, link_table, outbound
from dashboard.frames.network import NIC_KEYS, NIC_RX, NIC_TX, PATH_WORDS, gpu_nics, nic_table
from dashboard.frames.series import pods_over_range, state_timeline
from dashboard.inert_text import inert
from dashboard.promql import selector
from dashboard.serving_rows import serving_row
from dashboard.sources.source import Filters, rate_steps


def body(ctx: ui.PageContext) -> None:
    info = ui.fetch(ctx, "instant", "gpulens_gpu_info", ctx.filters)
    # every GPU the exporters list, answering or lost (a lost GPU has no gpulens_gpu_info)
    up = ui.fetch(ctx, "instant", "gpulens_gpu_up", Filters(cluster=ctx.filters.cluster))
    uuid = _pick(info, up)
    if not uuid:
        return
    mig = str(st.query_params.get("mig_uuid", ""))
    steps = rate_steps(ctx.window.stepped(ctx.step_s)[1])
    series = ui.fetch(ctx, "device_series", uuid, window=ctx.window, step_s=ctx.step_s)
    mine = info[col(info, "uuid") == uuid]
    head = gpu_panels.header(uuid, series, up, mine)

    with ui.panel("Header"):
        _header(head, gpu_panels.about(series, mine), mig, gpu_panels.leaves_now(series))

    with ui.panel("Pods that held it"):
        st.subheader("Pods that held this GPU in the range")
        pods = pods_over_range(series)
        if pods.empty:
            st.info("No pod held this GPU in the range.")
        else:
            pods = pods.assign(
                first_seen=[ui.fmt_time(t) for t in pods["first_seen"]],
                last_seen=[ui.fmt_time(t) for t in pods["last_seen"]],
                workload=_job_links(ctx, pods, mine),
            )
            ui.table(pods, key="gpu_pods", column_config=PODS_CONFIG)

    with ui.panel("Serving"):
        # the pods holding it now that serve a model (nothing drawn where none does)
        cluster = {"cluster": str(col(mine, "cluster").iloc[0])} if not mine.empty else {}
        serving_row(ctx, selector("gpulens_pod_gpu_allocation", {"uuid": uuid}), cluster)

    drawn = gpu_panels.panels(series, steps)
    if series.empty:
        ui.no_data(f"No series of this GPU in {ui.over(ctx)}: its exporter sent none in the range.")
    for group in gpu_panels.GROUPS:
        of_group = [d for d in drawn if d.panel.group == group]
        if group == gpu_panels.ACTIVITY:
            st.header(inert(group))
            with ui.panel("Boundness"):
                boundness(series, head, mine)
        elif group == gpu_panels.POWER:
            st.header(inert(group))
        elif group == gpu_panels.LINKS:
            st.header(inert(group))
            with ui.panel("Links"):
                links(series, steps)
            with ui.panel("NICs"):
                nics(ctx, uuid, info)
        elif group == gpu_panels.ERRORS:
            st.header(inert(group))
            with ui.panel("Errors"):
                errors(series)
        elif of_group:
            st.header(inert(group))
        for i, d in enumerate(of_group):
            with ui.panel(d.panel.title):
                st.subheader(inert(d.panel.title))
                if d.panel.note:
                    st.caption(inert(d.panel.note))
                small = gpu_panels.multiples(d.lines)
                if small:
                    _multiples(d, small, key=f"gpu_{group}_{i}")
                else:
                    ui.chart(gpu_panels.lines_chart(d.lines, d.panel.unit), key=f"gpu_{group}_{i}")
        if group == gpu_panels.POWER:
            with ui.panel("Clock events"):
                clock_events(series, head)
        elif group == gpu_panels.PROBES and of_group:
            probes = gpu_panels.probe_words(series)
            if probes:
                st.caption(inert(probes))


# The devices table of a MIG or shared GPU (a comment: Streamlit's magic would draw a docstring).
LEAVES_CONFIG = {
    "device": st.column_config.TextColumn("Device", help="the whole GPU, or a MIG instance (profile, short UUID)"),
    "pods": st.column_config.TextColumn("Held by", help="namespace/pod of each pod holding it now"),
    "owners": st.column_config.TextColumn("Owner", help="the workload owning each pod: Kind/name"),
    "class": st.column_config.TextColumn("Class now", help="what limits it now (its boundness class)"),
}


# Small multiples side by side, each one's plot height (px) and its legend's columns: two charts fit
# 1,440 px with their legends; the chart's height holds its axis and legend too. A comment, not a
# docstring: Streamlit's magic would draw a string statement.
MULTIPLE_COLUMNS = 2
MULTIPLE_HEIGHT = 200
MULTIPLE_LEGEND_COLUMNS = 2


def _multiples(d: gpu_panels.Drawn, small: list[tuple[str, pd.DataFrame]], key: str) -> None:
    """A panel of a MIG GPU as small multiples: a chart per instance (the whole GPU's own series
    first), the same lines in the same colours in each, two side by side."""
    names = list(dict.fromkeys(d.lines["line"]))
    instances = sum(1 for leaf, _ in small if leaf != gpu_panels.WHOLE_GPU)
    st.caption(
        f"A chart per MIG instance ({instances:,}), the GPU's own series first; a line keeps its colour in every chart."
    )
    for start in range(0, len(small), MULTIPLE_COLUMNS):
        row = small[start : start + MULTIPLE_COLUMNS]
        for j, (column, (leaf, sub)) in enumerate(zip(st.columns(MULTIPLE_COLUMNS), row, strict=False)):
            with column:
                st.markdown(f"**{inert(leaf)}**")
                legend_rows = math.ceil(len(names) / MULTIPLE_LEGEND_COLUMNS)
                chart = gpu_panels.lines_chart(sub, d.panel.unit, names=names, legend_columns=MULTIPLE_LEGEND_COLUMNS,
                                               height=MULTIPLE_HEIGHT + 20 * legend_rows, label_limit=190)  # fmt: skip
                ui.chart(chart, key=f"{key}_{start + j}")


def _pick(info: pd.DataFrame, up: pd.DataFrame) -> str:
    """The GPU picker: every GPU exported now, and the URL's GPU even when it is not (a lost GPU,
    or one gone from the range's end), named by where it is; the chosen UUID, ``""`` for none."""
    gpus = with_cols(info, ["uuid", "gpu", "node", "instance", "name"])
    where = gpus["node"].where(gpus["node"] != "", gpus["instance"])
    names = {
        u: f"{w} · GPU {g} · {n} · {u}"
        for u, g, w, n in zip(gpus["uuid"], gpus["gpu"], where, gpus["name"], strict=True)
    }
    wanted = str(st.query_params.get("uuid", ""))
    options = sorted(names, key=lambda u: names[u])
    if wanted and wanted not in names:
        options = [wanted, *options]
        row = with_cols(up[col(up, "uuid") == wanted], ["gpu", "node", "instance", "value"])
        if row.empty:
            names[wanted] = f"{wanted} · not exported now"
        else:
            r = row.iloc[0]
            state = "LOST" if float(r["value"]) < 0.5 else "not in the filters' view"
            names[wanted] = f"{where_words(r['node'], r['instance'])} · GPU {r['gpu']} · {wanted} · {state}"
    if not options:
        ui.no_data("No GPU in view: no exporter has reported one (check the filters).")
        return ""
    uuid = str(
        st.selectbox(
            "GPU", options, index=options.index(wanted) if wanted in options else 0, format_func=lambda u: names[u]
        )
    )
    if uuid != wanted:
        st.query_params["uuid"] = uuid
        if "mig_uuid" in st.query_params:
            del st.query_params["mig_uuid"]
    return uuid


def _header(head: gpu_panels.Header, about: str, mig: str, leaves: pd.DataFrame) -> None:
    """The header: a LOST banner first where the GPU is lost, then short facts (node, GPU index,
    model, state; who holds it, its owner, its class now, sharing), a value each; a MIG or shared
    GPU's devices one row each (device, pods, owner, class now), as nvitop lists them."""
    if head.lost:
        st.error(f"**LOST.** {inert(head.banner)}", icon=":material/error:")
    facts = list(head.facts.items())
    for row in (facts[:4], facts[4:]):
        for column, (title, value) in zip(st.columns(len(row)), row, strict=True):
            column.caption(inert(title))
            short, _, rest = value.partition(": ") if title == "Class now" else (value, "", "")
            column.markdown(f"**{inert(short)}**")
            if rest:
                column.caption(inert(rest))
    if not leaves.empty:
        ui.table(leaves, key="gpu_leaves", column_config=LEAVES_CONFIG)
    if about:
        st.caption(inert(about))
    if mig:
        st.caption(f"Opened for MIG instance {inert(mig)}; the charts show the GPU and every instance on it.")


def boundness(series: pd.DataFrame, head: gpu_panels.Header, info: pd.DataFrame) -> None:
    """What limits the GPU over the range (its boundness class per leaf), or why it has none."""
    st.subheader("What limits it: boundness class over time")
    classes = state_timeline(series, "gpulens_gpu_boundness", "class")
    if classes.empty:
        ident = gpu_panels.identity(series, info)
        st.info(inert(gpu_panels.no_class_words(series, ident, "LOST" if head.lost else "answering")))
    else:
        ui.chart(state_strip(classes, "class"), key="gpu_class")


def clock_events(series: pd.DataFrame, head: gpu_panels.Header) -> None:
    """Clock events (throttle reasons) over the range in words; while the GPU is lost nothing is
    known about them, and the page says so rather than "no clock event"."""
    st.subheader("Clock events (throttling) over time")
    events = state_timeline(series, "gpulens_gpu_clock_event_active", "reason")
    events = gpu_panels.in_words(events, "reason", gpu_panels.CLOCK_EVENT_WORDS).rename(
        columns={"reason": "clock event"}
    )
    if not events.empty:
        ui.chart(state_strip(events, "clock event"), key="gpu_events")
    if head.lost:
        st.info(
            "Nothing is known about clock events while the GPU is lost: the exporter cannot read them"
            + (" (the strip shows the range before)." if not events.empty else ".")
        )
    elif events.empty:
        st.success("No clock event held the clocks down in the range.")
    energy = gpu_panels.energy_words(series)
    if energy:
        st.caption(inert(energy))


def errors(series: pd.DataFrame) -> None:
    """The errors in sentences: what happened in the range, or that nothing did; the panels with
    something to show follow."""
    happened, quiet = gpu_panels.errors_words(series)
    for line in happened:
        st.warning(inert(line), icon=":material/warning:")
    if quiet:
        named = [t if t[1:2].isupper() else t[:1].lower() + t[1:] for t in quiet]
        lead = "Nothing else in the range" if happened else "No error in the range"
        st.success(f"{inert(lead)}: {inert(', '.join(named))}: none.")
    if not happened and not quiet:
        st.info("No error series in the range (the exporter reads the error counters every 10 cycles).")


def _job_links(ctx: ui.PageContext, pods: pd.DataFrame, info: pd.DataFrame) -> list[str]:
    """Each holder's job page (frames.series.pods_over_range's ``workload`` is ``Kind/name``; a pod of no
    owner is the job ``Pod/<pod>``), in the GPU's cluster; ``""`` where the owner has no kind."""
    cluster = str(col(info, "cluster").iloc[0]) if not info.empty else ""
    params = ctx.link_params()
    out = []
    for ns, pod, workload in zip(pods["namespace"], pods["pod"], pods["workload"], strict=True):
        kind, _, name = str(workload).rpartition("/") if workload else ("Pod", "/", str(pod))
        out.append(ui.job_url((cluster, str(ns), kind, name), params) if kind and name else "")
    return out


def nics(ctx: ui.PageContext, uuid: str, info: pd.DataFrame) -> None:
    """The GPU's nearest RDMA NICs (docs/network.md): device, PCIe path, GPUDirect RDMA state and
    reason in words, and each NIC's throughput now (GB/s each way); the others are on the Network page."""
    row = with_cols(info[col(info, "uuid") == uuid], ["instance"])
    if row.empty:
        return
    on_node = Filters(cluster=ctx.filters.cluster, instance=str(row["instance"].iloc[0]) or None)
    paths = ui.fetch(ctx, "instant", "gpulens_gpu_nic_path_info", on_node)
    paths = paths[col(paths, "uuid") == uuid]
    if paths.empty:
        return  # a node without RDMA NICs: nothing to say on every GPU page
    ready = ui.fetch(ctx, "instant", "gpulens_gpu_nic_gdr_ready", on_node)
    pairs = gpu_nics(paths, ready[col(ready, "uuid") == uuid], info)
    near = pairs[pairs["nearest"]]
    st.subheader("Nearest NICs")
    by = list(NIC_KEYS)
    tx = ui.fetch(ctx, "rate", NIC_TX, on_node, window=ctx.window, step_s=ctx.step_s, by=by)
    rx = ui.fetch(ctx, "rate", NIC_RX, on_node, window=ctx.window, step_s=ctx.step_s, by=by)
    rates = nic_table(near.assign(kind="", numa_node="", pci_bus_id=""), pd.DataFrame(), pd.DataFrame(), tx, rx)
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
        path=[PATH_WORDS.get(str(p), str(p)) for p in table["path"]],
        gdr_ready=["ready" if r else "not ready" for r in table["gdr_ready"]],
        tx=[ui.fmt_rate(v) for v in table["tx"]],
        rx=[ui.fmt_rate(v) for v in table["rx"]],
    )[["device", "path", "gdr_ready", "reason", "tx", "rx"]]
    ui.dataframe(shown, hide_index=True, key="gpu_nics", column_config=NIC_TABLE_CONFIG)


def links(series: pd.DataFrame, steps: int) -> None:
    """PCIe and NVLink: what each link carries (capacity) and where its bytes are read from, the
    range's means, and throughput each way (the rate over ``steps`` steps) and use over time."""
    st.subheader("Links: PCIe and NVLink")
    nvlink, degraded = gpu_panels.nvlink_words(series)
    if degraded:
        st.warning(inert(nvlink) + " Its collectives and peer copies run that much slower (alert GPUNvlinkDown).")
    elif nvlink:
        st.caption(inert(nvlink))
    throughput, use = link_panels(series, steps)
    table = link_table(series)
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
        ui.dataframe(
            ui.humanize_bytes(ui.link_use_percent(table, ["mean_utilization", "peak_utilization"])),
            hide_index=True,
            column_config=LINK_TABLE_CONFIG,
            key="gpu_links",
        )
    left, right = st.columns(2)
    with left:
        st.markdown("**Throughput, GB/s**")
        ui.chart(
            time_lines(throughput, "bytes_per_second", legend_columns=2, dashed=outbound(throughput)),
            key="gpu_link_throughput",
        )
    with right:
        st.markdown("**Use, % of capacity**")
        ui.chart(time_lines(use, "ratio", full_scale=True, legend_columns=2), key="gpu_link_use")


# The link table (frames.links.link_table) in words (a comment: Streamlit's magic would draw a docstring).
LINK_TABLE_CONFIG = {
    "device": st.column_config.TextColumn("device", help="the whole GPU, or the MIG instance"),
    "capacity_bytes_per_second": st.column_config.TextColumn(
        "capacity each way", help="PCIe: generation x lanes, after line encoding; NVLink: the active links together"
    ),
    "measured_by": st.column_config.TextColumn("bytes read from"),
    "in_bytes_per_second": st.column_config.TextColumn("in (mean)", help="into the GPU, mean over the range"),
    "out_bytes_per_second": st.column_config.TextColumn("out (mean)", help="out of the GPU, mean over the range"),
    "mean_utilization": st.column_config.ProgressColumn(
        "use (mean)", format=ui.PERCENT_FORMAT, min_value=0, max_value=100
    ),
    "peak_utilization": st.column_config.ProgressColumn(
        "use (peak)", format=ui.PERCENT_FORMAT, min_value=0, max_value=100
    ),
}

PODS_CONFIG = {
    "mig_uuid": st.column_config.TextColumn("MIG instance", help="empty: the whole GPU"),
    "replicas": st.column_config.NumberColumn("Replicas", help="time-slicing replicas the container held"),
    "first_seen": st.column_config.TextColumn("First seen"),
    "last_seen": st.column_config.TextColumn("Last seen"),
    "workload": st.column_config.LinkColumn(
        "Job", display_text=ui.JOB_IN_URL, help="the job the pod belongs to (namespace/kind/name): its page"
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
