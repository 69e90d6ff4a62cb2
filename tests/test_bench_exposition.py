"""The benches' exposition readers on the exporter's real page: every series carries ``node``, so a
reader that expects the stage label alone finds nothing (the H100 overhead run of issue 55 called
attribution broken for that reason)."""

from __future__ import annotations

from pathlib import Path

from tests.support.exposition_labels import stage_success, unresolved_walks

GOLDEN = Path(__file__).parent / "golden"


def test_stage_success_reads_every_stage_of_a_page_with_node_labels() -> None:
    body = (GOLDEN / "h200x8.prom").read_bytes()
    expected = {
        line.split(b'stage="', 1)[1].split(b'"', 1)[0].decode()
        for line in body.splitlines()
        if line.startswith(b"gpulens_stage_success{")
    }
    assert expected, "the golden page has no stage series"
    assert set(stage_success(body)) == expected


def test_unresolved_walks_sum_only_the_unresolved_outcomes_whatever_the_labels() -> None:
    body = (
        b'gpulens_kubernetes_owner_walks_total{node="n1",outcome="error"} 2\n'
        b'gpulens_kubernetes_owner_walks_total{outcome="forbidden",node="n1"} 1\n'
        b'gpulens_kubernetes_owner_walks_total{node="n1",outcome="resolved"} 7\n'
    )
    assert unresolved_walks(body) == 3
