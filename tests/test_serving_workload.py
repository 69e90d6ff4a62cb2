"""The GPU serving workload without a GPU (issue 53): the continuous-batching scheduler and the
engine's step loop (scripts/gpu_serving.py, with a stand-in for the torch model that keeps each
slot's owner), the vLLM-named metrics it publishes (names, labels, buckets, values against its own
counts), the OpenMetrics history its run writes, and the exporter page reading of the run."""

from __future__ import annotations

import gzip
import io
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.parser import text_string_to_metric_families as text_families

from tests.support import serving_engine as se
from tests.support.om_scrape import PageLog, ScrapeHistory, Target, parse_page, read_pages
from tests.support.serving_figures import (
    engine_phase,
    exporter_reading,
    generation_points,
    interpolate,
    mode_after,
    phase_figures,
)
from tests.support.serving_metrics import (
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    EngineMetrics,
    buckets_1_2_5,
)
from tests.support.serving_sched import ROLES, Request, Scheduler

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


class SlotModel:
    """The torch decoder's interface over plain lists: each slot holds (request id, context) of
    whoever's KV is there, so a wrong move or an overwrite shows."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.kv: dict[int, tuple[int, int]] = {}
        self.decodes: list[int] = []

    def prefill(self, slots: list[int], length: int) -> None:
        for slot in slots:
            owner = next(r for r in self.sched.running if r.slot == slot)
            assert owner.prompt_tokens == length
            self.kv[slot] = (owner.rid, length)

    def decode(self, lengths: list[int]) -> None:
        for slot, length in enumerate(lengths):
            req = self.sched.running[slot]
            rid, ctx = self.kv[slot]
            assert rid == req.rid, f"slot {slot} holds request {rid}'s KV, not {req.rid}'s"
            assert ctx == length - 1, f"request {rid}: KV of {ctx} tokens, decoding at {length}"
            self.kv[slot] = (rid, length)
        self.decodes.append(len(lengths))

    def move(self, src: int, dst: int, context: int) -> None:
        rid, ctx = self.kv[src]
        assert ctx == context
        self.kv[dst] = (rid, ctx)

    def sync(self) -> None:
        pass


class Clock:
    """A monotonic stand-in: each step of the loop reads a later time."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 0.004
        return self.t


def _args(role: str, pod: str) -> Any:
    import argparse

    return argparse.Namespace(role=role, pod=pod, namespace="serving", model_name="m-1b", port=8000)


def _run(
    role: str, levels: list[int], steps_each: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, EngineMetrics, Scheduler, SlotModel]:
    clock = Clock()
    max_len = se.default_max_len(role)
    metrics = EngineMetrics("m-1b", max_len)
    slots = max(levels) if role != "prefill" else ROLES[role].prefill_batch
    sched = Scheduler(role, slots, max_len, metrics, seed=3)
    model = SlotModel(sched)
    log = se.StepLog()
    for n in levels:
        sched.set_concurrency(n, clock())
        for _ in range(steps_each):
            se.step(model, sched, log, 0.0, clock, time.sleep)
    return se, metrics, sched, model


def test_requests_join_and_leave_the_running_batch_with_their_own_kv(monkeypatch: pytest.MonkeyPatch) -> None:
    _, metrics, sched, model = _run("both", [1, 8, 16], 600, monkeypatch)
    c = metrics.counts
    assert c.requests_finished > 8  # requests left and others joined the running batch
    assert max(model.decodes) == 16 and 1 in model.decodes
    # every generated token is counted once: those of finished requests plus those still running
    running = sum(r.generated for r in sched.running)
    assert c.generation_tokens >= running
    assert sorted(r.slot for r in sched.running) == list(range(len(sched.running)))
    assert len(sched.running) + len(sched.waiting) == 16


def test_prefill_role_gives_one_token_per_request_and_never_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    _, metrics, sched, model = _run("prefill", [8], 10, monkeypatch)
    c = metrics.counts
    assert model.decodes == []
    assert c.generation_tokens == c.requests_finished == 40  # 4 a step
    assert c.prompt_tokens == 40 * 2048
    assert sched.running == []


def test_decode_role_keeps_its_batch_full(monkeypatch: pytest.MonkeyPatch) -> None:
    _, metrics, _, model = _run("decode", [32], 300, monkeypatch)
    assert model.decodes[-1] == 32 and metrics.counts.prompt_tokens == 32 * 16


def test_concurrency_above_the_slots_is_refused() -> None:
    sched = Scheduler("both", 4, 2560, EngineMetrics("m", 2560))
    with pytest.raises(ValueError, match="KV slots"):
        sched.set_concurrency(5, 0.0)
    with pytest.raises(ValueError, match="max_len"):
        Scheduler("both", 4, 1000, EngineMetrics("m", 1000))


def test_kv_usage_counts_whole_blocks() -> None:
    sched = Scheduler("decode", 2, 1296, EngineMetrics("m", 1296))
    sched.running = [Request(0, 16, 800, 0.0, slot=0, generated=1)]
    # 17 tokens = 2 blocks of 16, of 2 slots x 81 blocks
    assert sched.kv_usage() == pytest.approx(2 / 162)


def test_published_names_labels_and_buckets_follow_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    _, metrics, sched, _ = _run("both", [8], 400, monkeypatch)
    page = generate_latest(metrics.registry).decode()
    fams = {f.name: f for f in text_families(page)}
    want = {
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter",
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
    }
    for name, kind in want.items():
        assert fams[name].type == kind, name
        for s in fams[name].samples:
            if s.name.endswith("_created"):
                continue
            assert s.labels["model_name"] == "m-1b" and s.labels["engine"] == "0", s
    c = metrics.counts

    def value(sample: str, **labels: str) -> float:
        fam = sample.removesuffix("_total").removesuffix("_count").removesuffix("_sum").removesuffix("_bucket")
        return next(s.value for s in fams[fam].samples if s.name == sample and labels.items() <= s.labels.items())

    assert value("vllm:generation_tokens_total") == c.generation_tokens
    assert value("vllm:prompt_tokens_total") == c.prompt_tokens
    assert value("vllm:request_success_total", finished_reason="length") == c.requests_finished
    assert value("vllm:num_requests_running") == len(sched.running)
    assert value("vllm:inter_token_latency_seconds_count") == sum(c.itl_buckets)
    assert value("vllm:time_to_first_token_seconds_count") == c.ttft_count

    def bounds(fam: str) -> list[float]:
        return [float(s.labels["le"]) for s in fams[fam].samples if s.name == fam + "_bucket"]

    assert bounds("vllm:time_to_first_token_seconds") == [*TTFT_BUCKETS, float("inf")]
    assert bounds("vllm:inter_token_latency_seconds") == [*ITL_BUCKETS, float("inf")]
    assert bounds("vllm:e2e_request_latency_seconds") == [*REQUEST_LATENCY_BUCKETS, float("inf")]
    assert len(TTFT_BUCKETS) == 22 and len(ITL_BUCKETS) == 19 and len(REQUEST_LATENCY_BUCKETS) == 21
    # the ITL histogram the engine counts itself is the published one, bucket for bucket
    cumulative = [s.value for s in fams["vllm:inter_token_latency_seconds"].samples if s.name.endswith("_bucket")]
    own = [sum(c.itl_buckets[: i + 1]) for i in range(len(c.itl_buckets))]
    assert cumulative == own


def test_token_count_buckets_are_vllms_1_2_5() -> None:
    assert buckets_1_2_5(100) == (1, 2, 5, 10, 20, 50, 100)
    assert buckets_1_2_5(2560)[-1] == 2000


def _engine_page(metrics: EngineMetrics) -> str:
    return generate_latest(metrics.registry).decode()


EXPORTER_PAGE = """# HELP gpulens_gpu_boundness What limits the leaf.
# TYPE gpulens_gpu_boundness gauge
gpulens_gpu_boundness{class="memory",gpu="0",mig_uuid="",node="gpu-node-1",uuid="GPU-a"} 1
gpulens_gpu_boundness{class="compute",gpu="0",mig_uuid="",node="gpu-node-1",uuid="GPU-a"} 0
# TYPE gpulens_pod_gpu_boundness gauge
gpulens_pod_gpu_boundness{class="memory",container="vllm",gpu="0",namespace="serving",node="n1",pod="llm-agg-x"} 1
# TYPE gpulens_gpu_busy_ratio gauge
gpulens_gpu_busy_ratio{gpu="0",mig_uuid="",node="gpu-node-1",uuid="GPU-a"} 0.93
# TYPE gpulens_gpu_energy_joules_total counter
gpulens_gpu_energy_joules_total{gpu="0",mig_uuid="",node="gpu-node-1",uuid="GPU-a"} 1234.5
gpulens_gpu_energy_joules_created{gpu="0",mig_uuid="",node="gpu-node-1",uuid="GPU-a"} 1.7e9
"""


def _history(metrics: EngineMetrics, times: list[float]) -> tuple[ScrapeHistory, str]:
    engine = Target(
        {"job": "serving/vllm", "instance": "127.0.0.1:8003", "namespace": "serving", "pod": "llm-decode-x"}
    )
    exporter = Target({"job": "gpulens", "instance": "gpu-node-1:9445", "node": "from-target"}, honor=True)
    history = ScrapeHistory()
    page = _engine_page(metrics)
    for t in times:
        history.add(engine, page, t)
        history.add(exporter, EXPORTER_PAGE, t + 0.5)
    out = io.StringIO()
    history.write(out)
    return history, out.getvalue()


def test_history_is_openmetrics_with_target_labels_and_no_created(monkeypatch: pytest.MonkeyPatch) -> None:
    _, metrics, _, _ = _run("decode", [4], 5, monkeypatch)
    # one scrape: the strict OpenMetrics parser (it mis-reads a histogram over several timestamps)
    _, text = _history(metrics, [100.0])
    assert text.endswith("# EOF\n") and "_created" not in text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    gen = fams["vllm:generation_tokens"]
    assert gen.type == "counter"
    labels = gen.samples[0].labels
    assert labels["namespace"] == "serving" and labels["pod"] == "llm-decode-x" and labels["model_name"] == "m-1b"
    assert float(gen.samples[0].timestamp) == 100.0
    assert fams["vllm:inter_token_latency_seconds"].type == "histogram"
    energy = fams["gpulens_gpu_energy_joules"].samples[0]
    assert energy.name == "gpulens_gpu_energy_joules_total" and energy.value == 1234.5
    assert "namespace" not in energy.labels  # the exporter's target labels do not invent a pod
    assert energy.labels["node"] == "gpu-node-1"  # honorLabels: the exporter's own node wins
    pod = fams["gpulens_pod_gpu_boundness"].samples[0].labels
    assert pod["namespace"] == "serving" and pod["node"] == "n1"
    assert labels.get("node") is None  # an engine target gets no node


def test_a_page_label_under_a_target_label_is_kept_as_exported() -> None:
    history = ScrapeHistory()
    history.add(Target({"job": "serving/vllm", "pod": "p-1"}), '# TYPE up_g gauge\nup_g{pod="inner"} 1\n', 5.0)
    line = next(x for x in io.StringIO(_written(history)) if x.startswith("up_g"))
    assert 'exported_pod="inner"' in line and 'pod="p-1"' in line


def _written(history: ScrapeHistory) -> str:
    out = io.StringIO()
    history.write(out)
    return out.getvalue()


def test_histogram_points_stay_together_in_time_order(monkeypatch: pytest.MonkeyPatch) -> None:
    _, metrics, _, _ = _run("decode", [4], 5, monkeypatch)
    _, text = _history(metrics, [101.0, 100.0])
    itl = [line for line in text.splitlines() if line.startswith("vllm:inter_token_latency_seconds")]
    per_point = len(ITL_BUCKETS) + 3  # buckets with +Inf, count, sum
    assert len(itl) == 2 * per_point
    assert {line.rsplit(" ", 1)[1] for line in itl[:per_point]} == {"100.000"}
    assert itl[per_point - 3].split("{")[0].endswith("_bucket") and 'le="+Inf"' in itl[per_point - 3]


@pytest.mark.integration
def test_promtool_backfills_the_history(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The history of several scrapes goes through ``promtool tsdb create-blocks-from openmetrics``
    and the engine's counter comes back with its pod's labels."""
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run the README test command (scripts/test.sh)")
    _, metrics, _, _ = _run("decode", [4], 5, monkeypatch)
    _, text = _history(metrics, [1_700_000_000.0 + k for k in range(5)])
    (tmp_path / "h.om").write_text(text)
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(tmp_path / "h.om"), str(tmp_path / "db")],
        check=True,
        capture_output=True,
    )
    (tmp_path / "db" / "wal").mkdir()  # promtool 2.42's dump opens the WAL too
    dump = subprocess.run(
        [promtool, "tsdb", "dump", "--match", '{__name__="vllm:generation_tokens_total"}', str(tmp_path / "db")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    lines = [line for line in dump.splitlines() if line.startswith("{")]
    assert len(lines) == 5, dump[:500]
    assert 'pod="llm-decode-x"' in lines[0] and 'namespace="serving"' in lines[0]


def test_a_page_without_type_lines_is_unknown_families() -> None:
    types, samples = parse_page('foo_total{a="1"} 3\nbar 2\n')
    assert types == {}
    assert [(f, n) for f, n, _, _ in samples] == [("foo_total", "foo_total"), ("bar", "bar")]
    history = ScrapeHistory()
    history.add(Target({"job": "j"}), 'foo_total{a="1"} 3\n', 1.0)
    out = io.StringIO()
    history.write(out)
    assert "# TYPE foo_total unknown" in out.getvalue()
    list(text_string_to_metric_families(out.getvalue()))


def test_exporter_reading_and_phase_figures() -> None:
    r = exporter_reading(EXPORTER_PAGE)
    assert r == {
        "gpu_class": "memory",
        "busy": 0.93,
        "energy_j": 1234.5,
        "pod_classes": {"serving/llm-agg-x": "memory"},
    }
    assert interpolate([(0.0, 0.0), (10.0, 100.0)], 2.5) == 25.0
    assert interpolate([(0.0, 0.0), (10.0, 100.0)], 12.0) == 100.0
    rows: list[tuple[float, str | None]] = [(float(t), "launch" if t < 12 else "memory") for t in range(0, 21)]
    m = mode_after(rows, 0.0, 20.0, 10.0)
    assert m["class"] == "memory" and m["settled_counts"] == {"launch": 1, "memory": 9}


def test_the_model_has_at_least_a_billion_parameters() -> None:
    assert se.ModelConfig().params >= 1_000_000_000
    assert se.ModelConfig().kv_bytes_per_token() == 2 * 16 * 2048 * 2


def test_engine_summary_counts_per_level(monkeypatch: pytest.MonkeyPatch) -> None:
    _, metrics, _, _ = _run("both", [1], 1, monkeypatch)
    log = se.StepLog()
    log.add(10.0, 1, 1500, 0, 0.02, 0.0)
    log.add(10.5, 0, 0, 1, 0.0, 0.003)
    log.add(20.5, 0, 0, 8, 0.0, 0.004)
    args = _args("both", "p")
    s = se.summary(args, se.ModelConfig(), 64, 2560, 1.0, 10.0, 30.0, [(10.0, 1), (20.0, 8)], [], [], log, metrics)
    assert [lv["generation_tokens"] for lv in s["levels"]] == [2, 8]
    assert s["levels"][1]["mean_decode_batch"] == 8
    assert s["model"]["params"] == se.ModelConfig().params


@pytest.mark.integration
def test_engine_script_help_needs_no_torch() -> None:
    import subprocess

    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SCRIPTS.parent)}
    code = "import sys; sys.modules['torch'] = None; sys.argv = ['gpu_serving.py', '--help']; "
    code += f"import runpy; runpy.run_path({str(SCRIPTS / 'gpu_serving.py')!r}, run_name='__main__')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--role" in done.stdout and "--sweep" in done.stdout


@pytest.mark.gpu
@pytest.mark.integration
def test_cached_decode_equals_recompute_on_a_gpu() -> None:
    """The model's KV-cache decode, eager and through CUDA graphs, against recomputing the sequence."""
    import subprocess

    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "gpu_serving.py"), "--self-check"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "captured 0" not in done.stdout.splitlines()[1], done.stdout


@pytest.mark.gpu
@pytest.mark.integration
def test_engine_on_a_gpu_publishes_what_it_counts(tmp_path: Path) -> None:
    """A short run of the real engine (2 layers) on a GPU: the scraped counters equal its summary."""
    import json
    import socket
    import subprocess
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    summary = tmp_path / "s.json"
    cmd = [
        sys.executable,
        str(SCRIPTS / "gpu_serving.py"),
        "--role",
        "both",
        "--layers",
        "2",
        "--sweep",
        "1,4",
        "--hold",
        "3",
    ]
    cmd += ["--port", str(port), "--summary", str(summary), "--deadline", "120"]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().startswith("ready")
        proc.stdin.write(f"go {time.time() + 0.5} 6\n")
        proc.stdin.flush()
        assert proc.stdout.readline().startswith("done")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            page = r.read().decode()
        own = json.loads(summary.read_text())
        fams = {f.name: f for f in text_families(page)}
        gen = next(s.value for s in fams["vllm:generation_tokens"].samples if s.name.endswith("_total"))
        assert gen == own["counts"]["generation_tokens"] > 0
        assert [lv["concurrency"] for lv in own["levels"]] == [1, 4]
    finally:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(30)


def test_pages_round_trip_through_gzip(tmp_path: Path) -> None:
    log = PageLog(tmp_path / "p.gz")
    log.add("a 1", 1.0)
    log.add("a 2\n", 2.0)
    log.close()
    assert read_pages(tmp_path / "p.gz") == [(1.0, "a 1\n"), (2.0, "a 2\n")]
    with gzip.open(tmp_path / "p.gz", "rt") as f:
        assert f.readline() == "# SCRAPE 1.000\n"


def test_run_figures_per_phase_from_engine_summaries_and_readings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device run's figures (bench/gpu_serving_run.py) from an engine's summary, the 1 s
    readings and the scraped counters: tokens, joules per token, classes, ITL, the Prometheus check."""
    _, metrics, _, _ = _run("decode", [8], 1, monkeypatch)
    counts0 = metrics.counts.as_dict()
    g0 = metrics.counts.generation_tokens
    assert (1000 - g0) % 2 == 0
    metrics.counts.generation_tokens = 1000
    metrics.counts.itl_buckets[0] = 900
    metrics.counts.itl_sum = 4.5
    counts1 = metrics.counts.as_dict()
    summary = se.summary(
        _args("decode", "llm-decode-x"), se.ModelConfig(), 8, 1296, 1.0, 100.0, 120.0, [(100.0, 8)],
        [{"t": 100.0, "counts": counts0}, {"t": 120.0, "counts": counts1}],
        [(100.0, g0, 0, 0, 8, 0), (110.0, (g0 + 1000) // 2, 0, 0, 8, 0), (120.0, 1000, 0, 0, 8, 0)],
        se.StepLog(), metrics,
    )  # fmt: skip
    readings = [
        {"t": 100.0 + k, "nvml_energy_j": 1000.0 + 300.0 * k, "gpu_class": "launch" if k < 11 else "memory",
         "busy": 0.9, "pod_classes": {"serving/llm-decode-x": "memory"}}
        for k in range(21)
    ]  # fmt: skip
    scraped = {"decode": [(101.0, g0 + (1000 - g0) * 0.05), (119.0, g0 + (1000 - g0) * 0.95)]}
    phase = {"name": "decode_solo", "start": 100.0, "end": 120.0, "engines": ["decode"]}
    pods = {"decode": "serving/llm-decode-x"}
    ph = phase_figures([phase], readings, {"decode": summary}, scraped, pods)[0]
    assert ph["nvml_energy_j"] == pytest.approx(6000.0)
    assert ph["generation_tokens"] == pytest.approx(1000.0 - g0)
    assert ph["joules_per_generated_token"] == pytest.approx(6000.0 / (1000 - g0))
    assert ph["gpu_class"]["class"] == "memory"
    assert ph["pod_classes"]["serving/llm-decode-x"]["class"] == "memory"
    own = ph["engines_own"]["decode"]
    n = 900 - counts0["itl_bucket_counts"][0]  # type: ignore[index]
    assert own["itl_bucket_counts"][0] == n and sum(own["itl_bucket_counts"]) == n
    assert own["itl_mean_s"] == pytest.approx((4.5 - counts0["itl_sum_s"]) / n)  # type: ignore[operator]
    assert own["prometheus_check"]["ratio"] == pytest.approx(1.0)
    # the engine's own figures alone, without scrapes: no check to give
    assert "prometheus_check" not in engine_phase(summary, [], 100.0, 120.0)


def test_own_counts_move_in_steps_where_the_steps_are_known() -> None:
    """The counter a scrape reads moves at the end of a step and holds in between: the own count
    at a scrape time is the one at the last step end before it, not a line between two steps."""
    summary = {"start": 10.0, "steps": [(10.0, 4, 8192, 0, 0.5, 0.0), (10.5, 4, 8192, 0, 0.5, 0.0)]}
    points, stepwise = generation_points(summary)
    assert stepwise and points == [(10.0, 0.0), (10.5, 4.0), (11.0, 8.0)]
    assert interpolate(points, 10.9, hold=True) == 4.0
    assert interpolate(points, 10.9) == pytest.approx(7.2)


@pytest.mark.integration
def test_the_device_run_end_to_end_on_the_simulated_node(tmp_path: Path) -> None:
    """bench/gpu_serving_run.py --dry-run: the real exporter (simulated node, the full attribution
    chain), two short aggregated levels and the disaggregated pair with a stand-in model, scraped
    each second; its three files, a history promtool can read, and the engines' pods."""
    import json
    import os
    import shutil
    import subprocess

    from tests.support.net import free_port

    repo = SCRIPTS.parent
    cmd = [sys.executable, "-m", "bench.gpu_serving_run", "--dry-run", "--out", str(tmp_path), "--idle", "1"]
    cmd += ["--hold", "2", "--sweep", "1,8", "--solo", "1", "--together", "3", "--exporter-port", str(free_port())]
    cmd += ["--port", "0"]  # each engine binds a free port and says which
    env = {**os.environ, "PYTHONPATH": str(repo)}
    done = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, env=env, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["details.tgz", "history.om.gz", "summary.json"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["attribution"] == "full"
    names = [p["name"] for p in summary["phases"]]
    assert names == ["idle", "agg_b1", "agg_b8", "prefill_solo", "disagg", "decode_solo", "idle_end"]
    pods = {e["pod"] for e in summary["engines"].values()}
    assert len(pods) == 3 and all(p.startswith("serving/llm-") for p in pods)
    assert set(summary["pid_pods"].values()) == pods
    disagg = summary["phases"][4]
    assert set(disagg["engines_own"]) == {"prefill", "decode"} and disagg["generation_tokens"] > 0
    if shutil.which("promtool") is None:
        pytest.fail("promtool is not installed: run the README test command (scripts/test.sh)")
    # back here: the serving rules recorded over the history, read at each phase's end
    cmd = [sys.executable, "-m", "bench.serving_analysis", str(tmp_path), "--json", str(tmp_path / "rows.json")]
    cmd += ["--window", "3"]  # the phases here last 1-3 s; a rate needs two scrapes
    done = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads((tmp_path / "rows.json").read_text())
    # a record reading records is a pass later (and promtool offsets each pass's evaluations): the
    # first second of a run's first phase may have rates but no ratio yet
    served = [r for r in rows if r["engine"] and r["own_tok_s"] and r["tok_per_gpu_s"]]
    found = {(r["phase"], r["engine"]) for r in served}
    assert ("disagg", "decode") in found and found & {("agg_b1", "both"), ("agg_b8", "both")}, found
    for r in served:
        # each engine pod holds one of GPU 0's three time-slicing replicas: a third of a GPU
        assert r["pod"] in pods and r["model"] == "gpulens-llama-1b" and r["role_source"] in {"inferred", "unknown"}
        assert r["pod_gpus"] == pytest.approx(1 / 3), r
        assert r["tok_per_gpu_s"] == pytest.approx(r["rules_tok_s"] / r["pod_gpus"], rel=1e-6), r
    # the rules' rate against the engine's own count where the 3 s window lies inside the phase (a
    # shorter phase's window reaches into the engine's start, when it generated nothing)
    whole = [r for r in served if r["seconds"] >= 3]
    assert whole and all(0.5 < r["tok_ratio"] < 1.5 for r in whole), whole
    assert "| agg_b8 | both |" in done.stdout


@pytest.mark.gpu
@pytest.mark.integration
def test_the_device_run_short_on_a_gpu(tmp_path: Path) -> None:
    """bench/gpu_serving_run.py on a GPU with the NVML exporter, short phases and a 2-layer model:
    energy per token, the exporter's readings and the engines' pods come back."""
    import json
    import os
    import subprocess

    from tests.support.net import free_port

    repo = SCRIPTS.parent
    cmd = [sys.executable, "-m", "bench.gpu_serving_run", "--out", str(tmp_path), "--idle", "1", "--hold", "3"]
    cmd += ["--sweep", "1,8", "--solo", "3", "--together", "4", "--exporter-port", str(free_port()), "--port", "0"]
    cmd += ["--model-args", "--layers", "2"]
    done = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["attribution"] in ("full", "kubelet", "none")
    agg = summary["phases"][2]
    assert agg["name"] == "agg_b8" and agg["generation_tokens"] > 0 and agg["joules_per_generated_token"] > 0
    assert any(r.get("gpu_class") for r in summary["readings"])
