"""The one seam to GPU hardware: the ``GpuBackend`` protocol both backends implement."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from exporter.model import BackendSample


@runtime_checkable
class GpuBackend(Protocol):
    """Source of one ``BackendSample`` per sampling cycle.

    Contract:
    - ``sample()`` returns a complete ``BackendSample`` without sleeping.  Windowed signals (GPM,
      per-process utilisation) span from the previous ``sample()`` call to this one, so the
      sampler's interval is the window; on the first call they are ``None``.
      It never raises for a single GPU or field: a lost GPU becomes
      ``GpuSample(up=False)``, an unsupported field ``None``.  When the driver is missing it
      returns ``BackendSample(up=False, error=...)`` and retries initialisation with backoff on
      later calls.
    - It may be called only from one thread at a time (the sampler's worker).
    - ``close()`` releases the driver (NVML shutdown); safe to call twice.
    """

    name: str

    def sample(self) -> BackendSample:
        """Read every GPU once; windowed signals cover the time since the previous call."""
        ...

    def close(self) -> None:
        """Release resources; idempotent."""
        ...
