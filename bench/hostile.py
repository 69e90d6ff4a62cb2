"""Hostile clients against gpulens and Debian's node_exporter, side by side, on loopback.

    .venv/bin/python -m bench.hostile                          # every attack, both exporters, 60 s each
    .venv/bin/python -m bench.hostile --attacks unread,login-queue --seconds 5   # a smoke run
    .venv/bin/python -m bench.hostile --container              # the high-severity ones, in the image
    .venv/bin/python -m bench.hostile --list                   # the attacks

Each exporter runs as its own process on 127.0.0.1, fresh for each attack: gpulens with
``--backend sim`` (the attack's simulator scenario), ``prometheus-node-exporter`` from the Debian
package (the exporter-toolkit web config gpulens mirrors).  Where the attack needs them, both get
the same web config: basic auth (one bcrypt cost-10 user), TLS or mutual TLS with a CA and
certificates made by ``openssl`` in a temporary folder.  While the attack runs
(bench/hostile_attacks.py; ``--seconds`` each), a normal client in a process of its own scrapes
``/metrics`` once a second (gzip, like Prometheus; HTTPS, credentials and client certificate
where the attack turns them on), and the exporter's RSS, threads and open fds are sampled every
0.25 s.

``--container`` runs gpulens from the project's image under podman with the chart's limits
(``exporter.resources.limits``: 256Mi, 200m) and reports whether it was OOM-killed and its cgroup
memory peak.  The image is built once by scripts/image.sh into build/hostile/ and tagged with a
digest of the sources it holds; a later run reuses it until those sources change.

Prints Markdown tables (docs/security.md keeps the latest) and, with ``--json``, the raw figures.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from bench.hostile_attacks import (
    HOST,
    PASSWORD,
    SCRAPE_TIMEOUT,
    USER,
    AttackSpec,
    Budget,
    ScraperConfig,
    ScrapeResult,
    Target,
    connect,
    enter_private_network,
    error_kind,
    registry,
    scrape_get,
    scrape_headers,
    scraper_main,
)
from tests.support.net import free_port
from tests.support.process import stop
from tests.support.procstat import open_fds, rss_bytes, thread_count

REPO = Path(__file__).resolve().parents[1]
HOSTILE_DIR = REPO / "build" / "hostile"
"""The exporters' logs of the last run; for --container also the image archive, podman's storage
and the containers' temporary folders (git-ignored)."""
NODE_EXPORTER = "prometheus-node-exporter"
NODE_EXPORTER_COLLECTORS = ("cpu", "meminfo", "loadavg", "netdev", "filesystem", "diskstats")
"""node_exporter runs with these collectors only, so its page and collection cost stay small."""
READY_TIMEOUT = 120.0
"""Seconds an exporter may take to answer its readiness URL (a container at 0.2 CPU is slow)."""
GOAL_RSS_MB, GOAL_P99_MS, GOAL_THREADS = 20.0, 50.0, 2
"""The goals: RSS growth, normal-scrape p99, and how far the thread count may rise ("flat": the
second render thread may start)."""
CONNECTION_CAP = 512
"""gpulens' connection cap (``exporter.http.limits.Limits.max_connections``)."""
GOAL_FDS = CONNECTION_CAP + 32
"""How far the open fds may rise: every attack holding connections takes the server to its cap,
so "flat" means bounded by the cap (plus a few for the scraper and the sampling), not unchanged."""


# --- results --------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One exporter under one attack (MB of 10^6 bytes, ms, counts)."""

    exporter: str
    attack: str
    rss_before_mb: float = 0.0
    rss_peak_mb: float = 0.0
    rss_after_mb: float | None = None
    """RSS some seconds after the attack ended (AttackSpec.rss_after_seconds), else None."""
    socket_queues_peak_mb: float = 0.0
    """Peak of the bytes the kernel holds on the exporter's sockets: replies its clients have not
    read, requests it has not read.  Memory outside RSS (charged to the pod on cgroup v2 nodes)."""
    threads_before: int = 0
    threads_peak: int = 0
    fds_before: int = 0
    fds_peak: int = 0
    scrapes: int = 0
    scrapes_ok: int = 0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    attack_count: int | None = 0
    """Connections or requests the attack made (None: a peer attack, nothing made client-side)."""
    load_average: float = 0.0
    """The machine's 1-minute load average when the attack ended (other work shares the cores)."""
    notes: list[str] = field(default_factory=list)
    not_applicable: str = ""
    """Why this exporter has no figures for this attack ("" when it has)."""
    oom_killed: bool | None = None
    """--container only: the container was OOM-killed."""
    memory_peak_mb: float | None = None
    """--container only: the container's cgroup memory peak."""

    @property
    def rss_growth_mb(self) -> float:
        """Peak RSS during the attack minus RSS just before it."""
        return self.rss_peak_mb - self.rss_before_mb

    def misses(self) -> list[str]:
        """The goals this row misses."""
        out = []
        if self.rss_growth_mb > GOAL_RSS_MB:
            out.append("RSS")
        if self.threads_peak - self.threads_before > GOAL_THREADS:
            out.append("threads")
        if self.fds_peak - self.fds_before > GOAL_FDS:
            out.append("fds")
        if not self.p99_ms <= GOAL_P99_MS:  # NaN (no scrape answered) misses too
            out.append("p99")
        if self.scrapes_ok < self.scrapes:
            out.append("lost scrapes")
        if self.oom_killed:
            out.append("OOM")
        return out


@dataclass(frozen=True)
class ProcSample:
    """RSS (bytes), threads and open fds of a process at one moment."""

    rss: int
    threads: int
    fds: int


def sample(pid: int) -> ProcSample | None:
    """The process' RSS, threads and fds, or None once it is gone."""
    try:
        return ProcSample(rss_bytes(pid), thread_count(pid), open_fds(pid))
    except (OSError, RuntimeError):
        return None


def socket_queue_bytes(port: int) -> int:
    """Bytes queued in the kernel on the TCP sockets whose local port is ``port``: sent but not
    yet taken by the peer plus received but not yet read (tx_queue and rx_queue of /proc/net/tcp
    and tcp6), listening sockets left out."""
    total = 0
    suffix = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            next(f, None)
            for line in f:
                fields = line.split()
                if fields[1].endswith(suffix) and fields[3] != "0A":
                    tx, rx = fields[4].split(":")
                    total += int(tx, 16) + int(rx, 16)
    return total


def vm_hwm_bytes(pid: int) -> int:
    """The highest RSS the process has had since it started (``VmHWM``), 0 if it is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (inclusive method); NaN for no values."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


# --- TLS material and web config ------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(folder: Path, args: str) -> None:
    """Run ``openssl`` with space-separated ``args`` (none contains a space) in ``folder``."""
    subprocess.run(["openssl", *args.split()], cwd=folder, check=True, capture_output=True, timeout=60)


def make_tls(folder: Path) -> TlsFiles:
    """Generate the CA and the two certificates (P-256 keys, valid 2 days) into ``folder``."""
    if shutil.which("openssl") is None:
        raise SystemExit("openssl is not installed (apt-get install openssl)")
    key = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes"
    ca_ext = "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign"
    _openssl(folder, f"req -x509 {key} -keyout ca.key -out ca.crt -days 2 -subj /CN=hostile-bench-ca {ca_ext}")
    extensions = {
        "server": "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        "client": "extendedKeyUsage=clientAuth\n",
    }
    for serial, (name, ext) in enumerate(extensions.items(), start=2):
        (folder / f"{name}.ext").write_text(ext)
        _openssl(folder, f"req {key} -keyout {name}.key -out {name}.csr -subj /CN=hostile-{name}")
        _openssl(
            folder,
            f"x509 -req -in {name}.csr -CA ca.crt -CAkey ca.key -set_serial {serial} -days 2 -out {name}.crt "
            f"-extfile {name}.ext",
        )
    for f in folder.iterdir():
        f.chmod(0o644)  # a container's user must read them (a throwaway CA in a temporary folder)
    return TlsFiles(*(folder / n for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")))


def write_web_config(folder: Path, spec: AttackSpec, tls: TlsFiles | None) -> Path | None:
    """The exporter-toolkit web config the attack needs (both exporters read it), or None."""
    lines: list[str] = []
    if tls is not None:
        lines += ["tls_server_config:", f"  cert_file: {tls.server_cert}", f"  key_file: {tls.server_key}"]
        if spec.tls == "mtls":
            lines += ["  client_auth_type: RequireAndVerifyClientCert", f"  client_ca_file: {tls.ca}"]
    if spec.auth:
        import bcrypt

        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
        lines += ["basic_auth_users:", f"  {USER}: '{hashed}'"]
    if not lines:
        return None
    path = folder / "web.yml"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o644)
    return path


# --- measuring ------------------------------------------------------------------------------------


class Watcher:
    """Samples a process (RSS, threads, fds; a container's cgroup memory) every 0.25 s and runs
    the normal scraper in a process of its own, so the attack's threads cannot delay it."""

    def __init__(self, pid: int, scraper: ScraperConfig, cgroup: Path | None = None) -> None:
        self.pid, self.scraper_cfg, self.cgroup = pid, scraper, cgroup
        self.rss_peak = self.threads_peak = self.fds_peak = self.memory_peak = self.socket_queues_peak = 0
        self.result = ScrapeResult()
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._scraper: subprocess.Popen[str] | None = None

    def __enter__(self) -> Watcher:
        self._sampler.start()
        return self

    def start_scraper(self) -> None:
        """Start the normal scraper's process (it scrapes until the block ends)."""
        argv = [sys.executable, "-m", "bench.hostile", "--scraper", json.dumps(asdict(self.scraper_cfg))]
        self._scraper = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sampler.join(15)
        if self._scraper is not None:
            self._scraper.send_signal(signal.SIGTERM)
            try:  # it ends its scrape in flight first: a connect and a request, 10 s each at most
                out, _ = self._scraper.communicate(timeout=SCRAPE_TIMEOUT * 3)
            except subprocess.TimeoutExpired:
                self._scraper.kill()
                out, _ = self._scraper.communicate()
            if out:
                self.result = ScrapeResult(**json.loads(out))

    def _sample(self) -> None:
        tick = 0
        while not self._stop.wait(0.25):
            tick += 1
            if tick % 4 == 0:  # once a second: the tables list every socket of the machine
                self.socket_queues_peak = max(self.socket_queues_peak, socket_queue_bytes(self.scraper_cfg.port))
            if self.cgroup is not None:
                self.memory_peak = max(self.memory_peak, cgroup_memory_peak(self.cgroup))
            s = sample(self.pid)
            if s is None:
                continue  # gone (a killed container): keep the peaks seen so far
            self.rss_peak = max(self.rss_peak, s.rss)
            self.threads_peak = max(self.threads_peak, s.threads)
            self.fds_peak = max(self.fds_peak, s.fds)


def warm_up(cfg: ScraperConfig) -> None:
    """One scrape before the attack, as Prometheus would have made (credentials verified and
    cached, the first page rendered)."""
    conn = connect(cfg)
    try:
        scrape_get(conn, scrape_headers(cfg))
    finally:
        conn.close()


# --- exporters ------------------------------------------------------------------------------------


@dataclass
class Running:
    """An exporter that is up: its port, host PID, seconds it took to get ready (None: it did not
    within the timeout), and (--container) the container's name and cgroup folder."""

    port: int
    pid: int
    ready_s: float | None
    container: str = ""
    cgroup: Path | None = None


@dataclass(frozen=True)
class Launch:
    """What an exporter is started with for one attack."""

    spec: AttackSpec
    folder: Path
    web_config: Path | None
    scraper: ScraperConfig
    gpulens_tree: Path = REPO


def ready_check(exporter: str, spec: AttackSpec) -> tuple[str, int]:
    """(path, expected status) of the exporter's readiness check.  node_exporter has no readiness
    endpoint: /metrics without credentials (401 with basic auth on), so nothing gets cached."""
    if exporter == "gpulens":
        return "/readyz", 200
    return "/metrics", 401 if spec.auth else 200


def _status(cfg: ScraperConfig, path: str) -> int | None:
    """The status of one GET ``path`` (HTTPS and client certificate as ``cfg`` says), or None."""
    try:
        conn = connect(cfg, timeout=2.0)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            return resp.status
        finally:
            conn.close()
    except (OSError, http.client.HTTPException):
        return None


def wait_ready(cfg: ScraperConfig, check: tuple[str, int], started: float, alive: Callable[[], bool]) -> float | None:
    """Seconds from ``started`` until ``check`` (path, status) answered; None if the exporter did
    not within READY_TIMEOUT, or stopped (``alive``)."""
    path, expect = check
    while time.monotonic() - started < READY_TIMEOUT and alive():
        if _status(cfg, path) == expect:
            return time.monotonic() - started
        time.sleep(0.1)
    return None


@contextlib.contextmanager
def _process(argv: list[str], log: Path, env: dict[str, str], cwd: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``argv`` (output to ``log``) for the block; SIGTERM, then SIGKILL after 10 s."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env})
        try:
            yield proc
        finally:
            stop(proc)


def log_path(attack: str, exporter: str) -> Path:
    """Where an exporter's output goes: build/hostile/logs/<attack>-<exporter>.log (the last run's)."""
    folder = HOSTILE_DIR / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{attack}-{exporter}.log"


def _log_tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.exists() else ""


@contextlib.contextmanager
def run_exporter(exporter: str, launch: Launch, extra_argv: list[str], env: dict[str, str]) -> Iterator[Running]:
    """Start gpulens (``--backend sim``) or node_exporter on a free loopback port; yield it once
    ready.  A peer attack's gpulens may stay unready: it is then served as it is (ready_s None)."""
    port = free_port()
    host = launch.spec.host
    listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    config = launch.web_config
    log = log_path(launch.spec.name, exporter)
    if exporter == "gpulens":
        flags = f"--backend sim --sim.scenario {launch.spec.scenario} --web.listen-address {listen}"
        argv = [sys.executable, "-m", "exporter", *flags.split()]
        argv += ["--web.config.file", str(config)] if config else []
        env = {"PYTHONUNBUFFERED": "1", "PYTHONPATH": str(launch.gpulens_tree), **env}
        cwd = launch.gpulens_tree
    else:
        exe = shutil.which(NODE_EXPORTER)
        if exe is None:
            raise SystemExit(f"{NODE_EXPORTER} is not installed (apt-get install prometheus-node-exporter)")
        argv = [exe, f"--web.listen-address={listen}", "--collector.disable-defaults"]
        argv += [f"--collector.{c}" for c in NODE_EXPORTER_COLLECTORS]
        argv += [f"--web.config.file={config}"] if config else []
        cwd = REPO
    cfg = replace(launch.scraper, port=port)
    started = time.monotonic()
    with _process(argv + extra_argv, log, env, cwd) as proc:
        ready_s = wait_ready(cfg, ready_check(exporter, launch.spec), started, lambda: proc.poll() is None)
        if ready_s is None and not (launch.spec.peer and proc.poll() is None):
            raise RuntimeError(f"{exporter} did not become ready:\n{_log_tail(log)}")
        yield Running(port, proc.pid, ready_s)


def launch_for(spec: AttackSpec, folder: Path, tree: Path) -> Launch:
    """TLS material, web config and scraper settings for one attack, in ``folder``."""
    tls = make_tls(folder) if spec.tls else None
    config = write_web_config(folder, spec, tls)
    port = 0  # set once the exporter has its port
    scraper = ScraperConfig(
        port=port,
        auth=spec.auth,
        ca=str(tls.ca) if tls else "",
        cert=str(tls.client_cert) if tls and spec.tls == "mtls" else "",
        key=str(tls.client_key) if tls and spec.tls == "mtls" else "",
        keepalive=spec.keepalive_scraper,
        source=spec.scraper_source,
        host=spec.host,
    )
    return Launch(spec, folder, config, scraper, tree)


def raise_fd_limit() -> None:
    """Raise this process' soft open-files limit to the hard one (600 attack sockets at a time)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def attack_under_watch(spec: AttackSpec, running: Running, launch: Launch, seconds: float, settle: float) -> Outcome:
    """Let the exporter settle, warm it up (unless the attack says not to), then run the attack
    beside the normal scraper and measure."""
    cfg = replace(launch.scraper, port=running.port)
    time.sleep(settle)
    outcome = Outcome(exporter="", attack=spec.name)
    if spec.warm_up:
        try:
            warm_up(cfg)
        except (OSError, http.client.HTTPException) as exc:
            outcome.notes.append(f"warm-up failed ({error_kind(exc)})")
    before = sample(running.pid) or ProcSample(0, 0, 0)
    target, budget = Target(spec.host, running.port, spec.source), Budget(seconds, spec.max_opens)
    with Watcher(running.pid, cfg, running.cgroup) as w, ThreadPoolExecutor(1) as pool:
        if spec.scraper_lag_s < 0:
            w.start_scraper()
            time.sleep(-spec.scraper_lag_s)
        attack = pool.submit(spec.run, target, budget)
        if spec.scraper_lag_s >= 0:
            time.sleep(spec.scraper_lag_s)
            w.start_scraper()
        outcome.attack_count = attack.result() if not spec.peer else None
        outcome.load_average = os.getloadavg()[0]
        time.sleep(1.0)
        if spec.rss_after_seconds:
            time.sleep(max(0.0, spec.rss_after_seconds - 1.0))
            after = sample(running.pid)
            outcome.rss_after_mb = after.rss / 1e6 if after else None
    result = w.result
    outcome.rss_before_mb, outcome.rss_peak_mb = before.rss / 1e6, max(w.rss_peak, before.rss) / 1e6
    outcome.threads_before, outcome.threads_peak = before.threads, max(w.threads_peak, before.threads)
    outcome.fds_before, outcome.fds_peak = before.fds, max(w.fds_peak, before.fds)
    outcome.socket_queues_peak_mb = w.socket_queues_peak / 1e6
    outcome.scrapes, outcome.scrapes_ok = result.scrapes, result.ok
    outcome.p50_ms, outcome.p99_ms = percentile(result.ms, 50), percentile(result.ms, 99)
    outcome.notes += scrape_notes(spec, result)
    if running.cgroup is not None:
        outcome.memory_peak_mb = w.memory_peak / 1e6
    print(f"  latencies (ms): {[round(x, 1) for x in result.ms]}", file=sys.stderr)
    return outcome


def scrape_notes(spec: AttackSpec, result: ScrapeResult) -> list[str]:
    """The scraper's failures by kind, its reconnects (kept-alive) and its first answer (cold)."""
    notes = [f"{n} {kind}" for kind, n in sorted(result.errors.items())]
    if spec.keepalive_scraper:
        notes.append(f"scraper reconnects {result.reconnects}")
    if not spec.warm_up:
        if result.first_ok_s is None:
            notes.append("no login answered")
        else:
            notes.append(f"first login answered {result.first_ok_s:.1f} s after the scraper started")
    return notes


def run_one(exporter: str, spec: AttackSpec, args: argparse.Namespace) -> Outcome:
    """Start a fresh exporter for ``spec``, run the attack under watch, stop the exporter."""
    if spec.peer and exporter != "gpulens":
        return Outcome(exporter, spec.name, not_applicable="no kubelet or API client")
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp, contextlib.ExitStack() as stack:
        folder = Path(tmp)
        folder.chmod(0o755)
        launch = launch_for(spec, folder, args.gpulens_tree)
        extra_argv: list[str] = []
        env: dict[str, str] = {}
        if spec.peer:
            import bench.hostile_peers as peers  # type: ignore[import-not-found,unused-ignore]

            setup = stack.enter_context(peers.hostile_peer(spec.peer, folder))
            extra_argv, env = list(setup.argv), dict(setup.env)
        running = stack.enter_context(run_exporter(exporter, launch, extra_argv, env))
        outcome = attack_under_watch(spec, running, launch, args.seconds, args.settle_seconds)
        outcome.exporter = exporter
        if spec.peer:
            ready = f"{running.ready_s:.1f} s" if running.ready_s is not None else f"not within {READY_TIMEOUT:.0f} s"
            hwm = vm_hwm_bytes(running.pid) / 1e6
            outcome.notes[:0] = [f"time to ready {ready}", f"peak RSS since start (VmHWM) {hwm:.1f} MB"]
        return outcome


# --- --container: the image under podman with the chart's limits ---------------------------------

IMAGE = "localhost/gpulens-hostile"
IMAGE_SOURCES = ("exporter", "pyproject.toml", "deploy/image", "scripts/image.sh")
"""What the exporter image is made of; the image tag is a digest of these files."""


def cgroup_dir(pid: int) -> Path | None:
    """The memory cgroup folder of a process (cgroup v1 memory controller, else v2), or None."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    for line in lines:
        if line.startswith("0::"):
            return Path("/sys/fs/cgroup") / line[3:].lstrip("/")
    return None


def cgroup_memory_peak(folder: Path) -> int:
    """Peak memory (bytes) of a cgroup so far: memory.peak (v2) or memory.max_usage_in_bytes (v1);
    0 once the cgroup is gone."""
    for name in ("memory.peak", "memory.max_usage_in_bytes", "memory.current", "memory.usage_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            return int((folder / name).read_text().split()[0])
    return 0


def chart_exporter() -> tuple[dict[str, str], list[str]]:
    """The chart's exporter container: its resource limits and its arguments."""
    from tests.support.deploy import objects, one

    pod = one(objects({"exporter": {"probes": {"enabled": False}}}), "DaemonSet")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    return dict(container["resources"]["limits"]), list(container["args"])


def podman_limits(limits: dict[str, str]) -> list[str]:
    """Kubernetes limits (``256Mi``, ``200m``) as podman flags; swap off, as on a kubelet node."""
    memory = limits["memory"].replace("Mi", "m").replace("Gi", "g")
    cpu = limits["cpu"]
    cpus = f"{int(cpu[:-1]) / 1000:g}" if cpu.endswith("m") else cpu
    return [f"--memory={memory}", f"--memory-swap={memory}", f"--cpus={cpus}"]


class Podman:
    """podman with its own storage under build/hostile/podman and the repository's containers.conf
    (runc, cgroupfs), as tests/test_image.py runs it."""

    def __init__(self, state: Path = HOSTILE_DIR / "podman") -> None:
        if shutil.which("podman") is None:
            raise SystemExit("podman is not installed (scripts/test.sh installs it)")
        self.base = [
            "podman",
            "--root",
            str(state / "root"),
            "--runroot",
            str(state / "run"),
            "--tmpdir",
            str(state / "tmp"),
            "--storage-driver",
            "vfs",
        ]
        self.env = {
            **os.environ,
            "CONTAINERS_CONF": str(REPO / "deploy" / "image" / "containers.conf"),
            "CONTAINERS_REGISTRIES_CONF": str(REPO / "deploy" / "image" / "registries.conf"),
        }

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run one podman command; RuntimeError with its output if it fails and ``check``."""
        proc = subprocess.run([*self.base, *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)}: {proc.stdout}{proc.stderr}")
        return proc


def source_digest(tree: Path = REPO) -> str:
    """A digest of the files the exporter image is built from (tracked and untracked, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z", "--", *IMAGE_SOURCES],
        cwd=tree,
        capture_output=True,
        check=True,
    ).stdout
    digest = hashlib.sha256()
    for name in sorted(set(filter(None, listed.split(b"\0")))):
        path = tree / name.decode()
        if path.is_file():
            digest.update(name + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _seed_rootfs(out: Path) -> None:
    """Reuse the base root filesystem tests/test_image.py's build left in build/images (linked;
    scripts/image.sh rebuilds it anyway if its inputs changed)."""
    mine = out / "rootfs"
    mine.mkdir(parents=True, exist_ok=True)
    if any(mine.glob("*.tar")):
        return
    for tar in (REPO / "build" / "images" / "rootfs").glob("*.tar"):
        try:
            os.link(tar, mine / tar.name)
        except OSError:
            shutil.copy2(tar, mine / tar.name)


def ensure_image(podman: Podman, tree: Path = REPO) -> str:
    """The exporter image of ``tree`` (a git checkout), tagged ``localhost/gpulens-hostile:<source
    digest>``: reused if podman has it, else built by its scripts/image.sh (minutes) and loaded."""
    digest = source_digest(tree)
    tag = f"{IMAGE}:{digest}"
    if podman("image", "exists", tag, check=False).returncode == 0:
        return tag
    out = HOSTILE_DIR / "images"
    _seed_rootfs(out)
    log = out / "build.log"
    print(f"# building {tag} with scripts/image.sh (log: {log}) ...", file=sys.stderr, flush=True)
    with open(log, "wb") as f:
        build = subprocess.run(
            ["bash", "scripts/image.sh", "exporter"],
            cwd=tree,
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "GPULENS_IMAGE_OUT": str(out)},
            timeout=1800,
        )
    if build.returncode != 0:
        raise SystemExit(f"scripts/image.sh failed:\n{_log_tail(log)}")
    if source_digest(tree) != digest:
        raise SystemExit("the image's sources changed during the build; run again")
    version = tomllib.loads((tree / "pyproject.toml").read_text())["project"]["version"]
    podman("load", "-q", "-i", str(out / f"gpulens-exporter-{version}.oci.tar"), timeout=600)
    podman("tag", f"ghcr.io/gpulens/gpulens-exporter:{version}", tag)
    return tag


@contextlib.contextmanager
def run_container(podman: Podman, image: str, launch: Launch) -> Iterator[Running]:
    """gpulens from ``image`` as the chart runs it (its arguments, read-only root, no capabilities,
    its limits; ``--backend sim``), on the host's loopback (``--network=host``: no user-space
    proxy in front of the server); yields it once ready, removes it afterwards."""
    port = free_port()
    name = f"gpulens-hostile-{port}"
    limits, chart_args = chart_exporter()
    skip = ("--backend", "--web.listen-address", "--kubernetes.")
    args = [a for a in chart_args if not a.startswith(skip)]
    args += ["--backend=sim", f"--sim.scenario={launch.spec.scenario}", f"--web.listen-address={HOST}:{port}"]
    args += [f"--web.config.file={launch.web_config}"] if launch.web_config else []
    chart_like = "--network=host --user=0:0 --cap-drop=all --security-opt=no-new-privileges --read-only "
    chart_like += "--read-only-tmpfs=false --tmpfs=/tmp:rw,size=256m,mode=1777"  # the chart's emptyDir
    flags = [f"--name={name}", *chart_like.split(), f"--volume={launch.folder}:{launch.folder}:ro"]
    flags += podman_limits(limits)
    started = time.monotonic()
    podman("run", "-d", *flags, image, *args)
    try:
        ready_s = wait_ready(
            replace(launch.scraper, port=port), ready_check("gpulens", launch.spec), started, lambda: True
        )
        if ready_s is None:
            raise RuntimeError(f"the container did not become ready:\n{podman('logs', name, check=False).stderr}")
        pid = int(podman("inspect", "--format", "{{.State.Pid}}", name).stdout.strip())
        yield Running(port, pid, ready_s, container=name, cgroup=cgroup_dir(pid))
    finally:
        logs = podman("logs", name, check=False)
        log_path(launch.spec.name, "gpulens-image").write_text(logs.stdout + logs.stderr)
        podman("rm", "-f", name, check=False)


def run_container_one(spec: AttackSpec, args: argparse.Namespace, podman: Podman, image: str) -> Outcome:
    """One attack against gpulens in its container: measured as run_one, plus OOM and memory peak."""
    (HOSTILE_DIR / "tmp").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hostile-", dir=HOSTILE_DIR / "tmp") as tmp:
        folder = Path(tmp)
        folder.chmod(0o755)
        launch = launch_for(spec, folder, REPO)
        with run_container(podman, image, launch) as running:
            outcome = attack_under_watch(spec, running, launch, args.seconds, args.settle_seconds)
            state = podman(
                "inspect", "--format", "{{.State.OOMKilled}} {{.State.Status}} {{.State.ExitCode}}", running.container
            )
            oom, status, code = state.stdout.split()
            # podman 4.3 with runc on cgroup v1 leaves OOMKilled false when the kernel's OOM killer
            # ends the container; its SIGKILL shows as exit code 137 (nothing else kills it here).
            outcome.oom_killed = oom == "true" or (status == "exited" and code == "137")
            if status != "running":
                outcome.notes.insert(0, f"container {status} (exit code {code})")
        outcome.exporter = "gpulens (image)"
        return outcome


# --- report ---------------------------------------------------------------------------------------

GOALS = (
    f"Goals: RSS growth ≤ {GOAL_RSS_MB:.0f} MB, threads flat (at most +{GOAL_THREADS}), fds bounded "
    f"(at most +{GOAL_FDS}: the {CONNECTION_CAP}-connection cap and a few), normal-scrape "
    f"p99 ≤ {GOAL_P99_MS:.0f} ms, no lost scrapes; 'misses' names the goals a row does not meet."
)
COLUMNS: dict[str, Callable[[Outcome], str]] = {
    "RSS before → peak (MB)": lambda o: f"{o.rss_before_mb:.1f} → {o.rss_peak_mb:.1f}",
    "RSS growth (MB)": lambda o: f"{o.rss_growth_mb:+.1f}",
    "RSS after (MB)": lambda o: _mb(o.rss_after_mb),
    "kernel socket queues (MB)": lambda o: f"{o.socket_queues_peak_mb:.1f}",
    "threads before → peak": lambda o: f"{o.threads_before} → {o.threads_peak}",
    "fds before → peak": lambda o: f"{o.fds_before} → {o.fds_peak}",
    "normal scrapes answered": lambda o: f"{o.scrapes_ok}/{o.scrapes}",
    "p50 / p99 (ms)": lambda o: f"{o.p50_ms:.1f} / {o.p99_ms:.1f}",
    "attack connections or requests": lambda o: "–" if o.attack_count is None else str(o.attack_count),
    "load avg": lambda o: f"{o.load_average:.1f}",
    "misses": lambda o: ", ".join(o.misses()) or "–",
    "notes": lambda o: "; ".join(o.notes) or "–",
}
"""The main table's columns after attack and exporter: header -> cell of an Outcome."""
CONTAINER_COLUMNS: tuple[str, ...] = (
    "OOM-killed",
    "memory peak (MB)",
    *("RSS before → peak (MB)", "kernel socket queues (MB)", "normal scrapes answered", "p50 / p99 (ms)"),
    *("attack connections or requests", "load avg", "misses", "notes"),
)


def _mb(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _cell(o: Outcome, column: str) -> str:
    if column == "OOM-killed":
        return "–" if o.oom_killed is None else ("yes" if o.oom_killed else "no")
    if column == "memory peak (MB)":
        return _mb(o.memory_peak_mb)
    return COLUMNS[column](o)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def markdown(outcomes: list[Outcome]) -> str:
    """The table docs/security.md shows, with the goals under it."""
    rows = [_row(["attack", "exporter", *COLUMNS]), _row(["---"] * (len(COLUMNS) + 2))]
    for o in outcomes:
        if o.not_applicable:
            rows.append(_row([o.attack, o.exporter, *["n/a"] * (len(COLUMNS) - 1), o.not_applicable]))
        else:
            rows.append(_row([o.attack, o.exporter, *(_cell(o, c) for c in COLUMNS)]))
    return "\n".join(rows) + "\n\n" + GOALS + "\n"


def container_markdown(outcomes: list[Outcome], limits: dict[str, str]) -> str:
    """The --container table: OOM, cgroup memory peak, scrapes answered; the limits under it."""
    rows = [_row(["attack", *CONTAINER_COLUMNS]), _row(["---"] * (len(CONTAINER_COLUMNS) + 1))]
    rows += [_row([o.attack, *(_cell(o, c) for c in CONTAINER_COLUMNS)]) for o in outcomes]
    limit = (
        f"gpulens in its image under podman with the chart's limits: memory {limits['memory']}, CPU {limits['cpu']}."
    )
    return "\n".join(rows) + "\n\n" + limit + "\n"


def list_attacks(attacks: dict[str, AttackSpec], peers_missing: str) -> str:
    """``--list``: one line per attack, and the peer attacks' state."""
    lines = [f"{name:24} {spec.what}" for name, spec in attacks.items()]
    if peers_missing:
        lines.append(f"{'(kubelet/API peers)':24} {peers_missing}: bench/hostile_peers.py")
    return "\n".join(lines) + "\n"


def _choose(value: str, attacks: dict[str, AttackSpec], container: bool, parser: argparse.ArgumentParser) -> list[str]:
    if value == "all":
        return [n for n, s in attacks.items() if s.container or not container]
    if not value:
        return [n for n, s in attacks.items() if s.container] if container else list(attacks)
    names = [a for a in value.split(",") if a]
    for name in names:
        if name not in attacks:
            parser.error(f"--attacks: unknown attack {name!r}; --list shows them")
    return names


def main(argv: list[str] | None = None) -> int:
    """Run the attacks; print the tables (and write ``--json``)."""
    parser = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--attacks", default="", help="comma-separated names, or 'all' (default: all)")
    parser.add_argument("--exporters", default="gpulens,node_exporter")
    parser.add_argument("--seconds", type=float, default=60.0, help="each attack's length (default 60)")
    parser.add_argument("--settle-seconds", type=float, default=3.0)
    parser.add_argument("--container", action="store_true", help="gpulens in its image with the chart's limits")
    parser.add_argument(
        "--gpulens-tree",
        type=Path,
        default=REPO,
        help="run gpulens (or, --container, build its image) from this checkout",
    )
    parser.add_argument("--list", action="store_true", help="list the attacks and exit")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--scraper", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.scraper:
        scraper_main(ScraperConfig(**json.loads(args.scraper)))
        return 0
    attacks, peers_missing = registry()
    if args.list:
        sys.stdout.write(list_attacks(attacks, peers_missing))
        return 0
    chosen = _choose(args.attacks, attacks, args.container, parser)
    exporters = [e for e in args.exporters.split(",") if e]
    for e in exporters:
        if e not in ("gpulens", "node_exporter"):
            parser.error(f"--exporters: unknown exporter {e!r}")
    if peers_missing:
        print(f"# kubelet/API peer attacks {peers_missing}", file=sys.stderr)
    if any(attacks[name].host != HOST for name in chosen) and not args.container:
        enter_private_network()  # before any thread: the whole run moves into it
    raise_fd_limit()
    outcomes: list[Outcome] = []
    if args.container:
        podman = Podman()
        image = ensure_image(podman, args.gpulens_tree)
        for name in chosen:
            print(f"# {name} vs gpulens in {image} ...", file=sys.stderr, flush=True)
            outcomes.append(run_container_one(attacks[name], args, podman, image))
        sys.stdout.write(container_markdown(outcomes, chart_exporter()[0]))
    else:
        for name in chosen:
            for exporter in exporters:
                print(f"# {name} vs {exporter} ...", file=sys.stderr, flush=True)
                outcomes.append(run_one(exporter, attacks[name], args))
                print(markdown(outcomes[-1:]).splitlines()[2], file=sys.stderr, flush=True)
        sys.stdout.write(markdown(outcomes))
    if args.json:
        rows = [asdict(o) | {"rss_growth_mb": o.rss_growth_mb, "misses": o.misses()} for o in outcomes]
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
