"""Writes a history of the exporter's series as OpenMetrics, for Prometheus backfilling.

``promtool tsdb create-blocks-from openmetrics FILE DIR`` turns the file into TSDB blocks, and a
Prometheus started on DIR serves the history: the advisor's tests and demo
(dashboard/advisor/backfill.py), the dashboard's scale test and benchmark
(scripts/backfill_fleet.py) and the rules-versus-dashboard consistency test all write through this
one writer.  Names, types, help and label names come from the metric catalogue (exporter/render/metrics.py)
plus the labels Prometheus adds to a target (``TARGET_LABELS``): a name or label the exporter does
not export is refused, so a history cannot drift from what a real exporter serves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TextIO

from exporter.render.metrics import spec

TARGET_LABELS: frozenset[str] = frozenset({"instance", "job", "node", "cluster"})
"""Labels Prometheus (or its relabelling) adds to every series of a scrape target."""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def label_text(labels: Mapping[str, str]) -> str:
    """``{a="x",b="y"}``: sorted, escaped, empty values left out (Prometheus treats them as absent)."""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()) if v) + "}"


class OpenMetricsHistory:
    """Streams families of timestamped samples to ``out``; ``close()`` ends the file.

    OpenMetrics wants each family's samples together: write every series of one metric before the
    next metric (a metric that comes back after another raises ``ValueError``).  Within a series,
    samples must be in time order (promtool's requirement).
    """

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._family: str | None = None
        self._done: set[str] = set()
        self.samples = 0
        """Samples written so far."""

    def series(self, name: str, labels: Mapping[str, str], values: Sequence[str | None], stamps: Sequence[str]) -> None:
        """One series: ``values[i]`` (formatted; ``None`` = absent) at Unix time ``stamps[i]`` (s)."""
        entry = spec(name)
        unknown = set(labels) - set(entry.labels) - TARGET_LABELS
        if unknown:
            raise ValueError(f"{name} has no label {sorted(unknown)}; its labels are {entry.labels}")
        if len(values) != len(stamps):
            raise ValueError(f"{name}: {len(values)} values for {len(stamps)} timestamps")
        family = name.removesuffix("_total") if entry.type == "counter" else name
        if family != self._family:
            if family in self._done:
                raise ValueError(f"{family}: its series must be written together (OpenMetrics)")
            if self._family is not None:
                self._done.add(self._family)
            self._family = family
            self._out.write(f"# TYPE {family} {entry.type}\n# HELP {family} {entry.help}\n")
        text = label_text(labels)
        lines = [f"{name}{text} {v} {ts}\n" for v, ts in zip(values, stamps, strict=True) if v is not None]
        self._out.write("".join(lines))
        self.samples += len(lines)

    def close(self) -> int:
        """End the file (``# EOF``); return the number of samples written."""
        self._out.write("# EOF\n")
        return self.samples
