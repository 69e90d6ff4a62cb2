"""Bandwidth probes (HBM copy, pinned host-to-device, device-to-host) written once against an array module.

The measurement (buffer sizing, warm-up, median of N, byte accounting) is shared; an
``ArrayDevice`` supplies allocation, the three copies and a clock: ``CupyDevice`` times with CUDA
events on a GPU through CuPy's CUDA runtime bindings, ``NumpyDevice`` with ``perf_counter`` on the
host so CI runs the same code.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

MiB = 1 << 20


class ProbeError(Exception):
    """A probe could not run; ``kind`` is the machine-readable reason printed in the JSON error."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class DeviceInfo:
    """What the probe needs to know about the device it measures (bytes throughout)."""

    array: str
    """``cupy`` or ``numpy``."""
    index: int | None
    uuid: str | None
    name: str | None
    pci_bus_id: str | None
    cache_bytes: int
    """L2 cache of the GPU (NumPy: the CPU's last-level cache); buffers must dwarf it."""
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class BufferPlan:
    """Buffer sizes in bytes: ``copy_bytes`` each for the HBM copy's source and destination,
    ``transfer_bytes`` for the pinned host buffer and its device twin."""

    copy_bytes: int
    transfer_bytes: int

    @property
    def device_bytes(self) -> int:
        """Device memory the probe allocates."""
        return 2 * self.copy_bytes + self.transfer_bytes


def plan_buffers(
    info: DeviceInfo,
    *,
    cache_multiple: int = 16,
    min_cache_multiple: int = 4,
    max_free_fraction: float = 0.05,
    transfer_bytes: int = 24 * MiB,
    max_copy_bytes: int | None = None,
) -> BufferPlan:
    """Size the buffers so the copy streams from HBM, not from L2, and takes little memory.

    The copy buffer is ``cache_multiple`` x the cache (H200: 16 x 50 MiB = 800 MiB, so the copy
    moves 1.6 GiB), reduced to fit in ``max_free_fraction`` of free memory together with the other
    buffers.  If that leaves less than ``min_cache_multiple`` x the cache the result would measure
    the cache, so ``ProbeError("insufficient_memory")`` is raised instead.  ``max_copy_bytes`` caps
    the size for a fast run (NumPy in CI).
    """
    budget = int(info.free_bytes * max_free_fraction)
    copy = min(cache_multiple * info.cache_bytes, (budget - transfer_bytes) // 2)
    copy -= copy % MiB
    if copy < min_cache_multiple * info.cache_bytes or copy <= 0:
        need = 2 * min_cache_multiple * info.cache_bytes + transfer_bytes
        raise ProbeError(
            "insufficient_memory",
            f"probe needs {need} bytes ({max_free_fraction:.0%} of free memory at most), {info.free_bytes} bytes free",
        )
    if max_copy_bytes is not None:
        copy = min(copy, max_copy_bytes)
    return BufferPlan(copy_bytes=copy, transfer_bytes=transfer_bytes)


@dataclass(frozen=True)
class ProbeMeasurement:
    """One probe's result: median bandwidth over ``repeats`` timed copies after warm-up."""

    probe: str
    bytes_per_second: float
    """Bytes moved per copy / median copy time. For ``hbm_copy`` bytes read + bytes written."""
    bytes_moved: int
    """Bytes one copy moves."""
    gpu_seconds: float
    """Device time of every copy this probe issued, warm-up included (CUDA events)."""
    wall_seconds: float
    """Host wall time of the probe, from the first enqueue to the last completion."""
    repeats: int
    samples_seconds: tuple[float, ...]

    def as_json(self) -> dict[str, Any]:
        """The probe's entry in the CLI's JSON object."""
        return {
            "bytes_per_second": self.bytes_per_second,
            "bytes_moved": self.bytes_moved,
            "gpu_seconds": self.gpu_seconds,
            "wall_seconds": self.wall_seconds,
            "repeats": self.repeats,
            "samples_seconds": list(self.samples_seconds),
        }


class ArrayDevice(Protocol):
    """Allocation, copies and a clock for one device; copies may be asynchronous."""

    info: DeviceInfo

    def device_buffer(self, nbytes: int) -> Any:
        """A 1-D uint8 array of ``nbytes`` in device memory, pages resident."""
        ...

    def host_buffer(self, nbytes: int) -> Any:
        """A 1-D uint8 host array of ``nbytes``; page-locked (pinned) on a GPU."""
        ...

    def copy_on_device(self, dst: Any, src: Any) -> None:
        """Device memory to device memory."""
        ...

    def host_to_device(self, dst: Any, src: Any) -> None:
        """Host (pinned) to device."""
        ...

    def device_to_host(self, dst: Any, src: Any) -> None:
        """Device to host (pinned)."""
        ...

    def time_each(self, op: Callable[[], None], count: int) -> list[float]:
        """Run ``op`` ``count`` times back to back; each run's duration in seconds."""
        ...

    def close(self) -> None:
        """Release every buffer and handle the device gave out."""
        ...


def measure(
    device: ArrayDevice, probe: str, op: Callable[[], None], bytes_moved: int, warmup: int, repeats: int
) -> ProbeMeasurement:
    """Time ``op`` (warm-up runs discarded) and report the median bandwidth."""
    if repeats < 1 or warmup < 0:
        raise ProbeError("usage", "repeats must be >= 1 and warmup >= 0")
    start = time.perf_counter()
    durations = device.time_each(op, warmup + repeats)
    wall = time.perf_counter() - start
    samples = tuple(durations[warmup:])
    median = statistics.median(samples)
    if median <= 0:
        raise ProbeError("clock", f"{probe}: non-positive copy time {median!r}")
    return ProbeMeasurement(
        probe=probe,
        bytes_per_second=bytes_moved / median,
        bytes_moved=bytes_moved,
        gpu_seconds=sum(durations),
        wall_seconds=wall,
        repeats=repeats,
        samples_seconds=samples,
    )


def run_probes(
    device: ArrayDevice, plan: BufferPlan, *, warmup: int = 1, repeats: int = 5
) -> dict[str, ProbeMeasurement]:
    """Run ``hbm_copy``, ``h2d`` and ``d2h`` once each; results keyed by probe name."""
    src = device.device_buffer(plan.copy_bytes)
    dst = device.device_buffer(plan.copy_bytes)
    host = device.host_buffer(plan.transfer_bytes)
    staging = device.device_buffer(plan.transfer_bytes)
    results = {
        "hbm_copy": measure(
            device, "hbm_copy", lambda: device.copy_on_device(dst, src), 2 * plan.copy_bytes, warmup, repeats
        ),
        "h2d": measure(
            device, "h2d", lambda: device.host_to_device(staging, host), plan.transfer_bytes, warmup, repeats
        ),
        "d2h": measure(
            device, "d2h", lambda: device.device_to_host(host, staging), plan.transfer_bytes, warmup, repeats
        ),
    }
    return results


def _cpu_last_level_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """Largest cache of CPU 0 from sysfs (``32768K`` style sizes); 32 MiB when unreadable."""
    sizes = []
    for size_file in root.glob("index*/size"):
        text = size_file.read_text().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=32 * MiB)


class NumpyDevice:
    """The host as a stand-in device: same code path, ``perf_counter`` timing, host memcpy speeds.

    Its numbers describe the CPU's memory, not a GPU; it exists so CI executes the probe.
    """

    def __init__(self) -> None:
        import numpy

        self._np = numpy
        page = os.sysconf("SC_PAGE_SIZE")
        self.info = DeviceInfo(
            array="numpy",
            index=None,
            uuid=None,
            name="host (numpy)",
            pci_bus_id=None,
            cache_bytes=_cpu_last_level_cache_bytes(),
            free_bytes=os.sysconf("SC_AVPHYS_PAGES") * page,
            total_bytes=os.sysconf("SC_PHYS_PAGES") * page,
        )

    def device_buffer(self, nbytes: int) -> Any:
        buf = self._np.empty(nbytes, dtype=self._np.uint8)
        buf.fill(1)  # fault the pages in now, not inside the timed copies
        return buf

    host_buffer = device_buffer

    def copy_on_device(self, dst: Any, src: Any) -> None:
        self._np.copyto(dst, src)

    host_to_device = copy_on_device
    device_to_host = copy_on_device

    def time_each(self, op: Callable[[], None], count: int) -> list[float]:
        out = []
        for _ in range(count):
            start = time.perf_counter()
            op()
            out.append(time.perf_counter() - start)
        return out

    def close(self) -> None:
        """Nothing to release: the arrays are garbage collected."""


def format_cuda_uuid(raw: bytes | str | None) -> str | None:
    """CUDA's 16-byte device UUID in NVML's ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` form."""
    if raw is None:
        return None
    if isinstance(raw, str):
        return raw
    if len(raw) != 16:
        return None
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


CUDA_MEMCPY_HOST_TO_DEVICE = 1
CUDA_MEMCPY_DEVICE_TO_HOST = 2
CUDA_MEMCPY_DEVICE_TO_DEVICE = 3
CUDA_STREAM_NON_BLOCKING = 0x01
CUDA_HOST_ALLOC_DEFAULT = 0
CUDA_DEV_ATTR_L2_CACHE_SIZE = 38
CUDA_ERROR_MEMORY_ALLOCATION = 2
"""CUDA runtime ABI constants (``cudaMemcpyKind``, stream and host-alloc flags, ``cudaDevAttrL2CacheSize``,
``cudaErrorMemoryAllocation``): fixed by the CUDA API, spelled out so no CuPy version's naming matters."""


def load_cuda_runtime() -> Any:
    """CuPy's CUDA runtime bindings, the module CuPy exposes as ``cupy.cuda.runtime``.

    It is imported from where CuPy defines it (``cupy_backends.cuda.api.runtime``), which loads
    neither NumPy nor CuPy's array library: the probe needs only allocations, copies and events,
    and ``import cupy`` was most of its start-up (H200, page cache dropped: a probe process took
    1.79 s with it, 0.58 s without; docs/benchmarks.md).  Falls back to ``import cupy`` where
    this import fails (a CuPy release that moves the module, or one whose libraries only CuPy's
    own start-up can locate).  ``ProbeError("unavailable")`` when CuPy is not installed.
    """
    try:
        from cupy_backends.cuda.api import runtime
    except ImportError:
        try:
            import cupy
        except ImportError as exc:
            raise ProbeError("unavailable", f"cupy is not installed: {exc}") from exc
        runtime = cupy.cuda.runtime
    return runtime


@dataclass(frozen=True)
class CudaBuffer:
    """A raw allocation: ``ptr`` is a device pointer or a pinned host pointer, ``nbytes`` its size."""

    ptr: int
    nbytes: int


class CupyDevice:
    """One CUDA device through CuPy's runtime bindings: ``cudaMemcpyAsync`` on a private stream,
    CUDA-event timing, raw ``cudaMalloc`` / ``cudaHostAlloc`` buffers freed by ``close()``.

    ``index`` is the CUDA ordinal as this process sees it; the CLI narrows visibility with
    ``CUDA_VISIBLE_DEVICES`` so the context is created on the requested GPU only.  ``runtime`` is
    the module from ``load_cuda_runtime()`` (tests pass a fake with the same functions).
    """

    def __init__(self, index: int, runtime: Any) -> None:
        rt = runtime
        self._rt = rt
        count = rt.getDeviceCount()
        if not 0 <= index < count:
            raise ProbeError("device_not_found", f"CUDA device {index} not visible ({count} visible)")
        rt.setDevice(index)
        props = rt.getDeviceProperties(index)
        free, total = rt.memGetInfo()  # the first call that needs the context: CUDA starts here
        name = props.get("name")
        self.info = DeviceInfo(
            array="cupy",
            index=index,
            uuid=format_cuda_uuid(props.get("uuid")),
            name=name.decode() if isinstance(name, bytes) else name,
            pci_bus_id=rt.deviceGetPCIBusId(index),
            cache_bytes=int(rt.deviceGetAttribute(CUDA_DEV_ATTR_L2_CACHE_SIZE, index)),
            free_bytes=int(free),
            total_bytes=int(total),
        )
        self._stream = rt.streamCreateWithFlags(CUDA_STREAM_NON_BLOCKING)
        self._device_ptrs: list[int] = []
        self._host_ptrs: list[int] = []

    def device_buffer(self, nbytes: int) -> CudaBuffer:
        ptr = self._rt.malloc(nbytes)  # cudaMalloc backs the range with memory at allocation
        self._device_ptrs.append(ptr)
        return CudaBuffer(ptr, nbytes)

    def host_buffer(self, nbytes: int) -> CudaBuffer:
        ptr = self._rt.hostAlloc(nbytes, CUDA_HOST_ALLOC_DEFAULT)  # pinned: every page faulted in
        self._host_ptrs.append(ptr)
        return CudaBuffer(ptr, nbytes)

    def _copy(self, dst: CudaBuffer, src: CudaBuffer, kind: int) -> None:
        self._rt.memcpyAsync(dst.ptr, src.ptr, min(dst.nbytes, src.nbytes), kind, self._stream)

    def copy_on_device(self, dst: CudaBuffer, src: CudaBuffer) -> None:
        self._copy(dst, src, CUDA_MEMCPY_DEVICE_TO_DEVICE)

    def host_to_device(self, dst: CudaBuffer, src: CudaBuffer) -> None:
        self._copy(dst, src, CUDA_MEMCPY_HOST_TO_DEVICE)

    def device_to_host(self, dst: CudaBuffer, src: CudaBuffer) -> None:
        self._copy(dst, src, CUDA_MEMCPY_DEVICE_TO_HOST)

    def time_each(self, op: Callable[[], None], count: int) -> list[float]:
        # Events recorded back to back on the probe's stream: event i+1 - event i is copy i on
        # the GPU's clock.  Host enqueue overlaps the previous copy, so only the first (warm-up)
        # interval can include host time.
        rt = self._rt
        events = [rt.eventCreate() for _ in range(count + 1)]
        try:
            rt.eventRecord(events[0], self._stream)
            for i in range(count):
                op()
                rt.eventRecord(events[i + 1], self._stream)
            rt.eventSynchronize(events[-1])
            return [rt.eventElapsedTime(events[i], events[i + 1]) / 1e3 for i in range(count)]
        finally:
            for event in events:
                rt.eventDestroy(event)

    def close(self) -> None:
        """Wait for the stream, free every buffer and the stream (the process exits next anyway)."""
        rt = self._rt
        rt.streamSynchronize(self._stream)
        while self._device_ptrs:
            rt.free(self._device_ptrs.pop())
        while self._host_ptrs:
            rt.freeHost(self._host_ptrs.pop())
        rt.streamDestroy(self._stream)
