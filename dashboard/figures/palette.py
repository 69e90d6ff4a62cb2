"""The dashboard's colours: one per boundness class (the same on every page), one per kind of
advisor recommendation, and as many distinct ones as a chart has pods."""

from __future__ import annotations

import colorsys
from typing import Any

from dashboard.definitions import UNKNOWN_CLASS
from exporter.model import POD_BOUNDNESS_CLASSES

CLASS_COLORS: dict[str, str] = {
    "idle": "#9e9e9e",
    "launch": "#ff9800",
    "latency": "#ffd54f",
    "communication": "#6d4c41",
    "memory": "#1e88e5",
    "compute": "#43a047",
    "mixed": "#8e24aa",
    "transfer": "#d81b60",
    "busy": "#90a4ae",
    "shared": "#00897b",
    "unknown": "#d7ccc8",
}
"""One colour per boundness class, the same on every page (``transfer``, links busy while the
SMs idle or wait: a magenta none of the kernel classes is near; ``busy``, the coarse class of a GPU
without GPM whose limit cannot be told: a blue-grey between idle's grey and the kernel classes;
``communication``, latency-like kernels waiting on peers or the network: a brown beside latency's
yellow)."""


CLASS_ORDER = [*POD_BOUNDNESS_CLASSES, UNKNOWN_CLASS]
"""The exporter's classes (``shared``: a pod's class when several pods have processes on its leaf,
the recording rule gpulens:pod_gpu_boundness:class; a leaf itself never has it), then ``unknown``."""


RECOMMENDATION_COLORS: dict[str, str] = {
    "release": "#d62728",
    "mig": "#1f77b4",
    "time-slice": "#9467bd",
    "higher-bandwidth": "#ff7f0e",
}
"""One colour per kind of advisor recommendation (Right-sizing page)."""


def class_scale(present: set[str]) -> dict[str, Any]:
    """A colour scale of the classes ``present``: the known ones in CLASS_ORDER, then any other."""
    domain = [c for c in CLASS_ORDER if c in present] + sorted(present - set(CLASS_ORDER))
    return {"domain": domain, "range": [CLASS_COLORS.get(c, "#757575") for c in domain]}


def class_color(present: set[str]) -> dict[str, Any]:
    """Colour by boundness class, in the class colours, with the "bound by" legend."""
    return {"field": "class", "type": "nominal", "scale": class_scale(present), "legend": {"title": "bound by"}}


def distinct_colours(n: int) -> list[str]:
    """``n`` colours no two alike, for a legend of as many names (pods): hues a golden angle apart,
    every other one darker, so neighbours in the legend differ in hue and lightness."""
    out = []
    for i in range(n):
        hue = (0.58 + i * 0.381966) % 1.0
        light = 0.42 if i % 2 == 0 else 0.62
        r, g, b = colorsys.hls_to_rgb(hue, light, 0.7)
        out.append(f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}")
    return out
