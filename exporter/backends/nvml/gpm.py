"""GPM (Hopper+ GPU performance metrics) windows: two NVML samples per leaf -> ratios 0..1.

Each leaf (whole GPU or MIG instance) keeps the buffer of the previous cycle; the window is the
time between two ``sample()`` calls, i.e. the sampler's interval.

Graphics-engine activity (the busy fraction) is asked separately, and only for a window in which
kernels ran: on an H200 (driver 580) ``nvmlGpmMetricsGet`` takes orders of magnitude more CPU for
``GRAPHICS_UTIL`` than for each other metric (``bench/gpm_cost.py``; docs/benchmarks.md, "Real
H200: gpulens vs nvitop-exporter"), so asking it every second was half of the exporter's CPU on an
idle GPU. A window with SM activity exactly 0 and no
GPU-Util ran no kernel, and its graphics activity is 0: in the recorded H200 traces
(``tests/fixtures/gpm_traces/``) the 146 samples with SM activity 0 read at most 0.0017, and at
most 0.00007 where GPU-Util was 0 too (copy-engine work; the link utilisation counts it).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from exporter.backends.nvml.query import ANY_SCOPE, NvmlQuery
from exporter.model import GpmSample

#: GpmSample field -> NVML metric constant name (NVML returns each in percent).
RATIO_METRICS: dict[str, str] = {
    "sm_active": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_active": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "fp64_active": "NVML_GPM_METRIC_FP64_UTIL",
    "fp32_active": "NVML_GPM_METRIC_FP32_UTIL",
    "fp16_active": "NVML_GPM_METRIC_FP16_UTIL",
    "dram_active": "NVML_GPM_METRIC_DRAM_BW_UTIL",
    "graphics_active": "NVML_GPM_METRIC_GRAPHICS_UTIL",
}
#: NVLink totals (MiB/s), asked only on physical GPUs that have NVLink.
NVLINK_METRICS: dict[str, str] = {
    "nvlink_rx": "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC",
    "nvlink_tx": "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC",
}
#: PCIe totals (MiB/s, TLP headers included), asked on whole GPUs and on MIG GPU instances.
PCIE_METRICS: dict[str, str] = {
    "pcie_tx": "NVML_GPM_METRIC_PCIE_TX_PER_SEC",
    "pcie_rx": "NVML_GPM_METRIC_PCIE_RX_PER_SEC",
}
BUSY_FIELD = "graphics_active"
"""The ratio metric asked only for windows in which kernels ran (see the module docstring)."""
_MIB = 1024 * 1024
#: Percent values this far outside 0..100 are rounding noise and clamped; further out is absurd.
_PERCENT_SLACK = 0.5


def _metric_ids(nvml: Any, metrics: dict[str, str]) -> dict[str, int]:
    """GpmSample field -> NVML metric id, for the metrics the binding ``nvml`` defines."""
    ids = {field: getattr(nvml, const, None) for field, const in metrics.items()}
    return {field: i for field, i in ids.items() if isinstance(i, int)}


@dataclass
class _Window:
    previous: Any  # nvmlGpmSample_t holding the last cycle's counters
    spare: Any  # second buffer, filled this cycle, then swapped
    previous_at: float | None = None
    dropped: frozenset[str] = frozenset()
    """Link metrics NVML answered NotSupported for on this leaf: not asked again."""


@dataclass(frozen=True)
class GpmReading:
    """One GPM window: ratios for the leaf and NVLink throughput (bytes/s) for the GPU."""

    sample: GpmSample
    nvlink_rx_bytes_per_second: float | None = None
    nvlink_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    pcie_tx_bytes_per_second: float | None = None


class GpmTracker:
    """Holds two GPM sample buffers per leaf and turns consecutive samples into ratios.

    One per session, shared by its GPUs: ``retain`` frees the buffers of every leaf that is gone.
    """

    def __init__(self, query: NvmlQuery) -> None:
        self._q = query
        self._windows: dict[str, _Window] = {}
        nvml = query.nvml
        # Metric ids the binding defines (an older one may lack some), resolved once.
        ratio_ids = _metric_ids(nvml, RATIO_METRICS)
        busy_id = ratio_ids.pop(BUSY_FIELD, None)
        self._busy_ids = {BUSY_FIELD: busy_id} if busy_id is not None else {}
        self._ratio_ids = {**ratio_ids, **_metric_ids(nvml, PCIE_METRICS)}
        self._all_ids = {**self._ratio_ids, **_metric_ids(nvml, NVLINK_METRICS)}
        self._request_type = nvml.c_nvmlGpmMetricsGet_t
        self._request_version = nvml.NVML_GPM_METRICS_GET_VERSION
        self._success = nvml.NVML_SUCCESS
        self._not_supported = nvml.NVML_ERROR_NOT_SUPPORTED

    def read(
        self,
        scope: str,
        leaf_id: str,
        fetch: Callable[[Any], bool],
        now: float,
        nvlink: bool = False,
        utilization_ratio: float | None = None,
    ) -> GpmReading | None:
        """Fill a new buffer with ``fetch(buffer)`` (False = failed) and compare with the last one.

        ``utilization_ratio`` is NVML GPU-Util for the same cycle (``None`` for a MIG instance):
        with SM activity, it tells whether kernels ran, so whether graphics activity is asked.
        Returns ``None`` on the first call for a leaf, or when a sample or the metrics call failed
        (the next window then starts afresh).
        """
        window = self._windows.get(leaf_id)
        if window is None:
            alloc = self._q.fns.nvmlGpmSampleAlloc
            first = self._q.call(scope, alloc, key="gpm")
            second = self._q.call(scope, alloc, key="gpm") if first is not None else None
            if second is None:
                self._free(first)
                return None
            window = _Window(previous=first, spare=second)
            self._windows[leaf_id] = window
        if not fetch(window.spare):
            window.previous_at = None
            return None
        reading = None
        if window.previous_at is not None and now > window.previous_at:
            reading = self._metrics(scope, window, now - window.previous_at, nvlink, utilization_ratio)
        window.previous, window.spare = window.spare, window.previous
        window.previous_at = now
        return reading

    def _metrics(
        self, scope: str, window: _Window, seconds: float, nvlink: bool, utilization_ratio: float | None
    ) -> GpmReading | None:
        ids = self._all_ids if nvlink else self._ratio_ids
        values = self._ask(scope, window, ids)
        if values is None:
            return None
        if self._busy_ids:
            sm = values.get("sm_active")
            if sm is None or sm > 0.0 or (utilization_ratio is not None and utilization_ratio > 0.0):
                busy = self._ask(scope, window, self._busy_ids)
                values[BUSY_FIELD] = None if busy is None else busy.get(BUSY_FIELD)
            else:
                values[BUSY_FIELD] = 0.0  # no kernel ran in the window (module docstring)
        ratios = {f: values.get(f) for f in RATIO_METRICS}
        if all(v is None for v in ratios.values()):
            return None
        sample = GpmSample(window_seconds=seconds, **ratios)
        return GpmReading(
            sample=sample,
            nvlink_rx_bytes_per_second=values.get("nvlink_rx"),
            nvlink_tx_bytes_per_second=values.get("nvlink_tx"),
            pcie_rx_bytes_per_second=values.get("pcie_rx"),
            pcie_tx_bytes_per_second=values.get("pcie_tx"),
        )

    def _ask(self, scope: str, window: _Window, ids: dict[str, int]) -> dict[str, float | None] | None:
        """The metrics ``ids`` over ``window``'s two samples, by field (``None`` where NVML gave none);
        ``None`` when the call failed."""
        if window.dropped:
            ids = {f: i for f, i in ids.items() if f not in window.dropped}
        request = self._request_type()
        request.version = self._request_version
        request.numMetrics = len(ids)
        request.sample1 = window.previous
        request.sample2 = window.spare
        for slot, metric_id in enumerate(ids.values()):
            request.metrics[slot].metricId = metric_id
        if self._q.call(scope, self._q.fns.nvmlGpmMetricsGet, request, key="gpm_metrics") is None:
            return None
        values: dict[str, float | None] = {}
        for slot, field in enumerate(ids):
            metric = request.metrics[slot]
            if metric.nvmlReturn != self._success:
                values[field] = None
                if metric.nvmlReturn == self._not_supported and field not in RATIO_METRICS:
                    window.dropped = window.dropped | {field}  # e.g. PCIe on a MIG instance
                continue
            raw = float(metric.value)
            values[field] = self._ratio(raw) if field in RATIO_METRICS else self._bytes_per_second(raw)
        return values

    def _ratio(self, percent: float) -> float | None:
        if math.isnan(percent) or not -_PERCENT_SLACK <= percent <= 100.0 + _PERCENT_SLACK:
            self._q.count("out_of_range")
            return None
        return min(max(percent / 100.0, 0.0), 1.0)

    def _bytes_per_second(self, mib_per_second: float) -> float | None:
        if math.isnan(mib_per_second) or mib_per_second < 0:
            self._q.count("out_of_range")
            return None
        return mib_per_second * _MIB

    def retain(self, leaf_ids: Iterable[str]) -> None:
        """Free the buffers of leaves that no longer exist (MIG reconfigured, GPU gone)."""
        keep = set(leaf_ids)
        for leaf_id in [k for k in self._windows if k not in keep]:
            window = self._windows.pop(leaf_id)
            self._free(window.previous)
            self._free(window.spare)

    def forget(self) -> None:
        """Free every buffer (GPUs re-enumerated, session closing)."""
        self.retain(())

    def _free(self, buffer: Any) -> None:
        if buffer is None:
            return
        with contextlib.suppress(Exception):  # a failing free must not break close()
            self._q.call(ANY_SCOPE, self._q.fns.nvmlGpmSampleFree, buffer, key="gpm_free")


class GpmReader:
    """GPM windows of one physical GPU and of its MIG instances, kept in the session's tracker."""

    def __init__(self, q: NvmlQuery, tracker: GpmTracker, handle: Any, uuid: str, enabled: bool = True) -> None:
        self._q = q
        self._tracker = tracker
        self._handle = handle
        self._uuid = uuid
        self._enabled = enabled
        """False with ``--no-collect.gpm``: GPM is never asked, as on a GPU without it."""
        self._capable = False
        self._has_nvlink = False

    def probe(self) -> None:
        """Ask once whether the GPU has GPM (Hopper and later; not asked when GPM is switched off)
        and NVLink (for NVLink throughput)."""
        q, f = self._q, self._q.fns
        if self._enabled:
            support = q.call(self._uuid, f.nvmlGpmQueryDeviceSupport, self._handle)
            self._capable = bool(support is not None and getattr(support, "isSupportedDevice", 0))
        self._has_nvlink = q.call(self._uuid, f.nvmlDeviceGetNvLinkState, self._handle, 0) is not None

    @property
    def supported(self) -> bool:
        """True while the GPU has GPM and NVML has not refused GPM samples on it."""
        return self._capable and not self._q.is_unsupported(self._uuid, "gpm")

    def read(
        self, leaf_id: str, gpu_instance_id: int | None, now: float, utilization_ratio: float | None = None
    ) -> GpmReading | None:
        """The window ending ``now`` for the whole GPU (``gpu_instance_id=None``, with its NVML
        GPU-Util of this cycle) or one MIG instance."""
        q, u, h = self._q, self._uuid, self._handle
        if not self.supported:
            return None
        if gpu_instance_id is None:
            sample_get = q.fns.nvmlGpmSampleGet

            def fetch(buffer: Any) -> bool:
                return q.call(u, sample_get, h, buffer, key="gpm") is not None

        else:
            if q.is_unsupported(u, "gpm_mig"):
                return None
            mig_sample_get = q.fns.nvmlGpmMigSampleGet

            def fetch(buffer: Any) -> bool:
                return q.call(u, mig_sample_get, h, gpu_instance_id, buffer, key="gpm_mig") is not None

        nvlink = self._has_nvlink and gpu_instance_id is None
        return self._tracker.read(u, leaf_id, fetch, now, nvlink=nvlink, utilization_ratio=utilization_ratio)
