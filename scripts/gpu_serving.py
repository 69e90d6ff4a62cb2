#!/usr/bin/env python3
"""A serving engine on the GPU: a Llama-like decoder (random bf16 weights), a KV cache per request,
prefill then token-by-token decode, continuous batching of synthetic requests, and vLLM-named
metrics on its own port.  One process is one engine (one pod): ``--role both`` (aggregated),
``prefill`` (long prompts, one output token) or ``decode`` (minimal prompt, long decode).

The model (defaults: 1.2 B parameters): d_model 2048, 16 layers, 16 heads of 128, SwiGLU MLP of
8192, RMSNorm, no positional encoding (random weights: what is measured is the work, not the text),
vocabulary 32,000, bf16.  The KV cache is one tensor per K and V of [layers, slots, heads, max_len,
head_dim]; running requests hold slots 0..n-1 (tests/support/serving_sched.py), so a decode step
attends over ``cache[:, :n, :, :longest]`` (a view) with a mask per request.  Decode replays CUDA
graphs, one per padded batch size and rounded length, captured on first use (as vLLM does;
``--no-cuda-graphs`` launches kernel by kernel).  Prefill runs eagerly per group of equal prompt
length with causal SDPA.  Every step ends with a synchronisation (the tokens are known, as an
engine that returns them must), so the latencies are real.

Protocol with its parent (bench/gpu_serving_run.py): after the model is built and warmed up it
serves /metrics on ``--port`` and prints ``ready``; it then reads one line from stdin,
``go START DURATION [MARK ...]`` (Unix seconds), serves from START to START + DURATION or until
it reads ``stop`` (or stdin ends) (with
``--role both`` the concurrency steps through ``--sweep``, ``--hold`` seconds each; otherwise it
holds ``--concurrency``), snapshots its own counts at each MARK, writes ``--summary`` (JSON),
prints ``done``, and keeps serving /metrics until stdin ends.  It never lives past ``--deadline``
seconds.

    python3 scripts/gpu_serving.py --role both --port 8001 --summary agg.json
    python3 scripts/gpu_serving.py --help          # works without torch
"""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.serving_engine import SWEEP, Model, ModelConfig, StepLog, default_max_len, step, summary  # noqa: E402
from tests.support.serving_sched import ROLES, Scheduler  # noqa: E402

# --- the model (torch) --------------------------------------------------------------------------

GRAPH_BATCHES = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128)
"""Decode batch sizes captured as CUDA graphs; a batch runs padded to the next one (vLLM pads alike)."""
GRAPH_LEN_STEP = 64
"""Decode attention reads each slot up to the longest context rounded up to this many tokens (one
CUDA graph per batch size and rounded length)."""


class Decoder:
    """The decoder's weights and KV cache on the GPU, and its prefill and decode steps."""

    def __init__(
        self, cfg: ModelConfig, slots: int, max_len: int, seed: int, use_graphs: bool = True, dtype: str = "bfloat16"
    ) -> None:
        import torch

        self.torch = torch
        self.cfg = cfg
        self.slots = slots
        self.max_len = max_len
        dev = torch.device("cuda")
        dt = getattr(torch, dtype)
        gen = torch.Generator(device=dev).manual_seed(seed)
        d, f = cfg.d_model, cfg.ffn

        def w(rows: int, cols: int) -> Any:
            return torch.randn(rows, cols, device=dev, dtype=dt, generator=gen) * (1.0 / math.sqrt(rows))

        self.embed = torch.randn(cfg.vocab, d, device=dev, dtype=dt, generator=gen)
        self.layers = [
            {
                "n1": torch.ones(d, device=dev, dtype=dt),
                "qkv": w(d, 3 * d),
                "o": w(d, d),
                "n2": torch.ones(d, device=dev, dtype=dt),
                "gu": w(d, 2 * f),
                "down": w(f, d),
            }
            for _ in range(cfg.layers)
        ]
        self.norm = torch.ones(d, device=dev, dtype=dt)
        self.head = w(d, cfg.vocab)
        shape = (cfg.layers, slots, cfg.heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=dev, dtype=dt)
        self.v = torch.zeros(shape, device=dev, dtype=dt)
        self.tokens = torch.zeros(slots, device=dev, dtype=torch.long)
        """The last token of the request in each slot (the next decode's input)."""
        self.positions = torch.arange(max_len, device=dev)
        self.rows = torch.arange(slots, device=dev)
        self.logits = torch.zeros(slots, cfg.vocab, device=dev)
        """The last logits of each slot (float32; the self-check compares them)."""
        self.lens = torch.ones(slots, device=dev, dtype=torch.long)
        """Each slot's context after the current decode (the decode's input, static for the graphs)."""
        self.use_graphs = use_graphs
        self.graphs: dict[tuple[int, int], Any] = {}
        self.graph_error = ""
        self.pool = torch.cuda.graph_pool_handle() if use_graphs else None

    def _norm(self, x: Any, weight: Any) -> Any:
        F = self.torch.nn.functional
        if hasattr(F, "rms_norm"):
            return F.rms_norm(x, (x.shape[-1],), weight, 1e-5)
        xf = x.float()
        return (xf * self.torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * weight

    def _mlp(self, x: Any, p: dict[str, Any]) -> Any:
        F = self.torch.nn.functional
        g, u = (self._norm(x, p["n2"]) @ p["gu"]).chunk(2, dim=-1)
        return x + (F.silu(g) * u) @ p["down"]

    def prefill(self, slots: list[int], length: int, ids: Any = None) -> None:
        """Prefill ``len(slots)`` prompts of ``length`` tokens (``ids``, else random IDs) into
        ``slots``; the first output token of each goes to ``self.tokens[slot]``."""
        torch = self.torch
        F = torch.nn.functional
        cfg = self.cfg
        b, h, hd = len(slots), cfg.heads, cfg.head_dim
        idx = torch.tensor(slots, device=self.tokens.device)
        if ids is None:
            ids = torch.randint(0, cfg.vocab, (b, length), device=idx.device)
        x = self.embed[ids]
        for li, p in enumerate(self.layers):
            qkv = (self._norm(x, p["n1"]) @ p["qkv"]).view(b, length, 3, h, hd).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            self.k[li, idx, :, :length] = k
            self.v[li, idx, :, :length] = v
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + a.transpose(1, 2).reshape(b, length, cfg.d_model) @ p["o"]
            x = self._mlp(x, p)
        logits = self._norm(x[:, -1], self.norm) @ self.head
        self.logits[idx] = logits.float()
        self.tokens[idx] = logits.argmax(-1)

    def decode(self, lengths: list[int]) -> None:
        """One token for each request in slots ``0..n-1``: ``lengths[i]`` is slot i's context after
        this token (its KV goes to position ``lengths[i] - 1``).  The attention reads each slot up
        to the longest context rounded up to ``GRAPH_LEN_STEP`` tokens, masked per request; with
        CUDA graphs (as vLLM decodes) one graph per (batch, rounded length) is captured on first
        use and replayed after, else the same kernels are launched one by one."""
        torch = self.torch
        n = len(lengths)
        longest = min(self.max_len, -(-max(lengths) // GRAPH_LEN_STEP) * GRAPH_LEN_STEP)
        if not self.use_graphs:
            self.lens[:n].copy_(torch.tensor(lengths, dtype=torch.long))
            self._decode(n, longest)
            return
        # as vLLM does, pad the batch to the next captured size: the padding slots are free (running
        # requests hold 0..n-1), attend to their position 0 only, and their tokens are never read
        padded = next((b for b in GRAPH_BATCHES if b >= n), n)
        padded = min(padded, self.slots) if n <= self.slots else n
        self.lens[:padded].copy_(torch.tensor(lengths + [1] * (padded - n), dtype=torch.long))
        graph = self.graphs.get((padded, longest))
        if graph is None:
            self._capture(padded, longest)  # its eager run was this step
            return
        graph.replay()

    def _capture(self, n: int, longest: int) -> None:
        """Run one decode of ``n`` slots over ``longest`` positions eagerly on a side stream (this
        step), then capture it as a CUDA graph for the next steps of that shape.  If capture fails,
        every later decode runs eagerly (the reason is printed and kept in ``graph_error``)."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._decode(n, longest)
        torch.cuda.current_stream().wait_stream(side)
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self._decode(n, longest)
        except Exception as exc:  # keep serving, eagerly; the summary says so
            self.use_graphs = False
            self.graph_error = repr(exc)
            print(f"CUDA graph capture failed, decoding eagerly from now on: {exc!r}", file=sys.stderr, flush=True)
            return
        self.graphs[(n, longest)] = graph

    def _decode(self, n: int, longest: int) -> None:
        """The decode step's kernels for slots ``0..n-1`` (contexts in ``self.lens``)."""
        F = self.torch.nn.functional
        cfg = self.cfg
        h, hd = cfg.heads, cfg.head_dim
        lens = self.lens[:n]
        pos = lens - 1
        rows = self.rows[:n]
        mask = (self.positions[:longest][None, :] < lens[:, None]).view(n, 1, 1, longest)
        x = self.embed[self.tokens[:n]].view(n, 1, cfg.d_model)
        for li, p in enumerate(self.layers):
            qkv = (self._norm(x, p["n1"]) @ p["qkv"]).view(n, 3, h, hd)
            q = qkv[:, 0].unsqueeze(2)
            self.k[li][rows, :, pos] = qkv[:, 1]
            self.v[li][rows, :, pos] = qkv[:, 2]
            k = self.k[li, :n, :, :longest]
            v = self.v[li, :n, :, :longest]
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + a.reshape(n, 1, cfg.d_model) @ p["o"]
            x = self._mlp(x, p)
        logits = self._norm(x[:, 0], self.norm) @ self.head
        self.logits[:n] = logits.float()
        self.tokens[:n] = logits.argmax(-1)

    def move(self, src: int, dst: int, context: int) -> None:
        """Move a request's KV (``context`` tokens) and last token from slot ``src`` to ``dst``."""
        self.k[:, dst, :, :context] = self.k[:, src, :, :context]
        self.v[:, dst, :, :context] = self.v[:, src, :, :context]
        self.tokens[dst] = self.tokens[src]

    def sync(self) -> None:
        self.torch.cuda.synchronize()


class FakeDecoder:
    """The decoder's interface without a GPU: each step sleeps about what a 1 B model's would take
    (20 us per prompt token of prefill, 2 ms + 10 us per request of decode)."""

    def __init__(self, cfg: ModelConfig, slots: int) -> None:
        self.cfg = cfg
        self.slots = slots

    def prefill(self, slots: list[int], length: int) -> None:
        time.sleep(20e-6 * length * len(slots))

    def decode(self, lengths: list[int]) -> None:
        time.sleep(0.002 + 10e-6 * len(lengths))

    def move(self, src: int, dst: int, context: int) -> None:
        pass

    def sync(self) -> None:
        pass


# --- the engine loop ----------------------------------------------------------------------------


def serve(args: argparse.Namespace) -> int:
    """Build, warm up, announce, then serve one ``go`` window; see the module docstring."""
    from prometheus_client import start_http_server

    from tests.support.serving_metrics import EngineMetrics

    born = time.monotonic()
    role = args.role
    max_len = args.max_len or default_max_len(role)
    slots = args.slots or (
        max(args.sweep) if role == "both" else ROLES[role].prefill_batch if role == "prefill" else args.concurrency
    )
    cfg = ModelConfig(args.d_model, args.layers, args.heads, args.ffn, args.vocab)
    model: Model = (
        FakeDecoder(cfg, slots) if args.fake_model else Decoder(cfg, slots, max_len, args.seed, not args.no_cuda_graphs)
    )
    # warm-up (not counted): one prefill of the role's longest prompt, a few decode steps
    t0 = time.monotonic()
    prompt = ROLES[role].prompt[1]
    warm_b = min(slots, ROLES[role].prefill_batch)
    model.prefill(list(range(warm_b)), prompt)
    for i in range(3):
        model.decode([prompt + 1 + i] * warm_b)
    model.sync()
    warm_s = time.monotonic() - t0
    metrics = EngineMetrics(args.model_name, max_len)
    server, _ = start_http_server(args.port, addr=args.host, registry=metrics.registry)
    args.port = server.server_port  # the one bound (--port 0: any free port)
    print(f"ready port={args.port} pid={os.getpid()} params={cfg.params} warmup_s={warm_s:.2f}", flush=True)

    line = _readline(args.deadline - (time.monotonic() - born))
    if not line or not line.startswith("go "):
        print(f"no go line ({line!r}); exiting", flush=True)
        return 2
    parts = line.split()
    start, duration = float(parts[1]), float(parts[2])
    marks = sorted(float(x) for x in parts[3:])
    mono_of = time.monotonic() - time.time()  # unix -> monotonic offset
    while time.time() < start:
        time.sleep(min(0.05, max(0.0, start - time.time())))

    sched = Scheduler(role, slots, max_len, metrics, seed=args.seed)
    levels = (
        [(start + i * args.hold, n) for i, n in enumerate(args.sweep)]
        if role == "both"
        else [(start, args.concurrency)]
    )
    level_marks = [t for t, _ in levels[1:]]
    all_marks = sorted(set(marks + level_marks))
    end = start + duration
    log = StepLog()
    snapshots: list[dict[str, Any]] = [{"t": time.time(), "counts": metrics.counts.as_dict(), "level": None}]
    timeline: list[tuple[float, int, int, int, int, int]] = []
    next_tick = math.floor(time.time()) + 1.0
    level_i = -1
    deadline = born + args.deadline
    next_poll = time.monotonic() + 0.2
    while True:
        now_u = time.time()
        if now_u >= end or time.monotonic() >= deadline:
            break
        if time.monotonic() >= next_poll:  # "stop" from the parent, or its end (stdin closed)
            next_poll = time.monotonic() + 0.2
            if select.select([sys.stdin], [], [], 0)[0] and sys.stdin.readline().strip() in ("stop", ""):
                end = now_u
                break
        while level_i + 1 < len(levels) and levels[level_i + 1][0] <= now_u:
            level_i += 1
            sched.set_concurrency(levels[level_i][1], now_u + mono_of)
        while all_marks and all_marks[0] <= now_u:
            snapshots.append(
                {"t": now_u, "mark": all_marks.pop(0), "counts": metrics.counts.as_dict(), "level": levels[level_i][1]}
            )
        if now_u >= next_tick:
            c = metrics.counts
            timeline.append(
                (
                    round(now_u, 3),
                    c.generation_tokens,
                    c.prompt_tokens,
                    c.requests_finished,
                    len(sched.running),
                    len(sched.waiting),
                )
            )
            next_tick = math.floor(now_u) + 1.0
        step(model, sched, log, now_u, time.monotonic, time.sleep)
    snapshots.append(
        {
            "t": time.time(),
            "mark": end,
            "counts": metrics.counts.as_dict(),
            "level": levels[level_i][1] if level_i >= 0 else None,
        }
    )
    c = metrics.counts
    timeline.append(
        (
            round(time.time(), 3),
            c.generation_tokens,
            c.prompt_tokens,
            c.requests_finished,
            len(sched.running),
            len(sched.waiting),
        )
    )
    result = summary(args, cfg, slots, max_len, warm_s, start, end, levels, snapshots, timeline, log, metrics)
    result["cuda_graphs"] = {
        "requested": not args.no_cuda_graphs and not args.fake_model,
        "in_use_at_end": bool(getattr(model, "use_graphs", False)),
        "captured": len(getattr(model, "graphs", {})),
        "error": getattr(model, "graph_error", ""),
        "batch_sizes": GRAPH_BATCHES,
        "length_step": GRAPH_LEN_STEP,
    }
    Path(args.summary).write_text(json.dumps(result))
    print(
        f"done generation_tokens={c.generation_tokens} prompt_tokens={c.prompt_tokens} requests={c.requests_finished}",
        flush=True,
    )
    # keep /metrics up (the scraper reads the final counters) until the parent closes stdin
    _readline(max(0.0, args.deadline - (time.monotonic() - born)))
    return 0


def _readline(timeout: float) -> str:
    """One line from stdin within ``timeout`` seconds ('' at its end or on timeout)."""
    ready, _, _ = select.select([sys.stdin], [], [], max(0.0, timeout))
    return sys.stdin.readline().strip() if ready else ""


def self_check() -> int:
    """On a GPU: a small float32 decoder's cached decode (eager, then through CUDA graphs with a padded
    batch) gives the logits of recomputing the whole sequence by prefill; slot moves keep them."""
    import torch

    cfg = ModelConfig(d_model=256, layers=2, heads=4, ffn=512, vocab=1000)
    worst = 0.0
    for graphs in (False, True):
        m = Decoder(cfg, slots=4, max_len=128, seed=1, use_graphs=graphs, dtype="float32")
        ref = Decoder(cfg, slots=4, max_len=128, seed=1, use_graphs=False, dtype="float32")
        gen = torch.Generator(device="cuda").manual_seed(7)
        prompts = [torch.randint(0, cfg.vocab, (1, n), device="cuda", generator=gen) for n in (20, 33, 7)]
        seqs = [p[0].tolist() for p in prompts]
        for slot, p in enumerate(prompts):
            m.prefill([slot], p.shape[1], p)
        for s, slot in zip(seqs, range(3), strict=True):
            s.append(int(m.tokens[slot]))
        for step_i in range(6):
            if step_i == 3:  # request 0 leaves: the last one moves into its slot, as the scheduler does
                m.move(2, 0, len(seqs[2]) - 1)
                seqs = [seqs[2], seqs[1]]
            m.decode([len(s) for s in seqs])
            m.sync()
            for slot, s in enumerate(seqs):
                ref.prefill([3], len(s), torch.tensor([s], device="cuda"))
                ref.sync()
                err = float((m.logits[slot] - ref.logits[3]).abs().max() / ref.logits[3].abs().max())
                worst = max(worst, err)
                s.append(int(m.tokens[slot]))
        print(f"cuda graphs {graphs}: captured {len(m.graphs)}, error {m.graph_error or 'none'}")
    ok = worst < 1e-3
    verdict = "ok" if ok else "FAIL"
    print(f"self-check: largest relative logit difference, cached decode vs recompute: {worst:.2e} {verdict}")
    return 0 if ok else 1


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=sorted(ROLES), default="both", help="both (aggregated), prefill or decode")
    ap.add_argument("--port", type=int, default=8000, help="port of this engine's /metrics (0: any free port)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--model-name", default="gpulens-llama-1b", help="served model name (label model_name)")
    ap.add_argument("--pod", default="", help="the pod this engine stands for (recorded in the summary)")
    ap.add_argument("--namespace", default="serving")
    ap.add_argument("--summary", default="engine-summary.json", help="where the JSON summary goes")
    ap.add_argument(
        "--sweep",
        type=lambda s: [int(x) for x in s.split(",")],
        default=list(SWEEP),
        help="--role both: concurrency levels",
    )
    ap.add_argument("--hold", type=float, default=20.0, help="--role both: seconds at each level")
    ap.add_argument("--concurrency", type=int, default=32, help="--role prefill/decode: requests kept in the system")
    ap.add_argument("--slots", type=int, default=0, help="KV slots (default: the most the role runs at once)")
    ap.add_argument(
        "--max-len", type=int, default=0, help="KV slot length in tokens (default: the role's longest request)"
    )
    ap.add_argument("--d-model", type=int, default=ModelConfig.d_model)
    ap.add_argument("--layers", type=int, default=ModelConfig.layers)
    ap.add_argument("--heads", type=int, default=ModelConfig.heads)
    ap.add_argument("--ffn", type=int, default=ModelConfig.ffn)
    ap.add_argument("--vocab", type=int, default=ModelConfig.vocab)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--no-cuda-graphs",
        action="store_true",
        help="decode eagerly (one kernel launch at a time) instead of replaying graphs",
    )
    ap.add_argument(
        "--self-check", action="store_true", help="on a GPU: check cached decode against recompute, then exit"
    )
    ap.add_argument("--fake-model", action="store_true", help="no GPU: a stand-in that sleeps instead (plumbing tests)")
    ap.add_argument("--deadline", type=float, default=540.0, help="the process never lives longer (s)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.self_check:
        return self_check()
    if args.role == "prefill":
        args.concurrency = max(args.concurrency, ROLES["prefill"].prefill_batch)
    # a watchdog: whatever happens, the process ends at its deadline
    timer = threading.Timer(args.deadline + 5.0, lambda: os._exit(3))
    timer.daemon = True
    timer.start()
    return serve(args)


if __name__ == "__main__":
    raise SystemExit(main())
