"""Scrape mode's idle verdict (dashboard/sources/scrape_verdicts.py) and the block storage under it
(dashboard/sources/scrape_history.py): the fast path gives what the definition gives on labelled frames,
a settled verdict is kept and an unsettled one is not, and blocks read back every scrape as it was."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dashboard import definitions
from dashboard.sources.scrape import ScrapeSource
from dashboard.sources.scrape_history import TargetHistory, coded, frame, of_metric, reduced
from dashboard.sources.scrape_verdicts import IDLE_LABELS, VerdictCache, leaf_idle, settled_before
from dashboard.sources.source import NO_FILTERS, SM_ACTIVE, Filters, Window
from tests.support.sim_exposition import render_cycles

SCENARIOS = ("h200x8", "mig", "a100", "l40s", "timeslice")
"""GPM leaves, MIG instances with GPM, MIG instances without (compute processes), pre-Hopper
whole GPUs (busy ratio) and time-sliced replicas."""
INTERVAL = 15.0
PAGES = 40
T0 = 1_700_000_000.0


@pytest.fixture(scope="module")
def pages() -> dict[str, list[str]]:
    return {f"http://{sc}:9445/metrics": list(render_cycles(sc, PAGES, volatile="0")) for sc in SCENARIOS}


def _source(pages: dict[str, list[str]], upto: int) -> ScrapeSource:
    """A source holding the first ``upto`` pages of each target, one every INTERVAL (targets
    scraped in order, a second apart)."""
    src = ScrapeSource(list(pages), interval_s=INTERVAL, timeout_s=5.0, fetch=lambda url: "", clock=lambda: T0)
    for k in range(upto):
        for i, (url, texts) in enumerate(pages.items()):
            src._history[url].add(T0 + k * INTERVAL + i, texts[k])
    return src


@pytest.fixture(scope="module")
def filled(pages: dict[str, list[str]]) -> ScrapeSource:
    """Every page of every target, for the tests that only read the source (filled once: parsing
    the 200 pages is most of a test's time)."""
    return _source(pages, PAGES)


def _reference(src: ScrapeSource, grid: np.ndarray, target: Filters = NO_FILTERS) -> pd.DataFrame:
    """The definition on labelled frames (every sample with its label strings): what the scrape
    source computed before the fast path."""
    hist = src._snapshot()
    picks = src._within(hist, float(grid[0]) - definitions.MEAN_WINDOW_SECONDS, float(grid[-1]))

    def raw(metric: str, where: tuple[str, str] | None = None) -> pd.DataFrame:
        df = frame(of_metric(metric, IDLE_LABELS, where), picks, time=True)
        for label, value in target.target_matchers().items():
            df = df[df[label] == value] if label in df.columns else df.iloc[0:0]
        return df

    classes = [raw("gpulens_gpu_boundness", ("class", c)) for c in definitions.IN_USE_CLASSES]
    return definitions.leaf_idle_frame(
        raw(SM_ACTIVE),
        raw("gpulens_gpu_sm_active_seconds_total"),
        raw("gpulens_gpu_utilization_ratio"),
        pd.concat([c for c in classes if not c.empty] or [pd.DataFrame()], ignore_index=True),
        grid,
        fresh_s=src._fresh_s(),
        busy_ratio=raw("gpulens_gpu_busy_ratio"),
        busy_seconds=raw("gpulens_gpu_busy_seconds_total"),
        processes=raw("gpulens_gpu_compute_processes"),
    )


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    keys = [*definitions.LEAF, "timestamp"]
    out = df[[*keys, "sm_mean", "idle"]].astype({"uuid": str, "mig_uuid": str, "sm_mean": float, "idle": bool})
    return out.sort_values(keys).reset_index(drop=True)


@pytest.mark.parametrize("target", [NO_FILTERS, Filters(instance="mig:9445"), Filters(instance="l40s:9445")])
def test_the_fast_verdict_is_the_definition_on_labelled_frames(filled: ScrapeSource, target: Filters) -> None:
    src = filled
    end = T0 + (PAGES - 1) * INTERVAL + 0.5
    grid = np.asarray([end - k * 60.0 for k in range(8, -1, -1)])
    got = leaf_idle(src._within(src._snapshot(), float(grid[0]) - 300.0, end), grid, target, src._fresh_s())
    want = _reference(src, grid, target)
    assert len(want) > 0
    pd.testing.assert_frame_equal(_sorted(got), _sorted(want), check_exact=False, rtol=1e-12)
    if target == NO_FILTERS:
        assert got["idle"].any() and not got["idle"].all(), "idle and busy leaves both present"
        assert (got["mig_uuid"] != "").any(), "MIG leaves present"


def test_a_settled_verdict_is_kept_and_an_unsettled_one_is_not(pages: dict[str, list[str]]) -> None:
    """The verdict at t is kept once every target has a scrape after t; before that a target's
    next scrape may still be stamped before t (the source stamps a scrape when it starts it)."""
    src = _source(pages, 20)
    hist = src._snapshot()
    settled = settled_before(hist)
    assert settled == T0 + 19 * INTERVAL, "the first target's newest scrape is the oldest newest one"
    cache = VerdictCache()
    early, late = settled - 30.0, settled + 2.5
    first = cache.verdicts(lambda a, b: src._within(hist, a, b), [early, late], hist, NO_FILTERS, src._fresh_s())
    assert sorted(t for _scope, t in cache._kept) == [early], "only the settled time is kept"
    # one more round: the late time's window gains samples (its verdict may change), the early one's cannot
    for i, (url, texts) in enumerate(pages.items()):
        src._history[url].add(T0 + 20 * INTERVAL + i, texts[20])
    hist = src._snapshot()
    again = cache.verdicts(lambda a, b: src._within(hist, a, b), [early, late], hist, NO_FILTERS, src._fresh_s())
    fresh = VerdictCache().verdicts(
        lambda a, b: src._within(hist, a, b), [early, late], hist, NO_FILTERS, src._fresh_s()
    )
    pd.testing.assert_frame_equal(_sorted(again), _sorted(fresh))
    pd.testing.assert_frame_equal(
        _sorted(first[first["timestamp"] == early]), _sorted(again[again["timestamp"] == early])
    )
    assert sorted(t for _scope, t in cache._kept) == [early, late]


def test_a_late_sample_before_an_unsettled_time_is_counted() -> None:
    """Target b's scrape stamped before t arrives after t was first read: the verdict at t reads it."""
    busy = 'gpulens_gpu_sm_active_ratio{uuid="GPU-b",mig_uuid=""} 0.9\n'
    idle = 'gpulens_gpu_sm_active_ratio{uuid="GPU-b",mig_uuid=""} 0.0\n'
    other = 'gpulens_gpu_sm_active_ratio{uuid="GPU-a",mig_uuid=""} 0.0\n'
    src = ScrapeSource(["http://a:1", "http://b:1"], interval_s=15, fetch=lambda url: "", clock=lambda: T0)
    a, b = src._history.values()
    for k in range(10):
        a.add(T0 + 15 * k, other)
        b.add(T0 + 15 * k, idle)
    a.add(T0 + 150, other)
    t = T0 + 148.0
    before = src._idle_at([t], src._snapshot(), NO_FILTERS)
    assert bool(before.set_index("uuid").loc["GPU-b", "idle"])
    b.add(T0 + 147, busy * 1)  # stamped before t, added after it was read
    after = src._idle_at([t], src._snapshot(), NO_FILTERS)
    assert not bool(after.set_index("uuid").loc["GPU-b", "idle"]), "the late busy sample counts"


def test_the_cache_is_bounded() -> None:
    cache = VerdictCache(max_rows=10)
    part = pd.DataFrame({"uuid": ["a", "b", "c"], "mig_uuid": "", "timestamp": 1.0, "sm_mean": 0.0, "idle": True})
    cache._keep((), [(float(t), part) for t in range(10)])
    assert cache._rows <= 10 and len(cache._kept) == 3
    assert sorted(t for _s, t in cache._kept) == [7.0, 8.0, 9.0], "the oldest go first"
    hist: list = []
    cache.verdicts(lambda a, b: [], [7.0], hist, NO_FILTERS, 15.0)  # read again: the most recent
    cache._keep((), [(10.0, part)])
    assert sorted(t for _s, t in cache._kept) == [7.0, 9.0, 10.0], "the least recently read go first"


def test_activity_steps_are_step_aligned_and_recur() -> None:
    """Prometheus' subquery steps: multiples of the step, the last moved to the range's end; a range
    read ten seconds later shares all but its newest steps (so their settled verdicts are kept)."""
    src = ScrapeSource(["http://a:1"], interval_s=5, fetch=lambda url: "", clock=lambda: T0)
    end = T0 + 1000.3
    grid, step = src._steps(Window(3600.0), 45.0, end)
    assert step == 45.0 and len(grid) == 80
    assert grid[-1] == end and all(math.isclose(t / 45.0, round(t / 45.0)) for t in grid[:-1])
    later, _ = src._steps(Window(3600.0), 45.0, end + 10.0)
    assert len(set(grid) & set(later)) >= 78
    aligned, _ = src._steps(Window(3600.0), 45.0, math.floor(end / 45.0) * 45.0)
    assert len(aligned) == 80 and aligned[-1] == math.floor(end / 45.0) * 45.0


def _page(t: int, extra: bool) -> str:
    text = f'gpulens_up 1\ngpulens_gpu_sm_active_ratio{{uuid="GPU-a"}} {t}\n'
    return text + (f'gpulens_gpu_sm_active_ratio{{uuid="GPU-x"}} {-t}\n' if extra else "")


def test_blocks_read_back_every_scrape_across_layouts_failures_and_eviction() -> None:
    h = TargetHistory("n:1", 64)  # four scrapes a block
    assert h.block_rows(2) == 4
    for t in range(150):
        if t % 11 == 5:
            h.failed(float(t))
        else:
            h.add(float(t), _page(t, extra=(t // 13) % 2 == 1))
    src = ScrapeSource(["http://n:1"], fetch=lambda url: "", clock=lambda: 200.0)
    src._history = {"http://n:1": h}
    snap = src._snapshot()[0]
    assert len(snap.scrapes) == 64 and len(snap.times) == 64 and snap.times[0] == 86.0
    assert 0 <= h.head_row < h.blocks[0].filled, "a block goes with its last scrape"
    assert sum(b.filled for b in h.blocks) - h.head_row == 64
    got = frame(of_metric("gpulens_gpu_sm_active_ratio"), [(snap, np.arange(64), snap.times)], time=True)
    want = [(float(t), u, v) for t in range(86, 150) if t % 11 != 5
            for u, v in [("GPU-a", float(t))] + ([("GPU-x", float(-t))] if (t // 13) % 2 else [])]  # fmt: skip
    rows = sorted(zip(got["timestamp"], got["uuid"], got["value"], strict=True))
    assert rows == sorted(want)
    # a snapshot is not changed by later scrapes, nor by the eviction of its oldest ones
    for t in range(150, 250):
        h.add(float(t), _page(t, extra=False))
    again = frame(of_metric("gpulens_gpu_sm_active_ratio"), [(snap, np.arange(64), snap.times)], time=True)
    pd.testing.assert_frame_equal(got, again)
    # reduced() over the blocks: a window's mean per series
    snap = src._snapshot()[0]
    idx = np.nonzero(snap.times >= 240.0)[0]
    mean = reduced(of_metric("gpulens_gpu_sm_active_ratio"), [(snap, idx, snap.times[idx])], "mean")
    assert mean["value"].tolist() == [float(np.mean(np.arange(240, 250)))]
    series, samples = coded([of_metric("gpulens_gpu_sm_active_ratio")], [(snap, idx, snap.times[idx])])[0]
    assert list(series["uuid"]) == ["GPU-a"] and samples["value"].tolist() == [float(t) for t in range(240, 250)]


class _Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_now_reads_the_last_evaluation_which_every_page_shares(pages: dict[str, list[str]]) -> None:
    """ "Now" is the newest multiple of the scrape interval at which every target has been scraped
    (a Prometheus reader sees its rules' last evaluation): kept, so the Fleet page's count and names
    read one verdict; while none is that old, the last target's first scrape, so that every target's
    devices are in the verdict (the Fleet's totals add up); now itself when the scrapes have stopped
    for more than a minute."""
    clock = _Clock(T0)
    src = ScrapeSource(list(pages), interval_s=INTERVAL, fetch=lambda url: "", clock=clock)
    urls = list(pages)
    for i, url in enumerate(urls):
        src._history[url].add(T0 + 3.0 + i, pages[url][0])
    clock.t = T0 + 3.0 + len(urls) + 0.5
    first = T0 + 3.0 + len(urls) - 1
    assert src._evaluated(None, src._snapshot()) == first, "one scrape each: once every target has one"
    for k in range(1, 20):
        for i, url in enumerate(urls):
            src._history[url].add(T0 + 3.0 + k * INTERVAL + i, pages[url][k])
    clock.t = T0 + 3.0 + 19 * INTERVAL + len(urls) + 0.5
    at = src._evaluated(None, src._snapshot())
    assert at == math.floor((T0 + 3.0 + 19 * INTERVAL) / INTERVAL) * INTERVAL and at % INTERVAL == 0
    idle = src.leaf_idle()
    since = src.idle_since(window=Window(3600.0), step_s=45.0)
    assert ((), at) in src._verdicts._kept, "the verdict read as now is kept"
    named = {(u, m) for u, m, v in zip(idle["uuid"], idle["mig_uuid"], idle["value"], strict=True) if v >= 0.5}
    assert named and {(u, m) for u, m in zip(since["uuid"], since["mig_uuid"], strict=True)} <= named
    assert src._evaluated(T0 + 100.5, src._snapshot()) == T0 + 100.5, "an explicit end is read as given"
    clock.t += 61.0
    assert src._evaluated(None, src._snapshot()) == clock.t, "scrapes stalled: now itself"
