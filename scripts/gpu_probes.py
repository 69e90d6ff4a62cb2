"""GPU check of the bandwidth probes (issue 5): run on a machine with an NVIDIA GPU, idle.

1. ``python3 -m probes --array cupy --device 0`` several times, each a cold process (CUDA start
   included), interleaved with a torch reference in its own process: device-to-device copy of the
   same size and pinned H2D/D2H (same size and 256 MiB), all CUDA-event timed.
2. While a memory-bound torch copy loop runs in a child process, the exporter's ProbeScheduler
   (fed by NvmlBackend snapshots) must skip the GPU as busy; after the load ends it must probe it.

This process itself never creates a CUDA context (it would show up as a compute process and make
the GPU "busy"): every CUDA user is a child.  Prints a markdown table; writes
``OUT/gpu_probes.json`` and ``OUT/gpu_probes.md``.  Usage: ``python3 scripts/gpu_probes.py [OUT]
[--drop-caches]`` (the latter empties the page cache before each probe: every run starts cold).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from probes.expected import expected_bandwidth  # noqa: E402
from tests.support.pagecache import drop_page_cache  # noqa: E402

RUNS = 5

TORCH_REFERENCE = r"""
import json, statistics, sys, torch
copy_bytes, transfer_bytes, reps = int(sys.argv[1]), int(sys.argv[2]), 20
dev = torch.device("cuda:0")

def median_seconds(fn, warmup=3):
    # Events back to back around each copy, one sync at the end: timed like the probe.
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    ev[0].record()
    for i in range(reps):
        fn()
        ev[i + 1].record()
    ev[-1].synchronize()
    return statistics.median(ev[i].elapsed_time(ev[i + 1]) / 1e3 for i in range(reps))

out = {}
src = torch.empty(copy_bytes, dtype=torch.uint8, device=dev); dst = torch.empty_like(src)
out["d2d_same_size"] = 2 * copy_bytes / median_seconds(lambda: dst.copy_(src))
del src, dst
big = 4 << 30
src = torch.empty(big, dtype=torch.uint8, device=dev); dst = torch.empty_like(src)
out["d2d_4gib"] = 2 * big / median_seconds(lambda: dst.copy_(src))
del src, dst
for label, n in (("same_size", transfer_bytes), ("256mib", 256 << 20)):
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    d = torch.empty(n, dtype=torch.uint8, device=dev)
    out["h2d_" + label] = n / median_seconds(lambda: d.copy_(host, non_blocking=True))
    out["d2h_" + label] = n / median_seconds(lambda: host.copy_(d, non_blocking=True))
print(json.dumps(out))
"""

MEMORY_LOAD = r"""
import sys, time, torch
a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
b.copy_(a); torch.cuda.synchronize()
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        b.copy_(a)
    torch.cuda.synchronize()
"""


def _run_json(argv: list[str], timeout: float = 120) -> tuple[dict[str, Any], float, int]:
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    try:
        doc = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        doc = {"error": {"type": "no_json", "message": (proc.stdout + proc.stderr)[-2000:]}}
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-2000:])
    return doc, wall, proc.returncode


def _smi() -> str:
    q = "name,driver_version,memory.total,memory.used,utilization.gpu,pcie.link.gen.max,pcie.link.width.max"
    try:
        return subprocess.run(
            ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi failed: {exc}"


def bandwidth_runs(drop_caches: bool) -> dict[str, Any]:
    """Probe processes interleaved with torch references of the same sizes; with ``drop_caches``
    every probe process starts with an empty page cache, as the first one after a node boots."""
    runs: list[dict[str, Any]] = []
    for i in range(RUNS):
        cache = drop_page_cache() if drop_caches else "warm"
        doc, wall, rc = _run_json([sys.executable, "-m", "probes", "--array", "cupy", "--device", "0"])
        row: dict[str, Any] = {"run": i, "rc": rc, "process_wall_seconds": wall, "page_cache": cache}
        if rc != 0 or "probes" not in doc:
            row["error"] = doc.get("error")
            runs.append(row)
            print(f"probe run {i} failed: {doc}", flush=True)
            continue
        p = doc["probes"]
        row.update(
            hbm_copy=p["hbm_copy"]["bytes_per_second"],
            h2d=p["h2d"]["bytes_per_second"],
            d2h=p["d2h"]["bytes_per_second"],
            gpu_seconds=doc["gpu_seconds"],
            init_seconds=doc["init_seconds"],
            in_process_wall_seconds=doc["wall_seconds"],
            copy_bytes=doc["buffers"]["copy_bytes"],
            transfer_bytes=doc["buffers"]["transfer_bytes"],
            device=doc["device"],
        )
        ref, _, ref_rc = _run_json(
            [sys.executable, "-c", TORCH_REFERENCE, str(row["copy_bytes"]), str(row["transfer_bytes"])]
        )
        row["torch"] = ref if ref_rc == 0 else {"error": ref}
        runs.append(row)
        print(f"probe run {i}: {json.dumps(row)}", flush=True)
    return {"runs": runs}


class RawPynvmlBackend:
    """Fallback if NvmlBackend fails here: GPU 0's processes, utilisation, memory and compute mode."""

    name = "raw-pynvml"

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    def sample(self) -> Any:
        from exporter.model import BackendSample, GpuSample, LeafSample, ProcessSample

        n, h = self._nvml, self._handle
        uuid = n.nvmlDeviceGetUUID(h)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        mem = n.nvmlDeviceGetMemoryInfo(h)
        util = n.nvmlDeviceGetUtilizationRates(h).gpu / 100
        procs = tuple(ProcessSample(pid=p.pid) for p in n.nvmlDeviceGetComputeRunningProcesses(h))
        mode = {0: "default", 2: "prohibited", 3: "exclusive_process"}.get(n.nvmlDeviceGetComputeMode(h))
        leaf = LeafSample(
            uuid=uuid,
            memory_used_bytes=mem.used,
            memory_total_bytes=mem.total,
            utilization_ratio=util,
            processes=procs,
        )
        gpu = GpuSample(
            index=0,
            uuid=uuid,
            name=str(n.nvmlDeviceGetName(h)),
            compute_mode=mode,
            utilization_ratio=util,
            memory_used_bytes=mem.used,
            memory_total_bytes=mem.total,
            leaves=(leaf,),
        )
        return BackendSample(up=True, gpus=(gpu,))

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def _open_backend() -> tuple[Any, str]:
    """NvmlBackend if it answers on this machine, else raw pynvml (the report says which)."""
    try:
        from exporter.backends.nvml.backend import NvmlBackend

        backend = NvmlBackend()
        if backend.sample().up:
            return backend, "exporter.backends.nvml.backend.NvmlBackend"
        backend.close()
    except Exception as exc:
        print(f"NvmlBackend unusable here ({exc!r}); falling back to raw pynvml", flush=True)
    return RawPynvmlBackend(), "raw pynvml (NvmlBackend failed)"


def _sample_snapshot(backend: Any) -> Any:
    from exporter.model import Snapshot

    return Snapshot(timestamp=time.time(), backend=backend.sample())


def _leaf_signals(snapshot: Any) -> dict[str, Any]:
    gpu = snapshot.backend.gpus[0]
    leaf = gpu.leaves[0]
    return {
        "processes": len(leaf.processes),
        "utilization_ratio": gpu.utilization_ratio,
        "sm_active": leaf.gpm.sm_active if leaf.gpm else None,
        "dram_active": leaf.gpm.dram_active if leaf.gpm else None,
        "free_bytes": (gpu.memory_total_bytes or 0) - (gpu.memory_used_bytes or 0),
    }


def gating_run() -> dict[str, Any]:
    """The scheduler skips the GPU as busy under a memory-bound load, then probes it once idle."""
    from exporter.probe_scheduler import ProbeOptions, ProbeScheduler

    options = ProbeOptions(
        enabled=True,
        interval_seconds=3600.0,
        jitter_ratio=0.0,
        first_delay_seconds=0.0,
        retry_seconds=1.0,
        timeout_seconds=10.0,
        command=(sys.executable, "-m", "probes", "--array", "cupy"),
    )
    backend, source = _open_backend()
    sched = ProbeScheduler(options)
    out: dict[str, Any] = {"source": source}
    load = subprocess.Popen([sys.executable, "-c", MEMORY_LOAD, "30"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert load.stdout is not None
        out["load_ready"] = load.stdout.readline().strip() == "ready"
        backend.sample()
        time.sleep(1.0)
        busy = _sample_snapshot(backend)
        out["busy_signals"] = _leaf_signals(busy)
        t0 = time.perf_counter()
        sched.observe(busy)
        out["busy_observe_seconds"] = time.perf_counter() - t0
        sched.wait_until_idle(30)
        out["busy_runs"] = {r: n for (_, r), n in sched.results()[1].items() if n}
    finally:
        load.kill()
        load.wait()
    time.sleep(2.0)
    backend.sample()
    time.sleep(1.0)
    idle = _sample_snapshot(backend)
    out["idle_signals"] = _leaf_signals(idle)
    sched.observe(idle)
    sched.wait_until_idle(30)
    results, counts = sched.results()
    out["idle_runs"] = {r: n for (_, r), n in counts.items() if n}
    out["idle_results"] = [
        {"probe": r.probe, "bytes_per_second": r.bandwidth_bytes_per_second, "efficiency": r.efficiency_ratio}
        for r in results
    ]
    out["exporter_imported_cupy_or_torch"] = any(m in sys.modules for m in ("cupy", "torch"))
    sched.close()
    backend.close()
    return out


def _fmt(x: float | None, scale: float, digits: int = 2) -> str:
    return "-" if x is None else f"{x / scale:.{digits}f}"


def _hbm_against_expected(run: dict[str, Any], hbm_copy: float) -> str:
    """The median HBM copy against the datasheet and the achievable figure of the GPU's own model
    (probes/expected.py), or a note that the model is not in the table."""
    name = run.get("device", {}).get("name")
    expected = expected_bandwidth(name, "hbm_copy")
    if expected is None:
        return f"HBM copy: {name!r} is not in probes/expected.py"
    return (
        f"HBM copy / {expected.datasheet_bytes_per_second / 1e12:.2f} TB/s datasheet of {name} "
        f"{hbm_copy / expected.datasheet_bytes_per_second:.3f}, / its achievable "
        f"({expected.basis}) {hbm_copy / expected.achievable_bytes_per_second:.3f}"
    )


def report(bw: dict[str, Any], gate: dict[str, Any]) -> str:
    """Markdown table of everything measured."""
    ok = [r for r in bw["runs"] if "hbm_copy" in r and "d2d_same_size" in r.get("torch", {})]
    lines = [
        "| run | probe HBM copy TB/s | torch D2D same size TB/s | ratio | probe H2D GB/s | torch H2D same / 256 MiB"
        " | probe D2H GB/s | torch D2H same / 256 MiB | probe GPU ms | process wall s (incl. CUDA start) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in ok:
        t = r["torch"]
        lines.append(
            f"| {r['run']} | {_fmt(r['hbm_copy'], 1e12)} | {_fmt(t['d2d_same_size'], 1e12)} "
            f"| {r['hbm_copy'] / t['d2d_same_size']:.3f} | {_fmt(r['h2d'], 1e9, 1)} "
            f"| {_fmt(t['h2d_same_size'], 1e9, 1)} / {_fmt(t['h2d_256mib'], 1e9, 1)} | {_fmt(r['d2h'], 1e9, 1)} "
            f"| {_fmt(t['d2h_same_size'], 1e9, 1)} / {_fmt(t['d2h_256mib'], 1e9, 1)} "
            f"| {r['gpu_seconds'] * 1e3:.2f} | {r['process_wall_seconds']:.2f} |"
        )
    if ok:

        def med(key: str, sub: str | None = None) -> float:
            return statistics.median((r[sub][key] if sub else r[key]) for r in ok)

        lines += [
            "",
            f"Medians over {len(ok)} runs: HBM copy {med('hbm_copy') / 1e12:.3f} TB/s vs torch "
            f"{med('d2d_same_size', 'torch') / 1e12:.3f} TB/s (ratio "
            f"{statistics.median(r['hbm_copy'] / r['torch']['d2d_same_size'] for r in ok):.3f}); torch 4 GiB copy "
            f"{med('d2d_4gib', 'torch') / 1e12:.3f} TB/s; H2D {med('h2d') / 1e9:.1f} GB/s (ratio to torch same size "
            f"{statistics.median(r['h2d'] / r['torch']['h2d_same_size'] for r in ok):.3f}, to 256 MiB "
            f"{statistics.median(r['h2d'] / r['torch']['h2d_256mib'] for r in ok):.3f}); D2H {med('d2h') / 1e9:.1f} "
            f"GB/s (ratio {statistics.median(r['d2h'] / r['torch']['d2h_same_size'] for r in ok):.3f}, "
            f"{statistics.median(r['d2h'] / r['torch']['d2h_256mib'] for r in ok):.3f}); GPU time max "
            f"{max(r['gpu_seconds'] for r in ok) * 1e3:.2f} ms; process wall max "
            f"{max(r['process_wall_seconds'] for r in ok):.2f} s (median {med('process_wall_seconds'):.2f} s, "
            f"CUDA init in-process median {med('init_seconds'):.2f} s); buffers {ok[0]['copy_bytes'] >> 20} MiB "
            f"copy, {ok[0]['transfer_bytes'] >> 20} MiB transfer; {_hbm_against_expected(ok[0], med('hbm_copy'))}.",
        ]
    lines += [
        "",
        f"Scheduler under a memory-bound torch load ({gate.get('source')}): signals {gate.get('busy_signals')}, "
        f"runs {gate.get('busy_runs')}; after the load ended: signals {gate.get('idle_signals')}, "
        f"runs {gate.get('idle_runs')}, results {gate.get('idle_results')}; exporter process imported "
        f"cupy/torch: {gate.get('exporter_imported_cupy_or_torch')}.",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", nargs="?", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--drop-caches", action="store_true", help="empty the page cache before every probe run")
    args = parser.parse_args()
    out_dir = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    print(_smi(), flush=True)
    bw: dict[str, Any] = {"runs": []}
    gate: dict[str, Any] = {}
    try:
        bw = bandwidth_runs(args.drop_caches)
    except Exception as exc:
        bw["error"] = repr(exc)
        print(f"bandwidth runs failed: {exc!r}", flush=True)
    try:
        gate = gating_run()
    except Exception as exc:
        gate["error"] = repr(exc)
        print(f"gating run failed: {exc!r}", flush=True)
    doc = {"nvidia_smi": _smi(), "bandwidth": bw, "gating": gate}
    (out_dir / "gpu_probes.json").write_text(json.dumps(doc, indent=1, default=str))
    table = report(bw, gate)
    (out_dir / "gpu_probes.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
