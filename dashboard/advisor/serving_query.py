"""Measures every served model over a window in Prometheus, from the ``gpulens.serving`` recording
rules joined with the GPUs its pods hold, and hands the serving advisor one ServedModel per
(namespace, model, role).

Per (namespace, model, role), over the window at one step (``[window:step]`` subqueries):
- GPUs: the mean of ``gpulens:serving_model_gpus:sum`` (MIG and time-slicing weighted by share);
- output tokens/s: the mean of ``gpulens:serving_model_output_tokens:rate5m``;
- ITL and TTFT p95: the 95th percentile over the window of the rules' 5-minute p95s (the latency a
  target is held against: met 95 % of the time);
- KV-cache use: the peak of ``gpulens:serving_model_kv_cache_usage:ratio_max5m``;
- the queue's trend: ``deriv`` of ``gpulens:serving_model_requests_queued:avg5m`` (requests/s);
- the KV transfer's share of the links: the mean of ``gpulens:serving_model_nvlink_utilization:ratio``
  and of ``gpulens:serving_model_nic_utilization:ratio``, the busier of the two;
- the class mix: the share of the window each pod's class (``gpulens_pod_gpu_boundness``) was each
  class, averaged over the model's pods;
- busy ratio and peak memory: the mean busy ratio (``definitions.busy_mean_promql``) and the peak
  ``gpulens_gpu_memory_used_bytes`` of the leaves its pods hold;
- the GPU model: the leaves' NVML name and MIG profile (a model on two GPU models gets no advice).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from dashboard import definitions
from dashboard.advisor.query import DEFAULT_WINDOW, Window, evaluate
from dashboard.advisor.serving import (
    BalanceAdvice,
    ServedModel,
    ServingAdvice,
    advise_model,
    balance,
    weights_from_name,
)
from dashboard.advisor.serving_gpus import serving_gpu_for
from dashboard.frames.columns import with_cols
from dashboard.promql import duration, selector, subquery_range
from dashboard.serving import rules
from dashboard.sources.prometheus import PrometheusSource
from dashboard.sources.source import NO_FILTERS, Filters

MODEL = ("namespace", "model", "role")
POD = ("namespace", "pod")
LEAF = ("uuid", "mig_uuid")


def _queries(filters: Filters, win: Window) -> dict[str, str]:
    """The PromQL of every measurement, keyed by what it measures."""
    ns = {"namespace": filters.namespace} if filters.namespace else {}
    rng = subquery_range(win.window_s, win.resolved_step())
    window = duration(win.window_s)

    def model(record: str) -> str:
        return selector(f"gpulens:serving_model_{record}", ns)

    info = selector("gpulens:serving_pod:info", ns)
    pods = f"max by (namespace, pod, model, role) ({info})"
    alloc = f"max by (namespace, pod, uuid, mig_uuid) ({selector('gpulens_pod_gpu_allocation', ns)})"
    held = f"({alloc} * on (namespace, pod) group_left (model, role) {pods})"
    pod_class = f"max by (namespace, pod, class) ({selector('gpulens_pod_gpu_boundness', ns)})"
    on_held = f"and on (uuid, mig_uuid) {held}"
    ever_held = f"max by (uuid, mig_uuid) (max_over_time({held}{rng}))"
    return {
        "gpus": f"avg_over_time({model('gpus:sum')}{rng})",
        "pods": f"max_over_time({model('pods:count')}{rng})",
        "output": f"avg_over_time({model('output_tokens:rate5m')}{rng})",
        "itl": f"quantile_over_time(0.95, {model('itl_seconds:p95_5m')}{rng})",
        "ttft": f"quantile_over_time(0.95, {model('ttft_seconds:p95_5m')}{rng})",
        "kv": f"max_over_time({model('kv_cache_usage:ratio_max5m')}{rng})",
        "queue": f"deriv({model('requests_queued:avg5m')}{rng})",
        # the KV transfer's share of each link (the measurement keeps the busier link)
        "links": " or ".join(
            f"label_replace(avg_over_time({selector(rules.model_link_utilization_record(link), ns)}{rng}), "
            f'"link", "{link}", "", "")'
            for link in rules.LINKS
        ),
        "held": f"max_over_time({held}{rng})",
        "classes": f"avg_over_time(({pod_class} * on (namespace, pod) group_left (model, role) {pods}){rng})",
        # only the leaves serving pods held in the window (a fleet's other GPUs are not read)
        "busy": f"avg_over_time((max by (uuid, mig_uuid) ({definitions.busy_mean_promql()}) {on_held}){rng})",
        "memory": f"max_over_time((max by (uuid, mig_uuid) (gpulens_gpu_memory_used_bytes) {on_held}){rng})",
        "name": f"max by (uuid, name) (last_over_time(gpulens_gpu_info[{window}])) and on (uuid) {ever_held}",
        "profile": (
            f"max by (mig_uuid, mig_profile) (last_over_time(gpulens_mig_instance_info[{window}]))"
            f" and on (mig_uuid) {ever_held}"
        ),
    }


def _by(df: pd.DataFrame, keys: tuple[str, ...]) -> dict[tuple[str, ...], float]:
    return {tuple(str(r[k]) for k in keys): float(r["value"]) for r in with_cols(df, keys).to_dict("records")}


@dataclass(frozen=True)
class Measured:
    """Every served model measured, and why the ones left out were left out."""

    models: list[ServedModel]
    skipped: dict[tuple[str, str, str], str]
    """(namespace, model, role) -> why it has no ServedModel."""


def measure(src: PrometheusSource, win: Window = DEFAULT_WINDOW, filters: Filters = NO_FILTERS) -> Measured:
    """One ServedModel per (namespace, model, role) whose pods held GPUs in the window.

    Raises SourceError when Prometheus does not answer.
    """
    r = evaluate(src, _queries(filters, win), win)
    gpus, output = _by(r["gpus"], MODEL), _by(r["output"], MODEL)
    itl, ttft, kv, queue, pods = (_by(r[k], MODEL) for k in ("itl", "ttft", "kv", "queue", "pods"))
    busy, memory = _by(r["busy"], LEAF), _by(r["memory"], LEAF)
    links: dict[tuple[str, ...], float] = {}
    for x in with_cols(r["links"], MODEL).to_dict("records"):
        key = tuple(str(x[k]) for k in MODEL)
        links[key] = max(links.get(key, 0.0), float(x["value"]))
    names = {str(x["uuid"]): str(x["name"]) for x in with_cols(r["name"], ("uuid", "name")).to_dict("records")}
    profiles = {
        str(x["mig_uuid"]): str(x["mig_profile"])
        for x in with_cols(r["profile"], ("mig_uuid", "mig_profile")).to_dict("records")
    }
    leaves: dict[tuple[str, ...], set[tuple[str, str]]] = {}
    for x in with_cols(r["held"], (*MODEL, *LEAF)).to_dict("records"):
        leaves.setdefault(tuple(str(x[k]) for k in MODEL), set()).add((str(x["uuid"]), str(x["mig_uuid"])))
    mixes: dict[tuple[str, ...], dict[str, float]] = {}
    counts: dict[tuple[str, ...], set[str]] = {}
    for x in with_cols(r["classes"], (*MODEL, "pod", "class")).to_dict("records"):
        key = tuple(str(x[k]) for k in MODEL)
        mix = mixes.setdefault(key, {})
        mix[str(x["class"])] = mix.get(str(x["class"]), 0.0) + float(x["value"])
        counts.setdefault(key, set()).add(str(x["pod"]))

    out: list[ServedModel] = []
    skipped: dict[tuple[str, str, str], str] = {}
    for key in sorted(gpus):
        ns, name, role = key
        held = leaves.get(key, set())
        kinds = {(names.get(u, ""), profiles.get(m, "") if m else "") for u, m in held}
        gpu = serving_gpu_for(*next(iter(kinds))) if len(kinds) == 1 else None
        if not held or gpu is None:
            skipped[(ns, name, role)] = (
                "its pods hold GPUs of several models"
                if len(kinds) > 1
                else "its GPU model is not in the advisor's table"
                if held
                else "no GPU held"
            )
            continue
        n_pods = max(1, len(counts.get(key, set())))
        mix = {c: v / n_pods * win.window_s for c, v in mixes.get(key, {}).items()}
        leaf_busy = [busy[leaf] for leaf in held if leaf in busy]
        leaf_memory = [memory[leaf] for leaf in held if leaf in memory]
        per_replica = max(1, round(gpus[key] / max(pods.get(key, 1.0), 1.0)))
        out.append(
            ServedModel(
                model=name,
                role=role or "both",
                gpu=gpu,
                gpus=gpus[key],
                busy_ratio=sum(leaf_busy) / len(leaf_busy) if leaf_busy else 0.0,
                class_seconds=mix,
                output_tokens_per_second=output.get(key, 0.0),
                itl_p95_seconds=itl.get(key),
                ttft_p95_seconds=ttft.get(key),
                memory_used_peak_bytes=max(leaf_memory) if leaf_memory else None,
                weights_bytes=weights_from_name(name, per_replica),
                kv_cache_peak_ratio=kv.get(key),
                waiting_trend_per_second=queue.get(key, 0.0),
                namespace=ns,
                link_share=links.get(key),
            )
        )
    return Measured(out, skipped)


@dataclass(frozen=True)
class ServingReport:
    """The serving advice of every measured model, the balance of every disaggregated pair."""

    advice: list[ServingAdvice]
    balance: list[BalanceAdvice]
    skipped: dict[tuple[str, str, str], str]


def advise_serving(
    src: PrometheusSource,
    win: Window = DEFAULT_WINDOW,
    prices: Mapping[str, float] | None = None,
    targets: Mapping[str, float] | None = None,
    filters: Filters = NO_FILTERS,
    ttft_targets: Mapping[str, float] | None = None,
) -> ServingReport:
    """Measure and advise: ``targets`` maps a model name to its ITL p95 target in seconds (others
    get today's p95 plus the stated margin); ``ttft_targets`` to its TTFT p95 target in seconds
    (others have none: no default, prefill does not scale with the decode's class mix)."""
    measured = measure(src, win, filters)
    itl, ttft = targets or {}, ttft_targets or {}
    advice = [advise_model(m, prices or {}, itl.get(m.model), ttft.get(m.model)) for m in measured.models]
    roles: dict[tuple[str, str], dict[str, ServedModel]] = {}
    for m in measured.models:
        roles.setdefault((m.namespace, m.model), {})[m.role] = m
    pairs = [balance(r["prefill"], r["decode"]) for r in roles.values() if "prefill" in r and "decode" in r]
    return ServingReport(advice, pairs, measured.skipped)
