"""A fake procfs for PID attribution: the ``/proc/<pid>/cgroup`` a pod's process has."""

from __future__ import annotations


def cgroup_line(pod_uid: str, container_id: str) -> str:
    """``/proc/<pid>/cgroup`` of a process in container ``container_id`` (64 hex digits) of a
    Burstable pod ``pod_uid``: cgroup v2, the systemd driver, containerd."""
    slug = pod_uid.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slug}.slice/"
        f"cri-containerd-{container_id}.scope\n"
    )
