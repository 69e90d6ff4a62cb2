"""CPU cost of one ``NvmlBackend.sample()`` cycle over the fake NVML, with no driver time in it.

    .venv/bin/python -m bench.nvml_cycle [--cycles 2000] [--repeat 5] [--against REF] [--json FILE]

What it isolates: the backend's own Python work per cycle (error gate, readers, snapshot
building) for two node shapes, 8 whole GPUs with one process each, and 8 GPUs x 7 MIG instances
with one process per instance. The fake answers every NVML call at once, so on a real GPU the
driver's time (milliseconds per call for PCIe and energy) comes on top; that part is measured by
``scripts/gpu_check.py``. Reported: median over ``repeat`` runs of the mean microseconds per
cycle, and the NVML calls one cycle makes (which a refactoring must not change).

``--against REF`` times the ``NvmlBackend`` of git revision REF too, in the same process and
alternating run by run with this tree's, over the same fake, and reports the ratio: the way to
show that a change to the backend kept its hot path as cheap.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any

from exporter.backends.nvml.backend import NvmlBackend
from tests.fakes.fake_pynvml import FakeGpu, FakeMig, FakeNvml, FakeProcess

SM, DRAM, TENSOR = 2, 10, 5


class _Clock:
    """Monotonic clock that advances one second per ``sample()`` so GPM windows are complete."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> float:
        return 1.7e9 + self.now


def whole_gpus(n: int = 8) -> list[FakeGpu]:
    """``n`` H200s, MIG off, one busy process each."""
    return [
        FakeGpu(
            uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000",
            gpm={SM: 50.0, DRAM: 30.0, TENSOR: 20.0},
            processes=[FakeProcess(pid=1000 + i)],
            process_util=[(1000 + i, 50, 30)],
            nvlink=True,
        )
        for i in range(n)
    ]


def mig_gpus(n: int = 8, per_gpu: int = 7) -> list[FakeGpu]:
    """``n`` H200s with ``per_gpu`` 1g.18gb instances, one process in each."""
    gpus = []
    for i in range(n):
        migs = [
            FakeMig(
                uuid=f"MIG-{i:04d}{m:04d}-0000-0000-0000-000000000000",
                gpu_instance_id=m + 7,
                gpm={SM: 40.0, DRAM: 20.0},
                processes=[FakeProcess(pid=10_000 + 10 * i + m, gpu_instance_id=m + 7, compute_instance_id=0)],
            )
            for m in range(per_gpu)
        ]
        gpus.append(
            FakeGpu(
                uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000",
                mig_mode=1,
                migs=migs,
                process_util=[(10_000 + 10 * i + m, 40, 20) for m in range(per_gpu)],
            )
        )
    return gpus


REPO = Path(__file__).resolve().parents[1]
_PACKAGE = "exporter_at_ref"


def backend_at(ref: str, into: Path) -> Any:
    """``NvmlBackend`` of git revision ``ref``: its ``exporter/`` unpacked under ``into`` as a
    package of another name (imports rewritten), so both versions load in one process."""
    archive = subprocess.run(["git", "archive", ref, "exporter"], cwd=REPO, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    (into / "exporter").rename(into / _PACKAGE)
    for path in (into / _PACKAGE).rglob("*.py"):
        path.write_text(re.sub(r"\bexporter\.", _PACKAGE + ".", path.read_text()))
    sys.path.insert(0, str(into))
    return importlib.import_module(_PACKAGE + ".backends.nvml.backend").NvmlBackend


def time_shape(gpus: list[FakeGpu], cycles: int, backend_type: Callable[..., Any] = NvmlBackend) -> tuple[float, float]:
    """Mean CPU microseconds (this process) per ``sample()`` after 20 warm-up cycles, and NVML calls per cycle."""
    fake = FakeNvml(gpus)
    clock = _Clock()
    backend = backend_type(nvml=fake, clock=clock, wall_clock=clock.wall)
    for _ in range(20):
        backend.sample()
        clock.now += 1.0
    before = sum(fake.calls.values())
    t0 = time.process_time()
    for _ in range(cycles):
        backend.sample()
        clock.now += 1.0
    elapsed = time.process_time() - t0
    calls = (sum(fake.calls.values()) - before) / cycles
    backend.close()
    return elapsed / cycles * 1e6, calls


def main() -> None:
    """Time both shapes and print one line each (JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--against", metavar="REF", help="also time the backend of this git revision")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        other = backend_at(args.against, Path(tmp)) if args.against else None
        results = {}
        for label, make in (("8 GPUs", whole_gpus), ("8 GPUs x 7 MIG", mig_gpus)):
            runs, refs = [], []
            for _ in range(args.repeat):
                runs.append(time_shape(make(), args.cycles))
                if other is not None:
                    refs.append(time_shape(make(), args.cycles, other))
            us, calls = statistics.median(r[0] for r in runs), runs[0][1]
            line = f"{label:16s} {us:8.1f} us/cycle  {calls:6.1f} NVML calls/cycle"
            results[label] = {"us_per_cycle": round(us, 1), "nvml_calls_per_cycle": calls}
            if refs:
                ref_us, ref_calls = statistics.median(r[0] for r in refs), refs[0][1]
                line += f"   {args.against}: {ref_us:8.1f} us/cycle  {ref_calls:6.1f} calls  ratio {us / ref_us:.2f}"
                results[label] |= {"ref_us_per_cycle": round(ref_us, 1), "ref_nvml_calls_per_cycle": ref_calls}
            print(line, flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
