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

import collections
import contextlib
import logging
import os
import re
import resource
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, cast

from exporter import fsread
from exporter.label_values import label_value
from exporter.model import NicPort, NicSample

log = logging.getLogger(__name__)

MAX_DEVICES = 64
"""Default of ``--collect.nic.max-devices``: RDMA devices read per node.  A p5/p5en has 32 EFA
devices, a DGX 8 to 10 ConnectX ports: twice the largest real node.  Past it the most useful are kept
(``RdmaReader.discover``)."""
MAX_COUNTERS = 8192
"""Default of ``--collect.nic.max-counters``: counter files read per node, the ports' traffic
counters included.  A p5en has 32 x 34 = 1,088; a ConnectX port about 120 (the kernel's port
counters and mlx5's ``hw_counters``), 3,840 for 32 of them: about twice the largest real node, and
a page of about 0.7 MB at most from these series."""
MAX_LISTED = 65_536
"""Entries of ``class/infiniband``, and of one counter directory, looked at (name, type, link
target: no file opened).  Past it the rest are neither looked at nor counted, and the count of
left-out entries is a lower bound (logged as "at least")."""
VERIFY_FACTOR = 16
"""Past the device ceiling, the best ``VERIFY_FACTOR`` x the ceiling entries by their listing (a
link to a PCI function first, then the name) are checked (their PCI function and port states) to
choose from; the rest are left out unopened."""
MAX_PORTS = 8
"""Ports read per device (RDMA NICs have one or two)."""
MAX_COUNTERS_PER_DIR = 512
"""Counter files kept per counter directory, the first by name (mlx5 has ~100, EFA ~25)."""
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

IB_32_BIT: frozenset[str] = frozenset(
    {"port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets", "port_xmit_wait"}
)
"""Files of a port's ``counters/`` that the kernel may show 32 bits wide, from the InfiniBand
PortCounters attribute: the four data and packet counters where the adapter lacks the extended
(64-bit) set, ``port_xmit_wait`` always (docs/network.md, "Counter widths").  Every other counter
file is read as 64-bit."""
EXTENDED_MARK = "unicast_xmit_packets"
"""A file only the kernel's extended (64-bit) port counters have: where a port's ``counters/`` holds
it, its data and packet counters are 64-bit."""

OVER_LIMIT = "over_limit"
"""Dropped: past ``--collect.nic.max-devices`` or ``--collect.nic.max-counters``."""
OVER_BOUND = "over_bound"
"""Dropped: past a fixed bound of one directory (``MAX_PORTS``, ``MAX_COUNTERS_PER_DIR``)."""
OUTSIDE_TREE = "outside_tree"
"""Dropped: a ``class/infiniband`` entry that resolves outside the sysfs root or to no directory."""
DROP_REASONS: tuple[str, ...] = (OVER_LIMIT, OVER_BOUND, OUTSIDE_TREE)
DROP_KINDS: tuple[str, ...] = ("device", "port", "counter")

_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_PCI_LINK = re.compile(r"/[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]/infiniband/[^/]+/?$")
"""The target of a ``class/infiniband`` link to a device below a PCI function, as the kernel makes it
(``../../devices/pci0000:48/.../0000:4f:00.0/infiniband/rdmap79s0``)."""
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")
_ACTIVE = 4
"""``state`` of a port that carries traffic (``4: ACTIVE``)."""

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


def counter_advance(last: int, raw: int, bits: int = 64) -> int | None:
    """How much a cumulative counter read ``bits`` wide grew from ``last`` to ``raw``; ``None``: it
    did not, and stays held at ``last``.

    - Up: the difference.
    - Down, keeping at least half of ``last``: jitter (a driver summing per-queue counters, a torn
      read), never a reset, which goes to near zero.  Nothing is counted and the counter is held at
      ``last`` until it passes it again, so jitter back and forth never adds up.
    - Down toward zero, a 32-bit counter (``IB_32_BIT``) from the top quarter of its range: a wrap,
      the distance to 2**32 plus the new value.
    - Any other fall toward zero: a reset (driver reload, counters cleared) after which all of
      ``raw`` is new.  A 64-bit counter never wraps: at 400 Gb/s a byte counter takes 11 years to
      reach 2**64, so a 64-bit decrease is never taken for one.

    Integers: a float holds 53 bits, and near 2**64 would lose up to 2048 of a step."""
    if raw >= last:
        return raw - last
    if raw >= last - raw:
        return None
    if bits == 32 and 0.75 * WRAP_32 <= last < WRAP_32:
        return raw + WRAP_32 - last
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
    """A counter file and its monotonic total (an integer: a float holds 53 bits) since first read;
    ``bits``: how wide the kernel shows it (32 for ``IB_32_BIT`` files until one reads 2**32 or
    more, else 64)."""

    __slots__ = ("bits", "file", "last", "name", "scale", "total")

    def __init__(self, name: str, file: _File, scale: float = 1.0, bits: int = 64) -> None:
        self.name = name
        self.file = file
        self.scale = scale
        self.bits = bits
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
        if last is None or raw >= last:
            if last is not None:
                c.total += raw - last
            c.last = raw
            if raw >= WRAP_32:
                c.bits = 64  # a value no 32-bit counter has: this one is 64-bit
        else:
            step = counter_advance(last, raw, c.bits)
            if step is not None:  # None: jitter, held at the last value
                c.total += step
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
Dropped = Mapping[tuple[str, str], int]
"""(kind: device, port or counter; reason: one of ``DROP_REASONS``) -> items left out."""


@dataclass
class _Candidate:
    """A counter file found at discovery, not opened yet: its name, path, scale and width."""

    name: str
    path: str
    scale: float = 1.0
    bits: int = 64


@dataclass
class _PortPlan:
    number: int
    path: str
    link_layer: str | None
    traffic: dict[str, list[_Candidate]]
    """Named traffic key -> the files that may feed it, in order (the first that reads a number wins)."""
    others: list[_Candidate]
    """Its other counters: the kernel's ``counters/`` (their names are the ABI), then the driver's."""


@dataclass
class _DevicePlan:
    name: str
    bdf: str
    driver: str
    numa_node: int | None
    p2p: str | None
    ports: list[_PortPlan]
    counters: list[_Candidate]
    """Device-level counters (``hw_counters/``)."""

    @property
    def other_count(self) -> int:
        return len(self.counters) + sum(len(p.others) for p in self.ports)

    def keep_others(self, n: int) -> None:
        """Keep the first ``n`` counters besides traffic: the device's own, then each port's."""
        self.counters = self.counters[:n]
        n -= len(self.counters)
        for port in self.ports:
            port.others = port.others[: max(0, n)]
            n -= len(port.others)


def fair_shares(demands: Sequence[int], budget: int) -> list[int]:
    """Split ``budget`` among ``demands`` max-min fairly: each gets its demand or an equal share of
    what is left, whichever is smaller, so a device with few counters leaves the rest to others and
    no device is starved because it sorts last."""
    out = [0] * len(demands)
    left = max(0, budget)
    order = sorted(range(len(demands)), key=lambda i: (demands[i], i))
    for k, i in enumerate(order):
        give = min(demands[i], -(-left // (len(order) - k)))  # the remainder to the first
        out[i] = give
        left -= give
    return out


def _listing_rank(entry: os.DirEntry[str]) -> tuple[int, str]:
    """How promising a ``class/infiniband`` entry looks from its listing alone (no file opened; one
    ``readlink`` for a link): a link to a device below a PCI function (as the kernel links every real
    one) 0, another link 1, anything else 2; then its name."""
    try:
        if entry.is_symlink():
            return (0 if _PCI_LINK.search(os.readlink(entry.path)) else 1, entry.name)
    except OSError:
        pass
    return (2, entry.name)


def _port_rank(entry: os.DirEntry[str]) -> tuple[bool, int, str]:
    """Ports in number order (``1`` before ``10``); other names, and anything but a directory, after
    them (first item true: not a port)."""
    name = entry.name
    port = name.isdigit() and len(name) <= 6 and entry.is_dir(follow_symlinks=False)
    return (not port, int(name) if port else 0, name)


def _counter_rank(entry: os.DirEntry[str]) -> tuple[bool, str]:
    """Counter files by name; settings, traffic files (opened by name) and anything but a regular
    file after them (the listing's type: no system call)."""
    name = entry.name
    other = name in _SETTINGS or name in _TRAFFIC or not entry.is_file(follow_symlinks=False)
    return (other, name)


def _is_regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def counter_bits(in_ib_counters: bool, name: str, extended: bool) -> int:
    """How wide the kernel shows a counter file: 32 for ``IB_32_BIT`` files of a port's ``counters/``
    (the data and packet ones only where the extended set is absent), else 64."""
    if not in_ib_counters or name not in IB_32_BIT:
        return 64
    return 64 if extended and name != "port_xmit_wait" else 32


def _pci_function(real: str, top: str) -> tuple[str, str]:
    """The PCI address of a device directory's ``device`` link and the function's path, when it
    resolves to a PCI function inside the tree; else ("", "")."""
    pci = os.path.realpath(os.path.join(real, "device"))
    if pci.startswith(top + os.sep) and _BDF.match(os.path.basename(pci)):
        return os.path.basename(pci), pci
    return "", ""


def _has_active_port(real: str) -> bool:
    """Whether a device directory has a port whose ``state`` reads ACTIVE (at most ``MAX_PORTS``
    ports looked at)."""
    for entry in fsread.list_dir(os.path.join(real, "ports"), MAX_PORTS):
        text = fsread.read_text(os.path.join(entry.path, "state"), 64)
        if text is not None and parse_state(text.encode()) == _ACTIVE:
            return True
    return False


def _open_counters(
    device: str,
    port: int | None,
    candidates: Sequence[_Candidate],
    budget: list[int],
    old: _Known,
    first: bool = False,
) -> list[_Counter]:
    """Open ``candidates`` (the counter read before a rediscovery goes on with its total); only those
    that read as a number now are kept (``first``: stop at the first)."""
    out: list[_Counter] = []
    for cand in candidates:
        counter = old.get((device, port, cand.name))
        if counter is None:
            counter = _Counter(cand.name, _File(cand.path, budget), cand.scale, cand.bits)
        else:
            counter.file = _File(cand.path, budget)
            counter.bits = max(counter.bits, cand.bits)
        if counter.update() is None:
            counter.file.close()  # not a number (unsupported on this hardware): not a counter
            continue
        out.append(counter)
        if first:
            break
    return out


class RdmaReader:
    """The RDMA devices of one sysfs tree; ``discover()`` then ``read(now)`` every cycle.

    ``max_devices`` and ``max_counters`` bound what a node's tree can make the exporter read and
    export (``--collect.nic.max-devices``, ``--collect.nic.max-counters``); past them the most
    useful are kept and the rest counted in ``dropped``."""

    def __init__(
        self,
        sysfs: str,
        max_open_files: int = MAX_OPEN_FILES,
        max_devices: int = MAX_DEVICES,
        max_counters: int = MAX_COUNTERS,
    ) -> None:
        self.sysfs = sysfs
        self.max_open_files = max_open_files
        self.max_devices = max_devices
        self.max_counters = max_counters
        self._devices: list[_Device] = []
        self._reads = 0
        self.dropped: Dropped = MappingProxyType({})
        """Items left out at the last discovery, by (kind, reason)."""
        self.dropped_at_least = False
        """Whether a listing stopped at ``MAX_LISTED``: then ``dropped`` is a lower bound."""

    @property
    def skipped(self) -> int:
        """Devices, ports and counter files left out at the last discovery, all reasons."""
        return sum(self.dropped.values())

    @property
    def device_names(self) -> tuple[str, ...]:
        """Names of the devices found at the last discovery."""
        return tuple(d.name for d in self._devices)

    def discover(self) -> int:
        """(Re)build the table of devices and files, keeping the counters' totals of devices and
        files that are still there; returns the number of devices.

        Every entry of ``class/infiniband`` is looked at (up to ``MAX_LISTED``: its listing and link
        target, no file opened).  Past ``max_devices``, the best ``VERIFY_FACTOR`` x ``max_devices``
        by their listing are checked, and those with a PCI function, then those with an active port,
        then by name are kept: the same tree always gives the same choice.  Counters then fill
        ``max_counters``: every kept port's traffic counters first, then the others shared fairly
        among the devices (each device's own, then its ports' in order, each directory by name)."""
        old: _Known = {
            (d.name, p.number, c.name): c
            for d in self._devices
            for p in d.ports
            for c in (*p.counters, *p.traffic.values())
        }
        old.update({(d.name, None, c.name): c for d in self._devices for c in d.counters})
        prev = {(d.name, p.number): p.prev for d in self._devices for p in d.ports}
        self.close()
        dropped: collections.Counter[tuple[str, str]] = collections.Counter()
        self.dropped_at_least = False
        top = os.path.realpath(self.sysfs)
        chosen = self._choose(os.path.join(self.sysfs, "class", "infiniband"), top, dropped)
        plans = [self._plan(name, real, bdf, pci, dropped) for name, real, bdf, pci in chosen]
        self._allot(plans, dropped)
        budget = [open_budget(self.max_open_files)]
        devices = [self._build(plan, budget, old) for plan in plans]
        for dev in devices:
            for port in dev.ports:
                port.prev = prev.get((dev.name, port.number))
        self._devices = devices
        self.dropped = MappingProxyType({k: n for k, n in sorted(dropped.items()) if n})
        return len(devices)

    def _listed(
        self, path: str, keep: int, key: Callable[[os.DirEntry[str]], Any]
    ) -> tuple[list[os.DirEntry[str]], int]:
        entries, seen, more = fsread.smallest_entries(path, keep, key, MAX_LISTED)
        self.dropped_at_least |= more
        return entries, seen

    def _wanted(
        self, path: str, keep: int, rank: Callable[[os.DirEntry[str]], tuple[Any, ...]]
    ) -> tuple[list[os.DirEntry[str]], int]:
        """The first ``keep`` entries of a directory by ``rank`` whose rank starts false (the others:
        not what is looked for), and how many such entries it has (up to ``MAX_LISTED`` looked at)."""
        found = 0

        def counted(entry: os.DirEntry[str]) -> tuple[Any, ...]:
            nonlocal found
            key = rank(entry)
            found += not key[0]
            return key

        entries, _seen = self._listed(path, keep, counted)
        return [e for e in entries if not rank(e)[0]], found

    def _choose(
        self, root: str, top: str, dropped: collections.Counter[tuple[str, str]]
    ) -> list[tuple[str, str, str, str]]:
        """The devices to read: (name, real path, PCI address or "", PCI function's path), by name."""
        listed, seen = self._listed(root, VERIFY_FACTOR * self.max_devices, _listing_rank)
        found: list[tuple[str, str, str, str]] = []
        for entry in listed:
            real = os.path.realpath(entry.path)
            if not real.startswith(top + os.sep) or not os.path.isdir(real):
                dropped[("device", OUTSIDE_TREE)] += 1  # a link out of the tree, or not a device directory
                continue
            found.append((label_value(entry.name), real, *_pci_function(real, top)))
        if len(found) > self.max_devices:
            # Only past the ceiling: the port states of every candidate are read to choose.
            found.sort(key=lambda f: (f[2] == "", not _has_active_port(f[1]), f[0]))
        kept = found[: self.max_devices]
        dropped[("device", OVER_LIMIT)] += len(found) - len(kept) + seen - len(listed)
        return sorted(kept)

    def _plan(
        self, name: str, real: str, bdf: str, pci: str, dropped: collections.Counter[tuple[str, str]]
    ) -> _DevicePlan:
        driver = ""
        numa: int | None = None
        p2p: str | None = None
        if bdf:
            top = os.path.realpath(self.sysfs)
            drv = os.path.realpath(os.path.join(pci, "driver"))
            driver = label_value(os.path.basename(drv)) if drv.startswith(top + os.sep) else ""
            numa_text = fsread.read_text(os.path.join(pci, "numa_node"), 64)
            numa = int(numa_text) if numa_text is not None and re.fullmatch(r"-?[0-9]{1,4}", numa_text) else None
            p2p = fsread.read_text(os.path.join(pci, "p2p"), 256)
            if p2p is None:
                p2p = fsread.read_text(os.path.join(pci, "gdr"), 64)
            p2p = label_value(p2p) if p2p is not None else None
        ports: list[_PortPlan] = []
        port_entries, found = self._wanted(os.path.join(real, "ports"), MAX_PORTS, _port_rank)
        for entry in port_entries:
            ports.append(self._port_plan(int(entry.name), entry.path, dropped))
        dropped[("port", OVER_BOUND)] += found - len(ports)
        counters = self._listing(os.path.join(real, "hw_counters"), False, False, dropped)
        return _DevicePlan(name, bdf, driver, numa, p2p, ports, counters)

    def _port_plan(self, number: int, path: str, dropped: collections.Counter[tuple[str, str]]) -> _PortPlan:
        ib = os.path.join(path, "counters")
        extended = _is_regular(os.path.join(ib, EXTENDED_MARK))
        traffic: dict[str, list[_Candidate]] = {}
        # The kernel's port counters first (their names are the ABI), then the driver's; opened by
        # name, so a directory of thousands of files cannot push them out.
        for directory, in_ib in ((ib, True), (os.path.join(path, "hw_counters"), False)):
            for file_name, (key, scale) in _TRAFFIC.items():
                file_path = os.path.join(directory, file_name)
                if _is_regular(file_path):
                    bits = counter_bits(in_ib, file_name, extended)
                    traffic.setdefault(key, []).append(_Candidate(file_name, file_path, scale, bits))
        others = self._listing(ib, True, extended, dropped)
        others += self._listing(os.path.join(path, "hw_counters"), False, False, dropped)
        return _PortPlan(number, path, fsread.read_text(os.path.join(path, "link_layer"), 64), traffic, others)

    def _listing(
        self, path: str, in_ib: bool, extended: bool, dropped: collections.Counter[tuple[str, str]]
    ) -> list[_Candidate]:
        """The counter files of one directory besides traffic and settings, the first
        ``MAX_COUNTERS_PER_DIR`` by name (none opened yet)."""
        entries, found = self._wanted(path, MAX_COUNTERS_PER_DIR, _counter_rank)
        dropped[("counter", OVER_BOUND)] += found - len(entries)  # counter files only, not settings
        return [_Candidate(label_value(e.name), e.path, 1.0, counter_bits(in_ib, e.name, extended)) for e in entries]

    def _allot(self, plans: list[_DevicePlan], dropped: collections.Counter[tuple[str, str]]) -> None:
        """Cut the plans' counters to ``max_counters``: traffic of every port first (in device and port
        order), then the others shared fairly."""
        left = self.max_counters
        for plan in plans:
            for port in plan.ports:
                for key in list(port.traffic):
                    if left > 0:
                        left -= 1
                    else:
                        del port.traffic[key]
                        dropped[("counter", OVER_LIMIT)] += 1
        demands = [plan.other_count for plan in plans]
        for plan, demand, share in zip(plans, demands, fair_shares(demands, left), strict=True):
            if share < demand:
                plan.keep_others(share)
                dropped[("counter", OVER_LIMIT)] += demand - share

    def _build(self, plan: _DevicePlan, budget: list[int], old: _Known) -> _Device:
        ports = [self._build_port(plan.name, p, budget, old) for p in plan.ports]
        first_layer = next((p.link_layer for p in ports if p.link_layer), None)
        device_counters = _open_counters(plan.name, None, plan.counters, budget, old)
        # Read just now: a rediscovery between two slow reads must not drop them until the next.
        totals = {c.name: c.total * c.scale for c in device_counters}
        kind = _kind(plan.driver, first_layer)
        return _Device(plan.name, kind, plan.driver, plan.bdf, plan.numa_node, plan.p2p, ports, device_counters, totals)

    def _build_port(self, device: str, plan: _PortPlan, budget: list[int], old: _Known) -> _Port:
        path = plan.path
        port = _Port(
            plan.number,
            _File(os.path.join(path, "state"), budget),
            _File(os.path.join(path, "phys_state"), budget),
            _File(os.path.join(path, "rate"), budget),
            plan.link_layer,
        )
        port.rate = _parse_rate_file(port.rate_file)
        for key, candidates in plan.traffic.items():
            opened = _open_counters(device, plan.number, candidates, budget, old, first=True)
            if opened:
                port.traffic[key] = opened[0]
        port.counters = _open_counters(device, plan.number, plan.others, budget, old)
        port.names = tuple(c.name for c in port.counters)
        port.traffic_counters = tuple(port.traffic.values())
        return port

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
