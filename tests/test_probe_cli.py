"""The probe CLI and its measurement code, run on NumPy as CI runs them (no GPU)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from probes import cli
from probes.bandwidth import BufferPlan, DeviceInfo, MiB, ProbeError, format_cuda_uuid, plan_buffers, run_probes

REPO = Path(__file__).resolve().parents[1]


def _probe(*args: str, timeout: float = 60) -> tuple[int, dict[str, Any], float]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "probes", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    elapsed = time.perf_counter() - start
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, f"expected exactly one JSON line, got {proc.stdout!r} / {proc.stderr!r}"
    return proc.returncode, json.loads(lines[0]), elapsed


@pytest.mark.integration  # runs another program
def test_numpy_probe_prints_one_json_object_with_all_three_probes() -> None:
    rc, doc, _ = _probe("--array", "numpy", "--repeats", "3")
    assert rc == 0, doc
    assert doc["array"] == "numpy"
    assert set(doc["probes"]) == {"hbm_copy", "h2d", "d2h"}
    for name, entry in doc["probes"].items():
        assert entry["bytes_per_second"] > 0, name
        assert entry["bytes_moved"] > 0
        assert entry["gpu_seconds"] > 0
        assert entry["wall_seconds"] >= entry["gpu_seconds"] * 0.5
        assert len(entry["samples_seconds"]) == 3
    assert doc["gpu_seconds"] == pytest.approx(sum(p["gpu_seconds"] for p in doc["probes"].values()))


@pytest.mark.integration  # runs another program
def test_hbm_copy_counts_bytes_read_plus_written() -> None:
    rc, doc, _ = _probe("--array", "numpy", "--buffer-bytes", str(4 * MiB), "--transfer-bytes", str(MiB))
    assert rc == 0, doc
    hbm = doc["probes"]["hbm_copy"]
    assert hbm["bytes_moved"] == 2 * 4 * MiB
    assert doc["probes"]["h2d"]["bytes_moved"] == MiB
    median = sorted(hbm["samples_seconds"])[len(hbm["samples_seconds"]) // 2]
    assert hbm["bytes_per_second"] == pytest.approx(hbm["bytes_moved"] / median)


@pytest.mark.integration  # runs another program
def test_allocation_failure_is_a_json_out_of_memory_error() -> None:
    rc, doc, _ = _probe("--array", "numpy", "--buffer-bytes", str(1 << 60))
    assert rc == 4
    assert doc["error"]["type"] == "out_of_memory"
    assert "allocate" in doc["error"]["message"]


@pytest.mark.integration  # runs another program
def test_bad_arguments_are_a_json_usage_error() -> None:
    rc, doc, _ = _probe("--array", "numpy", "--repeats", "many")
    assert rc == 2
    assert doc["error"]["type"] == "usage"


@pytest.mark.integration  # runs another program
def test_probe_gives_up_at_its_timeout_with_a_json_error() -> None:
    # A thousand 512 MiB NumPy copies cannot finish in 0.3 s: the watchdog must say so and exit.
    rc, doc, elapsed = _probe(
        "--array", "numpy", "--timeout", "0.3", "--buffer-bytes", str(256 * MiB), "--repeats", "1000"
    )
    assert rc == 3
    assert doc["error"]["type"] == "timeout"
    assert elapsed < 10


@pytest.mark.integration  # runs another program
def test_cupy_missing_or_without_a_gpu_is_a_json_error_not_a_traceback() -> None:
    rc, doc, _ = _probe("--array", "cupy", "--device", "0")
    assert rc != 0
    assert doc["error"]["type"] in {"unavailable", "cuda_error", "device_not_found"}


def _info(cache: int, free: int) -> DeviceInfo:
    return DeviceInfo("cupy", 0, None, "NVIDIA H200", None, cache, free, free)


def test_buffers_dwarf_the_h200_l2_and_take_a_small_share_of_memory() -> None:
    l2 = 50 * MiB  # H200 datasheet (docs/h200-facts.md)
    free = 140 * 1024 * MiB
    plan = plan_buffers(_info(l2, free))
    assert plan.copy_bytes >= 16 * l2
    assert plan.device_bytes <= 0.05 * free


def test_buffers_shrink_to_fit_a_small_mig_instance() -> None:
    plan = plan_buffers(_info(12 * MiB, 16 * 1024 * MiB))
    assert plan.device_bytes <= 0.05 * 16 * 1024 * MiB
    assert plan.copy_bytes >= 4 * 12 * MiB


def test_too_little_memory_to_beat_the_cache_is_refused() -> None:
    with pytest.raises(ProbeError) as err:
        plan_buffers(_info(50 * MiB, 2 * 1024 * MiB))
    assert err.value.kind == "insufficient_memory"


class _CountingDevice:
    """A fake device whose every copy takes a known time: checks warm-up and median handling."""

    def __init__(self, durations: list[float]) -> None:
        self.info = _info(MiB, 1 << 34)
        self._durations = durations
        self.calls = 0

    def device_buffer(self, nbytes: int) -> bytearray:
        return bytearray(nbytes)

    host_buffer = device_buffer

    def copy_on_device(self, dst: bytearray, src: bytearray) -> None:
        self.calls += 1

    host_to_device = copy_on_device
    device_to_host = copy_on_device

    def time_each(self, op: Any, count: int) -> list[float]:
        for _ in range(count):
            op()
        return self._durations[:count]

    def close(self) -> None:
        pass


def test_warmup_is_discarded_and_the_median_reported() -> None:
    device = _CountingDevice([1.0, 0.004, 0.002, 0.003])  # slow first (cold) copy
    plan = BufferPlan(copy_bytes=1000, transfer_bytes=500)
    results = run_probes(device, plan, warmup=1, repeats=3)
    assert results["hbm_copy"].bytes_per_second == pytest.approx(2000 / 0.003)
    assert results["hbm_copy"].gpu_seconds == pytest.approx(1.009)
    assert results["h2d"].bytes_per_second == pytest.approx(500 / 0.003)
    assert device.calls == 3 * 4


def test_cuda_uuid_is_formatted_like_nvml() -> None:
    raw = bytes.fromhex("0123456789abcdef0011223344556677")
    assert format_cuda_uuid(raw) == "GPU-01234567-89ab-cdef-0011-223344556677"
    assert format_cuda_uuid(None) is None


def test_uuid_restricts_cuda_to_that_gpu_or_mig_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[int] = []
    monkeypatch.setattr(cli, "load_cuda_runtime", lambda: "runtime")
    monkeypatch.setattr(cli, "CupyDevice", lambda index, runtime: opened.append(index))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    mig = "MIG-2a1ca17e-6c95-5b34-a4a9-19ee253a5385"
    cli._open_device(argparse.Namespace(array="cupy", uuid=mig, device=None))
    assert opened == [0]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == mig


def test_device_index_follows_nvidia_smi_pci_order(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[int] = []
    monkeypatch.setattr(cli, "load_cuda_runtime", lambda: "runtime")
    monkeypatch.setattr(cli, "CupyDevice", lambda index, runtime: opened.append(index))
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    cli._open_device(argparse.Namespace(array="cupy", uuid=None, device=3))
    assert opened == [3]
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


@pytest.mark.integration  # runs another program
def test_exporter_side_never_imports_cupy_or_numpy() -> None:
    code = "import sys, exporter.probe_scheduler; print(sorted({'cupy', 'numpy', 'torch'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- every option: ASCII digits, finite, within its stated range; a usage error names it ---------


def _probe_usage(*args: str) -> tuple[int, dict[str, Any], str]:
    """Run the CLI on arguments it must refuse: (exit status, the JSON line, stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "probes", "--array", "numpy", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, f"expected exactly one JSON line, got {proc.stdout!r} / {proc.stderr!r}"
    return proc.returncode, json.loads(lines[0]), proc.stderr


@pytest.mark.integration  # runs another program
@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--timeout", "inf"),
        ("--timeout", "nan"),
        ("--timeout", "1e9"),
        ("--timeout", "3601"),
        ("--timeout", "1_0"),
        ("--timeout", "\u0665"),  # ARABIC-INDIC DIGIT FIVE
        ("--buffer-bytes", "-5"),
        ("--buffer-bytes", "99999999999999999999999"),
        ("--transfer-bytes", "-1"),
        ("--transfer-bytes", "0"),
        ("--repeats", "0"),
        ("--repeats", "100000000000"),
        ("--warmup", "-1"),
        ("--device", "-1"),
        ("--device", "\uff11"),  # FULLWIDTH DIGIT ONE
        ("--device", "256"),
        ("--uuid", ""),
        ("--uuid", "0,1"),
    ],
)
def test_bad_option_value_is_a_usage_error_naming_the_option(option: str, value: str) -> None:
    rc, doc, stderr = _probe_usage(f"{option}={value}")
    assert rc == 2, doc
    assert doc["error"]["type"] == "usage"
    assert option in doc["error"]["message"]
    assert option in stderr
    assert "Traceback" not in stderr


def test_option_parsers_take_what_the_exporter_passes_and_state_their_range() -> None:
    assert cli._seconds("0.900") == 0.9  # the scheduler passes 90 % of --probes.timeout, 3 decimals
    assert cli._seconds("3240.000") == 3240.0
    assert cli._whole(1, cli.MAX_BUFFER_BYTES)(str(1 << 60)) == 1 << 60
    for uuid in (
        "GPU-01234567-89ab-cdef-0011-223344556677",
        "MIG-2a1ca17e-6c95-5b34-a4a9-19ee253a5385",
        "MIG-GPU-01234567-89ab-cdef-0011-223344556677/1/0",
    ):
        assert cli._uuid(uuid) == uuid
    with pytest.raises(argparse.ArgumentTypeError, match=r"1\.\.1000"):
        cli._whole(1, cli.MAX_COPIES)("1001")
