"""Bounded, non-blocking reads of host files (procfs, sysfs) that a hostile or broken tree cannot
turn into a hang or a memory spike.

Every open is ``O_NONBLOCK``: a FIFO opens and reads at once (empty) instead of waiting for a
writer, and a device node never blocks the reader.  Every read stops at a byte limit, every
directory listing at an entry limit, so a planted huge file or a directory of a million entries
costs at most the bound.
"""

from __future__ import annotations

import errno
import heapq
import os
import stat
from collections.abc import Callable, Iterator
from typing import Any

OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
"""How every host file is opened."""


def read_bounded(path: str, limit: int) -> str:
    """At most ``limit`` bytes of a regular file, decoded leniently.  Checked with fstat before
    reading, so a FIFO, socket or device raises ``OSError`` at once instead of blocking."""
    fd = os.open(path, OPEN_FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        chunks: list[bytes] = []
        left = limit
        while left > 0:
            chunk = os.read(fd, min(left, 16 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", errors="replace")


def read_text(path: str, limit: int = 4096) -> str | None:
    """A small regular file's text, stripped; ``None`` when it is missing, not a regular file or
    unreadable (sysfs answers EINVAL or EIO for an attribute the hardware does not support)."""
    try:
        return read_bounded(path, limit).strip()
    except (OSError, ValueError):
        return None


def list_dir(path: str, limit: int) -> list[os.DirEntry[str]]:
    """At most ``limit`` entries of a directory (in the kernel's order), ``[]`` when it is missing
    or unreadable."""
    out: list[os.DirEntry[str]] = []
    try:
        with os.scandir(path) as it:
            for entry in it:
                out.append(entry)
                if len(out) >= limit:
                    break
    except OSError:
        return []
    return out


def smallest_entries(
    path: str, keep: int, key: Callable[[os.DirEntry[str]], Any], cap: int
) -> tuple[list[os.DirEntry[str]], int, bool]:
    """The ``keep`` entries of a directory with the smallest ``key``, sorted by it, chosen among its
    first ``cap`` entries (in the kernel's order); how many entries were looked at; and whether the
    directory has more than ``cap`` (then that count is a lower bound).  Memory is ``keep`` entries
    whatever the directory holds, and the work ``cap`` calls of ``key`` at most, so every name of a
    large directory is looked at (the best are found wherever they are listed) without opening any
    file.  ``[]``, 0 when the directory is missing or unreadable."""
    seen = 0

    def counted(it: Iterator[os.DirEntry[str]]) -> Iterator[os.DirEntry[str]]:
        nonlocal seen
        for entry in it:
            seen += 1
            yield entry
            if seen >= cap:
                return

    try:
        with os.scandir(path) as it:
            best: list[os.DirEntry[str]] = []
            if keep > 0 and cap > 0:
                best = heapq.nsmallest(keep, counted(it), key=key)
            elif cap > 0:
                for _ in counted(it):  # nothing to keep: only counted
                    pass
            more = seen >= cap and next(it, None) is not None
    except OSError:
        return [], 0, False
    return best, seen, more
