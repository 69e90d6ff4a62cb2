"""Fair scheduling of uncached basic-auth checks: a flood of wrong passwords cannot starve a login.

bcrypt costs tens of milliseconds per check by design, and checks run one at a time on one
low-priority thread.  In one FIFO, 200 connections sending wrong passwords put the first real
login after a restart behind 200 checks, past any scrape timeout.  So:

- **A lane per client address** (an IPv4 address, or an IPv6 /64, which one host usually holds),
  served round-robin: a flood from one address delays a login from another by at most one check
  per busy lane.
- **Bounded lanes.**  A lane holds at most ``lane_depth`` pending checks and there are at most
  ``max_lanes`` lanes; work beyond that is shed at once (the caller answers 429) instead of
  queued.
- **Unknown user names cost no bcrypt at all.**  They can never succeed; their refusal is only
  delayed by the time one real check takes, so that a user name cannot be told apart by timing.
- **Identical credentials share one check**: a scraper's parallel first requests after a restart
  wait for the same result.

Credentials verified before are answered from the cache before any of this (``BasicAuth``).
Everything here runs on the event-loop thread.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections import OrderedDict, deque
from concurrent.futures import Executor
from dataclasses import dataclass

from exporter.http.webconfig import BasicAuth

LANE_DEPTH = 4
"""Pending checks one client address may have; more are shed (429)."""
MAX_LANES = 32
"""Client addresses that may have checks pending at once; a new address beyond is shed."""


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


@dataclass
class _Job:
    header: str
    result: asyncio.Future[bool]


class LoginScheduler:
    """Runs ``BasicAuth.check`` on ``pool`` (one thread), fairly across client lanes.

    ``check(address, header)`` is called on the loop thread and returns a future of the verdict,
    or ``None`` when the work is shed.
    """

    def __init__(
        self,
        auth: BasicAuth,
        pool: Executor,
        loop: asyncio.AbstractEventLoop,
        lane_depth: int = LANE_DEPTH,
        max_lanes: int = MAX_LANES,
    ) -> None:
        self._auth = auth
        self._pool = pool
        self._loop = loop
        self.lane_depth = lane_depth
        self.max_lanes = max_lanes
        self._lanes: OrderedDict[str, deque[_Job]] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[bool]] = {}
        self._running = False
        self.shed = 0
        """Checks refused because their lane, or the table of lanes, was full."""

    def pending(self) -> int:
        """Checks waiting (not counting the one running)."""
        return sum(len(q) for q in self._lanes.values())

    def check(self, address: str, header: str) -> asyncio.Future[bool] | None:
        """A future of whether ``header`` holds valid credentials; ``None`` if shed."""
        same = self._inflight.get(header)
        if same is not None:
            return same
        result: asyncio.Future[bool] = self._loop.create_future()
        if not self._auth.knows_user(header):
            self._loop.call_later(self._auth.check_seconds, _settle, result, False)
            return result
        lane = client_lane(address)
        queue = self._lanes.get(lane)
        if queue is None:
            if len(self._lanes) >= self.max_lanes:
                self.shed += 1
                return None
            queue = self._lanes[lane] = deque()
        elif len(queue) >= self.lane_depth:
            self.shed += 1
            return None
        queue.append(_Job(header, result))
        self._inflight[header] = result
        self._next()
        return result

    def _next(self) -> None:
        if self._running or not self._lanes:
            return
        lane, queue = self._lanes.popitem(last=False)
        job = queue.popleft()
        if queue:
            self._lanes[lane] = queue  # back of the round
        self._running = True
        running = self._loop.run_in_executor(self._pool, self._auth.check, job.header)
        running.add_done_callback(lambda done: self._finished(job, done))

    def _finished(self, job: _Job, done: asyncio.Future[bool]) -> None:
        self._running = False
        self._inflight.pop(job.header, None)
        ok = False
        if not done.cancelled() and done.exception() is None:
            ok = bool(done.result())
        _settle(job.result, ok)
        self._next()


def _settle(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)
