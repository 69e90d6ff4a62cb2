"""NVML backend: reads every physical GPU and leaf (whole GPU or MIG instance) through NVML.

The binding, ``pynvml`` (nvidia-ml-py), is loaded on first use by the session module, so the
exporter runs without it. This class owns the library's life: initialisation with backoff, re-initialisation after a
driver loss, bounded shutdown. Everything between one ``nvmlInit`` and its end is an
:class:`NvmlSession`, whose readers pass every call through :class:`NvmlQuery`; that gate turns
NVML errors into ``None`` fields, lost GPUs and re-initialisation. See
``docs/gpu-validation.md`` for what an H200 answers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from exporter.backends.nvml.functions import NvmlFunctions
from exporter.backends.nvml.gpu import ReaderOptions
from exporter.backends.nvml.query import GpuLost, NeedsReinit, error_names
from exporter.backends.nvml.session import NvmlSession, load_binding
from exporter.model import BackendSample

_log = logging.getLogger(__name__)

_BACKOFF_FIRST_SECONDS = 1.0
_BACKOFF_MAX_SECONDS = 60.0


class _InitRetry:
    """When ``nvmlInit`` may be tried again: 1 s after a failure, doubling up to 60 s."""

    def __init__(self) -> None:
        self.error = "nvml not initialised yet"
        """Why NVML is unavailable, as of the last attempt."""
        self._next_at = 0.0
        self._delay = _BACKOFF_FIRST_SECONDS

    def waiting(self, now: float) -> bool:
        """True while the delay after the last failure has not passed."""
        return now < self._next_at

    def failed(self, now: float, error: str, grow: bool) -> float:
        """Record a failed attempt at ``now``; returns the delay before the next one."""
        self.error = error
        delay = self._delay
        self._next_at = now + delay
        if grow:
            self._delay = min(delay * 2, _BACKOFF_MAX_SECONDS)
        return delay

    def succeeded(self) -> None:
        """``nvmlInit`` worked: the next failure waits the first delay again."""
        self._delay = _BACKOFF_FIRST_SECONDS


class NvmlBackend:
    """GpuBackend over NVML (``pynvml``), safe against missing drivers and failing GPUs.

    ``nvml`` is the binding module (default: ``pynvml``, imported on first use); tests inject a
    fake. ``clock`` (monotonic seconds) paces init retries and GPM windows; ``wall_clock`` (Unix
    seconds) supplies the timestamps NVML's per-process utilisation expects.

    PCIe throughput costs a sampling window per direction per call (NVML samples one; the ms on an
    H200 are in docs/benchmarks.md), so it is read every ``pcie_every`` cycles per GPU, staggered
    by index so the GPUs of a node do not all pay in the same cycle; cycles in between repeat the
    last value.  Total energy (the largest per-cycle cost on an H200) is a counter, so it is read every
    ``energy_every`` cycles the same way: ``rate()`` over any window longer than that is unchanged.
    Fields that change with a configuration or an error (MIG and compute mode, power limit, ECC,
    remapped rows, PCIe replays, fan, HBM temperature) are read every ``slow_every`` cycles
    (exporter/backends/nvml/device.py), and so is the NVLink fabric registration, which completes
    some time after boot (exporter/backends/nvml/fabric.py).  ``gpm=False`` (``--no-collect.gpm``) never samples GPM:
    every GPU then reads as one without it (coarse classes, docs/boundness.md).
    """

    name = "nvml"

    def __init__(
        self,
        nvml: Any = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        pcie_every: int = 10,
        energy_every: int = 10,
        slow_every: int = 10,
        close_timeout: float = 5.0,
        gpm: bool = True,
    ) -> None:
        self._nvml = nvml
        self._options = ReaderOptions(
            clock=clock,
            wall_clock=wall_clock,
            pcie_every=max(1, pcie_every),
            energy_every=max(1, energy_every),
            slow_every=max(1, slow_every),
            gpm=gpm,
        )
        self._close_timeout = close_timeout
        self._lock = threading.Lock()
        self._session: NvmlSession | None = None
        self._closed = False
        self._retry = _InitRetry()
        # Outlive sessions: a GPU without a handle keeps its UUID; a failing GPU logs once.
        self._known_uuids: dict[int, str] = {}
        self._failed_once: set[str] = set()
        self._cycle = 0

    def sample(self) -> BackendSample:
        """Read every GPU once; GPM and per-process utilisation cover the time since the last call."""
        with self._lock:
            if self._closed:
                return BackendSample(up=False, error="backend closed")
            session = self._session or self._start()
            if isinstance(session, str):
                return BackendSample(up=False, error=session)
            try:
                result = session.sample(self._cycle)
            except NeedsReinit as exc:
                # Driver reload / GPU reset: handles are stale. Re-init now, once, then retry.
                _log.warning("nvml reported %s; re-initialising", exc)
                self._session = None
                session = self._start(force=True)
                if isinstance(session, str):
                    return BackendSample(up=False, error=session)
                try:
                    result = session.sample(self._cycle)
                except NeedsReinit as again:
                    self._session = None
                    return BackendSample(up=False, error=f"nvml {again} right after re-init")
            self._cycle += 1
            return result

    def close(self) -> None:
        """Free GPM buffers and event sets, then shut NVML down; safe to call twice.

        If a ``sample()`` is stuck inside a hung NVML call, waits at most ``close_timeout``
        seconds and then leaves NVML as it is, so shutdown on SIGTERM stays bounded.
        """
        if not self._lock.acquire(timeout=self._close_timeout):
            _log.warning(
                "an NVML call is still running after %.0f s; closing without nvmlShutdown", self._close_timeout
            )
            self._closed = True
            return
        try:
            if self._closed:
                return
            self._closed = True
            if self._session is not None:
                self._session.close()
                self._session = None
        finally:
            self._lock.release()

    def _start(self, force: bool = False) -> NvmlSession | str:
        """Initialise NVML and open a session; returns why NVML is unavailable when it cannot.

        Retries wait with a doubling backoff (1 s up to 60 s) unless ``force``d.
        """
        now = self._options.clock()
        if not force and self._retry.waiting(now):
            return self._retry.error
        try:
            nvml = self._module()
            fns = NvmlFunctions.resolve(nvml)
            if fns.nvmlInit.fn is None:
                raise RuntimeError("the NVML binding has no nvmlInit")
            fns.nvmlInit.fn()
        except Exception as exc:
            error = f"nvml unavailable: {self._describe_init_failure(exc)}"
            delay = self._retry.failed(now, error, grow=True)
            _log.warning("%s; retrying in %.0f s", error, delay)
            return error
        self._retry.succeeded()
        try:
            session = NvmlSession(nvml, fns, self._options, self._known_uuids, self._failed_once)
        except (NeedsReinit, GpuLost) as exc:
            error = f"nvml unavailable: {exc} during enumeration"
            self._retry.failed(now, error, grow=False)
            return error
        _log.info("nvml ready: driver %s, %d GPU(s)", session.driver_version, session.gpu_count)
        self._session = session
        return session

    def _module(self) -> Any:
        if self._nvml is None:
            self._nvml = load_binding()
        return self._nvml

    def _describe_init_failure(self, exc: BaseException) -> str:
        if isinstance(exc, ImportError):
            return "nvidia-ml-py is not installed"
        value = getattr(exc, "value", None)
        if self._nvml is not None and isinstance(value, int):
            name = error_names(self._nvml).get(value)
            if name is not None:
                return name.lower()
        return f"{type(exc).__name__}: {exc}"
