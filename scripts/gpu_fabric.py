"""Real-GPU check of the NVLink fabric reads: what NVML answers, and what NvmlBackend makes of it.

Run on a machine with an NVIDIA GPU, from the repository root:
    python3 scripts/gpu_fabric.py [--out DIR] [--cycles N]
For every GPU, prints what ``nvmlDeviceGetGpuFabricInfoV`` (with each struct version the binding
has) and the older ``nvmlDeviceGetGpuFabricInfo`` answer, raw; then samples NvmlBackend ``N``
cycles (``slow_every`` 10) and prints each GPU's ``fabric``, the cycles' error counts and how often
the backend called each fabric function. With ``--out`` (default: ``$OUT`` when set) it writes the
same as DIR/gpu_fabric.json (tests/fixtures/nvml_fabric/h200.json keeps the raw answers of one such
run). GPU UUIDs are left out.
Reads only: nothing on the GPU is changed.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import sys
from collections import Counter
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pynvml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exporter.backends.nvml.backend import NvmlBackend

FABRIC_FUNCTIONS = ("nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo")
#: (function, struct class name) pairs asked directly, newest struct first.
RAW_CALLS = (
    ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v3_t"),
    ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v2_t"),
    ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
)


def error_name(code: int) -> str:
    """``NOT_SUPPORTED`` for 3: the binding's ``NVML_ERROR_*`` constant's name, or ``SUCCESS``."""
    if code == pynvml.NVML_SUCCESS:
        return "SUCCESS"
    for attr in dir(pynvml):
        if attr.startswith("NVML_ERROR_") and getattr(pynvml, attr) == code:
            return attr.removeprefix("NVML_ERROR_")
    return f"CODE_{code}"


def struct_fields(info: Any) -> dict[str, Any]:
    """Every field of a filled fabric info struct, the cluster UUID as hex and the status named."""
    out: dict[str, Any] = {}
    for name, *_ in info._fields_:
        value = getattr(info, name)
        if name == "clusterUuid":
            value = bytes(value).hex()
        elif name == "version":
            value = hex(value)
        out[name] = value
    out["status_name"] = error_name(int(info.status))
    return out


def raw_answer(handle: Any, function: str, struct_name: str) -> dict[str, Any]:
    """What one call answers: the filled struct, or the NVML error it raised."""
    fn: Callable[..., Any] | None = getattr(pynvml, function, None)
    struct = getattr(pynvml, struct_name, None)
    if fn is None or struct is None:
        return {"absent_from_binding": function if fn is None else struct_name}
    info = struct()
    try:
        fn(handle, ctypes.byref(info))
    except pynvml.NVMLError as exc:
        return {"error": error_name(exc.value)}
    return {"struct": struct_fields(info)}


def counted(calls: Counter[str]) -> None:
    """Wrap the binding's fabric functions so that ``calls`` counts the backend's calls of each."""
    for name in FABRIC_FUNCTIONS:
        fn = getattr(pynvml, name, None)
        if fn is None:
            continue

        def wrapper(*args: Any, _fn: Callable[..., Any] = fn, _name: str = name) -> Any:
            calls[_name] += 1
            return _fn(*args)

        setattr(pynvml, name, wrapper)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT"), help="folder for gpu_fabric.json")
    parser.add_argument("--cycles", type=int, default=12, help="NvmlBackend cycles to sample")
    args = parser.parse_args()
    try:
        binding = version("nvidia-ml-py")
    except PackageNotFoundError:
        binding = "unknown"
    pynvml.nvmlInit()
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            answers = {f"{fn}({struct})": raw_answer(handle, fn, struct) for fn, struct in RAW_CALLS}
            gpus.append({"index": index, "name": pynvml.nvmlDeviceGetName(handle), "answers": answers})
    finally:
        pynvml.nvmlShutdown()
    print(f"driver {driver}, nvidia-ml-py {binding}, {len(gpus)} GPU(s)")
    for gpu in gpus:
        print(f"GPU {gpu['index']} ({gpu['name']}):")
        for call, answer in gpu["answers"].items():
            print(f"  {call}: {json.dumps(answer)}")

    calls: Counter[str] = Counter()
    counted(calls)
    backend = NvmlBackend(slow_every=10)
    errors: Counter[str] = Counter()
    fabrics: dict[int, list[Any]] = {}
    try:
        for _ in range(args.cycles):
            sample = backend.sample()
            errors.update(sample.errors)
            for g in sample.gpus:
                fabric = dataclasses.asdict(g.fabric) if g.fabric is not None else None
                fabrics.setdefault(g.index, []).append(fabric)
    finally:
        backend.close()
    print(f"NvmlBackend over {args.cycles} cycles: errors {dict(errors)}, calls {dict(calls)}")
    for gpu in gpus:
        seen = fabrics.get(int(gpu["index"]), [])
        distinct = [json.loads(x) for x in sorted({json.dumps(f, sort_keys=True) for f in seen})]
        gpu["sample_fabric"] = distinct
        print(f"  GPU {gpu['index']} fabric: {json.dumps(distinct)}")
    report = {
        "driver_version": driver,
        "nvidia_ml_py": binding,
        "cycles": args.cycles,
        "slow_every": 10,
        "backend_calls": dict(calls),
        "backend_errors": dict(errors),
        "gpus": gpus,
    }
    if args.out:
        path = Path(args.out) / "gpu_fabric.json"
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
