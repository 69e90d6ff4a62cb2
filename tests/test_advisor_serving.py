"""The serving advisor's answers, each checked against a computation by hand in the test.

Figures used by hand (dashboard/advisor/serving_gpus.py): bandwidth H200 4.8e12, H100 3.35e12,
L40S 0.864e12, A100-40GB 1.555e12 B/s; dense BF16 H200 = H100 = 989e12 FLOP/s.
"""

from __future__ import annotations

import math

import pytest

from dashboard.advisor import serving_gpus as sg
from dashboard.advisor.serving import (
    BUSY_CEILING,
    MEMORY_HEADROOM,
    ServedModel,
    advise_model,
    balance,
    memory_needed,
    step_ratio,
    weights_from_name,
)

GB = 1e9


def small_model_on_h200() -> ServedModel:
    """An 8 B model on one H200, a quarter busy, memory-bound: vLLM took 127 GB for its KV pool
    but the KV cache peaked at 10 % of it."""
    return ServedModel(
        model="llama-3-8b",
        role="both",
        gpu=sg.H200,
        gpus=1,
        busy_ratio=0.25,
        class_seconds={"idle": 5400.0, "memory": 1620.0, "launch": 180.0},
        output_tokens_per_second=2000.0,
        itl_p95_seconds=0.008,
        memory_used_peak_bytes=127 * GB,
        weights_bytes=weights_from_name("llama-3-8b"),
        kv_cache_peak_ratio=0.10,
    )


def test_the_small_model_on_an_h200_moves_to_a_smaller_gpu_that_meets_its_target() -> None:
    m = small_model_on_h200()
    # weights 8e9 x 2 = 16 GB; KV pool 127 - 16 = 111 GB at 10 % = 11.1 GB; x 1.2 = 32.52 GB
    assert m.weights_bytes == 16 * GB
    assert memory_needed(m) == pytest.approx((16 + 11.1) * MEMORY_HEADROOM * GB)
    prices = {"H200": 4.0, "L40S": 0.90, "L4": 0.80}
    advice = advise_model(m, prices, target_itl_seconds=0.050)
    # shares of busy time: memory 0.9, launch 0.1
    # L40S: r = 0.9 x 4.8/0.864 + 0.1 = 5.1; ITL 8 ms x 5.1 = 40.8 ms <= 50; GPUs ceil(0.25 x 5.1 / 0.8) = 2
    #   $/M = 0.90 x 2 / (2000 x 3600) x 1e6 = 0.25; today 4.0 / 7.2e6 x 1e6 = 0.556
    # L4: 24 GB < 32.52 GB: does not fit.  H200 1g.35gb (priced as a quarter of an H200: 2 of 8
    #   memory slices): bandwidth 1.2e12, r = 0.9 x 4 + 0.1 = 3.7, ITL 29.6 ms, GPUs ceil(0.25 x 3.7 / 0.8) = 2,
    #   $/M = 4.0 x 0.25 x 2 / 7.2e6 x 1e6 = 0.278 > 0.25.  H200 3g.71gb: half an H200, r = 1.9, 1 GPU, 0.278.
    assert advice.target == "L40S", advice.text
    assert advice.chosen is not None
    assert advice.chosen.step_ratio == pytest.approx(0.9 * 4.8 / 0.864 + 0.1)
    assert advice.chosen.gpus == 2 == math.ceil(0.25 * 5.1 / BUSY_CEILING)
    assert advice.chosen.itl_p95_seconds == pytest.approx(0.0408)
    assert advice.chosen.usd_per_million_tokens == pytest.approx(0.25)
    assert advice.evidence["usd_per_million_now"] == pytest.approx(4.0 / 7.2e6 * 1e6)
    l4 = next(p for p in advice.considered if p.gpu.key == "L4")
    assert not l4.fits_memory
    slice_35 = next(p for p in advice.considered if p.gpu.key == "H200 1g.35gb")
    assert slice_35.usd_per_million_tokens == pytest.approx(4.0 * 0.25 * 2 / 7.2e6 * 1e6)
    assert advice.text.startswith("serve llama-3-8b on 2 × L40S: predicted ")
    assert "ITL p95 41 ms against a 50 ms target, $0.56 → $0.25 per M tokens" in advice.text


def decode_bound_on_h100(itl: float = 0.040) -> ServedModel:
    """A 70 B model's decode on eight H100s, 90 % busy, 95 % of it memory-bound."""
    return ServedModel(
        model="llama-3-70b",
        role="decode",
        gpu=sg.H100,
        gpus=8,
        busy_ratio=0.9,
        class_seconds={"idle": 2880.0, "memory": 24624.0, "launch": 1296.0},
        output_tokens_per_second=20000.0,
        itl_p95_seconds=itl,
        memory_used_peak_bytes=76 * GB,
        weights_bytes=weights_from_name("llama-3-70b", gpus_per_replica=8),
        kv_cache_peak_ratio=0.9,
    )


@pytest.mark.parametrize(("h200_price", "moves"), [(3.50, True), (4.50, False)])
def test_a_decode_bound_model_on_h100_moves_to_h200_only_when_the_cost_per_token_falls(
    h200_price: float, moves: bool
) -> None:
    m = decode_bound_on_h100()
    # busy shares: memory 0.95, launch 0.05.  H200: r = 0.95 x 3.35/4.8 + 0.05 = 0.71302
    # GPUs: the ceiling is today's 0.9 (above 0.8): ceil(8 x 0.9 x 0.71302 / 0.9) = ceil(5.704) = 6
    # cost per hour: today 8 x 3.00 = 24; H200 6 x 3.50 = 21 (12.5 % less: move) or 6 x 4.50 = 27 (keep)
    prices = {"H100": 3.00, "H200": h200_price}
    advice = advise_model(m, prices, target_itl_seconds=0.050)
    h200 = next(p for p in advice.considered if p.gpu.key == "H200")
    assert h200.step_ratio == pytest.approx(0.95 * 3.35 / 4.8 + 0.05)
    assert h200.gpus == 6
    assert h200.usd_per_million_tokens == pytest.approx(6 * h200_price / (20000 * 3600) * 1e6)
    # weights 70e9 x 2 / 8 = 17.5 GB a GPU, KV (76 - 17.5) x 0.9 = 52.65 GB, x 1.2 = 84.2 GB: no
    # H100 slice fits (the H200 has more memory than today's GPU, so it fits whatever the need)
    assert not any(p.fits_memory for p in advice.considered if p.gpu.key.startswith("H100 "))
    assert advice.target == ("H200" if moves else "keep"), advice.text


def test_a_candidate_whose_predicted_ttft_exceeds_its_target_is_rejected() -> None:
    """The TTFT p95 target (``--ttft-target``) holds as the ITL one does: TTFT becomes r times today's."""
    m = small_model_on_h200()
    m = ServedModel(**{**m.__dict__, "ttft_p95_seconds": 0.200})
    prices = {"H200": 4.0, "L40S": 0.90, "L4": 0.80}
    # without a TTFT target: the L40S as above (r = 5.1, $0.25 per M), its TTFT 200 ms x 5.1 = 1,020 ms unheld
    assert advise_model(m, prices, target_itl_seconds=0.050).target == "L40S"
    advice = advise_model(m, prices, target_itl_seconds=0.050, target_ttft_seconds=0.500)
    # with 500 ms: L40S 1,020 ms > 500, rejected; H200 1g.35gb (r 3.7) 740 ms > 500, rejected ($0.278);
    #   H200 3g.71gb (r = 0.9 x 4.8/2.4 + 0.1 = 1.9) 380 ms <= 500, 1 GPU, $/M = 4.0 x 0.5 / 7.2e6 x 1e6 = 0.278;
    #   H200 4g.71gb (r 1.9, 380 ms) meets too but costs 4.0 x 4/7 / 7.2e6 x 1e6 = 0.317
    by_gpu = {p.gpu.key: p for p in advice.considered}
    assert by_gpu["L40S"].ttft_p95_seconds == pytest.approx(0.200 * 5.1)
    assert by_gpu["L40S"].itl_p95_seconds <= 0.050 and not by_gpu["L40S"].meets_target
    assert by_gpu["H200 1g.35gb"].ttft_p95_seconds == pytest.approx(0.200 * 3.7)
    assert not by_gpu["H200 1g.35gb"].meets_target
    assert advice.target == "H200 3g.71gb", advice.text
    assert advice.chosen is not None and advice.chosen.ttft_p95_seconds == pytest.approx(0.200 * 1.9)
    assert advice.chosen.usd_per_million_tokens == pytest.approx(4.0 * 0.5 / (2000 * 3600) * 1e6)
    assert "TTFT p95 380 ms against a 500 ms target" in advice.text
    assert (advice.evidence["ttft_target_seconds"], advice.evidence["ttft_target_source"]) == (0.5, "given")
    assert advice.evidence["ttft_p95_seconds"] == 0.200
    # at 300 ms no candidate's TTFT (380 ms at best) meets it: keep, naming both targets
    kept = advise_model(m, prices, target_itl_seconds=0.050, target_ttft_seconds=0.300)
    assert kept.target == "keep", kept.text
    assert "no priced GPU meets the 50 ms ITL p95 and 300 ms TTFT p95 targets and fits" in kept.text
    # a TTFT target but no TTFT measured: no candidate can be shown to meet it
    unmeasured = advise_model(small_model_on_h200(), prices, target_itl_seconds=0.050, target_ttft_seconds=0.500)
    assert unmeasured.target == "keep" and not any(p.meets_target for p in unmeasured.considered)


def test_without_a_ttft_target_no_ttft_is_held() -> None:
    """No default TTFT target: the evidence names none, and a model is advised on its ITL alone."""
    m = ServedModel(**{**small_model_on_h200().__dict__, "ttft_p95_seconds": 5.0})
    advice = advise_model(m, {"H200": 4.0, "L40S": 0.90}, target_itl_seconds=0.050)
    assert "ttft_target_seconds" not in advice.evidence and "TTFT" not in advice.text
    assert advice.target == "L40S", advice.text


def test_a_model_at_its_latency_limit_is_kept() -> None:
    m = decode_bound_on_h100(itl=0.050)
    # at 50 ms against a 50 ms target: every slower GPU fails (L40S r = 0.95 x 3.35/0.864 + 0.05 = 3.73),
    # the faster H200 meets it (35.7 ms) but costs 27 > 24 an hour
    prices = {"H100": 3.00, "H200": 4.50, "L40S": 0.90, "A100": 1.50}
    advice = advise_model(m, prices, target_itl_seconds=0.050)
    assert advice.target == "keep", advice.text
    slower = [p for p in advice.considered if p.step_ratio > 1]
    assert slower and not any(p.meets_target for p in slower)
    assert "no GPU that meets the 50 ms target serves it cheaper" in advice.text


def test_without_a_target_the_target_is_todays_p95_plus_the_stated_margin() -> None:
    advice = advise_model(decode_bound_on_h100(), {"H100": 3.0})
    assert advice.evidence["itl_target_seconds"] == pytest.approx(0.040 * 1.25)
    assert advice.evidence["itl_target_source"] == "today's p95 + 25 %"


def test_no_advice_without_a_measured_class_mix() -> None:
    m = small_model_on_h200()
    coarse = ServedModel(**{**m.__dict__, "class_seconds": {"idle": 5400.0, "busy": 1800.0}})
    advice = advise_model(coarse, {"H200": 4.0, "L40S": 0.9})
    assert advice.target == "no advice"
    assert "no measured class mix" in advice.text
    # the latency target still stands (the Serving page holds the model against it)
    assert advice.evidence["itl_target_seconds"] == pytest.approx(0.008 * 1.25)
    assert advice.evidence["itl_target_source"] == "today's p95 + 25 %"
    given = advise_model(coarse, {"H200": 4.0}, target_itl_seconds=0.004)
    assert (given.evidence["itl_target_seconds"], given.evidence["itl_target_source"]) == (0.004, "given")


def test_a_model_whose_weights_are_unknown_never_moves_to_less_memory() -> None:
    m = small_model_on_h200()
    unknown = ServedModel(**{**m.__dict__, "model": "in-house-chat", "weights_bytes": None})
    advice = advise_model(unknown, {"H200": 4.0, "L40S": 0.9, "B200": 6.0})
    assert all(p.gpu.memory_bytes >= sg.H200.memory_bytes for p in advice.considered if p.fits_memory)
    assert advice.target == "keep", advice.text


def test_an_unbalanced_disaggregated_deployment_moves_gpus_to_the_role_that_holds_the_other_back() -> None:
    prefill = ServedModel(
        "deepseek-r1-distill-70b", "prefill", sg.H200, 2, 0.2, {"compute": 1.0}, 0.0, None, waiting_trend_per_second=0.0
    )
    decode = ServedModel(
        "deepseek-r1-distill-70b",
        "decode",
        sg.H200,
        6,
        0.95,
        {"memory": 1.0},
        9000.0,
        0.03,
        waiting_trend_per_second=0.4,
    )
    # work: prefill 2 x 0.2 = 0.4, decode 6 x 0.95 = 5.7 GPU-seconds a second; 8 GPUs split
    # 8 x 0.4 / 6.1 = 0.52 -> 1 prefill GPU (at least one): move 2 - 1 = 1 GPU to decode
    advice = balance(prefill, decode, kv_link_share=0.12)
    assert (advice.holding_back, advice.move_gpus) == ("decode", 1)
    assert advice.text == (
        "deepseek-r1-distill-70b: decode holds prefill back (decode 95 % busy, queue growing; prefill 20 % busy): "
        "move 1 GPU from prefill to decode; KV transfer uses 12 % of the links"
    )
    steady = balance(prefill, ServedModel(**{**decode.__dict__, "busy_ratio": 0.5, "waiting_trend_per_second": 0.0}))
    assert steady.move_gpus == 0 and "keeps up" in steady.text


def test_step_ratio_scales_each_class_by_its_own_resource() -> None:
    shares = {"compute": 0.5, "memory": 0.3, "transfer": 0.1, "launch": 0.1}
    # H100 -> A100-40GB: compute 989/312, memory 3.35/1.555, PCIe gen 5 -> 4 doubles, launch same
    want = 0.5 * 989 / 312 + 0.3 * 3.35 / 1.555 + 0.1 * 2 + 0.1
    assert step_ratio(shares, sg.H100, sg.A100_40GB) == pytest.approx(want)
    assert step_ratio({"mixed": 1.0}, sg.H100, sg.L40S) == pytest.approx(max(3.35 / 0.864, 989 / 362))


def test_the_table_names_every_model_and_the_nvml_names_map_to_it() -> None:
    assert {g.key for g in sg.WHOLE} == {"A10G", "L4", "L40S", "A100-40GB", "A100-80GB", "H100", "H200", "B200"}
    assert sg.serving_gpu_for("NVIDIA L40S") is sg.L40S
    assert sg.serving_gpu_for("NVIDIA L4") is sg.L4
    assert sg.serving_gpu_for("NVIDIA A10G") is sg.A10G
    assert sg.serving_gpu_for("NVIDIA H100 80GB HBM3") is sg.H100
    mig = sg.serving_gpu_for("NVIDIA H200", "3g.71gb")
    assert mig is not None and mig.key == "H200 3g.71gb" and mig.gpu_share == 0.5
    assert mig.bandwidth_bytes_per_second == pytest.approx(4.8e12 / 2)
    assert sg.serving_gpu_for("NVIDIA T4") is None
    for g in sg.WHOLE:
        assert g.source and g.memory_bytes > 0 and g.bf16_flops > 0


def test_weights_from_the_name() -> None:
    assert weights_from_name("meta-llama/Llama-3.1-8B-Instruct") == 16e9
    assert weights_from_name("qwen2.5-1.5b") == 3e9
    assert weights_from_name("mixtral-8x7b") is None
    assert weights_from_name("gpt-oss") is None
