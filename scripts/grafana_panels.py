"""The panels of gpulens's Grafana dashboards, declared as data: one ``Board`` per area.

Role: what each dashboard shows (title, PromQL, unit, how a table reads), in the Streamlit pages'
words; ``scripts/grafana_dashboard.py`` turns it into Grafana's JSON model through Grafana's typed
SDK (``grafana-foundation-sdk``). Eight boards, linked to one another: fleet and waste, workloads,
jobs and stragglers, network and GPUDirect RDMA, links (PCIe and NVLink), sharing (MIG,
time-slicing, MPS), health, and one GPU.

One definition: idle, in use, launch- and transfer-bound, wasted GPU-hours, the job figures and
the stragglers are read from the recording rules (``dashboard/definitions.py`` and
``dashboard/jobs.py`` write them), never derived here again; the few expressions that are not a
rule are built from those modules' names. Threshold lines (temperature slowdown and shutdown, the
power limit, the maximum SM clock) are series of the GPU's own limits, as the exporter reads them,
not constants. Tables name the node, the GPU index and the pod.

Units: ratios 0..1 (``percentunit``), data rates in bytes per second (``Bps``); only a NIC's line
rate is in bits per second (``bps``), labelled so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from dashboard import definitions, jobs
from dashboard.definitions import counter_events_promql
from dashboard.frames import health
from dashboard.frames.jobs import SLOWDOWN_WORDS
from dashboard.frames.network import GDR_REASONS, PATH_WORDS, PORT_STATES
from exporter.model import BOUNDNESS_CLASSES
from exporter.render.metrics import BY_NAME

# --- the template variables' matchers --------------------------------------------------------------
DEV = 'cluster=~"$cluster", node=~"$node", gpu=~"$gpu"'
"""A device series (it has ``gpu``, the GPU index): the Cluster, Node and GPU variables."""
NODE = 'cluster=~"$cluster", node=~"$node"'
"""A series of the node or the exporter (no GPU)."""
POD = 'cluster=~"$cluster", node=~"$node", namespace=~"$namespace"'
"""A per-container series that has no ``gpu`` label: the GPU variable joins through :func:`on_gpu`."""
PODGPU = 'cluster=~"$cluster", node=~"$node", gpu=~"$gpu", namespace=~"$namespace"'
"""A per-container recorded series (the pod rules add ``gpu``)."""
NS = 'cluster=~"$cluster", namespace=~"$namespace"'
"""A per-namespace or per-job series."""
CL = 'cluster=~"$cluster"'
LEAF = "{{node}} GPU {{gpu}} {{mig_profile}}"
GPU_LEGEND = "{{node}} GPU {{gpu}}"
ON_LEAF = ", ".join(definitions.LEAF)

IDLE_RULE = "gpulens:gpu_idle:bool"
if IDLE_RULE not in definitions.RULES:  # pragma: no cover (a rename in definitions.py)
    raise RuntimeError(f"{IDLE_RULE} is not a rule of dashboard/definitions.py")
IDLE_WORDS = (
    f"Idle = SM active < {definitions.IDLE_SM_ACTIVE_BELOW:.0%} over {definitions.MEAN_WINDOW}, no kernels "
    "running and its links idle (launch-bound and transfer-bound devices are in use): the recording rule "
    f"{IDLE_RULE}, the definition the alerts and the Streamlit dashboard use."
)

KERNEL_TIME = next(
    name for name in ("gpulens_pod_gpu_kernel_time_ratio", "gpulens_pod_gpu_sm_share_ratio") if name in BY_NAME
)
"""The per-process NVML figure (the share of sampled time a kernel of the pod's processes ran),
under its new name once the exporter exports it, else the old one (kept one release)."""

REASON_WORDS: Mapping[str, str] = MappingProxyType(
    {**SLOWDOWN_WORDS, "sync_boost": "sync boost", "display_clock_setting": "display clock setting"}
)
"""Clock event reasons that hold clocks down, in words (those of ``health.NOT_THROTTLING`` are not
throttling and are left out)."""
NOT_THROTTLING = "|".join(sorted(health.NOT_THROTTLING))
STAGE_WORDS: Mapping[str, str] = MappingProxyType({"1": "ok", "0": "failed"})
READY_WORDS: Mapping[str, str] = MappingProxyType({"1": "ready", "0": "not ready"})
STATE_WORDS: Mapping[str, str] = MappingProxyType({str(k): v for k, v in PORT_STATES.items()})
THRESHOLD_WORDS: Mapping[str, str] = MappingProxyType(
    {"slowdown": "slowdown limit", "shutdown": "shutdown limit", "gpu_max": "max operating", "memory_max": "HBM limit"}
)
ALERT_NAMES = "GPU.*|gpulens.*"  # the rule file's alerts all start with GPU (GPUAllocatedButIdle, GPUXidError, ...)


# --- declarations -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel; ``limit``: a threshold series drawn dashed (a GPU's own limit)."""

    expr: str
    legend: str = ""
    instant: bool = False
    limit: bool = False


@dataclass(frozen=True)
class Table:
    """How a table reads: the label columns it shows (label, header) in order, the header of each
    query's value column (``None``: hidden, a value that is always 1), the header to sort by, and
    value mappings (header -> raw value -> words). ``cluster`` is in ``by`` but hidden."""

    columns: tuple[tuple[str, str], ...]
    values: tuple[str | None, ...] = ("Value",)
    sort: str = ""
    desc: bool = False
    mappings: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    units: Mapping[str, str] = field(default_factory=dict)

    @property
    def by(self) -> str:
        """The ``by`` clause of the table's aggregation: ``cluster`` and the shown labels."""
        return ", ".join(["cluster", *(label for label, _ in self.columns)])


@dataclass(frozen=True)
class Panel:
    """One panel: ``kind`` is a Grafana panel type (timeseries, stat, table, bargauge, state-timeline).
    ``no_value``: the sentence shown when the query returns nothing (and the live test then allows
    it to return nothing: "no throttling" is an answer); ``link``: the uid of a board it opens."""

    title: str
    kind: str
    targets: tuple[Target, ...]
    unit: str = "short"
    description: str = ""
    width: int = 8
    height: int = 8
    max: float | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    table: Table | None = None
    no_value: str = ""
    link: str = ""
    mappings: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Board:
    """One dashboard: its uid (also the file name, ``deploy/grafana/<uid>.json``), title, what it
    answers, and its rows of panels."""

    uid: str
    title: str
    description: str
    rows: tuple[tuple[str, tuple[Panel, ...]], ...]
    single: tuple[str, ...] = ()
    """Variables that take one value, no "All" (the one-GPU board's node and GPU)."""


def t(expr: str, legend: str = "", instant: bool = False) -> Target:
    return Target(expr, legend, instant)


def limit(expr: str, legend: str) -> Target:
    return Target(expr, legend, limit=True)


def stat(
    title: str,
    expr: str,
    description: str = "",
    unit: str = "short",
    width: int = 4,
    link: str = "",
    no_value: str = "",
) -> Panel:
    return Panel(
        title,
        "stat",
        (t(expr, instant=True),),
        unit=unit,
        description=description,
        width=width,
        height=4,
        link=link,
        no_value=no_value,
    )


def count0(expr: str) -> str:
    """``count()`` of ``expr``, 0 where it has no series (a stat then reads 0, not "No data")."""
    return f"count({expr}) or vector(0)"


def on_gpu(expr: str, dev: str = DEV) -> str:
    """``expr`` (a per-container series keyed by ``uuid`` without ``gpu``) with its GPU index
    added, kept to the GPUs the GPU variable selects."""
    return f"({expr}) * on (uuid) group_left (gpu) max by (uuid, gpu) (gpulens_gpu_info{{{dev}}})"


def leaf_of(dev: str = DEV) -> str:
    """1 per leaf the variables select, with its node, GPU index and MIG profile: the right side of a
    join that adds them to a series keyed by ``uuid, mig_uuid`` only."""
    return f"(max by (uuid, mig_uuid, node, gpu, mig_profile) (gpulens_gpu_memory_total_bytes{{{dev}}}) * 0 + 1)"


def words(expr: str, label: str, mapping: Mapping[str, str]) -> str:
    """``expr`` with ``label``'s raw values replaced by their words (legends cannot map values)."""
    for raw, text in mapping.items():
        expr = f'label_replace({expr}, "{label}", "{text}", "{label}", "{raw}")'
    return expr


def rate(counter: str, window: str = "5m") -> str:
    """Per second over ``window``, only where the counter is still exported."""
    return f"(rate({counter}[{window}]) and {counter})"


# --- the Fleet page's counts (frames.fleet.fleet_counts) ------------------------------------------
def _leaves_promql(dev: str) -> str:
    """Every device (leaf) the exporters see, one series per ``uuid, mig_uuid``: the MIG instances,
    and the whole GPUs that have none (a GPU in MIG mode counts as its instances)."""
    mig = f"gpulens_mig_instance_info{{{dev}}}"
    return (
        f'(max by ({ON_LEAF}) (gpulens_mig_instance_info{{{dev}, mig_uuid!=""}})'
        f" or max by ({ON_LEAF}) (gpulens_gpu_info{{{dev}}} unless on (uuid) {mig}))"
    )


def _allocated_leaves_promql(dev: str, ns: str) -> str:
    return f"max by ({ON_LEAF}) ({on_gpu(f'gpulens_pod_gpu_allocation{{{ns}}}', dev)})"


def _verdict_promql(dev: str, idle: bool) -> str:
    """The leaves whose recorded verdict is idle (``idle``) or in use, as ``fleet_counts`` reads it."""
    return f"(max by ({ON_LEAF}) ({IDLE_RULE}{{{dev}}}) {'>=' if idle else '<'} 0.5)"


def fleet_count_promql(name: str, dev: str = DEV, pod: str = POD) -> str:
    """The PromQL of one of ``frames.fleet.fleet_counts``' counts (``gpus``, ``devices``, ``allocated``,
    ``in_use``, ``allocated_idle``) over the series the ``dev`` and ``pod`` matchers select."""
    leaves = _leaves_promql(dev)
    alloc = _allocated_leaves_promql(dev, pod)
    exprs = {
        "gpus": count0(f"max by (uuid) (gpulens_gpu_info{{{dev}}})"),
        "devices": count0(leaves),
        "allocated": count0(f"{alloc} and on ({ON_LEAF}) {leaves}"),
        "in_use": count0(f"{_verdict_promql(dev, idle=False)} and on ({ON_LEAF}) {leaves}"),
        "allocated_idle": count0(f"{_verdict_promql(dev, idle=True)} and on ({ON_LEAF}) {alloc}"),
    }
    return exprs[name]


FLEET_COUNTS: tuple[tuple[str, str, str], ...] = (
    ("gpus", "Physical GPUs", "GPUs the exporters see (a GPU in MIG mode is one GPU here, its instances devices)."),
    ("devices", "Devices", "Whole GPUs and MIG instances (a GPU in MIG mode counts as its instances)."),
    ("allocated", "Allocated", "Devices held by at least one pod (a time-sliced GPU once)."),
    ("in_use", "In use", "Devices not idle now, allocated or not. " + IDLE_WORDS),
    ("allocated_idle", "Allocated but idle", "Devices held by a pod and idle now. " + IDLE_WORDS),
)
"""(``fleet_counts`` key, panel title as the Fleet page words it, description)."""


# --- table shapes ----------------------------------------------------------------------------------
NODE_GPU = (("node", "Node"), ("gpu", "GPU"))
LEAF_COLUMNS = (*NODE_GPU, ("mig_profile", "MIG profile"))
POD_COLUMNS = (("namespace", "Namespace"), ("pod", "Pod"))
POD_DEVICE = (*POD_COLUMNS, *LEAF_COLUMNS)
"""A pod and the device it holds: namespace, pod, node, GPU index, MIG profile."""
JOB_COLUMNS = (("namespace", "Namespace"), ("workload_kind", "Kind"), ("workload", "Job"))
PCT = "percentunit"

FLEET = "gpulens-fleet"
WORKLOADS = "gpulens-workloads"
JOBS = "gpulens-jobs"
NETWORK = "gpulens-network"
LINKS = "gpulens-links"
SHARING = "gpulens-sharing"
HEALTH = "gpulens-health"
GPU = "gpulens-gpu"


# --- fleet and waste ----------------------------------------------------------------------------------
_LOST = f"gpulens_gpu_up{{{DEV}}} == 0"
_GDR_OFF = f"max by (cluster, node, gpu) (gpulens_gpu_nic_gdr_ready{{{DEV}}}) == 0"
_STRAGGLERS = f"gpulens:job_straggler:info{{{NS}}}"
_COMM_BOUND = f"({jobs.communication_bound_promql()}) and on (cluster, namespace) (gpulens:job_gpus:count{{{NS}}})"
_FIRING = f'ALERTS{{alertstate="firing", alertname=~"{ALERT_NAMES}", {CL}}}'

FLEET_BOARD = Board(
    FLEET,
    "gpulens / Fleet and waste",
    "What is wrong now, how many GPUs are held and used, and the GPU-hours wasted, per namespace.",
    (
        (
            "What is wrong now",
            (
                stat(
                    "Firing gpulens alerts",
                    count0(_FIRING),
                    "Alerts of the gpulens rules firing now (the table below names them).",
                    link=HEALTH,
                ),
                stat(
                    "GPUs lost",
                    count0(_LOST),
                    "GPUs the exporter lists but cannot read (gpulens_gpu_up == 0).",
                    link=HEALTH,
                ),
                stat(
                    "GPUs without GPUDirect RDMA",
                    count0(_GDR_OFF),
                    "GPUs on nodes with RDMA NICs that no NIC can reach by GPUDirect RDMA (every pair's "
                    "gpulens_gpu_nic_gdr_ready is 0): their RDMA traffic goes through host memory.",
                    link=NETWORK,
                ),
                stat(
                    "Communication-bound jobs",
                    count0(_COMM_BOUND),
                    f"Jobs whose GPUs spend >= {jobs.COMMUNICATION_BOUND_AT_LEAST:.0%} of their time waiting "
                    "on their peers or the network, with no straggler to explain it (GPUJobCommunicationBound).",
                    link=JOBS,
                ),
                stat(
                    "Stragglers",
                    count0(_STRAGGLERS),
                    "GPUs their job's other GPUs wait for (gpulens:job_straggler:info).",
                    link=JOBS,
                ),
                Panel(
                    "Exporters up",
                    "stat",
                    (
                        t(count0(f"gpulens_up{{{NODE}}} == 1"), "up", instant=True),
                        t(count0(f"gpulens:exporter_target:info{{{NODE}}}"), "of targets", instant=True),
                    ),
                    description="Exporters scraped whose GPU backend answers (gpulens_up == 1), of the exporter "
                    "targets Prometheus knows (gpulens:exporter_target:info, which keeps a dead exporter while "
                    "its scrapes fail).",
                    width=4,
                    height=4,
                    options={"textMode": "value_and_name", "colorMode": "none", "orientation": "horizontal"},
                    link=HEALTH,
                ),
                Panel(
                    "Firing alerts",
                    "table",
                    (t(f"count by (cluster, alertname, severity) ({_FIRING})", instant=True),),
                    description="The gpulens alerts firing now, by name and severity, with how many series fire.",
                    width=24,
                    height=5,
                    table=Table(
                        (("alertname", "Alert"), ("severity", "Severity")), ("Firing",), sort="Firing", desc=True
                    ),
                    no_value="No gpulens alert is firing.",
                ),
            ),
        ),
        (
            "GPUs",
            (
                *(stat(title, fleet_count_promql(key), description) for key, title, description in FLEET_COUNTS),
                stat("Power", f"sum(gpulens_gpu_power_watts{{{DEV}}})", unit="watt", width=2),
                stat("Memory used", f"sum(gpulens_gpu_memory_used_bytes{{{DEV}}})", unit="bytes", width=2),
                Panel(
                    "Activity per device (5 m mean)",
                    "timeseries",
                    (t(f"gpulens:gpu_activity:ratio_avg5m{{{DEV}}}", LEAF),),
                    unit=PCT,
                    description="The figure idle reads (gpulens:gpu_activity:ratio_avg5m): SM activity where the "
                    "GPU has GPM, else NVML GPU-Util (or, on a MIG instance without GPM, whether a process ran).",
                    width=12,
                    max=1,
                ),
                Panel(
                    "GPU-Util per GPU (NVML, 5 m mean)",
                    "timeseries",
                    (t(f"gpulens:gpu_utilization:ratio_avg5m{{{DEV}}}", GPU_LEGEND),),
                    unit=PCT,
                    description="Time any kernel ran: what nvidia-smi shows. Compare with the activity: a GPU "
                    "can read busy here while its SMs idle (launch-bound).",
                    width=12,
                    max=1,
                ),
                Panel(
                    "SM active per device (5 m mean)",
                    "timeseries",
                    (t(f"gpulens:gpu_sm_active:ratio_avg5m{{{DEV}}}", LEAF),),
                    unit=PCT,
                    description="Share of time the SMs had work (GPM, Hopper and newer).",
                    width=12,
                    max=1,
                ),
                Panel(
                    "Devices per boundness class (10 m)",
                    "timeseries",
                    (t(f"class:gpulens_gpu_boundness:sum{{{CL}}}", "{{class}}"),),
                    description="How many devices were in each class, time-weighted over 10 m "
                    "(class:gpulens_gpu_boundness:sum).",
                    width=6,
                ),
                Panel(
                    "Boundness mix (10 m)",
                    "bargauge",
                    (t(f"class:gpulens_gpu_boundness:ratio{{{CL}}}", "{{class}}", instant=True),),
                    unit=PCT,
                    description="Share of the classified devices in each class over 10 m "
                    "(class:gpulens_gpu_boundness:ratio).",
                    width=6,
                    max=1,
                ),
            ),
        ),
        (
            "Waste per namespace",
            (
                Panel(
                    "Allocated, busy and idle devices per namespace",
                    "timeseries",
                    (
                        t(f"namespace:gpulens_gpus_allocated:count{{{NS}}}", "{{namespace}} allocated"),
                        t(f"namespace:gpulens_gpus_busy:count{{{NS}}}", "{{namespace}} busy"),
                        t(f"namespace:gpulens_gpus_idle:count{{{NS}}}", "{{namespace}} allocated but idle"),
                    ),
                    description="Devices allocated to the namespace's pods, those busy and those idle (recording "
                    "rules namespace:gpulens_gpus_{allocated,busy,idle}:count). " + IDLE_WORDS,
                    width=12,
                ),
                Panel(
                    "Wasted GPU-hours per namespace (hour ending at each point)",
                    "timeseries",
                    (t(f"namespace:gpulens_gpu_wasted_hours:sum1h{{{NS}}}", "{{namespace}}"),),
                    description="Hours a device was allocated while idle, in the preceding hour; a time-sliced "
                    "GPU split among its holders, a MIG instance weighted by its share of the GPU (3g of 7: 3/7 "
                    "of a GPU): namespace:gpulens_gpu_wasted_hours:sum1h (from gpulens:pod_gpu_wasted:gpus).",
                    width=12,
                ),
                Panel(
                    "GPUs wasted now per pod",
                    "table",
                    (
                        t(
                            f"sum by (cluster, namespace, pod, node) (gpulens:pod_gpu_wasted:gpus{{{POD}}}"
                            f" and on (uuid) gpulens_gpu_info{{{DEV}}}) > 0",
                            instant=True,
                        ),
                    ),
                    description="GPU-equivalents each pod holds idle now (gpulens:pod_gpu_wasted:gpus: its holding "
                    "share x the device idle x the device's share of a GPU).",
                    width=24,
                    height=6,
                    table=Table((*POD_COLUMNS, ("node", "Node")), ("GPUs wasted",), sort="GPUs wasted", desc=True),
                    no_value="No pod holds an idle GPU now.",
                ),
            ),
        ),
    ),
)


# --- workloads ---------------------------------------------------------------------------------------
POD_LEAF_COLUMNS = (*POD_COLUMNS, ("container", "Container"), ("workload", "Workload"), *LEAF_COLUMNS)
WORKLOADS_BOARD = Board(
    WORKLOADS,
    "gpulens / Workloads",
    "Which pods hold which GPUs, how much of them they use, and what limits them.",
    (
        (
            "Pods and their devices",
            (
                Panel(
                    "Pods holding GPUs",
                    "table",
                    (
                        t(
                            f"max by (cluster, namespace, pod, node, gpu, mig_profile, container, workload) "
                            f"(gpulens:pod_gpu_activity:ratio_avg5m{{{PODGPU}}})",
                            instant=True,
                        ),
                        t(
                            f"max by (cluster, namespace, pod, node, gpu, mig_profile, container, workload) "
                            f"(gpulens:pod_gpu_sm_active:ratio_avg5m{{{PODGPU}}})",
                            instant=True,
                        ),
                        t(
                            f"max by (cluster, namespace, pod, node, gpu, mig_profile, container, workload) "
                            f"(gpulens:pod_gpu_transfer:ratio_avg5m{{{PODGPU}}})",
                            instant=True,
                        ),
                    ),
                    unit=PCT,
                    description="Each container, the device it holds (node, GPU index, MIG profile) and, over "
                    f"{definitions.MEAN_WINDOW}, the device's activity (what idle reads), SM activity and "
                    "transfer share (gpulens:pod_gpu_{activity,sm_active,transfer}:ratio_avg5m).",
                    width=24,
                    height=9,
                    table=Table(
                        (
                            *POD_DEVICE,
                            ("container", "Container"),
                            ("workload", "Workload"),
                        ),
                        ("Activity", "SM active", "Transfer share"),
                        sort="Activity",
                    ),
                ),
                Panel(
                    "Allocated but idle now",
                    "table",
                    (
                        t(
                            f"max by (cluster, namespace, pod, node, gpu, mig_profile, container) "
                            f"(gpulens:pod_gpu_activity:ratio_avg5m{{{PODGPU}}} and on (namespace, pod, container, "
                            f"{ON_LEAF}) (gpulens:pod_gpu_idle:bool{{{PODGPU}}} == 1))",
                            instant=True,
                        ),
                    ),
                    unit=PCT,
                    description="Containers holding a device idle now (gpulens:pod_gpu_idle:bool; "
                    "GPUAllocatedButIdle fires after 30 m), with the device's activity. " + IDLE_WORDS,
                    width=12,
                    table=Table(
                        (
                            *POD_DEVICE,
                            ("container", "Container"),
                        ),
                        ("Activity",),
                        sort="Namespace",
                    ),
                    no_value="Every allocated GPU and MIG instance is in use.",
                ),
                Panel(
                    "Boundness per pod now",
                    "table",
                    (
                        t(
                            f"max by (cluster, namespace, pod, node, gpu, mig_profile, class) "
                            f"(gpulens:pod_gpu_boundness:class{{{PODGPU}}})",
                            instant=True,
                        ),
                    ),
                    description="Each pod's class on each device: the device's while the pod is alone on it, "
                    '"shared" where several pods run on it (gpulens:pod_gpu_boundness:class).',
                    width=12,
                    table=Table(
                        (
                            *POD_DEVICE,
                            ("class", "Class"),
                        ),
                        (None,),
                        sort="Namespace",
                    ),
                ),
                Panel(
                    "Who holds each GPU",
                    "table",
                    (
                        t(
                            f"max by (cluster, node, gpu, namespace, pod) (gpulens:gpu_holder:info{{{NS}}}"
                            f" * on (uuid) group_left (node, gpu)"
                            f" max by (uuid, node, gpu) (gpulens_gpu_info{{{DEV}}}))",
                            instant=True,
                        ),
                    ),
                    description="Each physical GPU and the pods holding it or one of its MIG instances "
                    "(gpulens:gpu_holder:info: who an alert about the GPU names).",
                    width=12,
                    table=Table((*NODE_GPU, *POD_COLUMNS), (None,), sort="Node"),
                ),
                Panel(
                    "Pods launch-bound or waiting on links",
                    "table",
                    (
                        t(
                            f"max by (cluster, namespace, pod, node, gpu, mig_profile, class) "
                            f'(gpulens:pod_gpu_boundness:class{{{PODGPU}, class=~"{definitions.LAUNCH_CLASS}|'
                            f'{definitions.TRANSFER_CLASS}"}})',
                            instant=True,
                        ),
                    ),
                    description="Pods in use though their SMs idle: launch-bound (tiny kernels back to back, "
                    "GPULaunchBound) or transfer-bound (their links busy).",
                    width=12,
                    table=Table(
                        (
                            *POD_DEVICE,
                            ("class", "Class"),
                        ),
                        (None,),
                        sort="Namespace",
                    ),
                    no_value="No pod is launch-bound or transfer-bound now.",
                ),
            ),
        ),
        (
            "Over time",
            (
                Panel(
                    "Activity per pod (5 m mean)",
                    "timeseries",
                    (
                        t(
                            f"max by (namespace, pod, node, gpu, mig_profile) "
                            f"(gpulens:pod_gpu_activity:ratio_avg5m{{{PODGPU}}})",
                            "{{namespace}}/{{pod}} on {{node}} GPU {{gpu}} {{mig_profile}}",
                        ),
                    ),
                    unit=PCT,
                    width=12,
                    max=1,
                ),
                Panel(
                    "GPU memory per pod",
                    "timeseries",
                    (
                        t(
                            f"sum by (namespace, pod) (gpulens_pod_gpu_memory_used_bytes{{{POD}}})",
                            "{{namespace}}/{{pod}}",
                        ),
                    ),
                    unit="bytes",
                    width=12,
                ),
                Panel(
                    "Communication share per pod (5 m)",
                    "timeseries",
                    (t(f"gpulens:pod_gpu_communication:ratio_avg5m{{{NS}}}", "{{namespace}}/{{pod}}"),),
                    unit=PCT,
                    description="Share of the pod's GPU time spent waiting in a collective on its peers or the "
                    "network (gpulens:pod_gpu_communication:ratio_avg5m; GPUs with GPM).",
                    width=12,
                    max=1,
                ),
                Panel(
                    "Boundness per device (10 m)",
                    "table",
                    (
                        t(
                            f"max by (cluster, node, gpu, mig_profile, class) "
                            f"(gpulens:gpu_boundness:ratio_avg10m{{{DEV}}}) > 0",
                            instant=True,
                        ),
                    ),
                    unit=PCT,
                    description="Each device's classes over the last 10 m and the share of it spent in each "
                    "(gpulens:gpu_boundness:ratio_avg10m; classes it never had left out).",
                    width=12,
                    table=Table((*LEAF_COLUMNS, ("class", "Class")), ("Share of 10 m",), sort="Node"),
                ),
            ),
        ),
    ),
)


# --- jobs and stragglers ------------------------------------------------------------------------------
_JOB_BY = "cluster, namespace, workload_kind, workload"


def _job(record: str) -> str:
    return f"max by ({_JOB_BY}) ({record}{{{NS}}})"


JOB_FIGURES: tuple[tuple[str, str], ...] = (
    ("gpulens:job_gpus:count", "GPUs"),
    ("gpulens:job_gpu_share:sum", "GPU equivalents"),
    ("gpulens:job_nodes:count", "Nodes"),
    ("gpulens:job_pods:count", "Pods"),
    ("gpulens:job_activity:ratio_avg5m", "Activity"),
    ("gpulens:job_activity_min:ratio_avg5m", "Lowest"),
    ("gpulens:job_activity_max:ratio_avg5m", "Highest"),
    ("gpulens:job_activity_spread:ratio_avg5m", "Spread"),
    ("gpulens:job_busy:ratio_avg5m", "Busy"),
    ("gpulens:job_memory_used_max:ratio_max5m", "Peak memory"),
    ("gpulens:job_memory_at_max:bytes", "Memory of that GPU"),
    ("gpulens:job_leaves_classified:count", "GPUs classified"),
)
"""The job records of the Jobs table, in the Jobs page's order, with their headers."""
_RATIO_HEADERS = ("Activity", "Lowest", "Highest", "Spread", "Busy", "Peak memory", "Communication")

_LEAF_BY = "cluster, namespace, workload, pod, node, gpu, mig_profile"


def _job_leaf(record: str) -> str:
    return f"max by ({_LEAF_BY}) ({record}{{{NS}}} * on (uuid, mig_uuid) group_left (gpu, mig_profile) {leaf_of()})"


JOBS_BOARD = Board(
    JOBS,
    "gpulens / Jobs and stragglers",
    "Each job (the pods of one owner) across nodes: how busy, how evenly, what it waits on, and which GPU "
    "the others wait for.",
    (
        (
            "Jobs",
            (
                stat("Jobs holding GPUs", count0(f"gpulens:job_gpus:count{{{NS}}}"), "Jobs holding GPUs now.", width=6),
                stat(
                    "Multi-node jobs",
                    count0(f"gpulens:job_nodes:count{{{NS}}} > 1"),
                    "Jobs whose GPUs are on more than one node.",
                    width=6,
                ),
                stat(
                    "Communication-bound jobs",
                    count0(_COMM_BOUND),
                    f"Jobs waiting on their peers or the network >= {jobs.COMMUNICATION_BOUND_AT_LEAST:.0%} "
                    "of the time, no straggler explaining it.",
                    width=6,
                    link=NETWORK,
                ),
                stat("Straggling GPUs", count0(_STRAGGLERS), "GPUs their job's other GPUs wait for.", width=6),
                Panel(
                    "Jobs",
                    "table",
                    (
                        *(t(_job(record), instant=True) for record, _ in JOB_FIGURES),
                        t(
                            f"max by ({_JOB_BY}) (gpulens:job_boundness:ratio_avg5m"
                            f'{{{NS}, class="{jobs.COMMUNICATION}"}})',
                            instant=True,
                        ),
                    ),
                    description="One row per job: its GPUs (a MIG instance by its share of a GPU), nodes, pods, "
                    "activity (mean, lowest, highest, spread), busy ratio, peak memory on one GPU over that "
                    "GPU's memory, and its communication share (the gpulens:job_* rules, 5 m).",
                    width=24,
                    height=9,
                    table=Table(
                        JOB_COLUMNS,
                        (*(header for _, header in JOB_FIGURES), "Communication"),
                        sort="GPUs",
                        desc=True,
                        units={
                            **dict.fromkeys(_RATIO_HEADERS, PCT),
                            "Memory of that GPU": "bytes",
                            "GPU equivalents": "short",
                        },
                    ),
                ),
                Panel(
                    "Class mix per job (5 m)",
                    "bargauge",
                    (t(f"gpulens:job_boundness:ratio_avg5m{{{NS}}} > 0", "{{workload}} {{class}}", instant=True),),
                    unit=PCT,
                    description="Per job and class, the mean share of its GPUs' time in the class "
                    "(gpulens:job_boundness:ratio_avg5m).",
                    width=12,
                    height=9,
                    max=1,
                ),
                Panel(
                    "Activity per job (5 m mean)",
                    "timeseries",
                    (
                        t(f"gpulens:job_activity:ratio_avg5m{{{NS}}}", "{{workload}} mean"),
                        t(f"gpulens:job_activity_min:ratio_avg5m{{{NS}}}", "{{workload}} lowest GPU"),
                    ),
                    unit=PCT,
                    width=12,
                    height=9,
                    max=1,
                ),
            ),
        ),
        (
            "Stragglers and each GPU of a job",
            (
                Panel(
                    "Stragglers",
                    "table",
                    (
                        t(
                            f"max by (cluster, namespace, workload, pod, node, gpu, reason) ({_STRAGGLERS})",
                            instant=True,
                        ),
                    ),
                    unit=PCT,
                    description="The GPU each job's other GPUs wait for: its peers spend >= 25 % of their time in "
                    "communication and it >= 20 points less. Reason input: it sat idle for want of input; "
                    "compute: it computed while they waited (slow clocks, throttling). Value: its peers' "
                    "communication share (gpulens:job_straggler:info).",
                    width=24,
                    height=6,
                    table=Table(
                        (*JOB_COLUMNS[::2], *POD_COLUMNS[1:], *NODE_GPU, ("reason", "Reason")),
                        ("Peers waiting",),
                        sort="Peers waiting",
                        desc=True,
                    ),
                    no_value="No job has a straggler now.",
                ),
                Panel(
                    "Each GPU of each job",
                    "table",
                    (
                        t(_job_leaf("gpulens:job_leaf_activity:ratio_avg5m"), instant=True),
                        t(_job_leaf("gpulens:job_leaf_busy:ratio_avg5m"), instant=True),
                        t(_job_leaf("gpulens:job_leaf_communication:ratio_avg5m"), instant=True),
                        t(_job_leaf("gpulens:job_leaf_peers_communication:ratio_avg5m"), instant=True),
                        t(_job_leaf("gpulens:job_leaf_peers_busy:ratio_avg5m"), instant=True),
                        t(_job_leaf("gpulens:job_leaf_memory_used:ratio_max5m"), instant=True),
                    ),
                    unit=PCT,
                    description="Per job, pod and GPU (gpulens:job_leaf:info): activity, busy ratio and "
                    "communication share over 5 m, the same two of its peers (the job's other GPUs) and its "
                    "peak memory over its memory: what the straggler rule compares.",
                    width=24,
                    height=10,
                    table=Table(
                        (
                            ("namespace", "Namespace"),
                            ("workload", "Job"),
                            ("pod", "Pod"),
                            ("node", "Node"),
                            ("gpu", "GPU"),
                            ("mig_profile", "MIG profile"),
                        ),
                        ("Activity", "Busy", "Communication", "Peers' communication", "Peers' busy", "Peak memory"),
                        sort="Job",
                    ),
                ),
                Panel(
                    "GPUs per job and node",
                    "table",
                    (
                        t(
                            f"count by (cluster, namespace, workload, node) (gpulens:job_leaf:info{{{NS}, {NODE}}})",
                            instant=True,
                        ),
                    ),
                    description="Where each job's GPUs are (gpulens:job_leaf:info).",
                    width=24,
                    height=6,
                    table=Table(
                        (("namespace", "Namespace"), ("workload", "Job"), ("node", "Node")), ("GPUs",), sort="Job"
                    ),
                ),
            ),
        ),
    ),
)


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
                    count0(_GDR_OFF),
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


# --- links: PCIe and NVLink ---------------------------------------------------------------------------
def _link_rate(link: str) -> tuple[Target, ...]:
    return (
        *(
            t(
                f"sum by (node, gpu, mig_profile) ({rate(f'gpulens_gpu_{link}_{d}_bytes_total{{{DEV}}}')})",
                f"{LEAF} {'sent' if d == 'tx' else 'received'}",
            )
            for d in ("tx", "rx")
        ),
        limit(
            f'max by (node, gpu) (gpulens_gpu_{link}_capacity_bytes_per_second{{{DEV}, mig_uuid=""}})',
            "{{node}} GPU {{gpu}} capacity each way",
        ),
    )


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
                    _link_rate("pcie"),
                    unit="Bps",
                    description="Bytes per second each device sent and received over PCIe (TLP headers "
                    "included), with the link's capacity each way (dashed).",
                    width=12,
                ),
                Panel(
                    "NVLink throughput (5 m)",
                    "timeseries",
                    _link_rate("nvlink"),
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


# --- sharing: MIG, time-slicing, MPS --------------------------------------------------------------------
SHARING_BOARD = Board(
    SHARING,
    "gpulens / Sharing: MIG, time-slicing, MPS",
    "How each GPU is shared, how full the shares are, and each pod's part of a shared GPU.",
    (
        (
            "Modes",
            (
                Panel(
                    "Devices per sharing mode",
                    "bargauge",
                    (t(f"count by (mode) (gpulens_gpu_sharing_info{{{DEV}}})", "{{mode}}", instant=True),),
                    description="Whole GPUs and MIG instances by how they are shared: exclusive, time-slicing, "
                    "MPS or DRA (gpulens_gpu_sharing_info).",
                    width=8,
                ),
                Panel(
                    "Shared devices",
                    "table",
                    (
                        t(
                            "max by (cluster, node, gpu, mig_profile, mode) "
                            f'(gpulens_gpu_sharing_info{{{DEV}, mode!~"exclusive|mig"}})',
                            instant=True,
                        ),
                        t(
                            f"max by (cluster, node, gpu, mig_profile, mode) (gpulens_gpu_compute_processes{{{DEV}}}"
                            " * on (uuid, mig_uuid) group_left (mode) "
                            'gpulens_gpu_sharing_info{mode!~"exclusive|mig"})',
                            instant=True,
                        ),
                    ),
                    description="Devices shared by time-slicing, MPS or a shared ResourceClaim (MIG: below), and "
                    "the compute processes running on each (an MPS server is not counted).",
                    width=16,
                    table=Table((*LEAF_COLUMNS, ("mode", "Mode")), (None, "Processes"), sort="Node"),
                ),
                Panel(
                    "Time-slice occupancy (pods / replicas)",
                    "bargauge",
                    (
                        t(
                            on_gpu(
                                f"gpulens_gpu_sharing_pods{{{NODE}}} / on (uuid) gpulens_gpu_sharing_replicas{{{NODE}}}"
                            ),
                            "{{node}} GPU {{gpu}}",
                            instant=True,
                        ),
                    ),
                    unit=PCT,
                    description="Pods holding a time-slicing replica of the GPU over the replicas advertised.",
                    width=8,
                    max=1,
                ),
                Panel(
                    "Each pod's share of a shared device",
                    "table",
                    (
                        t(
                            f"max by (cluster, namespace, pod, node, gpu, mig_profile) "
                            f"(gpulens:pod_gpu_holding:ratio{{{POD}}}"
                            f" * on (uuid, mig_uuid) group_left (gpu, mig_profile) {leaf_of()}) < 1",
                            instant=True,
                        ),
                    ),
                    unit=PCT,
                    description="The replicas each pod holds over all replicas held on the device "
                    "(gpulens:pod_gpu_holding:ratio; 1 for an exclusive device, left out): how its wasted "
                    "GPU-hours are split.",
                    width=16,
                    table=Table(
                        (*POD_COLUMNS, ("node", "Node"), ("gpu", "GPU"), ("mig_profile", "MIG profile")),
                        ("Holding share",),
                        sort="Node",
                    ),
                    no_value="No device is shared by replicas.",
                ),
                Panel(
                    "Kernel time per pod on shared GPUs",
                    "timeseries",
                    (
                        t(
                            f"max by (namespace, pod, node, gpu) ({on_gpu(f'{KERNEL_TIME}{{{POD}}}')}"
                            f" and on (uuid) (count by (uuid) ({KERNEL_TIME}) > 1))",
                            "{{namespace}}/{{pod}} on {{node}} GPU {{gpu}}",
                        ),
                    ),
                    unit=PCT,
                    description="Share of sampled time a kernel of the pod's processes ran (NVML per-process "
                    f"utilisation, {KERNEL_TIME}), shown only where several pods share a GPU.",
                    width=24,
                    max=1,
                ),
            ),
        ),
        (
            "MIG",
            (
                Panel(
                    "MIG instances per GPU and profile",
                    "table",
                    (
                        t(
                            f"count by (cluster, node, gpu, mig_profile) (gpulens_mig_instance_info{{{DEV}}})",
                            instant=True,
                        ),
                    ),
                    width=8,
                    table=Table(LEAF_COLUMNS, ("MIG instances",), sort="Node"),
                ),
                Panel(
                    "MIG instances allocated per profile",
                    "bargauge",
                    (
                        t(
                            f"count by (mig_profile) (gpulens_mig_instance_info{{{DEV}}} * on (uuid, mig_uuid) "
                            f"group_left () max by (uuid, mig_uuid) (gpulens_pod_gpu_allocation{{{POD}}}))",
                            "{{mig_profile}}",
                            instant=True,
                        ),
                    ),
                    width=8,
                ),
                Panel(
                    "Share of its GPU per MIG instance",
                    "table",
                    (
                        t(
                            f"max by (cluster, node, gpu, mig_profile) (gpulens:leaf_gpu_share:ratio "
                            f"* on (uuid, mig_uuid) group_left (node, gpu, mig_profile) "
                            "max by (uuid, mig_uuid, node, gpu, mig_profile) "
                            f'(gpulens_mig_instance_info{{{DEV}, mig_uuid!=""}}))',
                            instant=True,
                        ),
                    ),
                    unit=PCT,
                    description="Each MIG profile's compute slices over the GPU's (3g of 7: 3/7): the weight of its "
                    "GPU-hours (gpulens:leaf_gpu_share:ratio).",
                    width=8,
                    table=Table(LEAF_COLUMNS, ("Share of the GPU",), sort="Node"),
                ),
                Panel(
                    "Activity per MIG instance (5 m mean)",
                    "timeseries",
                    (
                        t(
                            f'gpulens:gpu_activity:ratio_avg5m{{{DEV}, mig_uuid!=""}}',
                            "{{node}} GPU {{gpu}} {{mig_profile}} {{gpu_instance_id}}",
                        ),
                    ),
                    unit=PCT,
                    width=24,
                    max=1,
                ),
            ),
        ),
    ),
)


# --- health ---------------------------------------------------------------------------------------
def _temperature(dev: str) -> tuple[Target, ...]:
    return (
        t(f"gpulens_gpu_temperature_celsius{{{dev}}}", GPU_LEGEND),
        *(
            limit(
                f'max by (node, gpu) (gpulens_gpu_temperature_threshold_celsius{{{dev}, threshold="{kind}"}})',
                f"{{{{node}}}} GPU {{{{gpu}}}} {THRESHOLD_WORDS[kind]}",
            )
            for kind in ("slowdown", "shutdown")
        ),
    )


def _memory_temperature(dev: str) -> tuple[Target, ...]:
    return (
        t(f"gpulens_gpu_memory_temperature_celsius{{{dev}}}", f"{GPU_LEGEND} HBM"),
        limit(
            f'max by (node, gpu) (gpulens_gpu_temperature_threshold_celsius{{{dev}, threshold="memory_max"}})',
            f"{GPU_LEGEND} {THRESHOLD_WORDS['memory_max']}",
        ),
    )


def _power(dev: str) -> tuple[Target, ...]:
    return (
        t(f"gpulens_gpu_power_watts{{{dev}}}", GPU_LEGEND),
        limit(f"max by (node, gpu) (gpulens_gpu_power_limit_watts{{{dev}}})", f"{GPU_LEGEND} power limit"),
    )


def _clock(dev: str) -> tuple[Target, ...]:
    return (
        t(f"gpulens_gpu_sm_clock_hertz{{{dev}}}", f"{GPU_LEGEND} SM"),
        limit(f"max by (node, gpu) (gpulens_gpu_sm_clock_max_hertz{{{dev}}})", f"{GPU_LEGEND} max SM clock"),
    )


def _xids(dev: str) -> str:
    """Xid events per GPU in the hour ending at each point, the first event of a code counted too; 0
    for a GPU without any (an exporter that creates the counter at the first event has no series)."""
    events = counter_events_promql(f"gpulens_gpu_xid_errors_total{{{dev}}}", "1h")
    return f"sum by (node, gpu) ({events}) or max by (node, gpu) (gpulens_gpu_info{{{dev}}}) * 0"


def _clock_events(dev: str) -> Target:
    events = f'max by (node, gpu, reason) (gpulens_gpu_clock_event_active{{{dev}, reason!~"{NOT_THROTTLING}"}}) > 0'
    return t(words(events, "reason", REASON_WORDS), "{{node}} GPU {{gpu}} {{reason}}")


HEALTH_BOARD = Board(
    HEALTH,
    "gpulens / Health",
    "Temperatures and power against each GPU's own limits, clocks and what holds them down, errors "
    "(Xid, ECC, remapped rows), probes and the exporters themselves.",
    (
        (
            "Now",
            (
                Panel(
                    "Throttling in the last hour",
                    "table",
                    (
                        t(
                            f"max by (cluster, node, gpu, reason) (avg_over_time(gpulens_gpu_clock_event_active"
                            f'{{{DEV}, reason!~"{NOT_THROTTLING}"}}[1h])) > 0',
                            instant=True,
                        ),
                    ),
                    unit=PCT,
                    description="GPUs whose clocks a clock event held down in the last hour, one row per GPU and "
                    "reason (in words, as nvidia-smi prints them), with the share of the hour. An idle GPU's low "
                    "clocks and an application clock setting are not throttling and are left out.",
                    width=12,
                    table=Table(
                        (*NODE_GPU, ("reason", "Reason")),
                        ("Share of the hour",),
                        sort="Share of the hour",
                        desc=True,
                        mappings={"Reason": REASON_WORDS},
                    ),
                    no_value="No throttling in the last hour.",
                ),
                Panel(
                    "GPUs lost",
                    "table",
                    (t(f"max by (cluster, node, gpu) ({_LOST})", instant=True),),
                    description="GPUs the exporter lists but cannot read now (gpulens_gpu_up == 0, GPULost).",
                    width=6,
                    table=Table(NODE_GPU, (None,), sort="Node"),
                    no_value="Every GPU answers.",
                ),
                Panel(
                    "Exporter stages (failed first)",
                    "table",
                    (t(f"min by (cluster, node, stage) (gpulens_stage_success{{{NODE}}})", instant=True),),
                    description="Each exporter's stages and whether the last cycle's run succeeded.",
                    width=6,
                    table=Table(
                        (("node", "Node"), ("stage", "Stage")),
                        ("State",),
                        sort="State",
                        mappings={"State": STAGE_WORDS},
                    ),
                ),
                Panel(
                    "ECC errors since the driver loaded (volatile)",
                    "table",
                    tuple(
                        t(
                            "sum by (cluster, node, gpu) "
                            f'(gpulens_gpu_ecc_errors_total{{{DEV}, severity="{severity}"}})',
                            instant=True,
                        )
                        for severity in ("corrected", "uncorrected")
                    ),
                    description="Volatile ECC error counts per GPU, uncorrected first.",
                    width=8,
                    table=Table(NODE_GPU, ("Corrected", "Uncorrected"), sort="Uncorrected", desc=True),
                ),
                Panel(
                    "Remapped HBM rows",
                    "table",
                    (
                        t(f"sum by (cluster, node, gpu) (gpulens_gpu_remapped_rows{{{DEV}}})", instant=True),
                        t(f"max by (cluster, node, gpu) (gpulens_gpu_row_remap_pending{{{DEV}}})", instant=True),
                        t(f"max by (cluster, node, gpu) (gpulens_gpu_row_remap_failure{{{DEV}}})", instant=True),
                    ),
                    description="HBM rows remapped (correctable and uncorrectable causes), whether a remap waits "
                    "for a GPU reset, and whether one failed.",
                    width=8,
                    table=Table(
                        NODE_GPU,
                        ("Rows remapped", "Waits for a reset", "Remap failed"),
                        sort="Rows remapped",
                        desc=True,
                        mappings={
                            "Waits for a reset": {"0": "no", "1": "yes"},
                            "Remap failed": {"0": "no", "1": "yes"},
                        },
                    ),
                ),
                Panel(
                    "Xid errors in the last hour",
                    "timeseries",
                    (
                        t(
                            _xids(DEV),
                            "{{node}} GPU {{gpu}}",
                        ),
                    ),
                    description="Xid events per GPU in the hour ending at each point, the first event of a code "
                    "counted too (what GPUXidError counts). 0 where the exporter saw none.",
                    width=8,
                ),
            ),
        ),
        (
            "Against the GPU's own limits",
            (
                Panel(
                    "Temperature",
                    "timeseries",
                    _temperature(DEV),
                    unit="celsius",
                    description="GPU die temperature, with the GPU's own slowdown (hardware slows the clocks) and "
                    "shutdown limits, dashed (gpulens_gpu_temperature_threshold_celsius).",
                    width=12,
                ),
                Panel(
                    "HBM temperature",
                    "timeseries",
                    _memory_temperature(DEV),
                    unit="celsius",
                    description="Memory temperature, with the limit past which the driver slows the GPU.",
                    width=12,
                ),
                Panel(
                    "Power",
                    "timeseries",
                    _power(DEV),
                    unit="watt",
                    description="Power draw, with each GPU's enforced power limit (dashed).",
                    width=12,
                ),
                Panel(
                    "SM clock",
                    "timeseries",
                    _clock(DEV),
                    unit="hertz",
                    description="SM clock, with each GPU's maximum (dashed). A GPU at its power cap near its "
                    "maximum clock is normal under load.",
                    width=12,
                ),
                Panel(
                    "What holds the clocks down",
                    "timeseries",
                    (_clock_events(DEV),),
                    description="1 while the reason holds the clocks down, in words (idle and application clocks "
                    "left out).",
                    width=12,
                ),
                Panel(
                    "Energy per hour",
                    "timeseries",
                    (t(f"sum by (node) (increase(gpulens_gpu_energy_joules_total{{{DEV}}}[1h])) / 3.6e6", "{{node}}"),),
                    unit="kwatth",
                    description="Energy the node's GPUs used in the hour ending at each point.",
                    width=12,
                ),
                Panel(
                    "Memory clock",
                    "timeseries",
                    (t(f"gpulens_gpu_memory_clock_hertz{{{DEV}}}", f"{GPU_LEGEND} memory clock"),),
                    unit="hertz",
                    width=12,
                ),
                Panel(
                    "Fan speed",
                    "timeseries",
                    (t(f"gpulens_gpu_fan_speed_ratio{{{DEV}}}", GPU_LEGEND),),
                    unit=PCT,
                    description="Fan speed over its maximum (absent on passively cooled GPUs).",
                    width=12,
                    max=1,
                    no_value="No GPU here reports a fan (passively cooled GPUs have none).",
                ),
            ),
        ),
        (
            "Probes and exporters",
            (
                Panel(
                    "Probe efficiency (measured / expected)",
                    "timeseries",
                    (
                        t(f"gpulens_probe_efficiency_ratio{{{DEV}}}", LEAF + " {{probe}}"),
                        limit(
                            f"max by (node, gpu) (gpulens_gpu_info{{{DEV}}})"
                            f" * {definitions.PROBE_SLOW_EFFICIENCY_BELOW}",
                            "slow below",
                        ),
                    ),
                    unit=PCT,
                    description="Cached results of the gated bandwidth probes over what a healthy GPU of the model "
                    f"reaches; below {definitions.PROBE_SLOW_EFFICIENCY_BELOW:.0%} is slow.",
                    width=12,
                    no_value="No probe result cached (probes off, or not run yet).",
                ),
                Panel(
                    "Exporter",
                    "timeseries",
                    (
                        t(f"max by (node) (gpulens_snapshot_age_seconds{{{NODE}}})", "{{node}} snapshot age"),
                        t(f"max by (node, stage) (gpulens_stage_duration_seconds{{{NODE}}})", "{{node}} {{stage}}"),
                    ),
                    unit="s",
                    description="Age of the snapshot each scrape served and how long each stage took.",
                    width=12,
                ),
                Panel(
                    "Exporter errors (per hour)",
                    "timeseries",
                    (
                        t(
                            f"sum by (node, code) (increase(gpulens_nvml_errors_total{{{NODE}}}[1h]))",
                            "{{node}} NVML {{code}}",
                        ),
                        t(
                            f"sum by (node, family) (increase(gpulens_render_errors_total{{{NODE}}}[1h]))",
                            "{{node}} render {{family}}",
                        ),
                        t(
                            f"sum by (node, reason) (increase(gpulens_unmapped_devices_total{{{NODE}}}[1h]))",
                            "{{node}} unmapped device {{reason}}",
                        ),
                    ),
                    description="NVML calls that failed, families that could not be rendered and kubelet devices "
                    "matching no GPU, in the hour ending at each point.",
                    width=12,
                    no_value="No NVML, render or kubelet device error in the range.",
                ),
                Panel(
                    "Kubelet attribution age",
                    "timeseries",
                    (
                        t(
                            f"time() - max by (node) (gpulens_podresources_last_success_timestamp_seconds{{{NODE}}})",
                            "{{node}}",
                        ),
                    ),
                    unit="s",
                    description="Seconds since each exporter last read the kubelet's pod resources.",
                    width=12,
                ),
            ),
        ),
    ),
)


# --- one GPU -----------------------------------------------------------------------------------------
ONE = 'cluster=~"$cluster", node=~"$node", gpu=~"$gpu"'
WHOLE = f'{ONE}, mig_uuid=""'
"""The picked GPU as a whole (its MIG instances, if any, have panels of their own)."""
INSTANCES = f'{ONE}, mig_uuid!=""'
CLASS_NUMBERS: Mapping[str, str] = MappingProxyType({str(i + 1): c for i, c in enumerate(BOUNDNESS_CLASSES)})
"""Each boundness class as a number (a state timeline colours values; the mapping names them)."""


def class_band(dev: str) -> str:
    """Each leaf's class as its number in ``CLASS_NUMBERS``: one band per leaf, coloured by class."""
    each = " or ".join(
        f'(max by (node, gpu, mig_profile, gpu_instance_id) (gpulens_gpu_boundness{{{dev}, class="{c}"}} == 1)'
        f" * 0 + {n})"
        for n, c in CLASS_NUMBERS.items()
    )
    return f"max by (node, gpu, mig_profile, gpu_instance_id) ({each})"


GPU_BOARD = Board(
    GPU,
    "gpulens / One GPU",
    "One GPU over time (pick its node and GPU index): who holds it, how busy, what limits it, its "
    "temperature, power and clocks against its own limits, its links and errors.",
    (
        (
            "Who and how busy",
            (
                Panel(
                    "Pods holding it",
                    "table",
                    (
                        t(
                            f"max by (cluster, namespace, pod, container, workload, node, gpu, mig_profile) "
                            f"(gpulens:pod_gpu_activity:ratio_avg5m{{{ONE}}})",
                            instant=True,
                        ),
                    ),
                    unit=PCT,
                    width=24,
                    height=6,
                    table=Table(
                        (*POD_COLUMNS, ("container", "Container"), ("workload", "Workload"), *LEAF_COLUMNS),
                        ("Activity",),
                        sort="Pod",
                    ),
                    no_value="No pod holds it.",
                ),
                Panel(
                    "Idle verdict and what it reads",
                    "timeseries",
                    (
                        t(f"gpulens:gpu_activity:ratio_avg5m{{{WHOLE}}}", "activity"),
                        t(
                            f"gpulens:gpu_kernels_active:bool{{{CL}}}"
                            f" * on (uuid, mig_uuid) group_left (node, gpu, mig_profile) {leaf_of(WHOLE)}",
                            "kernels running",
                        ),
                        t(f"gpulens:gpu_transfer:ratio_avg5m{{{WHOLE}}}", "transfer share"),
                        t(f"gpulens:gpu_idle:bool{{{WHOLE}}}", "idle"),
                    ),
                    unit=PCT,
                    description="The idle verdict (1 idle) and its inputs: activity over 5 m, kernels running "
                    "(GPU-Util), transfer share (gpulens:gpu_idle:bool, gpulens:gpu_activity:ratio_avg5m, "
                    "gpulens:gpu_kernels_active:bool, gpulens:gpu_transfer:ratio_avg5m). " + IDLE_WORDS,
                    width=12,
                    max=1,
                ),
                Panel(
                    "Utilisation and activity",
                    "timeseries",
                    (
                        t(f"gpulens_gpu_utilization_ratio{{{ONE}}}", "GPU-Util"),
                        t(f"gpulens_gpu_sm_active_ratio{{{WHOLE}}}", "SM active"),
                        t(f"gpulens_gpu_sm_occupancy_ratio{{{WHOLE}}}", "SM occupancy"),
                        t(f"gpulens_gpu_dram_active_ratio{{{WHOLE}}}", "DRAM active"),
                        t(f"gpulens_gpu_tensor_active_ratio{{{WHOLE}}}", "tensor"),
                        t(f"gpulens_gpu_pipe_active_max_ratio{{{WHOLE}}}", "busiest pipe"),
                        t(f"gpulens_gpu_busy_ratio{{{WHOLE}}}", "busy"),
                    ),
                    unit=PCT,
                    description="The whole GPU (a GPU in MIG mode: its MIG instances below, one line each).",
                    width=12,
                    max=1,
                ),
                Panel(
                    "Each MIG instance: activity (5 m mean)",
                    "timeseries",
                    (
                        t(
                            f"gpulens:gpu_activity:ratio_avg5m{{{INSTANCES}}}",
                            "{{mig_profile}} instance {{gpu_instance_id}}",
                        ),
                    ),
                    unit=PCT,
                    description="One line per MIG instance: its activity (gpulens:gpu_activity:ratio_avg5m).",
                    width=12,
                    max=1,
                    no_value="This GPU is not in MIG mode.",
                ),
                Panel(
                    "Each MIG instance: memory used",
                    "timeseries",
                    (
                        t(
                            f"gpulens_gpu_memory_used_bytes{{{INSTANCES}}} / on (uuid, mig_uuid) "
                            f"gpulens_gpu_memory_total_bytes{{{INSTANCES}}}",
                            "{{mig_profile}} instance {{gpu_instance_id}}",
                        ),
                    ),
                    unit=PCT,
                    description="One line per MIG instance: memory used over its memory.",
                    width=12,
                    max=1,
                    no_value="This GPU is not in MIG mode.",
                ),
                Panel(
                    "Boundness class over time",
                    "state-timeline",
                    (t(class_band(ONE), "{{mig_profile}} {{gpu_instance_id}}"),),
                    description="What limits each device while it works: one band per device (the whole GPU, or "
                    "each MIG instance), coloured by its class.",
                    width=24,
                    height=6,
                    mappings=CLASS_NUMBERS,
                ),
            ),
        ),
        (
            "Memory, power, temperature, clocks",
            (
                Panel(
                    "Memory",
                    "timeseries",
                    (
                        t(f"gpulens_gpu_memory_used_bytes{{{ONE}}}", f"{LEAF} used"),
                        limit(f"gpulens_gpu_memory_total_bytes{{{ONE}}}", f"{LEAF} total"),
                    ),
                    unit="bytes",
                    width=12,
                ),
                Panel("Power", "timeseries", _power(ONE), unit="watt", width=12),
                Panel("Temperature", "timeseries", _temperature(ONE), unit="celsius", width=12),
                Panel("SM clock", "timeseries", _clock(ONE), unit="hertz", width=12),
                Panel("What holds the clocks down", "timeseries", (_clock_events(ONE),), width=12),
                Panel("HBM temperature", "timeseries", _memory_temperature(ONE), unit="celsius", width=12),
            ),
        ),
        (
            "Links and errors",
            (
                Panel("PCIe throughput (5 m)", "timeseries", _link_rate("pcie"), unit="Bps", width=12),
                Panel("NVLink throughput (5 m)", "timeseries", _link_rate("nvlink"), unit="Bps", width=12),
                Panel(
                    "Errors (per hour)",
                    "timeseries",
                    (
                        t(
                            _xids(ONE),
                            f"{GPU_LEGEND} Xid",
                        ),
                        t(
                            f"sum by (node, gpu, severity) (increase(gpulens_gpu_ecc_errors_total{{{ONE}}}[1h]))",
                            f"{GPU_LEGEND} ECC {{{{severity}}}}",
                        ),
                    ),
                    width=12,
                ),
                Panel(
                    "Identity",
                    "table",
                    (
                        t(
                            "max by (cluster, node, gpu, name, driver_version, pci_bus_id, mig_mode) "
                            f"(gpulens_gpu_info{{{ONE}}})",
                            instant=True,
                        ),
                    ),
                    width=12,
                    table=Table(
                        (
                            *NODE_GPU,
                            ("name", "Model"),
                            ("driver_version", "Driver"),
                            ("pci_bus_id", "PCI address"),
                            ("mig_mode", "MIG mode"),
                        ),
                        (None,),
                        sort="Node",
                    ),
                ),
            ),
        ),
    ),
    single=("node", "gpu"),
)


BOARDS: tuple[Board, ...] = (
    FLEET_BOARD,
    WORKLOADS_BOARD,
    JOBS_BOARD,
    NETWORK_BOARD,
    LINKS_BOARD,
    SHARING_BOARD,
    HEALTH_BOARD,
    GPU_BOARD,
)
"""Every dashboard, in the order of the links between them."""
