"""The Network and GPUDirect RDMA board: RDMA NIC ports, GPUDirect RDMA per GPU and NIC, traffic."""

from __future__ import annotations

from dashboard.frames.network import GDR_REASONS, PATH_WORDS

from .model import (
    CL,
    DEV,
    NETWORK,
    NODE_GPU,
    NS,
    PCT,
    POD_COLUMNS,
    READY_WORDS,
    STATE_WORDS,
    Board,
    Panel,
    Table,
    count0,
    stat,
    t,
)
from .series import GDR_OFF

# --- network and GPUDirect RDMA ------------------------------------------------------------------------
_NIC = 'cluster=~"$cluster", node=~"$node"'
NETWORK_BOARD = Board(
    NETWORK,
    "gpulens / Network and GPUDirect RDMA",
    "The RDMA NICs of each node (EFA, InfiniBand, RoCE): their state, traffic and errors, and whether "
    "each GPU can reach a NIC by GPUDirect RDMA.",
    (
        (
            "GPUDirect RDMA",
            (
                stat(
                    "GPUs without GPUDirect RDMA",
                    count0(GDR_OFF),
                    "GPUs that no NIC of their node can reach by GPUDirect RDMA.",
                    width=6,
                ),
                stat(
                    "Pods staging RDMA through host memory",
                    count0(f'ALERTS{{alertname="GPUDirectRDMANotReady", alertstate="firing", {CL}}}'),
                    "Pods moving RDMA traffic while their GPU has no NIC ready for GPUDirect RDMA (the "
                    "GPUDirectRDMANotReady alert, firing).",
                    width=6,
                ),
                stat("RDMA NICs", count0(f"gpulens_nic_info{{{_NIC}}}"), "RDMA devices the exporters see.", width=6),
                stat(
                    "Ports not active",
                    count0(f"gpulens_nic_port_state_id{{{_NIC}}} != 4"),
                    "RDMA ports whose logical state is not active.",
                    width=6,
                ),
                Panel(
                    "GPUDirect RDMA per GPU and nearest NIC",
                    "table",
                    (
                        t(
                            f"max by (cluster, node, gpu, device, reason) (gpulens_gpu_nic_gdr_ready{{{DEV}}}"
                            f' and on (uuid, device) gpulens_gpu_nic_path_info{{nearest="true"}})',
                            instant=True,
                        ),
                    ),
                    description="For each GPU and its nearest NICs: whether GPUDirect RDMA can work between them "
                    "and how, or why not (gpulens_gpu_nic_gdr_ready).",
                    width=12,
                    height=9,
                    table=Table(
                        (*NODE_GPU, ("device", "NIC"), ("reason", "How / why not")),
                        ("GPUDirect RDMA",),
                        sort="GPUDirect RDMA",
                        mappings={"GPUDirect RDMA": READY_WORDS, "How / why not": GDR_REASONS},
                    ),
                ),
                Panel(
                    "PCIe path from each GPU to its nearest NICs",
                    "table",
                    (
                        t(
                            "max by (cluster, node, gpu, device, path) "
                            f'(gpulens_gpu_nic_path_info{{{DEV}, nearest="true"}})',
                            instant=True,
                        ),
                    ),
                    description="The PCIe path between each GPU and its closest NICs, as nvidia-smi topo -m "
                    "names it (gpulens_gpu_nic_path_info).",
                    width=12,
                    height=9,
                    table=Table(
                        (*NODE_GPU, ("device", "NIC"), ("path", "Path")),
                        (None,),
                        sort="Node",
                        mappings={"Path": PATH_WORDS},
                    ),
                ),
            ),
        ),
        (
            "NICs",
            (
                Panel(
                    "NIC ports",
                    "table",
                    (
                        t(f"max by (cluster, node, device, port) (gpulens_nic_port_state_id{{{_NIC}}})", instant=True),
                        t(
                            "max by (cluster, node, device, port) "
                            f"(gpulens_nic_port_rate_bytes_per_second{{{_NIC}}}) * 8",
                            instant=True,
                        ),
                        t(
                            "max by (cluster, node, device, port) "
                            f"(gpulens:nic_port_utilization:ratio_avg5m{{{_NIC}}})",
                            instant=True,
                        ),
                    ),
                    description="Each RDMA port: its state, line rate (bits per second, each way) and "
                    "utilisation over 5 m (its busier direction over the line rate: "
                    "gpulens:nic_port_utilization:ratio_avg5m).",
                    width=12,
                    height=9,
                    table=Table(
                        (("node", "Node"), ("device", "NIC"), ("port", "Port")),
                        ("State", "Line rate", "Use (5 m)"),
                        sort="Use (5 m)",
                        desc=True,
                        mappings={"State": STATE_WORDS},
                        units={"Line rate": "bps", "Use (5 m)": PCT, "State": "none"},
                    ),
                ),
                Panel(
                    "Pods and their NICs",
                    "table",
                    (
                        t(
                            f"sum by (cluster, namespace, pod) (gpulens:pod_nic_bytes:rate5m{{{NS}}})",
                            instant=True,
                        ),
                        t(
                            f"max by (cluster, namespace, pod) (gpulens:pod_nic_shared:count{{{NS}}})",
                            instant=True,
                        ),
                    ),
                    description="Bytes per second (sent plus received, 5 m) each pod moves through the NICs it "
                    "holds alone (gpulens:pod_nic_bytes:rate5m), and how many of its NICs other pods hold too "
                    "(gpulens:pod_nic_shared:count: their bytes cannot be split).",
                    width=12,
                    height=9,
                    table=Table(
                        POD_COLUMNS,
                        ("Through its own NICs", "NICs shared"),
                        sort="Through its own NICs",
                        desc=True,
                        units={"Through its own NICs": "Bps", "NICs shared": "short"},
                    ),
                    no_value="No pod holds an RDMA NIC.",
                ),
                Panel(
                    "Throughput per NIC port (5 m)",
                    "timeseries",
                    (
                        t(
                            f"gpulens:nic_port_bytes:rate5m{{{_NIC}}}",
                            "{{node}} {{device}}/{{port}} {{direction}}",
                        ),
                    ),
                    unit="Bps",
                    description="Bytes per second through each port, sent (tx) and received (rx) "
                    "(gpulens:nic_port_bytes:rate5m).",
                    width=12,
                ),
                Panel(
                    "Throughput per pod (5 m)",
                    "timeseries",
                    (t(f"gpulens:pod_nic_bytes:rate5m{{{NS}}}", "{{namespace}}/{{pod}} {{direction}}"),),
                    unit="Bps",
                    width=12,
                ),
                Panel(
                    "NIC errors and retransmits (per hour)",
                    "table",
                    (
                        t(
                            f"sum by (cluster, node, device, counter) (increase(gpulens_nic_port_stat_total"
                            f'{{{_NIC}, counter=~".*(err|drop|discard|retrans|timeout).*"}}[1h])) > 0',
                            instant=True,
                        ),
                    ),
                    description="Port error, drop and retransmit counters that grew in the last hour, by their "
                    "sysfs name (gpulens_nic_port_stat_total).",
                    width=24,
                    height=6,
                    table=Table(
                        (("node", "Node"), ("device", "NIC"), ("counter", "Counter")),
                        ("In the last hour",),
                        sort="In the last hour",
                        desc=True,
                    ),
                    no_value="No NIC error or retransmit counter grew in the last hour.",
                ),
            ),
        ),
    ),
)
