"""``gpulens-advisor``: right-sizing advice for every workload, read from Prometheus.

Exit status: 0 with the table, 2 for bad arguments (argparse convention; a message naming the flag,
each value written as ``dashboard.inputs`` says), 1 when Prometheus cannot answer (message on stderr).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from dashboard.advisor.engine import Policy, Recommendation
from dashboard.advisor.job_query import JobAdviceReport, JobReport, advise_all_jobs
from dashboard.advisor.jobs import JobAdvice
from dashboard.advisor.query import Window, advise
from dashboard.advisor.serving_query import ServingReport, advise_serving
from dashboard.inputs import (
    HEADROOM,
    ITL_TARGET_SECONDS,
    PRICE_USD,
    QUERY_TIMEOUT_SECONDS,
    STEP_SECONDS,
    TTFT_TARGET_SECONDS,
    WINDOW_SECONDS,
    duration_in,
    duration_span,
    http_url,
    named,
    number_between,
    parse_itl_targets,
    parse_prices,
    parse_ttft_targets,
    plain,
)
from dashboard.sources import prometheus_auth
from dashboard.sources.prometheus import PrometheusSource
from dashboard.sources.source import Filters, SourceError

ENV_PREFIX = "GPULENS_ADVISOR_"
"""Environment twins of the --prometheus-* authentication flags: GPULENS_ADVISOR_PROMETHEUS_*."""

PARSE_WINDOW = duration_in(*WINDOW_SECONDS, weeks=True, whole_seconds=True)
"""``--window``: 1h..365d in whole seconds (``7d``, ``2w``, ``36h``)."""
PARSE_STEP = duration_in(*STEP_SECONDS, weeks=True, whole_seconds=True)
"""``--step``: 1s..1d in whole seconds (PromQL subqueries step in whole seconds)."""
PARSE_HEADROOM = number_between(*HEADROOM)
"""``--headroom`` and ``--compute-headroom``: a multiple 1..4 of the observed figure."""
PARSE_TIMEOUT = duration_in(*QUERY_TIMEOUT_SECONDS)
"""``--timeout``: 100ms..1h per Prometheus query."""
SERVING_COLUMNS = ("namespace", "model", "role", "gpu", "gpus", "advice", "usd_per_million_now", "usd_per_million_then")


def serving_rows(report: ServingReport) -> list[dict[str, object]]:
    """One row per served model and role: today's GPU, the advice and the cost per M tokens."""
    rows: list[dict[str, object]] = []
    for a in report.advice:
        now = a.evidence.get("usd_per_million_now")
        rows.append(
            {
                "namespace": a.evidence.get("namespace", ""),
                "model": a.model,
                "role": a.role,
                "gpu": a.evidence.get("gpu"),
                "gpus": f"{float(a.evidence.get('gpus') or 0):g}",
                "advice": a.target if a.chosen is None else f"{a.chosen.gpus} x {a.target}",
                "usd_per_million_now": None if not isinstance(now, float) else f"{now:,.3f}",
                "usd_per_million_then": None
                if a.chosen is None or a.chosen.usd_per_million_tokens is None
                else f"{a.chosen.usd_per_million_tokens:,.3f}",
                "reason": a.text,
            }
        )
    return rows


COLUMNS = (
    "namespace",
    "workload",
    "gpu_model",
    "current",
    "devices",
    "recommendation",
    "target",
    "gpu_hours_held",
    "gpu_hours_saved",
    "cost_saved_usd",
    "memory_peak_gib",
    "sm_p95",
    "sm_mean",
    "dram_p95",
    "idle_share",
    "reason",
)


def row(rec: Recommendation) -> dict[str, object]:
    """One output row: the recommendation and the numbers behind it (GiB and ratios rounded)."""
    u = rec.usage

    def r(x: float | None, nd: int = 3) -> float | None:
        return None if x is None or x != x else round(x, nd)

    return {
        "namespace": u.namespace,
        "workload": f"{u.workload_kind}/{u.workload}",
        "gpu_model": u.gpu_model,
        "current": u.mig_profile or ("shared GPU" if u.shared else "whole GPU"),
        "devices": u.devices,
        "recommendation": rec.action.value,
        "target": rec.target,
        "gpu_hours_held": r(rec.gpu_hours_held, 1),
        "gpu_hours_saved": r(rec.gpu_hours_saved, 1),
        "cost_saved_usd": r(rec.cost_saved_usd, 2),
        "memory_peak_gib": r(None if u.memory_peak_bytes is None else u.memory_peak_bytes / 2**30, 1),
        "sm_p95": r(u.sm_active_p95),
        "sm_mean": r(u.sm_active_mean),
        "dram_p95": r(u.dram_active_p95),
        "idle_share": r(u.device_hours_idle / u.device_hours_held if u.device_hours_held else None),
        "reason": rec.reason,
    }


def totals(recs: Sequence[Recommendation]) -> dict[str, float | None]:
    """GPU-hours held and saved, and dollars saved (None when no recommendation has a price)."""
    costs = [r.cost_saved_usd for r in recs if r.cost_saved_usd is not None]
    return {
        "gpu_hours_held": sum(r.gpu_hours_held for r in recs),
        "gpu_hours_saved": sum(r.gpu_hours_saved for r in recs),
        "cost_saved_usd": sum(costs) if costs else None,
    }


JOB_COLUMNS = (
    "job",
    "gpu_model",
    "gpus",
    "nodes",
    "recommendation",
    "target",
    "gpu_hours_held",
    "gpu_hours_saved",
    "cost_saved_usd",
    "wasted_gpu_hours",
    "communication",
    "activity",
    "reason",
)
"""The columns of a job's advice (:func:`job_row`)."""


def job_row(a: JobAdvice) -> dict[str, object]:
    """One job advice as an output row: the job, the action and the figures behind it (GPU-hours to
    0.1, dollars to the cent, ratios to 0.001); ``wasted_gpu_hours`` is the waste definition's."""
    u = a.usage

    def r(x: float | None, nd: int = 3) -> float | None:
        return None if x is None or x != x else round(x, nd)

    return {
        "job": u.name,
        "cluster": u.cluster,
        "namespace": u.namespace,
        "workload": f"{u.workload_kind}/{u.workload}",
        "gpu_model": u.gpu_model,
        "gpus": u.gpus,
        "nodes": u.nodes,
        "recommendation": a.action.value,
        "target": a.target,
        "gpu_hours_held": r(a.gpu_hours_held, 1),
        "gpu_hours_saved": r(a.gpu_hours_saved, 1),
        "cost_saved_usd": r(a.cost_saved_usd, 2),
        "wasted_gpu_hours": r(a.wasted_gpu_hours, 1),
        "communication": r(u.communication),
        "activity": r(u.activity),
        "reason": a.reason,
    }


ACTION_NAMES = {
    "scale-in": "Scale in",
    "straggler": "Straggler",
    "higher-bandwidth": "Higher-bandwidth GPU",
    "keep": "Keep",
}
"""How the page names each job action."""


def job_display(a: JobAdvice) -> dict[str, str]:
    """One job advice for people (the Right-sizing page): every cell text, GPU-hours with thousands
    separators and one decimal, dollars to the cent, ``no price`` where none is configured."""
    u = a.usage
    gpus = f"{u.gpus:,} on {u.nodes:,} node{'s' if u.nodes != 1 else ''}"
    model = u.gpu_model.removeprefix("NVIDIA ") or "unknown model"
    return {
        "Job": u.name,
        "GPUs": f"{gpus} ({model})",
        "Advice": ACTION_NAMES.get(a.action.value, a.action.value),
        "Target": a.target,
        "GPU-hours held": f"{a.gpu_hours_held:,.1f}",
        "GPU-hours saveable": f"{a.gpu_hours_saved:,.1f}",
        "Saving": "no price" if a.cost_saved_usd is None else f"${a.cost_saved_usd:,.2f}",
        "Wasted GPU-hours": f"{a.wasted_gpu_hours:,.1f}",
        "Evidence": a.reason,
    }


def span_text(seconds: float) -> str:
    """A span for people: ``45 s``, ``20 min``, ``5.5 h``, ``7 days``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 86400:.3g} days"


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


def coverage_text(measured: JobReport) -> str:
    """What the data covers against the window asked, e.g. ``data from 2026-12-02 04:15 UTC to
    2026-12-02 04:35 UTC: 20 min of data in the last 1 h``."""
    if measured.first is None or measured.last is None:
        return f"no GPU allocated in the last {span_text(measured.window_s)}"
    return (
        f"data from {_utc(measured.first)} to {_utc(measured.last)}: "
        f"{span_text(measured.covered_s)} of data in the last {span_text(measured.window_s)}"
    )


def covered(measured: JobReport) -> dict[str, float | None]:
    """The span the data covers, for the json output (Unix seconds)."""
    return {"start": measured.first, "end": measured.last, "seconds": measured.covered_s}


def _aligned(rows: Sequence[dict[str, object]], shown: Sequence[str]) -> list[str]:
    """``rows`` as left-aligned text columns under a header."""
    cells = [[("-" if x[c] is None else str(x[c])) for c in shown] for x in rows]
    widths = [max([len(c), *(len(line[i]) for line in cells)]) for i, c in enumerate(shown)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(shown, widths, strict=True))]
    return lines + ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)) for line in cells]


def _markdown(rows: Sequence[dict[str, object]], shown: Sequence[str]) -> list[str]:
    """``rows`` as a Markdown table (``|`` in a cell escaped)."""

    def cell(v: object) -> str:
        return "-" if v is None else str(v).replace("|", "\\|")

    return [
        "| " + " | ".join(shown) + " |",
        "|" + "|".join("---" for _ in shown) + "|",
        *("| " + " | ".join(cell(x[c]) for c in shown) + " |" for x in rows),
    ]


def render(
    recs: Sequence[Recommendation],
    fmt: str,
    window_s: float,
    jobs: JobAdviceReport | None = None,
    serving: ServingReport | None = None,
) -> str:
    """The recommendations as ``table`` (aligned text), ``markdown``, ``csv`` (workloads only) or
    ``json`` (with evidence); ``jobs``, the job advice, as a Jobs section with the span its data
    covers."""
    rows = [row(r) for r in recs]
    job_rows = [job_row(a) for a in jobs.advice] if jobs is not None else []
    if fmt == "json":
        doc: dict[str, object] = {
            "window_seconds": window_s,
            "totals": totals(recs),
            "workloads": [
                {**x, "evidence": {k: _json(v) for k, v in r.evidence.items()}} for x, r in zip(rows, recs, strict=True)
            ],
        }
        if jobs is not None:
            doc["covered"] = covered(jobs.measured)
            doc["jobs"] = [
                {**x, "evidence": {k: _json(v) for k, v in a.evidence.items()}}
                for x, a in zip(job_rows, jobs.advice, strict=True)
            ]
        if serving is not None:
            doc["serving"] = [
                {**x, "evidence": {k: _json(v) for k, v in a.evidence.items()}, "assumptions": list(a.assumptions)}
                for x, a in zip(serving_rows(serving), serving.advice, strict=True)
            ]
            doc["serving_balance"] = [
                {"model": b.model, "holding_back": b.holding_back, "move_gpus": b.move_gpus, "text": b.text}
                for b in serving.balance
            ]
        return json.dumps(doc, indent=2) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
        w.writeheader()
        w.writerows({k: ("" if v is None else v) for k, v in x.items()} for x in rows)
        return buf.getvalue()
    md = fmt == "markdown"
    table = _markdown if md else _aligned

    def why(items: list[str]) -> list[str]:
        """The reasons under a table: an indented block, or a Markdown list."""
        return ["", "Why:", "", *(f"- {x}" for x in items)] if md else ["", "why:", *(f"  {x}" for x in items)]

    def heading(text: str) -> list[str]:
        return [f"## {text}", ""] if md else [text]

    lines = (heading("Workloads") if md else []) + table(rows, [c for c in COLUMNS if c != "reason"])
    lines += why([f"{x['namespace']}/{x['workload']}: {x['reason']}" for x in rows])
    if jobs is not None:
        lines += ["", *heading(f"Jobs (multi-GPU), {coverage_text(jobs.measured)}")]
        if job_rows:
            lines += table(job_rows, [c for c in JOB_COLUMNS if c != "reason"])
            lines += why([f"{x['job']}: {x['recommendation']}: {x['reason']}" for x in job_rows])
        else:
            lines.append("no job held two GPUs or more")
    if serving is not None and (serving.advice or serving.balance):
        srows = serving_rows(serving)
        lines += ["", *heading("Serving (the gpulens.serving rules)")]
        lines += table(srows, SERVING_COLUMNS)
        lines += why([str(x["reason"]) for x in srows] + [b.text for b in serving.balance])
    t = totals(recs)
    cost = "" if t["cost_saved_usd"] is None else f", ${t['cost_saved_usd']:,.2f}"
    lines += [
        "",
        f"{len(rows)} workloads over {span_text(window_s)}: {t['gpu_hours_held'] or 0:,.1f} GPU-hours held, "
        f"{t['gpu_hours_saved'] or 0:,.1f} could be saved{cost}",
    ]
    if not rows:
        lines = ["no workload held a GPU in the window"]
    return "\n".join(lines) + "\n"


def _json(v: object) -> object:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def parser() -> argparse.ArgumentParser:
    """The parser; value flags keep their text, read by :func:`options` (a bad one exits 2 naming it)."""
    window = duration_span(*WINDOW_SECONDS)
    step = duration_span(*STEP_SECONDS)
    timeout = duration_span(*QUERY_TIMEOUT_SECONDS)
    headroom = f"{plain(HEADROOM[0])}..{plain(HEADROOM[1])}"
    p = argparse.ArgumentParser(
        prog="gpulens-advisor",
        description="Recommend the smallest GPU, MIG profile or sharing mode that fits each workload.",
    )
    p.add_argument(
        "--prometheus",
        required=True,
        metavar="URL",
        help="Prometheus (or any PromQL API) base URL: http:// or https://",
    )
    p.add_argument(
        "--window",
        default="7d",
        help=f"how far back to look: s, m, h, d or w units, {window} in whole seconds (default 7d)",
    )
    p.add_argument(
        "--step",
        default=None,
        help=f"subquery resolution, {step} in whole seconds and at most --window (default: window/1008, at least 1m)",
    )
    p.add_argument(
        "--format",
        choices=("table", "markdown", "csv", "json"),
        default="table",
        help="table (default), markdown, csv (the workloads only) or json (with the evidence); all but csv "
        "add a Jobs section",
    )
    p.add_argument(
        "--price",
        action="append",
        default=[],
        metavar="MODEL=USD",
        help="price per GPU-hour for GPU models whose name contains MODEL (repeatable; '*' = any other); "
        f"USD {plain(PRICE_USD[0])}..{plain(PRICE_USD[1])}",
    )
    p.add_argument("--headroom", default="1.2", help=f"memory margin over the observed peak, {headroom} (default 1.2)")
    p.add_argument(
        "--compute-headroom", default="1.1", help=f"SM margin over the observed SM-active p95, {headroom} (default 1.1)"
    )
    p.add_argument(
        "--itl-target",
        action="append",
        default=[],
        metavar="MODEL=DURATION[,...]",
        help="a served model's inter-token latency p95 target (repeatable; e.g. llama-3-8b=50ms,qwen-7b=40ms; "
        f"{duration_span(*ITL_TARGET_SECONDS)}); default: today's p95 + 25%%",
    )
    p.add_argument(
        "--ttft-target",
        action="append",
        default=[],
        metavar="MODEL=DURATION[,...]",
        help="a served model's time-to-first-token p95 target (repeatable; e.g. llama-3-8b=800ms; "
        f"{duration_span(*TTFT_TARGET_SECONDS)}); default: none (TTFT is not held)",
    )
    p.add_argument("--namespace", default=None, help="only workloads of this namespace")
    p.add_argument("--timeout", default="30", help=f"time limit of each Prometheus query, {timeout} (default 30s)")
    prometheus_auth.add_arguments(p, ENV_PREFIX)
    return p


@dataclass(frozen=True)
class Options:
    """The advisor's validated values: seconds, USD per GPU-hour by model, the policy."""

    prometheus: str
    window: Window
    prices: dict[str, float]
    policy: Policy
    timeout_s: float
    itl_targets: dict[str, float]
    """Served model -> ITL p95 target (seconds)."""
    ttft_targets: dict[str, float]
    """Served model -> TTFT p95 target (seconds)."""


def _targets(items: Sequence[str], flag: str, parse: Callable[[str], dict[str, float]]) -> dict[str, float]:
    """A repeatable per-model latency flag's values merged; a model given twice (in one value or
    two) is refused, naming ``flag``."""
    targets: dict[str, float] = {}
    for item in items:
        more = named(parse, flag, item)
        twice = sorted(targets.keys() & more.keys())
        if twice:
            raise ValueError(f"{flag}: {twice[0]!r} has two targets")
        targets.update(more)
    return targets


def options(a: argparse.Namespace) -> Options:
    """Every value flag read and checked; ValueError names the flag."""
    window_s = named(PARSE_WINDOW, "--window", a.window)
    step_s = None if a.step is None else named(PARSE_STEP, "--step", a.step)
    if step_s is not None and step_s > window_s:
        raise ValueError(f"--step {a.step!r} is longer than --window {a.window!r}")
    prices: dict[str, float] = {}
    for item in a.price:
        more = named(parse_prices, "--price", item)
        twice = sorted(prices.keys() & more.keys())
        if twice:
            raise ValueError(f"--price: {twice[0]!r} is priced twice")
        prices.update(more)
    return Options(
        prometheus=named(http_url, "--prometheus", a.prometheus),
        window=Window(window_s=window_s, step_s=step_s),
        prices=prices,
        policy=Policy(
            headroom=named(PARSE_HEADROOM, "--headroom", a.headroom),
            compute_headroom=named(PARSE_HEADROOM, "--compute-headroom", a.compute_headroom),
        ),
        timeout_s=named(PARSE_TIMEOUT, "--timeout", a.timeout),
        itl_targets=_targets(a.itl_target, "--itl-target", parse_itl_targets),
        ttft_targets=_targets(a.ttft_target, "--ttft-target", parse_ttft_targets),
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    try:
        o = options(a)
        auth = prometheus_auth.from_args(a)
    except ValueError as exc:
        p.error(str(exc))
    src = PrometheusSource(o.prometheus, timeout_s=o.timeout_s, auth=auth)
    filters = Filters(namespace=a.namespace)
    try:
        recs = advise(src, o.window, o.prices, o.policy, filters)
        # a job's pods are workloads' pods: no workload, no job (and no second pass over an empty store)
        jobs = None
        if a.format != "csv":
            none = JobAdviceReport([], JobReport([], o.window.window_s))
            jobs = advise_all_jobs(src, o.window, o.prices, o.policy, filters) if recs else none
        # a served model's pods hold GPUs: no workload, no serving advice (and no pass over an empty store)
        serving = (
            advise_serving(src, o.window, o.prices, o.itl_targets, filters, o.ttft_targets)
            if recs and a.format != "csv"
            else None
        )
    except SourceError as exc:
        print(f"gpulens-advisor: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(render(recs, a.format, o.window.window_s, jobs, serving))
    return 0
