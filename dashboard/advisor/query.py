"""Measures each workload's GPU use over a window in Prometheus (raw gpulens series, no recording
rules needed) and hands the engine one WorkloadUsage per workload and device kind.

A workload is (namespace, workload_kind, workload) from ``gpulens_pod_gpu_allocation``; a pod
without an owner is its own workload (kind ``Pod``). Device series join on (uuid, mig_uuid): whole
GPUs on uuid, MIG instances on mig_uuid. Everything is evaluated server-side with subqueries at
one step (``[window:step]``), so the answer is a few rows per workload-device, whatever the window.

Signals per (workload, device) at each step:
- SM activity: the device's ``gpulens_gpu_sm_active_ratio``; on a GPU held by several workloads at
  once (time-slicing, MPS) the workload's own ``gpulens_pod_gpu_kernel_time_ratio`` (summed over its
  containers: the share of time its kernels ran, itself an upper bound of its SM activity) where
  the exporter has it, else the GPU's (an upper bound).
- Memory: the device's ``gpulens_gpu_memory_used_bytes`` (everything on it, conservative); on a
  shared GPU the workload's ``gpulens_pod_gpu_memory_used_bytes``, else the GPU's. Peaks take the
  highest raw sample within each step (``max_over_time(x[step])``) so a short spike is not missed.
- DRAM activity: the device's (on a shared GPU, the whole GPU's).
- Link use: the device's ``gpulens_gpu_pcie_utilization_ratio`` and
  ``gpulens_gpu_nvlink_utilization_ratio`` (the busier direction over the link's capacity), for the
  evidence of transfer-bound work.
- Boundness: the pod's own class, ``gpulens_pod_gpu_boundness`` (the device's class only where the
  pod is alone on it; ``shared`` or ``idle`` where several pods hold it).
- Hours held: steps held x step x the pod's share of the device (the replicas it holds over all
  replicas held on it: 1 unless time-sliced).
- Hours idle: the same at the steps at which the device was idle by the one definition of
  dashboard/definitions.py (SM active < 1 % over 5 m, no kernels and no launch- or transfer-bound
  moment; the recording rule gpulens:gpu_idle:bool, inlined here so backfilled history without
  recorded series works too).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pandas as pd

from dashboard import definitions
from dashboard.advisor.engine import DEFAULT_POLICY, Policy, Recommendation, WorkloadUsage, recommend_all
from dashboard.frames.columns import with_cols
from dashboard.promql import by_clause, duration, selector, subquery_range
from dashboard.sources.prometheus import PrometheusSource
from dashboard.sources.source import NO_FILTERS, Filters

WORKLOAD = ("namespace", "workload_kind", "workload")
POD = (*WORKLOAD, "pod")
LEAF = ("uuid", "mig_uuid")
KEYS = (*POD, *LEAF)
MAX_STEPS = 20_000
"""Most subquery steps per series; longer windows get a coarser step."""


@dataclass(frozen=True)
class Window:
    """What to measure: ``window_s`` seconds ending at ``end`` (Unix s; None = now), every ``step_s``."""

    window_s: float = 7 * 86400.0
    step_s: float | None = None
    """None: max(60 s, window / 1008), i.e. 10 minutes over 7 days."""
    end: float | None = None

    def resolved_step(self) -> float:
        step = self.step_s if self.step_s else max(60.0, self.window_s / 1008)
        return float(max(step, math.ceil(self.window_s / MAX_STEPS)))


def _queries(filters: Filters, win: Window) -> dict[str, str]:
    """The PromQL for every measurement, keyed by what it measures; results are per (pod, device).

    Rows stay per pod (not per workload) on the server: grouping by owner in PromQL would need
    label_replace/or/unless at every step, which made a 1,000-GPU fleet several times slower.
    """
    target = filters.target_matchers()
    alloc = selector(
        "gpulens_pod_gpu_allocation", {**target, **({"namespace": filters.namespace} if filters.namespace else {})}
    )
    a = f"max by {by_clause(KEYS)} ({alloc})"
    holders = f"count by (uuid,mig_uuid) ({a})"
    # the pod's share of the device: replicas it holds / replicas held (definitions.holding_share_promql)
    share = (
        f"(count by {by_clause(KEYS)} ({alloc}) / on(uuid,mig_uuid) group_left() count by (uuid,mig_uuid) ({alloc}))"
    )
    step = duration(win.resolved_step())
    rng = subquery_range(win.window_s, win.resolved_step())

    def leaf(metric: str, peak: bool = False, extra: str = "") -> str:
        sel = selector(metric, target)
        return f"max by (uuid,mig_uuid{extra}) ({f'max_over_time({sel}[{step}])' if peak else sel})"

    def joined(metric: str, peak: bool = False) -> str:
        return f"({a} * on(uuid,mig_uuid) group_left() {leaf(metric, peak)})"

    def per_pod_on_shared(metric: str, peak: bool = False) -> str:
        # the pod's own series, with the allocation's owner labels, on GPUs several pods hold
        sel = selector(metric, target)
        inner = f"max_over_time({sel}[{step}])" if peak else sel
        return (
            f"(sum by (namespace,pod,uuid) ({inner}) * on(namespace,pod,uuid) group_left(workload_kind,workload)"
            f" max by (namespace,pod,uuid,workload_kind,workload) ({alloc}) and on(uuid) ({holders} > 1))"
        )

    # activity (dashboard/definitions.py): SM activity, or the busy ratio (GPU-Util) on a GPU without GPM
    no_sm = f"unless on(uuid,mig_uuid) {selector('gpulens_gpu_sm_active_ratio', target)}"
    sm = (
        f"({per_pod_on_shared('gpulens_pod_gpu_kernel_time_ratio')} or {joined('gpulens_gpu_sm_active_ratio')}"
        f" or ({joined('gpulens_gpu_busy_ratio')} {no_sm}))"
    )
    mem = (
        f"({per_pod_on_shared('gpulens_pod_gpu_memory_used_bytes', True)}"
        f" or {joined('gpulens_gpu_memory_used_bytes', True)})"
    )
    below = f"max by (uuid,mig_uuid) ({definitions.leaf_idle_promql(target)})"
    idle = f"({share} * on(uuid,mig_uuid) group_left() {below})"
    # the pod's own class (the leaf's only where the pod is alone there; "shared" or "idle" where
    # several pods hold the leaf), with the allocation's owner labels
    pod_cls = f"max by (namespace,pod,uuid,mig_uuid,class) ({selector('gpulens_pod_gpu_boundness', target)})"
    owned = f"({pod_cls} * on(namespace,pod,uuid,mig_uuid) group_left(workload_kind,workload) {a})"
    hours = f"{win.resolved_step():g} / 3600"
    window = duration(win.window_s)
    return {
        "held": f"sum_over_time({share}{rng}) * {hours}",
        "idle": f"sum_over_time({idle}{rng}) * {hours}",
        "sm_p95": f"quantile_over_time(0.95, {sm}{rng})",
        "sm_mean": f"avg_over_time({sm}{rng})",
        "dram_p95": f"quantile_over_time(0.95, {joined('gpulens_gpu_dram_active_ratio')}{rng})",
        "pcie_p95": f"quantile_over_time(0.95, {joined('gpulens_gpu_pcie_utilization_ratio')}{rng})",
        "nvlink_p95": f"quantile_over_time(0.95, {joined('gpulens_gpu_nvlink_utilization_ratio')}{rng})",
        "mem_peak": f"max_over_time({mem}{rng})",
        "holders": f"max_over_time(({a} * on(uuid,mig_uuid) group_left() {holders}){rng})",
        # share of the pod's held time during which others held the device too
        "shared_share": f"avg_over_time(({a} * on(uuid,mig_uuid) group_left() ({holders} > bool 1)){rng})",
        # share of the held time the pod's own class was each class (a state set: 0 or 1)
        "boundness": f"avg_over_time({owned}{rng})",
        "info": f"max by (uuid,name) (last_over_time({selector('gpulens_gpu_info', target)}[{window}]))",
        "mig": (
            f"max by (mig_uuid,mig_profile) (last_over_time({selector('gpulens_mig_instance_info', target)}[{window}]))"
        ),
    }


DEFAULT_WINDOW = Window()


def evaluate(src: PrometheusSource, queries: Mapping[str, str], win: Window) -> dict[str, pd.DataFrame]:
    """Every query of ``queries`` at the window's end (now when it has none), four at a time: the
    advisor's measurements each send a dozen subqueries that Prometheus evaluates apart.

    Raises SourceError when Prometheus does not answer."""
    at = win.end if win.end is not None else time.time()
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(queries, pool.map(lambda q: src.query(q, at), queries.values()), strict=True))


MEASURED = ("idle", "sm_p95", "sm_mean", "dram_p95", "pcie_p95", "nvlink_p95", "mem_peak", "holders", "shared_share")
"""The per (pod, device) figures of :func:`_queries` joined onto the hours held."""

SHARED_MIN_SHARE = 0.1
"""A device counts as shared when other pods held it too for at least this share of the time the
workload held it. A rolling update's handover (old and new pod listed together for a scrape or two,
or within Prometheus' 5 m lookback of backfilled data) is not sharing."""


def measure(src: PrometheusSource, win: Window = DEFAULT_WINDOW, filters: Filters = NO_FILTERS) -> list[WorkloadUsage]:
    """One WorkloadUsage per (workload, GPU model, MIG profile) seen holding a device in the window.

    Raises SourceError when Prometheus does not answer.
    """
    results = evaluate(src, _queries(filters, win), win)
    held = with_cols(results["held"], KEYS)
    if held.empty:
        return []
    rows = held.rename(columns={"value": "held"})[[*KEYS, "held"]]
    for key in MEASURED:
        df = with_cols(results[key], KEYS).rename(columns={"value": key})[[*KEYS, key]]
        rows = rows.merge(df.drop_duplicates(list(KEYS)), on=list(KEYS), how="left")
    info = with_cols(results["info"], ("uuid", "name"))
    models = dict(zip(info["uuid"], info["name"], strict=True))
    mig = with_cols(results["mig"], ("mig_uuid", "mig_profile"))
    profiles = dict(zip(mig["mig_uuid"], mig["mig_profile"], strict=True))
    rows["model"] = [models.get(u, "") for u in rows["uuid"]]
    rows["profile"] = [profiles.get(m, "") if m else "" for m in rows["mig_uuid"]]
    mixes: dict[tuple[str, ...], dict[str, float]] = {}
    for rec in with_cols(results["boundness"], (*KEYS, "class")).to_dict("records"):
        mixes.setdefault(tuple(str(rec[k]) for k in KEYS), {})[str(rec["class"])] = float(rec["value"])
    rows["mix"] = [mixes.get(tuple(str(r[k]) for k in KEYS), {}) for r in rows.to_dict("records")]
    # a pod without an owner is its own workload
    bare = rows["workload"] == ""
    rows.loc[bare, "workload"] = rows.loc[bare, "pod"]
    rows.loc[bare, "workload_kind"] = "Pod"

    out = []
    for (ns, kind, name, model, profile), g in rows.groupby([*WORKLOAD, "model", "profile"], sort=True):
        weights = g["held"].fillna(0.0)
        total = float(weights.sum())
        mix: dict[str, float] = {}
        for rec, w in zip(g.to_dict("records"), weights, strict=True):
            for cls, v in rec["mix"].items():
                mix[cls] = mix.get(cls, 0.0) + v * float(w) / total if total > 0 else 0.0
        out.append(
            WorkloadUsage(
                namespace=str(ns),
                workload_kind=str(kind),
                workload=str(name),
                gpu_model=str(model),
                mig_profile=str(profile),
                devices=int(g[list(LEAF)].drop_duplicates().shape[0]),
                device_hours_held=total,
                device_hours_idle=float(g["idle"].fillna(0.0).sum()),
                memory_peak_bytes=_max(g["mem_peak"]),
                sm_active_p95=_max(g["sm_p95"]),
                sm_active_mean=_weighted(g["sm_mean"], weights),
                dram_active_p95=_max(g["dram_p95"]),
                pcie_utilization_p95=_max(g["pcie_p95"]),
                nvlink_utilization_p95=_max(g["nvlink_p95"]),
                boundness=mix,
                shared=bool((g["shared_share"].fillna(0.0) >= SHARED_MIN_SHARE).any()),
            )
        )
    return out


def _max(s: pd.Series) -> float | None:
    v = s.max(skipna=True)
    return None if v != v else float(v)


def _weighted(values: pd.Series, weights: pd.Series) -> float | None:
    ok = values.notna() & (weights > 0)
    if not ok.any():
        return None
    return float((values[ok] * weights[ok]).sum() / weights[ok].sum())


def advise(
    src: PrometheusSource,
    win: Window = DEFAULT_WINDOW,
    prices: Mapping[str, float] | None = None,
    policy: Policy = DEFAULT_POLICY,
    filters: Filters = NO_FILTERS,
) -> list[Recommendation]:
    """Measure and recommend: every workload's advice over the window, largest saving first."""
    return recommend_all(measure(src, win, filters), prices, policy)
