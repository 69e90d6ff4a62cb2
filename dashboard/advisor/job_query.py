"""Measures every job (dashboard/jobs.py) over the advisor's window in Prometheus, from raw exporter
series, and hands :func:`dashboard.advisor.jobs.advise_jobs` one JobUsage per job.

The advisor must work on history recorded before the rules were loaded, so nothing here reads the
``gpulens:job_*`` records: the PromQL mirrors ``jobs.RULES`` with the 5 m window replaced by the
advisor's window, evaluated with subqueries at one step (``[window:step]``). The queries return one
row per job leaf (``jobs.JOB_LEAF``: cluster, the job, the pod, its node and the leaf); the job
figures are computed in pandas by the one definition's functions (``jobs.job_table``,
``jobs.stragglers``, ``jobs.job_mix``), so they are the definition's, and every aggregation keeps
``cluster`` (a store holding several clusters).

Per leaf, at each step while the job holds it (the allocation's presence), then over the window:
- **held**: the steps held x step x the pod's holding share (its replicas over all held on the
  leaf; 1 for an exclusive device), in hours; GPU-hours weigh MIG instances by
  ``definitions.gpu_share`` (as ``jobs.job_table`` does with ``gpu_share``);
- **activity** and **busy**: the mean of ``definitions.activity_mean_promql`` and
  ``definitions.busy_mean_promql``;
- **class mix** and **communication share**: the mean of each class's share of the pod's own class
  (``gpulens_pod_gpu_boundness``) within each step (``avg_over_time(x[step])``, every raw sample),
  so the communication share is the window's mean of ``gpulens_pod_gpu_boundness{class="communication"}``;
- **peak memory**: the highest raw ``gpulens_gpu_memory_used_bytes`` (``max_over_time(x[step])``);
  the leaf's memory the highest ``gpulens_gpu_memory_total_bytes``;
- **SM clock ratio** (``gpulens_gpu_sm_clock_hertz`` over ``gpulens_gpu_sm_clock_max_hertz``) and
  **slowdown share** (any of ``SLOWDOWN_REASONS`` active), the evidence for a straggler;
- **wasted GPU-hours**: ``definitions.wasted_promql`` (holding share x the leaf's idle verdict x its
  GPU share) integrated over the window: the waste definition's figure, the Workloads page's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from dashboard import definitions, jobs
from dashboard.advisor.engine import DEFAULT_POLICY, Policy
from dashboard.advisor.jobs import JobAdvice, JobLeaf, JobUsage, Straggler, advise_jobs
from dashboard.advisor.query import DEFAULT_WINDOW, Window, evaluate
from dashboard.frames.columns import with_cols
from dashboard.promql import duration, selector, subquery_range
from dashboard.sources.prometheus import PrometheusSource
from dashboard.sources.source import NO_FILTERS, Filters

SLOWDOWN_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
"""Clock event reasons (``gpulens_gpu_clock_event_active{reason}``) by which the GPU slows itself
down to protect itself: heat, a power brake, a hardware signal. Not a power cap, an application
clock setting, idling or sync boost, which every healthy busy GPU may show."""

JL = ", ".join(jobs.JOB_LEAF)
"""The labels of a per-leaf row (dashboard/jobs.py)."""
DEVICE = "cluster, uuid, mig_uuid"
"""A leaf: a whole GPU or MIG instance, per cluster."""
PHYSICAL = "cluster, uuid"
"""A physical GPU, per cluster (clocks and clock events are per GPU)."""
POD_LEAF = "cluster, namespace, pod, uuid, mig_uuid"
"""The labels of a pod's class on a leaf (its containers pooled)."""
POD_KEYS = ", ".join(definitions.POD_KEYS)


@dataclass(frozen=True)
class JobReport:
    """The jobs measured over a window and the span the data covers."""

    usages: list[JobUsage]
    window_s: float
    """The window asked for (s)."""
    first: float | None = None
    """Unix time of the first step at which any GPU was allocated (None: none in the window)."""
    last: float | None = None
    """Unix time of the last such step."""
    step_s: float = 0.0

    @property
    def covered_s(self) -> float:
        """Seconds the data covers: from the first step with an allocation to the last, plus a step."""
        if self.first is None or self.last is None:
            return 0.0
        return min(self.window_s, self.last - self.first + self.step_s)


@dataclass(frozen=True)
class JobAdviceReport:
    """Job advice and the span of data it rests on."""

    advice: list[JobAdvice]
    measured: JobReport = field(default_factory=lambda: JobReport([], 0.0))


def queries(filters: Filters, win: Window) -> dict[str, str]:
    """The PromQL of every per-leaf figure (module docstring), keyed by what it measures."""
    target = filters.target_matchers()
    mine = {**target, **({"namespace": filters.namespace} if filters.namespace else {})}
    alloc = selector("gpulens_pod_gpu_allocation", mine)
    alloc_all = selector("gpulens_pod_gpu_allocation", target)
    a = f"max by ({JL}) ({alloc})"
    step_s = win.resolved_step()
    step = duration(step_s)
    rng = subquery_range(win.window_s, step_s)
    window = duration(win.window_s)
    hours = f"{step_s:g} / 3600"
    # definitions.holding_share_promql, with the namespace filter on the holder only: a leaf shared
    # with another namespace's pod still splits its hours with it
    holding = (
        f"count by ({POD_KEYS}) ({alloc}) / on (uuid, mig_uuid) group_left () count by (uuid, mig_uuid) ({alloc_all})"
    )
    held = f"sum by ({JL}) ({holding})"

    def per_leaf(value: str, on: str = DEVICE) -> str:
        """``value`` (one series per ``on``) on each job leaf held at the step: labels JL."""
        return f"({a} * on ({on}) group_left () max by ({on}) ({value}))"

    def sel(metric: str, extra: Mapping[str, str] | None = None) -> str:
        return selector(metric, {**target, **(extra or {})})

    used = f"max_over_time({sel('gpulens_gpu_memory_used_bytes')}[{step}])"
    clock = (
        f"avg_over_time({sel('gpulens_gpu_sm_clock_hertz')}[{step}])"
        f" / on ({PHYSICAL}) max by ({PHYSICAL}) (max_over_time({sel('gpulens_gpu_sm_clock_max_hertz')}[{step}]) > 0)"
    )
    events = f'gpulens_gpu_clock_event_active{{{_inner(target)}reason=~"{"|".join(SLOWDOWN_REASONS)}"}}'
    slowdown = f"max by ({PHYSICAL}) (avg_over_time({events}[{step}]))"
    classes = (
        f"max by ({POD_LEAF}, class) (avg_over_time({sel('gpulens_pod_gpu_boundness')}[{step}]))"
        f" * on ({POD_LEAF}) group_left (workload_kind, workload, instance, node)"
        f" max by ({POD_LEAF}, workload_kind, workload, instance, node) ({a})"
    )
    wasted = definitions.wasted_promql(
        holding, definitions.leaf_idle_promql(target), definitions.gpu_share_promql(target)
    )
    present = f"timestamp(count({alloc}))"
    return {
        "held": f"sum_over_time({held}{rng}) * {hours}",
        "activity": f"avg_over_time({per_leaf(definitions.activity_mean_promql(target))}{rng})",
        "busy": f"avg_over_time({per_leaf(definitions.busy_mean_promql(target))}{rng})",
        "classes": f"avg_over_time(({classes}){rng})",
        "memory_used_bytes": f"max_over_time({per_leaf(used)}{rng})",
        "memory_total_bytes": (f"max by ({DEVICE}) (max_over_time({sel('gpulens_gpu_memory_total_bytes')}[{window}]))"),
        "sm_clock_ratio": f"avg_over_time({per_leaf(clock, PHYSICAL)}{rng})",
        "slowdown": f"avg_over_time({per_leaf(slowdown, PHYSICAL)}{rng})",
        "slowdown_reason": f"max by ({PHYSICAL}, reason) (avg_over_time({events}[{window}]))",
        "wasted": f"sum by ({JL}) (sum_over_time(({wasted}){rng})) * {hours}",
        "info": f"max by ({PHYSICAL}, gpu, name) (last_over_time({sel('gpulens_gpu_info')}[{window}]))",
        "mig": f"max by ({DEVICE}, mig_profile) (last_over_time({sel('gpulens_mig_instance_info')}[{window}]))",
        "node_gpus": (
            "count by (cluster, instance) "
            f"(max by (cluster, instance, uuid) (last_over_time({sel('gpulens_gpu_info')}[{window}])))"
        ),
        "first": f"min_over_time({present}{rng})",
        "last": f"max_over_time({present}{rng})",
    }


def _inner(matchers: Mapping[str, str]) -> str:
    """The matchers of ``matchers`` as the start of a selector's braces (``a="x",``), quoted."""
    text = selector("x", dict(matchers))
    return text[2:-1] + "," if text.endswith("}") else ""


LEAF_FIGURES = ("activity", "busy", "memory_used_bytes", "sm_clock_ratio", "slowdown")
"""The per-leaf means and peaks joined onto the hours held."""


def leaf_frame(results: Mapping[str, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(leaves, classes) from the query results: one row per job leaf with LEAF_COLUMNS (and
    ``held_hours``, ``gpu_share``, ``memory_*_bytes``, ``sm_clock_ratio``, ``slowdown``, ``model``,
    ``wasted_gpu_hours``), and one per (job leaf, class) with ``share``; bare pods named as their
    own job (``jobs.name_jobs``). Pure."""
    keys = list(jobs.JOB_LEAF)
    held = with_cols(results["held"], keys)
    if held.empty:
        return pd.DataFrame(columns=[*jobs.LEAF_COLUMNS, "held_hours"]), pd.DataFrame(columns=[*keys, "class", "share"])
    rows = held.rename(columns={"value": "held_hours"})[[*keys, "held_hours"]].drop_duplicates(keys)
    for name in (*LEAF_FIGURES, "wasted"):
        rows = rows.merge(_values(results[name], keys, name), on=keys, how="left")
    rows = rows.rename(columns={"wasted": "wasted_gpu_hours"})
    rows["wasted_gpu_hours"] = rows["wasted_gpu_hours"].fillna(0.0)
    device = ["cluster", "uuid", "mig_uuid"]
    rows = rows.merge(_values(results["memory_total_bytes"], device, "memory_total_bytes"), on=device, how="left")
    rows["memory_used_ratio"] = rows["memory_used_bytes"] / rows["memory_total_bytes"]
    info = with_cols(results["info"], ("cluster", "uuid", "gpu", "name")).drop_duplicates(["cluster", "uuid"])
    rows = rows.merge(
        info[["cluster", "uuid", "gpu", "name"]].rename(columns={"name": "model"}), on=["cluster", "uuid"], how="left"
    )
    mig = with_cols(results["mig"], ("cluster", "uuid", "mig_uuid", "mig_profile"))
    mig = mig.drop_duplicates(["cluster", "uuid", "mig_uuid"])[["cluster", "uuid", "mig_uuid", "mig_profile"]]
    rows = rows.merge(mig, on=["cluster", "uuid", "mig_uuid"], how="left")
    for c in ("gpu", "model", "mig_profile"):
        rows[c] = rows[c].fillna("").astype(str)
    rows["gpu_share"] = [definitions.gpu_share(p, m) for p, m in zip(rows["mig_profile"], rows["model"], strict=True)]
    classes = with_cols(results["classes"], (*keys, "class")).rename(columns={"value": "share"})
    classes = (
        jobs.name_jobs(classes[[*keys, "class", "share"]])
        if not classes.empty
        else pd.DataFrame(columns=[*keys, "class", "share"])
    )
    rows = jobs.name_jobs(rows)
    comm = classes[classes["class"] == jobs.COMMUNICATION][[*keys, "share"]].rename(columns={"share": "communication"})
    rows = rows.merge(comm.drop_duplicates(keys), on=keys, how="left")
    return rows, classes


def _values(result: pd.DataFrame, keys: list[str], name: str) -> pd.DataFrame:
    """A query's rows as ``keys`` + ``name`` (its value, float), one per key; empty (with those
    columns) when the store had no such series (an older exporter, no clock events)."""
    df = with_cols(result, keys)
    if "value" not in df.columns or df.empty:
        return pd.DataFrame({**{k: pd.Series(dtype=str) for k in keys}, name: pd.Series(dtype=float)})
    df = df.rename(columns={"value": name})[[*keys, name]]
    df[name] = pd.to_numeric(df[name], errors="coerce")
    return df.drop_duplicates(keys)


def job_usages(
    leaves: pd.DataFrame,
    classes: pd.DataFrame,
    node_gpus: Mapping[tuple[str, str], int],
    slowdown_reasons: Mapping[tuple[str, str], str] | None = None,
) -> list[JobUsage]:
    """One JobUsage per job from per-leaf rows (:func:`leaf_frame`), the job figures computed by
    ``jobs.job_table``, ``jobs.stragglers`` and ``jobs.job_mix``. ``node_gpus``: (cluster,
    instance) -> GPUs on that node; ``slowdown_reasons``: (cluster, uuid) -> the slowdown clock
    event that held the GPU down longest. Pure."""
    if leaves.empty:
        return []
    reasons = slowdown_reasons or {}
    table = jobs.job_table(leaves)
    mixes: dict[tuple[str, ...], dict[str, float]] = {}
    for rec in jobs.job_mix(classes).to_dict("records"):
        mixes.setdefault(tuple(str(rec[k]) for k in jobs.JOB), {})[str(rec["class"])] = float(rec["share"])
    strays = jobs.stragglers(leaves)
    strays_by_job = {tuple(str(k) for k in key): g for key, g in strays.groupby(list(jobs.JOB), sort=False)}
    one = jobs.one_per_leaf(leaves)
    out = []
    by_job = {tuple(str(k) for k in key): g for key, g in one.groupby(list(jobs.JOB), sort=False)}
    for rec in table.to_dict("records"):
        key = tuple(str(rec[k]) for k in jobs.JOB)
        g = by_job[key]
        cluster = key[0]
        leaf_of: dict[tuple[str, str], JobLeaf] = {}
        for r in g.to_dict("records"):
            leaf = JobLeaf(
                uuid=str(r["uuid"]),
                mig_uuid=str(r["mig_uuid"]),
                gpu=str(r.get("gpu", "") or ""),
                node=str(r["node"]),
                instance=str(r["instance"]),
                pod=str(r["pod"]),
                hours_held=(_num(r.get("held_hours")) or 0.0) * (_num(r.get("gpu_share")) or 1.0),
                memory_peak_bytes=_num(r.get("memory_used_bytes")),
                memory_total_bytes=_num(r.get("memory_total_bytes")),
                activity=_num(r.get("activity")),
                busy=_num(r.get("busy")),
                communication=_num(r.get("communication")),
            )
            leaf_of[(leaf.uuid, leaf.mig_uuid)] = leaf
        mine = strays_by_job.get(key, strays.iloc[0:0])
        stragglers = tuple(
            Straggler(
                leaf=leaf_of[(str(s["uuid"]), str(s["mig_uuid"]))],
                reason=str(s["reason"]),
                peers_communication=float(s["peers_communication"]),
                peers_busy=_num(s.get("peers_busy")),
                sm_clock_ratio=_num(s.get("sm_clock_ratio")),
                slowdown=_num(s.get("slowdown")),
                slowdown_reason=reasons.get((cluster, str(s["uuid"])), ""),
            )
            for _, s in mine.iterrows()
        )
        models = g["model"].replace("", pd.NA).dropna() if "model" in g.columns else pd.Series(dtype=str)
        out.append(
            JobUsage(
                cluster=key[0],
                namespace=key[1],
                workload_kind=key[2],
                workload=key[3],
                gpu_model=str(models.mode().iloc[0]) if not models.empty else "",
                leaves=tuple(leaf_of.values()),
                gpus_per_node={i: node_gpus.get((cluster, i), 0) for i in sorted(set(g["instance"]))},
                activity=_num(rec.get("activity")),
                busy=_num(rec.get("busy")),
                communication=_num(rec.get("communication")),
                mix=mixes.get(key, {}),
                gpu_hours_held=_num(rec.get("gpu_hours")),
                wasted_gpu_hours=float(g["wasted_gpu_hours"].fillna(0.0).sum()) if "wasted_gpu_hours" in g else 0.0,
                stragglers=stragglers,
            )
        )
    return out


def _num(v: object) -> float | None:
    """A finite float, or None for a missing or NaN value."""
    if v is None:
        return None
    try:
        x = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def touching(usages: list[JobUsage], filters: Filters) -> list[JobUsage]:
    """The jobs with a leaf on the node (``node`` or ``instance``) that ``filters`` name; all of them
    when they name none."""
    return [
        u
        for u in usages
        if any(
            (not filters.node or leaf.node == filters.node)
            and (not filters.instance or leaf.instance == filters.instance)
            for leaf in u.leaves
        )
    ]


def measure_jobs(src: PrometheusSource, win: Window = DEFAULT_WINDOW, filters: Filters = NO_FILTERS) -> JobReport:
    """Every job seen holding a GPU in the window, measured (module docstring). A node or instance
    filter keeps the jobs with a GPU there, measured whole (on all their nodes: a job cut to one
    node would look smaller than it is); cluster and namespace filter the queries.

    Raises SourceError when Prometheus does not answer."""
    results = evaluate(src, queries(Filters(cluster=filters.cluster, namespace=filters.namespace), win), win)
    leaves, classes = leaf_frame(results)
    nodes = _values(results["node_gpus"], ["cluster", "instance"], "value")
    node_gpus = {
        (str(c), str(i)): int(v) for c, i, v in zip(nodes["cluster"], nodes["instance"], nodes["value"], strict=True)
    }
    slow = _values(results["slowdown_reason"], ["cluster", "uuid", "reason"], "value")
    slow = slow[slow["value"] > 0].sort_values("value", kind="stable")
    # the reason that held each GPU's clocks down longest (the last, largest, wins)
    reasons = {(str(c), str(u)): str(r) for c, u, r in zip(slow["cluster"], slow["uuid"], slow["reason"], strict=True)}
    first, last = _scalar(results["first"]), _scalar(results["last"])
    usages = touching(job_usages(leaves, classes, node_gpus, reasons), filters)
    return JobReport(usages, win.window_s, first, last, win.resolved_step())


def _scalar(df: pd.DataFrame) -> float | None:
    if df.empty or "value" not in df.columns:
        return None
    return _num(df["value"].iloc[0])


def advise_all_jobs(
    src: PrometheusSource,
    win: Window = DEFAULT_WINDOW,
    prices: Mapping[str, float] | None = None,
    policy: Policy = DEFAULT_POLICY,
    filters: Filters = NO_FILTERS,
) -> JobAdviceReport:
    """Measure and advise: every multi-GPU job's advice over the window, largest saving first."""
    measured = measure_jobs(src, win, filters)
    return JobAdviceReport(advise_jobs(measured.usages, policy, prices), measured)
