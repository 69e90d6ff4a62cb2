"""A fake NVML node for backend tests: an injected clock, an H200 as the fake driver answers it,
and a backend over them."""

from __future__ import annotations

from typing import Any

from exporter.backends.nvml.backend import NvmlBackend
from tests.fakes.fake_pynvml import FakeGpu, FakeNvml


class Clock:
    """Injected monotonic clock; the wall clock follows it from a fixed epoch."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> float:
        return 1_700_000_000.0 + self.now


def h200(i: int = 0, **kw: object) -> FakeGpu:
    return FakeGpu(uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", pci_bus_id=f"00000000:{i:02X}:00.0", **kw)  # type: ignore[arg-type]


def make(fake: FakeNvml, clock: Clock, **kw: Any) -> NvmlBackend:
    return NvmlBackend(nvml=fake, clock=clock, wall_clock=clock.wall, **kw)
