"""The Health board: throttling in words, errors, temperature, power and clocks against the GPU's
own limits, probes and the exporters."""

from __future__ import annotations

from dashboard import definitions

from .model import (
    DEV,
    GPU_LEGEND,
    HEALTH,
    LEAF,
    NODE,
    NODE_GPU,
    NOT_THROTTLING,
    PCT,
    REASON_WORDS,
    STAGE_WORDS,
    Board,
    Panel,
    Table,
    limit,
    t,
)
from .series import LOST, clock_events, clock_lines, memory_temperature_lines, power_lines, temperature_lines, xids

# --- health ---------------------------------------------------------------------------------------
HEALTH_BOARD = Board(
    HEALTH,
    "gpulens / Health",
    "Temperatures and power against each GPU's own limits, clocks and what holds them down, errors "
    "(Xid, ECC, remapped rows), probes and the exporters themselves.",
    (
        (
            "Now",
            (
                Panel(
                    "Throttling in the last hour",
                    "table",
                    (
                        t(
                            f"max by (cluster, node, gpu, reason) (avg_over_time(gpulens_gpu_clock_event_active"
                            f'{{{DEV}, reason!~"{NOT_THROTTLING}"}}[1h])) > 0',
                            instant=True,
                        ),
                    ),
                    unit=PCT,
                    description="GPUs whose clocks a clock event held down in the last hour, one row per GPU and "
                    "reason (in words, as nvidia-smi prints them), with the share of the hour. An idle GPU's low "
                    "clocks and an application clock setting are not throttling and are left out.",
                    width=12,
                    table=Table(
                        (*NODE_GPU, ("reason", "Reason")),
                        ("Share of the hour",),
                        sort="Share of the hour",
                        desc=True,
                        mappings={"Reason": REASON_WORDS},
                    ),
                    no_value="No throttling in the last hour.",
                ),
                Panel(
                    "GPUs lost",
                    "table",
                    (t(f"max by (cluster, node, gpu) ({LOST})", instant=True),),
                    description="GPUs the exporter lists but cannot read now (gpulens_gpu_up == 0, GPULost).",
                    width=6,
                    table=Table(NODE_GPU, (None,), sort="Node"),
                    no_value="Every GPU answers.",
                ),
                Panel(
                    "Exporter stages (failed first)",
                    "table",
                    (t(f"min by (cluster, node, stage) (gpulens_stage_success{{{NODE}}})", instant=True),),
                    description="Each exporter's stages and whether the last cycle's run succeeded.",
                    width=6,
                    table=Table(
                        (("node", "Node"), ("stage", "Stage")),
                        ("State",),
                        sort="State",
                        mappings={"State": STAGE_WORDS},
                    ),
                ),
                Panel(
                    "ECC errors since the driver loaded (volatile)",
                    "table",
                    tuple(
                        t(
                            "sum by (cluster, node, gpu) "
                            f'(gpulens_gpu_ecc_errors_total{{{DEV}, severity="{severity}"}})',
                            instant=True,
                        )
                        for severity in ("corrected", "uncorrected")
                    ),
                    description="Volatile ECC error counts per GPU, uncorrected first.",
                    width=8,
                    table=Table(NODE_GPU, ("Corrected", "Uncorrected"), sort="Uncorrected", desc=True),
                ),
                Panel(
                    "Remapped HBM rows",
                    "table",
                    (
                        t(f"sum by (cluster, node, gpu) (gpulens_gpu_remapped_rows{{{DEV}}})", instant=True),
                        t(f"max by (cluster, node, gpu) (gpulens_gpu_row_remap_pending{{{DEV}}})", instant=True),
                        t(f"max by (cluster, node, gpu) (gpulens_gpu_row_remap_failure{{{DEV}}})", instant=True),
                    ),
                    description="HBM rows remapped (correctable and uncorrectable causes), whether a remap waits "
                    "for a GPU reset, and whether one failed.",
                    width=8,
                    table=Table(
                        NODE_GPU,
                        ("Rows remapped", "Waits for a reset", "Remap failed"),
                        sort="Rows remapped",
                        desc=True,
                        mappings={
                            "Waits for a reset": {"0": "no", "1": "yes"},
                            "Remap failed": {"0": "no", "1": "yes"},
                        },
                    ),
                ),
                Panel(
                    "Xid errors in the last hour",
                    "timeseries",
                    (
                        t(
                            xids(DEV),
                            "{{node}} GPU {{gpu}}",
                        ),
                    ),
                    description="Xid events per GPU in the hour ending at each point, the first event of a code "
                    "counted too (what GPUXidError counts). 0 where the exporter saw none.",
                    width=8,
                ),
            ),
        ),
        (
            "Against the GPU's own limits",
            (
                Panel(
                    "Temperature",
                    "timeseries",
                    temperature_lines(DEV),
                    unit="celsius",
                    description="GPU die temperature, with the GPU's own slowdown (hardware slows the clocks) and "
                    "shutdown limits, dashed (gpulens_gpu_temperature_threshold_celsius).",
                    width=12,
                ),
                Panel(
                    "HBM temperature",
                    "timeseries",
                    memory_temperature_lines(DEV),
                    unit="celsius",
                    description="Memory temperature, with the limit past which the driver slows the GPU.",
                    width=12,
                ),
                Panel(
                    "Power",
                    "timeseries",
                    power_lines(DEV),
                    unit="watt",
                    description="Power draw, with each GPU's enforced power limit (dashed).",
                    width=12,
                ),
                Panel(
                    "SM clock",
                    "timeseries",
                    clock_lines(DEV),
                    unit="hertz",
                    description="SM clock, with each GPU's maximum (dashed). A GPU at its power cap near its "
                    "maximum clock is normal under load.",
                    width=12,
                ),
                Panel(
                    "What holds the clocks down",
                    "timeseries",
                    (clock_events(DEV),),
                    description="1 while the reason holds the clocks down, in words (idle and application clocks "
                    "left out).",
                    width=12,
                ),
                Panel(
                    "Energy per hour",
                    "timeseries",
                    (t(f"sum by (node) (increase(gpulens_gpu_energy_joules_total{{{DEV}}}[1h])) / 3.6e6", "{{node}}"),),
                    unit="kwatth",
                    description="Energy the node's GPUs used in the hour ending at each point.",
                    width=12,
                ),
                Panel(
                    "Memory clock",
                    "timeseries",
                    (t(f"gpulens_gpu_memory_clock_hertz{{{DEV}}}", f"{GPU_LEGEND} memory clock"),),
                    unit="hertz",
                    width=12,
                ),
                Panel(
                    "Fan speed",
                    "timeseries",
                    (t(f"gpulens_gpu_fan_speed_ratio{{{DEV}}}", GPU_LEGEND),),
                    unit=PCT,
                    description="Fan speed over its maximum (absent on passively cooled GPUs).",
                    width=12,
                    max=1,
                    no_value="No GPU here reports a fan (passively cooled GPUs have none).",
                ),
            ),
        ),
        (
            "Probes and exporters",
            (
                Panel(
                    "Probe efficiency (measured / expected)",
                    "timeseries",
                    (
                        t(f"gpulens_probe_efficiency_ratio{{{DEV}}}", LEAF + " {{probe}}"),
                        limit(
                            f"max by (node, gpu) (gpulens_gpu_info{{{DEV}}})"
                            f" * {definitions.PROBE_SLOW_EFFICIENCY_BELOW}",
                            "slow below",
                        ),
                    ),
                    unit=PCT,
                    description="Cached results of the gated bandwidth probes over what a healthy GPU of the model "
                    f"reaches; below {definitions.PROBE_SLOW_EFFICIENCY_BELOW:.0%} is slow.",
                    width=12,
                    no_value="No probe result cached (probes off, or not run yet).",
                ),
                Panel(
                    "Exporter",
                    "timeseries",
                    (
                        t(f"max by (node) (gpulens_snapshot_age_seconds{{{NODE}}})", "{{node}} snapshot age"),
                        t(f"max by (node, stage) (gpulens_stage_duration_seconds{{{NODE}}})", "{{node}} {{stage}}"),
                    ),
                    unit="s",
                    description="Age of the snapshot each scrape served and how long each stage took.",
                    width=12,
                ),
                Panel(
                    "Exporter errors (per hour)",
                    "timeseries",
                    (
                        t(
                            f"sum by (node, code) (increase(gpulens_nvml_errors_total{{{NODE}}}[1h]))",
                            "{{node}} NVML {{code}}",
                        ),
                        t(
                            f"sum by (node, family) (increase(gpulens_render_errors_total{{{NODE}}}[1h]))",
                            "{{node}} render {{family}}",
                        ),
                        t(
                            f"sum by (node, reason) (increase(gpulens_unmapped_devices_total{{{NODE}}}[1h]))",
                            "{{node}} unmapped device {{reason}}",
                        ),
                    ),
                    description="NVML calls that failed, families that could not be rendered and kubelet devices "
                    "matching no GPU, in the hour ending at each point.",
                    width=12,
                    no_value="No NVML, render or kubelet device error in the range.",
                ),
                Panel(
                    "Kubelet attribution age",
                    "timeseries",
                    (
                        t(
                            f"time() - max by (node) (gpulens_podresources_last_success_timestamp_seconds{{{NODE}}})",
                            "{{node}}",
                        ),
                    ),
                    unit="s",
                    description="Seconds since each exporter last read the kubelet's pod resources.",
                    width=12,
                ),
            ),
        ),
    ),
)
