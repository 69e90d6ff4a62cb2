"""The Serving row of the Job and GPU pages: each pod there that serves a model, with what it
produces now (tokens per second and per GPU-second, energy per token, TTFT and ITL p95, KV cache).

One query (``dashboard/advisor/serving_figures.py``'s :func:`pods_query`): every per-pod rule of
``gpulens.serving`` for the pods the page names, the rules' values as they are (the Serving page and
the Grafana board read the same). Nothing is drawn where no pod serves; in scrape mode a line says
the row needs Prometheus (the exporters never scrape application pods: docs/serving.md).
"""

from __future__ import annotations

from collections.abc import Mapping

import streamlit as st

from dashboard import ui
from dashboard.advisor import serving_figures as figures
from dashboard.sources.prometheus import PrometheusSource

NEEDS_PROMETHEUS = (
    "Serving: the tokens, latency and KV cache of the pods that serve models here need Prometheus (start the "
    "dashboard with --prometheus URL): the gpulens.serving recording rules join the inference engines' own "
    "metrics with the GPUs they run on (docs/serving.md)."
)
CAPTION = (
    "Each pod here that serves a model, over the last 5 minutes, from the gpulens.serving recording rules (the "
    "Serving page has every model). Tokens per GPU-second divide by the GPUs the pod holds (a MIG instance by its "
    "share of the GPU); energy per million output tokens is its GPUs' energy over its output tokens (a prefill "
    "pod's goes to prompts: read its input tokens per GPU-second). A role not declared is inferred from the "
    "GPUs' classes."
)
MISSING: ui.Missing = {
    "output_tokens_per_second": "not published",
    "input_tokens_per_second": "not published",
    "output_tokens_per_gpu_second": "no GPU",
    "input_tokens_per_gpu_second": "no GPU",
    "ttft_p95_ms": "no request",
    "itl_p95_ms": "no request",
    "kv_cache_mean": "not published",
}


def serving_row(ctx: ui.PageContext, scope: str, matchers: Mapping[str, str] | None = None) -> None:
    """The Serving table of the pods ``scope`` names (PromQL with ``cluster``, ``namespace`` and
    ``pod`` labels: :func:`figures.pods_query`), under ``matchers``; nothing where none serves."""
    if not isinstance(ctx.source, PrometheusSource):
        st.caption(NEEDS_PROMETHEUS)
        return
    rows = ui.fetch(ctx, "query_labels", figures.pods_query(scope, matchers), figures.POD_LABELS, ctx.end_s)
    pods = figures.pod_frame(rows)
    if pods.empty:
        return
    st.subheader("Serving")
    st.caption(CAPTION)
    energy = ["prefill: see input" if str(r).startswith("prefill") else "no tokens" for r in pods["role"]]
    ui.table(pods, key="serving_pods", missing=MISSING | {"energy_per_million": energy})
