"""Recorded GPM traces per GPU model (JSON lines written by the device scripts) read back as model samples."""

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
FIXTURES_H100 = FIXTURES.parent / "gpm_traces_h100"
"""The same loads recorded on an H100 SXM (issue 55), in the same format."""
FIXTURES_BY_MODEL: dict[str, Path] = {"h200": FIXTURES, "h100": FIXTURES_H100}
"""Each GPU model's recorded traces; the replays run over every model's."""


def _load_manifest(folder: Path = FIXTURES) -> dict[str, dict[str, Any]]:
    path = folder / "manifest.json"
    if not path.exists():
        return {}
    data: dict[str, dict[str, Any]] = json.loads(path.read_text())
    return data


MANIFEST = _load_manifest()
"""Load name -> its order, expected classes, start and switch times (s)."""
RECORDED = sorted(MANIFEST, key=lambda name: int(MANIFEST[name]["order"]))
"""The recorded loads in the order they ran."""
MANIFESTS: dict[str, dict[str, dict[str, Any]]] = {
    m: _load_manifest(f) for m, f in FIXTURES_BY_MODEL.items() if (f / "manifest.json").exists()
}
"""Model -> its manifest (models with recorded traces)."""


def _in_order(manifest: dict[str, dict[str, Any]]) -> list[str]:
    return sorted(manifest, key=lambda name: int(manifest[name]["order"]))


RECORDED_BY_MODEL: dict[str, list[str]] = {m: _in_order(man) for m, man in MANIFESTS.items()}
"""Model -> its recorded loads in the order they ran."""
RECORDED_ALL: list[tuple[str, str]] = [(m, name) for m, names in RECORDED_BY_MODEL.items() for name in names]
"""(model, load) for every recorded trace of every model: the replays' parameters."""


def trace_path(model: str, name: str) -> Path:
    """The JSON-lines file of one model's recorded load."""
    return FIXTURES_BY_MODEL[model] / str(MANIFESTS[model][name]["file"])


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
