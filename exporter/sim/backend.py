"""Simulated GPU backend: a seeded, deterministic H200 node for CI, the demo and golden tests.

``SimulatedBackend`` plays one of the named scenarios in ``scenarios`` (which GPU runs what,
MIG layouts, pods) through the workloads of ``workloads`` and returns the same model types
as the NVML backend.  Simulated time advances ``step_seconds`` per ``sample()`` call, so the
N-th sample depends only on (scenario, seed, N) and the faults injected, never on the clock.

Link traffic is read as the NVML backend reads it on an H200: a whole GPU's PCIe and NVLink bytes
from GPM (``source="gpm"``: the H200's PCIe byte counters are 32-bit and skipped), a MIG
instance's PCIe share from its GPU instance's GPM (MIG instances have no NVLink), and the physical
link of a GPU in MIG mode from NVML's throughput samples (``source="sampled"``).  Both are rates over the
cycle's window, so the first sample (and the first after a loss) has none; the GPU's
``pcie_*``/``nvlink_*_bytes_per_second`` are the same reads.  An idle GPU moves a few KB/s.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from dataclasses import field as dataclass_field
from types import MappingProxyType
from typing import Any, NamedTuple

from exporter.attribution.merge import PidOwner, PodMeta
from exporter.backends.nvml_device import CLOCK_EVENT_REASONS
from exporter.backends.nvml_links import pcie_capacity
from exporter.model import (
    MPS_SERVER,
    NVLINK,
    NVLINK_ERROR_KINDS,
    PCIE,
    BackendSample,
    ContainerDevices,
    GpmSample,
    GpuSample,
    LeafSample,
    LinkTraffic,
    ProcessSample,
)
from exporter.sim import scenarios as sc
from exporter.sim.faults import FaultView, SimFaults

__all__ = ["SCENARIOS", "SimFaults", "SimulatedBackend"]

SCENARIOS: tuple[str, ...] = sc.SCENARIOS

IDLE_POWER_WATTS = 74.0
"""H200 board power with no CUDA context."""
CONTEXT_POWER_WATTS = 18.0
"""Extra power while any process holds a context (the GPU stays in P0)."""
IDLE_SM_CLOCK_HERTZ = 345e6
AMBIENT_CELSIUS = 27.0
CELSIUS_PER_WATT = 0.075
THERMAL_TIME_CONSTANT_SECONDS = 40.0
CLOCK_STEP_HERTZ = 15e6
"""Hopper SM clocks move in 15 MHz steps."""
UNAVAILABLE_ERROR = "NVML library not found (simulated)"
# PCIe traffic of a GPU that runs nothing (the driver's and NVML's own reads), between these and
# twice these: a few KB/s, ~1e-7 of the link, so an idle GPU stays idle.
HOUSEKEEPING_TX_BYTES_PER_SECOND = 1e3
HOUSEKEEPING_RX_BYTES_PER_SECOND = 2e3
H200_TEMPERATURE_THRESHOLDS: Mapping[str, float] = MappingProxyType(
    {"slowdown": 89.0, "shutdown": 95.0, "gpu_max": 87.0, "memory_max": 95.0}
)
"""What NVML answers for an H200's temperature limits, °C (driver 580, docs/gpu-validation.md)."""

_CLOCK_REASONS = tuple(CLOCK_EVENT_REASONS.values())
"""Every reason the H200's NVML lists as supported (docs/gpu-validation.md), labelled as the NVML
backend labels them (one list: the backend's)."""
_GPU_FIELDS = frozenset(f.name for f in fields(GpuSample))
_LEAF_FIELDS = frozenset(f.name for f in fields(LeafSample))
_GPM_FIELDS = frozenset(f.name for f in fields(GpmSample))
_ABSENT: dict[str, Any] = {"links": ()}
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


class SimulatedBackend:
    """A ``GpuBackend`` that simulates an H200 node; see ``SCENARIOS`` for the layouts.

    ``seed`` changes the noise and starting counters, not identities (UUIDs, PIDs, pods).
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
    ) -> None:
        if not step_seconds > 0:
            raise ValueError(f"step_seconds must be > 0, got {step_seconds}")
        self._scenario = sc.build(scenario)
        self.seed = seed
        self.step_seconds = float(step_seconds)
        self.faults = faults if faults is not None else SimFaults()
        self._calls = 0
        self._gpus = [self._new_state(spec) for spec in self._scenario.gpus]

    def _new_state(self, spec: sc.GpuSpec) -> _GpuState:
        rng = random.Random(f"{self._scenario.name}/{self.seed}/{spec.index}")
        # The driver loaded days ago: the energy counter does not start at zero.
        return _GpuState(spec, rng, energy_joules=round(rng.uniform(2e8, 9e8), 3))

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
        t = self._calls * self.step_seconds
        self._calls += 1
        for (index, kind), count in view.nvlink_errors.items():
            if 0 <= index < len(self._gpus):  # counted while the GPU is lost too, like energy
                self._gpus[index].nvlink_errors[kind] += count
        # Every GPU is simulated every cycle, faults or not, so a fault on one GPU never shifts
        # another GPU's random stream and counters keep integrating while a GPU is "lost".
        gpus = [self._sample_gpu(state, t) for state in self._gpus]
        if view.unavailable:
            for state in self._gpus:
                state.fresh = True
            return BackendSample(up=False, error=UNAVAILABLE_ERROR)
        for state in self._gpus:
            state.fresh = state.spec.index in view.lost
        errors: dict[str, int] = {}
        if not view.quiet or self.faults.has_xid():
            gpus = self._apply_faults(gpus, view, errors)
        return BackendSample(
            up=True,
            driver_version=sc.DRIVER_VERSION,
            gpus=tuple(gpus),
            errors=MappingProxyType(errors) if errors else MappingProxyType({}),
            gpm_supported="gpm" not in view.unsupported,
        )

    def close(self) -> None:
        """Nothing to release; idempotent."""

    # --- Kubernetes side ---------------------------------------------------------------

    def pod_devices(self) -> tuple[ContainerDevices, ...]:
        """Kubelet PodResources view: device IDs (``GPU-…``, ``MIG-…``, ``GPU-…::N``) per container."""
        return self._scenario.pod_devices

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

    def _sample_gpu(self, state: _GpuState, t: float) -> GpuSample:
        spec, rng = state.spec, state.rng
        windowed = not state.fresh
        dynamic_watts = 0.0
        busy = whole_mem_util = 0.0
        has_process = False
        leaves: list[LeafSample] = []
        moved: list[_Moved] = []
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
                dynamic_watts += share * (sig.power_watts - IDLE_POWER_WATTS) * leaf.compute_fraction
                # A workload on a slice of the GPU moves the bytes of its slice.
                rx += act.pcie_rx_bytes_per_second * leaf.compute_fraction
                tx += act.pcie_tx_bytes_per_second * leaf.compute_fraction
                nv += act.nvlink_bytes_per_second * leaf.compute_fraction
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
            if not windowed:
                gpm = None
            leaves.append(
                LeafSample(
                    uuid=spec.uuid,
                    mig=mig,
                    memory_used_bytes=sum(p.memory_bytes for p in leaf.processes),
                    memory_total_bytes=leaf.memory_total_bytes,
                    memory_reserved_bytes=sc.DRIVER_RESERVED_BYTES if mig is None else None,
                    # NVML offers GPU-Util only for whole GPUs.
                    utilization_ratio=_ratio(util) if mig is None else None,
                    gpm=gpm,
                    processes=tuple(procs),
                    # GPM measures each GPU instance's own PCIe bytes (MIG instances have no NVLink);
                    # a whole GPU's links are the device's reads, taken with its other readings.
                    links=self._links(leaf_moved, "gpm", nvlink=False) if windowed and mig else (),
                )
            )
            moved.append(leaf_moved)
        return self._physical(
            state, tuple(leaves), dynamic_watts, has_process, busy, whole_mem_util, tuple(moved), windowed
        )

    def _links(self, moved: _Moved, pcie_source: str, nvlink: bool) -> tuple[LinkTraffic, ...]:
        """One leaf's (or GPU's) link reads over the window: PCIe from ``pcie_source``, and NVLink
        from GPM where the GPU has NVLink to read (not in MIG mode)."""
        w = self.step_seconds
        pcie = LinkTraffic(
            PCIE,
            pcie_source,
            w,
            _per_second(moved.pcie_tx, w),
            _per_second(moved.pcie_rx, w),
            sc.PCIE_GEN5_X16_BYTES_PER_SECOND,
        )
        if not nvlink:
            return (pcie,)
        each_way = _per_second(moved.nvlink, w)
        return pcie, LinkTraffic(NVLINK, "gpm", w, each_way, each_way, sc.NVLINK_BYTES_PER_SECOND)

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
    ) -> GpuSample:
        spec, rng = state.spec, state.rng
        limit = sc.H200_POWER_LIMIT_WATTS
        demand = IDLE_POWER_WATTS + (CONTEXT_POWER_WATTS if has_process else 0.0) + dynamic_watts
        capped = demand > limit
        if capped:
            # The power controller holds the board just under its limit by lowering the SM clock.
            power = limit - abs(rng.gauss(2.0, 2.0))
            clock = sc.H200_SM_CLOCK_MAX_HERTZ * math.sqrt(limit / demand)
        else:
            power = demand + rng.gauss(0.0, 1.5)
            clock = sc.H200_SM_CLOCK_MAX_HERTZ if busy > 0.005 else IDLE_SM_CLOCK_HERTZ
        clock = round(clock / CLOCK_STEP_HERTZ) * CLOCK_STEP_HERTZ
        power = round(power, 3)
        target = AMBIENT_CELSIUS + CELSIUS_PER_WATT * power
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
        # The device's counters see every instance's bytes and the driver's own few KB/s.
        housekeeping_tx = HOUSEKEEPING_TX_BYTES_PER_SECOND * (1 + rng.random())
        housekeeping_rx = HOUSEKEEPING_RX_BYTES_PER_SECOND * (1 + rng.random())
        device = _Moved(
            sum(m.pcie_rx for m in moved) + housekeeping_rx,
            sum(m.pcie_tx for m in moved) + housekeeping_tx,
            sum(m.nvlink for m in moved),
        )
        # Rates need two reads of a counter (or two GPM samples): none on a fresh window.
        source = "sampled" if spec.mig_enabled else "gpm"
        gpu_links = self._links(device, source, nvlink=not spec.mig_enabled) if windowed else ()
        if windowed and not spec.mig_enabled:
            leaves = (replace(leaves[0], links=gpu_links),)  # the whole GPU is its only leaf: one read
        pcie = next((x for x in gpu_links if x.link == PCIE), None)
        nvl = next((x for x in gpu_links if x.link == NVLINK), None)
        whole = None if spec.mig_enabled else leaves[0]
        return GpuSample(
            index=spec.index,
            uuid=spec.uuid,
            name=sc.GPU_NAME,
            pci_bus_id=spec.pci_bus_id,
            compute_capability="9.0",
            mig_mode="enabled" if spec.mig_enabled else "disabled",
            compute_mode=spec.compute_mode,
            # In MIG mode NVML answers NotSupported for device-level utilisation.
            utilization_ratio=whole.utilization_ratio if whole else None,
            memory_utilization_ratio=_ratio(whole_mem_util) if whole else None,
            memory_used_bytes=sum(leaf.memory_used_bytes or 0 for leaf in leaves),
            memory_total_bytes=sc.H200_MEMORY_BYTES,
            power_watts=power,
            power_limit_watts=limit,
            energy_joules=state.energy_joules,
            temperature_celsius=temp,
            memory_temperature_celsius=temp + 4.0,
            temperature_thresholds=H200_TEMPERATURE_THRESHOLDS,
            fan_speed_ratio=None,  # SXM boards are passively cooled: NVML says NotSupported.
            sm_clock_hertz=clock,
            memory_clock_hertz=sc.H200_MEMORY_CLOCK_HERTZ,
            sm_clock_max_hertz=sc.H200_SM_CLOCK_MAX_HERTZ,
            clock_events=MappingProxyType(events),
            pcie_tx_bytes_per_second=pcie.tx_bytes_per_second if pcie else None,
            pcie_rx_bytes_per_second=pcie.rx_bytes_per_second if pcie else None,
            pcie_link_generation=5,
            pcie_link_width=16,
            pcie_link_max_generation=5,
            pcie_link_max_width=16,
            pcie_replay_errors=0,
            # The NVML backend reads NVLink throughput from the whole GPU's GPM counters, which a
            # GPU in MIG mode does not sample.
            nvlink_tx_bytes_per_second=nvl.tx_bytes_per_second if nvl else None,
            nvlink_rx_bytes_per_second=nvl.rx_bytes_per_second if nvl else None,
            links=gpu_links,
            # NVML finds no NVLink on a GPU in MIG mode here, as for its throughput above.
            nvlink_errors=None if spec.mig_enabled else MappingProxyType(dict(state.nvlink_errors)),
            ecc_errors=MappingProxyType({"corrected": spec.ecc_corrected, "uncorrected": 0}),
            remapped_rows=MappingProxyType(
                {"correctable": spec.remapped_correctable, "uncorrectable": 0, "pending": 0, "failure": 0}
            ),
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
