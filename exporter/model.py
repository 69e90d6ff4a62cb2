"""Frozen snapshot types: what one sampling cycle saw, in base units.

Every quantity is in base units (bytes, seconds, watts, joules, hertz, degrees
Celsius) and every activity is a ratio in 0..1.  ``None`` always means "not
available on this device / driver" and is never rendered as 0 or NaN.
This module imports nothing of ours so every other layer can depend on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

BOUNDNESS_CLASSES: tuple[str, ...] = (
    "idle",
    "launch",
    "latency",
    "communication",
    "memory",
    "compute",
    "mixed",
    "transfer",
    "busy",
)
"""The boundness state set of a leaf, in the order it is rendered (docs/boundness.md).  ``busy`` is
the coarse classes' answer without GPM: kernels ran, but what limits them cannot be told.
``communication`` is ``latency`` with evidence that the leaf waits on its peers or its network
(docs/network.md): only a leaf classed from GPM has it."""
COMMUNICATION = "communication"

COARSE_CLASSES: tuple[str, ...] = ("idle", "launch", "memory", "transfer", "busy")
"""The classes a whole GPU without GPM can have (``signals="nvml"``), in rendering order; with GPM
a leaf has every class but ``busy``."""
GPM_CLASSES: tuple[str, ...] = tuple(c for c in BOUNDNESS_CLASSES if c != "busy")
"""The classes a leaf classed from GPM can have."""
RAW_GPM_CLASSES: tuple[str, ...] = tuple(c for c in GPM_CLASSES if c != COMMUNICATION)
"""The classes the per-leaf GPM classifier itself decides; ``communication`` refines ``latency``
afterwards, from the pod's other leaves and its network (exporter/analysis/communication.py)."""

SIGNALS_GPM = "gpm"
"""A leaf classed from GPM (Hopper and newer): every class but ``busy``."""
SIGNALS_NVML = "nvml"
"""A whole GPU without GPM: coarse classes (idle, busy, memory, launch, transfer) from NVML GPU-Util,
memory-controller utilisation, power and the links."""
SIGNALS_PROCESSES = "processes"
"""A MIG instance without GPM: no GPU-Util, so only ``idle`` (no compute process on it over the
window) or no class."""

SHARED_CLASS = "shared"
"""A pod's class on a leaf where several pods run: the leaf's class describes none of them alone."""

POD_BOUNDNESS_CLASSES: tuple[str, ...] = (*BOUNDNESS_CLASSES, SHARED_CLASS)
"""Values of a pod's class (``gpulens_pod_gpu_boundness``, ``gpulens:pod_gpu_boundness:class``)."""

UNKNOWN_TENANT: tuple[str, str] = ("", "")
"""Tenant key of a process on a leaf that maps to no known pod (a host process, an unread cgroup)."""

_EMPTY: Mapping[str, int] = MappingProxyType({})

PCIE = "pcie"
NVLINK = "nvlink"
LINKS: tuple[str, ...] = (PCIE, NVLINK)
"""The links a leaf moves data over, in the order they are rendered."""
NVLINK_ERROR_KINDS: tuple[str, ...] = ("replay", "recovery", "crc_flit", "crc_data")
"""NVLink data-link error counters: ``replay`` (a packet sent again after the receiver rejected it),
``recovery`` (the link retrained), ``crc_flit`` (a flow-control unit with a bad CRC received),
``crc_data`` (a data packet with a bad CRC received)."""
TEMPERATURE_THRESHOLDS: tuple[str, ...] = ("slowdown", "shutdown", "gpu_max", "memory_max")
"""Kinds of the GPU's temperature limits: ``slowdown`` (hardware slows the clocks), ``shutdown`` (the
GPU turns off to protect itself), ``gpu_max`` (the hottest the die may run before clocks drop below
base), ``memory_max`` (the hottest the HBM may run before software slows it)."""


@dataclass(frozen=True)
class LinkTraffic:
    """Bytes a leaf moved over one kind of link (PCIe or NVLink) during the last window."""

    link: str
    """One of LINKS."""
    source: str
    """Where the bytes came from, best first: ``counter`` (NVML's cumulative byte counters), ``gpm``
    (GPM rates over the cycle's window) or ``sampled`` (NVML's sampled throughput calls, a 20 ms
    window, the last resort)."""
    window_seconds: float
    """Seconds the rates cover (the integral of a rate over this window is the bytes moved)."""
    tx_bytes_per_second: float | None = None
    """Out of the GPU (device to host for PCIe, to peers for NVLink)."""
    rx_bytes_per_second: float | None = None
    """Into the GPU."""
    capacity_bytes_per_second: float | None = None
    """What the link carries each way at most: PCIe generation x lanes (after line encoding),
    NVLink active links x their rate; ``None`` when NVML does not say."""

    def utilization_ratio(self) -> float | None:
        """The busier direction's bytes/s over the capacity, 0..1; ``None`` if either is unknown."""
        rates = [r for r in (self.tx_bytes_per_second, self.rx_bytes_per_second) if r is not None]
        if not rates or not self.capacity_bytes_per_second:
            return None
        return min(1.0, max(0.0, max(rates) / self.capacity_bytes_per_second))


def transfer_ratio(links: tuple[LinkTraffic, ...]) -> float | None:
    """A leaf's transfer activity: the highest utilisation of its links (0..1), ``None`` if none
    is known.  Bytes over capacity is a lower bound on the time the link was moving data."""
    ratios = [r for r in (link.utilization_ratio() for link in links) if r is not None]
    return max(ratios) if ratios else None


@dataclass(frozen=True)
class GpmSample:
    """GPM profiling ratios (0..1) over one window on Hopper+; ``None`` = metric unavailable."""

    window_seconds: float
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    fp64_active: float | None = None
    fp32_active: float | None = None
    fp16_active: float | None = None
    dram_active: float | None = None
    graphics_active: float | None = None
    """Graphics-engine activity: fraction of the window a context ran work on the leaf (the busy
    ratio; the duty cycle boundness is normalised by)."""

    def max_pipe_active(self) -> float | None:
        """Highest tensor/FP pipe activity (roofline y); ``None`` if no pipe is known."""
        pipes = [v for v in (self.tensor_active, self.fp64_active, self.fp32_active, self.fp16_active) if v is not None]
        return max(pipes) if pipes else None


@dataclass(frozen=True)
class ProcessSample:
    """One compute process on a leaf, as NVML reports it (host PID)."""

    pid: int
    used_memory_bytes: int | None = None
    sm_util_ratio: float | None = None
    """Share of SM time this process used over the last window (per-process utilisation)."""
    memory_util_ratio: float | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    mps_role: str | None = None
    """``server`` (the MPS server process, not a tenant), ``client`` (an MPS client), or ``None``
    (a process with its own context)."""


MPS_SERVER = "server"
MPS_CLIENT = "client"


@dataclass(frozen=True)
class MigInstance:
    """Identity of a MIG instance (GPU instance + compute instance) on a physical GPU."""

    mig_uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    """Profile name as nvidia-smi prints it, e.g. ``1g.18gb``."""


@dataclass(frozen=True)
class LeafSample:
    """A schedulable unit: the whole GPU (MIG off) or one MIG instance.

    ``uuid`` is always the physical GPU's UUID; ``mig`` is set for MIG instances.
    """

    uuid: str
    mig: MigInstance | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    """Memory the driver reserves (NVML memory info v2); ``None`` with v1, whose ``used`` includes it."""
    utilization_ratio: float | None = None
    """NVML "GPU-Util" (time one or more kernels ran); NVML offers it only for whole GPUs."""
    gpm: GpmSample | None = None
    processes: tuple[ProcessSample, ...] = ()
    links: tuple[LinkTraffic, ...] = ()
    """What the leaf moved over its links in the last window (a whole GPU: its own links; a MIG
    instance: its share, where GPM measures it per GPU instance)."""

    @property
    def leaf_id(self) -> str:
        """Stable key of this leaf: the MIG UUID for MIG instances, else the GPU UUID."""
        return self.mig.mig_uuid if self.mig is not None else self.uuid

    @property
    def tenants(self) -> tuple[ProcessSample, ...]:
        """Processes that run work for somebody: every process but the MPS server."""
        return tuple(p for p in self.processes if p.mps_role != MPS_SERVER)

    @property
    def mps(self) -> bool:
        """True while MPS serves this leaf (an MPS server or MPS clients are listed on it)."""
        return any(p.mps_role is not None for p in self.processes)


FABRIC_STATES: tuple[str, ...] = ("not_supported", "not_started", "in_progress", "completed")
"""NVML's GPU fabric registration states (``NVML_GPU_FABRIC_STATE_*``), in its order."""


@dataclass(frozen=True)
class GpuFabric:
    """A GPU's NVLink fabric registration: which cluster and clique it belongs to.

    GPUs of one NVLink domain (an NVL72 rack, a ComputeDomain of NVIDIA's DRA driver) share the
    cluster UUID and clique ID once registration completed."""

    state: str
    """One of ``FABRIC_STATES``."""
    cluster_uuid: str
    """The fabric's cluster UUID as text (``8-4-4-4-12`` hex); all zeros before registration."""
    clique_id: int
    """The clique within the cluster; GPUs of one clique reach each other over NVLink."""
    status: str = "success"
    """NVML's result of the registration, lower case without ``NVML_``: ``success``, or why it
    failed (``in_use``, ``unknown``...); meaningful once ``state`` is ``completed``."""


@dataclass(frozen=True)
class NvLink:
    """One NVLink of a physical GPU, as NVML answers for it."""

    link: int
    """The link's number on the GPU (0 to 17 on an H200)."""
    active: bool
    """NVML's link state: trained and carrying traffic (``nvidia-smi nvlink -s`` prints its speed)
    or not (``<inactive>``)."""
    remote: str | None = None
    """What the active link reaches (NVML's remote device type): ``gpu`` (another GPU directly),
    ``switch`` (an NVSwitch: on the HGX boards every GPU reaches every other through the switches)
    or ``cpu`` (IBM's NPU); ``None`` while inactive or where NVML does not say."""
    remote_pci_bus_id: str | None = None
    """The PCI bus ID of the device at the far end (a GPU's for a direct link), as NVML writes it."""


@dataclass(frozen=True)
class NvLinkPeer:
    """Another GPU of the node that a GPU reaches over NVLink."""

    index: int
    uuid: str
    links: int
    """The NVLinks between them (``NV#`` of ``nvidia-smi topo -m``)."""


@dataclass(frozen=True)
class GpuSample:
    """One physical GPU at one instant.  ``up=False`` means lost or unreadable: only identity is kept."""

    index: int
    uuid: str
    up: bool = True
    name: str | None = None
    pci_bus_id: str | None = None
    compute_capability: str | None = None
    """``major.minor``, e.g. ``9.0``."""
    mig_mode: str | None = None
    """``enabled`` / ``disabled``; ``None`` if the GPU has no MIG."""
    compute_mode: str | None = None
    """``default``, ``exclusive_process`` or ``prohibited``."""
    utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    """NVML "util.mem": time the memory controller was busy (not capacity)."""
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None
    """Raw cumulative energy since the driver loaded; counters.py makes it monotonic."""
    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    temperature_thresholds: Mapping[str, float] | None = None
    """The GPU's own temperature limits in degrees Celsius, by kind (``TEMPERATURE_THRESHOLDS``):
    ``slowdown``, ``shutdown`` and ``gpu_max`` are die temperatures (compare ``temperature_celsius``),
    ``memory_max`` an HBM temperature (compare ``memory_temperature_celsius``); kinds NVML does not
    answer are absent."""
    fan_speed_ratio: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    sm_clock_max_hertz: float | None = None
    clock_events: Mapping[str, bool] | None = None
    """Clock event (throttle) reason -> active."""
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    pcie_link_generation: int | None = None
    pcie_link_width: int | None = None
    pcie_link_max_generation: int | None = None
    """Highest PCIe generation the link can train to: the lower of the GPU's and the slot's (or
    switch port's) maximum, so a current generation below it is a link that trained down."""
    pcie_link_max_width: int | None = None
    """Most lanes the link can train to (the GPU and its slot together)."""
    pcie_replay_errors: int | None = None
    nvlink_tx_bytes_per_second: float | None = None
    nvlink_rx_bytes_per_second: float | None = None
    links: tuple[LinkTraffic, ...] = ()
    """The physical GPU's link traffic (the same reads the ``*_bytes_per_second`` fields come from)."""
    nvlink_errors: Mapping[str, int] | None = None
    """NVLink data-link errors since the driver loaded, summed over the GPU's links, by kind
    (``NVLINK_ERROR_KINDS``); ``None`` on a GPU without NVLink."""
    nvlinks: tuple[NvLink, ...] = ()
    """Every NVLink NVML answers a state for, by link number; empty on a GPU without NVLink (and on
    one in MIG mode). Re-read every minute with the link capacity."""
    nvlink_peers: tuple[NvLinkPeer, ...] | None = None
    """The node's other GPUs this GPU reaches over NVLink, by index, with the links to each
    (``NV#`` of ``nvidia-smi topo -m``): its links straight to that GPU, plus its links to NVSwitches
    when NVML says the pair can do peer-to-peer over NVLink.  ``None`` on a GPU without active
    NVLinks."""
    ecc_errors: Mapping[str, int] | None = None
    """Volatile ECC error counts by severity (``corrected`` / ``uncorrected``)."""
    remapped_rows: Mapping[str, int] | None = None
    """Remapped rows by cause (``correctable`` / ``uncorrectable``), plus ``pending``/``failure`` 0/1."""
    xid_events: tuple[int, ...] = ()
    """Xid codes of events that arrived since the previous sample (each event once)."""
    fabric: GpuFabric | None = None
    """The GPU's place in an NVLink fabric (``nvmlDeviceGetGpuFabricInfoV``); ``None`` where NVML
    has no such call or answers NOT_SUPPORTED (a GPU outside any NVLink fabric)."""
    leaves: tuple[LeafSample, ...] = ()


@dataclass(frozen=True)
class BackendSample:
    """What a backend returns for one cycle."""

    up: bool
    """False when the backend cannot answer at all (no driver, init failed)."""
    driver_version: str | None = None
    gpus: tuple[GpuSample, ...] = ()
    error: str | None = None
    """Why ``up`` is False, or a partial failure, for logs."""
    errors: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    """NVML error counts by code name during this cycle (transient errors)."""
    gpm_supported: bool | None = None


@dataclass(frozen=True)
class StageResult:
    """Health of one pipeline stage in the cycle: ``gpulens_stage_success/_duration_seconds``."""

    stage: str
    success: bool
    duration_seconds: float


@dataclass(frozen=True)
class PodRef:
    """A container that holds a device (from the kubelet), with its owner (from the API)."""

    namespace: str
    pod: str
    container: str
    uid: str | None = None
    workload_kind: str | None = None
    workload: str | None = None


@dataclass(frozen=True)
class ContainerDevices:
    """Raw kubelet PodResources entry: the device IDs one container holds for one resource.

    ``device_ids`` are as the device plugin advertised them: ``GPU-<uuid>``, ``MIG-<uuid>``,
    ``GPU-<uuid>::N`` (time-slicing replica), ``nvidia0/gi1`` and so on.
    """

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    pod_uid: str | None = None


@dataclass(frozen=True)
class ClaimRef:
    """A device allocated through a DRA ResourceClaim, as the kubelet names it (PodResources
    ``dynamic_resources``): the claim, and the driver, pool and device of one allocated device."""

    claim_namespace: str
    claim_name: str
    driver: str
    pool: str
    device: str


@dataclass(frozen=True)
class ClaimedDevice:
    """Raw kubelet PodResources ``dynamic_resources`` entry, flattened: one device one container
    holds through one ResourceClaim."""

    namespace: str
    pod: str
    container: str
    claim: ClaimRef
    cdi_devices: tuple[str, ...] = ()
    """Fully qualified CDI device names the driver prepared (``k8s.gpu.nvidia.com/claim=…``)."""
    pod_uid: str | None = None


@dataclass(frozen=True)
class SliceDevice:
    """One device a DRA driver publishes in this node's ResourceSlices (``resource.k8s.io/v1``),
    with the attributes gpulens reads; attributes the device lacks are ``None``."""

    driver: str
    pool: str
    device: str
    kind: str | None = None
    """The driver's ``type`` attribute: ``gpu`` or ``mig`` for NVIDIA's driver."""
    uuid: str | None = None
    """``uuid``: the GPU's UUID, or the MIG instance's."""
    parent_uuid: str | None = None
    """``parentUUID``: the physical GPU of a MIG device."""
    profile: str | None = None
    """``profile``: a MIG device's profile, e.g. ``1g.18gb``."""
    pci_bus_id: str | None = None
    """``resource.kubernetes.io/pciBusID`` (or the driver's own PCI bus ID attribute)."""


@dataclass(frozen=True)
class Allocation:
    """One device allocated to one container: ``gpulens_pod_gpu_allocation``."""

    pod: PodRef
    resource: str
    uuid: str
    mig_uuid: str | None = None
    replica: str | None = None
    """Time-slicing replica suffix (``GPU-…::N``), ``None`` for exclusive devices."""
    claim: ClaimRef | None = None
    """The ResourceClaim the device came through (DRA); ``None`` for a device plugin's device."""


@dataclass(frozen=True)
class PodUsage:
    """A container's use of one physical GPU, from its processes (needs PID -> pod)."""

    pod: PodRef
    uuid: str
    memory_used_bytes: int | None = None
    kernel_time_ratio: float | None = None
    """Share of the driver's sampled time in which a kernel of the container's processes ran on the
    GPU (NVML per-process utilisation, summed over its processes, at most 1): time, not SM activity
    (one small kernel counts as much as a full GPU's)."""


@dataclass(frozen=True)
class Attribution:
    """Who holds which device and what they use, merged from all attribution sources."""

    allocations: tuple[Allocation, ...] = ()
    usages: tuple[PodUsage, ...] = ()
    sharing_replicas: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    """Physical GPU UUID -> time-slicing replicas advertised."""
    sharing_pods: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    """Physical GPU UUID -> pods holding a replica."""
    unmapped_devices: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    """Reason -> count of device IDs that matched no known GPU (cumulative)."""
    podresources_last_success_timestamp: float | None = None
    """Unix time (s) of the last successful kubelet refresh (``gpulens_podresources_last_success…``)."""
    leaf_tenants: Mapping[str, frozenset[tuple[str, str]]] | None = None
    """Leaf id -> (namespace, pod) of every pod with compute processes on it (``UNKNOWN_TENANT``
    for a process that maps to no pod); a leaf with no process is absent.  ``None`` when processes
    cannot be mapped to pods this cycle (no PID source, or it failed)."""
    other_devices: tuple[tuple[PodRef, ContainerDevices], ...] = ()
    """Devices of resources that are not GPUs (NICs among them), with the pod they belong to; the
    network stage keeps those that name an RDMA device or are a NIC resource."""
    allocation_conflicts: int = 0
    """Exclusive devices (no replica) currently listed under more than one pod; all holders are
    shown.  Non-zero when an old kubelet still lists a finished pod and the API phase is unknown."""
    claim_sharing: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    """Physical GPU UUID -> pods holding that whole GPU through ResourceClaims, where more than one
    does (one claim shared by several pods): the GPU is time-sliced between them."""
    claims_ignored: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    """DRA driver -> devices of running containers' claims left out now: neither a GPU of this node
    nor one of its NICs."""
    owner_walks: Mapping[str, int] | None = None
    """Outcome (``resolved``, ``forbidden``, ``not_found``, ``error``, ``limited``: see
    exporter/attribution/owners.py) -> owner-chain walks through the Kubernetes API that ended so,
    cumulative since the start (counts).  ``None`` when the API source does not follow owner
    chains (``--no-kubernetes.owner-chain``, or no API source)."""
    items_dropped: Mapping[tuple[str, str], int] | None = None
    """(kind, reason) -> items the attribution left out, cumulative since the start: ``pod`` past
    ``--kubernetes.max-pods`` and ``allocation`` past ``--kubernetes.max-allocations`` (reason
    ``limit``), counted at every kubelet refresh that leaves them out; ``kubelet_connection``
    closed for a flood of HTTP/2 frames carrying no reply (reason ``control_frame_flood``).
    ``None`` without the kubelet PodResources source (the simulator's kubelet has no ceiling)."""


@dataclass(frozen=True)
class LeafAnalysis:
    """Derived per-leaf signals: boundness and the activity integrals (``*_seconds_total``)."""

    leaf_id: str
    boundness: str | None = None
    """One of BOUNDNESS_CLASSES, or ``None`` when nothing classes the leaf this cycle (a MIG
    instance without GPM that has processes, a GPM leaf before its first window)."""
    signals: str = SIGNALS_GPM
    """Which source the leaf's analysis has, and so its precision: ``gpm`` (full classes), ``nvml``
    (coarse classes from GPU-Util, memory-controller utilisation and power) or ``processes`` (a MIG
    instance without GPM: ``idle`` or no class)."""
    busy_ratio: float | None = None
    """This cycle's busy ratio (GPM graphics-engine activity, else NVML GPU-Util; the busiest link's
    utilisation where larger): the duty cycle the class is normalised by.  ``None`` for a MIG
    instance without GPM."""
    busy_seconds: float | None = None
    sharing_mode: str | None = None
    """``exclusive``, ``time-slicing``, ``mps`` or ``mig`` (exporter/analysis/sharing.py)."""
    sm_active_seconds: float | None = None
    tensor_active_seconds: float | None = None
    dram_active_seconds: float | None = None
    energy_joules: float | None = None
    """Monotonic energy counter (physical GPUs only)."""
    link_bytes: Mapping[tuple[str, str], float] = field(default_factory=lambda: MappingProxyType({}))
    """(link, direction ``tx``/``rx``) -> bytes moved since the exporter first saw the leaf."""
    transfer_ratio: float | None = None
    """This cycle's transfer activity: the busiest link's utilisation (0..1)."""


@dataclass(frozen=True)
class PodBoundness:
    """A container's class on one leaf it holds (``gpulens_pod_gpu_boundness``)."""

    pod: PodRef
    uuid: str
    mig_uuid: str | None
    boundness: str
    """One of POD_BOUNDNESS_CLASSES."""


@dataclass(frozen=True)
class ProbeResult:
    """The latest cached result of one probe on one GPU (written by the probe scheduler)."""

    uuid: str
    probe: str
    bandwidth_bytes_per_second: float | None
    efficiency_ratio: float | None
    last_success_timestamp: float | None


NIC_KINDS: tuple[str, ...] = ("efa", "infiniband", "roce", "rdma")
"""What an RDMA device is: ``efa`` (AWS Elastic Fabric Adapter), ``infiniband``, ``roce`` (RDMA over
Ethernet), ``rdma`` (any other)."""
PCIE_PATHS: tuple[str, ...] = ("PIX", "PXB", "PHB", "NODE", "SYS")
"""PCIe path classes between two devices, nearest first (as NCCL and ``nvidia-smi topo -m`` name
them): one PCIe switch, several switches, the host bridge, two host bridges of one NUMA node,
across NUMA nodes."""


@dataclass(frozen=True)
class NicPort:
    """One port of an RDMA device at one instant.  Counter totals are monotonic since the
    exporter first read them (a reset or 32-bit wrap handled); rates are over the last read."""

    port: int
    state_id: int | None = None
    """Logical state: 1 down, 2 init, 3 armed, 4 active, 5 active-defer."""
    physical_state_id: int | None = None
    """Physical state: 5 is LinkUp."""
    rate_bytes_per_second: float | None = None
    """Line rate each way (``100 Gb/sec (4X EDR)`` is 12.5e9)."""
    link_layer: str | None = None
    tx_bytes: float | None = None
    rx_bytes: float | None = None
    tx_packets: float | None = None
    rx_packets: float | None = None
    counters: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    """Every other port counter by its sysfs file name, monotonic total, in its own unit."""
    tx_bytes_per_second: float | None = None
    """Bytes sent per second over the time since the previous read; ``None`` on the first."""
    rx_bytes_per_second: float | None = None

    def utilization_ratio(self) -> float | None:
        """The busier direction's rate over the line rate (0..1); ``None`` if either is unknown."""
        rates = [r for r in (self.tx_bytes_per_second, self.rx_bytes_per_second) if r is not None]
        if not rates or not self.rate_bytes_per_second:
            return None
        return min(1.0, max(0.0, max(rates) / self.rate_bytes_per_second))


@dataclass(frozen=True)
class NicSample:
    """One RDMA device (``/sys/class/infiniband/<device>``) at one instant."""

    device: str
    kind: str
    """One of NIC_KINDS."""
    driver: str = ""
    pci_bus_id: str = ""
    """``0000:4f:00.0`` (lower case, sysfs spelling); empty when the device has no PCI function."""
    numa_node: int | None = None
    p2p: str | None = None
    """EFA only: the driver's peer-to-peer provider (``NVIDIA peermem``, ``NVIDIA``, ``NEURON``, empty),
    ``1``/``0`` from an older driver's ``gdr`` file; ``None`` where the NIC has neither file."""
    ports: tuple[NicPort, ...] = ()
    counters: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    """Device-level counters (EFA admin-queue and error counters), monotonic totals."""

    @property
    def link_layer(self) -> str:
        """The first port's link layer (``InfiniBand``, ``Ethernet``, ``Unknown``), or empty."""
        return next((p.link_layer for p in self.ports if p.link_layer), "")


@dataclass(frozen=True)
class GpuNicPath:
    """How one GPU reaches one NIC, and whether GPUDirect RDMA can work between them."""

    uuid: str
    device: str
    path: str
    """One of PCIE_PATHS."""
    nearest: bool
    """No other NIC has a closer path class to this GPU."""
    gdr_ready: bool
    gdr_reason: str
    """How it is ready (``peermem``, ``dmabuf``, ``efa_p2p``) or why not (``no_peer_memory``,
    ``path_phb``, ``path_node``, ``path_sys``); docs/network.md."""


@dataclass(frozen=True)
class NicHolder:
    """A container holding a NIC through the kubelet (``gpulens_pod_nic_allocation``)."""

    pod: PodRef
    resource: str
    device: str
    """The RDMA device, or empty when the device plugin's ID names none (a shared pool)."""


@dataclass(frozen=True)
class NetworkSample:
    """What the NIC source saw in its latest read (docs/network.md)."""

    nics: tuple[NicSample, ...] = ()
    paths: tuple[GpuNicPath, ...] = ()
    holders: tuple[NicHolder, ...] = ()
    """Filled by the sampler from the kubelet's devices (the NIC source does not read the kubelet)."""
    dropped: Mapping[tuple[str, str], int] = field(default_factory=lambda: MappingProxyType({}))
    """Devices, ports and counters the NIC source's last discovery left out: (kind, reason) -> count
    (``gpulens_nic_items_dropped``)."""

    def pods_holding(self, device: str) -> int:
        """Distinct pods holding ``device``."""
        return len({(h.pod.namespace, h.pod.pod) for h in self.holders if h.device == device})


@dataclass(frozen=True)
class Snapshot:
    """Everything one scrape renders; built once per cycle by the sampler, never mutated."""

    timestamp: float
    """Unix time (s) at which this cycle finished."""
    backend: BackendSample
    stages: tuple[StageResult, ...] = ()
    analysis: Mapping[str, LeafAnalysis] = field(default_factory=lambda: MappingProxyType({}))
    """leaf_id -> derived signals."""
    attribution: Attribution | None = None
    pod_boundness: tuple[PodBoundness, ...] = ()
    """Per allocated container and leaf: its class (exporter/analysis/pod_class.py)."""
    xid_totals: Mapping[tuple[str, int], int] = field(default_factory=lambda: MappingProxyType({}))
    """(GPU uuid, xid) -> events seen since the exporter started."""
    xid_last: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """GPU uuid -> the most recent Xid code seen since the exporter started (absent: none yet)."""
    nvml_errors: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """NVML error code -> errors seen since start (``gpulens_nvml_errors_total``)."""
    probe_results: tuple[ProbeResult, ...] = ()
    probe_runs: Mapping[tuple[str, str], int] = field(default_factory=lambda: MappingProxyType({}))
    """(uuid, result) -> probe runs since start."""
    network: NetworkSample | None = None
    """The node's RDMA NICs, their paths to the GPUs and their holders; ``None`` when the NIC source
    is off, found no RDMA device, or its read failed this cycle."""
