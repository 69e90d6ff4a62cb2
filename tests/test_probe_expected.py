"""Expected bandwidth per GPU model: what "efficiency" and "slower than its peers" mean to a user."""

from __future__ import annotations

import pytest

from probes.expected import (
    MODELS,
    PCIE_GEN5_X16_ACHIEVABLE,
    efficiency_ratio,
    expected_bandwidth,
)


def test_healthy_h200_copy_reads_as_full_efficiency_not_datasheet_fraction() -> None:
    expected = expected_bandwidth("NVIDIA H200", "hbm_copy")
    assert expected is not None
    assert expected.datasheet_bytes_per_second == 4.8e12
    assert expected.basis == "measured"
    assert efficiency_ratio(expected.achievable_bytes_per_second, "NVIDIA H200", "hbm_copy") == pytest.approx(1.0)
    # 80 % of what a healthy H200 reaches is what the "probe degraded" alert is about.
    slow = 0.8 * expected.achievable_bytes_per_second
    assert efficiency_ratio(slow, "NVIDIA H200", "hbm_copy") == pytest.approx(0.8)


H100_PROBE_HBM_COPY = 3.035e12
"""The probe's HBM copy on an idle H100 80GB HBM3, median of 5 runs (scripts/gpu_probes.py,
2026-12-07, issue 55; torch's same-size copy in the same run 3.033e12)."""


def test_a_healthy_h100_reads_full_efficiency_against_its_own_measured_fraction() -> None:
    expected = expected_bandwidth("NVIDIA H100 80GB HBM3", "hbm_copy")
    assert expected is not None and expected.basis == "measured"
    assert expected.datasheet_bytes_per_second == 3.35e12
    # The H200's achievable fraction (0.880) applied to an H100 reads its healthy copy as 1.03.
    ratio = efficiency_ratio(H100_PROBE_HBM_COPY, "NVIDIA H100 80GB HBM3", "hbm_copy")
    assert ratio == pytest.approx(1.0, abs=0.005)


def test_a_model_not_measured_assumes_the_h200_fraction_and_says_so() -> None:
    nvl = expected_bandwidth("NVIDIA H100 NVL", "hbm_copy")
    assert nvl is not None and nvl.basis == "assumed"
    assert nvl.achievable_bytes_per_second == pytest.approx(3.9e12 * 0.880)


def test_pcie_expectation_follows_the_models_link_generation() -> None:
    h100 = expected_bandwidth("NVIDIA H100 80GB HBM3", "h2d")
    a100 = expected_bandwidth("NVIDIA A100-SXM4-80GB", "d2h")
    assert h100 is not None and a100 is not None
    assert h100.achievable_bytes_per_second == PCIE_GEN5_X16_ACHIEVABLE
    assert a100.achievable_bytes_per_second == pytest.approx(PCIE_GEN5_X16_ACHIEVABLE / 2)
    assert 62e9 < h100.datasheet_bytes_per_second < 64e9


def test_datasheet_figures_of_the_main_models() -> None:
    by_name = {m.name: m.hbm_datasheet_bytes_per_second for m in MODELS}
    assert by_name["NVIDIA H200"] == 4.8e12
    assert by_name["NVIDIA H100 80GB HBM3"] == 3.35e12
    assert by_name["NVIDIA A100-SXM4-80GB"] == 2.039e12


def test_unknown_model_or_probe_has_no_efficiency() -> None:
    assert efficiency_ratio(1e12, "Some Future GPU", "hbm_copy") is None
    assert efficiency_ratio(1e12, None, "hbm_copy") is None
    assert efficiency_ratio(1e12, "NVIDIA H200", "nvlink") is None
    assert efficiency_ratio(0.0, "NVIDIA H200", "hbm_copy") is None


def test_model_names_match_regardless_of_case_and_spaces() -> None:
    assert expected_bandwidth(" nvidia h200 ", "hbm_copy") == expected_bandwidth("NVIDIA H200", "hbm_copy")


def test_mig_slice_is_expected_to_reach_its_share_of_hbm_but_full_pcie() -> None:
    whole = expected_bandwidth("NVIDIA H200", "hbm_copy")
    slice_ = expected_bandwidth("NVIDIA H200", "hbm_copy", memory_fraction=1 / 7)
    pcie = expected_bandwidth("NVIDIA H200", "h2d", memory_fraction=1 / 7)
    assert whole is not None and slice_ is not None and pcie is not None
    assert slice_.achievable_bytes_per_second == pytest.approx(whole.achievable_bytes_per_second / 7)
    assert pcie.achievable_bytes_per_second == PCIE_GEN5_X16_ACHIEVABLE
