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

from exporter.metrics import BY_NAME

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


def rate_steps(step_s: float) -> int:
    """How many steps of a series a counter's rate spans: one, or RATE_WINDOW_MIN_SECONDS' worth
    where the step is shorter."""
    return max(1, math.ceil(RATE_WINDOW_MIN_SECONDS / max(step_s, 1e-9) - 1e-9))


LOOKBACK_SECONDS = 300.0
"""How far back an instant value may lie (Prometheus' default lookback delta)."""


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

    def current_state(self, metric: str, filters: Filters = NO_FILTERS, *, end: float | None = None) -> pd.DataFrame:
        """Of state-set ``metric`` (one series per state, 1 for the current one), only the series
        whose value is 1 at ``end``: each device's current state, a sixth of the boundness
        series that :meth:`instant` would send."""
        ...

    def series(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        window_s: float,
        step_s: float,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        """Values over the ``window_s`` seconds before ``end`` every ``step_s`` (bounded by MAX_POINTS)."""
        ...

    def rate(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        window_s: float,
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
        window_s: float,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        """How much counter ``metric`` grew over the ``window_s`` seconds before ``end`` (resets handled)."""
        ...

    def events(
        self,
        metric: str,
        filters: Filters = NO_FILTERS,
        *,
        window_s: float,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        """How many events counter ``metric`` counted over the ``window_s`` seconds before ``end``,
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
        window_s: float,
        by: Sequence[str] | None = None,
        end: float | None = None,
    ) -> pd.DataFrame:
        """Mean of each series of gauge ``metric`` over the ``window_s`` seconds before ``end``."""
        ...

    def allocation_activity(
        self, filters: Filters = NO_FILTERS, *, window_s: float, step_s: float, end: float | None = None
    ) -> pd.DataFrame:
        """One row per allocated device seen in the window (ACTIVITY_COLUMNS), by the one
        definition of dashboard/definitions.py.

        ``wasted_gpu_hours``: the container's wasted GPU-hours over the window (idle steps x its
        share of the leaf x the leaf's GPU share x the step). ``first_allocated``: first step the
        allocation was seen; ``last_busy``: last step its leaf was not idle (NaN if never in the
        window); Unix seconds.
        """
        ...

    def device_series(self, uuid: str, *, window_s: float, step_s: float, end: float | None = None) -> pd.DataFrame:
        """Every gpulens series that carries ``uuid`` (the physical GPU: its own series, its MIG
        instances', its probes' and its allocations'), over the range, in one frame with a
        ``metric`` column (raw values: counters are not differentiated)."""
        ...

    def leaf_idle(self, filters: Filters = NO_FILTERS, *, end: float | None = None) -> pd.DataFrame:
        """The idle verdict now per leaf: uuid, mig_uuid, sm_mean (the leaf's mean activity over the
        definition's window: SM activity where it has GPM, else GPU-Util or processes;
        dashboard/definitions.py) and value (1 idle, 0 busy: in use, launch-bound included)."""
        ...

    def label_values(self, label: str, metric: str = "gpulens_gpu_info", within: Filters = NO_FILTERS) -> list[str]:
        """Sorted distinct non-empty values of ``label`` on the series of ``metric`` that match
        ``within``'s target matchers (cluster, node, instance; its namespace is ignored)."""
        ...

    def problems(self) -> list[str]:
        """Partial failures worth a warning banner (e.g. an exporter that did not answer)."""
        ...
