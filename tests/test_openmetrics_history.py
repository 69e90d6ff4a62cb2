"""The one OpenMetrics history writer (backfills for the advisor, the scale test and the
consistency test): it writes what an exporter would serve, or refuses."""

from __future__ import annotations

import io

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from dashboard.sources.openmetrics import OpenMetricsHistory, label_text

LEAF = {"gpu": "0", "uuid": "GPU-a", "mig_uuid": "", "instance": "n1:9445", "job": "gpulens"}


def test_families_parse_as_openmetrics_with_counter_names_and_absent_samples() -> None:
    out = io.StringIO()
    history = OpenMetricsHistory(out)
    history.series("gpulens_gpu_sm_active_ratio", LEAF, ["0.5", None, "0.25"], ["100", "160", "220"])
    history.series("gpulens_gpu_busy_seconds_total", LEAF, ["1", "61"], ["100", "160"])
    assert history.close() == 4
    families = {f.name: f for f in text_string_to_metric_families(out.getvalue())}
    assert families["gpulens_gpu_sm_active_ratio"].type == "gauge"
    assert [s.value for s in families["gpulens_gpu_sm_active_ratio"].samples] == [0.5, 0.25]
    busy = families["gpulens_gpu_busy_seconds"]  # an OpenMetrics counter family drops _total
    assert busy.type == "counter"
    assert [s.name for s in busy.samples] == ["gpulens_gpu_busy_seconds_total"] * 2
    assert out.getvalue().endswith("# EOF\n")


def test_a_label_the_exporter_does_not_export_is_refused() -> None:
    history = OpenMetricsHistory(io.StringIO())
    with pytest.raises(ValueError, match=r"no label .*'pod'"):
        history.series("gpulens_gpu_sm_active_ratio", {**LEAF, "pod": "x"}, ["1"], ["100"])


def test_an_unknown_metric_is_refused() -> None:
    with pytest.raises(KeyError, match="unknown metric"):
        OpenMetricsHistory(io.StringIO()).series("gpulens_gpu_sm_activ_ratio", LEAF, ["1"], ["100"])


def test_a_family_split_in_two_is_refused() -> None:
    history = OpenMetricsHistory(io.StringIO())
    history.series("gpulens_gpu_sm_active_ratio", LEAF, ["1"], ["100"])
    history.series("gpulens_gpu_dram_active_ratio", LEAF, ["1"], ["100"])
    with pytest.raises(ValueError, match="written together"):
        history.series("gpulens_gpu_sm_active_ratio", {**LEAF, "gpu": "1"}, ["1"], ["100"])


def test_values_and_timestamps_must_pair_up() -> None:
    with pytest.raises(ValueError, match="2 values for 1 timestamps"):
        OpenMetricsHistory(io.StringIO()).series("gpulens_up", {}, ["1", "1"], ["100"])


def test_label_values_are_escaped_and_empty_ones_left_out() -> None:
    assert label_text({"pod": 'a"b\\c\nd', "mig_uuid": "", "gpu": "0"}) == '{gpu="0",pod="a\\"b\\\\c\\nd"}'
