"""Serving advice: for a served model, which GPU model or MIG profile serves it cheapest while still
meeting its latency target, and for a disaggregated deployment, which role holds the other back.

The prediction is a roofline on the measured class mix of the model's GPUs (docs/serving.md,
"The serving advisor"). Of the busy time (seconds of each boundness class over the window):

- ``memory`` time scales with memory bandwidth (current / candidate);
- ``compute`` time scales with dense BF16 throughput;
- ``mixed`` time scales with the worse of the two (it is limited by both in turn);
- ``transfer`` time scales with the host link (each PCIe generation doubles it; unchanged where a
  generation is not sourced);
- ``launch``, ``latency`` and ``communication`` time is unchanged (the host, the kernels' own
  latency and the network do not change with the GPU).

The step-time ratio ``r`` is the sum of each class's share times its scale. At the same batch, the
inter-token latency and time to first token become ``r`` times today's, and one GPU's capacity
``1 / r`` of today's. The GPUs needed carry today's busy GPU-seconds times ``r`` at no more than
``BUSY_CEILING`` (or today's busy ratio, if higher: keeping today's GPU never needs more GPUs).
Memory must fit: a candidate with less memory than today's GPU must hold the weights plus the KV
cache at its observed peak, with ``MEMORY_HEADROOM``; a model whose weights are unknown is never
moved to a GPU with less memory. A model without a measured class mix (GPUs without GPM: the
``busy`` class) gets no advice.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dashboard.advisor.engine import pct, price_for
from dashboard.advisor.serving_gpus import ServingGpu, candidates

BUSY_CEILING = 0.8
"""Busy ratio a candidate's GPUs may reach at today's load (room for bursts)."""
MEMORY_HEADROOM = 1.2
"""Factor on weights + peak KV cache for activations, the engine's workspace and fragmentation."""
DEFAULT_TARGET_MARGIN = 0.25
"""Without a target, a model's latency target is today's p95 plus this share."""
MIN_SAVING = 0.05
"""A move must cut the cost per token by at least this share (smaller gains are noise)."""
MIN_CLASSIFIED = 0.9
"""Share of busy time that must carry a GPM class (not ``busy``) for a prediction."""
BYTES_PER_PARAMETER = 2
"""BF16 weights: what ``weights_from_name`` assumes."""

SAME = ("launch", "latency", "communication")
"""Classes whose time does not change with the GPU model."""
IDLE = "idle"
UNCLASSIFIED = "busy"

_PARAMS = re.compile(r"(?<![a-z0-9.])(\d+(?:\.\d+)?)\s*b(?![a-z0-9])", re.IGNORECASE)


def weights_from_name(model: str, gpus_per_replica: int = 1) -> float | None:
    """Weights per GPU (bytes) from a parameter count in the model's name (``llama-3-8b`` ->
    8e9 x 2 bytes), split over the replica's GPUs; None when the name gives none. Mixture-of-experts
    names (``8x7b``) give None: their count is not the product."""
    if re.search(r"\d+x\d", model, re.IGNORECASE):
        return None
    found = _PARAMS.search(model)
    if not found:
        return None
    return float(found.group(1)) * 1e9 * BYTES_PER_PARAMETER / max(1, gpus_per_replica)


@dataclass(frozen=True)
class ServedModel:
    """What was measured for one served model (one role of it) over the window."""

    model: str
    role: str
    """``both`` (aggregated), ``prefill`` or ``decode``."""
    gpu: ServingGpu
    """Today's GPU (or MIG profile)."""
    gpus: float
    """GPUs its pods hold (a MIG instance counts as its profile's share)."""
    busy_ratio: float
    """Mean busy ratio of those GPUs over the window, 0..1."""
    class_seconds: Mapping[str, float]
    """Seconds of each boundness class over the window, summed over its GPUs (idle included)."""
    output_tokens_per_second: float
    itl_p95_seconds: float | None
    ttft_p95_seconds: float | None = None
    memory_used_peak_bytes: float | None = None
    """Peak memory used on one of its GPUs."""
    weights_bytes: float | None = None
    """Weights on one GPU (bytes); None when not known."""
    kv_cache_peak_ratio: float | None = None
    """Peak KV-cache use, 0..1 of the engine's KV pool."""
    waiting_trend_per_second: float = 0.0
    """Slope of the queued requests over the window (requests per second; > 0: the queue grows)."""
    namespace: str = ""
    link_share: float | None = None
    """Mean over the window of its busiest link's busier direction over the link's capacity, 0..1
    (``gpulens:serving_model_{nvlink,nic}_utilization:ratio``); None where its pods have no such link."""


@dataclass(frozen=True)
class Prediction:
    """One candidate GPU for a served model."""

    gpu: ServingGpu
    step_ratio: float
    """Predicted step time / today's (< 1: faster)."""
    gpus: int
    itl_p95_seconds: float
    ttft_p95_seconds: float | None
    capacity_tokens_per_second: float
    """Output tokens/s the ``gpus`` can carry at the busy ceiling and today's batch sizes."""
    usd_per_million_tokens: float | None
    fits_memory: bool
    meets_target: bool


@dataclass(frozen=True)
class ServingAdvice:
    """The advice for one served model: move (``target`` a GPU key) or keep."""

    model: str
    role: str
    target: str
    """The GPU to move to, ``keep``, or ``no advice``."""
    text: str
    evidence: Mapping[str, float | str | None]
    assumptions: tuple[str, ...]
    chosen: Prediction | None = None
    considered: tuple[Prediction, ...] = field(default=())


ASSUMPTIONS = (
    "the same batch sizes and the same GPUs per replica on the candidate",
    "memory time scales with datasheet bandwidth, compute time with dense BF16 throughput, "
    "launch, latency and network time unchanged",
    f"at most {pct(BUSY_CEILING)} busy on the candidate at today's load",
)


def _shares(m: ServedModel) -> dict[str, float] | None:
    """Share of busy time per class; None when too little of it is classified."""
    busy = {c: s for c, s in m.class_seconds.items() if c != IDLE and s > 0}
    total = sum(busy.values())
    if total <= 0 or busy.get(UNCLASSIFIED, 0.0) / total > 1 - MIN_CLASSIFIED:
        return None
    classified = total - busy.get(UNCLASSIFIED, 0.0)
    return {c: s / classified for c, s in busy.items() if c != UNCLASSIFIED}


def step_ratio(shares: Mapping[str, float], now: ServingGpu, then: ServingGpu) -> float:
    """Predicted step time on ``then`` over today's on ``now``, from the class shares of busy time."""
    memory = now.bandwidth_bytes_per_second / then.bandwidth_bytes_per_second
    compute = now.bf16_flops / then.bf16_flops
    link = 1.0
    if now.pcie_generation and then.pcie_generation:
        link = 2.0 ** (now.pcie_generation - then.pcie_generation)
    scale = {"memory": memory, "compute": compute, "mixed": max(memory, compute), "transfer": link}
    return sum(share * (1.0 if c in SAME else scale.get(c, 1.0)) for c, share in shares.items())


def memory_needed(m: ServedModel) -> float | None:
    """Bytes one GPU needs: (weights + KV pool x peak use) x headroom; None when not known."""
    if m.weights_bytes is None or m.memory_used_peak_bytes is None or m.kv_cache_peak_ratio is None:
        return None
    kv_pool = max(0.0, m.memory_used_peak_bytes - m.weights_bytes)
    return (m.weights_bytes + kv_pool * m.kv_cache_peak_ratio) * MEMORY_HEADROOM


def usd_per_million(
    gpu: ServingGpu, gpus: float, tokens_per_second: float, prices: Mapping[str, float]
) -> float | None:
    """Dollars per million output tokens for ``gpus`` of ``gpu`` serving ``tokens_per_second``."""
    price = price_for(gpu.priced_as, prices)
    if price is None or tokens_per_second <= 0:
        return None
    return price * gpu.gpu_share * gpus / (tokens_per_second * 3600.0) * 1e6


def predict(
    m: ServedModel,
    then: ServingGpu,
    shares: Mapping[str, float],
    target_itl: float,
    target_ttft: float | None,
    prices: Mapping[str, float],
) -> Prediction:
    """The roofline prediction of ``m`` on ``then`` (see the module's text)."""
    r = step_ratio(shares, m.gpu, then)
    ceiling = max(BUSY_CEILING, m.busy_ratio)
    # today's busy GPU-seconds per second, in whole-GPU units of today's GPU, times r
    gpus = max(1, math.ceil(m.gpus * m.busy_ratio * r / ceiling - 1e-9))
    itl = (m.itl_p95_seconds or 0.0) * r
    ttft = m.ttft_p95_seconds * r if m.ttft_p95_seconds is not None else None
    per_gpu_now = m.output_tokens_per_second / max(m.gpus * m.busy_ratio, 1e-9)
    capacity = per_gpu_now / r * gpus * ceiling
    need = memory_needed(m)
    fits = then.memory_bytes >= m.gpu.memory_bytes or (need is not None and then.memory_bytes >= need)
    # a given TTFT target is met only by a predicted TTFT: without today's, none can be shown to meet it
    meets = itl <= target_itl and (target_ttft is None or (ttft is not None and ttft <= target_ttft))
    cost = usd_per_million(then, gpus, m.output_tokens_per_second, prices)
    return Prediction(then, r, gpus, itl, ttft, capacity, cost, fits, meets)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.0f} ms"


def _usd(value: float | None) -> str:
    return "no price" if value is None else f"${value:,.2f}"


def advise_model(
    m: ServedModel,
    prices: Mapping[str, float],
    target_itl_seconds: float | None = None,
    target_ttft_seconds: float | None = None,
    pool: Sequence[ServingGpu] | None = None,
) -> ServingAdvice:
    """Keep ``m`` where it is, or move it to the cheapest candidate that meets the latency target
    and fits its memory, and only when that cuts its cost per token by ``MIN_SAVING`` or more."""
    shares = _shares(m)
    evidence: dict[str, float | str | None] = {
        "namespace": m.namespace,
        "gpu": m.gpu.key,
        "gpus": m.gpus,
        "busy_ratio": m.busy_ratio,
        "output_tokens_per_second": m.output_tokens_per_second,
        "itl_p95_seconds": m.itl_p95_seconds,
        "ttft_p95_seconds": m.ttft_p95_seconds,
    }
    # the target and where it comes from, whatever the advice: the page holds every model against it
    given = target_itl_seconds is not None
    today = None if m.itl_p95_seconds is None else m.itl_p95_seconds * (1 + DEFAULT_TARGET_MARGIN)
    if target_itl_seconds is not None or today is not None:
        evidence["itl_target_seconds"] = target_itl_seconds if target_itl_seconds is not None else today
        evidence["itl_target_source"] = "given" if given else f"today's p95 + {pct(DEFAULT_TARGET_MARGIN)}"
    # TTFT is held to a target only where one is given (no default margin): a decode-bound model's
    # prefill scales with compute, not with the class mix its decode steps dominate
    if target_ttft_seconds is not None:
        evidence["ttft_target_seconds"] = target_ttft_seconds
        evidence["ttft_target_source"] = "given"
    if shares is None or m.itl_p95_seconds is None or m.output_tokens_per_second <= 0:
        why = (
            "no measured class mix (GPUs without GPM)"
            if shares is None
            else "no inter-token latency or no tokens in the window"
        )
        return ServingAdvice(
            m.model, m.role, "no advice", f"{m.model}: no serving advice: {why}", evidence, ASSUMPTIONS
        )
    evidence.update({f"share_{c}": s for c, s in sorted(shares.items())})
    target = target_itl_seconds if target_itl_seconds is not None else m.itl_p95_seconds * (1 + DEFAULT_TARGET_MARGIN)
    ttft_target = target_ttft_seconds
    # what the sentences call the target: the ITL one, and the TTFT one beside it where given
    targets = (
        f"{_ms(target)} target"
        if ttft_target is None
        else f"{_ms(target)} ITL p95 and {_ms(ttft_target)} TTFT p95 targets"
    )
    now_cost = usd_per_million(m.gpu, m.gpus, m.output_tokens_per_second, prices)
    evidence["usd_per_million_now"] = now_cost
    considered = tuple(
        predict(m, g, shares, target, ttft_target, prices) for g in (pool or candidates()) if g.key != m.gpu.key
    )
    good = [p for p in considered if p.fits_memory and p.meets_target and p.usd_per_million_tokens is not None]
    best = min(good, key=lambda p: (p.usd_per_million_tokens, p.gpus * p.gpu.gpu_share), default=None)
    assumptions: tuple[str, ...] = (*ASSUMPTIONS, f"latency target {_ms(target)} ({evidence['itl_target_source']})")
    if ttft_target is not None:
        assumptions = (
            *assumptions,
            f"TTFT p95 target {_ms(ttft_target)} (given), time to first token scaled by the same step ratio",
        )
    if best is None or now_cost is None or best.usd_per_million_tokens is None:
        why = "no price for today's GPU" if now_cost is None else f"no priced GPU meets the {targets} and fits"
        return ServingAdvice(
            m.model, m.role, "keep", f"keep {m.model} on {m.gpu.key}: {why}", evidence, assumptions, None, considered
        )
    if best.usd_per_million_tokens > now_cost * (1 - MIN_SAVING):
        return ServingAdvice(
            m.model,
            m.role,
            "keep",
            f"keep {m.model} on {m.gpu.key}: no GPU that meets the {targets} serves it cheaper "
            f"(best: {best.gpu.key} at {_usd(best.usd_per_million_tokens)} against {_usd(now_cost)} per M tokens)",
            evidence,
            assumptions,
            None,
            considered,
        )
    text = (
        f"serve {m.model} on {best.gpus} × {best.gpu.key}: predicted {best.capacity_tokens_per_second:,.0f} tok/s "
        f"(now {m.output_tokens_per_second:,.0f} on {m.gpus:g} × {m.gpu.key}), ITL p95 {_ms(best.itl_p95_seconds)} "
        f"against a {_ms(target)} target"
        + (
            ""
            if ttft_target is None
            else f", TTFT p95 {_ms(best.ttft_p95_seconds)} against a {_ms(ttft_target)} target"
        )
        + f", {_usd(now_cost)} → {_usd(best.usd_per_million_tokens)} per M tokens"
    )
    return ServingAdvice(m.model, m.role, best.gpu.key, text, evidence, assumptions, best, considered)


@dataclass(frozen=True)
class BalanceAdvice:
    """How to split a disaggregated deployment's GPUs between prefill and decode."""

    model: str
    holding_back: str
    """The role that holds the other back (``prefill``, ``decode``), or empty when balanced."""
    move_gpus: int
    """GPUs to move to ``holding_back`` from the other role (0: balanced)."""
    text: str
    evidence: Mapping[str, float | str | None]


def balance(prefill: ServedModel, decode: ServedModel, kv_link_share: float | None = None) -> BalanceAdvice:
    """Split the pair's GPUs in proportion to each role's busy GPU-seconds. The role that holds the
    other back is the one with the larger share of the work per GPU; GPUs move only when the split
    is off by at least one whole GPU and that role's queue grows or its GPUs pass ``BUSY_CEILING``.
    ``kv_link_share`` (0..1, default: the larger of the two roles' ``link_share``) is stated."""
    if kv_link_share is None:
        shares = [s for s in (prefill.link_share, decode.link_share) if s is not None]
        kv_link_share = max(shares) if shares else None
    load_p = prefill.gpus * prefill.busy_ratio
    load_d = decode.gpus * decode.busy_ratio
    total = prefill.gpus + decode.gpus
    evidence: dict[str, float | str | None] = {
        "prefill_gpus": prefill.gpus,
        "decode_gpus": decode.gpus,
        "prefill_busy_ratio": prefill.busy_ratio,
        "decode_busy_ratio": decode.busy_ratio,
        "prefill_queue_trend": prefill.waiting_trend_per_second,
        "decode_queue_trend": decode.waiting_trend_per_second,
        "kv_transfer_link_share": kv_link_share,
    }
    if load_p + load_d <= 0 or total < 2:
        return BalanceAdvice(prefill.model, "", 0, f"{prefill.model}: nothing to balance", evidence)
    ideal_p = min(max(round(total * load_p / (load_p + load_d)), 1), int(total) - 1)
    move = round(prefill.gpus - ideal_p)
    kv = "" if kv_link_share is None else f"; KV transfer uses {pct(kv_link_share)} of the links"
    if move > 0:
        slow, fast, n = decode, prefill, move
    elif move < 0:
        slow, fast, n = prefill, decode, -move
    else:
        return BalanceAdvice(prefill.model, "", 0, f"{prefill.model}: prefill and decode are balanced{kv}", evidence)
    pressed = slow.waiting_trend_per_second > 0 or slow.busy_ratio > BUSY_CEILING
    if not pressed:
        return BalanceAdvice(prefill.model, "", 0, f"{prefill.model}: {slow.role} is busier but keeps up{kv}", evidence)
    text = (
        f"{prefill.model}: {slow.role} holds {fast.role} back ({slow.role} {pct(slow.busy_ratio)} busy, queue "
        f"{'growing' if slow.waiting_trend_per_second > 0 else 'steady'}; {fast.role} {pct(fast.busy_ratio)} busy): "
        f"move {n} GPU{'s' if n != 1 else ''} from {fast.role} to {slow.role}{kv}"
    )
    return BalanceAdvice(prefill.model, slow.role, n, text, evidence)
