"""PID -> pod from /proc/<pid>/cgroup fixtures: every runtime x cgroup driver x cgroup version."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from exporter.attribution.cgroup import CgroupPidSource, parse_cgroup_file
from exporter.attribution.merge import KubeletView, PodDirectory, PodMeta
from exporter.attribution.pipeline import PipelineAttributor
from exporter.model import BackendSample, ContainerDevices, GpuSample, LeafSample, ProcessSample, StageResult

FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"
EXPECTED: dict[str, dict[str, str | None]] = json.loads((FIXTURES / "expected.json").read_text())


def test_fixtures_cover_every_runtime_and_driver_on_both_cgroup_versions() -> None:
    cases = {str(v["case"]) for v in EXPECTED.values()}
    for runtime in ("containerd", "crio", "docker"):
        for driver in ("systemd", "cgroupfs"):
            for version in ("v1", "v2"):
                assert any(c.startswith(f"{runtime}-{driver}-cgroup{version}-") for c in cases)


@pytest.mark.parametrize("pid", sorted(EXPECTED), ids=[EXPECTED[p]["case"] or p for p in sorted(EXPECTED)])
def test_cgroup_file_resolves_to_its_pod_and_container(pid: str) -> None:
    want = EXPECTED[pid]
    owner = parse_cgroup_file((FIXTURES / "proc" / pid / "cgroup").read_text())
    if want["pod_uid"] is None:
        assert owner is None
    else:
        assert owner is not None
        assert (owner.pod_uid, owner.container_id) == (want["pod_uid"], want["container_id"])


def test_source_reads_each_pid_once_and_forgets_pids_that_exited() -> None:
    source = CgroupPidSource(str(FIXTURES / "proc"))
    pids = [1001, 1002, 2001, 424242]  # 2001 is a host process, 424242 does not exist
    owners, result = source.owners(pids)
    assert result.success and owners is not None
    assert set(owners) == {1001, 1002}
    assert source.reads == 4
    for _ in range(50):
        source.owners(pids)
    assert source.reads == 4 + 50, "known PIDs are cached, only the missing one is retried"
    source.owners([1001])
    source.owners([1001, 1002])
    assert source.reads == 4 + 50 + 1, "1002 left the list, so it is read afresh (PID reuse)"


def test_cache_is_bounded() -> None:
    source = CgroupPidSource(str(FIXTURES / "proc"), max_entries=3)
    pids = [int(p) for p in EXPECTED]
    source.owners(pids)
    source.owners(pids)
    assert source.reads == 3 + 2 * (len(pids) - 3)


def test_proc_without_host_pids_fails_the_stage(tmp_path: Path) -> None:
    source = CgroupPidSource(str(tmp_path))
    owners, result = source.owners([1001, 1002])
    assert owners is None and not result.success
    owners, result = source.owners([])
    assert owners == {} and result.success, "no GPU processes: nothing to resolve is not a failure"


class _Kubelet:
    def __init__(self) -> None:
        self.view = KubeletView(
            devices=(
                ContainerDevices(
                    "ml", "a", "trainer", "nvidia.com/gpu", ("GPU-00000000-0000-0000-0000-000000000001::0",)
                ),
                ContainerDevices(
                    "ml", "b", "server", "nvidia.com/gpu", ("GPU-00000000-0000-0000-0000-000000000001::1",)
                ),
            )
        )

    def latest(self) -> tuple[KubeletView, StageResult, float]:
        return self.view, StageResult("podresources", True, 0.0), 1.0

    def close(self) -> None:
        pass


class _Pods:
    def __init__(self, directory: PodDirectory) -> None:
        self.directory = directory

    def latest(self) -> tuple[PodDirectory, StageResult]:
        return self.directory, StageResult("kube_api", True, 0.0)

    def close(self) -> None:
        pass


def test_processes_on_a_shared_gpu_are_attributed_to_containers_by_name(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    shutil.copytree(FIXTURES / "proc", proc)
    a = EXPECTED["1002"]  # containerd, systemd, cgroup v2
    b = EXPECTED["1005"]  # CRI-O, systemd, cgroup v1
    assert a["pod_uid"] and a["container_id"] and b["pod_uid"] and b["container_id"]
    pods = PodDirectory.of(
        [
            PodMeta(a["pod_uid"], "ml", "a", "Running", "Deployment", "a", {a["container_id"]: "trainer"}),
            PodMeta(b["pod_uid"], "ml", "b", "Running", "Deployment", "b", {}),  # API lags: no container IDs yet
        ]
    )
    uuid = "GPU-00000000-0000-0000-0000-000000000001"
    sample = BackendSample(
        up=True,
        gpus=(
            GpuSample(
                index=0,
                uuid=uuid,
                leaves=(
                    LeafSample(
                        uuid=uuid,
                        processes=(
                            ProcessSample(1002, used_memory_bytes=3 << 30, sm_util_ratio=0.5),
                            ProcessSample(1005, used_memory_bytes=1 << 30, sm_util_ratio=0.2),
                            ProcessSample(2001, used_memory_bytes=1 << 20, sm_util_ratio=0.0),
                        ),
                    ),
                ),
            ),
        ),
    )
    attributor = PipelineAttributor(_Kubelet(), _Pods(pods), CgroupPidSource(str(proc)))
    attribution, stages = attributor.attribute(sample, time.time())
    assert all(s.success for s in stages)
    got = {(u.pod.pod, u.pod.container): (u.memory_used_bytes, u.kernel_time_ratio) for u in attribution.usages}
    assert got == {("a", "trainer"): (3 << 30, 0.5), ("b", "server"): (1 << 30, 0.2)}

    # the pod's process exits and the host PID file goes away: its usage series goes with it
    shutil.rmtree(proc / "1005")
    sample2 = BackendSample(
        up=True,
        gpus=(
            GpuSample(
                index=0, uuid=uuid, leaves=(LeafSample(uuid=uuid, processes=sample.gpus[0].leaves[0].processes[:1]),)
            ),
        ),
    )
    attribution, _ = attributor.attribute(sample2, time.time())
    assert [(u.pod.pod, u.pod.container) for u in attribution.usages] == [("a", "trainer")]


# --- hostile files under --path.procfs -----------------------------------------------------------

_POD_LINE = "0::/kubepods/besteffort/pod0b9d6b5c-3b5e-4d2a-9a51-0123456789ab/" + "c" * 64 + "\n"


def test_a_huge_cgroup_file_is_read_only_up_to_the_bound(tmp_path: Path) -> None:
    """A 16 MiB file: only the first 64 KiB are read (the old code read all of it: +141 MiB RSS at
    200 MB), so a pod line planted past the bound is not seen, and memory stays flat."""
    import tracemalloc

    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text("x" * (16 << 20) + "\n" + _POD_LINE)
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "cgroup").write_text(_POD_LINE + "x" * (16 << 20))
    src = CgroupPidSource(str(tmp_path))
    tracemalloc.start()
    try:
        owners, result = src.owners([7, 8])
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.success and owners is not None
    assert 7 not in owners
    assert owners[8].pod_uid == "0b9d6b5c-3b5e-4d2a-9a51-0123456789ab"
    assert peak < 2 << 20, peak


def test_a_fifo_as_a_cgroup_file_does_not_block_the_sampler(tmp_path: Path) -> None:
    """The old code opened the FIFO and blocked for ever (no writer); now it is skipped at once."""
    import os
    import threading

    (tmp_path / "9").mkdir()
    os.mkfifo(tmp_path / "9" / "cgroup")
    (tmp_path / "10").mkdir()
    (tmp_path / "10" / "cgroup").write_text(_POD_LINE)
    src = CgroupPidSource(str(tmp_path))
    done: list[tuple[Any, Any]] = []
    worker = threading.Thread(target=lambda: done.append(src.owners([9, 10])), daemon=True)
    worker.start()
    worker.join(5)
    if worker.is_alive():  # release the blocked open() so the test process can end
        fd = os.open(tmp_path / "9" / "cgroup", os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        worker.join(5)
        pytest.fail("reading a FIFO blocked the cgroup stage")
    owners, result = done[0]
    assert result.success
    assert set(owners) == {10}
