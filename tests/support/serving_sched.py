"""Continuous batching of synthetic requests, without torch: the scheduler of scripts/gpu_serving.py.

Requests arrive (closed loop: the scheduler keeps ``concurrency`` requests in the system, a new
one arriving as soon as one finishes), wait, are prefilled (their first output token comes from the
prefill, as in vLLM), join the running decode batch, and leave when they reach their output
length.  Each running request holds one KV-cache slot; running requests always occupy slots
``0..n-1``, so the model attends over ``cache[:n]`` as a view: when a request leaves, the request in
the last slot moves into its slot (``Step.moves``: the model copies that slot's KV).

Times are seconds from the caller's clock (``time.monotonic()`` on the GPU); the scheduler never
reads a clock itself, so tests drive it with made-up times.  What it observes goes to ``Observer``
(the vLLM-named metrics and the run's own exact counts).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

KV_BLOCK_TOKENS = 16
"""Tokens per KV-cache block (vLLM's default block size): KV-cache use counts whole blocks."""


@dataclass(frozen=True)
class RoleShape:
    """What a role's requests look like: prompt and output lengths (tokens, inclusive ranges)."""

    prompt: tuple[int, int]
    output: tuple[int, int]
    prefill_batch: int
    """Most requests prefilled in one engine step."""


ROLES: dict[str, RoleShape] = {
    # Aggregated: prefill and decode in one engine, as vLLM serves by default.
    "both": RoleShape(prompt=(1024, 2048), output=(128, 512), prefill_batch=2),
    # Prefill-only pod (disaggregated): long prompts, one output token (the KV would move on).
    "prefill": RoleShape(prompt=(2048, 2048), output=(1, 1), prefill_batch=4),
    # Decode-only pod: minimal prompt (the KV arrives from the prefill pod), long decode.
    "decode": RoleShape(prompt=(16, 16), output=(768, 1280), prefill_batch=16),
}


@dataclass
class Request:
    """One synthetic request; times in seconds of the caller's clock."""

    rid: int
    prompt_tokens: int
    output_tokens: int
    arrival: float
    slot: int = -1
    generated: int = 0
    first_token: float | None = None
    last_token: float | None = None
    prefill_start: float | None = None

    @property
    def context(self) -> int:
        """Tokens in its KV cache: the prompt and every generated token but the last (not yet fed)."""
        return self.prompt_tokens + max(0, self.generated - 1)

    @property
    def done(self) -> bool:
        return self.generated >= self.output_tokens


class Observer(Protocol):
    """Receives what the scheduler sees (``tests.support.serving_metrics.EngineMetrics``)."""

    def prefilled(self, reqs: Sequence[Request], now: float) -> None: ...

    def decoded(self, reqs: Sequence[Request], itls: Sequence[float]) -> None: ...

    def finished(self, req: Request, now: float) -> None: ...

    def state(self, running: int, waiting: int, kv_usage: float) -> None: ...


@dataclass
class Step:
    """One engine step: prefill ``prefill`` (each into its slot), then decode every running request.

    ``moves`` are (from slot, to slot, context tokens) KV copies to do before the decode.  ``decode`` is
    the number of running requests in slots ``0..decode-1`` (those just prefilled included: their
    prefill gave their first token; the decode gives their second)."""

    prefill: list[Request] = field(default_factory=list)
    moves: list[tuple[int, int, int]] = field(default_factory=list)
    decode: int = 0


class Scheduler:
    """Closed-loop continuous batching for one role into ``slots`` KV slots of ``max_len`` tokens."""

    def __init__(self, role: str, slots: int, max_len: int, observer: Observer, seed: int = 0) -> None:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}: one of {sorted(ROLES)}")
        shape = ROLES[role]
        if shape.prompt[1] + shape.output[1] > max_len:
            raise ValueError(
                f"role {role}: prompt + output up to {shape.prompt[1] + shape.output[1]} > max_len {max_len}"
            )
        self.role = role
        self.shape = shape
        self.slots = slots
        self.max_len = max_len
        self.observer = observer
        self.rng = random.Random(seed)
        self.concurrency = 0
        """Requests kept in the system (waiting + running); 0 stops new arrivals."""
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.pending_moves: list[tuple[int, int, int]] = []
        """KV slot moves owed since the last decode: the model does them before the next prefill."""
        self._next_id = 0

    def set_concurrency(self, n: int, now: float) -> None:
        """Keep ``n`` requests in the system from now on (more arrive at once; fewer: none arrive
        until enough have left)."""
        if n > self.slots and self.shape.output[1] > 1:
            raise ValueError(f"concurrency {n} > {self.slots} KV slots")
        self.concurrency = n
        self._arrive(now)

    def _arrive(self, now: float) -> None:
        while len(self.waiting) + len(self.running) < self.concurrency:
            self.waiting.append(
                Request(
                    self._next_id,
                    self.rng.randint(*self.shape.prompt),
                    self.rng.randint(*self.shape.output),
                    now,
                )
            )
            self._next_id += 1

    def plan(self, now: float) -> Step:
        """The next step: admit waiting requests into free slots (at most ``prefill_batch``).
        ``step.moves`` are the KV moves owed since the last decode: do them before the prefill."""
        self._arrive(now)
        step = Step(moves=self.pending_moves)
        self.pending_moves = []
        while self.waiting and len(self.running) < self.slots and len(step.prefill) < self.shape.prefill_batch:
            req = self.waiting.popleft()
            req.slot = len(self.running)
            req.prefill_start = now
            self.running.append(req)
            step.prefill.append(req)
        return step

    def after_prefill(self, step: Step, now: float) -> Step:
        """The prefill of ``step`` is done (its first tokens exist at ``now``): requests that wanted
        one token leave; ``step.moves`` becomes the KV moves to do before the decode, and
        ``step.decode`` the decode batch."""
        for req in step.prefill:
            req.generated = 1
            req.first_token = req.last_token = now
        self.observer.prefilled(step.prefill, now)
        step.moves = self._retire(now)
        step.decode = len(self.running)
        self._report()
        return step

    def after_decode(self, step: Step, now: float) -> list[Request]:
        """The decode of ``step`` is done at ``now``: one token more for each of its requests;
        return those that finished (they left; ``pending_moves`` says which KV to move next)."""
        batch = self.running[: step.decode]
        itls = []
        for req in batch:
            itls.append(now - (req.last_token if req.last_token is not None else now))
            req.generated += 1
            req.last_token = now
        self.observer.decoded(batch, itls)
        finished = [r for r in batch if r.done]
        self.pending_moves = self._retire(now)
        self._report()
        return finished

    def _retire(self, now: float) -> list[tuple[int, int, int]]:
        """Remove finished requests and keep the running ones in slots 0..n-1: each running request
        in a slot at or past n moves into a freed slot below n.  Returns the KV moves (from slot,
        to slot, context tokens); they touch distinct slots, so their order does not matter."""
        done = [r for r in self.running if r.done]
        if not done:
            return []
        for req in done:
            self.observer.finished(req, now)
        keep = [r for r in self.running if not r.done]
        n = len(keep)
        holes = sorted(r.slot for r in done if r.slot < n)
        movers = sorted((r for r in keep if r.slot >= n), key=lambda r: r.slot)
        moves = []
        for hole, req in zip(holes, movers, strict=True):
            moves.append((req.slot, hole, req.context))
            req.slot = hole
        for req in done:
            req.slot = -1
        self.running = sorted(keep, key=lambda r: r.slot)
        return moves

    def kv_usage(self) -> float:
        """Fraction of the KV blocks held by running requests (blocks of ``KV_BLOCK_TOKENS``)."""
        blocks = sum(-(-(r.prompt_tokens + r.generated) // KV_BLOCK_TOKENS) for r in self.running)
        return blocks / (self.slots * -(-self.max_len // KV_BLOCK_TOKENS))

    def _report(self) -> None:
        self.observer.state(len(self.running), len(self.waiting), self.kv_usage())
