"""The serving engine's parts that need no torch (scripts/gpu_serving.py holds the model and the
process): the model's shape, one engine step over any model with the decoder's interface, the
per-step log and the engine's JSON summary.  Times are seconds (Unix for the log and summary)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from tests.support.serving_sched import ROLES, Request, Scheduler


class Model(Protocol):
    """What an engine step needs of the model (scripts/gpu_serving.py: Decoder)."""

    def prefill(self, slots: list[int], length: int) -> None: ...

    def decode(self, lengths: list[int]) -> None: ...

    def move(self, src: int, dst: int, context: int) -> None: ...

    def sync(self) -> None: ...


SWEEP = (1, 8, 16, 32, 64)
"""The aggregated engine's decode batch sizes (requests kept in the system), in order."""


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the decoder."""

    d_model: int = 2048
    layers: int = 16
    heads: int = 16
    ffn: int = 8192
    vocab: int = 32000

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def params(self) -> int:
        """Parameters: embedding, LM head, and per layer QKV, output, SwiGLU (gate+up, down), 2 norms."""
        d = self.d_model
        per_layer = 3 * d * d + d * d + 2 * d * self.ffn + self.ffn * d + 2 * d
        return 2 * self.vocab * d + self.layers * per_layer + d

    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token of context (K and V, bf16, every layer)."""
        return 2 * self.layers * self.d_model * 2


def default_max_len(role: str) -> int:
    """Longest prompt + output of the role, rounded up to 16 tokens (the attention's alignment)."""
    shape = ROLES[role]
    return -(-(shape.prompt[1] + shape.output[1]) // 16) * 16


class StepLog:
    """Per-step timings (seconds) in columns, and counts snapshots at marks."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, int, int, int, float, float]] = []
        """(unix start, requests prefilled, prompt tokens prefilled, decode batch, prefill s, decode s)."""

    def add(self, t: float, pre: int, pre_tokens: int, dec: int, pre_s: float, dec_s: float) -> None:
        self.rows.append((round(t, 4), pre, pre_tokens, dec, round(pre_s, 6), round(dec_s, 6)))


def quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "mean": None}
    s = sorted(values)
    return {
        "p50": s[len(s) // 2],
        "p95": s[min(len(s) - 1, int(0.95 * len(s)))],
        "mean": sum(s) / len(s),
    }


def step(
    model: Model,
    sched: Scheduler,
    log: StepLog,
    now_u: float,
    clock: Callable[[], float],
    idle: Callable[[float], None],
) -> None:
    """One engine step: owed KV moves, prefill of the admitted requests, one decode of all running;
    ``clock`` is monotonic seconds, ``idle`` sleeps when there is nothing to do."""
    t0 = clock()
    st = sched.plan(t0)
    _moves(model, st.moves)
    by_len: dict[int, list[Request]] = {}
    for r in st.prefill:
        by_len.setdefault(r.prompt_tokens, []).append(r)
    for length, reqs in by_len.items():
        model.prefill([r.slot for r in reqs], length)
    if st.prefill:
        model.sync()
    t1 = clock()
    st = sched.after_prefill(st, t1)
    _moves(model, st.moves)
    n = st.decode
    if n:
        model.decode([r.context + 1 for r in sched.running[:n]])
        model.sync()
    t2 = clock()
    if n:
        sched.after_decode(st, t2)
    if not st.prefill and not n:
        idle(0.001)  # nothing to do (concurrency 0)
        return
    log.add(now_u, len(st.prefill), sum(r.prompt_tokens for r in st.prefill), n, t1 - t0, t2 - t1)


def _moves(model: Model, moves: list[tuple[int, int, int]]) -> None:
    for src, dst, context in moves:
        model.move(src, dst, context)


def summary(
    args: argparse.Namespace,
    cfg: ModelConfig,
    slots: int,
    max_len: int,
    warm_s: float,
    start: float,
    end: float,
    levels: list[tuple[float, int]],
    snapshots: list[dict[str, Any]],
    timeline: list[tuple[float, int, int, int, int, int]],
    log: StepLog,
    metrics: Any,
) -> dict[str, Any]:
    """The run's own figures: counts, per-level tokens/s and step timings, the per-second timeline."""
    per_level = []
    bounds = [t for t, _ in levels] + [end]
    for i, (t0, n) in enumerate(levels):
        t1 = bounds[i + 1]
        rows = [r for r in log.rows if t0 <= r[0] < t1]
        dec = [r[5] for r in rows if r[3]]
        gen = sum(r[3] for r in rows) + sum(r[1] for r in rows)
        per_level.append(
            {
                "concurrency": n,
                "start": t0,
                "end": t1,
                "steps": len(rows),
                "generation_tokens": gen,
                "prompt_tokens": sum(r[2] for r in rows),
                "generation_tokens_per_s": gen / (t1 - t0) if t1 > t0 else None,
                "mean_decode_batch": (sum(r[3] for r in rows) / len(dec)) if dec else None,
                "decode_step_s": quantiles(dec),
                "prefill_step_s": quantiles([r[4] for r in rows if r[1]]),
            }
        )
    return {
        "role": args.role,
        "pod": args.pod,
        "namespace": args.namespace,
        "model_name": args.model_name,
        "pid": os.getpid(),
        "port": args.port,
        "model": {
            **asdict(cfg),
            "params": cfg.params,
            "kv_bytes_per_token": cfg.kv_bytes_per_token(),
            "dtype": "bfloat16",
        },
        "slots": slots,
        "max_len": max_len,
        "role_shape": asdict(ROLES[args.role]),
        "warmup_s": warm_s,
        "start": start,
        "end": end,
        "wall_s": end - start,
        "counts": metrics.counts.as_dict(),
        "generation_tokens_per_s": metrics.counts.generation_tokens / (end - start),
        "levels": per_level,
        "snapshots": snapshots,
        "timeline_columns": ["unix_s", "generation_tokens", "prompt_tokens", "requests_finished", "running", "waiting"],
        "timeline": timeline,
        "step_columns": ["unix_s", "prefilled_requests", "prefilled_tokens", "decode_batch", "prefill_s", "decode_s"],
        "steps": log.rows,
    }
