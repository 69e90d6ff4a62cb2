"""Recorded H200 GPM traces (JSON lines written by the device scripts) read back as model samples."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from exporter.model import GpmSample

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpm_traces"
"""The recorded H200 traces: one JSON-lines file per load and their manifest."""


def _load_manifest() -> dict[str, dict[str, Any]]:
    path = FIXTURES / "manifest.json"
    if not path.exists():
        return {}
    data: dict[str, dict[str, Any]] = json.loads(path.read_text())
    return data


MANIFEST = _load_manifest()
"""Load name -> its order, expected classes, start and switch times (s)."""
RECORDED = sorted(MANIFEST, key=lambda name: int(MANIFEST[name]["order"]))
"""The recorded loads in the order they ran."""


def load_phases(entry: dict[str, Any], offset: float = 0.0) -> list[tuple[float, float, str]]:
    """(start, end, expected class) per phase of a recorded load (seconds)."""
    expected = list(entry["expected"])
    start = offset + float(entry["load_started_s"])
    switch = entry.get("switch_s")
    if len(expected) == 1 or switch is None:
        return [(start, math.inf, expected[0])]
    return [(start, offset + float(switch), expected[0]), (offset + float(switch), math.inf, expected[1])]


def changes(classes: Iterable[str | None]) -> int:
    """How many times a class sequence changes."""
    seq = list(classes)
    return sum(1 for a, b in itertools.pairwise(seq) if a != b)


def settle_seconds(trace: list[tuple[float, str | None]], step_at: float, expected: str) -> float | None:
    """Seconds after ``step_at`` until the class becomes ``expected`` and stays so to the end."""
    settled: float | None = None
    for t, cls in trace:
        if t <= step_at:
            continue
        if cls == expected:
            if settled is None:
                settled = t - step_at
        else:
            settled = None
    return settled


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
