"""HTTP(S) endpoints: ``/metrics`` (exposition), ``/healthz`` (alive), ``/readyz`` (ready).

One asyncio event loop serves every connection; h11 parses HTTP/1.1.  What any client, however
slow or hostile, can cost is bounded (docs/security.md, "HTTP front"):

- connections: at most ``Limits.max_connections`` open at once.  A new connection over the cap
  closes the oldest one that is still waiting for its request (an idle keep-alive, a slow
  sender, a stalled TLS handshake); when every open connection is busy, the new one is closed.
- time: the TLS handshake, request line and headers must all arrive within
  ``Limits.request_deadline`` of the connection (or, on a kept-alive connection, of the first byte
  of the next request) - one deadline for the whole head, not per read.  A response must be
  taken by the client within ``Limits.write_deadline``.
- bytes: the request head may hold ``Limits.max_header_bytes`` and ``Limits.max_headers``
  fields (431 beyond).  A request body is never read: the reply closes the connection, so the
  body can never be parsed as a next request.
- threads: the loop thread, ``RENDER_WORKERS`` threads that build /metrics bodies, and one thread
  that runs bcrypt (uncached credential checks queue there, one at a time).

Only GET and HEAD are served.  TLS, mTLS and basic auth come from ``--web.config.file``
(exporter/webconfig.py); the TLS context is looked up per connection, so rotated certificates
take effect without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import os
import socket
import ssl
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import h11
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from exporter.negotiate import accepts_gzip, exposition_accept
from exporter.tcp import as_tcp
from exporter.webconfig import BasicAuth, TlsContextSource, WebConfig

log = logging.getLogger(__name__)

LANDING = b"""<html><head><title>gpulens exporter</title></head><body>
<h1>gpulens exporter</h1><p><a href="/metrics">Metrics</a> &middot;
<a href="/healthz">healthz</a> &middot; <a href="/readyz">readyz</a></p></body></html>
"""

RENDER_WORKERS = 2
"""Threads that build /metrics bodies (encoding, gzip); more requests wait for a free one."""
LISTEN_BACKLOG = 1024
"""Kernel accept queue (capped by net.core.somaxconn): a burst of reconnecting clients must not
overflow it, or a scraper's SYN is dropped and retried only a second later."""
ACCEPT_BATCH = 32
"""Connections accepted per event-loop wake-up."""
FD_RESERVE = 64
"""File descriptors kept free of connections for the rest of the process."""
BCRYPT_NICE = 10
"""Nice increment of the bcrypt thread."""
READ_CHUNK = 4096
"""Bytes read from a socket at a time.  A connection buffers at most one request head plus one
chunk: reading pauses while a request is answered."""


@dataclass(frozen=True)
class Limits:
    """The HTTP front's budget (counts, bytes and seconds); see the module docstring."""

    max_connections: int = 512
    max_header_bytes: int = 16 * 1024
    max_headers: int = 100
    request_deadline: float = 10.0
    keepalive_idle: float = 30.0
    write_deadline: float = 30.0


Exposition = Callable[[str], tuple[bytes, str]]
"""``render(accept_header) -> (body, content_type)``: the metrics page."""


UNAUTHENTICATED_PATHS = ("/healthz", "/readyz")
"""Liveness/readiness reveal nothing and kubelet probes cannot send credentials."""

_TEXT = "text/plain; charset=utf-8"


@dataclass
class _Response:
    status: int
    body: bytes
    ctype: str = _TEXT
    headers: tuple[tuple[str, str], ...] = ()


def _lower_priority() -> None:
    """Run the calling thread at a lower CPU priority (Linux: per-thread nice), so a flood of
    wrong passwords competes for a core with itself rather than with scrapes."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BCRYPT_NICE)


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
    def render(accept: str) -> tuple[bytes, str]:
        encoder, ctype = choose_encoder(exposition_accept(accept))
        return encoder(registry), ctype

    return render


def _raw_error(status: int, reason: str) -> bytes:
    body = f"{reason.lower()}\n".encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {_TEXT}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


def parse_listen_address(value: str) -> tuple[str, int]:
    """``host:port`` / ``:port`` / ``[::1]:port`` -> (host, port); ValueError names what is wrong."""
    host, sep, port_s = value.rpartition(":")
    if not sep:
        raise ValueError(f"expected HOST:PORT or :PORT, got {value!r}")
    host = host.strip("[]") or "0.0.0.0"
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"port {port_s!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} is out of range 0..65535")
    return host, port


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
    ) -> None:
        host, port = parse_listen_address(address)
        self._exposition = _plain(exposition) if isinstance(exposition, CollectorRegistry) else exposition
        self._ready = ready
        self.limits = _fit_to_fd_limit(limits or Limits())
        self._headers: tuple[tuple[str, str], ...] = ()
        self._auth: BasicAuth | None = None
        self._tls: TlsContextSource | None = None
        if web_config is not None:
            self._headers = tuple(web_config.headers.items())
            if web_config.basic_auth_users:
                self._auth = BasicAuth(web_config.basic_auth_users)
            if web_config.tls is not None:
                self._tls = TlsContextSource(web_config.tls, web_config.path)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # as_tcp: asyncio then sets TCP_NODELAY on each connection (a small reply is not held 40 ms)
        self._sock = as_tcp(socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG))
        self._sock.setblocking(False)
        self._read_buffer = memoryview(bytearray(READ_CHUNK))
        self._render_pool = ThreadPoolExecutor(RENDER_WORKERS, thread_name_prefix="gpulens-render")
        self._auth_pool = ThreadPoolExecutor(1, thread_name_prefix="gpulens-bcrypt", initializer=_lower_priority)
        self._loop = asyncio.new_event_loop()
        self._conns: dict[int, _Connection] = {}
        self._waiting: OrderedDict[int, _Connection] = OrderedDict()
        self._next_key = 0
        self._server: asyncio.AbstractServer | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run_loop, name="gpulens-http", daemon=True)
        self.evicted = 0
        """Connections closed to make room for a new one (for tests and the bench)."""
        self.refused = 0
        """New connections closed because every open one was busy."""

    @property
    def port(self) -> int:
        """The bound port (useful with ``:0``)."""
        return int(self._sock.getsockname()[1])

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
            fut = asyncio.run_coroutine_threadsafe(self._close(), self._loop)
            with contextlib.suppress(Exception):
                fut.result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        if not self._loop.is_running():
            self._loop.close()
        self._sock.close()
        self._render_pool.shutdown(wait=False, cancel_futures=True)
        self._auth_pool.shutdown(wait=False, cancel_futures=True)

    # --- loop ---------------------------------------------------------------------------
    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            self._loop.create_server(lambda: _Connection(self), sock=self._sock, backlog=ACCEPT_BATCH)
        )
        # asyncio uses one number for the kernel's queue and for accepts per wake-up: set the
        # queue long again, so a burst waits in the kernel while the loop keeps serving between
        # batches.
        self._sock.listen(LISTEN_BACKLOG)
        self._started.set()
        self._loop.run_forever()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns.values()):
            conn.close()
        self._conns.clear()
        self._waiting.clear()

    def _admit(self, conn: _Connection) -> bool:
        if len(self._conns) >= self.limits.max_connections:
            if not self._waiting:
                self.refused += 1
                return False
            _key, victim = self._waiting.popitem(last=False)
            victim.close()
            self.evicted += 1
        self._next_key += 1
        conn.key = self._next_key
        self._conns[conn.key] = conn
        return True

    def _forget(self, conn: _Connection) -> None:
        self._conns.pop(conn.key, None)
        self._waiting.pop(conn.key, None)

    def _set_waiting(self, conn: _Connection, waiting: bool) -> None:
        if waiting:
            self._waiting[conn.key] = conn
            self._waiting.move_to_end(conn.key)
        else:
            self._waiting.pop(conn.key, None)

    # --- requests -----------------------------------------------------------------------
    async def _respond(self, request: Any) -> _Response:
        method = request.method.decode("ascii", "replace")
        if method not in ("GET", "HEAD"):
            return _Response(405, b"method not allowed\n", headers=(("Allow", "GET, HEAD"),))
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.headers}
        path = urlsplit(request.target.decode("latin-1")).path
        if self._auth is not None and path not in UNAUTHENTICATED_PATHS:
            header = headers.get("authorization")
            ok = self._auth.check_cached(header)
            if ok is None:
                loop = asyncio.get_running_loop()
                ok = await loop.run_in_executor(self._auth_pool, self._auth.check, header)
            if not ok:
                return _Response(401, b"unauthorized\n", headers=(("WWW-Authenticate", 'Basic realm="gpulens"'),))
        if path == "/metrics":
            loop = asyncio.get_running_loop()
            accept, encoding = headers.get("accept", ""), headers.get("accept-encoding", "")
            return await loop.run_in_executor(self._render_pool, self._metrics, accept, encoding)
        if path == "/healthz":
            return _Response(200, b"ok\n")
        if path == "/readyz":
            if self._ready():
                return _Response(200, b"ready\n")
            return _Response(503, b"not ready: no snapshot yet, or the sampler stopped\n")
        if path == "/":
            return _Response(200, LANDING, "text/html; charset=utf-8")
        return _Response(404, b"not found\n")

    def _metrics(self, accept: str, accept_encoding: str) -> _Response:
        body, ctype = self._exposition(accept)
        extra: list[tuple[str, str]] = [("Vary", "Accept-Encoding")]
        if accepts_gzip(accept_encoding):
            body = gzip.compress(body, compresslevel=1)
            extra.append(("Content-Encoding", "gzip"))
        return _Response(200, body, ctype, tuple(extra))


class _Connection(asyncio.BufferedProtocol):
    """One client connection: bytes go to h11; one request is answered at a time.

    No task or thread exists for a connection that has not sent a complete request head: a timer
    (``call_later``) enforces the deadline, and the bytes wait in h11's capped buffer.
    """

    def __init__(self, server: MetricsServer) -> None:
        self.server = server
        self.key = 0
        self.transport: asyncio.Transport | None = None
        self.h = h11.Connection(h11.SERVER, max_incomplete_event_size=server.limits.max_header_bytes)
        self.timer: asyncio.TimerHandle | None = None
        self.write_timer: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = None
        self.idle = False  # kept alive between requests: the head deadline starts at the first byte
        self.busy = False  # a request is being answered (or the connection is being closed)
        self.tls_pending = False
        self.closed = False
        self.write_paused = False  # the transport's buffer is above its high-water mark
        self.drained: asyncio.Future[None] | None = None

    # --- asyncio.Protocol ---
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        server = self.server
        if not server._admit(self):
            self.closed = True
            transport.abort()
            return
        server._set_waiting(self, True)
        self._arm(server.limits.request_deadline)
        if server._tls is not None:
            self.tls_pending = True
            self.task = server._loop.create_task(self._start_tls(server._tls.context()))

    def get_buffer(self, sizehint: int) -> memoryview:
        # One small buffer shared by every connection (the loop consumes it before the next
        # read): a read never takes more than READ_CHUNK bytes off a socket.
        return self.server._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        if self.closed:
            return
        self.h.receive_data(bytes(self.server._read_buffer[:nbytes]))
        if self.idle:
            self.idle = False
            self._arm(self.server.limits.request_deadline)
        if not self.busy and not self.tls_pending:
            self._process()

    def eof_received(self) -> bool:
        if self.closed:
            return False
        self.h.receive_data(b"")
        if not self.busy and not self.tls_pending:
            self._process()
        # Keep the write side open only while a reply is on its way (TLS cannot half-close).
        return self.busy and self.server._tls is None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for timer in (self.timer, self.write_timer):
            if timer is not None:
                timer.cancel()
        self.server._forget(self)
        self.resume_writing()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    # --- helpers ---
    def close(self) -> None:
        """Drop the connection now (deadline, eviction, shutdown)."""
        if not self.closed:
            self.closed = True
            self.server._forget(self)
            if self.transport is not None:
                self.transport.abort()

    def _arm(self, seconds: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.server._loop.call_later(seconds, self.close)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _write(self, *chunks: bytes) -> None:
        """Send; if the client has not taken it all within the write deadline, drop it."""
        if self.closed or self.transport is None:
            return
        for chunk in chunks:
            if chunk:
                self.transport.write(chunk)
        if self.transport.get_write_buffer_size() and self.write_timer is None:
            self.write_timer = self.server._loop.call_later(self.server.limits.write_deadline, self._write_expired)

    def _write_expired(self) -> None:
        self.write_timer = None
        if self.transport is not None and self.transport.get_write_buffer_size():
            self.close()

    def _finish(self, *chunks: bytes) -> None:
        """Send a last reply and close once it is flushed."""
        self.busy = True
        self._disarm()
        self.server._set_waiting(self, False)
        self._write(*chunks)
        if not self.closed and self.transport is not None:
            self.transport.close()

    async def _start_tls(self, context: ssl.SSLContext) -> None:
        loop = self.server._loop
        assert self.transport is not None
        try:
            tls_transport = await loop.start_tls(
                self.transport,
                self,
                context,
                server_side=True,
                ssl_handshake_timeout=self.server.limits.request_deadline,
            )
        except Exception as exc:  # OSError, SSLError, TimeoutError, or the transport closed under it
            log.debug("TLS handshake failed: %s", exc)
            self.close()
            return
        if self.closed or tls_transport is None:
            if tls_transport is not None:
                tls_transport.abort()
            return
        self.transport = tls_transport
        self.tls_pending = False
        if not self.busy:
            self._process()

    def _process(self) -> None:
        buffered = len(self.h.trailing_data[0])
        try:
            event = self.h.next_event()
        except h11.RemoteProtocolError as exc:
            if exc.error_status_hint == 431:
                self._finish(_raw_error(431, "Request Header Fields Too Large"))
            else:
                self._finish(_raw_error(400, "Bad Request"))
            return
        if event is h11.NEED_DATA:
            return
        if isinstance(event, h11.Request):
            # h11 caps a head that is still incomplete; one that arrived whole is measured here
            head_bytes = buffered - len(self.h.trailing_data[0])
            limits = self.server.limits
            if head_bytes > limits.max_header_bytes or len(event.headers) > limits.max_headers:
                self._finish(_raw_error(431, "Request Header Fields Too Large"))
                return
            self.busy = True
            self._disarm()
            self.server._set_waiting(self, False)
            # A request without a body ends here (EndOfMessage); anything else is a body we will
            # not read, and the reply then closes the connection (their_state is not DONE).
            with contextlib.suppress(h11.RemoteProtocolError):
                self.h.next_event()
            assert self.transport is not None
            self.transport.pause_reading()
            self.task = self.server._loop.create_task(self._answer(event))
            return
        self.close()  # ConnectionClosed, or data after the peer's end of stream

    async def _answer(self, request: Any) -> None:
        try:
            response = await self.server._respond(request)
        except Exception:
            log.exception("request failed")
            self._finish(_raw_error(500, "Internal Server Error"))
            return
        if self.closed:
            return
        h = self.h
        headers = [
            ("Content-Type", response.ctype),
            ("Content-Length", str(len(response.body))),
            *self.server._headers,
            *response.headers,
        ]
        # A request body is never read: close instead, so it cannot be parsed as a request.
        closing = h.their_state is not h11.DONE or h.our_state is h11.MUST_CLOSE
        if closing:
            headers.append(("Connection", "close"))
        reason = HTTPStatus(response.status).phrase.encode()
        out = [h.send(h11.Response(status_code=response.status, headers=headers, reason=reason)) or b""]
        if request.method != b"HEAD" and response.body:  # passthrough: the body is not copied
            out += h.send_with_data_passthrough(h11.Data(data=response.body)) or []
        out.append(h.send(h11.EndOfMessage()) or b"")
        if closing or h.our_state is not h11.DONE or h.their_state is not h11.DONE:
            self._finish(*out)
            return
        self._write(*out)
        if self.write_paused:  # the client is not reading: read no next request until it does
            self.drained = self.server._loop.create_future()
            await self.drained
            if self.closed:
                return
        h.start_next_cycle()
        self.busy = False
        self.idle = not h.trailing_data[0]  # bytes of the next request may already be here
        self.server._set_waiting(self, True)
        limits = self.server.limits
        self._arm(limits.keepalive_idle if self.idle else limits.request_deadline)
        assert self.transport is not None
        self.transport.resume_reading()
        self._process()  # a pipelined request may already be buffered
