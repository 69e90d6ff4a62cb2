"""The Fleet and waste board: what is wrong now, the Fleet page's counts, activity, the boundness mix
and waste per namespace."""

from __future__ import annotations

from dashboard import jobs

from .model import (
    CL,
    DEV,
    FLEET,
    FLEET_COUNTS,
    GPU_LEGEND,
    HEALTH,
    IDLE_WORDS,
    JOBS,
    LEAF,
    NETWORK,
    NODE,
    NS,
    PCT,
    POD,
    POD_COLUMNS,
    Board,
    Panel,
    Table,
    count0,
    fleet_count_promql,
    stat,
    t,
)
from .series import COMM_BOUND, FIRING, GDR_OFF, LOST, STRAGGLERS

# --- fleet and waste ----------------------------------------------------------------------------------

FLEET_BOARD = Board(
    FLEET,
    "gpulens / Fleet and waste",
    "What is wrong now, how many GPUs are held and used, and the GPU-hours wasted, per namespace.",
    (
        (
            "What is wrong now",
            (
                stat(
                    "Firing gpulens alerts",
                    count0(FIRING),
                    "Alerts of the gpulens rules firing now (the table below names them).",
                    link=HEALTH,
                ),
                stat(
                    "GPUs lost",
                    count0(LOST),
                    "GPUs the exporter lists but cannot read (gpulens_gpu_up == 0).",
                    link=HEALTH,
                ),
                stat(
                    "GPUs without GPUDirect RDMA",
                    count0(GDR_OFF),
                    "GPUs on nodes with RDMA NICs that no NIC can reach by GPUDirect RDMA (every pair's "
                    "gpulens_gpu_nic_gdr_ready is 0): their RDMA traffic goes through host memory.",
                    link=NETWORK,
                ),
                stat(
                    "Communication-bound jobs",
                    count0(COMM_BOUND),
                    f"Jobs whose GPUs spend >= {jobs.COMMUNICATION_BOUND_AT_LEAST:.0%} of their time waiting "
                    "on their peers or the network, with no straggler to explain it (GPUJobCommunicationBound).",
                    link=JOBS,
                ),
                stat(
                    "Stragglers",
                    count0(STRAGGLERS),
                    "GPUs their job's other GPUs wait for (gpulens:job_straggler:info).",
                    link=JOBS,
                ),
                Panel(
                    "Exporters up",
                    "stat",
                    (
                        t(count0(f"gpulens_up{{{NODE}}} == 1"), "up", instant=True),
                        t(count0(f"gpulens:exporter_target:info{{{NODE}}}"), "of targets", instant=True),
                    ),
                    description="Exporters scraped whose GPU backend answers (gpulens_up == 1), of the exporter "
                    "targets Prometheus knows (gpulens:exporter_target:info, which keeps a dead exporter while "
                    "its scrapes fail).",
                    width=4,
                    height=4,
                    options={"textMode": "value_and_name", "colorMode": "none", "orientation": "horizontal"},
                    link=HEALTH,
                ),
                Panel(
                    "Firing alerts",
                    "table",
                    (t(f"count by (cluster, alertname, severity) ({FIRING})", instant=True),),
                    description="The gpulens alerts firing now, by name and severity, with how many series fire.",
                    width=24,
                    height=5,
                    table=Table(
                        (("alertname", "Alert"), ("severity", "Severity")), ("Firing",), sort="Firing", desc=True
                    ),
                    no_value="No gpulens alert is firing.",
                ),
            ),
        ),
        (
            "GPUs",
            (
                *(
                    stat(title, fleet_count_promql(key), description, width=3)
                    for key, title, description in FLEET_COUNTS
                ),
                stat("Power", f"sum(gpulens_gpu_power_watts{{{DEV}}})", unit="watt", width=3),
                stat("Memory used", f"sum(gpulens_gpu_memory_used_bytes{{{DEV}}})", unit="bytes", width=3),
                Panel(
                    "Activity per device (5 m mean)",
                    "timeseries",
                    (t(f"gpulens:gpu_activity:ratio_avg5m{{{DEV}}}", LEAF),),
                    unit=PCT,
                    description="The figure idle reads (gpulens:gpu_activity:ratio_avg5m): SM activity where the "
                    "GPU has GPM, else NVML GPU-Util (or, on a MIG instance without GPM, whether a process ran).",
                    width=12,
                    max=1,
                ),
                Panel(
                    "GPU-Util per GPU (NVML, 5 m mean)",
                    "timeseries",
                    (t(f"gpulens:gpu_utilization:ratio_avg5m{{{DEV}}}", GPU_LEGEND),),
                    unit=PCT,
                    description="Time any kernel ran: what nvidia-smi shows. Compare with the activity: a GPU "
                    "can read busy here while its SMs idle (launch-bound).",
                    width=12,
                    max=1,
                ),
                Panel(
                    "SM active per device (5 m mean)",
                    "timeseries",
                    (t(f"gpulens:gpu_sm_active:ratio_avg5m{{{DEV}}}", LEAF),),
                    unit=PCT,
                    description="Share of time the SMs had work (GPM, Hopper and newer).",
                    width=12,
                    max=1,
                ),
                Panel(
                    "Devices per boundness class (10 m)",
                    "timeseries",
                    (t(f"class:gpulens_gpu_boundness:sum{{{CL}}}", "{{class}}"),),
                    description="How many devices were in each class, time-weighted over 10 m "
                    "(class:gpulens_gpu_boundness:sum).",
                    width=6,
                ),
                Panel(
                    "Boundness mix (10 m)",
                    "bargauge",
                    (t(f"class:gpulens_gpu_boundness:ratio{{{CL}}}", "{{class}}", instant=True),),
                    unit=PCT,
                    description="Share of the classified devices in each class over 10 m "
                    "(class:gpulens_gpu_boundness:ratio).",
                    width=6,
                    max=1,
                ),
            ),
        ),
        (
            "Waste per namespace",
            (
                Panel(
                    "Allocated, busy and idle devices per namespace",
                    "timeseries",
                    (
                        t(f"namespace:gpulens_gpus_allocated:count{{{NS}}}", "{{namespace}} allocated"),
                        t(f"namespace:gpulens_gpus_busy:count{{{NS}}}", "{{namespace}} busy"),
                        t(f"namespace:gpulens_gpus_idle:count{{{NS}}}", "{{namespace}} allocated but idle"),
                    ),
                    description="Devices allocated to the namespace's pods, those busy and those idle (recording "
                    "rules namespace:gpulens_gpus_{allocated,busy,idle}:count). " + IDLE_WORDS,
                    width=12,
                ),
                Panel(
                    "Wasted GPU-hours per namespace (hour ending at each point)",
                    "timeseries",
                    (t(f"namespace:gpulens_gpu_wasted_hours:sum1h{{{NS}}}", "{{namespace}}"),),
                    description="Hours a device was allocated while idle, in the preceding hour; a time-sliced "
                    "GPU split among its holders, a MIG instance weighted by its share of the GPU (3g of 7: 3/7 "
                    "of a GPU): namespace:gpulens_gpu_wasted_hours:sum1h (from gpulens:pod_gpu_wasted:gpus).",
                    width=12,
                ),
                Panel(
                    "GPUs wasted now per pod",
                    "table",
                    (
                        t(
                            f"sum by (cluster, namespace, pod, node) (gpulens:pod_gpu_wasted:gpus{{{POD}}}"
                            f" and on (uuid) gpulens_gpu_info{{{DEV}}}) > 0",
                            instant=True,
                        ),
                    ),
                    description="GPU-equivalents each pod holds idle now (gpulens:pod_gpu_wasted:gpus: its holding "
                    "share x the device idle x the device's share of a GPU).",
                    width=24,
                    height=6,
                    table=Table((*POD_COLUMNS, ("node", "Node")), ("GPUs wasted",), sort="GPUs wasted", desc=True),
                    no_value="No pod holds an idle GPU now.",
                ),
            ),
        ),
    ),
)
