"""The one definition of idle, launch-bound, transfer share and wasted GPU-hours, for the rules, the
dashboard and the advisor.

- **Idle leaf** (a whole GPU or a MIG instance) at time t: its mean activity (below: SM activity
  where the GPU has GPM) over the ``MEAN_WINDOW`` before t is below ``IDLE_SM_ACTIVE_BELOW`` *and*
  it did no work that its activity misses in that window. "Did work" = NVML GPU-Util averaged at
  least ``KERNELS_UTIL_AT_LEAST`` (whole GPUs) or a boundness class of ``IN_USE_CLASSES``
  (``launch``, ``transfer``) at any moment (MIG instances too, which have no GPU-Util: for them only
  the class says data moved). The mean SM activity is exact from the integral counter once the
  counter is older than the window, else the mean of the sampled gauge; the busy ratio likewise.
- **Activity** of a leaf, at the precision its GPU allows (``gpulens_gpu_analysis_info{signals}``):
  its mean SM activity (GPM: Hopper and newer); without GPM its mean busy ratio (NVML GPU-Util,
  or the busiest link's utilisation where larger: pre-Hopper whole GPUs, ``signals="nvml"``);
  for a MIG instance without GPM (A100), which has no GPU-Util, 1 if a compute process ran on it
  in the window, else 0 (``signals="processes"``). Idle and under-used read this one figure, so a
  leaf without GPM gets the same verdicts, coarser: GPU-Util counts the time any kernel ran, so a
  kernel on one SM of 108 reads 100 %, and a process holding a MIG instance counts as use.
- **Launch-bound** is not idle: a stream of tiny kernels keeps SM activity near 0 while the GPU is
  in use. It is a misuse of its own kind (alert ``GPULaunchBound``, class ``launch``).
- **Transfer-bound** is not idle either: a leaf whose links (PCIe, NVLink) are busy while its SMs
  wait (class ``transfer``; e.g. a loop copying pinned host memory at ~51.5 GB/s reads SM activity
  0) is limited by its link, not oversized. Its **transfer share**
  (``gpulens:gpu_transfer:ratio_avg5m``) is the fraction of the ``MEAN_WINDOW`` its class was
  ``transfer``; the ``GPUUnderutilized`` alert counts it as use beside SM activity.
- **Wasted GPU-hours** of a container: the time its leaf was idle while allocated to it, times
  the container's share of the leaf (the time-slicing replicas it holds over all replicas held on
  the leaf; 1 for an exclusive device), times the leaf's share of a physical GPU
  (:func:`gpu_share`: a MIG instance weighs its compute slices over the GPU's, ``3g.71gb`` on an
  H200 = 3/7; a whole GPU 1). Integrated every ``WASTE_RESOLUTION_SECONDS``.

The recording rules (deploy/rules/gpulens.rules.yml) are generated from this module and
dashboard/jobs.py by ``python scripts/gen_rules.py``: ``RULES`` (per leaf), ``POD_RULES`` (per
container), ``NAMESPACE_RULES`` and the alert conditions below (``*_alert_promql``) are their
``expr`` fields, and tests/test_rules_generated.py fails when the committed file is stale. In
Prometheus mode the dashboard reads those recorded series; the advisor, which
must also work on history recorded before the rules were loaded, inlines the same PromQL
(:func:`leaf_idle_promql`); scrape mode computes the same thing in pandas (:func:`leaf_idle_frame`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from dashboard.promql import selector

IDLE_SM_ACTIVE_BELOW = 0.01
"""Mean SM activity (0..1) below which a leaf is idle (unless it ran kernels)."""
KERNELS_UTIL_AT_LEAST = 0.05
"""Mean NVML GPU-Util (0..1) at or above which a GPU ran kernels, whatever its SM activity."""
MEAN_WINDOW = "5m"
MEAN_WINDOW_SECONDS = 300.0
"""The window of both means above."""
LAUNCH_CLASS = "launch"
TRANSFER_CLASS = "transfer"
COMMUNICATION_CLASS = "communication"
"""The class of a leaf spinning in a collective, waiting on its peers or the network (docs/network.md)."""
IN_USE_CLASSES: tuple[str, ...] = (LAUNCH_CLASS, TRANSFER_CLASS)
"""Boundness classes that mean the leaf is in use whatever its SM activity reads: ``launch`` (tiny
kernels back to back) and ``transfer`` (its links busy while the SMs idle or wait)."""
UNKNOWN_CLASS = "unknown"
"""Shown for a series with no boundness class (no GPM to classify with); not an exporter class."""
WASTE_RESOLUTION_SECONDS = 60.0
"""Step at which wasted GPU-hours are integrated (the rule's ``[1h:1m]`` subquery)."""
COMPUTE_SLICES = 7
"""Compute slices of a MIG-capable GPU (A100, H100, H200, B200...)."""
COMPUTE_SLICES_BY_MODEL: Mapping[str, int] = {"A30": 4}
"""Models divided into another number of compute slices (substring of the NVML name)."""

WINDOW_AGE_RESOLUTION_SECONDS = 5.0
"""How precisely a series' age in the window is read (Prometheus: the step of the subquery that
finds its first sample; scrape mode reads every scrape). A verdict over ``MEAN_WINDOW`` is given
once its series are ``MEAN_WINDOW_SECONDS`` minus this old (:func:`window_full`)."""
LEAF_HISTORY_METRIC = "gpulens_gpu_memory_total_bytes"
"""The series whose age is a leaf's history (one per whole GPU and MIG instance, from the first
scrape on, whatever the GPU can measure)."""
POD_HISTORY_METRIC = "gpulens_pod_gpu_allocation"
"""The series whose age is how long a pod has held a leaf (a job's verdicts wait for it)."""


def window_full(age_s: float, window_s: float = MEAN_WINDOW_SECONDS) -> bool:
    """True when a series ``age_s`` seconds old fills a verdict's window: the verdict is given.
    Until then it is *collecting*, as an alert waits out its ``for:`` (a mean over the seconds
    there are would flip as they grow: a job at 14 s called communication-bound, at 5 m not)."""
    return bool(age_s == age_s and age_s >= window_s - WINDOW_AGE_RESOLUTION_SECONDS)


def collecting_words(age_s: float, window_s: float = MEAN_WINDOW_SECONDS) -> str:
    """A verdict still collecting its window, in words: ``collecting (14 s of 5 m)``."""
    held = 0.0 if age_s != age_s else max(0.0, min(age_s, window_s))
    return f"collecting ({_span(held)} of {_span(window_s)})"


def _span(seconds: float) -> str:
    """``14 s``, ``2 m 05 s``, ``5 m``: a span of the window as the collecting words write it."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    m, rest = divmod(s, 60)
    return f"{m} m {rest:02d} s" if rest else f"{m} m"


def window_age_promql(series: str, by: Sequence[str], at: float | None) -> str:
    """Seconds (capped at ``MEAN_WINDOW_SECONDS``) of history of ``series`` (a selector) per ``by``
    in the ``MEAN_WINDOW`` before ``at`` (Unix s; ``None``: the query's own evaluation time,
    ``time()``, as a Grafana panel reads it): ``at`` minus the first subquery step at which it had a
    sample, to within ``WINDOW_AGE_RESOLUTION_SECONDS``. A series older than the window reads the
    whole window (its sample before the window is within the lookback of the first step)."""
    step = f"{WINDOW_AGE_RESOLUTION_SECONDS:g}s"
    labels = ", ".join(by)
    first = f"min_over_time(timestamp(max by ({labels}) ({series}))[{MEAN_WINDOW}:{step}])"
    now = "time()" if at is None else f"{at:.3f}"
    return f"clamp_max({now} - {first}, {MEAN_WINDOW_SECONDS!r})"


def window_full_promql(series: str, by: Sequence[str]) -> str:
    """The ``by`` groups of ``series`` whose history fills a verdict's window now: :func:`window_full`
    in PromQL, for a Grafana panel (the series' value is their age in seconds)."""
    return f"({window_age_promql(series, by, None)} >= {MEAN_WINDOW_SECONDS - WINDOW_AGE_RESOLUTION_SECONDS!r})"


def window_ages_frame(samples: pd.DataFrame, by: Sequence[str], at: float) -> pd.DataFrame:
    """:func:`window_age_promql` in pandas: per ``by``, ``age_s`` = ``at`` minus the first sample's
    time (``samples``: raw rows with ``by`` and ``timestamp``, read from a little before the
    window so that a series older than it reads the whole window), capped at the window."""
    cols = [*by, "age_s"]
    if samples.empty:
        return pd.DataFrame(columns=cols)
    s = _leafy(samples, by)
    first = s.groupby(list(by), as_index=False)["timestamp"].min()
    first["age_s"] = (at - first["timestamp"].astype(float)).clip(lower=0.0, upper=MEAN_WINDOW_SECONDS)
    return first[cols].reset_index(drop=True)


WASTE_RULE_WINDOW_SECONDS = 3600.0
"""Window of ``namespace:gpulens_gpu_wasted_hours:sum1h``: the wasted GPU-hours of the last hour."""
UNDERUSED_ACTIVITY_BELOW = 0.2
"""Mean activity (0..1) over ``UNDERUSED_WINDOW`` below which a held leaf is under-used
(``GPUUnderutilized``), unless activity plus transfer share reaches it."""
UNDERUSED_WINDOW = "6h"
LAUNCH_BOUND_SHARE_ABOVE = 0.8
"""Share (0..1) of the rule evaluations of ``LAUNCH_BOUND_WINDOW`` in which a pod's own class was
``launch`` above which it is launch-bound (``GPULaunchBound``)."""
LAUNCH_BOUND_WINDOW = "10m"

PROBE_SLOW_EFFICIENCY_BELOW = 0.85
"""A bandwidth probe result below this share of the model's expected bandwidth is slow: the Health
page flags it and ``GPUMemoryBandwidthDegraded`` fires when three runs in a row are
(:func:`probe_degraded_alert_promql`)."""
PROBE_SLOW_RUNS = 3
PROBE_SLOW_WINDOW = "3h"
"""Window in which ``PROBE_SLOW_RUNS`` runs (one an hour by default) must all have been slow."""


def counter_events_promql(series: str, window: str) -> str:
    """How many events a counter ``series`` (a selector) counted in the last ``window``, the first
    one included: ``increase()``, or the whole count of a series that did not exist ``window`` ago
    (the exporter creates an Xid code's counter at its first event, and ``increase()`` misses a series'
    first sample), only where the target was scraped then (so a new Prometheus does not count an
    old exporter's whole history). The ``GPUXidError`` warning alert reads the same."""
    return (
        f"(increase({series}[{window}]) or (({series} unless {series} offset {window}) "
        f"and on (instance, job) (up offset {window} == 1)))"
    )


EXPORTERS_DOWN_PROMQL = "up == 0 and on (job, instance) gpulens:exporter_target:info"
"""Scrape targets known to be gpulens exporters (whatever the job is called) that Prometheus cannot
scrape now: the ``GPUExporterDown`` alert's ``scrape_failed`` case and the dashboard's banner."""


LEAF = ("uuid", "mig_uuid")

KERNEL_TIME_METRICS = ("gpulens_pod_gpu_kernel_time_ratio", "gpulens_pod_gpu_sm_share_ratio")
"""The per-process figure (share of sampled time a kernel of the pod's processes ran, NVML
per-process utilisation), by its name and then its deprecated one: the pages read the first that an
exporter exports (dashboard.ui.kernel_time), so they work against exporters from before the rename."""
_SLICES = re.compile(r"^(\d+)g\.")


def compute_slices(model: str) -> int:
    """Compute slices a GPU of NVML name ``model`` divides into."""
    upper = model.upper()
    return next((n for key, n in COMPUTE_SLICES_BY_MODEL.items() if key in upper), COMPUTE_SLICES)


def gpu_share(mig_profile: str, model: str = "") -> float:
    """Share of a physical GPU a leaf weighs in GPU-hours: 1 for a whole GPU (``""``), the MIG
    profile's compute slices over the GPU's (``3g.71gb`` -> 3/7); an unknown shape counts whole."""
    m = _SLICES.match(mig_profile or "")
    if not m:
        return 1.0
    return min(1.0, int(m.group(1)) / compute_slices(model))


# --- PromQL --------------------------------------------------------------------------------
def _sel(metric: str, matchers: Mapping[str, str] | None, extra: Mapping[str, str] | None = None) -> str:
    return selector(metric, {**(matchers or {}), **(extra or {})})


def _integral_mean_promql(counter: str, gauge: str) -> str:
    """A ratio's mean over MEAN_WINDOW: exact from its integral ``counter`` once the counter is a
    window old (rate() of a younger one reads its growth over the whole window), else the mean of
    the sampled ``gauge``."""
    w = MEAN_WINDOW
    return f"(rate({counter}[{w}]) and {counter} and {counter} offset {w}) or (avg_over_time({gauge}[{w}]) and {gauge})"


def sm_mean_promql(matchers: Mapping[str, str] | None = None) -> str:
    """Mean SM activity of each leaf over MEAN_WINDOW (``gpulens:gpu_sm_active:ratio_avg5m``)."""
    return _integral_mean_promql(
        _sel("gpulens_gpu_sm_active_seconds_total", matchers), _sel("gpulens_gpu_sm_active_ratio", matchers)
    )


def busy_mean_promql(matchers: Mapping[str, str] | None = None) -> str:
    """Mean busy ratio of each leaf over MEAN_WINDOW, as :func:`sm_mean_promql` does for SM activity."""
    return _integral_mean_promql(
        _sel("gpulens_gpu_busy_seconds_total", matchers), _sel("gpulens_gpu_busy_ratio", matchers)
    )


def activity_mean_promql(matchers: Mapping[str, str] | None = None) -> str:
    """Each leaf's mean activity over MEAN_WINDOW (``gpulens:gpu_activity:ratio_avg5m``; the module
    docstring): SM activity where the leaf has it, else its busy ratio, else (a MIG instance without
    GPM) 1 if it ran a compute process in the window and 0 if not."""
    sm = f"{_sel('gpulens_gpu_sm_active_ratio', matchers)} or {_sel('gpulens_gpu_sm_active_seconds_total', matchers)}"
    busy = f"{_sel('gpulens_gpu_busy_ratio', matchers)} or {_sel('gpulens_gpu_busy_seconds_total', matchers)}"
    procs = _sel("gpulens_gpu_compute_processes", matchers)
    ran = f"(max_over_time({procs}[{MEAN_WINDOW}]) > bool 0 and {procs})"
    return (
        f"({sm_mean_promql(matchers)})"
        f" or (({busy_mean_promql(matchers)}) unless on (uuid, mig_uuid) ({sm}))"
        f" or ({ran} unless on (uuid, mig_uuid) ({sm} or {busy}))"
    )


def util_mean_promql(matchers: Mapping[str, str] | None = None) -> str:
    """Mean NVML GPU-Util over MEAN_WINDOW (``gpulens:gpu_utilization:ratio_avg5m``)."""
    util = _sel("gpulens_gpu_utilization_ratio", matchers)
    return f"avg_over_time({util}[{MEAN_WINDOW}]) and {util}"


def kernels_active_promql(util_mean: str, matchers: Mapping[str, str] | None = None) -> str:
    """1 if the leaf was in use in the window by a signal other than SM activity, else 0
    (``gpulens:gpu_kernels_active:bool``, a name kept for its users): GPU-Util at the threshold, or
    a class of ``IN_USE_CLASSES`` at any moment (kernels launched, or data moved over its links);
    ``util_mean`` is the GPU-Util mean's expression."""
    in_use = _regex_sel("gpulens_gpu_boundness", matchers, "class", "|".join(IN_USE_CLASSES))
    return (
        f"max by (cluster, uuid, mig_uuid) (({util_mean} >= bool {KERNELS_UTIL_AT_LEAST!r})"
        f" or max_over_time({in_use}[{MEAN_WINDOW}]))"
    )


def transfer_share_promql(matchers: Mapping[str, str] | None = None) -> str:
    """Fraction (0..1) of the last MEAN_WINDOW each leaf's class was ``transfer``
    (``gpulens:gpu_transfer:ratio_avg5m``); absent for a leaf without a class (no GPM). The class
    label is dropped: the name says which class."""
    transfer = _sel("gpulens_gpu_boundness", matchers, {"class": TRANSFER_CLASS})
    return f"max without (class) (avg_over_time({transfer}[{MEAN_WINDOW}]) and {transfer})"


_POD_LEAF = "cluster, namespace, pod, container, uuid, mig_uuid"


def communication_share_promql(matchers: Mapping[str, str] | None = None) -> str:
    """Each pod's **communication share** (``gpulens:pod_gpu_communication:ratio_avg5m``, 0..1): the
    mean over the pod's leaves of the fraction of the last MEAN_WINDOW each leaf was in class
    ``communication`` (spinning in a collective); absent for a pod whose leaves have no class (no
    GPM). Labels cluster, namespace, pod, workload_kind, workload. :func:`communication_share_frame`
    computes the same from per-series means."""
    comm = _sel("gpulens_pod_gpu_boundness", matchers, {"class": COMMUNICATION_CLASS})
    alloc = _sel("gpulens_pod_gpu_allocation", matchers)
    return (
        "avg by (cluster, namespace, pod, workload_kind, workload) ("
        f"(avg_over_time({comm}[{MEAN_WINDOW}]) and {comm})"
        f" * on ({_POD_LEAF}) group_left (workload_kind, workload)"
        f" max by ({_POD_LEAF}, workload_kind, workload) ({alloc}))"
    )


def idle_promql(sm_mean: str, kernels_active: str) -> str:
    """1 if the leaf is idle, 0 if busy (``gpulens:gpu_idle:bool``), from the two expressions."""
    below = f"({sm_mean} < bool {IDLE_SM_ACTIVE_BELOW!r})"
    return f"({below} * on (uuid, mig_uuid) group_left () ({kernels_active} == bool 0)) or {below}"


def leaf_idle_promql(matchers: Mapping[str, str] | None = None) -> str:
    """``gpulens:gpu_idle:bool`` computed from raw exporter series (for the advisor)."""
    return idle_promql(
        f"({activity_mean_promql(matchers)})", kernels_active_promql(f"({util_mean_promql(matchers)})", matchers)
    )


def _regex_sel(metric: str, matchers: Mapping[str, str] | None, label: str, regex: str) -> str:
    """``metric{matchers..., label=~"regex"}`` (``regex`` is a trusted constant of this module)."""
    base = _sel(metric, matchers)
    inner = base[base.index("{") + 1 : -1] + "," if base.endswith("}") else ""
    return f'{metric}{{{inner}{label}=~"{regex}"}}'


def _profile_re(slices: int) -> str:
    """PromQL regex (as written inside a double-quoted string) for profiles named ``<slices>g.*``."""
    return f"{slices}g" + "\\\\" + "..*"


def gpu_share_promql(matchers: Mapping[str, str] | None = None) -> str:
    """Each leaf's share of a physical GPU (``gpulens:leaf_gpu_share:ratio``), as :func:`gpu_share`:
    MIG instances by the compute slices in their profile name; whole GPUs, unknown shapes and
    instances whose GPU's model is unknown 1."""
    mig = _sel("gpulens_mig_instance_info", matchers)
    info = _sel("gpulens_gpu_info", matchers)
    slices = " or ".join(
        "max by (cluster, uuid, mig_uuid) "
        f"({_regex_sel('gpulens_mig_instance_info', matchers, 'mig_profile', _profile_re(n))}) * {n}"
        for n in range(1, COMPUTE_SLICES + 1)
    )
    totals = " or ".join(
        [
            *(
                f"max by (uuid) ({_regex_sel('gpulens_gpu_info', matchers, 'name', f'(?i).*{key}.*')}) * {n}"
                for key, n in COMPUTE_SLICES_BY_MODEL.items()
            ),
            f"max by (uuid) ({info}) * {COMPUTE_SLICES}",
        ]
    )
    alloc = _sel("gpulens_pod_gpu_allocation", matchers)
    return (
        f"clamp_max(({slices}) / on (uuid) group_left () ({totals}), 1)"
        f" or max by (cluster, uuid, mig_uuid) ({mig}) * 0 + 1"
        f" or max by (cluster, uuid, mig_uuid) ({alloc}) * 0 + 1"
    )


POD_KEYS = (
    "cluster",
    "namespace",
    "pod",
    "container",
    "workload_kind",
    "workload",
    "uuid",
    "mig_uuid",
    "instance",
    "node",
)
"""Labels of the per-container recorded series. ``cluster`` is kept where the series have it (a
store holding several clusters: docs/capacity.md); on a Prometheus that has no such label the
``by`` clause simply yields none."""


def holding_share_promql(allocation: str) -> str:
    """Each container's share of its leaf (``gpulens:pod_gpu_holding:ratio``): the allocation
    series (one per replica) it holds over all held on the leaf; ``allocation`` is the selector."""
    keys = ", ".join(POD_KEYS)
    return (
        f"count by ({keys}) ({allocation}) / on (uuid, mig_uuid) group_left () count by (uuid, mig_uuid) ({allocation})"
    )


def wasted_promql(holding: str, idle: str, share: str) -> str:
    """GPU-equivalents a container wastes now (``gpulens:pod_gpu_wasted:gpus``): holding share x
    idle (0/1) x the leaf's GPU share; integrate over time for GPU-hours."""
    return (
        f"{holding} * on (uuid, mig_uuid) group_left () max by (uuid, mig_uuid) ({idle})"
        f" * on (uuid, mig_uuid) group_left () max by (uuid, mig_uuid) ({share})"
    )


def pod_leaf_promql(leaf: str) -> str:
    """A per-leaf figure ``leaf`` (an expression with uuid, mig_uuid) on every container holding the
    leaf: labels POD_KEYS plus the leaf's ``gpu`` and ``mig_profile`` (``gpulens:pod_gpu_*`` records)."""
    keys = ", ".join(POD_KEYS)
    return (
        f"max by ({keys}) (gpulens_pod_gpu_allocation)"
        f" * on (uuid, mig_uuid) group_left (gpu, mig_profile) max by (uuid, mig_uuid, gpu, mig_profile) ({leaf})"
    )


def pod_class_promql() -> str:
    """A **pod's class** on each leaf it holds (``gpulens:pod_gpu_boundness:class``, value 1): the
    exporter's ``gpulens_pod_gpu_boundness`` (the leaf's class while the pod is alone there,
    ``shared`` where several pods run on it, ``idle`` for a pod with no process on a leaf others
    use), with the routing labels of its allocation and the leaf's ``gpu`` and ``mig_profile``."""
    holder = "namespace, pod, container, uuid, mig_uuid"
    routing = ", ".join(k for k in POD_KEYS if k not in holder.split(", "))
    own = (
        f"(max by ({holder}, class) (gpulens_pod_gpu_boundness == 1)"
        f" * on ({holder}) group_left ({routing})"
        f" max by ({', '.join(POD_KEYS)}) (gpulens_pod_gpu_allocation))"
    )
    leaf = "max by (uuid, mig_uuid, gpu, mig_profile) (gpulens_gpu_boundness)"
    return f"{own} * on (uuid, mig_uuid) group_left (gpu, mig_profile) {leaf}"


def prom_duration(seconds: float) -> str:
    """A PromQL duration in its largest whole unit: 3600 -> ``1h``, 60 -> ``1m``, 90 -> ``90s``."""
    s = max(1, round(seconds))
    for unit, size in (("h", 3600), ("m", 60)):
        if s % size == 0:
            return f"{s // size}{unit}"
    return f"{s}s"


_NAMESPACE_LEAVES = "max by (cluster, namespace, uuid, mig_uuid) (gpulens:pod_gpu_idle:bool)"
"""One series per (namespace, leaf) allocated: a time-sliced leaf two pods of a namespace share once."""


def namespace_wasted_hours_promql() -> str:
    """``namespace:gpulens_gpu_wasted_hours:sum1h``: ``gpulens:pod_gpu_wasted:gpus`` integrated over
    the last WASTE_RULE_WINDOW_SECONDS at a fixed WASTE_RESOLUTION_SECONDS (a subquery, so the
    figure does not depend on the evaluation interval), in GPU-hours."""
    window = f"[{prom_duration(WASTE_RULE_WINDOW_SECONDS)}:{prom_duration(WASTE_RESOLUTION_SECONDS)}]"
    steps_per_hour = 3600.0 / WASTE_RESOLUTION_SECONDS
    return f"sum by (cluster, namespace) (sum_over_time(gpulens:pod_gpu_wasted:gpus{window})) / {steps_per_hour:g}"


def allocated_idle_alert_promql() -> str:
    """The ``GPUAllocatedButIdle`` condition: a container's leaf idle by the one verdict
    (``gpulens:pod_gpu_idle:bool``; a launch- or transfer-bound leaf is in use) with its activity
    under the idle threshold."""
    return f"gpulens:pod_gpu_activity:ratio_avg5m < {IDLE_SM_ACTIVE_BELOW!r} and gpulens:pod_gpu_idle:bool == 1"


def underused_alert_promql() -> str:
    """The ``GPUUnderutilized`` condition: a container's mean activity over UNDERUSED_WINDOW under
    UNDERUSED_ACTIVITY_BELOW (held the whole window), unless activity plus its transfer share
    reaches it (a transfer-bound pod is limited by its link). A leaf without a class has no transfer
    share: the sum is absent, ``unless`` removes nothing and activity alone decides."""
    w, below = UNDERUSED_WINDOW, UNDERUSED_ACTIVITY_BELOW
    activity = "gpulens:pod_gpu_activity:ratio_avg5m"
    return (
        f"(avg_over_time({activity}[{w}]) < {below!r} and {activity} and {activity} offset {w})"
        f" unless (avg_over_time({activity}[{w}]) + avg_over_time(gpulens:pod_gpu_transfer:ratio_avg5m[{w}])"
        f" >= {below!r})"
    )


def launch_bound_alert_promql() -> str:
    """The ``GPULaunchBound`` condition: the pod's own class (``gpulens:pod_gpu_boundness:class``) was
    ``launch`` in over LAUNCH_BOUND_SHARE_ABOVE of the evaluations of LAUNCH_BOUND_WINDOW."""
    w = LAUNCH_BOUND_WINDOW
    own = "gpulens:pod_gpu_boundness:class"
    return (
        f'(sum without (class) (count_over_time({own}{{class="{LAUNCH_CLASS}"}}[{w}]))'
        f" / sum without (class) (count_over_time({own}[{w}]))) > {LAUNCH_BOUND_SHARE_ABOVE!r}"
    )


def probe_degraded_alert_promql() -> str:
    """The ``GPUMemoryBandwidthDegraded`` condition: PROBE_SLOW_RUNS probe runs in a row slow, from
    cached gauges: the last-success timestamp changed PROBE_SLOW_RUNS - 1 times within
    PROBE_SLOW_WINDOW (the value at the window's start is one more run) and the best efficiency of
    them all is under PROBE_SLOW_EFFICIENCY_BELOW."""
    w = PROBE_SLOW_WINDOW
    return (
        f"max_over_time(gpulens_probe_efficiency_ratio[{w}]) < {PROBE_SLOW_EFFICIENCY_BELOW!r}"
        f" and changes(gpulens_probe_last_success_timestamp_seconds[{w}]) >= {PROBE_SLOW_RUNS - 1}"
        " and gpulens_probe_efficiency_ratio"
    )


RULES: Mapping[str, str] = {
    "gpulens:gpu_sm_active:ratio_avg5m": sm_mean_promql(),
    "gpulens:gpu_activity:ratio_avg5m": activity_mean_promql(),
    "gpulens:gpu_utilization:ratio_avg5m": util_mean_promql(),
    "gpulens:gpu_kernels_active:bool": kernels_active_promql("gpulens:gpu_utilization:ratio_avg5m"),
    "gpulens:gpu_transfer:ratio_avg5m": transfer_share_promql(),
    "gpulens:pod_gpu_communication:ratio_avg5m": communication_share_promql(),
    # from raw series, not from the rules above: a rule reading another rule's output lags it by
    # an evaluation (more when backfilled), and the dashboard's scrape mode and the advisor, which
    # compute from raw series, would then disagree with it at every transition
    "gpulens:gpu_idle:bool": leaf_idle_promql(),
    "gpulens:leaf_gpu_share:ratio": gpu_share_promql(),
    "gpulens:pod_gpu_holding:ratio": holding_share_promql("gpulens_pod_gpu_allocation"),
    "gpulens:pod_gpu_wasted:gpus": wasted_promql(
        holding_share_promql("gpulens_pod_gpu_allocation"), leaf_idle_promql(), gpu_share_promql()
    ),
}
"""Per-leaf recording rule name -> its expression (scripts/gen_rules.py writes it into the file)."""

POD_RULES: Mapping[str, str] = {
    "gpulens:pod_gpu_sm_active:ratio_avg5m": pod_leaf_promql("gpulens:gpu_sm_active:ratio_avg5m"),
    "gpulens:pod_gpu_activity:ratio_avg5m": pod_leaf_promql("gpulens:gpu_activity:ratio_avg5m"),
    "gpulens:pod_gpu_transfer:ratio_avg5m": pod_leaf_promql("gpulens:gpu_transfer:ratio_avg5m"),
    "gpulens:pod_gpu_idle:bool": pod_leaf_promql("gpulens:gpu_idle:bool"),
    "gpulens:pod_gpu_boundness:class": pod_class_promql(),
}
"""Per-container recording rule name -> its expression: a leaf's figures on the containers holding it."""

NAMESPACE_RULES: Mapping[str, str] = {
    "namespace:gpulens_gpus_allocated:count": f"count by (cluster, namespace) ({_NAMESPACE_LEAVES})",
    "namespace:gpulens_gpus_busy:count": f"count by (cluster, namespace) ({_NAMESPACE_LEAVES} == 0)",
    "namespace:gpulens_gpus_idle:count": f"count by (cluster, namespace) ({_NAMESPACE_LEAVES} == 1)",
    "namespace:gpulens_gpu_wasted_hours:sum1h": namespace_wasted_hours_promql(),
}
"""Per-namespace recording rule name -> its expression: allocated, busy and idle leaves, wasted GPU-hours."""


# --- pandas (scrape mode) ------------------------------------------------------------------
def _window_stats(
    raw: pd.DataFrame, keys: list[str], grid: np.ndarray, window_s: float, fresh_s: float
) -> pd.DataFrame:
    """Per key and grid time t: mean, max and count of the samples in (t - window_s, t], the
    first/last sample (time, value) in it, and whether the newest sample is within ``fresh_s``.

    Vectorised over keys and times (a fleet has thousands of leaves and hundreds of steps): the
    samples are sorted by (key, time) into one array, each window found by one searchsorted, sums
    from per-key cumulative sums, maxima by one ``maximum.reduceat``."""
    cols = [*keys, "timestamp", "mean", "max", "n", "t0", "v0", "t1", "v1", "fresh"]
    grid = np.asarray(grid, dtype=float)
    if raw.empty or not len(grid):
        return pd.DataFrame(columns=cols).astype({"timestamp": float, "fresh": bool})
    df = raw.assign(_g=raw.groupby(keys, sort=False).ngroup())
    df = df[df["_g"] >= 0].sort_values(["_g", "timestamp"], kind="stable")
    code = df["_g"].to_numpy(dtype=np.int64)
    ts = df["timestamp"].to_numpy(dtype=float)
    vs = df["value"].to_numpy(dtype=float)
    first = df.drop_duplicates("_g")
    n_groups = len(first)
    # one sorted axis: key code * span + time since base, so a window never crosses keys
    base = min(float(ts.min()), float(grid.min()) - window_s)
    span = max(float(ts.max()), float(grid.max())) - base + 1.0
    axis = code * span + (ts - base)
    g = np.arange(n_groups, dtype=np.int64)[:, None] * span
    hi = np.searchsorted(axis, g + (grid[None, :] - base), side="right")
    lo = np.searchsorted(axis, g + (grid[None, :] - window_s - base), side="right")
    n = hi - lo
    gi, ti = np.nonzero(n > 0)
    lo, hi, n = lo[gi, ti], hi[gi, ti], n[gi, ti]
    # one reduceat per statistic: each window [lo, hi) reduced as ndarray.sum/max would
    bounds = np.stack([lo, hi], axis=1).ravel()
    mean = np.add.reduceat(np.append(vs, 0.0), bounds)[::2] / n
    peaks = np.maximum.reduceat(np.append(vs, -np.inf), bounds)[::2]
    out = first[keys].iloc[gi].reset_index(drop=True)
    out["timestamp"] = grid[ti]
    out["mean"] = mean
    out["max"] = peaks
    out["n"] = n
    out["t0"], out["v0"] = ts[lo], vs[lo]
    out["t1"], out["v1"] = ts[hi - 1], vs[hi - 1]
    out["fresh"] = grid[ti] - ts[hi - 1] <= fresh_s
    return out[cols].astype({"timestamp": float, "fresh": bool})


def _integral_mean_frame(
    ratio: pd.DataFrame, seconds: pd.DataFrame, keys: list[str], grid: np.ndarray, fresh_s: float
) -> pd.DataFrame:
    """Per key and grid time, ``mean``: the ratio's mean over MEAN_WINDOW, from the integral counter
    where it spans the whole window (its increase over the covered time), else from the gauge's
    samples (:func:`_integral_mean_promql`); only where a sample is within ``fresh_s``."""
    gauge = _window_stats(_leafy(ratio, keys), keys, grid, MEAN_WINDOW_SECONDS, fresh_s)
    gauge = gauge[gauge["fresh"]][[*keys, "timestamp", "mean"]]
    counter = _window_stats(_leafy(seconds, keys), keys, grid, MEAN_WINDOW_SECONDS, fresh_s)
    # rate() needs two samples, and the rule wants the counter to exist a whole window ago
    born = _leafy(seconds, keys).groupby(keys, as_index=False)["timestamp"].min().rename(columns={"timestamp": "born"})
    counter = counter.merge(born, on=keys, how="left")
    counter = counter[
        counter["fresh"] & (counter["n"] >= 2) & (counter["born"] <= counter["timestamp"] - MEAN_WINDOW_SECONDS)
    ]
    counter = counter.assign(rate=(counter["v1"] - counter["v0"]) / (counter["t1"] - counter["t0"]))
    out = gauge.merge(counter[[*keys, "timestamp", "rate"]], on=[*keys, "timestamp"], how="outer")
    out["mean"] = out["rate"].where(out["rate"].notna(), out["mean"])
    return out.dropna(subset=["mean"])[[*keys, "timestamp", "mean"]]


def _present(frames_: Sequence[pd.DataFrame], keys: list[str], grid: np.ndarray, fresh_s: float) -> pd.DataFrame:
    """(key, grid time) pairs at which any of ``frames_`` has a sample within ``fresh_s``: the
    rules' ``unless on (uuid, mig_uuid) (x or y)``."""
    parts = []
    for df in frames_:
        stats = _window_stats(_leafy(df, keys), keys, grid, fresh_s, fresh_s)
        parts.append(stats[stats["fresh"]][[*keys, "timestamp"]])
    return pd.concat(parts).drop_duplicates() if parts else pd.DataFrame(columns=[*keys, "timestamp"])


def _unless(df: pd.DataFrame, present: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    if df.empty or present.empty:
        return df
    marked = df.merge(present.drop_duplicates().assign(_p=True), on=[*keys, "timestamp"], how="left")
    return df[~marked["_p"].fillna(False).astype(bool).to_numpy()]


def leaf_idle_frame(
    sm_ratio: pd.DataFrame,
    sm_seconds: pd.DataFrame,
    util: pd.DataFrame,
    boundness: pd.DataFrame,
    grid: np.ndarray,
    fresh_s: float,
    busy_ratio: pd.DataFrame | None = None,
    busy_seconds: pd.DataFrame | None = None,
    processes: pd.DataFrame | None = None,
    keys: Sequence[str] = LEAF,
) -> pd.DataFrame:
    """``gpulens:gpu_idle:bool`` in pandas: per leaf and grid time, ``sm_mean`` (the leaf's mean
    activity: SM activity where it has GPM, else its busy ratio, else 1/0 for compute processes
    in the window; :func:`activity_mean_promql`) and ``idle`` (bool).

    Inputs are raw samples (labels + timestamp + value, one row per scrape; ``boundness`` needs the
    series of the ``IN_USE_CLASSES`` only, others are ignored); a leaf counts at t only if its
    series was scraped within ``fresh_s`` of t (the rules' ``and x``: a stale leaf drops out).
    ``keys``: the columns that name a leaf (a caller may pass one integer code per leaf instead
    of the two UUID strings: grouping integers is several times faster over a fleet's window).
    """
    keys = list(keys)
    cols = [*keys, "timestamp", "sm_mean", "idle"]
    empty = pd.DataFrame()
    busy_ratio = empty if busy_ratio is None else busy_ratio
    busy_seconds = empty if busy_seconds is None else busy_seconds
    processes = empty if processes is None else processes
    if all(df.empty for df in (sm_ratio, sm_seconds, busy_ratio, busy_seconds, processes)):
        return pd.DataFrame(columns=cols)
    sm = _integral_mean_frame(sm_ratio, sm_seconds, keys, grid, fresh_s)
    has_sm = _present([sm_ratio, sm_seconds], keys, grid, fresh_s)
    busy = _unless(_integral_mean_frame(busy_ratio, busy_seconds, keys, grid, fresh_s), has_sm, keys)
    ran = _window_stats(_leafy(processes, keys), keys, grid, MEAN_WINDOW_SECONDS, fresh_s)
    ran = ran[ran["fresh"]].assign(mean=lambda d: (d["max"] > 0).astype(float))[[*keys, "timestamp", "mean"]]
    ran = _unless(ran, pd.concat([has_sm, _present([busy_ratio, busy_seconds], keys, grid, fresh_s)]), keys)
    activity = pd.concat([sm, busy, ran], ignore_index=True).rename(columns={"mean": "sm_mean"})
    util_stats = _window_stats(_leafy(util, keys), keys, grid, MEAN_WINDOW_SECONDS, fresh_s)
    util_stats = util_stats[util_stats["fresh"]]
    busy_util = util_stats.assign(k=util_stats["mean"] >= KERNELS_UTIL_AT_LEAST)[[*keys, "timestamp", "k"]]
    b = _leafy(boundness, keys)
    b = b[b["class"].isin(IN_USE_CLASSES)] if "class" in b.columns else b.iloc[0:0]
    # the in-use classes' series of a leaf pool into one window (keyed by leaf, not class): any
    # sample at 1 counts, and no freshness test, as max_over_time in the rule
    in_use = _window_stats(b, keys, grid, MEAN_WINDOW_SECONDS, np.inf)
    in_use = in_use.assign(k=in_use["max"] >= 1)[[*keys, "timestamp", "k"]]
    kernels = pd.concat([busy_util, in_use]).groupby([*keys, "timestamp"], as_index=False)["k"].max()
    activity = activity.merge(kernels, on=[*keys, "timestamp"], how="left")
    k = activity["k"].astype("boolean").fillna(False).astype(bool)
    activity["idle"] = (activity["sm_mean"] < IDLE_SM_ACTIVE_BELOW) & ~k
    return activity[cols].reset_index(drop=True)


def _leafy(df: pd.DataFrame, keys: Sequence[str] = LEAF) -> pd.DataFrame:
    """``df`` with the ``keys``, ``timestamp`` and ``value`` columns it lacks (keys ``""``)."""
    missing = [c for c in (*keys, "timestamp", "value") if c not in df.columns]
    if not missing:
        return df
    out = df.copy()
    for c in missing:
        out[c] = "" if c in keys else np.nan
    return out


def wasted_from_series(
    allocation: pd.DataFrame,
    idle: pd.DataFrame,
    shares: Mapping[tuple[str, str], float],
    *,
    keys: Sequence[str],
    step_s: float,
) -> pd.DataFrame:
    """Wasted GPU-hours per allocation (``keys``) from aligned steps: allocation rows (one per
    replica, with ``timestamp``), :func:`leaf_idle_frame` output and :func:`gpu_shares`.

    At each step a container wastes its holding share x the leaf's idle (0/1) x the leaf's GPU
    share, for ``step_s`` seconds (``gpulens:pod_gpu_wasted:gpus`` integrated). A step without an
    idle verdict for the leaf (no SM data) wastes nothing. Columns: ``keys``, wasted_gpu_hours,
    first_allocated (first step held), last_busy (last step the leaf was not idle; NaN if never).
    """
    cols = [*keys, "wasted_gpu_hours", "first_allocated", "last_busy"]
    if allocation.empty:
        return pd.DataFrame(columns=cols)
    a = allocation.copy()
    for k in keys:
        if k not in a.columns:
            a[k] = ""
    held = a.groupby([*keys, "timestamp"], as_index=False).size().rename(columns={"size": "held"})
    held["holding"] = held["held"] / held.groupby([*LEAF, "timestamp"])["held"].transform("sum")
    verdict = (
        idle[[*LEAF, "timestamp", "idle"]] if not idle.empty else pd.DataFrame(columns=[*LEAF, "timestamp", "idle"])
    )
    joined = held.merge(verdict, on=[*LEAF, "timestamp"], how="left")
    # each row's leaf share, looked up once per leaf (a range holds a row per leaf and step)
    leaves = joined.groupby(list(LEAF), sort=False).ngroup().to_numpy()
    first = joined.drop_duplicates(list(LEAF))
    per_leaf = np.asarray(
        [shares.get((u, m), 1.0) for u, m in zip(first["uuid"], first["mig_uuid"], strict=True)], dtype=float
    )
    share = per_leaf[leaves] if len(joined) else np.zeros(0)
    is_idle = joined["idle"].astype("boolean").fillna(False).astype(float)
    joined["wasted_gpu_hours"] = joined["holding"] * is_idle * share * step_s / 3600.0
    out = joined.groupby(list(keys), as_index=False).agg(
        wasted_gpu_hours=("wasted_gpu_hours", "sum"), first_allocated=("timestamp", "min")
    )
    busy = verdict[verdict["idle"] == False]  # noqa: E712 (a pandas mask)
    last = busy.groupby(list(LEAF), as_index=False)["timestamp"].max().rename(columns={"timestamp": "last_busy"})
    out = out.merge(last, on=list(LEAF), how="left")
    out["last_busy"] = pd.to_numeric(out["last_busy"], errors="coerce")
    return out[cols]


def gpu_shares(info: pd.DataFrame, mig_info: pd.DataFrame) -> dict[tuple[str, str], float]:
    """(uuid, mig_uuid) -> :func:`gpu_share`, from gpulens_gpu_info and gpulens_mig_instance_info rows."""
    models = dict(zip(_col(info, "uuid"), _col(info, "name"), strict=True))
    out: dict[tuple[str, str], float] = {(u, ""): 1.0 for u in models}
    for u, m, p in zip(_col(mig_info, "uuid"), _col(mig_info, "mig_uuid"), _col(mig_info, "mig_profile"), strict=True):
        out[(u, m)] = gpu_share(p, models[u]) if u in models else 1.0
    return out


def communication_share_frame(means: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`communication_share_promql` in pandas, from ``means``: each ``gpulens_pod_gpu_boundness``
    series' mean over MEAN_WINDOW (any classes; only ``communication`` is read).

    Returns (per leaf: namespace, pod, container, uuid, mig_uuid, share; per pod: namespace, pod,
    share = the mean of its leaves' shares), each share 0..1; empty frames where no leaf has a class."""
    leaf_cols = ["namespace", "pod", "container", *LEAF]
    if means.empty or "class" not in means.columns:
        return pd.DataFrame(columns=[*leaf_cols, "share"]), pd.DataFrame(columns=["namespace", "pod", "share"])
    m = means.copy()
    for c in leaf_cols:
        if c not in m.columns:
            m[c] = ""
    m = m[(m["class"] == COMMUNICATION_CLASS) & m["value"].notna()]
    leaves = m.groupby(leaf_cols, as_index=False)["value"].max().rename(columns={"value": "share"})
    pods = leaves.groupby(["namespace", "pod"], as_index=False)["share"].mean()
    return leaves, pods


def _col(df: pd.DataFrame, name: str) -> list[str]:
    return [str(x) for x in df[name]] if name in df.columns else [""] * len(df)
