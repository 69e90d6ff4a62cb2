"""Fair scheduling of uncached basic-auth checks: a flood of wrong passwords cannot starve a login.

bcrypt costs tens of milliseconds per check by design, and checks run one at a time on one
low-priority thread.  In one FIFO, 200 connections sending wrong passwords put the first real
login after a restart behind 200 checks, past any scrape timeout.  So:

- **Known-good addresses first.**  An address served well lately (``KnownClients``: with basic
  auth on, a 2xx reply to correct credentials) has a lane of its own that is served before any
  other, so a known scraper (new credentials after a rotation, a cache miss) never waits behind a
  flood from its /64.  A wrong password from it makes it unknown again.
- **A lane per full client address, grouped by /64** (``client_lane``), served round-robin: first
  between /64s, then between the addresses of a /64.  After a restart (no history), a flood from
  one address delays a login from another address of the same /64 by at most one check per busy
  lane of that /64, and a login from another /64 by at most one check per busy /64.
- **Bounded lanes.**  A lane holds at most ``lane_depth`` pending checks, a /64 at most
  ``group_lanes`` address lanes, and there are at most ``max_lanes`` lanes in all (known ones
  apart, as many again); work beyond that is shed at once (the caller answers 429) instead of
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
from collections import OrderedDict, deque
from concurrent.futures import Executor
from dataclasses import dataclass

from exporter.http.clients import KnownClients, client_address, client_lane
from exporter.http.webconfig import BasicAuth

LANE_DEPTH = 4
"""Pending checks one client address may have; more are shed (429)."""
MAX_LANES = 32
"""Client addresses that may have checks pending at once; a new address beyond is shed (known-good
addresses have as many again of their own)."""
GROUP_LANES = 8
"""Addresses of one /64 that may have checks pending at once; a new one beyond is shed."""

__all__ = ["GROUP_LANES", "LANE_DEPTH", "MAX_LANES", "LoginScheduler", "client_lane"]


@dataclass
class _Job:
    address: str
    header: str
    result: asyncio.Future[bool]


Lanes = OrderedDict[str, deque[_Job]]
"""Pending checks by full client address, in round-robin order."""


class LoginScheduler:
    """Runs ``BasicAuth.check`` on ``pool`` (one thread), fairly across client addresses and /64s,
    known-good addresses first (module docstring).

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
        group_lanes: int = GROUP_LANES,
        known: KnownClients | None = None,
    ) -> None:
        self._auth = auth
        self._pool = pool
        self._loop = loop
        self.lane_depth = lane_depth
        self.max_lanes = max_lanes
        self.group_lanes = group_lanes
        self.known = known if known is not None else KnownClients()
        """Addresses served well lately (shared with the connection budget)."""
        self._first: Lanes = OrderedDict()  # known-good addresses
        self._groups: OrderedDict[str, Lanes] = OrderedDict()  # the others, by /64
        self._lanes = 0  # address lanes in _groups
        self._inflight: dict[str, asyncio.Future[bool]] = {}
        self._running = False
        self.shed = 0
        """Checks refused because their lane, their /64's lanes, or the table of lanes, was full."""

    def pending(self) -> int:
        """Checks waiting (not counting the one running)."""
        lanes = [*self._first.values(), *(q for group in self._groups.values() for q in group.values())]
        return sum(len(q) for q in lanes)

    def _queue(self, address: str) -> deque[_Job] | None:
        """The lane a new check of ``address`` joins, made if need be; None: shed it."""
        if self.known.knows(address):
            lanes, room = self._first, len(self._first) < self.max_lanes
        else:
            group = self._groups.get(client_lane(address))
            lanes = group if group is not None else OrderedDict()
            room = self._lanes < self.max_lanes and len(lanes) < self.group_lanes
        queue = lanes.get(address)
        if queue is None:
            if not room:
                return None
            queue = lanes[address] = deque()
            if lanes is not self._first:
                self._lanes += 1
                self._groups.setdefault(client_lane(address), lanes)
        return queue if len(queue) < self.lane_depth else None

    def check(self, address: str, header: str) -> asyncio.Future[bool] | None:
        """A future of whether ``header`` holds valid credentials; ``None`` if shed."""
        same = self._inflight.get(header)
        if same is not None:
            return same
        result: asyncio.Future[bool] = self._loop.create_future()
        if not self._auth.knows_user(header):
            self._loop.call_later(self._auth.check_seconds, _settle, result, False)
            return result
        address = client_address(address)
        queue = self._queue(address)
        if queue is None:
            self.shed += 1
            return None
        queue.append(_Job(address, header, result))
        self._inflight[header] = result
        self._next()
        return result

    def _take(self) -> _Job | None:
        """The next check: round-robin over known-good addresses, else over /64s, then over the
        addresses of that /64."""
        if self._first:
            return _pop_round(self._first)
        if not self._groups:
            return None
        lane, group = self._groups.popitem(last=False)
        job = _pop_round(group)
        if not group.get(job.address):
            self._lanes -= 1
        if group:
            self._groups[lane] = group  # back of the round
        return job

    def _next(self) -> None:
        if self._running:
            return
        job = self._take()
        if job is None:
            return
        self._running = True
        running = self._loop.run_in_executor(self._pool, self._auth.check, job.header)
        running.add_done_callback(lambda done: self._finished(job, done))

    def _finished(self, job: _Job, done: asyncio.Future[bool]) -> None:
        self._running = False
        self._inflight.pop(job.header, None)
        ok = False
        if not done.cancelled() and done.exception() is None:
            ok = bool(done.result())
        if not ok:
            self.known.forget(job.address)
        _settle(job.result, ok)
        self._next()


def _pop_round(lanes: Lanes) -> _Job:
    """The first job of the first lane; the lane goes to the back of the round (dropped if empty)."""
    address, queue = lanes.popitem(last=False)
    job = queue.popleft()
    if queue:
        lanes[address] = queue
    return job


def _settle(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)
