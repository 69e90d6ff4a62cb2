"""The simulated GPU node (demo, CI, golden files): a GPU backend, attribution sources and a probe
runner that stand in for NVML, the kubelet, the API server, /proc and the CuPy probes.  H200 nodes
with GPM, and pre-Hopper nodes without it (A100, L40S, A10G); ``gpm=False`` reads any node as if
NVML refused GPM.

Only the composition root (``exporter.cli``) chooses it, through ``Simulation``; no production
module imports this package.
"""

from exporter.sim.backend import SCENARIOS, SimulatedBackend
from exporter.sim.faults import SimFaults
from exporter.sim.simulation import Simulation

__all__ = ["SCENARIOS", "SimFaults", "SimulatedBackend", "Simulation"]
