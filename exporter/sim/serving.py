"""The simulated ``serving`` node's inference deployments: which pod serves which model with which
engine and role, and what it produces, derived from the same figures as the GPUs' workloads
(exporter/sim/scenarios.py) so that tokens, classes, energy and links agree.

The exporter never reads this: the engines' own ``/metrics`` are served by a separate process
(``python -m exporter.sim.engines``) and joined with gpulens' series in Prometheus (docs/serving.md).

Throughput follows a roofline on one H200 (figures in docs/serving.md):

- **Decode** streams the weights and the batch's KV cache from HBM once per step: a step takes
  ``STEP_OVERHEAD_SECONDS`` + (weight bytes + batch x context x KV bytes per token) / (GPUs x HBM
  bandwidth x ``DECODE_BANDWIDTH_EFFICIENCY``); the inter-token latency is one step; steps per
  second = busy share / step; output tokens per second = steps x batch.
- **Prefill** is dense matrix work: prompt tokens per second = busy share x GPUs x BF16 FLOP/s x
  ``PREFILL_FLOPS_EFFICIENCY`` / (2 x parameters). The KV cache it hands on is prompt tokens per
  second x KV bytes per token.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

H200_HBM_BYTES_PER_SECOND = 4.8e12
"""HBM3e bandwidth of one H200 (NVIDIA's datasheet: 4.8 TB/s)."""
H200_BF16_FLOPS = 989e12
"""Dense BF16 tensor throughput of one H200 SXM (NVIDIA's datasheet: 989 TFLOPS without sparsity)."""
H200_HBM_BYTES = 141e9
"""HBM capacity of one H200 (141 GB)."""
DECODE_BANDWIDTH_EFFICIENCY = 0.7
"""Share of the HBM bandwidth a decode step achieves."""
PREFILL_FLOPS_EFFICIENCY = 0.55
"""Share of the dense BF16 throughput a prefill achieves."""
STEP_OVERHEAD_SECONDS = 0.003
"""Time of a decode step spent outside HBM reads (scheduling, sampling, kernel launches): what
bounds a small model's steps."""
KV_CACHE_SHARE = 0.9
"""Share of the HBM left after the weights that the engine gives its KV cache (vLLM's
``gpu_memory_utilization`` 0.9)."""


@dataclass(frozen=True)
class Model:
    """A served model: its name as the engine reports it, its size and its KV cache per token."""

    name: str
    parameters: float
    bytes_per_parameter: float
    kv_bytes_per_token: float
    """Layers x KV heads x head size x 2 (K and V) x bytes per element."""

    @property
    def weight_bytes(self) -> float:
        return self.parameters * self.bytes_per_parameter


QWEN_32B = Model("Qwen/Qwen2.5-32B-Instruct", 32.8e9, 2.0, 64 * 8 * 128 * 2 * 2)
LLAMA_70B = Model("meta-llama/Llama-3.1-70B-Instruct", 70.6e9, 1.0, 80 * 8 * 128 * 2 * 1)
"""FP8 weights and KV cache (one byte each)."""
QWEN_7B = Model("Qwen/Qwen2.5-7B-Instruct", 7.6e9, 2.0, 28 * 4 * 128 * 2 * 2)
LLAMA_1B = Model("meta-llama/Llama-3.2-1B-Instruct", 1.24e9, 2.0, 16 * 8 * 64 * 2 * 2)


@dataclass(frozen=True)
class Deployment:
    """One serving pod of the scenario: the engine it runs and what it serves."""

    workload: str
    """The pod's top owner in the scenario (it finds the pod, its namespace and its GPUs)."""
    engine: str
    """``vllm``, ``sglang`` or ``dynamo-frontend`` (the exposition format)."""
    model: Model
    role: str
    """``prefill``, ``decode``, ``both`` or ``frontend``."""
    gpus: int
    level: float
    """Share of the time its GPUs run its kernels (the GPU workload's level)."""
    batch: int = 1
    """Requests decoded together (running requests of a decode or aggregated pod)."""
    prompt_tokens: int = 1024
    output_tokens: int = 256
    queued: float = 0.0
    """Requests waiting, on average."""
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    """The pod's labels a scrape copies (the role the deployment declares)."""
    kv_nvlink_share: float = 0.0
    """Share of a prefill pod's KV cache handed to a decode pod on this node (over NVLink); the rest
    goes to decode pods on other nodes over its EFAs."""

    @property
    def context_tokens(self) -> float:
        """Mean tokens in a decoding request's KV cache (its prompt and half its output)."""
        return self.prompt_tokens + self.output_tokens / 2

    def step_seconds(self) -> float:
        """One decode step at full speed (seconds)."""
        read = self.model.weight_bytes + self.batch * self.context_tokens * self.model.kv_bytes_per_token
        return STEP_OVERHEAD_SECONDS + read / (self.gpus * H200_HBM_BYTES_PER_SECOND * DECODE_BANDWIDTH_EFFICIENCY)

    def decode_steps_per_second(self) -> float:
        return self.level / self.step_seconds()

    def prefill_tokens_per_second(self) -> float:
        flops = self.level * self.gpus * H200_BF16_FLOPS * PREFILL_FLOPS_EFFICIENCY
        return flops / (2 * self.model.parameters)

    def output_tokens_per_second(self) -> float:
        if self.role == "prefill":
            return self.requests_per_second()  # the first token of each request
        return self.decode_steps_per_second() * self.batch

    def requests_per_second(self) -> float:
        if self.role == "prefill":
            return self.prefill_tokens_per_second() / self.prompt_tokens
        return self.decode_steps_per_second() * self.batch / self.output_tokens

    def input_tokens_per_second(self) -> float:
        if self.role == "prefill":
            return self.prefill_tokens_per_second()
        if self.role == "decode":
            return 0.0  # prompts were computed by the prefill pods
        return self.requests_per_second() * self.prompt_tokens

    def itl_seconds(self) -> float:
        """Median inter-token latency: one decode step at full speed."""
        return self.step_seconds()

    def ttft_seconds(self) -> float:
        """Median time to first token: the prompt's prefill on the pod's GPUs, plus a queue of two
        decode steps (an aggregated pod interleaves prompts with decoding)."""
        flops = self.gpus * H200_BF16_FLOPS * PREFILL_FLOPS_EFFICIENCY
        prefill = self.prompt_tokens * 2 * self.model.parameters / flops
        return prefill + (0.0 if self.role == "prefill" else 2 * self.itl_seconds())

    def kv_cache_usage(self) -> float:
        """Fraction of the KV cache in use (0..1)."""
        cache = (self.gpus * H200_HBM_BYTES - self.model.weight_bytes) * KV_CACHE_SHARE
        running = self.batch * self.context_tokens * self.model.kv_bytes_per_token
        return min(0.97, running / cache)

    def kv_transfer_bytes_per_second(self) -> float:
        """KV cache a prefill pod hands on (bytes/s): every prompt token's KV entries."""
        return self.input_tokens_per_second() * self.model.kv_bytes_per_token if self.role == "prefill" else 0.0


NAMESPACE = "inference"
AGGREGATED = "qwen-32b-vllm"
DISAGG = "llama-70b-disagg"
PREFILL = f"{DISAGG}-prefill"
DECODE = f"{DISAGG}-decode"
FRONTEND = f"{DISAGG}-frontend"
SGLANG = "qwen-7b-sglang"
SMALL = "llama-1b-chat"

DYNAMO_SUB_COMPONENT = "nvidia.com/dynamo-sub-component-type"
DYNAMO_COMPONENT = "nvidia.com/dynamo-component-type"

DEPLOYMENTS: tuple[Deployment, ...] = (
    # GPUs 0 and 1: an aggregated vLLM Deployment, two replicas; no role label (the rules infer it)
    Deployment(AGGREGATED, "vllm", QWEN_32B, "both", 1, 0.9, batch=48, prompt_tokens=900, output_tokens=300, queued=3),
    Deployment(AGGREGATED, "vllm", QWEN_32B, "both", 1, 0.9, batch=48, prompt_tokens=900, output_tokens=300, queued=3),
    # GPUs 2-3: Dynamo's vLLM prefill worker (TP 2); 4-5: its decode worker; half the KV cache to the
    # decode worker here over NVLink, half to one on another node over the EFAs
    Deployment(PREFILL, "vllm", LLAMA_70B, "prefill", 2, 0.85, batch=4, prompt_tokens=2048, output_tokens=400,
               pod_labels={DYNAMO_COMPONENT: "worker", DYNAMO_SUB_COMPONENT: "prefill"}, kv_nvlink_share=0.5),
    Deployment(DECODE, "vllm", LLAMA_70B, "decode", 2, 0.8, batch=24, prompt_tokens=2048, output_tokens=400,
               queued=2, pod_labels={DYNAMO_COMPONENT: "worker", DYNAMO_SUB_COMPONENT: "decode"}),
    # the deployment's frontend: no GPU, every request of the model
    Deployment(FRONTEND, "dynamo-frontend", LLAMA_70B, "frontend", 0, 0.0, prompt_tokens=2048, output_tokens=400,
               pod_labels={DYNAMO_COMPONENT: "frontend"}),
    # GPU 6: SGLang, the user naming the role
    Deployment(SGLANG, "sglang", QWEN_7B, "both", 1, 0.7, batch=32, prompt_tokens=600, output_tokens=200, queued=1,
               pod_labels={"gpulens.io/serving-role": "both"}),
    # GPU 7: a 1 B model on a whole H200: a few requests at a time, most of the GPU idle
    Deployment(SMALL, "vllm", LLAMA_1B, "both", 1, 0.2, batch=4, prompt_tokens=300, output_tokens=150,
               pod_labels={"llm-d.ai/role": "both"}),
)  # fmt: skip
"""The serving node's engine pods, in GPU order (the frontend holds none)."""


def deployment(workload: str) -> Deployment:
    """The (first) deployment of ``workload``."""
    return next(d for d in DEPLOYMENTS if d.workload == workload)


def kv_bytes(workload: str) -> tuple[float, float]:
    """(NVLink, EFA) KV bytes per second a disaggregated pair moves, each from the prefill pod's
    figures: what the prefill pod sends is what the decode pods receive."""
    pf = deployment(PREFILL)
    total = pf.kv_transfer_bytes_per_second()
    return total * pf.kv_nvlink_share, total * (1 - pf.kv_nvlink_share)


def lognormal_cdf(x: float, median: float, sigma: float = 0.35) -> float:
    """Share of observations at most ``x`` of a log-normal latency of ``median`` (``sigma``: the
    spread of its logarithm)."""
    if x <= 0:
        return 0.0
    if math.isinf(x):
        return 1.0
    return 0.5 * (1 + math.erf(math.log(x / median) / (sigma * math.sqrt(2))))
