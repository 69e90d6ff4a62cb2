"""NVLink fabric registration of one physical GPU: its cluster UUID, clique ID, state and status.

``nvmlDeviceGetGpuFabricInfoV`` (nvidia-ml-py's ``c_nvmlGpuFabricInfo_v2_t``; driver R550 and
later) fills a struct with the fabric's cluster UUID (16 bytes), the clique the GPU belongs to,
the registration state (``NVML_GPU_FABRIC_STATE_*``) and status (an NVML return code, meaningful
once the state is ``completed``). GPUs with one cluster UUID and clique ID reach each other over
NVLink: a GB200 NVL72 rack, the domain of a ComputeDomain of NVIDIA's DRA driver.

A GPU outside any NVLink fabric has no fabric (``None``) and is not asked again, whichever way
NVML says so: an H200 on driver 580 answers SUCCESS with the state NOT_SUPPORTED (an all-zero
UUID, clique 0: tests/fixtures/nvml_fabric/h200.json), other GPUs or drivers may raise NotSupported (the query
gate, exporter/backends/nvml/query.py, remembers that). A binding or driver without the versioned
call (FunctionNotFound) falls back to the older ``nvmlDeviceGetGpuFabricInfo``
(``c_nvmlGpuFabricInfo_t``), but only where the binding lays that struct out as the driver does:
nvidia-ml-py 13.610 declares its cluster UUID 80 bytes long, which shifts every later field.

Registration completes some time after boot, so the state is read again every ``every`` cycles
(the backend's ``slow_every``, staggered by GPU index) and held in between; a read that fails
transiently is counted by the gate, leaves ``None`` for that cycle and is retried at the next one.
"""

from __future__ import annotations

import ctypes
import logging
import uuid
from typing import Any

from exporter.backends.nvml.functions import NvmlFunction
from exporter.backends.nvml.query import ANY_SCOPE, NvmlQuery
from exporter.model import GpuFabric

_log = logging.getLogger(__name__)

#: The binding's registration state constants -> our state label (``model.FABRIC_STATES``, in
#: NVML's order).
FABRIC_STATE_CONSTANTS: dict[str, str] = {
    "NVML_GPU_FABRIC_STATE_NOT_SUPPORTED": "not_supported",
    "NVML_GPU_FABRIC_STATE_NOT_STARTED": "not_started",
    "NVML_GPU_FABRIC_STATE_IN_PROGRESS": "in_progress",
    "NVML_GPU_FABRIC_STATE_COMPLETED": "completed",
}
_NO_FABRIC = "not_supported"
"""The state of a GPU outside any NVLink fabric: exported as no fabric at all."""
_UUID_BYTES = 16
_OUT_OF_RANGE = "out_of_range"
_NO_ANSWER = object()
"""What a call returns when NVML filled no struct (an error, or NotSupported)."""


def cluster_uuid_text(raw: Any) -> str | None:
    """The 16 bytes of ``clusterUuid`` (a ctypes ``c_uint8`` array, bytes or ints) as lower-case
    ``8-4-4-4-12`` hex text; ``None`` when it is not 16 bytes."""
    try:
        return str(uuid.UUID(bytes=bytes(raw)))
    except (TypeError, ValueError):
        return None


def _laid_out_right(struct: type) -> bool:
    """Whether the binding's fabric info struct holds the 16-byte cluster UUID NVML writes."""
    return getattr(getattr(struct, "clusterUuid", None), "size", None) == _UUID_BYTES


class FabricReader:
    """Reads one GPU's fabric registration every ``every`` cycles, staggered by ``index``.

    ``read(cycle)`` returns the :class:`GpuFabric` as last read, or ``None`` where the GPU has no
    fabric (NVML says NOT_SUPPORTED, or the binding lacks the calls) or the last read failed.
    """

    def __init__(self, q: NvmlQuery, index: int, handle: Any, uuid: str, every: int) -> None:
        self._q = q
        self._index = index
        self._handle = handle
        self._uuid = uuid
        self._every = max(1, every)
        self._states = {
            value: label
            for const, label in FABRIC_STATE_CONSTANTS.items()
            if isinstance(value := getattr(q.nvml, const, None), int)
        }
        self._fabric: GpuFabric | None = None
        self._read_once = False
        self._failed = False
        self._none = False
        """True once NVML said the GPU has no fabric: never asked again (a driver reload, which
        starts a new session and reader, is what could change that)."""

    def read(self, cycle: int) -> GpuFabric | None:
        """The fabric as of this cycle: read when due (the first cycle, the staggered slow cycles,
        the cycle after a failed read), else the last reading."""
        if self._none:
            return None
        if not self._read_once or self._failed or (cycle - self._index) % self._every == 0:
            self._read_once = True
            self._fabric = self._read()
        return self._fabric

    def _read(self) -> GpuFabric | None:
        info = self._info()
        if info is None:
            return None
        state = self._states.get(int(info.state))
        if state == _NO_FABRIC:
            self._none = True
            return None
        cluster = cluster_uuid_text(info.clusterUuid)
        if state is None or cluster is None:
            self._q.count(_OUT_OF_RANGE)  # a state this code does not know
            return None
        return GpuFabric(state=state, cluster_uuid=cluster, clique_id=int(info.cliqueId), status=self._status(info))

    def _info(self) -> Any:
        """The filled fabric info struct, or ``None`` where NVML gave none.

        The versioned call first; the older one where the binding or the driver lacks it (or the
        GPU refused it). A transient failure (counted by the query gate) sets ``_failed``, so the
        next cycle reads again; once the GPU refused both calls, ``_none`` is set."""
        q, f, nvml = self._q, self._q.fns, self._q.nvml
        self._failed = False
        calls: tuple[tuple[Any, NvmlFunction], ...] = (
            (getattr(nvml, "c_nvmlGpuFabricInfo_v2_t", None), f.nvmlDeviceGetGpuFabricInfoV),
            (getattr(nvml, "c_nvmlGpuFabricInfo_t", None), f.nvmlDeviceGetGpuFabricInfo),
        )
        for struct, function in calls:
            if not self._usable(struct, function):
                continue
            info = struct()  # the v2 constructor sets the struct's version (nvmlGpuFabricInfo_v2)
            if q.call(self._uuid, function, self._handle, ctypes.byref(info), default=_NO_ANSWER) is not _NO_ANSWER:
                return info
            if not q.is_unsupported(self._uuid, function.name):
                self._failed = True
                return None
        self._none = True
        return None

    def _usable(self, struct: Any, function: NvmlFunction) -> bool:
        """Whether ``function`` may be asked with the binding's ``struct``: both present, the
        function not refused on this GPU and the struct laid out as NVML writes it."""
        if struct is None or self._q.is_unsupported(self._uuid, function.name):
            return False
        if not _laid_out_right(struct):  # a property of the binding: for every GPU, logged once
            self._q.unsupported.add((ANY_SCOPE, function.name))
            _log.info("the nvml binding's %s has no 16-byte clusterUuid; %s not used", struct.__name__, function.name)
            return False
        return True

    def _status(self, info: Any) -> str:
        """The registration's NVML result, lower case without ``NVML_`` / ``NVML_ERROR_``."""
        nvml = self._q.nvml
        code = int(info.status)
        if code == nvml.NVML_SUCCESS:
            return "success"
        return self._q.code(nvml.NVMLError(code)).lower()
