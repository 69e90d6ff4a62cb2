"""exporter/render/exposition.py writes what prometheus_client's encoders write, byte for byte.

prometheus_client stays the reference: each case renders the same families through our encoder
(``SnapshotCollector.exposition``) and through ``generate_latest`` of a registry holding the same
collector, in both formats, over every simulated node layout and over families with label
values and readings chosen to hit each escaping and number-formatting rule.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from exporter.cli import build
from exporter.config import parse_config
from exporter.render import metrics as cat
from exporter.render.collector import SnapshotCollector
from exporter.render.exposition import Encoder, Family, LabelSets, escape_label_value
from exporter.sim import SCENARIOS


def _both(collector: SnapshotCollector) -> list[tuple[str, str]]:
    registry = CollectorRegistry()
    registry.register(collector)
    return [
        (collector.exposition(False), generate_latest(registry).decode()),
        (collector.exposition(True), openmetrics_latest(registry).decode()),
    ]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_simulated_layout_encodes_as_prometheus_client_does(scenario: str) -> None:
    sampler, _expo, _backend = build(parse_config(["--backend", "sim", "--sim.scenario", scenario, "--no-probes"]))
    try:
        collector = SnapshotCollector(sampler.latest, version="1.2.3", backend="sim", include_age=False)
        for _ in range(4):  # each cycle's page, so that families kept from the one before are checked too
            sampler.run_once()
            for ours, theirs in _both(collector):
                assert ours == theirs
                assert ours.count("\n") > 100
        assert collector._encoder.reused > 0, "no family was ever taken from the render before"
    finally:
        sampler.stop()  # a p5en node's NIC source keeps ~1,200 counter files open until then


ODD_VALUES = ["", "plain", 'a "quoted" word', "back\\slash", "new\nline", "ünïcødé ✓", "\\n literal", '"\\\n']
ODD_READINGS = [0.0, -0.0, 1.0, 42, 0.1, 1e-9, 123456.0, 1234567.0, 1e16, 1e21, 2**53 + 1.0, -7.5, -1e300]


def _odd_catalogue() -> list[cat.MetricSpec]:
    """Two families over the GPU scope that add a label and read every odd value and reading."""

    def each(view: object) -> list[tuple[tuple[str, ...], float]]:
        return [((value,), reading) for value, reading in zip(ODD_VALUES * 2, ODD_READINGS, strict=False)]

    power = cat.spec("gpulens_gpu_power_watts")
    energy = cat.spec("gpulens_gpu_energy_joules_total")
    return [
        replace(power, own_labels=("zeta_label",), read=each, help='help with "quotes", a \\ and a\nnewline'),
        replace(energy, own_labels=("alpha_label",), read=each),
        *(s for s in cat.CATALOGUE if s.scope.name == "exporter"),
    ]


def test_odd_label_values_and_readings_encode_as_prometheus_client_does() -> None:
    sampler, _expo, _backend = build(parse_config(["--backend", "sim", "--no-probes"]))
    snap = sampler.run_once()
    collector = SnapshotCollector(lambda: snap, catalogue=_odd_catalogue(), include_age=False)
    for ours, theirs in _both(collector):
        assert ours == theirs
        assert 'zeta_label="a \\"quoted\\" word"' in ours
    # A label that sorts before the scope's: prometheus_client writes labels sorted by name.
    assert '{alpha_label="plain",gpu="0"' in collector.exposition(False)


def test_missing_readings_are_left_out_in_both() -> None:
    sampler, _expo, _backend = build(parse_config(["--backend", "sim", "--no-probes"]))
    snap = sampler.run_once()

    def nan(_v: object) -> list[tuple[tuple[str, ...], float | None]]:
        return [
            ((), float("nan")),
            ((), float("inf")),
            ((), None),
        ]

    catalogue = [replace(cat.spec("gpulens_gpu_power_watts"), read=nan), cat.spec("gpulens_up")]
    collector = SnapshotCollector(lambda: snap, catalogue=catalogue, include_age=False)
    for ours, theirs in _both(collector):
        assert ours == theirs
        assert "gpulens_gpu_power_watts" not in ours


def test_one_sample_entries_leave_out_missing_readings_too() -> None:
    """One-sample entries take the renderer's shorter path (``OneSample``): a reading of None,
    NaN or an infinity, a float subclass's NaN included, is left out there as well."""
    sampler, _expo, _backend = build(parse_config(["--backend", "sim", "--no-probes"]))
    snap = sampler.run_once()

    class Reading(float):
        pass

    odd = iter([None, float("nan"), float("inf"), Reading("nan"), -float("inf"), 250.0, 1, Reading(2.5)])
    base = cat.spec("gpulens_gpu_power_watts")
    spec = replace(base, read=cat.OneSample(lambda _gpu: next(odd)))
    collector = SnapshotCollector(lambda: snap, catalogue=[spec, cat.spec("gpulens_up")], include_age=False)
    text = collector.exposition(False)
    values = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith("gpulens_gpu_power_watts{")]
    assert values == ["250.0", "1.0", "2.5"], "8 GPUs: the five missing readings are left out"


def test_before_the_first_snapshot_both_agree() -> None:
    collector = SnapshotCollector(lambda: None, version="0.1", backend="sim")
    for ours, theirs in _both(collector):
        assert ours == theirs
        assert "gpulens_up 0.0" in ours


def test_the_label_set_cache_is_bounded_and_stays_right_when_it_fills() -> None:
    sets = LabelSets(max_entries=4)
    names = ("pod", "namespace")
    for i in range(50):
        if i % 10 == 0:
            sets.next_render()
        assert sets.encode(names, (f"p{i}", "ns")) == f'{{namespace="ns",pod="p{i}"}}'
        assert len(sets) <= 8, "at most max_entries in each of the two generations"
    assert sets.encode((), ()) == ""


def test_the_label_sets_of_departed_pods_are_forgotten_after_two_renders() -> None:
    # pods replaced every render (a node with churn): the cache holds the live sets, not every
    # pod that ever ran; a set used every render stays and reads the same
    sets = LabelSets()
    names = ("pod",)
    for render in range(200):
        sets.next_render()
        for i in range(10):
            sets.encode(names, (f"r{render}-p{i}",))
        assert sets.encode(names, ("steady",)) == '{pod="steady"}'
        assert len(sets) <= 2 * 11, len(sets)


def test_escaping_follows_the_format() -> None:
    assert escape_label_value('a\\b\n"c"') == 'a\\\\b\\n\\"c\\"'
    text = Encoder().encode([(Family("x_total", "counter", 'say "hi"', ()), [((), 1.0)])], openmetrics=False)
    assert text == '# HELP x_total say "hi"\n# TYPE x_total counter\nx_total 1.0\n'
    om = Encoder().encode([(Family("x_total", "counter", 'say "hi"', ()), [((), 1.0)])], openmetrics=True)
    assert om == '# HELP x say \\"hi\\"\n# TYPE x counter\nx_total 1.0\n# EOF\n'


def test_a_family_is_reused_only_while_its_samples_are_equal() -> None:
    """The text of the render before is taken for a family whose label values and readings are
    the same; any change (a reading, a label value, one sample more) formats it again."""
    enc = Encoder()
    fam = Family("gpulens_x", "gauge", "X.", ("gpu",))
    first = enc.encode([(fam, [(("0",), 1.0), (("1",), 2.0)])], False)
    assert enc.encode([(fam, [(("0",), 1.0), (("1",), 2.0)])], False) == first
    assert enc.reused == 1
    for changed in ([(("0",), 1.0), (("1",), 3.0)], [(("0",), 1.0), (("2",), 2.0)], [(("0",), 1.0)]):
        text = enc.encode([(fam, changed)], False)
        assert text == "".join(Encoder().family(fam, changed, False))
    assert enc.reused == 1
    nan = [(("0",), float("nan"))]
    assert enc.encode([(fam, nan)], False).endswith(" NaN\n")
    assert enc.encode([(fam, nan)], True).endswith(" NaN\n# EOF\n"), "each format keeps its own texts"
