"""The one declared mapping from each inference engine's Prometheus metrics to serving concepts, and
the roles of serving pods (docs/serving.md cites the engine versions each name was checked against).

**Concepts** (:data:`CONCEPTS`), with the unit the rules give them:

- ``input_tokens``, ``output_tokens``: counters of prompt (prefill) and generated tokens; rates in
  tokens per second.
- ``requests``: a counter of requests finished; rates in requests per second.
- ``running``, ``queued``: gauges of the requests being served and waiting; a pod's several engine
  series (vLLM's data-parallel ``engine`` label, SGLang's ranks) are summed.
- ``kv_cache_usage``: a gauge, the fraction (0..1) of the KV cache in use; a pod's several engine
  series are averaged.
- ``ttft``, ``itl``: histograms (Prometheus classic: ``_bucket`` with ``le``, ``_sum``, ``_count``)
  of the time to first token and the inter-token latency, in seconds.

A :class:`Source` names what the engine exposes for one concept: the sample names as they appear on
``/metrics`` (a Prometheus client appends ``_total`` to a counter: vLLM declares ``vllm:prompt_tokens``
and exposes ``vllm:prompt_tokens_total``), the first preferred where an engine version exposes
several (vLLM 0.10 exposes both ``vllm:kv_cache_usage_perc`` and the deprecated
``vllm:gpu_cache_usage_perc``); for a histogram its base name (the rules add ``_bucket``). A counter
may be a histogram's ``_sum`` or ``_count`` (TGI counts tokens only in its length histograms).
``matchers`` select the series of a labelled family (Triton's ``request_type="waiting"``).

An :class:`Engine` gives its sources, the label naming the model (``model_name`` for vLLM, SGLang and
TensorRT-LLM; ``model`` for Triton and Dynamo's frontend; TGI has none) and, for a component whose
role is fixed (Dynamo's frontend), that role. Adding an engine is one entry of :data:`ENGINES`; the
``gpulens.serving`` rules (:mod:`dashboard.serving.rules`) are generated from this table.

**Role** of a serving pod (:data:`ROLES`): ``prefill``, ``decode``, or ``both`` (aggregated serving).
It comes from what the deployment says, copied by the scrape into the series' ``role`` label
(:data:`ROLE_LABEL`) from the pod's labels (:data:`ROLE_POD_LABELS`, later ones win: Dynamo's
component types, llm-d's role, then the label the user names, ``gpulens.io/serving-role`` unless the
chart says otherwise; vLLM's KV-transfer role is a server flag, not a label: put it in that one). The
rules normalise the values (:data:`ROLE_ALIASES`: vLLM's ``kv_producer`` is ``prefill``). Where no
role is given it is inferred from the pod's GPU classes over ``ROLE_INFERENCE_WINDOW``: mostly
``compute`` → ``prefill``, mostly ``memory`` → ``decode``, neither → ``both``, and the series say so
(``role_source="inferred"``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

COUNTERS: tuple[str, ...] = ("input_tokens", "output_tokens", "requests")
"""Concepts read as counters (rates per second)."""
SUMMED_GAUGES: tuple[str, ...] = ("running", "queued")
"""Gauges summed over a pod's engine series."""
MEAN_GAUGES: tuple[str, ...] = ("kv_cache_usage",)
"""Gauges averaged over a pod's engine series (fractions 0..1)."""
HISTOGRAMS: tuple[str, ...] = ("ttft", "itl")
"""Latency histograms in seconds (base names; the series are ``<name>_bucket`` with ``le``)."""
CONCEPTS: tuple[str, ...] = (*COUNTERS, *SUMMED_GAUGES, *MEAN_GAUGES, *HISTOGRAMS)
"""Every serving concept, in the order of :class:`Engine`'s fields."""

ROLE_LABEL = "role"
"""The label carrying a serving pod's role, on the engine series (copied by the scrape from the
pod's labels) and on every ``gpulens:serving_*`` series."""
ROLE_SOURCE_LABEL = "role_source"
"""How the role was known: ``declared`` (a pod label), ``engine`` (the component's fixed role),
``inferred`` (the GPU classes) or ``unknown`` (no role label and no class to infer from)."""
ENGINE_LABEL = "serving_engine"
"""The engine's :attr:`Engine.name` on every ``gpulens:serving_*`` per-pod series (not ``engine``:
vLLM uses that label for its data-parallel engine index)."""
MODEL_LABEL = "model"
"""The model name on every ``gpulens:serving_*`` series, taken from the engine's own label."""

ROLES: tuple[str, ...] = ("prefill", "decode", "both")
"""The serving roles: a prefill pod computes prompts and hands the KV cache on, a decode pod
generates tokens, ``both`` does the two (aggregated serving)."""
FRONTEND_ROLE = "frontend"
"""The role of a component that routes requests and holds no GPU (Dynamo's frontend)."""

ROLE_ALIASES: Mapping[str, tuple[str, ...]] = {
    "prefill": ("prefill", "kv_producer", "producer", "context", "prefill-worker"),
    "decode": ("decode", "kv_consumer", "consumer", "generation", "decode-worker"),
    "both": ("both", "kv_both", "prefill-decode", "aggregated", "worker", "backend"),
    FRONTEND_ROLE: ("frontend",),
}
"""Role label values, as deployments write them (compared case-insensitively), by the role they
mean: vLLM's ``--kv-transfer-config`` ``kv_role`` (``kv_producer``, ``kv_consumer``, ``kv_both``),
Dynamo's ``nvidia.com/dynamo-sub-component-type`` (``prefill``, ``decode``) and
``nvidia.com/dynamo-component-type`` (``frontend``, ``worker``: a worker with no sub-component type
serves both), llm-d's ``llm-d.ai/role`` (``prefill``, ``decode``, ``both``). Other values are kept
as given."""

DYNAMO_COMPONENT_TYPE = "nvidia.com/dynamo-component-type"
DYNAMO_SUB_COMPONENT_TYPE = "nvidia.com/dynamo-sub-component-type"
LLM_D_ROLE = "llm-d.ai/role"
USER_ROLE_LABEL = "gpulens.io/serving-role"
"""The pod label a user sets to name a pod's role (the chart's ``servingMonitor.roleLabel``)."""

ROLE_POD_LABELS: tuple[str, ...] = (DYNAMO_COMPONENT_TYPE, DYNAMO_SUB_COMPONENT_TYPE, LLM_D_ROLE, USER_ROLE_LABEL)
"""Pod labels the scrape copies into :data:`ROLE_LABEL`, in order: a later one present wins (Dynamo's
sub-component type is more precise than its component type; the user's label overrides all)."""

ROLE_INFERENCE_WINDOW = "30m"
"""Window over which a pod's GPU classes decide an inferred role."""


def meta_label(pod_label: str) -> str:
    """The Prometheus service-discovery label of a pod label (``__meta_kubernetes_pod_label_<name>``,
    every character outside ``[a-zA-Z0-9_]`` replaced by ``_``)."""
    return "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() or c == "_" else "_" for c in pod_label)


@dataclass(frozen=True)
class Source:
    """What an engine exposes for one concept (module docstring)."""

    names: tuple[str, ...]
    """Sample names on ``/metrics``, preferred first; a histogram's base name."""
    matchers: tuple[tuple[str, str], ...] = ()
    """Label equality matchers selecting the concept's series of a labelled family."""
    note: str = ""
    """What differs from the concept (docs/serving.md quotes it)."""

    def __post_init__(self) -> None:
        if not self.names:
            raise ValueError("a Source needs at least one metric name")

    def selector(self, name: str, extra: Mapping[str, str] | None = None) -> str:
        """``name{matchers, extra}``: the PromQL selector of sample ``name`` (one of :attr:`names`, or
        a histogram's ``_bucket``), with ``extra`` matchers (a value starting ``!`` means ``!=``)."""
        parts = [f'{k}="{v}"' for k, v in self.matchers]
        for k, v in (extra or {}).items():
            parts.append(f'{k}!="{v[1:]}"' if v.startswith("!") else f'{k}="{v}"')
        inner = ", ".join(parts)
        # a name with a colon is a valid metric name; PromQL accepts it bare
        return f"{name}{{{inner}}}" if inner else name


@dataclass(frozen=True)
class Engine:
    """One inference engine's (or component's) metrics (module docstring)."""

    name: str
    """The ``serving_engine`` label value (lower case, stable)."""
    title: str
    versions: str
    """The versions whose names this entry was checked against (docs/serving.md)."""
    model_labels: tuple[str, ...]
    """Labels naming the model, later ones winning where a series has several; empty: none (the
    series' ``model`` is then empty)."""
    input_tokens: Source | None = None
    output_tokens: Source | None = None
    requests: Source | None = None
    running: Source | None = None
    queued: Source | None = None
    kv_cache_usage: Source | None = None
    ttft: Source | None = None
    itl: Source | None = None
    role: str = ""
    """A fixed role (:data:`FRONTEND_ROLE` for Dynamo's frontend); empty: from the pod's labels."""
    extra: Mapping[str, str] = field(default_factory=dict)
    """Further facts for docs/serving.md (label -> meaning)."""

    def source(self, concept: str) -> Source | None:
        """This engine's source of ``concept`` (one of :data:`CONCEPTS`), or None."""
        if concept not in CONCEPTS:
            raise ValueError(f"unknown serving concept {concept!r}; valid: {', '.join(CONCEPTS)}")
        value = getattr(self, concept)
        return value if isinstance(value, Source) else None

    def sources(self) -> dict[str, Source]:
        """Concept -> source, for the concepts this engine exposes."""
        return {c: s for c in CONCEPTS if (s := self.source(c)) is not None}

    def presence(self) -> list[tuple[Source, str]]:
        """(source, sample name) of the series that show a pod runs this engine: its counters' names
        (every version's), or where it has none its gauges' (each engine has one at least:
        :func:`_check`). Few, so that the rules reading them stay short (VictoriaMetrics refuses a
        query over 16 KiB by default)."""
        for kinds in (COUNTERS, (*SUMMED_GAUGES, *MEAN_GAUGES)):
            found = [(src, n) for c, src in self.sources().items() if c in kinds for n in src.names]
            if found:
                return found
        return []


VLLM = Engine(
    name="vllm",
    title="vLLM",
    versions="v1 engine 0.8 to 0.11 (vllm/v1/metrics/loggers.py); the V0 names of 0.6 to 0.9",
    model_labels=("model_name",),
    input_tokens=Source(("vllm:prompt_tokens_total",)),
    output_tokens=Source(("vllm:generation_tokens_total",)),
    requests=Source(("vllm:request_success_total",), note="one series per finished_reason, summed"),
    running=Source(("vllm:num_requests_running",)),
    queued=Source(("vllm:num_requests_waiting",)),
    kv_cache_usage=Source(
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        note="a fraction 0..1 despite the name; gpu_cache_usage_perc is the pre-0.10 name",
    ),
    ttft=Source(("vllm:time_to_first_token_seconds",)),
    itl=Source(
        ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        note="time_per_output_token_seconds is the older name of the same histogram",
    ),
    extra={"engine": "the data-parallel engine index (summed or averaged per pod)"},
)

SGLANG = Engine(
    name="sglang",
    title="SGLang",
    versions="0.4 to 0.5 (python/sglang/srt/metrics/collector.py); model label `name` before 0.4",
    model_labels=("name", "model_name"),
    input_tokens=Source(("sglang:prompt_tokens_total",)),
    output_tokens=Source(("sglang:generation_tokens_total",)),
    requests=Source(("sglang:num_requests_total",)),
    running=Source(("sglang:num_running_reqs",)),
    queued=Source(("sglang:num_queue_reqs",)),
    kv_cache_usage=Source(("sglang:token_usage",), note="KV pool tokens in use over its size, 0..1"),
    ttft=Source(("sglang:time_to_first_token_seconds",)),
    itl=Source(
        ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        note="older releases expose only time_per_output_token_seconds",
    ),
    extra={"tp_rank, dp_rank, pp_rank": "the rank labels of newer releases (summed or averaged per pod)"},
)

TGI = Engine(
    name="tgi",
    title="Text Generation Inference",
    versions="2.x and 3.x (router/src/server.rs, docs/source/reference/metrics.md)",
    model_labels=("model_name",),
    input_tokens=Source(("tgi_request_input_length_sum",), note="the input length histogram's sum"),
    output_tokens=Source(("tgi_request_generated_tokens_sum",), note="the generated tokens histogram's sum"),
    requests=Source(("tgi_request_success",), note="a counter without the _total suffix (Rust metrics crate)"),
    running=Source(("tgi_batch_current_size",)),
    queued=Source(("tgi_queue_size",)),
    itl=Source(
        ("tgi_request_mean_time_per_token_duration",),
        note="each request's mean time per output token, not every token's interval",
    ),
    extra={"(none)": "TGI names no model: copy one into model_name at the scrape (docs/serving.md)"},
)

TRITON_TRTLLM = Engine(
    name="triton-trtllm",
    title="TensorRT-LLM on Triton",
    versions="Triton 24.x/25.x with tensorrtllm_backend 0.12 to 0.20 (inflight_batcher_llm custom metrics)",
    model_labels=("model",),
    input_tokens=Source(
        ("nv_llm_input_token_len_sum",),
        (("response_metric_type", "total_input_tokens"),),
        note="the input token length histogram's sum",
    ),
    output_tokens=Source(
        ("nv_llm_output_token_len_sum",),
        (("response_metric_type", "total_output_tokens"),),
        note="the output token length histogram's sum",
    ),
    requests=Source(
        ("nv_llm_input_token_len_count",),
        (("response_metric_type", "total_input_tokens"),),
        note="one observation per request (nv_inference_request_success would count each model of an ensemble)",
    ),
    running=Source(("nv_trt_llm_request_metrics",), (("request_type", "scheduled"),)),
    queued=Source(("nv_trt_llm_request_metrics",), (("request_type", "waiting"),)),
    kv_cache_usage=Source(("nv_trt_llm_kv_cache_block_metrics",), (("kv_cache_block_type", "fraction"),)),
    extra={
        "model": "the Triton model (tensorrt_llm), not the checkpoint",
        "(no TTFT/ITL)": (
            "nv_inference_first_response_histogram_ms has `le` in milliseconds, which PromQL cannot rescale"
        ),
    },
)

TRTLLM_DYNAMO = Engine(
    name="trtllm",
    title="TensorRT-LLM worker (Dynamo)",
    versions="TensorRT-LLM 1.1 through Dynamo 0.7 to 1.x (trtllm: prefix before 0.8, trtllm_ after)",
    model_labels=("model_name",),
    requests=Source(("trtllm_request_success_total", "trtllm:request_success_total")),
    ttft=Source(("trtllm_time_to_first_token_seconds", "trtllm:time_to_first_token_seconds")),
    itl=Source(
        ("trtllm_time_per_output_token_seconds", "trtllm:time_per_output_token_seconds"),
        note="time per output token (TensorRT-LLM publishes no inter-token histogram)",
    ),
)

DYNAMO_FRONTEND = Engine(
    name="dynamo-frontend",
    title="NVIDIA Dynamo frontend",
    versions="Dynamo 0.4 to 1.x (metrics catalog: dynamo_frontend_*)",
    model_labels=("model",),
    input_tokens=Source(("dynamo_frontend_input_sequence_tokens_sum",), note="the input length histogram's sum"),
    output_tokens=Source(("dynamo_frontend_output_tokens_total",)),
    requests=Source(("dynamo_frontend_requests_total",), (("status", "success"),)),
    running=Source(("dynamo_frontend_inflight_requests",)),
    queued=Source(("dynamo_frontend_queued_requests",)),
    ttft=Source(("dynamo_frontend_time_to_first_token_seconds",)),
    itl=Source(("dynamo_frontend_inter_token_latency_seconds",)),
    role=FRONTEND_ROLE,
    extra={"(workers)": "Dynamo's vLLM, SGLang and TensorRT-LLM workers expose their engine's metrics (rows above)"},
)

ENGINES: tuple[Engine, ...] = (VLLM, SGLANG, TGI, TRITON_TRTLLM, TRTLLM_DYNAMO, DYNAMO_FRONTEND)
"""Every engine the serving rules read, in a stable order (the rules' ``or`` prefers earlier ones
where one pod's series match two, which no real engine does)."""

BY_NAME: Mapping[str, Engine] = {e.name: e for e in ENGINES}
"""Engine by its ``serving_engine`` name."""

RULE_LABELS: frozenset[str] = frozenset(
    {ENGINE_LABEL, MODEL_LABEL, ROLE_LABEL, ROLE_SOURCE_LABEL, "le", "metric"}
    | {label for engine in ENGINES for label in engine.model_labels}
)
"""Labels the serving rules group by or join on besides the scrape's (namespace, pod, cluster, job):
their own, the histograms' ``le``, ``metric`` (a metric's name kept as a label where series of
several metrics are counted) and the engines' model labels."""


def _check(engines: tuple[Engine, ...]) -> None:
    """Fail at import on a table that would generate wrong rules: a duplicate engine or name."""
    names = [e.name for e in engines]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate engine names: {names}")
    seen: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
    for e in engines:
        if not e.presence():
            raise ValueError(f"{e.name}: no counter or gauge shows that a pod runs it")
        if e.role and e.role not in (*ROLES, FRONTEND_ROLE):
            raise ValueError(f"{e.name}: unknown fixed role {e.role!r}")
        for concept, src in e.sources().items():
            for n in src.names:
                key = (n, src.matchers)
                if key in seen and seen[key] != f"{e.name}.{concept}":
                    raise ValueError(f"{n} is mapped twice: {seen[key]} and {e.name}.{concept}")
                seen[key] = f"{e.name}.{concept}"


_check(ENGINES)
