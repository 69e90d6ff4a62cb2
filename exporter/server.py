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
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import h11
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from exporter.negotiate import accepts_gzip, exposition_accept
from exporter.webconfig import BasicAuth, TlsContextSource, WebConfig

log = logging.getLogger(__name__)

LANDING = b"""<html><head><title>gpulens exporter</title></head><body>
<h1>gpulens exporter</h1><p><a href="/metrics">Metrics</a> &middot;
<a href="/healthz">healthz</a> &middot; <a href="/readyz">readyz</a></p></body></html>
"""

RENDER_WORKERS = 2
"""Threads that build /metrics bodies (encoding, gzip); more requests wait for a free one."""
LISTEN_BACKLOG = 1024
"""Kernel accept queue (capped by net.core.somaxconn), and connections accepted per wake-up: a
burst of reconnecting clients must not overflow it, or a scraper's SYN is dropped and retried
only a second later."""
FD_RESERVE = 64
"""File descriptors kept free of connections for the rest of the process."""
BCRYPT_NICE = 10
"""Nice increment of the bcrypt thread."""
READ_CHUNK = 4096
"""Bytes read from a socket at a time."""


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


class _Conn:
    """One open connection (``key`` orders them by arrival)."""

    __slots__ = ("key", "writer")

    def __init__(self, key: int, writer: asyncio.StreamWriter) -> None:
        self.key = key
        self.writer = writer


class _HeadTooLarge(Exception):
    pass


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
        self._sock = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)
        self._sock.setblocking(False)
        self._render_pool = ThreadPoolExecutor(RENDER_WORKERS, thread_name_prefix="gpulens-render")
        self._auth_pool = ThreadPoolExecutor(1, thread_name_prefix="gpulens-bcrypt", initializer=_lower_priority)
        self._loop = asyncio.new_event_loop()
        self._conns: dict[int, _Conn] = {}
        self._waiting: OrderedDict[int, _Conn] = OrderedDict()
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
            asyncio.start_server(self._connection, sock=self._sock, backlog=LISTEN_BACKLOG)
        )
        self._started.set()
        self._loop.run_forever()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns.values()):
            conn.writer.transport.abort()
        self._conns.clear()
        self._waiting.clear()

    def _admit(self, conn: _Conn) -> bool:
        if len(self._conns) >= self.limits.max_connections:
            if not self._waiting:
                self.refused += 1
                return False
            _key, victim = self._waiting.popitem(last=False)
            self._conns.pop(victim.key, None)
            victim.writer.transport.abort()
            self.evicted += 1
        self._conns[conn.key] = conn
        return True

    def _set_waiting(self, conn: _Conn, waiting: bool) -> None:
        if waiting:
            self._waiting[conn.key] = conn
            self._waiting.move_to_end(conn.key)
        else:
            self._waiting.pop(conn.key, None)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._next_key += 1
        conn = _Conn(self._next_key, writer)
        if not self._admit(conn):
            writer.transport.abort()
            return
        try:
            await self._serve(conn, reader, writer)
        except (OSError, EOFError, TimeoutError, h11.ProtocolError) as exc:
            log.debug("connection ended: %s", exc)
        except Exception:
            log.exception("connection failed")
        finally:
            self._conns.pop(conn.key, None)
            self._waiting.pop(conn.key, None)
            writer.transport.abort()

    async def _serve(self, conn: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        limits = self.limits
        deadline = loop.time() + limits.request_deadline
        self._set_waiting(conn, True)
        if self._tls is not None:
            async with asyncio.timeout_at(deadline):
                await writer.start_tls(self._tls.context())
        h = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        first = True
        while True:
            self._set_waiting(conn, True)
            try:
                request = await self._read_head(h, reader, deadline if first else None)
            except _HeadTooLarge:
                await self._write(writer, _raw_error(431, "Request Header Fields Too Large"))
                return
            except h11.RemoteProtocolError as exc:
                if exc.error_status_hint == 431:
                    await self._write(writer, _raw_error(431, "Request Header Fields Too Large"))
                elif h.their_state is not h11.CLOSED:
                    await self._write(writer, _raw_error(400, "Bad Request"))
                return
            if request is None:
                return
            self._set_waiting(conn, False)
            first = False
            response = await self._respond(request)
            method = request.method.decode("ascii", "replace")
            headers = [
                ("Content-Type", response.ctype),
                ("Content-Length", str(len(response.body))),
                *self._headers,
                *response.headers,
            ]
            # A request body is never read: close instead, so it cannot be parsed as a request.
            closing = h.their_state is not h11.DONE or h.our_state is h11.MUST_CLOSE
            if closing:
                headers.append(("Connection", "close"))
            out = h.send(h11.Response(status_code=response.status, headers=headers)) or b""
            if method != "HEAD" and response.body:
                out += h.send(h11.Data(data=response.body)) or b""
            out += h.send(h11.EndOfMessage()) or b""
            await self._write(writer, out)
            if closing or h.our_state is not h11.DONE or h.their_state is not h11.DONE:
                return
            h.start_next_cycle()

    async def _read_head(self, h: h11.Connection, reader: asyncio.StreamReader, deadline: float | None) -> Any:
        """The next ``h11.Request``, or None at a clean end of the connection.  ``deadline``
        (loop time) bounds the whole head; None (keep-alive) allows ``keepalive_idle`` for the
        first byte and ``request_deadline`` from there."""
        loop = asyncio.get_running_loop()
        limits = self.limits
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                if deadline is None:
                    async with asyncio.timeout(limits.keepalive_idle):
                        data = await reader.read(READ_CHUNK)
                    deadline = loop.time() + limits.request_deadline
                else:
                    async with asyncio.timeout_at(deadline):
                        data = await reader.read(READ_CHUNK)
                h.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                if len(event.headers) > limits.max_headers:
                    raise _HeadTooLarge
                return event
            return None  # ConnectionClosed, or PAUSED after the peer closed

    async def _write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        async with asyncio.timeout(self.limits.write_deadline):
            await writer.drain()

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
