"""Boundness classifier: classes, hysteresis, time-based windows, settle time, recorded H200 traces."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporter.analysis.boundness import BoundnessClassifier, Thresholds
from exporter.model import RAW_GPM_CLASSES, GpmSample
from tests.support.gpm_traces import (
    MANIFESTS,
    RECORDED_ALL,
    RECORDED_BY_MODEL,
    changes,
    load_phases,
    recorded_gpm,
    settle_seconds,
    trace_path,
)


@dataclass(frozen=True)
class Signature:
    """Steady GPM signals of one workload (ratios), plus NVML GPU-Util and whether a process exists."""

    sm: float = 0.0
    occ: float = 0.0
    tensor: float = 0.0
    fp32: float = 0.0
    dram: float = 0.0
    util: float | None = 0.0
    processes: bool = False
    busy: float | None = -1.0
    """GPM graphics-engine activity; -1 = the same as ``util`` (they agree on the H200)."""
    link: float | None = None
    """The busiest link's utilisation (fraction of its capacity); ``None`` = links not measured."""

    def sample(self, window: float) -> GpmSample:
        return GpmSample(
            window_seconds=window,
            sm_active=self.sm,
            sm_occupancy=self.occ,
            tensor_active=self.tensor,
            fp64_active=0.0,
            fp32_active=self.fp32,
            fp16_active=0.0,
            dram_active=self.dram,
            graphics_active=self.util if self.busy == -1.0 else self.busy,
        )

    def stalled(self, duty: float) -> Signature:
        """The same kernels running ``duty`` of the time (a job waiting on its input the rest)."""
        return Signature(
            sm=self.sm * duty,
            occ=self.occ * duty,
            tensor=self.tensor * duty,
            fp32=self.fp32 * duty,
            dram=self.dram * duty,
            util=None if self.util is None else self.util * duty,
            processes=self.processes,
            busy=self.busy if self.busy in (-1.0, None) else self.busy * duty,
            link=None if self.link is None else self.link * duty,
        )


def timesliced(a: Signature, b: Signature, share_a: float = 0.5) -> Signature:
    """Two tenants taking turns within every sample (time-slicing), both running flat out."""
    share_b = 1.0 - share_a
    return Signature(
        sm=a.sm * share_a + b.sm * share_b,
        occ=a.occ * share_a + b.occ * share_b,
        tensor=a.tensor * share_a + b.tensor * share_b,
        fp32=a.fp32 * share_a + b.fp32 * share_b,
        dram=a.dram * share_a + b.dram * share_b,
        util=1.0,
        processes=True,
    )


# Per-load GPM signatures measured on an H200 (docs/boundness.md, 1 s GPM windows).
IDLE = Signature()
COPY = Signature(sm=0.99, occ=0.80, dram=0.88, util=1.0, processes=True)
BF16_GEMM = Signature(sm=0.96, occ=0.14, tensor=0.93, dram=0.17, util=0.99, processes=True)
FP32_GEMM = Signature(sm=0.96, occ=0.12, fp32=0.77, dram=0.03, util=0.99, processes=True)
TINY_KERNELS = Signature(sm=0.0002, util=0.23, processes=True)
HOLDS_MEMORY = Signature(util=0.0, processes=True)
# Shapes not in the H200 table, for the classes it does not reach.
POINTER_CHASE = Signature(sm=0.90, occ=0.30, fp32=0.05, dram=0.12, util=1.0, processes=True)
RIDGE_GEMM = Signature(sm=0.98, occ=0.25, tensor=0.70, dram=0.70, util=1.0, processes=True)
# Pinned host-to-device copies saturating a PCIe Gen5 x16 link (51.5 of 63 GB/s), no kernel:
# NVML GPU-Util 1.0, GPM graphics and SM activity 0 (the H200 run).
H2D_COPY = Signature(util=1.0, busy=0.0, link=0.82, processes=True)

EXPECTED = {
    "idle": IDLE,
    "memory": COPY,
    "compute": BF16_GEMM,
    "launch": TINY_KERNELS,
    "latency": POINTER_CHASE,
    "mixed": RIDGE_GEMM,
    "transfer": H2D_COPY,
}


def feed(
    clf: BoundnessClassifier,
    phases: Sequence[tuple[Signature, float]],
    interval: float = 1.0,
    leaf: str = "GPU-0",
    start: float = 1000.0,
) -> list[tuple[float, str | None]]:
    """Feed consecutive (signature, seconds) phases at a fixed interval; return (t, class) per sample."""
    out: list[tuple[float, str | None]] = []
    t = start
    for sig, seconds in phases:
        for _ in range(round(seconds / interval)):
            t += interval
            out.append((t, clf.observe(leaf, sig.sample(interval), sig.util, sig.processes, t, sig.link)))
    return out


# --- every class -----------------------------------------------------------------------------


@pytest.mark.parametrize("expected", RAW_GPM_CLASSES)
def test_every_class_is_reachable_from_its_workload_shape(expected: str) -> None:
    trace = feed(BoundnessClassifier(), [(EXPECTED[expected], 30.0)])
    assert trace[-1][1] == expected
    assert changes(c for _, c in trace) == 0, "a steady workload must keep one class from the start"


@pytest.mark.parametrize(
    ("signature", "expected"),
    [
        (IDLE, "idle"),
        (COPY, "memory"),
        (BF16_GEMM, "compute"),
        (FP32_GEMM, "compute"),
        (TINY_KERNELS, "launch"),
        (HOLDS_MEMORY, "idle"),
    ],
    ids=["nothing", "d2d-copy", "bf16-gemm", "fp32-gemm-no-tf32", "tiny-kernels", "holds-40gib"],
)
def test_h200_workload_signatures_get_the_class_an_sre_expects(signature: Signature, expected: str) -> None:
    assert feed(BoundnessClassifier(), [(signature, 15.0)])[-1][1] == expected


def test_nvidia_smi_busy_but_sms_idle_reads_launch_not_busy() -> None:
    # GPU-Util says a quarter busy; GPM says the SMs are idle 99.98 % of the time.
    trace = feed(BoundnessClassifier(), [(TINY_KERNELS, 20.0)])
    assert {c for _, c in trace} == {"launch"}


# --- MIG leaves (no GPU-Util) ----------------------------------------------------------------


def test_mig_instance_with_tiny_kernels_reads_launch_from_the_sm_trace() -> None:
    mig_tiny = Signature(sm=0.0016, util=None, processes=True)  # the H200 stream scaled to 16 SMs
    assert feed(BoundnessClassifier(), [(mig_tiny, 15.0)])[-1][1] == "launch"


def test_mig_instance_holding_memory_and_running_nothing_reads_idle() -> None:
    assert feed(BoundnessClassifier(), [(Signature(util=None, processes=True), 15.0)])[-1][1] == "idle"


def test_mig_sm_trace_without_a_listed_process_reads_idle() -> None:
    assert feed(BoundnessClassifier(), [(Signature(sm=0.001, util=None), 15.0)])[-1][1] == "idle"


def test_mig_instance_saturating_its_dram_share_reads_memory() -> None:
    mig_copy = Signature(sm=0.99, occ=0.8, dram=0.85, util=None, processes=True)
    assert feed(BoundnessClassifier(), [(mig_copy, 15.0)])[-1][1] == "memory"


# --- hysteresis ------------------------------------------------------------------------------


def hovering_dram(n: int, seed: int, centre: float, interval: float) -> list[Signature]:
    """DRAM noisy per sample (+-0.05) around a centre that drifts slowly by +-0.02.

    The 10 s window mean of this wanders by about +-0.045: less than the 0.10 hysteresis band, as a
    steady workload's does (a real change moves it much further)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        dram = centre + 0.02 * math.sin(2 * math.pi * i * interval / 37.0) + rng.uniform(-0.05, 0.05)
        out.append(Signature(sm=0.95, occ=0.5, dram=min(1.0, max(0.0, dram)), util=1.0, processes=True))
    return out


@pytest.mark.parametrize("centre", [0.60, 0.50], ids=["at-enter-level", "at-exit-level"])
def test_dram_hovering_at_the_memory_boundary_does_not_flap(centre: float) -> None:
    clf = BoundnessClassifier()
    sigs = hovering_dram(600, seed=7, centre=centre, interval=1.0)
    classes = [clf.observe("g", s.sample(1.0), s.util, True, 1000.0 + i) for i, s in enumerate(sigs)]
    assert set(classes) <= {"memory", "latency"}
    assert changes(classes) <= 1


def test_without_hysteresis_the_same_hovering_signal_would_flap() -> None:
    # Guards the test above: with enter == exit and no dwell the classifier does flap on this input.
    no_hysteresis = Thresholds(memory_dram_enter=0.6, memory_dram_exit=0.6, min_dwell_seconds=0.0)
    clf = BoundnessClassifier(thresholds=no_hysteresis)
    sigs = hovering_dram(600, seed=7, centre=0.60, interval=1.0)
    classes = [clf.observe("g", s.sample(1.0), s.util, True, 1000.0 + i) for i, s in enumerate(sigs)]
    assert changes(classes) >= 5


def test_sm_activity_hovering_at_the_launch_boundary_does_not_flap() -> None:
    rng = random.Random(3)
    clf = BoundnessClassifier()
    classes = []
    for i in range(600):
        sm = max(0.0, 0.022 + 0.006 * math.sin(i / 9.0) + rng.uniform(-0.01, 0.01))
        sig = Signature(sm=sm, util=0.3, processes=True)
        classes.append(clf.observe("g", sig.sample(1.0), sig.util, True, 1000.0 + i))
    assert set(classes) <= {"launch", "latency"}
    assert changes(classes) <= 1


def test_a_short_burst_does_not_change_the_class() -> None:
    # A 2 s copy inside a long GEMM run moves the 10 s DRAM mean by ~0.14: no flap to mixed/memory.
    trace = feed(BoundnessClassifier(), [(BF16_GEMM, 20.0), (COPY, 2.0), (BF16_GEMM, 20.0)])
    assert {c for _, c in trace} == {"compute"}


# --- settle time -----------------------------------------------------------------------------

STEP_CASES = [
    (a, b)
    for a in ("idle", "memory", "compute", "launch", "latency", "mixed")
    for b in ("idle", "memory", "compute", "launch", "latency", "mixed")
    if a != b
]


@pytest.mark.parametrize(("before", "after"), STEP_CASES, ids=[f"{a}->{b}" for a, b in STEP_CASES])
@pytest.mark.parametrize("interval", [0.5, 1.0, 3.0])
def test_class_settles_within_two_windows_after_a_step(before: str, after: str, interval: float) -> None:
    window = 10.0
    clf = BoundnessClassifier(window_seconds=window)
    trace = feed(clf, [(EXPECTED[before], 30.0), (EXPECTED[after], 30.0)], interval=interval, start=0.0)
    assert trace[round(30.0 / interval) - 1][1] == before
    settled = settle_seconds(trace, 30.0, after)
    assert settled is not None, f"never settled on {after}"
    assert settled <= 2 * window


@pytest.mark.parametrize("window", [5.0, 10.0, 30.0])
@pytest.mark.parametrize("interval", [0.5, 1.0])
@pytest.mark.parametrize("load", ["memory", "compute", "transfer", "mixed", "latency"])
def test_a_stopped_load_reads_idle_within_two_seconds_whatever_the_window(
    load: str, interval: float, window: float
) -> None:
    # The stop is part-way through a sample (0.3 s in): the first sample after it is 30 % busy.
    sig = EXPECTED[load]
    tail = Signature(
        sm=sig.sm * 0.3,
        occ=sig.occ * 0.3,
        tensor=sig.tensor * 0.3,
        fp32=sig.fp32 * 0.3,
        dram=sig.dram * 0.3,
        util=None if sig.util is None else sig.util * 0.3,
        processes=True,
        busy=sig.busy if sig.busy in (-1.0, None) else sig.busy * 0.3,
        link=None if sig.link is None else sig.link * 0.3,
    )
    clf = BoundnessClassifier(window)
    before = feed(clf, [(sig, 30.0)], interval=interval, start=0.0)
    assert before[-1][1] == load
    after = feed(clf, [(tail, interval), (HOLDS_MEMORY, 20.0)], interval=interval, start=30.0)
    stop = 30.0 + interval * 0.7
    first_idle = next(t for t, c in after if c == "idle")
    assert first_idle - stop <= 2.0, after
    assert {c for t, c in after if t < first_idle} <= {load}, "no other class on the way to idle"
    assert {c for t, c in after if t >= first_idle} == {"idle"}


def test_a_load_stopping_then_another_starting_is_classed_on_its_own_samples() -> None:
    # Copy, 3 s of nothing, then a GEMM: the copy's samples left with the stop, so the GEMM is
    # never shown as memory; it is classed after the dwell.
    trace = feed(BoundnessClassifier(), [(COPY, 30.0), (HOLDS_MEMORY, 3.0), (BF16_GEMM, 20.0)], start=0.0)
    after = [c for t, c in trace if t > 33.0]
    assert "memory" not in after
    assert settle_seconds(trace, 33.0, "compute") == pytest.approx(3.0)


def test_a_load_starting_on_an_idle_leaf_is_classed_after_the_dwell_whatever_the_window() -> None:
    # Activity per busy time: the first busy sample already shows what limits the new load.
    for window in (5.0, 30.0):
        trace = feed(BoundnessClassifier(window), [(IDLE, 40.0), (COPY, 40.0)], start=0.0)
        assert settle_seconds(trace, 40.0, "memory") == pytest.approx(2.0 + 1.0)


# --- the window is time-based ----------------------------------------------------------------


def test_window_weights_samples_by_the_time_they_cover_not_by_count() -> None:
    clf = BoundnessClassifier(window_seconds=10.0, thresholds=Thresholds(min_dwell_seconds=0.0))
    t = 100.0
    clf.observe("g", COPY.sample(6.0), 1.0, True, t)  # one 6 s sample of a copy
    trickle = Signature(sm=0.01, util=0.02, processes=True)  # work, so no stop: the window decides
    for _ in range(40):  # then 40 samples of 0.1 s of almost nothing
        t += 0.1
        cls = clf.observe("g", trickle.sample(0.1), 0.02, True, t)
    means = clf.window_means("g", t)
    assert means is not None and means.dram_active is not None
    # 6 s at 0.88 and 4 s at 0: time-weighted 0.528; a per-sample mean would be 0.88 / 41 = 0.02.
    assert means.dram_active == pytest.approx(0.88 * 6 / 10, abs=1e-9)
    assert cls == "memory"  # still above the exit level 0.50


def test_oldest_sample_counts_only_with_its_overlap_of_the_window() -> None:
    clf = BoundnessClassifier(window_seconds=10.0)
    clf.observe("g", COPY.sample(8.0), 1.0, True, 8.0)  # covers 0..8
    trickle = Signature(sm=0.01, util=0.02, processes=True)  # work, so no stop: the window decides
    clf.observe("g", trickle.sample(8.0), 0.02, True, 16.0)  # covers 8..16; window is 6..16
    means = clf.window_means("g", 16.0)
    assert means is not None
    assert means.dram_active == pytest.approx(0.88 * 2 / 10)
    assert means.covered_seconds == pytest.approx(10.0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_irregular_intervals_give_the_same_class_and_settle_time_as_regular_ones(seed: int) -> None:
    rng = random.Random(seed)
    clf = BoundnessClassifier(window_seconds=10.0)
    t, trace = 0.0, []
    while t < 60.0:
        dt = rng.choice([0.1, 0.25, 0.5, 1.0, 2.0, 4.0])
        t += dt
        sig = IDLE if t <= 30.0 else BF16_GEMM
        trace.append((t, clf.observe("g", sig.sample(dt), sig.util, sig.processes, t)))
    assert all(c == "idle" for tt, c in trace if tt <= 30.0)
    settled = settle_seconds(trace, 30.0, "compute")
    assert settled is not None and settled <= 20.0
    regular = settle_seconds(feed(BoundnessClassifier(), [(IDLE, 30.0), (BF16_GEMM, 30.0)], start=0.0), 30.0, "compute")
    assert regular is not None and abs(settled - regular) <= 4.0 + 1.0


def test_samples_older_than_the_window_no_longer_count() -> None:
    clf = BoundnessClassifier(window_seconds=10.0, thresholds=Thresholds(min_dwell_seconds=0.0))
    clf.observe("g", COPY.sample(1.0), 1.0, True, 1.0)
    # A 30 s GPM gap (say GPM failed) then one idle sample: the copy has left the window.
    assert clf.observe("g", IDLE.sample(1.0), 0.0, True, 31.0) == "idle"


def test_a_sample_longer_than_the_window_decides_alone() -> None:
    clf = BoundnessClassifier(window_seconds=10.0)
    classes = [
        clf.observe("g", s.sample(60.0), s.util, True, 60.0 * (i + 1))
        for i, s in enumerate([COPY, BF16_GEMM, BF16_GEMM])
    ]
    # With a 60 s interval the dwell rounds up to one extra sample.
    assert classes == ["memory", "memory", "compute"]


# --- no GPM, forget, clocks ------------------------------------------------------------------


def test_no_gpm_gives_no_class() -> None:
    clf = BoundnessClassifier()
    assert clf.observe("g", None, 0.99, True, 1.0) is None
    assert clf.observe("g", GpmSample(window_seconds=1.0), 0.99, True, 2.0) is None
    assert clf.window_means("g", 2.0) is None


def test_a_gpm_gap_returns_none_then_resumes_from_the_window() -> None:
    clf = BoundnessClassifier()
    for i in range(10):
        clf.observe("g", COPY.sample(1.0), 1.0, True, float(i + 1))
    assert clf.observe("g", None, 1.0, True, 11.0) is None
    assert clf.observe("g", COPY.sample(1.0), 1.0, True, 12.0) == "memory"


def test_forget_drops_the_state_of_leaves_that_are_gone() -> None:
    clf = BoundnessClassifier()
    for i in range(15):
        clf.observe("MIG-a", COPY.sample(1.0), None, True, float(i + 1))
        clf.observe("MIG-b", COPY.sample(1.0), None, True, float(i + 1))
    clf.forget({"MIG-b"})
    assert clf.window_means("MIG-a", 15.0) is None
    assert clf.window_means("MIG-b", 15.0) is not None
    # A new instance reusing the id starts from scratch: its first class is its own, at once.
    assert clf.observe("MIG-a", IDLE.sample(1.0), None, False, 16.0) == "idle"
    half = COPY.stalled(0.5)  # still working: the window, not a stop, decides
    assert clf.observe("MIG-b", half.sample(1.0), None, True, 16.0) == "memory"


def test_leaves_are_classified_independently() -> None:
    clf = BoundnessClassifier()
    for i in range(15):
        a = clf.observe("GPU-a", COPY.sample(1.0), 1.0, True, float(i + 1))
        b = clf.observe("GPU-b", TINY_KERNELS.sample(1.0), 0.23, True, float(i + 1))
    assert (a, b) == ("memory", "launch")


def test_a_clock_that_jumps_back_restarts_the_leaf() -> None:
    clf = BoundnessClassifier()
    for i in range(15):
        clf.observe("g", COPY.sample(1.0), 1.0, True, 100.0 + i)
    assert clf.observe("g", IDLE.sample(1.0), 0.0, False, 5.0) == "idle"


def test_thresholds_without_hysteresis_direction_are_rejected() -> None:
    with pytest.raises(ValueError):
        Thresholds(memory_dram_enter=0.5, memory_dram_exit=0.6)
    with pytest.raises(ValueError):
        Thresholds(launch_sm_per_busy_enter=0.05, launch_sm_per_busy_exit=0.04)
    with pytest.raises(ValueError):
        Thresholds(busy_enter=0.01, busy_exit=0.02)
    with pytest.raises(ValueError):
        Thresholds(compute_pipe_enter=1.5)
    with pytest.raises(ValueError):
        BoundnessClassifier(window_seconds=0.0)


def test_thresholds_are_configurable() -> None:
    strict = Thresholds(memory_dram_enter=0.95, memory_dram_exit=0.9)
    assert feed(BoundnessClassifier(thresholds=strict), [(COPY, 15.0)])[-1][1] == "latency"


def test_fifty_six_mig_leaves_per_cycle_keep_bounded_state() -> None:
    # The 8 GPU x 7 MIG benchmark: 56 leaves per cycle; a 0.1 s interval keeps 100 samples a window.
    # What keeps observe O(1) is that each leaf's window holds only the samples of its span, however
    # long it runs (the time per observe is bench/classifier_cost.py's, not a test's: no timing asserts).
    clf = BoundnessClassifier()
    sig = POINTER_CHASE.sample(0.1)
    leaves = [f"MIG-{i}" for i in range(56)]
    for cycle in range(500):
        now = cycle * 0.1
        for leaf in leaves:
            clf.observe(leaf, sig, None, True, now)
    held = [len(clf._leaves[leaf].window._entries) for leaf in leaves]
    assert len(clf._leaves) == 56
    assert max(held) <= clf.window_seconds / 0.1 + 2, held


# --- recorded H200 traces --------------------------------------------------------------------
# Recorded by scripts/gpu_boundness.py on an H200 (docs/boundness.md has the command); one JSON
# line per 1 s GPM window, each load in the order it ran, warm-up of the load's processes included.
# Two-phase loads switch at ``switch_s`` (copy then nothing, copy then GEMM, ...).


def replay(path: Path, clf: BoundnessClassifier, t_offset: float = 0.0) -> list[tuple[float, str | None]]:
    """Feed a recorded JSON-lines GPM trace through a classifier; return (t, class) per window."""
    out: list[tuple[float, str | None]] = []
    prev: float | None = None
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        t = float(r["t"]) + t_offset
        gpm = recorded_gpm(r, (t - prev) if prev is not None else 1.0)
        has_processes = bool(r.get("has_processes", r["nvml_util"] > 0))
        out.append((t, clf.observe("GPU-h200", gpm, r["nvml_util"], has_processes, t)))
        prev = t
    return out


@pytest.mark.parametrize("model", sorted(MANIFESTS))
def test_recorded_traces_are_checked_in(model: str) -> None:
    manifest = MANIFESTS[model]
    finals = {str(e["expected"][-1]) for e in manifest.values()}
    assert finals == {"idle", "memory", "compute", "launch", "mixed"}
    for name in ("copy_and_gemm_timesliced", "stalled_gemm", "copy_then_idle", "copy_then_gemm"):
        assert name in manifest, name


@pytest.mark.parametrize(("model", "name"), RECORDED_ALL)
def test_recorded_load_is_right_within_two_windows_in_every_phase(model: str, name: str) -> None:
    entry = MANIFESTS[model][name]
    trace = replay(trace_path(model, name), BoundnessClassifier())
    phases = load_phases(entry)
    for i, (start, end, expected) in enumerate(phases):
        seg = [(t, c) for t, c in trace if start < t < end]
        settled = settle_seconds(seg, start, expected)
        assert settled is not None and settled <= 20.0, (model, name, expected, seg)
        if i:  # a transition: nothing but the two classes (memory -> compute may show mixed)
            allowed = {phases[i - 1][2], expected}
            if allowed == {"memory", "compute"}:
                allowed.add("mixed")
            seen = [c for _, c in seg]
            assert set(seen) <= allowed, (model, name, seen)
            assert seen.count("mixed") <= 10, (model, name, seen)


@pytest.mark.parametrize("model", sorted(MANIFESTS))
def test_recorded_time_sliced_mixture_reads_mixed_where_the_old_classifier_read_latency(model: str) -> None:
    entry = MANIFESTS[model]["copy_and_gemm_timesliced"]
    trace = replay(trace_path(model, "copy_and_gemm_timesliced"), BoundnessClassifier())
    start = float(entry["load_started_s"])
    assert {c for t, c in trace if t >= start + 10.0} == {"mixed"}


@pytest.mark.parametrize("model", sorted(MANIFESTS))
def test_recorded_stalled_gemm_reads_compute_with_a_busy_ratio_of_about_a_half(model: str) -> None:
    entry = MANIFESTS[model]["stalled_gemm"]
    clf = BoundnessClassifier()
    trace = replay(trace_path(model, "stalled_gemm"), clf)
    start = float(entry["load_started_s"])
    assert {c for t, c in trace if t >= start + 10.0} == {"compute"}
    means = clf.window_means("GPU-h200", trace[-1][0])
    assert means is not None and means.busy is not None
    assert 0.35 <= means.busy <= 0.65


@pytest.mark.parametrize("model", sorted(MANIFESTS))
def test_recorded_loads_back_to_back_each_settle_within_two_windows(model: str) -> None:
    # The loads as they ran, one after another: every step change is a real one.
    clf = BoundnessClassifier()
    offset = 0.0
    for name in RECORDED_BY_MODEL[model]:
        entry = MANIFESTS[model][name]
        trace = replay(trace_path(model, name), clf, t_offset=offset)
        for start, end, expected in load_phases(entry, offset):
            seg = [(t, c) for t, c in trace if start < t < end]
            settled = settle_seconds(seg, start, expected)
            assert settled is not None and settled <= 20.0, (model, name, expected)
        offset = trace[-1][0] + 1.0


# --- simulated fleet -------------------------------------------------------------------------


def classify_sim(scenario: str, cycles: int = 240) -> dict[tuple[int, str], list[str | None]]:
    """Play a simulated node through the classifier as the sampler does; classes per (gpu, leaf)."""
    from exporter.sim import SimulatedBackend

    backend = SimulatedBackend(scenario, seed=1)
    clf = BoundnessClassifier()
    out: dict[tuple[int, str], list[str | None]] = {}
    for n in range(cycles):
        for gpu in backend.sample().gpus:
            for leaf in gpu.leaves:
                util = gpu.utilization_ratio if leaf.mig is None else leaf.utilization_ratio
                cls = clf.observe(leaf.leaf_id, leaf.gpm, util, bool(leaf.processes), float(n + 1))
                key = (gpu.index, leaf.mig.profile + f"/{leaf.mig.gpu_instance_id}" if leaf.mig else "")
                out.setdefault(key, []).append(cls)
    return out


def test_simulated_h200_node_reads_as_its_workloads() -> None:
    got = classify_sim("h200x8")
    steady = {0: "memory", 1: "memory", 4: "launch", 5: "idle", 7: "idle"}
    for gpu, expected in steady.items():
        classes = got[(gpu, "")][15:]
        assert set(classes) == {expected}, f"GPU {gpu}"
    # GPU 6 is an FP32 solver that pauses 6 s every 2 min: compute nearly all the time.
    solver = got[(6, "")][15:]
    assert solver.count("compute") / len(solver) > 0.85


def test_simulated_mig_instances_are_classified_per_instance() -> None:
    got = classify_sim("mig")
    leaves = {k: v[15:] for k, v in got.items() if k[1]}
    assert len(leaves) >= 20
    classes = {c for v in leaves.values() for c in v}
    assert {"idle", "launch", "memory", "compute"} <= classes
    for key, seq in leaves.items():
        # An interactive notebook reads idle while it does nothing at all between its bursts;
        # what it does while it works must not flap.
        busy = [c for c in seq if c != "idle"]
        assert changes(busy) <= 4, f"{key} flaps: {seq}"


def test_a_gpu_running_wide_kernels_now_and_then_reads_what_its_kernels_do_with_a_low_busy_ratio() -> None:
    # Kernels 5 % of the time, a third of the SMs busy while they run: not a stream of tiny
    # kernels (SM activity per busy time 0.3), and nothing saturated while they run: latency,
    # with the busy ratio saying how rarely.
    clf = BoundnessClassifier()
    rare = Signature(sm=0.015, occ=0.01, tensor=0.01, dram=0.005, util=0.05, processes=True)
    assert feed(clf, [(rare, 30.0)])[-1][1] == "latency"
    means = clf.window_means("GPU-0", 1030.0)
    assert means is not None and means.busy == pytest.approx(0.05)
    narrow = Signature(sm=0.0005, util=0.05, processes=True)
    assert feed(BoundnessClassifier(), [(narrow, 30.0)])[-1][1] == "launch"
    below = Signature(sm=0.004, tensor=0.004, util=0.004, processes=True)
    assert feed(BoundnessClassifier(), [(below, 30.0)])[-1][1] == "idle", "busy under 1 %: idle"


# --- what limits it while it works, apart from how much it works --------------------------------


def test_two_tenants_time_sliced_flat_out_read_mixed_not_latency() -> None:
    # The H200 case: a copy tenant and a bf16 GEMM tenant taking turns; GPM read SM 0.90,
    # DRAM 0.43, tensor 0.35. Fully used, half on memory, half on tensor cores.
    shared = Signature(sm=0.90, occ=0.45, tensor=0.35, dram=0.43, util=1.0, processes=True)
    assert {c for _, c in feed(BoundnessClassifier(), [(shared, 30.0)])} == {"mixed"}


@pytest.mark.parametrize("share", [0.4, 0.5, 0.6])
def test_memory_and_compute_tenants_in_any_balance_read_mixed(share: float) -> None:
    for compute in (BF16_GEMM, FP32_GEMM):
        trace = feed(BoundnessClassifier(), [(timesliced(COPY, compute, share), 30.0)])
        assert trace[-1][1] == "mixed", (compute, share)


def test_two_memory_bound_tenants_read_memory() -> None:
    assert feed(BoundnessClassifier(), [(timesliced(COPY, COPY), 30.0)])[-1][1] == "memory"


@pytest.mark.parametrize(("signature", "expected"), [(BF16_GEMM, "compute"), (COPY, "memory"), (FP32_GEMM, "compute")])
@pytest.mark.parametrize("duty", [0.3, 0.5, 0.8])
def test_a_job_stalled_on_its_input_reads_its_kernels_class_and_its_duty_as_busy(
    signature: Signature, expected: str, duty: float
) -> None:
    clf = BoundnessClassifier()
    trace = feed(clf, [(signature.stalled(duty), 30.0)])
    assert {c for _, c in trace} == {expected}
    means = clf.window_means("GPU-0", trace[-1][0])
    assert means is not None and means.busy == pytest.approx(signature.util * duty)  # type: ignore[operator]


def test_a_job_stalled_in_phases_longer_than_a_sample_reads_its_kernels_class() -> None:
    # 2 s of GEMMs, 2 s waiting on data: whole samples of nothing between the busy ones. The
    # first pause has no history and is taken for a stop (idle while it lasts, the class back at
    # once when the GEMMs resume); from then on a pause no longer than the job's pauses is a stall.
    phases = [(BF16_GEMM, 2.0), (HOLDS_MEMORY, 2.0)] * 15
    trace = feed(BoundnessClassifier(), phases)
    assert {c for t, c in trace if t > 1004.0} == {"compute"}
    assert [c for t, c in trace if t <= 1004.0] == ["compute", "compute", "idle", "idle"]


@pytest.mark.parametrize("pause", [2.0, 3.0, 5.0])
def test_a_stalling_job_that_stops_reads_idle_once_its_pause_outlasts_its_stalls(pause: float) -> None:
    phases = [(COPY, 3.0), (HOLDS_MEMORY, pause)] * 5 + [(COPY, 3.0), (HOLDS_MEMORY, 20.0)]
    trace = feed(BoundnessClassifier(), phases, start=0.0)
    stop = 6 * 3.0 + 5 * pause
    stalls = [c for t, c in trace if 3.0 + pause + 1.0 < t <= stop]
    assert set(stalls) == {"memory"}
    first_idle = next(t for t, c in trace if t > stop and c == "idle")
    assert first_idle - stop <= 1.25 * pause + 1.0


def test_slow_alternation_between_memory_and_compute_phases_reads_mixed() -> None:
    # A pipeline of copy and GEMM phases of 4 s each: both resources bind half the busy time.
    trace = feed(BoundnessClassifier(), [(COPY, 4.0), (BF16_GEMM, 4.0)] * 10)
    tail = [c for t, c in trace if t >= 1020.0]
    assert set(tail) == {"mixed"}


def test_a_small_grid_is_not_normalised_away() -> None:
    # 40 of 132 SMs busy all the time, their tensor pipes saturated: the GPU is underused by
    # low parallelism (latency), not compute-bound.
    small = Signature(sm=0.30, occ=0.05, tensor=0.28, dram=0.05, util=1.0, processes=True)
    assert feed(BoundnessClassifier(), [(small, 30.0)])[-1][1] == "latency"


def test_busy_comes_from_gpm_graphics_activity_before_nvml_util() -> None:
    # GPM's own busy signal wins; NVML GPU-Util stands in only where GPM lacks it.
    half = Signature(sm=0.48, occ=0.07, tensor=0.47, dram=0.09, util=0.99, processes=True, busy=0.5)
    assert feed(BoundnessClassifier(), [(half, 30.0)])[-1][1] == "compute"
    no_gr = Signature(sm=0.48, occ=0.07, tensor=0.47, dram=0.09, util=0.5, processes=True, busy=None)
    assert feed(BoundnessClassifier(), [(no_gr, 30.0)])[-1][1] == "compute"


# --- transitions -----------------------------------------------------------------------------

BUSY_LOADS = {
    "copy": COPY,
    "bf16": BF16_GEMM,
    "fp32": FP32_GEMM,
    "tiny": TINY_KERNELS,
    "mix": timesliced(COPY, BF16_GEMM),
}
CLASS_OF = {"copy": "memory", "bf16": "compute", "fp32": "compute", "tiny": "launch", "mix": "mixed"}


@pytest.mark.parametrize("load", sorted(BUSY_LOADS))
@pytest.mark.parametrize("interval", [0.5, 1.0, 2.0])
def test_a_load_that_stops_goes_straight_to_idle(load: str, interval: float) -> None:
    trace = feed(BoundnessClassifier(), [(BUSY_LOADS[load], 30.0), (HOLDS_MEMORY, 30.0)], interval, start=0.0)
    after = [c for t, c in trace if t > 30.0]
    assert set(after) <= {CLASS_OF[load], "idle"}
    settled = settle_seconds(trace, 30.0, "idle")
    assert settled is not None and settled <= 20.0


PAIRS = [(a, b) for a in sorted(BUSY_LOADS) for b in sorted(BUSY_LOADS) if CLASS_OF[a] != CLASS_OF[b]]


@pytest.mark.parametrize(("before", "after"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_a_change_of_load_passes_through_no_wrong_class(before: str, after: str) -> None:
    # Only memory <-> compute may show mixed on the way, and for at most one window.
    trace = feed(BoundnessClassifier(), [(BUSY_LOADS[before], 30.0), (BUSY_LOADS[after], 30.0)], start=0.0)
    a, b = CLASS_OF[before], CLASS_OF[after]
    after_step = [c for t, c in trace if t > 30.0]
    allowed = {a, b} | ({"mixed"} if {a, b} == {"memory", "compute"} else set())
    assert set(after_step) <= allowed, after_step
    assert sum(1 for c in after_step if c == "mixed" and "mixed" not in (a, b)) <= 10
    settled = settle_seconds(trace, 30.0, b)
    assert settled is not None and settled <= 20.0


def test_simulated_time_sliced_node_shows_the_h200_signatures() -> None:
    # The simulator's timeslice node carries the shapes recorded on the H200: an alternating
    # mixture (GPU 3), a job stalled half the time on its input (GPU 7) and a job that changes
    # load: copy 60 s, GEMM 60 s, nothing 30 s (GPU 6).
    got = classify_sim("timeslice", cycles=400)
    assert set(got[(3, "")][15:]) == {"mixed"}
    assert set(got[(7, "")][15:]) == {"compute"}
    bench = got[(6, "")]
    # Steps at t=60 (copy -> GEMM), 120 (GEMM -> idle), 150 (idle -> copy), repeating every 150 s.
    for step, before, after, transit in ((60, "memory", "compute", {"mixed"}), (120, "compute", "idle", set())):
        for cycle in (0, 150):
            seg = bench[cycle + step - 5 : cycle + step + 25]
            assert seg[0] == before and seg[-1] == after, (cycle + step, seg)
            assert set(seg) <= {before, after, *transit}, (cycle + step, seg)
            assert seg.count("mixed") <= 10


def test_simulated_stalled_job_exports_a_busy_ratio_of_about_a_half() -> None:
    from exporter.sim import SimulatedBackend

    backend = SimulatedBackend("timeslice", seed=1)
    busy = []
    for _ in range(30):
        gpu7 = backend.sample().gpus[7]
        gpm = gpu7.leaves[0].gpm
        if gpm is not None and gpm.graphics_active is not None:
            busy.append(gpm.graphics_active)
    assert sum(busy) / len(busy) == pytest.approx(0.5, abs=0.03)


# --- the documented levels ---------------------------------------------------------------------

DOCUMENTED_ENTER = {"memory": 0.60, "compute": 0.60, "transfer": 0.50}
"""The enter levels docs/boundness.md gives: DRAM per busy time for ``memory``, the busiest pipe
for ``compute``, the busiest link's use of its capacity per busy time for ``transfer`` (kernels
that saturate nothing beside a busy link; with no kernel at all any link traffic is ``transfer``). The recorded
H200 loads sit far from them, so only these tests notice a level that moved without the
documentation."""


@pytest.mark.parametrize("expected", sorted(DOCUMENTED_ENTER))
@pytest.mark.parametrize("side", [-0.03, 0.03], ids=["below", "above"])
def test_each_class_enters_at_its_documented_level(expected: str, side: float) -> None:
    level = DOCUMENTED_ENTER[expected] + side
    steady = {
        "memory": Signature(sm=0.95, occ=0.5, dram=level, util=1.0, processes=True),
        "compute": Signature(sm=0.95, occ=0.5, tensor=level, dram=0.05, util=1.0, processes=True),
        "transfer": Signature(sm=0.3, occ=0.1, dram=0.05, util=1.0, link=level, processes=True),
    }[expected]
    got = feed(BoundnessClassifier(), [(steady, 20.0)])[-1][1]
    assert (got == expected) == (side > 0), f"{expected} at {level:.2f}: read {got}"
