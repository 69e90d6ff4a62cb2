"""GPU models and their MIG profile tables: what the advisor may recommend, with sources.

Memory of a MIG profile is the number in its name read as decimal gigabytes (``1g.18gb`` ->
18e9 bytes). That is at or below the usable memory NVIDIA lists for every profile here (e.g.
``1g.10gb`` on an H100 80GB offers 9,856 MiB = 10.3e9 bytes), so a slice is never credited with
memory it does not have. Sources:

- MIG profiles (names, memory eighths, compute sevenths): NVIDIA MIG User Guide, "Supported MIG
  Profiles", https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html
- HBM bandwidth: NVIDIA datasheets (H200 SXM 4.8 TB/s, H100 SXM 3.35 TB/s, A100 80GB SXM
  2.039 TB/s, A100 40GB 1.555 TB/s).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GB = 1_000_000_000
COMPUTE_SLICES = 7
MEMORY_SLICES = 8
_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb")


@dataclass(frozen=True)
class MigProfile:
    """One MIG GPU-instance profile of a GPU model."""

    name: str
    compute_slices: int
    """Compute slices of the 7 a GPU has (the ``Ng`` in the name)."""
    memory_slices: int
    """Memory slices of the 8 a GPU has."""
    memory_bytes: int
    """Memory the instance offers (conservative: the name's number in decimal GB)."""

    @property
    def compute_fraction(self) -> float:
        """Share of the GPU's SMs, 0..1."""
        return self.compute_slices / COMPUTE_SLICES

    @property
    def gpu_share(self) -> float:
        """Share of the GPU the instance takes from others, 0..1: the larger of its compute share
        and its memory share (a ``1g.35gb`` uses one compute slice but a quarter of the memory)."""
        return max(self.compute_slices / COMPUTE_SLICES, self.memory_slices / MEMORY_SLICES)


@dataclass(frozen=True)
class GpuModel:
    """A GPU model the advisor knows: memory, HBM bandwidth and MIG profiles (smallest first)."""

    key: str
    """Short name used in prices and output, e.g. ``H200``."""
    memory_bytes: int
    bandwidth_bytes_per_second: float
    """Datasheet HBM bandwidth."""
    mig_profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile | None:
        """The profile called ``name`` (``3g.71gb``; a ``+me`` suffix is ignored), else None."""
        base = name.split("+", 1)[0]
        return next((p for p in self.mig_profiles if p.name == base), None)


def _profiles(*rows: tuple[str, int]) -> tuple[MigProfile, ...]:
    """Profiles from (name, memory slices); compute slices and memory come from the name."""
    out = []
    for name, mem_slices in rows:
        m = _PROFILE.match(name)
        assert m, name
        out.append(MigProfile(name, int(m.group(1)), mem_slices, int(m.group(2)) * GB))
    return tuple(out)


H200 = GpuModel(
    "H200",
    141 * GB,
    4.8e12,
    _profiles(("1g.18gb", 1), ("1g.35gb", 2), ("2g.35gb", 2), ("3g.71gb", 4), ("4g.71gb", 4), ("7g.141gb", 8)),
)
H100 = GpuModel(
    "H100",
    80 * GB,
    3.35e12,
    _profiles(("1g.10gb", 1), ("1g.20gb", 2), ("2g.20gb", 2), ("3g.40gb", 4), ("4g.40gb", 4), ("7g.80gb", 8)),
)
A100_80GB = GpuModel(
    "A100-80GB",
    80 * GB,
    2.039e12,
    _profiles(("1g.10gb", 1), ("1g.20gb", 2), ("2g.20gb", 2), ("3g.40gb", 4), ("4g.40gb", 4), ("7g.80gb", 8)),
)
A100_40GB = GpuModel(
    "A100-40GB",
    40 * GB,
    1.555e12,
    _profiles(("1g.5gb", 1), ("1g.10gb", 2), ("2g.10gb", 2), ("3g.20gb", 4), ("4g.20gb", 4), ("7g.40gb", 8)),
)
MODELS: tuple[GpuModel, ...] = (H200, H100, A100_80GB, A100_40GB)


def model_for(name: str) -> GpuModel | None:
    """The known model for an NVML name (``NVIDIA H100 80GB HBM3``, ``NVIDIA A100-SXM4-40GB``).

    H100 NVL (94 GB) and H100 PCIe differ in memory or bandwidth from the SXM table and A100 PCIe
    in bandwidth; they are not in the table rather than guessed, so they get no MIG or bandwidth
    advice (None).
    """
    upper = name.upper()
    if "H200" in upper:
        return H200
    if "H100" in upper and "NVL" not in upper and "PCIE" not in upper:
        return H100
    if "A100" in upper and "PCIE" not in upper:
        return A100_80GB if "80GB" in upper else A100_40GB
    return None


def faster_models(current: GpuModel) -> list[GpuModel]:
    """Known models with more HBM bandwidth and at least as much memory, fastest first."""
    out = [
        m
        for m in MODELS
        if m.bandwidth_bytes_per_second > current.bandwidth_bytes_per_second and m.memory_bytes >= current.memory_bytes
    ]
    return sorted(out, key=lambda m: -m.bandwidth_bytes_per_second)
