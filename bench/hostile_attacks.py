"""The clients of ``bench/hostile.py``: the hostile ones (each attack, and the registry of them)
and the normal scraper that runs beside them.

An attack is a function ``attack(target, budget) -> connections or requests made``.  It runs
until ``budget`` says stop (its seconds are up, or it opened its share of connections), talks
to loopback only, and opens its sockets from ``target.source`` (127.0.0.2 stands for another
pod).  ``AttackSpec`` says how the exporter and the normal scraper are set up around it: basic
auth, TLS or mutual TLS, the simulator scenario, a warm-up scrape or none, a kept-alive scraper.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import functools
import importlib
import json
import os
import random
import select
import signal
import socket
import ssl
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from http.client import HTTPConnection, HTTPException, HTTPSConnection
from typing import Any

HOST = "127.0.0.1"
"""Where the exporters listen, and the normal scraper's source address."""
OTHER_CLIENT = "127.0.0.2"
"""Source address of an attacker that stands for another pod (any 127/8 address is local)."""
SAME_64_HOST = "fd00:1::1"
"""Where the exporters listen in the same-/64 attacks (IPv6, in the bench's own network namespace)."""
SAME_64_SCRAPER = "fd00:1::a"
SAME_64_ATTACKER = "fd00:1::b"
"""The normal scraper and the attacker of the same-/64 attacks: two addresses of one /64, as pods
of one node often have."""
SAME_64_ADDRESSES = (SAME_64_HOST, SAME_64_SCRAPER, SAME_64_ATTACKER)
USER = "prometheus"
PASSWORD = "correct horse battery staple"
SCRAPE_TIMEOUT = 10.0
"""Seconds the normal scraper waits for one scrape (Prometheus' default scrape_timeout)."""
MAX_OPENS = 50_000
"""No attack opens more connections than this in total (the churn attack has its own cap)."""
CHURN_MAX_OPENS = 250_000
"""The cap of the attacks that reconnect at once (plaintext churn; ffdhe against a server that
refuses the ClientHello at once): thousands of connections a second."""
RETRY_DELAY = 0.1
"""Seconds a dropped connection of a fleet waits before it is reopened (bounds the churn of
connections the server refuses at its cap)."""
SMALL_RCVBUF = 4096
"""SO_RCVBUF (bytes) of a client that never reads: the kernel then holds little of the reply and
the rest waits in the server (a hostile client picks this; it also bounds this side's memory)."""
PUSH_CAP_BYTES = 1 << 20
"""Most request bytes one pushing connection sends before it only holds the connection."""
_IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)
"""Linux: bind() to a source address picks the port at connect(), so TIME_WAIT ports are reused."""


@dataclass(frozen=True)
class Target:
    """The exporter under attack (loopback) and the source address the attacker connects from."""

    host: str
    port: int
    source: str = HOST


class Budget:
    """How long an attack runs (seconds, monotonic) and how many connections it may open."""

    def __init__(self, seconds: float, max_opens: int = MAX_OPENS) -> None:
        self.deadline = time.monotonic() + seconds
        self.max_opens = max_opens
        self.opened = 0
        self._lock = threading.Lock()

    def left(self) -> float:
        """Seconds until the attack must stop (never negative)."""
        return max(0.0, self.deadline - time.monotonic())

    def running(self) -> bool:
        """True until the time is up or every allowed connection has been opened."""
        return self.left() > 0 and self.opened < self.max_opens

    def take(self) -> bool:
        """Count one new connection; False (and nothing counted) once the cap is reached."""
        with self._lock:
            if self.opened >= self.max_opens:
                return False
            self.opened += 1
            return True


def request(path: str, *headers: str) -> bytes:
    """An HTTP/1.1 GET request head for ``path`` with extra ``Name: value`` header lines."""
    lines = [f"GET {path} HTTP/1.1", f"Host: {HOST}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def basic(user: str, password: str) -> str:
    """An ``Authorization`` header value for basic auth."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def open_socket(
    target: Target, *, timeout: float = 2.0, rcvbuf: int = 0, blocking: bool = True
) -> socket.socket | None:
    """A TCP socket from ``target.source`` to the target, or None if it could not connect.
    Non-blocking (``blocking=False``): the connect is only started; poll for POLLOUT."""
    s = socket.socket(socket.AF_INET6 if ":" in target.source else socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.IPPROTO_IP, _IP_BIND_ADDRESS_NO_PORT, 1)
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.bind((target.source, 0))
        if blocking:
            s.settimeout(timeout)
            s.connect((target.host, target.port))
            return s
        s.setblocking(False)
        if s.connect_ex((target.host, target.port)) in (0, errno.EINPROGRESS):
            return s
    except OSError:
        pass
    s.close()
    return None


def run_threads(count: int, work: Callable[[int], None], budget: Budget) -> None:
    """Run ``work(k)`` for k in 0..count-1 on daemon threads; wait until the budget's deadline
    plus 35 s (a worker's socket timeouts are at most 30 s) at most."""
    workers = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(count)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(budget.left() + 35)


# --- a fleet of connections driven by poll() ------------------------------------------------------


@dataclass
class _Slot:
    """One connection of a Fleet: its socket (None while closed), whether its connect is still in
    progress, the request bytes not yet sent, the bytes pushed so far, when it may reopen."""

    sock: socket.socket | None = None
    connecting: bool = False
    pending: bytes = b""
    pushed: int = 0
    retry_at: float = 0.0


@dataclass
class Fleet:
    """Keeps ``size`` connections open from one thread (poll()); a dropped one is reopened after
    ``RETRY_DELAY``.  Each connection sends ``opening`` once connected; with ``push`` it keeps
    sending copies of ``push`` while the server takes them (up to ``PUSH_CAP_BYTES``); with
    ``read`` it reads and discards what the server sends, otherwise it never reads."""

    target: Target
    size: int
    budget: Budget
    opening: bytes
    push: bytes = b""
    read: bool = False
    rcvbuf: int = 0
    slots: list[_Slot] = field(default_factory=list)

    def run(self) -> int:
        """Hold the connections until the budget ends; returns the connections opened."""
        self.slots = [_Slot() for _ in range(self.size)]
        poller = select.poll()
        by_fd: dict[int, _Slot] = {}
        while self.budget.left() > 0:
            now = time.monotonic()
            for slot in self.slots:
                if slot.sock is None and now >= slot.retry_at and self.budget.take():
                    self._open(slot, poller, by_fd)
            for fd, events in poller.poll(100):
                ready = by_fd.get(fd)
                if ready is not None:
                    self._event(ready, events, poller, by_fd)
        for slot in self.slots:
            if slot.sock is not None:
                slot.sock.close()
        return self.budget.opened

    def _mask(self, slot: _Slot) -> int:
        mask = select.POLLRDHUP | (select.POLLIN if self.read else 0)
        return mask | (select.POLLOUT if slot.connecting or slot.pending else 0)

    def _open(self, slot: _Slot, poller: select.poll, by_fd: dict[int, _Slot]) -> None:
        sock = open_socket(self.target, rcvbuf=self.rcvbuf, blocking=False)
        if sock is None:
            slot.retry_at = time.monotonic() + RETRY_DELAY
            return
        slot.sock, slot.connecting, slot.pending, slot.pushed = sock, True, b"", 0
        by_fd[sock.fileno()] = slot
        poller.register(sock, self._mask(slot))

    def _drop(self, slot: _Slot, poller: select.poll, by_fd: dict[int, _Slot]) -> None:
        if slot.sock is not None:
            by_fd.pop(slot.sock.fileno(), None)
            poller.unregister(slot.sock)
            slot.sock.close()
        slot.sock = None
        slot.retry_at = time.monotonic() + RETRY_DELAY

    def _event(self, slot: _Slot, events: int, poller: select.poll, by_fd: dict[int, _Slot]) -> None:
        sock = slot.sock
        assert sock is not None
        if slot.connecting:
            if events & (select.POLLERR | select.POLLHUP) or sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self._drop(slot, poller, by_fd)
                return
            slot.connecting, slot.pending = False, self.opening
        elif self.read and events & select.POLLIN:
            try:
                if not sock.recv(65536):
                    self._drop(slot, poller, by_fd)
                    return
            except BlockingIOError:
                pass
            except OSError:
                self._drop(slot, poller, by_fd)
                return
        elif events & (select.POLLERR | select.POLLHUP | select.POLLRDHUP):
            self._drop(slot, poller, by_fd)
            return
        if not self._flush(slot):
            self._drop(slot, poller, by_fd)
            return
        poller.modify(sock, self._mask(slot))

    def _flush(self, slot: _Slot) -> bool:
        """Send what the slot has pending (then more pushes); False if the connection failed."""
        assert slot.sock is not None
        while True:
            if not slot.pending and self.push and slot.pushed < PUSH_CAP_BYTES:
                slot.pending = self.push
            if not slot.pending:
                return True
            try:
                sent = slot.sock.send(slot.pending)
            except BlockingIOError:
                return True
            except OSError:
                return False
            slot.pending = slot.pending[sent:]
            slot.pushed += sent


# --- round 1: the four old attacks ----------------------------------------------------------------

SLOW_CONNECTIONS = 500
HEADER_CONNECTIONS = 20
ACCEPT_REQUESTS = 1500
PASSWORD_THREADS = 8


def attack_slow(target: Target, budget: Budget) -> int:
    """500 connections trickling a request head, one byte per connection per second."""
    socks: list[socket.socket | None] = [None] * SLOW_CONNECTIONS
    while budget.running():
        tick = time.monotonic()
        for i, s in enumerate(socks):
            if s is None:
                if not budget.take():
                    break
                s = open_socket(target)
                if s is None:
                    continue
                try:
                    s.setblocking(False)
                    s.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                    socks[i] = s
                except OSError:
                    s.close()
                continue
            try:
                s.send(b"a")
            except OSError:
                s.close()
                socks[i] = None
        time.sleep(min(budget.left(), max(0.0, 1.0 - (time.monotonic() - tick))))
    for s in socks:
        if s is not None:
            s.close()
    return budget.opened


def attack_headers(target: Target, budget: Budget) -> int:
    """20 connections each pushing 99 x 64 KB header lines, then one byte every 5 s."""
    line = b"X-Big-%02d: " + b"b" * (64 * 1024 - 16) + b"\r\n"

    def one(_k: int) -> None:
        while budget.running() and budget.take():
            s = open_socket(target, timeout=5)
            if s is None:
                time.sleep(0.2)
                continue
            try:
                with s:
                    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                    for i in range(99):
                        s.sendall(line % i)
                    while budget.left() > 0:
                        time.sleep(min(5.0, budget.left()))
                        s.sendall(b"c")
            except OSError:
                time.sleep(0.2)  # dropped or refused: reopen, at most 5 times a second

    run_threads(HEADER_CONNECTIONS, one, budget)
    return budget.opened


def _http_loop(target: Target, budget: Budget, timeout: float, send: Callable[[HTTPConnection], bool]) -> None:
    """Keep one kept-alive connection and call ``send(conn)`` (one request and its reply) until it
    returns False or the budget ends; reconnect when the connection fails or the server closes it."""
    conn: HTTPConnection | None = None
    while budget.left() > 0:
        if conn is None:
            if not budget.take():
                return
            conn = HTTPConnection(target.host, target.port, timeout=timeout, source_address=(target.source, 0))
        try:
            conn.timeout = max(0.1, min(timeout, budget.left() + 1))
            if conn.sock is not None:
                conn.sock.settimeout(conn.timeout)
            if not send(conn):
                break
        except (OSError, HTTPException):
            conn.close()
            conn = None
            time.sleep(0.01)  # refused or dropped: reconnect, at most 100 times a second
    if conn is not None:
        conn.close()


def get(conn: HTTPConnection, path: str, headers: dict[str, str]) -> int:
    """One GET on a kept-alive connection, its reply read whole; returns the status.  Closes the
    connection (the next request reconnects) when the server said it would."""
    conn.request("GET", path, headers=headers)
    resp = conn.getresponse()
    resp.read()
    if resp.will_close:
        conn.close()
    return resp.status


def attack_accept(target: Target, budget: Budget) -> int:
    """1,500 requests from 4 connections, each request with a different Accept version."""
    counter = iter(range(ACCEPT_REQUESTS))
    answered = [0]
    lock = threading.Lock()

    def send(conn: HTTPConnection) -> bool:
        with lock:
            i = next(counter, -1)
        if i < 0:
            return False
        accept = f"application/openmetrics-text; version=1.0.{i}" if i % 3 else f"text/plain; version=0.0.{i}"
        if i % 5 == 0:
            accept = f"application/openmetrics-text; version={i}x"
        get(conn, "/metrics", {"Accept": accept})
        with lock:
            answered[0] += 1
        return True

    run_threads(4, lambda _k: _http_loop(target, budget, 10, send), budget)
    return answered[0]


def _wrong_passwords(target: Target, budget: Budget, connections: int) -> int:
    """``connections`` kept-alive connections sending wrong passwords for USER, one request at a
    time each, until the budget ends; returns the requests answered."""
    answered = [0]
    lock = threading.Lock()

    def loop(k: int) -> None:
        rnd = random.Random(k)

        def send(conn: HTTPConnection) -> bool:
            get(conn, "/metrics", {"Authorization": basic(USER, f"{rnd.getrandbits(64):x}")})
            with lock:
                answered[0] += 1
            return True

        _http_loop(target, budget, 30, send)

    run_threads(connections, loop, budget)
    return answered[0]


def attack_password(target: Target, budget: Budget) -> int:
    """8 connections sending wrong passwords as fast as they are answered."""
    return _wrong_passwords(target, budget, PASSWORD_THREADS)


# --- round 2 --------------------------------------------------------------------------------------

FLEET_CONNECTIONS = 600
"""Connections of the fleet attacks: more than the server's cap of 512."""
UNREAD_PIPELINE = 4
LOGIN_CONNECTIONS = 200
LOGIN_QUEUE_LAG = 2.0
"""Seconds the wrong passwords flow before the normal scraper's first (uncached) login."""
CHURN_THREADS = 8
TLS_MIN_PERIOD = 0.01
"""Seconds between two connections of one ffdhe thread at least: a server that refuses the
ClientHello at once (Go's, which has no finite-field groups) is not hammered in a tight loop."""
PARTIAL_HEAD = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"


def attack_unread(target: Target, budget: Budget) -> int:
    """600 connections, each pipelining 4 ``GET /metrics`` (no gzip) and never reading."""
    opening = request("/metrics") * UNREAD_PIPELINE
    return Fleet(target, FLEET_CONNECTIONS, budget, opening, rcvbuf=SMALL_RCVBUF).run()


def attack_unread_healthz(target: Target, budget: Budget) -> int:
    """600 connections pipelining unauthenticated ``GET /healthz`` while the server takes them,
    never reading a reply."""
    push = request("/healthz") * 64
    return Fleet(target, FLEET_CONNECTIONS, budget, b"", push=push, rcvbuf=SMALL_RCVBUF).run()


def attack_keepalive_at_cap(target: Target, budget: Budget) -> int:
    """600 connections that complete one ``GET /healthz`` each and then sit idle kept alive."""
    return Fleet(target, FLEET_CONNECTIONS, budget, request("/healthz"), read=True).run()


@functools.cache
def ffdhe8192_client_hello() -> bytes:
    """One TLS 1.3 ClientHello that offers only the ffdhe8192 group (its key share included),
    captured from an in-memory handshake; replayed as is, it makes the server do one 8192-bit
    finite-field key exchange per connection."""
    from exporter.http.tls_groups import set_groups

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    set_groups(ctx, ["ffdhe8192"])
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=HOST)
    with contextlib.suppress(ssl.SSLWantReadError):  # it waits for the ServerHello: the hello is out
        tls.do_handshake()
    return outgoing.read()


def attack_tls_ffdhe(connections: int, target: Target, budget: Budget) -> int:
    """``connections`` concurrent connections, each replaying the ffdhe8192-only ClientHello and
    reading whatever the server sends until it closes, then reconnecting."""
    hello = ffdhe8192_client_hello()

    def one(_k: int) -> None:
        while budget.running() and budget.take():
            started = time.monotonic()
            s = open_socket(target)
            if s is None:
                time.sleep(0.05)
                continue
            try:
                with s:
                    s.settimeout(max(0.1, min(15.0, budget.left())))
                    s.sendall(hello)
                    while s.recv(65536):
                        pass
            except OSError:
                pass
            time.sleep(max(0.0, TLS_MIN_PERIOD - (time.monotonic() - started)))

    run_threads(connections, one, budget)
    return budget.opened


def attack_plaintext_churn(target: Target, budget: Budget) -> int:
    """8 threads that send a partial plaintext request head to the TLS port, close, and reconnect
    at once."""

    def one(_k: int) -> None:
        while budget.running() and budget.take():
            s = open_socket(target)
            if s is None:
                continue
            with contextlib.suppress(OSError):
                s.sendall(PARTIAL_HEAD)
            s.close()

    run_threads(CHURN_THREADS, one, budget)
    return budget.opened


def attack_login_queue(target: Target, budget: Budget) -> int:
    """200 kept-alive connections sending wrong passwords for the real user, continuously."""
    return _wrong_passwords(target, budget, LOGIN_CONNECTIONS)


MALFORMED_PER_SECOND = 100
"""Malformed requests a second of the malformed-request flood."""


def attack_malformed(target: Target, budget: Budget) -> int:
    """100 connections a second, each sending a request line that is not HTTP and reading the
    reply (or the reset) before it closes."""
    made = 0
    while budget.running():
        started = time.monotonic()
        if not budget.take():
            break
        s = open_socket(target, timeout=2.0)
        if s is not None:
            with s, contextlib.suppress(OSError):
                s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
                while s.recv(4096):
                    pass
        made += 1
        time.sleep(max(0.0, 1.0 / MALFORMED_PER_SECOND - (time.monotonic() - started)))
    return made


def enter_private_network(addresses: tuple[str, ...] = SAME_64_ADDRESSES) -> None:
    """Move this process (and every process it starts later) into a network namespace of its own
    whose loopback also holds ``addresses`` (IPv6): two addresses of one /64 without touching the
    host's interfaces.  Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN); call it before any thread starts
    (unshare moves only the calling thread)."""
    import ctypes
    import subprocess

    clone_newnet = 0x40000000
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(clone_newnet) != 0:
        raise SystemExit(
            f"the same-/64 attacks need a network namespace of their own (root): {os.strerror(ctypes.get_errno())}"
        )
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    for address in addresses:
        subprocess.run(["ip", "-6", "addr", "add", f"{address}/128", "dev", "lo", "nodad"], check=True)


def attack_none(_target: Target, budget: Budget) -> int:
    """No client-side attack: a misbehaving kubelet or API server does the harm."""
    time.sleep(budget.left())
    return 0


# --- the normal scraper ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ScraperConfig:
    """How the normal client reaches the exporter."""

    port: int
    auth: bool = False
    ca: str = ""
    """CA file that verifies the server: HTTPS when set."""
    cert: str = ""
    key: str = ""
    """Client certificate and key (mutual TLS)."""
    keepalive: bool = False
    """One kept-alive connection, reopened when dropped (Prometheus' way), instead of one per scrape."""
    source: str = HOST
    host: str = HOST
    """Where the exporter listens."""


@dataclass
class ScrapeResult:
    """What the normal scraper saw: scrapes made, answered (200), latencies of answered ones (ms),
    reconnects of a kept-alive scraper, seconds to the first answer, failures by kind."""

    scrapes: int = 0
    ok: int = 0
    ms: list[float] = field(default_factory=list)
    reconnects: int = 0
    first_ok_s: float | None = None
    errors: dict[str, int] = field(default_factory=dict)


@functools.cache
def client_context(cfg: ScraperConfig) -> ssl.SSLContext | None:
    """The scraper's TLS context (server verified with the CA; client certificate if given), one
    per configuration, as a client keeps one."""
    if not cfg.ca:
        return None
    ctx = ssl.create_default_context(cafile=cfg.ca)
    if cfg.cert:
        ctx.load_cert_chain(cfg.cert, cfg.key)
    return ctx


def connect(cfg: ScraperConfig, timeout: float = SCRAPE_TIMEOUT) -> HTTPConnection:
    """A connected (and, with TLS, handshaken) connection to the exporter from ``cfg.source``."""
    ctx = client_context(cfg)
    source = (cfg.source, 0)
    conn: HTTPConnection
    if ctx is not None:
        conn = HTTPSConnection(cfg.host, cfg.port, timeout=timeout, source_address=source, context=ctx)
    else:
        conn = HTTPConnection(cfg.host, cfg.port, timeout=timeout, source_address=source)
    conn.connect()
    return conn


def scrape_headers(cfg: ScraperConfig) -> dict[str, str]:
    """What Prometheus sends: gzip, and the credentials where basic auth is on."""
    headers = {"Accept-Encoding": "gzip"}
    if cfg.auth:
        headers["Authorization"] = basic(USER, PASSWORD)
    return headers


def scrape_get(conn: HTTPConnection, headers: dict[str, str]) -> tuple[int, bool]:
    """GET /metrics on ``conn``, reply read whole: (status, whether the server closes after it)."""
    conn.request("GET", "/metrics", headers=headers)
    resp = conn.getresponse()
    resp.read()
    return resp.status, resp.will_close


def error_kind(exc: BaseException) -> str:
    """A failed scrape's kind for the notes: refused, tls, timeout, reset, or the exception's name."""
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, ssl.SSLError):
        return "tls"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, ConnectionError):
        return "reset"
    return type(exc).__name__


class Scraper:
    """Scrapes once a second; a kept-alive one retries once on a fresh connection when the server
    closed the reused one (as Go's HTTP client does for a GET)."""

    def __init__(self, cfg: ScraperConfig) -> None:
        self.cfg = cfg
        self.headers = scrape_headers(cfg)
        self.conn: HTTPConnection | None = None
        self.opened = 0
        self.result = ScrapeResult()
        self.errors: Counter[str] = Counter()

    def _fresh(self) -> HTTPConnection:
        if self.conn is not None:
            self.conn.close()
        self.conn = None
        self.conn = connect(self.cfg)
        self.opened += 1
        return self.conn

    def once(self) -> None:
        """One scrape; counts it, and its latency if answered."""
        t0 = time.perf_counter()
        self.result.scrapes += 1
        try:
            reused = self.conn is not None
            conn = self.conn if self.conn is not None else self._fresh()
            try:
                status, closing = scrape_get(conn, self.headers)
            except ConnectionError:
                if not reused:
                    raise
                status, closing = scrape_get(self._fresh(), self.headers)
            if closing or not self.cfg.keepalive:
                assert self.conn is not None
                self.conn.close()
                self.conn = None
        except (OSError, HTTPException) as exc:
            if self.conn is not None:
                self.conn.close()
                self.conn = None
            self.errors[error_kind(exc)] += 1
            return
        if status != 200:
            self.errors[f"HTTP {status}"] += 1
            return
        self.result.ok += 1
        self.result.ms.append((time.perf_counter() - t0) * 1000)

    def run(self, stop: threading.Event, limit_s: float = 1800) -> ScrapeResult:
        """Scrape once a second until ``stop`` (or ``limit_s``)."""
        start = time.monotonic()
        while not stop.is_set() and time.monotonic() - start < limit_s:
            t0 = time.monotonic()
            self.once()
            if self.result.ok and self.result.first_ok_s is None:
                self.result.first_ok_s = time.monotonic() - start
            stop.wait(max(0.0, 1.0 - (time.monotonic() - t0)))
        self.result.reconnects = max(0, self.opened - 1) if self.cfg.keepalive else 0
        self.result.errors = dict(self.errors)
        return self.result


def scraper_main(cfg: ScraperConfig) -> None:
    """The normal client's process: scrape until SIGTERM, then print the ScrapeResult as JSON."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    result = Scraper(cfg).run(stop)
    sys.stdout.write(json.dumps(asdict(result)))


# --- the registry ---------------------------------------------------------------------------------

Attack = Callable[[Target, Budget], int]
"""``attack(target, budget) -> connections or requests made``."""

SCENARIO = "h200x8"
"""The simulator's default node (8 whole H200s; /metrics about 114 KB)."""
MIG_SCENARIO = "mig7x8"
"""The large MIG node (8 x 7 instances, 202 processes; /metrics about 630 KB)."""


@dataclass(frozen=True)
class AttackSpec:
    """One attack and how the exporter and the normal scraper are set up around it."""

    name: str
    run: Attack
    what: str
    """One line for ``--list`` and the docs."""
    auth: bool = False
    """Basic auth on (one bcrypt cost-10 user); the normal scraper sends the right password."""
    tls: str = ""
    """"" (plain HTTP), "tls", or "mtls" (client_auth_type RequireAndVerifyClientCert)."""
    scenario: str = SCENARIO
    warm_up: bool = True
    """One scrape before the attack (credentials verified and cached, first page rendered)."""
    scraper_lag_s: float = -1.0
    """Seconds the normal scraper starts after the attack (negative: before it)."""
    keepalive_scraper: bool = False
    """The normal scraper keeps one connection alive (like Prometheus) and counts reconnects."""
    source: str = OTHER_CLIENT
    """The attacker's source address: another pod's by default; the normal scraper's own
    (``HOST``) in the ``-same-addr`` variants."""
    host: str = HOST
    """Where the exporters listen (``SAME_64_HOST`` in the same-/64 attacks)."""
    scraper_source: str = HOST
    """The normal scraper's source address."""
    rss_after_seconds: float = 0.0
    """If set, RSS is also read this many seconds after the attack ended."""
    peer: str = ""
    """A hostile kubelet / API server (bench/hostile_peers.py); node_exporter is then n/a."""
    max_opens: int = MAX_OPENS
    container: bool = False
    """One of the high-severity attacks ``--container`` runs against the image."""


def _own_attacks() -> list[AttackSpec]:
    tls_ffdhe = "replays one ClientHello offering only ffdhe8192 on {} connections, reading until closed"
    unread = "600 connections each pipeline 4 GET /metrics (no gzip) and never read; reopened when dropped"
    return [
        AttackSpec("slow", attack_slow, "500 connections send a request head one byte per second"),
        AttackSpec("headers", attack_headers, "20 connections push 99 x 64 KB header lines, then a byte every 5 s"),
        AttackSpec("accept", attack_accept, "1,500 requests, each with a different Accept version"),
        AttackSpec("password", attack_password, "8 connections send wrong passwords", auth=True),
        AttackSpec("unread", attack_unread, unread + f" ({SCENARIO})", container=True),
        AttackSpec("unread-mig", attack_unread, unread + f" ({MIG_SCENARIO})", scenario=MIG_SCENARIO),
        AttackSpec(
            "unread-same-addr",
            attack_unread,
            unread + f" ({SCENARIO}), from the normal scraper's own address",
            source=HOST,
        ),
        AttackSpec(
            "unread-healthz-auth",
            attack_unread_healthz,
            "basic auth on; 600 connections pipeline unauthenticated GET /healthz, never read",
            auth=True,
        ),
        AttackSpec(
            "tls-ffdhe-8",
            functools.partial(attack_tls_ffdhe, 8),
            tls_ffdhe.format(8),
            tls="tls",
            max_opens=CHURN_MAX_OPENS,
        ),
        AttackSpec(
            "tls-ffdhe-48",
            functools.partial(attack_tls_ffdhe, 48),
            tls_ffdhe.format(48),
            tls="tls",
            max_opens=CHURN_MAX_OPENS,
            container=True,
        ),
        AttackSpec(
            "tls-ffdhe-mtls",
            functools.partial(attack_tls_ffdhe, 48),
            tls_ffdhe.format(48) + "; mutual TLS required",
            tls="mtls",
            max_opens=CHURN_MAX_OPENS,
        ),
        AttackSpec(
            "tls-plaintext-churn",
            attack_plaintext_churn,
            "8 threads send a partial plaintext head to the TLS port, close and reconnect at once",
            tls="tls",
            rss_after_seconds=10.0,
            max_opens=CHURN_MAX_OPENS,
            container=True,
        ),
        AttackSpec(
            "login-queue",
            attack_login_queue,
            "200 connections from 127.0.0.2 send wrong passwords for the real user; scraper not warmed up",
            auth=True,
            warm_up=False,
            scraper_lag_s=LOGIN_QUEUE_LAG,
            source=OTHER_CLIENT,
        ),
        AttackSpec(
            "login-queue-same-addr",
            attack_login_queue,
            "as login-queue, the attacker also from 127.0.0.1",
            auth=True,
            warm_up=False,
            scraper_lag_s=LOGIN_QUEUE_LAG,
            source=HOST,
        ),
        AttackSpec(
            "malformed-same-64",
            attack_malformed,
            f"{MALFORMED_PER_SECOND} malformed requests a second from {SAME_64_ATTACKER}, "
            f"in the /64 of the scraper ({SAME_64_SCRAPER})",
            source=SAME_64_ATTACKER,
            host=SAME_64_HOST,
            scraper_source=SAME_64_SCRAPER,
            max_opens=CHURN_MAX_OPENS,
        ),
        AttackSpec(
            "login-queue-same-64",
            attack_login_queue,
            f"as login-queue, from {SAME_64_ATTACKER}, in the /64 of the scraper ({SAME_64_SCRAPER})",
            auth=True,
            warm_up=False,
            scraper_lag_s=LOGIN_QUEUE_LAG,
            source=SAME_64_ATTACKER,
            host=SAME_64_HOST,
            scraper_source=SAME_64_SCRAPER,
        ),
        AttackSpec(
            "keepalive-at-cap",
            attack_keepalive_at_cap,
            "600 connections each complete one request, then idle kept alive; one kept-alive scraper",
            keepalive_scraper=True,
        ),
    ]


def _peer_attacks() -> tuple[list[AttackSpec], str]:
    """The kubelet / API server attacks of bench/hostile_peers.py, or why there are none."""
    try:
        peers: Any = importlib.import_module("bench.hostile_peers")
        names: dict[str, str] = dict(peers.PEER_ATTACKS)
    except Exception as exc:  # missing, or not importable yet: listed as unavailable
        return [], f"unavailable ({type(exc).__name__}: {exc})"
    return [AttackSpec(name, attack_none, what, peer=name) for name, what in names.items()], ""


def registry() -> tuple[dict[str, AttackSpec], str]:
    """Every attack by name, and why the peer attacks are unavailable ("" when they are not)."""
    own = {spec.name: spec for spec in _own_attacks()}
    peers, why = _peer_attacks()
    for spec in peers:
        name = spec.name if spec.name not in own else f"peer-{spec.name}"
        own[name] = replace(spec, name=name)
    return own, why
