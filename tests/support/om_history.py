"""Scrapes of simulated exporters turned into one OpenMetrics history (for ``promtool tsdb
create-blocks-from openmetrics`` and VictoriaMetrics' import): each page stamped at its scrape
time, with the target labels a scrape adds."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from dashboard.sources.openmetrics import OpenMetricsHistory, label_text

SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_INTEGRAL = re.compile(r"^(# (TYPE|HELP) )?gpulens_gpu_[a-z0-9_]+_seconds(_total|_created)?[ {]")


def without_integrals(text: str) -> str:
    """``text`` without the ratios' integral counters (``gpulens_gpu_*_seconds_total``): exporters
    that run a cycle per scrape while the scrapes are stamped seconds apart would rate a counter of
    seconds at a fraction of its gauge. Without them every reader takes the gauges' means over the
    window, as the rules do for a counter younger than the window."""
    return "\n".join(line for line in text.splitlines() if not _INTEGRAL.match(line)) + "\n"


def write_history(path: Path, targets: Iterable[tuple[dict[str, str], Sequence[str]]], times: Sequence[float]) -> None:
    """Write to ``path`` the pages of each target (its labels: cluster, instance, job, node...), the
    k-th page stamped ``times[k]`` (Unix seconds)."""
    by_series: dict[str, dict[str, tuple[dict[str, str], list[str | None], list[str]]]] = {}
    for target, pages in targets:
        for k, text in enumerate(pages):
            for line in text.splitlines():
                m = SAMPLE_LINE.match(line)
                if not m or line.startswith("#"):
                    continue
                name, labels, value = m.groups()
                full = {**dict(LABEL.findall(labels or "")), **target}
                _, values, stamps = by_series.setdefault(name, {}).setdefault(label_text(full), (full, [], []))
                values.append(value)
                stamps.append(f"{times[k]:.0f}")
    with path.open("w") as out:
        writer = OpenMetricsHistory(out)
        for name, series in by_series.items():
            for labels, values, stamps in series.values():
                writer.series(name, labels, values, stamps)
        writer.close()
