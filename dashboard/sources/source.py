"""The dashboard's data interface: one Protocol, answered by Prometheus or by direct scraping.

Pages only talk to a :class:`MetricSource`; every method returns a pandas DataFrame with one
column per label (missing labels are ``""``) plus ``value`` (and ``timestamp`` for series, Unix
seconds). Failures raise :class:`SourceError`, which pages turn into a banner.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import pandas as pd

from dashboard import jobs
from exporter.render.metrics import BY_NAME

ALLOCATION = "gpulens_pod_gpu_allocation"
SM_ACTIVE = "gpulens_gpu_sm_active_ratio"

ALLOCATION_KEYS: tuple[str, ...] = (
    "cluster",
    "node",
    "instance",
    "namespace",
    "pod",
    "container",
    "workload_kind",
    "workload",
    "uuid",
    "mig_uuid",
)
"""Labels that identify one allocated device of one container (the rows of activity tables)."""

POD_DEVICE_KEYS: tuple[str, ...] = ("namespace", "pod", "container", "uuid", "mig_uuid")
"""The part of ALLOCATION_KEYS that identifies the allocation (the rest describes it)."""

ACTIVITY_COLUMNS: tuple[str, ...] = (*ALLOCATION_KEYS, "wasted_gpu_hours", "first_allocated", "last_busy")

IDLE_SINCE_COLUMNS: tuple[str, ...] = (*POD_DEVICE_KEYS, "first_allocated", "last_busy")
"""Columns of :meth:`MetricSource.idle_since`."""

DEVICE_METRICS = r"gpulens_(?:gpu|mig|probe|pod)_.+"
"""Name pattern of the series the GPU page reads (device, MIG, probe and per-pod series)."""

MAX_POINTS = 720
"""Most points a range series may have; longer windows get a coarser step."""

MAX_WINDOW_SECONDS = 31 * 86400.0
MIN_STEP_SECONDS = 1.0
RATE_WINDOW_MIN_SECONDS = 60.0
"""The shortest window a counter's rate over time is taken over (each point: the mean over its step,
or over this much where the step is shorter): four scrapes at the chart's 15 s interval, so that a
window never holds a single scrape (no rate), and a late scrape averages out."""


HISTORY_STEPS = 240
"""Resolution of :meth:`MetricSource.history_start`: the range is searched in this many steps."""
HISTORY_METRIC = "gpulens_up"
"""The series whose first sample is where the GPUs' history begins: one per exporter, scraped
from its first scrape on (with its GPUs' series), so the search reads a series per node, not
per GPU: 0.02 s against 0.15 s for gpulens_gpu_info at 1,000 GPUs over 24 h."""


def rate_steps(step_s: float) -> int:
    """How many steps of a series a counter's rate spans: one, or RATE_WINDOW_MIN_SECONDS' worth
    where the step is shorter."""
    return max(1, math.ceil(RATE_WINDOW_MIN_SECONDS / max(step_s, 1e-9) - 1e-9))


LOOKBACK_SECONDS = 300.0
"""How far back an instant value may lie (Prometheus' default lookback delta)."""

SLOWDOWN_REASONS: tuple[str, ...] = (
    "hw_slowdown",
    "hw_thermal_slowdown",
    "sw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_power_cap",
)
"""Clock events (``gpulens_gpu_clock_event_active{reason}``) that hold a GPU's clocks down for
heat, power or a hardware signal: what can make one rank of a job compute slower than its peers."""
SLOWDOWN_SAMPLE_SECONDS = 15.0
"""How often, within the window, whether any slowdown event held is sampled in Prometheus mode (a
subquery step: the usual scrape interval); scrape mode reads every scrape."""

JOB_LEAF_EXTRA: tuple[str, ...] = (
    "gpu_share",
    "memory_used_bytes",
    "memory_total_bytes",
    "sm_clock_ratio",
    "slowdown",
    "slowdown_reasons",
    "model",
)
"""What :meth:`MetricSource.job_leaves` gives beside ``jobs.LEAF_COLUMNS``: the leaf's share of a
physical GPU (0..1; a 3g MIG instance 3/7), its peak memory used over the window and its memory
(bytes), its GPU's mean SM clock over the clock's maximum (0..1), the share of the window any of
SLOWDOWN_REASONS held its GPU's clocks down (0..1), those reasons (comma-separated, ``""`` for none)
and the GPU's model (NVML name)."""
JOB_LEAF_COLUMNS: tuple[str, ...] = (*jobs.LEAF_COLUMNS, *JOB_LEAF_EXTRA)
"""The columns of :meth:`MetricSource.job_leaves` (plus ``held_hours`` when asked for a range)."""
JOB_STRAGGLER_COLUMNS: tuple[str, ...] = (*jobs.JOB_LEAF, "gpu", "reason", "busy", "sm_clock_ratio", "slowdown_reasons")
"""The columns of :meth:`MetricSource.job_stragglers`: a straggling leaf, why it straggles
(``compute`` or ``input``: dashboard/jobs.py) and what says so in words (its busy ratio for
``input``; its GPU's SM clock over its maximum and slowdown events for ``compute``)."""
JOB_CLASS_COLUMNS: tuple[str, ...] = (*jobs.JOB_LEAF, "class", "share")
JOB_MIX_COLUMNS: tuple[str, ...] = (*jobs.JOB, "class", "share")
JOB_SERIES_COLUMNS: tuple[str, ...] = ("metric", "pod", "uuid", "mig_uuid", "class", "timestamp", "value")
"""The columns of :meth:`MetricSource.job_series`. ``metric``: ``sm_active`` (SM activity, 0..1),
``busy`` (NVML busy ratio, for leaves without SM activity), ``sm_clock`` (SM clock over its
maximum, 0..1) or ``class`` (value 1 at each step the pod's class on the leaf was ``class``)."""

HELD_POINTS = 80
"""Steps over a range at which ``held_hours`` samples whether a pod held a leaf (the Workloads page's
wasted hours use the same): 18 minutes apart over 24 h; a point query of the recorded
``gpulens:job_leaf:info`` per step, so a week costs what an hour does."""
HELD_MIN_STEP_SECONDS = 60.0
"""The finest ``held_hours`` step (the rules' evaluation interval)."""


def held_step(window: Window) -> tuple[float, float]:
    """(seconds, step) at which ``held_hours`` is sampled over ``window``."""
    return window.stepped(max(window.seconds / HELD_POINTS, HELD_MIN_STEP_SECONDS))


JobKey = tuple[str, str, str, str]
"""A job as ``jobs.JOB`` names it: (cluster, namespace, workload_kind, workload)."""


class SourceError(RuntimeError):
    """The data source could not answer (unreachable, timeout, bad reply); the message is for users."""


@dataclass(frozen=True)
class Filters:
    """What the user narrowed the view to; ``None`` = everything.

    ``cluster`` and ``node`` are labels added by Prometheus target relabelling and may not exist;
    ``instance`` always does. ``namespace`` restricts device series to devices allocated to a pod
    of that namespace.
    """

    cluster: str | None = None
    node: str | None = None
    instance: str | None = None
    namespace: str | None = None

    def target_matchers(self) -> dict[str, str]:
        """Matchers that apply to every series of a target (not the namespace)."""
        out = {}
        for key in ("cluster", "node", "instance"):
            value = getattr(self, key)
            if value:
                out[key] = value
        return out


NO_FILTERS = Filters()


def device_keys(metric: str) -> tuple[str, ...]:
    """Labels that tie ``metric`` to an allocated device: (uuid, mig_uuid) for per-leaf series,
    (uuid,) for physical ones, () when the metric has no device (self-health)."""
    spec = BY_NAME.get(metric)
    labels = spec.labels if spec else ()
    if "uuid" not in labels:
        return ()
    return ("uuid", "mig_uuid") if "mig_uuid" in labels else ("uuid",)


def has_namespace(metric: str) -> bool:
    """True when ``metric`` carries its own namespace label (per-pod series)."""
    spec = BY_NAME.get(metric)
    return spec is not None and "namespace" in spec.labels


def bounded_step(window_s: float, step_s: float) -> tuple[float, float]:
    """(window, step) clamped so a series has at most MAX_POINTS points and a window at most
    MAX_WINDOW_SECONDS; protects both the backend and the browser from huge answers."""
    window = min(max(window_s, MIN_STEP_SECONDS), MAX_WINDOW_SECONDS)
    step = max(step_s, MIN_STEP_SECONDS, window / MAX_POINTS)
    return window, float(round(step))


@dataclass(frozen=True)
class Window:
    """A span of time a source reads over: the ``seconds`` before the range's end.

    The end is not part of it: every source method takes ``end`` (Unix s; None = now) apart, the
    instant reads too. A source reads at least MIN_STEP_SECONDS and at most MAX_WINDOW_SECONDS
    (:meth:`bounded`), at most MAX_POINTS steps (:meth:`stepped`)."""

    seconds: float

    def bounded(self) -> float:
        """The seconds read: the window clamped to [MIN_STEP_SECONDS, MAX_WINDOW_SECONDS]."""
        return bounded_step(self.seconds, MIN_STEP_SECONDS)[0]

    def stepped(self, step_s: float) -> tuple[float, float]:
        """(seconds, step) of a read every ``step_s`` seconds over the window, bounded as
        :func:`bounded_step` bounds them."""
        return bounded_step(self.seconds, step_s)


class MetricSource(Protocol):
    """Where the dashboard reads metrics from."""

    @property
    def description(self) -> str:
        """Human-readable origin, e.g. ``Prometheus http://prom:9090``."""
        ...

    def instant(
        self, metric: str, filters: Filters = NO_FILTERS, *, by: Sequence[str] | None = None, end: float | None = None
    ) -> pd.DataFrame:
        """Newest value at ``end`` (Unix s; None = now) of every series of ``metric``; with ``by``,
        the sum by those labels. Every method takes ``end`` the same way (an absolute range)."""
        ...

    def current_state(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        only: tuple[str, str] | None = None,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        """Of state-set ``metric`` (one series per state, 1 for the current one), only the series
        whose value is 1 at ``end``: each device's current state, a sixth of the boundness
        series that :meth:`instant` would send. ``only`` (label, value): of that one state (the
        devices in it now, say ``("class", "transfer")``), so that a store selects only its series.
        ``by``: the labels each row keeps (one row per distinct set of them: the store's ``max
        by``), so that an answer of thousands of devices carries only what the page reads; None:
        every label."""
        ...

    def series(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        window: Window,
        step_s: float,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        """Values over ``window`` before ``end`` every ``step_s`` seconds (bounded by MAX_POINTS)."""
        ...

    def rate(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        window: Window,
        step_s: float,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        """Per-second rate of counter ``metric`` over the range, a point every ``step_s`` (the
        mean over about a step, resets handled); with ``by``, the rates summed by those labels."""
        ...

    def increase(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        window: Window,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        """How much counter ``metric`` grew over ``window`` before ``end`` (resets handled)."""
        ...

    def events(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        window: Window,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        """How many events counter ``metric`` counted over ``window`` before ``end``,
        its first one included: like ``increase``, except that a series that did not exist at the
        window's start on a target scraped then counts its whole value (an event counter the
        exporter creates at its first event, as the Xid counter: dashboard/definitions.py's
        ``counter_events_promql``)."""
        ...

    def mean(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        window: Window,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        """Mean of each series of gauge ``metric`` over ``window`` before ``end``."""
        ...

    def allocation_activity(
        self, filters: Filters = NO_FILTERS, *, window: Window, step_s: float, end: float | None = None
    ) -> pd.DataFrame:
        """One row per allocated device seen in the window (ACTIVITY_COLUMNS), by the one
        definition of dashboard/definitions.py.

        ``wasted_gpu_hours``: the container's wasted GPU-hours over the window (idle steps x its
        share of the leaf x the leaf's GPU share x the step). ``first_allocated``: first step the
        allocation was seen; ``last_busy``: last step its leaf was not idle (NaN if never in the
        window); Unix seconds.
        """
        ...

    def idle_since(
        self, filters: Filters = NO_FILTERS, *, window: Window, step_s: float, end: float | None = None
    ) -> pd.DataFrame:
        """allocation_activity's ``first_allocated`` and ``last_busy`` (the same steps, the same
        definition) for only the containers that hold a leaf idle at ``end`` (IDLE_SINCE_COLUMNS):
        what "idle for" needs (dashboard/fleet_names.py), without every allocation's wasted hours.
        Unix seconds; ``last_busy`` NaN where the leaf was never busy in the range."""
        ...

    def device_series(self, uuid: str, *, window: Window, step_s: float, end: float | None = None) -> pd.DataFrame:
        """Every gpulens series that carries ``uuid`` (the physical GPU: its own series, its MIG
        instances', its probes' and its allocations'), over the range, in one frame with a
        ``metric`` column (raw values: counters are not differentiated)."""
        ...

    def leaf_idle(self, filters: Filters = NO_FILTERS, *, end: float | None = None) -> pd.DataFrame:
        """The idle verdict now per leaf: uuid, mig_uuid, sm_mean (the leaf's mean activity over the
        definition's window: SM activity where it has GPM, else GPU-Util or processes;
        dashboard/definitions.py) and value (1 idle, 0 busy: in use, launch-bound included)."""
        ...

    def window_ages(
        self, metric: str, by: Sequence[str], filters: Filters = NO_FILTERS, *, end: float | None = None
    ) -> pd.DataFrame:
        """Per ``by`` of ``metric``'s series under ``filters``' target matchers, ``age_s``: the
        seconds of its history in the verdicts' window (dashboard/definitions.py ``MEAN_WINDOW``)
        before ``end``, capped at the window: how far a verdict over that window has collected
        (``definitions.window_full``). A series older than the window reads the whole window."""
        ...

    def job_leaves(
        self,
        filters: Filters = NO_FILTERS,
        *,
        window: Window | None = None,
        end: float | None = None,
        job: JobKey | None = None,
    ) -> pd.DataFrame:
        """One row per (job, pod, leaf) held at ``end`` (JOB_LEAF_COLUMNS; dashboard/jobs.py), of job
        ``job`` only where given (the Job page: one job's leaves, not the fleet's): the
        figures over the rules' window (``jobs.W``, 5 m) before ``end``, NaN where unmeasured. With
        ``window``, ``held_hours`` too: the hours the pod held the leaf over ``window`` before
        ``end`` (sampled every window / 80 s, at least a minute; the Workloads page's
        resolution). ``filters``: cluster and namespace select jobs by their own labels; node and
        instance select the jobs with a leaf there, whole (every leaf, on every node)."""
        ...

    def job_summary(
        self, filters: Filters = NO_FILTERS, *, window: Window | None = None, end: float | None = None
    ) -> pd.DataFrame:
        """One row per job held at ``end`` (``jobs.SUMMARY_COLUMNS``): ``jobs.job_summary`` of
        :meth:`job_leaves` (``gpu_hours`` over ``window``, NaN without). The Prometheus source reads
        the recorded job series instead (a few per job, not a few per leaf). Filters as
        :meth:`job_leaves`."""
        ...

    def job_stragglers(self, filters: Filters = NO_FILTERS, *, end: float | None = None) -> pd.DataFrame:
        """The straggling leaves at ``end`` (JOB_STRAGGLER_COLUMNS): ``jobs.stragglers`` of
        :meth:`job_leaves` with ``reason`` and the figures that explain it; the Prometheus source
        reads ``gpulens:job_straggler:info`` and those leaves' figures only. Filters as
        :meth:`job_leaves`."""
        ...

    def job_classes(self, filters: Filters = NO_FILTERS, *, end: float | None = None) -> pd.DataFrame:
        """Per (job, pod, leaf) and class (JOB_CLASS_COLUMNS), the fraction (0..1) of the rules'
        window the pod's class on the leaf was that class; only classified leaves (GPM). The input
        of ``jobs.job_mix``; filters as :meth:`job_leaves`."""
        ...

    def job_mix(self, filters: Filters = NO_FILTERS, *, end: float | None = None) -> pd.DataFrame:
        """Each job's class mix (JOB_MIX_COLUMNS, ``gpulens:job_boundness:ratio_avg5m``): per class
        the mean share over its classified leaves. ``jobs.job_mix`` of :meth:`job_classes`; the
        Prometheus source reads the recorded series (a few per job, not a few per leaf)."""
        ...

    def job_series(
        self,
        job: JobKey,
        instances: Sequence[str],
        *,
        window: Window,
        step_s: float,
        end: float | None = None,
    ) -> pd.DataFrame:
        """The job's leaves over the range (JOB_SERIES_COLUMNS), at each step only the leaves the job
        held then: SM activity (or the busy ratio), SM clock over its maximum, and the pod's class.
        ``instances``: the exporter targets the job's leaves are on (the stores read only theirs)."""
        ...

    def history_start(
        self,
        metric: str = HISTORY_METRIC,
        filters: Filters = NO_FILTERS,
        *,
        window: Window,
        end: float | None = None,
    ) -> float:
        """Unix time (s) of the first sample of ``metric`` under ``filters``' target matchers in ``window``
        before ``end``, to within ``window.seconds / HISTORY_STEPS``; NaN when the
        range holds none. ``metric`` may be a recording rule (the Prometheus source reads its
        recorded series: history recorded before the rules were loaded has none; the scrape source
        computes rules from the raw series, so it answers for gpulens_gpu_info)."""
        ...

    def label_values(self, label: str, metric: str = "gpulens_gpu_info", within: Filters = NO_FILTERS) -> list[str]:
        """Sorted distinct non-empty values of ``label`` on the series of ``metric`` that match
        ``within``'s target matchers (cluster, node, instance; its namespace is ignored)."""
        ...

    def problems(self) -> list[str]:
        """Partial failures worth a warning banner (e.g. an exporter that did not answer)."""
        ...
