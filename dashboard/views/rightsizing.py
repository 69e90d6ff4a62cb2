"""Right-sizing page: the advisor's recommendation for every workload, with evidence and savings.

A thin shell over dashboard.advisor (the same engine and numbers as ``gpulens-advisor``); it needs
the Prometheus source, since days of history live there and not in the exporters.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import ui
from dashboard.advisor.cli import coverage_text, job_display, row, totals
from dashboard.advisor.engine import Policy
from dashboard.advisor.job_query import advise_all_jobs
from dashboard.advisor.query import Window, advise
from dashboard.figures.waste import savings_bar
from dashboard.inert_text import inert
from dashboard.sources.prometheus import PrometheusSource
from dashboard.sources.source import Filters

WINDOWS = {"1 day": 86400.0, "7 days": 7 * 86400.0, "14 days": 14 * 86400.0, "30 days": 30 * 86400.0}
FIRST = ("namespace", "workload", "recommendation", "target", "gpu_hours_saved", "cost_saved_usd", "reason")


@st.cache_data(ttl=600, show_spinner="Measuring every workload over the window…", max_entries=32)
def _advice(
    url: str,
    timeout_s: float,
    window_s: float,
    headroom: float,
    compute_headroom: float,
    filters: tuple[str | None, ...],
    prices: tuple[tuple[str, float], ...],
) -> tuple[list[dict[str, Any]], dict[str, float | None], list[dict[str, Any]]]:
    src = PrometheusSource(url, timeout_s=timeout_s)
    recs = advise(src, Window(window_s=window_s), dict(prices), Policy(headroom, compute_headroom), Filters(*filters))
    evidence = [{"workload": f"{r.usage.namespace}/{r.usage.workload}", **r.evidence} for r in recs]
    return [row(r) for r in recs], totals(recs), evidence


@st.cache_data(ttl=600, show_spinner="Measuring every multi-GPU job over the window…", max_entries=32)
def _job_advice(
    url: str,
    timeout_s: float,
    window_s: float,
    headroom: float,
    compute_headroom: float,
    filters: tuple[str | None, ...],
    prices: tuple[tuple[str, float], ...],
) -> tuple[list[dict[str, str]], str]:
    """(the job advice as display rows, what span the data covers)."""
    src = PrometheusSource(url, timeout_s=timeout_s)
    policy = Policy(headroom, compute_headroom)
    report = advise_all_jobs(src, Window(window_s=window_s), dict(prices), policy, Filters(*filters))
    return [job_display(a) for a in report.advice], coverage_text(report.measured)


def body(ctx: ui.PageContext) -> None:
    if not isinstance(ctx.source, PrometheusSource):
        st.info(
            "Right-sizing needs days of history: start the dashboard with --prometheus URL. "
            "(The direct-scrape source keeps minutes.)"
        )
        return
    c1, c2, c3 = st.columns(3)
    window_label = c1.selectbox("Window", list(WINDOWS), index=1, key="rs_window")
    headroom = c2.number_input("Memory headroom (x peak)", 1.0, 4.0, 1.2, 0.05, key="rs_headroom")
    compute = c3.number_input("Compute headroom (x SM p95)", 1.0, 4.0, 1.1, 0.05, key="rs_compute")
    f = ctx.filters
    args = (
        ctx.source.base_url,
        ctx.settings.timeout_seconds * 3,
        WINDOWS[window_label],
        float(headroom),
        float(compute),
        (f.cluster, f.node, f.instance, f.namespace),
        tuple(sorted(ctx.settings.prices_per_gpu_hour.items())),
    )
    advised = False
    with ui.panel("Right-sizing"):
        rows, total, evidence = _advice(*args)
        if not rows:
            ui.no_data("No workload held a GPU in the window.")
            return
        advised = True
        m1, m2, m3, m4 = st.columns(4)
        m1.metric("Workloads", len(rows))
        m2.metric("GPU-hours held", f"{total['gpu_hours_held'] or 0:,.1f}")
        m3.metric("GPU-hours saveable", f"{total['gpu_hours_saved'] or 0:,.1f}")
        cost = total["cost_saved_usd"]
        if cost is not None:
            m4.metric("Saving", f"${cost:,.2f}")
        else:  # a hint, not a figure
            m4.caption(f"Saving: {ui.NO_PRICE}.")
        table = pd.DataFrame(rows)[list(FIRST + tuple(c for c in rows[0] if c not in FIRST))]
        st.subheader("Recommendations")
        st.caption(
            "Smallest MIG slice whose memory holds the peak x memory headroom and whose SMs cover SM-active p95 x "
            "compute headroom; time-slicing/MPS for light, bursty use; a higher-bandwidth GPU for memory-bound work; "
            "release for GPUs held idle. Savings are GPU-hours over this page's window (the sidebar's time range "
            "does not apply; filters do); see docs/advisor.md."
        )
        ui.table(
            table,
            key="rs_table",
            missing={
                "cost_saved_usd": "no price set",
                "memory_peak_gib": "not measured",
                "sm_p95": "not measured",
                "sm_mean": "not measured",
                "dram_p95": "not measured",
                "idle_share": "not measured",
            },
        )
        if (table["gpu_hours_saved"] > 0).any():
            st.subheader("Where the savings are")
            ui.chart(savings_bar(table), key="rs_bar")
        st.subheader("Evidence")
        names = [e["workload"] for e in evidence]
        pick = st.selectbox("Workload", names, key="rs_evidence")
        ui.table(ui.evidence_table(evidence[names.index(pick)]), key="rs_evidence_table")
    if not advised:
        return  # the measurement failed: its banner says why, and the jobs' queries would fail alike
    with ui.panel("Jobs"):
        # a job's pods are workloads' pods: reached only when some workload held a GPU
        st.subheader("Jobs")
        job_rows, covered = _job_advice(*args)
        st.caption(
            f"Multi-GPU jobs (the pods of one owner across nodes), {inert(covered)}. Scale in when the GPUs hold far "
            "more memory than the job uses and it spends its time communicating or idling; replace or drain a "
            "straggler its peers wait for; a higher-bandwidth GPU for memory-bound jobs. Wasted GPU-hours are the "
            "Workloads page's (idle while held). Job savings overlap the per-workload ones above: they are not added "
            "to the totals; see docs/advisor.md."
        )
        if not job_rows:
            st.info("No job held two GPUs or more in the window.")
        else:
            ui.table(pd.DataFrame(job_rows), key="rs_jobs")


ui.page("Right-sizing", body)
