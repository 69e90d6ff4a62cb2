"""Schedules bandwidth probes per GPU / MIG leaf, runs them one child process at a time, caches results.

The sampler calls ``observe()`` once per cycle and copies ``results()`` into the Snapshot, so a
scrape only ever reads the cache.  The exporter never imports CuPy: the probe runs in a child
(``python -m probes``) that is killed at a hard wall-clock timeout.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from exporter.attribution.stages import PODRESOURCES
from exporter.model import Attribution, GpuSample, LeafSample, ProbeResult, Snapshot
from probes.expected import PROBES, efficiency_ratio

log = logging.getLogger(__name__)

GiB = 1 << 30

RESULTS: tuple[str, ...] = (
    "ok",
    "skipped_busy",
    "skipped_memory",
    "skipped_allocated",
    "skipped_exclusive",
    "failed",
    "timeout",
)
"""Values of the ``result`` label of ``gpulens_probe_runs_total``; each starts at 0 per leaf."""


@dataclass(frozen=True)
class ProbeOptions:
    """When and how probes run (seconds, bytes, ratios 0..1)."""

    enabled: bool
    interval_seconds: float = 3600.0
    """Time between two runs on one leaf, before jitter."""
    jitter_ratio: float = 0.1
    """Each wait is multiplied by a uniform factor in [1 - j, 1 + j]."""
    timeout_seconds: float = 10.0
    """Hard wall-clock limit of one child process; it is killed after this."""
    max_utilization_ratio: float = 0.05
    """A leaf whose NVML utilisation or GPM SM activity is above this is busy."""
    min_free_memory_bytes: int = 4 * GiB
    skip_allocated: bool = True
    """Do not probe a device the kubelet allocated to a pod."""
    command: tuple[str, ...] = (sys.executable, "-m", "probes")
    """The probe CLI; ``--uuid LEAF --timeout S`` are appended."""
    first_delay_seconds: float = 60.0
    """Wait after a leaf is first seen (jittered like every wait), so a starting exporter first
    sees a few cycles of utilisation before it judges a GPU idle."""
    retry_seconds: float = 600.0
    """Wait after a skip, failure or timeout (capped at the interval), jittered likewise."""


@dataclass(frozen=True)
class ProbeRequest:
    """One run to make: which leaf, on what GPU model, within what time."""

    uuid: str
    """Leaf id passed as ``--uuid``: the MIG UUID for a MIG instance, else the GPU UUID."""
    gpu_uuid: str
    gpu_index: int
    gpu_name: str | None
    memory_fraction: float
    """The leaf's share of its GPU's memory (1 for a whole GPU)."""
    timeout_seconds: float


@dataclass(frozen=True)
class ProbeOutcome:
    """What a run returned: ``result`` is ``ok``, ``failed`` or ``timeout``."""

    result: str
    bandwidths: Mapping[str, float] = field(default_factory=dict)
    """Probe name -> bytes per second (``ok`` only)."""
    detail: str = ""


class ProbeRunner(Protocol):
    """Executes one probe run; ``cancel()`` may be called from another thread and must end it."""

    def run(self, request: ProbeRequest) -> ProbeOutcome: ...

    def cancel(self) -> None: ...


def parse_probe_output(stdout: str, returncode: int) -> ProbeOutcome:
    """Turn the probe CLI's exit status and JSON line into an outcome."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        doc = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        return ProbeOutcome("failed", detail=f"exit {returncode}, no JSON object on stdout")
    error = doc.get("error")
    if returncode != 0 or error is not None:
        kind = error.get("type") if isinstance(error, dict) else None
        message = error.get("message", "") if isinstance(error, dict) else str(error)
        return ProbeOutcome("timeout" if kind == "timeout" else "failed", detail=f"exit {returncode}: {message}")
    probes = doc.get("probes")
    bandwidths: dict[str, float] = {}
    if isinstance(probes, dict):
        for name in PROBES:
            entry = probes.get(name)
            value = entry.get("bytes_per_second") if isinstance(entry, dict) else None
            if isinstance(value, int | float) and value > 0:
                bandwidths[name] = float(value)
    if not bandwidths:
        return ProbeOutcome("failed", detail="JSON without any probe bandwidth")
    return ProbeOutcome("ok", MappingProxyType(bandwidths))


class SubprocessProbeRunner:
    """Runs the probe CLI in its own process group and kills the group at the deadline."""

    def __init__(self, command: tuple[str, ...]) -> None:
        self._command = command
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self._cancelled = False

    def run(self, request: ProbeRequest) -> ProbeOutcome:
        # The child's own watchdog fires first so it can say "timeout" in JSON; the kill is the
        # hard limit for a child stuck in the driver.
        argv = [*self._command, "--uuid", request.uuid, "--timeout", f"{request.timeout_seconds * 0.9:.3f}"]
        with self._lock:
            if self._cancelled:
                return ProbeOutcome("failed", detail="scheduler closed")
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )
            except OSError as exc:
                return ProbeOutcome("failed", detail=f"cannot start {argv[0]}: {exc}")
            self._proc = proc
        try:
            stdout, stderr = proc.communicate(timeout=request.timeout_seconds)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            proc.communicate()
            return ProbeOutcome("timeout", detail=f"killed after {request.timeout_seconds:g} s")
        finally:
            with self._lock:
                self._proc = None
        if self._cancelled:
            return ProbeOutcome("failed", detail="scheduler closed")
        outcome = parse_probe_output(stdout, proc.returncode)
        if outcome.result != "ok" and stderr.strip():
            return ProbeOutcome(outcome.result, outcome.bandwidths, f"{outcome.detail}; {stderr.strip()[-500:]}")
        return outcome

    @staticmethod
    def _kill(proc: subprocess.Popen[str]) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group is ours alone

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            proc = self._proc
        if proc is not None:
            self._kill(proc)


def _leaf_free_bytes(gpu: GpuSample, leaf: LeafSample) -> int | None:
    total, used = leaf.memory_total_bytes, leaf.memory_used_bytes
    if leaf.mig is None and (total is None or used is None):
        total, used = gpu.memory_total_bytes, gpu.memory_used_bytes
    if total is None or used is None:
        return None
    return total - used


def _is_allocated(gpu: GpuSample, leaf: LeafSample, attribution: Attribution | None) -> bool:
    if attribution is None:
        return False
    for a in attribution.allocations:
        if leaf.mig is not None and a.mig_uuid == leaf.mig.mig_uuid:
            return True
        if a.uuid == gpu.uuid and a.mig_uuid is None:
            return True  # the whole physical GPU (or a time-slicing replica of it) is held
    return False


def _allocation_unknown(snapshot: Snapshot) -> bool:
    """True when this snapshot's kubelet stage ran and did not succeed: no allocation can be
    trusted, so none may be assumed free.  (No kubelet stage at all: attribution is off.)"""
    return any(stage.stage == PODRESOURCES and not stage.success for stage in snapshot.stages)


def _is_busy(gpu: GpuSample, leaf: LeafSample, threshold: float) -> bool:
    if leaf.processes:
        return True
    util = leaf.utilization_ratio
    if util is None and leaf.mig is None:
        util = gpu.utilization_ratio
    if util is not None and util > threshold:
        return True
    sm_active = leaf.gpm.sm_active if leaf.gpm is not None else None
    return sm_active is not None and sm_active > threshold


def _memory_fraction(gpu: GpuSample, leaf: LeafSample) -> float:
    if leaf.mig is None or not leaf.memory_total_bytes or not gpu.memory_total_bytes:
        return 1.0
    return min(1.0, leaf.memory_total_bytes / gpu.memory_total_bytes)


class ProbeScheduler:
    """Decides per leaf when to probe, gates each run, runs one child at a time, caches results.

    ``observe()`` never blocks: a run happens on a worker thread.  ``results()`` only reads.
    """

    def __init__(
        self,
        options: ProbeOptions,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        runner: ProbeRunner | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._options = options
        self._clock = clock
        self._wall = wall
        self._runner: ProbeRunner = runner or SubprocessProbeRunner(options.command)
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._due: dict[str, float] = {}
        self._latest: dict[tuple[str, str], ProbeResult] = {}
        self._runs: dict[tuple[str, str], int] = {}
        self._thread: threading.Thread | None = None
        self._closed = False

    # --- the sampler's interface ------------------------------------------------------
    def observe(self, snapshot: Snapshot) -> None:
        """Start the probe of at most one due leaf that passes the gates; count the skips."""
        if not self._options.enabled:
            return
        now = self._clock()
        with self._lock:
            if self._closed:
                return
            leaves = [
                (gpu, leaf)
                for gpu in snapshot.backend.gpus
                if gpu.up
                for leaf in gpu.leaves
                if leaf.mig is not None or gpu.mig_mode != "enabled"
            ]
            self._forget_except({leaf.leaf_id for _, leaf in leaves})
            for _, leaf in leaves:
                if leaf.leaf_id not in self._due:
                    self._due[leaf.leaf_id] = now + self._wait(self._options.first_delay_seconds)
                    for result in RESULTS:
                        self._runs.setdefault((leaf.leaf_id, result), 0)
            if self._thread is not None and self._thread.is_alive():
                return  # one child at a time; due leaves wait for the next cycle
            for gpu, leaf in sorted(leaves, key=lambda gl: self._due[gl[1].leaf_id]):
                if self._due[leaf.leaf_id] > now:
                    break
                verdict = self._gate(gpu, leaf, snapshot.attribution, _allocation_unknown(snapshot))
                if verdict is not None:
                    self._count(leaf.leaf_id, verdict)
                    self._due[leaf.leaf_id] = now + self._wait(self._retry_seconds())
                    continue
                self._due[leaf.leaf_id] = now + self._wait(self._options.interval_seconds)
                self._start(gpu, leaf)
                break

    def results(self) -> tuple[tuple[ProbeResult, ...], Mapping[tuple[str, str], int]]:
        """Latest successful result per (leaf, probe) and run counts per (leaf, result)."""
        with self._lock:
            latest = tuple(self._latest[k] for k in sorted(self._latest))
            runs = MappingProxyType(dict(self._runs))
        return latest, runs

    def close(self) -> None:
        """Kill a running child and wait for its worker thread."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._runner.cancel()
        if thread is not None:
            thread.join(timeout=self._options.timeout_seconds + 5.0)

    # --- helpers ----------------------------------------------------------------------
    def wait_until_idle(self, timeout: float | None = None) -> bool:
        """Block until no probe runs (for tests and scripts); False if one still runs."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def _wait(self, base: float) -> float:
        j = self._options.jitter_ratio
        return base * self._rng.uniform(1.0 - j, 1.0 + j)

    def _retry_seconds(self) -> float:
        return min(self._options.retry_seconds, self._options.interval_seconds)

    def _gate(
        self, gpu: GpuSample, leaf: LeafSample, attribution: Attribution | None, allocation_unknown: bool = False
    ) -> str | None:
        """The skip reason for probing ``leaf`` now, or ``None`` if it may run.  While the kubelet
        has not answered (or is failing), allocation is unknown and counts as allocated."""
        o = self._options
        if o.skip_allocated and (allocation_unknown or _is_allocated(gpu, leaf, attribution)):
            return "skipped_allocated"
        if gpu.compute_mode == "exclusive_process":
            return "skipped_exclusive"  # our context would lock tenants out, or fail to open
        if _is_busy(gpu, leaf, o.max_utilization_ratio):
            return "skipped_busy"
        free = _leaf_free_bytes(gpu, leaf)
        if free is None or free < o.min_free_memory_bytes:
            return "skipped_memory"  # unknown free memory is treated as short: never guess
        return None

    def _count(self, leaf_id: str, result: str) -> None:
        key = (leaf_id, result)
        self._runs[key] = self._runs.get(key, 0) + 1

    def _forget_except(self, keep: set[str]) -> None:
        """Drop state of leaves that disappeared (GPU lost or removed, MIG reconfigured)."""
        for leaf_id in [k for k in self._due if k not in keep]:
            del self._due[leaf_id]
        self._latest = {k: v for k, v in self._latest.items() if k[0] in keep}
        self._runs = {k: v for k, v in self._runs.items() if k[0] in keep}

    def _start(self, gpu: GpuSample, leaf: LeafSample) -> None:
        request = ProbeRequest(
            uuid=leaf.leaf_id,
            gpu_uuid=gpu.uuid,
            gpu_index=gpu.index,
            gpu_name=gpu.name,
            memory_fraction=_memory_fraction(gpu, leaf),
            timeout_seconds=self._options.timeout_seconds,
        )
        self._thread = threading.Thread(
            target=self._run_one, args=(request,), name=f"gpulens-probe-{gpu.index}", daemon=True
        )
        self._thread.start()

    def _run_one(self, request: ProbeRequest) -> None:
        try:
            outcome = self._runner.run(request)
        except Exception as exc:  # a runner bug must count as a failure, not kill the thread silently
            log.exception("probe runner raised")
            outcome = ProbeOutcome("failed", detail=f"{type(exc).__name__}: {exc}")
        finished = self._wall()
        with self._lock:
            closed = self._closed
        if closed:  # killed by close(): a shutdown, not a GPU problem; count and report nothing
            log.info("probe of %s stopped: the exporter is shutting down", request.uuid)
            return
        if outcome.result != "ok":
            log.warning("probe of %s %s: %s", request.uuid, outcome.result, outcome.detail)
        with self._lock:
            if request.uuid not in self._due:
                return  # the leaf vanished while its probe ran
            self._count(request.uuid, outcome.result if outcome.result in RESULTS else "failed")
            if outcome.result != "ok":
                self._due[request.uuid] = self._clock() + self._wait(self._retry_seconds())
                return
            for probe, bandwidth in outcome.bandwidths.items():
                self._latest[(request.uuid, probe)] = ProbeResult(
                    uuid=request.uuid,
                    probe=probe,
                    bandwidth_bytes_per_second=bandwidth,
                    efficiency_ratio=efficiency_ratio(bandwidth, request.gpu_name, probe, request.memory_fraction),
                    last_success_timestamp=finished,
                )
