"""The Serving page's figures, read from Prometheus: every ``gpulens.serving`` model rule at one
instant, one row per (cluster, namespace, model, role), with the GPU models its pods hold, its
pods' classes and its cost per million tokens.

One definition: the figures are the recording rules (``dashboard/serving/rules.py`` writes them,
the Grafana Serving board reads the same); nothing here divides tokens by GPUs or takes a quantile
again. Only unit scaling and the price (``dashboard/advisor/serving.py``'s ``usd_per_million``, the
advisor's own) are applied here. The rules carry ``cluster`` and ``namespace`` but no node (a model
spans nodes): the node filter does not apply.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pandas as pd

from dashboard.advisor.serving import usd_per_million
from dashboard.advisor.serving_gpus import serving_gpu_for
from dashboard.frames.columns import with_cols
from dashboard.promql import selector
from dashboard.serving import rules
from dashboard.sources.prometheus import PrometheusSource
from dashboard.sources.source import NO_FILTERS, Filters

KEYS = ("cluster", "namespace", "model", "role")
"""A row of the page: one role of one model (prefill, decode, both, frontend; roles kept apart)."""

MODEL_FIGURES: Mapping[str, str] = {
    "replicas": "gpulens:serving_model_pods:count",
    "gpus": "gpulens:serving_model_gpus:sum",
    "input_tokens_per_second": "gpulens:serving_model_input_tokens:rate5m",
    "output_tokens_per_second": "gpulens:serving_model_output_tokens:rate5m",
    "requests_per_second": "gpulens:serving_model_requests:rate5m",
    "running": "gpulens:serving_model_requests_running:avg5m",
    "queued": "gpulens:serving_model_requests_queued:avg5m",
    "kv_cache_mean": "gpulens:serving_model_kv_cache_usage:ratio_avg5m",
    "kv_cache_max": "gpulens:serving_model_kv_cache_usage:ratio_max5m",
    "output_tokens_per_gpu_second": "gpulens:serving_model_output_tokens_per_gpu_second:ratio",
    "input_tokens_per_gpu_second": "gpulens:serving_model_input_tokens_per_gpu_second:ratio",
    "joules_per_output_token": "gpulens:serving_model_joules_per_output_token:ratio",
    "ttft_p50": "gpulens:serving_model_ttft_seconds:p50_5m",
    "ttft_p95": "gpulens:serving_model_ttft_seconds:p95_5m",
    "itl_p50": "gpulens:serving_model_itl_seconds:p50_5m",
    "itl_p95": "gpulens:serving_model_itl_seconds:p95_5m",
    "nvlink_bytes_per_second": "gpulens:serving_model_nvlink_bytes:rate5m",
    "nvlink_utilization": "gpulens:serving_model_nvlink_utilization:ratio",
    "nic_bytes_per_second": "gpulens:serving_model_nic_bytes:rate5m",
    "nic_utilization": "gpulens:serving_model_nic_utilization:ratio",
}
"""Column of the page's frame -> the recording rule it is (per model and role, 5 m)."""
for _rule in MODEL_FIGURES.values():  # pragma: no branch (a rename in rules.py fails at import)
    if _rule not in rules.RULES:
        raise RuntimeError(f"{_rule} is not a rule of dashboard/serving/rules.py")

UNJOINABLE = "gpulens:serving_unjoinable_series:count"
MIXED_GPUS = "several GPU models"


@dataclass(frozen=True)
class ServingFigures:
    """What the page draws: ``models`` (one row per :data:`KEYS`, the :data:`MODEL_FIGURES` columns,
    ``gpu_model``, ``joules_per_million``, ``usd_per_million``), ``classes`` (KEYS + ``class`` +
    ``pods``: the serving pods in each class now) and ``unjoinable`` (engine series without
    namespace or pod)."""

    models: pd.DataFrame
    classes: pd.DataFrame
    unjoinable: float


def _matchers(filters: Filters) -> dict[str, str]:
    out = {"cluster": filters.cluster} if filters.cluster else {}
    return {**out, **({"namespace": filters.namespace} if filters.namespace else {})}


def queries(filters: Filters = NO_FILTERS) -> dict[str, str]:
    """The PromQL of the page, keyed by what it reads."""
    m = _matchers(filters)
    names = "|".join(MODEL_FIGURES.values())
    info = f"max by (cluster, namespace, pod, model, role) ({selector('gpulens:serving_pod:info', m)})"
    alloc = f"max by (cluster, namespace, pod, uuid) ({selector('gpulens_pod_gpu_allocation', m)})"
    named = f"{alloc} * on (uuid) group_left (name) max by (uuid, name) (gpulens_gpu_info)"
    pod_class = f"max by (cluster, namespace, pod, class) ({selector('gpulens_pod_gpu_boundness', m)} == 1)"
    return {
        "models": f"{{__name__=~{_quote(names)}{''.join(f', {k}={_quote(v)}' for k, v in sorted(m.items()))}}}",
        "gpu_names": f"count by (cluster, namespace, model, role, name) (({named}) * on (cluster, namespace, pod) "
        f"group_left (model, role) {info})",
        "classes": f"count by (cluster, namespace, model, role, class) ({pod_class} * on (cluster, namespace, pod) "
        f"group_left (model, role) {info})",
        "unjoinable": f"sum({selector(UNJOINABLE, {'cluster': filters.cluster} if filters.cluster else {})})",
    }


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


OVER_TIME: Mapping[str, str] = {
    "output_tokens_per_second": MODEL_FIGURES["output_tokens_per_second"],
    "itl_p95": MODEL_FIGURES["itl_p95"],
}
"""The figures the page draws over the range (a line per model and role)."""


def series_query(figure: str, filters: Filters = NO_FILTERS) -> str:
    """The PromQL of one of :data:`OVER_TIME`'s figures under the cluster and namespace filters."""
    return f"max by (cluster, namespace, model, role) ({selector(OVER_TIME[figure], _matchers(filters))})"


LABELS: Mapping[str, tuple[str, ...]] = {
    "models": ("__name__", *KEYS),
    "gpu_names": (*KEYS, "name"),
    "classes": (*KEYS, "class"),
    "unjoinable": (),
}
"""The labels each of :func:`queries` is read into (``PrometheusSource.query_labels``)."""


def read(
    src: PrometheusSource,
    filters: Filters = NO_FILTERS,
    at: float | None = None,
    prices: Mapping[str, float] | None = None,
) -> ServingFigures:
    """The page's figures at ``at`` (None: now). Raises SourceError when Prometheus does not answer."""
    q = queries(filters)
    with ThreadPoolExecutor(max_workers=len(q)) as pool:
        r = dict(zip(q, pool.map(lambda k: src.query_labels(q[k], LABELS[k], at), q), strict=True))
    return assemble(r, prices or {})


def assemble(r: Mapping[str, pd.DataFrame], prices: Mapping[str, float]) -> ServingFigures:
    """:class:`ServingFigures` from the answers to :func:`queries` (read into :data:`LABELS`)."""
    unjoinable = r["unjoinable"]
    return ServingFigures(
        models=model_frame(r["models"], r["gpu_names"], prices),
        classes=r["classes"].rename(columns={"value": "pods"}),
        unjoinable=float(unjoinable["value"].sum()) if len(unjoinable) else 0.0,
    )


def model_frame(rows: pd.DataFrame, gpu_names: pd.DataFrame, prices: Mapping[str, float]) -> pd.DataFrame:
    """One row per model and role from the rules' series (``__name__``, KEYS, value) and the GPU
    models its pods hold (KEYS, ``name``): the :data:`MODEL_FIGURES` columns (NaN where a rule has
    no series, e.g. a latency with no request), ``gpu_model`` (empty without GPUs, :data:`MIXED_GPUS`
    where its pods hold several), ``joules_per_million`` and ``usd_per_million`` output tokens."""
    column = {rule: col for col, rule in MODEL_FIGURES.items()}
    rows = with_cols(rows, ("__name__", *KEYS))
    rows = rows[rows["__name__"].isin(column)]
    if rows.empty:
        return pd.DataFrame(columns=[*KEYS, *MODEL_FIGURES, "gpu_model", "joules_per_million", "usd_per_million"])
    wide = rows.assign(col=rows["__name__"].map(column)).pivot_table(
        index=list(KEYS), columns="col", values="value", aggfunc="max"
    )
    wide = wide.reindex(columns=list(MODEL_FIGURES)).reset_index()
    wide.columns.name = None
    names: dict[tuple[str, ...], list[str]] = {}
    for x in with_cols(gpu_names, (*KEYS, "name")).to_dict("records"):
        names.setdefault(tuple(str(x[k]) for k in KEYS), []).append(str(x["name"]))
    wide["gpu_model"] = [
        _one(names.get(tuple(str(x[k]) for k in KEYS), [])) for x in wide[list(KEYS)].to_dict("records")
    ]
    wide["joules_per_million"] = wide["joules_per_output_token"] * 1e6
    wide["usd_per_million"] = [
        _usd(str(g), float(n), float(tps), prices)
        for g, n, tps in zip(wide["gpu_model"], wide["gpus"], wide["output_tokens_per_second"], strict=True)
    ]
    return wide


POD_KEYS = ("cluster", "namespace", "pod", "model", "serving_engine", "role", "role_source")
"""A row of the job and GPU pages' Serving table: one model one pod serves (the per-pod rules' labels)."""

POD_FIGURES: Mapping[str, str] = {
    "info": "gpulens:serving_pod:info",
    "output_tokens_per_second": "gpulens:serving_output_tokens:rate5m",
    "input_tokens_per_second": "gpulens:serving_input_tokens:rate5m",
    "output_tokens_per_gpu_second": "gpulens:serving_output_tokens_per_gpu_second:ratio",
    "input_tokens_per_gpu_second": "gpulens:serving_input_tokens_per_gpu_second:ratio",
    "joules_per_output_token": "gpulens:serving_joules_per_output_token:ratio",
    "ttft_p95": "gpulens:serving_ttft_seconds:p95_5m",
    "itl_p95": "gpulens:serving_itl_seconds:p95_5m",
    "kv_cache_mean": "gpulens:serving_kv_cache_usage:ratio_avg5m",
}
"""Column of the pod frame -> the per-pod recording rule it is (5 m; ``info``: the pod serves, its
role completed)."""
for _rule in POD_FIGURES.values():  # pragma: no branch (a rename in rules.py fails at import)
    if _rule not in rules.RULES:
        raise RuntimeError(f"{_rule} is not a rule of dashboard/serving/rules.py")

POD_COLUMNS = (
    "namespace", "pod", "model", "role", "serving_engine", "output_tokens_per_second", "input_tokens_per_second",
    "output_tokens_per_gpu_second", "input_tokens_per_gpu_second", "energy_per_million", "ttft_p95_ms", "itl_p95_ms",
    "kv_cache_mean",
)  # fmt: skip
"""The columns of :func:`pod_frame`."""


def pods_query(scope: str, matchers: Mapping[str, str] | None = None) -> str:
    """One instant query of every :data:`POD_FIGURES` rule of the serving pods that ``scope`` names
    (PromQL whose series carry ``cluster``, ``namespace`` and ``pod``: a job's leaves, a GPU's
    allocation), under ``matchers`` (cluster, namespace). Read into :data:`POD_LABELS`."""
    names = "|".join(POD_FIGURES.values())
    extra = "".join(f", {k}={_quote(v)}" for k, v in sorted((matchers or {}).items()))
    return f"{{__name__=~{_quote(names)}{extra}}} and on (cluster, namespace, pod) ({scope})"


POD_LABELS = ("__name__", *POD_KEYS)
"""The labels :func:`pods_query` is read into."""

ROLE_WORDS = {"inferred": "{role} (inferred)", "unknown": "unknown (no GPU class)"}
"""How a role reads by where it came from (``role_source``); declared and engine roles read as they are."""


def pod_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per pod and model served from :func:`pods_query`'s answer (``__name__``, POD_KEYS,
    value): :data:`POD_COLUMNS`, the rules' values scaled for the page and nothing divided again
    (``energy_per_million``: joules per output token, which is MJ per million; TTFT and ITL p95 in
    ms; NaN where a rule has no series), the role in words (``decode (inferred)``), a prefill pod's
    energy per output token left out (its energy goes to prompts). Sorted by namespace, pod, model."""
    column = {rule: col for col, rule in POD_FIGURES.items()}
    rows = with_cols(rows, POD_LABELS)
    rows = rows[rows["__name__"].isin(column)]
    if rows.empty:
        return pd.DataFrame(columns=list(POD_COLUMNS))
    wide = rows.assign(col=rows["__name__"].map(column)).pivot_table(
        index=list(POD_KEYS), columns="col", values="value", aggfunc="max"
    )
    wide = wide.reindex(columns=list(POD_FIGURES)).reset_index()
    wide.columns.name = None
    prefill = wide["role"] == "prefill"
    wide["energy_per_million"] = wide["joules_per_output_token"].where(~prefill)
    wide["ttft_p95_ms"] = wide["ttft_p95"] * 1000.0
    wide["itl_p95_ms"] = wide["itl_p95"] * 1000.0
    wide["role"] = [
        ROLE_WORDS.get(str(source), "{role}").format(role=role) or "unknown"
        for role, source in zip(wide["role"], wide["role_source"], strict=True)
    ]
    wide = wide.sort_values(["namespace", "pod", "model"]).reset_index(drop=True)
    return wide[list(POD_COLUMNS)]


def _one(names: list[str]) -> str:
    distinct = sorted(set(names))
    return "" if not distinct else distinct[0] if len(distinct) == 1 else MIXED_GPUS


def _usd(gpu_model: str, gpus: float, tokens_per_second: float, prices: Mapping[str, float]) -> float | None:
    """USD per million output tokens: the advisor's ``usd_per_million`` on the whole GPU model (the
    GPU-equivalents already weigh a MIG instance by its share); None without a price, a known GPU
    model, GPUs or tokens."""
    gpu = serving_gpu_for(gpu_model) if gpu_model and gpu_model != MIXED_GPUS else None
    if gpu is None or not gpus > 0 or not tokens_per_second > 0:
        return None
    return usd_per_million(gpu, gpus, tokens_per_second, prices)
