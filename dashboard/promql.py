"""PromQL text builders: safe selectors from filters, so no label value can inject a query.

Every label value that reaches a query passes through :func:`quote`; label and metric names are
checked against the Prometheus name grammar instead of being quoted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def quote(value: str) -> str:
    """A PromQL double-quoted string literal holding exactly ``value``.

    PromQL strings follow Go's escaping: backslash, double quote and control characters must be
    escaped, everything else (including ``}`` and ``|``) is literal inside the quotes.
    """
    out = ['"']
    for ch in value:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def label_name(name: str) -> str:
    """``name`` if it is a valid label name, else ValueError (names cannot be quoted in PromQL 2)."""
    if not _LABEL_NAME.match(name):
        raise ValueError(f"invalid label name {name!r}")
    return name


def metric_name(name: str) -> str:
    """``name`` if it is a valid metric name, else ValueError."""
    if not _METRIC_NAME.match(name):
        raise ValueError(f"invalid metric name {name!r}")
    return name


def selector(metric: str, matchers: Mapping[str, str] | None = None) -> str:
    """``metric{a="x",b="y"}`` with every value quoted; empty matchers give the bare name."""
    parts = [f"{label_name(k)}={quote(v)}" for k, v in sorted((matchers or {}).items())]
    name = metric_name(metric)
    return f"{name}{{{','.join(parts)}}}" if parts else name


def by_clause(labels: Iterable[str]) -> str:
    """``(a,b)`` for ``sum by (a,b)``; every name validated."""
    return "(" + ",".join(label_name(x) for x in labels) + ")"


def duration(seconds: float) -> str:
    """A PromQL duration in whole seconds (at least 1 s), e.g. ``3600s``."""
    return f"{max(1, round(seconds))}s"


def subquery_range(window_s: float, step_s: float) -> str:
    """``[window:step]`` that evaluates exactly window/step steps, ending at the query time.

    Prometheus 2 includes a step that falls exactly on the window's start, Prometheus 3 does not;
    a window one second shorter gives both the same steps (the end and window/step - 1 before it),
    the steps the scrape source and the rules' own ``[1h:1m]`` integrate.
    """
    return f"[{duration(max(1.0, window_s - 1.0))}:{duration(step_s)}]"
