"""Jobs (dashboard/jobs.py): the sources' per-leaf figures joined into job rows, and the Jobs and
Job pages' tables and words (shares as %, memory in GiB, times in Unix seconds)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd

from dashboard import definitions, words
from dashboard.frames.columns import LEAF, col, with_cols
from dashboard.sources.source import Filters

POD_LEAF_KEYS = ("cluster", "namespace", "pod", "uuid", "mig_uuid")
"""Labels of a pod's series on one leaf (its class, its communication share) across clusters."""


SLOWDOWN_WORDS: dict[str, str] = {
    r: words.clock_event(r)
    for r in ("hw_thermal_slowdown", "hw_power_brake_slowdown", "hw_slowdown", "sw_thermal_slowdown", "sw_power_cap")
}
"""The slowdown clock events (source.SLOWDOWN_REASONS) in nvidia-smi's words (dashboard/words.py)."""


NO_CLASS = "no GPM: no class"
"""What a job's class, communication share and straggler read when none of its leaves is classified
(GPUs without GPM: pre-Hopper)."""


def job_leaf_rows(allocation: pd.DataFrame) -> pd.DataFrame:
    """``gpulens:job_leaf:info`` in pandas: one row per (job, pod, leaf) of allocation rows, columns
    ``jobs.JOB_LEAF``; a pod no controller owns is the job ``Pod/<pod>`` (``jobs.name_jobs``)."""
    from dashboard import jobs

    if allocation.empty:
        return pd.DataFrame(columns=list(jobs.JOB_LEAF))
    return jobs.name_jobs(allocation)[list(jobs.JOB_LEAF)].drop_duplicates().reset_index(drop=True)


JOB_AGE_KEYS: tuple[str, ...] = ("cluster", "namespace", "pod", "workload_kind", "workload")
"""The labels ``MetricSource.window_ages`` reads the pods' allocation history by (a job's age)."""


def job_ages(pod_ages: pd.DataFrame) -> pd.DataFrame:
    """Each job's history in the verdicts' window (JOB, age_s): the youngest of its pods'
    (``MetricSource.window_ages`` of ``definitions.POD_HISTORY_METRIC`` by JOB_AGE_KEYS). A job's
    verdicts (straggler, communication-bound) compare its pods, so they wait for the last to
    arrive."""
    from dashboard import jobs

    if pod_ages.empty:
        return pd.DataFrame(columns=[*jobs.JOB, "age_s"])
    named = jobs.name_jobs(pod_ages)
    named["age_s"] = pd.to_numeric(named["age_s"], errors="coerce")
    return named.groupby(list(jobs.JOB), as_index=False)["age_s"].min()[[*jobs.JOB, "age_s"]]


def keyed(df: pd.DataFrame, keys: Sequence[str], name: str) -> pd.DataFrame:
    """``df``'s ``value`` as column ``name``, one row per ``keys`` (the highest where several: the
    rules' ``max by``); rows without a value dropped."""
    cols = [*keys, name]
    if df.empty or "value" not in df.columns:
        return pd.DataFrame(columns=cols)
    d = with_cols(df, keys)
    d = d.assign(value=pd.to_numeric(d["value"], errors="coerce")).dropna(subset=["value"])
    if d.empty:
        return pd.DataFrame(columns=cols)
    return d.groupby(list(keys), as_index=False)["value"].max().rename(columns={"value": name})[cols]


def job_summary_figures(figures: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The rows of ``MetricSource.job_summary`` (jobs.SUMMARY_COLUMNS) from one frame per column
    (JOB labels and ``value``, a row per job): the jobs of ``gpus``, each figure joined on the job
    (NaN where a job has none; 0 stragglers and classified leaves where none was counted, 0 GPU-hours
    where ``gpu_hours`` was asked and the job held no step of the range yet). ``memory_used_bytes``
    is the peak memory ratio times ``memory_total_bytes`` (the memory of the leaf of that ratio)."""
    from dashboard import jobs

    key = list(jobs.JOB)

    def by_job(df: pd.DataFrame | None) -> dict[tuple[str, ...], float]:
        # a dict per figure, not a merge per figure: 500 jobs x 12 figures joined in a few ms
        if df is None or df.empty:
            return {}
        d = with_cols(df, key)
        keys = zip(*(d[k].astype(str) for k in key), strict=True)
        return dict(zip(keys, pd.to_numeric(d["value"], errors="coerce").tolist(), strict=True))

    jobs_now = list(by_job(figures["gpus"]))
    out = pd.DataFrame(jobs_now, columns=key) if jobs_now else pd.DataFrame(columns=key)
    for name in jobs.SUMMARY_COLUMNS:
        if name not in (*jobs.JOB, "memory_used_bytes"):
            values = by_job(figures.get(name))
            out[name] = [values.get(k, math.nan) for k in jobs_now]
    for name in ("gpus", "nodes", "pods", "stragglers", "classified_leaves"):  # counts (0: none recorded)
        out[name] = pd.to_numeric(out[name], errors="coerce").fillna(0).astype(int)
    if "gpu_hours" in figures:  # asked for a range: a job held at no step of it yet held none
        out["gpu_hours"] = out["gpu_hours"].fillna(0.0)
    out["activity_spread"] = out["activity_max"] - out["activity_min"]
    # the peak ratio times the memory of the leaf it was read on
    out["memory_used_bytes"] = out["memory_used_ratio"] * out["memory_total_bytes"]
    return out[list(jobs.SUMMARY_COLUMNS)].reset_index(drop=True)


def slowdown_reasons(reasons: pd.DataFrame) -> dict[str, str]:
    """Per GPU (uuid), the slowdown events seen (``reasons``: uuid, reason rows; only SLOWDOWN_WORDS'
    reasons), sorted and comma-separated."""
    r = with_cols(reasons, ["uuid", "reason"])
    r = r[r["reason"].isin(list(SLOWDOWN_WORDS))]
    seen: dict[str, set[str]] = {}
    for u, why in zip(r["uuid"].astype(str), r["reason"].astype(str), strict=True):
        seen.setdefault(u, set()).add(why)
    return {u: ",".join(sorted(w)) for u, w in seen.items()}


def straggler_figures(
    strays: pd.DataFrame, *, busy: pd.DataFrame, sm_clock_ratio: pd.DataFrame, reasons: pd.DataFrame
) -> pd.DataFrame:
    """The rows of ``MetricSource.job_stragglers`` (source.JOB_STRAGGLER_COLUMNS): ``strays`` (the
    straggling leaves: JOB_LEAF, gpu, reason) with ``busy`` (per uuid, mig_uuid), ``sm_clock_ratio``
    (per uuid) and the slowdown ``reasons`` seen (uuid, reason rows) joined on."""
    from dashboard.sources.source import JOB_STRAGGLER_COLUMNS

    out = with_cols(strays, JOB_STRAGGLER_COLUMNS[:-3]).copy()
    leaves = list(zip(out["uuid"].astype(str), out["mig_uuid"].astype(str), strict=True))
    b = keyed(busy, list(LEAF), "v")
    by_leaf = dict(zip(zip(b["uuid"].astype(str), b["mig_uuid"].astype(str), strict=True), b["v"], strict=True))
    c = keyed(sm_clock_ratio, ["uuid"], "v")
    by_gpu = dict(zip(c["uuid"].astype(str), c["v"], strict=True))
    seen = slowdown_reasons(reasons)
    out["busy"] = [by_leaf.get(k, math.nan) for k in leaves]
    out["sm_clock_ratio"] = [by_gpu.get(u, math.nan) for u, _ in leaves]
    out["slowdown_reasons"] = [seen.get(u, "") for u, _ in leaves]
    return out[list(JOB_STRAGGLER_COLUMNS)].reset_index(drop=True)


def job_leaf_figures(
    leaves: pd.DataFrame,
    *,
    activity: pd.DataFrame,
    busy: pd.DataFrame,
    communication: pd.DataFrame,
    memory_ratio: pd.DataFrame,
    memory_total: pd.DataFrame,
    sm_clock_ratio: pd.DataFrame,
    slowdown: pd.DataFrame,
    reasons: pd.DataFrame,
    gpus: pd.DataFrame,
    shares: pd.DataFrame,
    held: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The rows of ``MetricSource.job_leaves`` (source.JOB_LEAF_COLUMNS): ``leaves`` (JOB_LEAF) with
    each figure joined on its own key. Values (``value``) per (uuid, mig_uuid): ``activity``,
    ``busy``, ``memory_ratio`` (peak used over the leaf's memory), ``memory_total`` (bytes),
    ``shares`` (share of a GPU); per (cluster, namespace, pod, uuid, mig_uuid): ``communication``;
    per uuid (the physical GPU): ``sm_clock_ratio``, ``slowdown``; ``reasons``: uuid and reason rows
    (slowdown events seen in the window); ``gpus``: uuid, gpu, name (gpulens_gpu_info); ``held``:
    hours per (cluster, namespace, pod, uuid, mig_uuid), giving ``held_hours`` (0 where absent)."""
    from dashboard import jobs
    from dashboard.sources.source import JOB_LEAF_COLUMNS

    cols = [*JOB_LEAF_COLUMNS, *(["held_hours"] if held is not None else [])]
    if leaves.empty:
        return pd.DataFrame(columns=cols)
    out = with_cols(leaves, jobs.JOB_LEAF)[list(jobs.JOB_LEAF)].drop_duplicates()
    leaf, pod = list(LEAF), list(POD_LEAF_KEYS)
    for df, keys, name in (
        (activity, leaf, "activity"),
        (busy, leaf, "busy"),
        (communication, pod, "communication"),
        (memory_ratio, leaf, "memory_used_ratio"),
        (memory_total, leaf, "memory_total_bytes"),
        (sm_clock_ratio, ["uuid"], "sm_clock_ratio"),
        (slowdown, ["uuid"], "slowdown"),
        (shares, leaf, "gpu_share"),
    ):
        out = out.merge(keyed(df, keys, name), on=keys, how="left")
    g = with_cols(gpus, ["uuid", "gpu", "name"])[["uuid", "gpu", "name"]].drop_duplicates("uuid")
    out = out.merge(g.rename(columns={"name": "model"}), on="uuid", how="left")
    words = pd.DataFrame(list(slowdown_reasons(reasons).items()), columns=["uuid", "slowdown_reasons"])
    out = out.merge(words, on="uuid", how="left")
    for c in ("gpu", "model", "slowdown_reasons"):  # a column of no match is float NaN: "" then
        out[c] = ["" if v is None or v != v else str(v) for v in out[c]]
    out["gpu_share"] = pd.to_numeric(out["gpu_share"], errors="coerce").fillna(1.0)
    out["memory_used_bytes"] = out["memory_used_ratio"] * out["memory_total_bytes"]
    if held is not None:
        out = out.merge(keyed(held, pod, "held_hours"), on=pod, how="left")
        out["held_hours"] = pd.to_numeric(out["held_hours"], errors="coerce").fillna(0.0)
    for c in cols:
        if c not in out.columns:
            out[c] = math.nan
    return out[cols].reset_index(drop=True)


def jobs_within(leaves: pd.DataFrame, filters: Filters) -> pd.DataFrame:
    """The rows of the jobs ``filters`` select (``MetricSource.job_leaves``' semantics): cluster and
    namespace by the job's own labels; node and instance keep every leaf of each job with a leaf
    there (a job is shown whole)."""
    from dashboard import jobs

    out = leaves
    for key in ("cluster", "namespace"):
        value = getattr(filters, key)
        if value:
            out = out[col(out, key) == value]
    if (filters.node or filters.instance) and not out.empty:
        hit = out
        for key in ("node", "instance"):
            value = getattr(filters, key)
            if value:
                hit = hit[col(hit, key) == value]
        out = out.merge(hit[list(jobs.JOB)].drop_duplicates(), on=list(jobs.JOB), how="inner")
    return out.reset_index(drop=True)


def job_param(key: Sequence[str]) -> str:
    """A job's URL parameter ``namespace/Kind/name`` (Kubernetes names hold no ``/``); its cluster
    travels apart (``job_cluster``)."""
    _cluster, namespace, kind, name = (str(x) for x in key)
    return f"{namespace}/{kind}/{name}"


def job_from_param(text: str, cluster: str = "") -> tuple[str, str, str, str] | None:
    """The job (cluster, namespace, workload_kind, workload) of a ``job`` URL parameter; None when it
    does not read ``namespace/Kind/name``."""
    parts = text.split("/", 2)
    if len(parts) != 3 or not all(parts):
        return None
    return (cluster, parts[0], parts[1], parts[2])


def _pct(ratio: float) -> str:
    """A share (0..1) as whole percent with a space: ``50 %``."""
    return f"{ratio * 100:.0f} %"


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f}"


def where_words(node: object, instance: object) -> str:
    """Where a leaf is, as people name it: its node, else its exporter (``instance``)."""
    return str(node or "") or str(instance or "")


def gpu_words(node: object, instance: object, gpu: object, mig_uuid: object = "") -> str:
    """A leaf of a job as rows of the Job page name it: ``node-1 · GPU 3`` (a MIG instance adds its
    short UUID)."""
    text = f"{where_words(node, instance)} · GPU {gpu}" if str(gpu or "") else where_words(node, instance)
    mig = str(mig_uuid or "")
    return f"{text} · {mig[:12]}…" if mig else text


def straggler_reason(row: Mapping[str, object]) -> str:
    """Why a straggler (a ``jobs.stragglers`` row) holds its job back, in words: ``compute: SM
    clock 50 % of max, thermal slowdown`` or ``input: idle 45 % of the time while peers wait``."""
    if row.get("reason") == "input":
        busy = _num(row.get("busy"))
        idle = f"idle {_pct(1.0 - busy)} of the time" if busy == busy else "idle"
        return f"input: {idle} while peers wait"
    parts = []
    clock = _num(row.get("sm_clock_ratio"))
    if clock == clock:
        parts.append(f"SM clock {_pct(clock)} of max")
    events = [SLOWDOWN_WORDS[r] for r in str(row.get("slowdown_reasons") or "").split(",") if r in SLOWDOWN_WORDS]
    parts += list(dict.fromkeys(events))
    return "compute: " + (", ".join(parts) if parts else "computes while its peers wait")


def _num(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def straggler_words(row: Mapping[str, object]) -> str:
    """A straggling leaf by the pod holding it, with its reason: ``pod mixtral-sft-worker-1 on
    node-1 · GPU 3: compute: SM clock 50 % of max, …`` (the node, else its exporter)."""
    where = gpu_words(row.get("node"), row.get("instance"), row.get("gpu"), row.get("mig_uuid"))
    pod = str(row.get("pod") or "")
    return f"{f'pod {pod} on ' if pod else ''}{where}: {straggler_reason(row)}"


def activity_range_words(low: float, high: float) -> str:
    """A job's lowest and highest leaf activity and their spread: ``93–97 % · spread 4 pts``."""
    if low != low or high != high:
        return "no activity reading"
    return f"{low * 100:.0f}–{high * 100:.0f} % · spread {(high - low) * 100:.0f} pts"


def _memory_column(df: pd.DataFrame) -> list[str]:
    used, total = df["memory_used_bytes"].astype(float), df["memory_total_bytes"].astype(float)
    return [memory_words(u, t) for u, t in zip(used, total, strict=True)]


def _mix_words_by_job(mix: pd.DataFrame) -> dict[tuple[str, ...], str]:
    """Each job's class mix (``mix``: JOB, class, share rows) in words, largest first, classes under
    1 % left out (``communication 62 % · compute 38 %``), in one pass over the rows."""
    from dashboard import jobs

    if mix.empty:
        return {}
    m = mix.assign(share=pd.to_numeric(mix["share"], errors="coerce"))
    m = m[m["share"] >= 0.005].sort_values(["share", "class"], ascending=[False, True], kind="stable")
    out: dict[tuple[str, ...], list[str]] = {}
    cols = [m[k].astype(str).tolist() for k in jobs.JOB]
    for *k, c, v in zip(*cols, m["class"].astype(str), m["share"], strict=True):
        out.setdefault(tuple(k), []).append(f"{c} {_pct(v)}")
    return {k: " · ".join(v) for k, v in out.items()}


def memory_words(used: float, total: float) -> str:
    """The highest memory used on one leaf against its memory: ``118.0 of 140.4 GiB (84 %)``."""
    if used != used or total != total or total <= 0:
        return "no memory reading"
    return f"{_gib(used)} of {_gib(total)} GiB ({_pct(used / total)})"


JOB_OVERVIEW_COLUMNS: tuple[str, ...] = (
    "cluster",
    "namespace",
    "workload_kind",
    "workload",
    "gpus",
    "nodes",
    "pods",
    "gpu_hours",
    "activity",
    "activity_range",
    "busy",
    "communication",
    "mix",
    "memory",
    "straggler",
    "stragglers",
    "communication_bound",
    "classified",
    "collecting",
    "age_s",
)
"""The Jobs page's table (:func:`jobs_overview`): numbers for the bars and sorting, words for the rest."""


def jobs_overview(
    summary: pd.DataFrame, strays: pd.DataFrame, mix: pd.DataFrame, ages: pd.DataFrame | None = None
) -> pd.DataFrame:
    """One row per job of ``summary`` (``MetricSource.job_summary``: jobs.SUMMARY_COLUMNS), with its
    straggling leaves ``strays`` (``MetricSource.job_stragglers``) and class mix ``mix`` (JOB, class,
    share), most GPU-hours first (JOB_OVERVIEW_COLUMNS): the figures, the range of activity and the
    class mix in words, the highest memory on one leaf against its capacity, the stragglers in words
    (or why there is none to find) and whether the job is communication-bound
    (``jobs.COMMUNICATION_BOUND_AT_LEAST`` and no straggler).

    ``ages`` (:func:`job_ages`), where given, holds back the verdicts of a job whose history does
    not fill the window yet (``definitions.window_full``): no straggler, not communication-bound,
    its straggler and communication cells ``collecting (14 s of 5 m)`` (``collecting`` True)."""
    from dashboard import jobs

    key = list(jobs.JOB)
    if summary.empty:
        return pd.DataFrame(columns=list(JOB_OVERVIEW_COLUMNS))
    out = with_cols(summary, key)
    # words per job from whole columns (a pandas operation per job costs seconds at 500 jobs)
    said: dict[tuple[str, ...], list[str]] = {}
    for r in strays.to_dict("records"):
        said.setdefault(tuple(str(r[k]) for k in key), []).append(straggler_words(r))
    mixes = _mix_words_by_job(with_cols(mix, [*key, "class", "share"]))
    keys = [tuple(str(x) for x in r) for r in out[key].itertuples(index=False)]
    n = pd.to_numeric(out["classified_leaves"], errors="coerce").fillna(0).astype(int)
    out["stragglers"] = pd.to_numeric(out["stragglers"], errors="coerce").fillna(0).astype(int)
    out["straggler"] = [
        "; ".join(said.get(k, []))
        or (f"{s:,} (its figures did not load)" if s else "")
        or (NO_CLASS if c == 0 else "one classified GPU: no peers to wait" if c < 2 else "none")
        for k, c, s in zip(keys, n, out["stragglers"], strict=True)
    ]
    out["mix"] = [mixes.get(k) or NO_CLASS for k in keys]
    out["classified"] = n > 0
    out["communication_bound"] = (out["communication"] >= jobs.COMMUNICATION_BOUND_AT_LEAST - 1e-12) & (
        out["stragglers"] == 0
    )
    age = {tuple(str(x) for x in r[:-1]): float(r[-1]) for r in with_cols(ages, [*key, "age_s"])[[*key, "age_s"]]
           .itertuples(index=False)} if ages is not None else {}  # fmt: skip
    out["age_s"] = [age.get(k, math.nan) if ages is not None else definitions.MEAN_WINDOW_SECONDS for k in keys]
    out["collecting"] = [not definitions.window_full(a) for a in out["age_s"]]
    young = out["collecting"].to_numpy()
    out.loc[young, "stragglers"] = 0
    out.loc[young, "communication_bound"] = False
    # a job of no classified GPU never has a straggler verdict: it keeps saying why
    words = young & (n.to_numpy() > 0)
    out.loc[words, "straggler"] = [definitions.collecting_words(a) for a in out.loc[words, "age_s"]]
    out["activity_range"] = [
        activity_range_words(lo, hi) for lo, hi in zip(out["activity_min"], out["activity_max"], strict=True)
    ]
    out["memory"] = _memory_column(out)
    out = out.sort_values(["gpu_hours", "gpus", "namespace", "workload"], ascending=[False, False, True, True])
    return out[list(JOB_OVERVIEW_COLUMNS)].reset_index(drop=True)


def job_gpu_table(leaves: pd.DataFrame, collecting: str = "") -> pd.DataFrame:
    """The Job page's table: one row per leaf of one job (``MetricSource.job_leaves`` rows), by node
    then GPU index: where (``row``: :func:`gpu_words`), node, GPU, pod, activity, busy, communication
    (words where unclassified), memory in words, SM clock over its maximum, the slowdown events
    in words, and whether it straggles (the reason) or not; ``collecting`` (the job's window
    still filling, in words) stands for every leaf's straggler verdict."""
    from dashboard import jobs

    cols = ["row", "node", "gpu", "pod", "activity", "busy", "communication", "memory", "sm_clock_ratio", "slowdown",
            "straggler", "uuid", "mig_uuid"]  # fmt: skip
    if leaves.empty:
        return pd.DataFrame(columns=cols)
    one = jobs.one_per_leaf(leaves)
    strays = jobs.stragglers(leaves) if not collecting else leaves.iloc[0:0]
    why = {
        (str(r["uuid"]), str(r["mig_uuid"])): straggler_reason(r) for r in strays.to_dict("records")
    } if not strays.empty else {}  # fmt: skip
    n = int(one["communication"].notna().sum())
    where = zip(one["node"], one["instance"], one["gpu"], one["mig_uuid"], strict=True)
    out = one.assign(
        node=[where_words(a, b) for a, b in zip(one["node"], one["instance"], strict=True)],
        row=[gpu_words(a, b, g, m) for a, b, g, m in where],
        memory=_memory_column(one),
        slowdown=[
            ", ".join(SLOWDOWN_WORDS[r] for r in str(x).split(",") if r in SLOWDOWN_WORDS) or "none"
            for x in one["slowdown_reasons"]
        ],
        straggler=[
            collecting
            or why.get((str(u), str(m)))
            or (NO_CLASS if n == 0 else "no: one classified GPU" if n < 2 else "no")
            for u, m in zip(one["uuid"], one["mig_uuid"], strict=True)
        ],
        communication=[_pct(c) if c == c else NO_CLASS for c in one["communication"]],
        _i=pd.to_numeric(one["gpu"], errors="coerce"),
    )
    return out.sort_values(["node", "_i", "mig_uuid"])[cols].reset_index(drop=True)


def job_timeline(series: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """The Job page's timelines from ``MetricSource.job_series`` rows and the job's leaves (``rows``:
    uuid, mig_uuid, row): one frame with ``track`` (``activity``: SM activity, or the busy ratio of a
    leaf without it; ``class``; ``sm_clock``), ``row``, ``timestamp``, ``value`` and ``class``,
    only for the leaves in ``rows``."""
    cols = ["track", "row", "uuid", "mig_uuid", "timestamp", "value", "class"]
    if series.empty or rows.empty:
        return pd.DataFrame(columns=cols)
    s = with_cols(series, ["metric", "uuid", "mig_uuid", "class"])
    r = rows[["uuid", "mig_uuid", "row"]].drop_duplicates(["uuid", "mig_uuid"])
    sm = s[s["metric"] == "sm_active"]
    busy = s[s["metric"] == "busy"]
    has_sm = set(zip(sm["uuid"], sm["mig_uuid"], strict=True))
    busy = busy[[(u, m) not in has_sm for u, m in zip(busy["uuid"], busy["mig_uuid"], strict=True)]]
    activity = pd.concat([sm, busy], ignore_index=True).assign(track="activity", **{"class": ""})
    classes = s[(s["metric"] == "class") & (s["value"] >= 0.5)].drop_duplicates(["uuid", "mig_uuid", "timestamp"])
    classes = classes.assign(track="class")
    # the clock is the physical GPU's: every leaf on it reads it
    clock = s[s["metric"] == "sm_clock"].drop(columns=["mig_uuid"]).drop_duplicates(["uuid", "timestamp"])
    clock = clock.merge(r[["uuid", "mig_uuid"]], on="uuid").assign(track="sm_clock", **{"class": ""})
    parts = [p for p in (activity, classes, clock) if not p.empty]
    if not parts:
        return pd.DataFrame(columns=cols)
    out = pd.concat(parts, ignore_index=True).merge(r, on=["uuid", "mig_uuid"], how="inner")
    return out[cols].reset_index(drop=True)
