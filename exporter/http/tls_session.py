"""Server-side TLS for one connection over memory buffers, with the handshake run off the loop.

asyncio's own TLS (``loop.start_tls``) does the handshake's key exchange and signature on the
event-loop thread, so a client that makes handshakes expensive stalls every scrape, and each TLS
connection allocates a 256 KiB read buffer.  Here the connection feeds received bytes into an
``ssl.MemoryBIO`` and takes what OpenSSL wants to send from another; each handshake step runs on a
worker thread (OpenSSL releases the GIL while it computes), and only the cheap record layer
(AES-GCM or ChaCha20 on a few KiB at a time) runs on the loop afterwards.
"""

from __future__ import annotations

import contextlib
import ssl

READ_CHUNK = 16 * 1024
"""Plaintext taken from OpenSSL per ``read`` call (one TLS record holds at most 16 KiB)."""
HANDSHAKE_RECORD = 0x16
"""The content type of a TLS handshake record: the first byte every TLS client sends (its
ClientHello).  A plain-HTTP client's first byte is a method's letter."""
NOT_TLS_REPLY = (
    b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
    b"client sent an HTTP request to an HTTPS server\n"
)
"""The plain-text answer to a client whose first byte on the TLS port is not a handshake record
(the reply Go's servers give, so ``curl http://`` on an HTTPS port says what is wrong)."""


def starts_tls(first_byte: int) -> bool:
    """Whether a connection's first byte can begin a TLS session (a handshake record); anything
    else is refused before an SSL object, its buffers or a handshake step is spent on it."""
    return first_byte == HANDSHAKE_RECORD


class TlsSession:
    """One server-side TLS session; not thread-safe: ``handshake_step`` may run on a worker thread
    only while the owner neither feeds nor reads it."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._obj = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self.established = False
        self.stepping = False
        """A handshake step is running on a worker thread."""
        self.peer_closed = False
        """The client sent close_notify."""

    def feed(self, data: bytes) -> None:
        """Bytes received from the client."""
        self._incoming.write(data)

    def handshake_step(self) -> bool:
        """Advance the handshake with the bytes fed so far: True once it is complete, False when
        it needs more bytes from the client.  Raises ``ssl.SSLError`` (or ``OSError``) when the
        handshake failed; ``pending_output`` then holds the alert for the client."""
        try:
            self._obj.do_handshake()
        except ssl.SSLWantReadError:
            return False
        self.established = True
        return True

    def pending_output(self) -> bytes:
        """Bytes OpenSSL wants sent to the client (handshake messages, records, alerts)."""
        return self._outgoing.read()

    def decrypt(self) -> bytes:
        """All plaintext the fed records hold (may be empty: a record split across reads, or a
        post-handshake message).  Raises ``ssl.SSLError`` on a bad record."""
        out = bytearray()
        while True:
            try:
                chunk = self._obj.read(READ_CHUNK)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.peer_closed = True
                break
            if not chunk:
                break
            out += chunk
        return bytes(out)

    def encrypt(self, data: bytes | memoryview) -> bytes:
        """``data`` as TLS records, ready to send."""
        self._obj.write(data)
        return self._outgoing.read()

    def close_notify(self) -> bytes:
        """The close_notify alert to send before closing (empty if the session cannot send one)."""
        if not self.established:
            return b""
        with contextlib.suppress(ssl.SSLError, OSError):  # SSLWantReadError: the peer's alert is not awaited
            self._obj.unwrap()
        return self._outgoing.read()
