"""The Serving page's figures (dashboard/advisor/serving_figures.py) from the rules' answers: one row
per model and role, the rules' values as they are, the GPU model its pods hold, and the cost per
million output tokens from the advisor's own price function, checked against hand computations."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from dashboard.advisor import serving_figures as sf
from dashboard.serving import rules


def _rules(rows: list[tuple[str, str, str, float]]) -> pd.DataFrame:
    """(rule, model, role, value) in cluster c, namespace ns, as query_labels reads them."""
    return pd.DataFrame(
        [
            {"__name__": r, "cluster": "c", "namespace": "ns", "model": m, "role": role, "value": v}
            for r, m, role, v in rows
        ]
    )


def _names(rows: list[tuple[str, str, str]]) -> pd.DataFrame:
    return pd.DataFrame(
        [{"cluster": "c", "namespace": "ns", "model": m, "role": role, "name": n, "value": 1.0} for m, role, n in rows]
    )


def test_every_figure_is_a_serving_rule() -> None:
    assert set(sf.MODEL_FIGURES.values()) <= set(rules.RULES)
    assert all(r.startswith("gpulens:serving_model_") for r in sf.MODEL_FIGURES.values())


def test_one_row_per_model_and_role_with_the_rules_values_and_the_cost_per_million_tokens() -> None:
    rows = _rules(
        [
            ("gpulens:serving_model_gpus:sum", "llama", "decode", 2.0),
            ("gpulens:serving_model_output_tokens:rate5m", "llama", "decode", 100.0),
            ("gpulens:serving_model_joules_per_output_token:ratio", "llama", "decode", 4.0),
            ("gpulens:serving_model_itl_seconds:p95_5m", "llama", "decode", 0.03),
            ("gpulens:serving_model_gpus:sum", "llama", "prefill", 1.0),
            ("gpulens:serving_model_output_tokens:rate5m", "llama", "prefill", 5.0),
            ("gpulens:serving_model_pods:count", "llama", "frontend", 1.0),
            ("gpulens:serving_model_output_tokens:rate5m", "llama", "frontend", 100.0),
            ("gpulens:gpu_idle:bool", "llama", "decode", 1.0),  # not a figure of the page: ignored
        ]
    )
    names = _names([("llama", "decode", "NVIDIA H200"), ("llama", "prefill", "NVIDIA H200"),
                    ("llama", "prefill", "NVIDIA H100 80GB HBM3")])  # fmt: skip
    got = sf.model_frame(rows, names, {"H200": 3.5}).set_index("role")
    assert sorted(got.index) == ["decode", "frontend", "prefill"]
    decode = got.loc["decode"]
    assert decode["gpus"] == 2.0 and decode["itl_p95"] == 0.03 and decode["gpu_model"] == "NVIDIA H200"
    # 2 GPUs x $3.5 an hour = $7/h for 100 tok/s = 360,000 tok/h: $19.44 per million
    assert decode["usd_per_million"] == pytest.approx(7.0 / 360_000 * 1e6)
    assert decode["joules_per_million"] == pytest.approx(4e6)
    assert math.isnan(decode["ttft_p95"]), "a rule without a series is missing, not 0"
    assert got.loc["prefill", "gpu_model"] == sf.MIXED_GPUS and pd.isna(got.loc["prefill", "usd_per_million"])
    frontend = got.loc["frontend"]
    assert frontend["gpu_model"] == "" and pd.isna(frontend["usd_per_million"]) and math.isnan(frontend["gpus"])


def test_no_price_no_cost_and_no_rows_an_empty_frame() -> None:
    rows = _rules([("gpulens:serving_model_gpus:sum", "m", "both", 1.0),
                   ("gpulens:serving_model_output_tokens:rate5m", "m", "both", 10.0)])  # fmt: skip
    got = sf.model_frame(rows, _names([("m", "both", "NVIDIA H200")]), {})
    assert got["usd_per_million"].isna().all()
    empty = sf.model_frame(pd.DataFrame(columns=["__name__", *sf.KEYS, "value"]), _names([]), {})
    assert empty.empty and {"gpu_model", "usd_per_million", *sf.MODEL_FIGURES} <= set(empty.columns)


def test_the_queries_filter_by_cluster_and_namespace_only() -> None:
    from dashboard.sources.source import Filters

    q = sf.queries(Filters(cluster="a", node="n1", namespace="ns"))
    assert 'cluster="a"' in q["models"] and 'namespace="ns"' in q["models"]
    assert all("n1" not in text for text in q.values()), "a model spans nodes: the node filter does not apply"


# --- the Serving row of the job and GPU pages: per pod ---------------------------------------------


def _pod_rules(rows: list[tuple[str, str, str, str, float]]) -> pd.DataFrame:
    """(rule, pod, role, role_source, value) of model m served by vLLM in cluster c, namespace ns."""
    return pd.DataFrame(
        [
            {"__name__": r, "cluster": "c", "namespace": "ns", "pod": pod, "model": "m", "serving_engine": "vllm",
             "role": role, "role_source": source, "value": v}
            for r, pod, role, source, v in rows
        ]
    )  # fmt: skip


def test_every_pod_figure_is_a_per_pod_serving_rule() -> None:
    assert set(sf.POD_FIGURES.values()) <= set(rules.RULES)
    assert not any(r.startswith("gpulens:serving_model_") for r in sf.POD_FIGURES.values())


def test_one_row_per_serving_pod_with_the_rules_values_scaled_and_the_role_in_words() -> None:
    rows = _pod_rules(
        [
            ("gpulens:serving_pod:info", "decode-0", "decode", "inferred", 1.0),
            ("gpulens:serving_output_tokens:rate5m", "decode-0", "decode", "inferred", 2400.0),
            ("gpulens:serving_output_tokens_per_gpu_second:ratio", "decode-0", "decode", "inferred", 1200.0),
            ("gpulens:serving_joules_per_output_token:ratio", "decode-0", "decode", "inferred", 0.45),
            ("gpulens:serving_itl_seconds:p95_5m", "decode-0", "decode", "inferred", 0.0315),
            ("gpulens:serving_ttft_seconds:p95_5m", "decode-0", "decode", "inferred", 0.25),
            ("gpulens:serving_kv_cache_usage:ratio_avg5m", "decode-0", "decode", "inferred", 0.62),
            ("gpulens:serving_pod:info", "prefill-0", "prefill", "declared", 1.0),
            ("gpulens:serving_output_tokens:rate5m", "prefill-0", "prefill", "declared", 5.0),
            ("gpulens:serving_input_tokens_per_gpu_second:ratio", "prefill-0", "prefill", "declared", 9000.0),
            ("gpulens:serving_joules_per_output_token:ratio", "prefill-0", "prefill", "declared", 140.0),
            ("gpulens:serving_pod:info", "cold-0", "", "unknown", 1.0),
            ("gpulens:serving_model_gpus:sum", "decode-0", "decode", "inferred", 9.0),  # a model rule: not a pod's
        ]
    )
    got = sf.pod_frame(rows)
    assert list(got.columns) == list(sf.POD_COLUMNS)
    assert list(got["pod"]) == ["cold-0", "decode-0", "prefill-0"], "sorted by namespace, pod, model"
    by = got.set_index("pod")
    assert list(by["role"]) == ["unknown (no GPU class)", "decode (inferred)", "prefill"]
    decode = by.loc["decode-0"]
    assert decode["output_tokens_per_second"] == 2400.0 and decode["output_tokens_per_gpu_second"] == 1200.0
    # 0.45 J per output token is 0.45 MJ per million: the page's unit, the rule's number
    assert decode["energy_per_million"] == pytest.approx(0.45)
    assert decode["itl_p95_ms"] == pytest.approx(31.5) and decode["ttft_p95_ms"] == pytest.approx(250.0)
    assert decode["kv_cache_mean"] == 0.62
    prefill = by.loc["prefill-0"]
    assert math.isnan(prefill["energy_per_million"]), "a prefill pod's energy goes to prompts, not output tokens"
    assert prefill["input_tokens_per_gpu_second"] == 9000.0
    cold = by.loc["cold-0"]
    assert cold[["output_tokens_per_second", "itl_p95_ms", "kv_cache_mean"]].isna().all(), "no series, never a zero"


def test_no_serving_pod_an_empty_frame_with_every_column() -> None:
    empty = sf.pod_frame(pd.DataFrame(columns=[*sf.POD_LABELS, "value"]))
    assert empty.empty and list(empty.columns) == list(sf.POD_COLUMNS)
    other = sf.pod_frame(_pod_rules([("gpulens:serving_model_pods:count", "p", "both", "declared", 1.0)]))
    assert other.empty


def test_the_pods_query_reads_every_pod_rule_of_the_scopes_pods_in_one_query() -> None:
    q = sf.pods_query('gpulens:job_leaf:info{workload="a\\"b"}', {"cluster": "c", "namespace": 'n"s'})
    assert q.count("{__name__=~") == 1
    assert all(rule in q for rule in sf.POD_FIGURES.values())
    assert 'cluster="c"' in q and 'namespace="n\\"s"' in q, "label values are quoted"
    assert q.endswith(' and on (cluster, namespace, pod) (gpulens:job_leaf:info{workload="a\\"b"})')
