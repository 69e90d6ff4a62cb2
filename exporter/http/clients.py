"""Who a client is, to the HTTP front's budgets: its lane (a /64) and whether it has been served well.

Per-client budgets (exporter/http/admission.py) and login lanes (exporter/http/login.py) must hold
against a neighbour: pods of one node often share an IPv6 /64, and a host may hold every address
of its /64, so a flood can come from a fresh address each time.  Two facts decide:

- ``client_lane(address)``: the IPv4 address, or the IPv6 /64.  The budget every unknown address
  of the lane shares, so cycling through addresses buys nothing.
- ``KnownClients``: full addresses that were served well lately (a 2xx reply handed over whole;
  with basic auth on, only a reply to a request that carried correct credentials).  A known
  address keeps its own budget and login lane however busy its /64 is.  The table is bounded
  (``max_known``, least recently served forgotten first) and each lane may add only
  ``grants_per_second`` new addresses (bursts of ``grant_burst``), so a neighbour cycling through
  its /64 cannot push a scraper out of it within a scrape interval.

Everything here runs on the event-loop thread.
"""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable

MAX_KNOWN = 1024
"""Known-good addresses remembered; the least recently served is forgotten beyond."""
GRANTS_PER_SECOND = 1.0
"""New known-good addresses one lane (a /64) may add per second, on average."""
GRANT_BURST = 32.0
"""New known-good addresses one lane may add at once (a node's scrapers after a restart)."""


def client_address(address: str) -> str:
    """The full address of a peer: IPv4-mapped IPv6 as IPv4, the zone dropped; anything
    unparsable (a unix socket) as given."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def client_lane(address: str) -> str:
    """The lane of a peer address: the IPv4 address (also when IPv4-mapped into IPv6), or the
    IPv6 /64; anything unparsable (a unix socket) is one lane of its own."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class TokenBuckets:
    """Token buckets by key (``rate`` tokens a second, at most ``burst``), at most ``max_keys``
    of them: the least recently touched is forgotten beyond, and starts again full."""

    def __init__(self, rate: float, burst: float, max_keys: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def tokens(self, key: str) -> float:
        """The tokens ``key`` holds now (refilled; the key becomes the most recently touched)."""
        now = self._clock()
        tokens, last = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        self._buckets[key] = (tokens, now)
        if len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return tokens

    def take(self, key: str) -> bool:
        """Take one token from ``key``; False (and the bucket left at 0) when it had none."""
        tokens = self.tokens(key)
        self._buckets[key] = (max(0.0, tokens - 1.0), self._clock())
        return tokens >= 1.0


class KnownClients:
    """Full addresses served well lately (module docstring), bounded, least recently served
    forgotten first."""

    def __init__(
        self,
        max_known: int = MAX_KNOWN,
        grants_per_second: float = GRANTS_PER_SECOND,
        grant_burst: float = GRANT_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_known = max_known
        self._known: OrderedDict[str, None] = OrderedDict()
        self._grants = TokenBuckets(grants_per_second, grant_burst, max_known, clock)

    def __len__(self) -> int:
        return len(self._known)

    def knows(self, address: str) -> bool:
        """Whether ``address`` was served well lately."""
        return client_address(address) in self._known

    def served_well(self, address: str) -> None:
        """``address`` was served well: remember it (or refresh it), within its lane's grants."""
        full = client_address(address)
        if full in self._known:
            self._known.move_to_end(full)
            return
        if not self._grants.take(client_lane(address)):
            return
        self._known[full] = None
        if len(self._known) > self.max_known:
            self._known.popitem(last=False)

    def forget(self, address: str) -> None:
        """``address`` presented wrong credentials: it is known-good no more."""
        self._known.pop(client_address(address), None)
