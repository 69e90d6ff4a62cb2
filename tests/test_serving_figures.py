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
