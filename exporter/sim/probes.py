"""Simulated probe runner: bandwidth probe results for the simulated fleet, with no process and no GPU."""

from __future__ import annotations

import threading
import zlib
from collections.abc import Mapping
from types import MappingProxyType

from exporter.probe_scheduler import ProbeOutcome, ProbeRequest
from probes.expected import PROBES, expected_bandwidth

_SIM_DEFAULTS: Mapping[str, float] = {"hbm_copy": 2.0e12, "h2d": 25e9, "d2h": 25e9}


class SimulatedProbeRunner:
    """SIMULATED probe results for the simulated backend (demo, CI); no process, no GPU.

    Deterministic: each probe reports its model's achievable bandwidth (probes/expected.py) times
    an efficiency of 0.985-1.0 that depends only on the leaf and the run number, except the HBM
    copy of GPU ``degraded_gpu_index``, which runs at ``degraded_efficiency`` (default 0.8) so
    dashboards and the "probe degraded" alert have something to show.  The default, GPU 7, is the
    idle, unallocated whole GPU of the sim's ``h200x8`` and ``mig`` scenarios: the gates skip
    the busy and allocated ones there, exactly as they would on a real node.
    """

    def __init__(self, degraded_gpu_index: int | None = 7, degraded_efficiency: float = 0.8) -> None:
        self._degraded = degraded_gpu_index
        self._degraded_efficiency = degraded_efficiency
        self._runs: dict[str, int] = {}
        self._lock = threading.Lock()

    def run(self, request: ProbeRequest) -> ProbeOutcome:
        with self._lock:
            n = self._runs[request.uuid] = self._runs.get(request.uuid, 0) + 1
        bandwidths: dict[str, float] = {}
        for probe in PROBES:
            expected = expected_bandwidth(request.gpu_name, probe, request.memory_fraction)
            base = expected.achievable_bytes_per_second if expected else _SIM_DEFAULTS[probe]
            if probe == "hbm_copy" and request.gpu_index == self._degraded:
                efficiency = self._degraded_efficiency
            else:
                efficiency = 1.0 - (zlib.crc32(f"{request.uuid}/{probe}/{n}".encode()) % 16) / 1000
            bandwidths[probe] = base * efficiency
        return ProbeOutcome("ok", MappingProxyType(bandwidths), detail="simulated")

    def cancel(self) -> None:
        """Nothing runs in the background."""
