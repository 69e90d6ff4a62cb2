"""The simulated inference engines' own ``/metrics`` (vLLM, SGLang, NVIDIA Dynamo's frontend and its
vLLM workers), one port per pod, for the ``serving`` scenario (exporter/sim/serving.py): a separate
process, as real engines are. The exporter never scrapes them; Prometheus does, and joins them with
gpulens' series on (namespace, pod) (docs/serving.md).

``python -m exporter.sim.engines [--address 127.0.0.1] [--port 9500] [--file-sd PATH]`` serves pod
``i`` of :func:`targets` on port ``port + i``; ``--file-sd`` writes a Prometheus file_sd list of
them carrying the labels Kubernetes service discovery would give (``__meta_kubernetes_namespace``,
``__meta_kubernetes_pod_name``, ``__meta_kubernetes_pod_label_*``), so the relabelling of
docs/serving.md applies as written.

Each exposition follows its engine's real format (names, labels, ``_total`` counters, classic
histograms with the engine's own buckets). Counters grow at the deployment's rates from the process
start (``t`` seconds): a pure function of ``t``, so tests render any instant.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from exporter.sim import scenarios
from exporter.sim import serving as sv

VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                     20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
"""vLLM v1's time-to-first-token buckets (vllm/v1/metrics/loggers.py)."""
VLLM_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0)  # fmt: skip
"""vLLM v1's inter-token latency buckets."""
SGLANG_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
                       400.0)  # fmt: skip
"""SGLang's default time-to-first-token buckets."""
SGLANG_ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2,
                      0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)  # fmt: skip
"""SGLang's default inter-token latency buckets."""
DYNAMO_TTFT_BUCKETS = (0.0, 0.0022, 0.0047, 0.01, 0.022, 0.047, 0.1, 0.22, 0.47, 1.0, 2.2, 4.7, 10.0, 22.0, 48.0,
                       100.0, 220.0, 480.0)  # fmt: skip
"""Dynamo's frontend latency buckets (its defaults, exponential from 1 ms)."""

FRONTEND_POD = f"{sv.FRONTEND}-6c9f8b7d4b-x2x7q"
"""The Dynamo frontend's pod (it holds no GPU, so the node's scenario does not list it)."""
DYNAMO_FRONTEND_PORT = 8000


@dataclass(frozen=True)
class Target:
    """One engine pod: its deployment, namespace and name, and its pod's labels."""

    deployment: sv.Deployment
    namespace: str
    pod: str


def targets() -> list[Target]:
    """The serving scenario's engine pods, in :data:`serving.DEPLOYMENTS` order (the aggregated
    Deployment's replicas in the scenario's order)."""
    pods = list(scenarios.build("serving").pods)
    out: list[Target] = []
    used: set[str] = set()
    for d in sv.DEPLOYMENTS:
        if d.role == "frontend":
            out.append(Target(d, sv.NAMESPACE, FRONTEND_POD))
            continue
        ours = (p for p in pods if p.workload == d.workload or p.name.startswith(d.workload + "-"))
        pod = next(p for p in ours if p.uid not in used)
        used.add(pod.uid)
        out.append(Target(d, pod.namespace, pod.name))
    return out


# --- exposition ------------------------------------------------------------------------------------
def _num(value: float) -> str:
    """A sample value as prometheus_client writes it (``12.0``, ``1.5e-05``)."""
    return repr(float(value))


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


class _Page:
    """Accumulates one exposition in the text format (HELP and TYPE once per family)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_: str) -> None:
        self.lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, labels: dict[str, str], value: float) -> None:
        self.lines.append(f"{name}{{{_labels(labels)}}} {_num(value)}")

    def histogram(
        self,
        name: str,
        help_: str,
        labels: dict[str, str],
        buckets: Sequence[float],
        count: float,
        median: float,
        sigma: float = 0.35,
    ) -> None:
        """A classic histogram of ``count`` observations (so far) of a log-normal latency."""
        self.family(name, "histogram", help_)
        for le in (*buckets, math.inf):
            observed = math.floor(count * sv.lognormal_cdf(le, median, sigma)) if count > 0 else 0
            self.sample(f"{name}_bucket", {**labels, "le": "+Inf" if math.isinf(le) else _num(le)}, observed)
        n = math.floor(count)
        self.sample(f"{name}_count", labels, n)
        self.sample(f"{name}_sum", labels, n * median * math.exp(sigma**2 / 2))

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def vllm(d: sv.Deployment, t: float, *, dynamo_component: str = "") -> str:
    """A vLLM v1 server's page after ``t`` seconds (vllm/v1/metrics/loggers.py: ``model_name`` and
    the data-parallel ``engine`` labels), with Dynamo's component metrics for a Dynamo worker."""
    page, lab = _Page(), {"engine": "0", "model_name": d.model.name}
    page.family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.")
    page.sample("vllm:num_requests_running", lab, d.batch)
    page.family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.")
    page.sample("vllm:num_requests_waiting", lab, d.queued)
    page.family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.")
    page.sample("vllm:kv_cache_usage_perc", lab, round(d.kv_cache_usage(), 4))
    page.family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.")
    page.sample("vllm:prompt_tokens_total", lab, math.floor(d.input_tokens_per_second() * t))
    page.family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.")
    page.sample("vllm:generation_tokens_total", lab, math.floor(d.output_tokens_per_second() * t))
    page.family("vllm:request_success_total", "counter", "Count of successfully processed requests.")
    requests = d.requests_per_second() * t
    for reason, share in (("stop", 0.8), ("length", 0.2), ("abort", 0.0)):
        page.sample("vllm:request_success_total", {**lab, "finished_reason": reason}, math.floor(requests * share))
    page.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", lab,
                   VLLM_TTFT_BUCKETS, requests, d.ttft_seconds())  # fmt: skip
    decode_tokens = max(0.0, d.output_tokens_per_second() - d.requests_per_second()) * t
    page.histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", lab,
                   VLLM_ITL_BUCKETS, decode_tokens if d.role != "prefill" else 0.0, d.itl_seconds())  # fmt: skip
    if dynamo_component:
        dyn = {"dynamo_component": dynamo_component, "dynamo_endpoint": "generate", "dynamo_namespace": sv.DISAGG}
        page.family("dynamo_component_inflight_requests", "gauge", "Number of requests currently being processed")
        page.sample("dynamo_component_inflight_requests", dyn, d.batch)
        page.family("dynamo_component_requests_total", "counter", "Total number of requests processed")
        page.sample("dynamo_component_requests_total", dyn, math.floor(requests))
    return page.text()


def sglang(d: sv.Deployment, t: float) -> str:
    """An SGLang server's page after ``t`` seconds (python/sglang/srt/metrics/collector.py)."""
    page, lab = _Page(), {"model_name": d.model.name}
    page.family("sglang:num_running_reqs", "gauge", "The number of running requests.")
    page.sample("sglang:num_running_reqs", lab, d.batch)
    page.family("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.")
    page.sample("sglang:num_queue_reqs", lab, d.queued)
    page.family("sglang:token_usage", "gauge", "The token usage.")
    page.sample("sglang:token_usage", lab, round(d.kv_cache_usage(), 4))
    page.family("sglang:gen_throughput", "gauge", "The generation throughput (token/s).")
    page.sample("sglang:gen_throughput", lab, round(d.output_tokens_per_second(), 2))
    page.family("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.")
    page.sample("sglang:prompt_tokens_total", lab, math.floor(d.input_tokens_per_second() * t))
    page.family("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.")
    page.sample("sglang:generation_tokens_total", lab, math.floor(d.output_tokens_per_second() * t))
    requests = d.requests_per_second() * t
    page.family("sglang:num_requests_total", "counter", "Number of requests processed.")
    page.sample("sglang:num_requests_total", lab, math.floor(requests))
    page.histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", lab,
                   SGLANG_TTFT_BUCKETS, requests, d.ttft_seconds())  # fmt: skip
    decode_tokens = max(0.0, d.output_tokens_per_second() - d.requests_per_second()) * t
    page.histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", lab,
                   SGLANG_ITL_BUCKETS, decode_tokens, d.itl_seconds())  # fmt: skip
    return page.text()


def dynamo_frontend(t: float) -> str:
    """The Dynamo frontend's page after ``t`` seconds (its metrics catalog, ``dynamo_frontend_*``,
    label ``model``): every request of the disaggregated deployment, prefilled by its prefill
    workers and decoded by its decode workers."""
    pf, dc = sv.deployment(sv.PREFILL), sv.deployment(sv.DECODE)
    page, lab = _Page(), {"model": pf.model.name}
    requests = pf.requests_per_second() * t
    page.family("dynamo_frontend_inflight_requests", "gauge", "Number of inflight requests")
    page.sample("dynamo_frontend_inflight_requests", lab, pf.batch + 2 * dc.batch)
    page.family("dynamo_frontend_queued_requests", "gauge", "Number of requests in HTTP processing queue")
    page.sample("dynamo_frontend_queued_requests", lab, pf.queued)
    page.family("dynamo_frontend_requests_total", "counter", "Total number of LLM requests processed")
    ok = {"endpoint": "chat_completions", "error_type": "", "model": pf.model.name, "request_type": "stream"}
    page.sample("dynamo_frontend_requests_total", {**ok, "status": "success"}, math.floor(requests))
    page.family("dynamo_frontend_output_tokens_total", "counter", "Total number of output tokens generated")
    page.sample("dynamo_frontend_output_tokens_total", lab, math.floor(requests * pf.output_tokens))
    page.histogram("dynamo_frontend_input_sequence_tokens", "Input sequence length in tokens", lab,
                   (0.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0), requests, pf.prompt_tokens, 0.2)  # fmt: skip
    first = pf.ttft_seconds() + dc.itl_seconds()  # prefill, KV hand-over, the first decode step
    page.histogram("dynamo_frontend_time_to_first_token_seconds", "Time to first token in seconds", lab,
                   DYNAMO_TTFT_BUCKETS, requests, first)  # fmt: skip
    page.histogram("dynamo_frontend_inter_token_latency_seconds", "Inter-token latency in seconds", lab,
                   DYNAMO_TTFT_BUCKETS, requests * (pf.output_tokens - 1), dc.itl_seconds())  # fmt: skip
    return page.text()


def render(target: Target, t: float) -> str:
    """``target``'s page after ``t`` seconds."""
    d = target.deployment
    if d.engine == "dynamo-frontend":
        return dynamo_frontend(t)
    if d.engine == "sglang":
        return sglang(d, t)
    component = {"prefill": "prefill", "decode": "backend"}.get(d.role, "") if d.workload.startswith(sv.DISAGG) else ""
    return vllm(d, t, dynamo_component=component)


def file_sd(address: str, port: int) -> list[dict[str, object]]:
    """A Prometheus file_sd list of the targets on ``address`` from ``port`` on, labelled as
    Kubernetes service discovery labels a pod (meta labels, dropped after relabelling)."""
    out: list[dict[str, object]] = []
    for i, target in enumerate(targets()):
        labels = {
            "__meta_kubernetes_namespace": target.namespace,
            "__meta_kubernetes_pod_name": target.pod,
            "__meta_kubernetes_pod_phase": "Running",
            "__meta_kubernetes_pod_container_port_name": "metrics",
            "__meta_kubernetes_pod_label_app_kubernetes_io_component": target.deployment.engine,
        }
        for key, value in target.deployment.pod_labels.items():
            labels["__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in key)] = value
        out.append({"targets": [f"{address}:{port + i}"], "labels": labels})
    return out


# --- serving -------------------------------------------------------------------------------------
def _handler(target: Target, start: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = render(target, time.monotonic() - start).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve the simulated inference engines' /metrics, a port a pod.")
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9500, help="port of the first pod; pod i listens on port + i")
    parser.add_argument("--file-sd", type=Path, help="write a Prometheus file_sd list of the pods here")
    args = parser.parse_args(argv)
    start = time.monotonic()
    servers = []
    for i, target in enumerate(targets()):
        # one single-threaded server a pod: a slow client holds its pod's port only
        server = HTTPServer((args.address, args.port + i), _handler(target, start))
        servers.append(server)
        threading.Thread(target=server.serve_forever, name=f"engine-{target.pod}", daemon=True).start()
        url = f"http://{args.address}:{args.port + i}/metrics"
        print(f"  {target.deployment.engine:16} {target.namespace}/{target.pod}: {url}")
    if args.file_sd:
        args.file_sd.write_text(json.dumps(file_sd(args.address, args.port), indent=2) + "\n")
    sys.stdout.flush()
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        for server in servers:
            server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
