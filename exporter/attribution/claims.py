"""Devices held through DRA ResourceClaims: which GPU or MIG instance each one is, which are NICs,
and which are left out.

The kubelet names a claimed device by its driver, pool and device (PodResources
``dynamic_resources``); what the device *is* only its driver says, in this node's ResourceSlices
(``slices.SliceDirectory``).  A device is

- a **GPU or MIG instance** of this node when its published ``uuid`` names one (NVIDIA's driver
  ``gpu.nvidia.com`` publishes ``uuid``, and for a MIG device ``parentUUID`` and ``profile``); a
  MIG device published without its own UUID (created at allocation) is the one instance of that
  profile on its parent, when there is exactly one;
- a **NIC** of this node when its device name or published PCI bus ID is one of the node's RDMA
  devices (the network stage then joins it to the NIC's traffic);
- otherwise **left out**, and counted by driver (a ComputeDomain's IMEX channel, an FPGA).

A device of a GPU driver that resolves to no GPU here (no slice yet, a UUID this node does not
have) is counted among the unmapped device IDs with its reason, as a device plugin's would be.

Pure functions: the merge (``merge.build_allocations``) calls them with the cycle's inputs.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from exporter.attribution.deviceids import DeviceIndex, DeviceRef
from exporter.attribution.slices import SliceDirectory
from exporter.model import ClaimedDevice, ContainerDevices, SliceDevice

GPU_DRIVERS: frozenset[str] = frozenset({"gpu.nvidia.com"})
"""DRA drivers whose every device is a GPU or a MIG instance: a device of theirs that resolves
to none here is an unmapped GPU, not a device left out."""
GPU_KINDS: frozenset[str] = frozenset({"gpu", "mig"})
"""Values of a published ``type`` attribute that say the device is a GPU or a MIG instance."""
MAX_IGNORED_DRIVERS = 64
"""Distinct drivers counted by name among the devices left out; the rest count under ``other``
(a node runs a handful of DRA drivers; the bound keeps a hostile kubelet from growing a label)."""
OTHER_DRIVER = "other"
MAX_DRIVER_NAME = 63
"""A DRA driver's name is a DNS subdomain of at most 63 characters (the API server validates it)."""

NO_SLICE = "no_slice"
"""Unmapped reason: a GPU driver's claimed device that no ResourceSlice of this node publishes
(the slice source is off or failing, or the driver has not published it yet)."""
AMBIGUOUS_MIG = "ambiguous_mig"
"""Unmapped reason: a MIG device published without a UUID whose parent has no instance, or
several, of its profile."""


@dataclass(frozen=True)
class Resolved:
    """What one claimed device is: a GPU or MIG instance (``ref``), a NIC (``nic``, the IDs
    that named it), unmapped (``reason``: a GPU driver's device naming no GPU here) or left out
    (all ``None``)."""

    ref: DeviceRef | None = None
    nic: tuple[str, ...] | None = None
    reason: str | None = None


def device_id(claimed: ClaimedDevice) -> str:
    """The device as one ID, ``driver/pool/device`` (for the unmapped count's de-duplication)."""
    c = claimed.claim
    return f"{c.driver}/{c.pool}/{c.device}"


def _gpu(published: SliceDevice, index: DeviceIndex) -> DeviceRef | str:
    """The GPU or MIG instance a published device names, or why none."""
    if published.uuid:
        found = index.resolve(published.uuid.strip())
        if isinstance(found, str) or found.replica is None:
            return found
        return DeviceRef(found.uuid, found.mig_uuid)  # a UUID never names a replica
    if published.parent_uuid and published.profile:
        parent = index.resolve(published.parent_uuid.strip())
        if isinstance(parent, str):
            return parent
        matches = index.migs_with_profile(parent.uuid, published.profile)
        return DeviceRef(parent.uuid, matches[0]) if len(matches) == 1 else AMBIGUOUS_MIG
    return "unknown_shape"


def resolve(
    claimed: ClaimedDevice, slices: SliceDirectory | None, index: DeviceIndex, nic_ids: Collection[str]
) -> Resolved:
    """What ``claimed`` is on this node (see the module docstring)."""
    c = claimed.claim
    published = slices.get(c.driver, c.pool, c.device) if slices is not None else None
    gpu_like = c.driver in GPU_DRIVERS or (
        published is not None
        and (published.kind in GPU_KINDS or bool(published.uuid and index.looks_like_gpu(published.uuid)))
    )
    if gpu_like:
        if published is None:
            return Resolved(reason=NO_SLICE)
        found = _gpu(published, index)
        return Resolved(ref=found) if isinstance(found, DeviceRef) else Resolved(reason=found)
    ids = (c.device, published.pci_bus_id if published is not None else None)
    named = tuple(i for i in ids if i and _nic_key(i, nic_ids) is not None)
    if named:
        return Resolved(nic=tuple(_nic_key(i, nic_ids) or i for i in named))
    return Resolved()


def _nic_key(device_id: str, nic_ids: Collection[str]) -> str | None:
    """The spelling of ``device_id`` that ``nic_ids`` holds (as given, lower case, or with the PCI
    domain ``0000:`` added), else ``None``."""
    for key in (device_id, device_id.strip().lower(), "0000:" + device_id.strip().lower()):
        if key in nic_ids:
            return key
    return None


def nic_entry(claimed: ClaimedDevice, ids: tuple[str, ...]) -> ContainerDevices:
    """A claimed NIC as the network stage reads NIC holders: the driver stands for the resource."""
    return ContainerDevices(
        claimed.namespace, claimed.pod, claimed.container, claimed.claim.driver, ids, claimed.pod_uid
    )


def count_ignored(counts: dict[str, int], driver: str) -> None:
    """Count one device left out under its driver (bounded by ``MAX_IGNORED_DRIVERS``; a name
    longer than a driver name can be, 63 characters, counts as ``other`` too)."""
    if len(driver) > MAX_DRIVER_NAME or (driver not in counts and len(counts) >= MAX_IGNORED_DRIVERS):
        driver = OTHER_DRIVER
    counts[driver] = counts.get(driver, 0) + 1
