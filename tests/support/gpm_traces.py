"""Recorded H200 GPM traces (JSON lines written by the device scripts) read back as model samples."""

from __future__ import annotations

from typing import Any

from exporter.model import GpmSample


def recorded_gpm(row: dict[str, Any], window: float) -> GpmSample:
    """One recorded GPM window (a JSON line of the device scripts' traces) as the backend's sample."""
    return GpmSample(
        window_seconds=window,
        sm_active=row["sm_active"],
        sm_occupancy=row["sm_occupancy"],
        tensor_active=row["tensor"],
        fp64_active=row["fp64"],
        fp32_active=row["fp32"],
        fp16_active=row["fp16"],
        dram_active=row["dram"],
        graphics_active=row.get("graphics_util"),
    )
