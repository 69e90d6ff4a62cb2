"""How the dashboard's and the advisor's options are written: numbers, durations, prices, URLs.

Every value option of ``gpulens-dashboard`` and ``gpulens-advisor`` (and each ``GPULENS_DASHBOARD_*``
twin) is read by a parser from here. Durations are the exporter's (``exporter.quantities.parse_duration``:
ASCII digits with ``ms``, ``s``, ``m``, ``h`` or ``d``, bare seconds, at most a year), plus ``w``
(weeks) where the advisor takes it. Numbers are plain ASCII decimals, read by the exporter's flags'
parser (``exporter.quantities``): no sign, exponent, ``_``, whitespace, ``nan``, ``inf`` or other
scripts' digits (``int()`` and ``float()`` take all of those). The parsers of a bare number in a
range, :func:`number_between` and :func:`whole_between`, are the dashboard's own.

Each parser raises ``ValueError`` whose message starts with the text it refused; :func:`named` puts
the flag or the environment variable in front of it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from decimal import Decimal
from typing import TypeVar
from urllib.parse import urlsplit

from exporter.quantities import (
    MAX_DURATION_SECONDS,
    MAX_TEXT,
    is_plain,
    is_whole,
    parse_duration,
    shown_seconds,
    why_not_plain,
)

T = TypeVar("T")

_ZERO = re.compile(r"0+(?:\.0+)?(ms|s|m|h|d|w)?")
"""A duration of zero in any unit (``0``, ``0s``, ``0.0m``): what ``--refresh`` reads as off."""
_MAX_URL = 2048
"""Longest URL read (characters)."""
_HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?(\.[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?)*")
"""A DNS name (RFC 1123 labels; ``_`` too, which Docker and Compose service names may have)."""

QUERY_TIMEOUT_SECONDS = (0.1, 3600.0)
"""Range of a Prometheus query's timeout (s): the dashboard's ``--timeout`` and the advisor's."""
PRICE_USD = (0.0, 10000.0)
"""Range of a price per GPU-hour (USD)."""
HEADROOM = (1.0, 4.0)
"""Range of the advisor's memory and compute headrooms (a multiple of the observed figure): the
Right-sizing page's inputs take the same."""
PORT = (1, 65535)
"""Range of a TCP port (to listen on, or in a URL)."""
MAX_MARKS = (1, 1_000_000)
"""Range of the dashboard's ``--max-marks`` (GPUs a chart draws a mark each for)."""
WINDOW_SECONDS = (3600.0, MAX_DURATION_SECONDS)
"""Range of the advisor's ``--window`` (s): an hour (its shortest evidence) to a year (the
exporter's longest duration)."""
STEP_SECONDS = (1.0, 86400.0)
"""Range of the advisor's ``--step`` (s): PromQL's finest subquery step to a day."""
ITL_TARGET_SECONDS = (0.001, 60.0)
"""Range of a served model's inter-token latency p95 target (s): the advisor's and the dashboard's
``--itl-target``. One decode step: a millisecond is below any engine's step, a minute far above."""
TTFT_TARGET_SECONDS = (0.001, 600.0)
"""Range of a served model's time-to-first-token p95 target (s): the advisor's and the dashboard's
``--ttft-target``. TTFT holds the queue and the whole prompt's prefill, so it runs far longer than
a decode step: a 128 k-token prompt on a 70 B model takes tens of seconds to prefill, and batch or
agent traffic queues for minutes. Ten minutes is beyond any interactive or gateway timeout."""


def duration_span(low: float, high: float) -> str:
    """A range of durations in seconds as the messages and help texts write it: ``100ms..1h``."""
    return f"{shown_seconds(low)}..{shown_seconds(high)}"


def plain(value: float) -> str:
    """``value`` as a plain decimal that the parsers here read back exactly: 30.0 -> ``30``,
    1e-05 -> ``0.00001`` (``f"{x:g}"`` would write an exponent and drop digits)."""
    if value.is_integer():
        return str(int(value))
    return format(Decimal(repr(value)), "f")


def _why_not_plain(text: str) -> str:
    """Why ``text`` is not a plain ASCII decimal, as the end of a sentence starting with the text."""
    return "it " + why_not_plain(
        text,
        sign="has a sign (write the number without + or -)",
        otherwise="is not a number written in ASCII digits 0-9",
    )


def _shown_text(text: str) -> str:
    """``text`` quoted for a message, cut short when it is long."""
    return repr(text) if len(text) <= MAX_TEXT else f"{text[:20]!r}..."


def number_between(low: float, high: float, unit: str = "") -> Callable[[str], float]:
    """A parser of a plain ASCII decimal ``low <= x <= high`` (``unit`` is for the messages only),
    compared exactly: ``4.0000000000000000001`` is above 4 even though its float is 4.0."""
    span = f"{plain(low)}..{plain(high)}{unit}"

    def parse(text: str) -> float:
        if len(text) > MAX_TEXT:
            raise ValueError(f"{_shown_text(text)} is not a number in {span}: it is longer than {MAX_TEXT} characters")
        if not is_plain(text):
            raise ValueError(f"{text!r} is not a number in {span}: {_why_not_plain(text)}")
        exact = Decimal(text)
        if exact < Decimal(repr(low)):
            raise ValueError(f"{text!r} is not a number in {span}: it must be at least {plain(low)}")
        if exact > Decimal(repr(high)):
            raise ValueError(f"{text!r} is not a number in {span}: it must be at most {plain(high)}")
        return float(text)

    return parse


def whole_between(low: int, high: int) -> Callable[[str], int]:
    """A parser of a whole number ``low <= n <= high`` in ASCII digits."""
    span = f"{low}..{high}"

    def parse(text: str) -> int:
        if len(text) > MAX_TEXT:
            raise ValueError(
                f"{_shown_text(text)} is not a whole number in {span}: it is longer than {MAX_TEXT} characters"
            )
        if not is_whole(text):
            why = "it has a fraction" if is_plain(text) else _why_not_plain(text)
            raise ValueError(f"{text!r} is not a whole number in {span}: {why}")
        value = int(text)
        if value < low:
            raise ValueError(f"{text!r} is not a whole number in {span}: it must be at least {low}")
        if value > high:
            raise ValueError(f"{text!r} is not a whole number in {span}: it must be at most {high}")
        return value

    return parse


def _without_text(message: str, text: str) -> str:
    """The exporter's message about ``text`` as the end of ours: without the quoted text it starts
    with (then "it ...") and without its examples (ours give the range)."""
    quoted = repr(text) + " "
    why = "it " + message[len(quoted) :] if message.startswith(quoted) else message
    return why.split(": expected a duration", 1)[0]


def duration_in(
    low: float, high: float, *, weeks: bool = False, whole_seconds: bool = False, zero: bool = False
) -> Callable[[str], float]:
    """A parser of a duration ``low <= seconds <= high`` written as the exporter's flags write one
    (``500ms``, ``30``, ``2m``, ``1h``, ``7d``; ``exporter.quantities.parse_duration``), returning seconds.

    ``weeks``: ``2w`` too (the advisor's windows). ``whole_seconds``: refuse a fraction of a second
    (PromQL subqueries step in whole seconds). ``zero``: a duration of zero (``0``, ``0s``) is
    allowed and returns 0 (``--refresh 0`` = off)."""
    span = f"0 or {duration_span(low, high)}" if zero else duration_span(low, high)

    def parse(text: str) -> float:
        nil = _ZERO.fullmatch(text) if text.isascii() else None
        if nil and (weeks or nil.group(1) != "w"):
            if zero:
                return 0.0
            raise ValueError(f"{text!r} is not a duration in {span}: it must be positive")
        in_weeks = weeks and len(text) > 1 and text.endswith("w") and text[-2].isdigit()
        read = text[:-1] + "d" if in_weeks else text
        try:
            seconds = parse_duration(read) * (7 if in_weeks else 1)
        except ValueError as exc:
            why = _without_text(str(exc), read) + (" (or w, weeks)" if weeks and "unit" in str(exc) else "")
            raise ValueError(f"{_shown_text(text)} is not a duration in {span}: {why}") from None
        if seconds < low:
            raise ValueError(f"{text!r} is not a duration in {span}: it is shorter than {shown_seconds(low)}")
        if seconds > high:
            raise ValueError(f"{text!r} is not a duration in {span}: it is longer than {shown_seconds(high)}")
        if whole_seconds:
            if abs(seconds - round(seconds)) > 1e-6:
                raise ValueError(f"{text!r} is not a duration in {span}: it is not a whole number of seconds")
            seconds = float(round(seconds))
        return seconds

    return parse


def _host_problem(host: str) -> str | None:
    """Why ``host`` (ASCII, no spaces) is no IP address or DNS name, or None when it is one."""
    if ":" in host:  # IPv6, in the brackets urlsplit() checked (or bare, to listen on)
        try:
            ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return f"{host!r} is not an IPv6 address"
        return None
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return f"{host!r} is not an IPv4 address"
        return None
    if len(host) > 253 or not _HOST_NAME.fullmatch(host):
        return f"{host!r} is not a host name (letters, digits, '-', '_' and '.')"
    return None


def _url_problem(text: str) -> str | None:
    """Why ``text`` is no ``http://`` or ``https://`` URL with a host (and a port in 1..65535 if it
    names one), or None when it is one."""
    if not text:
        return "it is empty"
    if len(text) > _MAX_URL:
        return f"it is longer than {_MAX_URL} characters"
    if not text.isascii():
        return "it has characters outside ASCII (write an international host name in its xn-- form)"
    if any(c.isspace() or not c.isprintable() for c in text):
        return "it contains whitespace or control characters"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        return f"it does not parse ({exc})"
    if parts.scheme not in ("http", "https"):
        return "it must start with http:// or https://"
    if not parts.hostname:
        return "it has no host"
    if parts.netloc.endswith(":"):
        return "it has an empty port after ':'"
    if port is not None and not PORT[0] <= port <= PORT[1]:
        return f"its port {port} is outside {PORT[0]}..{PORT[1]}"
    why = _host_problem(parts.hostname)
    return None if why is None else f"its host {why}"


def http_url(text: str) -> str:
    """A Prometheus base URL: ``http://`` or ``https://``, a host, optionally a port (1..65535) and
    a path; no query or fragment (the API's paths are appended to it). Returned as given."""
    why = _url_problem(text)
    if why is None and ("?" in text or "#" in text):
        why = "it has a query or a fragment ('?' or '#'): give the base URL only"
    if why:
        raise ValueError(f"{_shown_text(text)} is not an http:// or https:// URL: {why}")
    return text


def scrape_target(text: str) -> str:
    """One exporter to scrape: a URL as :func:`http_url` takes (query allowed), or without the scheme
    (``node-a:9445``, read as ``http://``). Returned as given."""
    why = _url_problem(text if "://" in text else f"http://{text}")
    if why:
        raise ValueError(f"{_shown_text(text)} is not an exporter URL (http[s]://HOST[:PORT][/PATH]): {why}")
    return text


def scrape_targets(text: str) -> tuple[str, ...]:
    """``URL[,URL...]``: each a :func:`scrape_target` (surrounding spaces dropped), at least one."""
    targets = tuple(t.strip() for t in text.split(",") if t.strip())
    if not targets:
        raise ValueError(f"{_shown_text(text)} names no exporter URL")
    for target in targets:
        scrape_target(target)
    return targets


def listen_host(text: str) -> str:
    """The address to listen on: an IPv4 or IPv6 address (without brackets) or a host name, in ASCII."""
    if not text:
        raise ValueError("'' is not an address to listen on: it is empty (0.0.0.0 listens on every IPv4 address)")
    if not text.isascii() or any(c.isspace() or not c.isprintable() for c in text):
        raise ValueError(f"{_shown_text(text)} is not an address to listen on: write it in ASCII, without spaces")
    why = _host_problem(text)
    if why:
        raise ValueError(f"{_shown_text(text)} is not an address to listen on: {why}")
    return text


_price = number_between(*PRICE_USD, unit=" USD")


def model_pair(item: str, form: str) -> tuple[str, str]:
    """``MODEL=VALUE`` -> (the model, stripped, printable and not empty; the value's text): the
    advisor's and the dashboard's per-model flags. ``form`` says what was expected (``MODEL=USD (e.g. H200=3.5)``)."""
    model, sep, value = item.rpartition("=")
    model = model.strip()
    if not sep or not model:
        raise ValueError(f"{item!r} is not {form}")
    if not model.isprintable():
        raise ValueError(f"{item!r}: the model name has control characters")
    return model, value.strip()


def per_model(text: str, form: str, value: Callable[[str], float], twice: str) -> dict[str, float]:
    """``MODEL=VALUE[,...]`` -> {model: value(VALUE)}: each item in ``form`` (for the messages), a
    model given twice refused with ``twice`` ("is priced twice"), a bad value named with its item;
    empty: {}."""
    out: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        model, raw = model_pair(item, form)
        if model in out:
            raise ValueError(f"{item!r}: {model!r} {twice}")
        try:
            out[model] = value(raw)
        except ValueError as exc:
            raise ValueError(f"{item!r}: {exc}") from None
    return out


def parse_prices(text: str) -> dict[str, float]:
    """``H200=3.5,A100=1.2,*=2`` -> {"H200": 3.5, ...}: USD per GPU-hour by model name (``*`` = any
    other), each a plain decimal in :data:`PRICE_USD`; a model priced twice is refused. Empty: {}."""
    return per_model(text, "MODEL=USD (e.g. H200=3.5)", _price, "is priced twice")


def latency_targets(span: tuple[float, float], example: str) -> Callable[[str], dict[str, float]]:
    """A parser of per-model latency p95 targets, ``MODEL=DURATION[,...]``: ``llama-3-8b=50ms,qwen-7b=0.04``
    -> {"llama-3-8b": 0.05, "qwen-7b": 0.04} in seconds, each a duration in ``span`` (s), the model as
    its engine names it (the ``model`` label); a model given twice is refused; empty: {}. ``example``
    (``llama-3-8b=50ms``) is for the messages. One parser for every kind of latency target
    (:data:`parse_itl_targets`, :data:`parse_ttft_targets`)."""
    duration = duration_in(*span)
    form = f"MODEL=DURATION (e.g. {example})"

    def parse(text: str) -> dict[str, float]:
        return per_model(text, form, duration, "has two targets")

    return parse


parse_itl_targets = latency_targets(ITL_TARGET_SECONDS, "llama-3-8b=50ms")
"""Each served model's inter-token latency p95 target (s), :data:`ITL_TARGET_SECONDS`: ``--itl-target``."""
parse_ttft_targets = latency_targets(TTFT_TARGET_SECONDS, "llama-3-8b=800ms")
"""Each served model's time-to-first-token p95 target (s), :data:`TTFT_TARGET_SECONDS`: ``--ttft-target``."""


def refusal(name: str, text: str, exc: Exception) -> str:
    """The message for ``text`` given to ``name`` (a ``--flag`` or an environment variable) and
    refused with ``exc``: ``--timeout 'inf' is not a duration ...``, ``GPULENS_X='1_0' is not ...``."""
    label = f"{name} {_shown_text(text)}" if name.startswith("-") else f"{name}={_shown_text(text)}"
    message = str(exc)
    quoted = _shown_text(text)
    if message.startswith(quoted) and message[len(quoted) : len(quoted) + 1] in (" ", ":"):
        return label + message[len(quoted) :]
    return f"{label}: {message}"


def named(parse: Callable[[str], T], name: str, text: str) -> T:
    """``parse(text)`` for the flag or environment variable ``name``; a refusal is a ``ValueError``
    that names it (:func:`refusal`)."""
    try:
        return parse(text)
    except (ValueError, OverflowError) as exc:
        raise ValueError(refusal(name, text, exc)) from None
