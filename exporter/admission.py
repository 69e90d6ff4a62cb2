"""A budget of new connections per client address, so one address cannot keep the front busy.

Every new connection costs the event loop work before it can be judged: an accept, a request
parsed, a reply started.  A client that reconnects as fast as it is dropped (unread replies,
plaintext on the TLS port, ffdhe ClientHellos) turns that into a loop at full CPU, and every
scraper's connection waits in the kernel's accept queue behind it.  So each client address (an
IPv4 address or an IPv6 /64, ``exporter.login.client_lane``) gets a token bucket of new
connections; a connection beyond it is closed at once (with a reset), before any parsing.
Prometheus opens one connection per target and keeps it; a kubelet probe opens one every few
seconds: both stay far below the rate.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from exporter.login import client_lane

RATE_PER_SECOND = 50.0
"""New connections per second one address may open, on average."""
BURST = 100.0
"""New connections one address may open at once (the bucket's size)."""
MAX_ADDRESSES = 4096
"""Addresses remembered; the least recently seen is forgotten beyond (it starts with a full bucket)."""


class ConnectionBudget:
    """Token buckets of new connections per client lane; ``admit(address)`` on each accept."""

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

    def admit(self, address: str) -> bool:
        """Take one token from ``address``' bucket; False when it is empty."""
        lane = client_lane(address)
        now = self._clock()
        tokens, last = self._buckets.pop(lane, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        ok = tokens >= 1.0
        self._buckets[lane] = (tokens - 1.0 if ok else tokens, now)
        if len(self._buckets) > self.max_addresses:
            self._buckets.popitem(last=False)
        if not ok:
            self.refused += 1
        return ok
