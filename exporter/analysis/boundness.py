"""Boundness classification: what limits each leaf (GPU or MIG instance) while it works.

Two questions, answered apart: *how much of the time does the leaf work* (the busy ratio, GPM
graphics-engine activity) and *what limits it while it works* (the class).  Each GPM sample is
classed on its DRAM and pipe activity divided by its own busy fraction; the class of a leaf is
the one that holds most of the busy time in a sliding time window, with hysteresis and a minimum
dwell.  docs/boundness.md gives the physical reasoning behind every level and the H200 and H100
runs.

Without GPM (pre-Hopper GPUs, ``--no-collect.gpm``) the same window, vote, dwell and stop rules
class each sample coarsely from NVML instead (``signals="nvml"``: ``busy``, ``memory``, ``launch``,
``transfer``; ``idle``), and a MIG instance without GPM reads only ``idle`` or no class
(``signals="processes"``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from exporter.model import BOUNDNESS_CLASSES, COMMUNICATION, SIGNALS_GPM, SIGNALS_NVML, SIGNALS_PROCESSES, GpmSample

BUSY_CLASSES: tuple[str, ...] = tuple(c for c in BOUNDNESS_CLASSES if c not in ("idle", COMMUNICATION))
"""Classes a working leaf can have (``idle`` is the absence of work)."""

# Window signal slots: raw means first, then busy-seconds per busy class.
_BUSY, _SM, _OCC, _DRAM, _PIPE, _UTIL, _XFER = range(7)
_VOTE0 = 7
_N_SIGNALS = _VOTE0 + len(BUSY_CLASSES)
_RESUM_EVERY = 4096
"""Appends between exact re-summations of a window (bounds float drift of the running sums)."""
_MIN_BUSY = 1e-6
"""A sample busier than this is classed; below it the leaf did nothing measurable."""


@dataclass(frozen=True)
class Thresholds:
    """Decision levels, all ratios 0..1.  See docs/boundness.md for why each sits where it does.

    Per-sample levels apply to activity *per busy time* (a resource's activity divided by the
    sample's busy fraction); window levels apply to shares of the window's busy time.
    """

    memory_dram_enter: float = 0.60
    """DRAM bandwidth per busy time (fraction of the theoretical peak) at which DRAM binds."""
    memory_dram_exit: float = 0.50
    compute_pipe_enter: float = 0.60
    """Busiest tensor/FP64/FP32/FP16 pipe activity per busy time at which arithmetic binds."""
    compute_pipe_exit: float = 0.50
    mixed_sum_enter: float = 0.60
    """DRAM + busiest pipe per busy time at which the two resources together bind ..."""
    mixed_sum_exit: float = 0.50
    mixed_part: float = 0.20
    """... provided each of the two accounts for at least this much of the busy time."""
    launch_sm_per_busy_enter: float = 0.02
    """SM activity per busy time below which the kernels that ran kept the SMs idle (launch)."""
    launch_sm_per_busy_exit: float = 0.04
    busy_enter: float = 0.01
    """Window busy ratio at which the leaf counts as working (below the exit level: ``idle``)."""
    busy_exit: float = 0.005
    busy_sm_trace_enter: float = 1e-4
    """Fallback when no busy signal exists (MIG without GPM graphics activity): SM activity that
    proves kernels ran on a leaf whose processes NVML lists."""
    busy_sm_trace_exit: float = 5e-5
    alternation_share: float = 0.40
    """Memory-bound and compute-bound samples each holding this share of the busy time: the
    leaf alternates between the two (slow phases, tenants taking turns), so ``mixed``."""
    transfer_link_enter: float = 0.50
    """Link utilisation per busy time (fraction of the link's capacity) at which a sample whose
    kernels saturate nothing is limited by its links: ``transfer``, not ``latency`` or ``launch``."""
    transfer_link_exit: float = 0.40
    stop_quiet_seconds: float = 1.0
    """A leaf that has done nothing (no kernel, no link traffic) this long has stopped: ``idle`` at
    once, without waiting for its work to leave the window ..."""
    stall_margin: float = 1.25
    """... unless the leaf already paused and resumed within the window: then a pause counts as a
    stop only once it is this many times longer than the longest such pause (a job stalled on its
    input keeps its class through its stalls)."""
    switch_margin: float = 0.20
    """The exported busy class yields only to a class whose share of busy time exceeds its own
    by this much (hysteresis: a 50/50 split cannot flap)."""
    min_dwell_seconds: float = 2.0
    """A new class is exported only once it has been the candidate this long."""

    # Without GPM (signals "nvml"): the coarse classes' levels, calibrated on an H200 with GPM off
    # (docs/boundness.md, "Without GPM": NVML util, memory-controller util and power of 11 loads)
    # and checked on an H100's 15 (issue 55).
    coarse_memory_util_enter: float = 0.60
    """Without GPM: NVML memory-controller utilisation per busy time (util.mem / GPU-Util) at which a
    sample is memory-heavy (``memory``).  util.mem is the fraction of time the memory controller was
    busy, not bytes over peak.  On the H200: copy loops 1.0-1.1, two tenants copying and multiplying
    0.65, GEMMs 0.05-0.26: 0.60 separates them."""
    coarse_memory_util_exit: float = 0.50
    coarse_util_min: float = 0.05
    """Without GPM: GPU-Util a sample needs before its power and memory-controller utilisation per
    busy time are read ("clearly above 0": NVML answers whole percents, so below 5 % those ratios
    are mostly rounding, and the power a few kernels add is within the noise); below it a sample
    with kernels reads ``busy``.  First estimate."""
    coarse_launch_power_enter: float = 0.35
    """Without GPM: the GPU's power above its idle power, as a fraction of its power limit and per
    busy time ((power - idle) / limit / GPU-Util), below which the kernels that ran kept the SMs
    (nearly) empty: ``launch``.  On the H200 (limit 700 W; idle 0.109 of it, 0.167 with a CUDA
    context): back-to-back tiny kernels (GPU-Util 0.26) 0.00 above the context's idle, 0.23 above
    the bare idle, 0.26 above the 0.10 guess; every load that fills the SMs 0.45 or more whichever
    idle it is measured from (a copy loop 0.51-0.58, a GEMM stalled half the time 0.45-0.52, a slow
    copy 0.45-0.59, GEMMs 0.76-0.89).  0.35 lies between, with room on both sides.  On the H100
    (limit 700 W; idle 0.104, 0.177 with a context; issue 55): tiny kernels 0.00 above the context's
    idle, 0.12-0.30 above the bare idle; a stalled GEMM 0.44-0.56, GEMMs 0.52-0.90; its copies only
    0.33-0.39 above the context's idle (HBM3 draws less), which is why ``memory`` (util.mem) is
    tested before this level and copies never depend on it."""
    coarse_launch_power_exit: float = 0.40
    coarse_idle_power_ratio: float = 0.10
    """Without GPM: a GPU's idle power as a fraction of its power limit, used until the leaf has been
    seen doing nothing (from then on, the least power it drew while idle: with a process listed,
    where one was, since a CUDA context keeps the GPU in a higher power state).  Set low on
    purpose (idle GPUs draw ~0.10-0.25 of their limit, the more with a context): too low a guess
    reads fewer samples ``launch``, not more.  First estimate."""

    def __post_init__(self) -> None:
        for name in (
            "mixed_part",
            "alternation_share",
            "switch_margin",
            "coarse_util_min",
            "coarse_idle_power_ratio",
        ):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}: thresholds must be ratios in 0..1")
        pairs = (
            ("memory_dram", self.memory_dram_enter, self.memory_dram_exit, True),
            ("compute_pipe", self.compute_pipe_enter, self.compute_pipe_exit, True),
            ("mixed_sum", self.mixed_sum_enter, self.mixed_sum_exit, True),
            ("launch_sm_per_busy", self.launch_sm_per_busy_enter, self.launch_sm_per_busy_exit, False),
            ("busy", self.busy_enter, self.busy_exit, True),
            ("busy_sm_trace", self.busy_sm_trace_enter, self.busy_sm_trace_exit, True),
            ("transfer_link", self.transfer_link_enter, self.transfer_link_exit, True),
            ("coarse_memory_util", self.coarse_memory_util_enter, self.coarse_memory_util_exit, True),
            ("coarse_launch_power", self.coarse_launch_power_enter, self.coarse_launch_power_exit, False),
        )
        for name, enter, exit_, rising in pairs:
            if not (0.0 <= enter <= 1.0 and 0.0 <= exit_ <= 1.0):
                raise ValueError(f"{name}: thresholds must be ratios in 0..1")
            if (rising and exit_ > enter) or (not rising and exit_ < enter):
                raise ValueError(f"{name}: exit level {exit_} would not give hysteresis around {enter}")
        if self.min_dwell_seconds < 0:
            raise ValueError("min_dwell_seconds must be >= 0")
        if self.stop_quiet_seconds <= 0:
            raise ValueError("stop_quiet_seconds must be > 0")
        if self.stall_margin < 1.0:
            raise ValueError("stall_margin must be >= 1")


class _SampleClasser:
    """Classes one GPM sample at a time by its activity per busy time, with per-leaf hysteresis.

    DRAM and pipe activity are divided by the sample's busy fraction: a job that stalls half the
    time on its input moves half as many bytes per second of wall time but exactly as many per
    second of work.  Small grids are not divided away: SM activity counts SM-time, so 20 blocks
    on 132 SMs read a low SM activity per busy time and land in ``latency``, where low
    parallelism belongs.  Each level is a Schmitt trigger across consecutive samples, so a
    workload whose per-sample value hovers at a level keeps one class.
    """

    __slots__ = ("coarse_launch", "coarse_memory", "compute", "launch", "memory", "mixed", "th", "transfer")

    def __init__(self, th: Thresholds) -> None:
        self.th = th
        self.transfer = _Schmitt(th.transfer_link_enter, th.transfer_link_exit)
        self.memory = _Schmitt(th.memory_dram_enter, th.memory_dram_exit)
        self.compute = _Schmitt(th.compute_pipe_enter, th.compute_pipe_exit)
        self.mixed = _Schmitt(th.mixed_sum_enter, th.mixed_sum_exit)
        self.launch = _Schmitt(th.launch_sm_per_busy_enter, th.launch_sm_per_busy_exit, rising=False)
        self.coarse_memory = _Schmitt(th.coarse_memory_util_enter, th.coarse_memory_util_exit)
        self.coarse_launch = _Schmitt(th.coarse_launch_power_enter, th.coarse_launch_power_exit, rising=False)

    def classify(
        self, busy: float, sm_active: float | None, dram_active: float | None, max_pipe_active: float | None
    ) -> str:
        """The busy class of a sample whose leaf was busy ``busy`` (> 0) of the sample's time."""
        dram = min(1.0, (dram_active or 0.0) / busy)
        pipe = min(1.0, (max_pipe_active or 0.0) / busy)
        memory = self.memory.update(dram)
        compute = self.compute.update(pipe)
        together = self.mixed.update(dram + pipe) and min(dram, pipe) >= self.th.mixed_part
        launch = self.launch.update(None if sm_active is None else sm_active / busy)
        if launch:
            return "launch"
        if memory and compute:
            return "mixed"
        # Hysteresis holds a class against noise, not against a second resource joining in: a
        # resource kept on only by its exit level does not dominate a mixture.
        dominant = dram >= self.th.memory_dram_enter or pipe >= self.th.compute_pipe_enter
        if together and not dominant:
            return "mixed"
        if memory:
            return "memory"
        if compute:
            return "compute"
        return "mixed" if together else "latency"

    def classify_coarse(self, busy: float, memory_util: float | None, power_excess: float | None) -> str:
        """The coarse class (no GPM) of a sample whose kernels ran ``busy`` (> 0) of its time.

        ``memory_util`` is NVML's memory-controller utilisation (0..1) and ``power_excess`` the
        GPU's power above its idle power as a fraction of its power limit; both per sample, ``None``
        when unknown.  Below ``coarse_util_min`` of GPU-Util: ``busy``.  ``memory`` when the memory
        controller was busy a large part of the busy time; else ``launch`` when the power excess per
        busy time is small (kernels ran, the SMs stayed nearly empty); otherwise ``busy`` (kernels
        ran, what limits them cannot be told).  Memory goes first: kernels that keep the memory
        controller busy are not launch-bound (tiny kernels read util.mem 0.00 on the H200 and the
        H100), and a copy's power is the model's HBM's (an H100's copy draws 0.33-0.39 of its limit
        above its context's idle per busy time, under the launch level; an H200's 0.43-0.59).
        Schmitt triggers across samples, as for the GPM classes.
        """
        if busy < self.th.coarse_util_min:
            return "busy"  # too few kernels for the ratios to tell anything
        memory = memory_util is not None and self.coarse_memory.update(min(1.0, memory_util / busy))
        launch = power_excess is not None and self.coarse_launch.update(min(1.0, power_excess / busy))
        if memory:
            return "memory"
        return "launch" if launch else "busy"

    def votes(
        self,
        kernels: float,
        link: float,
        sm_active: float | None,
        dram_active: float | None,
        max_pipe_active: float | None,
    ) -> dict[str, float]:
        """Busy class -> busy fraction of one sample whose kernels ran ``kernels`` and whose
        busiest link moved ``link`` (fraction of its capacity) of the sample's time.

        Copy-engine time is work.  Kernels that saturate a resource of their own (memory, compute,
        mixed) keep their class: copies hidden behind them do not limit the job, and only the
        link time beyond the kernel time goes to ``transfer``.  Kernels that saturate nothing
        (launch, latency: the SMs idle or wait) while the link runs near its capacity are waiting
        on the link, so the whole busy time is ``transfer``.  A sample with link traffic and no
        kernel at all is ``transfer``, at any rate: moving data was all the leaf did.
        """
        cls = self.classify(kernels, sm_active, dram_active, max_pipe_active) if kernels > _MIN_BUSY else None
        return self._split(kernels, link, cls)

    def coarse_votes(
        self, kernels: float, link: float, memory_util: float | None, power_excess: float | None
    ) -> dict[str, float]:
        """:meth:`votes` without GPM: the kernels' class is :meth:`classify_coarse`'s.  Launch-like
        kernels (power near idle) beside a busy link are waiting on it (``transfer``), as ``launch``
        is with GPM; ``busy`` and ``memory`` kernels keep their time."""
        cls = self.classify_coarse(kernels, memory_util, power_excess) if kernels > _MIN_BUSY else None
        return self._split(kernels, link, cls)

    def _split(self, kernels: float, link: float, cls: str | None) -> dict[str, float]:
        """Busy class -> busy fraction, from the kernels' time and class (``None``: no kernel ran)
        and the link's time (see :meth:`votes`)."""
        busy = max(kernels, link)
        transfer = self.transfer.update(link / busy if busy > _MIN_BUSY else None)
        if cls is None:
            return {"transfer": link} if link > _MIN_BUSY else {}
        if cls in ("launch", "latency") and transfer:
            return {"transfer": busy}
        out = {cls: kernels}
        if link > kernels:
            out["transfer"] = link - kernels
        return out


@dataclass(frozen=True)
class WindowMeans:
    """Time-weighted means (ratios 0..1) over the classifier window; ``None`` = no data."""

    busy: float | None
    """Busy ratio: GPM graphics-engine activity (NVML GPU-Util where GPM lacks it)."""
    sm_active: float | None
    sm_occupancy: float | None
    dram_active: float | None
    max_pipe_active: float | None
    utilization: float | None
    transfer: float | None
    """Busiest link's utilisation (fraction of its capacity)."""
    covered_seconds: float
    """Seconds of samples the means are taken over (<= the window)."""
    busy_shares: dict[str, float]
    """Busy class -> share of the window's busy time its samples hold (sums to 1, or empty)."""


class _Schmitt:
    """One hysteretic condition: ``value >= enter`` switches on, ``value < exit`` switches off
    (mirrored when ``rising`` is False: below ``enter`` on, at or above ``exit`` off)."""

    __slots__ = ("enter", "exit", "on", "rising")

    def __init__(self, enter: float, exit_: float, rising: bool = True) -> None:
        self.enter = enter
        self.exit = exit_
        self.rising = rising
        self.on = False

    def update(self, value: float | None) -> bool:
        """Feed a value; ``None`` (signal unknown) keeps the current state."""
        if value is not None:
            level = self.exit if self.on else self.enter
            self.on = value >= level if self.rising else value < level
        return self.on


class _Window:
    """Time-weighted running means of the signals over ``[now - span, now]``.

    Each entry covers ``[end - duration, end]``; the oldest entry may straddle the window start and
    then counts only with its overlap.  Running sums make ``add`` O(1) amortised.
    """

    __slots__ = ("_appends", "_entries", "_span", "_sw", "_swv")

    def __init__(self, span: float) -> None:
        self._span = span
        # (end, duration, values); values[i] None = that signal missing in the sample
        self._entries: deque[tuple[float, float, tuple[float | None, ...]]] = deque()
        self._sw = [0.0] * _N_SIGNALS
        self._swv = [0.0] * _N_SIGNALS
        self._appends = 0

    @property
    def last_end(self) -> float | None:
        return self._entries[-1][0] if self._entries else None

    def add(self, end: float, duration: float, values: tuple[float | None, ...]) -> None:
        self._entries.append((end, duration, values))
        self._accumulate(duration, values, 1.0)
        self._appends += 1
        self._evict(end)
        if self._appends >= _RESUM_EVERY:
            self._resum()

    def means(self, now: float) -> WindowMeans:
        start = now - self._span
        sw = list(self._sw)
        swv = list(self._swv)
        if self._entries:
            o_end, o_dur, o_vals = self._entries[0]
            outside = min(o_dur, max(0.0, start - (o_end - o_dur)))
            if outside > 0.0:
                for i, v in enumerate(o_vals):
                    if v is not None:
                        sw[i] -= outside
                        swv[i] -= outside * v
        out: list[float | None] = []
        for i in range(_N_SIGNALS):
            if sw[i] > 1e-9:
                out.append(min(1.0, max(0.0, swv[i] / sw[i])))
            else:
                out.append(None)
        votes = [v or 0.0 for v in out[_VOTE0:]]
        total = sum(votes)
        shares = {c: v / total for c, v in zip(BUSY_CLASSES, votes, strict=True)} if total > 1e-12 else {}
        covered = max(sw[:_VOTE0]) if self._entries else 0.0
        return WindowMeans(
            busy=out[_BUSY],
            sm_active=out[_SM],
            sm_occupancy=out[_OCC],
            dram_active=out[_DRAM],
            max_pipe_active=out[_PIPE],
            utilization=out[_UTIL],
            transfer=out[_XFER],
            covered_seconds=max(0.0, covered),
            busy_shares=shares,
        )

    def _accumulate(self, duration: float, values: tuple[float | None, ...], sign: float) -> None:
        for i, v in enumerate(values):
            if v is not None:
                self._sw[i] += sign * duration
                self._swv[i] += sign * duration * v

    def _evict(self, now: float) -> None:
        start = now - self._span
        entries = self._entries
        while entries and entries[0][0] <= start:
            _, dur, vals = entries.popleft()
            self._accumulate(dur, vals, -1.0)
        if not entries:
            self._sw = [0.0] * _N_SIGNALS
            self._swv = [0.0] * _N_SIGNALS

    def _resum(self) -> None:
        self._appends = 0
        self._sw = [0.0] * _N_SIGNALS
        self._swv = [0.0] * _N_SIGNALS
        for _, dur, vals in self._entries:
            self._accumulate(dur, vals, 1.0)


class _Pauses:
    """How long a leaf has done nothing, and the longest pause it resumed from within the window.

    A pause is a run of samples with no work (busy under the idle level), lengthened by the idle
    part of the samples on either side: a sample busy ``b`` of its ``duration`` before the run
    ended with ``(1 - b) * duration`` of nothing (a stop part-way through a sample), and the one
    that ends the run began with that much.  A partly busy sample alone is no pause: a steady
    load busy a quarter of every sample spreads its work over the sample.
    """

    __slots__ = ("_resumed", "_run", "_span", "_tail")

    def __init__(self, span: float) -> None:
        self._span = span
        self._run = 0.0  # seconds of whole samples with no work, up to now
        self._tail = 0.0  # idle part of the last sample that had work
        self._resumed: deque[tuple[float, float]] = deque()  # (resumed at, pause length), lengths falling

    @property
    def quiet(self) -> float:
        """Seconds the leaf has done nothing, up to now (0 while its last sample had work)."""
        return self._run + self._tail if self._run > 0.0 else 0.0

    def add(self, end: float, duration: float, busy: float, idle_below: float) -> None:
        """Feed a sample ending at ``end`` that was busy ``busy`` (0..1) of ``duration`` seconds."""
        if busy < idle_below:
            self._run += duration
            return
        gap = duration * (1.0 - busy)
        if self._run > 0.0:
            pause = self._run + self._tail + gap
            while self._resumed and self._resumed[-1][1] <= pause:
                self._resumed.pop()  # keep a falling sequence: its head is the longest pause
            self._resumed.append((end, pause))
        self._run = 0.0
        self._tail = gap

    def longest(self, now: float) -> float:
        """The longest pause the leaf resumed from within the last window (0: none)."""
        while self._resumed and self._resumed[0][0] <= now - self._span:
            self._resumed.popleft()
        return self._resumed[0][1] if self._resumed else 0.0

    def forget_resumes(self) -> None:
        """A stop was called: the pauses before it say nothing about the next load."""
        self._resumed.clear()


class _LeafState:
    __slots__ = (
        "busy",
        "busy_trace",
        "candidate",
        "candidate_since",
        "classer",
        "context_idle_power",
        "current",
        "idle_power",
        "last_at",
        "pauses",
        "processes_at",
        "resume_class",
        "signals",
        "stopped",
        "window",
    )

    def __init__(self, span: float, th: Thresholds, signals: str = SIGNALS_GPM) -> None:
        self.signals = signals
        """The source the leaf is classed from (``SIGNALS_*``); a change restarts the leaf."""
        self.last_at: float | None = None
        """Without GPM: when the leaf was last observed (a sample covers the time since)."""
        self.idle_power: float | None = None
        """Without GPM: the least power (fraction of the limit) drawn while the leaf did nothing and
        NVML listed no process on it ..."""
        self.context_idle_power: float | None = None
        """... and while it did nothing with a process listed (a CUDA context keeps the GPU in a
        higher power state: the baseline of a job's own kernels)."""
        self.processes_at: float | None = None
        """MIG without GPM: when NVML last listed a compute process on the leaf."""
        self.window = _Window(span)
        self.classer = _SampleClasser(th)
        self.busy = _Schmitt(th.busy_enter, th.busy_exit)
        self.busy_trace = _Schmitt(th.busy_sm_trace_enter, th.busy_sm_trace_exit)
        self.pauses = _Pauses(span)
        self.current: str | None = None
        self.candidate: str | None = None
        self.candidate_since = 0.0
        self.stopped = False
        """True from a stop (``idle`` called on a quiet run) until work resumes."""
        self.resume_class: str | None = None
        """The class before the stop: work that resumes with it takes it back at once."""

    def learn_idle_power(self, power_ratio: float, has_processes: bool) -> None:
        """Without GPM: a sample in which nothing ran drew ``power_ratio`` of the power limit."""
        if has_processes:
            seen = self.context_idle_power
            self.context_idle_power = power_ratio if seen is None else min(seen, power_ratio)
        else:
            seen = self.idle_power
            self.idle_power = power_ratio if seen is None else min(seen, power_ratio)

    def idle_power_for(self, has_processes: bool, default: float) -> float:
        """The power (fraction of the limit) the leaf draws doing nothing, as the baseline of a
        sample's kernels: with a context where one was seen idle, else the least idle power seen,
        else ``default``."""
        if has_processes and self.context_idle_power is not None:
            return self.context_idle_power
        seen = [p for p in (self.idle_power, self.context_idle_power) if p is not None]
        return min(seen) if seen else default


def kernel_busy(gpm: GpmSample | None, utilization_ratio: float | None) -> float | None:
    """The fraction of one sample that kernels ran: GPM graphics-engine activity, else NVML
    GPU-Util, else None.

    Graphics-engine activity is the fraction of time a context ran work on the leaf (GPM gives it
    per MIG instance too); NVML GPU-Util is the same duty cycle for whole GPUs on drivers whose
    GPM lacks the metric.  On the H200 the two agree within 0.01 on steady work, not at edges or
    on duty-cycled work (docs/boundness.md).
    """
    if gpm is not None and gpm.graphics_active is not None:
        return gpm.graphics_active
    return utilization_ratio


def busy_signal(gpm: GpmSample | None, utilization_ratio: float | None, transfer: float | None = None) -> float | None:
    """The busy ratio of one sample: the larger of the kernels' time (:func:`kernel_busy`) and the
    busiest link's utilisation, ``None`` when neither is known.

    Copy-engine work is work: a leaf that moves data over PCIe or NVLink is busy at least the
    fraction of the time its link needed to carry those bytes (bytes over capacity).
    """
    kernels = kernel_busy(gpm, utilization_ratio)
    known = [v for v in (kernels, transfer) if v is not None]
    return max(known) if known else None


class BoundnessClassifier:
    """Per-leaf boundness over a sliding time window, with hysteresis.

    The sampler calls ``observe`` once per cycle for every leaf and ``forget`` with the leaves
    still present.  Each call is O(1) amortised: the window keeps running sums.
    """

    def __init__(self, window_seconds: float = 10.0, thresholds: Thresholds | None = None) -> None:
        if window_seconds <= 0:
            raise ValueError("window_seconds must be > 0")
        self.window_seconds = window_seconds
        self.thresholds = thresholds if thresholds is not None else Thresholds()
        self._leaves: dict[str, _LeafState] = {}

    def observe(
        self,
        leaf_id: str,
        gpm: GpmSample | None,
        utilization_ratio: float | None,
        has_processes: bool,
        now: float,
        transfer: float | None = None,
        *,
        signals: str = SIGNALS_GPM,
        memory_utilization_ratio: float | None = None,
        power_ratio: float | None = None,
    ) -> str | None:
        """Add one cycle's signals for a leaf and return its class, or ``None`` when nothing classes it.

        ``gpm`` covers ``[now - gpm.window_seconds, now]`` (the backend's window); ``now`` is in
        seconds on any clock that only moves forward (a jump backwards restarts the leaf).
        ``utilization_ratio`` is NVML GPU-Util (``None`` for MIG instances), the busy signal when
        GPM has no graphics activity; ``has_processes`` says whether NVML lists compute processes
        on the leaf (used only without any busy signal); ``transfer`` is the busiest link's
        utilisation over the same window (:func:`exporter.model.transfer_ratio`), ``None`` when
        the leaf's links are not measured.
        A ``None`` GPM (first cycle, a failed window) adds nothing and returns ``None``; the leaf's
        earlier samples still age out of the window by time.

        ``signals`` says what the leaf has (``exporter.model.SIGNALS_*``): ``gpm`` (the default:
        the GPM classes above); ``nvml`` (a whole GPU without GPM: ``gpm`` is ignored and the coarse
        classes idle/busy/memory/launch/transfer come from ``utilization_ratio``, ``transfer``,
        ``memory_utilization_ratio`` (NVML util.mem, 0..1) and ``power_ratio`` (power draw over
        the power limit, 0..1)); ``processes`` (a MIG instance without GPM: ``idle`` when
        ``has_processes`` was false over the whole window, else ``None``).  A leaf whose
        ``signals`` change starts afresh.
        """
        if signals == SIGNALS_NVML:
            return self._observe_nvml(
                leaf_id, utilization_ratio, has_processes, now, transfer, memory_utilization_ratio, power_ratio
            )
        if signals == SIGNALS_PROCESSES:
            return self._observe_processes(leaf_id, has_processes, now)
        if gpm is None:
            return None
        pipe = gpm.max_pipe_active()
        if gpm.sm_active is None and gpm.dram_active is None and pipe is None:
            return None
        state = self._leaves.get(leaf_id)
        if state is None or state.signals != SIGNALS_GPM:
            state = self._leaves[leaf_id] = _LeafState(self.window_seconds, self.thresholds)
        last = state.window.last_end
        if last is not None and now < last:
            state = self._leaves[leaf_id] = _LeafState(self.window_seconds, self.thresholds)
            last = None
        duration = gpm.window_seconds
        if not duration > 0.0:
            duration = (now - last) if last is not None and now > last else 1.0
        kernels = kernel_busy(gpm, utilization_ratio)
        busy = busy_signal(gpm, utilization_ratio, transfer)
        votes = [0.0] * len(BUSY_CLASSES)
        if kernels is None:
            # Without a busy signal every sample weighs by time alone and nothing is normalised.
            cls = state.classer.classify(1.0, gpm.sm_active, gpm.dram_active, pipe)
            votes[BUSY_CLASSES.index(cls)] = 1.0
        else:
            shares = state.classer.votes(kernels, transfer or 0.0, gpm.sm_active, gpm.dram_active, pipe)
            for cls, weight in shares.items():
                votes[BUSY_CLASSES.index(cls)] = weight
        values = (busy, gpm.sm_active, gpm.sm_occupancy, gpm.dram_active, pipe, utilization_ratio, transfer, *votes)
        return self._advance(state, now, duration, busy, values, has_processes)

    def _advance(
        self,
        state: _LeafState,
        now: float,
        duration: float,
        busy: float | None,
        values: tuple[float | None, ...],
        has_processes: bool,
    ) -> str:
        """Add one sample (``values`` in window slot order, covering ``duration`` seconds up to
        ``now``) and return the class: the stop rule, then the window vote, then the dwell."""
        if busy is not None:
            state.pauses.add(now, duration, busy, self.thresholds.busy_exit)
        if self._stopped(state, now):
            state.window.add(now, duration, values)
            return self._settle(state, "idle", now, at_once=True)
        state.window.add(now, duration, values)
        means = state.window.means(now)
        candidate = self._decide(state, means, has_processes)
        resumed = state.stopped and candidate != "idle"
        if resumed:
            state.stopped = False
        return self._settle(state, candidate, now, at_once=resumed and candidate == state.resume_class)

    def _state_without_gpm(self, leaf_id: str, signals: str, now: float) -> tuple[_LeafState, float | None]:
        """The leaf's state on a path without GPM (restarted when its source changed or the clock
        went back) and the time of its previous observation (``None``: the first)."""
        state = self._leaves.get(leaf_id)
        if state is None or state.signals != signals or (state.last_at is not None and now < state.last_at):
            state = self._leaves[leaf_id] = _LeafState(self.window_seconds, self.thresholds, signals)
        last = state.last_at
        state.last_at = now
        return state, last

    def _observe_nvml(
        self,
        leaf_id: str,
        utilization_ratio: float | None,
        has_processes: bool,
        now: float,
        transfer: float | None,
        memory_utilization_ratio: float | None,
        power_ratio: float | None,
    ) -> str | None:
        """A whole GPU without GPM: coarse classes from GPU-Util (the kernels' time), the links,
        the memory-controller utilisation and the power, through the same window, vote, dwell and
        stop rules as the GPM classes.  A sample covers the time since the leaf's previous one (1 s
        for the first, as a GPM sample without a window)."""
        th = self.thresholds
        state, last = self._state_without_gpm(leaf_id, SIGNALS_NVML, now)
        busy = busy_signal(None, utilization_ratio, transfer)
        if busy is None:
            return None  # nothing measured the leaf this cycle
        duration = now - last if last is not None and now > last else 1.0
        kernels = utilization_ratio or 0.0
        link = transfer or 0.0
        excess = None
        if power_ratio is not None:
            if busy < th.busy_exit:
                state.learn_idle_power(power_ratio, has_processes)
            excess = max(0.0, power_ratio - state.idle_power_for(has_processes, th.coarse_idle_power_ratio))
        votes = [0.0] * len(BUSY_CLASSES)
        for cls, weight in state.classer.coarse_votes(kernels, link, memory_utilization_ratio, excess).items():
            votes[BUSY_CLASSES.index(cls)] = weight
        values = (busy, None, None, None, None, utilization_ratio, transfer, *votes)
        return self._advance(state, now, duration, busy, values, has_processes)

    def _observe_processes(self, leaf_id: str, has_processes: bool, now: float) -> str | None:
        """A MIG instance without GPM, which has no GPU-Util: ``idle`` when NVML listed no compute
        process on it over the window, otherwise ``None`` (nothing measures its use)."""
        state, _ = self._state_without_gpm(leaf_id, SIGNALS_PROCESSES, now)
        if has_processes:
            state.processes_at = now
        if state.processes_at is not None and now - state.processes_at < self.window_seconds:
            state.current = None
            return None
        state.current = "idle"
        return "idle"

    def window_means(self, leaf_id: str, now: float) -> WindowMeans | None:
        """The smoothed signals the leaf's class was taken from (roofline coordinates), if any."""
        state = self._leaves.get(leaf_id)
        return state.window.means(now) if state is not None else None

    def forget(self, keep: set[str]) -> None:
        """Drop the state of every leaf not in ``keep`` (GPU lost, MIG instance destroyed)."""
        for leaf_id in [k for k in self._leaves if k not in keep]:
            del self._leaves[leaf_id]

    def _stopped(self, state: _LeafState, now: float) -> bool:
        """True when the leaf has done nothing for ``stop_quiet_seconds``, or, if it already
        paused and resumed within the window, ``stall_margin`` times its longest such pause."""
        th = self.thresholds
        quiet = state.pauses.quiet
        if quiet < th.stop_quiet_seconds:
            return False
        if not state.stopped and quiet < state.pauses.longest(now) * th.stall_margin:
            return False
        if not state.stopped:
            # A stop: the stopped load's samples no longer speak for the leaf (the next load is
            # classed on its own samples), and its pauses say nothing about the next load's.
            state.stopped = True
            state.resume_class = state.current
            state.pauses.forget_resumes()
            state.classer = _SampleClasser(th)
            state.window = _Window(self.window_seconds)
        return True

    def _decide(self, state: _LeafState, m: WindowMeans, has_processes: bool) -> str:
        th = self.thresholds
        if m.busy is not None:
            working = state.busy.update(m.busy)
        else:
            # No duty-cycle signal (MIG instance on a driver without GPM graphics activity): a
            # trace of SM activity on a leaf whose processes NVML lists is the evidence of work.
            working = state.busy_trace.update(m.sm_active) and has_processes
        if not working or not m.busy_shares:
            state.classer = _SampleClasser(th)  # the next load is classed afresh
            return "idle"
        shares = m.busy_shares
        current = state.current
        # Alternation keeps its own hysteresis: once mixed, it takes a clearer majority to leave.
        alternation = th.alternation_share - (th.switch_margin / 2 if current == "mixed" else 0.0)
        if shares["memory"] >= alternation and shares["compute"] >= alternation:
            return "mixed"
        best = max(BUSY_CLASSES, key=lambda c: shares[c])
        if current in shares and current != best and shares[current] + th.switch_margin >= shares[best]:
            return current
        return best

    def _settle(self, state: _LeafState, candidate: str, now: float, at_once: bool = False) -> str:
        """Export ``candidate`` once it has held ``min_dwell_seconds`` (``at_once``: a stop, or
        work resuming with the class it had before the stop, needs no dwell)."""
        if state.current is None or at_once:
            state.current = candidate
            state.candidate = None
            return candidate
        if candidate == state.current:
            state.candidate = None
            return candidate
        if candidate != state.candidate:
            state.candidate = candidate
            state.candidate_since = now
        if now - state.candidate_since >= self.thresholds.min_dwell_seconds:
            state.current = candidate
            state.candidate = None
        return state.current
