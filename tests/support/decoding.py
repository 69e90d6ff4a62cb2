"""Watching the PodResources decoder's work: which strings it decodes."""

from __future__ import annotations

import pytest

from exporter.attribution import podresources_wire


def count_decoded_strings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The byte length of every string ``podresources_wire`` decodes from now on (the list grows as
    it decodes), so a test can show a decoder skipped the names it does not need."""
    decoded: list[int] = []
    real = podresources_wire._text

    def counting(buf: memoryview, start: int, end: int) -> str:
        decoded.append(end - start)
        return real(buf, start, end)

    monkeypatch.setattr(podresources_wire, "_text", counting)
    return decoded
