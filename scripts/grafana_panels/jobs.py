"""The Jobs and stragglers board: each job across nodes from the gpulens:job_* rules, its straggler
and each GPU of each job."""

from __future__ import annotations

from dashboard import jobs

from .model import (
    JOB_COLUMNS,
    JOBS,
    NETWORK,
    NODE,
    NODE_GPU,
    NS,
    PCT,
    POD_COLUMNS,
    Board,
    Panel,
    Table,
    count0,
    leaf_of,
    stat,
    t,
)
from .series import COMM_BOUND, STRAGGLERS

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
                    count0(COMM_BOUND),
                    f"Jobs waiting on their peers or the network >= {jobs.COMMUNICATION_BOUND_AT_LEAST:.0%} "
                    "of the time, no straggler explaining it.",
                    width=6,
                    link=NETWORK,
                ),
                stat("Straggling GPUs", count0(STRAGGLERS), "GPUs their job's other GPUs wait for.", width=6),
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
                            f"max by (cluster, namespace, workload, pod, node, gpu, reason) ({STRAGGLERS})",
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
