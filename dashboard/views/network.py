"""Network page: every node's RDMA NICs (throughput each way against the line rate, errors and
retransmits, port state), GPUDirect RDMA readiness per GPU with the reason in words, which pods hold
which NICs, and how much of its GPUs' time each pod spends waiting in collectives (docs/network.md)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import definitions, ui
from dashboard.figures.network import communication_bars, nic_throughput_bars
from dashboard.figures.timelines import time_lines
from dashboard.frames.columns import with_cols
from dashboard.frames.network import (
    NIC_KEYS,
    NIC_RX,
    NIC_TX,
    gdr_by_gpu,
    gpu_nics,
    nic_errors,
    nic_table,
    pod_gpu_classes,
    pod_nics,
)
from dashboard.inert_text import inert
from dashboard.sources.source import Window

# Nodes drawn one throughput chart each; beyond, the table only (pick a node in the sidebar). A
# comment, not a docstring: Streamlit's magic would draw a string statement on the page.
MAX_NODE_CHARTS = 6


def body(ctx: ui.PageContext) -> None:
    f = ctx.filters
    window = ui.fmt_duration(ctx.window_s)
    over = ui.over(ctx)
    by = list(NIC_KEYS)
    q = {
        "info": ui.query("instant", "gpulens_nic_info", f),
        "state": ui.query("instant", "gpulens_nic_port_state_id", f),
        "line": ui.query("instant", "gpulens_nic_port_rate_bytes_per_second", f),
        "tx": ui.query("rate", NIC_TX, f, window=ctx.window, step_s=ctx.step_s, by=by),
        "rx": ui.query("rate", NIC_RX, f, window=ctx.window, step_s=ctx.step_s, by=by),
        "errors": ui.query("increase", "gpulens_nic_port_stat_total", f, window=ctx.window),
        "paths": ui.query("instant", "gpulens_gpu_nic_path_info", f),
        "ready": ui.query("instant", "gpulens_gpu_nic_gdr_ready", f),
        "gpus": ui.query("instant", "gpulens_gpu_info", f),
        "alloc": ui.query("instant", "gpulens_pod_nic_allocation", f),
        "holders": ui.query("instant", "gpulens_nic_pods", f),
        "pod_class": ui.query("mean", "gpulens_pod_gpu_boundness", f, window=Window(definitions.MEAN_WINDOW_SECONDS)),
        "pod_now": ui.query("current_state", "gpulens_pod_gpu_boundness", f),
    }
    ui.prefetch(ctx, q.values())
    info = ui.get(ctx, q["info"])
    if info.empty:
        st.info(
            "No RDMA NIC in view: the nodes here have no EFA, InfiniBand or RoCE device (or their exporters "
            "run with --no-collect.nic). GPUs of such nodes talk to other nodes over TCP only."
        )
        return
    tx, rx = ui.get(ctx, q["tx"]), ui.get(ctx, q["rx"])
    nics = nic_table(info, ui.get(ctx, q["state"]), ui.get(ctx, q["line"]), tx, rx)

    with ui.panel("NICs"):
        _nics(nics)

    with ui.panel("Throughput over time"):
        st.subheader("Throughput over time, per node")
        lines = _node_lines(tx, "sent") + _node_lines(rx, "received")
        lines = [x for x in lines if not x.empty]
        if not lines:
            st.info("No NIC throughput in the range yet: a rate needs a minute of history.")
        else:
            df = pd.concat(lines, ignore_index=True)
            ui.chart(time_lines(df, "bytes_per_second", legend_columns=2, dashed=_received(df)), key="nic_time")
            st.caption("All of a node's NICs together; received dashed.")

    with ui.panel("Errors and retransmits"):
        st.subheader(f"Errors and retransmits (last {inert(window)})")
        errors = nic_errors(ui.get(ctx, q["errors"]))
        if errors.empty:
            st.success(f"No NIC errors, drops or retransmits in {inert(over)}.")
        else:
            st.caption(
                "Counters that grew over the range: drops, retransmits and timeouts slow every collective of "
                "the job; link errors point at a cable or transceiver."
            )
            table = errors.assign(count=[f"{v:,.0f}" for v in errors["count"]])
            ui.table(ui.node_column(table), key="nic_errors", column_config=ERROR_CONFIG)

    with ui.panel("GPUDirect RDMA"):
        _gdr(ui.get(ctx, q["paths"]), ui.get(ctx, q["ready"]), ui.get(ctx, q["gpus"]))

    with ui.panel("Pods and NICs"):
        st.subheader("Pods holding NICs")
        leaves, pods_comm = definitions.communication_share_frame(ui.get(ctx, q["pod_class"]))
        pods = pod_nics(ui.get(ctx, q["alloc"]), ui.get(ctx, q["holders"]), nics, pods_comm)
        if pods.empty:
            st.info("No pod holds a NIC through a device plugin: a pod without one talks over its node's network.")
        else:
            st.caption(
                "Throughput counts the NICs a pod holds alone; a NIC held by several pods cannot be split among "
                f"them and reads shared. Communication = the share of its GPUs' time over the last "
                f"{definitions.MEAN_WINDOW} spent waiting in collectives (the rule's figure)."
            )
            table = pods.assign(
                shared=[f"{n} shared" if n else "none" for n in pods["shared"]],
                tx=[_traffic(v, s) for v, s in zip(pods["tx"], pods["shared"], strict=True)],
                rx=[_traffic(v, s) for v, s in zip(pods["rx"], pods["shared"], strict=True)],
                communication=pods["communication"] * 100.0,
            )
            ui.table(
                ui.node_column(table), key="pod_nics", column_config=POD_CONFIG, missing={"communication": "no class"}
            )

    with ui.panel("Communication"):
        st.subheader("Time in communication per GPU")
        per_gpu = pod_gpu_classes(ui.get(ctx, q["pod_now"]), leaves, ui.get(ctx, q["gpus"]))
        per_gpu = (
            per_gpu[per_gpu["pod"].isin(set(pods["pod"]) if not pods.empty else set())]
            if not per_gpu.empty
            else per_gpu
        )
        if per_gpu.empty:
            st.info(f"No GPU of a pod holding NICs has a class over the last {definitions.MEAN_WINDOW} (needs GPM).")
        else:
            for sentence in _stragglers(per_gpu):
                st.warning(inert(sentence), icon=":material/hourglass_bottom:")
            st.caption(
                "A GPU spinning in a collective (NCCL) reads class communication: it waits on its peers or the "
                "network. One GPU computing while its peers wait is a straggler (a throttled or slower GPU)."
            )
            ui.chart(communication_bars(per_gpu), key="comm_bars")


def _nics(nics: pd.DataFrame) -> None:
    """Port state, one throughput chart per node (up to MAX_NODE_CHARTS) and the NIC table."""
    st.subheader("NICs: throughput now against the line rate")
    down = nics[nics["ports_down"] > 0]
    if not down.empty:
        where = ", ".join(
            f"{n or i} {d}" for n, i, d in zip(down["node"], down["instance"], down["device"], strict=True)
        )
        st.warning(f"{len(down)} NIC(s) with a port down: {inert(where)}", icon=":material/link_off:")
    inactive = nics[(nics["state"] != "active") & (nics["ports_down"] == 0)]
    if not inactive.empty:
        st.warning(
            f"{len(inactive)} NIC(s) not active: " + inert(", ".join(inactive["device"])), icon=":material/link_off:"
        )
    if down.empty and inactive.empty:
        st.success(f"All {len(nics)} NICs in view are up (port state active).")
    st.caption(
        "Throughput: the rate of each NIC's byte counters over the last step (a minute at least); the tick is "
        "its line rate each way. Use = the busier direction over the line rate."
    )
    where = nics["node"].where(nics["node"] != "", nics["instance"])
    nodes = list(dict.fromkeys(where))
    for i, node in enumerate(nodes[:MAX_NODE_CHARTS]):
        st.markdown(f"**{inert(node)}**: {int((where == node).sum())} NICs")
        ui.chart(nic_throughput_bars(nics[where == node]), key=f"nic_bars_{i}")
    if len(nodes) > MAX_NODE_CHARTS:
        st.caption(f"{len(nodes)} nodes: the charts show the first {MAX_NODE_CHARTS}; pick a node in the sidebar.")
    table = nics.assign(
        tx=[ui.fmt_rate(v) for v in nics["tx"]],
        rx=[ui.fmt_rate(v) for v in nics["rx"]],
        line_rate=[ui.fmt_line_rate(v) for v in nics["line_rate"]],
        utilization=nics["utilization"] * 100.0,
    ).drop(columns=["ports_down"])
    ui.table(ui.node_column(table), key="nic_table", column_config=NIC_CONFIG, missing={"utilization": "not measured"})


def _node_lines(rates: pd.DataFrame, direction: str) -> list[pd.DataFrame]:
    """A node's NICs summed, one line per node and direction (``series``: "<node> sent")."""
    if rates.empty:
        return []
    r = with_cols(rates, ["node", "instance"])
    r = r.assign(where=r["node"].where(r["node"] != "", r["instance"]))
    total = r.groupby(["where", "timestamp"], as_index=False)["value"].sum()
    return [total.assign(series=[f"{w} {direction}" for w in total["where"]])[["timestamp", "series", "value"]]]


def _received(lines: pd.DataFrame) -> list[str]:
    return [s for s in dict.fromkeys(lines["series"]) if str(s).endswith(" received")]


def _traffic(value: float, shared: int) -> str:
    """A pod's NIC throughput in words: the rate, or "shared" where it holds no NIC alone."""
    if value != value:
        return "shared" if shared else ""
    return ui.fmt_rate(value)


def _gdr(paths: pd.DataFrame, ready: pd.DataFrame, gpus: pd.DataFrame) -> None:
    """GPUDirect RDMA per node and GPU: ready or not with its nearest NICs, and why."""
    st.subheader("GPUDirect RDMA: can the NICs read and write GPU memory directly?")
    pairs = gpu_nics(paths, ready, gpus)
    per_gpu = gdr_by_gpu(pairs)
    if per_gpu.empty:
        st.info("No GPU–NIC path known: the exporters did not place the GPUs and NICs on the PCIe tree.")
        return
    st.caption(
        "Per GPU, with its nearest NICs: ready when a peer-memory module, DMA-BUF or the EFA driver lets the NIC "
        "reach GPU memory, and the NIC sits close enough (PIX or PXB) for NCCL to use it. Without it, every "
        "byte a GPU sends to another node is copied through host memory first."
    )
    where = per_gpu["node"].where(per_gpu["node"] != "", per_gpu["instance"])
    for node in dict.fromkeys(where):
        rows = per_gpu[where == node]
        ok = int(rows["ready"].sum())
        if ok == len(rows):
            how = ", ".join(sorted(set(rows["reason"]))).removeprefix("ready: ")
            st.success(
                f"{inert(node)}: GPUDirect RDMA ready on all {len(rows)} GPUs ({inert(how)}).", icon=":material/check:"
            )
        else:
            why = "; ".join(sorted(set(rows[~rows["ready"]]["reason"])))
            st.warning(
                f"{inert(node)}: GPUDirect RDMA not ready on {len(rows) - ok:,} of {len(rows)} GPUs: {inert(why)}.",
                icon=":material/block:",
            )
    table = per_gpu.assign(ready=["ready" if r else "not ready" for r in per_gpu["ready"]])
    ui.table(ui.linked(ui.node_column(table)), key="gdr_table", column_config=GDR_CONFIG)


def _stragglers(per_gpu: pd.DataFrame) -> list[str]:
    """Sentences naming the GPUs that compute while most of their pod's GPUs wait in communication."""
    out = []
    for (ns, pod), g in per_gpu.groupby(["namespace", "pod"], sort=True):
        waiting = g[g["class"] == definitions.COMMUNICATION_CLASS]
        computing = g[g["class"].isin(("compute", "memory", "mixed"))]
        if len(g) >= 2 and len(waiting) >= len(g) / 2 and 0 < len(computing) < len(waiting):
            which = ", ".join(
                f"GPU {x}" if x else str(u) for x, u in zip(computing["gpu"], computing["uuid"], strict=True)
            )
            out.append(
                f"{ns}/{pod}: {len(waiting)} of {len(g)} GPUs wait in communication while {which} computes: "
                "a straggler holds the job back (is it throttled? see the Health page)."
            )
    return out


# Column settings of the page's tables, in words (comments: Streamlit's magic would draw a docstring).
NIC_CONFIG = {
    "device": st.column_config.TextColumn("NIC", help="the RDMA device's name"),
    "kind": st.column_config.TextColumn("Kind"),
    "numa_node": st.column_config.TextColumn("NUMA node"),
    "pci_bus_id": st.column_config.TextColumn("PCI bus ID", width="medium"),
    "state": st.column_config.TextColumn("Port state"),
    "tx": st.column_config.TextColumn("Sent", help="bytes sent per second now"),
    "rx": st.column_config.TextColumn("Received", help="bytes received per second now"),
    "line_rate": st.column_config.TextColumn(
        "Line rate", help="each way: the NIC's rating in bits per second, and the same in bytes per second"
    ),
    "utilization": st.column_config.ProgressColumn(
        "Use", format=ui.PERCENT_FORMAT, min_value=0, max_value=100, help="the busier direction over the line rate"
    ),
}
ERROR_CONFIG = {
    "device": st.column_config.TextColumn("NIC"),
    "what": st.column_config.TextColumn("Counter"),
    "count": st.column_config.TextColumn("In the range"),
}
GDR_CONFIG = {
    **ui.COLUMN_CONFIG,
    "gpu": st.column_config.TextColumn("GPU"),
    "nearest": st.column_config.TextColumn("Nearest NICs", help="the NICs no other NIC is closer than, and the path"),
    "ready": st.column_config.TextColumn("GPUDirect RDMA"),
    "reason": st.column_config.TextColumn("How, or why not"),
}
POD_CONFIG = {
    "nics": st.column_config.NumberColumn("NICs held", format="localized"),
    "shared": st.column_config.TextColumn("Shared with other pods"),
    "tx": st.column_config.TextColumn("Sent", help="through the NICs it holds alone"),
    "rx": st.column_config.TextColumn("Received", help="through the NICs it holds alone"),
    "communication": ui.COMMUNICATION_COLUMN,
}


ui.page("Network", body)
