"""A scriptable in-test GpuBackend: each sample() returns the next queued BackendSample."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from exporter.model import BackendSample, GpmSample, GpuSample, LeafSample, ProcessSample


def gpu(index: int, **kw: object) -> GpuSample:
    """A healthy whole GPU with one leaf; keyword overrides apply to the GpuSample."""
    uuid = f"GPU-{index:08d}-0000-0000-0000-000000000000"
    leaf = LeafSample(
        uuid=uuid,
        memory_used_bytes=1 << 30,
        memory_total_bytes=80 << 30,
        utilization_ratio=0.5,
        gpm=GpmSample(window_seconds=1.0, sm_active=0.5, dram_active=0.25, tensor_active=0.1),
        processes=(ProcessSample(pid=1000 + index, used_memory_bytes=1 << 30),),
    )
    fields: dict[str, object] = {
        "index": index,
        "uuid": uuid,
        "name": "NVIDIA H200",
        "utilization_ratio": 0.5,
        "power_watts": 300.0,
        "energy_joules": 1000.0,
        "leaves": (leaf,),
    }
    fields.update(kw)
    return GpuSample(**fields)  # type: ignore[arg-type]


class ScriptedBackend:
    """Returns ``make(n)`` for the n-th call; ``hang`` makes calls block until released."""

    name = "sim"

    def __init__(self, make: Callable[[int], BackendSample]) -> None:
        self._make = make
        self.calls = 0
        self.hang = False
        self.release = threading.Event()
        self.closed = False

    def sample(self) -> BackendSample:
        self.calls += 1
        if self.hang:
            self.release.wait(30)
        return self._make(self.calls)

    def close(self) -> None:
        self.closed = True


def healthy(n_gpus: int = 2) -> Callable[[int], BackendSample]:
    """A backend factory of ``n_gpus`` healthy GPUs."""
    return lambda _n: BackendSample(up=True, driver_version="580.159.04", gpus=tuple(gpu(i) for i in range(n_gpus)))


def wait_until(pred: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll ``pred`` until true or timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return pred()
