"""The metric catalogue: every series gpulens exports, with type, unit, help and labels.

The collector builds its families from here, docs/metrics.md is generated from here
(``python -m exporter.metrics --markdown``), and the dashboard imports names from here.
Renaming an entry breaks users' dashboards and alerts: change it only on purpose.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Literal

MetricType = Literal["gauge", "counter"]

GPU_LABELS: tuple[str, ...] = ("gpu", "uuid")
"""Physical-GPU identity: index and UUID."""

LEAF_LABELS: tuple[str, ...] = (
    "gpu",
    "uuid",
    "mig_uuid",
    "gpu_instance_id",
    "compute_instance_id",
    "mig_profile",
)
"""Leaf identity (whole GPU or MIG instance); the MIG labels are empty for whole GPUs."""

POD_LABELS: tuple[str, ...] = ("namespace", "pod", "container")


@dataclass(frozen=True)
class MetricSpec:
    """One metric family of the public contract."""

    name: str
    type: MetricType
    unit: str
    """Base unit (``bytes``, ``seconds``, ``watts``, ``joules``, ``hertz``, ``celsius``,
    ``ratio``) or ``""`` for counts, states and info series."""
    help: str
    labels: tuple[str, ...] = ()
    section: str = "core"
    """Which part of the exporter renders it (docs grouping)."""


def _g(name: str, unit: str, help_: str, labels: tuple[str, ...] = (), section: str = "device") -> MetricSpec:
    return MetricSpec(name, "gauge", unit, help_, labels, section)


def _c(name: str, unit: str, help_: str, labels: tuple[str, ...] = (), section: str = "device") -> MetricSpec:
    return MetricSpec(name, "counter", unit, help_, labels, section)


CATALOGUE: tuple[MetricSpec, ...] = (
    # --- self-health -------------------------------------------------------------------
    _g("gpulens_up", "", "1 when the GPU backend (NVML or simulator) answers, else 0.", (), "self"),
    _g(
        "gpulens_build_info",
        "",
        "Exporter build: version and the backend in use (nvml or sim); always 1.",
        ("version", "backend"),
        "self",
    ),
    _g(
        "gpulens_stage_success",
        "",
        "1 if the pipeline stage succeeded in the newest snapshot, 0 if it failed (its series are absent).",
        ("stage",),
        "self",
    ),
    _g(
        "gpulens_stage_duration_seconds",
        "seconds",
        "Wall time the pipeline stage took in the newest snapshot.",
        ("stage",),
        "self",
    ),
    _g(
        "gpulens_snapshot_age_seconds",
        "seconds",
        "Age of the snapshot this scrape rendered; grows if sampling is stuck.",
        (),
        "self",
    ),
    _c(
        "gpulens_nvml_errors_total",
        "",
        "NVML calls that failed with a transient error, by NVML error code.",
        ("code",),
        "self",
    ),
    # --- identity ----------------------------------------------------------------------
    _g(
        "gpulens_gpu_info",
        "",
        "Identity of a physical GPU; always 1. Join on uuid.",
        ("gpu", "uuid", "name", "pci_bus_id", "driver_version", "compute_capability", "mig_mode"),
    ),
    _g("gpulens_gpu_up", "", "1 if the GPU answers, 0 if it is lost or unreadable.", GPU_LABELS),
    _g(
        "gpulens_mig_instance_info",
        "",
        "Identity of a MIG instance on its physical GPU; always 1.",
        ("gpu", "uuid", "mig_uuid", "gpu_instance_id", "compute_instance_id", "mig_profile"),
    ),
    # --- utilisation (NVML) ------------------------------------------------------------
    _g(
        "gpulens_gpu_utilization_ratio",
        "ratio",
        "NVML GPU-Util: fraction of time one or more kernels ran (what nvidia-smi shows). "
        "Not SM activity: see gpulens_gpu_sm_active_ratio.",
        GPU_LABELS,
    ),
    _g(
        "gpulens_gpu_memory_utilization_ratio",
        "ratio",
        "NVML util.mem: fraction of time the memory controller was busy (not capacity used).",
        GPU_LABELS,
    ),
    # --- GPM profiling (per leaf) ------------------------------------------------------
    _g(
        "gpulens_gpu_sm_active_ratio",
        "ratio",
        "GPM: fraction of SM cycles with a warp resident.",
        LEAF_LABELS,
    ),
    _g(
        "gpulens_gpu_sm_occupancy_ratio",
        "ratio",
        "GPM: resident warps as a fraction of the SMs' maximum.",
        LEAF_LABELS,
    ),
    _g("gpulens_gpu_tensor_active_ratio", "ratio", "GPM: tensor pipe activity (any precision).", LEAF_LABELS),
    _g("gpulens_gpu_fp64_active_ratio", "ratio", "GPM: FP64 pipe activity.", LEAF_LABELS),
    _g("gpulens_gpu_fp32_active_ratio", "ratio", "GPM: FP32 pipe activity.", LEAF_LABELS),
    _g("gpulens_gpu_fp16_active_ratio", "ratio", "GPM: FP16 pipe activity.", LEAF_LABELS),
    _g(
        "gpulens_gpu_dram_active_ratio",
        "ratio",
        "GPM: DRAM bandwidth used as a fraction of peak (roofline x).",
        LEAF_LABELS,
    ),
    _g(
        "gpulens_gpu_pipe_active_max_ratio",
        "ratio",
        "Highest of the tensor/FP64/FP32/FP16 pipe activities (roofline y).",
        LEAF_LABELS,
    ),
    _g(
        "gpulens_gpu_busy_ratio",
        "ratio",
        "Busy ratio: fraction of time the leaf ran work (GPM graphics-engine activity; NVML GPU-Util "
        "where GPM lacks it). The boundness class says what limits the leaf during this time.",
        LEAF_LABELS,
    ),
    _c(
        "gpulens_gpu_busy_seconds_total",
        "seconds",
        "Integral of gpulens_gpu_busy_ratio over time; rate() gives the exact busy ratio of any window.",
        LEAF_LABELS,
    ),
    _c(
        "gpulens_gpu_sm_active_seconds_total",
        "seconds",
        "Integral of gpulens_gpu_sm_active_ratio over time; rate() gives the exact mean.",
        LEAF_LABELS,
    ),
    _c(
        "gpulens_gpu_tensor_active_seconds_total",
        "seconds",
        "Integral of gpulens_gpu_tensor_active_ratio over time.",
        LEAF_LABELS,
    ),
    _c(
        "gpulens_gpu_dram_active_seconds_total",
        "seconds",
        "Integral of gpulens_gpu_dram_active_ratio over time.",
        LEAF_LABELS,
    ),
    # --- memory (per leaf) -------------------------------------------------------------
    _g("gpulens_gpu_memory_used_bytes", "bytes", "Device memory in use on the leaf.", LEAF_LABELS),
    _g("gpulens_gpu_memory_total_bytes", "bytes", "Device memory of the leaf.", LEAF_LABELS),
    _g(
        "gpulens_gpu_compute_processes",
        "",
        "Compute processes running work on the leaf (tenants; an MPS server is not counted).",
        LEAF_LABELS,
    ),
    # --- physical ----------------------------------------------------------------------
    _g("gpulens_gpu_power_watts", "watts", "Power draw.", GPU_LABELS),
    _g("gpulens_gpu_power_limit_watts", "watts", "Enforced power limit.", GPU_LABELS),
    _c(
        "gpulens_gpu_energy_joules_total",
        "joules",
        "Energy used since the exporter first saw the GPU (monotonic across driver counter resets).",
        GPU_LABELS,
    ),
    _g("gpulens_gpu_temperature_celsius", "celsius", "GPU die temperature.", GPU_LABELS),
    _g("gpulens_gpu_memory_temperature_celsius", "celsius", "HBM temperature.", GPU_LABELS),
    _g("gpulens_gpu_fan_speed_ratio", "ratio", "Fan speed as a fraction of maximum.", GPU_LABELS),
    _g("gpulens_gpu_sm_clock_hertz", "hertz", "SM clock.", GPU_LABELS),
    _g("gpulens_gpu_sm_clock_max_hertz", "hertz", "Maximum SM clock.", GPU_LABELS),
    _g("gpulens_gpu_memory_clock_hertz", "hertz", "Memory clock.", GPU_LABELS),
    _g(
        "gpulens_gpu_clock_event_active",
        "",
        "1 while the clock event (throttle) reason holds the clocks down, else 0.",
        (*GPU_LABELS, "reason"),
    ),
    _g("gpulens_gpu_pcie_tx_bytes_per_second", "bytes", "PCIe transmit throughput (bytes/s).", GPU_LABELS),
    _g("gpulens_gpu_pcie_rx_bytes_per_second", "bytes", "PCIe receive throughput (bytes/s).", GPU_LABELS),
    _g("gpulens_gpu_pcie_link_generation", "", "Current PCIe link generation.", GPU_LABELS),
    _g("gpulens_gpu_pcie_link_width", "", "Current PCIe link width (lanes).", GPU_LABELS),
    _c("gpulens_gpu_pcie_replay_errors_total", "", "PCIe replay counter.", GPU_LABELS),
    _g("gpulens_gpu_nvlink_tx_bytes_per_second", "bytes", "NVLink transmit throughput (bytes/s).", GPU_LABELS),
    _g("gpulens_gpu_nvlink_rx_bytes_per_second", "bytes", "NVLink receive throughput (bytes/s).", GPU_LABELS),
    # --- health ------------------------------------------------------------------------
    _c(
        "gpulens_gpu_ecc_errors_total",
        "",
        "Volatile ECC errors since the driver loaded, by severity (corrected, uncorrected).",
        (*GPU_LABELS, "severity"),
    ),
    _g(
        "gpulens_gpu_remapped_rows",
        "",
        "HBM rows remapped, by cause (correctable, uncorrectable).",
        (*GPU_LABELS, "cause"),
    ),
    _g("gpulens_gpu_row_remap_pending", "", "1 if a row remap waits for a GPU reset.", GPU_LABELS),
    _g("gpulens_gpu_row_remap_failure", "", "1 if a row remap failed.", GPU_LABELS),
    _c(
        "gpulens_gpu_xid_errors_total",
        "",
        "Xid events seen since the exporter started, by Xid code.",
        (*GPU_LABELS, "xid"),
    ),
    # --- analysis ----------------------------------------------------------------------
    _g(
        "gpulens_gpu_boundness",
        "",
        "What limits the leaf while it works, over the analysis window: exactly one class is 1 "
        "(idle, launch, latency, memory, compute, mixed). Absent without GPM. How much of the time "
        "it works is gpulens_gpu_busy_ratio.",
        (*LEAF_LABELS, "class"),
        "analysis",
    ),
    _g(
        "gpulens_pod_gpu_boundness",
        "",
        "The container's class on a leaf it holds: exactly one class is 1 (idle, launch, latency, "
        "memory, compute, mixed, shared). The leaf's class while the pod is its only holder or the "
        "only pod with processes on it; shared when several pods run there (the leaf's class "
        "describes none of them alone); idle for a pod with no process on a leaf others use. "
        "Absent when the leaf has no class.",
        (*POD_LABELS, "uuid", "mig_uuid", "class"),
        "analysis",
    ),
    _g(
        "gpulens_gpu_analysis_info",
        "",
        "Which signals the leaf's analysis used: signals=gpm (boundness exported) or nvml (no GPM).",
        (*LEAF_LABELS, "signals"),
        "analysis",
    ),
    # --- attribution -------------------------------------------------------------------
    _g(
        "gpulens_pod_gpu_allocation",
        "",
        "1 per device the kubelet allocated to a container; the join key for per-pod views.",
        (*POD_LABELS, "uuid", "mig_uuid", "replica", "resource", "workload_kind", "workload"),
        "attribution",
    ),
    _g(
        "gpulens_pod_gpu_memory_used_bytes",
        "bytes",
        "Device memory used by the container's processes on the GPU.",
        (*POD_LABELS, "uuid"),
        "attribution",
    ),
    _g(
        "gpulens_pod_gpu_sm_share_ratio",
        "ratio",
        "The container's share of SM time on the GPU over the last window (per-process utilisation). "
        "Absent under MPS: the driver reports per-process utilisation only for the MPS server, so it "
        "cannot be split between the clients.",
        (*POD_LABELS, "uuid"),
        "attribution",
    ),
    _g(
        "gpulens_gpu_sharing_info",
        "",
        "How the leaf is shared, always 1: mode is exclusive, time-slicing (the device plugin "
        "advertises replicas), mps (NVML lists an MPS server or MPS clients on it) or mig.",
        (*LEAF_LABELS, "mode"),
        "attribution",
    ),
    _g(
        "gpulens_gpu_sharing_replicas",
        "",
        "Time-slicing replicas the device plugin advertises for the GPU.",
        ("uuid",),
        "attribution",
    ),
    _g(
        "gpulens_gpu_sharing_pods",
        "",
        "Pods holding a time-slicing replica of the GPU.",
        ("uuid",),
        "attribution",
    ),
    _c(
        "gpulens_unmapped_devices_total",
        "",
        "Device IDs from the kubelet that matched no GPU on this node, by reason.",
        ("reason",),
        "attribution",
    ),
    _g(
        "gpulens_pod_gpu_allocation_conflicts",
        "",
        "Exclusive devices the kubelet lists under more than one pod (all holders are shown); non-zero "
        "when an old kubelet still lists a finished pod and the API cannot say which one runs.",
        (),
        "attribution",
    ),
    _g(
        "gpulens_podresources_last_success_timestamp_seconds",
        "seconds",
        "Unix time of the last successful kubelet PodResources refresh.",
        (),
        "attribution",
    ),
    # --- probes ------------------------------------------------------------------------
    _g(
        "gpulens_probe_bandwidth_bytes_per_second",
        "bytes",
        "Cached result of the last successful bandwidth probe (bytes/s); see "
        "gpulens_probe_last_success_timestamp_seconds for when it ran.",
        (*LEAF_LABELS, "probe"),
        "probes",
    ),
    _g(
        "gpulens_probe_efficiency_ratio",
        "ratio",
        "Cached probe bandwidth divided by what a healthy GPU of this model reaches (probes/expected.py). "
        "Leaf labels as on every leaf series: uuid is the physical GPU, mig_uuid the probed MIG instance.",
        (*LEAF_LABELS, "probe"),
        "probes",
    ),
    _g(
        "gpulens_probe_last_success_timestamp_seconds",
        "seconds",
        "Unix time of the probe's last successful run.",
        (*LEAF_LABELS, "probe"),
        "probes",
    ),
    _c(
        "gpulens_probe_runs_total",
        "",
        "Probe runs by result (ok, skipped_busy, skipped_memory, skipped_allocated, "
        "skipped_exclusive, failed, timeout).",
        (*LEAF_LABELS, "result"),
        "probes",
    ),
)

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in CATALOGUE}


def spec(name: str) -> MetricSpec:
    """The catalogue entry for ``name``; KeyError names the unknown metric."""
    return BY_NAME[name]


def markdown() -> str:
    """docs/metrics.md: the catalogue as a table per section (generated; do not edit by hand)."""
    titles = {
        "self": "Exporter self-health",
        "device": "Devices (NVML and GPM)",
        "analysis": "Analysis",
        "attribution": "Pod attribution",
        "probes": "Probes",
    }
    out = [
        "# Metrics",
        "",
        "Generated from `exporter/metrics.py` by `python -m exporter.metrics --markdown > docs/metrics.md`;",
        "a test fails when this file and the catalogue drift. Ratios are 0..1; unsupported values are",
        "omitted, never 0 or NaN. MIG labels (`mig_uuid`, `gpu_instance_id`, `compute_instance_id`,",
        "`mig_profile`) are empty on whole-GPU series.",
        "",
    ]
    for section, title in titles.items():
        rows = [m for m in CATALOGUE if m.section == section]
        if not rows:
            continue
        out += [f"## {title}", "", "| name | type | unit | labels | help |", "|---|---|---|---|---|"]
        for m in rows:
            labels = ", ".join(f"`{label}`" for label in m.labels)
            out.append(f"| `{m.name}` | {m.type} | {m.unit or '-'} | {labels} | {m.help} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """CLI: print the catalogue as markdown."""
    parser = argparse.ArgumentParser(prog="python -m exporter.metrics")
    parser.add_argument("--markdown", action="store_true", help="print docs/metrics.md")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown())
        return 0
    parser.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
