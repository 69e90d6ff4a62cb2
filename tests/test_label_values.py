"""No single value can fail a page, and label values have a ceiling (issue 51, defects 1 and 5).

The rule (exporter/label_values.py): any string becomes a valid UTF-8 label value of at most 253
characters, escaped reversibly, cut with a hash past the ceiling.  The render's last guard
(exporter/render/collector.py): a family that still cannot be written is dropped alone, counted
in ``gpulens_render_errors_total`` and named by ``/readyz``.  Both are checked over every family of
the catalogue, with invalid bytes, lone surrogates and 1 MiB strings in every label.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter import label_values
from exporter.label_values import MAX_LABEL_VALUE_CHARS, label_value, unescape_label_value
from exporter.render import metrics as cat
from exporter.render.collector import CachedExposition, SnapshotCollector
from exporter.render.scopes import EXPORTER, Scope
from exporter.sampler import Sampler
from tests.fakes_backend import ScriptedBackend, healthy

MIB = 1024 * 1024
NOT_UTF8 = os.fsdecode(b"rx_\xff_bytes")
"""A sysfs file name with byte 0xff, as ``os.listdir`` gives it (a surrogate escape)."""
LONE = "team-\ud800-owner"
"""A name whose JSON held ``\\ud800``: a lone surrogate once decoded."""
HUGE = "w" * MIB
WIDEST = max(len(s.labels) for s in cat.CATALOGUE)
HOSTILE = {
    "not_utf8": NOT_UTF8,
    "lone_surrogate": LONE,
    "huge": HUGE,
    "huge_not_utf8": "\udcff" * MIB,
    "mixed": "a\\b\udc80\ud83d" + "z" * 300,
}


def test_real_names_are_left_as_they_are() -> None:
    for name in ("mlx5_0", "rdmap79s0", "tx_bytes", "train-workers-0-0-abcde", "ünïcødé ✓", "", "x" * 253):
        assert label_value(name) is name


def test_the_escape_is_valid_utf8_and_reversible() -> None:
    assert label_value(NOT_UTF8) == "rx_\\xff_bytes"
    assert label_value(LONE) == "team-\\ud800-owner"
    assert label_value("back\\slash") == "back\\\\slash"
    for original in (NOT_UTF8, LONE, "back\\slash", "\\xff", "a\\b\udc80\ud83d", os.fsdecode(b"mlx5_\xff\xfe")):
        escaped = label_value(original)
        escaped.encode()  # valid UTF-8
        assert unescape_label_value(escaped) == original
    assert label_value("\\xff") != label_value(os.fsdecode(b"\xff")), "the text \\xff and byte 0xff stay apart"
    assert os.fsencode(unescape_label_value(label_value(os.fsdecode(b"mlx5_\xff")))) == b"mlx5_\xff"


def test_a_long_value_is_cut_with_a_hash_of_the_whole_and_two_stay_distinct() -> None:
    a, b = label_value(HUGE + "a"), label_value(HUGE + "b")
    assert len(a) == len(b) == MAX_LABEL_VALUE_CHARS
    assert a != b, "two names that differ only past the cut"
    assert a.startswith("w" * 200) and a[-17] == "~"
    assert label_value(HUGE + "a") == a, "the same name gives the same value"
    cut = label_value("\udcff" * MIB)
    cut.encode()
    assert len(cut) <= MAX_LABEL_VALUE_CHARS and cut.split("~")[0].endswith("\\xff"), "never half an escape"


def test_rewrites_are_counted_by_reason() -> None:
    before = label_values.rewritten()
    label_value(NOT_UTF8)
    label_value(HUGE)
    label_value("\udcff" * MIB)
    label_value("back\\slash")  # the escape's own spelling, not a fault of the input
    label_value("mlx5_0")
    after = label_values.rewritten()
    assert after["invalid_utf8"] - before["invalid_utf8"] == 2
    assert after["too_long"] - before["too_long"] == 2


# --- every family of the catalogue, every label -----------------------------------------------------


def _hostile_catalogue(value_of: Callable[[int], str], exporter_reads: bool) -> list[cat.MetricSpec]:
    """The catalogue with ``value_of(i)`` in every label ``i`` of every family: each scope yields one
    instance with those identity values, each entry one sample with those values of its own labels.
    With ``exporter_reads``, the exporter's own families keep their real reads (so they can report
    what failed)."""
    scopes: dict[str, Scope[object]] = {}
    out = []
    for spec in cat.CATALOGUE:
        scope = spec.scope
        if scope is EXPORTER and exporter_reads:
            out.append(spec)
            continue
        if scope is not EXPORTER:

            def walk(_frame: object, w: int = len(scope.labels)) -> list[tuple[tuple[str, ...], object]]:
                return [(tuple(value_of(i) for i in range(w)), None)]

            scope = scopes.setdefault(scope.name, Scope(scope.name, scope.labels, walk, ""))
        first, width = len(scope.labels), len(spec.own_labels)

        def read(_view: object, f: int = first, w: int = width) -> list[tuple[tuple[str, ...], float]]:
            return [(tuple(value_of(f + i) for i in range(w)), 1.0)]

        out.append(replace(spec, scope=scope, read=read))
    return out


def _snapshot_source() -> Callable[[], object]:
    sampler = Sampler(ScriptedBackend(healthy(1)))
    sampler.run_once()
    snap = sampler.latest()
    return lambda: snap


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_every_family_renders_with_hostile_names_made_label_values(kind: str) -> None:
    """The rule at the entry: every family renders, byte for byte as prometheus_client writes it,
    in valid UTF-8, with no line over a few KiB, and every value reads back to its name (or is cut)."""
    raw = HOSTILE[kind]
    values = [label_value(f"{raw}{i}") for i in range(20)]
    catalogue = _hostile_catalogue(values.__getitem__, exporter_reads=False)
    source = _snapshot_source()
    collector = SnapshotCollector(source, version="1.0", backend="sim", include_age=False, catalogue=catalogue)  # type: ignore[arg-type]
    registry = CollectorRegistry()
    registry.register(collector)
    for openmetrics in (False, True):
        text = collector.exposition(openmetrics)
        if not openmetrics:
            assert text == generate_latest(registry).decode()
        body = text.encode()  # valid UTF-8, or this raises
        # each value at most 253 characters, up to 2 bytes each once written (a backslash doubled)
        assert max(len(line) for line in body.splitlines()) <= WIDEST * (2 * MAX_LABEL_VALUE_CHARS + 40) + 200
    text = collector.exposition(False)
    families = {f.name for f in text_string_to_metric_families(text)}
    wanted = {s.name.removesuffix("_total") for s in cat.CATALOGUE}
    assert wanted <= families, sorted(wanted - families)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for value in sample.labels.values():
                assert len(value) <= MAX_LABEL_VALUE_CHARS
                if "~" not in value:
                    assert unescape_label_value(value).startswith(raw[:100])
    assert collector.render_errors.latest() == ()


def test_a_family_that_cannot_be_written_is_dropped_alone_counted_and_named() -> None:
    """The last guard: raw surrogates in every label of every family (the entry rule bypassed), and
    in the exporter's own version label.  The page is still written, valid UTF-8; exactly the
    families with a label are left out, each counted once per snapshot and named."""
    catalogue = _hostile_catalogue(lambda i: f"{LONE}{i}", exporter_reads=True)
    source = _snapshot_source()
    collector = SnapshotCollector(
        source,  # type: ignore[arg-type]
        version=NOT_UTF8,
        backend="sim",
        include_age=False,
        catalogue=catalogue,
    )
    expo = CachedExposition(collector, source)  # type: ignore[arg-type]
    body, _ctype = expo.render("")
    body.decode()
    om, _ = expo.render("application/openmetrics-text; version=1.0.0")
    assert om.endswith(b"# EOF\n")
    failing = {s.name for s in cat.CATALOGUE if s.labels and s.scope is not EXPORTER} | {"gpulens_build_info"}
    text = body.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in failing:
        assert f"# TYPE {name} " not in text, name
    assert "gpulens_up" in families and "gpulens_stage_success" in families
    stages = {s.labels["stage"]: s.value for s in families["gpulens_stage_success"].samples}
    assert {f"render_{name}" for name in failing - {"gpulens_build_info"}} <= {k for k, v in stages.items() if v == 0}
    errors = {s.labels["family"]: s.value for s in families["gpulens_render_errors"].samples}
    assert set(errors) == failing - {"gpulens_build_info"}, "the exporter's own family is counted on the next page"
    assert set(errors.values()) == {1.0}, "once per snapshot, though both formats were written"
    assert set(expo.failed_families()) == failing
