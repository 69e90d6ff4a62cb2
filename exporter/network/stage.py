"""The network stage of a sampling cycle: the NIC source's latest read, the GPU–NIC paths and
GPUDirect RDMA readiness for this cycle's GPUs, and the pods holding the NICs."""

from __future__ import annotations

from exporter.model import Attribution, BackendSample, GpuNicPath, NetworkSample, NicSample, StageResult
from exporter.network import topology
from exporter.network.gdr import HostGdr, readiness
from exporter.network.pods import nic_holders
from exporter.network.source import NicSource

_PathKey = tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str, str, str | None], ...], HostGdr | None]


class NetworkStage:
    """Combines the NIC source with the cycle's GPUs and attribution; the paths are recomputed
    only when the GPUs, the NICs or the host's GPUDirect facts change (a few realpath calls)."""

    def __init__(self, source: NicSource) -> None:
        self.source = source
        self._key: _PathKey | None = None
        self._paths: tuple[GpuNicPath, ...] = ()

    def observe(
        self, sample: BackendSample, attribution: Attribution | None, now: float | None = None
    ) -> tuple[NetworkSample | None, StageResult | None]:
        """This cycle's network view and the ``nic`` stage (``None``: no RDMA device on the node);
        ``now`` is the sampler's clock (seconds), used when the source reads in this thread."""
        if not self.source.started:
            # Not started (tests, one-shot runs): read in the caller's thread, on its clock.
            self.source.read_once(now)
            reading = self.source.latest(now)
        else:
            reading = self.source.latest()
        if reading.nics is None:
            return None, reading.stage
        paths = self._paths_for(sample, reading.nics, reading.host)
        holders = nic_holders(reading.nics, attribution.other_devices) if attribution is not None else ()
        return NetworkSample(reading.nics, paths, holders, reading.dropped), reading.stage

    def _paths_for(
        self, sample: BackendSample, nics: tuple[NicSample, ...], host: HostGdr | None
    ) -> tuple[GpuNicPath, ...]:
        gpus = tuple((g.uuid, g.pci_bus_id or "") for g in sample.gpus if g.pci_bus_id)
        key: _PathKey = (gpus, tuple((n.device, n.pci_bus_id, n.kind, n.p2p) for n in nics), host)
        if key != self._key:
            self._paths = compute_paths(self.source.sysfs, gpus, nics, host)
            self._key = key
        return self._paths

    def start(self) -> None:
        """Start the source's reading thread."""
        self.source.start()

    def close(self) -> None:
        """Stop the source."""
        self.source.close()


def compute_paths(
    sysfs: str, gpus: tuple[tuple[str, str], ...], nics: tuple[NicSample, ...], host: HostGdr | None
) -> tuple[GpuNicPath, ...]:
    """Every (GPU, NIC) pair both of whose places are known: path class, nearest, readiness."""
    nic_places = {n.device: topology.place(sysfs, n.pci_bus_id) for n in nics if n.pci_bus_id}
    by_name = {n.device: n for n in nics}
    out: list[GpuNicPath] = []
    for uuid, bus_id in gpus:
        gpu_place = topology.place(sysfs, topology.sysfs_bdf(bus_id))
        if gpu_place is None:
            continue
        classes = {dev: topology.path_class(gpu_place, p) for dev, p in nic_places.items() if p is not None}
        near = topology.nearest(classes)
        for dev, path in sorted(classes.items()):
            nic = by_name[dev]
            ready, reason = readiness(host, nic.kind, nic.p2p, path) if host is not None else (False, "unknown")
            out.append(GpuNicPath(uuid, dev, path, dev in near, ready, reason))
    return tuple(out)
