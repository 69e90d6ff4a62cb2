"""The serving run's figures per phase (bench/gpu_serving_run.py), from what it recorded: the
exporter's page each second, NVML's energy counter, the engines' summaries and their scraped
counters.  Times are Unix seconds; energy joules; classes as the exporter exports them."""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

CLASS_WINDOW_S = 10.0
"""The exporter's analysis window: a phase's first seconds still show the one before."""
_BOUNDNESS = re.compile(r'^gpulens_gpu_boundness\{(?=[^}]*gpu="0")([^}]*)\}\s+(\S+)')
_POD_BOUNDNESS = re.compile(r"^gpulens_pod_gpu_boundness\{([^}]*)\}\s+(\S+)")
_BUSY = re.compile(r'^gpulens_gpu_busy_ratio\{(?=[^}]*gpu="0")[^}]*\}\s+(\S+)')
_ENERGY = re.compile(r'^gpulens_gpu_energy_joules_total\{(?=[^}]*gpu="0")[^}]*\}\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_GEN = re.compile(r"^vllm:generation_tokens_total\{[^}]*\}\s+(\S+)")


# --- what one exporter page says ------------------------------------------------------------------


def exporter_reading(text: str) -> dict[str, Any]:
    """GPU 0's class, busy ratio and energy counter, and each pod's class, from an exporter page."""
    out: dict[str, Any] = {"gpu_class": None, "busy": None, "energy_j": None, "pod_classes": {}}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = _BOUNDNESS.match(line)
        if m and float(m.group(2)) == 1.0:
            out["gpu_class"] = dict(_LABEL.findall(m.group(1))).get("class")
            continue
        m = _POD_BOUNDNESS.match(line)
        if m and float(m.group(2)) == 1.0:
            labels = dict(_LABEL.findall(m.group(1)))
            out["pod_classes"][f"{labels.get('namespace', '')}/{labels.get('pod', '')}"] = labels.get("class")
            continue
        m = _BUSY.match(line)
        if m:
            out["busy"] = float(m.group(1))
            continue
        m = _ENERGY.match(line)
        if m:
            out["energy_j"] = float(m.group(1))
    return out


def engine_generation(text: str) -> float | None:
    """``vllm:generation_tokens_total`` of an engine page (summed over its series)."""
    values = [float(m.group(1)) for line in text.splitlines() if (m := _GEN.match(line))]
    return sum(values) if values else None


def interpolate(points: list[tuple[float, float]], t: float, hold: bool = False) -> float | None:
    """Linear interpolation of sorted (time, value) points at ``t`` (clamped to the ends); with
    ``hold``, the value of the last point at or before ``t`` (a counter that moves in steps)."""
    if not points:
        return None
    times = [p[0] for p in points]
    if hold:
        i = bisect_right(times, t)
        return points[max(0, i - 1)][1]
    i = bisect_left(times, t)
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    (t0, v0), (t1, v1) = points[i - 1], points[i]
    return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def mode_after(rows: list[tuple[float, str | None]], start: float, end: float, settle: float) -> dict[str, Any]:
    """The class most often read in (start + settle, end], every class counted there, and over the
    whole phase."""
    settled = Counter(c for t, c in rows if start + settle < t <= end and c)
    whole = Counter(c for t, c in rows if start < t <= end and c)
    return {
        "class": settled.most_common(1)[0][0] if settled else None,
        "settled_counts": dict(settled),
        "all_counts": dict(whole),
    }


def phase_figures(
    phases: Sequence[Mapping[str, Any]],
    readings: Sequence[Mapping[str, Any]],
    summaries: Mapping[str, Mapping[str, Any]],
    scraped_gen: Mapping[str, list[tuple[float, float]]],
    pods: Mapping[str, str],
) -> list[dict[str, Any]]:
    """Per phase (name, start, end, engines: roles): NVML energy (else the exporter's energy
    counter, ``energy_source``) and mean power, the exporter's class
    for GPU 0 and for each engine's pod (``pods``: role -> namespace/pod) after the classifier's
    window, the mean busy ratio, each engine's own figures (``engine_phase``), the tokens generated
    and joules per generated token (all engines of the phase together)."""
    energy = [(r["t"], r["nvml_energy_j"]) for r in readings if r.get("nvml_energy_j") is not None]
    source = "nvml"
    if not energy:  # NVML's counter unreadable here: the exporter's (the same counter, read by it)
        energy = [(r["t"], r["energy_j"]) for r in readings if r.get("energy_j") is not None]
        source = "exporter"
    gpu_classes = [(r["t"], r.get("gpu_class")) for r in readings]
    out_phases = []
    for ph in phases:
        s, e = ph["start"], ph["end"]
        out = dict(ph)
        e0, e1 = interpolate(energy, s), interpolate(energy, e)
        joules = (e1 - e0) if e0 is not None and e1 is not None else None
        out["nvml_energy_j"] = joules
        out["energy_source"] = source
        out["mean_power_w"] = joules / (e - s) if joules is not None else None
        out["gpu_class"] = mode_after(gpu_classes, s, e, CLASS_WINDOW_S)
        busy = [r["busy"] for r in readings if s + CLASS_WINDOW_S < r["t"] <= e and r.get("busy") is not None]
        out["busy_ratio_mean"] = sum(busy) / len(busy) if busy else None
        out["pod_classes"] = {
            pods.get(role, role): mode_after(
                [(r["t"], r.get("pod_classes", {}).get(pods.get(role, role))) for r in readings], s, e, CLASS_WINDOW_S
            )
            for role in ph["engines"]
        }
        per_engine = {
            role: engine_phase(summaries[role], scraped_gen.get(role, []), s, e)
            for role in ph["engines"]
            if role in summaries
        }
        total = sum(x["generation_tokens"] for x in per_engine.values())
        out["engines_own"] = per_engine
        out["generation_tokens"] = total
        out["generation_tokens_per_s"] = total / (e - s)
        out["joules_per_generated_token"] = joules / total if total and joules is not None else None
        out_phases.append(out)
    return out_phases


def generation_points(summary: Mapping[str, Any]) -> tuple[list[tuple[float, float]], bool]:
    """(Unix time, generation tokens so far) of an engine, and whether they are exact steps: at the
    end of every step where its summary lists them (the counter moves there and holds in between),
    else its per-second timeline and its snapshots (to interpolate)."""
    steps = summary.get("steps") or []
    if steps:
        points = [(float(summary["start"]), 0.0)]
        total = 0.0
        for t, pre, _, dec, pre_s, dec_s in steps:
            total += pre + dec
            points.append((t + pre_s + dec_s, total))
        return sorted(points), True
    return sorted(
        [(row[0], float(row[1])) for row in summary["timeline"]]
        + [(snap["t"], float(snap["counts"]["generation_tokens"])) for snap in summary["snapshots"]]
    ), False


def engine_phase(
    summary: Mapping[str, Any], scraped_gen: list[tuple[float, float]], s: float, e: float
) -> dict[str, Any]:
    """An engine's own counts over [s, e], its ITL histogram there, and its Prometheus counter
    over the scrapes inside [s, e] against its own count between the same two instants."""
    points, stepwise = generation_points(summary)
    g0, g1 = interpolate(points, s, stepwise), interpolate(points, e, stepwise)
    gen = (g1 or 0.0) - (g0 or 0.0)
    out: dict[str, Any] = {"generation_tokens": gen, "generation_tokens_per_s": gen / (e - s)}
    snaps = summary["snapshots"]
    first = min(snaps, key=lambda x: abs(x["t"] - s))
    last = min(snaps, key=lambda x: abs(x["t"] - e))
    out["itl_snapshots_t"] = [first["t"], last["t"]]
    out["itl_bucket_bounds"] = last["counts"]["itl_bucket_bounds"]
    out["itl_bucket_counts"] = [
        b - a for a, b in zip(first["counts"]["itl_bucket_counts"], last["counts"]["itl_bucket_counts"], strict=True)
    ]
    n = sum(out["itl_bucket_counts"])
    out["itl_mean_s"] = (last["counts"]["itl_sum_s"] - first["counts"]["itl_sum_s"]) / n if n else None
    scraped = [(t, v) for t, v in scraped_gen if s <= t <= e]
    if len(scraped) >= 2:
        (ta, va), (tb, vb) = scraped[0], scraped[-1]
        own = (interpolate(points, tb, stepwise) or 0.0) - (interpolate(points, ta, stepwise) or 0.0)
        out["prometheus_check"] = {
            "from": ta,
            "to": tb,
            "scraped_tokens": vb - va,
            "own_tokens": own,
            "scraped_tokens_per_s": (vb - va) / (tb - ta),
            "ratio": (vb - va) / own if own else None,
        }
    return out
