"""The child side of the device runs that switch a GPU load between phases (scripts/gpu_boundness.py,
scripts/gpu_transfer.py): the loop that warms each phase, says ``ready``, runs the first phase until
the parent writes ``next`` on stdin, then runs the second and says ``switched <t>``.

The parent reads those lines to time its windows: ``t`` is ``time.monotonic()`` in seconds at the
switch (one clock for every process on Linux).  A phase's step is a callable that queues some GPU
work; ``duty`` makes one that works part of each period.  Needs torch (imported when called).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import NoReturn

Step = Callable[[], None]
"""One unit of a load: queues GPU work (and may wait for it)."""


def duty(step: Step, on: float, period: float, after: Step | None = None) -> Step:
    """A step that repeats ``step`` for ``on`` seconds of every ``period`` seconds and then waits
    (a stalled input); ``after`` runs after each repeat (e.g. ``torch.cuda.synchronize``, so that
    the work really ends inside the ``on`` part)."""

    def stalled() -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < on:
            step()
            if after is not None:
                after()
        time.sleep(max(0.0, period - (time.monotonic() - t0)))

    return stalled


def run_phases(phases: Sequence[tuple[str, Step]], warm: int) -> NoReturn:
    """Run ``phases`` ((kind, step), one or two) until the parent kills this process.

    Every phase but ``idle`` runs ``warm`` steps first, so that neither is timed cold.  Prints
    ``ready`` once the first phase loops, and ``switched <monotonic s>`` when a ``next`` line on
    stdin moved it to the second phase.  A full launch queue just blocks the loop.
    """
    import torch

    for kind, step in phases:
        if kind != "idle":
            for _ in range(warm):
                step()
    torch.cuda.synchronize()
    switch = threading.Event()

    def wait_switch() -> None:
        for line in sys.stdin:
            if line.strip() == "next":
                switch.set()
                return

    threading.Thread(target=wait_switch, daemon=True).start()
    print("ready", flush=True)
    step = phases[0][1]
    announced = False
    while True:
        if switch.is_set() and not announced and len(phases) > 1:
            torch.cuda.synchronize()
            step = phases[1][1]
            announced = True
            print(f"switched {time.monotonic():.4f}", flush=True)
        step()
