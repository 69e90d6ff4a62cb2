"""The ``gpulens.serving`` recording rules, generated from :mod:`dashboard.serving.engines`
(``python scripts/gen_rules.py`` writes them into deploy/rules/gpulens.rules.yml; docs/serving.md).

Three layers, each reading only the raw series and the layers above it in :data:`RULES`' order:

- **Per pod** (labels ``cluster, namespace, pod, model, serving_engine, role, role_source``): every
  engine's series of one concept, its own model label renamed ``model``, summed (gauges of a pod's
  several engine series summed or averaged) and joined to ``gpulens:serving_pod:info`` for the role.
  Only series with ``namespace`` and ``pod`` take part: the others are counted per scrape job and
  engine in ``gpulens:serving_unjoinable_series:count``, never dropped silently. A pod whose engine
  is not scraped has no serving series at all (never a zero).
- **Per pod, GPU side** (labels ``cluster, namespace, pod``): the GPUs it holds and the power they
  draw, a MIG instance by its share of the GPU and a time-sliced GPU by the replicas held
  (``gpulens:leaf_gpu_share:ratio`` x ``gpulens:pod_gpu_holding:ratio``), and the ratios of the
  engine figures over them.
- **Per model** (labels ``cluster, namespace, model, role``): sums over the pods of a model and role
  (roles kept apart), ratios as a sum over a sum (never a mean of ratios), latency quantiles from the
  summed bucket rates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from dashboard.definitions import MEAN_WINDOW
from dashboard.serving import engines as e

WINDOW = MEAN_WINDOW
"""Rate and mean window of every serving rule (the other groups' 5 m)."""
QUANTILES: Mapping[str, float] = {"p50": 0.5, "p95": 0.95}
"""The latency quantiles recorded, by the name suffix."""

SCOPE = "cluster, namespace, pod"
"""The labels joining engine series to gpulens' pod series."""
POD = f"{SCOPE}, {e.MODEL_LABEL}, {e.ENGINE_LABEL}"
"""The labels of a per-pod engine figure before the role is joined."""
POD_ROLE = f"{POD}, {e.ROLE_LABEL}, {e.ROLE_SOURCE_LABEL}"
"""The labels of every per-pod ``gpulens:serving_*`` engine series."""
MODEL = f"cluster, namespace, {e.MODEL_LABEL}, {e.ROLE_LABEL}"
"""The labels of every per-model ``gpulens:serving_model_*`` series."""
JOINABLE: Mapping[str, str] = {"namespace": "!", "pod": "!"}
"""Matchers every engine selector carries: non-empty ``namespace`` and ``pod``."""

ENGINE_INFO = "gpulens:serving_pod_engine:info"
INFO = "gpulens:serving_pod:info"
GPUS = "gpulens:serving_pod_gpus:sum"
POWER = "gpulens:serving_pod_power:watts"
LINK_BYTES = "gpulens:serving_pod_link_bytes:rate5m"
LINK_CAPACITY = "gpulens:serving_pod_link_capacity:bytes_per_second"
LINKS = ("nvlink", "nic")
"""The links a serving pod's bytes are read on (its GPUs' NVLink, the RDMA NICs it holds alone)."""
UNJOINABLE = "gpulens:serving_unjoinable_series:count"


def record(concept: str, *, model: bool = False) -> str:
    """The recorded series of ``concept`` per pod (or per ``model``): counters ``:rate5m``, gauges
    ``:avg5m`` (running, queued) and ``:ratio_avg5m`` (KV cache), histograms' bucket rates."""
    scope = "serving_model_" if model else "serving_"
    if concept in e.COUNTERS:
        return f"gpulens:{scope}{concept}:rate5m"
    if concept in e.SUMMED_GAUGES:
        return f"gpulens:{scope}requests_{concept}:avg5m"
    if concept in e.MEAN_GAUGES:
        return f"gpulens:{scope}{concept}:ratio_avg5m"
    if concept in e.HISTOGRAMS:
        return f"gpulens:{scope}{concept}_seconds_bucket:rate5m"
    raise ValueError(f"unknown serving concept {concept!r}")


def quantile_record(concept: str, suffix: str, *, model: bool = False) -> str:
    """The recorded ``suffix`` quantile (``p50``, ``p95``) of histogram ``concept`` in seconds."""
    scope = "serving_model_" if model else "serving_"
    return f"gpulens:{scope}{concept}_seconds:{suffix}_{WINDOW}"


def _alternatives(engine: e.Engine, src: e.Source, inner: Callable[[str], str]) -> str:
    """``inner`` of each of ``src``'s names, the first preferred (``or``)."""
    parts = [inner(n) for n in src.names]
    return parts[0] if len(parts) == 1 else " or ".join(f"({p})" for p in parts)


def _model_and_engine(expr: str, engine: e.Engine) -> str:
    """``expr`` with the engine's model label copied into ``model`` and ``serving_engine`` set."""
    for label in engine.model_labels:
        if label != e.MODEL_LABEL:
            expr = f'label_replace({expr}, "{e.MODEL_LABEL}", "$1", "{label}", "(.+)")'
    return f'label_replace({expr}, "{e.ENGINE_LABEL}", "{engine.name}", "", "")'


def _raw_by(engine: e.Engine, extra: str = "") -> str:
    """The ``by`` labels of a first aggregation of raw engine series (the engine's model labels kept)."""
    labels = [SCOPE, *(x for x in engine.model_labels if x != "cluster"), *([extra] if extra else [])]
    return ", ".join(labels)


def engine_figure(engine: e.Engine, concept: str) -> str | None:
    """``concept`` of ``engine`` per pod, labels :data:`POD` (plus ``le`` for a histogram), or None
    where the engine does not expose it."""
    src = engine.source(concept)
    if src is None:
        return None
    w = WINDOW
    if concept in e.COUNTERS:

        def inner(n: str) -> str:
            sel = src.selector(n, JOINABLE)
            return f"sum by ({_raw_by(engine)}) (rate({sel}[{w}]) and {sel})"

        by = POD
    elif concept in e.SUMMED_GAUGES or concept in e.MEAN_GAUGES:
        agg = "sum" if concept in e.SUMMED_GAUGES else "avg"

        def inner(n: str) -> str:
            sel = src.selector(n, JOINABLE)
            return f"{agg} by ({_raw_by(engine)}) (avg_over_time({sel}[{w}]) and {sel})"

        by = POD
    else:

        def inner(n: str) -> str:
            sel = src.selector(f"{n}_bucket", JOINABLE)
            return f"sum by ({_raw_by(engine, 'le')}) (rate({sel}[{w}]) and {sel})"

        by = f"{POD}, le"
    outer = "sum" if concept not in e.MEAN_GAUGES else "avg"
    return f"{outer} by ({by}) ({_model_and_engine(_alternatives(engine, src, inner), engine)})"


def kv_max_figure(engine: e.Engine) -> str | None:
    """The KV-cache use's peak over the window per pod (the highest of a pod's engine series)."""
    src = engine.kv_cache_usage
    if src is None:
        return None

    def inner(n: str) -> str:
        sel = src.selector(n, JOINABLE)
        return f"max by ({_raw_by(engine)}) (max_over_time({sel}[{WINDOW}]) and {sel})"

    return f"max by ({POD}) ({_model_and_engine(_alternatives(engine, src, inner), engine)})"


def _with_role(figures: list[str]) -> str:
    """The union of the engines' per-pod ``figures`` with the role and its source of the pod's info."""
    union = " or ".join(f"({f})" for f in figures)
    return f"({union}) * on ({POD}) group_left ({e.ROLE_LABEL}, {e.ROLE_SOURCE_LABEL}) {INFO}"


def pod_concept_promql(concept: str) -> str:
    """``record(concept)``: every engine's ``concept`` per pod, with the pod's role."""
    return _with_role([f for engine in e.ENGINES if (f := engine_figure(engine, concept)) is not None])


def pod_kv_max_promql() -> str:
    """``gpulens:serving_kv_cache_usage:ratio_max5m``."""
    return _with_role([f for engine in e.ENGINES if (f := kv_max_figure(engine)) is not None])


def normalise_role(expr: str) -> str:
    """``expr`` with its ``role`` label's values written as :data:`engines.ROLE_ALIASES` says
    (case-insensitively); other values kept."""
    for role, aliases in e.ROLE_ALIASES.items():
        alternatives = "|".join(aliases)
        expr = f'label_replace({expr}, "{e.ROLE_LABEL}", "{role}", "{e.ROLE_LABEL}", "(?i)(?:{alternatives})")'
    return expr


def _presence(engine: e.Engine) -> str:
    """One series per (pod, model) running ``engine``, labels :data:`POD` plus ``role``: as the pod's
    labels declare it, normalised (:func:`normalise_role`), or the engine's fixed role.

    Every label_replace applies to the union of the first aggregations, none outside the last
    ``group``: VictoriaMetrics (v1.1xx) writes a wrong value into a label that a label_replace
    outside an aggregation does not match, when another label_replace ran inside it
    (tests/test_rules_victoriametrics.py compares every rule on both stores)."""
    parts = [
        f"group by ({_raw_by(engine, e.ROLE_LABEL)}) ({src.selector(name, JOINABLE)})"
        for src, name in engine.presence()
    ]
    labelled = _model_and_engine(" or ".join(parts), engine)
    if engine.role:
        labelled = _source(f'label_replace({labelled}, "{e.ROLE_LABEL}", "{engine.role}", "", "")', "engine")
        return f"group by ({POD}, {e.ROLE_LABEL}, {e.ROLE_SOURCE_LABEL}) ({labelled})"
    return f"group by ({POD}, {e.ROLE_LABEL}) ({normalise_role(labelled)})"


def engine_info_promql() -> str:
    """``gpulens:serving_pod_engine:info``: one series (value 1) per pod, model and engine serving,
    labels :data:`POD` and ``role`` as the pod's labels declare it, normalised (empty where they
    declare none); a component of a fixed role has it, with ``role_source="engine"``."""
    return " or ".join(f"({_presence(engine)})" for engine in e.ENGINES)


def inferred_role_promql() -> str:
    """Per pod (labels :data:`SCOPE` and ``role``, value 1): the role its GPU classes suggest over
    ``engines.ROLE_INFERENCE_WINDOW``: ``prefill`` where its mean ``compute`` share exceeds its
    ``memory`` share, ``decode`` where ``memory`` exceeds ``compute``, ``both`` where they are equal
    (neither, or idle); absent for a pod whose GPUs have no class."""
    w = e.ROLE_INFERENCE_WINDOW

    def share(cls: str) -> str:
        return f'avg by ({SCOPE}) (avg_over_time(gpulens_pod_gpu_boundness{{class="{cls}"}}[{w}]))'

    c, m = share("compute"), share("memory")
    cases = (("prefill", f"{c} > on ({SCOPE}) {m}"), ("decode", f"{m} > on ({SCOPE}) {c}"),
             ("both", f"{c} == on ({SCOPE}) {m}"))  # fmt: skip
    return " or ".join(
        f'group by ({SCOPE}, {e.ROLE_LABEL}) (label_replace({cond}, "{e.ROLE_LABEL}", "{role}", "", ""))'
        for role, cond in cases
    )


def _source(expr: str, source: str) -> str:
    return f'label_replace({expr}, "{e.ROLE_SOURCE_LABEL}", "{source}", "", "")'


def info_promql() -> str:
    """``gpulens:serving_pod:info``: one series (value 1) per pod, model and engine serving, labels
    :data:`POD_ROLE`: the role the pod's labels declare (``role_source="declared"``), the engine's
    fixed role (``engine``), else the inferred one (:func:`inferred_role_promql`, ``inferred``), else
    ``role`` empty and ``role_source="unknown"``."""
    pods = f'{ENGINE_INFO}{{{e.ROLE_LABEL}=""}}'
    declared = _source(f'{ENGINE_INFO}{{{e.ROLE_LABEL}!="", {e.ROLE_SOURCE_LABEL}=""}}', "declared")
    fixed = f'{ENGINE_INFO}{{{e.ROLE_SOURCE_LABEL}="engine"}}'
    infer = inferred_role_promql()
    inferred = _source(f"{pods} * on ({SCOPE}) group_left ({e.ROLE_LABEL}) ({infer})", "inferred")
    unknown = _source(f"{pods} unless on ({SCOPE}) ({infer})", "unknown")
    return " or ".join((declared, fixed, inferred, unknown))


def _serving(expr: str) -> str:
    """``expr`` (per pod, labels :data:`SCOPE`) kept for serving pods only."""
    return f"({expr}) and on ({SCOPE}) {INFO}"


_HELD = (
    "gpulens:pod_gpu_holding:ratio * on (uuid, mig_uuid) group_left ()"
    " max by (uuid, mig_uuid) (gpulens:leaf_gpu_share:ratio)"
)
"""Per allocated container and leaf: the GPU-equivalents it holds (its share of the leaf times the
leaf's share of its GPU)."""


def pod_gpus_promql() -> str:
    """``gpulens:serving_pod_gpus:sum``: GPU-equivalents each serving pod holds (a 3g MIG instance of
    an H200 3/7, one of four time-slicing replicas 1/4)."""
    return _serving(f"sum by ({SCOPE}) ({_HELD})")


def pod_power_promql() -> str:
    """``gpulens:serving_pod_power:watts``: the mean power (W, J/s) over the window of the GPUs each
    serving pod holds, each GPU's energy counter shared as :func:`pod_gpus_promql` weighs it."""
    energy = "gpulens_gpu_energy_joules_total"
    watts = f"max by (uuid) (rate({energy}[{WINDOW}]) and {energy})"
    return _serving(f"sum by ({SCOPE}) ({_HELD} * on (uuid) group_left () {watts})")


def _labelled(expr: str, **labels: str) -> str:
    for name, value in labels.items():
        expr = f'label_replace({expr}, "{name}", "{value}", "", "")'
    return expr


def pod_link_bytes_promql() -> str:
    """``gpulens:serving_pod_link_bytes:rate5m``: bytes per second each serving pod's links moved over
    the window, per ``link`` and ``direction`` (tx, rx): ``nic`` is ``gpulens:pod_nic_bytes:rate5m``
    (the NICs it holds alone), ``nvlink`` the NVLink counters of the leaves it holds, each leaf's
    shared by the pod's replicas held (``gpulens:pod_gpu_holding:ratio``; a MIG instance's counter is
    its own). Between the prefill and decode pods of a disaggregated deployment this is mostly the
    KV cache handed on; tensor-parallel collectives of one pod move over NVLink too."""
    nic = _labelled("gpulens:pod_nic_bytes:rate5m", link="nic")
    parts = [nic]
    for direction in ("tx", "rx"):
        counter = f"gpulens_gpu_nvlink_{direction}_bytes_total"
        rate = f"max by (uuid, mig_uuid) (rate({counter}[{WINDOW}]) and {counter})"
        held = f"sum by ({SCOPE}) (gpulens:pod_gpu_holding:ratio * on (uuid, mig_uuid) group_left () {rate})"
        parts.append(_labelled(held, link="nvlink", direction=direction))
    return _serving(" or ".join(parts))


def pod_link_capacity_promql() -> str:
    """``gpulens:serving_pod_link_capacity:bytes_per_second``: what each serving pod's links carry
    each way at most (bytes/s), per ``link``: ``nvlink``, its leaves' active NVLink capacity
    (``gpulens_gpu_nvlink_capacity_bytes_per_second``) shared as :func:`pod_link_bytes_promql` shares
    their bytes; ``nic``, the line rate of the NICs it holds alone, every port."""
    capacity = "gpulens_gpu_nvlink_capacity_bytes_per_second"
    nvlink = (
        f"sum by ({SCOPE}) (gpulens:pod_gpu_holding:ratio * on (uuid, mig_uuid) group_left () "
        f"max by (uuid, mig_uuid) ({capacity}))"
    )
    alone = (
        'max by (cluster, instance, device, namespace, pod) (gpulens_pod_nic_allocation{device!=""})'
        " and on (cluster, instance, device) (gpulens_nic_pods == 1)"
    )
    rate = "sum by (cluster, instance, device) (gpulens_nic_port_rate_bytes_per_second)"
    nic = f"sum by ({SCOPE}) (({alone}) * on (cluster, instance, device) group_left () {rate})"
    return _serving(f"{_labelled(nvlink, link='nvlink')} or {_labelled(nic, link='nic')}")


def model_link_utilization_record(link: str) -> str:
    """The per-model record of ``link``'s busier direction over its capacity."""
    return f"gpulens:serving_model_{link}_utilization:ratio"


def model_link_utilization_promql(link: str) -> str:
    """0..1 per model and role: the busier direction of ``link`` (its pods' bytes/s in that direction
    summed) over the same pods' capacity each way summed: the KV transfer's share of the links."""

    def summed(rule: str, direction: str = "") -> str:
        matchers = f'link="{link}"' + (f', direction="{direction}"' if direction else "")
        return f"sum by ({MODEL}) ({INFO} * on ({SCOPE}) group_left () {rule}{{{matchers}}})"

    cap = f"({summed(LINK_CAPACITY)} > 0)"
    tx, rx = (f"({summed(LINK_BYTES, d)} / {cap})" for d in ("tx", "rx"))
    return f"clamp_max(({tx} >= {rx}) or {rx} or {tx}, 1)"


def model_link_bytes_record(link: str) -> str:
    """The per-model record of ``link``'s bytes (both directions)."""
    return f"gpulens:serving_model_{link}_bytes:rate5m"


def model_link_bytes_promql(link: str) -> str:
    """Bytes per second (sent plus received) the ``link`` of a model's pods moved, per role: a
    prefill role's KV cache sent, a decode role's received."""
    return f'sum by ({MODEL}) ({INFO} * on ({SCOPE}) group_left () sum by ({SCOPE}) ({LINK_BYTES}{{link="{link}"}}))'


def per_gpu_second_promql(concept: str) -> str:
    """Tokens per GPU-second per pod: ``concept``'s rate over the GPU-equivalents the pod holds."""
    return f"{record(concept)} / on ({SCOPE}) group_left () ({GPUS} > 0)"


def joules_per_token_promql() -> str:
    """Joules per output token per pod: the pod's GPU power (J/s) over its output tokens/s."""
    return f"{POWER} / on ({SCOPE}) group_right () ({record('output_tokens')} > 0)"


def quantile_promql(concept: str, q: float, *, model: bool = False) -> str:
    """The ``q`` quantile (seconds) of ``concept`` per pod or per model, from the summed bucket
    rates; absent (not NaN) where no request finished in the window."""
    by = f"{MODEL}, le" if model else f"{POD_ROLE}, le"
    return f"histogram_quantile({q!r}, sum by ({by}) ({record(concept)})) >= 0"


def model_gpus_promql() -> str:
    """``gpulens:serving_model_gpus:sum``: GPU-equivalents the pods of a model and role hold."""
    return f"sum by ({MODEL}) ({INFO} * on ({SCOPE}) group_left () {GPUS})"


def model_per_gpu_second_promql(concept: str) -> str:
    """A model's tokens per GPU-second: its pods' tokens/s summed over the GPU-equivalents of the same
    pods (those with both figures)."""
    rate = record(concept)
    num = f"sum by ({MODEL}) ({rate} and on ({SCOPE}) ({GPUS} > 0))"
    den = f"sum by ({MODEL}) ({rate} * 0 + on ({SCOPE}) group_left () {GPUS})"
    return f"{num} / ({den} > 0)"


def model_joules_per_token_promql() -> str:
    """A model's joules per output token: its pods' GPU power summed over their output tokens/s
    summed (the same pods)."""
    rate = record("output_tokens")
    num = f"sum by ({MODEL}) ({rate} * 0 + on ({SCOPE}) group_left () {POWER})"
    den = f"sum by ({MODEL}) ({rate} and on ({SCOPE}) {POWER})"
    return f"{num} / ({den} > 0)"


def unjoinable_promql() -> str:
    """``gpulens:serving_unjoinable_series:count``: engine series without ``namespace`` or ``pod``
    (a scrape that did not copy them), per scrape job and engine: they cannot be joined to any GPU."""
    parts = []
    for engine in e.ENGINES:
        # ``or`` matches label sets without the metric name: each metric's series keep it in a label
        # of their own, so that two metrics' series of equal labels both count
        sels = [
            f"label_replace({src.selector(name, {'namespace': ''})} or {src.selector(name, {'pod': ''})}, "
            f'"metric", "$1", "__name__", "(.+)")'
            for src, name in engine.presence()
        ]
        union = " or ".join(sels)
        named = f'label_replace({union}, "{e.ENGINE_LABEL}", "{engine.name}", "", "")'
        parts.append(f"count by (cluster, job, {e.ENGINE_LABEL}) ({named})")
    return " or ".join(parts)


def _rules() -> dict[str, str]:
    out: dict[str, str] = {
        UNJOINABLE: unjoinable_promql(),
        ENGINE_INFO: engine_info_promql(),
        INFO: info_promql(),
    }
    for concept in e.CONCEPTS:
        out[record(concept)] = pod_concept_promql(concept)
        if concept in e.MEAN_GAUGES:
            out["gpulens:serving_kv_cache_usage:ratio_max5m"] = pod_kv_max_promql()
    for concept in e.HISTOGRAMS:
        for suffix, q in QUANTILES.items():
            out[quantile_record(concept, suffix)] = quantile_promql(concept, q)
    out[GPUS] = pod_gpus_promql()
    out[POWER] = pod_power_promql()
    out["gpulens:serving_output_tokens_per_gpu_second:ratio"] = per_gpu_second_promql("output_tokens")
    out["gpulens:serving_input_tokens_per_gpu_second:ratio"] = per_gpu_second_promql("input_tokens")
    out["gpulens:serving_joules_per_output_token:ratio"] = joules_per_token_promql()
    out[LINK_BYTES] = pod_link_bytes_promql()
    out[LINK_CAPACITY] = pod_link_capacity_promql()
    # per model and role
    out["gpulens:serving_model_pods:count"] = f"count by ({MODEL}) ({INFO})"
    out["gpulens:serving_model_gpus:sum"] = model_gpus_promql()
    for concept in (*e.COUNTERS, *e.SUMMED_GAUGES):
        out[record(concept, model=True)] = f"sum by ({MODEL}) ({record(concept)})"
    out[record("kv_cache_usage", model=True)] = f"avg by ({MODEL}) ({record('kv_cache_usage')})"
    out["gpulens:serving_model_kv_cache_usage:ratio_max5m"] = (
        f"max by ({MODEL}) (gpulens:serving_kv_cache_usage:ratio_max5m)"
    )
    out["gpulens:serving_model_output_tokens_per_gpu_second:ratio"] = model_per_gpu_second_promql("output_tokens")
    out["gpulens:serving_model_input_tokens_per_gpu_second:ratio"] = model_per_gpu_second_promql("input_tokens")
    out["gpulens:serving_model_joules_per_output_token:ratio"] = model_joules_per_token_promql()
    for link in LINKS:
        out[model_link_bytes_record(link)] = model_link_bytes_promql(link)
        out[model_link_utilization_record(link)] = model_link_utilization_promql(link)
    for concept in e.HISTOGRAMS:
        for suffix, q in QUANTILES.items():
            out[quantile_record(concept, suffix, model=True)] = quantile_promql(concept, q, model=True)
    return out


RULES: Mapping[str, str] = _rules()
"""Recording rule name -> expression, in the group's order (each reads only raw series, the other
groups' records and records above it)."""
