"""Expressions two boards share: the fleet's problems (lost GPUs, GPUDirect RDMA off, stragglers,
communication-bound jobs, firing alerts) and a GPU's series with its own limits (temperature,
power, SM clock, link capacity), drawn the same on Health, Links and One GPU."""

from __future__ import annotations

from dashboard import jobs
from dashboard.definitions import counter_events_promql

from .model import (
    ALERT_NAMES,
    CL,
    DEV,
    GPU_LEGEND,
    LEAF,
    NOT_THROTTLING,
    NS,
    REASON_WORDS,
    THRESHOLD_WORDS,
    Target,
    limit,
    rate,
    t,
    words,
)

LOST = f"gpulens_gpu_up{{{DEV}}} == 0"
GDR_OFF = f"max by (cluster, node, gpu) (gpulens_gpu_nic_gdr_ready{{{DEV}}}) == 0"
STRAGGLERS = f"gpulens:job_straggler:info{{{NS}}}"
COMM_BOUND = f"({jobs.communication_bound_promql()}) and on (cluster, namespace) (gpulens:job_gpus:count{{{NS}}})"
FIRING = f'ALERTS{{alertstate="firing", alertname=~"{ALERT_NAMES}", {CL}}}'


def link_rate(link: str) -> tuple[Target, ...]:
    return (
        *(
            t(
                f"sum by (node, gpu, mig_profile) ({rate(f'gpulens_gpu_{link}_{d}_bytes_total{{{DEV}}}')})",
                f"{LEAF} {'sent' if d == 'tx' else 'received'}",
            )
            for d in ("tx", "rx")
        ),
        limit(
            f'max by (node, gpu) (gpulens_gpu_{link}_capacity_bytes_per_second{{{DEV}, mig_uuid=""}})',
            "{{node}} GPU {{gpu}} capacity each way",
        ),
    )


def temperature_lines(dev: str) -> tuple[Target, ...]:
    return (
        t(f"gpulens_gpu_temperature_celsius{{{dev}}}", GPU_LEGEND),
        *(
            limit(
                f'max by (node, gpu) (gpulens_gpu_temperature_threshold_celsius{{{dev}, threshold="{kind}"}})',
                f"{{{{node}}}} GPU {{{{gpu}}}} {THRESHOLD_WORDS[kind]}",
            )
            for kind in ("slowdown", "shutdown")
        ),
    )


def memory_temperature_lines(dev: str) -> tuple[Target, ...]:
    return (
        t(f"gpulens_gpu_memory_temperature_celsius{{{dev}}}", f"{GPU_LEGEND} HBM"),
        limit(
            f'max by (node, gpu) (gpulens_gpu_temperature_threshold_celsius{{{dev}, threshold="memory_max"}})',
            f"{GPU_LEGEND} {THRESHOLD_WORDS['memory_max']}",
        ),
    )


def power_lines(dev: str) -> tuple[Target, ...]:
    return (
        t(f"gpulens_gpu_power_watts{{{dev}}}", GPU_LEGEND),
        limit(f"max by (node, gpu) (gpulens_gpu_power_limit_watts{{{dev}}})", f"{GPU_LEGEND} power limit"),
    )


def clock_lines(dev: str) -> tuple[Target, ...]:
    return (
        t(f"gpulens_gpu_sm_clock_hertz{{{dev}}}", f"{GPU_LEGEND} SM"),
        limit(f"max by (node, gpu) (gpulens_gpu_sm_clock_max_hertz{{{dev}}})", f"{GPU_LEGEND} max SM clock"),
    )


def xids(dev: str) -> str:
    """Xid events per GPU in the hour ending at each point, the first event of a code counted too; 0
    for a GPU without any (an exporter that creates the counter at the first event has no series)."""
    events = counter_events_promql(f"gpulens_gpu_xid_errors_total{{{dev}}}", "1h")
    return f"sum by (node, gpu) ({events}) or max by (node, gpu) (gpulens_gpu_info{{{dev}}}) * 0"


def clock_events(dev: str) -> Target:
    events = f'max by (node, gpu, reason) (gpulens_gpu_clock_event_active{{{dev}, reason!~"{NOT_THROTTLING}"}}) > 0'
    return t(words(events, "reason", REASON_WORDS), "{{node}} GPU {{gpu}} {{reason}}")
