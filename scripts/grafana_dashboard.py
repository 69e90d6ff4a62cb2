"""Build deploy/grafana/gpulens.json, the Grafana dashboard over gpulens's own series.

Panels are declared here as data (title, PromQL, unit) and expanded into Grafana's JSON model, so
every query is in one readable place. ``scripts/render_manifests.py`` writes the file (and the
chart's copy) and its ``--check`` fails when they drift. Rows follow the Streamlit dashboard:
fleet, efficiency and boundness, workloads and waste, sharing (MIG and time-slicing), health.
Idle, busy and wasted GPU-hours come from the recording rules in deploy/rules/gpulens.rules.yml,
so the Grafana panels and the alerts agree.

No datasource UID is written: every panel uses the ``${datasource}`` template variable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from dashboard.definitions import counter_events_promql

UID = "gpulens-overview"
TITLE = "gpulens: GPUs, MIG slices and pods"

# Matchers every selector on a device series carries (the template variables).
DEV = 'cluster=~"$cluster", node=~"$node", uuid=~"$gpu"'
POD = 'cluster=~"$cluster", node=~"$node", uuid=~"$gpu", namespace=~"$namespace"'
NODE = 'cluster=~"$cluster", node=~"$node"'
NS = 'cluster=~"$cluster", namespace=~"$namespace"'
LEAF = "{{node}} GPU {{gpu}} {{mig_profile}}"


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel."""

    expr: str
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True)
class Panel:
    """One panel: kind is a Grafana panel type (timeseries, stat, table, bargauge)."""

    title: str
    kind: str
    targets: tuple[Target, ...]
    unit: str = "short"
    description: str = ""
    width: int = 8
    height: int = 8
    max: float | None = None
    options: dict[str, Any] = field(default_factory=dict)


def _t(expr: str, legend: str = "", instant: bool = False) -> Target:
    return Target(expr, legend, instant)


ROWS: list[tuple[str, list[Panel]]] = [
    (
        "Fleet",
        [
            Panel(
                "GPUs",
                "stat",
                (_t(f"count(gpulens_gpu_info{{{DEV}}})", instant=True),),
                description="Physical GPUs the exporters see.",
                width=4,
                height=4,
            ),
            Panel(
                "Allocated leaves",
                "stat",
                (_t(f"count(count by (uuid, mig_uuid) (gpulens_pod_gpu_allocation{{{POD}}}))", instant=True),),
                description="Whole GPUs and MIG instances held by at least one pod.",
                width=4,
                height=4,
            ),
            Panel(
                "Idle leaves",
                "stat",
                (_t(f"sum(gpulens:gpu_idle:bool{{{DEV}}})", instant=True),),
                description="Leaves whose SMs were active under 1 % over 5 m with no kernels running "
                "(gpulens:gpu_idle:bool, the definition the alerts use).",
                width=4,
                height=4,
            ),
            Panel(
                "Exporters up",
                "stat",
                (_t(f"sum(gpulens_up{{{NODE}}})", instant=True),),
                description="Exporters whose GPU backend answers.",
                width=4,
                height=4,
            ),
            Panel(
                "Power",
                "stat",
                (_t(f"sum(gpulens_gpu_power_watts{{{DEV}}})", instant=True),),
                unit="watt",
                width=4,
                height=4,
            ),
            Panel(
                "Memory used",
                "stat",
                (_t(f"sum(gpulens_gpu_memory_used_bytes{{{DEV}}})", instant=True),),
                unit="bytes",
                width=4,
                height=4,
            ),
            Panel(
                "SM active per leaf (5 m mean)",
                "timeseries",
                (_t(f"gpulens:gpu_sm_active:ratio_avg5m{{{DEV}}}", LEAF),),
                unit="percentunit",
                description="Share of time the SMs had work (GPM), per whole GPU or MIG instance.",
                width=12,
                max=1,
            ),
            Panel(
                "GPU-Util per GPU (NVML, 5 m mean)",
                "timeseries",
                (_t(f"gpulens:gpu_utilization:ratio_avg5m{{{DEV}}}", "{{node}} GPU {{gpu}}"),),
                unit="percentunit",
                description="Time any kernel ran: what nvidia-smi shows. Compare with SM active: a GPU "
                "can read busy here while its SMs idle (launch-bound).",
                width=12,
                max=1,
            ),
        ],
    ),
    (
        "Efficiency and boundness",
        [
            Panel(
                "Fleet boundness mix (10 m)",
                "bargauge",
                (_t('class:gpulens_gpu_boundness:ratio{cluster=~"$cluster"}', "{{cluster}} {{class}}", instant=True),),
                unit="percentunit",
                description="Share of classified leaves in each class, time-weighted over 10 m.",
                width=8,
                max=1,
            ),
            Panel(
                "Boundness per leaf (10 m)",
                "table",
                (
                    _t(
                        f"max by (node, gpu, mig_profile, class) (gpulens:gpu_boundness:ratio_avg10m{{{DEV}}})",
                        instant=True,
                    ),
                ),
                unit="percentunit",
                description="Share of the last 10 m each leaf spent in each class.",
                width=16,
            ),
            Panel(
                "Busy ratio per leaf",
                "timeseries",
                (_t(f"gpulens_gpu_busy_ratio{{{DEV}}}", LEAF),),
                unit="percentunit",
                description="Share of time the leaf ran work (GPM graphics-engine activity). The class "
                "above says what limits it during that time.",
                width=8,
                max=1,
            ),
            Panel(
                "Roofline x: DRAM active",
                "timeseries",
                (_t(f"gpulens_gpu_dram_active_ratio{{{DEV}}}", LEAF),),
                unit="percentunit",
                width=8,
                max=1,
            ),
            Panel(
                "Roofline y: busiest pipe",
                "timeseries",
                (_t(f"gpulens_gpu_pipe_active_max_ratio{{{DEV}}}", LEAF),),
                unit="percentunit",
                description="The most active tensor/FP pipe of each leaf.",
                width=8,
                max=1,
            ),
            Panel(
                "Tensor pipe active",
                "timeseries",
                (_t(f"gpulens_gpu_tensor_active_ratio{{{DEV}}}", LEAF),),
                unit="percentunit",
                width=8,
                max=1,
            ),
        ],
    ),
    (
        "Workloads and waste",
        [
            Panel(
                "Leaves per namespace",
                "timeseries",
                (
                    _t(f"namespace:gpulens_gpus_allocated:count{{{NS}}}", "{{cluster}} {{namespace}} allocated"),
                    _t(f"namespace:gpulens_gpus_idle:count{{{NS}}}", "{{cluster}} {{namespace}} idle"),
                ),
                description="Allocated leaves and those of them idle (recording rules).",
                width=12,
            ),
            Panel(
                "Wasted GPU-hours per namespace (hour ending at each point)",
                "timeseries",
                (_t(f"namespace:gpulens_gpu_wasted_hours:sum1h{{{NS}}}", "{{cluster}} {{namespace}}"),),
                description="Allocated leaf-hours spent idle in the preceding hour, by the recording rule "
                "namespace:gpulens_gpu_wasted_hours:sum1h (idle as the GPUAllocatedButIdle alert defines it).",
                width=12,
            ),
            Panel(
                "Pods holding GPUs: SM active (5 m mean)",
                "table",
                (_t(f"gpulens:pod_gpu_sm_active:ratio_avg5m{{{POD}}}", instant=True),),
                unit="percentunit",
                width=12,
            ),
            Panel(
                "Allocated but idle pods",
                "table",
                (_t(f"gpulens:pod_gpu_idle:bool{{{POD}}} == 1", instant=True),),
                description="Containers holding a leaf that is idle now (GPUAllocatedButIdle fires after 30 m).",
                width=12,
            ),
            Panel(
                "GPU memory per pod",
                "timeseries",
                (
                    _t(
                        f"sum by (cluster, namespace, pod) (gpulens_pod_gpu_memory_used_bytes{{{POD}}})",
                        "{{cluster}} {{namespace}}/{{pod}}",
                    ),
                ),
                unit="bytes",
                width=12,
            ),
            Panel(
                "Boundness per pod",
                "table",
                (_t(f"gpulens:pod_gpu_boundness:class{{{POD}}}", instant=True),),
                width=12,
            ),
        ],
    ),
    (
        "Sharing: MIG and time-slicing",
        [
            Panel(
                "MIG instances per GPU and profile",
                "table",
                (_t(f"count by (node, gpu, mig_profile) (gpulens_mig_instance_info{{{DEV}}})", instant=True),),
                width=8,
            ),
            Panel(
                "MIG instances allocated per profile",
                "bargauge",
                (
                    _t(
                        f"count by (mig_profile) (gpulens_mig_instance_info{{{DEV}}} * on (uuid, mig_uuid) "
                        "group_left () max by (uuid, mig_uuid) "
                        f"(gpulens_pod_gpu_allocation{{{POD}}}))",
                        "{{mig_profile}}",
                        instant=True,
                    ),
                ),
                width=8,
            ),
            Panel(
                "Time-slice occupancy (pods / replicas)",
                "bargauge",
                (
                    _t(
                        f"gpulens_gpu_sharing_pods{{{DEV}}} / gpulens_gpu_sharing_replicas{{{DEV}}}",
                        "{{node}} {{uuid}}",
                        instant=True,
                    ),
                ),
                unit="percentunit",
                width=8,
                max=1,
            ),
            Panel(
                "SM share per pod on shared GPUs",
                "timeseries",
                (_t(f"gpulens_pod_gpu_sm_share_ratio{{{POD}}}", "{{cluster}} {{namespace}}/{{pod}}"),),
                unit="percentunit",
                width=24,
                max=1,
            ),
        ],
    ),
    (
        "Health",
        [
            Panel(
                "Exporter stages (1 = ok)",
                "table",
                (_t(f"min by (node, stage) (gpulens_stage_success{{{NODE}}})", instant=True),),
                width=8,
            ),
            Panel(
                "Xid errors in the last hour",
                "timeseries",
                (
                    _t(
                        f"sum by (node) ({counter_events_promql(f'gpulens_gpu_xid_errors_total{{{DEV}}}', '1h')}) "
                        f"or sum by (node) (gpulens_up{{{NODE}}} * 0)",
                        "{{node}}",
                    ),
                ),
                description=(
                    "Zero where the exporter saw none. The first event of a code, which creates its "
                    "counter, counts too (what the GPUXidError alert and the Health page count)."
                ),
                width=8,
            ),
            Panel(
                "ECC errors (volatile)",
                "table",
                (_t(f"sum by (node, gpu, severity) (gpulens_gpu_ecc_errors_total{{{DEV}}})", instant=True),),
                width=8,
            ),
            Panel(
                "Probe efficiency (measured / expected)",
                "timeseries",
                (_t(f"gpulens_probe_efficiency_ratio{{{DEV}}}", "{{node}} {{uuid}} {{probe}}"),),
                unit="percentunit",
                description="Cached results of the gated bandwidth probes.",
                width=8,
            ),
            Panel(
                "Clock events active (throttling)",
                "table",
                (_t(f"max by (node, gpu, reason) (gpulens_gpu_clock_event_active{{{DEV}}})", instant=True),),
                width=8,
            ),
            Panel(
                "Temperature",
                "timeseries",
                (_t(f"gpulens_gpu_temperature_celsius{{{DEV}}}", "{{node}} GPU {{gpu}}"),),
                unit="celsius",
                width=8,
            ),
        ],
    ),
]


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


VARIABLES: list[dict[str, Any]] = [
    {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
    },
    _variable("cluster", "Cluster", "label_values(gpulens_up, cluster)"),
    _variable("node", "Node", 'label_values(gpulens_up{cluster=~"$cluster"}, node)'),
    _variable("gpu", "GPU", 'label_values(gpulens_gpu_info{cluster=~"$cluster", node=~"$node"}, uuid)'),
    _variable(
        "namespace",
        "Namespace",
        'label_values(gpulens_pod_gpu_allocation{cluster=~"$cluster", node=~"$node"}, namespace)',
    ),
]


def _panel_json(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.max is not None:
        defaults["min"] = 0
        defaults["max"] = panel.max
    out: dict[str, Any] = {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": dict(panel.options),
        "targets": [
            {
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "refId": chr(ord("A") + i),
                "expr": t.expr,
                "legendFormat": t.legend,
                "instant": t.instant,
                "range": not t.instant,
                **({"format": "table"} if panel.kind == "table" else {}),
            }
            for i, t in enumerate(panel.targets)
        ],
    }
    return out


def dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (schemaVersion 39, Grafana 10 and later)."""
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for row_title, row_panels in ROWS:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": row_title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid, y, x, row_h = pid + 1, y + 1, 0, 0
        for p in row_panels:
            if x + p.width > 24:
                x, y, row_h = 0, y + row_h, 0
            panels.append(_panel_json(p, pid, x, y))
            pid, x, row_h = pid + 1, x + p.width, max(row_h, p.height)
        y += row_h
    return {
        "__inputs": [],
        "uid": UID,
        "title": TITLE,
        "description": "gpulens: who holds each GPU, how much of it is used, and what limits it.",
        "tags": ["gpulens", "gpu", "kubernetes"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "1m",
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": VARIABLES},
        "panels": panels,
    }


def render() -> str:
    """The dashboard file's text."""
    return json.dumps(dashboard(), indent=2, sort_keys=False) + "\n"


def expressions(doc: dict[str, Any]) -> list[str]:
    """Every PromQL expression in a dashboard JSON model (panel targets and variable queries)."""
    out = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            out.append(var["query"]["query"])
    return out


if __name__ == "__main__":
    import sys

    sys.stdout.write(render())
