"""Serving page: what the GPUs that serve models produce, per model and role: replicas, GPUs and
their model, tokens per second and per GPU-second, energy and dollars per million output tokens,
TTFT and inter-token latency, KV-cache use, the queue and the pods' classes; then the advisor's
serving advice.

Prometheus only, by design: the figures are the ``gpulens.serving`` recording rules, which join the
inference engines' own metrics with gpulens' allocation and energy series in Prometheus (the
exporter never scrapes application pods, so the direct-scrape source has no engine series, and a
second computation here could disagree with the rules). ``dashboard/advisor/serving_figures.py``
reads them, beside the advisor's own query layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import ui
from dashboard.advisor import serving_figures as figures
from dashboard.advisor.query import Window
from dashboard.advisor.serving_query import ServingReport, advise_serving
from dashboard.figures.timelines import time_lines
from dashboard.inert_text import inert
from dashboard.sources.prometheus import PrometheusSource
from dashboard.sources.source import Filters

# (comments, not docstrings: Streamlit's magic would draw a string under an assignment on the page)
# The advisor measures at least this much history (its class mix and latency percentiles).
ADVICE_WINDOW_MIN_S = 3600.0

NEEDS_PROMETHEUS = (
    "Serving figures need Prometheus: start the dashboard with --prometheus URL. The inference engines' "
    "own metrics (tokens, latency, KV cache) are joined with the GPUs they run on by the gpulens.serving "
    "recording rules in Prometheus; the exporters never scrape application pods, so the direct-scrape "
    "source has no engine series (docs/serving.md)."
)
NO_SERVING = (
    "No serving pods: no inference engine's metrics are joined to a pod in the last 5 minutes. Scrape the "
    "engines (vLLM, SGLang, TGI, TensorRT-LLM, Dynamo) with their namespace and pod labels: the chart's "
    "servingMonitor or the scrape job of docs/serving.md."
)
KV_TRANSFER = (
    "Bytes per second each role's pods moved over the last 5 minutes, sent plus received: over their GPUs' "
    "NVLink (a time-sliced GPU's shared by the replicas held) and the RDMA NICs they hold alone (a NIC shared "
    "by several pods is nobody's: the Network page shows it). Between the prefill and decode pods of a "
    "disaggregated deployment this is mostly the KV cache handed on; tensor-parallel collectives use NVLink "
    "too. Use: the busier direction over what those links carry each way."
)
LINKS = ("nvlink", "nic")
KV_COLUMNS = ("namespace", "model", "role", "nvlink_kv", "nvlink_utilization", "nic_kv", "nic_utilization")
THROUGHPUT = (
    "namespace", "model", "role", "replicas", "gpu_equivalents", "gpu_model", "output_tokens_per_second",
    "input_tokens_per_second", "output_tokens_per_gpu_second", "input_tokens_per_gpu_second",
    "energy_per_million", "usd_per_million",
)  # fmt: skip
LATENCY = (
    "namespace", "model", "role", "ttft_p50_ms", "ttft_p95_ms", "itl_p50_ms", "itl_p95_ms", "kv_cache_mean",
    "kv_cache_max", "running", "queued", "requests_per_second", "class_mix",
)  # fmt: skip
MISSING: dict[str, str | Sequence[str]] = {
    "gpu_model": "no GPU",
    "gpu_equivalents": "no GPU",
    "usd_per_million": "no price or tokens",
    "energy_per_million": "no GPU or tokens",
    "output_tokens_per_gpu_second": "no GPU",
    "input_tokens_per_gpu_second": "no GPU",
    "output_tokens_per_second": "not published",
    "input_tokens_per_second": "not published",
    "ttft_p50_ms": "no request",
    "ttft_p95_ms": "no request",
    "itl_p50_ms": "no request",
    "itl_p95_ms": "no request",
    "kv_cache_mean": "not published",
    "kv_cache_max": "not published",
    "running": "not published",
    "queued": "not published",
    "requests_per_second": "not published",
    "class_mix": "no class",
    "itl_target_source": "no target",
    "itl_target_ms": "no target",
    "itl_p95_window_ms": "no request",
    "itl_target_status": "no latency",
    "ttft_target_ms": "no target",
    "ttft_p95_window_ms": "no request",
}


def body(ctx: ui.PageContext) -> None:
    if not isinstance(ctx.source, PrometheusSource):
        ui.no_data(NEEDS_PROMETHEUS)
        return
    f = ctx.filters
    q = {k: ui.query("query_labels", promql, figures.LABELS[k], ctx.end_s) for k, promql in figures.queries(f).items()}
    lines = {
        k: ui.query("query_range", figures.series_query(k, f), window=ctx.window, step_s=ctx.step_s, end=ctx.end_s)
        for k in figures.OVER_TIME
    }
    ui.prefetch(ctx, [*q.values(), *lines.values()])
    shown = False
    with ui.panel("Serving"):
        got = figures.assemble({k: ui.get(ctx, v) for k, v in q.items()}, ctx.settings.prices_per_gpu_hour)
        shown = models_panel(ctx, got)
    if shown:
        with ui.panel("Over time"):
            over_time(ctx, {k: ui.get(ctx, v) for k, v in lines.items()})
        with ui.panel("The advisor's serving advice"):
            advice_panel(ctx)


def models_panel(ctx: ui.PageContext, got: figures.ServingFigures) -> bool:
    """KPIs and the two tables; False when no model is served (said in words)."""
    models = got.models
    if got.unjoinable > 0:
        st.warning(
            f"{got.unjoinable:,.0f} engine series carry no namespace or pod label and are left out of every figure: "
            "the scrape does not copy them (docs/serving.md, Getting the engines scraped).",
            icon=":material/link_off:",
        )
    if models.empty:
        ui.no_data(NO_SERVING)
        return False
    serving = models[models["role"] != "frontend"]
    k = st.columns(5)
    k[0].metric("Models", f"{models[['cluster', 'namespace', 'model']].drop_duplicates().shape[0]:,}")
    k[1].metric("Serving pods", f"{models['replicas'].sum():,.0f}")
    k[2].metric("GPUs serving", inert(f"{models['gpus'].sum():,.2f}".rstrip("0").rstrip(".")))
    k[3].metric("Output tokens/s", f"{serving['output_tokens_per_second'].sum():,.0f}")
    k[4].metric("Energy per M output tokens", inert(_energy_kpi(serving)))
    caption = (
        "Per model and role over the last 5 minutes, from the gpulens.serving recording rules (the same the "
        "Grafana Serving board reads). Roles as the pods declare them, else inferred from their GPUs' classes. "
        "GPUs are GPU-equivalents: a MIG instance by its share of the GPU, a time-sliced GPU by the replicas "
        "held. A prefill role's energy goes to prompts: read its input tokens per GPU-second. The frontend "
        "(Dynamo's, no GPU) counts its workers' tokens again and is left out of the totals above."
    )
    if ctx.filters.node or ctx.filters.instance:
        caption += " The node filter does not apply here: a model's pods span nodes."
    st.caption(caption)  # inert: constants written above
    if not ctx.settings.prices_per_gpu_hour:
        st.caption(f"Cost per million tokens: {ui.NO_PRICE}.")
    table = models.assign(
        energy_per_million=models["joules_per_million"] / 1e6,
        **{f"{c}_ms": models[c] * 1000.0 for c in ("ttft_p50", "ttft_p95", "itl_p50", "itl_p95")},
        class_mix=class_mix(models, got.classes),
    ).rename(columns={"gpus": "gpu_equivalents"})
    table = table.sort_values(["namespace", "model", "role"]).reset_index(drop=True)
    prefill = table["role"] == "prefill"
    # a prefill role's energy and cost go to prompts: per output token they mislead (the rule is on
    # the Grafana board); its input tokens per GPU-second is its figure
    table.loc[prefill, ["energy_per_million", "usd_per_million"]] = float("nan")
    priced = bool(ctx.settings.prices_per_gpu_hour)
    why = [_why_no_cost(r, str(g), priced) for r, g in zip(table["role"], table["gpu_model"], strict=True)]
    table["gpu_model"] = table["gpu_model"].where(table["gpu_model"] != "", None)
    missing: ui.Missing = MISSING | {
        "energy_per_million": [w if w in ("prefill: see input", "no GPU") else "no tokens" for w in why],
        "usd_per_million": why,
    }
    st.subheader("Throughput and cost")
    ui.table(table[list(THROUGHPUT)], key="serving_models", missing=missing)
    st.subheader("Latency and load")
    ui.table(table[list(LATENCY)], key="serving_latency", missing=missing)
    kv_panel(table)
    return True


def kv_panel(table: pd.DataFrame) -> None:
    """The roles whose pods moved bytes over NVLink or their own NICs (the KV transfer of a
    disaggregated deployment); nothing where none did (a role whose links are idle is left out)."""
    moved = table[(table[[f"{link}_bytes_per_second" for link in LINKS]].fillna(0.0) > 0).any(axis=1)]
    if moved.empty:
        return
    st.subheader("KV transfer")
    st.caption(KV_TRANSFER)  # inert: a constant
    links = moved.assign(**{
        f"{link}_kv": [ui.fmt_rate(float(v)) if v == v else None for v in moved[f"{link}_bytes_per_second"]]
        for link in LINKS
    })  # fmt: skip
    missing: ui.Missing = {"nvlink_kv": "no NVLink", "nic_kv": "no NIC of its own",
                           "nvlink_utilization": "no NVLink", "nic_utilization": "no NIC of its own"}  # fmt: skip
    ui.table(links[list(KV_COLUMNS)], key="serving_links", missing=missing)


def over_time(ctx: ui.PageContext, lines: dict[str, pd.DataFrame]) -> None:
    """Output tokens per second and ITL p95 over the range, a line per model and role, side by side."""
    st.subheader("Over time")
    st.caption(f"A line per model and role over {ui.over(ctx)}; each point a 5-minute rate or quantile.")
    left, right = st.columns(2)
    for col, key, title, unit, scale in (
        (left, "output_tokens_per_second", "Output tokens per second", "tok/s", 1.0),
        (right, "itl_p95", "Inter-token latency p95", "ms", 1000.0),
    ):
        df = lines[key]
        with col:
            st.markdown(f"**{inert(title)}**")
            if df.empty:
                ui.no_data(f"No {inert(title.lower())} in {inert(ui.over(ctx))}.")
                continue
            df = df.assign(series=df["model"].astype(str) + " " + df["role"].astype(str), value=df["value"] * scale)
            ui.chart(time_lines(df, unit, legend_columns=1), key=f"serving_{key}")


def _why_no_cost(role: str, gpu_model: str, priced: bool) -> str:
    """Why a row has no energy or cost per million output tokens, in words (``gpu_model`` empty:
    the role holds no GPU)."""
    if role == "prefill":
        return "prefill: see input"
    if not gpu_model:
        return "no GPU"
    if gpu_model == figures.MIXED_GPUS:
        return "several GPU models"
    return "no price" if not priced else "no tokens"


def _energy_kpi(serving: pd.DataFrame) -> str:
    """Energy per million output tokens of every serving role together: the GPUs' joules over the
    tokens, from each role's rule (J per token x tokens per second = watts)."""
    ok = serving.dropna(subset=["joules_per_output_token", "output_tokens_per_second"])
    tokens = ok["output_tokens_per_second"].sum()
    if not tokens > 0:
        return "–"
    watts = (ok["joules_per_output_token"] * ok["output_tokens_per_second"]).sum()
    return f"{watts / tokens:,.2f} MJ"


def class_mix(models: pd.DataFrame, classes: pd.DataFrame) -> list[str | None]:
    """Each row's serving pods by their class now, in words (``memory 2, compute 1``); ``no GPU``
    for a role without GPUs (a frontend), None where none has a class."""
    mix: dict[tuple[str, ...], list[tuple[float, str]]] = {}
    for x in classes.to_dict("records"):
        key = tuple(str(x[k]) for k in figures.KEYS)
        mix.setdefault(key, []).append((float(x["pods"]), str(x["class"])))
    out: list[str | None] = []
    for x in models[[*figures.KEYS, "gpu_model"]].to_dict("records"):
        parts = sorted(mix.get(tuple(str(x[k]) for k in figures.KEYS), []), key=lambda p: (-p[0], p[1]))
        out.append(", ".join(f"{c} {n:,.0f}" for n, c in parts) or ("no GPU" if not x["gpu_model"] else None))
    return out


@st.cache_data(ttl=600, show_spinner="Measuring every served model over the window…", max_entries=32)
def _advice(
    url: str,
    window_s: float,
    end: float | None,
    filters: tuple[str | None, ...],
    prices: tuple[tuple[str, float], ...],
    targets: tuple[tuple[str, float], ...],
    ttft_targets: tuple[tuple[str, float], ...],
    _src: Any,
) -> ServingReport:
    win = Window(window_s=window_s, end=end)
    return advise_serving(_src, win, dict(prices), dict(targets), Filters(*filters), dict(ttft_targets))


def advice_panel(ctx: ui.PageContext) -> None:
    """The advisor's serving advice (dashboard/advisor/serving_query.py): a cheaper GPU model or
    MIG profile that meets the latency target, and the balance of disaggregated roles."""
    st.subheader("The advisor's serving advice")
    assert isinstance(ctx.source, PrometheusSource)
    window_s = max(ctx.window_s, ADVICE_WINDOW_MIN_S)
    f = ctx.filters
    report = _advice(
        ctx.source.base_url,
        window_s,
        ctx.end_s,
        (f.cluster, f.node, f.instance, f.namespace),
        tuple(sorted(ctx.settings.prices_per_gpu_hour.items())),
        tuple(sorted(ctx.settings.itl_targets_seconds.items())),
        tuple(sorted(ctx.settings.ttft_targets_seconds.items())),
        ctx.source,
    )
    st.caption(
        f"Over {ui.fmt_duration(window_s)}: a roofline on each model's measured class mix predicts its latency, GPUs "
        "and cost on every GPU model and MIG profile; a move is advised only to a cheaper one that meets the "
        "inter-token latency target and fits memory (docs/serving.md). Each model's ITL p95 over the window (the "
        "95th percentile of its 5-minute p95s) is held against its target: given (the dashboard's --itl-target), "
        "else today's p95 + 25 %, which it meets by construction. Its TTFT p95 is held likewise only where a "
        "target is given (the dashboard's --ttft-target; no default), and a move must meet that too."
    )
    rows = [
        {
            "model": a.model,
            "role": a.role,
            "recommendation": a.target,
            "itl_p95_window_ms": _ms(a.evidence.get("itl_p95_seconds")),
            "itl_target_ms": _ms(a.evidence.get("itl_target_seconds")),
            "itl_target_status": target_status(a.evidence.get("itl_p95_seconds"), a.evidence.get("itl_target_seconds")),
            "itl_target_source": a.evidence.get("itl_target_source"),
            "ttft_target_ms": _ms(a.evidence.get("ttft_target_seconds")),
            "ttft_target_status": ttft_status(
                a.evidence.get("ttft_p95_seconds"), a.evidence.get("ttft_target_seconds")
            ),
            "ttft_p95_window_ms": _ms(a.evidence.get("ttft_p95_seconds")),
        }
        for a in report.advice
    ]
    if rows:
        ui.table(pd.DataFrame(rows), key="serving_advice", missing=MISSING)
        # the advisor's sentences in full (a table cell would cut them)
        st.markdown("\n".join(f"- {inert(a.text)}" for a in report.advice))  # inert: each line
    else:
        ui.no_data("No served model could be measured for advice over the window (the reasons are below).")
    for b in report.balance:
        st.markdown(f"**{inert(b.model)}** (prefill and decode): {inert(b.text)}")
    if report.skipped:
        why_not = "; ".join(
            f"{inert(ns)}/{inert(m)} {inert(r or 'no role')}: {inert(why)}"
            for (ns, m, r), why in sorted(report.skipped.items())
        )
        st.caption("Not advised: " + why_not)  # inert: every value of why_not went through inert


def target_status(p95: object, target: object) -> str | None:
    """``met`` where the ITL p95 is at most its target, ``missed`` above it; None without either."""
    if not isinstance(p95, int | float) or not isinstance(target, int | float):
        return None
    return "met" if p95 <= target else "missed"


def ttft_status(p95: object, target: object) -> str:
    """:func:`target_status` of the TTFT p95, which has a target only where one is given: ``no target``
    without one, ``no TTFT measured`` with one but no p95 to hold against it."""
    if target is None:
        return "no target"
    return target_status(p95, target) or "no TTFT measured"


def _ms(seconds: object) -> float | None:
    return float(seconds) * 1000.0 if isinstance(seconds, int | float) else None


ui.page("Serving", body)
