"""The one gate every NVML call passes: classifies NVML errors and remembers unsupported calls.

The NVML binding module is passed in (``pynvml`` or a test fake); this module never imports it.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Collection
from typing import Any

_log = logging.getLogger(__name__)

#: Errors that mean "this device or driver will never answer this call": remembered, never retried.
_UNSUPPORTED = ("NOT_SUPPORTED", "FUNCTION_NOT_FOUND", "NO_PERMISSION")
#: Errors that mean the whole physical GPU is gone: it becomes ``GpuSample(up=False)``.
_LOST = ("GPU_IS_LOST", "RESET_REQUIRED")
#: Errors that mean the library lost its state (driver reload, shutdown): re-initialise.
_REINIT = ("UNINITIALIZED", "DRIVER_NOT_LOADED", "LIB_RM_VERSION_MISMATCH", "LIBRARY_NOT_FOUND")

ANY_SCOPE = "*"
"""Scope used for a function missing from the binding: it is missing for every device."""


class GpuLost(Exception):
    """The physical GPU stopped answering (``GpuIsLost``); carries the scope (device UUID)."""


class NeedsReinit(Exception):
    """NVML lost its state (``Uninitialized``, driver unloaded or swapped): re-init the library."""


class NvmlQuery:
    """Calls binding functions by name and turns NVML errors into data.

    ``call()`` returns the function's result, or ``None`` when the value is unavailable this
    cycle. Per (scope, call) it remembers NotSupported / FunctionNotFound / NoPermission and a
    function missing from the binding (AttributeError), and never calls those again. Transient
    errors (Unknown, Timeout, ...) are counted in ``errors`` by lower-case code name
    (``unknown``, ``timeout``) and retried next cycle. GpuIsLost raises :class:`GpuLost`;
    Uninitialized and driver errors raise :class:`NeedsReinit`.
    """

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self.unsupported: set[tuple[str, str]] = set()
        self.errors: Counter[str] = Counter()
        self._names: dict[int, str] = {}
        for attr in dir(nvml):
            if attr.startswith("NVML_ERROR_"):
                value = getattr(nvml, attr)
                if isinstance(value, int):
                    self._names.setdefault(value, attr[len("NVML_ERROR_") :])
        self._error_type: type[BaseException] = nvml.NVMLError

    def code(self, exc: BaseException) -> str:
        """Upper-case NVML code name of an NVML exception, e.g. ``NOT_SUPPORTED``."""
        value = getattr(exc, "value", None)
        if isinstance(value, int) and value in self._names:
            return self._names[value]
        return f"CODE_{value}"

    def is_nvml_error(self, exc: BaseException) -> bool:
        """True for the binding's NVMLError (and subclasses)."""
        return isinstance(exc, self._error_type)

    def code_value(self, name: str) -> int:
        """Numeric code of an NVML error name such as ``NOT_FOUND``."""
        return int(getattr(self._nvml, "NVML_ERROR_" + name))

    def is_unsupported(self, scope: str, key: str) -> bool:
        """True once (scope, key) or the bare function was found unsupported."""
        return (scope, key) in self.unsupported or (ANY_SCOPE, key) in self.unsupported

    def count(self, code: str) -> None:
        """Count one error for this cycle under ``code`` (already lower-case)."""
        self.errors[code] += 1

    def call(
        self,
        scope: str,
        name: str,
        *args: Any,
        key: str | None = None,
        expect: Collection[str] = (),
        default: Any = None,
    ) -> Any:
        """Call ``nvml.<name>(*args)`` for the device ``scope``.

        ``key`` distinguishes calls of one function with different arguments (ECC corrected vs
        uncorrected). Codes in ``expect`` (names like ``NOT_FOUND``) are normal answers: they
        return ``default`` without being counted.
        """
        key = key or name
        if self.is_unsupported(scope, key):
            return default
        fn: Callable[..., Any] | None = getattr(self._nvml, name, None)
        if fn is None:
            self.unsupported.add((ANY_SCOPE, key))
            _log.info("nvml binding has no %s; treating it as unsupported", name)
            return default
        try:
            return fn(*args)
        except AttributeError:
            # Some binding wrappers reach for a struct/constant a newer API needs.
            self.unsupported.add((ANY_SCOPE, key))
            _log.info("nvml binding cannot call %s (AttributeError); treating it as unsupported", name)
            return default
        except Exception as exc:
            if not self.is_nvml_error(exc):
                raise
            code = self.code(exc)
            if code in expect:
                return default
            if code in _UNSUPPORTED:
                self.unsupported.add((scope, key))
                level = logging.DEBUG if code == "NOT_SUPPORTED" else logging.INFO
                _log.log(level, "nvml %s on %s: %s; not asked again", key, scope, code)
                return default
            if code in _LOST:
                raise GpuLost(scope) from exc
            if code in _REINIT:
                raise NeedsReinit(code) from exc
            self.errors[code.lower()] += 1
            return default
