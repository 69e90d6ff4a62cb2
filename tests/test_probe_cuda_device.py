"""``CupyDevice`` against a fake of CuPy's CUDA runtime module (the seam below it), and, on a GPU
machine, that the probe loads CuPy's runtime bindings without NumPy or CuPy's array library."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from probes import cli
from probes.bandwidth import (
    CUDA_MEMCPY_DEVICE_TO_DEVICE,
    CUDA_MEMCPY_DEVICE_TO_HOST,
    CUDA_MEMCPY_HOST_TO_DEVICE,
    BufferPlan,
    CupyDevice,
    MiB,
    ProbeError,
    load_cuda_runtime,
    run_probes,
)

REPO = Path(__file__).resolve().parents[1]


class CUDARuntimeError(RuntimeError):
    """Named like CuPy's, which the CLI classifies by name and ``status``."""

    def __init__(self, status: int) -> None:
        super().__init__(f"cudaError {status}")
        self.status = status


class FakeRuntime:  # method names are CuPy's (camelCase, as the CUDA runtime's)
    """The functions of ``cupy.cuda.runtime`` the probe calls, on a simulated GPU.

    Each copy takes ``bytes / rate[kind]`` on a simulated GPU clock that events read; handles are
    tracked so the test can see that everything handed out was released.
    """

    def __init__(self, devices: int = 1, fail_malloc_over: int | None = None) -> None:
        self.devices = devices
        self.fail_malloc_over = fail_malloc_over
        self.rate = {
            CUDA_MEMCPY_DEVICE_TO_DEVICE: 4e12,
            CUDA_MEMCPY_HOST_TO_DEVICE: 55e9,
            CUDA_MEMCPY_DEVICE_TO_HOST: 50e9,
        }
        self.clock = 0.0
        self.copies: list[tuple[int, int, int, int, int]] = []
        self.live: dict[str, set[int]] = {"device": set(), "host": set(), "stream": set(), "event": set()}
        self.event_time: dict[int, float] = {}
        self.current: int | None = None
        self._next = 0x1000

    def _handle(self, kind: str) -> int:
        self._next += 0x1000
        self.live[kind].add(self._next)
        return self._next

    def _release(self, kind: str, handle: int) -> None:
        self.live[kind].remove(handle)  # KeyError = double free or foreign handle

    def getDeviceCount(self) -> int:
        return self.devices

    def setDevice(self, index: int) -> None:
        self.current = index

    def getDeviceProperties(self, index: int) -> dict[str, Any]:
        return {"name": b"NVIDIA H200", "uuid": bytes(range(16))}

    def memGetInfo(self) -> tuple[int, int]:
        return 140 << 30, 141 << 30

    def deviceGetPCIBusId(self, index: int) -> str:
        return "0000:19:00.0"

    def deviceGetAttribute(self, attr: int, index: int) -> int:
        assert attr == 38  # cudaDevAttrL2CacheSize
        return 60 * MiB

    def streamCreateWithFlags(self, flags: int) -> int:
        assert flags == 1  # non-blocking: never serialised behind a tenant's legacy default stream
        return self._handle("stream")

    def malloc(self, nbytes: int) -> int:
        if self.fail_malloc_over is not None and nbytes > self.fail_malloc_over:
            raise CUDARuntimeError(2)  # cudaErrorMemoryAllocation
        return self._handle("device")

    def hostAlloc(self, nbytes: int, flags: int) -> int:
        return self._handle("host")

    def memcpyAsync(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        assert stream in self.live["stream"]
        self.copies.append((dst, src, nbytes, kind, stream))
        self.clock += nbytes * (2 if kind == CUDA_MEMCPY_DEVICE_TO_DEVICE else 1) / self.rate[kind]

    def eventCreate(self) -> int:
        return self._handle("event")

    def eventRecord(self, event: int, stream: int) -> None:
        self.event_time[event] = self.clock

    def eventSynchronize(self, event: int) -> None:
        assert event in self.event_time

    def eventElapsedTime(self, start: int, end: int) -> float:
        return (self.event_time[end] - self.event_time[start]) * 1e3  # milliseconds, as CUDA

    def eventDestroy(self, event: int) -> None:
        self._release("event", event)

    def streamSynchronize(self, stream: int) -> None:
        assert stream in self.live["stream"]

    def free(self, ptr: int) -> None:
        self._release("device", ptr)

    def freeHost(self, ptr: int) -> None:
        self._release("host", ptr)

    def streamDestroy(self, stream: int) -> None:
        self._release("stream", stream)


def test_device_info_comes_from_the_cuda_runtime() -> None:
    rt = FakeRuntime(devices=2)
    device = CupyDevice(1, rt)
    assert rt.current == 1
    info = device.info
    assert (info.array, info.index, info.name, info.pci_bus_id) == ("cupy", 1, "NVIDIA H200", "0000:19:00.0")
    assert info.uuid == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert info.cache_bytes == 60 * MiB
    assert (info.free_bytes, info.total_bytes) == (140 << 30, 141 << 30)
    device.close()


def test_a_device_that_is_not_visible_is_reported_as_such() -> None:
    with pytest.raises(ProbeError) as err:
        CupyDevice(1, FakeRuntime(devices=1))
    assert err.value.kind == "device_not_found"


def test_each_probe_issues_its_own_copy_kind_and_is_timed_on_the_gpu_clock() -> None:
    rt = FakeRuntime()
    device = CupyDevice(0, rt)
    plan = BufferPlan(copy_bytes=960 * MiB, transfer_bytes=24 * MiB)
    results = run_probes(device, plan, warmup=1, repeats=5)
    device.close()
    kinds = [c[3] for c in rt.copies]
    assert (
        kinds
        == [CUDA_MEMCPY_DEVICE_TO_DEVICE] * 6 + [CUDA_MEMCPY_HOST_TO_DEVICE] * 6 + [CUDA_MEMCPY_DEVICE_TO_HOST] * 6
    )
    d2d, h2d, d2h = rt.copies[0], rt.copies[6], rt.copies[12]
    assert d2d[2] == 960 * MiB and d2d[0] != d2d[1]
    assert h2d[2] == d2h[2] == 24 * MiB
    assert (h2d[0], h2d[1]) == (d2h[1], d2h[0])  # the same pinned buffer and device twin, both ways
    assert results["hbm_copy"].bytes_per_second == pytest.approx(4e12)
    assert results["h2d"].bytes_per_second == pytest.approx(55e9)
    assert results["d2h"].bytes_per_second == pytest.approx(50e9)
    total = 6 * (2 * 960 * MiB / 4e12 + 24 * MiB / 55e9 + 24 * MiB / 50e9)
    assert sum(m.gpu_seconds for m in results.values()) == pytest.approx(total)


def test_close_releases_every_buffer_stream_and_event() -> None:
    rt = FakeRuntime()
    device = CupyDevice(0, rt)
    run_probes(device, BufferPlan(copy_bytes=64 * MiB, transfer_bytes=MiB), warmup=1, repeats=3)
    assert rt.live["event"] == set()  # events go as soon as their probe is timed
    device.close()
    assert rt.live == {"device": set(), "host": set(), "stream": set(), "event": set()}


def test_cli_runs_the_probes_through_the_cuda_runtime(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rt = FakeRuntime()
    monkeypatch.setattr(cli, "load_cuda_runtime", lambda: rt)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.setattr(cli, "_emitted", False)
    assert cli.main(["--device", "0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["array"] == "cupy"
    assert doc["buffers"]["copy_bytes"] == 16 * 60 * MiB  # 16 x L2, so HBM is measured, not cache
    assert doc["probes"]["hbm_copy"]["bytes_per_second"] == pytest.approx(4e12)
    assert rt.live == {"device": set(), "host": set(), "stream": set(), "event": set()}


def test_cuda_allocation_failure_is_out_of_memory_and_frees_what_was_taken(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rt = FakeRuntime(fail_malloc_over=100 * MiB)
    monkeypatch.setattr(cli, "load_cuda_runtime", lambda: rt)
    monkeypatch.setattr(cli, "_emitted", False)
    assert cli.main(["--device", "0", "--buffer-bytes", str(64 * MiB), "--transfer-bytes", str(200 * MiB)]) == 4
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["type"] == "out_of_memory"
    assert rt.live == {"device": set(), "host": set(), "stream": set(), "event": set()}


@pytest.mark.gpu
def test_probe_loads_cupys_cuda_runtime_without_numpy_or_cupys_array_library() -> None:
    pytest.importorskip("cupy_backends")
    code = (
        "import sys; from probes.bandwidth import load_cuda_runtime; rt = load_cuda_runtime(); "
        "print(rt.__name__, sorted({'cupy', 'numpy'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["cupy_backends.cuda.api.runtime", "[]"]


def test_runtime_bindings_fall_back_to_import_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_runtime = types.ModuleType("cupy.cuda.runtime")
    fake_cupy = types.ModuleType("cupy")
    fake_cupy.cuda = types.SimpleNamespace(runtime=fake_runtime)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy_backends", None)  # None in sys.modules: import fails
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    assert load_cuda_runtime() is fake_runtime


def test_without_cupy_the_probe_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy_backends", None)
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(ProbeError) as err:
        load_cuda_runtime()
    assert err.value.kind == "unavailable"
