"""What reading the node's RDMA NICs costs per cycle: a fake p5en tree (32 EFA devices, every counter
of the recent EFA driver), kept-open files against open-read-close, side by side.

    .venv/bin/python -m bench.nic_cost [--cycles 2000] [--discoveries 30] [--dir /dev/shm] [--profile 200] [--json]

No GPU and no NIC: ``exporter.sim.sysfs_tree`` writes the tree under ``--dir`` (a temporary
directory; tmpfs such as ``/dev/shm`` is closest to sysfs, which lives in memory), 32 devices x
(22 port counters + 12 device counters + ``state``, ``phys_state``, ``rate``).  Every counter is
rewritten in place between cycles (outside the timing), as the kernel regenerates its text.

Four readers run interleaved, one cycle each in turn (the order rotating), over the same files:

- ``kept-open``: ``RdmaReader.read()`` after ``discover()``, as the NIC source runs it: one
  ``pread`` at offset 0 per kept file; the ports' states and traffic counters each read, every other
  file of a tenth of the devices (each device every ``SLOW_EVERY`` reads);
- ``kept-open, every file``: ``read(everything=True)``, every counter and rate of every device in one
  read (what a read would cost without the rotation; the 2 ms target is about the kept-open p99);
- ``open-read-close``: the same reader with ``max_open_files=0`` (every file opened, read, closed);
- ``naive``: what node_exporter-style readers do each scrape: list ``class/infiniband``, each
  device's ports and counter directories, and read every file with open, fstat, read to EOF,
  close (Go's ``os.ReadFile``), parsing each counter;
- ``bare preads``: one ``os.pread`` per port file (768), kept open, nothing parsed or built: the
  system calls of a read of every port file.

Per cycle: wall time (``perf_counter``); the table gives the median, p99 and mean in µs, and the
CPU of the calling thread (``thread_time``) per cycle.  Discovery (walk, opens, first read) is
timed apart over ``--discoveries`` fresh readers; ``--profile`` adds a cProfile of kept-open reads.
The tree measures the exporter's own work (system calls and Python); on a real node reading an
EFA device's counters also costs the driver admin commands to the device (at most once per
``lifespan``, 10 ms, per counter directory), which no fake tree can show.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.real_gpu import percentile
from exporter import fsread
from exporter.network.rdma import SLOW_EVERY, RdmaReader
from exporter.sim import sysfs_tree as st

TARGET_SECONDS = 0.002
"""The requirement: every counter of 32 EFA devices read within 2 ms a cycle."""


def naive_read(sysfs: str) -> int:
    """One node_exporter-style pass over ``<sysfs>/class/infiniband``: list, then open-fstat-read-
    close every state, rate and counter file; returns the files read."""
    files = 0
    root = os.path.join(sysfs, "class", "infiniband")
    for dev in sorted(os.listdir(root)):
        device = os.path.join(root, dev)
        paths: list[str] = []
        ports = os.path.join(device, "ports")
        for port in sorted(os.listdir(ports)):
            port_dir = os.path.join(ports, port)
            paths += [os.path.join(port_dir, name) for name in ("state", "phys_state", "rate")]
            for sub in ("counters", "hw_counters"):
                directory = os.path.join(port_dir, sub)
                if os.path.isdir(directory):
                    paths += [os.path.join(directory, n) for n in sorted(os.listdir(directory)) if n != "lifespan"]
        directory = os.path.join(device, "hw_counters")
        if os.path.isdir(directory):
            paths += [os.path.join(directory, n) for n in sorted(os.listdir(directory)) if n != "lifespan"]
        values: dict[str, int | str] = {}
        for path in paths:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fstat(fd)
                chunks = []
                while chunk := os.read(fd, 512):
                    chunks.append(chunk)
            finally:
                os.close(fd)
            text = b"".join(chunks).strip()
            values[path] = int(text) if text.isdigit() else text.decode()
            files += 1
    return files


def fast_cycle_paths(sysfs: str) -> list[str]:
    """The files a fast cycle reads: each port's ``state``, ``phys_state`` and counters."""
    root = os.path.join(sysfs, "class", "infiniband")
    paths: list[str] = []
    for dev in sorted(os.listdir(root)):
        ports = os.path.join(root, dev, "ports")
        for port in sorted(os.listdir(ports)):
            port_dir = os.path.join(ports, port)
            paths += [os.path.join(port_dir, "state"), os.path.join(port_dir, "phys_state")]
            for sub in ("counters", "hw_counters"):
                directory = os.path.join(port_dir, sub)
                if os.path.isdir(directory):
                    paths += [os.path.join(directory, n) for n in sorted(os.listdir(directory)) if n != "lifespan"]
    return paths


def bare_preads(fds: list[int]) -> None:
    """One ``pread`` per kept file, nothing else: the system calls' share of a fast cycle."""
    for fd in fds:
        os.pread(fd, 64, 0)


def profile(sysfs: str, reads: int) -> str:
    """cProfile of ``reads`` kept-open reads: the functions by own time."""
    import cProfile
    import io
    import pstats

    reader = RdmaReader(sysfs)
    reader.discover()
    prof = cProfile.Profile()
    prof.enable()
    for i in range(reads):
        reader.read(float(i))
    prof.disable()
    reader.close()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    return out.getvalue()


def _files_per_cycle(samples: tuple[Any, ...]) -> tuple[float, int]:
    """(files a read touches on average as the NIC source reads, every file) for ``samples``: each
    read, the ports' states and traffic counters; each device's other files one read in
    ``SLOW_EVERY``."""
    every_read = sum(
        2 + sum(v is not None for v in (p.tx_bytes, p.rx_bytes, p.tx_packets, p.rx_packets))
        for n in samples
        for p in n.ports
    )
    others = sum(len(n.counters) + sum(len(p.counters) + 1 for p in n.ports) for n in samples)  # + rate
    return every_read + others / SLOW_EVERY, every_read + others


def _summary(xs: list[float]) -> dict[str, float]:
    return {
        "median_us": 1e6 * statistics.median(xs),
        "p99_us": 1e6 * percentile(xs, 0.99),
        "mean_us": 1e6 * statistics.fmean(xs),
        "max_us": 1e6 * max(xs),
    }


def measure(directory: str | None, cycles: int, discoveries: int, profile_reads: int = 0) -> dict[str, Any]:
    """Build the tree, time discovery and the three readers; the figures as a dict."""
    with tempfile.TemporaryDirectory(prefix="gpulens-nic-", dir=directory) as tmp:
        layout = st.p5en_layout()
        tree = st.SysfsTree.of(Path(tmp), layout)
        sysfs = str(tree.sysfs)
        names = [n.name for n in layout.nics]

        disc: list[float] = []
        for _ in range(discoveries):
            r = RdmaReader(sysfs)
            t0 = time.perf_counter()
            r.discover()
            disc.append(time.perf_counter() - t0)
            r.close()

        kept = RdmaReader(sysfs)
        devices = kept.discover()
        full = RdmaReader(sysfs)
        full.discover()
        reopen = RdmaReader(sysfs, max_open_files=0)
        reopen.discover()
        first = kept.read(0.0)
        fast_files, slow_files = _files_per_cycle(first)
        naive_files = naive_read(sysfs)
        fds = [os.open(p, fsread.OPEN_FLAGS) for p in fast_cycle_paths(sysfs)]
        for _ in range(SLOW_EVERY * 2):  # warm-up
            kept.read(0.0)
            full.read(0.0, everything=True)
            reopen.read(0.0)
            naive_read(sysfs)
            bare_preads(fds)

        wall: dict[str, list[float]] = {
            "kept": [],
            "kept_full": [],
            "reopen": [],
            "naive": [],
            "preads": [],
        }
        cpu: dict[str, float] = {"kept": 0.0, "kept_full": 0.0, "reopen": 0.0, "naive": 0.0, "preads": 0.0}
        now = 1.0
        runners: list[tuple[str, Callable[[], object]]] = [
            ("kept", lambda: kept.read(now)),
            ("kept_full", lambda: full.read(now, everything=True)),
            ("reopen", lambda: reopen.read(now)),
            ("naive", lambda: naive_read(sysfs)),
            ("preads", lambda: bare_preads(fds)),
        ]
        for cycle in range(cycles):
            now = 1.0 + cycle
            # Every counter moves between cycles, as on a busy node (not timed).
            value = 1_000_000 * (cycle + 1)
            for name in names:
                tree.set_counter(name, 1, "tx_bytes", value)
                tree.set_counter(name, 1, "rx_bytes", value)
            k = cycle % len(runners)
            for label, run in runners[k:] + runners[:k]:
                c0, t0 = time.thread_time(), time.perf_counter()
                run()
                t1, c1 = time.perf_counter(), time.thread_time()
                wall[label].append(t1 - t0)
                cpu[label] += c1 - c0
        kept.close()
        full.close()
        reopen.close()
        for fd in fds:
            os.close(fd)
        profiled = profile(sysfs, profile_reads) if profile_reads else None

    result: dict[str, Any] = {
        "devices": devices,
        "cycles": cycles,
        "slow_every": SLOW_EVERY,
        "files": {"fast_cycle": fast_files, "slow_cycle": slow_files, "naive": naive_files},
        "discovery": {"n": discoveries, **_summary(disc)},
        "readers": {label: _summary(xs) for label, xs in wall.items()},
        "cpu_us_per_cycle": {label: 1e6 * total / cycles for label, total in cpu.items()},
        "bare_preads": len(fds),
        "profile": profiled,
    }
    kept_median = result["readers"]["kept"]["median_us"]
    full_median = result["readers"]["kept_full"]["median_us"]
    result["ratio_to_kept"] = {
        label: result["readers"][label]["median_us"] / kept_median
        for label in ("kept_full", "reopen", "naive", "preads")
    }
    result["ratio_naive_to_kept_full"] = result["readers"]["naive"]["median_us"] / full_median
    worst = result["readers"]["kept"]["p99_us"]
    result["target_us"] = 1e6 * TARGET_SECONDS
    result["meets_target"] = worst <= 1e6 * TARGET_SECONDS
    return result


def table(r: dict[str, Any]) -> str:
    """The figures as markdown."""
    files = r["files"]
    rows = [
        f"{r['devices']} EFA devices, {r['cycles']} cycles per reader (interleaved), after discovery; "
        f"files per read as the source reads: {files['fast_cycle']:.0f} on average (the ports' states and "
        f"traffic each read, a device's other files 1 read in {r['slow_every']}; every file: {files['slow_cycle']}), "
        f"{files['naive']} (naive)",
        "",
        "| reader | median µs | p99 µs | mean µs | max µs | CPU µs/cycle | median / kept-open |",
        "|---|---|---|---|---|---|---|",
    ]
    labels = {
        "kept": "kept-open `pread` (RdmaReader), as the NIC source reads",
        "kept_full": "  kept-open, every counter and rate in one read (`everything=True`)",
        "reopen": "open-read-close (RdmaReader, max_open_files=0)",
        "naive": "naive: list + open/fstat/read/close every file",
        "preads": f"bare `os.pread` of the {r['bare_preads']} port files, nothing else",
    }
    for label, text in labels.items():
        s = r["readers"][label]
        cpu = r["cpu_us_per_cycle"].get(label)
        ratio = 1.0 if label == "kept" else r["ratio_to_kept"].get(label)
        rows.append(
            f"| {text} | {s['median_us']:,.0f} | {s['p99_us']:,.0f} | {s['mean_us']:,.0f} | {s['max_us']:,.0f} | "
            f"{'' if cpu is None else f'{cpu:,.0f}'} | {'' if ratio is None else f'{ratio:.2f}'} |"
        )
    d = r["discovery"]
    rows += [
        "",
        f"Discovery (walk, opens, first read of every file), {d['n']} fresh readers: median "
        f"{d['median_us'] / 1e3:.1f} ms, p99 {d['p99_us'] / 1e3:.1f} ms.",
        f"Naive / kept-open, every file in one read (the same files): {r['ratio_naive_to_kept_full']:.2f}x.",
        f"Target: every counter read within {r['target_us'] / 1e3:.0f} ms a cycle (kept-open p99, every "
        f"counter read once every {r['slow_every']} cycles): {'met' if r['meets_target'] else 'NOT met'}.",
    ]
    if r.get("profile"):
        rows += ["", "cProfile of kept-open reads (own time first):", "", "```", r["profile"].strip(), "```"]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """CLI: print the table (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=2000, help="timed cycles per reader")
    ap.add_argument("--discoveries", type=int, default=30, help="discoveries timed")
    ap.add_argument("--dir", default=None, help="where the tree is written (default: the temporary directory)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--profile", type=int, default=0, metavar="READS", help="also cProfile this many kept-open reads")
    a = ap.parse_args(argv)
    result = measure(a.dir, a.cycles, a.discoveries, a.profile)
    print(json.dumps(result, indent=2) if a.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
