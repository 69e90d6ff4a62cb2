"""One initialised NVML library: the error gate, the enumerated GPUs and their readers.

A session exists only between a successful ``nvmlInit`` and its end: ``close()`` (shutdown) or
a driver loss, after which the backend drops it and starts a new one with fresh handles. Nothing
in it is ever half-built: the constructor enumerates the GPUs or raises.

The only module that imports ``pynvml`` (nvidia-ml-py), lazily (:func:`load_binding`), so the
exporter runs without it; every other NVML module is handed the binding.
"""

from __future__ import annotations

import contextlib
import logging
from types import MappingProxyType
from typing import Any

from exporter.backends.nvml.functions import NvmlFunctions
from exporter.backends.nvml.gpm import GpmTracker
from exporter.backends.nvml.gpu import GpuReader, ReaderOptions
from exporter.backends.nvml.query import GpuLost, NeedsReinit, NvmlQuery
from exporter.backends.nvml.topology import NvLinkTopology
from exporter.backends.nvml.values import text
from exporter.model import BackendSample, GpuSample

_log = logging.getLogger(__name__)
_SYSTEM = "system"


def load_binding() -> Any:
    """The NVML binding module, ``pynvml`` (nvidia-ml-py, the optional extra "nvml"), imported on
    first use; ``ImportError`` where it is not installed."""
    import pynvml

    return pynvml


class NvmlSession:
    """The GPUs NVML answers for, read once per cycle by :meth:`sample`.

    ``nvml`` is the binding module and ``fns`` its functions, already initialised (``nvmlInit``
    succeeded). ``known_uuids`` (index -> UUID) and ``failed_once`` (UUIDs whose failure was
    logged) belong to the backend and outlive sessions: a GPU whose handle cannot be had keeps
    its UUID label, and a failing GPU logs its traceback once per process.
    Raises ``NeedsReinit`` or ``GpuLost`` when enumeration itself fails.
    """

    def __init__(
        self,
        nvml: Any,
        fns: NvmlFunctions,
        options: ReaderOptions,
        known_uuids: dict[int, str],
        failed_once: set[str],
    ) -> None:
        self._q = NvmlQuery(nvml, fns)
        self._options = options
        self._known_uuids = known_uuids
        self._failed_once = failed_once
        self._tracker = GpmTracker(self._q)
        self._topology = NvLinkTopology(self._q)
        self.driver_version = text(self._q.call(_SYSTEM, fns.nvmlSystemGetDriverVersion))
        self._gpus = self._enumerate()

    @property
    def gpu_count(self) -> int:
        """GPUs found at the last enumeration, readable or not."""
        return len(self._gpus)

    def sample(self, cycle: int) -> BackendSample:
        """Read every GPU once. Raises ``NeedsReinit`` when NVML lost its state."""
        q = self._q
        q.errors.clear()
        count = q.call(_SYSTEM, q.fns.nvmlDeviceGetCount)
        if count is not None and count != len(self._gpus):
            _log.info("GPU count changed from %d to %d; re-enumerating", len(self._gpus), count)
            self._tracker.forget()
            for gpu in self._gpus:
                if gpu is not None:
                    gpu.free()
            self._gpus = self._enumerate()
        samples = [self._sample_one(index, cycle) for index in range(len(self._gpus))]
        samples = self._topology.apply(samples, {g.uuid: g.handle for g in self._gpus if g is not None})
        self._tracker.retain(leaf.leaf_id for s in samples for leaf in s.leaves)
        return BackendSample(
            up=True,
            driver_version=self.driver_version,
            gpus=tuple(samples),
            errors=MappingProxyType(dict(q.errors)),
            gpm_supported=self._gpm_supported(),
        )

    def close(self) -> None:
        """Free GPM buffers and event sets, then shut NVML down."""
        self._tracker.forget()
        for gpu in self._gpus:
            if gpu is not None:
                with contextlib.suppress(GpuLost, NeedsReinit):
                    gpu.free()
        self._gpus = []
        shutdown = self._q.fns.nvmlShutdown.fn
        try:
            if shutdown is not None:
                shutdown()
        except Exception as exc:
            _log.debug("nvmlShutdown failed: %s", exc)

    def _sample_one(self, index: int, cycle: int) -> GpuSample:
        """One GPU's sample, or ``up=False`` when it is lost, has no handle, or reading it failed."""
        gpu = self._gpus[index]
        if gpu is None:
            gpu = self._gpus[index] = self._open_gpu(index)
        if gpu is None:
            return GpuSample(index=index, uuid=self._known_uuids.get(index, ""), up=False)
        try:
            return gpu.sample(cycle)
        except GpuLost:
            return GpuSample(index=index, uuid=gpu.uuid, up=False)
        except NeedsReinit:
            raise
        except Exception:
            # A bug or binding surprise on one GPU must not take the others down.
            if gpu.uuid not in self._failed_once:
                self._failed_once.add(gpu.uuid)
                _log.exception("reading GPU %s failed", gpu.uuid)
            self._q.count("exception")
            return GpuSample(index=index, uuid=gpu.uuid, up=False)

    def _enumerate(self) -> list[GpuReader | None]:
        count = self._q.call(_SYSTEM, self._q.fns.nvmlDeviceGetCount)
        return [self._open_gpu(index) for index in range(int(count or 0))]

    def _open_gpu(self, index: int) -> GpuReader | None:
        """Handle and static identity of one GPU; ``None`` when its handle cannot be had now."""
        q, f = self._q, self._q.fns
        scope = f"index:{index}"
        try:
            handle = q.call(scope, f.nvmlDeviceGetHandleByIndex, index)
            uuid = text(q.call(scope, f.nvmlDeviceGetUUID, handle)) if handle is not None else None
        except GpuLost:
            return None
        if handle is None or not uuid:
            return None
        self._known_uuids[index] = uuid
        gpu = GpuReader(q, index, handle, uuid, self._tracker, self._options)
        # If it is lost mid-way, it is sampled as lost and its identity re-read on the next cycle.
        with contextlib.suppress(GpuLost):
            gpu.read_identity()
        return gpu

    def _gpm_supported(self) -> bool | None:
        """Whether any GPU gives GPM windows; ``None`` when no GPU could be opened."""
        present = [g for g in self._gpus if g is not None]
        if not present:
            return None
        return any(g.gpm_supported for g in present)
