"""The serving workload's metrics under vLLM's v1 names, and its own exact counts beside them.

Names, types, label names and histogram buckets follow vLLM's ``PrometheusStatLogger``
(``vllm/v1/metrics/loggers.py``, vLLM 0.10-0.11): every series carries ``model_name`` (the served
model name) and ``engine`` (the engine core index, ``"0"`` for a single engine);
``vllm:request_success_total`` adds ``finished_reason`` (``length`` here: every synthetic request
stops at its output length).  The first output token of a request comes from its prefill and counts
as a generation token, as in vLLM.  Times are seconds.

``Counts`` is what the workload counted itself (exact integers and its own latency histograms), so
the figures Prometheus derives from the scrapes can be checked against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tests.support.serving_sched import Request

LABELS = ("model_name", "engine")
"""vLLM's label names on every series."""

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
"""vllm:time_to_first_token_seconds (seconds)."""
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
"""vllm:inter_token_latency_seconds (seconds; the buckets of the older time_per_output_token)."""
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
"""vllm:e2e_request_latency_seconds and the queue/prefill/decode/inference time histograms (seconds)."""
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
"""vllm:iteration_tokens_total: tokens per engine step."""


def buckets_1_2_5(max_value: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's request token-count buckets)."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(out)
            out.append(float(m * scale))
        scale *= 10


@dataclass
class Counts:
    """The workload's own exact figures (tokens, requests, latency observations)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_finished: int = 0
    steps: int = 0
    itl_buckets: list[int] = field(default_factory=lambda: [0] * (len(ITL_BUCKETS) + 1))
    """Observations per ITL bucket (not cumulative; the last is above 80 s)."""
    itl_sum: float = 0.0
    ttft_sum: float = 0.0
    ttft_count: int = 0

    def observe_itl(self, seconds: float) -> None:
        i = next((k for k, b in enumerate(ITL_BUCKETS) if seconds <= b), len(ITL_BUCKETS))
        self.itl_buckets[i] += 1
        self.itl_sum += seconds

    def as_dict(self) -> dict[str, object]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "generation_tokens": self.generation_tokens,
            "requests_finished": self.requests_finished,
            "steps": self.steps,
            "itl_bucket_bounds": [*ITL_BUCKETS, "+Inf"],
            "itl_bucket_counts": list(self.itl_buckets),
            "itl_sum_s": self.itl_sum,
            "itl_count": sum(self.itl_buckets),
            "ttft_sum_s": self.ttft_sum,
            "ttft_count": self.ttft_count,
        }


class EngineMetrics:
    """vLLM-named metrics of one engine in their own registry (``registry``), fed by the scheduler
    (``tests.support.serving_sched.Observer``), and the run's exact ``counts``."""

    def __init__(self, model_name: str, max_model_len: int, engine: str = "0") -> None:
        self.registry = CollectorRegistry()
        self.counts = Counts()
        values = (model_name, engine)
        r = self.registry

        def hist(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=r)

        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", LABELS, registry=r
        ).labels(*values)
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", LABELS, registry=r
        ).labels(*values)
        self.kv = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", LABELS, registry=r
        ).labels(*values)
        self.preemptions = Counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", LABELS, registry=r
        ).labels(*values)
        self.prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", LABELS, registry=r).labels(
            *values
        )
        self.generation = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", LABELS, registry=r
        ).labels(*values)
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*LABELS, "finished_reason"),
            registry=r,
        )
        self.success_length = success.labels(*values, "length")
        for reason in ("stop", "abort"):  # vLLM creates every reason's series at start
            success.labels(*values, reason)
        token_buckets = buckets_1_2_5(max_model_len)
        self.req_prompt = hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        ).labels(*values)
        self.req_generation = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", token_buckets
        ).labels(*values)
        self.iteration = hist(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_TOKENS_BUCKETS
        ).labels(*values)
        self.ttft = hist(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        ).labels(*values)
        self.itl = hist(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        ).labels(*values)
        lat = REQUEST_LATENCY_BUCKETS
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", lat).labels(
            *values
        )
        self.queue = hist(
            "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", lat
        ).labels(*values)
        self.prefill_time = hist(
            "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", lat
        ).labels(*values)
        self.decode_time = hist(
            "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", lat
        ).labels(*values)
        self.inference = hist(
            "vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", lat
        ).labels(*values)

    # --- tests.support.serving_sched.Observer -----------------------------------------------------------

    def prefilled(self, reqs: Sequence[Request], now: float) -> None:
        """``reqs`` were prefilled; their first token exists at ``now``."""
        tokens = sum(r.prompt_tokens for r in reqs)
        self.prompt.inc(tokens)
        self.generation.inc(len(reqs))
        self.counts.prompt_tokens += tokens
        self.counts.generation_tokens += len(reqs)
        for r in reqs:
            self.ttft.observe(now - r.arrival)
            self.counts.ttft_sum += now - r.arrival
            self.counts.ttft_count += 1
        if reqs:
            self.iteration.observe(tokens + len(reqs))

    def decoded(self, reqs: Sequence[Request], itls: Sequence[float]) -> None:
        """One decode step gave each of ``reqs`` one token, ``itls[i]`` after its previous one."""
        self.generation.inc(len(reqs))
        self.counts.generation_tokens += len(reqs)
        self.counts.steps += 1
        for s in itls:
            self.itl.observe(s)
            self.counts.observe_itl(s)
        if reqs:
            self.iteration.observe(len(reqs))

    def finished(self, req: Request, now: float) -> None:
        """``req`` reached its output length at ``now``."""
        self.success_length.inc()
        self.counts.requests_finished += 1
        start = req.prefill_start if req.prefill_start is not None else req.arrival
        first = req.first_token if req.first_token is not None else now
        self.e2e.observe(now - req.arrival)
        self.queue.observe(start - req.arrival)
        self.prefill_time.observe(first - start)
        self.decode_time.observe(now - first)
        self.inference.observe(now - start)
        self.req_prompt.observe(req.prompt_tokens)
        self.req_generation.observe(req.generated)

    def state(self, running: int, waiting: int, kv_usage: float) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv.set(kv_usage)
