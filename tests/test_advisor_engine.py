"""The right-sizing engine on a table of workloads, each with the reasoning a capacity planner
would give; the expected action, target and saving follow from docs/advisor.md's rules."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from dashboard.advisor.engine import (
    GPU_GPU,
    HOST_DEVICE,
    Action,
    Policy,
    WorkloadUsage,
    price_for,
    recommend,
    recommend_all,
)
from dashboard.advisor.profiles import H200, model_for

GIB = 2**30
WEEK = 168.0
PRICES = {"H200": 3.5, "H100": 2.5}


def usage(**kw: object) -> WorkloadUsage:
    base = dict(
        namespace="ns",
        workload_kind="Deployment",
        workload="w",
        gpu_model="NVIDIA H200",
        device_hours_held=WEEK,
        device_hours_idle=0.0,
    )
    base.update(kw)
    return WorkloadUsage(**base)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Case:
    name: str
    usage: WorkloadUsage
    action: Action
    target: str
    saved_gpu_hours: float
    why: str


CASES = [
    Case(
        "small inference pod on an H200",
        usage(memory_peak_bytes=9 * GIB, sm_active_p95=0.12, sm_active_mean=0.10, dram_active_p95=0.05,
              boundness={"latency": 0.9, "idle": 0.1}, device_hours_idle=16.8),
        Action.MIG, "1g.18gb", WEEK * 6 / 7,
        "9 GiB x 1.2 = 10.8 GiB fits 1g.18gb (18 GB); SM p95 12 % x 1.1 = 13.2 % fits one of seven compute "
        "slices (14.3 %); steady (p95/mean 1.2) so not a time-slicing candidate; saves 6/7 of the GPU",
    ),
    Case(
        "large tensor training job",
        usage(memory_peak_bytes=120 * GIB, sm_active_p95=0.97, sm_active_mean=0.95, dram_active_p95=0.2,
              boundness={"compute": 0.95, "idle": 0.05}, device_hours_idle=8.4),
        Action.KEEP, "keep", 0.0,
        "120 GiB x 1.2 exceeds every slice below the whole GPU and 95 % SM needs all seven slices",
    ),
    Case(
        "memory-bound job on two H100s",
        usage(gpu_model="NVIDIA H100 80GB HBM3", devices=2, device_hours_held=2 * WEEK,
              device_hours_idle=0.1 * 2 * WEEK,
              memory_peak_bytes=60 * GIB, sm_active_p95=0.99, sm_active_mean=0.9, dram_active_p95=0.88,
              boundness={"memory": 0.8, "latency": 0.1, "idle": 0.1}),
        Action.BANDWIDTH, "H200", 2 * WEEK * 0.8 * (1 - 3.35 / 4.8),
        "memory-bound 89 % of its busy time with DRAM p95 88 %: the memory-bound 80 % of its hours shrink by "
        "H100/H200 bandwidth (3.35/4.8 TB/s); the rest does not",
    ),
    Case(
        "idle holder",
        usage(memory_peak_bytes=2 * GIB, sm_active_p95=0.0, sm_active_mean=0.0, dram_active_p95=0.0,
              boundness={"idle": 0.98, "latency": 0.02}, device_hours_idle=0.98 * WEEK),
        Action.RELEASE, "release", 0.98 * WEEK,
        "idle 98 % of the week it held the GPU; only the idle hours are counted as saved",
    ),
    Case(
        "bursty notebook",
        usage(workload_kind="StatefulSet", memory_peak_bytes=30 * GIB, sm_active_p95=0.5, sm_active_mean=0.04,
              dram_active_p95=0.2, boundness={"idle": 0.6, "latency": 0.3, "compute": 0.1},
              device_hours_idle=0.6 * WEEK),
        Action.SHARE, "time-slicing or MPS", WEEK * (1 - 30 * GIB * 1.2 / H200.memory_bytes),
        "mean SM 4 % (light) with bursts to 50 % (p95/mean 12.5, bursty): a MIG slice sized for the bursts "
        "(4g.71gb, 4/7 of the GPU) frees less than sharing, which needs only its memory (36 GiB = 27 % of 141 GB)",
    ),
    Case(
        "peak memory above every MIG slice",
        usage(memory_peak_bytes=100 * GIB, sm_active_p95=0.35, sm_active_mean=0.25, dram_active_p95=0.3,
              boundness={"latency": 0.7, "compute": 0.2, "idle": 0.1}, device_hours_idle=16.8),
        Action.KEEP, "keep", 0.0,
        "100 GiB x 1.2 = 129 GB > 4g.71gb (71 GB), the largest slice below a whole GPU: no MIG profile would "
        "have held the peak; not light (mean 25 %), so no sharing either",
    ),
    Case(
        "oversized MIG slice",
        usage(mig_profile="3g.71gb", memory_peak_bytes=10 * GIB, sm_active_p95=0.2, sm_active_mean=0.15,
              dram_active_p95=0.1, boundness={"latency": 0.9, "idle": 0.1}, device_hours_idle=16.8),
        Action.MIG, "1g.18gb", WEEK * 3 / 7 * (1 - (1 / 7) / 0.5),
        "20 % of a 3/7 slice is 8.6 % of the GPU; x 1.1 fits 1/7. It held 3/7 of a GPU in GPU-hours (compute "
        "slices, the one weighting of dashboard/definitions.py); its 3g.71gb takes half the GPU from others (4 of "
        "8 memory slices), a 1g.18gb one seventh, so 1 - (1/7)/(1/2) of those hours are saved",
    ),
    Case(
        "launch-bound pod looks idle by SM activity but is not",
        usage(memory_peak_bytes=4 * GIB, sm_active_p95=0.001, sm_active_mean=0.0003, dram_active_p95=0.0,
              boundness={"launch": 0.95, "idle": 0.05}, device_hours_idle=0.96 * WEEK),
        Action.MIG, "1g.18gb", WEEK * 6 / 7,
        "its kernels run back to back (launch class 95 %), so it is not released; it needs few SMs, so a slice",
    ),
    Case(
        "transfer-bound ingest job copying host memory to the GPU",
        usage(workload_kind="Job", memory_peak_bytes=20 * GIB, sm_active_p95=0.3, sm_active_mean=0.045,
              dram_active_p95=0.01, pcie_utilization_p95=0.8, nvlink_utilization_p95=0.0,
              boundness={"transfer": 0.85, "compute": 0.15}),
        Action.TRANSFER, HOST_DEVICE, 0.0,
        "light (mean 4.5 %) and bursty (p95 30 %) by SM activity, which alone would say time-slicing, but 85 % "
        "of its busy time its PCIe link (p95 80 % of capacity) is the limit: fewer SMs or a neighbour would not "
        "shorten its copies; the fix is in how it moves data, and no GPU-hours are claimed",
    ),
    Case(
        "transfer-bound MIG instance, idle by SM activity alone",
        usage(mig_profile="3g.71gb", memory_peak_bytes=5 * GIB, sm_active_p95=0.002, sm_active_mean=0.001,
              dram_active_p95=0.01, pcie_utilization_p95=0.75,
              boundness={"transfer": 0.95, "idle": 0.05}, device_hours_idle=0.96 * WEEK),
        Action.TRANSFER, HOST_DEVICE, 0.0,
        "a MIG instance has no GPU-Util: only the class says data moved. Idle hours counted by SM activity "
        "(96 %) do not release it (transfer 95 % of the held time), and 5 GiB / 0.2 % SM would fit a 1g.18gb, "
        "but its copies would not get faster on one",
    ),
    Case(
        "tensor-parallel shard waiting on NVLink",
        usage(memory_peak_bytes=40 * GIB, sm_active_p95=0.25, sm_active_mean=0.08, dram_active_p95=0.2,
              pcie_utilization_p95=0.02, nvlink_utilization_p95=0.7,
              boundness={"transfer": 0.6, "compute": 0.3, "idle": 0.1}, device_hours_idle=0.1 * WEEK),
        Action.TRANSFER, GPU_GPU, 0.0,
        "transfer-bound 67 % of busy time on NVLink (p95 70 %), not PCIe: GPU-to-GPU exchange, so the advice is "
        "about collectives and the parallelism layout, not host copies",
    ),
    Case(
        "a few minutes of history",
        usage(device_hours_held=0.3, memory_peak_bytes=1 * GIB, sm_active_p95=0.01, sm_active_mean=0.01),
        Action.KEEP, "keep", 0.0,
        "18 minutes say nothing about a week",
    ),
    Case(
        "GPU model without a profile table",
        usage(gpu_model="NVIDIA L4", memory_peak_bytes=1 * GIB, sm_active_p95=0.05, sm_active_mean=0.04),
        Action.KEEP, "keep", 0.0,
        "no MIG table and no bandwidth figure for an L4: the advisor does not guess",
    ),
    Case(
        "memory not measured",
        usage(memory_peak_bytes=None, sm_active_p95=0.05, sm_active_mean=0.04),
        Action.KEEP, "keep", 0.0,
        "without the peak no slice can be shown to hold it (conservative)",
    ),
    Case(
        "small inference pod on an A30",
        usage(gpu_model="NVIDIA A30", memory_peak_bytes=4 * GIB, sm_active_p95=0.18, sm_active_mean=0.15,
              dram_active_p95=0.05, boundness={"latency": 1.0}),
        Action.MIG, "1g.6gb", WEEK * 3 / 4,
        "4 GiB x 1.2 = 4.8 GiB fits 1g.6gb (6 GB); SM p95 18 % x 1.1 = 19.8 % fits one of the A30's FOUR "
        "compute slices (25 %), though it would not fit a seventh; saves 3/4 of the GPU",
    ),
    Case(
        "medium job on an A100 PCIe 40GB",
        usage(gpu_model="NVIDIA A100-PCIE-40GB", memory_peak_bytes=15 * GIB, sm_active_p95=0.3, sm_active_mean=0.25,
              dram_active_p95=0.1, boundness={"latency": 1.0}),
        Action.MIG, "3g.20gb", WEEK * 0.5,
        "15 GiB x 1.2 = 18 GiB needs a 20 GB slice; 3g.20gb has 3/7 of the SMs (43 % >= 33 %) and takes half "
        "the memory, so half the GPU is freed",
    ),
    Case(
        "memory-bound job on an H100 NVL",
        usage(gpu_model="NVIDIA H100 NVL", memory_peak_bytes=60 * GIB, sm_active_p95=0.99, sm_active_mean=0.9,
              dram_active_p95=0.88, boundness={"memory": 0.8, "latency": 0.1, "idle": 0.1},
              device_hours_idle=0.1 * WEEK),
        Action.BANDWIDTH, "H200", WEEK * 0.8 * (1 - 3.9 / 4.8),
        "memory-bound; the H100 NVL's 3.9 TB/s against the H200's 4.8 TB/s shrinks the memory-bound 80 %",
    ),
    Case(
        "already time-sliced",
        usage(shared=True, memory_peak_bytes=3 * GIB, sm_active_p95=0.05, sm_active_mean=0.02, device_hours_held=50.0),
        Action.KEEP, "keep", 0.0,
        "it already shares its GPU",
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_recommendation_table(case: Case) -> None:
    rec = recommend(case.usage, PRICES)
    assert (rec.action, rec.target) == (case.action, case.target), (case.why, rec.reason)
    assert rec.gpu_hours_saved == pytest.approx(case.saved_gpu_hours, rel=1e-6, abs=1e-9), case.why
    assert rec.reason, "every recommendation says why"
    price = price_for(case.usage.gpu_model, PRICES)
    if case.action != Action.BANDWIDTH and price is not None:
        assert rec.cost_saved_usd == pytest.approx(case.saved_gpu_hours * price)


def test_transfer_bound_advice_shows_its_reason_and_evidence() -> None:
    rec = recommend(next(c.usage for c in CASES if c.name.startswith("transfer-bound ingest")), PRICES)
    assert rec.reason.startswith("transfer-bound 85 % of busy time, PCIe p95 80 % of capacity"), rec.reason
    for advice in ("pinned", "larger copies", "resident on the GPU", "overlapped with compute", "GPUDirect"):
        assert advice in rec.reason, advice
    assert rec.evidence["transfer_bound_share_of_busy"] == pytest.approx(0.85)
    assert rec.evidence["pcie_utilization_p95"] == 0.8
    assert rec.cost_saved_usd == 0.0
    unmeasured = recommend(usage(boundness={"transfer": 0.9, "idle": 0.1}, device_hours_idle=0.1 * WEEK))
    assert (unmeasured.action, unmeasured.target) == (Action.TRANSFER, HOST_DEVICE)
    assert "link use not measured" in unmeasured.reason


@pytest.mark.parametrize("profile", ["", "3g.71gb", "7g.141gb"])
def test_transfer_bound_work_is_never_shrunk_shared_or_released(profile: str) -> None:
    """Whatever its memory, SM activity and (SM-only) idle hours, a workload transfer-bound for most
    of its busy time gets advice on its data movement: never a smaller slice, time-slicing or release."""
    seen: set[Action] = set()
    for peak_gib in (1, 9, 30, 60):
        for sm_p95, sm_mean in ((0.0, 0.0), (0.05, 0.01), (0.3, 0.04), (0.6, 0.15)):
            for transfer, idle in ((0.5, 0.0), (0.3, 0.7), (0.06, 0.94), (0.95, 0.05)):
                u = usage(mig_profile=profile, memory_peak_bytes=peak_gib * GIB, sm_active_p95=sm_p95,
                          sm_active_mean=sm_mean, pcie_utilization_p95=0.8,
                          boundness={"transfer": transfer, "compute": 1 - transfer - idle, "idle": idle},
                          device_hours_idle=max(idle, 0.9) * WEEK)  # fmt: skip
                rec = recommend(u, PRICES)
                seen.add(rec.action)
                assert rec.action not in {Action.MIG, Action.SHARE, Action.RELEASE}, (u, rec.reason)
                assert rec.gpu_hours_saved == 0.0
    assert seen == {Action.TRANSFER}
    # the same mixes without the transfer class get shrunk, shared or released: the sweep reaches them
    assert recommend(usage(mig_profile=profile, memory_peak_bytes=1 * GIB, sm_active_p95=0.05,
                           sm_active_mean=0.01, device_hours_idle=0.94 * WEEK,
                           boundness={"compute": 0.06, "idle": 0.94})).action == Action.RELEASE  # fmt: skip


def test_recommended_slice_always_holds_the_observed_peak_times_headroom() -> None:
    model = H200
    targets: set[str] = set()
    for peak_gib in range(1, 140, 3):
        for p95 in (0.0, 0.05, 0.1, 0.2, 0.3, 0.6):
            rec = recommend(usage(memory_peak_bytes=peak_gib * GIB, sm_active_p95=p95, sm_active_mean=p95))
            if rec.action != Action.MIG:
                continue
            targets.add(rec.target)
            prof = model.profile(rec.target)
            assert prof is not None
            assert prof.memory_bytes >= peak_gib * GIB * 1.2, (peak_gib, p95, rec.target)
            assert prof.compute_fraction >= p95 * 1.1
    # The sweep must reach the checks above, across slices of different memory and compute sizes
    # (otherwise it passes without asserting anything).
    assert {"1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb"} <= targets, targets


def test_compute_headroom_is_a_knob() -> None:
    # 12 % x 1.2 = 14.4 % > 1/7 = 14.3 %: one compute slice is no longer enough, two are
    small = CASES[0].usage
    rec = recommend(small, PRICES, Policy(compute_headroom=1.2))
    assert (rec.action, rec.target) == (Action.MIG, "2g.35gb")


def test_larger_memory_headroom_picks_a_larger_slice() -> None:
    rec = recommend(replace(CASES[0].usage, memory_peak_bytes=16 * GIB), PRICES)
    assert rec.target == "1g.35gb", "16 GiB x 1.2 = 20.6 GB does not fit 18 GB"


def test_headroom_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Policy(headroom=0.9)


def test_higher_bandwidth_cost_can_be_negative_when_the_faster_gpu_is_pricier() -> None:
    rec = recommend(CASES[2].usage, {"H100": 2.5, "H200": 3.5})
    held = 2 * WEEK
    new_hours = held - rec.gpu_hours_saved
    assert rec.cost_saved_usd == pytest.approx(held * 2.5 - new_hours * 3.5)
    assert rec.cost_saved_usd is not None and rec.cost_saved_usd < 0
    assert recommend(CASES[2].usage, {"H100": 2.5}).cost_saved_usd is None, "no H200 price, no cost claim"


def test_no_price_means_no_cost_and_star_is_the_default() -> None:
    assert recommend(CASES[3].usage).cost_saved_usd is None
    assert recommend(CASES[3].usage, {"*": 2.0}).cost_saved_usd == pytest.approx(0.98 * WEEK * 2.0)


def test_evidence_carries_the_numbers_used() -> None:
    rec = recommend(CASES[0].usage, PRICES)
    assert rec.evidence["memory_peak_bytes"] == 9 * GIB
    assert rec.evidence["sm_active_p95"] == 0.12
    assert rec.evidence["memory_needed_bytes"] == pytest.approx(9 * GIB * 1.2)
    assert rec.evidence["gpu_hours_held"] == WEEK


def test_recommend_all_orders_by_saving() -> None:
    recs = recommend_all([c.usage for c in CASES[:6]], PRICES)
    saved = [r.gpu_hours_saved for r in recs]
    assert saved == sorted(saved, reverse=True)
    assert recs[0].action == Action.RELEASE


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIe"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB-PCIe"),
        ("NVIDIA A30", "A30"),
        ("NVIDIA H200 NVL", "H200"),
        ("NVIDIA L4", None),
    ],
)
def test_model_names_from_nvml(name: str, key: str | None) -> None:
    m = model_for(name)
    assert (m.key if m else None) == key


def test_profile_tables_are_ordered_and_conservative() -> None:
    from dashboard.advisor.profiles import MODELS

    for m in MODELS:
        shares = [p.gpu_share for p in m.mig_profiles]
        assert shares == sorted(shares) and shares[-1] == 1.0, m.key
        assert m.mig_profiles[-1].memory_bytes <= m.memory_bytes
