"""HTTP(S) endpoints: ``/metrics`` (exposition), ``/healthz`` (alive), ``/readyz`` (ready).

One asyncio event loop serves every connection (exporter/http/connection.py); h11 parses HTTP/1.1.
What any client, however slow or hostile, can cost is bounded (docs/security.md, "HTTP front"):

- misbehaving clients: each connection of a client address that ends badly (a deadline, an
  eviction, a reset for not reading, a failed TLS handshake, plaintext on the TLS port, a
  handshake beyond its address' share of the queue, a malformed request) takes a token
  from that address' bucket (``Limits.bad_endings_per_second``, bursts of
  ``bad_endings_burst``) and from its IPv6 /64's (4 times larger); while the address' is empty,
  or the /64's for an address not served well lately (exporter/http/clients.py), the address'
  new connections are reset before they are read (exporter/http/admission.py).
- connections: at most ``Limits.max_connections`` open at once.  A new connection over the cap
  closes another, in this order: one that has not completed a request or has stopped reading its
  reply (oldest first), then kept-alive idle ones that have delivered the fewest replies (a
  scraper's long-lived connection goes last).  When every open connection is being answered,
  the new one is closed.
- unsent bytes: a reply is written a slice at a time; at most ``Limits.max_stalled`` connections
  may have a reply stuck unread (the longest stuck is closed beyond), and every reply must be
  taken within ``Limits.write_deadline``.
- time: the TLS handshake, request line and headers must all arrive within
  ``Limits.request_deadline`` of the connection (or, on a kept-alive connection, of the first
  byte of the next request).
- bytes: the request head may hold ``Limits.max_header_bytes`` and ``Limits.max_headers``
  fields (431 beyond).  A request body is never read: the reply closes the connection.
- CPU: TLS handshakes run on ``TLS_WORKERS`` low-priority threads, at most
  ``Limits.max_handshakes`` waiting (more are shed), at most ``Limits.max_handshakes_per_client``
  of one address (more are shed and charged to it); a plaintext request on the TLS port is
  answered with a plain-text 400 at its first byte, before any SSL object exists
  (exporter/http/connection.py, ``_start_tls``); and only elliptic-curve key exchanges are
  offered (exporter/http/tls_groups.py); uncached bcrypt checks run on one low-priority thread, fairly
  between client addresses and /64s, known-good addresses first, and bounded (exporter/http/login.py).
- threads: the loop thread, ``RENDER_WORKERS`` that build /metrics bodies, the TLS handshake
  threads and the bcrypt thread: a fixed number.
- freed memory: after a burst of closed connections the C heap is trimmed (exporter/heap.py).

Only GET and HEAD are served.  TLS, mTLS and basic auth come from ``--web.config.file``
(exporter/http/webconfig.py); the TLS context is looked up per connection, so rotated certificates
take effect without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import ssl
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from exporter.heap import trim_now
from exporter.http.admission import ConnectionBudget
from exporter.http.clients import KnownClients, client_address
from exporter.http.connection import READ_CHUNK, TIER_IDLE_TRUSTED, TIER_STALLED, Connection
from exporter.http.limits import Limits
from exporter.http.login import LoginScheduler
from exporter.http.response import Response
from exporter.http.tls_session import TlsSession
from exporter.http.webconfig import BasicAuth, TlsContextSource, WebConfig
from exporter.listen_address import parse_listen_address
from exporter.render.gzip_stream import gzip_parts
from exporter.render.negotiate import accepts_gzip, exposition_accept
from exporter.tcp import as_tcp

log = logging.getLogger(__name__)

LANDING = b"""<html><head><title>gpulens exporter</title></head><body>
<h1>gpulens exporter</h1><p><a href="/metrics">Metrics</a> &middot;
<a href="/healthz">healthz</a> &middot; <a href="/readyz">readyz</a></p></body></html>
"""

RENDER_WORKERS = 2
"""Threads that build /metrics bodies (encoding, gzip); more requests wait for a free one."""
TLS_WORKERS = 1
"""Threads that run TLS handshake steps (key exchange, signature, certificate checks)."""
LISTEN_BACKLOG = 1024
"""Kernel accept queue (capped by net.core.somaxconn): a burst of reconnecting clients must not
overflow it, or a scraper's SYN is dropped and retried only a second later."""
ACCEPT_BATCH = 32
"""Connections accepted per event-loop wake-up."""
FD_RESERVE = 64
"""File descriptors kept free of connections for the rest of the process."""
WORKER_NICE = 10
"""Nice increment of the bcrypt and TLS handshake threads: under a CPU limit they yield to the
loop thread, which answers scrapes."""
STALL_SWEEP_SECONDS = 0.25
"""How often connections with replies in flight are checked; a client that has not taken a
reply at two checks in a row (0.25-0.5 s; a LAN scraper takes it in milliseconds) is stalled."""
TRIM_AFTER_CLOSES = 64
"""Closed connections after which the C heap is trimmed (at most once per ``TRIM_DELAY``)."""
TRIM_DELAY = 1.0
"""Seconds from the burst's first counted close to the trim."""


Body = bytes | Sequence[bytes | memoryview]
Exposition = Callable[[str], tuple[Body, str]]
"""``render(accept_header) -> (body or its parts, content_type)``: the metrics page."""
Reply = Callable[[str, bool, bool], tuple[Body, str] | None]
"""``reply(accept_header, gzip, encode) -> (body parts, content_type)``: the metrics page,
gzipped when ``gzip``; with ``encode`` False, ``None`` unless it is at hand without encoding or
compressing the page (exporter/render/collector.py, ``CachedExposition.reply``)."""


MAX_NAMED_FAILURES = 20
"""Families ``/readyz`` names at most (gpulens_render_errors_total has them all)."""

UNAUTHENTICATED_PATHS = ("/healthz", "/readyz")
"""Liveness/readiness reveal nothing and kubelet probes cannot send credentials."""


def _text(status: int, text: bytes, **kw: Any) -> Response:
    return Response(status, (text,), **kw)


def _lower_priority() -> None:
    """Run the calling thread at a lower CPU priority (Linux: per-thread nice)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICE)


def _fit_to_fd_limit(limits: Limits) -> Limits:
    """Raise the soft open-files limit to the hard one (as Go programs do at start), and keep
    ``max_connections`` below it: at the limit, accept() fails and asyncio stops accepting."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    except (ImportError, ValueError, OSError):
        return limits
    if soft != resource.RLIM_INFINITY and limits.max_connections > soft - FD_RESERVE:
        log.warning("open-files limit %d: serving at most %d connections", soft, max(1, soft - FD_RESERVE))
        return replace(limits, max_connections=max(1, soft - FD_RESERVE))
    return limits


def _plain(registry: CollectorRegistry) -> Exposition:
    def render(accept: str) -> tuple[Body, str]:
        encoder, ctype = choose_encoder(exposition_accept(accept))
        return encoder(registry), ctype

    return render


def listen_socket(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket.  An empty host listens on both stacks (``::`` with
    IPV6_V6ONLY off, as Go's ``:port`` does) where the host has IPv6, else on 0.0.0.0; ``0.0.0.0``
    is IPv4 only and ``::`` IPv6 only."""
    if not host:
        if socket.has_dualstack_ipv6():
            sock = socket.create_server(("", port), family=socket.AF_INET6, backlog=LISTEN_BACKLOG, dualstack_ipv6=True)
        else:
            sock = socket.create_server(("0.0.0.0", port), family=socket.AF_INET, backlog=LISTEN_BACKLOG)
    else:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)
    # as_tcp: asyncio then sets TCP_NODELAY on each connection (a small reply is not held 40 ms)
    return as_tcp(sock)


class MetricsServer:
    """Serves the exposition on a background event loop until ``shutdown()``.

    The listening socket is bound in the constructor, so a busy port raises ``OSError`` there.
    """

    def __init__(
        self,
        address: str,
        exposition: Exposition | CollectorRegistry,
        ready: Callable[[], bool],
        web_config: WebConfig | None = None,
        limits: Limits | None = None,
        reply: Reply | None = None,
        degraded: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        host, port = parse_listen_address(address)
        self._exposition = _plain(exposition) if isinstance(exposition, CollectorRegistry) else exposition
        self._reply_at_hand = reply
        """Where given, a page already encoded (and compressed) is answered on the loop thread,
        without the hop to a render thread; the rest still goes to one (``reply`` with ``encode``)."""
        self._ready = ready
        self._degraded = degraded
        """Where given, the families left out of the page because they failed to render: ``/readyz``
        names them (still 200: the rest of the page is served, and a restart would not mend a name)."""
        self.limits = _fit_to_fd_limit(limits or Limits())
        self.extra_headers: tuple[tuple[str, str], ...] = ()
        self._auth: BasicAuth | None = None
        self._tls: TlsContextSource | None = None
        if web_config is not None:
            self.extra_headers = tuple(web_config.headers.items())
            if web_config.basic_auth_users:
                self._auth = BasicAuth(web_config.basic_auth_users)
            if web_config.tls is not None:
                self._tls = TlsContextSource(web_config.tls, web_config.path)
        self.serves_tls = self._tls is not None
        self._sock = listen_socket(host, port)
        self._sock.setblocking(False)
        self.read_buffer = memoryview(bytearray(READ_CHUNK))
        self._render_pool = ThreadPoolExecutor(RENDER_WORKERS, thread_name_prefix="gpulens-render")
        self._auth_pool = ThreadPoolExecutor(1, thread_name_prefix="gpulens-bcrypt", initializer=_lower_priority)
        self._tls_pool = ThreadPoolExecutor(TLS_WORKERS, thread_name_prefix="gpulens-tls", initializer=_lower_priority)
        self.loop = asyncio.new_event_loop()
        self.known = KnownClients()
        """Client addresses served well lately: their own budget and login lane in a busy /64."""
        self._logins = (
            LoginScheduler(self._auth, self._auth_pool, self.loop, known=self.known) if self._auth is not None else None
        )
        self._conns: dict[int, Connection] = {}
        self.budget = ConnectionBudget(
            self.limits.bad_endings_per_second, self.limits.bad_endings_burst, known=self.known
        )
        self._tiers: list[OrderedDict[int, Connection]] = [OrderedDict() for _ in range(TIER_IDLE_TRUSTED + 1)]
        self._stalled: OrderedDict[int, Connection] = OrderedDict()
        self._unconfirmed: dict[int, Connection] = {}
        self._seen_unsent: set[int] = set()
        self._sweeping = False
        self._handshakes = 0
        self._handshakes_of: dict[str, int] = {}
        """Handshake steps waiting or running, by client address (only addresses with some)."""
        self._closes = 0
        self._trim_pending = False
        self._next_key = 0
        self._server: asyncio.AbstractServer | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run_loop, name="gpulens-http", daemon=True)
        self.evicted = 0
        """Connections closed to make room for a new one (for tests and the bench)."""
        self.refused = 0
        """New connections closed because every open one was busy."""
        self.stall_closed = 0
        """Connections closed because more than ``max_stalled`` had unread replies."""
        self.handshakes_shed = 0
        """TLS connections closed because ``max_handshakes`` were already waiting (or
        ``max_handshakes_per_client`` of their address)."""
        self.trims = 0
        """Heap trims after bursts of closed connections."""

    @property
    def port(self) -> int:
        """The bound port (useful with ``:0``)."""
        return int(self._sock.getsockname()[1])

    @property
    def family(self) -> socket.AddressFamily:
        """The listening socket's address family."""
        return self._sock.family

    def open_connections(self) -> int:
        """Connections open right now."""
        return len(self._conns)

    def start(self) -> None:
        """Start serving."""
        self._thread.start()
        self._started.wait(10)

    def shutdown(self) -> None:
        """Stop accepting, close every connection and the socket, and end the threads."""
        if self._thread.is_alive():
            fut = asyncio.run_coroutine_threadsafe(self._close(), self.loop)
            with contextlib.suppress(Exception):
                fut.result(5)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
        if not self.loop.is_running():
            self.loop.close()
        self._sock.close()
        for pool in (self._render_pool, self._auth_pool, self._tls_pool):
            pool.shutdown(wait=False, cancel_futures=True)

    # --- loop ---------------------------------------------------------------------------
    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._server = self.loop.run_until_complete(
            self.loop.create_server(lambda: Connection(self), sock=self._sock, backlog=ACCEPT_BATCH)
        )
        # asyncio uses one number for the kernel's queue and for accepts per wake-up: set the
        # queue long again, so a burst waits in the kernel while the loop keeps serving between
        # batches.
        self._sock.listen(LISTEN_BACKLOG)
        self._started.set()
        self.loop.run_forever()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns.values()):
            conn.close(charge=False)
        self._conns.clear()
        for tier in self._tiers:
            tier.clear()
        self._stalled.clear()
        self._unconfirmed.clear()

    # --- connection bookkeeping (loop thread) ---------------------------------------------
    def admit(self, conn: Connection) -> bool:
        """Take a new connection, closing an evictable one at the cap; False: refuse it (its
        address spent its budget of new connections, or every open connection is busy)."""
        if not self.budget.admit(conn.peer):
            return False
        if len(self._conns) >= self.limits.max_connections:
            victim = next((tier.popitem(last=False)[1] for tier in self._tiers if tier), None)
            if victim is None:
                self.refused += 1
                return False
            victim.close()
            self.evicted += 1
        self._next_key += 1
        conn.key = self._next_key
        self._conns[conn.key] = conn
        return True

    def place(self, conn: Connection, tier: int | None) -> None:
        """``conn`` belongs in eviction tier ``tier`` (None: not evictable); while it is stalled
        it stays in the first tier, and goes to ``tier`` once its client catches up."""
        conn.home = tier
        self._put(conn, TIER_STALLED if conn.key in self._stalled else tier)

    def _put(self, conn: Connection, tier: int | None) -> None:
        if conn.tier is not None:
            self._tiers[conn.tier].pop(conn.key, None)
        conn.tier = tier
        if tier is not None and not conn.closed:
            self._tiers[tier][conn.key] = conn

    def wrote(self, conn: Connection) -> None:
        """``conn`` handed bytes to its transport: watch until its client has taken them."""
        self._unconfirmed[conn.key] = conn
        if not self._sweeping:
            self._sweeping = True
            self.loop.call_later(STALL_SWEEP_SECONDS, self._sweep)

    def _sweep(self) -> None:
        """Every ``STALL_SWEEP_SECONDS`` while replies are unconfirmed: a connection whose client
        has taken everything is confirmed (and closed if it was ending); one that still holds
        unsent bytes at two sweeps in a row is stalled."""
        for key, conn in list(self._unconfirmed.items()):
            if conn.closed:
                self._unconfirmed.pop(key, None)
                self._seen_unsent.discard(key)
            elif conn.unsent() == 0:
                self._unconfirmed.pop(key, None)
                self._seen_unsent.discard(key)
                conn.lagging = False
                self._stall(conn, False)
                conn.drained_out()
            elif key in self._seen_unsent:
                conn.lagging = True
                self._stall(conn, True)
            else:
                self._seen_unsent.add(key)
        self._sweeping = bool(self._unconfirmed)
        if self._sweeping:
            self.loop.call_later(STALL_SWEEP_SECONDS, self._sweep)

    def paused(self, conn: Connection, paused: bool) -> None:
        """asyncio's buffer for ``conn`` went non-empty (the kernel refused bytes) or empty again:
        a paused writer holds up to one slice in user space, so it counts as stalled at once."""
        if paused or not conn.lagging:
            self._stall(conn, paused)

    def _stall(self, conn: Connection, stalled: bool) -> None:
        """A stalled connection is evictable first; beyond ``max_stalled`` the one stalled
        longest is closed (with a reset, which frees what the kernel holds for it)."""
        if not stalled:
            if self._stalled.pop(conn.key, None) is not None:
                self._put(conn, conn.home)
            return
        if conn.key in self._stalled:
            return
        self._stalled[conn.key] = conn
        self._put(conn, TIER_STALLED)
        while len(self._stalled) > self.limits.max_stalled:
            _key, victim = self._stalled.popitem(last=False)
            self.stall_closed += 1
            victim.close()

    def forget(self, conn: Connection) -> None:
        """``conn`` is closed: drop it from every table and count it towards a heap trim."""
        if self._conns.pop(conn.key, None) is None:
            return
        self._stalled.pop(conn.key, None)
        self._put(conn, None)
        self._unconfirmed.pop(conn.key, None)
        self._seen_unsent.discard(conn.key)
        self._closes += 1
        if self._closes >= TRIM_AFTER_CLOSES and not self._trim_pending:
            self._trim_pending = True
            self.loop.call_later(TRIM_DELAY, self._trim)

    def _trim(self) -> None:
        """Trim on a render thread: ``malloc_trim`` walks the whole heap (up to tens of ms with the
        driver's library loaded) and the loop must keep answering meanwhile."""
        self._closes = 0
        try:
            done = self.loop.run_in_executor(self._render_pool, trim_now)
        except RuntimeError:  # the pool is shut down
            self._trim_pending = False
            return
        done.add_done_callback(self._trimmed)

    def _trimmed(self, done: asyncio.Future[bool]) -> None:
        self._trim_pending = False
        if not done.cancelled() and done.exception() is None and done.result():
            self.trims += 1

    def tls_context(self) -> ssl.SSLContext | None:
        """The TLS context for a new connection (re-read after a certificate rotation), or None."""
        return self._tls.context() if self._tls is not None else None

    def handshake(self, session: TlsSession, peer: str) -> asyncio.Future[bool] | None:
        """Run one handshake step of ``session`` (a connection of ``peer``) on the TLS thread;
        None if too many wait.

        An address may have at most ``max_handshakes_per_client`` steps waiting: a connection
        beyond is shed and charged to the address at once.  A failed handshake is charged only
        once its step has run, so without this bound a client reconnecting at once (garbage
        behind a handshake record's first byte, a ClientHello no group fits) had hundreds of SSL
        objects in flight before its budget ran dry, and took the whole queue: other clients'
        handshakes were shed."""
        address = client_address(peer)
        waiting = self._handshakes_of.get(address, 0)
        if self._handshakes >= self.limits.max_handshakes or waiting >= self.limits.max_handshakes_per_client:
            self.handshakes_shed += 1
            if waiting >= self.limits.max_handshakes_per_client:
                self.budget.charge(peer)
            return None
        try:
            future = self.loop.run_in_executor(self._tls_pool, session.handshake_step)
        except RuntimeError:  # the pool is shut down
            return None
        self._handshakes += 1
        self._handshakes_of[address] = waiting + 1
        future.add_done_callback(functools.partial(self._handshake_done, address))
        return future

    def _handshake_done(self, address: str, _future: asyncio.Future[bool]) -> None:
        self._handshakes -= 1
        left = self._handshakes_of.pop(address, 1) - 1
        if left > 0:
            self._handshakes_of[address] = left

    # --- requests -----------------------------------------------------------------------
    async def respond(self, request: Any, peer: str) -> Response:
        """The reply to one request (``peer``: the client's address, for fair logins); a 2xx
        reply vouches for its client (``Response.vouches``) when auth is off or the request
        carried correct credentials."""
        response = await self._answer(request, peer)
        # on a path behind auth, a 2xx means the credentials were checked and correct
        checked = self._auth is None or urlsplit(request.target.decode("latin-1")).path not in UNAUTHENTICATED_PATHS
        if 200 <= response.status < 300 and checked:
            response = replace(response, vouches=True)
        return response

    async def _answer(self, request: Any, peer: str) -> Response:
        method = request.method.decode("ascii", "replace")
        if method not in ("GET", "HEAD"):
            return _text(405, b"method not allowed\n", headers=(("Allow", "GET, HEAD"),))
        headers: dict[str, str] = {}
        for name, value in request.headers:
            key = name.decode("latin-1").lower()
            if key == "authorization" and key in headers:  # which one counts is ambiguous: refuse
                return _text(400, b"more than one Authorization header\n", close=True)
            headers[key] = value.decode("latin-1")
        path = urlsplit(request.target.decode("latin-1")).path
        if self._auth is not None and path not in UNAUTHENTICATED_PATHS:
            refused = await self._authenticate(headers.get("authorization"), peer)
            if refused is not None:
                return refused
        if path == "/metrics":
            accept, encoding = headers.get("accept", ""), headers.get("accept-encoding", "")
            if self._reply_at_hand is not None:
                gzip = accepts_gzip(encoding)
                page = self._reply_at_hand(accept, gzip, False)
                if page is None:
                    page = await self.loop.run_in_executor(self._render_pool, self._reply_at_hand, accept, gzip, True)
                assert page is not None
                return _page(page, gzip)
            return await self.loop.run_in_executor(self._render_pool, self._metrics, accept, encoding)
        if path == "/healthz":
            return _text(200, b"ok\n")
        if path == "/readyz":
            if self._ready():
                return _text(200, self._readiness())
            return _text(503, b"not ready: no snapshot yet, or the sampler stopped\n")
        if path == "/":
            return Response(200, (LANDING,), "text/html; charset=utf-8")
        return _text(404, b"not found\n")

    def _readiness(self) -> bytes:
        """The body of a ready ``/readyz``: ``ready``, and the families left out of the page."""
        failed = self._degraded() if self._degraded is not None else ()
        if not failed:
            return b"ready\n"
        shown = ", ".join(failed[:MAX_NAMED_FAILURES]) + (", ..." if len(failed) > MAX_NAMED_FAILURES else "")
        return f"ready, but {len(failed)} families failed to render and are left out of /metrics: {shown}\n".encode()

    async def _authenticate(self, header: str | None, peer: str) -> Response | None:
        """None if ``header`` holds valid credentials, else the refusal (401, or 429 when the
        login lanes are full)."""
        assert self._auth is not None and self._logins is not None
        ok = self._auth.check_cached(header)
        if ok is None:
            verdict = self._logins.check(peer, header or "")
            if verdict is None:
                return _text(429, b"too many login attempts waiting\n", headers=(("Retry-After", "1"),), close=True)
            ok = await verdict
        if ok:
            return None
        return _text(401, b"unauthorized\n", headers=(("WWW-Authenticate", 'Basic realm="gpulens"'),))

    def _metrics(self, accept: str, accept_encoding: str) -> Response:
        body, ctype = self._exposition(accept)
        gzip = accepts_gzip(accept_encoding)
        if gzip:
            body = (gzip_parts((body,) if isinstance(body, bytes) else body),)
        return _page((body, ctype), gzip)


def _page(page: tuple[Body, str], gzipped: bool) -> Response:
    """The reply carrying a metrics page (``gzipped``: its body is a gzip stream)."""
    body, ctype = page
    parts: tuple[bytes | memoryview, ...] = (body,) if isinstance(body, bytes) else tuple(body)
    extra = (("Vary", "Accept-Encoding"), *((("Content-Encoding", "gzip"),) if gzipped else ()))
    return Response(200, parts, ctype, extra)
