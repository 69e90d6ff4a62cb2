"""Xid (critical error) events of one physical GPU: registered once, drained every cycle without blocking."""

from __future__ import annotations

from typing import Any

from exporter.backends.nvml.query import NvmlQuery

_MAX_EVENTS_PER_CYCLE = 1024


class XidEvents:
    """An NVML event set listening for one GPU's Xid events, when the GPU offers them."""

    def __init__(self, q: NvmlQuery, handle: Any, uuid: str) -> None:
        self._q = q
        self._handle = handle
        self._uuid = uuid
        self._event_set: Any = None  # NVML event set, or None while not registered

    def register(self) -> None:
        """Create an event set and register the GPU's Xid events; leaves none if NVML refuses."""
        q, f = self._q, self._q.fns
        xid = q.nvml.nvmlEventTypeXidCriticalError
        supported = q.call(self._uuid, f.nvmlDeviceGetSupportedEventTypes, self._handle)
        if supported is None or not supported & xid:
            return
        event_set = q.call(self._uuid, f.nvmlEventSetCreate)
        if event_set is None:
            return
        registered = q.call(self._uuid, f.nvmlDeviceRegisterEvents, self._handle, xid, event_set, default=False)
        if registered is False:
            q.call(self._uuid, f.nvmlEventSetFree, event_set)
            return
        self._event_set = event_set

    def drain(self) -> tuple[int, ...]:
        """Every Xid queued since the last cycle, oldest first (wait timeout 0 ms: never blocks)."""
        if self._event_set is None:
            return ()
        q = self._q
        wait, xid = q.fns.nvmlEventSetWait, q.nvml.nvmlEventTypeXidCriticalError
        xids = []
        for _ in range(_MAX_EVENTS_PER_CYCLE):
            data = q.call(self._uuid, wait, self._event_set, 0, expect=("TIMEOUT",))
            if data is None:
                break
            if data.eventType & xid:
                xids.append(int(data.eventData))
        return tuple(xids)

    def free(self) -> None:
        """Release the event set; safe to call twice."""
        if self._event_set is not None:
            event_set, self._event_set = self._event_set, None
            self._q.call(self._uuid, self._q.fns.nvmlEventSetFree, event_set)
