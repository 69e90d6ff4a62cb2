"""Freed C heap goes back to the OS: the mechanism on this C library, and the sampler's cadence."""

from __future__ import annotations

import subprocess
import sys

import pytest

from exporter.heap import HeapTrimmer

_PROGRAM = r"""
import ctypes, re

import pytest
from exporter.heap import HeapTrimmer
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss(): return int(re.search(r"VmRSS:\s+(\d+)", open("/proc/self/status").read()).group(1))
blocks = [libc.malloc(1024) for _ in range(40000)]   # 40 MB of small C allocations, as a C library makes
for b in blocks: ctypes.memset(b, 1, 1024)
keep = libc.malloc(1024)                               # one live block on top keeps the heap from shrinking by itself
for b in blocks: libc.free(b)
before = rss()
trimmer = HeapTrimmer()
trimmer.due(0.0)
print(before, rss(), trimmer.trims)
"""


@pytest.mark.integration  # runs another program
def test_trimming_returns_freed_c_heap() -> None:
    assert HeapTrimmer().available  # glibc (Debian, and the images): musl would make it a no-op
    out = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True, check=True).stdout
    before_kib, after_kib, trims = map(int, out.split())
    assert trims == 1
    assert before_kib - after_kib > 20_000, (before_kib, after_kib)  # most of the freed 40 MB


def test_cadence_first_call_then_every_period() -> None:
    calls: list[int] = []

    def trim(pad: int) -> int:
        calls.append(pad)
        return 1

    trimmer = HeapTrimmer(every_seconds=300, trim=trim)
    for now in (10.0, 11.0, 309.0, 310.0, 311.0, 609.0, 610.0):
        trimmer.due(now)
    assert calls == [0, 0, 0]


def test_a_failing_trim_is_dropped_not_raised() -> None:
    def broken(pad: int) -> int:
        raise OSError("boom")

    trimmer = HeapTrimmer(every_seconds=1, trim=broken)
    trimmer.due(0.0)
    trimmer.due(5.0)
    assert not trimmer.available and trimmer.trims == 0
