"""Expected probe bandwidth per GPU model, and the efficiency and fleet-median helpers built on it.

Efficiency is measured / *achievable* (what a healthy GPU of that model reaches with this probe),
not measured / datasheet: a healthy H200 copies well below its datasheet bandwidth, and a ratio
that reads well below 1 on a healthy GPU makes every threshold a guess. docs/probes.md gives the
figures, the reasoning and the sources; ``basis`` says whether the achievable figure was measured or assumed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PROBES: tuple[str, ...] = ("hbm_copy", "h2d", "d2h")
"""The probes, in the order they run and are reported (the ``probe`` label's values)."""
"""Probe names as exported in the ``probe`` label."""

HBM_COPY_FRACTION_H200 = 0.880
"""Probe HBM copy / datasheet on an idle H200, measured with this probe: median 4.225e12 B/s
(bytes read + written, 960 MiB buffers) over the datasheet 4.8e12 B/s; torch's copy of the same
size in the same run: 4.223e12 (docs/benchmarks.md, "Probes (H200)")."""

HBM_COPY_FRACTION_H100 = 0.906
"""Probe HBM copy / datasheet on an idle H100 SXM5 (NVIDIA H100 80GB HBM3), measured with this
probe: median 3.035e12 B/s (800 MiB buffers, 5 runs 3.031-3.038e12) over the datasheet 3.35e12
B/s; torch's copy of the same size in the same run: 3.033e12, of 4 GiB 3.048e12 (driver 580.159.04,
2026-12-07; docs/probes.md, "Measured on an H100").  The H200's fraction (0.880) would make a
healthy H100 read 1.03."""

PCIE_GEN5_X16_THEORETICAL = 16 * 32e9 * (128 / 130) / 8
"""PCIe 5.0 x16, one direction: 16 lanes x 32 GT/s with 128b/130b encoding = 63.0e9 B/s."""

PCIE_GEN5_X16_ACHIEVABLE = 55.0e9
"""Pinned host<->device copy on an H200 (gen 5 x16), measured with this probe: H2D 55.0e9,
D2H 55.1e9 B/s (24 MiB; torch 256 MiB in the same run: 55.4e9 / 55.3e9); an earlier H200
machine gave 53.6e9 / 54.2e9 (docs/h200-facts.md)."""

PCIE_GEN4_X16_THEORETICAL = PCIE_GEN5_X16_THEORETICAL / 2
PCIE_GEN4_X16_ACHIEVABLE = PCIE_GEN5_X16_ACHIEVABLE / 2
"""Gen 4 has half gen 5's signalling rate and the same encoding; assumed the same efficiency."""


@dataclass(frozen=True)
class GpuModelBandwidth:
    """Datasheet memory bandwidth and host link of one GPU model, with where the numbers come from."""

    name: str
    """The name NVML reports (``nvidia-smi --query-gpu=name``)."""
    hbm_datasheet_bytes_per_second: float
    pcie_generation: int
    """Host link generation the model is built for (x16); NVML's *current* generation is not used
    because an idle GPU drops its link to gen 1 to save power."""
    source: str
    hbm_achievable_fraction: float | None = None
    """What this probe's copy reaches of the datasheet on a healthy GPU of this model, where it
    was measured on one; ``None``: not measured, the H200's fraction is assumed (same probe, same
    copy path; replace when measured)."""

    @property
    def hbm_basis(self) -> str:
        """``measured`` where the model's own achievable fraction is known, else ``assumed``."""
        return "assumed" if self.hbm_achievable_fraction is None else "measured"

    @property
    def hbm_fraction(self) -> float:
        """The achievable fraction used: the model's own, else the H200's."""
        return HBM_COPY_FRACTION_H200 if self.hbm_achievable_fraction is None else self.hbm_achievable_fraction


@dataclass(frozen=True)
class ExpectedBandwidth:
    """What a healthy leaf should reach on one probe, in bytes per second."""

    probe: str
    datasheet_bytes_per_second: float
    achievable_bytes_per_second: float
    """The efficiency denominator."""
    basis: str
    source: str


_NVIDIA_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_NVIDIA_H100 = "https://www.nvidia.com/en-us/data-center/h100/"
_NVIDIA_A100 = "https://www.nvidia.com/en-us/data-center/a100/"
_NVIDIA_A30 = "https://www.nvidia.com/en-us/data-center/products/a30-gpu/"

MODELS: tuple[GpuModelBandwidth, ...] = (
    GpuModelBandwidth("NVIDIA H200", 4.8e12, 5, _NVIDIA_H200, HBM_COPY_FRACTION_H200),
    GpuModelBandwidth("NVIDIA H200 NVL", 4.8e12, 5, _NVIDIA_H200),
    GpuModelBandwidth("NVIDIA H100 80GB HBM3", 3.35e12, 5, _NVIDIA_H100, HBM_COPY_FRACTION_H100),
    GpuModelBandwidth("NVIDIA H100 NVL", 3.9e12, 5, _NVIDIA_H100),
    GpuModelBandwidth("NVIDIA H100 PCIe", 2.0e12, 5, _NVIDIA_H100),
    GpuModelBandwidth("NVIDIA A100-SXM4-80GB", 2.039e12, 4, _NVIDIA_A100),
    GpuModelBandwidth("NVIDIA A100 80GB PCIe", 1.935e12, 4, _NVIDIA_A100),
    GpuModelBandwidth("NVIDIA A100-SXM4-40GB", 1.555e12, 4, _NVIDIA_A100),
    GpuModelBandwidth("NVIDIA A100-PCIE-40GB", 1.555e12, 4, _NVIDIA_A100),
    GpuModelBandwidth("NVIDIA A30", 0.933e12, 4, _NVIDIA_A30),
)
"""Known models. Unknown models get no efficiency (the series is omitted)."""

BY_NAME: Mapping[str, GpuModelBandwidth] = {m.name.lower(): m for m in MODELS}


def model_bandwidth(name: str | None) -> GpuModelBandwidth | None:
    """The table row for an NVML device name (case-insensitive), or ``None`` if unknown."""
    if not name:
        return None
    return BY_NAME.get(name.strip().lower())


def expected_bandwidth(name: str | None, probe: str, memory_fraction: float = 1.0) -> ExpectedBandwidth | None:
    """Expected bandwidth of ``probe`` on a leaf of GPU model ``name``.

    ``memory_fraction`` is the leaf's share of the GPU's memory (1 for a whole GPU): a MIG
    instance owns that share of the memory slices and, approximately, of the HBM bandwidth.
    The host link is not partitioned by MIG, so h2d/d2h ignore it.
    """
    model = model_bandwidth(name)
    if model is None or probe not in PROBES:
        return None
    if probe == "hbm_copy":
        share = min(max(memory_fraction, 0.0), 1.0) or 1.0
        datasheet = model.hbm_datasheet_bytes_per_second * share
        return ExpectedBandwidth(probe, datasheet, datasheet * model.hbm_fraction, model.hbm_basis, model.source)
    gen5 = model.pcie_generation >= 5
    theoretical = PCIE_GEN5_X16_THEORETICAL if gen5 else PCIE_GEN4_X16_THEORETICAL
    achievable = PCIE_GEN5_X16_ACHIEVABLE if gen5 else PCIE_GEN4_X16_ACHIEVABLE
    basis = "measured" if gen5 else "assumed"
    return ExpectedBandwidth(probe, theoretical, achievable, basis, "PCI-SIG: 32 GT/s per lane (gen 5)")


def efficiency_ratio(
    measured_bytes_per_second: float, name: str | None, probe: str, memory_fraction: float = 1.0
) -> float | None:
    """Measured / achievable for this model (1.0 = as fast as a healthy GPU); ``None`` if unknown.

    Not clamped to 1: a value above 1 says the table is pessimistic for this GPU, which is
    worth seeing rather than hiding.
    """
    expected = expected_bandwidth(name, probe, memory_fraction)
    if expected is None or measured_bytes_per_second <= 0:
        return None
    return measured_bytes_per_second / expected.achievable_bytes_per_second
