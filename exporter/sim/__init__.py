"""The simulated H200 node (demo, CI, golden files): a GPU backend, attribution sources and a probe
runner that stand in for NVML, the kubelet, the API server, /proc and the CuPy probes.

Only the composition root (``exporter.cli``) chooses it, through ``Simulation``; no production
module imports this package.
"""

from exporter.sim.backend import SCENARIOS, SimulatedBackend
from exporter.sim.faults import SimFaults
from exporter.sim.simulation import Simulation

__all__ = ["SCENARIOS", "SimFaults", "SimulatedBackend", "Simulation"]
