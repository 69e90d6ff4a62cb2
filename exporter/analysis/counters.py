"""Monotonic counters derived from samples: activity integrals, energy, Xid and error totals.

Prometheus wants counters that only go up; NVML gives ratios (integrated here into
``*_seconds_total`` so ``rate()`` over any window is the exact mean) and a driver energy
counter that restarts at zero after a driver reload (made monotonic here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Generic, TypeVar

from exporter.model import LinkTraffic

K = TypeVar("K")


@dataclass
class _LeafIntegrals:
    sm: float = 0.0
    tensor: float = 0.0
    dram: float = 0.0
    busy: float = 0.0


class ActivityIntegrator:
    """Integrates activity ratios over their windows: seconds of SM / tensor / DRAM / busy time per leaf.

    A ratio ``r`` measured over a window of ``w`` seconds adds ``r * w`` seconds.  GPM windows come
    from the backend (the time between two GPM samples), so missed cycles are not double counted.
    A leaf without GPM integrates only its busy ratio (NVML GPU-Util, or its busiest link), over
    the time since the sampler's previous cycle; its SM / tensor / DRAM series stay absent, and so
    does every integral of a MIG instance without GPM (it has no busy ratio).
    """

    def __init__(self) -> None:
        self._leaves: dict[str, _LeafIntegrals] = {}

    def add(
        self,
        leaf_id: str,
        window_seconds: float,
        sm: float | None,
        tensor: float | None,
        dram: float | None,
        busy: float | None = None,
    ) -> tuple[float | None, float | None, float | None, float | None]:
        """Add one window; returns the running (sm, tensor, dram, busy) seconds, ``None`` where unknown."""
        acc = self._leaves.setdefault(leaf_id, _LeafIntegrals())
        w = max(0.0, window_seconds)
        if sm is not None:
            acc.sm += sm * w
        if tensor is not None:
            acc.tensor += tensor * w
        if dram is not None:
            acc.dram += dram * w
        if busy is not None:
            acc.busy += busy * w
        return (
            acc.sm if sm is not None else None,
            acc.tensor if tensor is not None else None,
            acc.dram if dram is not None else None,
            acc.busy if busy is not None else None,
        )

    def forget(self, keep: Iterable[str]) -> None:
        """Drop leaves that no longer exist (a MIG instance destroyed, a GPU removed)."""
        keep_set = set(keep)
        for leaf_id in list(self._leaves):
            if leaf_id not in keep_set:
                del self._leaves[leaf_id]


class LinkIntegrator:
    """Bytes each leaf moved over each link and direction since the exporter first saw it.

    Each cycle adds rate x window per direction.  For NVML's cumulative counters the backend
    derived the rate from the counter's increase over exactly that window, so the sum is the
    counter's own increase (across a driver reset the backend takes that window's rate from its
    next source instead); GPM and sampled rates are integrated the same way.
    """

    def __init__(self) -> None:
        self._totals: dict[str, dict[tuple[str, str], float]] = {}

    def add(self, leaf_id: str, links: Iterable[LinkTraffic]) -> Mapping[tuple[str, str], float]:
        """Add one cycle's link traffic of a leaf; returns its (link, direction) -> bytes totals."""
        totals = self._totals.setdefault(leaf_id, {})
        for link in links:
            w = max(0.0, link.window_seconds)
            for direction, rate in (("tx", link.tx_bytes_per_second), ("rx", link.rx_bytes_per_second)):
                if rate is None or not rate >= 0.0 or rate == float("inf"):
                    continue
                key = (link.link, direction)
                totals[key] = totals.get(key, 0.0) + rate * w
        return MappingProxyType(dict(totals))

    def forget(self, keep: Iterable[str]) -> None:
        """Drop leaves that no longer exist."""
        keep_set = set(keep)
        for leaf_id in [k for k in self._totals if k not in keep_set]:
            del self._totals[leaf_id]


class MonotonicCounter:
    """Turns a raw cumulative reading that may restart (driver reload) into a monotonic total.

    The first reading sets the origin (the total starts at 0 when the exporter first sees the
    device); a reading lower than the previous one is taken as a restart from zero, so its whole
    value counts as new.  Negative or non-finite readings are ignored.
    """

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._total: dict[str, float] = {}

    def update(self, key: str, raw: float | None) -> float | None:
        """Feed a raw reading; returns the monotonic total, or ``None`` if never read."""
        if raw is None or raw != raw or raw < 0 or raw == float("inf"):
            return self._total.get(key)
        last = self._last.get(key)
        total = self._total.get(key, 0.0)
        if last is not None:
            total += raw - last if raw >= last else raw
        self._last[key] = raw
        self._total[key] = total
        return total

    def forget(self, keep: Iterable[str]) -> None:
        """Drop keys that no longer exist."""
        keep_set = set(keep)
        for key in list(self._last):
            if key not in keep_set:
                self._last.pop(key, None)
                self._total.pop(key, None)


class EventCounter(Generic[K]):
    """Counts discrete events by key (Xid per GPU, NVML errors per code) since start."""

    def __init__(self) -> None:
        self._counts: dict[K, int] = {}

    def add(self, key: K, n: int = 1) -> None:
        """Count ``n`` more events for ``key``."""
        if n > 0:
            self._counts[key] = self._counts.get(key, 0) + n

    def add_all(self, counts: Mapping[K, int]) -> None:
        """Count several keys at once."""
        for key, n in counts.items():
            self.add(key, n)

    def totals(self) -> dict[K, int]:
        """A copy of the totals (safe to put in a frozen Snapshot)."""
        return dict(self._counts)
