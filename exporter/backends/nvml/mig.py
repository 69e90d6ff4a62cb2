"""MIG devices of one physical GPU: found every cycle, each with its GPU/compute instance and profile."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from exporter.backends.nvml.query import NvmlQuery
from exporter.backends.nvml.values import text
from exporter.model import MigInstance

_MIG_PROFILE = re.compile(r"(?:\d+c\.)?\d+g\.\d+gb")


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device found this cycle: its NVML handle and identity."""

    handle: Any
    mig: MigInstance


class MigDevices:
    """Lists the MIG devices of one GPU; enumerated every cycle so a reconfiguration is seen at once.

    The slot count is asked once; each device's profile name (``1g.18gb``) once per MIG UUID.
    """

    def __init__(self, q: NvmlQuery, handle: Any, uuid: str) -> None:
        self._q = q
        self._handle = handle
        self._uuid = uuid
        self._max_devices: int | None = None
        self._profiles: dict[str, str] = {}

    def present(self) -> list[MigDevice]:
        """MIG devices present now, in slot order."""
        q, f, u = self._q, self._q.fns, self._uuid
        if self._max_devices is None:
            self._max_devices = q.call(u, f.nvmlDeviceGetMaxMigDeviceCount, self._handle) or 0
        found = []
        learned = False
        for slot in range(self._max_devices):
            handle = q.call(u, f.nvmlDeviceGetMigDeviceHandleByIndex, self._handle, slot, expect=("NOT_FOUND",))
            if handle is None:
                continue
            mig_uuid = text(q.call(u, f.nvmlDeviceGetUUID, handle, key="mig_uuid"))
            gi = q.call(u, f.nvmlDeviceGetGpuInstanceId, handle)
            ci = q.call(u, f.nvmlDeviceGetComputeInstanceId, handle)
            if not mig_uuid or gi is None or ci is None:
                continue
            profile = self._profiles.get(mig_uuid)
            if profile is None:
                profile = self._profile(handle, gi)
                self._profiles[mig_uuid] = profile
                learned = True
            found.append(MigDevice(handle, MigInstance(mig_uuid, int(gi), int(ci), profile)))
        if learned:  # reconfigured: forget the profiles of instances that are gone
            self._profiles = {d.mig.mig_uuid: d.mig.profile for d in found}
        return found

    def _profile(self, handle: Any, gpu_instance_id: int) -> str:
        """``1g.18gb``-style name: from the MIG device's name, else from its GPU instance profile."""
        q, f, u = self._q, self._q.fns, self._uuid
        name = text(q.call(u, f.nvmlDeviceGetName, handle, key="mig_name")) or ""
        match = _MIG_PROFILE.search(name)
        if match:
            return match.group(0)
        instance = q.call(u, f.nvmlDeviceGetGpuInstanceById, self._handle, gpu_instance_id)
        info = q.call(u, f.nvmlGpuInstanceGetInfo, instance) if instance is not None else None
        profile = (
            q.call(u, f.nvmlDeviceGetGpuInstanceProfileInfoById, self._handle, info.profileId)
            if info is not None
            else None
        )
        if profile is not None:
            match = _MIG_PROFILE.search(text(profile.name) or "")
            if match:
                return match.group(0)
            return f"{profile.sliceCount}g.{round(profile.memorySizeMB / 1024)}gb"
        return "unknown"
