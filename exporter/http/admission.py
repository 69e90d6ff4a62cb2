"""A budget of misbehaving connections per client address, so one address cannot keep the front
busy.

Every new connection costs the event loop work before it can be judged: an accept, a request
parsed, a reply started.  A client that reconnects as fast as it is dropped (unread replies,
plaintext on the TLS port, ffdhe ClientHellos, heads that never end) turns that into a loop at
full CPU, and every scraper's connection waits in the kernel's accept queue behind it.  So each
client address (an IPv4 address or an IPv6 /64, ``exporter.http.login.client_lane``) has a token
bucket, and each of its connections that ends badly - closed at a deadline, evicted, reset for
not reading, a failed TLS handshake, a malformed request - takes a token (``charge``).  While
the bucket is empty, the address' new connections are reset at once, before any parsing.
Connections that end well cost nothing: a client scraping as fast as it can, one connection per
scrape, is never refused.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from exporter.http.login import client_lane

RATE_PER_SECOND = 20.0
"""Connections per second one address may end badly, on average."""
BURST = 100.0
"""Connections one address may end badly in a burst (the bucket's size)."""
MAX_ADDRESSES = 4096
"""Addresses remembered; the least recently seen is forgotten beyond (it starts with a full bucket)."""


class ConnectionBudget:
    """Token buckets per client lane: ``admit(address)`` on each accept, ``charge(address)``
    when one of its connections ends badly."""

    def __init__(
        self,
        rate: float = RATE_PER_SECOND,
        burst: float = BURST,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.max_addresses = max_addresses
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self.refused = 0
        """Connections refused because their address had spent its budget."""

    def _tokens(self, lane: str, now: float) -> float:
        tokens, last = self._buckets.pop(lane, (self.burst, now))
        return min(self.burst, tokens + (now - last) * self.rate)

    def _store(self, lane: str, tokens: float, now: float) -> None:
        self._buckets[lane] = (tokens, now)
        if len(self._buckets) > self.max_addresses:
            self._buckets.popitem(last=False)

    def admit(self, address: str) -> bool:
        """Whether ``address`` may open a connection now (its bucket holds a token)."""
        lane = client_lane(address)
        now = self._clock()
        tokens = self._tokens(lane, now)
        self._store(lane, tokens, now)
        if tokens < 1.0:
            self.refused += 1
            return False
        return True

    def charge(self, address: str) -> None:
        """One of ``address``' connections ended badly: take a token."""
        lane = client_lane(address)
        now = self._clock()
        self._store(lane, max(0.0, self._tokens(lane, now) - 1.0), now)
