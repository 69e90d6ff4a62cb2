# ruff: noqa: E501
# (the table below holds alert annotations as the rules file's lines: Go templates that cannot be cut)
"""Generate deploy/rules/gpulens.rules.yml, and the Helm chart's copy, from dashboard/definitions.py
and dashboard/jobs.py: ``python scripts/gen_rules.py`` writes both, then re-renders deploy/manifests/
(whose PrometheusRule embeds them) with scripts/render_manifests.py; ``--check`` writes nothing and
exits 1 when either rules file differs from what it would write (render_manifests.py --check
covers the manifests).

Every expression that encodes a concept (idle, activity, launch-bound, the transfer and communication
shares, wasted GPU-hours, a pod's class, a job and its straggler...) is taken from those modules
(``definitions.RULES``, ``POD_RULES``, ``NAMESPACE_RULES``, ``jobs.RULES`` and their ``*_promql``
functions) and written nowhere else. What is not a definition is declared in :data:`GROUPS` below:
the group names and order, the comments, the alerts' durations, labels and annotations, and the
expressions of the rules that only read hardware or network series (temperature limits, PCIe, NVLink,
NICs) or combine recorded series. Generation fails if a rule of those modules has no place in
:data:`GROUPS`, so a new definition cannot be forgotten.

The output is deterministic (same definitions, same bytes). Expressions taken from the modules are
laid out by :func:`layout`: kept on one line where they fit, else broken before each top-level
``or``/``and``/``unless`` and arithmetic vector match (``* on (...)``), and an over-long parenthesised operand
opened over several lines. Declared expressions are written as declared.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python scripts/gen_rules.py` from anywhere
    sys.path.insert(0, str(REPO))

from dashboard import definitions, jobs  # noqa: E402 (after the path set-up above)
from dashboard.serving import rules as serving  # noqa: E402 (after the path set-up above)

RULES_FILE = REPO / "deploy" / "rules" / "gpulens.rules.yml"
CHART_RULES_FILE = REPO / "deploy" / "helm" / "gpulens" / "files" / "gpulens.rules.yml"
OUTPUTS = (RULES_FILE, CHART_RULES_FILE)
COMMAND = "python scripts/gen_rules.py"
RUNBOOKS = "https://github.com/gpulens/gpulens/blob/main/docs/runbooks.md"
WIDTH = 110
"""Longest line :func:`layout` aims for (indent included); a line with no place to break may exceed it."""

DEFINED: Mapping[str, str] = {
    **definitions.RULES,
    **definitions.POD_RULES,
    **definitions.NAMESPACE_RULES,
    **jobs.RULES,
    **serving.RULES,
}
"""Every recording rule whose expression a definitions module writes."""


@dataclass(frozen=True)
class Record:
    """A recording rule: ``expr`` as a definitions module writes it (:func:`defined`) or declared."""

    name: str
    expr: str
    comment: str = ""
    blank_before: bool = False
    generated: bool = False


@dataclass(frozen=True)
class Alert:
    """An alerting rule; ``description`` keeps its line breaks (YAML folds them into spaces)."""

    name: str
    expr: str
    severity: str
    summary: str
    description: str
    for_: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    comment: str = ""
    blank_before: bool = False
    generated: bool = False
    window: str = ""
    """The PromQL duration the condition reads over (a mean's window, an increase's range), ``""``
    where it reads a level now. With ``for_`` it says what the alert measures: a 5 m mean held for
    30 m has been true of the last 35 minutes (``<<held>>``). A declared ``expr`` writes it as
    ``<<window>>``, so the expression and the words quote one value."""


@dataclass(frozen=True)
class Group:
    name: str
    rules: tuple[Record | Alert, ...]


def defined(name: str, comment: str = "", *, blank_before: bool = False) -> Record:
    """The recording rule ``name`` with the expression its definitions module writes."""
    return Record(name, DEFINED[name], comment, blank_before, generated=True)


def condition(
    name: str,
    expr: str,
    severity: str,
    summary: str,
    description: str,
    for_: str = "",
    labels: Mapping[str, str] | None = None,
    comment: str = "",
    *,
    blank_before: bool = False,
    window: str = "",
) -> Alert:
    """An alert whose condition ``expr`` a definitions module writes (laid out by :func:`layout`);
    ``window``: the definitions' constant the expression reads over (:class:`Alert`)."""
    return Alert(name, expr, severity, summary, description, for_, labels or {}, comment, blank_before, True, window)


# --- layout of generated PromQL ---------------------------------------------------------------
_OPENERS, _CLOSERS = "([{", ")]}"


def _depths(expr: str) -> Iterator[tuple[int, str, int]]:
    """(index, character, bracket depth before it) for every character outside string literals."""
    depth, quote, escaped = 0, "", False
    for i, ch in enumerate(expr):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
            continue
        if ch in "\"'`":
            quote = ch
            continue
        if ch in _CLOSERS:
            depth -= 1
        yield i, ch, depth
        if ch in _OPENERS:
            depth += 1


def _split(expr: str) -> list[str]:
    """``expr`` cut before each top-level set operator and ``* on``/``/ on`` vector match, and after
    each top-level comma."""
    cuts = []
    for i, ch, depth in _depths(expr):
        if depth or ch not in " ,":
            continue
        rest = expr[i + 1 :]
        if ch == "," and rest.startswith(" "):
            cuts.append(i + 1)
        elif ch == " " and (
            rest.startswith(("or ", "and ", "unless "))
            or (rest[:2] in ("* ", "/ ", "+ ", "- ") and rest[2:].startswith(("on (", "ignoring (")))
        ):
            cuts.append(i)
    pieces, start = [], 0
    for cut in cuts:
        pieces.append(expr[start:cut].strip())
        start = cut
    pieces.append(expr[start:].strip())
    return [p for p in pieces if p]


def _last_group(piece: str) -> tuple[str, str, str] | None:
    """``piece`` as (head ending in ``(``, inside, ``)`` and what follows) around its last top-level
    parenthesised group, or None."""
    close = None
    opens: list[int] = []
    pairs: dict[int, int] = {}
    for i, ch, _ in _depths(piece):
        if ch == "(":
            opens.append(i)
        elif ch == ")" and opens:
            o = opens.pop()
            if not opens:
                pairs[i] = o
                close = i
    if close is None:
        return None
    open_ = pairs[close]
    return piece[: open_ + 1], piece[open_ + 1 : close], piece[close:]


def layout(expr: str, indent: int = 0) -> list[str]:
    """``expr`` as lines indented by ``indent`` (module docstring); whitespace only is added or
    removed between tokens, so the expression parses the same."""
    expr = expr.strip()
    pad = " " * indent
    if indent + len(expr) <= WIDTH:
        return [pad + expr]
    pieces = _split(expr)
    lines: list[str] = []
    for piece in pieces:
        if lines and lines[-1].endswith(",") and len(lines[-1]) + 1 + len(piece) <= WIDTH:
            lines[-1] += " " + piece  # arguments packed while they fit
            continue
        lines.extend(_layout_piece(piece, indent))
    return lines


_MATCHING = re.compile(r"^[*/+-] (?:on|ignoring) \([^)]*\)(?: group_(?:left|right) \([^)]*\))?")
"""A vector match's operator and modifiers, e.g. ``* on (uuid, mig_uuid) group_left (gpu)``."""


def _layout_piece(piece: str, indent: int) -> list[str]:
    pad = " " * indent
    if indent + len(piece) <= WIDTH:
        return [pad + piece]
    matching = _MATCHING.match(piece)
    if matching:  # the operator and its modifiers on a line of their own, the operand below
        return [pad + matching.group(0), *_layout_piece(piece[matching.end() :].strip(), indent)]
    group = _last_group(piece)
    if group is None or not group[1].strip():
        return [pad + piece]
    head, inside, tail = group
    if len(_split(head[:-1])) > 1:  # an operator before the group: lay the head out first
        return [pad + piece]
    return [pad + head, *layout(inside, indent + 2), pad + tail]


# --- the declared table -------------------------------------------------------------------------
HEADER = """\
gpulens Prometheus rules: recording rules for per-namespace use and waste, and alerts.

GENERATED by scripts/gen_rules.py from dashboard/definitions.py and dashboard/jobs.py: do not edit.
Change a definition (or the script's table of comments, alerts and hardware rules) and run
`python scripts/gen_rules.py`; tests/test_rules_generated.py fails while this file is stale. The
script writes the Helm chart's copy too (deploy/helm/gpulens/files/), which its PrometheusRule
embeds. Every alert has a `promtool test rules` test under deploy/rules/tests/ and a runbook
section in docs/runbooks.md, linked from its runbook_url annotation.

Joins: allocation series carry uuid (physical GPU) and, for MIG, mig_uuid; device series carry
uuid and mig_uuid (empty, hence absent in Prometheus, for whole GPUs). Matching on
(uuid, mig_uuid) therefore joins whole GPUs on uuid and MIG instances on mig_uuid.
Every aggregation keeps `cluster`: where one store holds several clusters (a scale-out store fed by
each cluster's Prometheus or vmagent with a `cluster` label) the namespace and fleet figures stay per
cluster; where the series have no such label, `by (cluster, ...)` yields none (docs/capacity.md).
Every "rate/avg_over_time(x[w]) and x" keeps only leaves that are still exported, so a GPU whose
series went stale drops out of the rules at once instead of lingering for the range window.

Network (group gpulens.network, docs/network.md): NIC series are per exporter target and their
device names (rdmap79s0, mlx5_0) repeat on every node, so NIC joins match on
(cluster, instance, device), never on device alone; a pod's NIC and GPU allocations come from the
same scrape as its node's NICs and carry the same instance. A NIC's traffic is attributed to a pod
only where the pod holds it alone (gpulens_nic_pods == 1); gpulens:pod_nic_shared:count says how
many of its NICs a pod shares. The group's alert reads the group's own recording rules, which are
evaluated before it in the same group, so it does not depend on the order of the groups.

Jobs (group gpulens.jobs, docs/jobs.md, dashboard/jobs.py writes the expressions): a job is the pods
of one top owner, (cluster, namespace, workload_kind, workload), over every node; a pod no controller
owns is the job Pod/<pod>. Its per-leaf records read the leaf group's gpulens:gpu_activity:ratio_avg5m
(a group later in the file: a one-evaluation lag at a transition) and raw series; the job figures,
the straggler and the two alerts read the group's own records, evaluated before them.

Serving (group gpulens.serving, docs/serving.md, dashboard/serving/rules.py writes the expressions
from the engine table dashboard/serving/engines.py): the inference engines' own series (vLLM,
SGLang, TGI, TensorRT-LLM, Dynamo), scraped with namespace and pod, joined to the pods' GPUs on
(cluster, namespace, pod). Per pod, then per model and role; every ratio's comment names its divisor.
"""

HARDWARE_XIDS = (48, 61, 62, 64, 74, 79, 92, 94, 95, 119, 120, 140)
"""Xid codes that point at the GPU, its memory, NVLink or the driver/GSP rather than the application."""


def sole_holder_promql(cond: str) -> str:
    """``cond`` (per physical GPU) with the ``namespace`` and ``pod`` of the pod holding the GPU where
    exactly one does (``gpulens:gpu_holder:info``); unchanged where none or several do."""
    one = "(count by (uuid) (gpulens:gpu_holder:info) == 1)"
    return (
        f"({cond}) * on (uuid) group_left (namespace, pod) (gpulens:gpu_holder:info and on (uuid) {one})"
        f" or ({cond}) unless on (uuid) {one}"
    )


XID_EVENTS_WINDOW = "10m"
"""The range in which an application Xid's events page (the warning ``GPUXidError``)."""


def xid_promql(*, hardware: bool) -> str:
    """The ``GPUXidError`` conditions: a hardware Xid's level (it holds until the exporter's count
    restarts), or any other Xid's events of the last ``XID_EVENTS_WINDOW``
    (``definitions.counter_events_promql``, which the Health page's Xid panel reads too). Each
    GPU's series without ``xid`` (0 from the exporter's first scrape) is never a code: ``> 0``
    keeps it out of both."""
    xids = "|".join(map(str, HARDWARE_XIDS))
    if hardware:
        return sole_holder_promql(f'gpulens_gpu_xid_errors_total{{xid=~"{xids}"}} > 0')
    events = definitions.counter_events_promql(f'gpulens_gpu_xid_errors_total{{xid!~"{xids}"}}', XID_EVENTS_WINDOW)
    return sole_holder_promql(f"{events} > 0")


SERVING_COMMENTS: Mapping[str, str] = {
    "gpulens:serving_unjoinable_series:count": """\
Engine series (every engine of dashboard/serving/engines.py) that lack namespace or pod, per
scrape job and engine: the scrape did not copy the pod's labels (docs/serving.md), so they
cannot be joined to any GPU. They take no part in the rules below; this count says they exist.
""",
    "gpulens:serving_pod_engine:info": """\
One series (value 1) per pod, model and engine serving (any engine series with namespace and
pod), with the role its pod's labels declare as the scrape copied them into role (Dynamo's
component types, llm-d.ai/role, gpulens.io/serving-role), normalised (vLLM's kv_producer is
prefill, kv_consumer decode, kv_both both); empty where none is declared. Dynamo's frontend has
its fixed role (role_source "engine"). The record below completes the role.
""",
    "gpulens:serving_pod:info": """\
The pods of the record above with their role completed: the declared one (role_source
"declared"), the engine's ("engine"); else inferred from the pod's GPU classes over 30 m
(compute share above memory share: prefill, below: decode, equal: both), "inferred"; a pod whose
GPUs have no class: role "" and "unknown". Every per-pod record below joins it for role.
""",
    "gpulens:serving_input_tokens:rate5m": """\
Per pod: prompt (input) tokens per second over 5 m, the pod's engine series summed.
Labels cluster, namespace, pod, model, serving_engine, role, role_source. A pod whose engine is not scraped has no series (never 0).
""",
    "gpulens:serving_output_tokens:rate5m": """\
Per pod: generated (output) tokens per second over 5 m. Labels cluster, namespace, pod, model, serving_engine, role, role_source.
""",
    "gpulens:serving_requests:rate5m": """\
Per pod: requests finished per second over 5 m (vLLM: every finished_reason).
""",
    "gpulens:serving_requests_running:avg5m": """\
Per pod: requests being served, mean over 5 m (a pod's engine series summed).
""",
    "gpulens:serving_requests_queued:avg5m": """\
Per pod: requests waiting, mean over 5 m.
""",
    "gpulens:serving_kv_cache_usage:ratio_avg5m": """\
Per pod: the fraction (0..1) of the KV cache in use, mean over 5 m (mean of the pod's engines).
""",
    "gpulens:serving_kv_cache_usage:ratio_max5m": """\
Per pod: the KV cache's peak use over 5 m (0..1; the fullest of the pod's engines).
""",
    "gpulens:serving_ttft_seconds_bucket:rate5m": """\
Per pod and bucket (le, seconds): time-to-first-token observations per second over 5 m; the
quantiles below and the per-model ones sum these buckets.
""",
    "gpulens:serving_itl_seconds_bucket:rate5m": """\
Per pod and bucket: inter-token latency observations per second over 5 m (TGI: each request's
mean time per token; TensorRT-LLM: time per output token).
""",
    "gpulens:serving_ttft_seconds:p50_5m": """\
Per pod: median time to first token over 5 m, seconds (histogram_quantile of the bucket rates:
linear within a bucket); absent where no request got its first token in the window.
""",
    "gpulens:serving_ttft_seconds:p95_5m": """\
Per pod: 95th percentile of the time to first token over 5 m, seconds.
""",
    "gpulens:serving_itl_seconds:p50_5m": """\
Per pod: median inter-token latency over 5 m, seconds.
""",
    "gpulens:serving_itl_seconds:p95_5m": """\
Per pod: 95th percentile of the inter-token latency over 5 m, seconds.
""",
    "gpulens:serving_pod_gpus:sum": """\
Per serving pod (labels cluster, namespace, pod): the GPU-equivalents it holds, each leaf
weighted by the pod's share of it (gpulens:pod_gpu_holding:ratio: 1/4 for one of four
time-slicing replicas) times its share of the GPU (gpulens:leaf_gpu_share:ratio: 3/7 for a
3g MIG instance of an H200). The divisor of every per GPU-second ratio below.
""",
    "gpulens:serving_pod_power:watts": """\
Per serving pod: watts (joules per second, mean over 5 m from gpulens_gpu_energy_joules_total)
of the GPUs it holds, each GPU's energy shared by the same weights as the record above (a MIG
instance gets its slices' share of the whole GPU's power, idle draw included).
""",
    "gpulens:serving_output_tokens_per_gpu_second:ratio": """\
Per pod: output tokens per GPU-second = gpulens:serving_output_tokens:rate5m DIVIDED BY
gpulens:serving_pod_gpus:sum (tokens/s per GPU-equivalent held). Absent for a pod holding no GPU.
""",
    "gpulens:serving_input_tokens_per_gpu_second:ratio": """\
Per pod: input tokens per GPU-second = gpulens:serving_input_tokens:rate5m DIVIDED BY
gpulens:serving_pod_gpus:sum.
""",
    "gpulens:serving_joules_per_output_token:ratio": """\
Per pod: joules per output token = gpulens:serving_pod_power:watts (J/s) DIVIDED BY
gpulens:serving_output_tokens:rate5m (tokens/s). Absent while the pod generates no token. A prefill
pod's energy goes to input tokens: read its per GPU-second figures instead.
""",
    "gpulens:serving_pod_link_bytes:rate5m": """\
Per serving pod, link and direction (labels cluster, namespace, pod, link, direction tx|rx):
bytes per second over 5 m. link="nic": the RDMA NICs it holds alone (gpulens:pod_nic_bytes:rate5m);
link="nvlink": the NVLink counters of the leaves it holds, each shared by the pod's replicas held
(gpulens:pod_gpu_holding:ratio). Between the prefill and decode pods of a disaggregated deployment
these are mostly the KV cache handed on (tensor-parallel collectives use NVLink too).
""",
    "gpulens:serving_pod_link_capacity:bytes_per_second": """\
Per serving pod and link (labels cluster, namespace, pod, link): what its links carry each way at
most, bytes/s. link="nvlink": its leaves' active NVLink capacity, shared as the record above
shares their bytes; link="nic": the line rate of every port of the NICs it holds alone.
""",
    "gpulens:serving_model_pods:count": """\
Per model: the serving pods (replicas) of each role. Labels cluster, namespace, model, role: one series per model and role (roles kept apart).
""",
    "gpulens:serving_model_gpus:sum": """\
Per model: the GPU-equivalents its pods hold (gpulens:serving_pod_gpus:sum summed).
""",
    "gpulens:serving_model_input_tokens:rate5m": """\
Per model: input tokens per second, its pods' rates summed.
""",
    "gpulens:serving_model_output_tokens:rate5m": """\
Per model: output tokens per second, its pods' rates summed.
""",
    "gpulens:serving_model_requests:rate5m": """\
Per model: requests finished per second, summed.
""",
    "gpulens:serving_model_requests_running:avg5m": """\
Per model: requests being served, its pods' means summed.
""",
    "gpulens:serving_model_requests_queued:avg5m": """\
Per model: requests waiting, its pods' means summed.
""",
    "gpulens:serving_model_kv_cache_usage:ratio_avg5m": """\
Per model: KV cache use (0..1), the mean over its pods (each pod weighs the same).
""",
    "gpulens:serving_model_kv_cache_usage:ratio_max5m": """\
Per model: the fullest KV cache of its pods over 5 m (0..1).
""",
    "gpulens:serving_model_output_tokens_per_gpu_second:ratio": """\
Per model: output tokens per GPU-second = the SUM of its pods' output tokens/s DIVIDED BY the
SUM of the same pods' GPU-equivalents (a ratio of sums, not a mean of the pods' ratios).
""",
    "gpulens:serving_model_input_tokens_per_gpu_second:ratio": """\
Per model: input tokens per GPU-second = the SUM of its pods' input tokens/s DIVIDED BY the SUM of
the same pods' GPU-equivalents.
""",
    "gpulens:serving_model_joules_per_output_token:ratio": """\
Per model: joules per output token = the SUM of its pods' GPU watts DIVIDED BY the SUM of the
same pods' output tokens/s.
""",
    "gpulens:serving_model_nvlink_bytes:rate5m": """\
Per model and role: bytes per second its pods' NVLink moved, sent plus received
(gpulens:serving_pod_link_bytes:rate5m summed): a prefill role's KV cache sent, a decode role's received.
""",
    "gpulens:serving_model_nic_bytes:rate5m": """\
Per model and role: bytes per second the NICs its pods hold alone moved, sent plus received: the KV
cache handed between nodes.
""",
    "gpulens:serving_model_nvlink_utilization:ratio": """\
Per model and role, 0..1: the busier direction of its pods' NVLink (bytes/s summed over the pods)
DIVIDED BY the same pods' NVLink capacity each way summed: the KV transfer's share of the links.
""",
    "gpulens:serving_model_nic_utilization:ratio": """\
Per model and role, 0..1: the busier direction of the NICs its pods hold alone DIVIDED BY their
line rate each way summed.
""",
    "gpulens:serving_model_ttft_seconds:p50_5m": """\
Per model: median time to first token over 5 m, seconds, from its pods' bucket rates summed
(exact over all its requests, not a mean of the pods' quantiles).
""",
    "gpulens:serving_model_ttft_seconds:p95_5m": """\
Per model: 95th percentile of the time to first token over 5 m, seconds.
""",
    "gpulens:serving_model_itl_seconds:p50_5m": """\
Per model: median inter-token latency over 5 m, seconds.
""",
    "gpulens:serving_model_itl_seconds:p95_5m": """\
Per model: 95th percentile of the inter-token latency over 5 m, seconds.
""",
}
"""The comment of each gpulens.serving rule (dashboard/serving/rules.py writes the expressions)."""
SERVING_BREAKS: frozenset[str] = frozenset(
    {
        "gpulens:serving_pod_engine:info",
        "gpulens:serving_input_tokens:rate5m",
        "gpulens:serving_pod_gpus:sum",
        "gpulens:serving_model_pods:count",
    }
)


GROUPS: tuple[Group, ...] = (
    Group(
        "gpulens.leaf",
        (
            defined(
                "gpulens:gpu_sm_active:ratio_avg5m",
                """\
Mean SM activity of each leaf (whole GPU or MIG instance) over 5 m, 0..1. Exact from the
integral counter once the counter is older than the window: rate() divides by the whole
window, so a counter born 15 s ago (exporter restart, new MIG instance) would read ~20x too
low and make a busy leaf look idle. Until then, and where the counter is absent, the mean of
the sampled gauge stands in.
""",
            ),
            defined(
                "gpulens:gpu_activity:ratio_avg5m",
                """\
Mean activity of each leaf over 5 m, 0..1, at the precision its GPU allows: SM activity
(GPM, Hopper and newer); else its busy ratio (NVML GPU-Util, or its busiest link's
utilisation); else, for a MIG instance without GPM (A100), 1 if a compute process ran on it.
Idle and under-used read it (dashboard/definitions.py writes it).
""",
            ),
            defined(
                "gpulens:gpu_utilization:ratio_avg5m",
                """\
Mean NVML GPU-Util (time any kernel ran) over 5 m, physical GPUs only.
""",
            ),
            defined(
                "gpulens:gpu_kernels_active:bool",
                """\
1 if the leaf was in use in the last 5 m by a signal other than SM activity (the name is
older than the transfer class; kept for the dashboards and alerts that read it): NVML
GPU-Util >= <<kernels_util>> (whole GPUs) or the boundness class "launch" or "transfer" at any moment
(GPM, MIG instances too). A launch-bound stream of tiny kernels keeps SM activity near 0
while GPU-Util reads ~20 %; a transfer-bound leaf moves data over its links (PCIe, NVLink)
while its SMs wait, SM activity 0. Both are in use, not idle. A MIG instance has no
GPU-Util: for it only the class says kernels ran or data moved.
""",
            ),
            defined(
                "gpulens:gpu_transfer:ratio_avg5m",
                """\
Transfer share: the fraction of the last 5 m each leaf's class was "transfer" (0..1), the
time its links kept it busy with its SMs idle or waiting. GPUUnderutilized counts it as use
beside its activity. Absent for a leaf without a class (a MIG instance without GPM, or an
exporter older than the class): such a leaf is judged by its activity alone. Written by
dashboard/definitions.py.
""",
            ),
            defined(
                "gpulens:gpu_idle:bool",
                """\
1 if the leaf is idle (SM active < <<idle>> over <<mean_window>>, no kernels running and no data moved: the
sm_active and kernels_active rules above), 0 if busy. The one definition of idle, generated
from dashboard/definitions.py, which the dashboard and the advisor use too. From raw series, not
from the rules above: a rule reading another rule lags it by an evaluation, and would then
disagree with the dashboard and the advisor at every transition.
""",
            ),
            defined(
                "gpulens:leaf_gpu_share:ratio",
                """\
Each leaf's share of a physical GPU, the weight of its GPU-hours: a MIG instance counts
its compute slices over the GPU's (the "Ng" of its profile over 7, 4 on an A30: 3g.71gb on
an H200 = 3/7); a whole GPU, a profile of another shape, or an instance whose GPU model is
unknown 1.
""",
            ),
            Record(
                "gpulens:gpu_boundness:ratio_avg10m",
                expr="avg_over_time(gpulens_gpu_boundness[10m]) and gpulens_gpu_boundness",
                comment="""\
Share of the last 10 m each leaf spent in each boundness class (0..1 per class).
""",
            ),
        ),
    ),
    Group(
        "gpulens.pod",
        (
            defined(
                "gpulens:pod_gpu_sm_active:ratio_avg5m",
                """\
Per allocated container and leaf: the leaf's mean SM activity, with the routing labels
(namespace, pod, container, workload_kind, workload) and the GPU index / MIG profile.
""",
            ),
            defined(
                "gpulens:pod_gpu_activity:ratio_avg5m",
                """\
Per allocated container and leaf: the leaf's activity (gpulens:gpu_activity:ratio_avg5m: SM
activity where the GPU has GPM, else GPU-Util or processes), labelled as the record above.
The idle and under-used alerts read it, so they work on GPUs without GPM too.
""",
            ),
            defined(
                "gpulens:pod_gpu_transfer:ratio_avg5m",
                """\
Per allocated container and leaf: the leaf's transfer share (above), labelled as
gpulens:pod_gpu_sm_active:ratio_avg5m so the two add up in GPUUnderutilized.
""",
            ),
            defined(
                "gpulens:pod_gpu_idle:bool",
                """\
Per allocated container and leaf: 1 if the leaf is idle, 0 if busy.
""",
            ),
            Record(
                "gpulens:gpu_holder:info",
                expr="max by (cluster, uuid, namespace, pod) (gpulens_pod_gpu_allocation) * 0 + 1",
                comment="""\
Per physical GPU, each pod holding it or one of its MIG instances (value 1): the owners an
alert about the GPU itself (Xid, ECC, loss) names. Alerts take a pod's namespace and name
as labels where one pod holds the GPU, and list every holder in their description.
""",
                blank_before=True,
            ),
            defined(
                "gpulens:pod_gpu_holding:ratio",
                """\
Per allocated container and leaf: its share of the leaf, the replicas it holds over all
replicas held on the leaf (1 for an exclusive GPU or MIG instance).
""",
                blank_before=True,
            ),
            defined(
                "gpulens:pod_gpu_wasted:gpus",
                """\
Per allocated container and leaf: the GPU-equivalents it wastes now (holding share x leaf
idle x the leaf's GPU share, the three rules above, inlined from raw series for the same
reason). Integrated over time, wasted GPU-hours: the dashboard and the advisor compute the
same figure (dashboard/definitions.py writes this expression).
""",
            ),
            defined(
                "gpulens:pod_gpu_boundness:class",
                """\
Per allocated container and leaf: the container's boundness class (value 1), as the exporter
decides it (gpulens_pod_gpu_boundness): the leaf's class only while the pod is alone there
(the leaf's only holder, or the only pod with processes on it); "shared" where several pods
run on the leaf (time-slicing, MPS: the leaf's class describes their mixture, none of them);
"idle" for a pod with no process on a leaf others use. Adds the routing labels, the GPU
index and the MIG profile.
""",
                blank_before=True,
            ),
        ),
    ),
    Group(
        "gpulens.namespace",
        (
            defined(
                "namespace:gpulens_gpus_allocated:count",
                """\
Leaves (whole GPUs or MIG instances) allocated to the namespace; a time-sliced GPU shared
by several pods of one namespace counts once.
""",
            ),
            defined(
                "namespace:gpulens_gpus_busy:count",
                """\
Allocated leaves that are busy (SM active >= <<idle>>, kernels running or data moving).
""",
            ),
            defined(
                "namespace:gpulens_gpus_idle:count",
                """\
Allocated leaves that are idle.
""",
            ),
            defined(
                "namespace:gpulens_gpu_wasted_hours:sum1h",
                """\
Wasted GPU-hours in the last hour: the namespace's wasted GPU-equivalents (idle allocated
leaves, split among their holders, MIG instances weighted by their GPU share), integrated
at a fixed 1 m resolution (subquery) so the figure does not depend on the rule evaluation
interval. Sum it for longer windows, e.g. sum_over_time(...[1d:1h]) for a day.
""",
            ),
        ),
    ),
    Group(
        "gpulens.fleet",
        (
            Record(
                "class:gpulens_gpu_boundness:sum",
                expr="sum by (cluster, class) (gpulens:gpu_boundness:ratio_avg10m)",
                comment="""\
Fleet boundness mix: leaves per class (time-weighted over 10 m) ...
""",
            ),
            Record(
                "class:gpulens_gpu_boundness:ratio",
                expr="""\
class:gpulens_gpu_boundness:sum
/ ignoring (class) group_left ()
sum by (cluster) (class:gpulens_gpu_boundness:sum)
""",
                comment="""\
... and the same as a share of all classified leaves (the classes sum to 1).
""",
            ),
        ),
    ),
    Group(
        "gpulens.exporter",
        (
            Record(
                "gpulens:exporter_target:info",
                expr="""\
max by (cluster, job, instance, node) (gpulens_build_info) * 0 + 1
or
(last_over_time(gpulens:exporter_target:info[10m]) and on (job, instance) (up == 0))
""",
                comment="""\
Every scrape target that is a gpulens exporter, whatever its job is called (the chart's
ServiceMonitor, a nameOverride, a vmagent or Alloy job): a target that exported
gpulens_build_info, carried forward while its scrapes fail (up == 0) so that a dead exporter
stays known until service discovery drops it. Reads its own previous value.
""",
            ),
        ),
    ),
    Group(
        "gpulens.network",
        (
            Record(
                "gpulens:nic_port_bytes:rate5m",
                expr="""\
label_replace(
  max by (cluster, instance, node, device, port) (
    rate(gpulens_nic_port_data_transmitted_bytes_total[5m])
    and gpulens_nic_port_data_transmitted_bytes_total
  ),
  "direction", "tx", "", ""
)
or
label_replace(
  max by (cluster, instance, node, device, port) (
    rate(gpulens_nic_port_data_received_bytes_total[5m])
    and gpulens_nic_port_data_received_bytes_total
  ),
  "direction", "rx", "", ""
)
""",
                comment="""\
Bytes per second through each NIC port over 5 m, one series per direction
(direction="tx" sent, "rx" received), labels cluster, instance, node, device, port. From the
exporter's byte counters (EFA tx_bytes/rx_bytes; InfiniBand port_xmit_data/port_rcv_data x 4).
""",
            ),
            Record(
                "gpulens:nic_port_utilization:ratio_avg5m",
                expr="""\
clamp_max(
  max by (cluster, instance, node, device, port) (gpulens:nic_port_bytes:rate5m)
  / on (cluster, instance, device, port) group_left ()
  max by (cluster, instance, device, port) (gpulens_nic_port_rate_bytes_per_second > 0),
  1
)
""",
                comment="""\
Utilisation of each NIC port over 5 m, 0..1: its busier direction's bytes/s (the rule
above) over its line rate each way (gpulens_nic_port_rate_bytes_per_second). Absent for a
port whose rate is unknown or 0 (down). Labels cluster, instance, node, device, port.
""",
            ),
            Record(
                "gpulens:pod_nic_bytes:rate5m",
                expr="""\
sum by (cluster, namespace, pod, direction) (
  gpulens:nic_port_bytes:rate5m
  * on (cluster, instance, device) group_left (namespace, pod)
  (
    max by (cluster, instance, device, namespace, pod) (gpulens_pod_nic_allocation{device!=""})
    and on (cluster, instance, device) (gpulens_nic_pods == 1)
  )
)
""",
                comment="""\
Bytes per second each pod moves through the NICs it holds alone (gpulens_nic_pods == 1),
summed over those NICs and their ports, per direction: a pod holding 32 EFAs alone reads the
sum of the 32. A NIC held by several pods is attributed to none of them (its bytes cannot be
split); a pod holding only shared NICs has no series (gpulens:pod_nic_shared:count says so).
Labels cluster, namespace, pod, direction.
""",
            ),
            Record(
                "gpulens:pod_nic_shared:count",
                expr="""\
sum by (cluster, namespace, pod) (
  (
    max by (cluster, instance, namespace, pod, device) (gpulens_pod_nic_allocation{device!=""})
    * on (cluster, instance, device) group_left ()
    (max by (cluster, instance, device) (gpulens_nic_pods) > bool 1)
  )
  or
  max by (cluster, instance, namespace, pod, container, resource) (gpulens_pod_nic_allocation{device=""})
)
""",
                comment="""\
How many of the NICs a pod holds are held by other pods too (gpulens_nic_pods > 1); 0 for a
pod that holds all its NICs alone. Each allocation that names no NIC (device="": a shared
pool such as rdma/hca_shared_devices_a) counts as shared. Every pod holding a NIC has a
series. Labels cluster, namespace, pod.
""",
            ),
            defined(
                "gpulens:pod_gpu_communication:ratio_avg5m",
                """\
Share of each pod's GPU time in the class `communication` (spinning in a collective, waiting
on other GPUs: docs/network.md) over 5 m, 0..1: the mean over the pod's leaves of the time each
was in that class. Absent for a pod whose leaves have no class (no GPM). Labels cluster,
namespace, pod, workload_kind, workload.
""",
            ),
            Alert(
                "GPUDirectRDMANotReady",
                expr="""\
(
  # the pod holds NICs: their traffic, if one of them moves >= 1 % of its line rate
  (
    sum by (cluster, namespace, pod) (
      max by (cluster, instance, namespace, pod, device) (gpulens_pod_nic_allocation{device!=""})
      * on (cluster, instance, device) group_left ()
      sum by (cluster, instance, device) (gpulens:nic_port_bytes:rate5m)
    )
    and on (cluster, namespace, pod)
    (
      gpulens_pod_nic_allocation{device!=""}
      and on (cluster, instance, device) (gpulens:nic_port_utilization:ratio_avg5m >= 0.01)
    )
  )
  or
  # the pod holds no NIC: the traffic of its node's unheld NICs, if one moves >= 1 %
  sum by (cluster, namespace, pod) (
    (
      max by (cluster, instance, namespace, pod) (gpulens_pod_gpu_allocation)
      unless on (cluster, namespace, pod) gpulens_pod_nic_allocation{device!=""}
    )
    * on (cluster, instance) group_left ()
    (
      sum by (cluster, instance) (
        gpulens:nic_port_bytes:rate5m
        and on (cluster, instance, device) (gpulens_nic_pods == 0)
      )
      and on (cluster, instance)
      (
        gpulens:nic_port_utilization:ratio_avg5m >= 0.01
        and on (cluster, instance, device) (gpulens_nic_pods == 0)
      )
    )
  )
)
# ... and a GPU the pod holds has no GDR-ready NIC (x 1, adding the pod's workload labels)
* on (cluster, namespace, pod) group_left (workload_kind, workload)
max by (cluster, namespace, pod, workload_kind, workload) (
  gpulens_pod_gpu_allocation
  and on (cluster, instance, uuid) (max by (cluster, instance, uuid) (gpulens_gpu_nic_gdr_ready) == 0)
)
""",
                severity="warning",
                for_="15m",
                window=definitions.MEAN_WINDOW,
                summary="{{ $labels.namespace }}/{{ $labels.pod }} has moved RDMA traffic without GPUDirect RDMA for <<held>>",
                description="""\
{{ $labels.namespace }}/{{ $labels.pod }}{{ with $labels.workload }} ({{ $labels.workload_kind }} {{ . }}){{ end }} holds GPUs{{ with query (printf `max by (node, instance) (gpulens_pod_gpu_allocation{cluster=%q,namespace=%q,pod=%q})` $labels.cluster $labels.namespace $labels.pod) }}{{ with . | first }} on {{ with .Labels.node }}{{ . }}{{ else }}{{ .Labels.instance }}{{ end }}{{ end }}{{ end }}
for which no NIC is ready for GPUDirect RDMA (reason: {{ range $i, $r := query (printf `count by (reason) (gpulens_gpu_nic_gdr_ready{cluster=%q} == 0 and on (cluster, instance, uuid, device) gpulens_gpu_nic_path_info{nearest="true"} and on (cluster, instance, uuid) gpulens_pod_gpu_allocation{cluster=%q,namespace=%q,pod=%q})` $labels.cluster $labels.cluster $labels.namespace $labels.pod) | sortByLabel "reason" }}{{ if $i }}, {{ end }}{{ $r.Labels.reason }}{{ else }}unknown{{ end }}),
while {{ if query (printf `gpulens_pod_nic_allocation{cluster=%q,namespace=%q,pod=%q,device!=""}` $labels.cluster $labels.namespace $labels.pod) }}the NICs it holds{{ else }}its node's NICs that no pod holds{{ end }}
move {{ $value | humanize }}B/s (sent plus received, mean over <<window>>), and have for <<held>>
(means over <<window>>, held for <<for>>): its RDMA traffic is staged through host memory.
""",
                comment="""\
A pod whose RDMA traffic goes through host memory: it holds a GPU that has no NIC ready for
GPUDirect RDMA (every gpulens_gpu_nic_gdr_ready pair of that GPU is 0), and its traffic is
real: a NIC it holds (alone or shared) moves at least 1 % of its line rate, or, for a pod that
holds no NIC by name (none, or only device="" pool allocations), a NIC of its node that no pod
holds does (a NIC another pod holds is not mounted in this pod). The value is the bytes/s
(sent plus received) of those NICs. Labels cluster, namespace, pod, workload_kind, workload.
""",
                blank_before=True,
            ),
        ),
    ),
    Group(
        "gpulens.jobs",
        (
            defined(
                "gpulens:job_leaf:info",
                """\
Every (job, pod, leaf) allocated now, value 1: a job is the pods of one top owner (cluster, namespace,
workload_kind, workload; the exporter follows the owner chain: docs/attribution.md); a pod no
controller owns is a job of its own (workload_kind="Pod", workload=<pod>). Labels cluster,
namespace, workload_kind, workload, pod, instance, node, uuid, mig_uuid.
""",
            ),
            defined(
                "gpulens:job_leaf_activity:ratio_avg5m",
                """\
Each job leaf's activity over 5 m (gpulens:gpu_activity:ratio_avg5m: SM activity with GPM, else
GPU-Util), with its GPU index.
""",
            ),
            defined(
                "gpulens:job_leaf_busy:ratio_avg5m",
                """\
Each job leaf's busy ratio over 5 m (the time kernels ran).
""",
            ),
            defined(
                "gpulens:job_leaf_communication:ratio_avg5m",
                """\
Each job leaf's communication share: the fraction of 5 m the pod's class on it was `communication`
(spinning in a collective, waiting on its peers). Absent where the leaf has no class (no GPM).
""",
            ),
            defined(
                "gpulens:job_leaf_memory_used:ratio_max5m",
                """\
Each job leaf's peak memory used over 5 m, over the leaf's memory (0..1).
""",
            ),
            defined(
                "gpulens:job_leaf_peers_communication:ratio_avg5m",
                """\
Per job leaf, the mean communication share of its peers (the job's other leaves); jobs of two
leaves or more.
""",
            ),
            defined(
                "gpulens:job_leaf_peers_busy:ratio_avg5m",
                """\
Per job leaf, the mean busy ratio of its peers.
""",
            ),
            defined(
                "gpulens:job_gpus:count",
                """\
The job's leaves (whole GPUs and MIG instances; one two of its pods share counts once).
""",
            ),
            defined(
                "gpulens:job_gpu_share:sum",
                """\
The GPUs the job holds, a MIG instance by its share of its GPU (gpulens:leaf_gpu_share:ratio); its
GPU-hours over a range: sum_over_time(gpulens:job_gpu_share:sum[range:step]) * step / 3600.
""",
            ),
            defined(
                "gpulens:job_nodes:count",
                """\
The nodes (exporter targets) the job's leaves are on.
""",
            ),
            defined(
                "gpulens:job_activity:ratio_avg5m",
                """\
Mean, lowest and highest activity over the job's leaves, and the spread (highest - lowest).
""",
            ),
            defined("gpulens:job_activity_min:ratio_avg5m"),
            defined("gpulens:job_activity_max:ratio_avg5m"),
            defined("gpulens:job_activity_spread:ratio_avg5m"),
            defined(
                "gpulens:job_busy:ratio_avg5m",
                """\
Mean busy ratio over the job's leaves.
""",
            ),
            defined(
                "gpulens:job_boundness:ratio_avg5m",
                """\
The job's class mix: per class, the mean over its classified leaves of the fraction of 5 m the
pod's class on the leaf was that class (the classes sum to 1). class="communication" is the job's
communication share.
""",
            ),
            defined(
                "gpulens:job_memory_used_max:ratio_max5m",
                """\
The job's highest peak memory used on one leaf, over that leaf's memory (its memory headroom).
""",
            ),
            defined(
                "gpulens:job_memory_at_max:bytes",
                """\
The memory of that leaf (bytes; one where several tie): with the ratio, its peak used and headroom.
""",
            ),
            defined(
                "gpulens:job_pods:count",
                """\
The job's pods holding GPUs now.
""",
            ),
            defined(
                "gpulens:job_leaves_classified:count",
                """\
Its (pod, leaf) pairs with a class (GPM): 0 or absent, no class mix and no straggler to find.
""",
            ),
            defined(
                "gpulens:job_straggler:info",
                """\
The job's straggler, the leaf the others wait for: its peers spend >= <<peers_wait>> of their time in
`communication` and it >= <<straggler_gap>> less (dashboard/jobs.py). reason="input": its busy ratio is
>= <<input_gap>> below its peers' (its GPU sat idle for want of input while they spun); else
"compute" (it computed while they waited: slow clocks, throttling). Value: its peers' mean
communication share. Labels: the job leaf's and gpu.
""",
            ),
            Alert(
                "GPUJobStraggler",
                expr="gpulens:job_straggler:info",
                severity="warning",
                for_="15m",
                window=definitions.MEAN_WINDOW,
                summary="{{ $labels.workload_kind }} {{ $labels.namespace }}/{{ $labels.workload }} has waited on GPU {{ $labels.gpu }} of pod {{ $labels.pod }} on <<node>> for <<held>>",
                description="""\
The other GPUs of {{ $labels.workload_kind }} {{ $labels.namespace }}/{{ $labels.workload }} spend
{{ $value | humanizePercentage }} of their time waiting in collectives, GPU {{ $labels.gpu }}
({{ $labels.uuid }}) of pod {{ $labels.pod }} on <<node>> far less, for <<held>>
(means over <<window>>, held for <<for>>): the whole job runs at its pace.
{{ if eq $labels.reason "input" }}Its GPU sits idle for part of each step while its peers spin: it waits for its input
(data loading, host-side preprocessing, storage).{{ else }}It computes while its peers wait: look for slow clocks or throttling
(SM clock {{ with query (printf `avg_over_time(gpulens_gpu_sm_clock_hertz{uuid=%q}[15m]) / on (uuid) gpulens_gpu_sm_clock_max_hertz{uuid=%q}` $labels.uuid $labels.uuid) }}{{ . | first | value | humanizePercentage }}{{ else }}unknown{{ end }} of its maximum over 15 m;
clock events: {{ range $i, $r := query (printf `max by (reason) (max_over_time(gpulens_gpu_clock_event_active{uuid=%q,reason!~"gpu_idle|applications_clocks_setting|display_clock_setting|sync_boost"}[15m])) == 1` $labels.uuid) | sortByLabel "reason" }}{{ if $i }}, {{ end }}{{ $r.Labels.reason }}{{ else }}none{{ end }}).{{ end }}
""",
                comment="""\
A multi-GPU job waits on one of its GPUs: its peers spend a quarter of their time or more in
collectives waiting for it (means over <<window>>), for <<for>> (gpulens:job_straggler:info; reason
compute or input).
""",
                blank_before=True,
            ),
            condition(
                "GPUJobCommunicationBound",
                expr=jobs.communication_bound_promql(),
                severity="warning",
                for_="30m",
                window=definitions.MEAN_WINDOW,
                summary="{{ $labels.workload_kind }} {{ $labels.namespace }}/{{ $labels.workload }} has spent {{ $value | humanizePercentage }} of its GPU time communicating for <<held>>",
                description="""\
{{ $labels.workload_kind }} {{ $labels.namespace }}/{{ $labels.workload }} spends {{ $value | humanizePercentage }}
of its GPUs' time waiting in collectives (class communication), on
{{ with query (printf `gpulens:job_gpus:count{cluster=%q,namespace=%q,workload_kind=%q,workload=%q}` $labels.cluster $labels.namespace $labels.workload_kind $labels.workload) }}{{ . | first | value }}{{ end }} GPUs over
{{ with query (printf `gpulens:job_nodes:count{cluster=%q,namespace=%q,workload_kind=%q,workload=%q}` $labels.cluster $labels.namespace $labels.workload_kind $labels.workload) }}{{ . | first | value }}{{ end }} nodes,
and no single GPU holds it back, for <<held>> (means over <<window>>, held for <<for>>): the
interconnect sets its pace. Check GPUDirect RDMA, the
NICs its pods hold and their traffic, and whether it would fit on fewer nodes (the advisor).
""",
                comment="""\
A multi-GPU job spends <<communication_bound>> of its GPU time or more in collectives with no straggler to explain
it (means over <<window>>), for <<for>>: the interconnect (NICs, GPUDirect RDMA, placement) sets its pace.
""",
                blank_before=True,
            ),
        ),
    ),
    Group(
        "gpulens.serving",
        tuple(defined(name, SERVING_COMMENTS[name], blank_before=name in SERVING_BREAKS) for name in serving.RULES),
    ),
    Group(
        "gpulens.alerts",
        (
            condition(
                "GPUAllocatedButIdle",
                expr=definitions.allocated_idle_alert_promql(),
                severity="warning",
                for_="30m",
                window=definitions.MEAN_WINDOW,
                summary="GPU {{ $labels.gpu }} on <<node>> held by {{ $labels.namespace }}/{{ $labels.pod }} has been idle for <<held>>",
                description="""\
Container {{ $labels.container }} of {{ $labels.namespace }}/{{ $labels.pod }}
({{ $labels.workload_kind }} {{ $labels.workload }}) holds GPU {{ $labels.gpu }}
({{ $labels.uuid }}{{ with $labels.mig_uuid }} {{ . }}{{ end }}) on
<<node>>; {{ if (query (printf "gpulens_gpu_analysis_info{uuid=%q,signals!=\\"gpm\\"}" $labels.uuid)) }}its
activity (no GPM on this GPU: GPU-Util, or for a MIG instance its processes) stayed
under <<idle>>{{ else }}its SMs were active under <<idle>> of the time{{ end }} for <<held>>
(means over <<window>>, held for <<for>>).
""",
                comment="""\
Follows the idle verdict: a launch- or transfer-bound leaf is busy, so it never fires there.
""",
            ),
            condition(
                "GPUUnderutilized",
                expr=definitions.underused_alert_promql(),
                severity="info",
                for_="10m",
                window=definitions.UNDERUSED_WINDOW,
                summary='GPU {{ $labels.gpu }} on <<node>> held by {{ $labels.namespace }}/{{ $labels.pod }} averaged {{ $value | humanizePercentage }} {{ if (query (printf "gpulens_gpu_analysis_info{uuid=%q,signals!=\\"gpm\\"}" $labels.uuid)) }}GPU-Util{{ else }}SM activity{{ end }} for <<held>>',
                description="""\
{{ $labels.namespace }}/{{ $labels.pod }} ({{ $labels.workload_kind }} {{ $labels.workload }})
has held GPU {{ $labels.gpu }} ({{ $labels.uuid }}{{ with $labels.mig_uuid }} {{ . }}{{ end }})
for <<held>> (means over <<window>>, held for <<for>>) with {{ if (query (printf "gpulens_gpu_analysis_info{uuid=%q,signals!=\\"gpm\\"}" $labels.uuid)) }}its GPU-Util (no GPM on this GPU) under <<underused>>{{ else }}its SMs active
under <<underused>> of the time{{ end }}; a smaller MIG profile or a shared GPU would likely do.
""",
                comment="""\
Activity (SM activity; GPU-Util without GPM) under <<underused>> over <<underused_window>>, unless it plus the transfer
share reaches <<underused>>: a transfer-bound pod (links busy, SMs waiting) is limited by its link,
and a smaller slice or a shared GPU would not help it. The value stays the activity mean
(the summary shows it). A pod whose leaf has no class has no transfer share: the sum is then
absent (`+` drops a series without a partner), `unless` removes nothing, and activity alone
decides.
""",
                blank_before=True,
            ),
            condition(
                "GPULaunchBound",
                expr=definitions.launch_bound_alert_promql(),
                severity="info",
                for_="20m",
                window=definitions.LAUNCH_BOUND_WINDOW,
                summary="{{ $labels.namespace }}/{{ $labels.pod }} has been launch-bound on GPU {{ $labels.gpu }} of <<node>> for <<held>>: its GPU runs kernels but its SMs idle",
                description="""\
For <<held>> (shares over <<window>>, held for <<for>>) GPU {{ $labels.gpu }} ({{ $labels.uuid }}{{ with $labels.mig_uuid }} {{ . }}{{ end }})
of {{ $labels.namespace }}/{{ $labels.pod }} was launch-bound most of the time: kernels keep
nvidia-smi's GPU-Util up while the SMs are almost never active.
""",
                comment="""\
The pod's own class (gpulens:pod_gpu_boundness:class) was launch in over <<launch_share>> of the
evaluations of the last <<window>>, for <<for>>: a pod on a shared leaf reads "shared", never
the leaf's launch class, so a neighbour's tiny kernels do not page it.
""",
                blank_before=True,
            ),
            condition(
                "GPUMemoryBandwidthDegraded",
                expr=definitions.probe_degraded_alert_promql(),
                severity="warning",
                window=definitions.PROBE_SLOW_WINDOW,
                summary="GPU {{ $labels.gpu }}{{ with $labels.mig_uuid }} MIG instance {{ . }}{{ end }} on <<node>>: {{ $labels.probe }} bandwidth under <<probe_slow>> of expected in <<probe_runs>> runs in a row within <<held>>",
                description="""\
The {{ $labels.probe }} probe of GPU {{ $labels.gpu }} ({{ $labels.uuid }}{{ with $labels.mig_uuid }},
MIG instance {{ . }}{{ end }}) on
<<node>> measured at best
{{ $value | humanizePercentage }} of the bandwidth expected for its model in each of its
last <<probe_runs>> or more runs, within <<window>>.
""",
                comment="""\
"Three runs in a row" from cached gauges: the probe's last-success timestamp changed at least
twice within <<window>> (the value at the window start is a third run; the default probe interval is
1 h), and the highest efficiency of all those runs is below <<probe_slow_ratio>>. A good run resolves it.
""",
                blank_before=True,
            ),
            condition(
                "GPUXidError",
                expr=xid_promql(hardware=True),
                severity="critical",
                summary="GPU {{ $labels.gpu }} on <<node>><<holder>> has raised Xid {{ $labels.xid }} since the exporter started",
                description="""\
GPU {{ $labels.gpu }} ({{ $labels.uuid }}) reported Xid {{ $labels.xid }} ({{ $value }} since the exporter
started), which points at the GPU, its memory, NVLink or the driver rather than the
application. {{ with query (printf "gpulens:gpu_holder:info{uuid=%q}" $labels.uuid) | sortByLabel "pod" }}Held by{{ range . }} {{ .Labels.namespace }}/{{ .Labels.pod }}{{ end }}.{{ else }}No pod holds it.{{ end }}
""",
                comment="""\
Xid codes that point at the GPU, its memory, NVLink or the driver/GSP (drain the node).
The level, not the increase: the exporter counts a GPU's Xids from its own start, so the
alert holds from the first event until that count is gone. It goes when the node reboots
or the exporter restarts (its counters start again), which is also how a human clears it
after the GPU was reset or replaced: delete the node's gpulens pod (docs/runbooks.md). It
does not resolve by itself while the GPU stays as it is. Where one pod holds the GPU, the
alert carries its namespace and pod; the description lists every holder.
""",
                blank_before=True,
            ),
            condition(
                "GPUXidError",
                expr=xid_promql(hardware=False),
                severity="warning",
                window=XID_EVENTS_WINDOW,
                summary="GPU {{ $labels.gpu }} on <<node>><<holder>> raised Xid {{ $labels.xid }} in the last <<held>>",
                description="""\
GPU {{ $labels.gpu }} ({{ $labels.uuid }}) reported Xid {{ $labels.xid }} in the last <<window>>, which is
usually caused by the application that ran on it. {{ with query (printf "gpulens:gpu_holder:info{uuid=%q}" $labels.uuid) | sortByLabel "pod" }}Held by{{ range . }} {{ .Labels.namespace }}/{{ .Labels.pod }}{{ end }}.{{ else }}No pod holds it.{{ end }}
""",
                comment="""\
Every other Xid: usually the application (13, 31, 43, 45...) or a recorded row remap (63):
events of the last <<window>>. A code's counter is created by its first event, which increase() cannot
see, so a series that is new since <<window>> ago counts too (each GPU's series without xid, 0 from
the exporter's first scrape, is new once too: `> 0` keeps it out) (only if the target was scraped then,
so a Prometheus restart does not raise it): dashboard/definitions.py's
counter_events_promql, which the Health page's Xid panel reads too.
""",
            ),
            condition(
                "GPUEccUncorrectable",
                expr=sole_holder_promql('gpulens_gpu_ecc_errors_total{severity="uncorrected"} > 0'),
                severity="critical",
                summary="GPU {{ $labels.gpu }} on <<node>><<holder>> has counted uncorrectable ECC errors since the driver loaded",
                description="""\
GPU {{ $labels.gpu }} ({{ $labels.uuid }}) counted {{ $value }} uncorrectable ECC errors since
the driver loaded; data on it may be corrupt. {{ with query (printf "gpulens:gpu_holder:info{uuid=%q}" $labels.uuid) | sortByLabel "pod" }}Held by{{ range . }} {{ .Labels.namespace }}/{{ .Labels.pod }}{{ end }}.{{ else }}No pod holds it.{{ end }}
""",
                comment="""\
Volatile counts reset only when the driver reloads or the GPU is reset, which is also the
remedy, so the level (not the increase) is the condition and a reset resolves it.
""",
                blank_before=True,
            ),
            Alert(
                "GPUThermalThrottling",
                expr="""\
(
  avg_over_time(gpulens_gpu_clock_event_active{reason=~"hw_thermal_slowdown|sw_thermal_slowdown"}[<<window>>])
  and gpulens_gpu_clock_event_active
)
> 0.25
""",
                severity="warning",
                for_="5m",
                window="10m",
                summary="GPU {{ $labels.gpu }} on <<node>> has been thermally throttled for <<held>>",
                description="""\
GPU {{ $labels.gpu }} ({{ $labels.uuid }}) had its clocks held down by {{ $labels.reason }}
{{ $value | humanizePercentage }} of the last <<window>>, and over a quarter of the <<window>> before every evaluation
for <<for>>: <<held>> in all.
""",
                blank_before=True,
            ),
            Alert(
                "GPURowRemapFailure",
                expr="gpulens_gpu_row_remap_failure == 1",
                severity="critical",
                summary="GPU {{ $labels.gpu }} on <<node>> failed to remap a memory row",
                description="""\
GPU {{ $labels.gpu }} ({{ $labels.uuid }}) could not remap a failing HBM row: it has no spare
left for it and needs service. {{ with query (printf "gpulens:gpu_holder:info{uuid=%q}" $labels.uuid) | sortByLabel "pod" }}Held by{{ range . }} {{ .Labels.namespace }}/{{ .Labels.pod }}{{ end }}.{{ else }}No pod holds it.{{ end }}
""",
                comment="""\
Row remapping (HBM): a failed remap means the GPU has run out of spare rows for a bad one
(replace it); a pending remap waits for a GPU reset to take effect.
""",
                blank_before=True,
            ),
            Alert(
                "GPURowRemapPending",
                expr="gpulens_gpu_row_remap_pending == 1",
                severity="warning",
                for_="10m",
                summary="GPU {{ $labels.gpu }} on <<node>> has had a row remap waiting for a reset for <<held>>",
                description="""\
GPU {{ $labels.gpu }} ({{ $labels.uuid }}) remapped a failing HBM row <<for>> ago or more; the remap
takes effect at the next GPU reset. {{ with query (printf "gpulens:gpu_holder:info{uuid=%q}" $labels.uuid) | sortByLabel "pod" }}Held by{{ range . }} {{ .Labels.namespace }}/{{ .Labels.pod }}{{ end }}.{{ else }}No pod holds it.{{ end }}
""",
            ),
            Alert(
                "GPUPcieLinkDegraded",
                expr="""\
gpulens_gpu_pcie_link_width < on (uuid) group_left () gpulens_gpu_pcie_link_max_width
or
(
  gpulens_gpu_pcie_link_generation < on (uuid) group_left () gpulens_gpu_pcie_link_max_generation
  and on (uuid) (avg_over_time(gpulens_gpu_utilization_ratio[10m]) >= 0.5)
)
""",
                severity="warning",
                for_="15m",
                summary="GPU {{ $labels.gpu }} on <<node>>: PCIe link trained below its maximum for <<held>>",
                description="""\
For <<held>>, GPU {{ $labels.gpu }} ({{ $labels.uuid }}) has run its PCIe link at
{{ with query (printf "gpulens_gpu_pcie_link_generation{uuid=%q}" $labels.uuid) }}Gen{{ . | first | value }}{{ end }}
x{{ with query (printf "gpulens_gpu_pcie_link_width{uuid=%q}" $labels.uuid) }}{{ . | first | value }}{{ end }}
where it can train to
Gen{{ with query (printf "gpulens_gpu_pcie_link_max_generation{uuid=%q}" $labels.uuid) }}{{ . | first | value }}{{ end }}
x{{ with query (printf "gpulens_gpu_pcie_link_max_width{uuid=%q}" $labels.uuid) }}{{ . | first | value }}{{ end }}:
host-to-GPU copies run slower. {{ with query (printf "gpulens:gpu_holder:info{uuid=%q}" $labels.uuid) | sortByLabel "pod" }}Held by{{ range . }} {{ .Labels.namespace }}/{{ .Labels.pod }}{{ end }}.{{ else }}No pod holds it.{{ end }}
""",
                comment="""\
A PCIe link trained below what the GPU and its slot support. Fewer lanes is never a power
saving: 15 m is enough. A lower generation is, at idle (the link trains down and back up
under load), so it counts only while the GPU ran kernels half the time or more.
""",
                blank_before=True,
            ),
            Alert(
                "GPUNvlinkErrors",
                expr="""\
sum without (kind) (increase(gpulens_gpu_nvlink_errors_total{kind="recovery"}[<<window>>])) > 0
or
sum without (kind) (increase(gpulens_gpu_nvlink_errors_total{kind=~"crc_flit|crc_data|replay"}[<<window>>])) > 100
""",
                severity="warning",
                window="10m",
                summary="GPU {{ $labels.gpu }} on <<node>> counted NVLink errors in the last <<held>>",
                description="""\
GPU {{ $labels.gpu }} ({{ $labels.uuid }}) counted {{ $value | humanize }} NVLink errors in the last
<<window>> (link recoveries, or CRC errors and replays beyond a trickle). {{ with query (printf "gpulens:gpu_holder:info{uuid=%q}" $labels.uuid) | sortByLabel "pod" }}Held by{{ range . }} {{ .Labels.namespace }}/{{ .Labels.pod }}{{ end }}.{{ else }}No pod holds it.{{ end }}
""",
                comment="""\
NVLink: a link that retrained (recovery) is always worth a look; CRC errors are corrected by
replaying the packet, so only a steady stream (over 100 in <<window>>) points at a bad link.
""",
                blank_before=True,
            ),
            Alert(
                "GPUNvlinkDown",
                expr="""\
(gpulens_gpu_nvlink_link_active == 0)
  and on (cluster, instance, uuid, link)
(max_over_time(gpulens_gpu_nvlink_link_active[6h]) == 1)
or
(gpulens_gpu_nvlink_link_active == 0)
  and on (cluster, instance, link)
(max by (cluster, instance, link) (gpulens_gpu_nvlink_link_active) == 1)
""",
                severity="warning",
                for_="5m",
                summary="NVLink {{ $labels.link }} of GPU {{ $labels.gpu }} on <<node>> has been down for <<held>>",
                description="""\
Link {{ $labels.link }} of GPU {{ $labels.gpu }} ({{ $labels.uuid }}) has been down for <<held>>;
{{ with query (printf "sum(gpulens_gpu_nvlink_link_active{uuid=%q})" $labels.uuid) }}{{ . | first | value }}{{ end }}
of its {{ with query (printf "count(gpulens_gpu_nvlink_link_active{uuid=%q})" $labels.uuid) }}{{ . | first | value }}{{ end }}
links are up, and its collectives run that much slower. {{ with query (printf "gpulens:gpu_holder:info{uuid=%q}" $labels.uuid) | sortByLabel "pod" }}Held by{{ range . }} {{ .Labels.namespace }}/{{ .Labels.pod }}{{ end }}.{{ else }}No pod holds it.{{ end }}
""",
                comment="""\
NVLink: a link that is down (gpulens_gpu_nvlink_link_active 0) while it was up within the last
6 hours, or while the same link is up on another GPU of the node (an HGX board trains all 18
on every GPU: a down link there stays visible after the 6 hours). Links never up on a node
(an unused bridge port) do not fire.
""",
                blank_before=True,
            ),
            Alert(
                "GPUTemperatureHigh",
                expr="""\
gpulens_gpu_temperature_celsius >= on (uuid) group_left () gpulens_gpu_temperature_threshold_celsius{threshold="gpu_max"}
or
gpulens_gpu_memory_temperature_celsius >= on (uuid) group_left () gpulens_gpu_temperature_threshold_celsius{threshold="memory_max"}
or
(gpulens_gpu_temperature_celsius >= 85 unless on (uuid) gpulens_gpu_temperature_threshold_celsius{threshold="gpu_max"})
""",
                severity="warning",
                for_="5m",
                summary="GPU {{ $labels.gpu }} on <<node>> is at {{ $value }} degrees C, at its temperature limit for <<held>>",
                description="""\
GPU {{ $labels.gpu }} ({{ $labels.uuid }}) has been at or above its maximum operating temperature
for <<held>> ({{ $value }} degrees C): check the node's cooling and airflow. {{ with query (printf "gpulens:gpu_holder:info{uuid=%q}" $labels.uuid) | sortByLabel "pod" }}Held by{{ range . }} {{ .Labels.namespace }}/{{ .Labels.pod }}{{ end }}.{{ else }}No pod holds it.{{ end }}
""",
                comment="""\
Absolute temperature against the GPU's own limits (gpulens_gpu_temperature_threshold_celsius):
warning at its maximum operating temperature (gpu_max, or the HBM's memory_max), critical at
slowdown, where the hardware slows the clocks to protect itself. A GPU that reports no
limits is held to 85 degrees C.
""",
                blank_before=True,
            ),
            Alert(
                "GPUTemperatureHigh",
                expr='gpulens_gpu_temperature_celsius >= on (uuid) group_left () gpulens_gpu_temperature_threshold_celsius{threshold="slowdown"}',
                severity="critical",
                for_="2m",
                summary="GPU {{ $labels.gpu }} on <<node>> is at {{ $value }} degrees C, past its slowdown limit for <<held>>",
                description="""\
GPU {{ $labels.gpu }} ({{ $labels.uuid }}) has been at or above the temperature at which its hardware
slows the clocks for <<held>> ({{ $value }} degrees C); near its shutdown limit it turns off. {{ with query (printf "gpulens:gpu_holder:info{uuid=%q}" $labels.uuid) | sortByLabel "pod" }}Held by{{ range . }} {{ .Labels.namespace }}/{{ .Labels.pod }}{{ end }}.{{ else }}No pod holds it.{{ end }}
""",
            ),
            Alert(
                "GPUNodeFewerHealthyThanAllocatable",
                expr="""\
sum by (node) (kube_node_status_allocatable{resource=~"nvidia_com_gpu|nvidia_com_gpu_shared|nvidia_com_mig_.+"})
>
sum by (node) (
  count by (node, uuid) (gpulens_mig_instance_info and on (uuid) (gpulens_gpu_up == 1))
  or
  (max by (node, uuid) (gpulens_gpu_sharing_replicas) and on (uuid) (gpulens_gpu_up == 1))
  or
  max by (node, uuid) (gpulens_gpu_up == 1)
)
""",
                severity="warning",
                for_="15m",
                summary="Node {{ $labels.node }} has offered more GPU devices than it has healthy GPUs for, for <<held>>",
                description="""\
Kubernetes can allocate {{ $value }} GPU devices on {{ $labels.node }}, more than its readable GPUs
provide, and has for <<held>>: a lost or unreadable GPU is still advertised, and pods scheduled onto it will fail.
""",
                comment="""\
Kubernetes can hand out more GPU devices on a node than gpulens can read there: a GPU lost
or unreadable that the device plugin still advertises, so pods are scheduled onto it. Devices
are counted as the device plugin counts them: a whole GPU once, a time-sliced GPU once per
replica, a MIG GPU once per instance (single or mixed strategy alike). Needs
kube-state-metrics (allocatable) and the `node` label on the exporters' series.
""",
                blank_before=True,
            ),
            condition(
                "GPULost",
                expr=sole_holder_promql("gpulens_gpu_up == 0"),
                severity="critical",
                for_="2m",
                summary="GPU {{ $labels.gpu }} on <<node>><<holder>> has been lost or unreadable for <<held>>",
                description="""\
GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on
<<node>> has not answered the
driver for <<held>>: its series are gone and the pods holding it have lost it. {{ with query (printf "gpulens:gpu_holder:info{uuid=%q}" $labels.uuid) | sortByLabel "pod" }}Held by{{ range . }} {{ .Labels.namespace }}/{{ .Labels.pod }}{{ end }}.{{ else }}No pod holds it.{{ end }}
""",
                comment="""\
A GPU the exporter knows but cannot read: fallen off the bus (Xid 79), lost to NVML, or
unreadable after a reset. The exporter keeps gpulens_gpu_up{...} = 0 for it and drops its
other series, so every other alert on that GPU goes quiet: this one must speak.
""",
                blank_before=True,
            ),
            condition(
                "GPUExporterDown",
                expr=definitions.EXPORTERS_DOWN_PROMQL,
                severity="warning",
                for_="5m",
                labels={"reason": "scrape_failed"},
                summary="gpulens exporter {{ $labels.instance }}{{ with $labels.node }} on node {{ . }}{{ end }} has not been scraped for <<held>>",
                description="""\
Prometheus has failed to scrape {{ $labels.instance }} for <<held>>: the GPUs of that node
are unobserved and their alerts cannot fire.
""",
                comment="""\
Any target known to be a gpulens exporter (gpulens:exporter_target:info: whatever its scrape
job is called) that Prometheus cannot scrape.
""",
                blank_before=True,
            ),
            Alert(
                "GPUExporterDown",
                expr="gpulens_up == 0",
                severity="warning",
                for_="5m",
                labels={"reason": "gpu_backend_down"},
                summary="gpulens exporter {{ $labels.instance }}{{ with $labels.node }} on node {{ . }}{{ end }} has not reached the GPU driver for <<held>>",
                description="""\
The exporter at {{ $labels.instance }} answers, but its GPU backend (NVML) has been
unavailable for <<held>>: it exports no GPU series.
""",
            ),
            Alert(
                "GPUExporterDown",
                expr="""\
max by (node) (kube_node_status_capacity{resource=~"nvidia_com_gpu|nvidia_com_mig_.+"} > 0)
unless on (node)
max by (node) (gpulens_build_info)
""",
                severity="warning",
                for_="15m",
                labels={"reason": "not_running"},
                summary="GPU node {{ $labels.node }} has had no gpulens exporter for <<held>>",
                description="""\
Node {{ $labels.node }} offers GPUs but no gpulens exporter has been scraped there for
<<held>>: the DaemonSet's pod is not running on it, or has never answered, so its GPUs
are unobserved.
""",
                comment="""\
A GPU node with no working exporter: none scheduled there (a taint it does not tolerate, a
nodeSelector that misses the node), or one that has failed since it started and so was
never known as a gpulens target. No gpulens series comes from the node, whatever the job
is called. kube-state-metrics knows which nodes offer GPUs (whole or MIG resources);
without it this rule matches nothing. The exporters' series need the `node` label (the
chart's ServiceMonitor sets it). <<for>> covers a node joining and its pod starting.
""",
            ),
            Alert(
                "GPUExporterStageFailing",
                expr="""\
avg_over_time(gpulens_stage_success[<<window>>]) < 0.5
and
gpulens_stage_success
""",
                severity="warning",
                for_="5m",
                window="10m",
                summary="gpulens stage {{ $labels.stage }} has been failing on <<node>> for <<held>>",
                description="""\
The {{ $labels.stage }} stage of the exporter {{ $labels.instance }} failed in more than half of its
cycles over the <<window>> before every evaluation for <<for>> (<<held>> in all); the series it
produces are missing.
""",
                blank_before=True,
            ),
            Alert(
                "GPUExporterStageFailing",
                expr="gpulens_snapshot_age_seconds > <<window_seconds>>",
                severity="warning",
                for_="5m",
                labels={"stage": "sampler"},
                window="1m",
                summary="gpulens stage sampler has taken no snapshot on <<node>> for <<held>>",
                description="""\
The newest snapshot of the exporter {{ $labels.instance }} is {{ $value | humanizeDuration }} old
(older than <<window>> for <<for>>): sampling has stopped and every GPU value the exporter serves
is stale.
""",
                comment="""\
A sampler that stopped producing snapshots (a driver call hung past every deadline).
""",
            ),
        ),
    ),
)
"""The rules file: its groups in order, each rule with its comment."""


# --- prose: the definitions' figures quoted in comments and annotations -------------------------
def _pct(ratio: float) -> str:
    return f"{ratio * 100:g} %"


def _span(duration: str, words: bool = False) -> str:
    """A PromQL duration as prose: ``6h`` -> ``6 h`` (``6 hours`` with ``words``)."""
    m = re.fullmatch(r"(\d+)([smh])", duration)
    if not m:
        return duration
    n, unit = int(m.group(1)), m.group(2)
    if not words:
        return f"{n} {unit}"
    name = {"s": "second", "m": "minute", "h": "hour"}[unit]
    return f"{n} {name}" + ("s" if n != 1 else "")


PROSE: Mapping[str, str] = {
    "idle": _pct(definitions.IDLE_SM_ACTIVE_BELOW),
    "kernels_util": _pct(definitions.KERNELS_UTIL_AT_LEAST),
    "mean_window": _span(definitions.MEAN_WINDOW),
    "underused": _pct(definitions.UNDERUSED_ACTIVITY_BELOW),
    "underused_window": _span(definitions.UNDERUSED_WINDOW),
    "underused_window_words": _span(definitions.UNDERUSED_WINDOW, words=True),
    "launch_share": _pct(definitions.LAUNCH_BOUND_SHARE_ABOVE),
    "launch_window": _span(definitions.LAUNCH_BOUND_WINDOW),
    "probe_slow": _pct(definitions.PROBE_SLOW_EFFICIENCY_BELOW),
    "probe_slow_ratio": f"{definitions.PROBE_SLOW_EFFICIENCY_BELOW:g}",
    "probe_runs": str(definitions.PROBE_SLOW_RUNS),
    "probe_window": _span(definitions.PROBE_SLOW_WINDOW),
    "peers_wait": _pct(jobs.STRAGGLER_PEERS_WAIT_AT_LEAST),
    "straggler_gap": f"{jobs.STRAGGLER_GAP_AT_LEAST * 100:g} points",
    "input_gap": f"{jobs.INPUT_STALL_BUSY_GAP * 100:g} points",
    "communication_bound": _pct(jobs.COMMUNICATION_BOUND_AT_LEAST),
    "node": "{{ with $labels.node }}{{ . }}{{ else }}{{ $labels.instance }}{{ end }}",
    "holder": "{{ with $labels.pod }} held by {{ $labels.namespace }}/{{ . }}{{ end }}",
}
"""``<<name>>`` in a comment, summary or description is replaced by the figure the definitions
modules hold, so the prose follows a changed threshold; ``node`` names the alert's node (its
``node`` label, which the exporter puts on every series, else the scrape target), ``holder`` the
pod holding its GPU where the alert carries one."""


def seconds(duration: str) -> int:
    """A PromQL duration (``5m``, ``1h30m``) in seconds."""
    parts = re.findall(r"(\d+)([smhd])", duration)
    if not duration or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a PromQL duration in s, m, h, d: {duration!r}")
    return sum(int(n) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[u] for n, u in parts)


def words(total: int) -> str:
    """Seconds as an alert says them: ``35 minutes``, ``6 hours 10 minutes``, ``1 hour``."""
    out = []
    for name, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        n, total = divmod(total, size)
        if n:
            out.append(f"{n} {name}" + ("s" if n != 1 else ""))
    return " ".join(out) or "0 seconds"


def measured(rule: Alert) -> dict[str, str]:
    """What ``rule`` measures, in words, from its own ``window`` and ``for_``: ``<<window>>`` (the
    range its condition reads over), ``<<for>>`` (how long the condition must hold) and
    ``<<held>>`` (both: a 5 m mean held for 30 m is true of the last 35 minutes), and
    ``<<window_seconds>>``. A figure the rule lacks is not offered, so quoting it fails."""
    figures: dict[str, str] = {}
    window, for_ = seconds(rule.window) if rule.window else 0, seconds(rule.for_) if rule.for_ else 0
    if window:
        figures["window"] = words(window)
        figures["window_seconds"] = str(window)
    if for_:
        figures["for"] = words(for_)
    if window or for_:
        figures["held"] = words(window + for_)
    return figures


def prose(text: str, rule: Alert | None = None) -> str:
    """``text`` with every ``<<name>>`` of :data:`PROSE`, and of ``rule``'s :func:`measured`
    figures, filled in (an unknown name fails)."""
    figures = {**PROSE, **measured(rule)} if rule is not None else PROSE

    def fill(m: re.Match[str]) -> str:
        if m.group(1) not in figures:
            raise KeyError(f"scripts/gen_rules.py: no figure <<{m.group(1)}>> in PROSE{' or the rule' if rule else ''}")
        return figures[m.group(1)]

    return re.sub(r"<<(\w+)>>", fill, text)


# --- rendering ---------------------------------------------------------------------------------
def _comment(text: str, indent: int, rule: Alert | None = None) -> list[str]:
    pad = " " * indent
    lines = textwrap.dedent(prose(text, rule)).strip("\n").splitlines()
    return [f"{pad}# {line}".rstrip() if line else f"{pad}#" for line in lines]


def _is_plain(value: str) -> bool:
    """Whether ``value`` reads back unchanged as a plain (unquoted) YAML scalar."""
    import yaml

    try:
        return bool(yaml.safe_load(f"k: {value}") == {"k": value})
    except yaml.YAMLError:
        return False


def _quoted(value: str) -> str:
    """``value`` as a quoted YAML scalar: double quotes where it has none, else single quotes."""
    if '"' not in value and "\\" not in value:
        return f'"{value}"'
    if "'" not in value:
        return f"'{value}'"
    return json.dumps(value)  # a JSON string is a YAML double-quoted scalar


def _expr(rule: Record | Alert) -> list[str]:
    if rule.generated:
        body = layout(rule.expr, 10)
    else:
        expr = rule.expr
        if isinstance(rule, Alert):  # a declared alert writes its window as <<window>>
            figures = {"window": rule.window, "window_seconds": str(seconds(rule.window))} if rule.window else {}
            expr = re.sub(r"<<(\w+)>>", lambda m: figures[m.group(1)], expr)
        body = [" " * 10 + line if line else "" for line in textwrap.dedent(expr).strip("\n").splitlines()]
    if len(body) == 1 and _is_plain(body[0].strip()):
        return [f"        expr: {body[0].strip()}"]
    return ["        expr: |", *body]


def _rule(rule: Record | Alert) -> list[str]:
    lines = [""] if rule.blank_before else []
    if rule.comment:
        lines += _comment(rule.comment, 6, rule if isinstance(rule, Alert) else None)
    if isinstance(rule, Record):
        return [*lines, f"      - record: {rule.name}", *_expr(rule)]
    lines += [f"      - alert: {rule.name}", *_expr(rule)]
    if rule.for_:
        lines.append(f"        for: {rule.for_}")
    lines += ["        labels:", f"          severity: {rule.severity}"]
    lines += [f"          {key}: {value}" for key, value in rule.labels.items()]
    description = textwrap.dedent(prose(rule.description, rule)).strip("\n").splitlines()
    return [
        *lines,
        "        annotations:",
        f"          summary: {_quoted(prose(rule.summary, rule))}",
        "          description: >-",
        *("            " + line for line in description),
        f"          runbook_url: {RUNBOOKS}#{rule.name.lower()}",
    ]


def render(groups: tuple[Group, ...] = GROUPS) -> str:
    """The rules file's text."""
    _check_every_definition_placed(groups)
    lines = [*_comment(HEADER, 0), "groups:"]
    for n, group in enumerate(groups):
        if n:
            lines.append("")
        lines += [f"  - name: {group.name}", "    rules:"]
        for rule in group.rules:
            lines += _rule(rule)
    return "\n".join(lines) + "\n"


def _check_every_definition_placed(groups: tuple[Group, ...]) -> None:
    records = [r.name for g in groups for r in g.rules if isinstance(r, Record)]
    twice = sorted({r for r in records if records.count(r) > 1})
    missing = sorted(set(DEFINED) - set(records))
    if twice or missing:
        raise ValueError(f"scripts/gen_rules.py GROUPS: recorded twice {twice}, defined but not placed {missing}")
    for g in groups:  # a group keeps the order its module gives (each job rule reads rules above it)
        order = [r.name for r in g.rules if isinstance(r, Record) and r.name in jobs.RULES]
        if order and order != [r for r in jobs.RULES if r in order]:
            raise ValueError(f"group {g.name}: the job rules must keep dashboard/jobs.py's order")


def stale() -> list[Path]:
    """The output files that differ from what :func:`render` writes (missing ones included)."""
    text = render()
    return [p for p in OUTPUTS if not p.exists() or p.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        drifted = stale()
        for path in drifted:
            old = path.read_text().splitlines(keepends=True) if path.exists() else []
            rel = str(path.relative_to(REPO))
            sys.stdout.writelines(difflib.unified_diff(old, text.splitlines(keepends=True), rel, f"{rel} (generated)"))
            print(f"{rel} is stale: run {COMMAND}", file=sys.stderr)
        return 1 if drifted else 0
    for path in OUTPUTS:
        path.write_text(text)
    return _render_manifests()


def _render_manifests() -> int:
    """Re-render deploy/manifests/ (its PrometheusRule embeds the rules) with
    scripts/render_manifests.py, so that one command brings every copy of the rules up to date."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("render_manifests", REPO / "scripts" / "render_manifests.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(sys.modules[spec.name])
    return int(sys.modules[spec.name].main([]))


if __name__ == "__main__":
    sys.exit(main())
