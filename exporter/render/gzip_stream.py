"""Gzip for ``/metrics`` replies: whole pages, and a cached page finished per request.

A scrape's CPU matters more than its bytes, so level 1 (a page of an 8-GPU node compresses about
10x at that level).  ``GzipHead`` keeps a page's compressed head and the compressor's state after
it, so that a reply whose only new bytes are a short tail (the snapshot's age) costs compressing
that tail, not the page.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any

GZIP_LEVEL = 1
"""zlib level of every gzipped reply."""


def _compressor() -> Any:
    return zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS)


def gzip_parts(parts: Iterable[bytes | memoryview]) -> bytes:
    """The concatenated ``parts`` as one gzip stream, compressed part by part (never joined first)."""
    z = _compressor()
    return b"".join([*(z.compress(p) for p in parts), z.flush()])


class GzipHead:
    """The gzip stream of a page's cached part, flushed to a byte boundary, and the compressor's
    state after it.  ``finish(tail)`` ends the stream with a per-request tail, compressing the
    tail alone on a copy of that state: the copy is ~0.3 MB of memory for the moment, and far
    less CPU than compressing the page again."""

    def __init__(self, head: bytes | memoryview) -> None:
        self._z = _compressor()
        self.head = self._z.compress(head) + self._z.flush(zlib.Z_SYNC_FLUSH)

    def finish(self, tail: bytes) -> bytes:
        """The rest of the stream: ``tail`` compressed, and the gzip trailer."""
        z = self._z.copy()
        return z.compress(tail) + z.flush()
