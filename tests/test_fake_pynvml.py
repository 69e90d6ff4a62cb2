"""The fake NVML driver answers a plain device getter that the backend declares but the fake has no
method for from ``FakeGpu.answers``, so a new NVML read needs no new method in the fake (only an
answer where a test wants one); a name the backend does not declare stays absent."""

from __future__ import annotations

import pytest

from exporter.backends.nvml.functions import NvmlFunctions
from tests.fakes.fake_pynvml import FakeGpu, FakeNvml, NVMLError, code

NEW = "nvmlDeviceGetPerformanceState"
"""A real nvidia-ml-py getter the backend does not call today, declared for these tests only."""


@pytest.fixture(autouse=True)
def declared(monkeypatch: pytest.MonkeyPatch) -> None:
    names = NvmlFunctions.names()
    monkeypatch.setattr(NvmlFunctions, "names", classmethod(lambda _cls: (*names, NEW)))


def _nvml(**answers: object) -> FakeNvml:
    nvml = FakeNvml([FakeGpu(uuid="GPU-a", answers=dict(answers))])
    nvml.nvmlInit()
    return nvml


def test_a_declared_getter_without_a_method_answers_from_the_gpu() -> None:
    nvml = _nvml(**{NEW: 8})
    assert getattr(nvml, NEW)(nvml.nvmlDeviceGetHandleByIndex(0)) == 8
    assert nvml.calls[NEW] == 1


def test_without_an_answer_it_is_not_supported_like_a_gpu_without_the_feature() -> None:
    nvml = _nvml()
    with pytest.raises(NVMLError) as err:
        getattr(nvml, NEW)(nvml.nvmlDeviceGetHandleByIndex(0))
    assert err.value.value == code("NOT_SUPPORTED")


def test_failures_and_removal_apply_to_it_as_to_any_call() -> None:
    nvml = _nvml(**{NEW: 0})
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.fail(NEW, "UNKNOWN")
    with pytest.raises(NVMLError):
        getattr(nvml, NEW)(handle)
    assert getattr(nvml, NEW)(handle) == 0
    nvml.remove(NEW)
    assert getattr(nvml, NEW) is None  # absent from an older binding


def test_a_name_the_backend_does_not_declare_is_absent() -> None:
    with pytest.raises(AttributeError):
        _ = _nvml().nvmlDeviceGetNmae
