"""One bad name never takes down a node's page, and names have a ceiling (issue 51, defects 1, 5),
through the seams: the real NIC reader over a sysfs tree, the HTTP front, the exporter process with
the API emulator and a real gRPC kubelet.

- A sysfs device and a counter file whose names are not UTF-8 are exported escaped (``\\xff``) on a
  200 page, with every other series.
- A pod owner whose name holds a lone surrogate, and one whose name is 1 MiB, are exported escaped
  and cut, with and without the owner chain; the other pods keep their workloads.
- A DRA claim of 1 MiB, and a device of 1 MiB that the driver publishes and the kubelet names
  alike, are exported cut, and the two still join.
"""

from __future__ import annotations

import http.client
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from exporter.http.server import MetricsServer
from exporter.network.source import NicSource
from exporter.network.stage import NetworkStage
from exporter.render import metrics as cat
from exporter.render.collector import CachedExposition, SnapshotCollector
from exporter.sampler import Sampler
from exporter.sim import sysfs_tree as st
from tests.fakes.kube_api_server import KubeApiEmulator, make_pod, make_resource_slice, nvidia_gpu, owner_reference
from tests.fakes.kubelet_server import FakeKubelet, pod
from tests.fakes_backend import ScriptedBackend, healthy
from tests.support.exporter import run_exporter
from tests.support.scrape import Samples, api_env, eventually, gpu_uuids, scrape, stage

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
MAX = 253
NODE = "gpu-node-1"
GPU_DRIVER = "gpu.nvidia.com"
BAD_NIC = os.fsdecode(b"mlx5_\xff")
BAD_COUNTER = os.fsdecode(b"rx_\xff_bytes")
MLX_FUNCTION = st.PciFunction("0000:17:00.0", "pci0000:14", ("0000:14:01.0",), 1, st.MELLANOX_VENDOR)
MLX_FUNCTION_2 = st.PciFunction("0000:18:00.0", "pci0000:14", ("0000:14:02.0",), 1, st.MELLANOX_VENDOR)


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.fixture
def bad_tree(tmp_path: Path) -> Iterator[st.SysfsTree]:
    """Two InfiniBand NICs, one named ``mlx5_<0xff>``; the other has a counter file ``rx_<0xff>_bytes``."""
    tree = st.SysfsTree(
        tmp_path, [st.mlx5_infiniband_nic(BAD_NIC, MLX_FUNCTION), st.mlx5_infiniband_nic("mlx5_1", MLX_FUNCTION_2)]
    )
    (tree.device_dir("mlx5_1") / "ports" / "1" / "hw_counters" / BAD_COUNTER).write_text("7\n")
    yield tree


def test_sysfs_names_that_are_not_utf8_are_escaped_on_a_200_page(bad_tree: st.SysfsTree) -> None:
    stage_ = NetworkStage(NicSource(str(bad_tree.sysfs), str(bad_tree.procfs)))
    sampler = Sampler(ScriptedBackend(healthy(1)), network=stage_)
    collector = SnapshotCollector(sampler.latest, include_age=False)
    expo = CachedExposition(collector, sampler.latest)
    server = MetricsServer("127.0.0.1:0", expo.render_parts, ready=lambda: sampler.latest() is not None)
    server.start()
    try:
        sampler.run_once()
        sampler.run_once()
        status, body = _get(server.port, "/metrics")
        assert status == 200, body[:200]
        text = body.decode()
        assert 'gpulens_nic_info{device="mlx5_\\\\xff"' in text, "the device, its 0xff written as the text \\xff"
        assert 'counter="rx_\\\\xff_bytes",device="mlx5_1"' in text
        assert 'device="mlx5_1"' in text and "gpulens_gpu_power_watts{" in text, "every other series is there"
        assert 'stage="render_' not in text
        assert _get(server.port, "/readyz") == (200, b"ready\n")
    finally:
        server.shutdown()
        sampler.stop()
        stage_.close()


# --- names from the Kubernetes API and the kubelet --------------------------------------------------

LONE = "trainer-\ud800"
HUGE_OWNER = "o" * MIB
HUGE_CLAIM = "c" * MIB
HUGE_DEVICE = "d" * MIB


def _workloads(samples: Samples) -> dict[str, tuple[str, str]]:
    return {
        lab["pod"]: (lab["workload_kind"], lab["workload"]) for lab, _ in samples.get("gpulens_pod_gpu_allocation", [])
    }


def _cut(value: str, prefix: str) -> bool:
    return len(value) == MAX and value.startswith(prefix * 200) and value[-17] == "~"


@pytest.mark.parametrize("chain", [True, False], ids=["owner-chain", "no-owner-chain"])
def test_owner_names_with_a_lone_surrogate_or_of_1_mib_are_escaped_and_cut(tmp_path: Path, chain: bool) -> None:
    with KubeApiEmulator() as api, FakeKubelet() as kubelet:
        api.put(make_pod("bad-0", "ml", owner=owner_reference("Job", LONE, "ml")))
        api.put(make_pod("huge-0", "ml", owner=owner_reference("Job", HUGE_OWNER, "ml")))
        api.put(make_pod("good-0", "ml", owner=("StatefulSet", "good")))
        args = (
            *("--kubernetes.podresources-socket", kubelet.socket_path, "--kubernetes.refresh-interval", "1s"),
            *("--kubernetes.api", "--kubernetes.node-name", NODE, "--no-probes"),
            *(() if chain else ("--no-kubernetes.owner-chain",)),
        )
        with run_exporter(*args, env=api_env(api, tmp_path)) as base:
            uuids = gpu_uuids(scrape(base))
            kubelet.pods = [
                pod("ml", name, [("main", [("nvidia.com/gpu", [uuids[i]])])])
                for i, name in enumerate(("bad-0", "huge-0", "good-0"))
            ]
            done = eventually(base, lambda s: len([w for w in _workloads(s).values() if w[1]]) == 3, timeout=60)
            got = _workloads(done)
            assert got["good-0"] == ("StatefulSet", "good"), "the other pods keep their workloads"
            assert got["bad-0"] == ("Job", "trainer-\\ud800")
            kind, name = got["huge-0"]
            assert kind == "Job" and _cut(name, "o"), name[:40]
            assert stage(done, "kube_api") == 1.0
            status, body = _get(int(base.rsplit(":", 1)[1]), "/metrics")
            assert status == 200 and max(len(line) for line in body.splitlines()) < 4096


def test_a_dra_claim_and_device_of_1_mib_are_cut_and_still_join(tmp_path: Path) -> None:
    with KubeApiEmulator() as api, FakeKubelet() as kubelet:
        api.put(make_pod("llm-0", "team", owner=("StatefulSet", "llm")))
        args = (
            *("--kubernetes.podresources-socket", kubelet.socket_path, "--kubernetes.refresh-interval", "1s"),
            *("--kubernetes.api", "--kubernetes.node-name", NODE, "--no-probes"),
        )
        with run_exporter(*args, env=api_env(api, tmp_path)) as base:
            first = scrape(base)
            uuid = gpu_uuids(first)[0]
            bus = {lab["uuid"]: lab["pci_bus_id"] for lab, _ in first["gpulens_gpu_info"]}
            api.put_slice(make_resource_slice(NODE, GPU_DRIVER, NODE, [nvidia_gpu(HUGE_DEVICE, uuid, bus[uuid])]))
            claim = (GPU_DRIVER, NODE, HUGE_DEVICE, ["k8s.gpu.nvidia.com/claim=x"])
            kubelet.pods = [pod("team", "llm-0", [("vllm", [], [("team", HUGE_CLAIM, [claim])])])]
            done = eventually(
                base,
                lambda s: (
                    any(lab["claim_name"] for lab, _ in s.get("gpulens_pod_gpu_allocation", []))
                    and stage(s, "resourceslices") == 1.0
                ),
            )
            (labels,) = [lab for lab, _ in done["gpulens_pod_gpu_allocation"] if lab["pod"] == "llm-0"]
            assert labels["uuid"] == uuid, "the claimed device joined its published one"
            assert _cut(labels["claim_name"], "c") and _cut(labels["device"], "d")
            status, body = _get(int(base.rsplit(":", 1)[1]), "/metrics")
            assert status == 200 and max(len(line) for line in body.splitlines()) < 4096


def test_a_family_that_fails_to_render_is_counted_and_readyz_names_it() -> None:
    """Past the entry rule (a value that still cannot be written): the page is served without that
    family, ``gpulens_render_errors_total`` counts it and ``/readyz`` names it (still 200: the rest
    of the page is served, and a restart would not mend a name)."""
    name = "gpulens_gpu_power_watts"
    bad = replace(cat.spec(name), own_labels=("extra",), read=lambda _v: [((LONE,), 1.0)])
    catalogue = [bad if s.name == name else s for s in cat.CATALOGUE]
    sampler = Sampler(ScriptedBackend(healthy(1)))
    collector = SnapshotCollector(sampler.latest, include_age=False, catalogue=catalogue)
    expo = CachedExposition(collector, sampler.latest)
    server = MetricsServer(
        "127.0.0.1:0",
        expo.render_parts,
        ready=lambda: sampler.latest() is not None,
        reply=expo.reply,
        degraded=expo.failed_families,
    )
    server.start()
    try:
        sampler.run_once()
        status, body = _get(server.port, "/metrics")
        assert status == 200
        text = body.decode()
        assert f"# TYPE {name} " not in text
        assert "gpulens_gpu_utilization_ratio{" in text, "the other families are there"
        assert f'gpulens_render_errors_total{{family="{name}"}} 1.0' in text
        assert f'gpulens_stage_success{{stage="render_{name}"}} 0.0' in text
        status, ready = _get(server.port, "/readyz")
        assert status == 200 and name in ready.decode() and ready.startswith(b"ready, but 1 families failed")
    finally:
        server.shutdown()
        sampler.stop()
