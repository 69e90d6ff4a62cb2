"""The right-sizing engine: a pure function from one workload's measured use to one recommendation.

Inputs are numbers the query layer measured over a window (peak memory, SM/DRAM/link activity
percentiles, boundness mix, hours held and idle); the output says what to do, why (the evidence it
used) and what it saves in GPU-hours and dollars. No I/O; every threshold lives in :class:`Policy`.

Rules, in order (docs/advisor.md has the reasoning):

1. fewer than ``min_hours`` held -> keep (too little evidence);
2. idle for at least ``release_idle_share`` of the held time, and hardly ever launch- or
   transfer-bound (the classes of ``definitions.IN_USE_CLASSES``: SMs near 0 while in use) -> release;
3. already on a shared (time-sliced / MPS) GPU -> keep;
4. transfer-bound for most of its busy time (links busy, SMs waiting) -> reduce its data movement,
   with the link named; never a smaller device: the link, not the SMs, sets its pace;
5. memory-bound for most of its busy time, DRAM p95 high, and a known model with more HBM
   bandwidth and as much memory exists -> a higher-bandwidth GPU;
6. the cheaper of: the smallest MIG profile whose memory covers peak x ``headroom`` and whose
   compute share covers SM-active p95 x ``compute_headroom``; time-slicing / MPS when use is light
   and bursty -> whichever frees more of the GPU (ties go to MIG, which isolates);
7. otherwise keep the GPU it has.

Conservative: a MIG profile is recommended only if its memory holds the observed peak times the
headroom (which is at least 1), and memory unknown means no MIG and no sharing advice.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from dashboard import definitions
from dashboard.advisor.profiles import COMPUTE_SLICES, GpuModel, MigProfile, faster_models, model_for

_SLICES = re.compile(r"^(\d+)g\.")


class Action(StrEnum):
    """What the advisor recommends."""

    RELEASE = "release"
    MIG = "mig"
    SHARE = "time-slice"
    BANDWIDTH = "higher-bandwidth"
    TRANSFER = "reduce-transfers"
    KEEP = "keep"


@dataclass(frozen=True)
class WorkloadUsage:
    """What one workload did with its GPUs over the window (all ratios 0..1, None = not measured).

    SM and DRAM activity are relative to the device held: a MIG instance's own SMs, or the whole
    GPU. ``device_hours_*`` count hours per device held (a time-sliced GPU's hours split among the
    workloads holding it); the engine weighs MIG instances by their share of a GPU.
    """

    namespace: str
    workload_kind: str
    workload: str
    gpu_model: str
    """NVML name, e.g. ``NVIDIA H200``."""
    mig_profile: str = ""
    """``""`` for whole GPUs, else the profile held, e.g. ``3g.71gb``."""
    devices: int = 1
    """Distinct devices (GPUs or MIG instances) held in the window."""
    device_hours_held: float = 0.0
    device_hours_idle: float = 0.0
    memory_peak_bytes: float | None = None
    """Highest memory used on any one device held."""
    sm_active_p95: float | None = None
    sm_active_mean: float | None = None
    dram_active_p95: float | None = None
    pcie_utilization_p95: float | None = None
    """PCIe use (busier direction over the link's capacity, 0..1), p95 over the window."""
    nvlink_utilization_p95: float | None = None
    """NVLink use (busier direction over the active links' capacity, 0..1), p95 over the window."""
    boundness: Mapping[str, float] = field(default_factory=dict)
    """Share of held time per boundness class (idle, launch, latency, memory, compute, mixed,
    transfer; shared on a GPU other pods run on)."""
    shared: bool = False
    """Held on a GPU other workloads held at the same time (time-slicing or MPS)."""

    @property
    def name(self) -> str:
        """``namespace/Kind/workload``."""
        return f"{self.namespace}/{self.workload_kind}/{self.workload}"


@dataclass(frozen=True)
class Policy:
    """Thresholds of the engine; the defaults are documented in docs/advisor.md."""

    headroom: float = 1.2
    """Memory a recommended device must have, as a multiple of the observed peak (>= 1)."""
    compute_headroom: float = 1.1
    """SM capacity a recommended device must have, as a multiple of SM-active p95 (>= 1). Lower
    than the memory headroom because compute is a soft limit (a full slice runs slower) while
    memory is a hard one (a full slice fails to allocate)."""
    min_hours: float = 1.0
    release_idle_share: float = 0.9
    release_max_launch_share: float = 0.05
    """Launch-bound kernels and link transfers (classes ``launch`` and ``transfer``) leave SMs almost
    idle while work is running: a holder in those classes this share of its held time is busy."""
    transfer_bound_share: float = 0.5
    """Share of busy time in the ``transfer`` class that makes a workload transfer-bound."""
    memory_bound_share: float = 0.5
    """Share of busy time in the ``memory`` class that makes a workload memory-bound."""
    memory_bound_dram_p95: float = 0.6
    light_sm_mean: float = 0.10
    bursty_p95_over_mean: float = 3.0
    bursty_min_p95: float = 0.10
    """A burst is SM activity of at least this much (so near-zero noise is not "bursty")."""
    share_max_memory: float = 0.5
    """Time-slicing only when peak x headroom fits in this share of the GPU's memory (room for a
    neighbour: time-slicing does not partition memory)."""
    job_scale_in_communication_share: float = 0.25
    """A multi-GPU job whose memory fits on fewer GPUs is advised to scale in when it spends at least
    this share (0..1) of its time communicating (its class mix; dashboard/jobs.py) ..."""
    job_scale_in_activity_below: float = 0.5
    """... or when its mean activity (0..1; dashboard/definitions.py) is below this. A busy,
    compute-bound data-parallel job is left alone: on fewer GPUs each step takes proportionally
    longer, so it holds fewer GPUs for longer and saves no GPU-hours (docs/advisor.md, Jobs)."""

    def __post_init__(self) -> None:
        if self.headroom < 1 or self.compute_headroom < 1:
            raise ValueError("headroom must be at least 1 (a smaller device would not have held the peak)")


DEFAULT_POLICY = Policy()


@dataclass(frozen=True)
class Recommendation:
    """One workload's advice: the action, its target and reason, the evidence, the saving."""

    usage: WorkloadUsage
    action: Action
    target: str
    """What to move to: a MIG profile, ``time-slicing or MPS``, a model key, ``release``, ``keep``;
    for transfer-bound work the traffic to reduce (``reduce host-device traffic``)."""
    reason: str
    evidence: Mapping[str, float | str | None]
    gpu_hours_held: float
    """Whole-GPU-equivalent hours held in the window."""
    gpu_hours_saved: float
    cost_saved_usd: float | None
    """``None`` when no price is configured for the models involved."""


def price_for(model: str, prices: Mapping[str, float]) -> float | None:
    """USD per GPU-hour for a model: exact key, else the longest key contained in the name
    (case-insensitive), else ``*``; None when none applies (same matching as the dashboard)."""
    if model in prices:
        return prices[model]
    matches = [k for k in prices if k != "*" and k.upper() in model.upper()]
    if matches:
        return prices[max(matches, key=len)]
    return prices.get("*")


def current_share(usage: WorkloadUsage, model: GpuModel | None) -> tuple[float, float]:
    """(share of a GPU the device takes, share of the GPU's SMs it has) for what is held now."""
    if not usage.mig_profile:
        return 1.0, 1.0
    prof = model.profile(usage.mig_profile) if model else None
    if prof:
        return prof.gpu_share, prof.compute_fraction
    m = _SLICES.match(usage.mig_profile)
    frac = min(1.0, int(m.group(1)) / (model.compute_slices if model else COMPUTE_SLICES)) if m else 1.0
    return frac, frac


def smallest_profile(model: GpuModel, memory_bytes: float, compute_fraction: float) -> MigProfile | None:
    """The smallest profile (by GPU share, then compute) with at least that memory and compute."""
    fits = [p for p in model.mig_profiles if p.memory_bytes >= memory_bytes and p.compute_fraction >= compute_fraction]
    return min(fits, key=lambda p: (p.gpu_share, p.compute_slices, p.memory_bytes), default=None)


def _gib(b: float | None) -> str:
    return "?" if b is None else f"{b / 2**30:.1f} GiB"


def pct(r: float | None) -> str:
    """A 0..1 ratio in the pages' percentage style (``96 %``); ``?`` when unknown."""
    return "?" if r is None else f"{r * 100:.0f} %"


HOST_DEVICE = "reduce host-device traffic"
GPU_GPU = "reduce GPU-to-GPU traffic"
_HOST_DEVICE_ADVICE = (
    "pinned (page-locked) host memory, fewer and larger copies, data kept resident on the GPU between "
    "steps, copies overlapped with compute on separate CUDA streams, GPUDirect RDMA/Storage for network "
    "and storage input"
)
_GPU_GPU_ADVICE = (
    "collectives overlapped with compute, fewer and larger exchanges (bucketed gradients), a "
    "parallelism layout that sends less over the links"
)


def transfer_advice(usage: WorkloadUsage) -> tuple[str, str]:
    """(target, what to change) for transfer-bound work: NVLink traffic is GPU-to-GPU exchange,
    everything else (PCIe, or links not measured) host-device copies."""
    pcie, nvlink = usage.pcie_utilization_p95, usage.nvlink_utilization_p95
    if nvlink is not None and nvlink > (pcie or 0.0):
        return GPU_GPU, _GPU_GPU_ADVICE
    return HOST_DEVICE, _HOST_DEVICE_ADVICE


def _links(usage: WorkloadUsage) -> str:
    """The measured links' p95 use, e.g. ``PCIe p95 80% of capacity``."""
    seen = [
        f"{name} p95 {pct(v)} of capacity"
        for name, v in (("PCIe", usage.pcie_utilization_p95), ("NVLink", usage.nvlink_utilization_p95))
        if v is not None
    ]
    return ", ".join(seen) or "link use not measured"


def recommend(
    usage: WorkloadUsage, prices: Mapping[str, float] | None = None, policy: Policy = DEFAULT_POLICY
) -> Recommendation:
    """The recommendation for one workload (pure; see the module docstring for the rules)."""
    prices = prices or {}
    model = model_for(usage.gpu_model)
    share, sm_fraction = current_share(usage, model)
    # GPU-hours weigh a MIG instance by its compute slices, as the rules and the dashboard do
    # (dashboard/definitions.py); ``share`` (the larger of compute and memory share) only compares
    # the device held with a smaller one
    weight = definitions.gpu_share(usage.mig_profile, usage.gpu_model)
    held = usage.device_hours_held * weight
    idle = usage.device_hours_idle * weight
    idle_share = usage.device_hours_idle / usage.device_hours_held if usage.device_hours_held > 0 else 0.0
    busy = max(0.0, 1.0 - usage.boundness.get("idle", idle_share))
    sm_p95 = None if usage.sm_active_p95 is None else usage.sm_active_p95 * sm_fraction
    sm_mean = None if usage.sm_active_mean is None else usage.sm_active_mean * sm_fraction
    unit_price = price_for(usage.gpu_model, prices)
    evidence: dict[str, float | str | None] = {
        "gpu_model": usage.gpu_model,
        "mig_profile": usage.mig_profile or None,
        "devices": float(usage.devices),
        "memory_peak_bytes": usage.memory_peak_bytes,
        "sm_active_p95": usage.sm_active_p95,
        "sm_active_mean": usage.sm_active_mean,
        "dram_active_p95": usage.dram_active_p95,
        "pcie_utilization_p95": usage.pcie_utilization_p95,
        "nvlink_utilization_p95": usage.nvlink_utilization_p95,
        "idle_share": idle_share,
        **{f"boundness_{k}": v for k, v in sorted(usage.boundness.items())},
        "gpu_hours_held": held,
        "gpu_hours_idle": idle,
        "headroom": policy.headroom,
        "compute_headroom": policy.compute_headroom,
    }

    def done(
        action: Action, target: str, reason: str, saved: float, cost: float | None = None, *, own_cost: bool = False
    ) -> Recommendation:
        saved = max(0.0, saved)
        if not own_cost:
            cost = None if unit_price is None else saved * unit_price
        return Recommendation(usage, action, target, reason, evidence, held, saved, cost)

    if usage.device_hours_held < policy.min_hours:
        return done(
            Action.KEEP,
            "keep",
            f"held {usage.device_hours_held:.2g} device-hours ({held:.2g} GPU-hours), under {policy.min_hours:g}: "
            "too little history to judge",
            0.0,
        )

    # launch- and transfer-bound time reads SM activity near 0 while the leaf is in use: the one
    # definition's in-use classes, so the advisor and the idle verdict agree on what is busy
    in_use = sum(usage.boundness.get(c, 0.0) for c in definitions.IN_USE_CLASSES)
    if idle_share >= policy.release_idle_share and in_use < policy.release_max_launch_share:
        return done(
            Action.RELEASE,
            "release",
            f"idle {pct(idle_share)} of the {held:.1f} GPU-hours held (SM active p95 {pct(usage.sm_active_p95)})",
            idle,
        )

    if usage.shared:
        return done(Action.KEEP, "keep", "already shares its GPU (time-slicing or MPS)", 0.0)

    transfer_bound = usage.boundness.get(definitions.TRANSFER_CLASS, 0.0) / busy if busy > 0 else 0.0
    evidence["transfer_bound_share_of_busy"] = transfer_bound
    if transfer_bound >= policy.transfer_bound_share:
        # its SMs wait on the link: fewer SMs (a MIG slice) or a neighbour (time-slicing) would not
        # shorten its copies, and a slice gets only its share of the copy engines; no GPU-hours are
        # claimed, since how much faster its owner makes the copies is not known
        target, how = transfer_advice(usage)
        return done(
            Action.TRANSFER,
            target,
            f"transfer-bound {pct(transfer_bound)} of busy time, {_links(usage)}: its SMs wait on the link, so a "
            f"smaller slice or a shared GPU would not help; try {how}",
            0.0,
        )

    mem_bound = usage.boundness.get("memory", 0.0) / busy if busy > 0 else 0.0
    evidence["memory_bound_share_of_busy"] = mem_bound
    if (
        model is not None
        and not usage.mig_profile
        and mem_bound >= policy.memory_bound_share
        and (usage.dram_active_p95 or 0.0) >= policy.memory_bound_dram_p95
    ):
        faster = faster_models(model)
        if faster:
            new = faster[0]
            speedup = new.bandwidth_bytes_per_second / model.bandwidth_bytes_per_second
            # memory-bound time shrinks with bandwidth; the rest of the time does not
            new_hours = held * (1 - usage.boundness.get("memory", 0.0) * (1 - 1 / speedup))
            evidence["bandwidth_ratio"] = speedup
            new_price = price_for(f"NVIDIA {new.key}", prices)
            cost = None
            if unit_price is not None and new_price is not None:
                cost = held * unit_price - new_hours * new_price
            return done(
                Action.BANDWIDTH,
                new.key,
                f"memory-bound {pct(mem_bound)} of busy time, DRAM active p95 {pct(usage.dram_active_p95)}: "
                f"{new.key} has {speedup:.2f}x the HBM bandwidth of {model.key}",
                held - new_hours,
                cost,
                own_cost=True,
            )

    candidates: list[tuple[float, Action, str, str]] = []  # (new share, action, target, reason)
    if model is not None and usage.memory_peak_bytes is not None and sm_p95 is not None:
        need_mem = usage.memory_peak_bytes * policy.headroom
        need_sm = sm_p95 * policy.compute_headroom
        evidence["memory_needed_bytes"] = need_mem
        evidence["sm_needed_fraction"] = need_sm
        prof = smallest_profile(model, need_mem, need_sm)
        if prof is not None and prof.gpu_share < 1.0:
            candidates.append(
                (
                    prof.gpu_share,
                    Action.MIG,
                    prof.name,
                    f"peak {_gib(usage.memory_peak_bytes)} x {policy.headroom:g} fits {prof.name} "
                    f"({_gib(prof.memory_bytes)}), SM p95 {pct(sm_p95)} of the GPU x {policy.compute_headroom:g} "
                    f"fits {prof.compute_slices}/{prof.compute_total} of its SMs",
                )
            )
        elif prof is None or prof.gpu_share >= 1.0:
            largest = max(
                (p for p in model.mig_profiles if p.gpu_share < 1.0), key=lambda p: (p.memory_bytes, p.compute_slices)
            )
            evidence["no_mig_because"] = (
                f"peak x headroom {_gib(need_mem)} > {largest.name} ({_gib(largest.memory_bytes)})"
                if need_mem > largest.memory_bytes
                else f"SM p95 x headroom {pct(need_sm)} > {largest.compute_slices}/{largest.compute_total} of the SMs"
            )
        light = sm_mean is not None and sm_mean < policy.light_sm_mean
        bursty = (
            sm_mean is not None
            and sm_p95 >= policy.bursty_min_p95
            and sm_p95 >= policy.bursty_p95_over_mean * max(sm_mean, 1e-6)
        )
        mem_share = need_mem / model.memory_bytes
        if light and bursty and mem_share <= policy.share_max_memory and sm_mean is not None:
            new_share = max(sm_mean * policy.compute_headroom, mem_share)
            candidates.append(
                (
                    new_share,
                    Action.SHARE,
                    "time-slicing or MPS",
                    f"light and bursty: SM mean {pct(sm_mean)}, p95 {pct(sm_p95)}; "
                    f"peak {_gib(usage.memory_peak_bytes)} x {policy.headroom:g} is {pct(mem_share)} of GPU memory",
                )
            )
    if candidates:
        new_share, action, target, reason = min(candidates, key=lambda c: (c[0], c[1] != Action.MIG))
        if new_share < share:
            evidence["new_gpu_share"] = new_share
            return done(action, target, reason, held * (1 - new_share / share))
    if model is None:
        why = f"no profile table for {usage.gpu_model or 'an unknown model'}"
    elif usage.memory_peak_bytes is None:
        why = "GPU memory use not measured"
    else:
        why = str(evidence.get("no_mig_because") or "uses what it holds")
    return done(Action.KEEP, "keep", why, 0.0)


def recommend_all(
    usages: list[WorkloadUsage], prices: Mapping[str, float] | None = None, policy: Policy = DEFAULT_POLICY
) -> list[Recommendation]:
    """Recommendations for every workload, largest saving first."""
    recs = [recommend(u, prices, policy) for u in usages]
    return sorted(recs, key=lambda r: (-r.gpu_hours_saved, r.usage.name))
