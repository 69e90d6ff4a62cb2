"""Boundness classification: what limits each leaf (GPU or MIG instance) over a sliding time window.

Turns per-cycle GPM ratios into one of ``BOUNDNESS_CLASSES`` with hysteresis; docs/boundness.md
gives the physical reasoning behind every threshold and the H200 measurements.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from exporter.model import GpmSample

_SM, _OCC, _DRAM, _PIPE, _UTIL = range(5)
_N_SIGNALS = 5
_RESUM_EVERY = 4096
"""Appends between exact re-summations of a window (bounds float drift of the running sums)."""


@dataclass(frozen=True)
class Thresholds:
    """Decision thresholds, all ratios 0..1 of a window mean; each has an enter and an exit level.

    A condition switches on when its window mean reaches the *enter* level and off only when it
    falls past the *exit* level (a Schmitt trigger), so a mean hovering at one level cannot flap.
    See docs/boundness.md for why each level sits where it does.
    """

    memory_dram_enter: float = 0.60
    """GPM DRAM bandwidth utilisation (fraction of the theoretical peak) at which DRAM binds."""
    memory_dram_exit: float = 0.50
    compute_pipe_enter: float = 0.60
    """Busiest tensor/FP64/FP32/FP16 pipe activity at which arithmetic binds."""
    compute_pipe_exit: float = 0.50
    launch_sm_enter: float = 0.02
    """Below this SM activity, kernels that ran kept the SMs idle: launch/host bound."""
    launch_sm_exit: float = 0.04
    launch_sm_per_busy_enter: float = 0.2
    """Launch needs narrow kernels: SM activity / GPU-Util (SMs holding work while kernels ran)
    below this.  Keeps the fading tail of a wide workload (both means shrinking together) out."""
    launch_sm_per_busy_exit: float = 0.3
    busy_util_enter: float = 0.02
    """NVML GPU-Util (whole GPUs) at which "kernels ran" (launch vs idle)."""
    busy_util_exit: float = 0.01
    busy_sm_trace_enter: float = 1e-4
    """GPM SM activity that proves kernels ran when GPU-Util is unknown (MIG instances)."""
    busy_sm_trace_exit: float = 5e-5
    min_dwell_seconds: float = 2.0
    """A new class is exported only once it has been the candidate this long (suppresses the
    short transit through an intermediate class while the window slides across a step)."""

    def __post_init__(self) -> None:
        pairs = (
            ("memory_dram", self.memory_dram_enter, self.memory_dram_exit, True),
            ("compute_pipe", self.compute_pipe_enter, self.compute_pipe_exit, True),
            ("launch_sm", self.launch_sm_enter, self.launch_sm_exit, False),
            ("launch_sm_per_busy", self.launch_sm_per_busy_enter, self.launch_sm_per_busy_exit, False),
            ("busy_util", self.busy_util_enter, self.busy_util_exit, True),
            ("busy_sm_trace", self.busy_sm_trace_enter, self.busy_sm_trace_exit, True),
        )
        for name, enter, exit_, rising in pairs:
            if not (0.0 <= enter <= 1.0 and 0.0 <= exit_ <= 1.0):
                raise ValueError(f"{name}: thresholds must be ratios in 0..1")
            if (rising and exit_ > enter) or (not rising and exit_ < enter):
                raise ValueError(f"{name}: exit level {exit_} would not give hysteresis around {enter}")
        if self.min_dwell_seconds < 0:
            raise ValueError("min_dwell_seconds must be >= 0")


@dataclass(frozen=True)
class WindowMeans:
    """Time-weighted means (ratios 0..1) over the classifier window; ``None`` = no data."""

    sm_active: float | None
    sm_occupancy: float | None
    dram_active: float | None
    max_pipe_active: float | None
    utilization: float | None
    covered_seconds: float
    """Seconds of samples the means are taken over (<= the window)."""


class _Schmitt:
    """One hysteretic condition: ``value >= enter`` switches on, ``value < exit`` switches off."""

    __slots__ = ("enter", "exit", "on", "rising")

    def __init__(self, enter: float, exit_: float, rising: bool = True) -> None:
        self.enter = enter
        self.exit = exit_
        self.rising = rising
        self.on = False

    def update(self, value: float | None) -> bool:
        """Feed a window mean; ``None`` (signal unknown) keeps the current state."""
        if value is not None:
            if self.rising:
                self.on = value >= self.enter if not self.on else value >= self.exit
            else:
                self.on = value < self.enter if not self.on else value < self.exit
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
        covered = max(sw) if self._entries else 0.0
        return WindowMeans(out[_SM], out[_OCC], out[_DRAM], out[_PIPE], out[_UTIL], max(0.0, covered))

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


class _LeafState:
    __slots__ = (
        "busy_sm",
        "busy_util",
        "candidate",
        "candidate_since",
        "compute",
        "current",
        "launch",
        "memory",
        "narrow",
        "window",
    )

    def __init__(self, span: float, th: Thresholds) -> None:
        self.window = _Window(span)
        self.memory = _Schmitt(th.memory_dram_enter, th.memory_dram_exit)
        self.compute = _Schmitt(th.compute_pipe_enter, th.compute_pipe_exit)
        self.launch = _Schmitt(th.launch_sm_enter, th.launch_sm_exit, rising=False)
        self.busy_util = _Schmitt(th.busy_util_enter, th.busy_util_exit)
        self.busy_sm = _Schmitt(th.busy_sm_trace_enter, th.busy_sm_trace_exit)
        self.narrow = _Schmitt(th.launch_sm_per_busy_enter, th.launch_sm_per_busy_exit, rising=False)
        self.current: str | None = None
        self.candidate: str | None = None
        self.candidate_since = 0.0


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
    ) -> str | None:
        """Add one cycle's signals for a leaf and return its class, or ``None`` without GPM.

        ``gpm`` covers ``[now - gpm.window_seconds, now]`` (the backend's window); ``now`` is in
        seconds on any clock that only moves forward (a jump backwards restarts the leaf).
        ``utilization_ratio`` is NVML GPU-Util (``None`` for MIG instances); ``has_processes`` says
        whether NVML lists compute processes on the leaf.
        A ``None`` GPM (pre-Hopper, GPM refused, first cycle) adds nothing and returns ``None``;
        the leaf's earlier samples still age out of the window by time.
        """
        if gpm is None:
            return None
        values: tuple[float | None, ...] = (
            gpm.sm_active,
            gpm.sm_occupancy,
            gpm.dram_active,
            gpm.max_pipe_active(),
            utilization_ratio,
        )
        if values[_SM] is None and values[_DRAM] is None and values[_PIPE] is None:
            return None
        state = self._leaves.get(leaf_id)
        if state is None:
            state = self._leaves[leaf_id] = _LeafState(self.window_seconds, self.thresholds)
        last = state.window.last_end
        if last is not None and now < last:
            state = self._leaves[leaf_id] = _LeafState(self.window_seconds, self.thresholds)
            last = None
        duration = gpm.window_seconds
        if not duration > 0.0:
            duration = (now - last) if last is not None and now > last else 1.0
        state.window.add(now, duration, values)
        means = state.window.means(now)
        candidate = self._decide(state, means, has_processes)
        return self._settle(state, candidate, now)

    def window_means(self, leaf_id: str, now: float) -> WindowMeans | None:
        """The smoothed signals the leaf's class was taken from (roofline coordinates), if any."""
        state = self._leaves.get(leaf_id)
        return state.window.means(now) if state is not None else None

    def forget(self, keep: set[str]) -> None:
        """Drop the state of every leaf not in ``keep`` (GPU lost, MIG instance destroyed)."""
        for leaf_id in [k for k in self._leaves if k not in keep]:
            del self._leaves[leaf_id]

    def _decide(self, state: _LeafState, m: WindowMeans, has_processes: bool) -> str:
        # Every trigger sees every window mean, so its state is current whichever branch decides.
        memory = state.memory.update(m.dram_active)
        compute = state.compute.update(m.max_pipe_active)
        sm_low = state.launch.update(m.sm_active if m.sm_active is not None else 0.0)
        util_busy = state.busy_util.update(m.utilization)
        trace_busy = state.busy_sm.update(m.sm_active)
        narrow = state.narrow.update(
            (m.sm_active or 0.0) / m.utilization if m.utilization is not None and m.utilization > 0 else None
        )
        if memory and compute:
            return "mixed"
        if memory:
            return "memory"
        if compute:
            return "compute"
        if not sm_low:
            return "latency"
        # MIG: NVML has no per-instance GPU-Util.  A trace of SM activity on a leaf whose
        # processes NVML lists is then the evidence that kernels ran (see docs/boundness.md).
        # On a whole GPU the kernels must also have been narrow: SMs nearly idle *while kernels
        # ran*.  When a wide workload stops, SM activity and GPU-Util fade out of the window
        # together, and that tail is not a launch-bound phase.
        kernels_ran = (util_busy and narrow) if m.utilization is not None else (trace_busy and has_processes)
        return "launch" if kernels_ran else "idle"

    def _settle(self, state: _LeafState, candidate: str, now: float) -> str:
        if state.current is None:
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
