"""The Serving board: what the GPUs that serve models produce, per model and role (prefill, decode,
both, frontend): replicas, GPUs, tokens per second, tokens per GPU-second, joules per output token,
TTFT and inter-token latency, KV-cache use and the request queue; then each serving pod.

One definition: every figure is a ``gpulens.serving`` recording rule (``dashboard/serving/rules.py``
writes them; docs/serving.md lists them); nothing here divides or takes a quantile again. The
serving series carry ``cluster``, ``namespace``, ``model`` and ``role`` (no node or GPU: a model spans
nodes), so the panels filter by the Cluster and Namespace variables; the GPUs of each pod are joined
through the allocation series, which the Node and GPU variables filter.
"""

from __future__ import annotations

from .model import (
    CL,
    DEV,
    GPU,
    NS,
    PCT,
    POD,
    SERVING,
    WORKLOADS,
    Board,
    Panel,
    Table,
    Target,
    stat,
    t,
)

MODEL_ROLE = "{{namespace}} {{model}} {{role}}"
"""The legend of a per-model series: a model's roles are kept apart."""
MODEL_COLUMNS = (("namespace", "Namespace"), ("model", "Model"), ("role", "Role"))
POD_SERVING_COLUMNS = (
    ("namespace", "Namespace"),
    ("pod", "Pod"),
    ("model", "Model"),
    ("serving_engine", "Engine"),
    ("role", "Role"),
    ("role_source", "Role from"),
)
TOK_S = "suffix: tok/s"
TOK_GPU_S = "suffix: tok/GPU-s"
J_TOK = "suffix: J/tok"
ROLE_WORDS = (
    "Roles: prefill, decode, both (aggregated serving) or frontend (Dynamo's, no GPU), as the pod's labels "
    "declare them, else inferred from its GPUs' classes (docs/serving.md)."
)


def _model(rule: str) -> str:
    """A per-model rule under the Cluster and Namespace variables."""
    return f"gpulens:serving_model_{rule}{{{NS}}}"


def _model_table(rule: str) -> Target:
    return t(f"max by (cluster, namespace, model, role) ({_model(rule)})", instant=True)


def _pod(rule: str, matchers: str = "") -> str:
    """A per-pod rule under the Cluster and Namespace variables (and ``matchers``, ", a=\"b\"")."""
    return f"gpulens:serving_{rule}{{{NS}{matchers}}}"


def _pod_table(rule: str) -> Target:
    return t(f"max by (cluster, namespace, pod, model, serving_engine, role, role_source) ({_pod(rule)})", instant=True)


def _pod_gpu_side(rule: str) -> Target:
    """A per-pod GPU-side rule (labels ``cluster, namespace, pod`` only) with the pod's model, engine
    and role: the info series is the many side (a pod serving two models has a row for each)."""
    return t(
        "max by (cluster, namespace, pod, model, serving_engine, role, role_source) "
        f"({_pod('pod:info')} * on (cluster, namespace, pod) group_left () {_pod(rule)})",
        instant=True,
    )


MODEL_TABLE_VALUES: tuple[tuple[str, str, str], ...] = (
    ("pods:count", "Replicas", "short"),
    ("gpus:sum", "GPUs", "short"),
    ("input_tokens:rate5m", "Input", TOK_S),
    ("output_tokens:rate5m", "Output", TOK_S),
    ("output_tokens_per_gpu_second:ratio", "Output per GPU", TOK_GPU_S),
    ("input_tokens_per_gpu_second:ratio", "Input per GPU", TOK_GPU_S),
    ("joules_per_output_token:ratio", "Energy per output token", J_TOK),
    ("requests:rate5m", "Requests", "reqps"),
    ("nvlink_bytes:rate5m", "NVLink (KV)", "Bps"),
    ("nvlink_utilization:ratio", "NVLink use", PCT),
    ("nic_bytes:rate5m", "NICs (KV)", "Bps"),
    ("nic_utilization:ratio", "NIC use", PCT),
)
"""(rule suffix, column header, unit) of the throughput table, one row per model and role."""
LATENCY_TABLE_VALUES: tuple[tuple[str, str, str], ...] = (
    ("ttft_seconds:p50_5m", "TTFT p50", "s"),
    ("ttft_seconds:p95_5m", "TTFT p95", "s"),
    ("itl_seconds:p50_5m", "ITL p50", "s"),
    ("itl_seconds:p95_5m", "ITL p95", "s"),
    ("kv_cache_usage:ratio_avg5m", "KV cache (mean)", PCT),
    ("kv_cache_usage:ratio_max5m", "KV cache (fullest pod)", PCT),
    ("requests_running:avg5m", "Running", "short"),
    ("requests_queued:avg5m", "Queued", "short"),
)
"""(rule suffix, header, unit) of the latency and load table."""
POD_TABLE_VALUES: tuple[tuple[str, str, str], ...] = (
    ("output_tokens:rate5m", "Output", TOK_S),
    ("input_tokens:rate5m", "Input", TOK_S),
    ("output_tokens_per_gpu_second:ratio", "Output per GPU", TOK_GPU_S),
    ("input_tokens_per_gpu_second:ratio", "Input per GPU", TOK_GPU_S),
    ("joules_per_output_token:ratio", "Energy per output token", J_TOK),
    ("requests:rate5m", "Requests", "reqps"),
    ("ttft_seconds:p95_5m", "TTFT p95", "s"),
    ("itl_seconds:p95_5m", "ITL p95", "s"),
    ("kv_cache_usage:ratio_avg5m", "KV cache", PCT),
    ("requests_running:avg5m", "Running", "short"),
    ("requests_queued:avg5m", "Queued", "short"),
)
"""(per-pod rule suffix, header, unit) of the pods table, after the GPUs and watts."""

LINK_TX, LINK_RX = (_pod("pod_link_bytes:rate5m", f', direction="{d}"') for d in ("tx", "rx"))
"""Each serving pod's link bytes sent and received."""

SERVING_BOARD = Board(
    SERVING,
    "gpulens / Serving: tokens, latency and cost per model",
    "What the GPUs that serve models produce, per model and role: replicas, GPUs, tokens per second and per "
    "GPU-second, joules per output token, TTFT and inter-token latency, KV-cache use and the queue. From the "
    "gpulens.serving recording rules, which join the inference engines' own metrics (vLLM, SGLang, TGI, "
    "TensorRT-LLM, Dynamo) with gpulens' allocation and energy on (cluster, namespace, pod).",
    (
        (
            "Overview",
            (
                stat(
                    "Models served",
                    f"count(count by (cluster, namespace, model) ({_model('pods:count')})) or vector(0)",
                    "Distinct (namespace, model) pairs with at least one scraped engine pod.",
                ),
                stat(
                    "Serving pods",
                    f"sum({_model('pods:count')}) or vector(0)",
                    "Engine pods (replicas) of every model and role (gpulens:serving_model_pods:count).",
                ),
                stat(
                    "Engine pods scraped",
                    f"count({_pod('pod_engine:info')}) or vector(0)",
                    "Engine series joinable to a pod, per pod, model and engine, before the role is completed "
                    "(gpulens:serving_pod_engine:info).",
                ),
                stat(
                    "GPUs serving",
                    f"sum({_model('gpus:sum')}) or vector(0)",
                    "GPU-equivalents held by serving pods: a MIG instance by its share of the GPU, a time-sliced "
                    "GPU by the replicas held (gpulens:serving_model_gpus:sum).",
                ),
                stat(
                    "Output tokens/s",
                    f"sum({_model('output_tokens:rate5m')}) or vector(0)",
                    "Generated tokens per second, every model (a Dynamo frontend's tokens are its workers': "
                    "filter by role to avoid reading them twice).",
                    unit=TOK_S,
                ),
                stat(
                    "Engine series not joinable",
                    f"sum(gpulens:serving_unjoinable_series:count{{{CL}}}) or vector(0)",
                    "Engine counter series without namespace or pod (a scrape that did not copy them): they take "
                    "part in no figure here. Above 0: fix the scrape (docs/serving.md, Getting the engines "
                    "scraped).",
                ),
            ),
        ),
        (
            "Per model and role",
            (
                Panel(
                    "Throughput per model and role",
                    "table",
                    tuple(_model_table(rule) for rule, _, _ in MODEL_TABLE_VALUES),
                    description="Replicas, GPU-equivalents, tokens per second and per GPU-second (a sum over a sum, "
                    "never a mean of the pods' ratios), joules per output token (the GPUs' energy over the "
                    "tokens; large for a prefill pod by design: read its input per GPU), and the bytes the role's "
                    "NVLink and NICs moved, sent plus received (between prefill and decode pods, mostly the KV "
                    "cache handed on), and the busier direction's share of those links. " + ROLE_WORDS,
                    width=24,
                    table=Table(
                        MODEL_COLUMNS,
                        tuple(header for _, header, _ in MODEL_TABLE_VALUES),
                        sort="Output",
                        desc=True,
                        units={header: unit for _, header, unit in MODEL_TABLE_VALUES},
                    ),
                ),
                Panel(
                    "Latency and load per model and role",
                    "table",
                    tuple(_model_table(rule) for rule, _, _ in LATENCY_TABLE_VALUES),
                    description="Time to first token and inter-token latency (quantiles of the pods' summed "
                    "histogram buckets over 5 m), KV cache in use (mean over the pods, and the fullest pod), "
                    "requests being served and waiting (5 m means, summed over the pods).",
                    width=24,
                    table=Table(
                        MODEL_COLUMNS,
                        tuple(header for _, header, _ in LATENCY_TABLE_VALUES),
                        sort="TTFT p95",
                        desc=True,
                        units={header: unit for _, header, unit in LATENCY_TABLE_VALUES},
                    ),
                ),
            ),
        ),
        (
            "Over time",
            (
                Panel(
                    "Output tokens per second",
                    "timeseries",
                    (t(_model("output_tokens:rate5m"), MODEL_ROLE),),
                    unit=TOK_S,
                    width=12,
                ),
                Panel(
                    "Input tokens per second",
                    "timeseries",
                    (t(_model("input_tokens:rate5m"), MODEL_ROLE),),
                    unit=TOK_S,
                    width=12,
                ),
                Panel(
                    "Output tokens per GPU-second",
                    "timeseries",
                    (t(_model("output_tokens_per_gpu_second:ratio"), MODEL_ROLE),),
                    unit=TOK_GPU_S,
                    description="gpulens:serving_model_output_tokens_per_gpu_second:ratio: the roles' output "
                    "tokens per second over their GPU-equivalents.",
                    width=12,
                ),
                Panel(
                    "Joules per output token",
                    "timeseries",
                    (t(_model("joules_per_output_token:ratio"), MODEL_ROLE),),
                    unit=J_TOK,
                    description="The serving GPUs' watts over the output tokens per second "
                    "(gpulens:serving_model_joules_per_output_token:ratio).",
                    width=12,
                ),
                Panel(
                    "Time to first token",
                    "timeseries",
                    (
                        t(_model("ttft_seconds:p95_5m"), f"{MODEL_ROLE} p95"),
                        t(_model("ttft_seconds:p50_5m"), f"{MODEL_ROLE} p50"),
                    ),
                    unit="s",
                    width=12,
                ),
                Panel(
                    "Inter-token latency",
                    "timeseries",
                    (
                        t(_model("itl_seconds:p95_5m"), f"{MODEL_ROLE} p95"),
                        t(_model("itl_seconds:p50_5m"), f"{MODEL_ROLE} p50"),
                    ),
                    unit="s",
                    width=12,
                ),
                Panel(
                    "KV cache in use",
                    "timeseries",
                    (
                        t(_model("kv_cache_usage:ratio_avg5m"), f"{MODEL_ROLE} mean"),
                        t(_model("kv_cache_usage:ratio_max5m"), f"{MODEL_ROLE} fullest pod"),
                    ),
                    unit=PCT,
                    width=12,
                    max=1,
                ),
                Panel(
                    "Requests running and queued",
                    "timeseries",
                    (
                        t(_model("requests_running:avg5m"), f"{MODEL_ROLE} running"),
                        t(_model("requests_queued:avg5m"), f"{MODEL_ROLE} queued"),
                        t(_model("requests:rate5m"), f"{MODEL_ROLE} finished per second"),
                    ),
                    description="Requests being served and waiting (5 m means), and requests finished per second.",
                    width=12,
                ),
                Panel(
                    "GPUs per model and role",
                    "timeseries",
                    (
                        t(_model("gpus:sum"), f"{MODEL_ROLE} GPUs"),
                        t(_model("pods:count"), f"{MODEL_ROLE} replicas"),
                    ),
                    width=12,
                ),
                Panel(
                    "TTFT: requests within each bound",
                    "bargauge",
                    (
                        t(
                            f"sum by (le) ({_pod('ttft_seconds_bucket:rate5m')})",
                            "≤ {{le}} s",
                            instant=True,
                        ),
                    ),
                    unit="reqps",
                    description="First tokens per second answered within each bucket bound (cumulative), every "
                    "serving pod together (gpulens:serving_ttft_seconds_bucket:rate5m).",
                    width=6,
                ),
                Panel(
                    "ITL: tokens within each bound",
                    "bargauge",
                    (
                        t(
                            f"sum by (le) ({_pod('itl_seconds_bucket:rate5m')})",
                            "≤ {{le}} s",
                            instant=True,
                        ),
                    ),
                    description="Inter-token intervals per second within each bucket bound (cumulative), every "
                    "serving pod together (gpulens:serving_itl_seconds_bucket:rate5m).",
                    width=6,
                ),
            ),
        ),
        (
            "Pods",
            (
                Panel(
                    "Each serving pod",
                    "table",
                    (
                        _pod_gpu_side("pod_gpus:sum"),
                        _pod_gpu_side("pod_power:watts"),
                        *(_pod_table(rule) for rule, _, _ in POD_TABLE_VALUES),
                    ),
                    description="Each engine pod with its model, engine and role, where the role came from "
                    "(declared, engine, inferred, unknown), its GPU-equivalents and their watts "
                    "(gpulens:serving_pod_gpus:sum, gpulens:serving_pod_power:watts) and its serving figures. "
                    "Open a pod's GPUs on the Workloads board.",
                    width=24,
                    height=10,
                    link=WORKLOADS,
                    table=Table(
                        POD_SERVING_COLUMNS,
                        ("GPUs", "Power", *(header for _, header, _ in POD_TABLE_VALUES)),
                        sort="Output",
                        desc=True,
                        units={"Power": "watt"} | {header: unit for _, header, unit in POD_TABLE_VALUES},
                    ),
                ),
                Panel(
                    "GPUs of each serving pod",
                    "table",
                    (
                        t(
                            "max by (cluster, namespace, pod, node, gpu, name) "
                            f"((gpulens_pod_gpu_allocation{{{POD}}} * on (uuid) group_left (gpu, name) "
                            f"max by (uuid, gpu, name) (gpulens_gpu_info{{{DEV}}})) "
                            f"and on (cluster, namespace, pod) {_pod('pod:info')})",
                            instant=True,
                        ),
                    ),
                    description="The GPUs each serving pod holds, by node and index, and their model. Open one on "
                    "the One GPU board.",
                    width=12,
                    link=GPU,
                    table=Table(
                        (
                            ("namespace", "Namespace"),
                            ("pod", "Pod"),
                            ("node", "Node"),
                            ("gpu", "GPU"),
                            ("name", "GPU model"),
                        ),
                        (None,),
                        sort="Pod",
                    ),
                    no_value="No serving pod holds a GPU the variables select.",
                ),
                Panel(
                    "Pod TTFT and ITL medians",
                    "timeseries",
                    (
                        t(_pod("ttft_seconds:p50_5m"), "{{namespace}}/{{pod}} TTFT p50"),
                        t(_pod("itl_seconds:p50_5m"), "{{namespace}}/{{pod}} ITL p50"),
                    ),
                    unit="s",
                    width=6,
                ),
                Panel(
                    "Pod KV cache peak",
                    "timeseries",
                    (t(_pod("kv_cache_usage:ratio_max5m"), "{{namespace}}/{{pod}}"),),
                    unit=PCT,
                    description="The fullest the pod's KV cache was over 5 m "
                    "(gpulens:serving_kv_cache_usage:ratio_max5m).",
                    width=6,
                    max=1,
                ),
                Panel(
                    "Pod links now",
                    "table",
                    (
                        t(
                            f"max by (cluster, namespace, pod, link) ({LINK_TX})",
                            instant=True,
                        ),
                        t(
                            f"max by (cluster, namespace, pod, link) ({LINK_RX})",
                            instant=True,
                        ),
                        t(
                            f"max by (cluster, namespace, pod, link) ({_pod('pod_link_capacity:bytes_per_second')})",
                            instant=True,
                        ),
                    ),
                    description="Each serving pod's links over 5 m: bytes sent and received per second and what "
                    "the links carry each way at most (gpulens:serving_pod_link_bytes:rate5m, "
                    "gpulens:serving_pod_link_capacity:bytes_per_second).",
                    width=12,
                    table=Table(
                        (("namespace", "Namespace"), ("pod", "Pod"), ("link", "Link")),
                        ("Sent", "Received", "Capacity each way"),
                        sort="Sent",
                        desc=True,
                        units={"Sent": "Bps", "Received": "Bps", "Capacity each way": "Bps"},
                    ),
                    no_value="No serving pod moves bytes over NVLink or a NIC it holds alone.",
                ),
                Panel(
                    "Pod link traffic (KV transfer)",
                    "timeseries",
                    (
                        t(
                            f"sum by (cluster, namespace, pod, link, direction) ({_pod('pod_link_bytes:rate5m')})",
                            "{{namespace}}/{{pod}} {{link}} {{direction}}",
                        ),
                    ),
                    unit="Bps",
                    description="Bytes per second each serving pod's links moved, by link (nvlink: its GPUs' "
                    "NVLink, each shared by the replicas held; nic: the RDMA NICs it holds alone) and direction "
                    "(tx sent, rx received): a prefill pod sends its KV cache, a decode pod receives it "
                    "(gpulens:serving_pod_link_bytes:rate5m).",
                    width=12,
                ),
            ),
        ),
    ),
)
