"""GPU models and their MIG profile tables: what the advisor may recommend, with sources.

Memory of a MIG profile is the number in its name read as decimal gigabytes (``1g.18gb`` ->
18e9 bytes). That is at or below the usable memory NVIDIA lists for every profile here (e.g.
``1g.10gb`` on an H100 80GB offers 9,856 MiB = 10.3e9 bytes), so a slice is never credited with
memory it does not have. Sources:

- MIG profiles (names, memory eighths, compute sevenths): NVIDIA MIG User Guide, "Supported MIG
  Profiles", https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html
- HBM bandwidth: the datasheet figure of probes/expected.py's table (one table for the probes'
  efficiency and the advisor's "higher-bandwidth GPU"), looked up by the model's NVML name.

The A30 divides into quarters (4 compute and 4 memory slices), every other model here into
sevenths of its SMs and eighths of its memory.  For the H100 NVL (94 GB) and the A30 the
"name's number" rule was checked against the whole card the same way as for the H100 80GB: a
slice gets ~96.5 % of its share of the memory NVML reports (H100 80GB: 9,856 MiB of 81,559 / 8),
which is 12.1e9 bytes for an NVL ``1g.12gb`` and 6.2e9 for an A30 ``1g.6gb``, both at or above the
name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from probes.expected import model_bandwidth

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
    compute_total: int = COMPUTE_SLICES
    """Compute slices of the whole GPU (7; 4 on an A30)."""
    memory_total: int = MEMORY_SLICES
    """Memory slices of the whole GPU (8; 4 on an A30)."""

    @property
    def compute_fraction(self) -> float:
        """Share of the GPU's SMs, 0..1."""
        return self.compute_slices / self.compute_total

    @property
    def gpu_share(self) -> float:
        """Share of the GPU the instance takes from others, 0..1: the larger of its compute share
        and its memory share (a ``1g.35gb`` uses one compute slice but a quarter of the memory)."""
        return max(self.compute_slices / self.compute_total, self.memory_slices / self.memory_total)


@dataclass(frozen=True)
class GpuModel:
    """A GPU model the advisor knows: memory, HBM bandwidth and MIG profiles (smallest first)."""

    key: str
    """Short name used in prices and output, e.g. ``H200``."""
    memory_bytes: int
    bandwidth_bytes_per_second: float
    """Datasheet HBM bandwidth."""
    mig_profiles: tuple[MigProfile, ...]

    @property
    def compute_slices(self) -> int:
        """Compute slices of the whole GPU (its largest profile's)."""
        return self.mig_profiles[-1].compute_total

    def profile(self, name: str) -> MigProfile | None:
        """The profile called ``name`` (``3g.71gb``; a ``+me`` suffix is ignored), else None."""
        base = name.split("+", 1)[0]
        return next((p for p in self.mig_profiles if p.name == base), None)


def _profiles(
    *rows: tuple[str, int], compute_total: int = COMPUTE_SLICES, memory_total: int = MEMORY_SLICES
) -> tuple[MigProfile, ...]:
    """Profiles from (name, memory slices); compute slices and memory come from the name."""
    out = []
    for name, mem_slices in rows:
        m = _PROFILE.match(name)
        assert m, name
        out.append(MigProfile(name, int(m.group(1)), mem_slices, int(m.group(2)) * GB, compute_total, memory_total))
    return tuple(out)


_SEVENTHS_80GB = (("1g.10gb", 1), ("1g.20gb", 2), ("2g.20gb", 2), ("3g.40gb", 4), ("4g.40gb", 4), ("7g.80gb", 8))
_SEVENTHS_40GB = (("1g.5gb", 1), ("1g.10gb", 2), ("2g.10gb", 2), ("3g.20gb", 4), ("4g.20gb", 4), ("7g.40gb", 8))


def _datasheet(nvml_name: str) -> float:
    """HBM datasheet bandwidth (bytes/s) of ``nvml_name`` from probes/expected.py."""
    row = model_bandwidth(nvml_name)
    if row is None:
        raise KeyError(f"{nvml_name!r} is not in probes/expected.py")
    return row.hbm_datasheet_bytes_per_second


H200 = GpuModel(
    "H200",
    141 * GB,
    _datasheet("NVIDIA H200"),
    _profiles(("1g.18gb", 1), ("1g.35gb", 2), ("2g.35gb", 2), ("3g.71gb", 4), ("4g.71gb", 4), ("7g.141gb", 8)),
)
H100 = GpuModel("H100", 80 * GB, _datasheet("NVIDIA H100 80GB HBM3"), _profiles(*_SEVENTHS_80GB))
H100_NVL = GpuModel(
    "H100-NVL",
    94 * GB,
    _datasheet("NVIDIA H100 NVL"),
    _profiles(("1g.12gb", 1), ("1g.24gb", 2), ("2g.24gb", 2), ("3g.47gb", 4), ("4g.47gb", 4), ("7g.94gb", 8)),
)
H100_PCIE = GpuModel("H100-PCIe", 80 * GB, _datasheet("NVIDIA H100 PCIe"), _profiles(*_SEVENTHS_80GB))
A100_80GB = GpuModel("A100-80GB", 80 * GB, _datasheet("NVIDIA A100-SXM4-80GB"), _profiles(*_SEVENTHS_80GB))
A100_80GB_PCIE = GpuModel("A100-80GB-PCIe", 80 * GB, _datasheet("NVIDIA A100 80GB PCIe"), _profiles(*_SEVENTHS_80GB))
A100_40GB = GpuModel("A100-40GB", 40 * GB, _datasheet("NVIDIA A100-SXM4-40GB"), _profiles(*_SEVENTHS_40GB))
A100_40GB_PCIE = GpuModel("A100-40GB-PCIe", 40 * GB, _datasheet("NVIDIA A100-PCIE-40GB"), _profiles(*_SEVENTHS_40GB))
A30 = GpuModel(
    "A30",
    24 * GB,
    _datasheet("NVIDIA A30"),
    _profiles(("1g.6gb", 1), ("2g.12gb", 2), ("4g.24gb", 4), compute_total=4, memory_total=4),
)
MODELS: tuple[GpuModel, ...] = (
    H200,
    H100,
    H100_NVL,
    H100_PCIE,
    A100_80GB,
    A100_80GB_PCIE,
    A100_40GB,
    A100_40GB_PCIE,
    A30,
)


def model_for(name: str) -> GpuModel | None:
    """The known model for an NVML name (``NVIDIA H100 80GB HBM3``, ``NVIDIA A100-PCIE-40GB``,
    ``NVIDIA H100 NVL``, ``NVIDIA A30``); None for others (no MIG or bandwidth advice, rather
    than a guess)."""
    upper = name.upper()
    pcie = "PCIE" in upper
    if "H200" in upper:
        return H200  # SXM and NVL: the same memory, bandwidth and profiles
    if "H100" in upper:
        if "NVL" in upper:
            return H100_NVL
        return H100_PCIE if pcie else H100
    if "A100" in upper:
        if "80GB" in upper:
            return A100_80GB_PCIE if pcie else A100_80GB
        return A100_40GB_PCIE if pcie else A100_40GB
    if re.search(r"\bA30\b", upper):
        return A30
    return None


def faster_models(current: GpuModel) -> list[GpuModel]:
    """Known models with more HBM bandwidth and at least as much memory, fastest first."""
    out = [
        m
        for m in MODELS
        if m.bandwidth_bytes_per_second > current.bandwidth_bytes_per_second and m.memory_bytes >= current.memory_bytes
    ]
    return sorted(out, key=lambda m: -m.bandwidth_bytes_per_second)
