"""The PCIe path between a GPU and a NIC, from their sysfs device paths.

``realpath <sysfs>/bus/pci/devices/<bdf>`` is the chain of PCI bridges from a root complex
(``pci0000:00``) down to the device.  As NCCL reads it, a PCIe switch counts once, at its
upstream port: walking up two levels at a time from the device (its downstream port, then the
switch's upstream port) gives the switches above it, nearest first.  Two devices then are
``PIX`` (one switch between them), ``PXB`` (several switches, no host bridge), ``PHB`` (the same
root complex), ``NODE`` (the same NUMA node) or ``SYS``.  NVML's topology calls relate GPUs to GPUs
only, so a GPU–NIC path always comes from here.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from exporter import fsread
from exporter.model import PCIE_PATHS

_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
MAX_DEPTH = 32
"""Bridges followed below a root complex; real trees are under 10 deep."""


@dataclass(frozen=True)
class PciPlace:
    """Where a PCI function sits: its root complex, the switches above it (nearest first) and its
    NUMA node (``None``: the kernel does not say, or says -1)."""

    root: str
    switches: tuple[str, ...]
    numa_node: int | None


def sysfs_bdf(nvml_bus_id: str) -> str:
    """NVML's bus ID (``00000000:18:00.0``) as sysfs spells it (``0000:18:00.0``): the kernel
    writes the domain with at least four hex digits, so a VMD domain ``00010000`` is ``10000``."""
    text = nvml_bus_id.strip().lower()
    domain, _, rest = text.partition(":")
    if re.fullmatch(r"[0-9a-f]{1,8}", domain):
        domain = f"{int(domain, 16):04x}"
    return f"{domain}:{rest}"


def place(sysfs: str, bdf: str) -> PciPlace | None:
    """The place of the PCI function ``bdf`` (sysfs spelling) in the tree under ``sysfs``;
    ``None`` when it is not there or its path leaves the tree."""
    if not _BDF.match(bdf):
        return None
    top = os.path.realpath(os.path.join(sysfs, "devices"))
    real = os.path.realpath(os.path.join(sysfs, "bus", "pci", "devices", bdf))
    if not real.startswith(top + os.sep):
        return None
    parts = real[len(top) + 1 :].split(os.sep)
    if len(parts) < 2 or not parts[0].startswith("pci") or len(parts) > MAX_DEPTH or parts[-1] != bdf:
        return None
    switches: list[str] = []
    i = len(parts) - 1 - 2
    while i >= 1 and _BDF.match(parts[i]):
        switches.append(parts[i])
        i -= 2
    numa_text = fsread.read_text(os.path.join(real, "numa_node"), 64)
    numa = int(numa_text) if numa_text is not None and re.fullmatch(r"-?[0-9]{1,4}", numa_text) else None
    return PciPlace(parts[0], tuple(switches), numa if numa is not None and numa >= 0 else None)


def path_class(a: PciPlace, b: PciPlace) -> str:
    """The path class between two places (one of ``PCIE_PATHS``)."""
    common = next((s for s in a.switches if s in b.switches), None)
    if common is not None:
        hops = a.switches.index(common) + b.switches.index(common) + 1
        return "PIX" if hops == 1 else "PXB"
    if a.root == b.root:
        return "PHB"
    if a.numa_node == b.numa_node:
        return "NODE"  # the same node, or neither says (a host without NUMA)
    return "SYS"


def nearest(paths: dict[str, str]) -> set[str]:
    """The NICs (keys) whose path class is the closest among ``paths`` (NIC -> class)."""
    if not paths:
        return set()
    best = min(PCIE_PATHS.index(p) for p in paths.values())
    return {nic for nic, p in paths.items() if PCIE_PATHS.index(p) == best}
