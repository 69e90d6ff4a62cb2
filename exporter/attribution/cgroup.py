"""Host PID -> (pod UID, container ID) from ``<procfs>/<pid>/cgroup``, cached per PID.

Understands cgroup v1 and v2, the systemd and cgroupfs drivers, and containerd, CRI-O and Docker
paths, e.g. ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>
.slice/cri-containerd-<id>.scope`` or ``/kubepods/besteffort/pod<uid>/<id>``.  Needs the host's
PIDs to be visible (``hostPID`` or the host /proc mounted at ``--path.procfs``).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Collection, Mapping

from exporter import fsread
from exporter.attribution import stages
from exporter.attribution.merge import PidOwner
from exporter.model import StageResult

STAGE = stages.CGROUP

_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})(?:\.slice)?$"
)
_CONTAINER = re.compile(r"^(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})(?:\.scope)?$")


def parse_cgroup_path(path: str) -> PidOwner | None:
    """The pod and container a cgroup path belongs to; ``None`` if it is not a pod's container."""
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        m = _POD_UID.search(part)
        if m is None or not (part.startswith("pod") or "-pod" in part):
            continue
        uid = m.group(1).replace("_", "-")
        container_id = None
        if i + 1 < len(parts):
            c = _CONTAINER.match(parts[i + 1])
            if c is None:
                return None  # e.g. crio-conmon-<id>.scope: the runtime's monitor, not the container
            container_id = c.group(1)
        return PidOwner(pod_uid=uid, container_id=container_id)
    return None


def parse_cgroup_file(text: str) -> PidOwner | None:
    """Parse a whole ``/proc/<pid>/cgroup``: v2 (``0::/path``) or v1 (one line per hierarchy)."""
    best: PidOwner | None = None
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        owner = parse_cgroup_path(fields[2])
        if owner is not None:
            if owner.container_id is not None:
                return owner
            best = best or owner
    return best


MAX_CGROUP_FILE_BYTES = 64 * 1024
"""A real ``/proc/<pid>/cgroup`` is well under 4 KiB (one line per hierarchy); bytes past this
are never read, so a planted huge file under ``--path.procfs`` costs nothing."""


def read_bounded(path: str, limit: int = MAX_CGROUP_FILE_BYTES) -> str:
    """At most ``limit`` bytes of a regular file (``exporter.fsread.read_bounded``)."""
    return fsread.read_bounded(path, limit)


class CgroupPidSource:
    """Resolves PIDs through ``<procfs>/<pid>/cgroup``; each PID is read once while it lives.

    The cache holds only PIDs seen in the latest cycle (a PID that went away is forgotten, so a
    reused PID is read afresh) and never more than ``max_entries``.
    """

    def __init__(self, procfs: str = "/proc", max_entries: int = 4096) -> None:
        self.procfs = procfs
        self.max_entries = max_entries
        self._cache: dict[int, PidOwner | None] = {}
        self.reads = 0

    def _read(self, pid: int) -> PidOwner | None:
        self.reads += 1
        return parse_cgroup_file(read_bounded(os.path.join(self.procfs, str(pid), "cgroup")))

    def owners(self, pids: Collection[int]) -> tuple[Mapping[int, PidOwner] | None, StageResult]:
        """Owners of the PIDs that run in pods.  Fails (``None``) when none of the PIDs is
        visible, which means /proc is not the host's (no ``hostPID``)."""
        start = time.perf_counter()
        wanted = set(pids)
        for gone in [p for p in self._cache if p not in wanted]:
            del self._cache[gone]
        found: dict[int, PidOwner] = {}
        unreadable = 0
        for pid in wanted:
            if pid in self._cache:
                owner = self._cache[pid]
            else:
                try:
                    owner = self._read(pid)
                except OSError:
                    unreadable += 1  # exited since NVML listed it, or not visible: retry next cycle
                    continue
                if len(self._cache) < self.max_entries:
                    self._cache[pid] = owner
            if owner is not None:
                found[pid] = owner
        ok = not wanted or unreadable < len(wanted)
        result = StageResult(STAGE, ok, time.perf_counter() - start)
        return (found if ok else None), result

    def close(self) -> None:
        """Forget the cache."""
        self._cache.clear()
