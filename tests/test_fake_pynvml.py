"""The fake NVML driver answers a plain device getter it has no method for from ``FakeGpu.answers``,
so a new NVML read needs no new method in the fake (only an answer where a test wants one)."""

from __future__ import annotations

import pytest

from tests.fakes.fake_pynvml import FakeGpu, FakeNvml, NVMLError, code


def _nvml(**answers: object) -> FakeNvml:
    nvml = FakeNvml([FakeGpu(uuid="GPU-a", answers=dict(answers))])
    nvml.nvmlInit()
    return nvml


def test_a_getter_without_a_method_answers_from_the_gpu() -> None:
    nvml = _nvml(nvmlDeviceGetPerformanceState=8)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetPerformanceState(handle) == 8
    assert nvml.calls["nvmlDeviceGetPerformanceState"] == 1


def test_without_an_answer_it_is_not_supported_like_a_gpu_without_the_feature() -> None:
    nvml = _nvml()
    with pytest.raises(NVMLError) as err:
        nvml.nvmlDeviceGetPerformanceState(nvml.nvmlDeviceGetHandleByIndex(0))
    assert err.value.value == code("NOT_SUPPORTED")


def test_failures_and_removal_apply_to_it_as_to_any_call() -> None:
    nvml = _nvml(nvmlDeviceGetPerformanceState=0)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.fail("nvmlDeviceGetPerformanceState", "UNKNOWN")
    with pytest.raises(NVMLError):
        nvml.nvmlDeviceGetPerformanceState(handle)
    assert nvml.nvmlDeviceGetPerformanceState(handle) == 0
    nvml.remove("nvmlDeviceGetPerformanceState")
    assert nvml.nvmlDeviceGetPerformanceState is None  # absent from an older binding


def test_only_device_getters_are_made_up() -> None:
    with pytest.raises(AttributeError):
        _ = _nvml().nvmlSomethingElse
