"""Hand freed C heap memory back to the operating system (glibc ``malloc_trim``).

Initialising NVML allocates and frees MiB of C heap in the driver's library; glibc keeps freed
memory mapped in the process, so it stays in the exporter's resident set (what the kubelet and
``kubectl top`` show) although nothing uses it.  On an H200, one ``malloc_trim(0)`` after the
first cycle returned most of it (docs/benchmarks.md, "Real H200: gpulens vs nvitop-exporter").
The sampler trims after its first cycle (NVML is initialised by then) and
every ``TRIM_EVERY_SECONDS`` after that, which also covers a re-initialisation after a
driver loss.  One call walks the free lists of a heap of a few tens of MiB: well under a
millisecond.  Where the C library has no ``malloc_trim`` (musl), it is a no-op.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

TRIM_EVERY_SECONDS = 300.0
"""Seconds between trims after the first one."""


def _libc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class HeapTrimmer:
    """Calls ``malloc_trim(0)`` at the first ``due(now)`` and then every ``every_seconds``.

    ``now`` is a monotonic time in seconds; ``trim`` replaces the C library's function (tests).
    """

    def __init__(self, every_seconds: float = TRIM_EVERY_SECONDS, trim: Callable[[int], int] | None = None) -> None:
        self.every_seconds = every_seconds
        self._trim = trim if trim is not None else _libc_trim()
        self._next_at: float | None = None
        self.trims = 0

    @property
    def available(self) -> bool:
        """Whether this C library can trim at all."""
        return self._trim is not None

    def due(self, now: float) -> None:
        """Trim if the time has come; never raises."""
        if self._trim is None or (self._next_at is not None and now < self._next_at):
            return
        self._next_at = now + self.every_seconds
        try:
            self._trim(0)
            self.trims += 1
        except Exception:  # a C library that misbehaves must not stop sampling
            log.exception("malloc_trim failed; not trying again")
            self._trim = None


@functools.cache
def _shared_trim() -> Callable[[int], int] | None:
    return _libc_trim()


def trim_now() -> bool:
    """One ``malloc_trim(0)`` now (after a burst of freed connections); False where the C library
    has none or it failed.  Never raises."""
    trim = _shared_trim()
    if trim is None:
        return False
    try:
        trim(0)
    except Exception:  # a C library that misbehaves must not stop serving
        log.exception("malloc_trim failed")
        return False
    return True
