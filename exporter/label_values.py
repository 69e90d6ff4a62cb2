"""Any string made a valid, bounded label value: the one rule for names that enter the exporter.

Role: sysfs names (RDMA devices, ports' counter files, drivers), Kubernetes API strings (pods,
namespaces, owners), kubelet strings (containers, resources, DRA claims) and DRA ResourceSlice
names become label values.  A name read from the host or a tenant may hold bytes that are not
UTF-8 (``os.listdir`` gives them as surrogate escapes, ``\\udcff`` for byte 0xff), lone surrogates
(a JSON ``\\ud800`` escape decodes to one), or be of any length.  ``label_value`` is applied where
each such name enters (docs/labels.md), and gives:

- the value unchanged when it is valid UTF-8, has no backslash and is at most
  ``MAX_LABEL_VALUE_CHARS`` characters (every real name);
- otherwise an escaped form that is valid UTF-8 and reversible (``unescape_label_value``):
  ``\\`` becomes ``\\\\``, a surrogate escape of byte 0xHH becomes the text ``\\xHH``, any other
  surrogate U+HHHH the text ``\\uHHHH`` (lower-case hex);
- cut to ``MAX_LABEL_VALUE_CHARS`` characters when longer: the first ``KEPT_CHARS`` characters
  (never half an escape), ``~`` and 16 hex digits of the SHA-256 of the whole original (its
  UTF-8 bytes, surrogates passed through), so two long names stay distinct.  ``~`` is in no
  Kubernetes name, so a cut value is recognisable as one.

Each rewrite is counted by reason (``rewritten()``, exported as
``gpulens_label_values_rewritten_total``): ``invalid_utf8`` when surrogates were escaped,
``too_long`` when the value was cut (both for a value that was both).  Doubling a backslash alone
is the escape's own spelling, not a fault of the input, and is not counted.  The counts are per
process and count every time a value is read in (a rediscovery, an API event, a kubelet refresh),
so they keep growing while a source keeps offering the value.  Thread-safe.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Mapping
from types import MappingProxyType

MAX_LABEL_VALUE_CHARS = 253
"""Longest label value, characters: the longest Kubernetes object name (a DNS subdomain).  Label
values read from Kubernetes labels would be bound to 63, but no exported value comes from one:
every name gpulens exports is an object name, a sysfs file name (255 bytes at most) or a DRA
name (driver, pool and device names are at most 253)."""

HASH_HEX_DIGITS = 16
"""Hex digits of the SHA-256 suffix of a cut value (64 bits: two names of one node collide with a
probability of about 1e-15 even among thousands)."""

CUT_MARK = "~"
"""Between the kept prefix of a cut value and its hash."""

KEPT_CHARS = MAX_LABEL_VALUE_CHARS - len(CUT_MARK) - HASH_HEX_DIGITS
"""Characters of the escaped value a cut keeps, at most (fewer when an escape would straddle)."""

REASONS = ("invalid_utf8", "too_long")
"""Why a value was rewritten (the ``reason`` label of ``gpulens_label_values_rewritten_total``)."""

_TO_ESCAPE = re.compile("[\\\\\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED = re.compile(r"\\(\\|x[0-9a-f]{2}|u[0-9a-f]{4})")

_lock = threading.Lock()
_counts = dict.fromkeys(REASONS, 0)


def _escape_char(ch: str) -> str:
    if ch == "\\":
        return "\\\\"
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's surrogate escape of byte code - 0xDC00
        return f"\\x{code - 0xDC00:02x}"
    if 0xD800 <= code <= 0xDFFF:
        return f"\\u{code:04x}"
    return ch


def _count(reason: str) -> None:
    with _lock:
        _counts[reason] += 1


def _clean(value: str) -> bool:
    """Whether ``value`` is a label value as it is: at most ``MAX_LABEL_VALUE_CHARS`` characters,
    no backslash, valid UTF-8 (no surrogate)."""
    if len(value) > MAX_LABEL_VALUE_CHARS or "\\" in value:
        return False
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def label_value(value: str) -> str:
    """``value`` as a valid UTF-8 label value of at most ``MAX_LABEL_VALUE_CHARS`` characters
    (module docstring: the escape, the cut and what is counted)."""
    if _clean(value):
        return value
    invalid = not value.isascii() and _SURROGATE.search(value) is not None
    if invalid:
        _count("invalid_utf8")
    if len(value) <= MAX_LABEL_VALUE_CHARS:  # escaping only lengthens: a longer value is cut anyway
        escaped = _TO_ESCAPE.sub(lambda m: _escape_char(m.group()), value)
        if len(escaped) <= MAX_LABEL_VALUE_CHARS:
            return escaped
    _count("too_long")
    kept: list[str] = []
    used = 0
    for ch in value[:KEPT_CHARS]:  # the work is bounded by the cut, not by the value's length
        piece = _escape_char(ch)
        if used + len(piece) > KEPT_CHARS:
            break
        kept.append(piece)
        used += len(piece)
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_HEX_DIGITS]
    return "".join(kept) + CUT_MARK + digest


def label_value_or_none(value: object) -> str | None:
    """``label_value`` of a string; ``None`` for anything else (a JSON field that is missing, or
    not a string)."""
    return label_value(value) if isinstance(value, str) else None


def is_clean(value: str) -> bool:
    """Whether ``label_value`` leaves ``value`` as it is (valid UTF-8, no backslash, not too long):
    a name that can be sent back to its source (an API path) as it is."""
    return _clean(value)


def unescape_label_value(value: str) -> str:
    """The original of an escaped, uncut label value (the inverse of ``label_value`` for values it
    did not cut): ``\\\\`` -> ``\\``, ``\\xHH`` -> the surrogate escape of byte 0xHH, ``\\uHHHH`` ->
    U+HHHH.  ``os.fsencode`` of the result gives a sysfs name's bytes back."""

    def one(m: re.Match[str]) -> str:
        body = m.group(1)
        if body == "\\":
            return "\\"
        if body[0] == "x":
            return chr(0xDC00 + int(body[1:], 16))
        return chr(int(body[1:], 16))

    return _ESCAPED.sub(one, value)


def rewritten() -> Mapping[str, int]:
    """Values rewritten so far in this process, by reason (``REASONS``)."""
    with _lock:
        return MappingProxyType(dict(_counts))
