"""Device fields of one physical GPU: identity once, telemetry every cycle, slow fields staggered.

Identity (name, PCI bus id, compute capability, maximum SM clock, supported clock reasons, the
temperature thresholds) is read once per GPU; then three cadences, each chosen from what a field
is for and what it costs on an H200 (docs/gpu-validation.md#cost-of-one-sample-one-gpu):

- **every cycle**: what the busy time, the boundness class and the link counters integrate
  (utilisation, memory, GPM, links, processes: other readers) and the instant gauges a scrape
  shows (power, temperature, clocks, clock events);
- **slow, every ``slow_every`` cycles** (staggered by GPU index): fields that change with a
  configuration or an error, and whose consumers look at minutes: the MIG and compute modes, the
  enforced power limit, ECC, remapped rows, PCIe replays, the fan and the HBM temperature (and,
  read by ``links``, the PCIe width and the NVLink error counters). The MIG mode alone is
  one of the dearer calls (docs/benchmarks.md, "Real H200: gpulens vs nvitop-exporter"); a change
  shows up to ``slow_every`` cycles late;
- **energy, every ``energy_every`` cycles**: the total-energy counter (the dearest read) feeds
  ``rate()`` over windows longer than that, which it leaves unchanged.

To read a new NVML field: add the function to ``functions.py``, read it in
:meth:`DeviceFields.sample` next to the ``GpuSample`` field it fills, and teach the fake.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from exporter.backends.nvml.links import PcieState
from exporter.backends.nvml.query import NvmlQuery
from exporter.backends.nvml.values import MAX_POWER_WATTS, field_value, milli, percent, temperature, text
from exporter.model import NVLINK, PCIE, GpuFabric, GpuSample, LeafSample, LinkTraffic, NvLink

#: Clock event (throttle) reason bits, by the binding's constant name -> our reason label.
CLOCK_EVENT_REASONS: dict[str, str] = {
    "nvmlClocksEventReasonGpuIdle": "gpu_idle",
    "nvmlClocksEventReasonApplicationsClocksSetting": "applications_clocks_setting",
    "nvmlClocksEventReasonSwPowerCap": "sw_power_cap",
    "nvmlClocksEventReasonHwSlowdown": "hw_slowdown",
    "nvmlClocksEventReasonSyncBoost": "sync_boost",
    "nvmlClocksEventReasonSwThermalSlowdown": "sw_thermal_slowdown",
    "nvmlClocksEventReasonHwThermalSlowdown": "hw_thermal_slowdown",
    "nvmlClocksEventReasonHwPowerBrakeSlowdown": "hw_power_brake_slowdown",
    "nvmlClocksEventReasonDisplayClockSetting": "display_clock_setting",
}
_COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
#: The GPU's temperature limits we read, by our kind label (``model.TEMPERATURE_THRESHOLDS``) ->
#: the binding's threshold constant. The acoustic thresholds are fan targets, not limits: left out.
TEMPERATURE_THRESHOLDS: dict[str, str] = {
    "slowdown": "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN",
    "shutdown": "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN",
    "gpu_max": "NVML_TEMPERATURE_THRESHOLD_GPU_MAX",
    "memory_max": "NVML_TEMPERATURE_THRESHOLD_MEM_MAX",
}
_MHZ = 1e6


def _reason_bits(nvml: Any, supported_mask: int | None) -> tuple[tuple[str, int], ...]:
    """(label, bit) per clock event reason the binding defines and the GPU supports (all if unknown)."""
    bits = ((label, getattr(nvml, const, None)) for const, label in CLOCK_EVENT_REASONS.items())
    return tuple(
        (label, bit) for label, bit in bits if bit is not None and (supported_mask is None or supported_mask & bit)
    )


Memory = tuple[int | None, int | None, int | None]
"""(used, total, driver-reserved) bytes of a GPU or MIG device."""


def memory_info(q: NvmlQuery, scope: str, handle: Any) -> Memory:
    """(used, total, reserved) bytes; v2 (used excludes driver-reserved memory) when the driver
    has it, else v1 (reserved ``None``: v1's used includes it)."""
    fn = q.fns.nvmlDeviceGetMemoryInfo
    version = getattr(q.nvml, "nvmlMemory_v2", None)
    info = None
    if version is not None:
        info = q.call(scope, fn, handle, version, key="memory_info_v2")
    if info is None and (version is None or q.is_unsupported(scope, "memory_info_v2")):
        info = q.call(scope, fn, handle)
    if info is None:
        return None, None, None
    reserved = getattr(info, "reserved", None)
    return int(info.used), int(info.total), None if reserved is None else int(reserved)


@dataclass(frozen=True, slots=True)
class DeviceCore:
    """The device fields the leaves need too: busy ratios, memory and the MIG mode."""

    utilization_ratio: float | None
    memory_utilization_ratio: float | None
    memory: Memory
    mig_mode: str | None
    """``enabled`` / ``disabled``; ``None`` when the GPU has no MIG."""


@dataclass(frozen=True, slots=True)
class _SlowFields:
    """The slow fields as last read (see the module docstring)."""

    compute_mode: str | None
    power_limit_watts: float | None
    memory_temperature_celsius: float | None
    fan_speed_ratio: float | None
    pcie_replay_errors: int | None
    ecc_errors: Mapping[str, int] | None
    remapped_rows: Mapping[str, int] | None


class DeviceFields:
    """Reads the fields of one physical GPU that belong to the GPU itself (not to its leaves).

    Slow fields are read every ``slow_every`` cycles and total energy every ``energy_every``
    cycles, both staggered by GPU index so the GPUs of a node do not all pay in the same cycle; the
    cycles in between repeat the last value (see the module docstring).  Link traffic comes from
    ``links.LinkReader``.
    """

    def __init__(self, q: NvmlQuery, index: int, handle: Any, uuid: str, energy_every: int, slow_every: int) -> None:
        self._q = q
        self._index = index
        self._handle = handle
        self._uuid = uuid
        self._energy_every = energy_every
        self._slow_every = slow_every
        self._slow: _SlowFields | None = None
        self._mig_state: Any = None
        self._mig_read = False
        self._name: str | None = None
        self._pci_bus_id: str | None = None
        self._compute_capability: str | None = None
        self._sm_clock_max_hertz: float | None = None
        self._temperature_thresholds: Mapping[str, float] | None = None
        # (label, bit) of each clock event reason the binding defines, narrowed by read_identity
        # to those the GPU supports.
        self._clock_reasons = _reason_bits(q.nvml, None)
        self._energy_mj: float | None = None

    def read_identity(self) -> None:
        """Name, PCI bus id, compute capability, maximum SM clock, the supported clock reasons and
        the temperature thresholds."""
        q, f, h, u = self._q, self._q.fns, self._handle, self._uuid
        self._name = text(q.call(u, f.nvmlDeviceGetName, h))
        pci = q.call(u, f.nvmlDeviceGetPciInfo, h)
        if pci is not None:
            self._pci_bus_id = text(getattr(pci, "busId", None))
        cc = q.call(u, f.nvmlDeviceGetCudaComputeCapability, h)
        if cc is not None:
            self._compute_capability = f"{cc[0]}.{cc[1]}"
        max_sm = q.call(u, f.nvmlDeviceGetMaxClockInfo, h, q.nvml.NVML_CLOCK_SM)
        self._sm_clock_max_hertz = max_sm * _MHZ if max_sm else None
        mask = q.call(u, f.nvmlDeviceGetSupportedClocksEventReasons, h)
        if mask is None:
            mask = q.call(u, f.nvmlDeviceGetSupportedClocksThrottleReasons, h)
        self._clock_reasons = _reason_bits(q.nvml, mask)
        self._temperature_thresholds = self._read_temperature_thresholds()

    def _read_temperature_thresholds(self) -> Mapping[str, float] | None:
        """The GPU's temperature limits (°C) by kind; each kind NVML does not answer is left out
        and, NotSupported, never asked again."""
        q, f, h, u, nvml = self._q, self._q.fns, self._handle, self._uuid, self._q.nvml
        limits: dict[str, float] = {}
        for kind, const in TEMPERATURE_THRESHOLDS.items():
            threshold = getattr(nvml, const, None)
            if threshold is None:
                continue
            raw = q.call(u, f.nvmlDeviceGetTemperatureThreshold, h, threshold, key="temperature_threshold_" + kind)
            celsius = temperature(q, raw)
            if celsius is not None:
                limits[kind] = celsius
        return MappingProxyType(limits) if limits else None

    def _due(self, cycle: int, every: int) -> bool:
        return (cycle - self._index) % every == 0

    def core(self, cycle: int) -> DeviceCore:
        """Utilisation, memory and MIG mode (a slow field), read before the leaves that reuse them."""
        q, f, h, u = self._q, self._q.fns, self._handle, self._uuid
        util = q.call(u, f.nvmlDeviceGetUtilizationRates, h)
        if not self._mig_read or self._due(cycle, self._slow_every):
            self._mig_state = q.call(u, f.nvmlDeviceGetMigMode, h)
            self._mig_read = True
        mig_state = self._mig_state
        return DeviceCore(
            utilization_ratio=percent(q, util.gpu) if util is not None else None,
            memory_utilization_ratio=percent(q, util.memory) if util is not None else None,
            memory=memory_info(q, u, h),
            mig_mode=None if mig_state is None else ("enabled" if mig_state[0] else "disabled"),
        )

    def sample(
        self,
        cycle: int,
        core: DeviceCore,
        leaves: tuple[LeafSample, ...],
        links: tuple[LinkTraffic, ...],
        pcie: PcieState,
        nvlink_errors: Mapping[str, int] | None,
        xid_events: tuple[int, ...],
        fabric: GpuFabric | None = None,
        nvlinks: tuple[NvLink, ...] = (),
    ) -> GpuSample:
        """The GPU's sample: ``core`` and the other readers' parts (the links' traffic, state and
        NVLink errors, the NVLink fabric registration, each NVLink's state) plus every remaining
        device field."""
        q, f, h, u, nvml = self._q, self._q.fns, self._handle, self._uuid, self._q.nvml
        if self._energy_mj is None or self._due(cycle, self._energy_every):
            self._energy_mj = q.call(u, f.nvmlDeviceGetTotalEnergyConsumption, h)
        if self._slow is None or self._due(cycle, self._slow_every):
            self._slow = self._read_slow()
        slow = self._slow
        by_name = {link.link: link for link in links}
        pcie_link, nvlink = by_name.get(PCIE), by_name.get(NVLINK)
        sm_clock = q.call(u, f.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM, key="clock_sm")
        mem_clock = q.call(u, f.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM, key="clock_mem")
        return GpuSample(
            index=self._index,
            uuid=u,
            name=self._name,
            pci_bus_id=self._pci_bus_id,
            compute_capability=self._compute_capability,
            mig_mode=core.mig_mode,
            compute_mode=slow.compute_mode,
            utilization_ratio=core.utilization_ratio,
            memory_utilization_ratio=core.memory_utilization_ratio,
            memory_used_bytes=core.memory[0],
            memory_total_bytes=core.memory[1],
            power_watts=milli(q, q.call(u, f.nvmlDeviceGetPowerUsage, h), MAX_POWER_WATTS),
            power_limit_watts=slow.power_limit_watts,
            energy_joules=self._energy_mj / 1000.0 if self._energy_mj is not None else None,
            temperature_celsius=temperature(q, q.call(u, f.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)),
            memory_temperature_celsius=slow.memory_temperature_celsius,
            temperature_thresholds=self._temperature_thresholds,
            fan_speed_ratio=slow.fan_speed_ratio,
            sm_clock_hertz=sm_clock * _MHZ if sm_clock is not None else None,
            memory_clock_hertz=mem_clock * _MHZ if mem_clock is not None else None,
            sm_clock_max_hertz=self._sm_clock_max_hertz,
            clock_events=self._clock_events(),
            pcie_tx_bytes_per_second=pcie_link.tx_bytes_per_second if pcie_link else None,
            pcie_rx_bytes_per_second=pcie_link.rx_bytes_per_second if pcie_link else None,
            pcie_link_generation=pcie.generation,
            pcie_link_width=pcie.width,
            pcie_link_max_generation=pcie.max_generation,
            pcie_link_max_width=pcie.max_width,
            pcie_replay_errors=slow.pcie_replay_errors,
            nvlink_tx_bytes_per_second=nvlink.tx_bytes_per_second if nvlink else None,
            nvlink_rx_bytes_per_second=nvlink.rx_bytes_per_second if nvlink else None,
            links=links,
            nvlinks=nvlinks,
            nvlink_errors=nvlink_errors,
            ecc_errors=slow.ecc_errors,
            remapped_rows=slow.remapped_rows,
            xid_events=xid_events,
            fabric=fabric,
            leaves=leaves,
        )

    def _read_slow(self) -> _SlowFields:
        q, f, h, u = self._q, self._q.fns, self._handle, self._uuid
        compute_mode = q.call(u, f.nvmlDeviceGetComputeMode, h)
        return _SlowFields(
            compute_mode=_COMPUTE_MODES.get(compute_mode) if compute_mode is not None else None,
            power_limit_watts=milli(q, q.call(u, f.nvmlDeviceGetEnforcedPowerLimit, h), MAX_POWER_WATTS),
            memory_temperature_celsius=self._memory_temperature(),
            fan_speed_ratio=percent(q, q.call(u, f.nvmlDeviceGetFanSpeed, h)),
            pcie_replay_errors=q.call(u, f.nvmlDeviceGetPcieReplayCounter, h),
            ecc_errors=self._ecc(),
            remapped_rows=self._remapped_rows(),
        )

    def _memory_temperature(self) -> float | None:
        """HBM temperature (°C) from the field-values API; a per-field NotSupported is remembered."""
        q, nvml = self._q, self._q.nvml
        field_id = getattr(nvml, "NVML_FI_DEV_MEMORY_TEMP", None)
        if field_id is None:
            return None
        values = q.call(self._uuid, q.fns.nvmlDeviceGetFieldValues, self._handle, [field_id], key="memory_temp")
        if not values:
            return None
        entry = values[0]
        code = entry.nvmlReturn
        if code != nvml.NVML_SUCCESS:
            if code == nvml.NVML_ERROR_NOT_SUPPORTED:
                q.unsupported.add((self._uuid, "memory_temp"))
            else:
                q.count(q.code(nvml.NVMLError(code)).lower())
            return None
        return temperature(q, field_value(nvml, entry))

    def _clock_events(self) -> Mapping[str, bool] | None:
        """Active clock event reasons among those the GPU supports; the pre-12.x name as fallback."""
        q, f = self._q, self._q.fns
        active = q.call(self._uuid, f.nvmlDeviceGetCurrentClocksEventReasons, self._handle)
        if active is None and q.is_unsupported(self._uuid, f.nvmlDeviceGetCurrentClocksEventReasons.name):
            active = q.call(self._uuid, f.nvmlDeviceGetCurrentClocksThrottleReasons, self._handle)
        if active is None:
            return None
        return MappingProxyType({label: bool(active & bit) for label, bit in self._clock_reasons})

    def _ecc(self) -> Mapping[str, int] | None:
        """Volatile ECC error counts by severity; ``None`` when neither count is available."""
        q, nvml = self._q, self._q.nvml
        counts = {}
        for severity, error_type in (
            ("corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            value = q.call(
                self._uuid,
                q.fns.nvmlDeviceGetTotalEccErrors,
                self._handle,
                error_type,
                nvml.NVML_VOLATILE_ECC,
                key="ecc_" + severity,
            )
            if value is not None:
                counts[severity] = int(value)
        return MappingProxyType(counts) if counts else None

    def _remapped_rows(self) -> Mapping[str, int] | None:
        """Remapped rows by cause, plus the pending and failure flags as 0/1."""
        rows = self._q.call(self._uuid, self._q.fns.nvmlDeviceGetRemappedRows, self._handle)
        if rows is None:
            return None
        correctable, uncorrectable, pending, failure = rows
        return MappingProxyType(
            {
                "correctable": int(correctable),
                "uncorrectable": int(uncorrectable),
                "pending": int(bool(pending)),
                "failure": int(bool(failure)),
            }
        )
