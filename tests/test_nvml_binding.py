"""Every NVML name the backend uses exists in nvidia-ml-py's ``pynvml`` and in the test fake.

A name the binding lacks would make its field silently unsupported on every GPU; a name the fake
lacks would leave that code path untested. Names are gathered from the declared function table
(``NvmlFunctions``) and from the backend's source: every attribute read from the binding module
(``nvml.X``, ``q.nvml.X``) and every string literal shaped like an NVML identifier (constants
looked up with ``getattr``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from exporter.backends import nvml
from exporter.backends.nvml.functions import NvmlFunction, NvmlFunctions
from exporter.backends.nvml.query import NvmlQuery
from tests.fakes.fake_pynvml import FakeNvml

BACKEND = Path(nvml.__file__).parent
_TABLE_METHODS = {"names", "resolve", "missing"}
_NVML_IDENTIFIER = re.compile(r"(nvml[A-Z]\w*|NVML_\w*[A-Za-z0-9]|c_nvml\w+)")


def nvml_names_in(source: str) -> set[str]:
    """NVML names a backend module's source refers to: attributes of the binding, string constants."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _reads_binding(node):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _NVML_IDENTIFIER.fullmatch(node.value):
            names.add(node.value)
    return names


def _reads_binding(node: ast.Attribute) -> bool:
    """An attribute of the binding module or of the resolved function table (not its methods)."""
    return _is_binding(node.value) or (_is_function_table(node.value) and node.attr not in _TABLE_METHODS)


def _is_binding(node: ast.expr) -> bool:
    """``nvml``, ``q.nvml``, ``self._q.nvml``: the binding module by every name the backend gives it."""
    if isinstance(node, ast.Name):
        return node.id == "nvml"
    return isinstance(node, ast.Attribute) and node.attr == "nvml"


def _is_function_table(node: ast.expr) -> bool:
    """``f``, ``fns``, ``q.fns``, ``self._q.fns``: the resolved ``NvmlFunctions``."""
    if isinstance(node, ast.Name):
        return node.id in ("f", "fns")
    return isinstance(node, ast.Attribute) and node.attr == "fns"


def backend_sources() -> dict[str, str]:
    paths = sorted(BACKEND.glob("*.py"))
    assert len(paths) >= 5, paths
    return {p.name: p.read_text() for p in paths}


def used_names() -> set[str]:
    names = set(NvmlFunctions.names())
    for source in backend_sources().values():
        names |= nvml_names_in(source)
    return names


def missing_from(binding: Any, names: set[str]) -> list[str]:
    return sorted(n for n in names if getattr(binding, n, None) is None)


@pytest.fixture(scope="module")
def pynvml() -> ModuleType:
    return pytest.importorskip("pynvml", reason="nvidia-ml-py (extra 'nvml') not installed")


def test_every_function_the_backend_calls_exists_in_nvidia_ml_py_and_in_the_fake(pynvml: ModuleType) -> None:
    functions = set(NvmlFunctions.names())
    assert len(functions) > 50
    assert missing_from(pynvml, functions) == []
    assert missing_from(FakeNvml([]), functions) == []
    assert all(callable(getattr(pynvml, n)) and callable(getattr(FakeNvml([]), n)) for n in functions)


def test_every_nvml_name_in_the_backend_source_exists_in_nvidia_ml_py_and_in_the_fake(pynvml: ModuleType) -> None:
    names = used_names()
    assert {"NVML_CLOCK_SM", "nvmlClocksEventReasonSwPowerCap", "NVML_GPM_METRIC_SM_UTIL"} <= names
    assert {"nvmlDeviceGetPowerUsage", "nvmlGpmMigSampleGet", "c_nvmlGpmMetricsGet_t"} <= names
    assert missing_from(pynvml, names) == []
    assert missing_from(FakeNvml([]), names) == []


def test_every_call_site_names_a_declared_function() -> None:
    """``f.X`` / ``fns.X`` in the backend is a field of ``NvmlFunctions`` (mypy checks it too)."""
    declared = set(NvmlFunctions.names())
    assert set(vars(NvmlFunctions)) >= _TABLE_METHODS, "the table's own methods, not NVML names"
    for name, source in backend_sources().items():
        referenced = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Attribute) and _is_function_table(node.value):
                referenced.add(node.attr)
        assert referenced <= declared | _TABLE_METHODS, (name, referenced - declared - _TABLE_METHODS)


def test_the_checks_catch_a_misspelled_name(pynvml: ModuleType) -> None:
    source = (
        'q.call(u, f.nvmlDeviceGetNmae, h)\nx = nvml.NVML_CLOCK_SMM\ny = getattr(nvml, "nvmlClocksEventReasonGpuIdel")'
    )
    names = nvml_names_in(source)
    misspelled = ["NVML_CLOCK_SMM", "nvmlClocksEventReasonGpuIdel", "nvmlDeviceGetNmae"]
    assert missing_from(pynvml, names) == misspelled
    assert missing_from(FakeNvml([]), names) == misspelled


def test_a_misspelled_function_cannot_be_called() -> None:
    fns = NvmlFunctions.resolve(FakeNvml([]))
    with pytest.raises(AttributeError):
        fns.nvmlDeviceGetNmae  # type: ignore[attr-defined]  # noqa: B018
    query = NvmlQuery(FakeNvml([]), fns)
    with pytest.raises(AttributeError):
        query.call("GPU-0", "nvmlDeviceGetName")  # type: ignore[arg-type]


def test_a_function_an_old_binding_lacks_resolves_to_none_and_is_unsupported() -> None:
    fake = FakeNvml([])
    fake.remove("nvmlDeviceGetCurrentClocksEventReasons")
    fns = NvmlFunctions.resolve(fake)
    assert fns.missing() == ("nvmlDeviceGetCurrentClocksEventReasons",)
    assert fns.nvmlDeviceGetCurrentClocksEventReasons == NvmlFunction("nvmlDeviceGetCurrentClocksEventReasons", None)
    query = NvmlQuery(fake, fns)
    assert query.call("GPU-0", fns.nvmlDeviceGetCurrentClocksEventReasons, object(), default=-1) == -1
    assert query.is_unsupported("GPU-1", "nvmlDeviceGetCurrentClocksEventReasons")
