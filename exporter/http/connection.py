"""One HTTP/1.1 client connection of the exporter's front (exporter/http/server.py): bytes in, h11 events,
one request answered at a time, replies written in slices, TLS through exporter/http/tls_session.py.

What one connection can hold, whatever its client does (docs/security.md, "HTTP front"):

- received bytes: one ``READ_CHUNK`` read plus h11's buffer, capped at the head limit; reading
  pauses while a request is answered or a TLS handshake step runs;
- unsent bytes: one ``WRITE_SLICE`` in asyncio's buffer (the next slice is written only once the
  kernel took the last one) plus the kernel's send buffer, fixed at ``SEND_BUFFER_BYTES``; the
  page itself is shared between replies (exporter/render/collector.py, ``render_parts``);
- pipelined requests: ``MAX_PIPELINED`` answered back to back; the reply to the last carries
  ``Connection: close``;
- time: the head deadline, the keep-alive idle limit and the write deadline (``Limits``).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import logging
import socket
import ssl
import struct
import termios
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any, Protocol

import h11

from exporter.http.admission import ConnectionBudget
from exporter.http.limits import Limits
from exporter.http.response import TEXT, Response
from exporter.http.tls_session import NOT_TLS_REPLY, TlsSession, starts_tls

log = logging.getLogger(__name__)

READ_CHUNK = 4096
"""Bytes read from a socket at a time."""
WRITE_SLICE = 32 * 1024
"""Bytes of a reply handed to the transport at a time."""
SEND_BUFFER_BYTES = 32 * 1024
"""SO_SNDBUF asked for each connection; Linux doubles it for its bookkeeping, so a client that
stops reading leaves at most 64 KiB in kernel memory (which a cgroup v2 memory limit counts).
At 64 KiB a 0.5 ms round trip still carries 128 MB/s; a gzipped page is tens of KiB."""
RECV_BUFFER_BYTES = 16 * 1024
"""SO_RCVBUF of each connection (doubled by Linux): a request head is at most 16 KiB and a body
is never read, so a client pushing bytes the server does not read leaves at most 32 KiB in
kernel memory."""
_LINGER_RESET = struct.pack("ii", 1, 0)
"""SO_LINGER on with a 0 s timeout: close() resets the connection and drops its unsent bytes
instead of leaving them queued in the kernel behind a client that never reads."""
MAX_PIPELINED = 4
"""Requests answered from bytes that arrived before the previous reply was sent (HTTP
pipelining; no scraper does it) before the connection is closed."""

TIER_STALLED = 0
"""Eviction tier of a client that is not taking its reply (evicted first)."""
TIER_SUSPECT = 1
"""Eviction tier: no request completed yet, a head in progress, or a TLS handshake."""
TIER_IDLE_NEW, TIER_IDLE, TIER_IDLE_TRUSTED = 2, 3, 4
"""Eviction tiers of kept-alive connections between requests, by replies delivered: 1, 2-15, 16+
(a scraper's long-lived connection is the last to go)."""
TRUSTED_AFTER = 16


def raw_error(status: int, reason: str) -> bytes:
    """A complete ``Connection: close`` reply for a request h11 could not take."""
    body = f"{reason.lower()}\n".encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {TEXT}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


def kernel_unsent(sock: socket.socket | None) -> int:
    """Bytes the kernel still holds for the peer (sent but not acknowledged, or not yet sent):
    Linux's SIOCOUTQ; 0 where unknown."""
    if sock is None:
        return 0
    out = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, out, True)
    except (OSError, ValueError):
        return 0
    return int(out[0])


def _idle_tier(replies: int) -> int:
    if replies >= TRUSTED_AFTER:
        return TIER_IDLE_TRUSTED
    return TIER_IDLE if replies >= 2 else TIER_IDLE_NEW


class Front(Protocol):
    """What a connection asks of the server that accepted it (``exporter.http.server.MetricsServer``).

    The server owns every connection and decides for all of them: who is admitted, which one is
    evicted when the front is full, which replies are stalled, how TLS handshakes are scheduled.
    A connection only reports what happened to it through these calls, so this module does not
    depend on the server's."""

    limits: Limits
    budget: ConnectionBudget
    """Misbehaving endings per client address: a connection that ends badly charges its peer."""
    loop: asyncio.AbstractEventLoop
    read_buffer: memoryview
    """The one buffer every connection reads into (its bytes are consumed before the next read)."""
    extra_headers: tuple[tuple[str, str], ...]
    """Headers every reply carries (``http_server_config.headers`` of the web config)."""
    serves_tls: bool
    """Connections speak TLS (``tls_context`` then gives the context for a new session)."""

    def admit(self, conn: Connection) -> bool:
        """Whether a new connection may stay (its address' budget, the connection cap)."""
        ...

    def place(self, conn: Connection, tier: int | None) -> None:
        """Move a connection to an eviction tier (``None``: not evictable, a reply in progress)."""
        ...

    def wrote(self, conn: Connection) -> None:
        """A slice of a reply was handed to the transport: watch that the client takes it."""
        ...

    def paused(self, conn: Connection, paused: bool) -> None:
        """The transport's write buffer filled (``True``) or drained (``False``)."""
        ...

    def forget(self, conn: Connection) -> None:
        """The connection is closed: drop it from every table."""
        ...

    def tls_context(self) -> ssl.SSLContext | None:
        """The TLS context for a new connection (looked up per connection), or None for plain HTTP."""
        ...

    def handshake(self, session: TlsSession, peer: str) -> asyncio.Future[bool] | None:
        """Run one TLS handshake step of ``peer``'s connection off the loop; None when too many
        are already waiting (in all, or of ``peer``'s address)."""
        ...

    async def respond(self, request: Any, peer: str) -> Response:
        """The reply to a complete request head (``h11.Request``) from ``peer``."""
        ...


class Connection(asyncio.BufferedProtocol):
    """One client connection.  No task or thread exists for a connection that has not sent a
    complete request head: a timer enforces the deadline, and the bytes wait in h11's capped
    buffer."""

    def __init__(self, server: Front) -> None:
        self.server = server
        self.key = 0
        self.tier: int | None = None
        self.home: int | None = None  # the tier it belongs in when not stalled
        self.sock: socket.socket | None = None
        self.closing = False  # the last reply is out: close once the client has taken it
        self.lagging = False  # the stall sweep found the kernel still holding its bytes
        self.peer = ""
        self.transport: asyncio.Transport | None = None
        self.h = h11.Connection(h11.SERVER, max_incomplete_event_size=server.limits.max_header_bytes)
        self.tls_port = False  # served over TLS: the session starts at the client's first byte
        self.tls: TlsSession | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.write_timer: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = None
        self.idle = False  # kept alive between requests: the head deadline starts at the first byte
        self.busy = False  # a request is being answered (or the connection is being closed)
        self.closed = False
        self.write_paused = False  # the kernel has not taken the last slice yet
        self.drained: asyncio.Future[None] | None = None
        self.replies = 0
        self.pipelined = 0
        self.vouching = False  # the last reply, once taken whole, makes the client known-good

    # --- asyncio.Protocol ---
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        server = self.server
        sock = transport.get_extra_info("socket")
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not server.admit(self):
            self.closed = True
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
            transport.abort()
            return
        if sock is not None:
            self.sock = sock
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECV_BUFFER_BYTES)
        transport.set_write_buffer_limits(high=0)  # pause_writing as soon as the kernel refuses bytes
        server.place(self, TIER_SUSPECT)
        self._arm(server.limits.request_deadline)
        # The SSL object (and what OpenSSL allocates for it) waits for the client's first byte:
        # a client that sends nothing, or plaintext, never costs one (_start_tls).
        self.tls_port = server.serves_tls

    def get_buffer(self, sizehint: int) -> memoryview:
        # One small buffer shared by every connection (the loop consumes it before the next
        # read): a read never takes more than READ_CHUNK bytes off a socket.
        return self.server.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        if self.closed or self.closing:  # nothing more is read once the last reply is out
            return
        data = bytes(self.server.read_buffer[:nbytes])
        if self.tls_port and self.tls is None and not self._start_tls(data[0]):
            return
        if self.tls is not None:
            if self.tls.stepping:  # reading is paused during a step; never feed a busy session
                self.close()
                return
            self.tls.feed(data)
            if not self.tls.established:
                self._handshake()
                return
            try:
                data = self.tls.decrypt()
            except (ssl.SSLError, OSError):
                self.close()
                return
            self._flush_tls()
            if self.tls.peer_closed:
                self.h.receive_data(data)
                self.h.receive_data(b"")
            elif not data:
                return
            else:
                self.h.receive_data(data)
        else:
            self.h.receive_data(data)
        if self.idle:
            self.idle = False
            self.server.place(self, TIER_SUSPECT)
            self._arm(self.server.limits.request_deadline)
        if not self.busy:
            self._process()

    def eof_received(self) -> bool:
        if self.closed:
            return False
        if self.tls_port and self.tls is None:  # closed before its first byte: nothing to answer
            self.close(charge=False)
            return False
        if self.tls is None or self.tls.established:
            self.h.receive_data(b"")
            if not self.busy:
                self._process()
        # Keep the write side open only while a reply is on its way (TLS cannot half-close).
        return self.busy and self.tls is None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for timer in (self.timer, self.write_timer):
            if timer is not None:
                timer.cancel()
        self.server.forget(self)
        self.resume_writing()

    def pause_writing(self) -> None:
        self.write_paused = True
        if not self.closed:
            self.server.paused(self, True)

    def resume_writing(self) -> None:
        self.write_paused = False
        if not self.closed:
            self.server.paused(self, False)
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def unsent(self) -> int:
        """Bytes of replies the client has not taken yet: asyncio's buffer plus the kernel's."""
        if self.closed or self.transport is None:
            return 0
        return self.transport.get_write_buffer_size() + kernel_unsent(self.sock)

    # --- helpers ---
    def close(self, charge: bool = True) -> None:
        """Drop the connection now (deadline, eviction, stall, shutdown), and with it whatever the
        kernel still holds for the client; ``charge``: the client misbehaved (its address'
        budget pays; not at shutdown)."""
        if not self.closed:
            if charge:
                self.server.budget.charge(self.peer)
            self.closed = True
            self.server.forget(self)
            if self.sock is not None:
                with contextlib.suppress(OSError):
                    self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
            if self.transport is not None:
                self.transport.abort()
            self.resume_writing()

    def _arm(self, seconds: float, charge: bool = True) -> None:
        """Close the connection in ``seconds`` (the head deadline: charged; the keep-alive idle
        limit: ``charge`` False, an idle scraper is no misbehaviour)."""
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.server.loop.call_later(seconds, self.close, charge)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _put(self, chunk: bytes | memoryview) -> None:
        """Hand bytes to the transport (encrypted first under TLS); start the write deadline."""
        if self.closed or self.transport is None or not chunk:
            return
        if self.tls is not None:
            try:
                chunk = self.tls.encrypt(chunk)
            except (ssl.SSLError, OSError):
                self.close()
                return
        self.transport.write(chunk)
        self.server.wrote(self)
        if self.write_timer is None and self.transport.get_write_buffer_size():
            self.write_timer = self.server.loop.call_later(self.server.limits.write_deadline, self._write_expired)

    def _write_expired(self) -> None:
        self.write_timer = None
        if self.transport is not None and self.transport.get_write_buffer_size():
            self.close()

    def _flush_tls(self) -> None:
        if self.tls is not None and self.transport is not None and not self.closed:
            out = self.tls.pending_output()
            if out:
                self.transport.write(out)

    def finish(self, *chunks: bytes, charge: bool = True) -> None:
        """Send a last short error reply and close once it is flushed; ``charge``: the request
        was malformed (its address' budget pays)."""
        if charge:
            self.server.budget.charge(self.peer)
        self.busy = True
        self._disarm()
        self.server.place(self, None)
        for chunk in chunks:
            self._put(chunk)
        self._close_after_flush()

    def _close_after_flush(self) -> None:
        """End the connection after the last reply: send our end of stream once asyncio's buffer
        is flushed, and close the socket once the client has taken everything (the server's stall
        sweep sees it), so unread bytes never linger in the kernel after we let go of the socket.
        The write deadline, eviction and the stall cap still apply meanwhile."""
        if self.closed or self.transport is None:
            return
        if self.tls is not None:
            notify = self.tls.close_notify()
            if notify:
                self.transport.write(notify)
        self.closing = True
        self.transport.pause_reading()  # a client still pushing bytes is not read any more
        if self.transport.can_write_eof():
            self.transport.write_eof()
        if self.write_timer is not None:
            self.write_timer.cancel()
        self.write_timer = self.server.loop.call_later(self.server.limits.write_deadline, self.close)
        self.server.wrote(self)

    def drained_out(self) -> None:
        """The client has taken every byte (called by the server's stall sweep)."""
        if self.closing and not self.closed and self.transport is not None:
            if self.vouching:
                self.server.budget.known.served_well(self.peer)
            self.closed = True
            self.server.forget(self)
            if self.write_timer is not None:
                self.write_timer.cancel()
            self.transport.close()

    # --- TLS handshake, off the loop ---
    def _start_tls(self, first_byte: int) -> bool:
        """Start the TLS session at the client's first byte; False if the connection ends here.

        A first byte that is no TLS handshake record (a plain-HTTP request on the TLS port) is
        answered with a 400 in plain text and charged to the client's address at once, on the
        loop: no SSL object, no OpenSSL buffers, no handshake step on the TLS thread.  Charged
        there instead, after a step failed, a client reconnecting at once kept hundreds of SSL
        objects a second in flight before its budget ran dry (RSS +23-30 MB), and filled the
        handshake queue, so a scraper's handshake was shed."""
        if not starts_tls(first_byte):
            self.finish(NOT_TLS_REPLY)
            return False
        context = self.server.tls_context()
        try:
            if context is None:  # serves_tls: never; refuse rather than answer in plain text
                raise ssl.SSLError("no TLS context")
            self.tls = TlsSession(context)
        except (ssl.SSLError, OSError) as exc:
            log.warning("cannot start a TLS session: %s", exc)
            self.close(charge=False)
            return False
        return True

    def _handshake(self) -> None:
        tls = self.tls
        assert tls is not None and self.transport is not None
        if tls.stepping:
            return
        future = self.server.handshake(tls, self.peer)
        if future is None:  # too many handshakes waiting: shed this one
            self.close(charge=False)
            return
        tls.stepping = True
        self.transport.pause_reading()
        future.add_done_callback(self._stepped)

    def _stepped(self, future: asyncio.Future[bool]) -> None:
        tls = self.tls
        assert tls is not None
        tls.stepping = False
        if self.closed or self.transport is None:
            return
        error = future.exception() if not future.cancelled() else asyncio.CancelledError()
        self._flush_tls()  # handshake messages, or the alert that ends a failed handshake
        if error is not None:
            log.debug("TLS handshake failed: %s", error)
            self.server.budget.charge(self.peer)
            self.busy = True
            self._disarm()
            self.server.place(self, None)
            self._close_after_flush()  # once the alert is sent (the write deadline bounds it)
            return
        self.transport.resume_reading()
        if not future.result():
            return  # the client's next flight is still to come
        try:
            data = tls.decrypt()  # application data may have come with the client's Finished
        except (ssl.SSLError, OSError):
            self.close()
            return
        self._flush_tls()
        if data:
            self.h.receive_data(data)
        if not self.busy:
            self._process()

    # --- requests ---
    def _process(self) -> None:
        buffered = len(self.h.trailing_data[0])
        try:
            event = self.h.next_event()
        except h11.RemoteProtocolError as exc:
            if exc.error_status_hint == 431:
                self.finish(raw_error(431, "Request Header Fields Too Large"))
            else:
                self.finish(raw_error(400, "Bad Request"))
            return
        if event is h11.NEED_DATA:
            return
        if isinstance(event, h11.Request):
            # h11 caps a head that is still incomplete; one that arrived whole is measured here
            head_bytes = buffered - len(self.h.trailing_data[0])
            limits = self.server.limits
            if head_bytes > limits.max_header_bytes or len(event.headers) > limits.max_headers:
                self.finish(raw_error(431, "Request Header Fields Too Large"))
                return
            names = [name for name, _ in event.headers]
            if b"transfer-encoding" in names and b"content-length" in names:
                # Two framings: a proxy in front may read it the other way (request smuggling).
                self.finish(raw_error(400, "Bad Request"))
                return
            self.busy = True
            self._disarm()
            self.server.place(self, None)
            # A request without a body ends here (EndOfMessage); anything else is a body we will
            # not read, and the reply then closes the connection (their_state is not DONE).
            with contextlib.suppress(h11.RemoteProtocolError):
                self.h.next_event()
            assert self.transport is not None
            self.transport.pause_reading()
            self.task = self.server.loop.create_task(self._answer(event))
            return
        # the client closed between requests (free), or sent data after its end of stream
        self.close(charge=not isinstance(event, h11.ConnectionClosed))

    async def _answer(self, request: Any) -> None:
        try:
            response = await self.server.respond(request, self.peer)
        except Exception:
            log.exception("request failed")
            self.finish(raw_error(500, "Internal Server Error"), charge=False)
            return
        if self.closed:
            return
        await self._reply(request, response)

    async def _reply(self, request: Any, response: Response) -> None:
        h = self.h
        length = sum(len(part) for part in response.body)
        headers = [
            ("Content-Type", response.ctype),
            ("Content-Length", str(length)),
            *self.server.extra_headers,
            *response.headers,
        ]
        # A request body is never read: close instead, so it cannot be parsed as a request.
        closing = (
            response.close
            or h.their_state is not h11.DONE
            or h.our_state is h11.MUST_CLOSE
            or self.pipelined >= MAX_PIPELINED
        )
        if closing:
            headers.append(("Connection", "close"))
        if self.pipelined >= MAX_PIPELINED:  # no scraper pipelines: its address' budget pays
            self.server.budget.charge(self.peer)
        reason = HTTPStatus(response.status).phrase.encode()
        head = h.send(h11.Response(status_code=response.status, headers=headers, reason=reason)) or b""
        with_body = request.method != b"HEAD" and length > 0
        if with_body and len(head) + length <= WRITE_SLICE:
            # A reply of one slice goes in one write (one send, one segment): a scrape of a gzipped
            # page, or any page of a small node. The joined copy is at most a slice, as below.
            data = [head]
            for part in response.body:
                data.extend(h.send_with_data_passthrough(h11.Data(data=part)) or ())  # type: ignore[arg-type]
            data.append(h.send(h11.EndOfMessage()) or b"")
            self._put(b"".join(data))
        else:
            self._put(head)
            if with_body and not await self._send_body(response.body):
                return
            self._put(h.send(h11.EndOfMessage()) or b"")
        if closing or h.our_state is not h11.DONE or h.their_state is not h11.DONE:
            self.vouching = response.vouches  # once the client has taken it all (drained_out)
            self._close_after_flush()
            return
        if self.write_paused and not await self._drain():  # read no next request until it is taken
            return
        if response.vouches:
            self.server.budget.known.served_well(self.peer)
        self.replies += 1
        h.start_next_cycle()
        self.busy = False
        self.idle = not h.trailing_data[0]  # bytes of the next request may already be here
        self.pipelined = 0 if self.idle else self.pipelined + 1
        self.server.place(self, _idle_tier(self.replies) if self.idle else TIER_SUSPECT)
        limits = self.server.limits
        self._arm(limits.keepalive_idle if self.idle else limits.request_deadline, charge=not self.idle)
        assert self.transport is not None
        self.transport.resume_reading()
        self._process()  # a pipelined request may already be buffered

    async def _send_body(self, parts: Sequence[bytes | memoryview]) -> bool:
        """Write the body slice by slice, each once the kernel took the last; False if the
        connection closed on the way."""
        for part in parts:
            # h11 only counts the bytes of a Content-Length body: a memoryview passes through uncopied
            for chunk in self.h.send_with_data_passthrough(h11.Data(data=part)) or ():  # type: ignore[arg-type]
                view = memoryview(chunk)
                for offset in range(0, len(view), WRITE_SLICE):
                    if self.closed:
                        return False
                    self._put(view[offset : offset + WRITE_SLICE])
                    if self.write_paused and not await self._drain():
                        return False
        return not self.closed

    async def _drain(self) -> bool:
        """Wait until the transport's buffer is empty; False if the connection closed."""
        while self.write_paused and not self.closed:
            self.drained = self.server.loop.create_future()
            await self.drained
        self.drained = None
        if self.write_timer is not None:
            self.write_timer.cancel()
            self.write_timer = None
        return not self.closed
