"""A simulated week of served models whose serving advice is known, as an OpenMetrics file for
``promtool tsdb create-blocks-from openmetrics``: the exporter's series the serving advisor joins
(allocations, the pods' classes, busy ratio, memory, GPU names) and the ``gpulens.serving`` records
it reads, written as the rules would have recorded them (the rules themselves are checked by
promtool in deploy/rules/tests/serving.test.yml).

Four deployments (tests/test_advisor_serving_week.py computes each answer by hand):
- ``small``: llama-3-8b on one H200, a quarter busy, memory-bound, KV cache at most 20 % used;
- ``decode``: llama-3-70b on eight H100s, 90 % busy, memory-bound, ITL p95 40 ms;
- ``limit``: llama-3-70b-limit on two H200s at its 50 ms ITL target;
- ``dynamo``: deepseek-r1-distill-70b, prefill on two H200s (20 % busy, compute) and decode on six
  (95 % busy, memory, its queue growing); the KV transfer uses 6 % of the prefill pods' NVLink and
  28 % of their NICs, 5 % and 31 % of the decode pods'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TextIO

H200, H100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
GB = 1e9
GOLDEN = (5**0.5 - 1) / 2


@dataclass(frozen=True)
class Deployment:
    """One (namespace, model, role) and what its GPUs and engine did all week."""

    namespace: str
    model: str
    role: str
    pod: str
    gpu_name: str
    gpus: int
    busy_ratio: float
    pattern: tuple[str, ...]
    """The pod's classes in proportion: sample k takes the class at (k x the golden ratio) mod 1 of
    it, so any regular subsampling (the advisor's step) still sees each class in proportion."""
    output_tokens_per_second: float
    itl_p95_seconds: float | None
    ttft_p95_seconds: float | None
    memory_used_bytes: float
    kv_cache_max_ratio: float
    queue_slope_per_second: float = 0.0
    link_utilization: tuple[tuple[str, float], ...] = ()
    """(link, 0..1) written as ``gpulens:serving_model_<link>_utilization:ratio``."""


def _pattern(**counts: int) -> tuple[str, ...]:
    return tuple(c for c, n in counts.items() for _ in range(n))


DEPLOYMENTS = (
    Deployment(
        "small",
        "llama-3-8b",
        "both",
        "small-0",
        H200,
        1,
        0.25,
        _pattern(idle=30, memory=9, launch=1),
        2000.0,
        0.008,
        0.060,
        127 * GB,
        0.20,
    ),
    Deployment(
        "decode",
        "llama-3-70b",
        "both",
        "decode-0",
        H100,
        8,
        0.90,
        _pattern(idle=4, memory=34, launch=2),
        20000.0,
        0.040,
        0.300,
        76 * GB,
        0.90,
    ),
    Deployment(
        "limit",
        "llama-3-70b-limit",
        "both",
        "limit-0",
        H200,
        2,
        0.60,
        _pattern(idle=16, memory=23, launch=1),
        6000.0,
        0.050,
        0.400,
        130 * GB,
        0.95,
    ),
    Deployment(
        "dynamo",
        "deepseek-r1-distill-70b",
        "prefill",
        "prefill-0",
        H200,
        2,
        0.20,
        _pattern(idle=32, compute=8),
        0.0,
        None,
        0.250,
        100 * GB,
        0.30,
        link_utilization=(("nvlink", 0.06), ("nic", 0.28)),
    ),
    Deployment(
        "dynamo",
        "deepseek-r1-distill-70b",
        "decode",
        "decode-0",
        H200,
        6,
        0.95,
        _pattern(idle=2, memory=38),
        9000.0,
        0.030,
        None,
        130 * GB,
        0.92,
        queue_slope_per_second=0.001,
        link_utilization=(("nvlink", 0.05), ("nic", 0.31)),
    ),
)
CLASSES = ("idle", "launch", "latency", "communication", "memory", "compute", "mixed", "transfer", "busy", "shared")


def _uuid(d: Deployment, i: int) -> str:
    return f"GPU-{d.namespace}-{d.role}-{i}"


def write(out: TextIO, days: float, interval_s: float, end: float) -> int:
    """Write ``days`` (and an hour) ending at ``end`` every ``interval_s``; return samples written."""
    steps = int((days * 86400 + 3600) // interval_s) + 1
    stamps = [f"{end - interval_s * (steps - 1 - k):.0f}" for k in range(steps)]
    families: dict[str, list[tuple[dict[str, str], list[str]]]] = {}

    def add(name: str, labels: dict[str, str], values: list[str]) -> None:
        families.setdefault(name, []).append(({"job": "gpulens", "instance": "node:9445", **labels}, values))

    def const(value: float) -> list[str]:
        return [f"{value:.6g}"] * steps

    for d in DEPLOYMENTS:
        pod = {"namespace": d.namespace, "pod": d.pod}
        key = {"namespace": d.namespace, "model": d.model, "role": d.role}
        add("gpulens:serving_pod:info", {**pod, "model": d.model, "role": d.role, "role_source": "declared"}, const(1))
        add("gpulens:serving_model_pods:count", key, const(1))
        add("gpulens:serving_model_gpus:sum", key, const(d.gpus))
        add("gpulens:serving_model_output_tokens:rate5m", key, const(d.output_tokens_per_second))
        add("gpulens:serving_model_kv_cache_usage:ratio_max5m", key, const(d.kv_cache_max_ratio))
        add(
            "gpulens:serving_model_requests_queued:avg5m",
            key,
            [f"{3 + d.queue_slope_per_second * interval_s * k:.6g}" for k in range(steps)],
        )
        for link, share in d.link_utilization:
            add(f"gpulens:serving_model_{link}_utilization:ratio", key, const(share))
        if d.itl_p95_seconds is not None:
            add("gpulens:serving_model_itl_seconds:p95_5m", key, const(d.itl_p95_seconds))
        if d.ttft_p95_seconds is not None:
            add("gpulens:serving_model_ttft_seconds:p95_5m", key, const(d.ttft_p95_seconds))
        classes = [d.pattern[int((k * GOLDEN) % 1.0 * len(d.pattern))] for k in range(steps)]
        for c in CLASSES:
            add(
                "gpulens_pod_gpu_boundness",
                {**pod, "uuid": _uuid(d, 0), "mig_uuid": "", "class": c},
                ["1" if x == c else "0" for x in classes],
            )
        for i in range(d.gpus):
            leaf = {"uuid": _uuid(d, i), "mig_uuid": ""}
            add("gpulens_pod_gpu_allocation", {**pod, **leaf, "container": "engine"}, const(1))
            add("gpulens_gpu_info", {"uuid": leaf["uuid"], "name": d.gpu_name, "gpu": str(i)}, const(1))
            add("gpulens_gpu_busy_ratio", leaf, const(d.busy_ratio))
            add("gpulens_gpu_memory_used_bytes", leaf, const(d.memory_used_bytes))
    samples = 0
    for name, series in families.items():
        out.write(f"# TYPE {name} gauge\n")
        for labels, values in series:
            text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            out.write("".join(f"{name}{{{text}}} {v} {ts}\n" for v, ts in zip(values, stamps, strict=True)))
            samples += len(values)
    out.write("# EOF\n")
    return samples
