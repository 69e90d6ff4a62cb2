"""Named layouts for the simulated backend: GPUs, MIG instances, processes and the pods holding them.

Each scenario is a fixed node: which GPU runs which workload, its MIG layout, and the
Kubernetes side (kubelet device IDs, pod owners, PID -> container) so attribution, the demo
and the dashboard work with no cluster.  Identity (UUIDs, PIDs, pod names) depends only on
the scenario name, never on the seed, so series keep their labels across runs.

The jobs whose PCIe traffic decides or tests their class run on the mps node's GPUs 4-6, which
that node used to leave free (``_host_transfer_jobs``): a data loader copying from pinned host
memory with no kernel (``transfer``), an LLM server offloading its KV cache (``memory``) and
training with its optimizer offloaded (``compute``).  Every other GPU keeps its workload and class;
their link traffic comes from the same workloads (exporter/sim/workloads.py).

Every node is one GPU model (``GpuModel``: what NVML answers for it).  The H200 nodes (``h200x8``,
``mig``, ``mig7x8``, ``timeslice``, ``mps``) have GPM; the pre-Hopper nodes (``a100``: p4de's
A100-SXM4-80GB, some in MIG mode; ``l40s``; ``a10g``: g5.12xlarge) have none, so only NVML's
GPU-Util, memory-controller utilisation, power, clocks and links describe them.

Two H200 nodes have RDMA NICs (``Scenario.network``; the backend writes them as a sysfs tree,
exporter/sim/sysfs_tree.py): ``p5en`` and ``p5en-nogdr``, the two workers of one multi-node
training job (``_p5en``), with and without GPUDirect RDMA.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from exporter.attribution.merge import PidOwner, PodMeta
from exporter.model import ClaimedDevice, ClaimRef, ContainerDevices, GpuFabric, MigInstance, SliceDevice
from exporter.sim import serving as sv
from exporter.sim import sysfs_tree as st
from exporter.sim import workloads as w

MIB = 1024**2
GIB = 1024**3

H200_MEMORY_BYTES = 143771 * MIB
DRIVER_RESERVED_BYTES = 512 * MIB
"""Memory the simulated driver reserves on a whole H200 (NVML memory info v2 ``reserved``)."""
H200_POWER_LIMIT_WATTS = 700.0
H200_SM_CLOCK_MAX_HERTZ = 1980e6
H200_MEMORY_CLOCK_HERTZ = 3201e6
DRIVER_VERSION = st.DRIVER_VERSION
GPU_NAME = "NVIDIA H200"

PCIE_GEN5_X16_BYTES_PER_SECOND = 32e9 * 16 * 128 / 130 / 8
"""What an H200's PCIe Gen5 x16 link carries each way at most (~63.0 GB/s): 32 GT/s per lane x
16 lanes, less the 128b/130b line encoding, 8 bits a byte (what NVML's generation x width gives)."""
PCIE_GEN4_X16_BYTES_PER_SECOND = 16e9 * 16 * 128 / 130 / 8
"""The same for PCIe Gen4 x16 (~31.5 GB/s): the A100's, L40S's and A10G's link."""
NVLINK_LINKS = 18
"""NVLink 4 links of an HGX H200 GPU, all active (to the baseboard's NVSwitches)."""
NVLINK_LINK_BYTES_PER_SECOND = 26.5625e9
"""One NVLink 4 link's rate each way as NVML states it (``nvidia-smi nvlink -s``: 26.562 GB/s):
two lanes of 106.25 Gb/s.  The data payload peaks near 25 GB/s a link (the "900 GB/s" of the
datasheet is 18 x 25 GB/s x 2 directions)."""
NVLINK_BYTES_PER_SECOND = NVLINK_LINKS * NVLINK_LINK_BYTES_PER_SECOND
"""Capacity of the GPU's NVLink each way (~478 GB/s): the active links together."""

# PCI bus of the eight GPUs on an HGX H200 baseboard (the fake sysfs tree places them there too).
_H200_PCI_BUS_IDS = tuple(f"00000000:{bus:02X}:00.0" for bus in st.HGX_GPU_BUSES)


@dataclass(frozen=True)
class MigProfile:
    """A MIG profile: compute slices (of 7) and instance memory (bytes, as NVML lists the profile)."""

    name: str
    compute_slices: int
    memory_bytes: int


MIG_PROFILES: dict[str, MigProfile] = {
    p.name: p
    for p in (
        MigProfile("1g.18gb", 1, int(17.25 * GIB)),
        MigProfile("1g.35gb", 1, int(34.75 * GIB)),
        MigProfile("2g.35gb", 2, int(34.75 * GIB)),
        MigProfile("3g.71gb", 3, 70 * GIB),
        MigProfile("4g.71gb", 4, 70 * GIB),
        MigProfile("7g.141gb", 7, int(139.625 * GIB)),
    )
}
"""The H200's MIG profiles (approximate memory)."""

A100_80GB_MIG_PROFILES: dict[str, MigProfile] = {
    p.name: p
    for p in (
        MigProfile("1g.10gb", 1, 9728 * MIB),
        MigProfile("2g.20gb", 2, 19968 * MIB),
        MigProfile("3g.40gb", 3, 40192 * MIB),
    )
}
"""The A100-SXM4-80GB's MIG profiles the ``a100`` node uses, with the memory ``nvidia-smi`` shows for
such instances (9728, 19968 and 40192 MiB).  A 3g.40gb takes 4 of the 8 memory slices, a 2g.20gb
2, a 1g.10gb 1: a GPU holds 3g + 2g + 1g + 1g, or 3g + 2g + 2g."""


@dataclass(frozen=True)
class GpuModel:
    """What NVML answers for one GPU model, and how the simulation scales the workloads to it.

    Sizes in bytes, power in watts, clocks in hertz, temperatures in °C, link rates in bytes/s each
    way.  Workload signatures (exporter/sim/workloads.py) were written for an H200: their power is
    scaled by ``power_scale``, and their host and peer traffic by the link capacities' ratios
    (``pcie_scale``, ``nvlink_scale``); their time shares (GPU-Util, util.mem) are the GPU's own.
    """

    name: str
    """``nvmlDeviceGetName``."""
    compute_capability: str
    memory_bytes: int
    """NVML's total memory of the whole GPU."""
    reserved_bytes: int
    """Memory the driver reserves (NVML memory info v2 ``reserved``)."""
    power_limit_watts: float
    idle_power_watts: float
    """Board power with no CUDA context (the GPU idles in P8)."""
    context_power_watts: float
    """Extra power while any process holds a context (the GPU stays in P0)."""
    sm_clock_max_hertz: float
    idle_sm_clock_hertz: float
    memory_clock_hertz: float
    temperature_thresholds: Mapping[str, float]
    """``nvmlDeviceGetTemperatureThreshold`` by kind; kinds NVML does not answer are absent."""
    celsius_per_watt: float
    """Die temperature above the 27 °C inlet per watt drawn, once settled (the cooling's resistance)."""
    memory_temperature_offset_celsius: float | None
    """HBM temperature minus die temperature; ``None``: no memory sensor (GDDR6: NVML NotSupported)."""
    fan_speed_ratio: float | None
    """What ``nvmlDeviceGetFanSpeed`` answers; ``None``: NotSupported (passively cooled)."""
    pcie_generation: int
    pcie_width: int
    pcie_bytes_per_second: float
    """What the PCIe link carries each way at most (generation x lanes, after line encoding)."""
    gpm: bool
    """GPM (Hopper and newer): SM, DRAM and pipe activity, and the link rates per window."""
    nvlink_links: int = 0
    """Active NVLinks (0: no NVLink)."""
    nvlink_link_bytes_per_second: float = 0.0
    """One link's rate each way as NVML states it (``NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON``)."""
    nvlink_counters: bool = False
    """NVML's cumulative per-link NVLink byte counters (``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX``)
    answer, so NVLink bytes are read from them; else only from GPM."""
    mig_profiles: Mapping[str, MigProfile] = field(default_factory=lambda: MappingProxyType({}))
    """MIG profiles by name; empty: no MIG (NVML answers NotSupported for the MIG mode)."""

    @property
    def nvlink_bytes_per_second(self) -> float:
        """The NVLink capacity each way: the active links together (0 without NVLink)."""
        return self.nvlink_links * self.nvlink_link_bytes_per_second

    @property
    def power_scale(self) -> float:
        """Watts this GPU draws above idle per watt an H200 draws above idle for the same work
        (the span from idle to the power limit, over the H200's); 1 for the H200."""
        return (self.power_limit_watts - self.idle_power_watts) / (H200.power_limit_watts - H200.idle_power_watts)

    @property
    def pcie_scale(self) -> float:
        """Host traffic of a workload here per byte it moves on an H200: the PCIe links' ratio (a
        data loader or a checkpoint goes as fast as the link lets it); 1 for the H200."""
        return self.pcie_bytes_per_second / H200.pcie_bytes_per_second

    @property
    def nvlink_scale(self) -> float:
        """Peer traffic of a workload here per byte it moves over an H200's NVLink: the NVLink
        capacities' ratio; 0 without NVLink (no all-reduce bytes modelled over PCIe)."""
        return self.nvlink_bytes_per_second / H200.nvlink_bytes_per_second


H200 = GpuModel(
    name=GPU_NAME,
    compute_capability="9.0",
    memory_bytes=H200_MEMORY_BYTES,
    reserved_bytes=DRIVER_RESERVED_BYTES,
    power_limit_watts=H200_POWER_LIMIT_WATTS,
    idle_power_watts=74.0,
    context_power_watts=18.0,
    sm_clock_max_hertz=H200_SM_CLOCK_MAX_HERTZ,
    idle_sm_clock_hertz=345e6,
    memory_clock_hertz=H200_MEMORY_CLOCK_HERTZ,
    # What NVML answers for an H200's temperature limits, °C (driver 580, docs/gpu-validation.md).
    temperature_thresholds=MappingProxyType({"slowdown": 89.0, "shutdown": 95.0, "gpu_max": 87.0, "memory_max": 95.0}),
    celsius_per_watt=0.075,
    memory_temperature_offset_celsius=4.0,
    fan_speed_ratio=None,  # SXM boards are passively cooled: NVML says NotSupported.
    pcie_generation=5,
    pcie_width=16,
    pcie_bytes_per_second=PCIE_GEN5_X16_BYTES_PER_SECOND,
    gpm=True,
    nvlink_links=NVLINK_LINKS,
    nvlink_link_bytes_per_second=NVLINK_LINK_BYTES_PER_SECOND,
    # The NVML backend reads an H200's NVLink bytes from GPM (the per-link counters were not
    # validated on NVLink hardware, docs/gpu-validation.md).
    nvlink_counters=False,
    mig_profiles=MappingProxyType(MIG_PROFILES),
)
"""HGX H200 (SXM, 141 GB HBM3e)."""

A100_SXM4_80GB = GpuModel(
    name="NVIDIA A100-SXM4-80GB",
    compute_capability="8.0",
    memory_bytes=81920 * MIB,  # nvidia-smi: "81920MiB"
    reserved_bytes=512 * MIB,  # estimate (as the H200's)
    power_limit_watts=400.0,
    idle_power_watts=55.0,  # nvidia-smi -q on idle A100 SXM4s: 52-60 W at 210 MHz
    context_power_watts=15.0,  # estimate
    sm_clock_max_hertz=1410e6,
    idle_sm_clock_hertz=210e6,
    memory_clock_hertz=1593e6,
    # nvidia-smi -q on A100s (SXM4 and 80GB PCIe): shutdown 92, slowdown 89, max operating 85, HBM 95.
    temperature_thresholds=MappingProxyType({"slowdown": 89.0, "shutdown": 92.0, "gpu_max": 85.0, "memory_max": 95.0}),
    celsius_per_watt=0.1,  # estimate: ~67 °C at the 400 W limit
    memory_temperature_offset_celsius=10.0,  # estimate: idle A100s read HBM 13-18 °C above the die
    fan_speed_ratio=None,  # SXM: passively cooled
    pcie_generation=4,
    pcie_width=16,
    pcie_bytes_per_second=PCIE_GEN4_X16_BYTES_PER_SECOND,
    gpm=False,
    nvlink_links=12,  # NVLink 3 to the NVSwitches (p4de: nvidia-smi nvlink -s, 12 x 25 GB/s)
    nvlink_link_bytes_per_second=25e9,
    nvlink_counters=True,  # nvidia-smi nvlink -gt d reads them on Ampere
    mig_profiles=MappingProxyType(A100_80GB_MIG_PROFILES),
)
"""A100-SXM4-80GB (HBM2e), as on AWS p4de.24xlarge."""

L40S = GpuModel(
    name="NVIDIA L40S",
    compute_capability="8.9",
    memory_bytes=46068 * MIB,  # nvidia-smi: "46068MiB" (48 GB GDDR6, ECC on)
    reserved_bytes=665 * MIB,  # estimate: 450-685 MiB read on 48 GB PCIe boards
    power_limit_watts=350.0,
    idle_power_watts=30.0,  # nvidia-smi: 22-34 W in P8
    context_power_watts=55.0,  # nvidia-smi: 82-105 W in P0 at 0 % GPU-Util
    sm_clock_max_hertz=2520e6,
    idle_sm_clock_hertz=210e6,
    memory_clock_hertz=9001e6,
    # Estimate: an L20 (same AD102 board, driver 550) reads its limits as T.Limit margins that put
    # them at 87 (max operating), 89 (slowdown) and 92 °C (shutdown).  No HBM: no memory limit.
    temperature_thresholds=MappingProxyType({"slowdown": 89.0, "shutdown": 92.0, "gpu_max": 87.0}),
    celsius_per_watt=0.12,  # estimate
    memory_temperature_offset_celsius=None,  # GDDR6: Memory Current Temp N/A
    fan_speed_ratio=None,  # passively cooled: nvidia-smi shows N/A
    pcie_generation=4,
    pcie_width=16,
    pcie_bytes_per_second=PCIE_GEN4_X16_BYTES_PER_SECOND,
    gpm=False,
)
"""L40S (Ada, 48 GB GDDR6, PCIe; no NVLink, no MIG)."""

A10G = GpuModel(
    name="NVIDIA A10G",
    compute_capability="8.6",
    memory_bytes=23028 * MIB,  # nvidia-smi -q on a g5: Total 23028 MiB, Reserved 304 MiB
    reserved_bytes=304 * MIB,
    power_limit_watts=300.0,
    idle_power_watts=10.0,  # nvidia-smi on g5: 9-11 W in P8
    context_power_watts=50.0,  # nvidia-smi on g5: 60-71 W in P0 at 0 % GPU-Util
    sm_clock_max_hertz=1710e6,
    idle_sm_clock_hertz=210e6,
    memory_clock_hertz=6251e6,
    # nvidia-smi -q on an A10G (driver 535): shutdown 98, slowdown 95, max operating 88; memory N/A.
    temperature_thresholds=MappingProxyType({"slowdown": 95.0, "shutdown": 98.0, "gpu_max": 88.0}),
    celsius_per_watt=0.14,  # estimate
    memory_temperature_offset_celsius=None,  # GDDR6: Memory Current Temp N/A
    fan_speed_ratio=0.0,  # the g5's A10G answers 0 % (nvidia-smi: "0%"), not NotSupported
    pcie_generation=4,
    pcie_width=16,
    pcie_bytes_per_second=PCIE_GEN4_X16_BYTES_PER_SECOND,
    gpm=False,
)
"""A10G (Ampere GA102, 24 GB GDDR6), as on AWS g5 instances."""

_P4DE_PCI_BUS_IDS = tuple(f"00000000:{bus}:{dev}.0" for bus in ("10", "20", "90", "A0") for dev in ("1C", "1D"))
"""PCI addresses of the eight A100s of a p4d/p4de instance."""
_G5_PCI_BUS_IDS = tuple(f"00000000:00:{dev}.0" for dev in ("1B", "1C", "1D", "1E"))
"""PCI addresses of the four A10Gs of a g5.12xlarge."""
_L40S_PCI_BUS_IDS = ("00000000:4A:00.0", "00000000:61:00.0", "00000000:CA:00.0", "00000000:E1:00.0")
"""PCI addresses of a four-GPU L40S server (one GPU per root port)."""


@dataclass(frozen=True)
class ProcessSpec:
    """A simulated CUDA process: host PID, what it runs, memory it holds, who owns it."""

    pid: int
    workload: w.Workload
    memory_bytes: int
    pod_uid: str | None
    container: str | None
    mps_role: str | None = None
    """``server`` / ``client`` under MPS (see exporter.model.ProcessSample.mps_role)."""


@dataclass(frozen=True)
class LeafSpec:
    """A whole GPU (``mig`` None) or one MIG instance, with the processes on it."""

    memory_total_bytes: int
    compute_fraction: float
    """Share of the GPU's SMs (1 for a whole GPU, slices/7 for MIG): scales its power."""
    processes: tuple[ProcessSpec, ...]
    mig: MigInstance | None = None


@dataclass(frozen=True)
class GpuSpec:
    """A physical GPU in the scenario."""

    index: int
    uuid: str
    pci_bus_id: str
    leaves: tuple[LeafSpec, ...]
    mig_enabled: bool = False
    ecc_corrected: int = 0
    remapped_correctable: int = 0
    compute_mode: str = "default"
    """``default`` or ``exclusive_process`` (MPS deployments often allow only the MPS server)."""
    model: GpuModel = H200
    """What GPU it is."""
    slowdown_clock_ratio: float | None = None
    """A GPU whose cooling fails: HW thermal slowdown holds its SM clock at this fraction of the
    maximum while it works (its kernels take 1/ratio as long: the scenario's workload says so);
    ``None``: no slowdown."""
    celsius_per_watt: float | None = None
    """This GPU's own cooling resistance (°C above the inlet per watt), where it differs from its
    model's (``GpuModel.celsius_per_watt``)."""
    fabric: GpuFabric | None = None
    """Its NVLink fabric registration as NVML reports it; ``None``: NVML answers NOT_SUPPORTED."""


@dataclass(frozen=True)
class Scenario:
    """A complete simulated node."""

    name: str
    gpus: tuple[GpuSpec, ...]
    pod_devices: tuple[ContainerDevices, ...]
    pods: tuple[PodMeta, ...]
    """What the API server would say about the node's pods (phase, owner workload)."""
    pid_owners: dict[int, PidOwner]
    """host PID -> the pod and container it runs in (what /proc/<pid>/cgroup would say)."""
    sharing_replicas: dict[str, int] = field(default_factory=dict)
    """GPU UUID -> time-slicing replicas the device plugin advertises."""
    network: NodeNetwork | None = None
    """The node's RDMA NICs, written as a sysfs tree by the backend; ``None``: no NIC."""
    pod_claims: tuple[ClaimedDevice, ...] = ()
    """Devices containers hold through DRA ResourceClaims (PodResources ``dynamic_resources``)."""
    slice_devices: tuple[SliceDevice, ...] = ()
    """What this node's DRA drivers publish in ResourceSlices."""
    noise: str | None = None
    """The name the GPUs' noise is seeded from, where it is not ``name``: a twin node (``dra-plugin``)
    draws its original's noise, so the two differ only in what the twin changes."""


@dataclass(frozen=True)
class NodeNetwork:
    """A node's RDMA NICs and the GPUDirect RDMA prerequisites (what exporter/sim/sysfs_tree.py
    writes): the PCIe layout (its GPUs by index match the scenario's), whether the
    ``nvidia_peermem`` module is loaded and whether the GPU driver is the open kernel module."""

    layout: st.Layout
    peermem: bool
    open_kernel_module: bool


_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet Kubernetes uses for generated names


# A stream of tiny kernels is always "running" from NVML's point of view: its GPU-Util jitter
# comes from the signature's band, not from the share.
_LAUNCHER = w.Steady(w.LAUNCH_BOUND, level=1.0, jitter=0.0)


class _NodeBuilder:
    """Accumulates GPUs, pods and processes with deterministic identities for one scenario of one
    GPU model; ``pci_bus_ids`` are the node's GPU addresses by index."""

    def __init__(self, scenario: str, model: GpuModel = H200, pci_bus_ids: tuple[str, ...] = _H200_PCI_BUS_IDS) -> None:
        self.scenario = scenario
        self.model = model
        self._pci_bus_ids = pci_bus_ids
        self._rng = random.Random(f"gpulens-sim/{scenario}")
        self._pid = 3100 + self._rng.randrange(900)
        self.gpus: list[GpuSpec] = []
        self.devices: list[ContainerDevices] = []
        self.owners: dict[str, PodMeta] = {}
        self.pids: dict[int, PidOwner] = {}
        self.sharing: dict[str, int] = {}
        self.claims: list[ClaimedDevice] = []
        self.published: list[SliceDevice] = []

    def _uuid(self, key: str) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"https://gpulens.invalid/sim/{self.scenario}/{key}"))

    def gpu_uuid(self, index: int) -> str:
        return "GPU-" + self._uuid(f"gpu/{index}")

    def mig(self, gpu: int, profile: str, gi: int, ci: int = 0) -> MigInstance:
        return MigInstance("MIG-" + self._uuid(f"gpu/{gpu}/gi/{gi}/ci/{ci}"), gi, ci, profile)

    def _suffix(self, n: int) -> str:
        return "".join(self._rng.choice(_NAME_CHARS) for _ in range(n))

    def pod(
        self, namespace: str, kind: str, workload: str, phase: str = "Running", name: str | None = None
    ) -> tuple[str, str]:
        """Register a pod owned by ``kind``/``workload``; returns (pod UID, pod name).  ``name``: the
        pod's name where its controller names pods itself (a PyTorchJob's ``<job>-worker-<n>``)."""
        if name is None:
            name = self._generated_name(kind, workload)
        uid = self._uuid(f"pod/{namespace}/{name}")
        self.owners[uid] = PodMeta(uid, namespace, name, phase=phase, workload_kind=kind, workload=workload)
        return uid, name

    def _generated_name(self, kind: str, workload: str) -> str:
        """The name ``kind``'s controller gives a pod of ``workload``."""
        if kind == "Deployment":
            return f"{workload}-{self._suffix(10)}-{self._suffix(5)}"
        if kind == "StatefulSet":
            ordinal = sum(1 for o in self.owners.values() if o.workload == workload and o.workload_kind == kind)
            return f"{workload}-{ordinal}"
        if kind == "CronJob":
            return f"{workload}-{29410000 + self._rng.randrange(90000)}-{self._suffix(5)}"
        return f"{workload}-{self._suffix(5)}"

    def hold(self, pod_uid: str, container: str, resource: str, device_ids: tuple[str, ...]) -> None:
        """The kubelet allocated ``device_ids`` of ``resource`` to this container."""
        pod = self.owners[pod_uid]
        self.devices.append(ContainerDevices(pod.namespace, pod.name, container, resource, device_ids, pod_uid))

    def claim(self, pod_uid: str, container: str, claim: ClaimRef) -> None:
        """The kubelet lists ``claim``'s device under this container (PodResources
        ``dynamic_resources``)."""
        pod = self.owners[pod_uid]
        cdi = (
            f"k8s.{claim.driver}/claim={self._uuid(f'claim/{claim.claim_namespace}/{claim.claim_name}')}-{claim.device}",
        )
        self.claims.append(ClaimedDevice(pod.namespace, pod.name, container, claim, cdi, pod_uid))

    def proc(
        self,
        workload: w.Workload,
        memory_bytes: int,
        pod_uid: str | None = None,
        container: str | None = None,
        mps_role: str | None = None,
    ) -> ProcessSpec:
        self._pid += 1 + self._rng.randrange(400)
        if pod_uid is not None and container is not None:
            self.pids[self._pid] = PidOwner(pod_uid=pod_uid, container=container)
        # Memory is allocated in 2 MiB pages.
        return ProcessSpec(self._pid, workload, memory_bytes // (2 * MIB) * 2 * MIB, pod_uid, container, mps_role)

    def add_gpu(
        self,
        index: int,
        leaves: tuple[LeafSpec, ...],
        mig_enabled: bool = False,
        ecc_corrected: int = 0,
        remapped_correctable: int = 0,
        compute_mode: str = "default",
        slowdown_clock_ratio: float | None = None,
        celsius_per_watt: float | None = None,
    ) -> GpuSpec:
        spec = GpuSpec(
            index,
            self.gpu_uuid(index),
            self._pci_bus_ids[index % len(self._pci_bus_ids)],
            leaves,
            mig_enabled,
            ecc_corrected,
            remapped_correctable,
            compute_mode,
            self.model,
            slowdown_clock_ratio,
            celsius_per_watt,
        )
        self.gpus.append(spec)
        return spec

    def whole(self, *procs: ProcessSpec) -> tuple[LeafSpec, ...]:
        return (LeafSpec(self.model.memory_bytes, 1.0, procs),)

    def mig_leaf(self, gpu: int, profile: str, gi: int, *procs: ProcessSpec) -> LeafSpec:
        p = self.model.mig_profiles[profile]
        return LeafSpec(p.memory_bytes, p.compute_slices / 7, procs, self.mig(gpu, profile, gi))

    def build(self, network: NodeNetwork | None = None, name: str | None = None) -> Scenario:
        """The scenario, called ``name`` where it differs from the builder's (a twin node, whose
        noise stays the builder's)."""
        return Scenario(
            name or self.scenario,
            tuple(self.gpus),
            tuple(self.devices),
            tuple(self.owners.values()),
            dict(self.pids),
            self.sharing,
            network,
            tuple(self.claims),
            tuple(self.published),
            self.scenario if name not in (None, self.scenario) else None,
        )


def _exclusive(
    b: _NodeBuilder,
    index: int,
    namespace: str,
    kind: str,
    workload_name: str,
    container: str,
    workload: w.Workload,
    memory_bytes: int,
    ecc_corrected: int = 0,
    remapped_correctable: int = 0,
) -> str:
    """A whole GPU held by one single-container pod running one process; returns the pod UID."""
    uid, _ = b.pod(namespace, kind, workload_name)
    b.hold(uid, container, "nvidia.com/gpu", (b.gpu_uuid(index),))
    b.add_gpu(
        index, b.whole(b.proc(workload, memory_bytes, uid, container)), False, ecc_corrected, remapped_correctable
    )
    return uid


def _h200x8() -> Scenario:
    b = _NodeBuilder("h200x8")
    # 0, 1: memory-bound: an embedding re-index copy loop and an LLM decode server.
    _exclusive(
        b, 0, "research", "CronJob", "embedding-reindex", "reindex", w.Steady(w.MEMORY_COPY, level=0.97), 48 * GIB
    )
    _exclusive(
        b,
        1,
        "inference",
        "Deployment",
        "llm-decode",
        "vllm",
        w.Diurnal(w.LLM_DECODE, low=0.86, high=1.0, period_seconds=1800.0),
        int(0.9 * H200_MEMORY_BYTES),
    )
    # 2, 3: one data-parallel training pod on two GPUs, ranks in lock step.
    uid, _ = b.pod("ml-training", "Job", "llama3-8b-finetune")
    b.hold(uid, "trainer", "nvidia.com/gpu", (b.gpu_uuid(2), b.gpu_uuid(3)))
    for index in (2, 3):
        b.add_gpu(index, b.whole(b.proc(w.Training(w.BF16_GEMM), 118 * GIB, uid, "trainer")))
    # 4: a request scorer launching tiny kernels: nvidia-smi says ~23 % busy, SMs are idle.
    _exclusive(b, 4, "inference", "Deployment", "fraud-scoring", "scorer", _LAUNCHER, int(3.2 * GIB))
    # 5: a notebook holding 40 GiB and running nothing.
    _exclusive(b, 5, "notebooks", "StatefulSet", "jupyter-alice", "notebook", w.Idle(), 40 * GIB)
    # 6: an FP32 solver (TF32 off) that pauses to write results; this GPU has a few corrected ECC errors.
    _exclusive(
        b,
        6,
        "research",
        "Job",
        "cfd-solver",
        "solver",
        w.Steady(w.FP32_GEMM, pause_every_seconds=120.0, pause_seconds=6.0),
        22 * GIB,
        ecc_corrected=3,
        remapped_correctable=1,
    )
    # 7: idle and unallocated.
    b.add_gpu(7, b.whole())
    return b.build()


def _mig_pod(
    b: _NodeBuilder,
    leaf_gpu: int,
    profile: str,
    gi: int,
    namespace: str,
    kind: str,
    workload_name: str,
    container: str,
    workloads: tuple[w.Workload, ...],
    memory_bytes: int,
) -> LeafSpec:
    """A MIG instance held by one pod whose container runs one process per workload."""
    uid, _ = b.pod(namespace, kind, workload_name)
    leaf = b.mig_leaf(leaf_gpu, profile, gi)
    assert leaf.mig is not None
    b.hold(uid, container, f"nvidia.com/mig-{profile}", (leaf.mig.mig_uuid,))
    procs = tuple(b.proc(wl, memory_bytes // len(workloads), uid, container) for wl in workloads)
    return LeafSpec(leaf.memory_total_bytes, leaf.compute_fraction, procs, leaf.mig)


def _mig() -> Scenario:
    b = _NodeBuilder("mig")
    # GPU 0: 7 x 1g.18gb: four embedder replicas, two notebooks (one busy, one idle), one free.
    leaves = [
        _mig_pod(
            b, 0, "1g.18gb", 7 + i, "inference", "Deployment", "embedder", "embedder",
            (w.Diurnal(w.SMALL_BATCH_INFERENCE, low=0.15, high=0.8, offset_seconds=37.0 * i),),
            int(9.5 * GIB),
        )
        for i in range(4)
    ]  # fmt: skip
    leaves.append(_mig_pod(b, 0, "1g.18gb", 11, "notebooks", "StatefulSet", "jupyter-bob", "notebook",
                           (w.Bursty(w.SMALL_BATCH_INFERENCE),), 6 * GIB))  # fmt: skip
    leaves.append(_mig_pod(b, 0, "1g.18gb", 12, "notebooks", "StatefulSet", "jupyter-dana", "notebook",
                           (w.Idle(),), 12 * GIB))  # fmt: skip
    leaves.append(b.mig_leaf(0, "1g.18gb", 13))
    b.add_gpu(0, tuple(leaves), mig_enabled=True)
    # GPU 1: 3g + 2g + 1g + 1g.
    b.add_gpu(
        1,
        (
            _mig_pod(b, 1, "3g.71gb", 2, "ml-training", "Job", "bert-pretrain", "trainer",
                     (w.Training(w.BF16_GEMM, compute_seconds=30.0, load_seconds=4.0),), 52 * GIB),
            _mig_pod(b, 1, "2g.35gb", 3, "inference", "Deployment", "reranker", "reranker",
                     (w.Diurnal(w.SMALL_BATCH_INFERENCE, low=0.2, high=0.9),) * 2, 18 * GIB),
            _mig_pod(b, 1, "1g.18gb", 9, "notebooks", "StatefulSet", "jupyter-erin", "notebook",
                     (w.Idle(),), 15 * GIB),
            b.mig_leaf(1, "1g.18gb", 10),
        ),
        mig_enabled=True,
    )  # fmt: skip
    # GPU 2: 4g + 3g.
    b.add_gpu(
        2,
        (
            _mig_pod(b, 2, "4g.71gb", 1, "research", "Job", "whisper-batch", "transcribe",
                     (w.Steady(w.FP16_BATCH, level=0.95),), 41 * GIB),
            _mig_pod(b, 2, "3g.71gb", 2, "inference", "Deployment", "llm-decode-small", "vllm",
                     (w.Diurnal(w.LLM_DECODE, low=0.5, high=1.0, offset_seconds=300.0),), 63 * GIB),
        ),
        mig_enabled=True,
    )  # fmt: skip
    # GPU 3: one 7g.141gb instance serving a vector database (memory-bound).
    b.add_gpu(
        3,
        (_mig_pod(b, 3, "7g.141gb", 0, "inference", "StatefulSet", "vector-db", "search",
                  (w.Steady(w.MEMORY_COPY, level=0.9),), 120 * GIB),),
        mig_enabled=True,
    )  # fmt: skip
    # GPU 4: 4 x 1g.35gb: two nightly evaluations, a tokenizer service launching tiny kernels, one free.
    b.add_gpu(
        4,
        (
            _mig_pod(b, 4, "1g.35gb", 3, "research", "CronJob", "nightly-eval", "eval",
                     (w.Steady(w.FP16_BATCH, level=0.9),), 30 * GIB),
            _mig_pod(b, 4, "1g.35gb", 4, "research", "CronJob", "nightly-eval", "eval",
                     (w.Steady(w.FP16_BATCH, level=0.9, offset_seconds=11.0),), 30 * GIB),
            _mig_pod(b, 4, "1g.35gb", 5, "inference", "Deployment", "tokenizer", "tokenizer",
                     (_LAUNCHER,), 2 * GIB),
            b.mig_leaf(4, "1g.35gb", 6),
        ),
        mig_enabled=True,
    )  # fmt: skip
    # GPU 5: 3 x 2g.35gb speech recognition replicas + 1g.18gb Monte Carlo in FP32.
    b.add_gpu(
        5,
        (
            *(
                _mig_pod(b, 5, "2g.35gb", 3 + i, "inference", "Deployment", "asr-stream", "asr",
                         (w.Diurnal(w.SMALL_BATCH_INFERENCE, low=0.1, high=0.85, offset_seconds=60.0 * i),),
                         20 * GIB)
                for i in range(3)
            ),
            _mig_pod(b, 5, "1g.18gb", 13, "research", "Job", "monte-carlo", "sim",
                     (w.Steady(w.FP32_GEMM, level=0.97),), 5 * GIB),
        ),
        mig_enabled=True,
    )  # fmt: skip
    # GPU 6, 7: MIG disabled: a whole-GPU training job and an idle, unallocated GPU.
    _exclusive(b, 6, "ml-training", "Job", "llama3-8b-finetune", "trainer", w.Training(w.BF16_GEMM), 118 * GIB)
    b.add_gpu(7, b.whole())
    return b.build()


_MIG7X8_SERVICES: tuple[tuple[str, w.Signature], ...] = (
    ("embedder", w.SMALL_BATCH_INFERENCE),
    ("ocr", w.FP16_BATCH),
    ("reranker", w.SMALL_BATCH_INFERENCE),
    ("tts", w.LLM_DECODE),
    ("feature-store", w.MEMORY_COPY),
)


def _mig7x8() -> Scenario:
    """8 GPUs x 7 x 1g.18gb: 50 service pods with 4 worker processes each, 2 idle notebooks,
    4 free instances: 56 leaves, 202 processes (the benchmark's large MIG node)."""
    b = _NodeBuilder("mig7x8")
    slot = 0
    for gpu in range(8):
        leaves: list[LeafSpec] = []
        for k in range(7):
            gi = 7 + k
            if gpu == 7 and k >= 3:
                leaves.append(b.mig_leaf(gpu, "1g.18gb", gi))  # free
            elif gpu == 6 and k >= 5:
                leaves.append(_mig_pod(b, gpu, "1g.18gb", gi, "notebooks", "StatefulSet", f"jupyter-{k}",
                                       "notebook", (w.Idle(),), 8 * GIB))  # fmt: skip
            else:
                name, sig = _MIG7X8_SERVICES[slot % len(_MIG7X8_SERVICES)]
                workers = tuple(
                    w.Diurnal(sig, low=0.05, high=0.3, period_seconds=1800.0, offset_seconds=53.0 * slot + 7.0 * j)
                    for j in range(4)
                )
                leaves.append(_mig_pod(b, gpu, "1g.18gb", gi, "inference", "Deployment", name, name, workers, 14 * GIB))
                slot += 1
        b.add_gpu(gpu, tuple(leaves), mig_enabled=True)
    return b.build()


def _timeslice() -> Scenario:
    """GPUs 0-3 time-sliced (4 replicas each, resource ``nvidia.com/gpu.shared``), 4-7 exclusive; one
    alternating mixture (3), one job changing load (6) and one stalled on its input (7)."""
    b = _NodeBuilder("timeslice")
    shared = "nvidia.com/gpu.shared"

    def replica(gpu: int, n: int) -> str:
        return f"{b.gpu_uuid(gpu)}::{n}"

    # GPU 0: 4 replicas held by 3 pods: two embedder replicas and a sweep trial holding two.
    procs: list[ProcessSpec] = []
    for i in range(2):
        uid, _ = b.pod("inference", "Deployment", "embedder")
        b.hold(uid, "embedder", shared, (replica(0, i),))
        procs.append(b.proc(w.Diurnal(w.SMALL_BATCH_INFERENCE, low=0.2, high=0.6, offset_seconds=90.0 * i),
                            10 * GIB, uid, "embedder"))  # fmt: skip
    uid, _ = b.pod("research", "Job", "hparam-sweep-trial-3")
    b.hold(uid, "trial", shared, (replica(0, 2), replica(0, 3)))
    procs.append(b.proc(w.Training(w.BF16_GEMM, compute_seconds=20.0, load_seconds=5.0), 60 * GIB, uid, "trial"))
    b.add_gpu(0, b.whole(*procs))
    # GPU 1: 4 notebooks: two poke at it now and then, two hold memory and do nothing.
    procs = []
    for i, wl in enumerate((w.Bursty(w.SMALL_BATCH_INFERENCE), w.Bursty(w.FP32_GEMM, 0.15), w.Idle(), w.Idle())):
        uid, _ = b.pod("notebooks", "StatefulSet", "jupyter-team")
        b.hold(uid, "notebook", shared, (replica(1, i),))
        procs.append(b.proc(wl, (8 + 6 * i) * GIB, uid, "notebook"))
    b.add_gpu(1, b.whole(*procs))
    # GPU 2: 2 of 4 replicas held, by a launch-bound scorer and a memory-bound decoder.
    uid, _ = b.pod("inference", "Deployment", "fraud-scoring")
    b.hold(uid, "scorer", shared, (replica(2, 0),))
    p1 = b.proc(_LAUNCHER, 3 * GIB, uid, "scorer")
    uid, _ = b.pod("inference", "Deployment", "llm-decode-small")
    b.hold(uid, "vllm", shared, (replica(2, 1),))
    p2 = b.proc(w.Diurnal(w.LLM_DECODE, low=0.3, high=0.7), 50 * GIB, uid, "vllm")
    b.add_gpu(2, b.whole(p1, p2))
    # GPU 3: 2 of 4 replicas held by a memory-bound and a tensor-bound tenant, both flat out:
    # they take turns, so the GPU is fully used, half on DRAM and half on tensor cores (mixed).
    uid, _ = b.pod("etl", "Job", "embedding-backfill")
    b.hold(uid, "copier", shared, (replica(3, 0),))
    p1 = b.proc(w.Steady(w.MEMORY_COPY), 12 * GIB, uid, "copier")
    uid, _ = b.pod("research", "Job", "attention-sweep")
    b.hold(uid, "sweep", shared, (replica(3, 1),))
    p2 = b.proc(w.Steady(w.BF16_GEMM), 30 * GIB, uid, "sweep")
    b.add_gpu(3, b.whole(p1, p2))
    for gpu in range(4):
        b.sharing[b.gpu_uuid(gpu)] = 4
    # GPUs 4-7 exclusive.
    _exclusive(b, 4, "ml-training", "Job", "llama3-8b-finetune", "trainer", w.Training(w.BF16_GEMM), 118 * GIB)
    _exclusive(b, 5, "inference", "Deployment", "llm-decode", "vllm",
               w.Diurnal(w.LLM_DECODE, low=0.86, high=1.0), int(0.9 * H200_MEMORY_BYTES))  # fmt: skip
    # GPU 6: a benchmark that changes what limits it: copy, then GEMMs, then nothing, repeated.
    phases = ((w.MEMORY_COPY, 60.0), (w.BF16_GEMM, 60.0), (w.IDLE, 30.0))
    _exclusive(b, 6, "research", "Job", "kernel-bench", "bench", w.Phased(w.MEMORY_COPY, phases=phases), 22 * GIB)
    # GPU 7: a GEMM job starved by its data loader: works half of every second.
    _exclusive(b, 7, "ml-training", "Job", "resnet-dataloader-bound", "trainer", w.Stalled(w.BF16_GEMM), 40 * GIB)
    return b.build()


def _mps() -> Scenario:
    """MPS (the device plugin's MPS sharing: 4 replicas of ``nvidia.com/gpu`` per MPS GPU).

    GPU 0: a memory-bound and a tensor-bound tenant as MPS clients of one MPS server, compute mode
    exclusive-process (only the server may open a context). GPU 1: one MPS client alone. GPU 2:
    two pods time-sliced without MPS, for contrast. GPU 3: exclusive. GPUs 4-6: exclusive jobs
    that move data over PCIe (see ``_host_transfer_jobs``). GPU 7: free.
    NVML's shapes under MPS: the compute-process list holds the server and the clients, each
    client with its own memory; per-process utilisation has one entry, the server's.
    """
    b = _NodeBuilder("mps")
    shared = "nvidia.com/gpu"
    daemon, _ = b.pod("kube-system", "DaemonSet", "nvidia-device-plugin-mps-control-daemon")

    def replica(gpu: int, n: int) -> str:
        return f"{b.gpu_uuid(gpu)}::{n}"

    def server() -> ProcessSpec:
        return b.proc(w.Idle(), 300 * MIB, daemon, "mps-control-daemon", mps_role="server")

    procs = [server()]
    for n, (ns, name, container, wl, mem) in enumerate(
        (
            ("inference", "llm-decode-mps", "vllm", w.Steady(w.LLM_DECODE, level=0.6), 40 * GIB),
            ("inference", "reranker-mps", "reranker", w.Steady(w.BF16_GEMM, level=0.4), 12 * GIB),
        )
    ):
        uid, _ = b.pod(ns, "Deployment", name)
        b.hold(uid, container, shared, (replica(0, n),))
        procs.append(b.proc(wl, mem, uid, container, mps_role="client"))
    b.add_gpu(0, b.whole(*procs), compute_mode="exclusive_process")
    uid, _ = b.pod("inference", "Deployment", "embedder-mps")
    b.hold(uid, "embedder", shared, (replica(1, 0),))
    b.add_gpu(1, b.whole(server(), b.proc(w.Steady(w.MEMORY_COPY), 9 * GIB, uid, "embedder", mps_role="client")))
    ts = []
    for i, wl in enumerate((w.Steady(w.MEMORY_COPY), w.Steady(w.BF16_GEMM))):
        uid, _ = b.pod("research", "Job", f"sweep-{i}")
        b.hold(uid, "trial", "nvidia.com/gpu.shared", (replica(2, i),))
        ts.append(b.proc(wl, 20 * GIB, uid, "trial"))
    b.add_gpu(2, b.whole(*ts))
    for gpu in (0, 1, 2):
        b.sharing[b.gpu_uuid(gpu)] = 4
    _exclusive(b, 3, "ml-training", "Job", "llama3-8b-finetune", "trainer", w.Training(w.BF16_GEMM), 118 * GIB)
    _host_transfer_jobs(b, 4)
    b.add_gpu(7, b.whole())
    return b.build()


def _host_transfer_jobs(b: _NodeBuilder, first: int) -> None:
    """Three whole GPUs from ``first`` on, each running a job whose PCIe traffic is heavy, and what
    limits each while it works (docs/boundness.md):

    - ``first``: a data loader staging shards from pinned host memory, copies back to back and no
      kernel: 51.5 GB/s into the GPU, 0.82 of the link; NVML GPU-Util 1.0, GPM graphics and SM
      activity 0. ``transfer``.
    - ``first + 1``: an LLM decode server keeping its KV cache in host memory: memory-bound decode
      kernels most of the time, with up to 30 GB/s in and 18 GB/s out. ``memory`` (its copies hide
      behind its kernels).
    - ``first + 2``: fine-tuning with the optimizer offloaded to the host: GEMMs while gradients
      stream out, then 1 s of each 9 s step waiting for the weights to come back flat out.
      ``compute``.

    They sit on GPUs the mps scenario left free, so no other scenario's classes change.
    """
    _exclusive(b, first, "etl", "Job", "shard-stager", "stager", w.HostCopy(), 96 * GIB)
    offload = w.Diurnal(w.LLM_DECODE, low=0.75, high=1.0, request_bytes=w.KV_OFFLOAD_BYTES_PER_SECOND)
    _exclusive(b, first + 1, "inference", "Deployment", "llm-kv-offload", "vllm", offload, int(0.9 * H200_MEMORY_BYTES))
    _exclusive(
        b,
        first + 2,
        "ml-training",
        "Job",
        "zero-offload-finetune",
        "trainer",
        w.OffloadedOptimizer(w.BF16_GEMM),
        84 * GIB,
    )


def _a100() -> Scenario:
    """8 x A100-SXM4-80GB as on p4de.24xlarge (NVLink 3 to NVSwitches, PCIe Gen4 x16), GPUs 4 and 5
    in MIG mode.  No GPM: NVML's GPU-Util and util.mem describe the whole GPUs, nothing the MIG
    instances (NVML has no GPU-Util per instance).

    Reads: 0, 1 busy (GPU-Util ~99 %, at the 400 W limit, NVLink all-reduce); 2 launch-bound
    (GPU-Util 19-27 %, ~100 W); 3 allocated idle; 4: a memory-bound 3g.40gb, an allocated idle
    2g.20gb, a launch-bound 1g.10gb and a free 1g.10gb; 5: a busy 3g.40gb, an under-used 2g.20gb
    and a free 2g.20gb; 6 under-used (GPU-Util 3-15 %); 7 unallocated.
    """
    b = _NodeBuilder("a100", A100_SXM4_80GB, _P4DE_PCI_BUS_IDS)
    # 0, 1: one data-parallel fine-tuning pod on two GPUs, ranks in lock step.
    uid, _ = b.pod("ml-training", "Job", "mistral-7b-finetune")
    b.hold(uid, "trainer", "nvidia.com/gpu", (b.gpu_uuid(0), b.gpu_uuid(1)))
    for index in (0, 1):
        b.add_gpu(index, b.whole(b.proc(w.Training(w.BF16_GEMM), 71 * GIB, uid, "trainer")))
    # 2: a request scorer launching tiny kernels: nvidia-smi says ~23 % busy, the power stays low.
    _exclusive(b, 2, "inference", "Deployment", "fraud-scoring", "scorer", _LAUNCHER, int(3.2 * GIB))
    # 3: a notebook holding 30 GiB and running nothing.
    _exclusive(b, 3, "notebooks", "StatefulSet", "jupyter-carol", "notebook", w.Idle(), 30 * GIB)
    # GPU 4: 3g + 2g + 1g + 1g: an LLM decoder (memory-bound), an idle notebook, a tokenizer
    # launching tiny kernels, one free.
    b.add_gpu(
        4,
        (
            _mig_pod(b, 4, "3g.40gb", 2, "inference", "Deployment", "llm-decode-small", "vllm",
                     (w.Diurnal(w.LLM_DECODE, low=0.5, high=1.0, offset_seconds=300.0),), 34 * GIB),
            _mig_pod(b, 4, "2g.20gb", 3, "notebooks", "StatefulSet", "jupyter-frank", "notebook",
                     (w.Idle(),), 12 * GIB),
            _mig_pod(b, 4, "1g.10gb", 9, "inference", "Deployment", "tokenizer", "tokenizer",
                     (_LAUNCHER,), 2 * GIB),
            b.mig_leaf(4, "1g.10gb", 10),
        ),
        mig_enabled=True,
    )  # fmt: skip
    # GPU 5: 3g + 2g + 2g: batch transcription flat out, a reranker at low load, one free.
    b.add_gpu(
        5,
        (
            _mig_pod(b, 5, "3g.40gb", 1, "research", "Job", "whisper-batch", "transcribe",
                     (w.Steady(w.FP16_BATCH, level=0.95),), 28 * GIB),
            _mig_pod(b, 5, "2g.20gb", 5, "inference", "Deployment", "reranker", "reranker",
                     (w.Diurnal(w.SMALL_BATCH_INFERENCE, low=0.05, high=0.3),), 9 * GIB),
            b.mig_leaf(5, "2g.20gb", 6),
        ),
        mig_enabled=True,
    )  # fmt: skip
    # 6: an embedding service at a few requests a second: GPU-Util 3-15 %, under-used.
    _exclusive(b, 6, "inference", "Deployment", "search-embedder", "embedder",
               w.Diurnal(w.SMALL_BATCH_INFERENCE, low=0.04, high=0.2), 14 * GIB)  # fmt: skip
    # 7: idle and unallocated.
    b.add_gpu(7, b.whole())
    return b.build()


def _l40s() -> Scenario:
    """4 x L40S (48 GB GDDR6, PCIe Gen4 x16, no NVLink, no MIG, no GPM): an inference node.

    Reads: 0 busy and memory-bound (GPU-Util ~99 %, util.mem 0.8-0.9); 1 under-used (GPU-Util
    2-15 %); 2 and 3 allocated idle (a notebook, and a canary server with its model loaded and
    no traffic routed to it).
    """
    b = _NodeBuilder("l40s", L40S, _L40S_PCI_BUS_IDS)
    _exclusive(b, 0, "inference", "Deployment", "llm-decode", "vllm",
               w.Diurnal(w.LLM_DECODE, low=0.86, high=1.0), int(0.9 * L40S.memory_bytes))  # fmt: skip
    _exclusive(b, 1, "inference", "Deployment", "image-captioner", "captioner",
               w.Diurnal(w.SMALL_BATCH_INFERENCE, low=0.03, high=0.2, offset_seconds=600.0), 11 * GIB)  # fmt: skip
    _exclusive(b, 2, "notebooks", "StatefulSet", "jupyter-grace", "notebook", w.Idle(), 20 * GIB)
    _exclusive(b, 3, "inference", "Deployment", "llm-decode-canary", "vllm", w.Idle(), int(0.9 * L40S.memory_bytes))
    return b.build()


def _a10g() -> Scenario:
    """4 x A10G as on g5.12xlarge (24 GB GDDR6, PCIe Gen4 x16, no NVLink, no MIG, no GPM).

    Reads: 0 busy (a LoRA fine-tune: GPU-Util ~99 %, at the 300 W limit); 1 under-used (a speech
    recognition service, GPU-Util 4-15 %); 2 allocated idle (a notebook); 3 time-sliced (4
    replicas of ``nvidia.com/gpu.shared``), two held by notebooks that run nothing: allocated idle.
    """
    b = _NodeBuilder("a10g", A10G, _G5_PCI_BUS_IDS)
    _exclusive(b, 0, "ml-training", "Job", "llama3-8b-lora", "trainer",
               w.Training(w.BF16_GEMM, compute_seconds=30.0, load_seconds=4.0), 21 * GIB)  # fmt: skip
    _exclusive(b, 1, "inference", "Deployment", "asr-stream", "asr",
               w.Diurnal(w.SMALL_BATCH_INFERENCE, low=0.05, high=0.2, offset_seconds=900.0), 6 * GIB)  # fmt: skip
    _exclusive(b, 2, "notebooks", "StatefulSet", "jupyter-heidi", "notebook", w.Idle(), 10 * GIB)
    procs = []
    for n in range(2):
        uid, _ = b.pod("notebooks", "StatefulSet", "jupyter-team")
        b.hold(uid, "notebook", "nvidia.com/gpu.shared", (f"{b.gpu_uuid(3)}::{n}",))
        procs.append(b.proc(w.Idle(), (6 + 2 * n) * GIB, uid, "notebook"))
    b.add_gpu(3, b.whole(*procs))
    b.sharing[b.gpu_uuid(3)] = 4
    return b.build()


EFA_RESOURCE = "vpc.amazonaws.com/efa"
"""The EFA device plugin's resource; its device IDs are the RDMA device names (``rdmap79s0``)."""
P5EN_GDR_NODE_BYTES_PER_SECOND = 93 * w.GB
"""What a p5en node's 32 EFAs carry each way in an inter-node all-reduce with GPUDirect RDMA (the
NICs read and write GPU memory directly): near 93 GB/s of bus bandwidth a node."""
P5EN_BOUNCE_NODE_BYTES_PER_SECOND = 33 * w.GB
"""The same without GPUDirect RDMA: every byte bounces through a host buffer (a GPU copy, then the
NIC's DMA), which caps the all-reduce near 33 GB/s a node."""
P5EN_COMPUTE_SECONDS = 2.0
"""Forward and backward of one step on a GPU at full clock."""
P5EN_ALLREDUCE_BYTES_PER_GPU = 23.25 * w.GB
"""Gradient bytes each GPU sends (and receives) over its NICs each step: 2 s of the all-reduce at
the GPUDirect rate (186 GB a node)."""
P5EN_STRAGGLER = 5
"""The p5en node's GPU whose cooling fails."""
P5EN_STRAGGLER_CLOCK_RATIO = 0.5
"""HW thermal slowdown holds the straggler's SM clock at half the maximum: its compute takes twice as long."""
P5EN_STRAGGLER_CELSIUS_PER_WATT = 0.285
"""The straggler's cooling: its ~220 W average (throttled) settles it near 90 °C, past its 89 °C
slowdown threshold."""


def _p5en(gdr: bool) -> Scenario:
    """One worker node of a two-node PyTorchJob (``llama-70b-pretrain``, synchronous data-parallel):
    8 H200s and 32 EFA devices (p5en-like PCIe layout, exporter/sim/sysfs_tree.py), one pod holding
    them all, one process per GPU.  Each step every GPU computes for 2 s, then the ranks all-reduce
    their gradients (NVLink inside the node, the EFAs between nodes).  Each node is simulated alone.

    ``gdr`` (``p5en``, worker 0): ``nvidia_peermem`` loaded, the open kernel module, every EFA's
    ``p2p`` naming NVIDIA peermem; the all-reduce runs at 93 GB/s a node (2 s).  GPU 5 is thermally
    throttled (half clock, ``hw_thermal_slowdown``): it computes for 4 s while its 7 peers wait in
    NCCL, so the peers spend 4 s of each 6 s step in NCCL (latency-bound kernels) and GPU 5 computes
    4 s of 6 (compute).
    Otherwise (``p5en-nogdr``, worker 1): no peer-memory module, the proprietary kernel module, empty
    ``p2p``: the all-reduce bounces through host memory at 33 GB/s a node (5.6 s), and every GPU
    spends ~74 % of its busy time in NCCL.  On both, a GPU's PCIe bytes in the all-reduce are its
    NICs' bytes.
    """
    name = "p5en" if gdr else "p5en-nogdr"
    b = _NodeBuilder(name)
    layout = st.p5en_layout("NVIDIA peermem" if gdr else "")
    uid, _ = b.pod(
        "ml-training", "PyTorchJob", "llama-70b-pretrain", name=f"llama-70b-pretrain-worker-{0 if gdr else 1}"
    )
    b.hold(uid, "pytorch", "nvidia.com/gpu", tuple(b.gpu_uuid(i) for i in range(len(layout.gpus))))
    b.hold(uid, "pytorch", EFA_RESOURCE, tuple(nic.name for nic in layout.nics))
    node_rate = P5EN_GDR_NODE_BYTES_PER_SECOND if gdr else P5EN_BOUNCE_NODE_BYTES_PER_SECOND
    slowest = P5EN_COMPUTE_SECONDS / P5EN_STRAGGLER_CLOCK_RATIO if gdr else P5EN_COMPUTE_SECONDS
    for index in range(len(layout.gpus)):
        straggler = gdr and index == P5EN_STRAGGLER
        workload = w.AllReduceTraining(
            compute_seconds=slowest if straggler else P5EN_COMPUTE_SECONDS,
            slowest_compute_seconds=slowest,
            nic_bytes_per_step=P5EN_ALLREDUCE_BYTES_PER_GPU,
            nic_bytes_per_second=node_rate / len(layout.gpus),
            nvlink_bytes_per_second=node_rate,
        )
        b.add_gpu(
            index,
            b.whole(b.proc(workload, 122 * GIB, uid, "pytorch")),
            slowdown_clock_ratio=P5EN_STRAGGLER_CLOCK_RATIO if straggler else None,
            celsius_per_watt=P5EN_STRAGGLER_CELSIUS_PER_WATT if straggler else None,
        )
    return b.build(NodeNetwork(layout, peermem=gdr, open_kernel_module=gdr))


JOBS_GPU_NIC_BYTES_PER_SECOND = P5EN_GDR_NODE_BYTES_PER_SECOND / 8
"""What one GPU's 4 EFAs carry each way in an all-reduce with GPUDirect RDMA (~11.6 GB/s)."""
JOBS_STRAGGLER_NODE = 1
JOBS_STRAGGLER_GPU = 3
"""The GPU of the two ``jobs`` nodes whose cooling fails: node 1's GPU 3, a rank of ``mixtral-sft``."""
JOBS_FABRIC_CLIQUE_ID = 1
"""The NVLink fabric clique of each ``jobs`` node's GPUs (each node's cluster UUID is its own)."""


@dataclass(frozen=True)
class _JobSpec:
    """One multi-node job of the ``jobs`` nodes: one pod per node holding two GPUs (and their 8 EFAs),
    each rank computing ``compute_seconds`` then all-reducing for ``allreduce_seconds`` per step."""

    namespace: str
    kind: str
    name: str
    pod: str
    """The pod name pattern (``{node}`` is the node's index), as the job's controller names pods."""
    compute_seconds: float
    allreduce_seconds: float
    memory_bytes: int


JOBS: tuple[_JobSpec, ...] = (
    # healthy: compute-bound, a short all-reduce (about 9 % of each step), nearly full memory
    _JobSpec("ml-training", "PyTorchJob", "gpt-13b-finetune", "gpt-13b-finetune-worker-{node}", 3.0, 0.3, 118 * GIB),
    # a straggler: node 1's GPU 3 throttles to half clock; the other three ranks wait for it in NCCL
    _JobSpec("ml-training", "JobSet", "mixtral-sft", "mixtral-sft-workers-0-{node}-q7x2m", 2.0, 0.5, 120 * GIB),
    # communication-bound: an all-to-all-heavy MoE step, 2.5 s of exchange per 1.5 s of compute
    _JobSpec("research", "MPIJob", "moe-pretrain", "moe-pretrain-worker-{node}", 1.5, 2.5, 126 * GIB),
    # over-provisioned: 38 GB of 141 per GPU on four GPUs over two nodes, and more time exchanging
    # gradients than computing: two GPUs of one node would hold it
    _JobSpec("research", "Job", "embedding-train", "embedding-train-{node}-x8k2p", 1.2, 1.5, int(38e9)),
)
"""The four jobs of the two ``jobs`` nodes, GPUs 0-1, 2-3, 4-5 and 6-7 of each node."""


def _jobs(node: int) -> Scenario:
    """Node ``node`` (0 or 1) of a two-node cluster running four multi-node jobs (``JOBS``), two GPUs
    per job on each node: a healthy one, one with a straggler (node 1's GPU 3, thermally throttled to
    half clock, so every rank of that job steps at its pace: its peers on both nodes wait in NCCL), a
    communication-bound one and an over-provisioned one that would fit on two GPUs of one node. The
    node is a p5en (8 H200, 32 EFAs with GPUDirect RDMA); each pod holds its GPUs' nearest EFAs.
    Each node is simulated alone: the ranks of a job run the same step in lock step on both."""
    name = f"jobs-{node}"
    b = _NodeBuilder(name)
    layout = st.p5en_layout("NVIDIA peermem")
    for j, job in enumerate(JOBS):
        uid, _ = b.pod(job.namespace, job.kind, job.name, name=job.pod.format(node=node))
        gpus = (2 * j, 2 * j + 1)
        b.hold(uid, "trainer", "nvidia.com/gpu", tuple(b.gpu_uuid(i) for i in gpus))
        b.hold(uid, "trainer", EFA_RESOURCE, tuple(nic for i in gpus for nic in layout.nearest[i]))
        straggles = job.name == "mixtral-sft"
        slowest = job.compute_seconds / P5EN_STRAGGLER_CLOCK_RATIO if straggles else job.compute_seconds
        for index in gpus:
            straggler = straggles and node == JOBS_STRAGGLER_NODE and index == JOBS_STRAGGLER_GPU
            workload = w.AllReduceTraining(
                compute_seconds=slowest if straggler else job.compute_seconds,
                slowest_compute_seconds=slowest,
                nic_bytes_per_step=job.allreduce_seconds * JOBS_GPU_NIC_BYTES_PER_SECOND,
                nic_bytes_per_second=JOBS_GPU_NIC_BYTES_PER_SECOND,
                nvlink_bytes_per_second=2 * JOBS_GPU_NIC_BYTES_PER_SECOND,
            )
            b.add_gpu(
                index,
                b.whole(b.proc(workload, job.memory_bytes, uid, "trainer")),
                slowdown_clock_ratio=P5EN_STRAGGLER_CLOCK_RATIO if straggler else None,
                celsius_per_watt=P5EN_STRAGGLER_CELSIUS_PER_WATT if straggler else None,
            )
    # The node's eight GPUs are one NVLink domain (the baseboard's NVSwitches), registered under a
    # cluster UUID of the node's own: one clique per node, the jobs' traffic between nodes takes the
    # EFAs. (A real HGX board may report its registration completed with an all-zero UUID.)
    fabric = GpuFabric("completed", b._uuid("nvlink-fabric"), JOBS_FABRIC_CLIQUE_ID)
    b.gpus = [replace(gpu, fabric=fabric) for gpu in b.gpus]
    return b.build(NodeNetwork(layout, peermem=True, open_kernel_module=True))


SERVING_SIGNATURES: Mapping[str, w.Signature] = MappingProxyType(
    {"prefill": w.BF16_GEMM, "decode": w.LLM_DECODE, "both": w.LLM_DECODE}
)
"""What a serving pod's GPUs run by its role: a prefill computes dense GEMMs over the prompt, decode
(and aggregated serving, which spends most of its time decoding) streams weights and KV cache."""


def _serving() -> Scenario:
    """A p5en node (8 H200, 32 EFAs with GPUDirect RDMA) serving models (exporter/sim/serving.py):
    an aggregated vLLM Deployment (GPUs 0 and 1), a Dynamo disaggregated pair (prefill worker on
    GPUs 2-3, decode worker on 4-5; the prefill hands half its KV cache to this decode worker over
    NVLink and half to one on another node over its EFAs, and the decode worker receives as much
    from a prefill worker elsewhere), SGLang (GPU 6), and a 1 B model alone on an H200 (GPU 7). The
    engines' own /metrics come from ``python -m exporter.sim.engines``, not from the exporter."""
    b = _NodeBuilder("serving")
    layout = st.p5en_layout("NVIDIA peermem")
    nvlink, efa = sv.kv_bytes(sv.PREFILL)
    gpu = 0
    for d in sv.DEPLOYMENTS:
        if d.gpus == 0:
            continue
        kind = "DynamoGraphDeployment" if d.workload.startswith(sv.DISAGG) else "Deployment"
        top = sv.DISAGG if kind == "DynamoGraphDeployment" else d.workload
        name = f"{d.workload}-{b._suffix(10)}-{b._suffix(5)}" if kind != "Deployment" else None
        uid, _ = b.pod(sv.NAMESPACE, kind, top, name=name)
        gpus = tuple(range(gpu, gpu + d.gpus))
        b.hold(uid, d.engine, "nvidia.com/gpu", tuple(b.gpu_uuid(i) for i in gpus))
        kv = {}
        if d.role == "prefill":
            kv = {"kv_nvlink": nvlink / d.gpus, "kv_nic_tx": efa / d.gpus}
        elif d.role == "decode":
            kv = {"kv_nvlink": nvlink / d.gpus, "kv_nic_rx": efa / d.gpus}
        if kv.get("kv_nic_tx") or kv.get("kv_nic_rx"):
            b.hold(uid, d.engine, EFA_RESOURCE, tuple(nic for i in gpus for nic in layout.nearest[i]))
        # the engine takes its share of the GPU's memory at start (weights, then KV cache blocks),
        # however small the model: vLLM's gpu_memory_utilization 0.9, SGLang's mem_fraction_static 0.88
        memory = int((0.88 if d.engine == "sglang" else 0.9) * H200_MEMORY_BYTES)
        for i in gpus:
            # a small model's decode steps are short kernels with gaps between them, not HBM streams
            signature = w.SMALL_BATCH_INFERENCE if d.model.parameters < 3e9 else SERVING_SIGNATURES[d.role]
            workload = w.Serving(signature, level=d.level, **kv)
            b.add_gpu(i, b.whole(b.proc(workload, memory, uid, d.engine)))
        gpu += d.gpus
    return b.build(NodeNetwork(layout, peermem=True, open_kernel_module=True))


DRA_DRIVER = "gpu.nvidia.com"
"""NVIDIA's DRA driver for GPUs and MIG devices."""
DRA_CHANNEL_DRIVER = "compute-domain.nvidia.com"
"""NVIDIA's DRA driver for ComputeDomain IMEX channels: claimed, and neither a GPU nor a NIC."""


def _dra(claims: bool) -> Scenario:
    """A node whose GPUs are handed out through DRA ResourceClaims (``claims``), or its twin
    ``dra-plugin`` where the same pods hold the same GPUs through the device plugin: same GPUs,
    pods, processes and work, so every allocation, idle, waste and per-namespace figure must agree
    between the two (tests/test_dra.py).

    GPU 0: a device-plugin training pod on both nodes (a cluster mixes the two).  GPU 1: a whole
    GPU claimed by an LLM server.  GPU 2: one claim shared by two notebook pods (time-sliced; the
    twin advertises 2 replicas).  GPU 3: MIG, a 3g.71gb instance claimed by a trainer and a
    2g.35gb instance by a reranker whose device the driver published without a UUID (created at
    allocation); a 1g.18gb instance from the device plugin.  GPU 4: claimed, holding 40 GiB and
    idle (waste).  GPU 5: a whole GPU claimed with a ComputeDomain channel (a device of another
    driver, left out and counted).  GPUs 6 and 7: published and free.
    """
    b = _NodeBuilder("dra")
    name = "dra" if claims else "dra-plugin"
    pool = "dra-node-1"

    def publish(index: int) -> None:
        b.published.append(
            SliceDevice(
                DRA_DRIVER, pool, f"gpu-{index}", "gpu", b.gpu_uuid(index), None, None, _H200_PCI_BUS_IDS[index]
            )
        )

    def give(uid: str, container: str, claim_name: str, device: str, ids: tuple[str, ...], resource: str) -> None:
        pod = b.owners[uid]
        if claims:
            b.claim(uid, container, ClaimRef(pod.namespace, claim_name, DRA_DRIVER, pool, device))
        else:
            b.hold(uid, container, resource, ids)

    for index in range(8):
        if index != 3:
            publish(index)
    # GPU 0: the device plugin on both nodes.
    _exclusive(b, 0, "ml-training", "Job", "llama3-8b-finetune", "trainer", w.Training(w.BF16_GEMM), 118 * GIB)
    # GPU 1: an LLM server's claim.
    uid, pod_name = b.pod("inference", "Deployment", "llm-decode")
    give(uid, "vllm", f"{pod_name}-gpu-5kq2x", "gpu-1", (b.gpu_uuid(1),), "nvidia.com/gpu")
    b.add_gpu(
        1, b.whole(b.proc(w.Diurnal(w.LLM_DECODE, low=0.86, high=1.0), int(0.9 * H200_MEMORY_BYTES), uid, "vllm"))
    )
    # GPU 2: one claim shared by two notebooks.
    procs = []
    for i, wl in enumerate((w.Bursty(w.SMALL_BATCH_INFERENCE), w.Idle())):
        uid, _ = b.pod("notebooks", "StatefulSet", "jupyter-team")
        give(uid, "notebook", "team-shared-gpu", "gpu-2", (f"{b.gpu_uuid(2)}::{i}",), "nvidia.com/gpu.shared")
        procs.append(b.proc(wl, (10 + 8 * i) * GIB, uid, "notebook"))
    b.add_gpu(2, b.whole(*procs))
    if not claims:
        b.sharing[b.gpu_uuid(2)] = 2
    # GPU 3: MIG.
    uid, pod_name = b.pod("ml-training", "Job", "bert-pretrain")
    big = b.mig_leaf(3, "3g.71gb", 2)
    assert big.mig is not None
    device = "gpu-3-mig-3g71gb-0"
    b.published.append(SliceDevice(DRA_DRIVER, pool, device, "mig", big.mig.mig_uuid, b.gpu_uuid(3), "3g.71gb"))
    give(uid, "trainer", f"{pod_name}-mig-8m4rt", device, (big.mig.mig_uuid,), "nvidia.com/mig-3g.71gb")
    big = LeafSpec(big.memory_total_bytes, big.compute_fraction,
                   (b.proc(w.Training(w.BF16_GEMM, compute_seconds=30.0, load_seconds=4.0), 52 * GIB, uid, "trainer"),),
                   big.mig)  # fmt: skip
    uid, pod_name = b.pod("inference", "Deployment", "reranker")
    mid = b.mig_leaf(3, "2g.35gb", 3)
    assert mid.mig is not None
    device = "gpu-3-mig-2g35gb-4"
    b.published.append(SliceDevice(DRA_DRIVER, pool, device, "mig", None, b.gpu_uuid(3), "2g.35gb"))
    give(uid, "reranker", f"{pod_name}-mig-2vb9c", device, (mid.mig.mig_uuid,), "nvidia.com/mig-2g.35gb")
    mid = LeafSpec(mid.memory_total_bytes, mid.compute_fraction,
                   (b.proc(w.Diurnal(w.SMALL_BATCH_INFERENCE, low=0.2, high=0.9), 18 * GIB, uid, "reranker"),),
                   mid.mig)  # fmt: skip
    small = _mig_pod(b, 3, "1g.18gb", 9, "notebooks", "StatefulSet", "jupyter-erin", "notebook", (w.Idle(),), 6 * GIB)
    b.add_gpu(3, (big, mid, small, b.mig_leaf(3, "1g.18gb", 10)), mig_enabled=True)
    # GPU 4: claimed and idle, holding memory.
    uid, pod_name = b.pod("research", "Deployment", "feature-store-warm")
    give(uid, "cache", f"{pod_name}-gpu-7hq4d", "gpu-4", (b.gpu_uuid(4),), "nvidia.com/gpu")
    b.add_gpu(4, b.whole(b.proc(w.Idle(), 40 * GIB, uid, "cache")))
    # GPU 5: a GPU and a ComputeDomain channel in one pod.
    uid, pod_name = b.pod("ml-training", "Job", "mnnvl-allreduce")
    give(uid, "trainer", f"{pod_name}-gpu-c8x2w", "gpu-5", (b.gpu_uuid(5),), "nvidia.com/gpu")
    if claims:
        channel = ClaimRef("ml-training", f"{pod_name}-channel-c8x2w", DRA_CHANNEL_DRIVER, pool, "channel-0")
        b.claim(uid, "trainer", channel)
    b.add_gpu(5, b.whole(b.proc(w.Training(w.BF16_GEMM), 96 * GIB, uid, "trainer")))
    # GPUs 6, 7: free.
    b.add_gpu(6, b.whole())
    b.add_gpu(7, b.whole())
    if not claims:
        b.published.clear()
    return b.build(name=name)


BUILDERS: dict[str, Callable[[], Scenario]] = {
    "h200x8": _h200x8,
    "mig": _mig,
    "mig7x8": _mig7x8,
    "timeslice": _timeslice,
    "mps": _mps,
    "dra": lambda: _dra(claims=True),
    "dra-plugin": lambda: _dra(claims=False),
    "a100": _a100,
    "l40s": _l40s,
    "a10g": _a10g,
    "p5en": lambda: _p5en(gdr=True),
    "p5en-nogdr": lambda: _p5en(gdr=False),
    "jobs-0": lambda: _jobs(0),
    "jobs-1": lambda: _jobs(1),
    "serving": _serving,
}

SCENARIOS: tuple[str, ...] = tuple(BUILDERS)
"""Names accepted by ``SimulatedBackend(scenario=...)``."""


def build(name: str) -> Scenario:
    """The scenario called ``name``; ValueError names it and lists the valid ones."""
    try:
        builder = BUILDERS[name]
    except KeyError:
        raise ValueError(f"unknown sim scenario {name!r}; valid: {', '.join(SCENARIOS)}") from None
    return builder()
