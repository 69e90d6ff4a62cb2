"""The serving engine table (dashboard/serving/engines.py) and the gpulens.serving rules generated
from it (dashboard/serving/rules.py): the rules read exactly the table's metric names, an engine is
one entry, every ratio names its divisor. promtool checks the values (deploy/rules/tests/
serving.test.yml); tests/test_rules_victoriametrics.py checks VictoriaMetrics gives the same."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dashboard.serving import engines, rules
from tests.support.documents import yaml_file

REPO = Path(__file__).resolve().parents[1]
RULES_FILE = REPO / "deploy" / "rules" / "gpulens.rules.yml"


def _gen_rules() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_rules_serving", REPO / "scripts" / "gen_rules.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def _serving_group() -> list[dict[str, str]]:
    groups = yaml_file(RULES_FILE)["groups"]
    (group,) = [g for g in groups if g["name"] == "gpulens.serving"]
    return list(group["rules"])


_ENGINE_NAME = re.compile(
    r"(?<![\w:])((?:vllm|sglang|trtllm):[a-z0-9_]+|(?:tgi|nv|dynamo|trtllm)_[a-z0-9_]+)(?=\s*[{\[)]|\s|$)"
)
"""A metric name of the engine prefixes in a rule's expression."""


def _table_names() -> set[str]:
    out = set()
    for engine in engines.ENGINES:
        for concept, src in engine.sources().items():
            for name in src.names:
                out |= {f"{name}_bucket"} if concept in engines.HISTOGRAMS else {name}
    return out


def test_the_rules_read_exactly_the_engine_tables_metric_names() -> None:
    """A name in the rules that the table does not declare (a typo, a name written by hand) fails,
    and so does a declared name no rule reads."""
    used = {m for r in _serving_group() for m in _ENGINE_NAME.findall(r["expr"])}
    assert used == _table_names()


def test_an_engine_is_one_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new engine in the table reaches every per-pod rule of the concepts it exposes, and nothing else."""
    new = engines.Engine(
        name="llamacpp",
        title="llama.cpp server",
        versions="test",
        model_labels=("model",),
        output_tokens=engines.Source(("llamacpp:tokens_predicted_total",)),
        running=engines.Source(("llamacpp:requests_processing",)),
    )
    monkeypatch.setattr(engines, "ENGINES", (*engines.ENGINES, new))
    generated = rules._rules()
    assert "llamacpp:tokens_predicted_total" in generated["gpulens:serving_output_tokens:rate5m"]
    assert "llamacpp:requests_processing" in generated["gpulens:serving_requests_running:avg5m"]
    assert "llamacpp" in generated["gpulens:serving_pod_engine:info"]
    assert "llamacpp" in generated["gpulens:serving_unjoinable_series:count"]
    assert "llamacpp" not in generated["gpulens:serving_input_tokens:rate5m"]


def test_a_name_mapped_twice_or_an_engine_nothing_shows_is_refused() -> None:
    twice = dataclasses.replace(engines.SGLANG, name="sglang-copy")
    with pytest.raises(ValueError, match="mapped twice"):
        engines._check((engines.SGLANG, twice))
    with pytest.raises(ValueError, match="duplicate engine"):
        engines._check((engines.VLLM, engines.VLLM))
    histograms_only = engines.Engine("x", "x", "test", (), ttft=engines.Source(("x_ttft_seconds",)))
    with pytest.raises(ValueError, match="no counter or gauge"):
        engines._check((histograms_only,))
    with pytest.raises(ValueError, match="unknown serving concept"):
        engines.VLLM.source("tokens")


def test_every_ratio_says_what_it_divides_by() -> None:
    """A ``:ratio`` record (tokens per GPU-second, joules per token) names its divisor in its comment;
    the KV-cache fractions say they are 0..1."""
    comments = _gen_rules().SERVING_COMMENTS
    for name in rules.RULES:
        if name.endswith(":ratio"):
            assert "DIVIDED BY" in comments[name], name
        if ":ratio_" in name:
            assert "0..1" in comments[name], name


def test_every_serving_rule_is_placed_with_a_comment() -> None:
    placed = [r["record"] for r in _serving_group()]
    assert placed == list(rules.RULES)


@pytest.mark.parametrize(
    ("label", "meta"),
    [
        ("llm-d.ai/role", "__meta_kubernetes_pod_label_llm_d_ai_role"),
        ("nvidia.com/dynamo-sub-component-type", "__meta_kubernetes_pod_label_nvidia_com_dynamo_sub_component_type"),
        ("gpulens.io/serving-role", "__meta_kubernetes_pod_label_gpulens_io_serving_role"),
    ],
)
def test_pod_labels_map_to_their_service_discovery_labels(label: str, meta: str) -> None:
    assert engines.meta_label(label) == meta


def test_role_aliases_are_disjoint_and_name_every_role() -> None:
    seen: dict[str, str] = {}
    for role, aliases in engines.ROLE_ALIASES.items():
        for alias in aliases:
            assert alias.lower() not in seen, (alias, seen.get(alias.lower()), role)
            seen[alias.lower()] = role
    assert set(engines.ROLES) <= set(engines.ROLE_ALIASES)


VM_MAX_QUERY_BYTES = 16384
"""VictoriaMetrics' default ``-search.maxQueryLen``: vmalert's queries longer than this are refused."""


def test_every_rule_fits_victoriametrics_default_query_length() -> None:
    """A rule over 16 KiB works in Prometheus and fails every evaluation in a default
    VictoriaMetrics (the first serving info rule was 23.8 KiB)."""
    for group in yaml_file(RULES_FILE)["groups"]:
        for rule in group["rules"]:
            size = len(rule["expr"].encode())
            assert size < VM_MAX_QUERY_BYTES * 0.75, (rule.get("record") or rule.get("alert"), size)


def test_docs_serving_names_every_engine_name_and_every_rule() -> None:
    """docs/serving.md is the reference the advisor, the page and users read: a name added to the
    table or the rules without it fails."""
    text = (REPO / "docs" / "serving.md").read_text()
    for engine in engines.ENGINES:
        assert engine.title in text, engine.name
        for src in engine.sources().values():
            for name in src.names:
                assert f"`{name}" in text, name
    for name in rules.RULES:
        base, _, suffix = name.rpartition(":")
        assert name in text or (f"`{base}:" in text and f":{suffix}`" in text), name
    for label in engines.ROLE_POD_LABELS:
        assert engines.meta_label(label) in text, label
