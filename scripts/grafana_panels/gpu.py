"""The One GPU board: one GPU picked by node and GPU index, over time."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from exporter.model import BOUNDNESS_CLASSES

from .model import (
    CL,
    GPU,
    GPU_LEGEND,
    IDLE_WORDS,
    LEAF,
    LEAF_COLUMNS,
    NODE_GPU,
    PCT,
    POD_COLUMNS,
    Board,
    Panel,
    Table,
    leaf_of,
    limit,
    t,
)
from .series import clock_events, clock_lines, link_rate, memory_temperature_lines, power_lines, temperature_lines, xids

# --- one GPU -----------------------------------------------------------------------------------------
ONE = 'cluster=~"$cluster", node=~"$node", gpu=~"$gpu"'
WHOLE = f'{ONE}, mig_uuid=""'
"""The picked GPU as a whole (its MIG instances, if any, have panels of their own)."""
INSTANCES = f'{ONE}, mig_uuid!=""'
CLASS_NUMBERS: Mapping[str, str] = MappingProxyType({str(i + 1): c for i, c in enumerate(BOUNDNESS_CLASSES)})
"""Each boundness class as a number (a state timeline colours values; the mapping names them)."""


def class_band(dev: str) -> str:
    """Each leaf's class as its number in ``CLASS_NUMBERS``: one band per leaf, coloured by class."""
    each = " or ".join(
        f'(max by (node, gpu, mig_profile, gpu_instance_id) (gpulens_gpu_boundness{{{dev}, class="{c}"}} == 1)'
        f" * 0 + {n})"
        for n, c in CLASS_NUMBERS.items()
    )
    return f"max by (node, gpu, mig_profile, gpu_instance_id) ({each})"


GPU_BOARD = Board(
    GPU,
    "gpulens / One GPU",
    "One GPU over time (pick its node and GPU index): who holds it, how busy, what limits it, its "
    "temperature, power and clocks against its own limits, its links and errors.",
    (
        (
            "Who and how busy",
            (
                Panel(
                    "Pods holding it",
                    "table",
                    (
                        t(
                            f"max by (cluster, namespace, pod, container, workload, node, gpu, mig_profile) "
                            f"(gpulens:pod_gpu_activity:ratio_avg5m{{{ONE}}})",
                            instant=True,
                        ),
                    ),
                    unit=PCT,
                    width=24,
                    height=6,
                    table=Table(
                        (*POD_COLUMNS, ("container", "Container"), ("workload", "Workload"), *LEAF_COLUMNS),
                        ("Activity",),
                        sort="Pod",
                    ),
                    no_value="No pod holds it.",
                ),
                Panel(
                    "Idle verdict and what it reads",
                    "timeseries",
                    (
                        t(f"gpulens:gpu_activity:ratio_avg5m{{{WHOLE}}}", "activity"),
                        t(
                            f"gpulens:gpu_kernels_active:bool{{{CL}}}"
                            f" * on (uuid, mig_uuid) group_left (node, gpu, mig_profile) {leaf_of(WHOLE)}",
                            "kernels running",
                        ),
                        t(f"gpulens:gpu_transfer:ratio_avg5m{{{WHOLE}}}", "transfer share"),
                        t(f"gpulens:gpu_idle:bool{{{WHOLE}}}", "idle"),
                    ),
                    unit=PCT,
                    description="The idle verdict (1 idle) and its inputs: activity over 5 m, kernels running "
                    "(GPU-Util), transfer share (gpulens:gpu_idle:bool, gpulens:gpu_activity:ratio_avg5m, "
                    "gpulens:gpu_kernels_active:bool, gpulens:gpu_transfer:ratio_avg5m). " + IDLE_WORDS,
                    width=12,
                    max=1,
                ),
                Panel(
                    "Utilisation and activity",
                    "timeseries",
                    (
                        t(f"gpulens_gpu_utilization_ratio{{{ONE}}}", "GPU-Util"),
                        t(f"gpulens_gpu_sm_active_ratio{{{WHOLE}}}", "SM active"),
                        t(f"gpulens_gpu_sm_occupancy_ratio{{{WHOLE}}}", "SM occupancy"),
                        t(f"gpulens_gpu_dram_active_ratio{{{WHOLE}}}", "DRAM active"),
                        t(f"gpulens_gpu_tensor_active_ratio{{{WHOLE}}}", "tensor"),
                        t(f"gpulens_gpu_pipe_active_max_ratio{{{WHOLE}}}", "busiest pipe"),
                        t(f"gpulens_gpu_busy_ratio{{{WHOLE}}}", "busy"),
                    ),
                    unit=PCT,
                    description="The whole GPU (a GPU in MIG mode: its MIG instances below, one line each).",
                    width=12,
                    max=1,
                ),
                Panel(
                    "Each MIG instance: activity (5 m mean)",
                    "timeseries",
                    (
                        t(
                            f"gpulens:gpu_activity:ratio_avg5m{{{INSTANCES}}}",
                            "{{mig_profile}} instance {{gpu_instance_id}}",
                        ),
                    ),
                    unit=PCT,
                    description="One line per MIG instance: its activity (gpulens:gpu_activity:ratio_avg5m).",
                    width=12,
                    max=1,
                    no_value="This GPU is not in MIG mode.",
                ),
                Panel(
                    "Each MIG instance: memory used",
                    "timeseries",
                    (
                        t(
                            f"gpulens_gpu_memory_used_bytes{{{INSTANCES}}} / on (uuid, mig_uuid) "
                            f"gpulens_gpu_memory_total_bytes{{{INSTANCES}}}",
                            "{{mig_profile}} instance {{gpu_instance_id}}",
                        ),
                    ),
                    unit=PCT,
                    description="One line per MIG instance: memory used over its memory.",
                    width=12,
                    max=1,
                    no_value="This GPU is not in MIG mode.",
                ),
                Panel(
                    "Boundness class over time",
                    "state-timeline",
                    (t(class_band(ONE), "{{mig_profile}} {{gpu_instance_id}}"),),
                    description="What limits each device while it works: one band per device (the whole GPU, or "
                    "each MIG instance), coloured by its class.",
                    width=24,
                    height=6,
                    mappings=CLASS_NUMBERS,
                ),
            ),
        ),
        (
            "Memory, power, temperature, clocks",
            (
                Panel(
                    "Memory",
                    "timeseries",
                    (
                        t(f"gpulens_gpu_memory_used_bytes{{{ONE}}}", f"{LEAF} used"),
                        limit(f"gpulens_gpu_memory_total_bytes{{{ONE}}}", f"{LEAF} total"),
                    ),
                    unit="bytes",
                    width=12,
                ),
                Panel("Power", "timeseries", power_lines(ONE), unit="watt", width=12),
                Panel("Temperature", "timeseries", temperature_lines(ONE), unit="celsius", width=12),
                Panel("SM clock", "timeseries", clock_lines(ONE), unit="hertz", width=12),
                Panel("What holds the clocks down", "timeseries", (clock_events(ONE),), width=12),
                Panel("HBM temperature", "timeseries", memory_temperature_lines(ONE), unit="celsius", width=12),
            ),
        ),
        (
            "Links and errors",
            (
                Panel("PCIe throughput (5 m)", "timeseries", link_rate("pcie"), unit="Bps", width=12),
                Panel("NVLink throughput (5 m)", "timeseries", link_rate("nvlink"), unit="Bps", width=12),
                Panel(
                    "Errors (per hour)",
                    "timeseries",
                    (
                        t(
                            xids(ONE),
                            f"{GPU_LEGEND} Xid",
                        ),
                        t(
                            f"sum by (node, gpu, severity) (increase(gpulens_gpu_ecc_errors_total{{{ONE}}}[1h]))",
                            f"{GPU_LEGEND} ECC {{{{severity}}}}",
                        ),
                    ),
                    width=12,
                ),
                Panel(
                    "Identity",
                    "table",
                    (
                        t(
                            "max by (cluster, node, gpu, name, driver_version, pci_bus_id, mig_mode) "
                            f"(gpulens_gpu_info{{{ONE}}})",
                            instant=True,
                        ),
                    ),
                    width=12,
                    table=Table(
                        (
                            *NODE_GPU,
                            ("name", "Model"),
                            ("driver_version", "Driver"),
                            ("pci_bus_id", "PCI address"),
                            ("mig_mode", "MIG mode"),
                        ),
                        (None,),
                        sort="Node",
                    ),
                ),
            ),
        ),
    ),
    single=("node", "gpu"),
)
