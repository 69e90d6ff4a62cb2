"""The Fleet page names what it counts: the allocated-but-idle devices (where, whose, for how long),
the slowest GPUs (and why) and, on the SM heatmap, which GPUs no pod holds; read from the dashboard
fixtures through the direct-scrape source, as the page reads them."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from dashboard import fleet_names
from dashboard.figures.activity import FREE, sm_heatmap
from dashboard.figures.vega import data_of
from dashboard.frames.columns import from_rows
from dashboard.frames.fleet import fleet_counts
from dashboard.sources.scrape import ScrapeSource
from dashboard.sources.source import Window

FIX = Path(__file__).parent / "fixtures" / "dashboard"
START = 1_000_000.0
INTERVAL = 15.0
WINDOW = 900.0


class _Clock:
    def __init__(self) -> None:
        self.t = START

    def __call__(self) -> float:
        return self.t


@functools.cache
def _source(fixture: str, scrapes: int) -> tuple[ScrapeSource, float]:
    """A direct-scrape source that scraped ``fixture`` ``scrapes`` times, INTERVAL s apart; and the
    time of its last scrape (now). Shared by the tests (read only: the clock no longer moves)."""
    page = (FIX / f"{fixture}.prom").read_text()
    clock = _Clock()
    src = ScrapeSource(["http://a:1/metrics"], fetch=lambda _url: page, clock=clock, interval_s=INTERVAL)
    for i in range(scrapes):
        if i:
            clock.t += INTERVAL
        src.scrape_once()
    return src, clock.t


def _idle_names(src: ScrapeSource, now: float) -> tuple[pd.DataFrame, dict[str, int]]:
    info, mig = src.instant("gpulens_gpu_info"), src.instant("gpulens_mig_instance_info")
    alloc, idle = src.instant("gpulens_pod_gpu_allocation"), src.leaf_idle()
    activity = src.allocation_activity(window=Window(WINDOW), step_s=WINDOW / 80)
    table = fleet_names.allocated_idle(info, mig, alloc, idle, activity, now=now, window_s=WINDOW)
    return table, fleet_counts(info, mig, alloc, idle)


@pytest.mark.parametrize("fixture", ["h200x8", "mig", "dra", "timeslice", "mps", "p5en"])
def test_the_allocated_idle_devices_named_are_the_ones_counted(fixture: str) -> None:
    src, now = _source(fixture, 3)
    table, counts = _idle_names(src, now)
    assert len(table) == counts["allocated_idle"]
    assert table[["uuid", "mig_uuid"]].drop_duplicates().shape[0] == len(table), "one row per device"
    for column in ("node", "gpu", "pods", "owners", "idle_for"):
        assert (table[column].astype(str) != "").all(), column
    mig = table[table["mig_uuid"] != ""]
    assert mig["gpu"].str.contains(r"^GPU \d+ · MIG \dg\.\d+gb, instance \d+$").all(), mig["gpu"].tolist()


def test_the_idle_gpu_of_the_h200_node_is_named_with_its_pod_and_owner() -> None:
    src, now = _source("h200x8", 3)
    table, counts = _idle_names(src, now)
    assert counts["allocated_idle"] == 1
    row = table.iloc[0]
    assert (row["node"], row["gpu"]) == ("h200x8", "GPU 5")  # the exporter's node label
    assert row["pods"] == "notebooks/jupyter-alice-0"
    assert row["owners"] == "StatefulSet/jupyter-alice"
    assert row["uuid"] == "GPU-9692e00a-4d82-50fd-a1d9-41b081adaed8"


def test_a_device_idle_over_the_whole_range_says_so_not_a_precise_time() -> None:
    src, now = _source("h200x8", int(WINDOW / INTERVAL) + 20)  # history longer than the range
    table, _ = _idle_names(src, now)
    row = table.iloc[0]
    assert bool(row["whole_range"])
    assert row["idle_for"] == "whole range (≥ 15m 00s)"


def test_a_device_allocated_within_the_range_and_never_busy_is_idle_since_allocated() -> None:
    src, now = _source("h200x8", 11)  # 150 s of history in a 15-minute range
    table, _ = _idle_names(src, now)
    row = table.iloc[0]
    assert not bool(row["whole_range"])
    assert row["idle_seconds"] <= 150.0
    assert row["idle_for"] == f"{fleet_names.fmt_duration(row['idle_seconds'])}, since allocated"


def test_a_first_scrape_gives_no_idle_time_rather_than_zero_seconds() -> None:
    src, now = _source("h200x8", 1)
    table, counts = _idle_names(src, now)
    assert counts["allocated_idle"] == 1
    assert table["idle_for"].tolist() == [fleet_names.NO_HISTORY]


def test_idle_for_counts_from_the_last_busy_step_and_the_longest_idle_comes_first() -> None:
    now = 10_000.0
    leaves = [("GPU-a", ""), ("GPU-b", ""), ("GPU-c", "MIG-c1"), ("GPU-d", ""), ("GPU-e", "")]
    owner = {"workload_kind": "Job", "workload": "train"}
    alloc = from_rows(
        [
            {"namespace": "ml", "pod": f"p{i}", "container": "c", "uuid": u, "mig_uuid": m, **owner, "value": 1.0}
            for i, (u, m) in enumerate(leaves)
        ]
        + [{"namespace": "ml", "pod": "solo", "container": "c", "uuid": "GPU-a", "value": 1.0}]
    )
    idle = from_rows([{"uuid": u, "mig_uuid": m, "sm_mean": 0.0, "value": 1.0} for u, m in leaves])
    activity = pd.DataFrame(
        [
            # GPU-a busy 10 minutes ago; GPU-b 50 minutes ago but held by p1 only for the last 20;
            # GPU-c never busy, held since the range's start; GPU-d: no history
            {"mig_uuid": "", **r, "first_allocated": first, "last_busy": busy}
            for r, first, busy in (
                ({"namespace": "ml", "pod": "p0", "container": "c", "uuid": "GPU-a"}, 6400.0, 9400.0),
                ({"namespace": "ml", "pod": "solo", "container": "c", "uuid": "GPU-a"}, 6400.0, 9400.0),
                ({"namespace": "ml", "pod": "p1", "container": "c", "uuid": "GPU-b"}, 8800.0, 7000.0),
                (
                    {"namespace": "ml", "pod": "p2", "container": "c", "uuid": "GPU-c", "mig_uuid": "MIG-c1"},
                    6420.0,
                    math.nan,
                ),
                ({"namespace": "ml", "pod": "gone", "container": "c", "uuid": "GPU-d"}, 6400.0, 6500.0),
                # an answer outside the range (a store's oddity) reads as held since before it, never busy in it
                ({"namespace": "ml", "pod": "p4", "container": "c", "uuid": "GPU-e"}, 1.0, 1.0),
            )
        ]
    )
    info = from_rows([{"uuid": u, "gpu": str(i), "node": "n1", "value": 1.0} for i, (u, _) in enumerate(leaves)])
    mig = from_rows(
        [{"uuid": "GPU-c", "mig_uuid": "MIG-c1", "mig_profile": "3g.71gb", "gpu_instance_id": "2", "value": 1.0}]
    )
    table = fleet_names.allocated_idle(info, mig, alloc, idle, activity, now=now, window_s=3600.0)
    assert table["uuid"].tolist() == ["GPU-c", "GPU-e", "GPU-b", "GPU-a", "GPU-d"]
    words = dict(zip(table["uuid"], table["idle_for"], strict=True))
    assert words == {
        "GPU-c": "whole range (≥ 1h 00m)",
        "GPU-b": "20m 00s, since allocated",
        "GPU-a": "10m 00s",
        "GPU-d": fleet_names.NO_HISTORY,  # the only pod with history no longer holds it
        "GPU-e": "whole range (≥ 1h 00m)",
    }
    rows = table.set_index("uuid")
    assert rows.loc["GPU-c", "gpu"] == "GPU 2 · MIG 3g.71gb, instance 2"
    assert rows.loc["GPU-a", "pods"] == "ml/p0, ml/solo"
    assert rows.loc["GPU-a", "owners"] == f"Job/train, {fleet_names.BARE_POD_OWNER}"
    head, more = fleet_names.shown(table, 3)
    assert (len(head), more) == (3, 2)


def _slow(fixture: str) -> pd.DataFrame:
    src, _ = _source(fixture, 3)
    return fleet_names.slow_gpus(
        src.instant("gpulens_gpu_info"),
        src.instant("gpulens_pod_gpu_allocation"),
        src.mean("gpulens_gpu_clock_event_active", window=Window(WINDOW)),
        src.mean("gpulens_gpu_sm_clock_hertz", window=Window(300.0)),
        src.instant("gpulens_gpu_sm_clock_max_hertz"),
        src.leaf_idle(),
    )


def test_busy_gpus_power_capped_near_their_max_clock_are_not_slow() -> None:
    """GPUs 2 and 3 of the h200x8 node train at their power limit, at 1.89 of 1.98 GHz (95 %): an
    H200 under load does that by design, so Fleet lists no slow GPU (it listed both, "power cap
    100 %"); 5 and 7 idle at 345 MHz (by design too)."""
    assert _slow("h200x8")["gpu"].tolist() == []


def test_the_thermally_slowed_gpu_is_the_one_slow_gpu_of_the_p5en_node() -> None:
    """The p5en node's eight GPUs all run under a power cap; GPU 5 alone is thermally slowed to
    half its clock: it is the one listed (all eight were)."""
    slow = _slow("p5en")
    assert slow["gpu"].tolist() == ["GPU 5"]
    first = slow.iloc[0]
    assert (first["why"], first["sm_clock"]) == ("HW Thermal Slowdown 100 % · SM clock under 90 % of max", "50 %")


def _rule(clocks: dict[str, float], *, idle: frozenset[str] = frozenset(), events: dict[str, str] | None = None,
          model: dict[str, str] | None = None) -> list[str]:  # fmt: skip
    """slow_gpus over GPUs of SM clock ratio ``clocks`` (of a 2 GHz maximum), in use but those in
    ``idle``, with a clock event (reason) held over the whole range where ``events`` says."""
    names = model or {}
    info = from_rows([{"uuid": u, "gpu": str(i), "node": "n1", "name": names.get(u, "NVIDIA H200"), "value": 1.0}
                      for i, u in enumerate(clocks)])  # fmt: skip
    clock = from_rows([{"uuid": u, "value": r * 2e9} for u, r in clocks.items()])
    top = from_rows([{"uuid": u, "value": 2e9} for u in clocks])
    verdict = from_rows([{"uuid": u, "sm_mean": 0.0 if u in idle else 0.6, "value": float(u in idle)} for u in clocks])
    ev = from_rows([{"uuid": u, "reason": r, "value": 1.0} for u, r in (events or {}).items()])
    return sorted(fleet_names.slow_gpus(info, from_rows([]), ev, clock, top, verdict)["uuid"])


def test_the_slow_rule_either_side_of_its_lines() -> None:
    """dashboard/fleet_names.py's rule, each line from both sides: the clock under 90 % of max; 5
    points behind the peers' median; the power cap alone never; a thermal slowdown always."""
    cap = "sw_power_cap"
    # the clock line, under a power cap: 89 % is slow, 90 % is not
    assert _rule({"a": 0.89}, events={"a": cap}) == ["a"]
    assert _rule({"a": 0.90}, events={"a": cap}) == []
    # 16 busy H200s at 97-99 % of max under a power cap: none slow
    fleet = {f"g{i}": 0.97 + 0.02 * (i % 3) / 2 for i in range(16)}
    assert _rule(fleet, events=dict.fromkeys(fleet, cap)) == []
    # behind its peers (median 98 %): 93 % is 5 points behind, slow; 94 % is not
    peers = {"p1": 0.98, "p2": 0.98, "p3": 0.97}
    assert _rule({**peers, "x": 0.93}) == ["x"]
    assert _rule({**peers, "x": 0.94}) == []
    # peers are the same model, and at least two of them
    assert _rule({**peers, "x": 0.93}, model={"x": "NVIDIA H100 80GB HBM3"}) == []
    assert _rule({"p1": 0.98, "x": 0.93}) == []
    # an idle GPU's low clock is by design, unless a fault held it: a thermal slowdown always counts
    assert _rule({"a": 0.2}, idle=frozenset({"a"})) == []
    assert _rule({"a": 0.2}, idle=frozenset({"a"}), events={"a": cap}) == []
    assert _rule({"a": 0.99}, idle=frozenset({"a"}), events={"a": "hw_thermal_slowdown"}) == ["a"]


def test_a_low_clock_without_an_event_is_slow_only_while_in_use() -> None:
    info = from_rows([{"uuid": u, "gpu": g, "node": "n1", "value": 1.0} for u, g in (("GPU-a", "0"), ("GPU-b", "1"))])
    clock = from_rows([{"uuid": u, "value": 1.2e9} for u in ("GPU-a", "GPU-b")])
    top = from_rows([{"uuid": u, "value": 1.98e9} for u in ("GPU-a", "GPU-b")])
    idle = from_rows([{"uuid": "GPU-a", "sm_mean": 0.6, "value": 0.0}, {"uuid": "GPU-b", "sm_mean": 0.0, "value": 1.0}])
    none = from_rows([])
    slow = fleet_names.slow_gpus(info, none, none, clock, top, idle)
    assert slow["uuid"].tolist() == ["GPU-a"], "GPU-b is idle: its low clock is by design"
    row = slow.iloc[0]
    assert row["sm_clock"] == "61 %"
    assert row["why"] == "SM clock under 90 % of max, no slowdown event"
    assert row["pods"] == fleet_names.NO_POD
    assert math.isclose(row["sm_clock_ratio"], 1.2 / 1.98)
    at_max = from_rows([{"uuid": u, "value": 1.98e9} for u in ("GPU-a", "GPU-b")])
    assert fleet_names.slow_gpus(info, none, none, at_max, top, idle).empty
    # a power cap on GPU-b (idle now: not slow, a power cap is no fault) and on GPU-c (no SM data:
    # no verdict, but a power cap says it drew its full power: in use, and at 76 % slow)
    info_c = pd.concat([info, from_rows([{"uuid": "GPU-c", "gpu": "2", "node": "n1", "value": 1.0}])])
    capped = from_rows([{"uuid": u, "reason": "sw_power_cap", "value": 0.25} for u in ("GPU-b", "GPU-c")])
    clock_c = pd.concat([at_max, from_rows([{"uuid": "GPU-c", "value": 1.5e9}])])
    top_c = pd.concat([top, from_rows([{"uuid": "GPU-c", "value": 1.98e9}])])
    slow = fleet_names.slow_gpus(info_c, none, capped, clock_c, top_c, idle).set_index("uuid")
    assert slow.index.tolist() == ["GPU-c"]
    assert slow.loc["GPU-c", "sm_clock"] == "76 %"
    assert slow.loc["GPU-c", "why"] == "SW Power Cap 25 % · SM clock under 90 % of max"


def test_the_heatmap_marks_the_gpu_no_pod_holds_and_names_the_holders() -> None:
    src, _ = _source("h200x8", 3)
    sm = src.mean("gpulens_gpu_sm_active_ratio", window=Window(WINDOW))
    chart = sm_heatmap(sm, src.instant("gpulens_pod_gpu_allocation"))
    cells = {r["label"]: r for r in data_of(chart)}
    free = {label for label, r in cells.items() if r["allocation"] == FREE}
    assert free == {"GPU 7"}, "GPU 7 of the fixture has no pod"
    assert cells["GPU 7"]["holders"] == "no pod (free)"
    assert cells["GPU 5"]["holders"] == "notebooks/jupyter-alice-0"
    stroke = chart["encoding"]["stroke"]
    assert stroke["scale"]["domain"] == [FREE], "the legend says what the outline means"
    assert stroke["legend"]["orient"] == "bottom"
    json.dumps(chart)
