"""The simulated inference engines (exporter/sim/engines.py) serve each engine's real format, read
by the engine table the serving rules are generated from (dashboard/serving/engines.py), with
figures consistent with the serving node's GPUs (exporter/sim/serving.py, scenarios.py)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dashboard.serving import engines as table
from exporter.sim import engines, scenarios, serving


def _families(text: str) -> dict[str, str]:
    """Family name -> type, as a Prometheus client parses the page (raises on a malformed one)."""
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


@pytest.mark.parametrize("target", engines.targets(), ids=lambda t: t.pod)
def test_every_page_parses_and_the_table_reads_its_concepts(target: engines.Target) -> None:
    """Each concept the engine table maps for this engine is on the page under the first name (the
    current release's), with its kind; each target is a pod of the scenario or the frontend."""
    text = engines.render(target, 600.0)
    kinds = _families(text)
    names = _samples(text)
    engine = table.BY_NAME[target.deployment.engine]
    for concept, src in engine.sources().items():
        name = src.names[0]
        if concept in table.HISTOGRAMS:
            assert kinds.get(name) == "histogram", (concept, name)
        elif concept in table.COUNTERS and not name.endswith(("_sum", "_count")):
            assert kinds.get(name.removesuffix("_total")) == "counter", (concept, name)
            assert names[name] > 0 or target.deployment.role == "decode", (concept, name)
        else:
            assert name in names, (concept, name)


def test_the_targets_are_the_scenarios_serving_pods() -> None:
    pods = {(p.namespace, p.name) for p in scenarios.build("serving").pods}
    for target in engines.targets():
        if target.deployment.gpus:
            assert (target.namespace, target.pod) in pods
        else:
            assert (target.namespace, target.pod) not in pods, "the frontend holds no GPU"


def test_counters_grow_at_the_deployments_rates() -> None:
    target = next(t for t in engines.targets() if t.deployment.workload == serving.DECODE)
    a, b = _samples(engines.render(target, 600.0)), _samples(engines.render(target, 900.0))
    rate = (b["vllm:generation_tokens_total"] - a["vllm:generation_tokens_total"]) / 300.0
    assert rate == pytest.approx(target.deployment.output_tokens_per_second(), rel=1e-3)


def test_the_disaggregated_pair_moves_what_the_prefill_computes() -> None:
    """The KV cache the prefill pod hands on (its prompt tokens x KV bytes per token) is what the
    scenario's GPUs carry over NVLink and EFA, and the decode side gets it."""
    pf = serving.deployment(serving.PREFILL)
    nvlink, efa = serving.kv_bytes(serving.PREFILL)
    assert nvlink + efa == pytest.approx(pf.input_tokens_per_second() * pf.model.kv_bytes_per_token)
    gpus = scenarios.build("serving").gpus
    prefill = [g for g in gpus if g.index in (2, 3)]
    decode = [g for g in gpus if g.index in (4, 5)]
    for g in (*prefill, *decode):
        (proc,) = g.leaves[0].processes
        assert isinstance(proc.workload, scenarios.w.Serving)
        assert proc.workload.kv_nvlink * 2 == pytest.approx(nvlink)
    assert sum(g.leaves[0].processes[0].workload.kv_nic_tx for g in prefill) == pytest.approx(efa)  # type: ignore[attr-defined]
    assert sum(g.leaves[0].processes[0].workload.kv_nic_rx for g in decode) == pytest.approx(efa)  # type: ignore[attr-defined]


def test_file_sd_gives_the_labels_kubernetes_discovery_would() -> None:
    groups = engines.file_sd("127.0.0.1", 9500)
    assert [g["targets"] for g in groups] == [[f"127.0.0.1:{9500 + i}"] for i in range(len(engines.targets()))]
    decode = next(g for g in groups if "decode" in str(g["labels"]))
    labels = decode["labels"]
    assert isinstance(labels, dict)
    assert labels[table.meta_label(table.DYNAMO_SUB_COMPONENT_TYPE)] == "decode"
    assert labels["__meta_kubernetes_namespace"] == serving.NAMESPACE
