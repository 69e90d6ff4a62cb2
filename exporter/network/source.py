"""The NIC source: reads the node's RDMA devices in its own thread; the sampler takes the latest.

A read that hangs (an EFA admin command that times out, a wedged driver) delays nothing but this
thread: once the latest good read is older than ``stale_seconds`` the ``nic`` stage fails and the
NIC series drop until reads come back.  Devices are rediscovered, and the host's GPUDirect RDMA
facts re-read, every ``rediscover_seconds``.  Where no RDMA device exists the source says so once,
reports no stage (a node without NICs is not a failure) and keeps looking.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter.model import NicSample, StageResult
from exporter.network.gdr import HostGdr, host_gdr
from exporter.network.rdma import MAX_COUNTERS, MAX_DEVICES, OUTSIDE_TREE, OVER_BOUND, OVER_LIMIT, Dropped, RdmaReader

log = logging.getLogger(__name__)

STAGE = "nic"


@dataclass(frozen=True)
class NicReading:
    """The source's latest state: its devices (``None``: none found, or no good read lately),
    the host's GPUDirect RDMA facts, the stage result (``None`` while no device exists) and what
    the last discovery left out, by (kind, reason)."""

    nics: tuple[NicSample, ...] | None
    host: HostGdr | None
    stage: StageResult | None
    dropped: Dropped = field(default_factory=lambda: MappingProxyType({}))


class NicSource:
    """Reads ``<sysfs>/class/infiniband`` every ``interval_seconds`` in a daemon thread."""

    def __init__(
        self,
        sysfs: str,
        procfs: str,
        interval_seconds: float = 1.0,
        rediscover_seconds: float = 60.0,
        stale_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_devices: int = MAX_DEVICES,
        max_counters: int = MAX_COUNTERS,
    ) -> None:
        self.sysfs = sysfs
        self.procfs = procfs
        self.interval_seconds = interval_seconds
        self.rediscover_seconds = rediscover_seconds
        self.stale_seconds = stale_seconds if stale_seconds is not None else max(5.0, 3 * interval_seconds)
        self._clock = clock
        self._reader = RdmaReader(sysfs, max_devices=max_devices, max_counters=max_counters)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._discovered_at: float | None = None
        self._devices = 0
        self._said_none = False
        self._said_dropped: Dropped = MappingProxyType({})
        """What was left out when last warned about: a tree that stays the same is warned about once."""
        self._dropped: Dropped = MappingProxyType({})
        self._host: HostGdr | None = None
        self._nics: tuple[NicSample, ...] | None = None
        self._good_at: float | None = None
        self._duration = 0.0
        self._failed = False

    @property
    def started(self) -> bool:
        """Whether the reading thread was started."""
        return self._thread is not None

    def start(self) -> None:
        """Start reading in a daemon thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpulens-nic", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        next_at = self._clock()
        while not self._stop.is_set():
            self.read_once()
            next_at += self.interval_seconds
            delay = next_at - self._clock()
            if delay < 0:
                next_at = self._clock()
                delay = 0.0
            self._stop.wait(delay)

    def read_once(self, now: float | None = None) -> None:
        """One read (and a discovery when due) at ``now`` (seconds on the source's clock; the
        caller's clock when it reads in its own thread); never raises."""
        now = self._clock() if now is None else now
        t0 = time.perf_counter()
        try:
            if self._discovered_at is None or now - self._discovered_at >= self.rediscover_seconds:
                self._discover(now)
            nics = self._reader.read(now) if self._devices else None
        except Exception:
            log.exception("reading the RDMA devices under %s failed", self.sysfs)
            with self._lock:
                self._failed = True
                self._duration = time.perf_counter() - t0
            return
        with self._lock:
            self._nics = nics
            self._failed = False
            self._good_at = now
            self._duration = time.perf_counter() - t0

    def _discover(self, now: float) -> None:
        self._discovered_at = now
        before = self._devices
        self._devices = self._reader.discover()
        host = host_gdr(self.sysfs, self.procfs)
        with self._lock:
            self._host = host
        if self._devices == 0:
            if not self._said_none:
                log.info(
                    "no RDMA device under %s/class/infiniband: no NIC series (looking again every %.0f s)",
                    self.sysfs,
                    self.rediscover_seconds,
                )
                self._said_none = True
            return
        if self._devices != before:
            log.info(
                "reading %d RDMA device(s) under %s/class/infiniband: %s%s",
                self._devices,
                self.sysfs,
                ", ".join(self._reader.device_names[:8]),
                ", ..." if self._devices > 8 else "",
            )
        dropped = self._reader.dropped
        with self._lock:
            self._dropped = dropped
        if dropped and dropped != self._said_dropped:
            log.warning("%s", self.dropped_message())
        self._said_dropped = dropped

    def dropped_message(self) -> str:
        """What the last discovery left out, in words, with the true counts (a lower bound where
        a listing stopped at its bound, said so)."""
        reader = self._reader
        dropped = reader.dropped
        about = "at least " if reader.dropped_at_least else ""
        why = {
            OVER_LIMIT: f"over --collect.nic.max-devices={reader.max_devices} / "
            f"--collect.nic.max-counters={reader.max_counters} (kept first: devices with a PCI function "
            "and an active port, then by name; each port's traffic counters)",
            OVER_BOUND: "over a bound of one directory (ports per device, files per counter directory)",
            OUTSIDE_TREE: "outside the sysfs tree or not a directory",
        }
        parts = [
            f"{about}{n} {kind}(s) {why.get(reason, reason)}"
            for (kind, reason), n in sorted(dropped.items(), key=lambda kv: (kv[0][1], kv[0][0]))
        ]
        return f"RDMA devices under {self.sysfs}/class/infiniband: left out " + "; ".join(parts)

    def latest(self, now: float | None = None) -> NicReading:
        """The latest state (what the sampler renders this cycle) as of ``now`` (default: the clock)."""
        now = self._clock() if now is None else now
        with self._lock:
            if self._devices == 0 and not self._failed:
                return NicReading(None, self._host, None, self._dropped)
            fresh = self._good_at is not None and now - self._good_at <= self.stale_seconds
            ok = fresh and not self._failed and self._nics is not None
            stage = StageResult(STAGE, ok, self._duration)
            return NicReading(self._nics if ok else None, self._host, stage, self._dropped)

    def ids(self) -> frozenset[str]:
        """The names and PCI addresses of the RDMA devices of the latest good read (empty when
        none): what a device held through a ResourceClaim must match to count as a NIC."""
        reading = self.latest()
        out: set[str] = set()
        for nic in reading.nics or ():
            out.add(nic.device)
            if nic.pci_bus_id:
                out.add(nic.pci_bus_id)
        return frozenset(out)

    def close(self) -> None:
        """Stop the thread and close the kept files."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        if self._thread is None or not self._thread.is_alive():
            self._reader.close()
