"""GPM (Hopper+ GPU performance metrics) windows: two NVML samples per leaf -> ratios 0..1.

Each leaf (whole GPU or MIG instance) keeps the buffer of the previous cycle; the window is the
time between two ``sample()`` calls, i.e. the sampler's interval.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from exporter.backends.nvml_query import NvmlQuery
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
_MIB = 1024 * 1024
#: Percent values this far outside 0..100 are rounding noise and clamped; further out is absurd.
_PERCENT_SLACK = 0.5


@dataclass
class _Window:
    previous: Any  # nvmlGpmSample_t holding the last cycle's counters
    spare: Any  # second buffer, filled this cycle, then swapped
    previous_at: float | None = None


@dataclass(frozen=True)
class GpmReading:
    """One GPM window: ratios for the leaf and NVLink throughput (bytes/s) for the GPU."""

    sample: GpmSample
    nvlink_rx_bytes_per_second: float | None = None
    nvlink_tx_bytes_per_second: float | None = None


class GpmTracker:
    """Holds two GPM sample buffers per leaf and turns consecutive samples into ratios."""

    def __init__(self, nvml: Any, query: NvmlQuery) -> None:
        self._nvml = nvml
        self._q = query
        self._windows: dict[str, _Window] = {}

    def read(
        self,
        scope: str,
        leaf_id: str,
        fetch: Callable[[Any], bool],
        now: float,
        nvlink: bool = False,
    ) -> GpmReading | None:
        """Fill a new buffer with ``fetch(buffer)`` (False = failed) and compare with the last one.

        Returns ``None`` on the first call for a leaf, or when a sample or the metrics call failed
        (the next window then starts afresh).
        """
        window = self._windows.get(leaf_id)
        if window is None:
            first = self._q.call(scope, "nvmlGpmSampleAlloc", key="gpm")
            second = self._q.call(scope, "nvmlGpmSampleAlloc", key="gpm") if first is not None else None
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
            reading = self._metrics(scope, window.previous, window.spare, now - window.previous_at, nvlink)
        window.previous, window.spare = window.spare, window.previous
        window.previous_at = now
        return reading

    def _metrics(self, scope: str, first: Any, second: Any, seconds: float, nvlink: bool) -> GpmReading | None:
        nvml = self._nvml
        wanted = dict(RATIO_METRICS)
        if nvlink:
            wanted.update(NVLINK_METRICS)
        ids = {field: getattr(nvml, const, None) for field, const in wanted.items()}
        ids = {f: i for f, i in ids.items() if isinstance(i, int)}
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(ids)
        request.sample1 = first
        request.sample2 = second
        for slot, metric_id in enumerate(ids.values()):
            request.metrics[slot].metricId = metric_id
        if self._q.call(scope, "nvmlGpmMetricsGet", request, key="gpm_metrics") is None:
            return None
        values: dict[str, float | None] = {}
        for slot, field in enumerate(ids):
            metric = request.metrics[slot]
            if metric.nvmlReturn != nvml.NVML_SUCCESS:
                values[field] = None
                continue
            raw = float(metric.value)
            values[field] = self._ratio(raw) if field in RATIO_METRICS else self._bytes_per_second(raw)
        ratios = {f: values.get(f) for f in RATIO_METRICS}
        if all(v is None for v in ratios.values()):
            return None
        sample = GpmSample(window_seconds=seconds, **ratios)
        return GpmReading(
            sample=sample,
            nvlink_rx_bytes_per_second=values.get("nvlink_rx"),
            nvlink_tx_bytes_per_second=values.get("nvlink_tx"),
        )

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

    def forget(self, free: bool = True) -> None:
        """Drop every buffer; ``free=False`` after NVML lost its state (the pointers are stale)."""
        if free:
            self.retain(())
        self._windows.clear()

    def _free(self, buffer: Any) -> None:
        if buffer is None:
            return
        with contextlib.suppress(Exception):  # a failing free must not break close()
            self._q.call("*", "nvmlGpmSampleFree", buffer, key="gpm_free")
