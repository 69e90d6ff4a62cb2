"""The Links board: PCIe and NVLink bytes against the links' capacity, link state and errors."""

from __future__ import annotations

from .model import DEV, LEAF, LEAF_COLUMNS, LINKS, NODE_GPU, PCT, Board, Panel, Table, t
from .series import link_rate

# --- links: PCIe and NVLink ---------------------------------------------------------------------------
LINKS_BOARD = Board(
    LINKS,
    "gpulens / Links: PCIe and NVLink",
    "The bytes each GPU moves over PCIe and NVLink, against what the link carries, and links trained "
    "below their maximum or down.",
    (
        (
            "Throughput",
            (
                Panel(
                    "PCIe throughput (5 m)",
                    "timeseries",
                    link_rate("pcie"),
                    unit="Bps",
                    description="Bytes per second each device sent and received over PCIe (TLP headers "
                    "included), with the link's capacity each way (dashed).",
                    width=12,
                ),
                Panel(
                    "NVLink throughput (5 m)",
                    "timeseries",
                    link_rate("nvlink"),
                    unit="Bps",
                    description="Bytes per second each device sent and received over NVLink, with the capacity "
                    "of its active links each way (dashed).",
                    width=12,
                ),
                Panel(
                    "PCIe use",
                    "timeseries",
                    (t(f"gpulens_gpu_pcie_utilization_ratio{{{DEV}}}", LEAF),),
                    unit=PCT,
                    description="The busier direction's bytes per second over the link's capacity.",
                    width=12,
                    max=1,
                ),
                Panel(
                    "NVLink use",
                    "timeseries",
                    (t(f"gpulens_gpu_nvlink_utilization_ratio{{{DEV}}}", LEAF),),
                    unit=PCT,
                    width=12,
                    max=1,
                ),
                Panel(
                    "Where the link bytes come from",
                    "table",
                    (
                        t(
                            f"max by (cluster, node, gpu, mig_profile, link, source) (gpulens_gpu_link_info{{{DEV}}})",
                            instant=True,
                        ),
                    ),
                    description="counter: NVML's cumulative byte counters; otherwise how the exporter reads them "
                    "(gpulens_gpu_link_info).",
                    width=24,
                    height=6,
                    table=Table((*LEAF_COLUMNS, ("link", "Link"), ("source", "Source")), (None,), sort="Node"),
                ),
            ),
        ),
        (
            "Link state",
            (
                Panel(
                    "PCIe links trained below their maximum",
                    "table",
                    (
                        t(
                            f"max by (cluster, node, gpu) (gpulens_gpu_pcie_link_generation{{{DEV}}})"
                            f" < on (cluster, node, gpu) max by (cluster, node, gpu) "
                            f"(gpulens_gpu_pcie_link_max_generation{{{DEV}}})"
                            f" or max by (cluster, node, gpu) (gpulens_gpu_pcie_link_generation{{{DEV}}})"
                            f" and on (cluster, node, gpu) (max by (cluster, node, gpu) "
                            f"(gpulens_gpu_pcie_link_width{{{DEV}}}) < on (cluster, node, gpu) "
                            f"max by (cluster, node, gpu) (gpulens_gpu_pcie_link_max_width{{{DEV}}}))",
                            instant=True,
                        ),
                        t(f"max by (cluster, node, gpu) (gpulens_gpu_pcie_link_width{{{DEV}}})", instant=True),
                        t(f"max by (cluster, node, gpu) (gpulens_gpu_pcie_link_max_generation{{{DEV}}})", instant=True),
                        t(f"max by (cluster, node, gpu) (gpulens_gpu_pcie_link_max_width{{{DEV}}})", instant=True),
                    ),
                    description="GPUs whose PCIe link trained at a lower generation or fewer lanes than the GPU "
                    "and slot allow (an idle GPU may drop its generation to save power; lanes do not).",
                    width=12,
                    table=Table(
                        NODE_GPU,
                        ("Generation", "Lanes", "Max generation", "Max lanes"),
                        sort="Node",
                    ),
                    no_value="Every PCIe link runs at its maximum.",
                ),
                Panel(
                    "NVLinks down now",
                    "table",
                    (
                        t(
                            f"count by (cluster, node, gpu) (gpulens_gpu_nvlink_link_active{{{DEV}}} == 0)",
                            instant=True,
                        ),
                        t(
                            f"sum by (cluster, node, gpu) (gpulens_gpu_nvlink_link_active{{{DEV}}}) "
                            f"and on (cluster, node, gpu) (gpulens_gpu_nvlink_link_active{{{DEV}}} == 0)",
                            instant=True,
                        ),
                    ),
                    description="GPUs with an NVLink down, how many are down and how many still up (GPUNvlinkDown).",
                    width=12,
                    table=Table(NODE_GPU, ("Links down", "Links up"), sort="Links down", desc=True),
                    no_value="Every NVLink is up (or no GPU here has NVLink).",
                ),
                Panel(
                    "NVLinks between GPUs",
                    "table",
                    (
                        t(
                            f"max by (cluster, node, gpu, peer_gpu) (gpulens_gpu_nvlink_peer_links{{{DEV}}})",
                            instant=True,
                        ),
                    ),
                    description="NVLinks joining each GPU to another GPU of its node (the NV# of nvidia-smi topo -m).",
                    width=12,
                    table=Table((*NODE_GPU, ("peer_gpu", "Peer GPU")), ("NVLinks",), sort="Node"),
                    no_value="No GPU here links straight to another by NVLink (NVSwitch systems link through "
                    "the switch).",
                ),
                Panel(
                    "NVLink fabric",
                    "table",
                    (
                        t(
                            f"max by (cluster, node, gpu, state, status, clique_id) (gpulens_gpu_fabric_info{{{DEV}}})",
                            instant=True,
                        ),
                    ),
                    description="Each GPU's NVLink fabric registration (state, status, clique).",
                    width=12,
                    table=Table(
                        (*NODE_GPU, ("state", "State"), ("status", "Status"), ("clique_id", "Clique")),
                        (None,),
                        sort="Node",
                    ),
                    no_value="No GPU here reports NVLink fabric information.",
                ),
                Panel(
                    "Link errors (per hour)",
                    "timeseries",
                    (
                        t(
                            f"sum by (node, gpu) (increase(gpulens_gpu_pcie_replay_errors_total{{{DEV}}}[1h]))",
                            "{{node}} GPU {{gpu}} PCIe replays",
                        ),
                        t(
                            f"sum by (node, gpu, kind) (increase(gpulens_gpu_nvlink_errors_total{{{DEV}}}[1h]))",
                            "{{node}} GPU {{gpu}} NVLink {{kind}}",
                        ),
                    ),
                    description="PCIe replays and NVLink data-link errors in the hour ending at each point.",
                    width=24,
                ),
            ),
        ),
    ),
)
