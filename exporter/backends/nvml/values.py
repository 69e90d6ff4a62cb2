"""Decoding and plausibility checks of raw NVML values, shared by the NVML readers.

A value outside its plausible range is a sentinel or a glitch: it is dropped (``None``) and
counted under ``out_of_range`` in the cycle's error counts.
"""

from __future__ import annotations

import math
from typing import Any

from exporter.backends.nvml.query import NvmlQuery

NOT_AVAILABLE_U32 = 0xFFFFFFFF
"""NVML's "not available" for unsigned 32-bit answers (temperatures, GI/CI ids outside MIG)."""
MAX_POWER_WATTS = 5_000.0
MAX_TEMPERATURE_CELSIUS = 200.0
_OUT_OF_RANGE = "out_of_range"


def text(value: Any) -> str | None:
    """NVML strings arrive as ``str`` or ``bytes`` depending on the call; ``None`` stays ``None``."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def id_or_none(value: Any) -> int | None:
    """GI/CI ids are 0xFFFFFFFF (or absent) for processes outside MIG."""
    if value is None or value == NOT_AVAILABLE_U32:
        return None
    return int(value)


def percent(q: NvmlQuery, value: float | None) -> float | None:
    """NVML percent -> ratio 0..1; values outside 0..100 % are glitches, dropped and counted."""
    if value is None:
        return None
    if not 0 <= value <= 100:
        q.count(_OUT_OF_RANGE)
        return None
    return value / 100.0


def milli(q: NvmlQuery, value: float | None, maximum: float) -> float | None:
    """milli-units (mW, mJ) -> base units, dropping sentinels above ``maximum``."""
    if value is None:
        return None
    base = value / 1000.0
    if not 0 <= base <= maximum:
        q.count(_OUT_OF_RANGE)
        return None
    return base


def temperature(q: NvmlQuery, value: float | None) -> float | None:
    """Degrees Celsius, dropping NaN, the u32 sentinel and anything outside -50..200 °C."""
    if value is None:
        return None
    if math.isnan(value) or value >= NOT_AVAILABLE_U32 or not -50 <= value <= MAX_TEMPERATURE_CELSIUS:
        q.count(_OUT_OF_RANGE)
        return None
    return float(value)


def field_value(nvml: Any, entry: Any) -> float | None:
    """Decode a ``nvmlFieldValue_t`` union by its value type; ``None`` for an unknown type."""
    members = {
        nvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        nvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    }
    member = members.get(entry.valueType)
    if member is None:
        return None
    return float(getattr(entry.value, member))
