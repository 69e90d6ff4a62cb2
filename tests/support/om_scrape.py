"""Pages scraped from real targets (any exporter: gpulens, an engine) turned into one OpenMetrics
history for ``promtool tsdb create-blocks-from openmetrics``.

Unlike ``tests/support/om_history.py`` (which checks every name against gpulens' own metric table),
this keeps whatever a target serves, typed by its ``# TYPE`` lines, and adds the target labels a
Prometheus scrape (and its relabelling) would add: ``job``, ``instance``, and for an engine pod
``namespace`` and ``pod``.  Where a page's label has a target label's name, the target's wins and
the page's value moves to ``exported_<name>``, as Prometheus does without ``honor_labels``; a
target with ``honor`` (the gpulens exporter: the chart scrapes it with ``honorLabels: true``) keeps
the page's value instead.  ``*_created`` samples are left out (promtool would take them for series
of their own).

Times are Unix seconds; each page's samples are stamped at its scrape's start.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from dashboard.sources.openmetrics import label_text

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_TYPE = re.compile(r"^# TYPE\s+(\S+)\s+(\S+)")
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("_count", "_sum"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
}
OM_TYPES = {"counter", "gauge", "histogram", "summary", "gaugehistogram", "info", "stateset", "unknown"}


def _unescape(value: str) -> str:
    return value.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


def parse_page(text: str) -> tuple[dict[str, str], list[tuple[str, str, dict[str, str], str]]]:
    """(family -> type, [(family, sample name, labels, value)]) of a Prometheus text page (0.0.4 or
    OpenMetrics).  A counter family is named without ``_total``; a sample without a ``# TYPE`` is a
    family of type ``unknown`` of its own name."""
    types: dict[str, str] = {}
    samples: list[tuple[str, str, dict[str, str], str]] = []
    for line in text.splitlines():
        if line.startswith("#"):
            m = _TYPE.match(line)
            if m:
                name, kind = m.groups()
                kind = "unknown" if kind == "untyped" else kind
                if kind == "counter":
                    name = name.removesuffix("_total")
                types[name] = kind if kind in OM_TYPES else "unknown"
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.groups()
        if name.endswith("_created"):
            continue
        family = _family(name, types)
        samples.append((family, name, {k: _unescape(v) for k, v in _LABEL.findall(labels or "")}, value))
    return types, samples


def _family(name: str, types: Mapping[str, str]) -> str:
    if name in types and types[name] != "counter":
        return name
    for kind_suffixes in _SUFFIXES.values():
        for suffix in kind_suffixes:
            base = name.removesuffix(suffix)
            if base != name and base in types:
                return base
    return name


@dataclass
class Target:
    """One scrape target: its labels (added to every sample) and whether its own labels of the
    same names win (``honor``)."""

    labels: dict[str, str]
    honor: bool = False


@dataclass
class ScrapeHistory:
    """Samples of every scrape, by family and series, for one OpenMetrics file."""

    types: dict[str, str] = field(default_factory=dict)
    series: dict[str, dict[str, tuple[str, dict[str, str], list[tuple[float, str]]]]] = field(default_factory=dict)
    scrapes: int = 0

    def add(self, target: Target, text: str, t: float) -> int:
        """Add one page of ``target`` scraped at Unix time ``t``; return its sample count."""
        types, samples = parse_page(text)
        for fam, kind in types.items():
            self.types.setdefault(fam, kind)
        for fam, name, labels, value in samples:
            if target.honor:
                full = {**target.labels, **labels}
            else:
                clash = {f"exported_{k}": v for k, v in labels.items() if k in target.labels}
                full = {**labels, **clash, **target.labels}
            key = name + label_text(full)
            entry = self.series.setdefault(fam, {}).setdefault(key, (name, full, []))
            entry[2].append((t, value))
        self.scrapes += 1
        return len(samples)

    def write(self, out: TextIO) -> int:
        """Write the history as OpenMetrics and return the number of samples written: families
        together; within a family, each metric point together (a histogram's buckets, count and sum
        of one series at one time, buckets in page order), in time order; ``# EOF`` at the end."""
        written = 0
        for fam in sorted(self.series):
            kind = self.types.get(fam, "unknown")
            members = list(self.series[fam].values())
            if kind == "counter" and any(n != fam + "_total" for n, _, _ in members):
                kind = "unknown"  # a counter without _total is not an OpenMetrics counter
            if kind == "unknown" and any(n != fam for n, _, _ in members):
                continue  # cannot be written as one family; left out rather than mis-typed
            groups: dict[str, list[tuple[str, str, dict[float, str]]]] = {}
            for name, labels, points in members:
                fixed = {k: _canonical(v) if k in ("le", "quantile") else v for k, v in labels.items()}
                group = label_text({k: v for k, v in labels.items() if k not in ("le", "quantile")})
                groups.setdefault(group, []).append((name, label_text(fixed), dict(points)))
            out.write(f"# TYPE {fam} {kind}\n")
            for series in groups.values():
                for t in sorted({t for _, _, by_t in series for t in by_t}):
                    for name, text, by_t in series:
                        if t in by_t:
                            out.write(f"{name}{text} {by_t[t]} {t:.3f}\n")
                            written += 1
        out.write("# EOF\n")
        return written


def _canonical(value: str) -> str:
    """A bucket bound or quantile as OpenMetrics writes it (``1.0``, ``+Inf``)."""
    try:
        f = float(value)
    except ValueError:
        return value
    if f == float("inf"):
        return "+Inf"
    if f == float("-inf"):
        return "-Inf"
    return repr(f)


class PageLog:
    """Raw pages of one target, gzip-compressed, each after a ``# SCRAPE <unix seconds>`` line (so
    the history can be rebuilt with other target labels)."""

    def __init__(self, path: Path) -> None:
        self._f = gzip.open(path, "wt", compresslevel=5)  # noqa: SIM115 - closed by close()

    def add(self, text: str, t: float) -> None:
        self._f.write(f"# SCRAPE {t:.3f}\n")
        self._f.write(text if text.endswith("\n") else text + "\n")

    def close(self) -> None:
        self._f.close()


def read_pages(path: Path) -> list[tuple[float, str]]:
    """The (time, page) pairs a ``PageLog`` wrote."""
    pages: list[tuple[float, str]] = []
    t: float | None = None
    lines: list[str] = []
    with gzip.open(path, "rt") as f:
        for line in f:
            if line.startswith("# SCRAPE "):
                if t is not None:
                    pages.append((t, "".join(lines)))
                t, lines = float(line.split()[2]), []
            else:
                lines.append(line)
    if t is not None:
        pages.append((t, "".join(lines)))
    return pages
