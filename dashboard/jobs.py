"""The one definition of a job, its figures and its straggler, for the rules, the dashboard and the
advisor (docs/jobs.md).

- **Job**: the pods of one top owner, ``(cluster, namespace, workload_kind, workload)``: the exporter
  names the top of the owner chain the Kubernetes API gives (a JobSet, a LeaderWorkerSet, a
  PyTorchJob, a Deployment, ...; docs/attribution.md), so a job's pods on every node share the key.
  A pod with no owner is a job of its own: ``workload_kind="Pod"``, ``workload=<pod>``. A job's
  **leaves** are the whole GPUs and MIG instances its pods hold (a leaf two of its pods share
  counts once); its **nodes** the exporter targets (``instance``) they sit on.
- **Per leaf**, over ``MEAN_WINDOW`` (5 m): its activity (dashboard/definitions.py: SM activity
  where the GPU has GPM, else GPU-Util), its busy ratio, its **communication share** (the fraction
  of the window the pod's class on it was ``communication``: spinning in a collective), its class
  mix, and its peak memory used against the leaf's memory.
- **Per job**: leaves, nodes; mean, minimum and maximum activity over its leaves and the spread
  (max - min); mean busy ratio; class mix (the mean over its classified leaves of each class's
  share: the shares sum to 1); the highest memory used on one leaf, in bytes and against that leaf's
  memory.
- **Straggler**: in a job of at least two classified leaves, a leaf whose peers (the job's other
  leaves) spend at least ``STRAGGLER_PEERS_WAIT_AT_LEAST`` of their time in ``communication`` (their
  mean share) while its own share is at least ``STRAGGLER_GAP_AT_LEAST`` below theirs: the others
  wait for it. Its **reason**: ``input`` when its busy ratio is at least ``INPUT_STALL_BUSY_GAP``
  below its peers' mean (its GPU sat idle, starved of input, while they spun), else ``compute``
  (it kept computing while they waited: slow clocks, throttling, a slower GPU). A synchronous
  job runs at its slowest rank's pace; independent replicas (a Deployment's) never wait on each
  other, so they never show one. Sustained means the alert's ``for``.
- **Communication-bound job**: its class mix's ``communication`` share at least
  ``COMMUNICATION_BOUND_AT_LEAST``, with no straggler to explain the waiting.

The recording rules of group ``gpulens.jobs`` (deploy/rules/gpulens.rules.yml) are generated from
:data:`RULES` and :func:`communication_bound_promql` (``python scripts/gen_rules.py``); the
dashboard and the advisor aggregate per-leaf figures with :func:`job_table` and :func:`stragglers`,
the same arithmetic in pandas.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from dashboard import definitions
from dashboard.promql import subquery_range

JOB: tuple[str, ...] = ("cluster", "namespace", "workload_kind", "workload")
"""The labels that name a job (``cluster`` where the store holds several clusters)."""
JOB_LEAF: tuple[str, ...] = (*JOB, "pod", "instance", "node", "uuid", "mig_uuid")
"""The labels of a job's per-leaf series: the job, the pod holding the leaf, its node, the leaf."""
BARE_POD_KIND = "Pod"
"""``workload_kind`` of a job made of one pod that no controller owns (``workload`` = the pod)."""

STRAGGLER_PEERS_WAIT_AT_LEAST = 0.25
"""Mean communication share (0..1) of a leaf's peers from which they are waiting on someone."""
STRAGGLER_GAP_AT_LEAST = 0.2
"""How far (0..1, absolute) a straggler's own communication share lies below its peers' mean."""
INPUT_STALL_BUSY_GAP = 0.2
"""How far (0..1, absolute) a straggler's busy ratio lies below its peers' mean when its GPU sat idle
for want of input (reason ``input``); nearer, it was computing (reason ``compute``)."""
COMMUNICATION_BOUND_AT_LEAST = 0.4
"""Communication share (0..1) of a job's class mix from which the job is communication-bound."""
COMMUNICATION = definitions.COMMUNICATION_CLASS
W = definitions.MEAN_WINDOW

_JOB = ", ".join(JOB)
_JOB_LEAF = ", ".join(JOB_LEAF)
_POD_LEAF = "cluster, namespace, pod, uuid, mig_uuid"


# --- PromQL: the recording rules -------------------------------------------------------------
def job_leaf_promql() -> str:
    """``gpulens:job_leaf:info``: 1 per (job, pod, leaf) allocated now, labels JOB_LEAF; a pod with no
    owner becomes the job ``Pod/<pod>``."""
    alloc = f'max by ({_JOB_LEAF}) (gpulens_pod_gpu_allocation{{workload!=""}})'
    bare = f'max by ({_JOB_LEAF}) (gpulens_pod_gpu_allocation{{workload=""}})'
    named = f'label_replace({bare}, "workload", "$1", "pod", "(.+)")'
    return f'{alloc} or label_replace({named}, "workload_kind", "{BARE_POD_KIND}", "workload_kind", "")'


def _per_leaf(value: str, on: str = "uuid, mig_uuid", extra: str = "") -> str:
    """``value`` (one series per ``on`` key) on every job leaf: labels JOB_LEAF (+ ``extra``)."""
    by = f"{on}, {extra}" if extra else on
    return f"gpulens:job_leaf:info * on ({on}) group_left ({extra}) max by ({by}) ({value})"


def leaf_activity_promql() -> str:
    """``gpulens:job_leaf_activity:ratio_avg5m``: each job leaf's activity (gpulens:gpu_activity:ratio_avg5m)
    with its GPU index."""
    return _per_leaf("gpulens:gpu_activity:ratio_avg5m", extra="gpu")


def leaf_busy_promql() -> str:
    """``gpulens:job_leaf_busy:ratio_avg5m``: each job leaf's mean busy ratio over the window."""
    return _per_leaf(definitions.busy_mean_promql())


def _pod_class_share(class_matcher: str) -> str:
    sel = f"gpulens_pod_gpu_boundness{{{class_matcher}}}" if class_matcher else "gpulens_pod_gpu_boundness"
    return f"avg_over_time({sel}[{W}]) and {sel}"


def leaf_communication_promql() -> str:
    """``gpulens:job_leaf_communication:ratio_avg5m``: the fraction of the window the pod's class on
    the leaf was ``communication`` (absent where the leaf has no class: no GPM)."""
    return _per_leaf(_pod_class_share(f'class="{COMMUNICATION}"'), on=_POD_LEAF)


def leaf_memory_promql() -> str:
    """``gpulens:job_leaf_memory_used:ratio_max5m``: each job leaf's peak memory used over the window
    over the leaf's memory."""
    used = f"max_over_time(gpulens_gpu_memory_used_bytes[{W}]) and gpulens_gpu_memory_used_bytes"
    return _per_leaf(f"({used}) / on (uuid, mig_uuid) gpulens_gpu_memory_total_bytes")


def peers_promql(leaf_record: str) -> str:
    """The mean of ``leaf_record`` over each leaf's peers (the job's other leaves), per leaf; only
    in jobs with at least two leaves."""
    return (
        f"(sum by ({_JOB}) ({leaf_record}) - on ({_JOB}) group_right () {leaf_record})"
        f" / on ({_JOB}) group_left () (count by ({_JOB}) ({leaf_record}) - 1 > 0)"
    )


def straggler_promql() -> str:
    """``gpulens:job_straggler:info``: per straggling leaf (module docstring), value its peers' mean
    communication share, labels JOB_LEAF, gpu and ``reason`` (``compute`` or ``input``)."""
    c, pc = "gpulens:job_leaf_communication:ratio_avg5m", "gpulens:job_leaf_peers_communication:ratio_avg5m"
    b, pb = "gpulens:job_leaf_busy:ratio_avg5m", "gpulens:job_leaf_peers_busy:ratio_avg5m"
    strays = (
        f"({pc} >= {STRAGGLER_PEERS_WAIT_AT_LEAST!r})"
        f" and on ({_JOB_LEAF}) ({pc} - on ({_JOB_LEAF}) group_left () {c} >= {STRAGGLER_GAP_AT_LEAST!r})"
    )
    gap = f"{b} - on ({_JOB_LEAF}) {pb}"
    starved = f"max by ({_JOB_LEAF}) ({gap} <= -{INPUT_STALL_BUSY_GAP!r})"
    gpu = f"on ({_JOB_LEAF}) group_left (gpu) (gpulens:job_leaf_activity:ratio_avg5m * 0 + 1)"
    reason = '"reason", "{}", "workload", ".*"'
    return (
        f"label_replace((({strays}) and on ({_JOB_LEAF}) {starved}) * {gpu}, {reason.format('input')})"
        f" or label_replace((({strays}) unless on ({_JOB_LEAF}) {starved}) * {gpu}, {reason.format('compute')})"
    )


def job_mix_promql() -> str:
    """``gpulens:job_boundness:ratio_avg5m``: the job's class mix, per class the mean over its
    classified leaves of the fraction of the window the pod's class on the leaf was that class."""
    shares = f"max by ({_POD_LEAF}, class) ({_pod_class_share('')})"
    per_leaf = f"gpulens:job_leaf:info * on ({_POD_LEAF}) group_right (workload_kind, workload) {shares}"
    return (
        f"sum by ({_JOB}, class) ({per_leaf})"
        f" / on ({_JOB}) group_left () count by ({_JOB}) (gpulens:job_leaf_communication:ratio_avg5m)"
    )


def _leaves(record: str) -> str:
    """One series per (job, leaf) of ``record`` (a leaf two pods of the job share counts once)."""
    return f"max by ({_JOB}, uuid, mig_uuid) ({record})"


def gpu_share_promql() -> str:
    """``gpulens:job_gpu_share:sum``: the GPUs the job holds now, a MIG instance by its share of its
    GPU (``gpulens:leaf_gpu_share:ratio``: a 3g instance of an H200 3/7), a leaf two of its pods share
    once."""
    share = "max by (uuid, mig_uuid) (gpulens:leaf_gpu_share:ratio)"
    return f"sum by ({_JOB}) ({_leaves('gpulens:job_leaf:info')} * on (uuid, mig_uuid) group_left () {share})"


def gpu_hours_promql(share: str, window_s: float, step_s: float) -> str:
    """A job's **GPU-hours over a range**: ``share`` (a selector of ``gpulens:job_gpu_share:sum``) at
    each step of the range's ``[window:step]`` subquery, summed, times the step in hours: every GPU
    it held in the range counts for the steps it held it, those it released since included (as the
    advisor counts). The pandas twin: :func:`gpu_hours`."""
    return f"sum_over_time({share}{subquery_range(window_s, step_s)}) * {step_s:g} / 3600"


def memory_at_max_promql() -> str:
    """``gpulens:job_memory_at_max:bytes``: the memory (bytes) of the job's leaf of the highest memory
    ratio (``gpulens:job_memory_used_max:ratio_max5m``; one leaf where several tie): with the
    ratio, that leaf's peak used and its headroom in bytes."""
    top = f"topk by ({_JOB}) (1, gpulens:job_leaf_memory_used:ratio_max5m)"
    total = "max by (uuid, mig_uuid) (gpulens_gpu_memory_total_bytes)"
    return f"max by ({_JOB}) ({top} * 0 + on (uuid, mig_uuid) group_left () {total})"


RULES: Mapping[str, str] = {
    "gpulens:job_leaf:info": job_leaf_promql(),
    "gpulens:job_leaf_activity:ratio_avg5m": leaf_activity_promql(),
    "gpulens:job_leaf_busy:ratio_avg5m": leaf_busy_promql(),
    "gpulens:job_leaf_communication:ratio_avg5m": leaf_communication_promql(),
    "gpulens:job_leaf_memory_used:ratio_max5m": leaf_memory_promql(),
    "gpulens:job_leaf_peers_communication:ratio_avg5m": peers_promql("gpulens:job_leaf_communication:ratio_avg5m"),
    "gpulens:job_leaf_peers_busy:ratio_avg5m": peers_promql("gpulens:job_leaf_busy:ratio_avg5m"),
    "gpulens:job_gpus:count": f"count by ({_JOB}) ({_leaves('gpulens:job_leaf:info')})",
    "gpulens:job_gpu_share:sum": gpu_share_promql(),
    "gpulens:job_nodes:count": f"count by ({_JOB}) (max by ({_JOB}, instance) (gpulens:job_leaf:info))",
    "gpulens:job_activity:ratio_avg5m": f"avg by ({_JOB}) ({_leaves('gpulens:job_leaf_activity:ratio_avg5m')})",
    "gpulens:job_activity_min:ratio_avg5m": f"min by ({_JOB}) ({_leaves('gpulens:job_leaf_activity:ratio_avg5m')})",
    "gpulens:job_activity_max:ratio_avg5m": f"max by ({_JOB}) ({_leaves('gpulens:job_leaf_activity:ratio_avg5m')})",
    "gpulens:job_activity_spread:ratio_avg5m": (
        "gpulens:job_activity_max:ratio_avg5m - gpulens:job_activity_min:ratio_avg5m"
    ),
    "gpulens:job_busy:ratio_avg5m": f"avg by ({_JOB}) ({_leaves('gpulens:job_leaf_busy:ratio_avg5m')})",
    "gpulens:job_boundness:ratio_avg5m": job_mix_promql(),
    "gpulens:job_memory_used_max:ratio_max5m": f"max by ({_JOB}) (gpulens:job_leaf_memory_used:ratio_max5m)",
    "gpulens:job_memory_at_max:bytes": memory_at_max_promql(),
    "gpulens:job_pods:count": f"count by ({_JOB}) (max by ({_JOB}, pod) (gpulens:job_leaf:info))",
    "gpulens:job_leaves_classified:count": f"count by ({_JOB}) (gpulens:job_leaf_communication:ratio_avg5m)",
    "gpulens:job_straggler:info": straggler_promql(),
}
"""Recording rule name -> the expression the rule file must hold (compared without whitespace), in
the order of the group (each rule reads only rules above it)."""


def communication_bound_promql() -> str:
    """The ``GPUJobCommunicationBound`` condition: a job's communication share at or above the
    threshold, unless a straggler explains the waiting."""
    return (
        f'max without (class) (gpulens:job_boundness:ratio_avg5m{{class="{COMMUNICATION}"}})'
        f" >= {COMMUNICATION_BOUND_AT_LEAST!r} unless on ({_JOB}) gpulens:job_straggler:info"
    )


# --- pandas: the same arithmetic for the dashboard and the advisor ---------------------------
LEAF_COLUMNS: tuple[str, ...] = (
    *JOB_LEAF,
    "gpu",
    "activity",
    "busy",
    "communication",
    "memory_used_ratio",
)
"""What a source gives per job leaf (its means over the window, NaN where unmeasured): the input of
:func:`job_table` and :func:`stragglers`. Optional extra columns are carried through:
``memory_used_bytes``, ``memory_total_bytes`` (peak and capacity), ``held_hours``, ``gpu_share``,
``sm_clock_ratio`` (mean SM clock over its maximum) and ``slowdown`` (share of the window a
slowdown clock event held the clocks down)."""

JOB_COLUMNS: tuple[str, ...] = (
    *JOB,
    "gpus",
    "nodes",
    "activity",
    "activity_min",
    "activity_max",
    "activity_spread",
    "busy",
    "communication",
    "memory_used_ratio",
    "stragglers",
)
"""The columns of :func:`job_table` (plus ``gpu_hours`` where the leaves have ``held_hours``)."""


def name_jobs(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (rows with pod labels) with every JOB column present and the pods of no owner named as
    their own job, as :func:`job_leaf_promql` does."""
    out = df.copy()
    for c in (*JOB_LEAF,):
        if c not in out.columns:
            out[c] = ""
        out[c] = out[c].fillna("").astype(str)
    bare = out["workload"] == ""
    out.loc[bare, "workload"] = out.loc[bare, "pod"]
    out.loc[bare & (out["workload_kind"] == ""), "workload_kind"] = BARE_POD_KIND
    return out


def one_per_leaf(leaves: pd.DataFrame) -> pd.DataFrame:
    """One row per (job, leaf): a leaf two pods of a job share is one leaf (the first row's pod)."""
    return leaves.drop_duplicates([*JOB, "uuid", "mig_uuid"])


def stragglers(leaves: pd.DataFrame) -> pd.DataFrame:
    """The straggling leaves (module docstring) of ``leaves`` (LEAF_COLUMNS): their rows with
    ``peers_communication``, ``peers_busy`` and ``reason`` added (``gpulens:job_straggler:info``)."""
    cols = [*leaves.columns, "peers_communication", "peers_busy", "reason"]
    if leaves.empty:
        return pd.DataFrame(columns=cols)
    df = leaves[leaves["communication"].notna()].copy()
    if df.empty:
        return pd.DataFrame(columns=cols)
    g = df.groupby(list(JOB), sort=False)
    n = g["communication"].transform("count")
    df = df[n >= 2]
    if df.empty:
        return pd.DataFrame(columns=cols)
    g = df.groupby(list(JOB), sort=False)
    n = g["communication"].transform("count")
    df["peers_communication"] = (g["communication"].transform("sum") - df["communication"]) / (n - 1)
    busy_n = g["busy"].transform("count")
    df["peers_busy"] = (g["busy"].transform("sum") - df["busy"]) / (busy_n - 1).where(busy_n > 1)
    strays = (df["peers_communication"] >= STRAGGLER_PEERS_WAIT_AT_LEAST - 1e-12) & (
        df["peers_communication"] - df["communication"] >= STRAGGLER_GAP_AT_LEAST - 1e-12
    )
    starved = ((df["busy"] - df["peers_busy"]) <= -INPUT_STALL_BUSY_GAP + 1e-12).fillna(False)
    df["reason"] = np.where(starved, "input", "compute")
    return df[strays].reset_index(drop=True)[cols]


def job_table(leaves: pd.DataFrame) -> pd.DataFrame:
    """One row per job (JOB_COLUMNS) from its leaves' figures (LEAF_COLUMNS), as the rules of group
    ``gpulens.jobs`` compute them: means over leaves, the class mix's share of ``communication``
    (over the classified pods' leaves), the highest memory ratio, and the count of stragglers. With ``held_hours``
    (and ``gpu_share``) per leaf, ``gpu_hours`` too: the GPU-hours the job held in the window."""
    if leaves.empty:
        return pd.DataFrame(columns=[*JOB_COLUMNS, "gpu_hours"])
    one = one_per_leaf(leaves)
    g = one.groupby(list(JOB), sort=False)
    out = g.agg(
        gpus=("uuid", "size"),
        activity=("activity", "mean"),
        activity_min=("activity", "min"),
        activity_max=("activity", "max"),
        busy=("busy", "mean"),
        memory_used_ratio=("memory_used_ratio", "max"),
    ).reset_index()
    out["activity_spread"] = out["activity_max"] - out["activity_min"]
    # the class mix's communication share: per classified (pod, leaf), as job_mix_promql counts
    comm = leaves.groupby(list(JOB), sort=False)["communication"].mean().rename("communication").reset_index()
    out = out.merge(comm, on=list(JOB), how="left")
    nodes = leaves.groupby(list(JOB), sort=False)["instance"].nunique().rename("nodes").reset_index()
    out = out.merge(nodes, on=list(JOB), how="left")
    strays = stragglers(leaves)
    counts = strays.groupby(list(JOB), sort=False).size().rename("stragglers").reset_index()
    out = out.merge(counts, on=list(JOB), how="left")
    out["stragglers"] = out["stragglers"].fillna(0).astype(int)
    cols = list(JOB_COLUMNS)
    if "held_hours" in one.columns:
        share = one["gpu_share"] if "gpu_share" in one.columns else 1.0
        hours = (one["held_hours"] * share).groupby([one[c] for c in JOB], sort=False).sum()
        out = out.merge(hours.rename("gpu_hours").reset_index(), on=list(JOB), how="left")
        cols.append("gpu_hours")
    return out[cols]


SUMMARY_COLUMNS: tuple[str, ...] = (
    *JOB_COLUMNS,
    "gpu_hours",
    "pods",
    "classified_leaves",
    "memory_used_bytes",
    "memory_total_bytes",
)
"""The columns of :func:`job_summary`: :func:`job_table`'s, the pods, the classified (pod, leaf)
rows (0: no class to read), and the peak memory used on the leaf of the highest memory ratio with
that leaf's memory (bytes)."""


def job_summary(leaves: pd.DataFrame, hours: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per job (SUMMARY_COLUMNS) from its leaves now (``MetricSource.job_leaves`` rows) and
    its GPU-hours over the range (``hours``: :func:`gpu_hours`; NaN without): what the Jobs page
    lists. The Prometheus source reads the same from the recorded job series (``gpulens:job_*``)."""
    if leaves.empty:
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    key = list(JOB)
    out = job_table(leaves.drop(columns=["held_hours"], errors="ignore"))
    if hours is None:
        out["gpu_hours"] = np.nan
    else:
        out = out.merge(hours[[*key, "gpu_hours"]], on=key, how="left")
        out["gpu_hours"] = out["gpu_hours"].fillna(0.0)
    g = leaves.groupby(key, sort=False)
    extra = pd.DataFrame({"pods": g["pod"].nunique(), "classified_leaves": g["communication"].count()})
    peak = leaves.assign(_r=pd.to_numeric(leaves["memory_used_ratio"], errors="coerce"))
    peak = peak.sort_values("_r", ascending=False, na_position="last", kind="stable").drop_duplicates(key)
    peak = peak.reindex(columns=[*key, "memory_used_bytes", "memory_total_bytes"])
    out = out.merge(extra.reset_index(), on=key, how="left").merge(peak, on=key, how="left")
    return out[list(SUMMARY_COLUMNS)]


def gpu_hours(held: pd.DataFrame, step_s: float) -> pd.DataFrame:
    """Each job's GPU-hours over a range (:func:`gpu_hours_promql`) from the steps it held each leaf:
    ``held`` has a row per (pod, leaf, step held: ``timestamp``) with the JOB labels, ``uuid``,
    ``mig_uuid`` and ``gpu_share`` (1 where absent); a leaf two pods share counts once per step.
    Columns JOB and ``gpu_hours``."""
    if held.empty:
        return pd.DataFrame(columns=[*JOB, "gpu_hours"])
    one = held.drop_duplicates([*JOB, "uuid", "mig_uuid", "timestamp"])
    share = pd.to_numeric(one["gpu_share"], errors="coerce").fillna(1.0) if "gpu_share" in one else 1.0
    hours = (one.assign(_h=share * step_s / 3600.0)).groupby(list(JOB), sort=False)["_h"].sum()
    return hours.rename("gpu_hours").reset_index()


def job_mix(classes: pd.DataFrame) -> pd.DataFrame:
    """Each job's class mix (``gpulens:job_boundness:ratio_avg5m``) from per (job, pod, leaf, class)
    shares (JOB_LEAF, class, share): per class the sum of its leaves' shares over the job's
    classified leaves. Columns JOB, class, share."""
    if classes.empty:
        return pd.DataFrame(columns=[*JOB, "class", "share"])
    per_class = classes.groupby([*JOB, "class"], as_index=False, sort=False)["share"].sum()
    n = classes.drop_duplicates([*JOB, "pod", "uuid", "mig_uuid"]).groupby(list(JOB), sort=False).size()
    per_class = per_class.merge(n.rename("n").reset_index(), on=list(JOB))
    per_class["share"] = per_class["share"] / per_class["n"]
    return per_class[[*JOB, "class", "share"]]


def job_label(row: Mapping[str, object] | pd.Series) -> str:
    """How a job is written for people: ``namespace/Kind/name`` (and ``@cluster`` where known)."""
    text = f"{row.get('namespace', '')}/{row.get('workload_kind', '')}/{row.get('workload', '')}"
    cluster = str(row.get("cluster", "") or "")
    return f"{text} @ {cluster}" if cluster else text
