"""Hostile clients against gpulens and Debian's node_exporter, side by side, on loopback.

    .venv/bin/python -m bench.hostile                      # every attack, both exporters
    .venv/bin/python -m bench.hostile --attacks accept,password --slow-seconds 20

Each exporter runs as its own process on 127.0.0.1 (gpulens with ``--backend sim``;
``prometheus-node-exporter`` from the Debian package, which serves through the same
exporter-toolkit web config gpulens mirrors).  For each attack a normal client scrapes
``/metrics`` once a second (gzip, like Prometheus; with the right credentials where basic auth is
on), from a process of its own, while the attack runs; the exporter's RSS and thread count are
sampled every 0.25 s.

Attacks (every loop is bounded in count and time; targets are loopback only):

- ``slow``: 500 connections that send a request head one header byte per second, reopened when
  the server drops them, for ``--slow-seconds`` (60).
- ``headers``: 20 connections, each sending 99 header lines of 64 KB as fast as the server takes
  them and then one byte every 5 s without ever ending the head, for ``--headers-seconds`` (30;
  shorter than a 60 s hold so the whole run stays under ~5 minutes), reopened when dropped.
- ``accept``: 1,500 requests from 4 threads, each with a different ``version=`` in ``Accept``.
- ``password``: 8 threads sending wrong passwords for 10 s, against a web config with one
  bcrypt (cost 10) user; the normal client sends the right one.

Prints a Markdown table (docs/security.md keeps the latest) and, with ``--json``, the raw figures.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.support.net import free_port
from tests.support.process import managed_process
from tests.support.procstat import rss_bytes, thread_count

HOST = "127.0.0.1"
USER = "prometheus"
PASSWORD = "correct horse battery staple"
NODE_EXPORTER = "prometheus-node-exporter"
NODE_EXPORTER_COLLECTORS = ("cpu", "meminfo", "loadavg", "netdev", "filesystem", "diskstats")
"""node_exporter runs with these collectors only, so its page and collection cost stay small."""
MAX_RECONNECTS = 50_000
"""No attack opens more connections than this in total."""


@dataclass
class Outcome:
    """One exporter under one attack."""

    exporter: str
    attack: str
    rss_before_mb: float
    rss_peak_mb: float
    threads_before: int
    threads_peak: int
    scrapes: int
    scrapes_ok: int
    p50_ms: float
    p99_ms: float
    attack_requests: int
    load_average: float = 0.0
    """The machine's 1-minute load average when the attack ended (other work shares the cores)."""

    @property
    def rss_growth_mb(self) -> float:
        """Peak RSS during the attack minus RSS just before it."""
        return self.rss_peak_mb - self.rss_before_mb


# --- exporters ------------------------------------------------------------------------------------


def _web_config(folder: Path, with_auth: bool) -> Path | None:
    if not with_auth:
        return None
    import bcrypt

    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
    path = folder / "web.yml"
    path.write_text(f"basic_auth_users:\n  {USER}: '{hashed}'\n")
    return path


def _auth_headers(with_auth: bool) -> dict[str, str]:
    if not with_auth:
        return {}
    return {"Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}


@contextmanager
def run_exporter(name: str, with_auth: bool, folder: Path) -> Iterator[tuple[int, int]]:
    """Start ``gpulens`` or ``node_exporter`` on a free loopback port; yield (port, pid)."""
    port = free_port()
    config = _web_config(folder, with_auth)
    if name == "gpulens":
        argv = [sys.executable, "-m", "exporter", "--backend", "sim", "--web.listen-address", f"{HOST}:{port}"]
        if config:
            argv += ["--web.config.file", str(config)]
        ready = f"http://{HOST}:{port}/readyz"
    else:
        exe = shutil.which(NODE_EXPORTER)
        if exe is None:
            raise SystemExit(f"{NODE_EXPORTER} is not installed (apt-get install prometheus-node-exporter)")
        argv = [exe, f"--web.listen-address={HOST}:{port}", "--collector.disable-defaults"]
        argv += [f"--collector.{c}" for c in NODE_EXPORTER_COLLECTORS]
        if config:
            argv.append(f"--web.config.file={config}")
        ready = f"http://{HOST}:{port}/metrics"
    with managed_process(argv, ready, log=folder / f"{name}.log", ready_headers=_auth_headers(with_auth)) as proc:
        yield port, proc.pid


# --- measuring ------------------------------------------------------------------------------------


class Watcher:
    """Samples a process' RSS and threads, and runs the normal once-a-second scraper in a process
    of its own (so the attack threads of this process cannot delay it)."""

    def __init__(self, pid: int, port: int, with_auth: bool) -> None:
        self.pid, self.port, self.with_auth = pid, port, with_auth
        self.rss_peak = self.threads_peak = 0
        self.latencies_ms: list[float] = []
        self.scrapes = self.scrapes_ok = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._scraper: subprocess.Popen[str] | None = None

    def __enter__(self) -> Watcher:
        self._sampler.start()
        argv = [sys.executable, "-m", "bench.hostile", "--scraper-port", str(self.port)]
        if self.with_auth:
            argv.append("--scraper-auth")
        self._scraper = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sampler.join(15)
        if self._scraper is not None:
            self._scraper.send_signal(signal.SIGTERM)
            out, _ = self._scraper.communicate(timeout=30)
            result = json.loads(out)
            self.scrapes, self.scrapes_ok, self.latencies_ms = result["scrapes"], result["ok"], result["ms"]

    def _sample(self) -> None:
        while not self._stop.wait(0.25):
            try:
                self.rss_peak = max(self.rss_peak, rss_bytes(self.pid))
                self.threads_peak = max(self.threads_peak, thread_count(self.pid))
            except (OSError, RuntimeError):
                return


def scraper(port: int, with_auth: bool) -> None:
    """The normal client: GET /metrics (gzip) once a second until SIGTERM; prints JSON results."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    headers = {"Accept-Encoding": "gzip", **_auth_headers(with_auth)}
    scrapes = ok = 0
    ms: list[float] = []
    deadline = time.monotonic() + 900  # bounded even if nobody stops it
    while not stop.is_set() and time.monotonic() < deadline:
        t0 = time.perf_counter()
        scrapes += 1
        try:
            conn = http.client.HTTPConnection(HOST, port, timeout=10)
            conn.request("GET", "/metrics", headers=headers)
            resp = conn.getresponse()
            resp.read()
            conn.close()
            if resp.status == 200:
                ok += 1
                ms.append((time.perf_counter() - t0) * 1000)
        except (OSError, http.client.HTTPException):
            pass
        stop.wait(max(0.0, 1.0 - (time.perf_counter() - t0)))
    sys.stdout.write(json.dumps({"scrapes": scrapes, "ok": ok, "ms": ms}))


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


# --- attacks --------------------------------------------------------------------------------------

Attack = Callable[[int, argparse.Namespace], int]
"""``attack(port, args) -> requests or connections made``."""


def _open(port: int) -> socket.socket | None:
    try:
        s = socket.create_connection((HOST, port), timeout=2)
        s.setblocking(False)
        return s
    except OSError:
        return None


def attack_slow(port: int, args: argparse.Namespace) -> int:
    """500 connections trickling a request head, one byte per connection per second."""
    end = time.monotonic() + args.slow_seconds
    socks: list[socket.socket | None] = [None] * args.slow_connections
    opened = 0
    while time.monotonic() < end and opened < MAX_RECONNECTS:
        tick = time.monotonic()
        for i, s in enumerate(socks):
            if s is None:
                s = _open(port)
                if s is None:
                    continue
                opened += 1
                try:
                    s.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                except OSError:
                    s.close()
                    continue
                socks[i] = s
                continue
            try:
                s.send(b"a")
            except OSError:
                s.close()
                socks[i] = None
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    for s in socks:
        if s is not None:
            s.close()
    return opened


def attack_headers(port: int, args: argparse.Namespace) -> int:
    """20 connections each pushing 99 x 64 KB header lines, then one byte every 5 s."""
    end = time.monotonic() + args.headers_seconds
    opened = [0]
    line = b"X-Big-%02d: " + b"b" * (64 * 1024 - 16) + b"\r\n"

    def one() -> None:
        while time.monotonic() < end and opened[0] < MAX_RECONNECTS:
            try:
                with socket.create_connection((HOST, port), timeout=5) as s:
                    opened[0] += 1
                    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                    for i in range(99):
                        s.sendall(line % i)
                    while time.monotonic() < end:
                        time.sleep(min(5.0, max(0.0, end - time.monotonic())))
                        s.sendall(b"c")
            except OSError:
                time.sleep(0.2)  # dropped or refused: reopen, at most 5 times a second

    workers = [threading.Thread(target=one, daemon=True) for _ in range(20)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(args.headers_seconds + 15)
    return opened[0]


def attack_accept(port: int, args: argparse.Namespace) -> int:
    """1,500 requests, each with a different Accept version."""
    count = args.accept_requests
    done = [0]
    lock = threading.Lock()
    end = time.monotonic() + 120

    def one(start: int) -> None:
        conn = http.client.HTTPConnection(HOST, port, timeout=10)
        for i in range(start, count, 4):
            if time.monotonic() > end:
                return
            accept = f"application/openmetrics-text; version=1.0.{i}" if i % 3 else f"text/plain; version=0.0.{i}"
            if i % 5 == 0:
                accept = f"application/openmetrics-text; version={i}x"
            try:
                conn.request("GET", "/metrics", headers={"Accept": accept})
                conn.getresponse().read()
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection(HOST, port, timeout=10)
            with lock:
                done[0] += 1
        conn.close()

    workers = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(130)
    return done[0]


def attack_password(port: int, args: argparse.Namespace) -> int:
    """8 threads of wrong passwords for 10 s."""
    end = time.monotonic() + args.password_seconds
    done = [0]
    lock = threading.Lock()

    def one(seed: int) -> None:
        rnd = random.Random(seed)
        while time.monotonic() < end:
            wrong = f"{USER}:{rnd.getrandbits(64):x}".encode()
            headers = {"Authorization": "Basic " + base64.b64encode(wrong).decode()}
            try:
                conn = http.client.HTTPConnection(HOST, port, timeout=15)
                conn.request("GET", "/metrics", headers=headers)
                conn.getresponse().read()
                conn.close()
            except (OSError, http.client.HTTPException):
                time.sleep(0.05)
            with lock:
                done[0] += 1

    workers = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(args.password_seconds + 30)
    return done[0]


ATTACKS: dict[str, tuple[Attack, bool]] = {
    "slow": (attack_slow, False),
    "headers": (attack_headers, False),
    "accept": (attack_accept, False),
    "password": (attack_password, True),
}
"""name -> (attack, needs basic auth on)."""


def _warm_up(port: int, with_auth: bool) -> None:
    """One scrape before the attack, as Prometheus would have made (its credentials are then
    verified and cached, and the first page is rendered)."""
    conn = http.client.HTTPConnection(HOST, port, timeout=10)
    conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip", **_auth_headers(with_auth)})
    conn.getresponse().read()
    conn.close()


def run_one(exporter: str, attack: str, args: argparse.Namespace) -> Outcome:
    """Start a fresh exporter, let it settle, run one attack under watch, stop the exporter."""
    fn, with_auth = ATTACKS[attack]
    with (
        tempfile.TemporaryDirectory(prefix="hostile-") as tmp,
        run_exporter(exporter, with_auth, Path(tmp)) as (
            port,
            pid,
        ),
    ):
        time.sleep(args.settle_seconds)
        _warm_up(port, with_auth)
        rss0, threads0 = rss_bytes(pid), thread_count(pid)
        with Watcher(pid, port, with_auth) as w:
            time.sleep(1.0)
            made = fn(port, args)
            time.sleep(1.0)
        lat = w.latencies_ms
        print(f"  latencies (ms): {[round(x, 1) for x in lat]}", file=sys.stderr)
        return Outcome(
            exporter=exporter,
            attack=attack,
            rss_before_mb=rss0 / 1e6,
            rss_peak_mb=max(w.rss_peak, rss0) / 1e6,
            threads_before=threads0,
            threads_peak=max(w.threads_peak, threads0),
            scrapes=w.scrapes,
            scrapes_ok=w.scrapes_ok,
            p50_ms=_percentile(lat, 50),
            p99_ms=_percentile(lat, 99),
            attack_requests=made,
            load_average=os.getloadavg()[0],
        )


def markdown(outcomes: list[Outcome]) -> str:
    """The table docs/security.md shows."""
    rows = [
        "| attack | exporter | RSS before → peak (MB) | RSS growth (MB) | threads before → peak "
        "| normal scrapes answered | p50 / p99 (ms) | attack connections or requests | load avg |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        rows.append(
            f"| {o.attack} | {o.exporter} | {o.rss_before_mb:.1f} → {o.rss_peak_mb:.1f} | {o.rss_growth_mb:+.1f} "
            f"| {o.threads_before} → {o.threads_peak} | {o.scrapes_ok}/{o.scrapes} "
            f"| {o.p50_ms:.1f} / {o.p99_ms:.1f} | {o.attack_requests} | {o.load_average:.1f} |"
        )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the attacks; print the table (and write ``--json``)."""
    parser = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--attacks", default="slow,headers,accept,password")
    parser.add_argument("--exporters", default="gpulens,node_exporter")
    parser.add_argument("--slow-connections", type=int, default=500)
    parser.add_argument("--slow-seconds", type=float, default=60.0)
    parser.add_argument("--headers-seconds", type=float, default=30.0)
    parser.add_argument("--accept-requests", type=int, default=1500)
    parser.add_argument("--password-seconds", type=float, default=10.0)
    parser.add_argument("--settle-seconds", type=float, default=3.0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--scraper-port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--scraper-auth", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.scraper_port:
        scraper(args.scraper_port, args.scraper_auth)
        return 0
    attacks = [a for a in args.attacks.split(",") if a]
    exporters = [e for e in args.exporters.split(",") if e]
    for a in attacks:
        if a not in ATTACKS:
            parser.error(f"--attacks: unknown attack {a!r}; choose from {sorted(ATTACKS)}")
    for e in exporters:
        if e not in ("gpulens", "node_exporter"):
            parser.error(f"--exporters: unknown exporter {e!r}")
    outcomes: list[Outcome] = []
    for attack in attacks:
        for exporter in exporters:
            print(f"# {attack} vs {exporter} ...", file=sys.stderr, flush=True)
            outcomes.append(run_one(exporter, attack, args))
            print(markdown(outcomes[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    sys.stdout.write(markdown(outcomes))
    if args.json:
        args.json.write_text(json.dumps([asdict(o) | {"rss_growth_mb": o.rss_growth_mb} for o in outcomes], indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
