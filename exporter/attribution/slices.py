"""This node's DRA devices as their drivers publish them in ResourceSlices: an immutable snapshot
that the ResourceSlice source (``resourceslices.py``) builds and the claim resolution
(``claims.py``) reads."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from exporter.model import SliceDevice

DeviceKey = tuple[str, str, str]
"""(driver, pool, device): how PodResources names a claimed device, and how a slice does."""


@dataclass(frozen=True)
class SliceDirectory:
    """Published devices by (driver, pool, device)."""

    devices: Mapping[DeviceKey, SliceDevice]

    @staticmethod
    def of(devices: Iterable[SliceDevice]) -> SliceDirectory:
        """Index the devices; a later device of the same key replaces an earlier one."""
        return SliceDirectory(MappingProxyType({(d.driver, d.pool, d.device): d for d in devices}))

    def get(self, driver: str, pool: str, device: str) -> SliceDevice | None:
        """The published device, or ``None``."""
        return self.devices.get((driver, pool, device))
