"""The one gate every NVML call passes: classifies NVML errors and remembers unsupported calls.

The NVML binding module is passed in (``pynvml`` or a test fake); this module never imports it.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection
from typing import Any

from exporter.backends.nvml.functions import NvmlFunction, NvmlFunctions

_log = logging.getLogger(__name__)

#: Errors that mean "this device or driver will never answer this call": remembered, never retried.
_UNSUPPORTED = ("NOT_SUPPORTED", "FUNCTION_NOT_FOUND", "NO_PERMISSION")
#: Errors that mean the whole physical GPU is gone: it becomes ``GpuSample(up=False)``.
_LOST = ("GPU_IS_LOST", "RESET_REQUIRED")
#: Errors that mean the library lost its state (driver reload, shutdown): re-initialise.
_REINIT = ("UNINITIALIZED", "DRIVER_NOT_LOADED", "LIB_RM_VERSION_MISMATCH", "LIBRARY_NOT_FOUND")
_ERROR_PREFIX = "NVML_ERROR_"

ANY_SCOPE = "*"
"""Scope used for a function missing from the binding: it is missing for every device."""


class GpuLost(Exception):
    """The physical GPU stopped answering (``GpuIsLost``); carries the scope (device UUID)."""


class NeedsReinit(Exception):
    """NVML lost its state (``Uninitialized``, driver unloaded or swapped): re-init the library."""


def error_names(nvml: Any) -> dict[int, str]:
    """NVML error code -> upper-case name (``3`` -> ``NOT_SUPPORTED``), from the binding's constants."""
    names: dict[int, str] = {}
    for attr in dir(nvml):
        if attr.startswith(_ERROR_PREFIX):
            value = getattr(nvml, attr)
            if isinstance(value, int):
                names.setdefault(value, attr[len(_ERROR_PREFIX) :])
    return names


class NvmlQuery:
    """Calls binding functions and turns NVML errors into data.

    ``fns`` holds every function the backend uses, resolved from the binding ``nvml`` once;
    ``nvml`` stays reachable for constants and structs. ``call()`` returns the function's result,
    or ``None`` when the value is unavailable this cycle. Per (scope, key) it remembers
    NotSupported / FunctionNotFound / NoPermission and a function missing from the binding, and
    never calls those again. Transient errors (Unknown, Timeout, ...) are counted in ``errors``
    by lower-case code name (``unknown``, ``timeout``) and retried next cycle. GpuIsLost raises
    :class:`GpuLost`; Uninitialized and driver errors raise :class:`NeedsReinit`.
    """

    def __init__(self, nvml: Any, fns: NvmlFunctions) -> None:
        self.nvml = nvml
        self.fns = fns
        self.unsupported: set[tuple[str, str]] = set()
        self.errors: Counter[str] = Counter()
        self._names = error_names(nvml)
        self._error_type: type[BaseException] = nvml.NVMLError
        missing = fns.missing()
        if missing:
            _log.info("nvml binding has no %s; treating them as unsupported", ", ".join(missing))

    def code(self, exc: BaseException) -> str:
        """Upper-case NVML code name of an NVML exception, e.g. ``NOT_SUPPORTED``."""
        value = getattr(exc, "value", None)
        if isinstance(value, int) and value in self._names:
            return self._names[value]
        return f"CODE_{value}"

    def is_unsupported(self, scope: str, key: str) -> bool:
        """True once (scope, key) or the bare function was found unsupported."""
        return (scope, key) in self.unsupported or (ANY_SCOPE, key) in self.unsupported

    def count(self, code: str) -> None:
        """Count one error for this cycle under ``code`` (already lower-case)."""
        self.errors[code] += 1

    def call(
        self,
        scope: str,
        function: NvmlFunction,
        *args: Any,
        key: str | None = None,
        expect: Collection[str] = (),
        default: Any = None,
    ) -> Any:
        """Call ``function(*args)`` for the device ``scope``.

        ``key`` distinguishes calls of one function with different arguments (ECC corrected vs
        uncorrected); it defaults to the function's name. Codes in ``expect`` (names like
        ``NOT_FOUND``) are normal answers: they return ``default`` without being counted.
        """
        key = key or function.name
        if self.is_unsupported(scope, key):
            return default
        fn = function.fn
        if fn is None:
            self.unsupported.add((ANY_SCOPE, key))
            return default
        try:
            return fn(*args)
        except AttributeError:
            # Some binding wrappers reach for a struct/constant a newer API needs.
            self.unsupported.add((ANY_SCOPE, key))
            _log.info("nvml binding cannot call %s (AttributeError); treating it as unsupported", function.name)
            return default
        except Exception as exc:
            if not isinstance(exc, self._error_type):
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
