"""Scrape mode's history: compact (labels once, values as float64), bounded by a fleet-wide
sample budget, and read back exactly as the exposition said (same frames as prometheus_client's
parser gives)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dashboard.frames.columns import from_rows
from dashboard.sources.scrape import ScrapeSource, parse_exposition
from dashboard.sources.scrape_history import TargetHistory, frame, of_metric, parse_series, sample_lines
from dashboard.sources.source import Window

FIX = Path(__file__).parent / "fixtures" / "dashboard"
H200 = (FIX / "h200x8.prom").read_text()


def _source(pages: dict[str, str], **kw: object) -> tuple[ScrapeSource, dict[str, float]]:
    clock = {"t": 1_000_000.0}
    src = ScrapeSource(list(pages), fetch=lambda url: pages[url], clock=lambda: clock["t"], interval_s=5, **kw)  # type: ignore[arg-type]
    return src, clock


@pytest.mark.parametrize("fixture", ["h200x8.prom", "mig.prom", "mps.prom", "timeslice.prom"])
def test_every_series_reads_back_as_prometheus_client_parses_it(fixture: str) -> None:
    text = (FIX / fixture).read_text()
    src, _clock = _source({"http://n1:9445/metrics": text})
    src.scrape_once()
    expected = parse_exposition(text, "n1:9445")
    for name, samples in expected.items():
        want = from_rows({**dict(labels), "value": v} for labels, v in samples)
        got = src.instant(name)
        # the same columns in the same order, and the same rows in any order (compared as tuples:
        # sorting ~100 frames per page in pandas was most of the test's time)
        assert list(got.columns) == list(want.columns), name
        assert sorted(got.itertuples(index=False, name=None)) == sorted(want.itertuples(index=False, name=None)), name


KEYS = (
    "plain",
    "ns:name_total",
    'm{a="1"}',
    'm{a="1",}',
    'm{a="1",b=""}',
    'm{a="",b="2"}',
    'm{b="2",a="1"}',
    'm{a="1",a="2"}',
    'm{a="1",a=""}',
    'm{instance="given"}',
    'm{instance=""}',
    'm{a="x,b=y"}',
    'm{a="{}=,"}',
    'm{a="NVIDIA H200 ü 漢"}',
    'm{a="a\\"b} c"}',
    'm{a="back\\\\slash",b="new\\nline"}',
    "m{}",
    'm{ a="1" }',
    'm{a="1", b="2"}',
    'm{"quoted.name"}',
    'm{"quoted.name",a="1"}',
    '{"quoted.name",a="1"}',
)
"""Keys the exporter writes, and the escapes, spaces, quoted names and odd commas it does not."""


@pytest.mark.parametrize("key", KEYS)
def test_a_series_key_reads_as_prometheus_client_parses_it(key: str) -> None:
    try:
        sample = next(iter(text_string_to_metric_families(key + " 0\n"))).samples[0]
    except Exception as e:  # what the parser refuses, parse_series refuses too
        with pytest.raises(type(e)):
            parse_series(key, "n:1")
        return
    labels = {k: v for k, v in sample.labels.items() if v != ""}
    labels.setdefault("instance", "n:1")
    assert parse_series(key, "n:1") == (sample.name, tuple(sorted(labels.items())))


def test_sample_lines_take_escapes_spaces_and_timestamps() -> None:
    text = (
        "# HELP m a metric\n# TYPE m gauge\n"
        'm{name="NVIDIA H200",path="a\\"b} c"} 1.5\n'
        "plain 2\n"
        'stamped{x="1"} 3 1700000000000\n'
        "plain_stamped 4e0 1700000000000\n"
    )
    assert list(sample_lines(text)) == [
        ('m{name="NVIDIA H200",path="a\\"b} c"}', "1.5"),
        ("plain", "2"),
        ('stamped{x="1"}', "3"),
        ("plain_stamped", "4e0"),
    ]
    h = TargetHistory("n:1", 10)
    h.add(1.0, text)
    scrape = h.scrapes[-1]
    assert dict(scrape.layout.labels[0]) == {"instance": "n:1", "name": "NVIDIA H200", "path": 'a"b} c'}
    assert scrape.values.tolist() == [1.5, 2.0, 3.0, 4.0]


def test_scrapes_of_the_same_series_share_one_layout_and_keep_8_bytes_a_sample() -> None:
    h = TargetHistory("n:1", 10)
    for t in range(3):
        h.add(float(t), H200.replace("gpulens_up 1.0", f"gpulens_up {t % 2}.0"))
    layouts = {id(s.layout) for s in h.scrapes}
    assert len(layouts) == 1, "labels are kept once, not per scrape"
    n = len(h.scrapes[0].layout.names)
    assert all(s.values.dtype.itemsize == 8 and len(s.values) == n for s in h.scrapes)
    assert h.samples == 3 * n


def test_series_that_come_and_go_do_not_pile_up() -> None:
    h = TargetHistory("n:1", 3)
    for t in range(50):
        h.add(float(t), f'gpulens_pod_gpu_allocation{{pod="p{t}"}} 1\ngpulens_up 1\n')
    assert len(h._series) == 2, "the registry holds the series of the newest scrape only"
    assert len(h.scrapes) == 3


def test_the_history_is_bounded_by_a_fleet_wide_sample_budget() -> None:
    urls = [f"http://n{i}:9445/metrics" for i in range(4)]
    pages = {u: H200.replace("GPU-", f"GPU-n{i}-") for i, u in enumerate(urls)}
    series = sum(1 for _ in sample_lines(H200))
    budget = 4 * 10 * series  # ten scrapes of each target
    src, clock = _source(pages, max_samples=budget, history=720)
    for _ in range(30):
        clock["t"] += 5
        src.scrape_once()
    assert src.samples_kept() <= budget
    kept = src.series("gpulens_up", window=Window(3600), step_s=5)
    assert kept["timestamp"].nunique() == 10, "the oldest scrapes go first"
    assert "history 45s: 10 scrapes of" in src.description, "the page says what is kept"
    assert src.instant("gpulens_gpu_info")["uuid"].nunique() == 32


def test_a_selection_of_one_class_and_a_few_labels_reads_what_the_whole_metric_holds() -> None:
    """``of_metric(metric, labels, where)`` (the idle verdict reads the launch class only, with the
    few labels it joins on) gives the rows and values of the whole metric's frame, filtered and
    cut down to those columns; asked again of the same layout, it is the cached selection."""
    src, clock = _source({"http://n1:9445/metrics": H200})
    for _ in range(3):
        src.scrape_once()
        clock["t"] += 5
    hist = src._snapshot()
    picks = src._within(hist, 0.0, clock["t"])
    whole = frame(of_metric("gpulens_gpu_boundness"), picks, time=True)
    cols = ("uuid", "mig_uuid", "class")
    launch = frame(of_metric("gpulens_gpu_boundness", cols, ("class", "launch")), picks, time=True)
    want = whole[whole["class"] == "launch"][[*sorted(c for c in cols if c in whole.columns), "timestamp", "value"]]
    assert len(launch) == 3 * 8, "one series a GPU, three scrapes"
    pd.testing.assert_frame_equal(
        launch.sort_values(["uuid", "timestamp"]).reset_index(drop=True),
        want.sort_values(["uuid", "timestamp"]).reset_index(drop=True),
        check_dtype=False,
    )
    layout = hist[0].scrapes[-1].layout
    assert layout.subset("gpulens_gpu_boundness", cols, ("class", "launch")) is layout.subset(
        "gpulens_gpu_boundness", cols, ("class", "launch")
    )
    none = frame(of_metric("gpulens_gpu_boundness", cols, ("class", "no-such-class")), picks, time=True)
    assert none.empty
