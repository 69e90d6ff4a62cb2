"""One physical GPU of an NVML session: its handle and the readers that together fill its sample."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exporter.backends.nvml.device import DeviceCore, DeviceFields, memory_info
from exporter.backends.nvml.events import XidEvents
from exporter.backends.nvml.fabric import FabricReader
from exporter.backends.nvml.gpm import GpmReader, GpmReading, GpmTracker
from exporter.backends.nvml.links import LinkReader
from exporter.backends.nvml.mig import MigDevices
from exporter.backends.nvml.processes import Processes, process_samples
from exporter.backends.nvml.query import NvmlQuery
from exporter.model import PCIE, GpuSample, LeafSample, LinkTraffic


@dataclass(frozen=True)
class ReaderOptions:
    """How the readers of every GPU pace themselves (see ``NvmlBackend`` for the reasons)."""

    clock: Callable[[], float]
    """Monotonic seconds: the end of each GPM window."""
    wall_clock: Callable[[], float]
    """Unix seconds: the start of each per-process utilisation window."""
    pcie_every: int
    energy_every: int
    slow_every: int
    gpm: bool = True
    """False (``--no-collect.gpm``): GPM is never sampled, so every leaf reads as on a GPU without it."""


class GpuReader:
    """Reads one physical GPU: identity once, then device fields, leaves, GPM and Xid every cycle
    (and, every ``slow_every`` cycles, its NVLink fabric registration).

    Built at enumeration from the GPU's handle and UUID. ``sample()`` raises ``GpuLost`` when the
    GPU stops answering; until its identity has been read completely it is read again first.
    """

    def __init__(
        self, q: NvmlQuery, index: int, handle: Any, uuid: str, tracker: GpmTracker, options: ReaderOptions
    ) -> None:
        self.index = index
        self.uuid = uuid
        self._q = q
        self._handle = handle
        self._clock = options.clock
        self._identity_read = False
        self._sampled_once = False
        self._device = DeviceFields(q, index, handle, uuid, options.energy_every, options.slow_every)
        self._links = LinkReader(q, index, handle, uuid, options.pcie_every, options.slow_every)
        self._mig = MigDevices(q, handle, uuid)
        self._processes = Processes(q, handle, uuid, options.wall_clock)
        self._gpm = GpmReader(q, tracker, handle, uuid, enabled=options.gpm)
        self._events = XidEvents(q, handle, uuid)
        self._fabric = FabricReader(q, index, handle, uuid, options.slow_every)

    def read_identity(self) -> None:
        """Static identity, PCIe link maximums, GPM support, Xid registration; done once per GPU."""
        self._device.read_identity()
        self._links.read_identity()
        self._gpm.probe()
        self._events.register()
        self._identity_read = True

    def sample(self, cycle: int) -> GpuSample:
        """This cycle's sample; ``cycle`` paces the staggered PCIe, energy and slow reads (NVLink
        errors and the fabric registration among them)."""
        if not self._identity_read:
            self.read_identity()
        now = self._clock()
        core = self._device.core(cycle)
        pcie = self._links.pcie_state(cycle)
        if core.mig_mode == "enabled":
            links = self._links.read(cycle, now, None, pcie)
            leaves = self._mig_leaves(now, pcie.capacity)
        else:
            reading = self._gpm.read(self.uuid, None, now, core.utilization_ratio)
            # GPM's first window ends at the second sample: skip the slow sampled read until then.
            first = not self._sampled_once
            links = self._links.read(cycle, now, reading, pcie, gpm_pending=first and self._gpm.supported)
            leaves = (self._whole_gpu_leaf(core, reading, links),)
        self._sampled_once = True
        nvlink_errors = self._links.nvlink_errors(cycle)  # after read(): it finds the NVLinks
        fabric = self._fabric.read(cycle)
        return self._device.sample(
            cycle, core, leaves, links, pcie, nvlink_errors, self._events.drain(), fabric, self._links.nvlink_states
        )

    @property
    def handle(self) -> Any:
        """The GPU's NVML handle."""
        return self._handle

    @property
    def gpm_supported(self) -> bool:
        """True while the GPU gives GPM windows (Hopper or later, not refused)."""
        return self._gpm.supported

    def free(self) -> None:
        """Release the NVML objects this GPU holds (its Xid event set)."""
        self._events.free()

    def _whole_gpu_leaf(
        self, core: DeviceCore, reading: GpmReading | None, links: tuple[LinkTraffic, ...]
    ) -> LeafSample:
        """The GPU as its only leaf, with its GPM window and its links."""
        listed = self._processes.on_leaf(self.uuid, self._handle)
        utilization = self._processes.utilization(frozenset(int(p.pid) for p in listed.running))
        return LeafSample(
            uuid=self.uuid,
            memory_used_bytes=core.memory[0],
            memory_total_bytes=core.memory[1],
            memory_reserved_bytes=core.memory[2],
            utilization_ratio=core.utilization_ratio,
            gpm=reading.sample if reading is not None else None,
            processes=process_samples(listed, utilization),
            links=links,
        )

    def _mig_leaves(self, now: float, pcie_capacity: float | None) -> tuple[LeafSample, ...]:
        """One leaf per MIG device present now, each with its memory, GPM window, processes and the
        PCIe traffic GPM measures for its GPU instance (the instances share the GPU's link)."""
        devices = self._mig.present()
        listed = [self._processes.on_leaf(d.mig.mig_uuid, d.handle) for d in devices]
        utilization = self._processes.utilization(frozenset(int(p.pid) for leaf in listed for p in leaf.running))
        leaves = []
        for device, processes in zip(devices, listed, strict=True):
            mig = device.mig
            used, total, reserved = memory_info(self._q, mig.mig_uuid, device.handle)
            reading = self._gpm.read(mig.mig_uuid, mig.gpu_instance_id, now)
            leaves.append(
                LeafSample(
                    uuid=self.uuid,
                    mig=mig,
                    memory_used_bytes=used,
                    memory_total_bytes=total,
                    memory_reserved_bytes=reserved,
                    gpm=reading.sample if reading is not None else None,
                    processes=process_samples(processes, utilization, mig),
                    links=_instance_links(reading, pcie_capacity),
                )
            )
        return tuple(leaves)


def _instance_links(reading: GpmReading | None, pcie_capacity: float | None) -> tuple[LinkTraffic, ...]:
    """A MIG instance's PCIe traffic from its GPU instance's GPM window, if GPM measured it."""
    if reading is None or (reading.pcie_tx_bytes_per_second is None and reading.pcie_rx_bytes_per_second is None):
        return ()
    return (
        LinkTraffic(
            PCIE,
            "gpm",
            reading.sample.window_seconds,
            reading.pcie_tx_bytes_per_second,
            reading.pcie_rx_bytes_per_second,
            pcie_capacity,
        ),
    )
