#!/usr/bin/env python3
"""Device run on a machine with two or more GPUs: the real exporter keeps each GPU's series apart.

The exporter (``--backend nvml``, 1 s interval, probes every ``--probe-interval``) runs while a
torch copy loop runs on the *last* GPU only (``CUDA_VISIBLE_DEVICES``) for ``--load-seconds``.
The script scrapes ``/metrics`` every second and checks, per GPU:

- identity: one ``gpulens_gpu_info`` per GPU, distinct UUIDs, indices 0..N-1;
- the loaded GPU alone shows the compute process, SM and DRAM activity and class ``memory``;
  every other GPU reads SM activity ~0 and class ``idle``;
- probes: the idle GPUs are probed (``ok``, efficiency ~1) while the loaded GPU is skipped as
  busy; once its load ends it is probed too; never two probe children at once.

Prints a markdown table and PASS/FAIL per check; writes ``OUT/gpu_multi.json``.
Usage: ``python3 scripts/gpu_multi.py --out DIR [--load-seconds 100] [--after-seconds 60]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.process import managed_process  # noqa: E402  (the helper the tests and benches use)

COPY_LOAD = r"""
import sys, time, torch
a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        b.copy_(a)
    torch.cuda.synchronize()
"""

RESULTS = ("ok", "skipped_busy", "failed", "timeout")
"""Probe results shown per GPU (gpulens_probe_runs_total{result})."""

_SAMPLE = re.compile(r"^([a-z_]+)\{([^}]*)\} (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every labelled sample in an exposition."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out.append((m.group(1), dict(_LABEL.findall(m.group(2))), float(m.group(3))))
    return out


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return parse(resp.read().decode())


def value(samples: list[tuple[str, dict[str, str], float]], name: str, uuid: str, **match: str) -> float | None:
    """The value of ``name`` for GPU ``uuid`` whose labels include ``match``; None if absent."""
    for n, lab, v in samples:
        if n == name and lab.get("uuid") == uuid and all(lab.get(k) == x for k, x in match.items()):
            return v
    return None


def gpu_row(samples: list[tuple[str, dict[str, str], float]], uuid: str) -> dict[str, Any]:
    """What one scrape says about one GPU."""
    cls = next(
        (lab["class"] for n, lab, v in samples if n == "gpulens_gpu_boundness" and lab["uuid"] == uuid and v), None
    )
    return {
        "sm_active": value(samples, "gpulens_gpu_sm_active_ratio", uuid),
        "dram_active": value(samples, "gpulens_gpu_dram_active_ratio", uuid),
        "processes": value(samples, "gpulens_gpu_compute_processes", uuid),
        "class": cls,
        "runs": {r: value(samples, "gpulens_probe_runs_total", uuid, result=r) for r in RESULTS},
        "hbm_efficiency": value(samples, "gpulens_probe_efficiency_ratio", uuid, probe="hbm_copy"),
    }


def exporter_argv(port: int, probe_interval: str) -> list[str]:
    """The real exporter on every GPU, 1 s interval, probes every ``probe_interval``."""
    return [
        sys.executable, "-m", "exporter", "--backend", "nvml",
        "--web.listen-address", f"127.0.0.1:{port}", "--collect.interval", "1s",
        "--probes.interval", probe_interval, "--no-kubernetes.api",
    ]  # fmt: skip


def probe_children() -> int:
    """Probe child processes running now (``python -m probes``), from /proc."""
    n = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"-m" in cmd and b"probes" in cmd:
                n += 1
    return n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    p.add_argument("--load-seconds", type=float, default=100.0)
    p.add_argument("--after-seconds", type=float, default=60.0)
    p.add_argument("--probe-interval", default="20s")
    p.add_argument("--port", type=int, default=9447)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{args.port}/metrics"
    rows: list[dict[str, Any]] = []
    argv = exporter_argv(args.port, args.probe_interval)
    with managed_process(argv, f"http://127.0.0.1:{args.port}/readyz", log=args.out / "exporter.log"):
        info = [lab for name, lab, _ in scrape(url) if name == "gpulens_gpu_info"]
        gpus = sorted(info, key=lambda lab: int(lab["gpu"]))
        if len(gpus) < 2:
            print(f"needs two GPUs, the exporter sees {len(gpus)}")
            return 2
        loaded = gpus[-1]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": loaded["uuid"]}
        start = time.monotonic()
        load = subprocess.Popen([sys.executable, "-c", COPY_LOAD, str(args.load_seconds)], env=env)
        max_children = 0
        while time.monotonic() - start < args.load_seconds + args.after_seconds:
            t = time.monotonic() - start
            max_children = max(max_children, probe_children())
            samples = scrape(url)
            row: dict[str, Any] = {"t": round(t, 1), "load_running": load.poll() is None, "gpus": {}}
            for g in gpus:
                row["gpus"][g["gpu"]] = gpu_row(samples, g["uuid"])
            rows.append(row)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - start - t)))
        load.wait(timeout=30)
    return report(gpus, loaded, rows, max_children, args)


def report(gpus: list[dict[str, str]], loaded: dict[str, str], rows: list[dict[str, Any]], children: int,
           args: argparse.Namespace) -> int:  # fmt: skip
    """Table per GPU (during the load, at the end) and the checks; 0 if all pass."""
    during = [r for r in rows if r["load_running"] and r["t"] > 25]  # load started, one window past
    last = rows[-1]["gpus"]
    checks: list[tuple[str, bool]] = []
    table = [
        "| GPU | load | SM active (median during load) | DRAM active | processes | class during load | "
        "probe runs at end (ok / skipped_busy / failed / timeout) | HBM efficiency |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for g in gpus:
        k = g["gpu"]
        is_loaded = g is loaded
        sm = sorted(r["gpus"][k]["sm_active"] or 0.0 for r in during)
        dram = sorted(r["gpus"][k]["dram_active"] or 0.0 for r in during)
        procs = {r["gpus"][k]["processes"] for r in during}
        classes = sorted({str(r["gpus"][k]["class"]) for r in during})
        runs = last[k]["runs"]
        med_sm, med_dram = (sm[len(sm) // 2] if sm else 0.0), (dram[len(dram) // 2] if dram else 0.0)
        counts = " / ".join("-" if runs[r] is None else f"{runs[r]:g}" for r in RESULTS)
        table.append(
            f"| {k} | {'copy loop' if is_loaded else 'none'} | {med_sm:.3f} | {med_dram:.3f} | "
            f"{sorted(procs, key=str)} | {', '.join(classes)} | {counts} | {last[k]['hbm_efficiency']} |"
        )
        if is_loaded:
            checks += [
                (f"GPU {k}: SM active > 0.5 during its load", (med_sm or 0) > 0.5),
                (f"GPU {k}: 1 compute process during its load", procs == {1.0}),
                (f"GPU {k}: class memory during its load", classes == ["memory"]),
                (f"GPU {k}: skipped as busy while loaded", (runs["skipped_busy"] or 0) >= 1),
                (f"GPU {k}: probed ok after the load ended", (runs["ok"] or 0) >= 1),
            ]
        else:
            checks += [
                (f"GPU {k}: SM active < 0.01 while another GPU is loaded", (sm[-1] if sm else 1) < 0.01),
                (f"GPU {k}: no compute process", procs == {0.0}),
                (f"GPU {k}: class idle", classes == ["idle"]),
                (
                    f"GPU {k}: probed ok while another GPU was loaded",
                    max((r["gpus"][k]["runs"]["ok"] or 0) for r in rows if r["load_running"]) >= 1,
                ),
            ]
        eff = last[k]["hbm_efficiency"]
        checks.append((f"GPU {k}: HBM efficiency within 0.95-1.05", eff is not None and 0.95 <= eff <= 1.05))
    checks.append(("scrapes while the load ran", len(during) >= 10))
    checks.append(("distinct UUIDs, one per GPU", len({g["uuid"] for g in gpus}) == len(gpus)))
    checks.append(("never two probe children at once", children <= 1))
    lines = [*table, "", *[f"- {'PASS' if ok else 'FAIL'}: {name}" for name, ok in checks]]
    text = "\n".join(lines)
    print(text)
    (args.out / "gpu_multi.md").write_text(text + "\n")
    (args.out / "gpu_multi.json").write_text(json.dumps({"gpus": gpus, "rows": rows, "checks": checks}, indent=1))
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
