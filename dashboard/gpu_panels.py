"""The GPU page's panels and header: which device series it draws, in which panel, in which unit and
under which names, as one table (:data:`PANELS`, :data:`ELSEWHERE`), and the pure transforms that
turn the page's one range query (``MetricSource.device_series``) into what it shows.

Every line is named in words (no metric name, no label name), counters are drawn as rates, values
are converted to the unit on the panel's axis (bytes to GiB, hertz to MHz), counts get whole-number
axes, and the info series become text (the header, the "about" line). No Streamlit here:
dashboard/views/gpu.py draws what these functions return.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from dashboard import words
from dashboard.figures import vega
from dashboard.frames.columns import col, with_cols
from dashboard.frames.jobs import where_words
from dashboard.frames.links import (
    LINK_CAPACITY,
    LINK_COUNTERS,
    LINK_GAUGES,
    LINK_INFO,
    LINK_UTILIZATION,
    TRANSFER_ACTIVE,
    leaf_words,
)
from dashboard.frames.series import counter_rate
from dashboard.frames.sharing import sharing_modes

# --- the table -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Unit:
    """How a panel's values read: ``axis`` is the unit on the axis and in the tooltip (``GiB``,
    ``MHz``, ``per hour``), ``base`` the exporter's unit of the series it takes (the catalogue's:
    ``bytes``, ``hertz``, ``ratio``; ``""`` for counts), ``scale`` what a value (a gauge's, or a
    counter's per-second rate) is multiplied by to read in ``axis``, ``fmt`` the d3 number format,
    ``whole`` a count (whole-number ticks), ``full_scale`` a share drawn 0-100 % whatever its values."""

    axis: str
    base: str
    scale: float
    fmt: str
    whole: bool = False
    full_scale: bool = False


PERCENT = Unit("% of the time", "ratio", 1.0, ".0%", full_scale=True)
SHARE = Unit("% of expected", "ratio", 1.0, ".0%")
GIB = Unit("GiB", "bytes", 1 / 2**30, ",.1f")
GBPS = Unit("GB/s", "bytes", 1e-9, ",.1~f")
WATTS = Unit("W", "watts", 1.0, ",.0f")
CELSIUS = Unit("°C", "celsius", 1.0, ",.0f")
MHZ = Unit("MHz", "hertz", 1e-6, ",.0f")
COUNT = Unit("count", "", 1.0, ",d", whole=True)
PER_HOUR = Unit("per hour", "", 3600.0, ",.3~g")
"""The units of the GPU page's panels (:class:`Unit`); a counter's panel is per hour, its rate
(per second) times 3600."""


@dataclass(frozen=True)
class Line:
    """One device series family on a panel: ``words`` name its lines in the legend; where the
    family has a label that tells its series apart (``label``: ``severity``, ``probe``), ``words``
    holds ``{}`` for that label's value in words (:data:`LABEL_WORDS`). ``counter``: a counter
    (drawn as its rate), else a gauge (drawn as it is)."""

    metric: str
    words: str
    counter: bool = False
    label: str = ""


@dataclass(frozen=True)
class Panel:
    """A chart of the GPU page: the question it answers (``group``), its title in words, the unit
    on its axis, its lines and a caption (``note``, ``""`` for none)."""

    group: str
    title: str
    unit: Unit
    lines: tuple[Line, ...]
    note: str = ""


ACTIVITY = "Utilisation and activity"
MEMORY = "Memory"
POWER = "Power, clocks and throttling"
LINKS = "Links"
ERRORS = "Errors"
PROBES = "Probes"
SHARING = "Sharing"
OTHER = "Other series"
GROUPS = (ACTIVITY, MEMORY, POWER, LINKS, ERRORS, PROBES, SHARING, OTHER)
"""The page's sections, in order: each answers one question about the GPU."""

PANELS: tuple[Panel, ...] = (
    Panel(ACTIVITY, "How busy it is", PERCENT, (
        Line("gpulens_gpu_busy_ratio", "busy (kernels or links)"),
        Line("gpulens_gpu_utilization_ratio", "GPU-Util (nvidia-smi)"),
        Line("gpulens_gpu_sm_active_ratio", "SM active"),
        Line("gpulens_gpu_sm_occupancy_ratio", "SM occupancy"),
        Line("gpulens_gpu_tensor_active_ratio", "tensor pipe active"),
        Line("gpulens_gpu_dram_active_ratio", "DRAM bandwidth used"),
        Line("gpulens_gpu_pipe_active_max_ratio", "busiest pipe active"),
        Line("gpulens_gpu_memory_utilization_ratio", "memory controller busy (nvidia-smi)"),
    ), "GPU-Util counts any kernel running; SM active and the pipes (GPM, Hopper and newer) say how much of "
       "the chip the kernels use."),
    Panel(ACTIVITY, "Which pipes work", PERCENT, (
        Line("gpulens_gpu_fp64_active_ratio", "FP64 pipe active"),
        Line("gpulens_gpu_fp32_active_ratio", "FP32 pipe active"),
        Line("gpulens_gpu_fp16_active_ratio", "FP16 pipe active"),
    )),
    Panel(ACTIVITY, "Processes running work", COUNT, (
        Line("gpulens_gpu_compute_processes", "compute processes"),
    )),
    Panel(MEMORY, "Memory used of its total", GIB, (
        Line("gpulens_gpu_memory_used_bytes", "used"),
        Line("gpulens_gpu_memory_total_bytes", "total"),
    )),
    Panel(POWER, "Power draw and its limit", WATTS, (
        Line("gpulens_gpu_power_watts", "power draw"),
        Line("gpulens_gpu_power_limit_watts", "power limit"),
    )),
    Panel(POWER, "Clocks", MHZ, (
        Line("gpulens_gpu_sm_clock_hertz", "SM clock"),
        Line("gpulens_gpu_sm_clock_max_hertz", "SM clock at most"),
        Line("gpulens_gpu_memory_clock_hertz", "memory clock"),
    )),
    Panel(POWER, "Temperatures, and the GPU's own limits", CELSIUS, (
        Line("gpulens_gpu_temperature_celsius", "GPU"),
        Line("gpulens_gpu_memory_temperature_celsius", "memory"),
        Line("gpulens_gpu_temperature_threshold_celsius", "{}", label="threshold"),
    )),
    Panel(POWER, "Fan speed", PERCENT, (
        Line("gpulens_gpu_fan_speed_ratio", "fan speed"),
    )),
    Panel(LINKS, "PCIe link: generation and lanes, now and at most", COUNT, (
        Line("gpulens_gpu_pcie_link_generation", "PCIe generation"),
        Line("gpulens_gpu_pcie_link_max_generation", "PCIe generation at most"),
        Line("gpulens_gpu_pcie_link_width", "PCIe lanes"),
        Line("gpulens_gpu_pcie_link_max_width", "PCIe lanes at most"),
    )),
    Panel(ERRORS, "Memory errors (ECC)", PER_HOUR, (
        Line("gpulens_gpu_ecc_errors_total", "{} ECC errors", counter=True, label="severity"),
    )),
    Panel(ERRORS, "Xid errors", PER_HOUR, (
        Line("gpulens_gpu_xid_errors_total", "Xid {}", counter=True, label="xid"),
    ), "Xid codes are the driver's error reports; NVIDIA's Xid catalogue says what each one means."),
    Panel(ERRORS, "Link errors", PER_HOUR, (
        Line("gpulens_gpu_pcie_replay_errors_total", "PCIe replays", counter=True),
        Line("gpulens_gpu_nvlink_errors_total", "NVLink {}", counter=True, label="kind"),
    )),
    Panel(ERRORS, "Memory rows remapped", COUNT, (
        Line("gpulens_gpu_remapped_rows", "rows remapped {}", label="cause"),
    ), "A remapped row retires a failing HBM row for a spare one; a few are normal, a growing count is not."),
    Panel(PROBES, "Probe bandwidth against a healthy GPU of its model", SHARE, (
        Line("gpulens_probe_efficiency_ratio", "{}", label="probe"),
    )),
    Panel(PROBES, "Probe bandwidth", GBPS, (
        Line("gpulens_probe_bandwidth_bytes_per_second", "{}", label="probe"),
    )),
    Panel(PROBES, "Probe runs", PER_HOUR, (
        Line("gpulens_probe_runs_total", "runs {}", counter=True, label="result"),
    )),
    Panel(SHARING, "Time-slicing: replicas and the pods holding them", COUNT, (
        Line("gpulens_gpu_sharing_replicas", "replicas advertised"),
        Line("gpulens_gpu_sharing_pods", "pods holding it"),
    )),
)  # fmt: skip
"""The GPU page's charts, in order: every device series it draws, with its legend words and unit."""

ELSEWHERE: dict[str, str] = {
    "gpulens_gpu_info": "the header and the about line (model, driver, MIG mode, PCI address)",
    "gpulens_gpu_up": "the header's state: LOST while the exporter cannot read it",
    "gpulens_mig_instance_info": "the MIG instances' names on every line (their profile)",
    "gpulens_gpu_sharing_info": "the header's sharing mode, in words",
    "gpulens_gpu_analysis_info": "the boundness section's message when there is no class",
    "gpulens_gpu_fabric_info": "the about line (NVLink fabric clique)",
    "gpulens_gpu_nvlink_link_active": "the links section, as a sentence (links up of all, which are down)",
    "gpulens_gpu_nvlink_peer_links": "the links section, as a sentence (the GPUs it reaches over NVLink)",
    "gpulens_gpu_boundness": "the boundness strip and the header's class now",
    "gpulens_gpu_clock_event_active": "the clock events strip",
    "gpulens_gpu_row_remap_pending": "the errors section, as a sentence",
    "gpulens_gpu_row_remap_failure": "the errors section, as a sentence",
    "gpulens_gpu_energy_joules_total": "the power panel's caption (energy used over the range)",
    "gpulens_probe_last_success_timestamp_seconds": "the probes' caption (when each last succeeded)",
    # integrals of a charted gauge: rate() of each is the gauge's mean, already drawn
    "gpulens_gpu_busy_seconds_total": "integral of the busy ratio (drawn)",
    "gpulens_gpu_sm_active_seconds_total": "integral of SM activity (drawn)",
    "gpulens_gpu_tensor_active_seconds_total": "integral of tensor activity (drawn)",
    "gpulens_gpu_dram_active_seconds_total": "integral of DRAM activity (drawn)",
    # the links' section (frames.links.link_panels, frames.links.link_table) draws these
    **{m: "the links' section" for m in LINK_GAUGES.values()},
    **{m: "the links' section" for m in LINK_COUNTERS.values()},
    **{m: "the links' section" for m in LINK_UTILIZATION.values()},
    **{m: "the links' section" for m in LINK_CAPACITY.values()},
    LINK_INFO: "the links' section (where the bytes are read from)",
    TRANSFER_ACTIVE: "the links' section (the larger of its two use lines)",
    # the nearest NICs' table (and the Network page) show these per GPU-NIC pair
    "gpulens_gpu_nic_path_info": "the nearest NICs' table",
    "gpulens_gpu_nic_gdr_ready": "the nearest NICs' table",
}
"""Device series the GPU page shows other than as a line of :data:`PANELS` (as text, in a strip,
in the links' or NICs' section), or leaves out on purpose (integrals of a drawn gauge), and where."""

LABEL_WORDS: dict[str, dict[str, str]] = {
    "threshold": {
        "slowdown": "slowdown limit (hardware slows the clocks)",
        "shutdown": "shutdown limit",
        "gpu_max": "GPU limit (clocks may drop below base)",
        "memory_max": "memory limit",
    },
    "severity": {"corrected": "corrected", "uncorrected": "uncorrected"},
    # every GPU's Xid series without a code, 0 from the first scrape: "no Xid", told from "not read"
    "xid": {"": "errors: none"},
    "kind": {
        "replay": "replays (a packet sent again)",
        "recovery": "recoveries (a link retrained)",
        "crc_flit": "bad flow-control units (CRC)",
        "crc_data": "bad data packets (CRC)",
    },
    "cause": {"correctable": "after correctable errors", "uncorrectable": "after uncorrectable errors"},
    "probe": words.PROBE_WORDS,
    "reason": words.CLOCK_EVENT_WORDS,
    "result": {
        "ok": "that succeeded",
        "skipped_busy": "skipped: the GPU was busy",
        "skipped_memory": "skipped: too little free memory",
        "skipped_allocated": "skipped: a pod holds the GPU",
        "skipped_exclusive": "skipped: exclusive-process mode",
        "failed": "that failed",
        "timeout": "that timed out",
    },
}
"""Label values in words, by label; a value not listed reads with spaces for its underscores."""

CLASS_WORDS: dict[str, str] = {
    "idle": "idle: no kernel ran",
    "launch": "launch-bound: kernels ran but the SMs held almost no work",
    "latency": "latency-bound: the SMs hold work, memory and pipes stay low",
    "communication": "communication-bound: waiting on peers or the network",
    "memory": "memory-bound: DRAM bandwidth limits it",
    "compute": "compute-bound: the pipes limit it",
    "mixed": "mixed: memory and compute together limit it",
    "transfer": "moving data: links busy while the SMs idle",
    "busy": "busy: kernels ran (what limits them needs GPM)",
}
"""The boundness classes (docs/boundness.md) in words."""

SHARING_WORDS: dict[str, str] = {
    "exclusive": "exclusive: one pod at a time",
    "time-slicing": "time-slicing: pods take turns",
    "mps": "MPS: processes share the SMs at once",
    "mig": "MIG: split into instances",
}
"""``gpulens_gpu_sharing_info{mode}`` in words."""

CLOCK_EVENT_WORDS: dict[str, str] = words.CLOCK_EVENT_WORDS
"""Clock event (throttle) reasons in nvidia-smi's words (dashboard/words.py, the one mapping)."""

# --- converting the page's series --------------------------------------------------------


def label_words(label: str, value: object) -> str:
    """A label's value in words (:data:`LABEL_WORDS`); an unlisted one with spaces for underscores."""
    text = str(value or "")
    return LABEL_WORDS.get(label, {}).get(text) or text.replace("_", " ")


def words_of_metric(metric: str) -> str:
    """A series family no table places (a newer exporter's), named as well as its name allows:
    ``gpulens_gpu_foo_bar_ratio`` -> ``foo bar ratio``."""
    short = metric.removeprefix("gpulens_").removeprefix("gpu_").removeprefix("probe_")
    return short.replace("_", " ").strip() or metric


def _leaf_suffix(mig_uuid: object, mig_profile: object) -> str:
    return f" [{leaf_words(mig_uuid, mig_profile)}]" if mig_uuid else ""


WHOLE_GPU = "whole GPU"
"""The small multiple of a MIG GPU's own series (GPU-Util, power...: the physical GPU's)."""


def _named(rows: pd.DataFrame, line: Line) -> tuple[list[str], list[str], list[str]]:
    """Each row's legend name: the line's words (its label's value in them), and a MIG instance's
    profile and short UUID (``rows`` has the columns :data:`NAMING` names); and apart, the line's
    words alone and its leaf (WHOLE_GPU or the MIG instance in words), for small multiples."""
    values = rows[line.label].tolist() if line.label else [""] * len(rows)
    named: dict[tuple[object, object, object], tuple[str, str, str]] = {}
    out, words, leaves = [], [], []
    for key in zip(values, rows["mig_uuid"].tolist(), rows["mig_profile"].tolist(), strict=True):
        name = named.get(key)
        if name is None:
            value, mig, profile = (_text(k) for k in key)
            base = line.words.format(label_words(line.label, value)) if "{}" in line.words else line.words
            leaf = leaf_words(mig, profile) if mig else WHOLE_GPU
            name = named[key] = (base + _leaf_suffix(mig, profile), base, leaf)
        out.append(name[0])
        words.append(name[1])
        leaves.append(name[2])
    return out, words, leaves


def _values(rows: pd.DataFrame, line: Line, unit: Unit, steps: int) -> pd.DataFrame:
    """A family's rows in the panel's unit: a counter as its rate (over ``steps`` steps), times
    the unit's scale."""
    if line.counter:
        rows = counter_rate(rows, steps=steps)
    return rows if unit.scale == 1.0 else rows.assign(value=rows["value"] * unit.scale)


@dataclass(frozen=True)
class Drawn:
    """A panel with its lines: ``lines`` is a frame of timestamp, series (the legend name), value
    (in ``panel.unit``), and for small multiples ``line`` (the series' words without its leaf)
    and ``leaf`` (WHOLE_GPU or the MIG instance in words)."""

    panel: Panel
    lines: pd.DataFrame


NAMING = ("mig_uuid", "mig_profile", *sorted({line.label for p in PANELS for line in p.lines if line.label}))
"""The labels that name a line: its leaf, and each family's own label (:attr:`Line.label`)."""


def _placed() -> dict[str, tuple[Panel, Line]]:
    return {line.metric: (panel, line) for panel in PANELS for line in panel.lines}


def panels(series: pd.DataFrame, steps: int = 1) -> list[Drawn]:
    """The GPU page's charts from ``device_series`` rows, in :data:`PANELS` order, then one per
    family neither placed nor shown elsewhere (group :data:`OTHER`, named from its name without the
    prefix); counters are rates over ``steps`` steps (sources.source.rate_steps). Panels without rows are
    left out, and so are error panels where nothing happened (:func:`errors_words` says so)."""
    if series.empty or "metric" not in series.columns:
        return []
    # only the columns that name a line: a GPU's range is thousands of rows of dozens of labels
    df = with_cols(series, NAMING)[["metric", "timestamp", "value", *NAMING]].dropna(subset=["value"])
    by_metric = {str(m): rows.drop(columns=["metric"]) for m, rows in df.groupby("metric", sort=False)}
    extra = sorted(set(by_metric) - set(_placed()) - set(ELSEWHERE))
    table = list(PANELS) + [
        Panel(OTHER, words_of_metric(m).capitalize(), Unit("", "", 1.0, ",.3~g"),
              (Line(m, words_of_metric(m), counter=m.endswith("_total")),))
        for m in extra
        if not m.startswith("gpulens_pod_")
    ]  # fmt: skip
    out = []
    for panel in table:
        stamps: list[float] = []
        names: list[str] = []
        words: list[str] = []
        leaves: list[str] = []
        values: list[float] = []
        for line in panel.lines:
            rows = by_metric.get(line.metric)
            if rows is None or rows.empty:
                continue
            rows = _values(rows, line, panel.unit, steps)
            stamps += rows["timestamp"].tolist()
            n, w, lf = _named(rows, line)
            names += n
            words += w
            leaves += lf
            values += rows["value"].tolist()
        if not values or (panel.group == ERRORS and not any(abs(v) > 0 for v in values)):
            continue
        frame = {"timestamp": stamps, "series": names, "value": values, "line": words, "leaf": leaves}
        out.append(Drawn(panel, pd.DataFrame(frame)))
    return out


def increase(counter: pd.DataFrame) -> float:
    """How much a counter's series grew over its rows (a drop is a reset: the new value counts);
    0 with fewer than two points."""
    points = counter.sort_values("timestamp")["value"].to_numpy(dtype=float)
    if len(points) < 2:
        return 0.0
    steps = points[1:] - points[:-1]
    return float((steps.clip(min=0.0) + points[1:] * (steps < 0)).sum())


def _rows(series: pd.DataFrame, metric: str) -> pd.DataFrame:
    if series.empty or "metric" not in series.columns:
        return pd.DataFrame(columns=["timestamp", "value"])
    return series[series["metric"] == metric].dropna(subset=["value"])


def _latest(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of the newest timestamp in ``rows``."""
    return rows[rows["timestamp"] == rows["timestamp"].max()] if not rows.empty else rows


def errors_words(series: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The errors section in sentences: (what happened: each error counted in the range with its
    total, rows remapped now, a remap pending or failed; the titles of the error panels whose series
    the range has and that stayed at zero)."""
    happened, quiet = [], []
    for panel in (p for p in PANELS if p.group == ERRORS):
        present = False
        nonzero = False
        for line in panel.lines:
            rows = _rows(series, line.metric)
            if rows.empty:
                continue
            present = True
            label = line.label if line.label in rows.columns else ""
            for value, part in rows.groupby(label) if label else [("", rows)]:
                n = increase(part) if line.counter else float(_latest(part)["value"].max())
                if n > 0:
                    nonzero = True
                    name = line.words.format(label_words(label, value)) if "{}" in line.words else line.words
                    happened.append(f"{_count(n)} {name} {'in the range' if line.counter else 'now'}.")
        if present and not nonzero:
            quiet.append(panel.title)
    if (_latest(_rows(series, "gpulens_gpu_row_remap_pending"))["value"] >= 0.5).any():
        happened.append("A row remap waits for a GPU reset: the spare row takes over only after one.")
    if (_latest(_rows(series, "gpulens_gpu_row_remap_failure"))["value"] >= 0.5).any():
        happened.append("A row remap failed: the GPU has no spare row left for a failing one.")
    return happened, quiet


def _count(n: float) -> str:
    return f"{n:,.0f}" if abs(n - round(n)) < 1e-9 else f"{n:,.1f}"


# --- charts --------------------------------------------------------------------------------


def _time_axis(t: pd.Series) -> dict[str, Any]:
    """A UTC time x axis, with dates once the rows span a day and seconds within half an hour."""
    span = float(t.max() - t.min()) if len(t) else 0.0
    fmt = "%m-%d %H:%M" if span > 86_400_000 else "%H:%M" if span > 1_800_000 else "%H:%M:%S"
    return {"field": "t", "type": "temporal", "scale": {"type": "utc"}, "title": None,
            "axis": {"labelExpr": f"utcFormat(datum.value, '{fmt}')", "labelOverlap": True}}  # fmt: skip


MULTIPLES_MIN_LEAVES = 2
"""Leaves (the whole GPU's own series and its MIG instances) from which a panel is drawn as small
multiples, a chart per leaf (as nvitop lists them), not every instance's lines in one chart."""


def multiples(lines: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """A panel's lines (Drawn.lines) as small multiples: per leaf (the whole GPU's own series
    first, then its MIG instances by name), its lines named by their words alone (``series`` =
    ``line``); ``[]`` where the panel has fewer than MULTIPLES_MIN_LEAVES leaves (one chart)."""
    if lines.empty or "leaf" not in lines.columns or lines["leaf"].nunique() < MULTIPLES_MIN_LEAVES:
        return []
    order = sorted(set(lines["leaf"]), key=lambda x: (x != WHOLE_GPU, x))
    return [(leaf, lines[lines["leaf"] == leaf].assign(series=lambda d: d["line"])) for leaf in order]


def lines_chart(
    lines: pd.DataFrame,
    unit: Unit,
    *,
    legend_columns: int = 3,
    names: Sequence[str] | None = None,
    legend: bool = True,
    height: int | None = None,
    label_limit: int = 320,
) -> vega.Chart:
    """A panel's lines over time (timestamp, series, value already in ``unit``): the unit on the y
    axis and in the tooltip, whole-number ticks for a count, 0-100 % for a share of the time, and a
    legend naming every line, even a single one, in a grid of ``legend_columns``. A small multiple
    passes ``names`` (every line of the panel, so that each keeps its colour in every chart),
    ``legend`` (False: none), its ``height`` (axis and legend included) and ``label_limit`` (px a
    legend label may take: a half-width chart's two columns need shorter ones)."""
    if lines.empty:
        return vega.empty_figure()
    d = lines.assign(series=lines["series"].astype(str)).sort_values("timestamp", kind="stable")
    stamps = pd.to_datetime(d["timestamp"], unit="s", utc=True)
    d = d.assign(t=(d["timestamp"].astype(float) * 1000.0).round(), time=stamps.dt.strftime("%Y-%m-%d %H:%M:%S UTC"))
    shown = list(dict.fromkeys(d["series"]))
    domain = [n for n in names if n] if names else shown
    axis: dict[str, Any] = {"format": unit.fmt}
    y: dict[str, Any] = {"field": "value", "type": "quantitative", "title": unit.axis or None, "axis": axis}
    if unit.whole:
        axis["tickMinStep"] = 1
    if unit.full_scale:
        y["scale"] = {"domain": [0, 1]}
    columns = max(1, min(len(domain), legend_columns))
    key = {"title": None, "orient": "bottom", "columns": columns, "labelLimit": label_limit}
    color: dict[str, Any] = {
        "field": "series",
        "type": "nominal",
        "sort": domain,
        "scale": {"domain": domain},
        "legend": key if legend else None,
    }
    rows_ = math.ceil(len(domain) / columns) - 1 if legend else -3
    return {
        "datasets": {vega.DATASET: vega.rows(d, ["t", "time", "series", "value"])},
        "data": {"name": vega.DATASET},
        "mark": {"type": "line", "interpolate": "step-after" if unit.whole else "linear", "point": False},
        "encoding": {
            "x": _time_axis(d["t"]),
            "y": y,
            "color": color,
            "tooltip": [
                {"field": "time"},
                {"field": "series"},
                {"field": "value", "title": unit.axis or "value", "format": unit.fmt},
            ],
        },
        "height": height if height is not None else 220 + 20 * rows_,
    }


def in_words(timeline: pd.DataFrame, label: str, words: Mapping[str, str]) -> pd.DataFrame:
    """A state timeline (frames.series.state_timeline) with its states in words."""
    return timeline.assign(**{label: [words.get(str(s), str(s).replace("_", " ")) for s in timeline[label]]})


# --- the header ----------------------------------------------------------------------------


def when(ts: float) -> str:
    """Unix seconds as ``2026-11-30 11:20:05 UTC``."""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True)
class Header:
    """What the GPU page says first, every value in words (an empty one says why): ``state`` is
    ``answering``, ``LOST`` or ``unknown``; ``banner`` the sentence under a LOST state (``""``
    otherwise)."""

    model: str
    node: str
    holder: str
    sharing: str
    state: str
    banner: str
    boundness: str
    lost: bool
    gpu: str = ""
    owner: str = ""

    @property
    def facts(self) -> dict[str, str]:
        """The header's fields by their title on the page: short facts, one value each (a MIG
        GPU's instances, each with its pod and class, are :func:`leaves_now`' table)."""
        return {"Node": self.node, "GPU": self.gpu or "index not reported", "Model": self.model,
                "State": self.state, "Held by": self.holder, "Owner": self.owner or "none",
                "Class now": self.boundness, "Sharing": self.sharing}  # fmt: skip


IDENTITY = ("name", "driver_version", "mig_mode", "pci_bus_id", "compute_capability", "node", "instance", "gpu")
"""The labels of gpulens_gpu_info (and where it is) that :func:`identity` reads."""


def identity(series: pd.DataFrame, info_now: pd.DataFrame) -> dict[str, str]:
    """The GPU's newest identity labels: from gpulens_gpu_info now, else from the range's newest."""
    rows = info_now if not info_now.empty else _latest(_rows(series, "gpulens_gpu_info"))
    if rows.empty:
        return {}
    row = rows.iloc[0]
    return {k: _text(row.get(k)) for k in IDENTITY}


HOPPER_OR_NEWER = re.compile(r"\b(GH|GB)?(H|B)\d{2,3}\b|\bB\d{3}\b|\bGB\d{3}\b")
"""Model names of GPUs with GPM (Hopper and newer), where the compute capability is not known."""


def has_gpm_hardware(identity: Mapping[str, str]) -> bool | None:
    """Whether the GPU is Hopper or newer (has GPM): its compute capability is 9.0 or more, else
    its model's name says so; None when neither is known."""
    try:
        return float(identity.get("compute_capability") or "") >= 9.0
    except ValueError:
        name = identity.get("name", "")
        return bool(HOPPER_OR_NEWER.search(name)) if name else None


def _text(value: object) -> str:
    """A label's value as text: ``""`` where a frame put together from several series has none."""
    return value if isinstance(value, str) else ""


def where_of(rows: pd.DataFrame) -> str:
    """Where the first of ``rows`` is: its node, else its exporter (``instance``); ``""`` for none."""
    if rows.empty:
        return ""
    row = rows.iloc[0]
    return where_words(_text(row.get("node")), _text(row.get("instance")))


def lost_state(series: pd.DataFrame, up_now: pd.DataFrame) -> tuple[str, str]:
    """(``answering``, ``LOST`` or ``unknown``; the banner's sentence): LOST when the exporter
    reads gpulens_gpu_up 0 for it now (``up_now``: its instant rows), or when it is not exported now
    but was in the range; the sentence says since when (the last time it answered, or was seen)."""
    up = _rows(series, "gpulens_gpu_up")
    seen_up = up[up["value"] >= 0.5]["timestamp"]
    if not up_now.empty and (up_now["value"] < 0.5).any():
        where = where_of(up_now)
        since = f"it last answered at {when(float(seen_up.max()))}" if not seen_up.empty else (
            "it did not answer at any time in the range")  # fmt: skip
        return "LOST", f"The exporter on {where} lists this GPU but cannot read it: {since}."
    if up_now.empty:
        if series.empty:
            return "unknown", ""
        last = float(series["timestamp"].max())
        return "LOST", f"This GPU is not exported now: it was last seen at {when(last)}."
    return "answering", ""


NAMES_IN_HEADER = 2
"""Most pods the header names; more read ``N pods (by instance below)``."""


def _profiles(series: pd.DataFrame) -> dict[str, str]:
    """Each MIG instance's profile (mig_uuid -> ``1g.18gb``), from the series that carry it."""
    out: dict[str, str] = {}
    for metric in ("gpulens_mig_instance_info", "gpulens_gpu_boundness", "gpulens_gpu_sm_active_ratio"):
        rows = with_cols(_rows(series, metric), ["mig_uuid", "mig_profile"])
        for m, p in zip(rows["mig_uuid"].map(_text), rows["mig_profile"].map(_text), strict=True):
            if m and p:
                out.setdefault(m, p)
    return out


def _holders(series: pd.DataFrame) -> list[tuple[str, str, str]]:
    """Who holds the GPU now: (``namespace/pod``, owner ``Kind/name`` or ``""``, leaf in words:
    ``GPU`` or the MIG instance), one per pod and leaf."""
    alloc = _latest(_rows(series, "gpulens_pod_gpu_allocation"))
    if alloc.empty:
        return []
    cols = ["namespace", "pod", "workload_kind", "workload", "mig_uuid", "mig_profile"]
    a = with_cols(alloc, cols)[cols].map(_text)
    profiles = _profiles(series)
    out = []
    for ns, pod, kind, workload, mig, profile in a.drop_duplicates(["namespace", "pod", "mig_uuid"]).itertuples(
        index=False, name=None
    ):
        leaf = leaf_words(mig, profile or profiles.get(mig, ""))
        out.append((f"{ns}/{pod}", f"{kind}/{workload}" if kind and workload else "", leaf))
    return out


def _holders_now(series: pd.DataFrame) -> tuple[str, str]:
    """The header's holder and owner, short: the pod (or two) holding it, else how many
    (``7 pods, by instance below``); its owner where one owner holds it all."""
    held = _holders(series)
    if not held:
        return "no pod holds it now", ""
    pods = list(dict.fromkeys(p for p, _, _ in held))
    owners = list(dict.fromkeys(o for _, o, _ in held))
    instances = {leaf for _, _, leaf in held} - {"GPU"}
    if len(pods) <= NAMES_IN_HEADER:
        holder = ", ".join(pods)
    else:
        holder = f"{len(pods)} pods, by instance below" if instances else f"{len(pods)} pods, listed below"
    owner = owners[0] if len(owners) == 1 and owners[0] else ("no owner (bare pod)" if owners == [""] else "")
    if len(owners) > 1:
        owner = f"{len(owners)} owners"
    return holder, owner


def leaves_now(series: pd.DataFrame) -> pd.DataFrame:
    """A MIG or shared GPU's devices now, one row each as nvitop lists them: device (``GPU`` or the
    MIG instance in words), pod(s), owner(s), class now (in words, short); an instance no pod holds
    reads ``free``. Empty for a whole GPU held by at most one pod (the header says it all)."""
    cols = ["device", "pods", "owners", "class"]
    held = _holders(series)
    classes = classes_now(series)
    mig = _latest(_rows(series, "gpulens_mig_instance_info"))
    profiles = _profiles(series)
    devices = [leaf_words(m, p or profiles.get(m, "")) for m, p in
               zip(col(mig, "mig_uuid").map(_text), col(mig, "mig_profile").map(_text), strict=True) if m]  # fmt: skip
    devices = list(dict.fromkeys([*devices, *(leaf for _, _, leaf in held), *classes]))
    if len(devices) <= 1 and len({p for p, _, _ in held}) <= 1:
        return pd.DataFrame(columns=cols)
    rows = []
    for device in sorted(devices, key=lambda x: (x != "GPU", x)):
        pods = [p for p, _, leaf in held if leaf == device]
        owners = list(dict.fromkeys(o for _, o, leaf in held if leaf == device and o))
        cls = classes.get(device, "")
        rows.append(
            {
                "device": device,
                "pods": ", ".join(pods) or "free",
                "owners": ", ".join(owners) or ("none" if pods else ""),
                "class": CLASS_WORDS.get(cls, cls).split(":")[0] if cls else "no class",
            }
        )
    return pd.DataFrame(rows, columns=cols)


def _sharing_now(series: pd.DataFrame) -> str:
    rows = _latest(_rows(series, "gpulens_gpu_sharing_info"))
    mode = sharing_modes(rows).get(str(rows["uuid"].iloc[0])) if "uuid" in rows.columns and len(rows) else None
    if not mode:
        return ""
    text = SHARING_WORDS.get(mode, mode)
    replicas = _latest(_rows(series, "gpulens_gpu_sharing_replicas"))
    pods = _latest(_rows(series, "gpulens_gpu_sharing_pods"))
    if mode == "time-slicing" and not replicas.empty:
        held = f", {_count(float(pods['value'].iloc[0]))} held" if not pods.empty else ""
        text += f" ({_count(float(replicas['value'].iloc[0]))} replicas{held})"
    return text


def classes_now(series: pd.DataFrame) -> dict[str, str]:
    """Each leaf's boundness class in the range's newest step that has one: leaf (``GPU`` or the
    MIG instance) -> class."""
    rows = _rows(series, "gpulens_gpu_boundness")
    rows = _latest(rows[rows["value"] >= 0.5]) if not rows.empty else rows
    if rows.empty:
        return {}
    r = with_cols(rows, ["class", "mig_uuid", "mig_profile"])
    profiles = _profiles(series)
    return {
        leaf_words(m, p or profiles.get(_text(m), "")): str(c)
        for c, m, p in zip(r["class"], r["mig_uuid"].map(_text), r["mig_profile"].map(_text), strict=True)
    }


def class_counts_words(classes: Mapping[str, str]) -> str:
    """A MIG GPU's classes now, counted: ``7 instances: 3 compute-bound, 2 idle, 2 memory-bound``
    (each instance's is in :func:`leaves_now`' table)."""
    counts: dict[str, int] = {}
    for c in classes.values():
        word = CLASS_WORDS.get(c, c).split(":")[0]
        counts[word] = counts.get(word, 0) + 1
    parts = ", ".join(f"{n} {w}" for w, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{len(classes)} instance{'s' if len(classes) != 1 else ''}: {parts}"


def no_class_words(series: pd.DataFrame, identity: Mapping[str, str], state: str) -> str:
    """Why the GPU has no boundness class in the range, truthfully: a GPU without GPM (its analysis
    signals, else its compute capability or model) gets only coarse classes or none; a Hopper or
    newer GPU has every class, so the exporter sent none: lost, not exported, or just started."""
    signals = {_text(s) for s in col(_rows(series, "gpulens_gpu_analysis_info"), "signals")} - {""}
    gpm = "gpm" in signals or (not signals and has_gpm_hardware(identity) is True)
    if state == "LOST":
        why = "it is lost, and nothing is known while it is"
    elif not series.empty and series["timestamp"].min() > series["timestamp"].max() - 1:
        why = "it was seen at a single step only: a class takes a full analysis window"
    else:
        why = "the exporter may have just started (a class takes a full analysis window), or runs without analysis"
    if gpm:
        return f"The exporter sent no boundness class for this GPU in the range: {why}."
    if signals and signals <= {"processes"}:
        return ("No boundness class in the range: a MIG instance without GPM (before Hopper) has a class only when "
                "idle, and the exporter sent none.")  # fmt: skip
    if "nvml" in signals or has_gpm_hardware(identity) is False:
        model = identity.get("name") or "this GPU"
        return (f"No boundness class in the range: {model} has no GPM (before Hopper), so it gets only the coarse "
                f"classes from NVML, and the exporter sent none: {why}.")  # fmt: skip
    return f"No boundness class in the range, and nothing says which signals the GPU has: {why}."


def header(uuid: str, series: pd.DataFrame, up_now: pd.DataFrame, info_now: pd.DataFrame) -> Header:
    """The GPU page's header from its range query (``series``, ``device_series`` rows), its
    gpulens_gpu_up and gpulens_gpu_info rows now (``up_now``, ``info_now``: empty when it is not
    exported now): model, node, holder(s) with their owner, sharing mode, state and class now."""
    up_now = up_now[col(up_now, "uuid") == uuid] if not up_now.empty else up_now
    info_now = info_now[col(info_now, "uuid") == uuid] if not info_now.empty else info_now
    ident = identity(series, info_now)
    state, banner = lost_state(series, up_now)
    newest = _latest(series) if not series.empty else series
    where_from = info_now if not info_now.empty else up_now if not up_now.empty else newest
    node = where_of(where_from)
    gone = state == "LOST" and up_now.empty
    model = ident.get("name") or (
        "not known: the exporter sends the model only while it can read the GPU" if state == "LOST"
        else "not known: no series of this GPU in the range"
    )  # fmt: skip
    owner = ""
    if gone:
        holder = "not known: the GPU is not exported now"
        sharing = "not known: the GPU is not exported now"
    else:
        holder, owner = _holders_now(series)
        sharing = _sharing_now(series)
        if state == "LOST":
            sharing = f"{sharing} (when it last answered)" if sharing else "not known while it is lost"
        sharing = sharing or "not known: the exporter sent no sharing mode"
    classes = classes_now(series) if state != "LOST" else {}
    if classes:
        boundness = (
            CLASS_WORDS.get(classes["GPU"], classes["GPU"]) if list(classes) == ["GPU"]
            else class_counts_words(classes)
        )  # fmt: skip
    elif state == "LOST":
        boundness = "none: nothing is known while it is lost"
    else:
        boundness = "none: " + no_class_words(series, ident, state).split(": ", 1)[-1]
    gpu = ident.get("gpu") or (_text(with_cols(where_from, ["gpu"])["gpu"].iloc[0]) if len(where_from) else "")
    return Header(
        gpu=gpu,
        owner=owner,
        model=model,
        node=node or "not known: no series of this GPU says where it is",
        holder=holder,
        sharing=sharing,
        state={"answering": "answering", "LOST": "LOST", "unknown": "not exported, and not seen in the range"}[state],
        banner=banner,
        boundness=boundness,
        lost=state == "LOST",
    )


def about(series: pd.DataFrame, info_now: pd.DataFrame) -> str:
    """The GPU's info series as one line of text: driver, MIG mode, PCI address, compute capability
    and, where NVML reports one, its NVLink fabric clique; ``""`` when none is known."""
    ident = identity(series, info_now)
    parts = []
    if ident.get("driver_version"):
        parts.append(f"driver {ident['driver_version']}")
    if ident.get("mig_mode"):
        parts.append(f"MIG {ident['mig_mode']}")
    if ident.get("pci_bus_id"):
        parts.append(f"PCI {ident['pci_bus_id']}")
    if ident.get("compute_capability"):
        parts.append(f"compute capability {ident['compute_capability']}")
    fabric = _latest(_rows(series, "gpulens_gpu_fabric_info"))
    if not fabric.empty:
        f = with_cols(fabric, ["state", "clique_id", "cluster_uuid"]).iloc[0]
        cluster = str(f["cluster_uuid"])
        if cluster.strip("0-"):
            parts.append(
                f"NVLink fabric clique {f['clique_id']} of cluster {cluster[:8]}… ({f['state'] or 'state unknown'})"
            )
        else:
            parts.append(f"NVLink fabric registration {f['state'] or 'unknown'}, in no clique")
    return " · ".join(parts)


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def nvlink_words(series: pd.DataFrame) -> tuple[str, bool]:
    """The GPU's NVLinks now, in words: how many are up of how many, which are down, and the GPUs
    it reaches over how many links (the ``NV#`` of ``nvidia-smi topo -m``); and whether a link is
    down. ``("", False)`` on a GPU without NVLink series in the range."""
    states = _latest(_rows(series, "gpulens_gpu_nvlink_link_active"))
    if states.empty:
        return "", False
    s = with_cols(states, ["link"])
    up = {str(link): float(v) == 1 for link, v in zip(s["link"], s["value"], strict=True)}
    down = sorted((link for link, on in up.items() if not on), key=lambda x: (len(x), x))
    words = f"NVLink: {sum(up.values())} of {len(up)} links up"
    words += (
        f"; {'link' if len(down) == 1 else 'links'} {_and(down)} {'is' if len(down) == 1 else 'are'} down."
        if down
        else "."
    )
    peers = _latest(_rows(series, "gpulens_gpu_nvlink_peer_links"))
    p = with_cols(peers, ["peer_gpu"])
    by_links: dict[int, list[str]] = {}
    for gpu, v in zip(p["peer_gpu"], p["value"], strict=True):
        by_links.setdefault(round(float(v)), []).append(str(gpu))
    if not by_links:
        return words + " It reaches no other GPU of its node over NVLink.", bool(down)
    reach = [
        f"{'GPU' if len(gpus) == 1 else 'GPUs'} {_and(sorted(gpus, key=lambda x: (len(x), x)))} over {n:,} "
        f"{'link' if n == 1 else 'links'}{' each' if len(gpus) > 1 else ''} (NV{n})"
        for n, gpus in sorted(by_links.items(), reverse=True)
    ]
    return f"{words} It reaches {'; '.join(reach)}.", bool(down)


def energy_words(series: pd.DataFrame) -> str:
    """The energy the GPU used over the range (its energy counter's increase), in Wh or kWh;
    ``""`` with fewer than two points."""
    rows = _rows(series, "gpulens_gpu_energy_joules_total")
    if len(rows) < 2:
        return ""
    wh = increase(rows) / 3600.0
    span = float(rows["timestamp"].max() - rows["timestamp"].min())
    over = (
        f"{span / 3600:,.1f} hours"
        if span >= 7200
        else f"{span / 60:,.0f} minutes"
        if span >= 120
        else f"{span:,.0f} s"
    )
    used = f"{wh / 1000:,.2f} kWh" if wh >= 1000 else f"{wh:,.1f} Wh"
    return f"Energy used over the {over} of the range it was read: {used}."


def probe_words(series: pd.DataFrame) -> str:
    """When each probe last succeeded, in words; ``""`` when no probe has."""
    rows = _latest(_rows(series, "gpulens_probe_last_success_timestamp_seconds"))
    if rows.empty:
        return ""
    r = with_cols(rows, ["probe"])
    last = {label_words("probe", p): float(v) for p, v in zip(r["probe"], r["value"], strict=True) if v > 0}
    return "Last successful run: " + "; ".join(f"{p} at {when(t)}" for p, t in sorted(last.items())) + "."


def metrics_of(table: Sequence[Panel] = PANELS) -> set[str]:
    """Every family the table draws."""
    return {line.metric for panel in table for line in panel.lines}
