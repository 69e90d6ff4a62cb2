"""The simulated GPU node (demo, CI, golden files): a GPU backend, attribution sources and a probe
runner that stand in for NVML, the kubelet, the API server, /proc and the CuPy probes.  H200 nodes
with GPM, and pre-Hopper nodes without it (A100, L40S, A10G); ``gpm=False`` reads any node as if
NVML refused GPM.  Nodes with RDMA NICs (``p5en``, ``p5en-nogdr``) also write a fake sysfs/procfs
tree (``SysfsTree``) that the NIC source reads (``SimulatedBackend.network_roots()``).

Only the composition root (``exporter.cli``) chooses it, through ``Simulation``; no production
module imports this package.
"""

from exporter.sim.backend import SCENARIOS, SimulatedBackend
from exporter.sim.faults import SimFaults
from exporter.sim.simulation import Simulation
from exporter.sim.sysfs_tree import SysfsTree

__all__ = ["SCENARIOS", "SimFaults", "SimulatedBackend", "Simulation", "SysfsTree"]
