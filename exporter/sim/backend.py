"""Simulated GPU backend: a seeded, deterministic GPU node for CI, the demo and golden tests.

``SimulatedBackend`` plays one of the named scenarios in ``scenarios`` (which GPU model, which GPU
runs what, MIG layouts, pods) through the workloads of ``workloads`` and returns the same model
types as the NVML backend.  Simulated time advances ``step_seconds`` per ``sample()`` call, so the
N-th sample depends only on (scenario, seed, gpm, N) and the faults injected, never on the clock.

Link traffic is read as the NVML backend reads it.  With GPM (an H200): a whole GPU's PCIe and
NVLink bytes from GPM (``source="gpm"``: the H200's PCIe byte counters are 32-bit and skipped), a
MIG instance's PCIe share from its GPU instance's GPM (MIG instances have no NVLink), and the
physical link of a GPU in MIG mode from NVML's throughput samples (``source="sampled"``).  Without
GPM (a pre-Hopper model, or ``gpm=False``): the physical PCIe link from NVML's throughput samples,
read every ``SAMPLED_PCIE_EVERY_CYCLES`` cycles staggered by GPU index and repeated in between (as
the NVML backend paces them), no MIG instance's share, and NVLink from NVML's per-link byte
counters where the model has them (``source="counter"``: the A100), else none.  All are rates over
the cycle's window, so the first sample (and the first after a loss) has none; the GPU's
``pcie_*``/``nvlink_*_bytes_per_second`` are the same reads.  An idle GPU moves a few KB/s.

A scenario with RDMA NICs (``p5en``, ``p5en-nogdr``) gets a sysfs and procfs tree in a temporary
directory (exporter/sim/sysfs_tree.py; ``network_roots()`` names it, ``close()`` removes it) whose
NIC counters each ``sample()`` advances by the bytes the GPUs' workloads sent and received over
their nearest NICs in the same simulated second.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import tempfile
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from dataclasses import field as dataclass_field
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from exporter.attribution.merge import PidOwner, PodMeta
from exporter.backends.nvml.device import CLOCK_EVENT_REASONS
from exporter.backends.nvml.links import pcie_capacity
from exporter.backends.nvml.topology import nvlink_peers
from exporter.model import (
    MPS_SERVER,
    NVLINK,
    NVLINK_ERROR_KINDS,
    PCIE,
    BackendSample,
    ClaimedDevice,
    ContainerDevices,
    GpmSample,
    GpuSample,
    LeafSample,
    LinkTraffic,
    NvLink,
    NvLinkPeer,
    ProcessSample,
    SliceDevice,
)
from exporter.sim import scenarios as sc
from exporter.sim.faults import FaultView, SimFaults
from exporter.sim.sysfs_tree import SysfsTree

__all__ = ["SCENARIOS", "SimFaults", "SimulatedBackend"]

SCENARIOS: tuple[str, ...] = sc.SCENARIOS

AMBIENT_CELSIUS = 27.0
"""Inlet temperature, °C; a GPU settles ``celsius_per_watt`` (its model's) above it per watt."""
THERMAL_TIME_CONSTANT_SECONDS = 40.0
CLOCK_STEP_HERTZ = 15e6
"""SM clocks move in 15 MHz steps (Ampere, Ada and Hopper)."""
UNAVAILABLE_ERROR = "NVML library not found (simulated)"
# PCIe traffic of a GPU that runs nothing (the driver's and NVML's own reads), between these and
# twice these: a few KB/s, ~1e-7 of the link, so an idle GPU stays idle.
HOUSEKEEPING_TX_BYTES_PER_SECOND = 1e3
HOUSEKEEPING_RX_BYTES_PER_SECOND = 2e3
SAMPLED_PCIE_EVERY_CYCLES = 10
"""Without GPM the NVML backend reads ``nvmlDeviceGetPcieThroughput`` this often per GPU (its
``pcie_every`` default), staggered by GPU index, and repeats the last value in between."""
KIB = 1024
"""NVML's throughput samples and NVLink counters count KiB."""

_CLOCK_REASONS = tuple(CLOCK_EVENT_REASONS.values())
"""Every reason the H200's NVML lists as supported (docs/gpu-validation.md), labelled as the NVML
backend labels them (one list: the backend's)."""
_GPU_FIELDS = frozenset(f.name for f in fields(GpuSample))
_LEAF_FIELDS = frozenset(f.name for f in fields(LeafSample))
_GPM_FIELDS = frozenset(f.name for f in fields(GpmSample))
_ABSENT: dict[str, Any] = {"links": (), "nvlinks": ()}
"""What a faulted field reads where that is not ``None``: no link measured is no link reads."""
_LINK_READS: dict[str, tuple[str, str]] = {
    "pcie_tx_bytes_per_second": (PCIE, "tx"),
    "pcie_rx_bytes_per_second": (PCIE, "rx"),
    "nvlink_tx_bytes_per_second": (NVLINK, "tx"),
    "nvlink_rx_bytes_per_second": (NVLINK, "rx"),
}
"""GPU fields that are one read with a direction of the GPU's (and its whole-GPU leaf's) links."""


def _ratio(x: float) -> float:
    return round(min(1.0, max(0.0, x)), 6)


def _per_second(bytes_per_second: float, window_seconds: float) -> float:
    """A rate as a byte counter gives it: whole bytes moved in the window, over the window."""
    return max(0, round(bytes_per_second * window_seconds)) / window_seconds


class _Moved(NamedTuple):
    """Bytes per second a leaf (or a whole GPU) moved in the window; NVLink the same each way."""

    pcie_rx: float
    pcie_tx: float
    nvlink: float


@dataclass
class _GpuState:
    """What carries over between samples for one physical GPU."""

    spec: sc.GpuSpec
    rng: random.Random
    energy_joules: float
    temperature_celsius: float | None = None
    nvlink_errors: dict[str, int] = dataclass_field(default_factory=lambda: dict.fromkeys(NVLINK_ERROR_KINDS, 0))
    """Cumulative NVLink errors by kind (zero unless an ``nvlink_errors`` fault adds some)."""
    fresh: bool = True
    """No previous sample to window against (first call, or after being lost/unavailable)."""
    nvlink_link_kib: float = 0.0
    """Without GPM, on a model with NVLink counters: KiB each active link has carried each way
    (NCCL spreads the bytes over the links); NVML's counters are its whole KiB."""
    nvlinks: tuple[NvLink, ...] = ()
    """The GPU's NVLinks: all trained, all to the board's NVSwitches (none on a model without)."""
    sampled_pcie: tuple[float, float] | None = None
    """Without GPM: the last ``nvmlDeviceGetPcieThroughput`` read (tx, rx bytes/s), repeated until
    the next read; ``None`` until the first read of a window."""
    nic_tx: float = 0.0
    """Bytes/s the GPU's processes sent over RDMA NICs in the last window (its nearest NICs carry them)."""
    nic_rx: float = 0.0
    """Bytes/s they received."""


# How the simulated EFA devices count a job's bytes (NCCL over EFA through the aws-ofi-nccl
# plugin, which moves bulk data by RDMA write).  Shares are of the bytes on the wire each way.
EFA_PACKET_BYTES = 8192
"""Bytes a data packet carries on average (the EFA SRD MTU is about 8 KiB)."""
RDMA_WRITE_SHARE = 0.95
"""Of the bytes sent, those sent by RDMA writes (``rdma_write_bytes``; received: ``rdma_write_recv_bytes``)."""
RDMA_WRITE_WR_BYTES = 512 * 1024
"""Bytes per RDMA-write work request (NCCL's network chunks)."""
RDMA_READ_SHARE = 0.02
"""Of the bytes received, those fetched by RDMA reads (``rdma_read_bytes``; served to remote reads
out of the bytes sent: ``rdma_read_resp_bytes``)."""
RDMA_READ_WR_BYTES = 64 * 1024
SEND_SHARE = 0.01
"""Of the bytes each way, two-sided sends and receives (the plugin's control messages)."""
SEND_WR_BYTES = 256
RETRANSMIT_RATIO = 1e-6
"""Data packets the SRD transport sends again (``retrans_pkts``), per packet sent."""
RETRANSMIT_TIMEOUT_RATIO = 1e-10
"""Retransmission timeouts (``retrans_timeout_events``) per packet sent."""
KEEP_ALIVES_PER_SECOND = 1.0
"""The EFA device's keep-alive events (``keep_alive_rcvd``), one a second."""


def _efa_traffic(tx: float, rx: float) -> dict[str, float]:
    """What ``tx`` bytes sent and ``rx`` received add to each EFA port counter (floats; the files
    hold their whole parts)."""
    return {
        "tx_bytes": tx,
        "rx_bytes": rx,
        "tx_pkts": tx / EFA_PACKET_BYTES,
        "rx_pkts": rx / EFA_PACKET_BYTES,
        "rdma_write_bytes": RDMA_WRITE_SHARE * tx,
        "rdma_write_wrs": RDMA_WRITE_SHARE * tx / RDMA_WRITE_WR_BYTES,
        "rdma_write_recv_bytes": RDMA_WRITE_SHARE * rx,
        "rdma_read_bytes": RDMA_READ_SHARE * rx,
        "rdma_read_wrs": RDMA_READ_SHARE * rx / RDMA_READ_WR_BYTES,
        "rdma_read_resp_bytes": RDMA_READ_SHARE * tx,
        "send_bytes": SEND_SHARE * tx,
        "send_wrs": SEND_SHARE * tx / SEND_WR_BYTES,
        "recv_bytes": SEND_SHARE * rx,
        "recv_wrs": SEND_SHARE * rx / SEND_WR_BYTES,
        "retrans_pkts": RETRANSMIT_RATIO * tx / EFA_PACKET_BYTES,
        "retrans_bytes": RETRANSMIT_RATIO * tx,
        "retrans_timeout_events": RETRANSMIT_TIMEOUT_RATIO * tx / EFA_PACKET_BYTES,
    }


_CounterKey = tuple[str, int | None, str]
"""(NIC, port or ``None`` for the device, counter name)."""


IN_MEMORY = "/dev/shm"
"""Where a simulated sysfs tree goes when the caller did not choose a temporary folder: a tmpfs, as
the real sysfs lives in memory.  The tree is ~2,000 entries (~6 MiB of pages) rewritten every cycle;
on a virtual machine's ext4 each file operation costs ~0.1 ms, so building one took 0.8-1.1 s there."""
IN_MEMORY_FREE_BYTES = 64 * 1024 * 1024
"""Free space ``IN_MEMORY`` must have (a container's default /dev/shm is 64 MiB) to be used."""


def tree_parent() -> str | None:
    """Folder for simulated sysfs trees: ``$TMPDIR`` when it is set, else ``IN_MEMORY`` when it is a
    folder we can write with ``IN_MEMORY_FREE_BYTES`` free, else ``None`` (the system's default)."""
    if os.environ.get("TMPDIR"):
        return None
    try:
        stat = os.statvfs(IN_MEMORY)
    except OSError:
        return None
    if not os.access(IN_MEMORY, os.W_OK | os.X_OK) or stat.f_bavail * stat.f_frsize < IN_MEMORY_FREE_BYTES:
        return None
    return IN_MEMORY


class _NicCounters:
    """The simulated node's RDMA NICs: a sysfs tree in a temporary directory (removed by ``close``,
    or when the object is collected) whose counters follow the GPUs' NIC traffic.

    A GPU's bytes go to its nearest NICs (the layout's ``nearest``), split nearly evenly as NCCL
    stripes them over its rails.  Counters start where days of uptime left them (seeded) and only
    grow; each sample writes the counters whose whole value changed.
    """

    def __init__(self, network: sc.NodeNetwork, scenario: str, seed: int) -> None:
        self._layout = network.layout
        directory = tempfile.mkdtemp(prefix=f"gpulens-sim-{scenario}-", dir=tree_parent())
        self._finalizer = weakref.finalize(self, shutil.rmtree, directory, ignore_errors=True)
        self.tree = SysfsTree.of(Path(directory), network.layout, network.peermem, network.open_kernel_module)
        self._rng = random.Random(f"{scenario}/{seed}/nics")
        self._where: dict[tuple[str, str], int | None] = {}
        for nic in network.layout.nics:
            for port in nic.ports:
                for name in (*port.hw_counters, *port.ib_counters):
                    self._where[(nic.name, name)] = port.number
            for name in nic.device_counters:
                self._where.setdefault((nic.name, name), None)
        self._totals: dict[_CounterKey, float] = {}
        self._written: dict[_CounterKey, int] = {}
        self._start()
        self._flush()

    def _start(self) -> None:
        """Counters as days of uptime and earlier training left them."""
        rng = self._rng
        for nic in self._layout.nics:
            uptime = rng.uniform(2, 9) * 86400.0
            moved = rng.uniform(0.05, 0.2) * uptime * 12.5e9  # a fraction of the line rate, on average
            self._add(nic.name, _efa_traffic(moved, moved * rng.uniform(0.98, 1.02)))
            commands = float(rng.randrange(2000, 6000))  # the verbs that set up queues and memory
            self._add(nic.name, {"keep_alive_rcvd": uptime, "submitted_cmds": commands, "completed_cmds": commands})

    def advance(self, per_gpu: Mapping[int, tuple[float, float]], seconds: float) -> None:
        """Add ``seconds`` of traffic: GPU index -> (bytes/s sent, bytes/s received) over its NICs."""
        nearest = self._layout.nearest
        for index, (tx, rx) in sorted(per_gpu.items()):
            names = nearest[index] if index < len(nearest) else ()
            if not names:
                continue
            weights = [1.0 + self._rng.gauss(0.0, 0.01) for _ in names]
            total = sum(weights)
            for name, weight in zip(names, weights, strict=True):
                share = weight / total * seconds
                self._add(name, _efa_traffic(tx * share, rx * share))
        for nic in self._layout.nics:
            self._add(nic.name, {"keep_alive_rcvd": KEEP_ALIVES_PER_SECOND * seconds})
        self._flush()

    def _add(self, nic: str, deltas: Mapping[str, float]) -> None:
        """Add to the NIC's counters that exist (a driver without one has no file for it)."""
        for name, delta in deltas.items():
            key = (nic, name)
            if key in self._where:
                full = (nic, self._where[key], name)
                self._totals[full] = self._totals.get(full, 0.0) + delta

    def _flush(self) -> None:
        for key, total in self._totals.items():
            value = int(total)
            if self._written.get(key) != value:
                self.tree.set_counter(*key, value)
                self._written[key] = value

    def close(self) -> None:
        """Remove the tree; idempotent."""
        self._finalizer()


class SimulatedBackend:
    """A ``GpuBackend`` that simulates a GPU node; see ``SCENARIOS`` for the layouts.

    ``seed`` changes the noise and starting counters, not identities (UUIDs, PIDs, pods).
    ``gpm=False`` reads every GPU as NVML would if it refused GPM (every leaf's ``gpm`` ``None``,
    no GPM link rates), with the same random stream, so the other readings match ``gpm=True``'s;
    GPUs of a model without GPM never have it.
    ``faults`` can be flipped while sampling runs (``SimFaults``).  Besides ``sample()`` it
    answers what a Kubernetes node would: ``pod_devices()`` (kubelet PodResources),
    ``pods()`` (API server), ``pid_owners()`` (cgroups), ``sharing_replicas()`` (device plugin);
    ``exporter.sim.attribution`` turns those into attribution sources.
    """

    name = "sim"

    def __init__(
        self,
        scenario: str = "h200x8",
        seed: int = 0,
        faults: SimFaults | None = None,
        step_seconds: float = 1.0,
        gpm: bool = True,
    ) -> None:
        if not step_seconds > 0:
            raise ValueError(f"step_seconds must be > 0, got {step_seconds}")
        self._scenario = sc.build(scenario)
        self.seed = seed
        self.gpm = gpm
        """Whether GPUs whose model has GPM are read with it (``False``: as if NVML refused it)."""
        self.step_seconds = float(step_seconds)
        self.faults = faults if faults is not None else SimFaults()
        self._calls = 0
        self._gpus = [self._new_state(spec) for spec in self._scenario.gpus]
        network = self._scenario.network
        self._nics = _NicCounters(network, self._scenario.name, seed) if network is not None else None
        self._peers_for: tuple[tuple[str, bool, tuple[NvLink, ...]], ...] | None = None
        self._peers: dict[str, tuple[NvLinkPeer, ...]] = {}

    def _new_state(self, spec: sc.GpuSpec) -> _GpuState:
        rng = random.Random(f"{self._scenario.noise or self._scenario.name}/{self.seed}/{spec.index}")
        # The driver loaded days ago: the energy counter does not start at zero.
        state = _GpuState(spec, rng, energy_joules=round(rng.uniform(2e8, 9e8), 3))
        state.nvlinks = tuple(NvLink(link, True, "switch") for link in range(spec.model.nvlink_links))
        if spec.slowdown_clock_ratio is not None:
            # It has been throttling for a while: as hot as its slowdown threshold, not settling there.
            state.temperature_celsius = spec.model.temperature_thresholds.get("slowdown", 90.0) + 1.0
        return state

    @property
    def scenario(self) -> str:
        """Name of the scenario being played."""
        return self._scenario.name

    @property
    def simulated_seconds(self) -> float:
        """Simulated time of the most recent sample (0 before the first)."""
        return max(0, self._calls - 1) * self.step_seconds

    # --- GpuBackend ------------------------------------------------------------------

    def sample(self) -> BackendSample:
        """One cycle: every GPU, windowed signals over the last ``step_seconds``.

        Blocks only when a ``hang_seconds`` fault is set (the sampler must survive it).
        """
        view = self.faults.take()
        if view.hang_seconds > 0:
            self.faults.hang(view.hang_seconds)
        cycle = self._calls
        t = cycle * self.step_seconds
        self._calls += 1
        for (index, kind), count in view.nvlink_errors.items():
            if 0 <= index < len(self._gpus):  # counted while the GPU is lost too, like energy
                self._gpus[index].nvlink_errors[kind] += count
        # Every GPU is simulated every cycle, faults or not, so a fault on one GPU never shifts
        # another GPU's random stream and counters keep integrating while a GPU is "lost".
        gpus = [self._sample_gpu(state, t, cycle) for state in self._gpus]
        if self._nics is not None:  # the NICs move the job's bytes whatever NVML answers
            self._nics.advance({s.spec.index: (s.nic_tx, s.nic_rx) for s in self._gpus}, self.step_seconds)
        if view.unavailable:
            for state in self._gpus:
                state.fresh = True
            return BackendSample(up=False, error=UNAVAILABLE_ERROR)
        for state in self._gpus:
            state.fresh = state.spec.index in view.lost
        errors: dict[str, int] = {}
        if not view.quiet or self.faults.has_xid():
            gpus = self._apply_faults(gpus, view, errors)
        gpus = self._with_peers(gpus, "nvlink_peers" in view.none_fields)
        return BackendSample(
            up=True,
            driver_version=sc.DRIVER_VERSION,
            gpus=tuple(gpus),
            errors=MappingProxyType(errors) if errors else MappingProxyType({}),
            gpm_supported="gpm" not in view.unsupported and any(self._gpm_on(s.spec) for s in self._gpus),
        )

    def _with_peers(self, gpus: list[GpuSample], unsupported: bool = False) -> list[GpuSample]:
        """``gpus`` with their NVLink peers: every GPU of a simulated board reaches every other
        through the NVSwitches (HGX), computed again only when a GPU's links or state change
        (``unsupported``: a fault says NVML does not answer them)."""
        if unsupported:
            return gpus
        key = tuple((g.uuid, g.up, g.nvlinks) for g in gpus)
        if key != self._peers_for:
            self._peers_for = key
            self._peers = nvlink_peers(gpus, lambda a, b: True)
        return [replace(g, nvlink_peers=self._peers[g.uuid]) if g.uuid in self._peers else g for g in gpus]

    def close(self) -> None:
        """Remove the NICs' sysfs tree, if the scenario has one; idempotent."""
        if self._nics is not None:
            self._nics.close()

    def network_roots(self) -> tuple[str, str] | None:
        """(sysfs root, procfs root) of the simulated node's NIC tree (``--path.sysfs`` and
        ``--path.procfs`` of a real node), for scenarios with RDMA NICs; ``None`` for the others."""
        if self._nics is None:
            return None
        return str(self._nics.tree.sysfs), str(self._nics.tree.procfs)

    # --- Kubernetes side ---------------------------------------------------------------

    def pod_devices(self) -> tuple[ContainerDevices, ...]:
        """Kubelet PodResources view: device IDs (``GPU-…``, ``MIG-…``, ``GPU-…::N``) per container."""
        return self._scenario.pod_devices

    def pod_claims(self) -> tuple[ClaimedDevice, ...]:
        """Kubelet PodResources view of DRA: the devices containers hold through ResourceClaims."""
        return self._scenario.pod_claims

    def resource_slices(self) -> tuple[SliceDevice, ...]:
        """API server view of DRA: the devices this node's drivers publish in ResourceSlices."""
        return self._scenario.slice_devices

    def pods(self) -> tuple[PodMeta, ...]:
        """API server view: every simulated pod with its phase and owner workload."""
        return self._scenario.pods

    def pid_owners(self) -> Mapping[int, PidOwner]:
        """cgroup view: host PID of every simulated pod process -> its pod UID and container."""
        return MappingProxyType(self._scenario.pid_owners)

    def sharing_replicas(self) -> dict[str, int]:
        """GPU UUID -> time-slicing replicas advertised (only shared GPUs)."""
        return dict(self._scenario.sharing_replicas)

    # --- simulation --------------------------------------------------------------------

    def _gpm_on(self, spec: sc.GpuSpec) -> bool:
        """Whether this GPU's leaves get GPM windows: its model has GPM and it is not switched off."""
        return self.gpm and spec.model.gpm

    def _sample_gpu(self, state: _GpuState, t: float, cycle: int) -> GpuSample:
        spec, rng = state.spec, state.rng
        model = spec.model
        gpm_on = self._gpm_on(spec)
        windowed = not state.fresh
        dynamic_watts = 0.0
        busy = whole_mem_util = 0.0
        has_process = False
        leaves: list[LeafSample] = []
        moved: list[_Moved] = []
        state.nic_tx = state.nic_rx = 0.0
        for leaf in spec.leaves:
            acts = [p.workload.activity(t, rng) for p in leaf.processes]
            total = sum(a.share for a in acts)
            # Time-slicing: processes take turns, so their shares cannot add up past 1.
            scale = 1.0 / total if total > 1.0 else 1.0
            sm = occ = dram = tensor = fp32 = fp16 = fp64 = util = graphics = mem_util = 0.0
            rx = tx = nv = 0.0
            procs: list[ProcessSample] = []
            mig = leaf.mig
            for proc, act in zip(leaf.processes, acts, strict=True):
                has_process = True
                share = act.share * scale
                sig = act.signature or proc.workload.signature
                sm += share * sig.sm_active
                occ += share * sig.sm_occupancy
                dram += share * sig.dram_active
                tensor += share * sig.tensor_active
                fp32 += share * sig.fp32_active
                fp16 += share * sig.fp16_active
                fp64 += share * sig.fp64_active
                if sig.utilization_band is not None and share > 0:
                    lo, hi = sig.utilization_band
                    u = share * min(hi, max(lo, rng.gauss((lo + hi) / 2, (hi - lo) / 4)))
                else:
                    u = share * sig.utilization
                util += u
                # Copies count in GPU-Util but not in GPM's graphics-engine activity.
                graphics += u if sig.graphics_activity is None else share * sig.graphics_activity
                mem_util += share * sig.memory_utilization
                # Signatures give an H200's power: scaled to this model's span from idle to its limit.
                dynamic_watts += (
                    share * (sig.power_watts - sc.H200.idle_power_watts) * leaf.compute_fraction * model.power_scale
                )
                # A workload on a slice of the GPU moves the bytes of its slice, at this model's links.
                rx += act.pcie_rx_bytes_per_second * leaf.compute_fraction * model.pcie_scale
                tx += act.pcie_tx_bytes_per_second * leaf.compute_fraction * model.pcie_scale
                nv += act.nvlink_bytes_per_second * leaf.compute_fraction * model.nvlink_scale
                # The NICs' bytes are what the job sends; they are in its PCIe bytes too.
                state.nic_tx += act.nic_tx_bytes_per_second * leaf.compute_fraction
                state.nic_rx += act.nic_rx_bytes_per_second * leaf.compute_fraction
                # NVML has no per-process utilisation for MIG instances, and under MPS reports it
                # for the server only (set below, the clients' sum).
                per_process = windowed and mig is None and proc.mps_role is None
                procs.append(
                    ProcessSample(
                        pid=proc.pid,
                        used_memory_bytes=proc.memory_bytes,
                        sm_util_ratio=_ratio(u) if per_process else None,
                        memory_util_ratio=_ratio(share * sig.memory_utilization) if per_process else None,
                        gpu_instance_id=mig.gpu_instance_id if mig else None,
                        compute_instance_id=mig.compute_instance_id if mig else None,
                        mps_role=proc.mps_role,
                    )
                )
            if windowed and mig is None:
                procs = [
                    replace(p, sm_util_ratio=_ratio(util), memory_util_ratio=_ratio(mem_util))
                    if p.mps_role == MPS_SERVER
                    else p
                    for p in procs
                ]
            busy = max(busy, util)
            whole_mem_util = mem_util
            leaf_moved = _Moved(rx, tx, nv)
            # Noise is drawn even when the window is not reported, so the random stream (and every
            # later value) is the same whether or not a fault interrupted this GPU.
            g = rng.gauss
            gpm: GpmSample | None = GpmSample(
                window_seconds=self.step_seconds,
                sm_active=_ratio(sm * (1 + g(0, 0.01))),
                sm_occupancy=_ratio(occ * (1 + g(0, 0.02))),
                tensor_active=_ratio(tensor * (1 + g(0, 0.01))),
                fp64_active=_ratio(fp64),
                fp32_active=_ratio(fp32 * (1 + g(0, 0.01))),
                fp16_active=_ratio(fp16 * (1 + g(0, 0.02))),
                dram_active=_ratio(dram * (1 + g(0, 0.01))),
                # GPM graphics-engine activity tracks NVML GPU-Util on the H200 (within 0.01 on steady work) while
                # kernels run, and GPM has it per MIG instance too; no draw of its own keeps the
                # random stream.
                graphics_active=_ratio(graphics),
            )
            if not windowed or not gpm_on:
                gpm = None
            leaves.append(
                LeafSample(
                    uuid=spec.uuid,
                    mig=mig,
                    memory_used_bytes=sum(p.memory_bytes for p in leaf.processes),
                    memory_total_bytes=leaf.memory_total_bytes,
                    memory_reserved_bytes=model.reserved_bytes if mig is None else None,
                    # NVML offers GPU-Util only for whole GPUs.
                    utilization_ratio=_ratio(util) if mig is None else None,
                    gpm=gpm,
                    processes=tuple(procs),
                    # GPM measures each GPU instance's own PCIe bytes (MIG instances have no NVLink);
                    # a whole GPU's links are the device's reads, taken with its other readings.
                    links=(self._pcie_link(leaf_moved, "gpm", model),) if gpm is not None and mig else (),
                )
            )
            moved.append(leaf_moved)
        return self._physical(
            state, tuple(leaves), dynamic_watts, has_process, busy, whole_mem_util, tuple(moved), windowed, cycle
        )

    def _pcie_link(self, moved: _Moved, source: str, model: sc.GpuModel) -> LinkTraffic:
        """A leaf's (or GPU's) PCIe bytes over the window, as read from ``source``."""
        w = self.step_seconds
        return LinkTraffic(
            PCIE, source, w, _per_second(moved.pcie_tx, w), _per_second(moved.pcie_rx, w), model.pcie_bytes_per_second
        )

    def _gpu_links(self, state: _GpuState, device: _Moved, cycle: int, windowed: bool) -> tuple[LinkTraffic, ...]:
        """The physical GPU's link reads over the window, from the sources the NVML backend would
        use (see the module docstring); none on a fresh window.  NVLink counters integrate every
        cycle, read or not, like energy."""
        spec, model = state.spec, state.spec.model
        gpm_on = self._gpm_on(spec)
        w = self.step_seconds
        links = model.nvlink_links if not spec.mig_enabled else 0  # NVML finds no NVLink in MIG mode here
        counted = links > 0 and model.nvlink_counters  # preferred to GPM, as the NVML backend does
        kib_before = state.nvlink_link_kib
        if counted:
            state.nvlink_link_kib += device.nvlink * w / links / KIB
        if not windowed:
            state.sampled_pcie = None
            return ()
        if gpm_on and not spec.mig_enabled:
            pcie = self._pcie_link(device, "gpm", model)
        elif gpm_on:
            pcie = self._pcie_link(device, "sampled", model)
        else:
            if state.sampled_pcie is None or (cycle - spec.index) % SAMPLED_PCIE_EVERY_CYCLES == 0:
                # NVML samples ~20 ms of traffic and answers whole KiB/s.
                state.sampled_pcie = (
                    round(device.pcie_tx / KIB) * float(KIB),
                    round(device.pcie_rx / KIB) * float(KIB),
                )
            tx, rx = state.sampled_pcie
            pcie = LinkTraffic(PCIE, "sampled", w, tx, rx, model.pcie_bytes_per_second)
        if not links:
            return (pcie,)
        if counted:
            # Each link's counter in whole KiB; the rate is the links' increases together.
            per_second = (math.floor(state.nvlink_link_kib) - math.floor(kib_before)) * links * KIB / w
            return pcie, LinkTraffic(NVLINK, "counter", w, per_second, per_second, model.nvlink_bytes_per_second)
        if gpm_on:
            each_way = _per_second(device.nvlink, w)
            return pcie, LinkTraffic(NVLINK, "gpm", w, each_way, each_way, model.nvlink_bytes_per_second)
        return (pcie,)  # NVLink present, but neither GPM nor counters to read its bytes from

    def _physical(
        self,
        state: _GpuState,
        leaves: tuple[LeafSample, ...],
        dynamic_watts: float,
        has_process: bool,
        busy: float,
        whole_mem_util: float,
        moved: tuple[_Moved, ...],
        windowed: bool,
        cycle: int,
    ) -> GpuSample:
        spec, rng = state.spec, state.rng
        model = spec.model
        limit = model.power_limit_watts
        # HW thermal slowdown (a GPU whose cooling fails) holds the SM clock down while it works;
        # the dynamic power falls with the clock and the lower voltage that goes with it, roughly
        # as the clock's square (estimate).
        slowdown = spec.slowdown_clock_ratio if busy > 0.005 else None
        if slowdown is not None:
            dynamic_watts *= slowdown**2
        demand = model.idle_power_watts + (model.context_power_watts if has_process else 0.0) + dynamic_watts
        capped = demand > limit
        if capped:
            # The power controller holds the board just under its limit by lowering the SM clock.
            power = limit - abs(rng.gauss(2.0, 2.0))
            clock = model.sm_clock_max_hertz * math.sqrt(limit / demand)
        else:
            power = demand + rng.gauss(0.0, 1.5)
            clock = model.sm_clock_max_hertz if busy > 0.005 else model.idle_sm_clock_hertz
        if slowdown is not None:
            clock = min(clock, model.sm_clock_max_hertz * slowdown)
        clock = round(clock / CLOCK_STEP_HERTZ) * CLOCK_STEP_HERTZ
        power = round(power, 3)
        cooling = spec.celsius_per_watt if spec.celsius_per_watt is not None else model.celsius_per_watt
        target = AMBIENT_CELSIUS + cooling * power
        if state.temperature_celsius is None:
            state.temperature_celsius = target
        else:
            alpha = 1.0 - math.exp(-self.step_seconds / THERMAL_TIME_CONSTANT_SECONDS)
            state.temperature_celsius += (target - state.temperature_celsius) * alpha
        state.energy_joules = round(state.energy_joules + power * self.step_seconds, 3)
        temp = float(round(state.temperature_celsius))
        events = dict.fromkeys(_CLOCK_REASONS, False)
        events["gpu_idle"] = busy <= 0.005
        events["sw_power_cap"] = capped
        events["hw_thermal_slowdown"] = slowdown is not None
        # The device's counters see every instance's bytes and the driver's own few KB/s.
        housekeeping_tx = HOUSEKEEPING_TX_BYTES_PER_SECOND * (1 + rng.random())
        housekeeping_rx = HOUSEKEEPING_RX_BYTES_PER_SECOND * (1 + rng.random())
        device = _Moved(
            sum(m.pcie_rx for m in moved) + housekeeping_rx,
            sum(m.pcie_tx for m in moved) + housekeeping_tx,
            sum(m.nvlink for m in moved),
        )
        # Rates need two reads of a counter (or two GPM samples): none on a fresh window.
        gpu_links = self._gpu_links(state, device, cycle, windowed)
        if windowed and not spec.mig_enabled:
            leaves = (replace(leaves[0], links=gpu_links),)  # the whole GPU is its only leaf: one read
        pcie = next((x for x in gpu_links if x.link == PCIE), None)
        nvl = next((x for x in gpu_links if x.link == NVLINK), None)
        whole = None if spec.mig_enabled else leaves[0]
        memory_offset = model.memory_temperature_offset_celsius
        nvlink_present = model.nvlink_links > 0 and not spec.mig_enabled
        return GpuSample(
            index=spec.index,
            uuid=spec.uuid,
            name=model.name,
            pci_bus_id=spec.pci_bus_id,
            compute_capability=model.compute_capability,
            # A model without MIG: NVML answers NotSupported for the MIG mode.
            mig_mode=("enabled" if spec.mig_enabled else "disabled") if model.mig_profiles else None,
            compute_mode=spec.compute_mode,
            # In MIG mode NVML answers NotSupported for device-level utilisation.
            utilization_ratio=whole.utilization_ratio if whole else None,
            memory_utilization_ratio=_ratio(whole_mem_util) if whole else None,
            memory_used_bytes=sum(leaf.memory_used_bytes or 0 for leaf in leaves),
            memory_total_bytes=model.memory_bytes,
            power_watts=power,
            power_limit_watts=limit,
            energy_joules=state.energy_joules,
            temperature_celsius=temp,
            memory_temperature_celsius=temp + memory_offset if memory_offset is not None else None,
            temperature_thresholds=model.temperature_thresholds,
            fan_speed_ratio=model.fan_speed_ratio,
            sm_clock_hertz=clock,
            memory_clock_hertz=model.memory_clock_hertz,
            sm_clock_max_hertz=model.sm_clock_max_hertz,
            clock_events=MappingProxyType(events),
            pcie_tx_bytes_per_second=pcie.tx_bytes_per_second if pcie else None,
            pcie_rx_bytes_per_second=pcie.rx_bytes_per_second if pcie else None,
            pcie_link_generation=model.pcie_generation,
            pcie_link_width=model.pcie_width,
            pcie_link_max_generation=model.pcie_generation,
            pcie_link_max_width=model.pcie_width,
            pcie_replay_errors=0,
            # NVLink throughput as read above: GPM (which a GPU in MIG mode does not sample) or the
            # per-link counters; none where neither answers.
            nvlink_tx_bytes_per_second=nvl.tx_bytes_per_second if nvl else None,
            nvlink_rx_bytes_per_second=nvl.rx_bytes_per_second if nvl else None,
            links=gpu_links,
            # NVML finds no NVLink on a GPU in MIG mode here, nor on a model without NVLink.
            nvlinks=state.nvlinks if nvlink_present else (),
            nvlink_errors=MappingProxyType(dict(state.nvlink_errors)) if nvlink_present else None,
            ecc_errors=MappingProxyType({"corrected": spec.ecc_corrected, "uncorrected": 0}),
            remapped_rows=MappingProxyType(
                {"correctable": spec.remapped_correctable, "uncorrectable": 0, "pending": 0, "failure": 0}
            ),
            fabric=spec.fabric,
            leaves=leaves,
        )

    # --- faults ------------------------------------------------------------------------

    def _apply_faults(self, gpus: list[GpuSample], view: FaultView, errors: dict[str, int]) -> list[GpuSample]:
        none_fields = view.none_fields
        failed = 0
        out: list[GpuSample] = []
        for gpu in gpus:
            if gpu.index in view.lost:
                out.append(GpuSample(index=gpu.index, uuid=gpu.uuid, up=False))
                continue
            if gpu.index in view.pcie_link:
                gpu = replace(gpu, **_trained_to(gpu, *view.pcie_link[gpu.index]))
            down = {link for index, link in view.nvlink_down if index == gpu.index}
            if down and gpu.nvlinks:
                gpu = replace(gpu, **_links_down(gpu, down))
            changes: dict[str, Any] = {}
            xids = self.faults.take_xid(gpu.index)
            if xids:
                changes["xid_events"] = xids
            if none_fields:
                n, gpu_changes = _nulled(gpu, none_fields & _GPU_FIELDS, view.failing)
                failed += n
                changes.update(gpu_changes)
                # A failed PCIe or NVLink read fails for the links it is the same number as.
                dropped = {_LINK_READS[name] for name in gpu_changes if name in _LINK_READS}
                if dropped and "links" not in gpu_changes:
                    changes["links"] = _without_reads(gpu.links, dropped)
                leaves = []
                for leaf in gpu.leaves:
                    n, leaf_changes = _nulled(leaf, none_fields & _LEAF_FIELDS, view.failing)
                    failed += n
                    if dropped and leaf.mig is None and "links" not in leaf_changes:
                        leaf_changes["links"] = _without_reads(leaf.links, dropped)
                    if leaf.gpm is not None and none_fields & _GPM_FIELDS and "gpm" not in leaf_changes:
                        n, gpm_changes = _nulled(leaf.gpm, none_fields & _GPM_FIELDS, view.failing)
                        failed += n
                        if gpm_changes:
                            leaf_changes["gpm"] = replace(leaf.gpm, **gpm_changes)
                    leaves.append(replace(leaf, **leaf_changes) if leaf_changes else leaf)
                changes["leaves"] = tuple(leaves)
            out.append(replace(gpu, **changes) if changes else gpu)
        if failed:
            errors["unknown"] = failed
        return out


def _trained_to(gpu: GpuSample, generation: int, width: int) -> dict[str, Any]:
    """The changes that make ``gpu``'s PCIe link read as trained to ``generation`` x ``width``:
    its current generation and lanes, and the capacity of every PCIe read (the GPU's and its leaves')."""
    capacity = pcie_capacity(None, generation, width)

    def narrowed(links: tuple[LinkTraffic, ...]) -> tuple[LinkTraffic, ...]:
        return tuple(replace(x, capacity_bytes_per_second=capacity) if x.link == PCIE else x for x in links)

    return {
        "pcie_link_generation": generation,
        "pcie_link_width": width,
        "links": narrowed(gpu.links),
        "leaves": tuple(replace(leaf, links=narrowed(leaf.links)) for leaf in gpu.leaves),
    }


def _links_down(gpu: GpuSample, down: set[int]) -> dict[str, Any]:
    """The changes that make ``gpu``'s NVLinks in ``down`` read inactive: their states, and the
    NVLink capacity of every read (the GPU's and its leaves') one link's rate lower for each."""
    states = tuple(NvLink(x.link, False) if x.link in down else x for x in gpu.nvlinks)
    share = sum(x.active for x in states) / len(states)

    def narrowed(links: tuple[LinkTraffic, ...]) -> tuple[LinkTraffic, ...]:
        return tuple(
            replace(x, capacity_bytes_per_second=x.capacity_bytes_per_second * share)
            if x.link == NVLINK and x.capacity_bytes_per_second is not None
            else x
            for x in links
        )

    return {
        "nvlinks": states,
        "links": narrowed(gpu.links),
        "leaves": tuple(replace(leaf, links=narrowed(leaf.links)) for leaf in gpu.leaves),
    }


def _nulled(obj: Any, names: frozenset[str], failing: frozenset[str]) -> tuple[int, dict[str, Any]]:
    """Fields of ``obj`` among ``names`` that hold a value, set to None (``links``: to no links);
    and how many of them failed transiently (an unsupported field is not an error, a failing read is)."""
    changes: dict[str, Any] = {}
    failed = 0
    for name in names:
        absent = _ABSENT.get(name)
        if getattr(obj, name) != absent:
            changes[name] = absent
            failed += name in failing
    return failed, changes


def _without_reads(links: tuple[LinkTraffic, ...], dropped: set[tuple[str, str]]) -> tuple[LinkTraffic, ...]:
    """``links`` with the (link, direction) rates in ``dropped`` unread (``None``)."""
    out = []
    for x in links:
        unread: dict[str, Any] = {f"{d}_bytes_per_second": None for link, d in dropped if link == x.link}
        out.append(replace(x, **unread) if unread else x)
    return tuple(out)
