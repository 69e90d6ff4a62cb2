"""Start-up cost of one bandwidth-probe process, cold and warm, against a baseline probe package.

The probe's wall time (issue 5: <= 1.5 s per run including CUDA start) is mostly start-up, and the
first run after a node boots reads everything from disk.  This bench runs ``python3 -m probes
--array cupy --device 0`` as the scheduler does, each run timed from the caller (interpreter start
to exit), alternating the current package and a baseline (``--baseline DIR``: a directory holding
another revision's ``probes/``), with the page cache dropped before every cold run
(``tests/support/pagecache.py``) and not before warm ones.  It then splits the cold start into its parts
(interpreter, loading CuPy's runtime bindings vs ``import cupy``, first CUDA context).

GPU machine only; writes ``OUT/probe_coldstart.json`` and prints a markdown table.  Usage:
``python3 -m bench.probe_coldstart --out DIR [--baseline DIR] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.pagecache import drop_page_cache

REPO = Path(__file__).resolve().parents[1]

PARTS: dict[str, str] = {
    "interpreter": "pass",
    "cupy runtime bindings (probe)": "from cupy_backends.cuda.api import runtime",
    "import cupy (baseline)": "import cupy",
    "bindings + CUDA context": (
        "from cupy_backends.cuda.api import runtime as r; import time; t = time.perf_counter(); "
        "r.memGetInfo(); print(time.perf_counter() - t)"
    ),
}
"""Pieces of the cold start, each a fresh ``python3 -c`` process timed from the caller."""


def _timed(argv: list[str], cwd: Path) -> tuple[float, int, str]:
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)
    return time.perf_counter() - start, proc.returncode, proc.stdout.strip() or proc.stderr[-500:]


def probe_run(root: Path, cold: bool) -> dict[str, Any]:
    """One probe process started in ``root`` (whose ``probes/`` is imported), timed from here."""
    method = drop_page_cache() if cold else None
    wall, rc, out = _timed([sys.executable, "-m", "probes", "--array", "cupy", "--device", "0"], root)
    row: dict[str, Any] = {"cold": cold, "cache": method, "process_wall_seconds": wall, "rc": rc}
    try:
        doc = json.loads(out.splitlines()[-1])
        row.update(
            init_seconds=doc["init_seconds"],
            in_process_wall_seconds=doc["wall_seconds"],
            hbm_copy=doc["probes"]["hbm_copy"]["bytes_per_second"],
            gpu_seconds=doc["gpu_seconds"],
        )
    except (IndexError, KeyError, json.JSONDecodeError):
        row["output"] = out[-500:]
    return row


def parts(cold: bool) -> dict[str, Any]:
    """Wall time of each start-up piece in its own process: cold (page cache dropped just before)
    or warm (the same piece run once untimed just before)."""
    out: dict[str, Any] = {}
    for name, code in PARTS.items():
        if cold:
            drop_page_cache()
        else:
            _timed([sys.executable, "-c", code], REPO)  # read its files once: the timed run is warm
        wall, rc, text = _timed([sys.executable, "-c", code], REPO)
        out[name] = {"process_wall_seconds": wall, "rc": rc, "stdout": text[-200:]}
    return out


def _summary(rows: list[dict[str, Any]]) -> str:
    ok = [r["process_wall_seconds"] for r in rows if r["rc"] == 0]
    if not ok:
        return "failed"
    return f"{statistics.median(ok):.2f} (max {max(ok):.2f}, n={len(ok)})"


def report(doc: dict[str, Any]) -> str:
    """Markdown: process wall per variant cold / warm, the ratio, then the cold start's parts."""
    runs = doc["runs"]
    lines = [
        "| probe package | cold: wall s, median (max) | warm: wall s, median (max) |",
        "|---|---|---|",
    ]
    for variant in doc["variants"]:
        cold = [r for r in runs if r["variant"] == variant and r["cold"]]
        warm = [r for r in runs if r["variant"] == variant and not r["cold"]]
        lines.append(f"| {variant} | {_summary(cold)} | {_summary(warm)} |")
    if len(doc["variants"]) == 2:
        cur, base = doc["variants"]

        def med(variant: str, cold: bool) -> float:
            rows = [r for r in runs if r["variant"] == variant and r["cold"] is cold and r["rc"] == 0]
            return statistics.median(r["process_wall_seconds"] for r in rows) if rows else float("nan")

        lines += [
            "",
            f"current / baseline: cold {med(cur, True) / med(base, True):.2f}x, "
            f"warm {med(cur, False) / med(base, False):.2f}x",
        ]
    lines += ["", "| start-up piece (own process) | cold s | warm s |", "|---|---|---|"]
    for name in PARTS:
        c, w = doc["parts"]["cold"][name], doc["parts"]["warm"][name]
        lines.append(f"| {name} | {c['process_wall_seconds']:.3f} | {w['process_wall_seconds']:.3f} |")
    ctx = doc["parts"]["cold"]["bindings + CUDA context"]["stdout"]
    lines.append(f"\nCUDA context alone (cold process, in-process timer): {ctx} s. Cache method: {doc['cache']}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and the parts, write the JSON, print the table."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--baseline", type=Path, help="directory holding a baseline revision's probes/ package")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    variants = {"current": REPO}
    if args.baseline:
        variants["baseline"] = args.baseline.resolve()
    runs: list[dict[str, Any]] = []
    for cold in (True, False):
        for i in range(args.rounds):
            order = list(variants.items()) if i % 2 == 0 else list(variants.items())[::-1]
            for name, root in order:
                row = {"variant": name, "round": i, **probe_run(root, cold)}
                runs.append(row)
                print(json.dumps(row), flush=True)
    doc = {
        "variants": list(variants),
        "runs": runs,
        "parts": {"cold": parts(True), "warm": parts(False)},
        "cache": drop_page_cache(),
    }
    (args.out / "probe_coldstart.json").write_text(json.dumps(doc, indent=1))
    table = report(doc)
    (args.out / "probe_coldstart.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
