"""Content negotiation for ``/metrics``: which exposition format, and whether to gzip.

Both answers come from a fixed, small set, so no client header can multiply per-request state
(the exposition cache holds one body per format).  The rules follow Prometheus' own Go library
(``expfmt.Negotiate``): media ranges are tried by descending quality; OpenMetrics is chosen only
for a version this exporter can write (none or ``1.0.0``); anything unknown, malformed or
unsupported falls back to the classic text format with a 200, never an error.
"""

from __future__ import annotations

OPENMETRICS_ACCEPT = "application/openmetrics-text; version=1.0.0"
"""The canonical ``Accept`` value handed to the encoder for OpenMetrics."""
TEXT_ACCEPT = "text/plain; version=0.0.4"
"""The canonical ``Accept`` value for the classic text format (the fallback)."""
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=underscores"
"""``Content-Type`` of an OpenMetrics reply (what prometheus_client names it for that ``Accept``)."""
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""``Content-Type`` of a text-format reply."""

_MAX_RANGES = 32
"""Media ranges looked at per header; a longer list is cut (the fallback still applies)."""


def _ranges(header: str) -> list[tuple[float, str, dict[str, str]]]:
    """``(q, type, params)`` per comma-separated element, best quality first, stable."""
    out: list[tuple[float, int, str, dict[str, str]]] = []
    for index, element in enumerate(header.split(",")[:_MAX_RANGES]):
        parts = [p.strip() for p in element.split(";")]
        mtype = parts[0].lower()
        if not mtype:
            continue
        params: dict[str, str] = {}
        for p in parts[1:]:
            key, sep, value = p.partition("=")
            if sep:
                params[key.strip().lower()] = value.strip().strip('"')
        try:
            q = float(params.get("q", "1"))
        except ValueError:
            q = 0.0
        if not 0.0 < q <= 1.0:  # q=0 means "not acceptable"; nan and junk are treated the same
            continue
        out.append((q, index, mtype, params))
    out.sort(key=lambda r: (-r[0], r[1]))
    return [(q, mtype, params) for q, _i, mtype, params in out]


def exposition_accept(accept: str | None) -> str:
    """One of ``OPENMETRICS_ACCEPT`` / ``TEXT_ACCEPT`` for a client's ``Accept`` header."""
    for _q, mtype, params in _ranges(accept or ""):
        version = params.get("version", "")
        if mtype == "application/openmetrics-text" and version in ("", "1.0.0"):
            return OPENMETRICS_ACCEPT
        if mtype in ("text/plain", "text/*", "*/*"):
            return TEXT_ACCEPT
    return TEXT_ACCEPT


def accepts_gzip(accept_encoding: str | None) -> bool:
    """True if ``Accept-Encoding`` allows gzip: listed with q > 0, or ``*`` with q > 0 and gzip
    not refused explicitly (RFC 9110 §12.5.3)."""
    explicit: float | None = None
    wildcard: float | None = None
    for element in (accept_encoding or "").split(",")[:_MAX_RANGES]:
        parts = [p.strip() for p in element.split(";")]
        coding = parts[0].lower()
        q = 1.0
        for p in parts[1:]:
            key, sep, value = p.partition("=")
            if sep and key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
                if not 0.0 <= q <= 1.0:
                    q = 0.0
        if coding in ("gzip", "x-gzip"):
            explicit = q if explicit is None else max(explicit, q)
        elif coding == "*":
            wildcard = q
    if explicit is not None:
        return explicit > 0.0
    return wildcard is not None and wildcard > 0.0
