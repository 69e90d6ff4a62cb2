"""Device-plugin device IDs -> the GPU or MIG instance they name on this node.

The kubelet reports device IDs exactly as the device plugin advertised them, and plugins differ:
NVIDIA's plugin uses ``GPU-<uuid>``, ``MIG-<uuid>`` and ``GPU-<uuid>::N`` (time-slicing / MPS
replica N); old drivers named MIG devices ``MIG-GPU-<uuid>/<gi>/<ci>``; GKE's plugin uses
``nvidia0``, ``nvidia0/gi1`` (MIG by GPU instance id) and ``…/vgpu2`` (time-sharing replica).
An ID that names nothing on this node is reported with a reason, never raised.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.model import BackendSample

UNMAPPED_REASONS: tuple[str, ...] = ("empty_id", "unknown_shape", "unknown_gpu", "unknown_mig")
"""Every reason ``resolve`` can give (label values of ``gpulens_unmapped_devices_total``)."""

_HEX_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_REPLICA = r"(?:::(?P<replica>\d+))?"
_GPU_ID = re.compile(rf"^(?:GPU-)?(?P<uuid>{_HEX_UUID}){_REPLICA}$")
_MIG_ID = re.compile(rf"^MIG-(?P<uuid>{_HEX_UUID}){_REPLICA}$")
_MIG_LEGACY_ID = re.compile(rf"^MIG-GPU-(?P<uuid>{_HEX_UUID})/(?P<gi>\d+)/(?P<ci>\d+){_REPLICA}$")
_GKE_ID = re.compile(r"^nvidia(?P<index>\d+)(?:/gi(?P<gi>\d+))?(?:/vgpu(?P<replica>\d+))?$")


@dataclass(frozen=True)
class DeviceRef:
    """Where a device ID points: a physical GPU, optionally a MIG instance and a replica."""

    uuid: str
    """Physical GPU UUID as the backend spells it."""
    mig_uuid: str | None = None
    replica: str | None = None
    """Time-slicing replica number as a string (``"2"`` for ``GPU-…::2``), ``None`` if exclusive."""


def _key(uuid: str) -> str:
    """Comparison key of a UUID: the hex part, lower case (plugins vary the prefix and case)."""
    for prefix in ("GPU-", "MIG-"):
        if uuid.startswith(prefix):
            uuid = uuid[len(prefix) :]
    return uuid.lower()


class DeviceIndex:
    """This node's GPUs and MIG instances, indexed for every device-ID shape; built per sample."""

    def __init__(self, sample: BackendSample) -> None:
        self._gpus: dict[str, str] = {}
        self._migs: dict[str, tuple[str, str]] = {}
        self._by_index: dict[int, str] = {}
        self._mig_by_gi: dict[tuple[str, int], str] = {}
        self._mig_by_gi_ci: dict[tuple[str, int, int], str] = {}
        self._mig_by_profile: dict[tuple[str, str], list[str]] = {}
        for gpu in sample.gpus:
            self._gpus[_key(gpu.uuid)] = gpu.uuid
            self._by_index[gpu.index] = gpu.uuid
            for leaf in gpu.leaves:
                if leaf.mig is None:
                    continue
                mig = leaf.mig
                self._migs[_key(mig.mig_uuid)] = (gpu.uuid, mig.mig_uuid)
                # GKE names a MIG device by GPU instance; with several compute instances in one
                # GPU instance the first one stands for it.
                self._mig_by_gi.setdefault((gpu.uuid, mig.gpu_instance_id), mig.mig_uuid)
                self._mig_by_gi_ci[(gpu.uuid, mig.gpu_instance_id, mig.compute_instance_id)] = mig.mig_uuid
                self._mig_by_profile.setdefault((gpu.uuid, mig.profile), []).append(mig.mig_uuid)
        self.key = (
            tuple(sorted(self._gpus.values())),
            tuple(sorted(m for _, m in self._migs.values())),
        )
        """Changes exactly when the set of GPUs or MIG instances changes (cache key)."""

    @property
    def empty(self) -> bool:
        """True when the backend reported no GPU (down, or no GPU on this node)."""
        return not self._gpus

    def looks_like_gpu(self, device_id: str) -> bool:
        """True if the ID has one of the GPU shapes, whether or not it exists on this node."""
        return any(p.match(device_id) for p in (_GPU_ID, _MIG_ID, _MIG_LEGACY_ID, _GKE_ID))

    def migs_with_profile(self, gpu_uuid: str, profile: str) -> tuple[str, ...]:
        """The MIG instances of profile ``profile`` (``1g.18gb``) on the physical GPU ``gpu_uuid``
        (as the backend spells it), in the backend's order."""
        return tuple(self._mig_by_profile.get((gpu_uuid, profile), ()))

    def resolve(self, device_id: str) -> DeviceRef | str:
        """The device the ID names, or the reason it names none (one of ``UNMAPPED_REASONS``)."""
        if not device_id.strip():
            return "empty_id"
        m = _GPU_ID.match(device_id)
        if m:
            uuid = self._gpus.get(m["uuid"].lower())
            if uuid is None:
                # A bare or GPU-prefixed UUID can also be a MIG instance on some plugins.
                mig = self._migs.get(m["uuid"].lower())
                if mig is not None and not device_id.startswith("GPU-"):
                    return DeviceRef(mig[0], mig[1], m["replica"])
                return "unknown_gpu"
            return DeviceRef(uuid, None, m["replica"])
        m = _MIG_ID.match(device_id)
        if m:
            mig = self._migs.get(m["uuid"].lower())
            return DeviceRef(mig[0], mig[1], m["replica"]) if mig else "unknown_mig"
        m = _MIG_LEGACY_ID.match(device_id)
        if m:
            parent = self._gpus.get(m["uuid"].lower())
            if parent is None:
                return "unknown_gpu"
            mig_uuid = self._mig_by_gi_ci.get((parent, int(m["gi"]), int(m["ci"])))
            return DeviceRef(parent, mig_uuid, m["replica"]) if mig_uuid else "unknown_mig"
        m = _GKE_ID.match(device_id)
        if m:
            parent = self._by_index.get(int(m["index"]))
            if parent is None:
                return "unknown_gpu"
            if m["gi"] is None:
                return DeviceRef(parent, None, m["replica"])
            mig_uuid = self._mig_by_gi.get((parent, int(m["gi"])))
            return DeviceRef(parent, mig_uuid, m["replica"]) if mig_uuid else "unknown_mig"
        return "unknown_shape"
