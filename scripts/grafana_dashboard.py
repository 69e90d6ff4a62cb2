"""Build deploy/grafana/gpulens.json, the Grafana dashboard over gpulens's own series.

Role: the one place the Grafana panels are declared, as data (title, PromQL, unit, how a table
reads), expanded here into Grafana's JSON model. ``scripts/render_manifests.py`` writes the file
(and the chart's copy) and its ``--check`` fails when they drift. Rows follow the Streamlit
dashboard: fleet, efficiency and boundness, workloads and waste, sharing (MIG and time-slicing),
health.

One definition: the Fleet row counts what the Streamlit Fleet page counts (``frames.fleet.fleet_counts``:
Devices, Allocated, In use, Allocated but idle), in the same words, from the recording rule
``gpulens:gpu_idle:bool`` that dashboard/definitions.py writes; idle, busy and wasted GPU-hours
elsewhere are the recording rules' too (``gpulens:pod_gpu_idle:bool``,
``namespace:gpulens_gpus_*:count``, ``namespace:gpulens_gpu_wasted_hours:sum1h``), so the panels,
the Streamlit pages and the alerts agree. The expressions that are not a rule are built here from
dashboard/definitions.py's names (``definitions.LEAF``, ``definitions.RULES``,
``definitions.counter_events_promql``) rather than written again; tests/test_grafana_dashboard.py
evaluates the fleet counts against a real Prometheus and compares them with ``frames.fleet.fleet_counts``.

Tables are instant queries aggregated ``by`` the columns they show, organised (``organize``:
``Time``, ``__name__`` and target labels hidden, headers renamed, columns ordered) and sorted.

No datasource UID is written: every panel uses the ``${datasource}`` template variable.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from dashboard import definitions
from dashboard.definitions import counter_events_promql
from dashboard.frames import health
from dashboard.frames.jobs import SLOWDOWN_WORDS

UID = "gpulens-overview"
TITLE = "gpulens: GPUs, MIG slices and pods"

# Matchers every selector on a device series carries (the template variables).
DEV = 'cluster=~"$cluster", node=~"$node", uuid=~"$gpu"'
POD = 'cluster=~"$cluster", node=~"$node", uuid=~"$gpu", namespace=~"$namespace"'
NODE = 'cluster=~"$cluster", node=~"$node"'
NS = 'cluster=~"$cluster", namespace=~"$namespace"'
LEAF = "{{node}} GPU {{gpu}} {{mig_profile}}"

IDLE_RULE = "gpulens:gpu_idle:bool"
"""The recorded idle verdict of each leaf (1 idle, 0 in use): dashboard/definitions.py's rule."""
if IDLE_RULE not in definitions.RULES:  # pragma: no cover (a rename in definitions.py)
    raise RuntimeError(f"{IDLE_RULE} is not a rule of dashboard/definitions.py")
ON_LEAF = ", ".join(definitions.LEAF)
"""The labels that name a leaf (a whole GPU or a MIG instance): ``uuid, mig_uuid``."""
IDLE_WORDS = (
    f"Idle = SM active < {definitions.IDLE_SM_ACTIVE_BELOW:.0%} over {definitions.MEAN_WINDOW}, no kernels "
    "running and its links idle (launch-bound and transfer-bound devices are in use): the recording rule "
    f"{IDLE_RULE}, the definition the alerts and the Streamlit dashboard use."
)
"""How idle is defined, in the Streamlit Fleet page's words."""

HIDDEN = ("Time", "__name__", "job", "instance", "cluster", "endpoint", "service", "uuid", "mig_uuid")
"""Fields a table never shows: the sample time, the metric name and target labels. ``cluster`` is
kept in the ``by`` clauses (rows of two clusters stay apart) but not shown; the Cluster variable
says which clusters are in view."""

REASON_WORDS: Mapping[str, str] = MappingProxyType(
    {**SLOWDOWN_WORDS, "sync_boost": "sync boost", "display_clock_setting": "display clock setting"}
)
"""Clock event reasons that hold clocks down, in words (the Health page's; those of
``frames.health.NOT_THROTTLING`` are not throttling and are not listed)."""
STAGE_WORDS: Mapping[str, str] = MappingProxyType({"1": "ok", "0": "failed"})


# --- the four device counts of the Fleet page (frames.fleet.fleet_counts) ------------------------------
def _leaves_promql(dev: str) -> str:
    """Every device (leaf) the exporters see, one series per ``uuid, mig_uuid``: the MIG instances,
    and the whole GPUs that have none (a GPU in MIG mode counts as its instances)."""
    mig = f"gpulens_mig_instance_info{{{dev}}}"
    return (
        f'(max by ({ON_LEAF}) (gpulens_mig_instance_info{{{dev}, mig_uuid!=""}})'
        f" or max by ({ON_LEAF}) (gpulens_gpu_info{{{dev}}} unless on (uuid) {mig}))"
    )


def _allocated_leaves_promql(pod: str) -> str:
    return f"max by ({ON_LEAF}) (gpulens_pod_gpu_allocation{{{pod}}})"


def _verdict_promql(dev: str, idle: bool) -> str:
    """The leaves whose recorded verdict is idle (``idle``) or in use, as ``frames.fleet.fleet_counts``
    reads it (the highest verdict of a leaf, idle at 0.5 or more)."""
    return f"(max by ({ON_LEAF}) ({IDLE_RULE}{{{dev}}}) {'>=' if idle else '<'} 0.5)"


def _count(expr: str) -> str:
    """``count()`` of ``expr``, 0 where it has no series (a stat then reads 0, not "No data")."""
    return f"count({expr}) or vector(0)"


def fleet_count_promql(name: str, dev: str = DEV, pod: str = POD) -> str:
    """The PromQL of one of ``frames.fleet.fleet_counts``' counts (``gpus``, ``devices``, ``allocated``,
    ``in_use``, ``allocated_idle``) over the series ``dev`` (device) and ``pod`` (allocation)
    matchers select."""
    leaves = _leaves_promql(dev)
    alloc = _allocated_leaves_promql(pod)
    exprs = {
        "gpus": _count(f"max by (uuid) (gpulens_gpu_info{{{dev}}})"),
        "devices": _count(leaves),
        "allocated": _count(f"{alloc} and on ({ON_LEAF}) {leaves}"),
        "in_use": _count(f"{_verdict_promql(dev, idle=False)} and on ({ON_LEAF}) {leaves}"),
        "allocated_idle": _count(f"{_verdict_promql(dev, idle=True)} and on ({ON_LEAF}) {alloc}"),
    }
    return exprs[name]


FLEET_COUNTS: tuple[tuple[str, str, str], ...] = (
    ("gpus", "Physical GPUs", "GPUs the exporters see (a GPU in MIG mode is one GPU here, its instances devices)."),
    ("devices", "Devices", "Whole GPUs and MIG instances (a GPU in MIG mode counts as its instances)."),
    ("allocated", "Allocated", "Devices held by at least one pod (a time-sliced GPU once)."),
    ("in_use", "In use", "Devices not idle now, allocated or not. " + IDLE_WORDS),
    ("allocated_idle", "Allocated but idle", "Devices held by a pod and idle now. " + IDLE_WORDS),
)
"""(``frames.fleet.fleet_counts`` key, panel title as the Fleet page words it, description)."""


# --- panels --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel."""

    expr: str
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True)
class Table:
    """How a table panel reads: the label columns it shows (label, header) in order, the header of
    each query's value column (``None``: hidden, a value that is always 1), the header to sort by
    and value mappings (header -> raw value -> text). Labels in ``by`` but not in ``columns``
    (``cluster``) are hidden."""

    columns: tuple[tuple[str, str], ...]
    values: tuple[str | None, ...] = ("Value",)
    sort: str = ""
    desc: bool = False
    mappings: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @property
    def by(self) -> str:
        """The ``by`` clause of the panel's aggregation: ``cluster`` and the shown labels."""
        return ", ".join(["cluster", *(label for label, _ in self.columns)])


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
    table: Table | None = None
    no_value: str = ""


def _t(expr: str, legend: str = "", instant: bool = False) -> Target:
    return Target(expr, legend, instant)


def _stat(title: str, expr: str, description: str = "", unit: str = "short", width: int = 4) -> Panel:
    return Panel(title, "stat", (_t(expr, instant=True),), unit=unit, description=description, width=width, height=4)


NODE_GPU = (("node", "Node"), ("gpu", "GPU"))
LEAF_COLUMNS = (*NODE_GPU, ("mig_profile", "MIG profile"))
POD_COLUMNS = (("namespace", "Namespace"), ("pod", "Pod"), ("container", "Container"))

BOUNDNESS_LEAF = Table((*LEAF_COLUMNS, ("class", "Class")), ("Share of 10 m",), sort="Node")
PODS_ACTIVE = Table(
    (*POD_COLUMNS, ("workload", "Workload"), *LEAF_COLUMNS),
    (f"SM active ({definitions.MEAN_WINDOW} mean)",),
    sort="Namespace",
)
PODS_IDLE = Table(
    (*POD_COLUMNS, ("workload", "Workload"), *LEAF_COLUMNS),
    (f"SM active ({definitions.MEAN_WINDOW} mean)",),
    sort="Namespace",
)
PODS_CLASS = Table((*POD_COLUMNS, *LEAF_COLUMNS, ("class", "Class")), (None,), sort="Namespace")
MIG_PER_GPU = Table(LEAF_COLUMNS, ("MIG instances",), sort="Node")
STAGES = Table((("node", "Node"), ("stage", "Stage")), ("State",), sort="State", mappings={"State": STAGE_WORDS})
ECC = Table(NODE_GPU, ("Corrected", "Uncorrected"), sort="Uncorrected", desc=True)
THROTTLING = Table(
    (*NODE_GPU, ("reason", "Reason")),
    ("Share of the hour",),
    sort="Share of the hour",
    desc=True,
    mappings={"Reason": REASON_WORDS},
)
NOT_THROTTLING = "|".join(sorted(health.NOT_THROTTLING))
NVLINKS_DOWN = Table(NODE_GPU, ("Links down", "Links up"), sort="Links down", desc=True)


ROWS: list[tuple[str, list[Panel]]] = [
    (
        "Fleet",
        [
            *(_stat(title, fleet_count_promql(key), description) for key, title, description in FLEET_COUNTS),
            Panel(
                "Exporters up",
                "stat",
                (
                    _t(_count(f"gpulens_up{{{NODE}}} == 1"), "up", instant=True),
                    _t(_count(f"gpulens:exporter_target:info{{{NODE}}}"), "of targets", instant=True),
                ),
                description="Exporters scraped whose GPU backend answers (gpulens_up == 1), of the exporter "
                "targets Prometheus knows (gpulens:exporter_target:info, which keeps a dead exporter while "
                "its scrapes fail).",
                width=4,
                height=4,
                options={"textMode": "value_and_name", "colorMode": "none", "orientation": "horizontal"},
            ),
            _stat("Power", f"sum(gpulens_gpu_power_watts{{{DEV}}})", unit="watt", width=12),
            _stat("Memory used", f"sum(gpulens_gpu_memory_used_bytes{{{DEV}}})", unit="bytes", width=12),
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
                        f"max by ({BOUNDNESS_LEAF.by}) (gpulens:gpu_boundness:ratio_avg10m{{{DEV}}}) > 0",
                        instant=True,
                    ),
                ),
                unit="percentunit",
                description="Each leaf's classes over the last 10 m and the share of it spent in each "
                "(classes it never had left out).",
                width=16,
                table=BOUNDNESS_LEAF,
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
                "Allocated and allocated but idle devices per namespace",
                "timeseries",
                (
                    _t(f"namespace:gpulens_gpus_allocated:count{{{NS}}}", "{{cluster}} {{namespace}} allocated"),
                    _t(
                        f"namespace:gpulens_gpus_idle:count{{{NS}}}",
                        "{{cluster}} {{namespace}} allocated but idle",
                    ),
                ),
                description="Devices (whole GPUs, MIG instances) allocated to the namespace's pods, and "
                "those of them idle (recording rules namespace:gpulens_gpus_allocated:count and "
                "namespace:gpulens_gpus_idle:count). " + IDLE_WORDS,
                width=12,
            ),
            Panel(
                "Wasted GPU-hours per namespace (hour ending at each point)",
                "timeseries",
                (_t(f"namespace:gpulens_gpu_wasted_hours:sum1h{{{NS}}}", "{{cluster}} {{namespace}}"),),
                description="Hours a device was allocated while idle, in the preceding hour; a time-sliced "
                "GPU split among its pods by the replicas each holds, a MIG instance weighted by its "
                "compute slices (3g = 3/7 of a GPU): the recording rule "
                "namespace:gpulens_gpu_wasted_hours:sum1h (from gpulens:pod_gpu_wasted:gpus).",
                width=12,
            ),
            Panel(
                "Allocated but idle now",
                "table",
                (
                    _t(
                        f"max by ({PODS_IDLE.by}) (gpulens:pod_gpu_activity:ratio_avg5m{{{POD}}} "
                        f"and on (namespace, pod, container, {ON_LEAF}) (gpulens:pod_gpu_idle:bool{{{POD}}} == 1))",
                        instant=True,
                    ),
                ),
                unit="percentunit",
                description="Containers holding a device that is idle now (gpulens:pod_gpu_idle:bool; "
                "GPUAllocatedButIdle fires after 30 m), with the device's SM active. " + IDLE_WORDS,
                width=12,
                table=PODS_IDLE,
                no_value="Every allocated GPU and MIG instance is in use.",
            ),
            Panel(
                "Pods holding GPUs",
                "table",
                (_t(f"max by ({PODS_ACTIVE.by}) (gpulens:pod_gpu_activity:ratio_avg5m{{{POD}}})", instant=True),),
                unit="percentunit",
                description=f"Each container and the device it holds, with the device's SM active over "
                f"{definitions.MEAN_WINDOW} (GPU-Util where the GPU has no GPM: gpulens:pod_gpu_activity:ratio_avg5m, "
                "what the idle definition reads).",
                width=12,
                table=PODS_ACTIVE,
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
                (_t(f"max by ({PODS_CLASS.by}) (gpulens:pod_gpu_boundness:class{{{POD}}})", instant=True),),
                description="Each container's class now: the device's while the pod is alone on it, "
                '"shared" where several pods run on it.',
                width=12,
                table=PODS_CLASS,
            ),
        ],
    ),
    (
        "Sharing: MIG and time-slicing",
        [
            Panel(
                "MIG instances per GPU and profile",
                "table",
                (_t(f"count by ({MIG_PER_GPU.by}) (gpulens_mig_instance_info{{{DEV}}})", instant=True),),
                width=8,
                table=MIG_PER_GPU,
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
                "Exporter stages (failed first)",
                "table",
                (_t(f"min by ({STAGES.by}) (gpulens_stage_success{{{NODE}}})", instant=True),),
                description="Each exporter's stages and whether the last cycle's run succeeded.",
                width=8,
                table=STAGES,
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
                "ECC errors since the driver loaded (volatile)",
                "table",
                tuple(
                    _t(
                        f'sum by ({ECC.by}) (gpulens_gpu_ecc_errors_total{{{DEV}, severity="{severity}"}})',
                        instant=True,
                    )
                    for severity in ("corrected", "uncorrected")
                ),
                description="Volatile ECC error counts per GPU, uncorrected first.",
                width=8,
                table=ECC,
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
                "Throttling in the last hour",
                "table",
                (
                    _t(
                        f"max by ({THROTTLING.by}) (avg_over_time(gpulens_gpu_clock_event_active"
                        f'{{{DEV}, reason!~"{NOT_THROTTLING}"}}[1h])) > 0',
                        instant=True,
                    ),
                ),
                unit="percentunit",
                description="GPUs whose clocks a clock event held down in the last hour, one row per GPU and "
                "reason, with the share of the hour it held them (the Health page's throttling). An idle "
                "GPU's low clocks and an application clock setting are not throttling and are left out.",
                width=8,
                table=THROTTLING,
                no_value="No throttling in the last hour.",
            ),
            Panel(
                "NVLinks down now",
                "table",
                (
                    _t(f"count by ({NVLINKS_DOWN.by}) (gpulens_gpu_nvlink_link_active{{{DEV}}} == 0)", instant=True),
                    _t(
                        f"sum by ({NVLINKS_DOWN.by}) (gpulens_gpu_nvlink_link_active{{{DEV}}}) "
                        f"and on ({NVLINKS_DOWN.by}) (gpulens_gpu_nvlink_link_active{{{DEV}}} == 0)",
                        instant=True,
                    ),
                ),
                description="GPUs with an NVLink down, how many are down and how many still up (the "
                "GPUNvlinkDown alert and the GPU page's links section read the same series).",
                width=8,
                table=NVLINKS_DOWN,
                no_value="Every NVLink is up (or no GPU here has NVLink).",
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


def value_field(refid: str, targets: int) -> str:
    """The name Grafana gives a query's value column in a table (format table, instant): ``Value``
    for a panel of one query, ``Value #A`` etc. for several."""
    return "Value" if targets == 1 else f"Value #{refid}"


def _refid(i: int) -> str:
    return chr(ord("A") + i)


def _mapping(words: Mapping[str, str]) -> list[dict[str, Any]]:
    """Grafana value mappings: each raw value shown as its words."""
    return [
        {"type": "value", "options": {raw: {"text": text, "index": i} for i, (raw, text) in enumerate(words.items())}}
    ]


def _table_json(table: Table, targets: Sequence[Target]) -> dict[str, Any]:
    """A table's transformations (merge of several queries, organize), sort and per-column mappings."""
    if len(table.values) != len(targets):
        raise ValueError(f"{len(targets)} queries but {len(table.values)} value headers")
    values = [(value_field(_refid(i), len(targets)), header) for i, header in enumerate(table.values)]
    order = [*(label for label, _ in table.columns), *(name for name, header in values if header)]
    organize = {
        "excludeByName": {
            **dict.fromkeys(HIDDEN, True),
            **{name: True for name, header in values if header is None},
        },
        "indexByName": {name: i for i, name in enumerate(order)},
        "renameByName": {**dict(table.columns), **{name: header for name, header in values if header}},
    }
    transformations: list[dict[str, Any]] = [{"id": "merge", "options": {}}] if len(targets) > 1 else []
    transformations.append({"id": "organize", "options": organize})
    return {
        "transformations": transformations,
        "sortBy": [{"displayName": table.sort, "desc": table.desc}] if table.sort else [],
        "overrides": [
            {
                "matcher": {"id": "byName", "options": header},
                "properties": [{"id": "mappings", "value": _mapping(words)}],
            }
            for header, words in table.mappings.items()
        ],
    }


def _panel_json(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.max is not None:
        defaults["min"] = 0
        defaults["max"] = panel.max
    if panel.no_value:
        defaults["noValue"] = panel.no_value
    table = _table_json(panel.table, panel.targets) if panel.table is not None else None
    options = dict(panel.options)
    if table is not None:
        options.setdefault("showHeader", True)
        options["sortBy"] = table["sortBy"]
    elif panel.kind == "table":
        raise ValueError(f"table panel {panel.title!r} has no Table (columns, headers)")
    out: dict[str, Any] = {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": table["overrides"] if table else []},
        "options": options,
        "targets": [
            {
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "refId": _refid(i),
                "expr": t.expr,
                "legendFormat": t.legend,
                "instant": t.instant,
                "range": not t.instant,
                **({"format": "table"} if panel.kind == "table" else {}),
            }
            for i, t in enumerate(panel.targets)
        ],
    }
    if table is not None:
        out["transformations"] = table["transformations"]
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
