"""The HTTP front's budget: how many connections, how many header bytes, how long each step may take.

The server (exporter/http/server.py) enforces these; each connection (exporter/http/connection.py)
reads its deadlines and head limits from them. What each bound protects is in the server's module
docstring and docs/security.md ("HTTP front").
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.http.admission import BURST, RATE_PER_SECOND


@dataclass(frozen=True)
class Limits:
    """The HTTP front's budget (counts, bytes and seconds); see the module docstring."""

    max_connections: int = 512
    max_header_bytes: int = 16 * 1024
    max_headers: int = 100
    request_deadline: float = 10.0
    keepalive_idle: float = 30.0
    write_deadline: float = 30.0
    max_stalled: int = 32
    max_handshakes: int = 64
    max_handshakes_per_client: int = 8
    bad_endings_per_second: float = RATE_PER_SECOND
    bad_endings_burst: float = BURST
