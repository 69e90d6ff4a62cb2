"""PCIe and NVLink traffic of one physical GPU: bytes each way, what the link carries, and the source.

Each link's bytes come from the best source the driver has, decided per GPU and remembered:

1. **counter**: NVML's cumulative byte counters (field values ``PCIE_COUNT_TX/RX_BYTES``,
   ``NVLINK_THROUGHPUT_DATA_TX/RX`` per active link). Used only where a counter cannot wrap
   unseen within a cycle: on the H200 (driver 580) the PCIe fields are 32-bit byte counts, which
   wrap every 68 ms at Gen5 x16 line rate, so they read as noise at a 1 s cycle and are skipped.
2. **gpm**: GPM's PCIe and NVLink rates (MiB/s) over the cycle's GPM window (Hopper and later).
3. **sampled**: ``nvmlDeviceGetPcieThroughput`` (PCIe only): NVML samples a 20 ms window, and a
   call waits for it (docs/benchmarks.md, "Real H200: link reads against the commit before"), so
   it is read every ``pcie_every`` cycles, staggered by GPU index, and can miss bursty traffic
   entirely; the last resort.

NVML counts the bytes on the link, TLP headers included: a pinned copy reads more than the payload
it moves (figures: docs/boundness.md). Capacity per direction is the lane rate
NVML reports (``nvmlDeviceGetPcieSpeed``, else the generation's) x lanes x line-encoding efficiency;
for NVLink, the active links x the common link rate NVML reports.

Link health is read here too: the most the PCIe link can train to (once per GPU), beside its
current generation and width, and the NVLink data-link error counters (every ``slow_every``
cycles, on GPUs with NVLink).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from exporter.backends.nvml.gpm import GpmReading
from exporter.backends.nvml.query import NvmlQuery
from exporter.backends.nvml.values import text
from exporter.model import NVLINK, PCIE, LinkTraffic, NvLink

_log = logging.getLogger(__name__)

#: PCIe transfer rate per lane (GT/s) by generation, for drivers that do not answer the lane speed.
PCIE_GT_PER_LANE: dict[int, float] = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
_KIB = 1024
_MBPS = 1e6
_LINK_STATE_REFRESH_CYCLES = 60
"""NVLink states and speed are re-read this often (a link that trains down changes the capacity)."""
_MAX_NVLINKS = 18
"""NVLinks per GPU on Hopper (NVML_NVLINK_MAX_LINKS is larger in newer bindings; probing stops at
the first link NVML does not know)."""
_U32 = 1 << 32
NVLINK_ERROR_FIELDS: dict[str, str] = {
    "replay": "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "recovery": "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "crc_flit": "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "crc_data": "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
}
"""NVLink error kind (``model.NVLINK_ERROR_KINDS``) -> the binding's field id of its count summed
over the GPU's links: one field-values call reads all four."""


def pcie_encoding(generation: int) -> float:
    """Share of the line rate that carries TLPs: 8b/10b up to Gen2, 128b/130b Gen3-5, FLIT from Gen6."""
    if generation <= 2:
        return 8 / 10
    if generation <= 5:
        return 128 / 130
    return 242 / 256


def pcie_capacity(lane_mbps: float | None, generation: int | None, width: int | None) -> float | None:
    """Bytes/s a PCIe link carries each way: lane rate (Mb/s, or the generation's) x lanes x encoding."""
    if not generation or not width:
        return None
    rate = lane_mbps * _MBPS if lane_mbps else PCIE_GT_PER_LANE.get(generation, 0.0) * 1e9
    return rate * width * pcie_encoding(generation) / 8 if rate > 0 else None


@dataclass(frozen=True, slots=True)
class PcieState:
    """The PCIe link as it is now: generation, lanes and NVML's lane rate (Mb/s); and the most it
    can train to."""

    generation: int | None
    width: int | None
    lane_mbps: float | None
    max_generation: int | None = None
    """``nvmlDeviceGetMaxPcieLinkGeneration``: the highest generation the GPU *and* its slot (or
    switch port) support together. Not the GPU's own maximum (``nvmlDeviceGetGpuMaxPcieLinkGeneration``),
    which exceeds this in a slower slot: that link runs as fast as it can and is not degraded."""
    max_width: int | None = None
    """``nvmlDeviceGetMaxPcieLinkWidth``: the most lanes the link can train to."""

    @property
    def capacity(self) -> float | None:
        return pcie_capacity(self.lane_mbps, self.generation, self.width)


class _Counter:
    """Turns consecutive readings of cumulative counters into per-second increases."""

    __slots__ = ("_at", "_last")

    def __init__(self) -> None:
        self._last: tuple[int, ...] | None = None
        self._at = 0.0

    def rates(self, now: float, values: tuple[int, ...], wrap: int | None) -> tuple[list[float], float] | None:
        """(increase per second of each counter, window s) since the last reading; ``None`` on the
        first reading or after a restart.

        ``wrap`` is the modulus of counters that may wrap once between readings (the caller made
        sure none can wrap twice), ``None`` for counters that never wrap.
        """
        last, at = self._last, self._at
        self._last, self._at = values, now
        if last is None or len(last) != len(values) or now <= at:
            return None
        deltas = []
        for new, old in zip(values, last, strict=True):
            delta = new - old
            if delta < 0:
                if wrap is None:
                    return None  # driver reload: the counter restarted, drop this window
                delta += wrap
            deltas.append(delta)
        window = now - at
        return [d / window for d in deltas], window

    def reset(self) -> None:
        self._last = None


class LinkReader:
    """Reads one physical GPU's link traffic every cycle (see the module docstring)."""

    def __init__(self, q: NvmlQuery, index: int, handle: Any, uuid: str, pcie_every: int, slow_every: int = 1) -> None:
        self._q = q
        self._index = index
        self._handle = handle
        self._uuid = uuid
        self._pcie_every = pcie_every
        self._slow_every = slow_every
        self._width: int | None = None
        self._width_for: int | None = -1  # the generation _width was read at (-1: not yet)
        self._pcie_counter = _Counter()
        self._nvlink_counter = _Counter()
        self._nvlinks: tuple[int, ...] = ()
        self._nvlink_states: tuple[NvLink, ...] = ()
        self._nvlink_capacity: float | None = None
        self._links_read_at: int | None = None
        self._sampled: tuple[float | None, float | None] = (None, None)
        self._sampled_yet = False
        self._last_now: float | None = None
        self._lane_mbps: float | None = None
        self._lane_for: int | None = None  # the generation _lane_mbps was read at
        self._max_generation: int | None = None
        self._max_width: int | None = None
        self._nvlink_present = False  # NVML answered a state for at least one NVLink
        self._nvlink_errors: Mapping[str, int] | None = None
        self._nvlink_errors_read = False
        # Union member and width in bits of each unsigned integer field-value type.
        nvml = q.nvml
        self._widths: dict[int, tuple[str, int]] = {
            getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_INT", -1): ("uiVal", 32),
            getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_LONG", -2): ("ulVal", 64),
            getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", -3): ("ullVal", 64),
        }

    def read_identity(self) -> None:
        """The most the PCIe link can train to, generation and lanes: fixed by the GPU and its slot,
        read once per GPU (0 or NotSupported leaves it unknown)."""
        q, f, h, u = self._q, self._q.fns, self._handle, self._uuid
        self._max_generation = q.call(u, f.nvmlDeviceGetMaxPcieLinkGeneration, h) or None
        self._max_width = q.call(u, f.nvmlDeviceGetMaxPcieLinkWidth, h) or None

    # --- PCIe -----------------------------------------------------------------------------------
    def pcie_state(self, cycle: int) -> PcieState:
        """Current generation (every cycle: the link trains down at idle and up under load), and
        the lane rate and width, asked again when the generation changes; the width also every
        ``slow_every`` cycles (a cheap call, but one that changes only when a link degrades; its cost:
        docs/benchmarks.md, "Real H200: gpulens vs nvitop-exporter")."""
        q, f, h, u = self._q, self._q.fns, self._handle, self._uuid
        generation = q.call(u, f.nvmlDeviceGetCurrPcieLinkGeneration, h)
        if generation != self._lane_for:
            speed = q.call(u, f.nvmlDeviceGetPcieSpeed, h)
            self._lane_mbps = float(speed) if speed else None
            self._lane_for = generation
        if generation != self._width_for or (cycle - self._index) % self._slow_every == 0:
            self._width = q.call(u, f.nvmlDeviceGetCurrPcieLinkWidth, h)
            self._width_for = generation
        return PcieState(generation, self._width, self._lane_mbps, self._max_generation, self._max_width)

    def read(
        self, cycle: int, now: float, gpm: GpmReading | None, pcie: PcieState, gpm_pending: bool = False
    ) -> tuple[LinkTraffic, ...]:
        """This cycle's PCIe and NVLink traffic of the physical GPU (absent links omitted).

        ``gpm`` is the whole GPU's GPM window of this cycle (``None`` under MIG or without GPM);
        ``gpm_pending`` says GPM will answer from the next cycle on (its first window is not
        complete yet), so the slow sampled read is not worth making now.
        """
        window = (now - self._last_now) if self._last_now is not None and now > self._last_now else None
        self._last_now = now
        links = []
        pcie_link = self._pcie(cycle, now, window, gpm, pcie.capacity, gpm_pending)
        if pcie_link is not None:
            links.append(pcie_link)
        nvlink = self._nvlink(cycle, now, gpm)
        if nvlink is not None:
            links.append(nvlink)
        return tuple(links)

    def _pcie(
        self,
        cycle: int,
        now: float,
        window: float | None,
        gpm: GpmReading | None,
        capacity: float | None,
        gpm_pending: bool,
    ) -> LinkTraffic | None:
        counted = self._pcie_counted(now, capacity)
        if counted is not None:
            tx, rx, w = counted
            return LinkTraffic(PCIE, "counter", w, tx, rx, capacity)
        if gpm is not None and (gpm.pcie_tx_bytes_per_second is not None or gpm.pcie_rx_bytes_per_second is not None):
            return LinkTraffic(
                PCIE,
                "gpm",
                gpm.sample.window_seconds,
                gpm.pcie_tx_bytes_per_second,
                gpm.pcie_rx_bytes_per_second,
                capacity,
            )
        if gpm is None and gpm_pending:
            return None
        if not self._sampled_yet or (cycle - self._index) % self._pcie_every == 0:
            self._sampled_yet = True
            self._sampled = (self._throughput("TX"), self._throughput("RX"))
        sampled_tx, sampled_rx = self._sampled
        if sampled_tx is None and sampled_rx is None:
            return None
        # The sample stands for the whole cycle (0 s on the first cycle: nothing to integrate yet).
        return LinkTraffic(PCIE, "sampled", window or 0.0, sampled_tx, sampled_rx, capacity)

    def _pcie_counted(self, now: float, capacity: float | None) -> tuple[float, float, float] | None:
        """(tx, rx, window) from NVML's cumulative PCIe byte counters, where they can be trusted."""
        q, nvml = self._q, self._q.nvml
        if q.is_unsupported(self._uuid, "pcie_counter"):
            return None
        tx_id = getattr(nvml, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", None)
        rx_id = getattr(nvml, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", None)
        if tx_id is None or rx_id is None:
            q.unsupported.add((self._uuid, "pcie_counter"))
            return None
        values = self._fields([(tx_id, 0), (rx_id, 0)], "pcie_counter")
        if values is None:
            return None
        (tx, rx), bits = values
        # A counter usable at any cycle length up to a minute must not wrap twice between reads.
        if bits < 64:
            # A counter this narrow can wrap several times between two reads (2^32 bytes pass a
            # Gen5 x16 link in 68 ms): its increase cannot be known.
            _log.info(
                "nvml PCIe byte counters on %s are %d-bit (they wrap every %.0f ms at this link's rate); "
                "reading PCIe from GPM or throughput samples instead",
                self._uuid,
                bits,
                1000.0 * _U32 / capacity if capacity else float("nan"),
            )
            q.unsupported.add((self._uuid, "pcie_counter"))
            return None
        rates = self._pcie_counter.rates(now, (tx, rx), None)
        return (rates[0][0], rates[0][1], rates[1]) if rates is not None else None

    def _throughput(self, direction: str) -> float | None:
        nvml = self._q.nvml
        counter = nvml.NVML_PCIE_UTIL_TX_BYTES if direction == "TX" else nvml.NVML_PCIE_UTIL_RX_BYTES
        kib = self._q.call(
            self._uuid, self._q.fns.nvmlDeviceGetPcieThroughput, self._handle, counter, key=f"pcie_{direction}"
        )
        return float(kib) * _KIB if kib is not None else None

    # --- NVLink ---------------------------------------------------------------------------------
    def _nvlink(self, cycle: int, now: float, gpm: GpmReading | None) -> LinkTraffic | None:
        if self._q.is_unsupported(self._uuid, "nvlink_state"):
            return None  # a GPU without NVLink (remembered from the first answer)
        if self._links_read_at is None or cycle - self._links_read_at >= _LINK_STATE_REFRESH_CYCLES:
            self._read_link_states(cycle)
        if not self._nvlinks:
            return None
        capacity = self._nvlink_capacity
        counted = self._nvlink_counted(now, capacity)
        if counted is not None:
            tx, rx, w = counted
            return LinkTraffic(NVLINK, "counter", w, tx, rx, capacity)
        if gpm is not None and (
            gpm.nvlink_tx_bytes_per_second is not None or gpm.nvlink_rx_bytes_per_second is not None
        ):
            return LinkTraffic(
                NVLINK,
                "gpm",
                gpm.sample.window_seconds,
                gpm.nvlink_tx_bytes_per_second,
                gpm.nvlink_rx_bytes_per_second,
                capacity,
            )
        return None

    def _read_link_states(self, cycle: int) -> None:
        """Which NVLinks are active, what each reaches, and what they carry together each way."""
        q, f, h, u = self._q, self._q.fns, self._handle, self._uuid
        self._links_read_at = cycle
        active = []
        states: list[bool] = []
        for link in range(_MAX_NVLINKS):
            state = q.call(u, f.nvmlDeviceGetNvLinkState, h, link, key="nvlink_state", expect=("INVALID_ARGUMENT",))
            if state is None:
                break  # no NVLink at all (NotSupported, remembered) or past the GPU's last link
            states.append(bool(state))
            if state:
                active.append(link)
        self._nvlink_present = bool(states)
        if tuple(active) != self._nvlinks or len(states) != len(self._nvlink_states):
            self._nvlink_counter.reset()
            # What a link reaches changes only when links train or drop: asked again then.
            self._nvlink_states = tuple(
                NvLink(link, True, *self._remote(link)) if on else NvLink(link, False) for link, on in enumerate(states)
            )
        self._nvlinks = tuple(active)
        speed_id = getattr(q.nvml, "NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON", None)
        speed = None
        if active and speed_id is not None:
            values = self._fields([(speed_id, 0)], "nvlink_speed")
            speed = values[0][0] if values is not None else None
        # NVML gives the common rate of the active links in MB/s, each way.
        self._nvlink_capacity = len(active) * speed * _MBPS if speed else None

    def _remote(self, link: int) -> tuple[str | None, str | None]:
        """(what the active ``link`` reaches, the PCI bus ID at its far end); ``None`` for what NVML
        does not answer."""
        q, f, h, u, nvml = self._q, self._q.fns, self._handle, self._uuid, self._q.nvml
        kinds = {
            getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_GPU", -1): "gpu",
            getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", -2): "switch",
            getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_IBMNPU", -3): "cpu",
        }
        kind = q.call(u, f.nvmlDeviceGetNvLinkRemoteDeviceType, h, link, key="nvlink_remote_type")
        pci = q.call(u, f.nvmlDeviceGetNvLinkRemotePciInfo, h, link, key="nvlink_remote_pci")
        bus_id = text(getattr(pci, "busId", None)) if pci is not None else None
        return kinds.get(kind) if kind is not None else None, bus_id or None

    @property
    def nvlink_states(self) -> tuple[NvLink, ...]:
        """Every NVLink NVML answered a state for at the last refresh (call after :meth:`read`)."""
        return self._nvlink_states if self._nvlink_present else ()

    def _nvlink_counted(self, now: float, capacity: float | None) -> tuple[float, float, float] | None:
        """(tx, rx, window) summed over the active links from NVML's cumulative KiB counters."""
        q, nvml = self._q, self._q.nvml
        if q.is_unsupported(self._uuid, "nvlink_counter"):
            return None
        tx_id = getattr(nvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", None)
        rx_id = getattr(nvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", None)
        if tx_id is None or rx_id is None:
            q.unsupported.add((self._uuid, "nvlink_counter"))
            return None
        links = self._nvlinks
        values = self._fields([(fid, link) for link in links for fid in (tx_id, rx_id)], "nvlink_counter")
        if values is None:
            return None
        raw, bits = values
        wrap: int | None = None
        if bits < 64:
            # A 32-bit KiB counter wraps after 4 TiB: per link, at most once between two reads
            # (no link carries 4 TiB in a minute, the longest cycle).
            per_link = capacity / len(links) if capacity else None
            if per_link is None or per_link * 60.0 >= _U32 * _KIB:
                q.unsupported.add((self._uuid, "nvlink_counter"))
                return None
            wrap = _U32
        rates = self._nvlink_counter.rates(now, tuple(raw), wrap)
        if rates is None:
            return None
        per_second, window = rates
        return sum(per_second[0::2]) * _KIB, sum(per_second[1::2]) * _KIB, window

    def nvlink_errors(self, cycle: int) -> Mapping[str, int] | None:
        """NVLink data-link errors since the driver loaded, summed over the GPU's links, by kind
        (``NVLINK_ERROR_FIELDS``); read every ``slow_every`` cycles staggered by GPU index, the last
        reading in between. ``None`` on a GPU without NVLink (call after :meth:`read`, which finds
        the links) and where NVML counts none of the kinds."""
        if not self._nvlink_present:
            return None
        if not self._nvlink_errors_read or (cycle - self._index) % self._slow_every == 0:
            self._nvlink_errors_read = True
            self._nvlink_errors = self._read_nvlink_errors()
        return self._nvlink_errors

    def _read_nvlink_errors(self) -> Mapping[str, int] | None:
        """One field-values call for every kind not yet found unsupported (each kind remembered on
        its own under ``nvlink_errors_<kind>``, the whole call under ``nvlink_errors``)."""
        q, nvml, u = self._q, self._q.nvml, self._uuid
        wanted: list[tuple[str, int]] = []
        for kind, const in NVLINK_ERROR_FIELDS.items():
            field_id = getattr(nvml, const, None)
            if field_id is not None and not q.is_unsupported(u, "nvlink_errors_" + kind):
                wanted.append((kind, field_id))
        if not wanted:
            return None
        entries = q.call(
            u, q.fns.nvmlDeviceGetFieldValues, self._handle, [fid for _, fid in wanted], key="nvlink_errors"
        )
        if not entries:
            return None
        counts: dict[str, int] = {}
        for (kind, _), entry in zip(wanted, entries, strict=True):
            decoded = self._field_int(entry, "nvlink_errors_" + kind)
            if decoded is not None:
                counts[kind] = decoded[0]
        return MappingProxyType(counts) if counts else None

    # --- field values ---------------------------------------------------------------------------
    def _fields(self, ids: list[tuple[int, int]], key: str) -> tuple[list[int], int] | None:
        """Integer field values (field id, scope id) and their narrowest width in bits; ``None``
        when any of them is unavailable (NotSupported is remembered under ``key``)."""
        q = self._q
        entries = q.call(self._uuid, q.fns.nvmlDeviceGetFieldValues, self._handle, ids, key=key)
        if not entries:
            return None
        out: list[int] = []
        bits = 64
        for entry in entries:
            decoded = self._field_int(entry, key)
            if decoded is None:
                return None
            out.append(decoded[0])
            bits = min(bits, decoded[1])
        return out, bits

    def _field_int(self, entry: Any, key: str) -> tuple[int, int] | None:
        """(value, width in bits) of one unsigned integer field value; ``None`` when it failed
        (NotSupported or a non-integer type is remembered under ``key``, other errors counted)."""
        q, nvml = self._q, self._q.nvml
        code = entry.nvmlReturn
        if code != nvml.NVML_SUCCESS:
            if code == nvml.NVML_ERROR_NOT_SUPPORTED:
                q.unsupported.add((self._uuid, key))
            else:
                q.count(q.code(nvml.NVMLError(code)).lower())
            return None
        member = self._widths.get(entry.valueType)
        if member is None:
            q.unsupported.add((self._uuid, key))
            return None
        return int(getattr(entry.value, member[0])), member[1]
