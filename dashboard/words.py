"""Driver and probe names in words: the one mapping every page, table, chart and sentence uses.

Clock event (throttle) reasons read as ``nvidia-smi -q`` prints them under "Clocks Event Reasons"
(``sw_power_cap`` -> "SW Power Cap"); the bandwidth probes (``probes.expected.PROBES``) by what
they copy (``hbm_copy`` -> "HBM copy (device memory)"). A label value no table knows reads with
spaces for underscores, never as the raw snake_case name.
"""

from __future__ import annotations

CLOCK_EVENT_WORDS: dict[str, str] = {
    # the exporter's reason label (exporter/backends/nvml/device.py CLOCK_EVENT_REASONS) ->
    # nvidia-smi's words, worst first: the order the Health page lists and draws them in
    "hw_thermal_slowdown": "HW Thermal Slowdown",
    "hw_power_brake_slowdown": "HW Power Brake Slowdown",
    "hw_slowdown": "HW Slowdown",
    "sw_thermal_slowdown": "SW Thermal Slowdown",
    "sw_power_cap": "SW Power Cap",
    "sync_boost": "Sync Boost",
    "display_clock_setting": "Display Clock Setting",
    "applications_clocks_setting": "Applications Clocks Setting",
    "gpu_idle": "Idle",
}
"""``gpulens_gpu_clock_event_active{reason}`` in nvidia-smi's words, the most harmful first
(hardware protection, then the driver's thermal and power limits, then settings and idling)."""

CLOCK_EVENT_MEANING: dict[str, str] = {
    "hw_thermal_slowdown": "the GPU is too hot: clocks cut hard by the hardware",
    "hw_power_brake_slowdown": "an external power brake (the system's power supply) cut the clocks",
    "hw_slowdown": "hardware slowdown: too hot or the power supply asked for it",
    "sw_thermal_slowdown": "the driver lowers clocks to keep the GPU under its temperature limit",
    "sw_power_cap": "the driver holds the GPU at its power limit: normal near full load",
    "sync_boost": "held to the clocks of its sync-boost group",
    "display_clock_setting": "held by the display clock setting",
    "applications_clocks_setting": "held by the application clock setting (an operator's choice)",
    "gpu_idle": "idle: clocks lowered by design",
}
"""What each clock event reason means, for tooltips and captions."""

PROBE_WORDS: dict[str, str] = {
    "hbm_copy": "HBM copy (device memory)",
    "h2d": "Host to device (PCIe)",
    "d2h": "Device to host (PCIe)",
}
"""The bandwidth probes (``probe`` label, probes/expected.py ``PROBES``) by what they copy."""


def _fallback(value: object) -> str:
    text = str(value or "")
    words = text.replace("_", " ").strip()
    return words[:1].upper() + words[1:] if words else text


def clock_event(reason: object) -> str:
    """A clock event reason in nvidia-smi's words (an unknown one with spaces for underscores)."""
    return CLOCK_EVENT_WORDS.get(str(reason or "")) or _fallback(reason)


def clock_event_rank(reason: object) -> int:
    """Where ``reason`` sorts among :data:`CLOCK_EVENT_WORDS` (the worst first; unknown ones last)."""
    order = list(CLOCK_EVENT_WORDS)
    key = str(reason or "")
    return order.index(key) if key in order else len(order)


def probe(name: object) -> str:
    """A bandwidth probe's name in words (an unknown one with spaces for underscores)."""
    return PROBE_WORDS.get(str(name or "")) or _fallback(name)
