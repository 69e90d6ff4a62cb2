"""Job advice: what to change about a multi-GPU job as a whole, with its evidence and its saving.

A **job** is dashboard/jobs.py's: the pods of one top owner ``(cluster, namespace, workload_kind,
workload)`` across nodes, its **leaves** the GPUs (or MIG instances) they hold. The query layer
(dashboard/advisor/job_query.py) measures each job over the advisor's window into a
:class:`JobUsage` with the one definition's arithmetic (``jobs.job_table``, ``jobs.stragglers``,
``jobs.job_mix``); :func:`advise_jobs` is a pure function of those figures and the profile tables.
No I/O; the thresholds live in :class:`dashboard.advisor.engine.Policy`.

The rule of thumb it follows: start with the smallest GPU that fits the model in memory, scale up
when throughput is insufficient, scale out only when necessary (communication between nodes adds
latency). Rules, for jobs of at least two leaves (one-leaf jobs get the per-workload advice only):

1. fewer than ``Policy.min_hours`` GPU-hours held -> keep (too little history);
2. **straggler** (one advice per straggling leaf): a leaf its peers wait for. Reason ``compute``
   (its SM clock, throttling, a slower GPU) -> drain or replace that GPU; reason ``input`` (its GPU
   sat idle, starved of data) -> fix that pod's input pipeline. Saving: the peers' waiting
   attributable to it, estimated as (peers' mean communication share - its own) x the peers'
   GPU-hours held. A job with a straggler is not judged for scale-in: its communication share is
   the wait for the straggler, not its shape;
3. **higher-bandwidth**: memory-bound (the ``memory`` class at least ``Policy.memory_bound_share``
   of its busy time) on whole GPUs of a model that has a faster one (``profiles.faster_models``):
   the faster model, its extra bandwidth and memory in percent (from the profile tables), and how
   many of it would hold the job's peak where that is fewer. Saving as the per-workload rule:
   memory-bound time shrinks by the bandwidth ratio;
4. **scale-in**: on whole GPUs, the GPUs that would hold the sum of its leaves' peak memory x
   ``Policy.headroom`` are fewer than it holds, and it spends at least
   ``Policy.job_scale_in_communication_share`` of its time communicating or its mean activity is
   below ``Policy.job_scale_in_activity_below``. "On one node" when one of its nodes has that many
   GPUs and it spans several. Saving: (held - needed) x the hours held per GPU;
5. otherwise keep, with the reason (its peak needs the GPUs it holds; compute-bound; memory
   unmeasured).

Every advice carries the job's wasted GPU-hours by the waste definition (dashboard/definitions.py,
the Workloads page's figure), measured, not derived here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from dashboard import jobs, words
from dashboard.advisor.engine import DEFAULT_POLICY, Policy, pct, price_for
from dashboard.advisor.profiles import GpuModel, faster_models, model_for

GB = 1e9


class JobAction(StrEnum):
    """What the advisor recommends for a job."""

    SCALE_IN = "scale-in"
    STRAGGLER = "straggler"
    BANDWIDTH = "higher-bandwidth"
    KEEP = "keep"


@dataclass(frozen=True)
class JobLeaf:
    """One GPU (or MIG instance) of a job and what the job did with it over the window (ratios 0..1,
    None = not measured)."""

    uuid: str
    mig_uuid: str = ""
    gpu: str = ""
    """The GPU's index on its node (``""`` when unknown)."""
    node: str = ""
    """The node's name (``node`` target label; ``""`` where the store has none)."""
    instance: str = ""
    """The exporter target the leaf was read from (``host:port``)."""
    pod: str = ""
    hours_held: float = 0.0
    """GPU-hours the job held the leaf: steps held x step x holding share x the leaf's GPU share."""
    memory_peak_bytes: float | None = None
    """Highest memory used on the leaf while the job held it."""
    memory_total_bytes: float | None = None
    """The leaf's memory (NVML total)."""
    activity: float | None = None
    """Mean activity while held (dashboard/definitions.py: SM activity, else GPU-Util)."""
    busy: float | None = None
    """Mean busy ratio (GPU-Util) while held."""
    communication: float | None = None
    """Share of the held time the pod's class on the leaf was ``communication``."""

    @property
    def where(self) -> str:
        """``jobs-1 GPU 3`` (the instance where no node name is known)."""
        host = self.node or self.instance or "?"
        return f"{host} GPU {self.gpu}" if self.gpu else f"{host} {self.uuid}"


@dataclass(frozen=True)
class Straggler:
    """A leaf its peers wait for (dashboard/jobs.py), with the evidence of why."""

    leaf: JobLeaf
    reason: str
    """``compute`` (it kept computing while its peers waited) or ``input`` (its GPU sat idle)."""
    peers_communication: float
    """The peers' mean communication share (0..1)."""
    peers_busy: float | None = None
    """The peers' mean busy ratio (0..1)."""
    sm_clock_ratio: float | None = None
    """Its mean SM clock over its maximum while held (0..1)."""
    slowdown: float | None = None
    """Share of the held time a slowdown clock event (thermal, power brake, hardware) held its
    clocks down (0..1)."""
    slowdown_reason: str = ""
    """The slowdown clock event that held its clocks down longest (``hw_thermal_slowdown``)."""


@dataclass(frozen=True)
class JobUsage:
    """What one job did over the window: its leaves, nodes, memory, class mix, waste and stragglers."""

    cluster: str
    namespace: str
    workload_kind: str
    workload: str
    gpu_model: str
    """NVML name of its GPUs (the most held where they differ), e.g. ``NVIDIA H200``."""
    leaves: tuple[JobLeaf, ...]
    gpus_per_node: Mapping[str, int] = field(default_factory=dict)
    """GPUs each of its nodes has (by the leaves' ``instance``): where it could be packed."""
    activity: float | None = None
    """Mean activity over its leaves (``jobs.job_table``)."""
    busy: float | None = None
    communication: float | None = None
    """Mean communication share over its classified leaves (``jobs.job_table``)."""
    mix: Mapping[str, float] = field(default_factory=dict)
    """Class mix (``jobs.job_mix``): per class the mean share over its classified leaves; sums to 1."""
    gpu_hours_held: float | None = None
    """GPU-hours held in the window (``jobs.job_table``'s ``gpu_hours``); None = the leaves' sum."""
    wasted_gpu_hours: float = 0.0
    """GPU-hours its leaves sat idle while held, by the waste definition (dashboard/definitions.py)."""
    stragglers: tuple[Straggler, ...] = ()

    @property
    def key(self) -> tuple[str, str, str, str]:
        """``(cluster, namespace, workload_kind, workload)``: dashboard/jobs.py's JOB."""
        return (self.cluster, self.namespace, self.workload_kind, self.workload)

    @property
    def name(self) -> str:
        """``namespace/Kind/name`` (and `` @ cluster`` where known), as jobs.job_label writes it."""
        return jobs.job_label(dict(zip(jobs.JOB, self.key, strict=True)))

    @property
    def gpus(self) -> int:
        """Leaves held (GPUs or MIG instances)."""
        return len(self.leaves)

    @property
    def nodes(self) -> int:
        """Distinct nodes (exporter targets) its leaves sit on."""
        return len({leaf.instance for leaf in self.leaves})

    @property
    def whole_gpus(self) -> bool:
        """True when every leaf is a whole GPU (no MIG instance)."""
        return all(not leaf.mig_uuid for leaf in self.leaves)

    @property
    def held(self) -> float:
        """GPU-hours held in the window."""
        return self.gpu_hours_held if self.gpu_hours_held is not None else sum(x.hours_held for x in self.leaves)

    @property
    def memory_peak_sum(self) -> float | None:
        """Sum of its leaves' peak memory (bytes); None when any leaf's is unmeasured."""
        peaks = [leaf.memory_peak_bytes for leaf in self.leaves]
        return None if not peaks or any(p is None for p in peaks) else float(sum(p for p in peaks if p is not None))

    @property
    def memory_peak_max(self) -> float | None:
        """The highest peak memory of one leaf (bytes)."""
        peaks = [leaf.memory_peak_bytes for leaf in self.leaves if leaf.memory_peak_bytes is not None]
        return max(peaks) if peaks else None


@dataclass(frozen=True)
class JobAdvice:
    """One piece of advice for a job: the action, its target, the evidence, the saving."""

    usage: JobUsage
    action: JobAction
    target: str
    """``2 GPUs on one node``; ``drain or replace jobs-1 GPU 3``; a model key; ``keep``."""
    reason: str
    """The evidence in a sentence, with the figures."""
    evidence: Mapping[str, float | str | None]
    gpu_hours_held: float
    gpu_hours_saved: float
    cost_saved_usd: float | None
    """``None`` when no price is configured for the models involved."""

    @property
    def wasted_gpu_hours(self) -> float:
        """The job's wasted GPU-hours by the waste definition (the Workloads page's figure)."""
        return self.usage.wasted_gpu_hours


def _gb(b: float | None) -> str:
    """Bytes in decimal GB, as GPU memory is sold (``141 GB``, ``38.0 GB``)."""
    if b is None:
        return "?"
    v = b / GB
    return f"{v:,.0f} GB" if v >= 100 else f"{v:,.1f} GB"


def capacity_per_gpu(usage: JobUsage, model: GpuModel | None) -> float | None:
    """Memory one GPU of the job offers (bytes): the smallest leaf's NVML total, and no more than
    the profile table's figure for the model (``141 GB`` for an H200, below the 150.7e9 bytes NVML
    reports): conservative, so a scale-in never counts on memory a GPU does not offer."""
    totals = [leaf.memory_total_bytes for leaf in usage.leaves if leaf.memory_total_bytes]
    known = [*totals, *([float(model.memory_bytes)] if model is not None else [])]
    return float(min(known)) if known else None


def gpus_needed(peak_sum: float, headroom: float, capacity: float) -> int:
    """GPUs of ``capacity`` bytes that hold ``peak_sum`` bytes x ``headroom`` (at least 1)."""
    # a relative 1e-12 absorbs float rounding of an exact fit, and is below a byte of a GPU's memory
    return max(1, math.ceil(peak_sum * headroom / capacity * (1 - 1e-12)))


def _busy_share(usage: JobUsage, cls: str) -> float:
    """The class's share of the job's busy (not ``idle``) time, 0..1."""
    busy = 1.0 - usage.mix.get("idle", 0.0)
    return usage.mix.get(cls, 0.0) / busy if busy > 0 else 0.0


def advise_jobs(
    usages: Sequence[JobUsage], policy: Policy = DEFAULT_POLICY, prices: Mapping[str, float] | None = None
) -> list[JobAdvice]:
    """Advice for every job of at least two leaves (module docstring), largest saving first, then
    by name; ``prices`` (USD per GPU-hour by model, as the engine matches them) add the dollars."""
    out: list[JobAdvice] = []
    for usage in usages:
        if usage.gpus >= 2:
            out.extend(advise_job(usage, policy, prices or {}))
    order = {a: i for i, a in enumerate(JobAction)}
    return sorted(out, key=lambda a: (a.action == JobAction.KEEP, -a.gpu_hours_saved, a.usage.name, order[a.action]))


def _evidence(usage: JobUsage, capacity: float | None, policy: Policy) -> dict[str, float | str | None]:
    """The figures every advice of ``usage`` shows."""
    return {
        "gpu_model": usage.gpu_model,
        "gpus": float(usage.gpus),
        "nodes": float(usage.nodes),
        "gpu_hours_held": usage.held,
        "wasted_gpu_hours": usage.wasted_gpu_hours,
        "activity": usage.activity,
        "communication": usage.communication,
        "memory_peak_max_bytes": usage.memory_peak_max,
        "memory_peak_sum_bytes": usage.memory_peak_sum,
        "memory_per_gpu_bytes": capacity,
        "headroom": policy.headroom,
        **{f"mix_{k}": v for k, v in sorted(usage.mix.items())},
    }


def advise_job(
    usage: JobUsage, policy: Policy = DEFAULT_POLICY, prices: Mapping[str, float] | None = None
) -> list[JobAdvice]:
    """The advice for one job (one per straggler, at most one of each other action; ``keep`` when
    there is nothing to change)."""
    prices = prices or {}
    model = model_for(usage.gpu_model)
    held = usage.held
    unit_price = price_for(usage.gpu_model, prices)
    capacity = capacity_per_gpu(usage, model)
    base = _evidence(usage, capacity, policy)

    def advice(
        action: JobAction,
        target: str,
        reason: str,
        saved: float,
        extra: Mapping[str, float | str | None] | None = None,
        cost: float | None = None,
        *,
        own_cost: bool = False,
    ) -> JobAdvice:
        saved = max(0.0, saved)
        if not own_cost:
            cost = None if unit_price is None else saved * unit_price
        return JobAdvice(usage, action, target, reason, {**base, **(extra or {})}, held, saved, cost)

    if held < policy.min_hours:
        why = f"held {held:.2g} GPU-hours, under {policy.min_hours:g}: too little history to judge"
        return [advice(JobAction.KEEP, "keep", why, 0.0)]

    out = []
    for s in usage.stragglers:
        target, reason, saved, extra = _straggler(usage, s)
        out.append(advice(JobAction.STRAGGLER, target, reason, saved, extra))
    bandwidth = _bandwidth(usage, model, policy)
    if bandwidth is not None:
        target, reason, new_hours, extra = bandwidth
        old_price, new_price = unit_price, price_for(f"NVIDIA {target}", prices)
        cost = None if old_price is None or new_price is None else held * old_price - new_hours * new_price
        out.append(advice(JobAction.BANDWIDTH, target, reason, held - new_hours, extra, cost, own_cost=True))
    if usage.stragglers:
        return out  # its communication share is the wait for the straggler: fix that first
    scale_in, why_not = _scale_in(usage, capacity, policy)
    if scale_in is not None:
        target, reason, saved, extra = scale_in
        out.append(advice(JobAction.SCALE_IN, target, reason, saved, extra))
    if not out:
        out.append(advice(JobAction.KEEP, "keep", why_not, 0.0))
    return out


_Found = tuple[str, str, float, dict[str, float | str | None]]
"""(target, reason, GPU-hours saved (or, for bandwidth, GPU-hours on the new model), evidence)."""


def _scale_in(usage: JobUsage, capacity: float | None, policy: Policy) -> tuple[_Found | None, str]:
    """(scale-in advice or None, why not)."""
    peak_sum = usage.memory_peak_sum
    if not usage.whole_gpus:
        return None, "holds MIG instances: the per-workload advice sizes its slices"
    if peak_sum is None or capacity is None:
        return None, "GPU memory use not measured: no scale-in without it"
    needed = gpus_needed(peak_sum, policy.headroom, capacity)
    per_gpu = _gb(usage.memory_peak_max)
    comm, act = usage.communication, usage.activity
    if needed >= usage.gpus:
        return None, (
            f"its peak memory ({per_gpu} of {_gb(capacity)} per GPU, {_gb(peak_sum)} in all) x {policy.headroom:g} "
            f"needs {needed} GPUs: it holds {usage.gpus}"
        )
    waits = comm is not None and comm >= policy.job_scale_in_communication_share
    light = act is not None and act < policy.job_scale_in_activity_below
    if not (waits or light):
        return None, (
            f"{needed} GPUs would hold its memory, but it is compute-bound ({pct(comm)} communicating, activity "
            f"{pct(act)}): on fewer GPUs each step takes longer, so it would save no GPU-hours"
        )
    largest_node = max(usage.gpus_per_node.values(), default=0)
    if usage.nodes > 1 and 0 < needed <= largest_node:
        target = f"{needed} GPUs on one node"
    elif usage.nodes > 1 and largest_node > 0 and math.ceil(needed / largest_node) < usage.nodes:
        target = f"{needed} GPUs on {math.ceil(needed / largest_node)} nodes"
    else:
        target = f"{needed} GPUs"
    because = " and ".join(
        [
            *([f"spends {pct(comm)} communicating"] if waits else []),
            *([f"its activity averages {pct(act)}"] if light else []),
        ]
    )
    reason = (
        f"uses {per_gpu} of {_gb(capacity)} per GPU and {because}: {target} would hold it "
        f"({_gb(peak_sum)} x {policy.headroom:g} = {_gb(peak_sum * policy.headroom)})"
    )
    hours_per_gpu = usage.held / usage.gpus
    extra: dict[str, float | str | None] = {"gpus_needed": float(needed), "gpu_hours_per_gpu": hours_per_gpu}
    return (target, reason, (usage.gpus - needed) * hours_per_gpu, extra), ""


def _straggler(usage: JobUsage, s: Straggler) -> _Found:
    """Drain or replace the straggler's GPU (``compute``) or fix its input (``input``); saving
    (peers' mean communication share - its own) x the peers' GPU-hours held."""
    leaf = s.leaf
    own = leaf.communication or 0.0
    peers_hours = max(0.0, usage.held - leaf.hours_held)
    saved = max(0.0, s.peers_communication - own) * peers_hours
    evidence: dict[str, float | str | None] = {
        "straggler_gpu": leaf.gpu,
        "straggler_node": leaf.node or leaf.instance,
        "straggler_uuid": leaf.uuid,
        "straggler_pod": leaf.pod,
        "straggler_reason": s.reason,
        "straggler_communication": leaf.communication,
        "peers_communication": s.peers_communication,
        "straggler_busy": leaf.busy,
        "peers_busy": s.peers_busy,
        "sm_clock_ratio": s.sm_clock_ratio,
        "slowdown_share": s.slowdown,
        "slowdown_reason": s.slowdown_reason or None,
        "peers_gpu_hours_held": peers_hours,
    }
    waiting = (
        f"its {usage.gpus - 1} peers spend {pct(s.peers_communication)} of their time communicating (waiting), "
        f"it {pct(own)}"
    )
    if s.reason == "input":
        target = f"fix the input pipeline of {leaf.pod or leaf.where}"
        reason = (
            f"{leaf.where} ({leaf.uuid}) starves: its GPU is busy {pct(leaf.busy)} of the time against its peers' "
            f"{pct(s.peers_busy)} (its data arrives late); {waiting}"
        )
    else:
        target = f"drain or replace {leaf.where}"
        clocks = []
        if s.sm_clock_ratio is not None:
            clocks.append(f"SM clock {pct(s.sm_clock_ratio)} of its maximum")
        if s.slowdown:
            why = words.clock_event(s.slowdown_reason) if s.slowdown_reason else "a slowdown"
            clocks.append(f"clocks held down by {why} {pct(s.slowdown)} of the time")
        slow = ", ".join(clocks) or "no clock slowdown seen (a slower GPU, or a larger share of the work)"
        reason = f"{leaf.where} ({leaf.uuid}) computes while its peers wait: {slow}; {waiting}"
    return target, reason, saved, evidence


def _bandwidth(usage: JobUsage, model: GpuModel | None, policy: Policy) -> _Found | None:
    """A faster model for a memory-bound job on whole GPUs: (model key, reason, GPU-hours it would
    hold on it, evidence), or None."""
    if model is None or not usage.whole_gpus:
        return None
    memory_bound = _busy_share(usage, "memory")
    faster = faster_models(model)
    if memory_bound < policy.memory_bound_share or not faster:
        return None
    new = faster[0]
    speedup = new.bandwidth_bytes_per_second / model.bandwidth_bytes_per_second
    more_memory = new.memory_bytes / model.memory_bytes - 1
    # memory-bound time shrinks with bandwidth; the rest does not (the per-workload rule)
    new_hours = usage.held * (1 - usage.mix.get("memory", 0.0) * (1 - 1 / speedup))
    evidence: dict[str, float | str | None] = {
        "memory_bound_share_of_busy": memory_bound,
        "bandwidth_ratio": speedup,
        "more_bandwidth": speedup - 1,
        "more_memory": more_memory,
        "faster_model": new.key,
    }
    fewer = ""
    peak_sum = usage.memory_peak_sum
    if peak_sum is not None:
        on_new = gpus_needed(peak_sum, policy.headroom, float(new.memory_bytes))
        evidence["gpus_needed_on_faster_model"] = float(on_new)
        if on_new < usage.gpus:
            fewer = (
                f"; {on_new} {new.key} would hold its peak ({_gb(peak_sum)} x {policy.headroom:g}) "
                f"instead of {usage.gpus} {model.key}"
            )
    reason = (
        f"memory-bound {pct(memory_bound)} of its busy time: {new.key} has {pct(speedup - 1)} more bandwidth and "
        f"{pct(more_memory)} more memory than {model.key}{fewer}"
    )
    return new.key, reason, new_hours, evidence
