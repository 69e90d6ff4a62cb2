"""The simulated node as the composition root sees it: one object that supplies the backend,
the attribution stage and the probe runner, so that the choice of simulation is made once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.attribution.pipeline import PipelineAttributor
from exporter.sim.attribution import simulated_attributor
from exporter.sim.backend import SimulatedBackend
from exporter.sim.faults import SimFaults

if TYPE_CHECKING:
    from exporter.sim.probes import SimulatedProbeRunner

DEGRADED_PROBE_GPU: dict[str, int] = {"h200x8": 7}
"""Scenario -> the one GPU whose simulated HBM copy probe runs slow.  One per fleet, not one per
node: the other scenarios' idle GPUs probe healthy, so the slow one has healthy peers of its model
to compare with."""


@dataclass(frozen=True)
class Simulation:
    """A simulated node: its backend, and the attribution and probe parts that go with it."""

    backend: SimulatedBackend
    probe_first_delay_seconds: float = 5.0
    """The simulated fleet shows probe results within seconds of the demo starting."""

    @classmethod
    def create(cls, scenario: str, seed: int = 0, faults: str = "", gpm: bool = True) -> Simulation:
        """The node of ``--sim.scenario``, ``--sim.seed`` and ``--sim.faults``; ValueError on a bad
        scenario name or fault spec.  ``gpm=False`` reads it as if NVML refused GPM (``--collect.gpm``
        off): every leaf's GPM ``None``, to compare the classes without GPM with those with it."""
        return cls(SimulatedBackend(scenario, seed=seed, faults=SimFaults.parse(faults) if faults else None, gpm=gpm))

    def attributor(self, nic_ids: Callable[[], frozenset[str]] | None = None) -> PipelineAttributor:
        """Kubelet, API, ResourceSlice and cgroup stages answered by the simulated node; ``nic_ids``:
        the simulated node's NICs, as the NIC source reads them from its sysfs tree."""
        return simulated_attributor(self.backend, nic_ids)

    def probe_runner(self) -> SimulatedProbeRunner:
        """Simulated probe results, slow on this scenario's degraded GPU if it has one."""
        from exporter.sim.probes import SimulatedProbeRunner  # only when probes are on

        return SimulatedProbeRunner(degraded_gpu_index=DEGRADED_PROBE_GPU.get(self.backend.scenario))
