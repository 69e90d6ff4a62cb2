"""Compute processes of one physical GPU's leaves: who runs, their MPS role, their utilisation."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.backends.nvml.query import NvmlQuery
from exporter.backends.nvml.values import id_or_none, percent, text
from exporter.model import MPS_CLIENT, MPS_SERVER, MigInstance, ProcessSample

MPS_SERVER_PROCESS = "nvidia-cuda-mps-server"
"""Executable name of the MPS server (the control daemon starts one per GPU set and user)."""

Utilization = Mapping[int, tuple[float | None, float | None]]
"""pid -> (SM, memory) busy ratios over the last window."""
PROCESS_UTILIZATION_SECONDS = 5.0
"""Seconds between two reads of per-process utilisation while the same processes run (see
``Processes.utilization``)."""


@dataclass(frozen=True, slots=True)
class LeafProcesses:
    """The processes NVML lists on one leaf (host PIDs) and the MPS role of those that have one."""

    running: list[Any]
    roles: dict[int, str]


class Processes:
    """Process lists of one GPU (whole or per MIG device) and its per-process utilisation windows.

    ``wall_clock`` (Unix seconds) supplies the timestamps NVML's per-process utilisation expects.
    """

    def __init__(self, q: NvmlQuery, handle: Any, uuid: str, wall_clock: Callable[[], float]) -> None:
        self._q = q
        self._handle = handle
        self._uuid = uuid
        self._wall_clock = wall_clock
        self._since_us: int | None = None
        self._read_at = -math.inf
        """Wall clock (s) of the last utilisation read."""
        self._held: Utilization = {}
        """What the last read gave, answered until the next."""
        self._held_pids: frozenset[int] = frozenset()
        """The processes listed when it was read."""

    def on_leaf(self, scope: str, handle: Any) -> LeafProcesses:
        """Compute processes on a whole GPU or MIG device, MPS clients included, with their roles.

        NVML lists MPS clients apart (``nvmlDeviceGetMPSComputeRunningProcesses``); the compute
        process list holds them and the MPS server. The server is told by its process name
        (``nvidia-cuda-mps-server``), asked only while the leaf has MPS clients.
        """
        q, f = self._q, self._q.fns
        running = list(q.call(scope, f.nvmlDeviceGetComputeRunningProcesses, handle) or [])
        clients = list(q.call(scope, f.nvmlDeviceGetMPSComputeRunningProcesses, handle, expect=("NOT_FOUND",)) or [])
        if not clients:
            return LeafProcesses(running, {})
        roles = {int(p.pid): MPS_CLIENT for p in clients}
        listed = {int(p.pid) for p in running}
        running.extend(p for p in clients if int(p.pid) not in listed)
        for p in running:
            pid = int(p.pid)
            if pid in roles:
                continue
            name = text(q.call(scope, f.nvmlSystemGetProcessName, pid, expect=("NOT_FOUND",))) or ""
            if name.rsplit("/", 1)[-1] == MPS_SERVER_PROCESS:
                roles[pid] = MPS_SERVER
        return LeafProcesses(running, roles)

    def utilization(self, pids: frozenset[int]) -> Utilization:
        """pid -> (sm, memory) ratios over the span since the read before (``pids``: the
        processes listed now).

        The call is one of the dearest NVML reads on an H200 whatever it returns
        (``bench/nvml_alternatives.py``), and NVML averages each process over the whole span since
        the timestamp it is given (under bursts of work, one read every 5 s gives the mean share,
        one a second swings between none and all); the figures are in docs/benchmarks.md,
        "Figures moved out of docstrings".
        So it is read every ``PROCESS_UTILIZATION_SECONDS`` and its answer held in between: a mean
        over up to 5 s instead of the last second.  It is read at once when a process is listed
        that the last read did not know, so a new tenant's share shows on its first cycle.
        Skipped (``pids`` empty) while no compute process runs, as most GPUs in a fleet sit idle;
        empty on the first cycle.
        """
        q = self._q
        now = self._wall_clock()
        since = self._since_us
        if since is None or not pids:
            self._since_us = int(now * 1e6)
            self._held, self._held_pids, self._read_at = {}, frozenset(), -math.inf
            return {}
        if now - self._read_at < PROCESS_UTILIZATION_SECONDS and pids <= self._held_pids:
            return self._held
        self._since_us = int(now * 1e6)
        # NotFound means no process ran in the window: an empty answer, not an error.
        samples = q.call(
            self._uuid,
            q.fns.nvmlDeviceGetProcessUtilization,
            self._handle,
            since,
            expect=("NOT_FOUND",),
            default=[],
        )
        sums: dict[int, list[float]] = {}
        for s in samples or []:
            acc = sums.setdefault(int(s.pid), [0.0, 0.0, 0.0])
            acc[0] += s.smUtil
            acc[1] += s.memUtil
            acc[2] += 1
        self._held = {pid: (percent(q, sm / n), percent(q, mem / n)) for pid, (sm, mem, n) in sums.items()}
        self._held_pids, self._read_at = pids, now
        return self._held


def process_samples(
    listed: LeafProcesses, utilization: Utilization, mig: MigInstance | None = None
) -> tuple[ProcessSample, ...]:
    """One ``ProcessSample`` per listed process; MIG ids from ``mig`` when the leaf is an instance."""
    out = []
    roles = listed.roles
    for p in listed.running:
        pid = int(p.pid)
        sm, mem = utilization.get(pid, (None, None))
        gi = mig.gpu_instance_id if mig else id_or_none(getattr(p, "gpuInstanceId", None))
        ci = mig.compute_instance_id if mig else id_or_none(getattr(p, "computeInstanceId", None))
        out.append(
            ProcessSample(
                pid=pid,
                used_memory_bytes=int(p.usedGpuMemory) if p.usedGpuMemory is not None else None,
                sm_util_ratio=sm,
                memory_util_ratio=mem,
                gpu_instance_id=gi,
                compute_instance_id=ci,
                mps_role=roles.get(pid),
            )
        )
    return tuple(out)
