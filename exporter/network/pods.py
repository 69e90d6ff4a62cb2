"""Which pods hold which NICs: the kubelet's devices of non-GPU resources, resolved to RDMA devices.

The EFA device plugin (``vpc.amazonaws.com/efa``) lists the RDMA device names (``rdmap79s0``);
SR-IOV plugins list PCI addresses (``0000:4f:00.1``, each VF its own RDMA device); shared plugins
(``rdma/hca_shared_devices_a``) list IDs that name no device.  An ID naming a device or its PCI
address holds that NIC; an ID of a NIC resource naming none holds the pool (``device=""``); IDs
of other resources (hugepages-backed devices, FPGAs...) are not NICs and are left out.
"""

from __future__ import annotations

from collections.abc import Iterable

from exporter.model import ContainerDevices, NicHolder, NicSample, PodRef

NIC_RESOURCE_PREFIXES: tuple[str, ...] = ("vpc.amazonaws.com/efa", "rdma/")
"""Resources that are NICs by name: an ID of theirs that names no device is still a NIC held."""
MAX_HOLDERS = 4096
"""Holders kept per cycle (a node has a few dozen)."""


def is_nic_resource(resource: str) -> bool:
    """Whether ``resource`` is a NIC resource by its name."""
    return resource.startswith(NIC_RESOURCE_PREFIXES)


def nic_holders(nics: Iterable[NicSample], devices: Iterable[tuple[PodRef, ContainerDevices]]) -> tuple[NicHolder, ...]:
    """One holder per (container, resource, NIC), in the kubelet's order; bounded."""
    by_id: dict[str, str] = {}
    for nic in nics:
        by_id[nic.device] = nic.device
        if nic.pci_bus_id:
            by_id[nic.pci_bus_id] = nic.device
    out: dict[tuple[PodRef, str, str], NicHolder] = {}
    for ref, cd in devices:
        named = is_nic_resource(cd.resource)
        for device_id in cd.device_ids:
            key = device_id.strip().lower()
            device = by_id.get(device_id) or by_id.get(key) or by_id.get("0000:" + key)
            if device is None and not named:
                continue
            holder = NicHolder(ref, cd.resource, device or "")
            out.setdefault((ref, cd.resource, holder.device), holder)
            if len(out) >= MAX_HOLDERS:
                return tuple(out.values())
    return tuple(out.values())
