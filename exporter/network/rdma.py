"""Reads every RDMA device under ``<sysfs>/class/infiniband``: EFA, InfiniBand and RoCE counters.

Discovery walks the tree once (and again when asked: the NIC source does it every minute) and
keeps every per-cycle file open; a cycle then costs one ``pread`` at offset 0 per file (sysfs
regenerates an attribute's text on each read from offset 0), under half of what opening, reading
and closing each file costs and a fifth of a node_exporter-style walk (docs/benchmarks.md, "NIC
reading cost").  Every open is non-blocking and every read bounded
(``exporter.fsread``): a FIFO, a device node or a huge file planted in the tree blocks nothing
and costs at most the bound.  docs/network.md lists the files and what each becomes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import resource
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import cast

from exporter import fsread
from exporter.label_values import label_value
from exporter.model import NicPort, NicSample

log = logging.getLogger(__name__)

MAX_DEVICES = 256
"""RDMA devices read per node (a p5 has 32 EFA devices; SR-IOV nodes a few hundred VFs at most)."""
MAX_PORTS = 8
"""Ports read per device (RDMA NICs have one or two)."""
MAX_COUNTERS_PER_DIR = 512
"""Files looked at per counter directory (mlx5 has ~60, EFA ~25)."""
MAX_OPEN_FILES = 4096
"""Files kept open across cycles (and at most a quarter of the open-files limit: ``open_budget``);
past it, files are opened and closed at each read."""
COUNTER_BYTES = 64
"""Bytes read of a counter file: a 64-bit decimal and a newline fit in 21."""
SLOW_EVERY = 10
"""A device's counters other than the ports' traffic (bytes and packets each way), and its line rate,
are read every this many reads, the devices staggered over the reads (a tenth of them each read):
their series are at most this many intervals old, which a 15-60 s scrape does not see.  The traffic
counters (the rates the classifier and the utilisation need) and the port states are read every
read."""

WRAP_32 = 2**32
WRAP_64 = 2**64

_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")

_TRAFFIC: Mapping[str, tuple[str, float]] = MappingProxyType(
    {
        # EFA hw_counters: bytes and packets.
        "tx_bytes": ("tx_bytes", 1.0),
        "rx_bytes": ("rx_bytes", 1.0),
        "tx_pkts": ("tx_packets", 1.0),
        "rx_pkts": ("rx_packets", 1.0),
        # InfiniBand port counters: data in 4-byte words, packets.
        "port_xmit_data": ("tx_bytes", 4.0),
        "port_rcv_data": ("rx_bytes", 4.0),
        "port_xmit_packets": ("tx_packets", 1.0),
        "port_rcv_packets": ("rx_packets", 1.0),
    }
)
"""Counter files that feed the named traffic series, with their scale to bytes or packets."""
_SETTINGS = frozenset({"lifespan"})
"""Files of a counter directory that are settings, not counters."""


def counter_advance(last: int, raw: int) -> int:
    """How much a cumulative counter grew from ``last`` to ``raw``: a decrease is a 32-bit wrap
    when ``last`` sat in the top quarter of the 32-bit range, a 64-bit wrap in the top quarter of
    that one, else a reset (driver reload, counters cleared) after which all of ``raw`` is new.
    Integers: a float holds 53 bits, so near 2**64 it would lose up to 2048 of a wrap's delta."""
    if raw >= last:
        return raw - last
    if 0.75 * WRAP_32 <= last < WRAP_32 and raw < WRAP_32:
        return raw + WRAP_32 - last
    if last >= 0.75 * WRAP_64:
        return raw + WRAP_64 - last
    return raw


def open_budget(limit: int) -> int:
    """Files to keep open: ``limit``, at most a quarter of the process's open-files limit (soft),
    so kept counters never take the descriptors the HTTP server and the kubelet client need (the
    server raises the soft limit to the hard one at start, but discovery may come first, and a
    hard limit of 1024 exists).  Past the budget a file is opened and closed at each read."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ValueError, OSError):
        return limit
    if soft == resource.RLIM_INFINITY:
        return limit
    return max(0, min(limit, soft // 4))


def parse_rate(text: str | None) -> float | None:
    """Bytes per second each way from a port's ``rate`` (``400 Gb/sec (4X NDR)`` is 50e9)."""
    m = _RATE.match(text or "")
    return float(m.group(1)) * 1e9 / 8 if m else None


def _parse_rate_file(file: _File) -> float | None:
    data = file.read(128)
    return parse_rate(data.decode("ascii", "replace")) if data is not None else None


def parse_state(data: bytes | None) -> int | None:
    """The number of a ``state`` or ``phys_state`` file's bytes (``b"4: ACTIVE"`` is 4); ``None``
    when unreadable or not ``<n>: <NAME>`` with n in 0..255."""
    if data is None:
        return None
    try:
        value = int(data.split(b":", 1)[0])
    except ValueError:
        return None
    return value if 0 <= value < 256 else None


class _File:
    """One file re-read every cycle: kept open while the open-file budget allows."""

    __slots__ = ("fd", "path")

    def __init__(self, path: str, budget: list[int]) -> None:
        self.path = path
        self.fd: int | None = None
        if budget[0] > 0:
            try:
                self.fd = os.open(path, fsread.OPEN_FLAGS)
                budget[0] -= 1
            except OSError:
                self.fd = None

    def read(self, limit: int = COUNTER_BYTES) -> bytes | None:
        """The file's first ``limit`` bytes, fresh; ``None`` when it cannot be read."""
        try:
            if self.fd is not None:
                return os.pread(self.fd, limit, 0)
            fd = os.open(self.path, fsread.OPEN_FLAGS)
            try:
                return os.read(fd, limit)
            finally:
                os.close(fd)
        except OSError:
            return None

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


class _Counter:
    """A counter file and its monotonic total (an integer: a float holds 53 bits) since first read."""

    __slots__ = ("file", "last", "name", "scale", "total")

    def __init__(self, name: str, file: _File, scale: float = 1.0) -> None:
        self.name = name
        self.file = file
        self.scale = scale
        self.last: int | None = None
        self.total = 0

    def update(self) -> float | None:
        """Read it; the monotonic total (scaled), or ``None`` if this read failed."""
        return _update((self,))[0]


_MAX_RAW = 2**64
"""Counter values at or past this are not a 64-bit counter's: the read is refused."""


def _update(counters: Sequence[_Counter]) -> list[float | None]:
    """Read every counter of ``counters`` once; their monotonic totals (scaled) in order, ``None``
    for a read that failed or did not parse.  The per-cycle hot loop: one ``pread`` a kept-open
    file, ``int()`` of the bytes (it takes the trailing newline), no allocation beyond the result."""
    pread = os.pread
    out: list[float | None] = []
    append = out.append
    for c in counters:
        fd = c.file.fd
        try:
            data = pread(fd, COUNTER_BYTES, 0) if fd is not None else c.file.read()
            raw = int(data)  # type: ignore[arg-type]  # None (an unreadable file) raises TypeError
        except (OSError, ValueError, TypeError):
            append(None)
            continue
        if raw < 0 or raw >= _MAX_RAW:
            append(None)
            continue
        last = c.last
        if last is not None:
            c.total += raw - last if raw >= last else counter_advance(last, raw)
        c.last = raw
        append(c.total * c.scale)
    return out


@dataclass
class _Port:
    number: int
    state: _File
    phys_state: _File
    rate_file: _File
    link_layer: str | None
    traffic: dict[str, _Counter] = field(default_factory=dict)
    """Named traffic key (``tx_bytes`` ...) -> its counter."""
    counters: list[_Counter] = field(default_factory=list)
    names: tuple[str, ...] = ()
    """The counters' names, in their order (set once discovery is done)."""
    traffic_counters: tuple[_Counter, ...] = ()
    """``traffic``'s counters, in its order (set once discovery is done)."""
    published: Mapping[str, float] | None = None
    """The other counters' totals as of their last read (read with the device's slow reads)."""
    rate: float | None = None
    prev: tuple[float, float | None, float | None] | None = None
    """(time, tx bytes, rx bytes) of the previous read, for the rates."""


@dataclass
class _Device:
    name: str
    kind: str
    driver: str
    pci_bus_id: str
    numa_node: int | None
    p2p: str | None
    ports: list[_Port]
    counters: list[_Counter]
    device_totals: dict[str, float] = field(default_factory=dict)


def _kind(driver: str, link_layer: str | None) -> str:
    if driver == "efa":
        return "efa"
    if link_layer == "InfiniBand":
        return "infiniband"
    if link_layer == "Ethernet":
        return "roce"
    return "rdma"


_Known = dict[tuple[str, int | None, str], _Counter]
"""(device, port or None, file name) -> the counter read before a rediscovery (its total goes on)."""


class RdmaReader:
    """The RDMA devices of one sysfs tree; ``discover()`` then ``read(now)`` every cycle."""

    def __init__(self, sysfs: str, max_open_files: int = MAX_OPEN_FILES) -> None:
        self.sysfs = sysfs
        self.max_open_files = max_open_files
        self._devices: list[_Device] = []
        self._reads = 0
        self.skipped = 0
        """Devices, ports or files skipped at the last discovery (outside the tree, over a bound)."""

    @property
    def device_names(self) -> tuple[str, ...]:
        """Names of the devices found at the last discovery."""
        return tuple(d.name for d in self._devices)

    def discover(self) -> int:
        """(Re)build the table of devices and files, keeping the counters' totals of devices and
        files that are still there; returns the number of devices."""
        old: _Known = {
            (d.name, p.number, c.name): c
            for d in self._devices
            for p in d.ports
            for c in (*p.counters, *p.traffic.values())
        }
        old.update({(d.name, None, c.name): c for d in self._devices for c in d.counters})
        prev = {(d.name, p.number): p.prev for d in self._devices for p in d.ports}
        self.close()
        self.skipped = 0
        budget = [open_budget(self.max_open_files)]
        root = os.path.join(self.sysfs, "class", "infiniband")
        top = os.path.realpath(self.sysfs)
        entries = sorted(fsread.list_dir(root, MAX_DEVICES + 1), key=lambda e: e.name)
        if len(entries) > MAX_DEVICES:
            self.skipped += len(entries) - MAX_DEVICES
            entries = entries[:MAX_DEVICES]
        devices: list[_Device] = []
        for entry in entries:
            real = os.path.realpath(entry.path)
            if not real.startswith(top + os.sep) or not os.path.isdir(real):
                self.skipped += 1  # a link out of the tree, or not a device directory
                continue
            devices.append(self._device(label_value(entry.name), real, top, budget, old))
        for dev in devices:
            for port in dev.ports:
                port.prev = prev.get((dev.name, port.number))
        self._devices = devices
        return len(devices)

    def _device(self, name: str, real: str, top: str, budget: list[int], old: _Known) -> _Device:
        pci = os.path.realpath(os.path.join(real, "device"))
        inside = pci.startswith(top + os.sep)
        bdf = os.path.basename(pci) if inside and _BDF.match(os.path.basename(pci)) else ""
        driver = ""
        numa: int | None = None
        p2p: str | None = None
        if bdf:
            drv = os.path.realpath(os.path.join(pci, "driver"))
            driver = label_value(os.path.basename(drv)) if drv.startswith(top + os.sep) else ""
            numa_text = fsread.read_text(os.path.join(pci, "numa_node"), 64)
            numa = int(numa_text) if numa_text is not None and re.fullmatch(r"-?[0-9]{1,4}", numa_text) else None
            p2p = fsread.read_text(os.path.join(pci, "p2p"), 256)
            if p2p is None:
                p2p = fsread.read_text(os.path.join(pci, "gdr"), 64)
            p2p = label_value(p2p) if p2p is not None else None
        ports: list[_Port] = []
        port_entries = sorted(fsread.list_dir(os.path.join(real, "ports"), MAX_PORTS + 1), key=lambda e: e.name)
        for entry in port_entries[:MAX_PORTS]:
            if not entry.name.isdigit() or not entry.is_dir(follow_symlinks=False):
                continue
            ports.append(self._port(name, int(entry.name), entry.path, budget, old))
        self.skipped += max(0, len(port_entries) - MAX_PORTS)
        first_layer = next((p.link_layer for p in ports if p.link_layer), None)
        device_counters = self._counters(name, None, os.path.join(real, "hw_counters"), budget, old, {})
        # Read just now: a rediscovery between two slow reads must not drop them until the next.
        totals = {c.name: c.total * c.scale for c in device_counters}
        return _Device(name, _kind(driver, first_layer), driver, bdf, numa, p2p, ports, device_counters, totals)

    def _port(self, device: str, number: int, path: str, budget: list[int], old: _Known) -> _Port:
        port = _Port(
            number,
            _File(os.path.join(path, "state"), budget),
            _File(os.path.join(path, "phys_state"), budget),
            _File(os.path.join(path, "rate"), budget),
            fsread.read_text(os.path.join(path, "link_layer"), 64),
        )
        port.rate = _parse_rate_file(port.rate_file)
        # The kernel's port counters first (their names are the ABI), then the driver's.
        port.counters = self._counters(device, number, os.path.join(path, "counters"), budget, old, port.traffic)
        port.counters += self._counters(device, number, os.path.join(path, "hw_counters"), budget, old, port.traffic)
        port.names = tuple(c.name for c in port.counters)
        port.traffic_counters = tuple(port.traffic.values())
        return port

    def _counters(
        self,
        device: str,
        port: int | None,
        path: str,
        budget: list[int],
        old: _Known,
        traffic: dict[str, _Counter],
    ) -> list[_Counter]:
        """The counters of one directory; traffic counters go to ``traffic`` (the first file of a
        key wins), the others are returned.  Only regular files that read as a number now are kept."""
        out: list[_Counter] = []
        entries = fsread.list_dir(path, MAX_COUNTERS_PER_DIR + 1)
        self.skipped += max(0, len(entries) - MAX_COUNTERS_PER_DIR)
        for entry in sorted(entries[:MAX_COUNTERS_PER_DIR], key=lambda e: e.name):
            name = label_value(entry.name)
            if name in _SETTINGS or not entry.is_file(follow_symlinks=False):
                continue
            key, scale = _TRAFFIC.get(name, (None, 1.0))
            if port is None:
                key = None  # device-level counters are never the port's traffic
            if key is not None and key in traffic:
                continue
            counter = old.get((device, port, name))
            if counter is None:
                counter = _Counter(name, _File(entry.path, budget), scale)
            else:
                counter.file = _File(entry.path, budget)
            if counter.update() is None:
                counter.file.close()  # not a number (unsupported on this hardware): not a counter
                continue
            if key is not None:
                traffic[key] = counter
            else:
                out.append(counter)
        return out

    def read(self, now: float, everything: bool = False) -> tuple[NicSample, ...]:
        """Every device's port counters and states now; ``now`` (seconds, monotonic) times the rates.

        Device ``i``'s other counters (device-level, and the ports' beyond traffic) and line rate are
        read when ``(reads + i) % SLOW_EVERY == 0``: each device once every ``SLOW_EVERY`` reads, a
        tenth of the devices on each read, so no read carries them all; in between its last values
        are reported.  ``everything`` reads them all now."""
        n = self._reads
        self._reads += 1
        return tuple(
            self._read_device(d, now, everything or (n + i) % SLOW_EVERY == 0) for i, d in enumerate(self._devices)
        )

    def _read_device(self, dev: _Device, now: float, slow: bool) -> NicSample:
        if slow:
            values = _update(dev.counters)
            dev.device_totals = {c.name: v for c, v in zip(dev.counters, values, strict=True) if v is not None}
        ports = tuple(self._read_port(p, now, slow) for p in dev.ports)
        return NicSample(
            device=dev.name,
            kind=dev.kind,
            driver=dev.driver,
            pci_bus_id=dev.pci_bus_id,
            numa_node=dev.numa_node,
            p2p=dev.p2p,
            ports=ports,
            counters=MappingProxyType(dict(dev.device_totals)),
        )

    def _read_port(self, port: _Port, now: float, slow: bool) -> NicPort:
        if slow or port.published is None:
            port.rate = _parse_rate_file(port.rate_file)
            values = _update(port.counters)
            read = dict(zip(port.names, values, strict=True))
            # A read that failed drops only that counter's series.
            counters = (
                {k: v for k, v in read.items() if v is not None} if None in values else cast(dict[str, float], read)
            )
            port.published = MappingProxyType(counters)
        state = port.state.read()
        phys = port.phys_state.read()
        traffic = dict(zip(port.traffic, _update(port.traffic_counters), strict=True))
        tx, rx = traffic.get("tx_bytes"), traffic.get("rx_bytes")
        tx_rate = rx_rate = None
        if port.prev is not None and now > port.prev[0]:
            dt = now - port.prev[0]
            if tx is not None and port.prev[1] is not None:
                tx_rate = (tx - port.prev[1]) / dt
            if rx is not None and port.prev[2] is not None:
                rx_rate = (rx - port.prev[2]) / dt
        port.prev = (now, tx, rx)
        return NicPort(
            port=port.number,
            state_id=parse_state(state),
            physical_state_id=parse_state(phys),
            rate_bytes_per_second=port.rate,
            link_layer=port.link_layer,
            tx_bytes=tx,
            rx_bytes=rx,
            tx_packets=traffic.get("tx_packets"),
            rx_packets=traffic.get("rx_packets"),
            counters=port.published,
            tx_bytes_per_second=tx_rate,
            rx_bytes_per_second=rx_rate,
        )

    def close(self) -> None:
        """Close every kept file; the reader can ``discover()`` again."""
        for dev in self._devices:
            for c in dev.counters:
                c.file.close()
            for p in dev.ports:
                p.state.close()
                p.phys_state.close()
                p.rate_file.close()
                for c in (*p.counters, *p.traffic.values()):
                    c.file.close()
