"""The GPU models the serving advisor may move a model to: memory, memory bandwidth, dense BF16
tensor throughput and host link, each with its source (docs/serving.md, "GPU figures").

The models with MIG profiles (H200, H100, A100) take memory and bandwidth from the advisor's one
table (``dashboard/advisor/profiles.py``, whose bandwidth is ``probes/expected.py``'s datasheet
figure); the others are written here. Throughput is the datasheet's *dense* BF16 tensor figure
(the sparse one, twice as large, is not what a served transformer gets).
"""

from __future__ import annotations

from dataclasses import dataclass

from dashboard.advisor import profiles
from dashboard.advisor.profiles import GB, GpuModel, MigProfile

TFLOPS = 1e12
GBPS = 1e9


@dataclass(frozen=True)
class ServingGpu:
    """One GPU model as the serving roofline sees it (a whole GPU, or one MIG profile of it)."""

    key: str
    """Short name in advice and prices, e.g. ``L40S`` or ``H200 3g.71gb``."""
    memory_bytes: float
    bandwidth_bytes_per_second: float
    """Datasheet memory bandwidth (HBM or GDDR)."""
    bf16_flops: float
    """Datasheet dense BF16 tensor throughput, FLOP/s."""
    pcie_generation: int | None
    """Host link generation (x16); None where not sourced (transfer time then assumed unchanged)."""
    source: str
    price_key: str = ""
    """The key prices are looked up by (the whole model's, for a MIG profile); empty: ``key``."""
    gpu_share: float = 1.0
    """Share of a whole GPU it takes (a MIG profile's larger of compute and memory shares)."""

    @property
    def priced_as(self) -> str:
        return self.price_key or self.key


_NVIDIA_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_NVIDIA_H100 = "https://www.nvidia.com/en-us/data-center/h100/"
_NVIDIA_A100 = "https://www.nvidia.com/en-us/data-center/a100/"
_NVIDIA_L40S = "https://www.nvidia.com/en-us/data-center/l40s/"
_NVIDIA_L4 = "https://www.nvidia.com/en-us/data-center/l4/"
_NVIDIA_B200 = "https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200, per GPU)"
_A10G = "AWS G5 (A10G: 24 GB, 600 GB/s); dense BF16 tensor 70 TFLOPS as published for the A10G variant"


def _from_profiles(model: GpuModel, bf16_flops: float, pcie: int, source: str) -> ServingGpu:
    return ServingGpu(model.key, model.memory_bytes, model.bandwidth_bytes_per_second, bf16_flops, pcie, source)


H200 = _from_profiles(profiles.H200, 989 * TFLOPS, 5, _NVIDIA_H200)
H100 = _from_profiles(profiles.H100, 989 * TFLOPS, 5, _NVIDIA_H100)
A100_80GB = _from_profiles(profiles.A100_80GB, 312 * TFLOPS, 4, _NVIDIA_A100)
A100_40GB = _from_profiles(profiles.A100_40GB, 312 * TFLOPS, 4, _NVIDIA_A100)
B200 = ServingGpu("B200", 180 * GB, 8000 * GBPS, 2250 * TFLOPS, None, _NVIDIA_B200)
L40S = ServingGpu("L40S", 48 * GB, 864 * GBPS, 362 * TFLOPS, 4, _NVIDIA_L40S)
L4 = ServingGpu("L4", 24 * GB, 300 * GBPS, 121 * TFLOPS, 4, _NVIDIA_L4)
A10G = ServingGpu("A10G", 24 * GB, 600 * GBPS, 70 * TFLOPS, 4, _A10G)

WHOLE: tuple[ServingGpu, ...] = (A10G, L4, L40S, A100_40GB, A100_80GB, H100, H200, B200)
"""Every whole GPU the advisor may propose, smallest memory first."""

_MIG_MODELS: dict[str, GpuModel] = {
    g.key: m for g in WHOLE for m in profiles.MODELS if m.key == g.key and m.mig_profiles
}


def mig_slice(gpu: ServingGpu, profile: MigProfile) -> ServingGpu:
    """A MIG profile of ``gpu``: its memory, the bandwidth of its memory slices and the throughput
    of its compute slices (a slice has its share of the memory controllers and of the SMs)."""
    return ServingGpu(
        f"{gpu.key} {profile.name}",
        profile.memory_bytes,
        gpu.bandwidth_bytes_per_second * profile.memory_slices / profile.memory_total,
        gpu.bf16_flops * profile.compute_fraction,
        gpu.pcie_generation,
        gpu.source,
        price_key=gpu.key,
        gpu_share=profile.gpu_share,
    )


def candidates() -> tuple[ServingGpu, ...]:
    """Every whole GPU and every MIG profile (but the whole-GPU one) of the models that have them."""
    out = list(WHOLE)
    for gpu in WHOLE:
        model = _MIG_MODELS.get(gpu.key)
        if model:
            out += [mig_slice(gpu, p) for p in model.mig_profiles if p.gpu_share < 1.0]
    return tuple(out)


def serving_gpu_for(nvml_name: str, mig_profile: str = "") -> ServingGpu | None:
    """The table's entry for an NVML name (and MIG profile name, ``3g.71gb``), else None (no
    serving advice rather than a guess)."""
    upper = nvml_name.upper()
    found: ServingGpu | None = None
    if "B200" in upper:
        found = B200
    elif "L40S" in upper:
        found = L40S
    elif "A10G" in upper:
        found = A10G
    elif upper.replace("NVIDIA", "").strip() == "L4":
        found = L4
    else:
        model = profiles.model_for(nvml_name)
        found = next((g for g in WHOLE if model and g.key == model.key), None)
    if found is None or not mig_profile:
        return found
    model = _MIG_MODELS.get(found.key)
    profile = model.profile(mig_profile) if model else None
    return mig_slice(found, profile) if profile else None
