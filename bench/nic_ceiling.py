"""What an outsized NIC tree costs the exporter: series, page size and peak memory (issue 51, defect 6).

    .venv/bin/python -m bench.nic_ceiling [--devices 256] [--counters 1536] [--dir /tmp] [--source DIR] [--json]

``exporter.sim.sysfs_tree`` writes a tree of ``--devices`` EFA devices, each with ``--counters``
counter files spread evenly over its three counter directories (the device's ``hw_counters``, its
port's ``counters/`` and ``hw_counters/``; at most 512 each, every per-directory bound respected),
with the driver's real names first.  A fresh interpreter then runs what the exporter runs: the NIC
source and stage in a ``Sampler`` (a GPU backend of one answering sample without GPUs, so only the
NIC series vary), two cycles, each page rendered by ``CachedExposition`` as a scrape gets it, and
reports the samples on the page (all, and the NIC ones), the page's bytes and the process's peak
resident memory (``VmHWM``).

``--source DIR`` runs that interpreter on another source tree (an older commit exported with
``git archive <commit> | tar -x -C DIR``) for a before/after with the same tree; the measurement
uses only what both have (the reader's defaults, no flags).  The tree of 256 x 1,536 is 393,216
files: about 1.6 GB of disk or tmpfs while it runs; it is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from exporter.sim import sysfs_tree as st

MEASURE = r"""
import json, sys, time
from exporter.model import BackendSample
from exporter.network.source import NicSource
from exporter.network.stage import NetworkStage
from exporter.render.collector import CachedExposition, SnapshotCollector
from exporter.sampler import Sampler


class NoGpus:
    name = "sim"

    def sample(self):
        return BackendSample(up=True, driver_version="bench")

    def close(self):
        pass


sysfs, procfs = sys.argv[1], sys.argv[2]
source = NicSource(sysfs, procfs)
sampler = Sampler(NoGpus(), network=NetworkStage(source))
collector = SnapshotCollector(sampler.latest, version="bench", backend="sim", include_age=False)
exposition = CachedExposition(collector, sampler.latest)
sampler.after_publish = exposition.prepare
cycles = []
for _ in range(2):
    t0 = time.perf_counter()
    sampler.run_once()
    cycles.append(time.perf_counter() - t0)
    body, _ctype = exposition.render("text/plain")
lines = [line for line in body.decode().splitlines() if line and not line.startswith("#")]
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print(json.dumps({
    "samples": len(lines),
    "nic_samples": sum(line.startswith(("gpulens_nic_", "gpulens_gpu_nic_")) for line in lines),
    "page_bytes": len(body),
    "peak_rss_mib": int(status["VmHWM"].split()[0]) / 1024,
    "first_cycle_s": round(cycles[0], 2),
    "second_cycle_s": round(cycles[1], 2),
    "dropped": [line for line in lines if line.startswith("gpulens_nic_items_dropped")],
}))
sampler.stop()
"""


def write_tree(root: Path, devices: int, counters: int) -> st.SysfsTree:
    """``devices`` EFA devices of ``counters`` counter files each (a third per directory, at most 512)."""
    per_dir = min(512, -(-counters // 3))

    def names(real: tuple[str, ...], prefix: str) -> tuple[str, ...]:
        return real + tuple(f"{prefix}_{i:04d}" for i in range(per_dir - len(real)))

    nics = []
    for i in range(devices):
        function = st.PciFunction(f"0000:{i // 256:02x}:{i % 256:02x}.0", "pci0000:00", (), 0, st.AMAZON_VENDOR)
        port = st.PortSpec(
            rate=st.EFA_RATE,
            hw_counters=names(st.EFA_PORT_COUNTERS, "port_hw"),
            ib_counters=names(st.IB_PORT_COUNTERS, "port_ib"),
        )
        device = names(st.EFA_DEVICE_COUNTERS, "dev_hw")
        nics.append(st.NicSpec(f"rdmap{i}s0", "efa", function, (port,), device, p2p="NVIDIA peermem"))
    return st.SysfsTree(root, nics)


def measure(tree: st.SysfsTree, source: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": source}
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(tree.sysfs), str(tree.procfs)],
        env=env,
        cwd=source,
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="series, page size and peak RSS of an outsized NIC tree")
    p.add_argument("--devices", type=int, default=256)
    p.add_argument("--counters", type=int, default=1536, help="counter files per device")
    p.add_argument("--dir", default=None, help="where to write the tree (default: a temporary directory)")
    p.add_argument("--source", default=None, help="another source tree to measure too (before/after)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    here = str(Path(__file__).resolve().parent.parent)
    root = Path(tempfile.mkdtemp(prefix="nic-ceiling-", dir=args.dir))
    try:
        tree = write_tree(root, args.devices, args.counters)
        rows = {"this tree": measure(tree, here)}
        if args.source:
            rows[args.source] = measure(tree, str(Path(args.source).resolve()))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{args.devices} devices x {args.counters} counters\n")
    print("| source | samples | NIC samples | page MB | peak RSS MiB | 1st / 2nd cycle s |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        page = int(str(r["page_bytes"])) / 1e6
        print(
            f"| {name} | {r['samples']} | {r['nic_samples']} | {page:.2f} | {float(str(r['peak_rss_mib'])):.0f} | "
            f"{r['first_cycle_s']} / {r['second_cycle_s']} |"
        )
    for name, r in rows.items():
        for line in r.get("dropped") or []:  # type: ignore[attr-defined]
            print(f"{name}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
