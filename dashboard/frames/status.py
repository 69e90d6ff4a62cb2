"""The Fleet page's status summary: what is wrong now, one line each with the page that explains it
(firing alerts, GPUDirect RDMA not ready, lost GPUs, exporters down, stragglers, communication-bound
jobs), or "all clear". Pure pandas over the sources' frames; no queries, no Streamlit calls."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from dashboard.frames.columns import col

ALL_CLEAR = "All clear"
"""What the summary says when none of its checks finds anything wrong."""

ALERT_PAGES: Mapping[str, str] = {
    "GPUDirectRDMANotReady": "network",
    "GPUJobStraggler": "jobs",
    "GPUJobCommunicationBound": "jobs",
    "GPUAllocatedButIdle": "workloads",
    "GPUUnderutilized": "workloads",
    "GPULaunchBound": "workloads",
}
"""The page that explains each alert; every other gpulens alert (hardware, exporter) is the Health page's."""
GPULENS_ALERT_PREFIX = "GPU"
"""gpulens' alerts are all named ``GPU...`` (deploy/rules/gpulens.rules.yml): the summary lists
those, not every alert the Prometheus evaluates for other teams."""
SEVERITY_ORDER: Mapping[str, int] = {"critical": 0, "error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class StatusLine:
    """One thing wrong: ``level`` (``error`` or ``warning``), ``text`` (a sentence, data in it
    already made inert by the caller's renderer) and ``page`` (the ``ui.PAGES`` key of the page
    that explains it)."""

    level: str
    text: str
    page: str


def alert_lines(alerts: pd.DataFrame) -> list[StatusLine]:
    """One line per firing alert name (``ALERTS{alertstate="firing"}`` rows: alertname, severity),
    the most severe first: ``GPULost firing (2, critical)``."""
    a = alerts
    if a.empty or "alertname" not in a.columns:
        return []
    a = a[a["alertname"].astype(str).str.startswith(GPULENS_ALERT_PREFIX)]
    if "alertstate" in a.columns:
        a = a[a["alertstate"].astype(str).isin(["firing", ""])]
    if a.empty:
        return []
    sev = col(a, "severity").astype(str)
    rows: dict[str, tuple[int, str]] = {}
    for name, s in zip(a["alertname"].astype(str), sev, strict=True):
        n, worst = rows.get(name, (0, s))
        rows[name] = (n + 1, s if SEVERITY_ORDER.get(s, 3) < SEVERITY_ORDER.get(worst, 3) else worst)
    order = sorted(rows, key=lambda k: (SEVERITY_ORDER.get(rows[k][1], 3), k))
    out = []
    for name in order:
        n, s = rows[name]
        level = "error" if SEVERITY_ORDER.get(s, 3) == 0 else "warning"
        what = f"{n:,} series, {s}" if s else f"{n:,} series"
        out.append(StatusLine(level, f"Alert {name} firing ({what})", ALERT_PAGES.get(name, "health")))
    return out


def gdr_lines(per_gpu: pd.DataFrame) -> list[StatusLine]:
    """One line per node where GPUDirect RDMA is not ready on some GPU (``frames.network.gdr_by_gpu``
    rows: node, instance, ready, reason): ``jobs-0: GPUDirect RDMA not ready on 8 of 8 GPUs (no
    peer-memory module or DMA-BUF)``."""
    if per_gpu.empty:
        return []
    where = col(per_gpu, "node").astype(str)
    where = where.where(where != "", col(per_gpu, "instance").astype(str))
    out = []
    for node in dict.fromkeys(where):
        rows = per_gpu[(where == node).to_numpy()]
        bad = rows[~rows["ready"].astype(bool)]
        if bad.empty:
            continue
        why = "; ".join(sorted(set(bad["reason"].astype(str))))
        out.append(
            StatusLine(
                "error",
                f"{node}: GPUDirect RDMA not ready on {len(bad):,} of {len(rows):,} GPUs ({why}): traffic to other "
                "nodes is copied through host memory",
                "network",
            )
        )
    return out


def lost_lines(gpu_up: pd.DataFrame, up: pd.DataFrame) -> list[StatusLine]:
    """Lost GPUs (``gpulens_gpu_up`` below 1: node, instance, gpu) and exporters that cannot read
    their GPUs (``gpulens_up`` below 1), one line each kind."""
    out = []
    down = gpu_up[pd.to_numeric(col(gpu_up, "value"), errors="coerce") < 1] if not gpu_up.empty else gpu_up
    if not down.empty:
        where = col(down, "node").astype(str).where(col(down, "node").astype(str) != "", col(down, "instance"))
        names = ", ".join(sorted({f"{w} GPU {g}" for w, g in zip(where, col(down, "gpu"), strict=True)}))
        out.append(StatusLine("error", f"{len(down):,} GPU(s) lost or unreadable: {names}", "health"))
    bad = up[pd.to_numeric(col(up, "value"), errors="coerce") < 1] if not up.empty else up
    if not bad.empty:
        where = col(bad, "node").astype(str).where(col(bad, "node").astype(str) != "", col(bad, "instance"))
        names = ", ".join(sorted(set(where)))
        out.append(StatusLine("error", f"{len(bad):,} exporter(s) cannot read their GPUs: {names}", "health"))
    return out


def gdr_off_nodes(per_gpu: pd.DataFrame) -> set[str]:
    """The nodes (node, else exporter instance) where GPUDirect RDMA is not ready on some GPU
    (``frames.network.gdr_by_gpu`` rows)."""
    if per_gpu.empty:
        return set()
    bad = per_gpu[~per_gpu["ready"].astype(bool)]
    where = col(bad, "node").astype(str)
    return set(where.where(where != "", col(bad, "instance").astype(str)))


def job_nodes(allocation: pd.DataFrame) -> dict[tuple[str, ...], set[str]]:
    """Each job's nodes (node, else exporter instance) from allocation rows (the pods of no owner
    named as their own job, ``jobs.name_jobs``)."""
    from dashboard import jobs

    if allocation.empty:
        return {}
    named = jobs.name_jobs(allocation)
    where = named["node"].where(named["node"] != "", named["instance"])
    out: dict[tuple[str, ...], set[str]] = {}
    for key, w in zip(named[list(jobs.JOB)].itertuples(index=False), where, strict=True):
        out.setdefault(tuple(str(x) for x in key), set()).add(str(w))
    return out


def gdr_words(job: tuple[str, ...], nodes: Mapping[tuple[str, ...], set[str]], gdr_off: set[str]) -> str:
    """Why a communication-bound job may wait, where GPUDirect RDMA is off on its nodes:
    ``GPUDirect RDMA off on jobs-0, jobs-1``; ``""`` where it is ready (or unknown) on all of them."""
    off = sorted(nodes.get(job, set()) & gdr_off)
    return f"GPUDirect RDMA off on {', '.join(off)}" if off else ""


def job_lines(overview: pd.DataFrame, nodes: Mapping[tuple[str, ...], set[str]], gdr_off: set[str]) -> list[StatusLine]:
    """Stragglers and communication-bound jobs (``frames.jobs.jobs_overview`` rows, verdicts
    held back while collecting), one line each kind; a communication-bound job on a node in
    ``gdr_off`` says so (:func:`gdr_words`), as the likely reason it waits."""
    if overview.empty:
        return []
    from dashboard import jobs

    out = []
    strays = overview[overview["stragglers"] > 0]
    if not strays.empty:
        names = "; ".join(f"{jobs.job_label(r)}: {r['straggler']}" for r in strays.head(3).to_dict("records"))
        more = f" and {len(strays) - 3:,} more" if len(strays) > 3 else ""
        out.append(StatusLine("warning", f"{len(strays):,} job(s) held back by a straggler: {names}{more}", "jobs"))
    bound = overview[overview["communication_bound"].astype(bool)]
    if not bound.empty:
        parts = []
        for r in bound.head(3).to_dict("records"):
            key = tuple(str(r[k]) for k in jobs.JOB)
            why = gdr_words(key, nodes, gdr_off)
            share = f"{r['communication'] * 100:.0f} % in collectives"
            parts.append(f"{jobs.job_label(r)} ({share}{'; ' + why if why else ''})")
        more = f" and {len(bound) - 3:,} more" if len(bound) > 3 else ""
        text = f"{len(bound):,} communication-bound job(s): {'; '.join(parts)}{more}"
        out.append(StatusLine("warning", text, "jobs"))
    return out


def status_lines(
    *,
    alerts: list[StatusLine],
    gdr: list[StatusLine],
    lost: list[StatusLine],
    jobs_: list[StatusLine],
) -> list[StatusLine]:
    """The summary's lines, errors first, in a fixed order within each level (lost GPUs, GPUDirect,
    alerts, jobs): a firing alert that repeats a line found here stays, naming the rule."""
    lines = [*lost, *gdr, *alerts, *jobs_]
    return sorted(lines, key=lambda x: 0 if x.level == "error" else 1)
