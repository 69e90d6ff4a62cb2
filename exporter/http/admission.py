"""A budget of misbehaving connections per client, so one client cannot keep the front busy, and
a neighbour in its /64 cannot spend it.

Every new connection costs the event loop work before it can be judged: an accept, a request
parsed, a reply started.  A client that reconnects as fast as it is dropped (unread replies,
plaintext on the TLS port, ffdhe ClientHellos, heads that never end) turns that into a loop at
full CPU, and every scraper's connection waits in the kernel's accept queue behind it.  So each
connection that ends badly - closed at a deadline, evicted, reset for not reading, a failed TLS
handshake, a malformed request - takes a token (``charge``) from two token buckets:

- **its full address'** (``rate``, ``burst``);
- **its lane's** (an IPv6 /64, ``exporter.http.clients.client_lane``; ``LANE_SHARE`` times
  larger), which every address of the /64 shares, since a host may cycle through all of them.

A new connection is reset at once, before any parsing, while its address' bucket is empty; or,
for an address that has not been served well lately (``KnownClients``), while its lane's is.  So
a flood from one address only spends its own budget (the lane's is larger than one address can
drain), a flood cycling through a /64 shuts out only the /64's unknown or failing addresses, and
a scraper that has been served well keeps its own budget.  Connections that end well cost
nothing: a client scraping as fast as it can, one connection per scrape, is never refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from exporter.http.clients import KnownClients, TokenBuckets, client_address, client_lane

RATE_PER_SECOND = 20.0
"""Connections per second one address may end badly, on average."""
BURST = 100.0
"""Connections one address may end badly in a burst (the bucket's size)."""
LANE_SHARE = 4.0
"""A /64's bucket is this many times an address' (rate and burst): more than one address can
spend, so a flood from one neighbour never reaches its /64's unknown addresses."""
MAX_ADDRESSES = 4096
"""Addresses (and, apart, lanes) remembered; the least recently seen is forgotten beyond (it
starts again with a full bucket)."""


class ConnectionBudget:
    """Token buckets per client address and per /64: ``admit(address)`` on each accept,
    ``charge(address)`` when one of its connections ends badly."""

    def __init__(
        self,
        rate: float = RATE_PER_SECOND,
        burst: float = BURST,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
        known: KnownClients | None = None,
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.max_addresses = max_addresses
        self.known = known if known is not None else KnownClients(clock=clock)
        """Addresses served well lately (shared with the login lanes)."""
        self._own = TokenBuckets(rate, burst, max_addresses, clock)
        self._lanes = TokenBuckets(rate * LANE_SHARE, burst * LANE_SHARE, max_addresses, clock)
        self.refused = 0
        """Connections refused because their address, or their unknown address' /64, had spent its budget."""

    def admit(self, address: str) -> bool:
        """Whether ``address`` may open a connection now (module docstring)."""
        full, lane = client_address(address), client_lane(address)
        if self._own.tokens(full) < 1.0 or (
            lane != full and not self.known.knows(full) and self._lanes.tokens(lane) < 1.0
        ):
            self.refused += 1
            return False
        return True

    def charge(self, address: str) -> None:
        """One of ``address``' connections ended badly: take a token from it and from its /64."""
        full, lane = client_address(address), client_lane(address)
        self._own.take(full)
        if lane != full:
            self._lanes.take(lane)
