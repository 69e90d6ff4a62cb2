"""Real-GPU check of NvmlBackend: every field NVML fills, GPM under idle/copy/matmul, sample() cost.

Run on a machine with an NVIDIA GPU (torch needed only for the load phases):
    PYTHONPATH=. python3 scripts/gpu_check.py --out DIR
Prints markdown tables and writes DIR/gpu_check.json and DIR/gpu_check.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exporter.backends.nvml.backend import NvmlBackend
from exporter.model import BackendSample, GpmSample, GpuSample, LeafSample

COPY_LOAD = """
import time, torch
a = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); b = torch.empty_like(a)
a.fill_(1); torch.cuda.synchronize(); print('ready', flush=True)
end = time.time() + {seconds}
while time.time() < end:
    for _ in range(20): b.copy_(a)
    torch.cuda.synchronize()
"""
MATMUL_LOAD = """
import time, torch
x = torch.randn(8192, 8192, dtype=torch.bfloat16, device='cuda'); y = torch.randn_like(x)
z = x @ y; torch.cuda.synchronize(); print('ready', flush=True)
end = time.time() + {seconds}
while time.time() < end:
    for _ in range(10): z = x @ y
    torch.cuda.synchronize()
"""
GPM_FIELDS = [f.name for f in dataclasses.fields(GpmSample) if f.name != "window_seconds"]


def flat(prefix: str, obj: Any) -> Iterator[tuple[str, Any]]:
    """(dotted field name, value) for every non-None scalar in a sample dataclass."""
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            if f.name in ("leaves", "processes"):
                continue
            yield from flat(f"{prefix}{f.name}.", getattr(obj, f.name))
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from flat(f"{prefix}{k}.", v)
    elif isinstance(obj, tuple):
        if obj:
            yield prefix.rstrip("."), list(obj)
    elif obj is not None:
        yield prefix.rstrip("."), obj


def describe(gpu: GpuSample) -> dict[str, Any]:
    out = dict(flat("gpu.", gpu))
    for i, leaf in enumerate(gpu.leaves):
        out.update(flat(f"leaf[{i}].", leaf))
        out[f"leaf[{i}].processes"] = [
            {k: v for k, v in dataclasses.asdict(p).items() if v is not None} for p in leaf.processes
        ]
    return out


def run_phase(backend: NvmlBackend, name: str, seconds: float, load: str | None, pids: list[int]) -> dict[str, Any]:
    child = None
    if load is not None:
        child = subprocess.Popen(
            [sys.executable, "-c", load.format(seconds=seconds + 30)], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        if line != "ready":
            raise SystemExit(f"{name}: load did not start ({line!r}, rc={child.poll()})")
        pids.append(child.pid)
        time.sleep(1.0)
    backend.sample()  # opens this phase's GPM window
    samples: list[BackendSample] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(1.0)
        samples.append(backend.sample())
    if child is not None:
        child.kill()
        child.wait()
    if not samples or not samples[-1].up or not samples[-1].gpus:
        raise SystemExit(f"{name}: backend not up: {samples[-1].error if samples else 'no samples'}")
    gpm: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        leaf: LeafSample = s.gpus[0].leaves[0]
        if leaf.gpm is not None:
            for f in GPM_FIELDS:
                v = getattr(leaf.gpm, f)
                if v is not None:
                    gpm[f].append(v)
    util = [s.gpus[0].utilization_ratio for s in samples if s.gpus[0].utilization_ratio is not None]
    return {
        "phase": name,
        "cycles": len(samples),
        "gpm_mean": {f: statistics.fmean(v) for f, v in gpm.items()},
        "nvml_util_mean": statistics.fmean(util) if util else None,
        "errors": dict(sum((Counter(s.errors) for s in samples), Counter())),
        "fields": describe(samples[-1].gpus[0]),
        "backend": {
            "up": samples[-1].up,
            "driver_version": samples[-1].driver_version,
            "gpm_supported": samples[-1].gpm_supported,
        },
    }


class TimedModule:
    """Wraps the pynvml module and times every ``nvml*`` call, by function name."""

    def __init__(self, module: Any) -> None:
        self._module = module
        self.seconds: dict[str, list[float]] = defaultdict(list)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if not (callable(value) and name.startswith("nvml")) or isinstance(value, type):
            return value

        def timed(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return value(*args)
            finally:
                self.seconds[name].append(time.perf_counter() - t0)

        return timed

    def __dir__(self) -> list[str]:
        return dir(self._module)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def time_samples(make: Callable[[], NvmlBackend], cycles: int, interval: float) -> dict[str, Any]:
    backend = make()
    backend.sample()
    durations = []
    for _ in range(cycles):
        time.sleep(interval)
        t0 = time.perf_counter()
        backend.sample()
        durations.append(time.perf_counter() - t0)
    backend.close()
    return {
        "cycles": cycles,
        "p50_ms": percentile(durations, 0.5) * 1e3,
        "p99_ms": percentile(durations, 0.99) * 1e3,
        "max_ms": max(durations) * 1e3,
        "mean_ms": statistics.fmean(durations) * 1e3,
    }


def unprivileged_check() -> dict[str, Any]:
    """As uid 65534 (nobody, no capabilities): does NVML still give GPM, processes, energy?"""
    if os.geteuid() != 0:
        return {"skipped": "not root"}
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            import pynvml

            # The Xid event set is waited on each cycle only once registration succeeded.
            timed = TimedModule(pynvml)
            backend = NvmlBackend(nvml=timed)
            backend.sample()
            time.sleep(1.0)
            s = backend.sample()
            g = s.gpus[0]
            result = {
                "uid": os.getuid(),
                "up": s.up,
                "gpm": g.leaves[0].gpm is not None,
                "energy": g.energy_joules is not None,
                "fields_filled": len(describe(g)),
                "xid_registered": bool(timed.seconds.get("nvmlEventSetWait")),
                "errors": dict(s.errors),
            }
            backend.close()
        except Exception as exc:
            result = {"error": repr(exc)}
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 65536):
        data += chunk
    os.waitpid(pid, 0)
    return dict(json.loads(data or b"{}"))


def markdown(report: dict[str, Any]) -> str:
    phases = report["phases"]
    lines = ["### Every field NvmlBackend filled (last cycle of each phase)", ""]
    lines.append("| field | " + " | ".join(p["phase"] for p in phases) + " |")
    lines.append("|---|" + "---|" * len(phases))
    keys: list[str] = []
    for p in phases:
        keys.extend(k for k in p["fields"] if k not in keys)
    for k in keys:
        cells = []
        for p in phases:
            v = p["fields"].get(k, "")
            if isinstance(v, float):
                v = f"{v:.6g}"
            cells.append(str(v).replace("|", "/"))
        lines.append(f"| `{k}` | " + " | ".join(cells) + " |")
    lines += ["", "### GPM (mean over the phase, ratio 0..1) and NVML GPU-Util", ""]
    lines.append("| phase | cycles | nvml util | " + " | ".join(GPM_FIELDS) + " | errors |")
    lines.append("|---|---|---|" + "---|" * len(GPM_FIELDS) + "---|")
    for p in phases:
        util = p["nvml_util_mean"]
        cells = [f"{p['gpm_mean'][f]:.3f}" if f in p["gpm_mean"] else "-" for f in GPM_FIELDS]
        lines.append(
            f"| {p['phase']} | {p['cycles']} | {util if util is None else f'{util:.2f}'} | "
            + " | ".join(cells)
            + f" | {p['errors'] or ''} |"
        )
    lines += ["", "### Cost of NvmlBackend.sample() (one GPU)", ""]
    lines.append("| setting | cycles | p50 ms | p99 ms | max ms | mean ms |")
    lines.append("|---|---|---|---|---|---|")
    for name, t in report["timing"].items():
        stats = " | ".join(f"{t[k]:.2f}" for k in ("p50_ms", "p99_ms", "max_ms", "mean_ms"))
        lines.append(f"| {name} | {t['cycles']} | {stats} |")
    lines += ["", "### NVML calls per cycle (default settings, idle GPU)", ""]
    lines.append("| call | calls/cycle | mean µs | total ms/cycle |")
    lines.append("|---|---|---|---|")
    for row in report["per_call"]:
        lines.append(f"| {row['call']} | {row['per_cycle']:.2f} | {row['mean_us']:.0f} | {row['ms_per_cycle']:.3f} |")
    lines += ["", "### Unprivileged (uid 65534)", "", "```", json.dumps(report["unprivileged"]), "```"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--seconds", type=float, default=8.0, help="sampling time per phase")
    parser.add_argument("--no-load", action="store_true", help="idle phase only (no torch)")
    args = parser.parse_args()

    import pynvml

    report: dict[str, Any] = {"pynvml": getattr(pynvml, "__version__", None)}
    backend = NvmlBackend(pcie_every=1)  # PCIe every cycle here, so the table shows it in each phase
    pids: list[int] = []
    phases = [run_phase(backend, "idle", args.seconds, None, pids)]
    if not args.no_load:
        phases.append(run_phase(backend, "copy", args.seconds, COPY_LOAD, pids))
        phases.append(run_phase(backend, "matmul", args.seconds, MATMUL_LOAD, pids))
    backend.close()
    report["phases"] = phases
    report["load_pids"] = pids

    timed = TimedModule(pynvml)
    cycles = 30
    report["timing"] = {
        "default (PCIe every 10th cycle)": time_samples(lambda: NvmlBackend(nvml=timed), cycles, 0.2),
        "PCIe every cycle": time_samples(lambda: NvmlBackend(pcie_every=1), cycles, 0.2),
    }
    per_call = []
    for name, secs in timed.seconds.items():
        if name in ("nvmlInit", "nvmlShutdown"):
            continue
        per_cycle = len(secs) / (cycles + 1)
        per_call.append(
            {
                "call": name,
                "per_cycle": per_cycle,
                "mean_us": statistics.fmean(secs) * 1e6,
                "ms_per_cycle": sum(secs) / (cycles + 1) * 1e3,
            }
        )
    report["per_call"] = sorted(per_call, key=lambda r: -r["ms_per_cycle"])
    report["unprivileged"] = unprivileged_check()

    text = markdown(report)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.md").write_text(text)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
