"""A reply of the HTTP front as the server builds it and a connection writes it."""

from __future__ import annotations

from dataclasses import dataclass

TEXT = "text/plain; charset=utf-8"
"""Content type of the front's own short replies (errors, health and readiness answers)."""


@dataclass
class Response:
    """A reply: status, body in parts (sent without joining), content type, extra headers."""

    status: int
    body: tuple[bytes | memoryview, ...]
    ctype: str = TEXT
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False
    vouches: bool = False
    """Handed over whole, it makes the client known-good (``exporter.http.clients.KnownClients``):
    a 2xx reply, and with basic auth on, to a request that carried correct credentials."""
