"""Unary gRPC calls over a unix socket, on the ``h2`` HTTP/2 state machine.

The exporter makes two unary calls to the kubelet every refresh period (10 s by default).  The
``grpcio`` client costs several times more resident memory per node for that (its C core, the
libcrypto and libstdc++ it maps, protobuf and the generated stubs) than ``h2``, the pure-Python
HTTP/2 implementation of the python-hyper project (the one httpx uses); the MiB of each are in
docs/benchmarks.md, "Exporter memory by flags".
What is left to write is gRPC's thin framing over HTTP/2, which this module holds:

- request: ``POST /<service>/<method>`` with ``content-type: application/grpc``, ``te: trailers``
  and ``grpc-timeout``; the body is one length-prefixed message (1 byte "compressed" = 0, 4 bytes
  big-endian length, the protobuf bytes);
- reply: HTTP status 200, length-prefixed messages in DATA frames, then trailers with
  ``grpc-status`` and a percent-encoded ``grpc-message``; an error may come as headers alone
  ("trailers-only").

Each :class:`UnaryConnection` dials the socket afresh, so a kubelet restart (which recreates the
socket) is seen on the next refresh without a reconnect backoff.  Every wait is bounded by the
call's deadline and a reply by ``max_reply_bytes``: a stuck or hostile peer costs one timeout and
one bounded buffer, never more.  The cap is checked on the message's length prefix, before any of
the message is kept: a reply announced over the cap is refused at once (``RESOURCE_EXHAUSTED``);
one under it is received into a single buffer of exactly that length and handed back as a
``memoryview`` of it, with no further copy.

Frames that carry no part of the reply (SETTINGS and their acknowledgements, PING and PING
acknowledgements, WINDOW_UPDATE, PRIORITY, ALTSVC, PUSH_PROMISE, frames of unknown types,
informational headers, DATA without a byte of body) are rationed per connection (``_ControlBudget``): a
peer that floods them (``h2`` answers each PING and SETTINGS, and every frame costs its parsing)
gets a GOAWAY with ENHANCE_YOUR_CALM and the call fails with :class:`ControlFloodError`, after
at most one read's worth of frames (64 KiB).  CONTINUATION frames are bounded by ``h2`` itself
(64 per header block).
"""

from __future__ import annotations

import enum
import socket
import struct
import time
from types import TracebackType
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

WINDOW_BYTES = 16 * 1024 * 1024
"""Flow-control window offered to the server (stream and connection): a large reply streams
without waiting for a window update every 64 KiB."""


class StatusCode(enum.IntEnum):
    """gRPC status codes (numbers fixed by the gRPC protocol)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


_HTTP_TO_GRPC = {
    400: StatusCode.INTERNAL,
    401: StatusCode.UNAUTHENTICATED,
    403: StatusCode.PERMISSION_DENIED,
    404: StatusCode.UNIMPLEMENTED,
    429: StatusCode.UNAVAILABLE,
    502: StatusCode.UNAVAILABLE,
    503: StatusCode.UNAVAILABLE,
    504: StatusCode.UNAVAILABLE,
}
"""HTTP status of a reply that is not gRPC, mapped as the gRPC protocol specifies."""


class RpcError(Exception):
    """A call that did not return a message: ``code`` says why, ``details`` in words."""

    def __init__(self, code: StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class ControlFloodError(RpcError):
    """The peer sent more frames that carry no part of the reply than a connection allows."""


CONTROL_FRAME_BURST = 64
"""Frames carrying no part of the reply a connection may take at once.  A gRPC server sends a
handful per call: its SETTINGS, the acknowledgement of ours, a WINDOW_UPDATE or two for the
request, perhaps a PING (grpc-go's bandwidth estimator, keepalive); a connection lives one
refresh (two calls)."""
CONTROL_FRAMES_PER_SECOND = 16.0
"""How fast the allowance comes back: a connection lasts at most the refresh's deadline (5 s),
so a whole refresh allows about 144 such frames, 10 times what an honest kubelet sends."""

_CONTROL_EVENTS = (
    h2.events.RemoteSettingsChanged,
    h2.events.SettingsAcknowledged,
    h2.events.PingReceived,
    h2.events.PingAckReceived,
    h2.events.WindowUpdated,
    h2.events.PriorityUpdated,
    h2.events.AlternativeServiceAvailable,
    h2.events.UnknownFrameReceived,
    h2.events.InformationalResponseReceived,
    h2.events.PushedStreamReceived,
)
"""``h2`` events of frames that carry no part of a reply."""


class _ControlBudget:
    """A token bucket of ``CONTROL_FRAME_BURST`` frames refilled at ``CONTROL_FRAMES_PER_SECOND``."""

    def __init__(self) -> None:
        self.tokens = float(CONTROL_FRAME_BURST)
        self.at = time.monotonic()
        self.frames = 0
        """Frames carrying no part of the reply received so far on the connection."""

    def spend(self) -> None:
        """Take one frame; raises ``ControlFloodError`` when the allowance is spent."""
        now = time.monotonic()
        self.tokens = min(float(CONTROL_FRAME_BURST), self.tokens + (now - self.at) * CONTROL_FRAMES_PER_SECOND)
        self.at = now
        self.frames += 1
        if self.tokens < 1.0:
            raise ControlFloodError(
                StatusCode.RESOURCE_EXHAUSTED,
                f"the server sent {self.frames} HTTP/2 frames carrying no reply (SETTINGS, PING, WINDOW_UPDATE, "
                f"empty DATA...), over the allowance of {CONTROL_FRAME_BURST} at once and "
                f"{CONTROL_FRAMES_PER_SECOND:g} a second: connection closed",
            )
        self.tokens -= 1.0


def _carries_nothing(event: h2.events.Event, stream: int) -> bool:
    """Whether ``event`` is a frame that carries no part of the reply on ``stream``."""
    if isinstance(event, _CONTROL_EVENTS):
        return True
    if isinstance(event, h2.events.DataReceived):
        return event.stream_id != stream or (not event.data and event.stream_ended is None)
    return False


class _Message:
    """The one length-prefixed message of a unary reply, filled as DATA frames arrive.

    The 5-byte prefix (compressed flag, big-endian length) is read first; a length over ``cap``
    bytes is refused before anything else is kept, otherwise a buffer of exactly that length is
    allocated once and filled in place.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._prefix = bytearray()
        self._view: memoryview | None = None
        self.filled = 0
        """Bytes of the message received so far."""

    def feed(self, data: bytes) -> None:
        """Take the next bytes of the reply body; raises ``RpcError`` at the first sign of a
        message over the cap, a compressed one, or bytes past the one message."""
        chunk = memoryview(data)
        view = self._view
        if view is None:
            need = 5 - len(self._prefix)
            self._prefix += chunk[:need]
            chunk = chunk[need:]
            if len(self._prefix) < 5:
                return
            view = self._view = self._open()
        end = self.filled + len(chunk)
        if end > len(view):
            raise RpcError(
                StatusCode.INTERNAL,
                f"reply runs past the one message of {len(view)} bytes its prefix announced",
            )
        view[self.filled : end] = chunk
        self.filled = end

    def _open(self) -> memoryview:
        """The buffer for the message the complete prefix announces, once it passed the checks."""
        compressed, length = struct.unpack(">BI", self._prefix)
        if compressed:
            raise RpcError(StatusCode.INTERNAL, "compressed reply, though none was offered")
        if length > self.cap:
            raise RpcError(
                StatusCode.RESOURCE_EXHAUSTED, f"reply message of {length} bytes exceeds the cap of {self.cap} bytes"
            )
        return memoryview(bytearray(length))

    def message(self) -> memoryview:
        """The whole message; raises ``RpcError`` if the reply ended before it did."""
        if self._view is None:
            raise RpcError(StatusCode.INTERNAL, "reply holds no message")
        if self.filled != len(self._view):
            raise RpcError(
                StatusCode.INTERNAL, f"reply message of {self.filled} bytes, its prefix says {len(self._view)}"
            )
        return self._view


def _status(value: bytes | None) -> StatusCode:
    try:
        return StatusCode(int(value or b""))
    except ValueError:
        return StatusCode.UNKNOWN


class UnaryConnection:
    """One HTTP/2 connection to a gRPC server on ``socket_path``; calls run one after another.

    ``timeout_seconds`` bounds each call from its start (connect included for the first) unless
    the caller passes a deadline of its own; ``max_reply_bytes`` bounds one reply message.
    ``bytes_received`` counts what was read from the socket (frames and all).
    """

    def __init__(self, socket_path: str, timeout_seconds: float, max_reply_bytes: int) -> None:
        self.socket_path = socket_path
        self.timeout_seconds = timeout_seconds
        self.max_reply_bytes = max_reply_bytes
        self.bytes_received = 0
        self._control = _ControlBudget()
        self._sock: socket.socket | None = None
        self._h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))

    def __enter__(self) -> UnaryConnection:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self, error_code: int = 0) -> None:
        """Close the socket (a GOAWAY with ``error_code`` first); idempotent."""
        if self._sock is not None:
            try:
                self._h2.close_connection(error_code)
                self._sock.sendall(self._h2.data_to_send())
            except (OSError, h2.exceptions.ProtocolError):
                pass
            self._sock.close()
            self._sock = None

    def _connect(self, deadline: float) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.connect(self.socket_path)
        except OSError as exc:
            sock.close()
            raise RpcError(StatusCode.UNAVAILABLE, f"cannot connect to {self.socket_path}: {exc}") from exc
        self._h2.initiate_connection()
        self._h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW_BYTES})
        self._h2.increment_flow_control_window(WINDOW_BYTES - 65535)
        self._sock = sock
        return sock

    def call(self, method: str, request: bytes, deadline: float | None = None) -> memoryview:
        """Send ``request`` (serialised protobuf) to ``method`` (``/package.Service/Method``) and
        return the reply's serialised message (a view of the one buffer it was received into);
        raises :class:`RpcError`.  ``deadline`` (``time.monotonic()`` seconds) bounds the call,
        by default ``timeout_seconds`` from now."""
        if deadline is None:
            deadline = time.monotonic() + self.timeout_seconds
        remaining = self._remaining(deadline)
        sock = self._sock or self._connect(deadline)
        stream = self._h2.get_next_available_stream_id()
        headers = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", method.encode()),
            (b":authority", b"localhost"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            (b"grpc-timeout", b"%dm" % max(1, int(remaining * 1000))),
        ]
        self._h2.send_headers(stream, headers)
        self._h2.send_data(stream, struct.pack(">BI", 0, len(request)) + request, end_stream=True)
        try:
            return self._exchange(sock, stream, deadline)
        except ControlFloodError:
            self.close(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
            raise
        except RpcError:
            self.close()
            raise
        except h2.exceptions.ProtocolError as exc:
            self.close()
            raise RpcError(StatusCode.INTERNAL, f"HTTP/2 protocol error: {exc}") from exc

    def _exchange(self, sock: socket.socket, stream: int, deadline: float) -> memoryview:
        body = _Message(self.max_reply_bytes)
        response: dict[bytes, bytes] = {}
        trailers: dict[bytes, bytes] = {}
        ended = False
        while not ended:
            self._send(sock, deadline)
            for event in self._h2.receive_data(self._recv(sock, deadline)):
                if _carries_nothing(event, stream):
                    self._control.spend()
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream:
                    response = {bytes(k): bytes(v) for k, v in event.headers or ()}
                elif isinstance(event, h2.events.DataReceived) and event.stream_id == stream:
                    self._h2.acknowledge_received_data(event.flow_controlled_length, stream)
                    if response.get(b":status") == b"200":  # not gRPC otherwise: dropped unread
                        body.feed(event.data or b"")
                elif isinstance(event, h2.events.TrailersReceived) and event.stream_id == stream:
                    trailers = {bytes(k): bytes(v) for k, v in event.headers or ()}
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream:
                    ended = True
                elif isinstance(event, h2.events.StreamReset) and event.stream_id == stream:
                    raise RpcError(StatusCode.INTERNAL, f"stream reset by the server (error {event.error_code})")
                elif isinstance(event, h2.events.ConnectionTerminated):
                    raise RpcError(StatusCode.UNAVAILABLE, f"connection closed by the server ({event.error_code})")
        self._send(sock, deadline)
        return _message(response, trailers, body)

    def _send(self, sock: socket.socket, deadline: float) -> None:
        data = self._h2.data_to_send()
        if data:
            sock.settimeout(self._remaining(deadline))
            try:
                sock.sendall(data)
            except TimeoutError as exc:
                raise RpcError(StatusCode.DEADLINE_EXCEEDED, "deadline exceeded while sending") from exc
            except OSError as exc:
                raise RpcError(StatusCode.UNAVAILABLE, f"send failed: {exc}") from exc

    def _recv(self, sock: socket.socket, deadline: float) -> bytes:
        sock.settimeout(self._remaining(deadline))
        try:
            data = sock.recv(65536)
        except TimeoutError as exc:
            raise RpcError(StatusCode.DEADLINE_EXCEEDED, "deadline exceeded waiting for the reply") from exc
        except OSError as exc:
            raise RpcError(StatusCode.UNAVAILABLE, f"receive failed: {exc}") from exc
        if not data:
            raise RpcError(StatusCode.UNAVAILABLE, "connection closed before the reply ended")
        self.bytes_received += len(data)
        return data

    def _remaining(self, deadline: float) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RpcError(StatusCode.DEADLINE_EXCEEDED, f"no reply within {self.timeout_seconds:g} s")
        return remaining


def _message(response: dict[bytes, bytes], trailers: dict[bytes, bytes], body: _Message) -> memoryview:
    """The one message of a finished reply, or the error its status says."""
    http = response.get(b":status", b"")
    if http != b"200":
        code = _HTTP_TO_GRPC.get(int(http) if http.isdigit() else 0, StatusCode.UNKNOWN)
        raise RpcError(code, f"HTTP status {http.decode(errors='replace') or 'missing'}")
    status_field = trailers.get(b"grpc-status", response.get(b"grpc-status"))
    if status_field is None:
        raise RpcError(StatusCode.INTERNAL, "reply ended without grpc-status")
    status = _status(status_field)
    if status != StatusCode.OK:
        detail = trailers.get(b"grpc-message", response.get(b"grpc-message", b""))
        raise RpcError(status, unquote(detail.decode("utf-8", errors="replace")))
    return body.message()
