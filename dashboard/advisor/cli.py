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
from collections.abc import Sequence
from dataclasses import dataclass

from dashboard import prometheus_auth
from dashboard.advisor.engine import Policy, Recommendation
from dashboard.advisor.query import Window, advise
from dashboard.inputs import (
    HEADROOM,
    PRICE_USD,
    QUERY_TIMEOUT_SECONDS,
    STEP_SECONDS,
    WINDOW_SECONDS,
    duration_in,
    duration_span,
    http_url,
    named,
    number_between,
    parse_prices,
    plain,
)
from dashboard.prometheus_source import PrometheusSource
from dashboard.source import Filters, SourceError

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


def render(recs: Sequence[Recommendation], fmt: str, window_s: float) -> str:
    """The recommendations as ``table`` (aligned text), ``csv`` or ``json`` (with evidence)."""
    rows = [row(r) for r in recs]
    if fmt == "json":
        doc = {
            "window_seconds": window_s,
            "totals": totals(recs),
            "workloads": [
                {**x, "evidence": {k: _json(v) for k, v in r.evidence.items()}} for x, r in zip(rows, recs, strict=True)
            ],
        }
        return json.dumps(doc, indent=2) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
        w.writeheader()
        w.writerows({k: ("" if v is None else v) for k, v in x.items()} for x in rows)
        return buf.getvalue()
    shown = [c for c in COLUMNS if c != "reason"]
    cells = [[("-" if x[c] is None else str(x[c])) for c in shown] for x in rows]
    widths = [max([len(c), *(len(line[i]) for line in cells)]) for i, c in enumerate(shown)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(shown, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)) for line in cells]
    lines += ["", "why:"] + [f"  {x['namespace']}/{x['workload']}: {x['reason']}" for x in rows]
    t = totals(recs)
    cost = "" if t["cost_saved_usd"] is None else f", ${t['cost_saved_usd']:,.2f}"
    lines += [
        "",
        f"{len(rows)} workloads over {window_s / 86400:g} days: {t['gpu_hours_held'] or 0:,.1f} GPU-hours held, "
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
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
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
    try:
        recs = advise(src, o.window, o.prices, o.policy, Filters(namespace=a.namespace))
    except SourceError as exc:
        print(f"gpulens-advisor: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(render(recs, a.format, o.window.window_s))
    return 0
