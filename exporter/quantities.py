"""How options write numbers and durations, read strictly: the one parser of a plain ASCII decimal.

The exporter's flags (exporter/config.py) and the dashboard's and advisor's options
(dashboard/inputs.py) both read numbers through this module, so they refuse the same texts for the
same reasons. A plain decimal is ASCII digits with at most one decimal point: no sign, exponent,
``_``, whitespace, ``nan``, ``inf`` or other scripts' digits (``int()`` and ``float()`` take all of
those, and ``\\d`` matches any script's digits). A text longer than ``MAX_TEXT`` is refused before a
regex or a conversion has to work through it. A duration is a plain decimal with an optional unit.

It imports nothing of ours, so the dashboard uses it without loading the exporter's flags.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

DECIMAL = r"[0-9]+(?:\.[0-9]+)?"
"""A plain decimal in ASCII digits (a regular expression)."""
MAX_TEXT = 64
"""Longest number text read (characters): a longer one is a mistake."""
MAX_DURATION_SECONDS = 365 * 86400.0
"""No duration may exceed a year (Python's thread waits overflow near 292 years)."""
DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
"""Seconds per duration unit; a bare number is seconds."""

SIGN = "has a sign (write the number without + or -; negative values are not allowed)"
"""Why a signed number is refused (the exporter's wording)."""
OTHERWISE = "is not a plain decimal number"
"""Why a text is refused when no particular mistake explains it (the exporter's wording)."""

_PLAIN = re.compile(DECIMAL)
_WHOLE = re.compile(r"[0-9]+")
_DURATION = re.compile(rf"({DECIMAL})(ms|s|m|h|d)?")


def is_plain(text: str) -> bool:
    """Whether ``text`` is a plain ASCII decimal (``0``, ``1.25``)."""
    return _PLAIN.fullmatch(text) is not None


def is_whole(text: str) -> bool:
    """Whether ``text`` is a whole number in ASCII digits."""
    return _WHOLE.fullmatch(text) is not None


def why_not_plain(text: str, *, sign: str = SIGN, otherwise: str = OTHERWISE) -> str:
    """Why ``text`` is not a plain ASCII decimal, as a phrase that follows the text in a message
    (``'1e3' has an exponent (write 1000, not 1e3)``). ``sign`` and ``otherwise`` are the phrases for
    a signed number and for a text no particular mistake explains."""
    low = text.lower()
    if not text:
        return "is empty"
    if not text.isascii():
        return "has characters outside ASCII (write digits as 0-9)"
    if any(c.isspace() for c in text):
        return "contains whitespace"
    if text[0] in "+-":
        return sign
    if "_" in text:
        return "contains '_' (write 1000, not 1_000)"
    if "nan" in low or "inf" in low:
        return "is not a finite number"
    if re.search(r"[0-9.]e[+-]?[0-9]", low):
        return "has an exponent (write 1000, not 1e3)"
    return otherwise


def check_length(text: str) -> None:
    """Refuse a text longer than ``MAX_TEXT`` before a regex or a conversion reads it."""
    if len(text) > MAX_TEXT:
        raise ValueError(f"{text[:20]!r}... is longer than {MAX_TEXT} characters")


def exact(decimal: str) -> tuple[int, int]:
    """A plain ASCII decimal as an exact fraction (numerator, denominator): ``1.25`` -> (125, 100)."""
    whole, _, frac = decimal.partition(".")
    return int(whole + frac), 10 ** len(frac)


def not_a_quantity(text: str, what: str, units: Sequence[str], examples: str) -> ValueError:
    """The error for ``text`` that is no ``what`` (duration, size): an unknown unit, or why the
    number is not a plain ASCII decimal."""
    m = re.fullmatch(rf"{DECIMAL}([A-Za-z]+)", text)
    if m:
        return ValueError(f"{text!r} has an unknown unit {m.group(1)!r}: use one of {', '.join(units)}")
    return ValueError(f"{text!r} {why_not_plain(text)}: expected a {what} such as {examples}")


def parse_duration(text: str) -> float:
    """``500ms``, ``1s``, ``2m``, ``1h``, ``1d`` or bare seconds -> seconds (> 0, at most a year).

    ASCII digits only, no sign, exponent, ``_`` or whitespace."""
    check_length(text)
    m = _DURATION.fullmatch(text)
    if not m:
        raise not_a_quantity(text, "duration", list(DURATION_UNITS), "500ms, 1s, 2m, 1h")
    seconds = float(m.group(1)) * DURATION_UNITS[m.group(2) or "s"]
    if not math.isfinite(seconds) or seconds > MAX_DURATION_SECONDS:
        raise ValueError(f"{text!r} is longer than the limit of 365d")
    if seconds <= 0:
        raise ValueError(f"{text!r} must be greater than zero")
    return seconds


def shown_seconds(seconds: float) -> str:
    """A duration in seconds as the largest whole unit that writes it: 3600 -> ``1h``, 0.1 -> ``100ms``."""
    for unit in ("d", "h", "m", "s"):
        size = DURATION_UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds * 1000:g}ms"
