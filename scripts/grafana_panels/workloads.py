"""The Workloads board: which pod holds which device, how much it uses it, idle holders, classes."""

from __future__ import annotations

from dashboard import definitions

from .model import (
    DEV,
    IDLE_WORDS,
    LEAF_COLUMNS,
    NODE_GPU,
    NS,
    ON_LEAF,
    PCT,
    POD,
    POD_COLUMNS,
    POD_DEVICE,
    PODGPU,
    WORKLOADS,
    Board,
    Panel,
    Table,
    t,
)

# --- workloads ---------------------------------------------------------------------------------------
POD_LEAF_COLUMNS = (*POD_COLUMNS, ("container", "Container"), ("workload", "Workload"), *LEAF_COLUMNS)
WORKLOADS_BOARD = Board(
    WORKLOADS,
    "gpulens / Workloads",
    "Which pods hold which GPUs, how much of them they use, and what limits them.",
    (
        (
            "Pods and their devices",
            (
                Panel(
                    "Pods holding GPUs",
                    "table",
                    (
                        t(
                            f"max by (cluster, namespace, pod, node, gpu, mig_profile, container, workload) "
                            f"(gpulens:pod_gpu_activity:ratio_avg5m{{{PODGPU}}})",
                            instant=True,
                        ),
                        t(
                            f"max by (cluster, namespace, pod, node, gpu, mig_profile, container, workload) "
                            f"(gpulens:pod_gpu_sm_active:ratio_avg5m{{{PODGPU}}})",
                            instant=True,
                        ),
                        t(
                            f"max by (cluster, namespace, pod, node, gpu, mig_profile, container, workload) "
                            f"(gpulens:pod_gpu_transfer:ratio_avg5m{{{PODGPU}}})",
                            instant=True,
                        ),
                    ),
                    unit=PCT,
                    description="Each container, the device it holds (node, GPU index, MIG profile) and, over "
                    f"{definitions.MEAN_WINDOW}, the device's activity (what idle reads), SM activity and "
                    "transfer share (gpulens:pod_gpu_{activity,sm_active,transfer}:ratio_avg5m).",
                    width=24,
                    height=9,
                    table=Table(
                        (
                            *POD_DEVICE,
                            ("container", "Container"),
                            ("workload", "Workload"),
                        ),
                        ("Activity", "SM active", "Transfer share"),
                        sort="Activity",
                    ),
                ),
                Panel(
                    "Allocated but idle now",
                    "table",
                    (
                        t(
                            f"max by (cluster, namespace, pod, node, gpu, mig_profile, container) "
                            f"(gpulens:pod_gpu_activity:ratio_avg5m{{{PODGPU}}} and on (namespace, pod, container, "
                            f"{ON_LEAF}) (gpulens:pod_gpu_idle:bool{{{PODGPU}}} == 1))",
                            instant=True,
                        ),
                    ),
                    unit=PCT,
                    description="Containers holding a device idle now (gpulens:pod_gpu_idle:bool; "
                    "GPUAllocatedButIdle fires after 30 m), with the device's activity. " + IDLE_WORDS,
                    width=12,
                    table=Table(
                        (
                            *POD_DEVICE,
                            ("container", "Container"),
                        ),
                        ("Activity",),
                        sort="Namespace",
                    ),
                    no_value="Every allocated GPU and MIG instance is in use.",
                ),
                Panel(
                    "Boundness per pod now",
                    "table",
                    (
                        t(
                            f"max by (cluster, namespace, pod, node, gpu, mig_profile, class) "
                            f"(gpulens:pod_gpu_boundness:class{{{PODGPU}}})",
                            instant=True,
                        ),
                    ),
                    description="Each pod's class on each device: the device's while the pod is alone on it, "
                    '"shared" where several pods run on it (gpulens:pod_gpu_boundness:class).',
                    width=12,
                    table=Table(
                        (
                            *POD_DEVICE,
                            ("class", "Class"),
                        ),
                        (None,),
                        sort="Namespace",
                    ),
                ),
                Panel(
                    "Who holds each GPU",
                    "table",
                    (
                        t(
                            f"max by (cluster, node, gpu, namespace, pod) (gpulens:gpu_holder:info{{{NS}}}"
                            f" * on (uuid) group_left (node, gpu)"
                            f" max by (uuid, node, gpu) (gpulens_gpu_info{{{DEV}}}))",
                            instant=True,
                        ),
                    ),
                    description="Each physical GPU and the pods holding it or one of its MIG instances "
                    "(gpulens:gpu_holder:info: who an alert about the GPU names).",
                    width=12,
                    table=Table((*NODE_GPU, *POD_COLUMNS), (None,), sort="Node"),
                ),
                Panel(
                    "Pods launch-bound or waiting on links",
                    "table",
                    (
                        t(
                            f"max by (cluster, namespace, pod, node, gpu, mig_profile, class) "
                            f'(gpulens:pod_gpu_boundness:class{{{PODGPU}, class=~"{definitions.LAUNCH_CLASS}|'
                            f'{definitions.TRANSFER_CLASS}"}})',
                            instant=True,
                        ),
                    ),
                    description="Pods in use though their SMs idle: launch-bound (tiny kernels back to back, "
                    "GPULaunchBound) or transfer-bound (their links busy).",
                    width=12,
                    table=Table(
                        (
                            *POD_DEVICE,
                            ("class", "Class"),
                        ),
                        (None,),
                        sort="Namespace",
                    ),
                    no_value="No pod is launch-bound or transfer-bound now.",
                ),
            ),
        ),
        (
            "Over time",
            (
                Panel(
                    "Activity per pod (5 m mean)",
                    "timeseries",
                    (
                        t(
                            f"max by (namespace, pod, node, gpu, mig_profile) "
                            f"(gpulens:pod_gpu_activity:ratio_avg5m{{{PODGPU}}})",
                            "{{namespace}}/{{pod}} on {{node}} GPU {{gpu}} {{mig_profile}}",
                        ),
                    ),
                    unit=PCT,
                    width=12,
                    max=1,
                ),
                Panel(
                    "GPU memory per pod",
                    "timeseries",
                    (
                        t(
                            f"sum by (namespace, pod) (gpulens_pod_gpu_memory_used_bytes{{{POD}}})",
                            "{{namespace}}/{{pod}}",
                        ),
                    ),
                    unit="bytes",
                    width=12,
                ),
                Panel(
                    "Communication share per pod (5 m)",
                    "timeseries",
                    (t(f"gpulens:pod_gpu_communication:ratio_avg5m{{{NS}}}", "{{namespace}}/{{pod}}"),),
                    unit=PCT,
                    description="Share of the pod's GPU time spent waiting in a collective on its peers or the "
                    "network (gpulens:pod_gpu_communication:ratio_avg5m; GPUs with GPM).",
                    width=12,
                    max=1,
                ),
                Panel(
                    "Boundness per device (10 m)",
                    "table",
                    (
                        t(
                            f"max by (cluster, node, gpu, mig_profile, class) "
                            f"(gpulens:gpu_boundness:ratio_avg10m{{{DEV}}}) > 0",
                            instant=True,
                        ),
                    ),
                    unit=PCT,
                    description="Each device's classes over the last 10 m and the share of it spent in each "
                    "(gpulens:gpu_boundness:ratio_avg10m; classes it never had left out).",
                    width=12,
                    table=Table((*LEAF_COLUMNS, ("class", "Class")), ("Share of 10 m",), sort="Node"),
                ),
            ),
        ),
    ),
)
