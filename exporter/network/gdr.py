"""GPUDirect RDMA readiness between a GPU and a NIC (docs/network.md).

The NIC must be able to reach GPU memory — a peer-memory module, DMA-BUF from the open GPU kernel
module, or an EFA driver with an NVIDIA peer-to-peer provider — and the PCIe path must be close
enough for NCCL to use it by default (``PIX`` or ``PXB``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from exporter import fsread

PEERMEM_FILES: tuple[str, ...] = (
    "module/nvidia_peermem/version",
    "kernel/mm/memory_peers/nv_mem/version",
    "kernel/mm/memory_peers/nv_mem_nc/version",
)
"""Under sysfs: a loaded peer-memory module (NVIDIA's ``nvidia_peermem``, or the older ``nv_peer_mem``
registered as ``nv_mem`` / ``nv_mem_nc``), which lets an InfiniBand or RoCE NIC register GPU memory."""
OPEN_MODULE_MARK = "Open Kernel Module"
"""In ``<procfs>/driver/nvidia/version``: the GPU driver is the open kernel module, whose memory
NICs can import as DMA-BUF."""
CLOSE_ENOUGH = frozenset({"PIX", "PXB"})
"""Paths NCCL uses GPUDirect RDMA over by default (``NCCL_NET_GDR_LEVEL`` can widen it)."""


@dataclass(frozen=True)
class HostGdr:
    """What the host offers for GPUDirect RDMA, read once a minute by the NIC source."""

    peermem: bool
    dmabuf: bool


def host_gdr(sysfs: str, procfs: str) -> HostGdr:
    """Read the host's peer-memory modules and the GPU driver's kind."""
    peermem = any(fsread.read_text(os.path.join(sysfs, f), 256) is not None for f in PEERMEM_FILES)
    version = fsread.read_text(os.path.join(procfs, "driver", "nvidia", "version"), 4096) or ""
    return HostGdr(peermem=peermem, dmabuf=OPEN_MODULE_MARK in version)


def efa_p2p_ready(p2p: str | None) -> bool:
    """An EFA driver that can register GPU memory: its ``p2p`` provider names NVIDIA (``NVIDIA
    peermem``, ``NVIDIA``), or an older driver's ``gdr`` file reads 1."""
    text = (p2p or "").strip()
    return text == "1" or "nvidia" in text.lower()


def readiness(host: HostGdr, kind: str, p2p: str | None, path: str) -> tuple[bool, str]:
    """(ready, reason) for one GPU–NIC pair: how it is ready, or the first reason it is not."""
    if kind == "efa":
        # EFA registers GPU memory through its own p2p providers, or DMA-BUF; not ib_core peers.
        how = "efa_p2p" if efa_p2p_ready(p2p) else "dmabuf" if host.dmabuf else None
    else:
        how = "peermem" if host.peermem else "dmabuf" if host.dmabuf else None
    if how is None:
        return False, "no_peer_memory"
    if path not in CLOSE_ENOUGH:
        return False, f"path_{path.lower()}"
    return True, how
