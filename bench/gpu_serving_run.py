#!/usr/bin/env python3
"""Device run of the serving workload (issue 53) beside the real exporter, on GPU 0.

Phases, one after another (defaults; about 4.5 minutes in all):
  idle           10 s   nothing on the GPU (the exporter alone)
  agg_b1..b64   5x20 s  one aggregated engine (pod serving/llm-agg-...), 1, 8, 16, 32, 64 requests
  prefill_solo   20 s   the prefill-only engine alone (pod llm-prefill-...; the decode engine is
                        started after it, so no other pod has a process on the GPU)
  disagg         30 s   the prefill-only and the decode-only engine time-sliced on the GPU
  decode_solo    20 s   the decode-only engine alone (pod llm-decode-...; the prefill engine ended)
  idle_end       10 s
Engines start (model build, warm-up) between phases, outside them.

Every second it scrapes the exporter (``python3 -m exporter --backend nvml``) and every live
engine, keeping each page (``pages-<target>.txt.gz``), and reads GPU 0's energy counter through
NVML.  The engines' series get the target labels a PodMonitor would give them (``namespace``,
``pod``, ``container``, ``job``, ``instance``); the exporter's keep their own (``honorLabels``).
Attribution: with the test fakes importable (grpcio, protobuf, h2; PyYAML for the exporter's
kubeconfig) the exporter runs the chart's whole chain against a real gRPC kubelet and the API
emulator that list the three engine pods time-slicing GPU 0 (``<uuid>::0..2``), and a procfs
folder puts each engine's PIDs (its own, and the ones NVML reports once it runs) in its pod's
container; else against the kubelet alone; else NVML only (``--attribution``).

Writes into --out (at most 8 files, what a device call brings back):
  summary.json     per phase: its bounds, the exporter's class for the GPU and each pod (the mode
                   over the phase after the classifier's window, and every class counted), NVML
                   energy (J) and joules per generated token, each engine's own token counts and
                   tokens/s, the ITL histogram, and the engines' Prometheus counters against their
                   own counts over the same scrapes; the PID -> pod map; the facts of the machine
  history.om.gz    every scrape as one OpenMetrics history: ``gunzip`` it, then
                   ``promtool tsdb create-blocks-from openmetrics history.om DIR``
  details.tgz      each engine's summary (per-step timings, per-second counts), the raw pages,
                   the exporter's and engines' logs, nvidia-smi's facts
  run.log          what this script printed

    bash scripts/gpu_serving_run.sh                       # on the device, from the repository root
    python3 -m bench.gpu_serving_run --out DIR --hold 20 --solo 20 --together 30 --idle 10
    python3 -m bench.gpu_serving_run --rebuild DIR --role-label llm_d_ai_role   # here: history again
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.om_scrape import PageLog, ScrapeHistory, Target, read_pages  # noqa: E402
from tests.support.serving_figures import engine_generation, exporter_reading, phase_figures  # noqa: E402

NAMESPACE = "serving"
NODE = "gpu-node-1"
MODEL_NAME = "gpulens-llama-1b"
ENGINE_PODS: dict[str, tuple[str, str]] = {
    "both": ("llm-agg", "vllm"),
    "prefill": ("llm-prefill", "vllm"),
    "decode": ("llm-decode", "vllm"),
}
"""Role -> (Deployment, container) of its engine pod."""
# --- the run ----------------------------------------------------------------------------------------


@dataclass
class Engine:
    role: str
    pod: str
    container: str
    port: int
    proc: subprocess.Popen[str]
    summary: Path
    pids: list[int] = field(default_factory=list)
    ready_line: str = ""


class Run:
    """The exporter, the engines, the 1 s scraper and the phase records of one run."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.work = self.out / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.history = ScrapeHistory()
        self.targets: dict[str, tuple[str, Target, PageLog]] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.readings: list[dict[str, Any]] = []
        """Per second: t, NVML energy (J) and power (W), the exporter's reading."""
        self.engine_gen: dict[str, list[tuple[float, float]]] = {}
        """Target -> (scrape time, vllm:generation_tokens_total)."""
        self.phases: list[dict[str, Any]] = []
        self.engines: dict[str, Engine] = {}
        self.pid_pods: dict[int, str] = {}
        self.nvml: Any = None
        self.handle: Any = None
        self.chain: Any = None
        self.chain_folder: Path | None = None
        self.attribution = "none"
        self.pod_uids: dict[str, tuple[str, str]] = {}
        self.pod_names: dict[str, str] = {}
        self.exporter: subprocess.Popen[bytes] | None = None

    def log(self, msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)

    # --- NVML ------------------------------------------------------------------------------------

    def nvml_init(self) -> str:
        """GPU 0's UUID (NVML; the simulated node's first GPU in a dry run)."""
        if self.args.dry_run:
            from exporter.sim import scenarios

            return str(scenarios.build("h200x8").gpus[0].uuid)
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        uuid = pynvml.nvmlDeviceGetUUID(self.handle)
        return uuid.decode() if isinstance(uuid, bytes) else str(uuid)

    def energy_power(self) -> tuple[float | None, float | None]:
        nv = self.nvml
        if nv is None:
            return None, None
        try:
            e = nv.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0
        except nv.NVMLError:
            e = None
        try:
            p = nv.nvmlDeviceGetPowerUsage(self.handle) / 1000.0
        except nv.NVMLError:
            p = None
        return e, p

    def compute_pids(self) -> set[int]:
        nv = self.nvml
        if nv is None:
            return set()
        try:
            return {p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(self.handle)}
        except nv.NVMLError:
            return set()

    # --- attribution --------------------------------------------------------------------------

    def start_chain(self, stack: ExitStack, uuid: str) -> tuple[tuple[str, ...], dict[str, str]]:
        """The exporter's attribution flags and environment (see the module docstring)."""
        want = self.args.attribution
        import random

        from bench import exporter_rss as rss

        rng = random.Random("gpulens-serving")
        pods = []
        for replica, role in enumerate(("both", "prefill", "decode")):
            workload, container = ENGINE_PODS[role]
            owned = rss._owned(rng, NAMESPACE, "Deployment", workload, 0)
            uid = rss._uid(NAMESPACE, owned["name"])
            self.pod_names[role] = owned["name"]
            self.pod_uids[role] = (uid, container)
            pods.append(
                rss.NodePod(
                    NAMESPACE,
                    owned["name"],
                    uid,
                    owned["owner"],
                    (container,),
                    {container: (f"{uuid}::{replica}",)},
                    owned.get("template_hash"),
                    app=workload,
                )
            )
        plan = rss.NodePlan(tuple(pods), tuple(f"{uuid}::{r}" for r in range(3)), {})
        no_kubelet = ("--kubernetes.podresources-socket=", "--no-kubernetes.api", "--kubernetes.node-name", NODE)
        if want in ("auto", "full"):
            try:
                self.chain_folder = self.work / "chain"
                self.chain_folder.mkdir(exist_ok=True)
                chain = stack.enter_context(rss.full_chain(plan, self.chain_folder, node=NODE))
                self.attribution = "full"
                return chain.flags, chain.env
            except (SystemExit, ImportError, OSError) as exc:
                self.log(f"full chain unavailable ({exc}); trying the kubelet alone")
                if want == "full":
                    raise
        if want in ("auto", "kubelet"):
            try:
                from tests.fakes import kubelet_server

                kubelet = stack.enter_context(kubelet_server.FakeKubelet())
                kubelet.pods = [
                    kubelet_server.pod(
                        p.namespace, p.name, [(c, [(rss.GPU_RESOURCE, p.devices[c])]) for c in p.containers]
                    )
                    for p in pods
                ]
                kubelet.allocatable = [kubelet_server.devices(rss.GPU_RESOURCE, plan.allocatable)]
                self.attribution = "kubelet"
                return (
                    "--kubernetes.podresources-socket",
                    kubelet.socket_path,
                    "--no-kubernetes.api",
                    "--kubernetes.node-name",
                    NODE,
                ), dict(rss.NO_IN_CLUSTER)
            except (SystemExit, ImportError, OSError) as exc:
                self.log(f"kubelet fake unavailable ({exc}); NVML only")
                if want == "kubelet":
                    raise
        self.attribution = "none"
        return no_kubelet, {}

    def attribute(self, role: str, pids: set[int]) -> None:
        """Put ``pids`` in the pod of ``role`` (the procfs folder of the full chain) and record it."""
        pod = f"{NAMESPACE}/{self.pod_names.get(role, ENGINE_PODS[role][0])}"
        for pid in pids:
            self.pid_pods[pid] = pod
        if self.attribution == "full" and self.chain_folder is not None:
            from bench.exporter_rss import write_procfs

            write_procfs(self.chain_folder, dict.fromkeys(pids, self.pod_uids[role]))

    # --- exporter and scraper -----------------------------------------------------------------------

    def start_exporter(self, flags: tuple[str, ...], env: dict[str, str]) -> None:
        port = self.args.exporter_port
        cmd = [
            sys.executable, "-m", "exporter", "--backend", "sim" if self.args.dry_run else "nvml",
            "--web.listen-address", f"127.0.0.1:{port}",
            "--collect.interval", "1s", "--no-probes", *flags,
        ]  # fmt: skip
        log = open(self.work / "exporter.log", "wb")  # noqa: SIM115 - lives as long as the process
        self.exporter = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.exporter.poll() is not None:
                raise SystemExit(f"exporter exited with {self.exporter.returncode}; see exporter.log")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    if b"gpulens_gpu_info" in r.read():
                        break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            raise SystemExit("exporter did not serve GPU 0 within 60 s")
        self.add_target(
            "exporter",
            f"http://127.0.0.1:{port}/metrics",
            Target({"job": "gpulens", "instance": f"{NODE}:{port}"}, honor=True),
        )
        self.log(f"exporter up (attribution: {self.attribution}) {' '.join(cmd[2:])}")

    def add_target(self, name: str, url: str, target: Target) -> None:
        with self.lock:
            self.targets[name] = (url, target, PageLog(self.work / f"pages-{name}.txt.gz"))

    def drop_target(self, name: str) -> None:
        with self.lock:
            entry = self.targets.pop(name, None)
        if entry:
            entry[2].close()

    def scraper(self) -> None:
        next_t = time.time()
        while not self.stop.is_set():
            next_t += 1.0
            e, p = self.energy_power()
            row: dict[str, Any] = {"t": round(time.time(), 3), "nvml_energy_j": e, "power_w": p}
            with self.lock:
                targets = list(self.targets.items())
            for name, (url, target, pages) in targets:
                t = time.time()
                try:
                    with urllib.request.urlopen(url, timeout=0.8) as r:
                        text = r.read().decode("utf-8", "replace")
                except OSError:
                    continue
                with self.lock:
                    if name not in self.targets:
                        continue
                    pages.add(text, t)
                    self.history.add(target, text, t)
                if name == "exporter":
                    row.update(exporter_reading(text))
                else:
                    g = engine_generation(text)
                    if g is not None:
                        self.engine_gen.setdefault(name, []).append((t, g))
            self.readings.append(row)
            self.stop.wait(max(0.0, next_t - time.time()))

    # --- engines ----------------------------------------------------------------------------------

    def start_engine(self, role: str, port: int, extra: list[str]) -> Engine:
        workload, container = ENGINE_PODS[role]
        pod = self.pod_names.get(role, f"{workload}-0")
        summary = self.work / f"engine-{role}.json"
        before = self.compute_pids()
        cmd = [
            sys.executable, str(ROOT / "scripts" / "gpu_serving.py"), "--role", role, "--port", str(port),
            "--pod", pod, "--namespace", NAMESPACE, "--model-name", MODEL_NAME, "--summary", str(summary),
            "--deadline", str(self.args.engine_deadline), *self.args.model_args, *extra,
            *(["--fake-model"] if self.args.dry_run else []),
        ]  # fmt: skip
        log = open(self.work / f"engine-{role}.log", "w")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1
        )
        eng = Engine(role, pod, container, port, proc, summary)
        self.engines[role] = eng
        assert proc.stdout is not None
        deadline = time.monotonic() + self.args.ready_timeout
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                raise SystemExit(f"engine {role} ended before ready (rc={proc.poll()}); see engine-{role}.log")
            log.write(line)
            log.flush()
            if line.startswith("ready"):
                eng.ready_line = line.strip()
                eng.port = int(line.split("port=")[1].split()[0])  # the one it bound
                port = eng.port
                break
        else:
            raise SystemExit(f"engine {role} not ready within {self.args.ready_timeout} s")
        threading.Thread(target=self._drain, args=(proc, log), daemon=True).start()
        time.sleep(0.5)
        eng.pids = sorted({proc.pid} | (self.compute_pids() - before))
        self.attribute(role, set(eng.pids))
        self.add_target(
            role,
            f"http://127.0.0.1:{port}/metrics",
            Target(
                {
                    "job": f"{NAMESPACE}/vllm",
                    "instance": f"127.0.0.1:{port}",
                    "namespace": NAMESPACE,
                    "pod": pod,
                    "container": container,
                    **({self.args.role_label: role} if self.args.role_label else {}),
                }
            ),
        )
        self.log(f"engine {role} ready: pod {NAMESPACE}/{pod}, pids {eng.pids}: {eng.ready_line}")
        return eng

    @staticmethod
    def _drain(proc: subprocess.Popen[str], log: Any) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()

    def go(self, eng: Engine, start: float, duration: float, marks: list[float]) -> None:
        assert eng.proc.stdin is not None
        eng.proc.stdin.write(f"go {start:.3f} {duration:.3f} {' '.join(f'{m:.3f}' for m in marks)}\n")
        eng.proc.stdin.flush()

    def stop_engine(self, eng: Engine) -> None:
        """End its serving now (it writes its summary and keeps /metrics up until stdin ends)."""
        assert eng.proc.stdin is not None
        eng.proc.stdin.write("stop\n")
        eng.proc.stdin.flush()

    def finish_engine(self, eng: Engine, until: float) -> None:
        """Wait for its summary (or ``until``), scrape it once more, then end it."""
        while time.time() < until + 30 and not eng.summary.exists() and eng.proc.poll() is None:
            time.sleep(0.2)
        time.sleep(1.5)  # one more scrape of its final counters
        self.drop_target(eng.role)
        if eng.proc.stdin is not None:
            eng.proc.stdin.close()
        try:
            eng.proc.wait(15)
        except subprocess.TimeoutExpired:
            eng.proc.kill()
            eng.proc.wait(5)

    def phase(self, name: str, start: float, end: float, roles: list[str], **extra: Any) -> None:
        self.phases.append({"name": name, "start": start, "end": end, "engines": roles, **extra})

    def sleep_until(self, t: float) -> None:
        while time.time() < t:
            time.sleep(min(0.2, t - time.time()))

    def main(self) -> None:
        uuid = self.nvml_init()
        with ExitStack() as stack:
            flags, env = self.start_chain(stack, uuid)
            self.start_exporter(flags, env)
            threading.Thread(target=self.scraper, daemon=True).start()
            try:
                self.run_phases()
            finally:
                for eng in self.engines.values():
                    if eng.proc.poll() is None:
                        eng.proc.kill()
                self.stop.set()
                time.sleep(1.2)
                if self.exporter is not None:
                    self.exporter.terminate()
                    try:
                        self.exporter.wait(10)
                    except subprocess.TimeoutExpired:
                        self.exporter.kill()
                with self.lock:
                    for name in list(self.targets):
                        self.targets[name][2].close()
                    self.targets.clear()

    def run_phases(self) -> None:
        a = self.args
        t = time.time()
        self.phase("idle", t, t + a.idle, [])
        self.sleep_until(t + a.idle)
        # aggregated sweep
        agg = self.start_engine("both", a.port, ["--sweep", ",".join(map(str, a.sweep)), "--hold", str(a.hold)])
        start = time.time() + 1.0
        bounds = [start + i * a.hold for i in range(len(a.sweep) + 1)]
        self.go(agg, start, a.hold * len(a.sweep), bounds[1:-1])
        for i, n in enumerate(a.sweep):
            self.phase(f"agg_b{n}", bounds[i], bounds[i + 1], ["both"], concurrency=n)
        self.sleep_until(bounds[-1])
        self.finish_engine(agg, bounds[-1])
        # disaggregated: prefill alone, then both time-sliced, then decode alone; the decode engine
        # starts (and warms up) after the prefill engine's solo phase, so each solo phase has one
        # pod with processes on the GPU
        pre = self.start_engine("prefill", a.port + 1 if a.port else 0, ["--concurrency", str(a.prefill_concurrency)])
        t0 = time.time() + 1.0
        self.go(pre, t0, 3 * a.solo + a.together + 300, [t0 + a.solo])  # ended by "stop"
        self.phase("prefill_solo", t0, t0 + a.solo, ["prefill"])
        self.sleep_until(t0 + a.solo)
        dec = self.start_engine("decode", a.port + 2 if a.port else 0, ["--concurrency", str(a.decode_concurrency)])
        t1 = time.time() + 1.0
        t2, t3 = t1 + a.together, t1 + a.together + a.solo
        self.go(dec, t1, t3 - t1, [t2])
        self.phase("disagg", t1, t2, ["prefill", "decode"])
        self.phase("decode_solo", t2, t3, ["decode"])
        self.sleep_until(t2)
        self.stop_engine(pre)
        self.finish_engine(pre, t2)
        self.sleep_until(t3)
        self.finish_engine(dec, t3)
        t = time.time()
        self.phase("idle_end", t, t + a.idle, [])
        self.sleep_until(t + a.idle)

    # --- results ----------------------------------------------------------------------------------

    def results(self) -> dict[str, Any]:
        summaries = {}
        for role, eng in self.engines.items():
            if eng.summary.exists():
                summaries[role] = json.loads(eng.summary.read_text())
        pods = {role: f"{NAMESPACE}/{eng.pod}" for role, eng in self.engines.items()}
        return {
            "attribution": self.attribution,
            "pid_pods": {str(k): v for k, v in sorted(self.pid_pods.items())},
            "engines": {
                role: {
                    "pod": pods[role],
                    "container": eng.container,
                    "port": eng.port,
                    "pids": eng.pids,
                    "ready": eng.ready_line,
                    "counts": summaries.get(role, {}).get("counts"),
                    "model": summaries.get(role, {}).get("model"),
                    "levels": summaries.get(role, {}).get("levels"),
                }
                for role, eng in self.engines.items()
            },
            "phases": phase_figures(self.phases, self.readings, summaries, self.engine_gen, pods),
            "scrapes": self.history.scrapes,
        }


def write_outputs(run: Run, started: float) -> None:
    """history.om.gz and details.tgz first (the raw record), then summary.json (the figures): a
    failure in the figures loses none of the record."""
    out = run.out
    with gzip.open(out / "history.om.gz", "wt", compresslevel=6) as f:
        samples = run.history.write(f)
    run.log(f"history: {samples} samples from {run.history.scrapes} scrapes")
    (run.work / "readings.json").write_text(json.dumps(run.readings))
    with tarfile.open(out / "details.tgz", "w:gz") as tar:
        tar.add(run.work, arcname="details")
    try:
        res = run.results()
    except Exception as exc:  # the record is written; say why the figures are not
        import traceback

        (out / "summary.json").write_text(json.dumps({"error": repr(exc), "traceback": traceback.format_exc()}))
        run.log(f"figures failed: {exc!r}")
        return
    res["started"] = started
    res["args"] = vars(run.args)
    facts = run.work / "facts.txt"
    res["facts"] = facts.read_text() if facts.exists() else ""
    res["readings"] = run.readings
    (out / "summary.json").write_text(json.dumps(res, indent=1, default=str))
    shutil.rmtree(run.work, ignore_errors=True)
    for ph in res["phases"]:
        jpt = ph["joules_per_generated_token"]
        run.log(
            f"{ph['name']:>13}: class {ph['gpu_class']['class']} {ph['gpu_class']['settled_counts']} "
            f"tok/s {ph['generation_tokens_per_s']:.0f} J/tok {jpt if jpt is None else round(jpt, 4)} "
            f"pods { ({p: c['class'] for p, c in ph['pod_classes'].items()}) }"
        )
        for role, own in ph["engines_own"].items():
            check = own.get("prometheus_check")
            if check:
                run.log(
                    f"{'':>15}{role}: scraped/own tokens "
                    f"{check['scraped_tokens']:.0f}/{check['own_tokens']:.0f} = {check['ratio']}"
                )


def rebuild(folder: Path, role_label: str) -> None:
    """Write ``history.om.gz`` again from a run's pages (``details.tgz`` unpacked in ``folder``),
    with ``role_label`` added to the engines' series."""
    details = folder / "details"
    if not details.exists():
        with tarfile.open(folder / "details.tgz") as tar:
            tar.extractall(folder, filter="data")
    summary = json.loads((folder / "summary.json").read_text())
    history = ScrapeHistory()
    port = summary["args"]["exporter_port"]
    for path in sorted(details.glob("pages-*.txt.gz")):
        name = path.name.removeprefix("pages-").removesuffix(".txt.gz")
        if name == "exporter":
            target = Target({"job": "gpulens", "instance": f"{NODE}:{port}"}, honor=True)
        else:
            eng = summary["engines"][name]
            ns, pod = eng["pod"].split("/", 1)
            labels = {
                "job": f"{ns}/vllm",
                "instance": f"127.0.0.1:{eng['port']}",
                "namespace": ns,
                "pod": pod,
                "container": eng["container"],
            }
            if role_label:
                labels[role_label] = name
            target = Target(labels)
        for t, text in read_pages(path):
            history.add(target, text, t)
    with gzip.open(folder / "history.om.gz", "wt") as f:
        print(f"{history.write(f)} samples")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "serving-out"))
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle GPU before and after")
    ap.add_argument("--hold", type=float, default=20.0, help="seconds at each aggregated concurrency")
    ap.add_argument("--sweep", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 16, 32, 64])
    ap.add_argument("--solo", type=float, default=20.0, help="seconds of the prefill (then decode) engine alone")
    ap.add_argument("--together", type=float, default=30.0, help="seconds of prefill and decode time-sliced")
    ap.add_argument("--prefill-concurrency", type=int, default=8)
    ap.add_argument("--decode-concurrency", type=int, default=32)
    ap.add_argument(
        "--port", type=int, default=8001, help="first engine's metrics port (then +1, +2; 0: any free ports)"
    )
    ap.add_argument("--exporter-port", type=int, default=9445)
    ap.add_argument("--attribution", choices=("auto", "full", "kubelet", "none"), default="auto")
    ap.add_argument("--role-label", default="", help="a target label carrying the engine's role (e.g. llm_d_ai_role)")
    ap.add_argument("--ready-timeout", type=float, default=120.0)
    ap.add_argument("--engine-deadline", type=float, default=400.0)
    ap.add_argument("--model-args", nargs=argparse.REMAINDER, default=[], help="passed to every engine (last)")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="no GPU: the exporter's simulated node and engines with a stand-in model (checks the run's plumbing)",
    )
    ap.add_argument("--rebuild", metavar="DIR", help="only rewrite DIR/history.om.gz from a run's pages")
    return ap


def _facts(path: Path) -> None:
    cmds = [
        ["nvidia-smi", "-L"],
        [
            "nvidia-smi",
            "--query-gpu=name,driver_version,power.limit,clocks.max.sm,clocks.max.mem,memory.total,mig.mode.current",
            "--format=csv",
        ],
        [
            sys.executable,
            "-c",
            "import torch, sys; print(sys.version); print('torch', torch.__version__, torch.version.cuda)",
        ],
    ]
    with path.open("w") as f:
        for cmd in cmds:
            try:
                f.write(subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout)
            except (OSError, subprocess.TimeoutExpired) as exc:
                f.write(f"{cmd[0]}: {exc}\n")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.rebuild:
        rebuild(Path(args.rebuild), args.role_label)
        return 0

    def on_term(signum: int, _frame: Any) -> None:
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    run = Run(args)
    started = time.time()
    _facts(run.work / "facts.txt")
    rc = 0
    try:
        run.main()
    except SystemExit as exc:
        run.log(f"stopped: {exc}")
        rc = 1
    finally:
        write_outputs(run, started)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
