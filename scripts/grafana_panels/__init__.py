"""The panels of gpulens's Grafana dashboards, declared as data, one module per board (Role: what
each dashboard shows, in the Streamlit pages' words; ``scripts/grafana_dashboard.py`` builds
Grafana's JSON model from them with Grafana's typed SDK). Nine boards, linked to one another: fleet
and waste, workloads, jobs and stragglers, network and GPUDirect RDMA, links (PCIe and NVLink),
sharing (MIG, time-slicing, MPS), health, serving (tokens, latency and cost per model), and one
GPU.

scripts/ is not a package: scripts/grafana_dashboard.py loads this one from its folder.
"""

from __future__ import annotations

from .fleet import FLEET_BOARD
from .gpu import GPU_BOARD
from .health import HEALTH_BOARD
from .jobs import JOBS_BOARD
from .links import LINKS_BOARD
from .model import (
    FLEET,
    GPU,
    HEALTH,
    IDLE_RULE,
    JOBS,
    LINKS,
    NETWORK,
    REASON_WORDS,
    SERVING,
    SHARING,
    WORKLOADS,
    Board,
    Panel,
    Table,
    Target,
    fleet_count_promql,
)
from .network import NETWORK_BOARD
from .serving import SERVING_BOARD
from .sharing import SHARING_BOARD
from .workloads import WORKLOADS_BOARD

BOARDS: tuple[Board, ...] = (
    FLEET_BOARD,
    WORKLOADS_BOARD,
    JOBS_BOARD,
    NETWORK_BOARD,
    LINKS_BOARD,
    SHARING_BOARD,
    HEALTH_BOARD,
    SERVING_BOARD,
    GPU_BOARD,
)
"""Every dashboard, in the order of the links between them."""

__all__ = [
    "BOARDS",
    "FLEET",
    "GPU",
    "HEALTH",
    "IDLE_RULE",
    "JOBS",
    "LINKS",
    "NETWORK",
    "REASON_WORDS",
    "SERVING",
    "SHARING",
    "WORKLOADS",
    "Board",
    "Panel",
    "Table",
    "Target",
    "fleet_count_promql",
]
