"""CPU cost of the boundness classifier per leaf and cycle: the 8 GPU x 7 MIG case (56 leaves).

    .venv/bin/python -m bench.classifier_cost [--cycles 500] [--interval 0.1] [--leaves 56]

Feeds one fixed GPM sample to ``BoundnessClassifier.observe`` for every leaf and cycle, at
``--interval`` seconds of simulated time per cycle (0.1 s keeps 100 samples in a 10 s window, the
worst case the exporter allows), and prints the process CPU time per observe in µs (median of 5
rounds). tests/test_boundness.py checks the bounded state that keeps this flat; the time is here.
"""

from __future__ import annotations

import argparse
import statistics
import time

from exporter.analysis.boundness import BoundnessClassifier
from exporter.model import GpmSample


def per_observe_us(cycles: int, interval: float, leaves: int) -> float:
    """CPU µs per ``observe`` over ``cycles`` cycles of ``leaves`` leaves."""
    clf = BoundnessClassifier()
    # A pointer chase: SMs busy, little memory traffic (tests/test_boundness.py's POINTER_CHASE).
    sig = GpmSample(
        window_seconds=interval,
        sm_active=0.90,
        sm_occupancy=0.30,
        tensor_active=0.0,
        fp64_active=0.0,
        fp32_active=0.05,
        fp16_active=0.0,
        dram_active=0.12,
        graphics_active=1.0,
    )
    names = [f"MIG-{i}" for i in range(leaves)]
    t0 = time.process_time()
    for cycle in range(cycles):
        now = cycle * interval
        for leaf in names:
            clf.observe(leaf, sig, None, True, now)
    return (time.process_time() - t0) / (cycles * leaves) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=500)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--leaves", type=int, default=56)
    a = ap.parse_args()
    runs = [per_observe_us(a.cycles, a.interval, a.leaves) for _ in range(5)]
    print(f"{a.leaves} leaves, {a.cycles} cycles at {a.interval} s: {statistics.median(runs):.1f} µs CPU per observe")


if __name__ == "__main__":
    main()
