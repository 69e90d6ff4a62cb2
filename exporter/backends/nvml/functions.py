"""Every NVML binding function the backend calls, named once and looked up once per session.

Readers name a function as an attribute (``fns.nvmlDeviceGetName``), never as a string, so a
misspelled name is an ``AttributeError`` at its first run and a mypy error before that.
``tests/test_nvml_binding.py`` checks every field name here against nvidia-ml-py's ``pynvml``
and against the test fake. A function that an older binding lacks resolves to ``fn=None``; the
query gate then treats it as unsupported on every device, as it would a driver that answers
FunctionNotFound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True, slots=True)
class NvmlFunction:
    """One binding function: its NVML name and the callable, ``None`` when the binding lacks it."""

    name: str
    fn: Callable[..., Any] | None


@dataclass(frozen=True, slots=True)
class NvmlFunctions:
    """The backend's NVML functions, one field each, named exactly as in ``pynvml``."""

    # library and system
    nvmlInit: NvmlFunction
    nvmlShutdown: NvmlFunction
    nvmlSystemGetDriverVersion: NvmlFunction
    nvmlSystemGetProcessName: NvmlFunction
    nvmlDeviceGetCount: NvmlFunction
    nvmlDeviceGetHandleByIndex: NvmlFunction
    # identity, read once per GPU
    nvmlDeviceGetUUID: NvmlFunction
    nvmlDeviceGetName: NvmlFunction
    nvmlDeviceGetPciInfo: NvmlFunction
    nvmlDeviceGetCudaComputeCapability: NvmlFunction
    nvmlDeviceGetMaxClockInfo: NvmlFunction
    nvmlDeviceGetSupportedClocksEventReasons: NvmlFunction
    nvmlDeviceGetSupportedClocksThrottleReasons: NvmlFunction
    nvmlDeviceGetNvLinkState: NvmlFunction
    nvmlDeviceGetNvLinkRemoteDeviceType: NvmlFunction
    nvmlDeviceGetNvLinkRemotePciInfo: NvmlFunction
    nvmlDeviceGetP2PStatus: NvmlFunction
    nvmlDeviceGetMaxPcieLinkGeneration: NvmlFunction
    nvmlDeviceGetMaxPcieLinkWidth: NvmlFunction
    nvmlDeviceGetTemperatureThreshold: NvmlFunction
    # device fields, read every cycle
    nvmlDeviceGetUtilizationRates: NvmlFunction
    nvmlDeviceGetMemoryInfo: NvmlFunction
    nvmlDeviceGetMigMode: NvmlFunction
    nvmlDeviceGetComputeMode: NvmlFunction
    nvmlDeviceGetPowerUsage: NvmlFunction
    nvmlDeviceGetEnforcedPowerLimit: NvmlFunction
    nvmlDeviceGetTotalEnergyConsumption: NvmlFunction
    nvmlDeviceGetTemperature: NvmlFunction
    nvmlDeviceGetFieldValues: NvmlFunction
    nvmlDeviceGetFanSpeed: NvmlFunction
    nvmlDeviceGetClockInfo: NvmlFunction
    nvmlDeviceGetCurrentClocksEventReasons: NvmlFunction
    nvmlDeviceGetCurrentClocksThrottleReasons: NvmlFunction
    nvmlDeviceGetPcieThroughput: NvmlFunction
    nvmlDeviceGetCurrPcieLinkGeneration: NvmlFunction
    nvmlDeviceGetCurrPcieLinkWidth: NvmlFunction
    nvmlDeviceGetPcieSpeed: NvmlFunction
    nvmlDeviceGetPcieReplayCounter: NvmlFunction
    nvmlDeviceGetTotalEccErrors: NvmlFunction
    nvmlDeviceGetRemappedRows: NvmlFunction
    # NVLink fabric registration, read every slow cycle (fabric.py)
    nvmlDeviceGetGpuFabricInfoV: NvmlFunction
    nvmlDeviceGetGpuFabricInfo: NvmlFunction
    # Xid events
    nvmlDeviceGetSupportedEventTypes: NvmlFunction
    nvmlEventSetCreate: NvmlFunction
    nvmlDeviceRegisterEvents: NvmlFunction
    nvmlEventSetWait: NvmlFunction
    nvmlEventSetFree: NvmlFunction
    # MIG
    nvmlDeviceGetMaxMigDeviceCount: NvmlFunction
    nvmlDeviceGetMigDeviceHandleByIndex: NvmlFunction
    nvmlDeviceGetGpuInstanceId: NvmlFunction
    nvmlDeviceGetComputeInstanceId: NvmlFunction
    nvmlDeviceGetGpuInstanceById: NvmlFunction
    nvmlGpuInstanceGetInfo: NvmlFunction
    nvmlDeviceGetGpuInstanceProfileInfoById: NvmlFunction
    # processes
    nvmlDeviceGetComputeRunningProcesses: NvmlFunction
    nvmlDeviceGetMPSComputeRunningProcesses: NvmlFunction
    nvmlDeviceGetProcessUtilization: NvmlFunction
    # GPM
    nvmlGpmQueryDeviceSupport: NvmlFunction
    nvmlGpmSampleAlloc: NvmlFunction
    nvmlGpmSampleFree: NvmlFunction
    nvmlGpmSampleGet: NvmlFunction
    nvmlGpmMigSampleGet: NvmlFunction
    nvmlGpmMetricsGet: NvmlFunction

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every function name the backend may call."""
        return tuple(field.name for field in fields(cls))

    @classmethod
    def resolve(cls, nvml: Any) -> NvmlFunctions:
        """Look every function up in the binding module ``nvml`` (``None`` where it has none)."""
        return cls(**{name: NvmlFunction(name, getattr(nvml, name, None)) for name in cls.names()})

    def missing(self) -> tuple[str, ...]:
        """Names the binding lacks (an nvidia-ml-py older than the functions we use)."""
        return tuple(name for name in self.names() if getattr(self, name).fn is None)
