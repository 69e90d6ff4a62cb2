"""The Sharing board: MIG, time-slicing and MPS, and each pod's part of a shared device."""

from __future__ import annotations

from .model import (
    DEV,
    KERNEL_TIME,
    LEAF_COLUMNS,
    NODE,
    PCT,
    POD,
    POD_COLUMNS,
    SHARING,
    Board,
    Panel,
    Table,
    leaf_of,
    on_gpu,
    t,
)

# --- sharing: MIG, time-slicing, MPS --------------------------------------------------------------------
SHARING_BOARD = Board(
    SHARING,
    "gpulens / Sharing: MIG, time-slicing, MPS",
    "How each GPU is shared, how full the shares are, and each pod's part of a shared GPU.",
    (
        (
            "Modes",
            (
                Panel(
                    "Devices per sharing mode",
                    "bargauge",
                    (t(f"count by (mode) (gpulens_gpu_sharing_info{{{DEV}}})", "{{mode}}", instant=True),),
                    description="Whole GPUs and MIG instances by how they are shared: exclusive, time-slicing, "
                    "MPS or DRA (gpulens_gpu_sharing_info).",
                    width=8,
                ),
                Panel(
                    "Shared devices",
                    "table",
                    (
                        t(
                            "max by (cluster, node, gpu, mig_profile, mode) "
                            f'(gpulens_gpu_sharing_info{{{DEV}, mode!~"exclusive|mig"}})',
                            instant=True,
                        ),
                        t(
                            f"max by (cluster, node, gpu, mig_profile, mode) (gpulens_gpu_compute_processes{{{DEV}}}"
                            " * on (uuid, mig_uuid) group_left (mode) "
                            'gpulens_gpu_sharing_info{mode!~"exclusive|mig"})',
                            instant=True,
                        ),
                    ),
                    description="Devices shared by time-slicing, MPS or a shared ResourceClaim (MIG: below), and "
                    "the compute processes running on each (an MPS server is not counted).",
                    width=16,
                    table=Table((*LEAF_COLUMNS, ("mode", "Mode")), (None, "Processes"), sort="Node"),
                ),
                Panel(
                    "Time-slice occupancy (pods / replicas)",
                    "bargauge",
                    (
                        t(
                            on_gpu(
                                f"gpulens_gpu_sharing_pods{{{NODE}}} / on (uuid) gpulens_gpu_sharing_replicas{{{NODE}}}"
                            ),
                            "{{node}} GPU {{gpu}}",
                            instant=True,
                        ),
                    ),
                    unit=PCT,
                    description="Pods holding a time-slicing replica of the GPU over the replicas advertised.",
                    width=8,
                    max=1,
                ),
                Panel(
                    "Each pod's share of a shared device",
                    "table",
                    (
                        t(
                            f"max by (cluster, namespace, pod, node, gpu, mig_profile) "
                            f"(gpulens:pod_gpu_holding:ratio{{{POD}}}"
                            f" * on (uuid, mig_uuid) group_left (gpu, mig_profile) {leaf_of()}) < 1",
                            instant=True,
                        ),
                    ),
                    unit=PCT,
                    description="The replicas each pod holds over all replicas held on the device "
                    "(gpulens:pod_gpu_holding:ratio; 1 for an exclusive device, left out): how its wasted "
                    "GPU-hours are split.",
                    width=16,
                    table=Table(
                        (*POD_COLUMNS, ("node", "Node"), ("gpu", "GPU"), ("mig_profile", "MIG profile")),
                        ("Holding share",),
                        sort="Node",
                    ),
                    no_value="No device is shared by replicas.",
                ),
                Panel(
                    "Kernel time per pod on shared GPUs",
                    "timeseries",
                    (
                        t(
                            f"max by (namespace, pod, node, gpu) ({on_gpu(f'{KERNEL_TIME}{{{POD}}}')}"
                            f" and on (uuid) (count by (uuid) ({KERNEL_TIME}) > 1))",
                            "{{namespace}}/{{pod}} on {{node}} GPU {{gpu}}",
                        ),
                    ),
                    unit=PCT,
                    description="Share of sampled time a kernel of the pod's processes ran (NVML per-process "
                    f"utilisation, {KERNEL_TIME}), shown only where several pods share a GPU.",
                    width=24,
                    max=1,
                ),
            ),
        ),
        (
            "MIG",
            (
                Panel(
                    "MIG instances per GPU and profile",
                    "table",
                    (
                        t(
                            f"count by (cluster, node, gpu, mig_profile) (gpulens_mig_instance_info{{{DEV}}})",
                            instant=True,
                        ),
                    ),
                    width=8,
                    table=Table(LEAF_COLUMNS, ("MIG instances",), sort="Node"),
                ),
                Panel(
                    "MIG instances allocated per profile",
                    "bargauge",
                    (
                        t(
                            f"count by (mig_profile) (gpulens_mig_instance_info{{{DEV}}} * on (uuid, mig_uuid) "
                            f"group_left () max by (uuid, mig_uuid) (gpulens_pod_gpu_allocation{{{POD}}}))",
                            "{{mig_profile}}",
                            instant=True,
                        ),
                    ),
                    width=8,
                ),
                Panel(
                    "Share of its GPU per MIG instance",
                    "table",
                    (
                        t(
                            f"max by (cluster, node, gpu, mig_profile) (gpulens:leaf_gpu_share:ratio "
                            f"* on (uuid, mig_uuid) group_left (node, gpu, mig_profile) "
                            "max by (uuid, mig_uuid, node, gpu, mig_profile) "
                            f'(gpulens_mig_instance_info{{{DEV}, mig_uuid!=""}}))',
                            instant=True,
                        ),
                    ),
                    unit=PCT,
                    description="Each MIG profile's compute slices over the GPU's (3g of 7: 3/7): the weight of its "
                    "GPU-hours (gpulens:leaf_gpu_share:ratio).",
                    width=8,
                    table=Table(LEAF_COLUMNS, ("Share of the GPU",), sort="Node"),
                ),
                Panel(
                    "Activity per MIG instance (5 m mean)",
                    "timeseries",
                    (
                        t(
                            f'gpulens:gpu_activity:ratio_avg5m{{{DEV}, mig_uuid!=""}}',
                            "{{node}} GPU {{gpu}} {{mig_profile}} {{gpu_instance_id}}",
                        ),
                    ),
                    unit=PCT,
                    width=24,
                    max=1,
                ),
            ),
        ),
    ),
)
