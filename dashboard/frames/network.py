"""The Network page's tables (docs/network.md): RDMA NICs' throughput (bytes/s) and errors, the
paths between GPUs and NICs, GPUDirect RDMA readiness, and each pod's NICs and communication."""

from __future__ import annotations

import math

import pandas as pd

from dashboard.frames.columns import with_cols
from dashboard.frames.links import latest
from dashboard.frames.sharing import POD_KEYS, pod_classes

NIC_KEYS = ("node", "instance", "device")
"""Labels that identify one NIC: device names (``rdmap79s0``, ``mlx5_0``) repeat on every node."""


NIC_TX = "gpulens_nic_port_data_transmitted_bytes_total"


NIC_RX = "gpulens_nic_port_data_received_bytes_total"


NIC_ERROR_COUNTERS: dict[str, str] = {
    # EFA
    "rx_drops": "received packets dropped",
    "retrans_pkts": "packets retransmitted",
    "retrans_timeout_events": "retransmit timeouts",
    "unresponsive_remote_events": "unresponsive remote peers",
    "impaired_remote_conn_events": "impaired remote connections",
    "rdma_read_wr_err": "failed RDMA reads",
    "rdma_write_wr_err": "failed RDMA writes",
    # InfiniBand / RoCE
    "symbol_error": "symbol errors",
    "link_downed": "link went down",
    "link_error_recovery": "link error recoveries",
    "port_rcv_errors": "received packets with errors",
    "port_xmit_wait": "ticks waiting to send (congestion)",
    "local_ack_timeout_err": "ack timeouts",
    "out_of_sequence": "packets out of sequence",
}
"""The port counters (``gpulens_nic_port_stat_total{counter}``) that count errors, retransmits
or congestion, in words; the other counters count traffic."""


PORT_STATES: dict[int, str] = {1: "down", 2: "initialising", 3: "armed", 4: "active", 5: "active (deferred)"}
"""``gpulens_nic_port_state_id`` in words (the kernel's InfiniBand port states)."""


NIC_KINDS: dict[str, str] = {"efa": "EFA", "infiniband": "InfiniBand", "roce": "RoCE", "rdma": "RDMA"}


GDR_REASONS: dict[str, str] = {
    "peermem": "ready: peer-memory module loaded",
    "dmabuf": "ready: DMA-BUF (open GPU kernel module)",
    "efa_p2p": "ready: the EFA driver's NVIDIA peer-to-peer",
    "no_peer_memory": "no peer-memory module or DMA-BUF",
    "path_phb": "NIC not close enough to the GPU (through the host bridge)",
    "path_node": "NIC not close enough to the GPU (between host bridges of a NUMA node)",
    "path_sys": "NIC not close enough to the GPU (across NUMA nodes)",
}
"""``gpulens_gpu_nic_gdr_ready{reason}`` in words: how a ready pair works, or why a pair cannot."""


PATH_WORDS: dict[str, str] = {
    "PIX": "PIX: one PCIe switch",
    "PXB": "PXB: several PCIe switches",
    "PHB": "PHB: through the host bridge",
    "NODE": "NODE: between host bridges",
    "SYS": "SYS: across NUMA nodes",
}
"""The PCIe path classes between a GPU and a NIC (as ``nvidia-smi topo -m`` names them), in words."""


def _nic_sum(df: pd.DataFrame, name: str) -> pd.DataFrame:
    """Per NIC (NIC_KEYS), the sum of ``df``'s values over its ports, as column ``name``."""
    if df.empty:
        return pd.DataFrame(columns=[*NIC_KEYS, name])
    return (
        with_cols(df, NIC_KEYS).groupby(list(NIC_KEYS), as_index=False)["value"].sum().rename(columns={"value": name})
    )


def nic_table(
    info: pd.DataFrame, state: pd.DataFrame, line_rate: pd.DataFrame, tx: pd.DataFrame, rx: pd.DataFrame
) -> pd.DataFrame:
    """One row per NIC: node, instance, device, kind (in words), numa_node, pci_bus_id, state (its
    worst port's, in words), ports_down, tx and rx (bytes/s now, summed over its ports; ``tx``/``rx``
    are rate series, of which each series' newest point is read), line_rate (bytes/s each way,
    summed over its ports), utilization (0..1: the busier direction over the line rate; NaN when
    the rate is unknown). Sorted by where and PCI address."""
    cols = [*NIC_KEYS, "kind", "numa_node", "pci_bus_id", "state", "ports_down", "tx", "rx", "line_rate",
            "utilization"]  # fmt: skip
    if info.empty:
        return pd.DataFrame(columns=cols)
    out = with_cols(info, [*NIC_KEYS, "kind", "numa_node", "pci_bus_id"])
    out = out[[*NIC_KEYS, "kind", "numa_node", "pci_bus_id"]].drop_duplicates(list(NIC_KEYS))
    out["kind"] = [NIC_KINDS.get(str(k), str(k) or "RDMA") for k in out["kind"]]
    out["numa_node"] = [str(n) if str(n) not in ("", "-1") else "none" for n in out["numa_node"]]
    if not state.empty:
        s = with_cols(state, NIC_KEYS)
        worst = s.groupby(list(NIC_KEYS), as_index=False)["value"].min()
        down = s[s["value"] == 1].groupby(list(NIC_KEYS), as_index=False).size().rename(columns={"size": "ports_down"})
        out = out.merge(worst.rename(columns={"value": "_state"}), on=list(NIC_KEYS), how="left")
        out = out.merge(down, on=list(NIC_KEYS), how="left")
    else:
        out["_state"], out["ports_down"] = math.nan, 0
    out["state"] = [PORT_STATES.get(int(v), "unknown") if v == v else "unknown" for v in out["_state"]]
    out["ports_down"] = pd.to_numeric(out["ports_down"], errors="coerce").fillna(0).astype(int)
    for name, df in (("tx", latest(tx)), ("rx", latest(rx)), ("line_rate", line_rate)):
        out = out.merge(_nic_sum(df, name), on=list(NIC_KEYS), how="left")
    busier = out[["tx", "rx"]].max(axis=1)
    rate = out["line_rate"].where(out["line_rate"] > 0)
    out["utilization"] = (busier / rate).clip(upper=1.0)
    return out.sort_values(["node", "instance", "pci_bus_id", "device"])[cols].reset_index(drop=True)


def nic_errors(increase: pd.DataFrame) -> pd.DataFrame:
    """Error, retransmit and congestion counters (NIC_ERROR_COUNTERS) that grew, per NIC and
    counter: node, instance, device, what (in words), count (the growth over the range), largest first."""
    cols = [*NIC_KEYS, "what", "count"]
    if increase.empty or "counter" not in increase.columns:
        return pd.DataFrame(columns=cols)
    df = with_cols(increase, [*NIC_KEYS, "counter"])
    df = df[df["counter"].isin(NIC_ERROR_COUNTERS.keys())]
    df = df.groupby([*NIC_KEYS, "counter"], as_index=False)["value"].sum()
    df = df[df["value"] > 0]
    df = df.assign(what=[NIC_ERROR_COUNTERS[c] for c in df["counter"]], count=df["value"])
    return df.sort_values(["count", "device"], ascending=[False, True])[cols].reset_index(drop=True)


def gpu_nics(paths: pd.DataFrame, ready: pd.DataFrame, gpus: pd.DataFrame) -> pd.DataFrame:
    """Every GPU–NIC pair with its PCIe path and GPUDirect RDMA state: node, instance, gpu, uuid,
    device, path (class), nearest (bool), gdr_ready (bool), reason (in words). ``gpus``:
    gpulens_gpu_info rows (for node and instance when the pair series lack them)."""
    cols = ["node", "instance", "gpu", "uuid", "device", "path", "nearest", "gdr_ready", "reason"]
    if paths.empty:
        return pd.DataFrame(columns=cols)
    p = with_cols(paths, ["node", "instance", "gpu", "uuid", "device", "path", "nearest"])
    p = p.assign(nearest=p["nearest"] == "true")[["node", "instance", "gpu", "uuid", "device", "path", "nearest"]]
    r = with_cols(ready, ["uuid", "device", "reason"])
    r = r[["uuid", "device", "reason", "value"]] if not r.empty else pd.DataFrame(columns=["uuid", "device", "reason",
                                                                                           "value"])  # fmt: skip
    p = p.drop_duplicates(["instance", "uuid", "device"]).merge(
        r.drop_duplicates(["uuid", "device"]), on=["uuid", "device"], how="left"
    )
    p["gdr_ready"] = p["value"].fillna(0) >= 1
    p["reason"] = [GDR_REASONS.get(str(x), str(x)) if x == x and x else "unknown" for x in p["reason"]]
    p["_i"] = pd.to_numeric(p["gpu"], errors="coerce")
    return p.sort_values(["node", "instance", "_i", "path", "device"])[cols].reset_index(drop=True)


def gdr_by_gpu(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per GPU, GPUDirect RDMA with its nearest NICs: node, instance, gpu, uuid, nearest (how many
    NICs, and their path class), ready (True when one of them is ready), reason (how, or why not:
    the first reason of its nearest NICs, in words). From :func:`gpu_nics`."""
    cols = ["node", "instance", "gpu", "uuid", "nearest", "ready", "reason"]
    if pairs.empty:
        return pd.DataFrame(columns=cols)
    near = pairs[pairs["nearest"]]
    rows = []
    for (node, inst, gpu, uuid), g in near.groupby(["node", "instance", "gpu", "uuid"], sort=False):
        ok = g[g["gdr_ready"]]
        paths = ", ".join(sorted(set(g["path"])))
        rows.append(
            {
                "node": node,
                "instance": inst,
                "gpu": gpu,
                "uuid": uuid,
                "nearest": f"{len(g)} NIC{'s' if len(g) != 1 else ''} ({paths})",
                "ready": not ok.empty,
                "reason": str((ok if not ok.empty else g)["reason"].iloc[0]),
            }
        )
    return pd.DataFrame(rows, columns=cols)


def pod_nics(
    allocation: pd.DataFrame, holders: pd.DataFrame, nics: pd.DataFrame, communication: pd.DataFrame
) -> pd.DataFrame:
    """Per pod holding NICs: node, instance, namespace, pod, workload, nics (how many it holds),
    shared (how many of those other pods hold too; an allocation naming no NIC counts as shared),
    tx and rx (bytes/s now through the NICs it holds alone; NaN when it holds none alone), and
    communication (the pod's communication share, NaN without a class).

    ``allocation``: gpulens_pod_nic_allocation; ``holders``: gpulens_nic_pods; ``nics``:
    :func:`nic_table`; ``communication``: the per-pod frame of definitions.communication_share_frame."""
    cols = ["node", "instance", "namespace", "pod", "workload", "nics", "shared", "tx", "rx", "communication"]
    if allocation.empty:
        return pd.DataFrame(columns=cols)
    a = with_cols(allocation, [*NIC_KEYS, "namespace", "pod", "workload", "container", "resource"])
    h = with_cols(holders, ["node", "instance", "device"])
    h = h[["node", "instance", "device", "value"]].rename(columns={"value": "holders"})
    named = a[a["device"] != ""].drop_duplicates(["node", "instance", "namespace", "pod", "device"])
    named = named.merge(h, on=list(NIC_KEYS), how="left")
    named["alone"] = named["holders"].fillna(1) <= 1
    named = named.merge(nics[[*NIC_KEYS, "tx", "rx"]], on=list(NIC_KEYS), how="left")
    pool = a[a["device"] == ""].drop_duplicates(["node", "instance", "namespace", "pod", "container", "resource"])
    keys = ["node", "instance", "namespace", "pod", "workload"]
    out = pd.concat(
        [named.assign(shared=~named["alone"]), pool.assign(alone=False, shared=True, tx=math.nan, rx=math.nan)],
        ignore_index=True,
    )
    alone = out[out["alone"]]
    traffic = alone.groupby(keys, as_index=False)[["tx", "rx"]].sum(min_count=1)
    counts = out.groupby(keys, as_index=False).agg(nics=("device", "size"), shared=("shared", "sum"))
    res = counts.merge(traffic, on=keys, how="left")
    comm = communication.rename(columns={"share": "communication"})[["namespace", "pod", "communication"]]
    res = res.merge(comm, on=["namespace", "pod"], how="left")
    res["shared"] = res["shared"].astype(int)
    for c in ("tx", "rx", "communication"):
        res[c] = pd.to_numeric(res[c], errors="coerce")
    return res.sort_values(["namespace", "pod"])[cols].reset_index(drop=True)


def pod_gpu_classes(pod_boundness: pd.DataFrame, leaves: pd.DataFrame, gpus: pd.DataFrame) -> pd.DataFrame:
    """Per pod leaf (namespace, pod, node, instance, gpu, uuid, mig_uuid, class now, communication
    share): where a pod's GPUs spend their time, so a straggler (one GPU computing while its peers
    wait in ``communication``) shows. ``leaves``: the per-leaf frame of
    definitions.communication_share_frame; ``gpus``: gpulens_gpu_info (node, instance, GPU index)."""
    cols = ["namespace", "pod", "node", "instance", "gpu", "uuid", "mig_uuid", "class", "communication"]
    if leaves.empty:
        return pd.DataFrame(columns=cols)
    classes = pod_classes(pod_boundness)
    out = leaves.rename(columns={"share": "communication"}).merge(classes, on=list(POD_KEYS), how="left")
    g = with_cols(gpus, ["uuid", "node", "instance", "gpu"])[["uuid", "node", "instance", "gpu"]]
    out = with_cols(out.merge(g.drop_duplicates("uuid"), on="uuid", how="left"), cols)
    out["class"] = out["class"].fillna("unknown")
    out["communication"] = pd.to_numeric(out["communication"], errors="coerce")
    out["_i"] = pd.to_numeric(out["gpu"], errors="coerce")
    return out.sort_values(["namespace", "pod", "node", "_i"])[cols].reset_index(drop=True)
