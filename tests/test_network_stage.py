"""The network stage (exporter/network/stage.py) and the NIC source (exporter/network/source.py)
over fake sysfs trees written by ``exporter.sim.sysfs_tree``, with the cycle's GPUs as a backend
reports them (``GpuSample.pci_bus_id`` in NVML's spelling, ``00000000:18:00.0``).

What is checked: the GPU–NIC paths, nearest NICs and readiness the stage hands the exposition, that
they are computed once and reused while GPUs, NICs and host facts stay the same, which pods hold
which NICs from the kubelet's non-GPU devices, and how the source behaves without devices, with
stale or failing reads, and at close.  A fake clock drives the source: no sleeping, no timing.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporter.model import (
    Attribution,
    BackendSample,
    ContainerDevices,
    GpuNicPath,
    GpuSample,
    NetworkSample,
    NicHolder,
    NicSample,
    PodRef,
)
from exporter.network import pods, rdma, stage
from exporter.network.gdr import HostGdr
from exporter.network.pods import MAX_HOLDERS, nic_holders
from exporter.network.source import STAGE, NicSource
from exporter.network.stage import NetworkStage
from exporter.render.collector import SnapshotCollector
from exporter.sampler import Sampler
from exporter.sim import sysfs_tree as st
from tests.fakes_backend import ScriptedBackend


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def nvml_bus_id(function: st.PciFunction) -> str:
    """``0000:9a:00.0`` as NVML writes it: ``00000000:9A:00.0``."""
    domain, bus, rest = function.bdf.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}"


def backend_sample(gpus: tuple[st.PciFunction, ...], drop: int | None = None) -> BackendSample:
    return BackendSample(
        up=True,
        gpus=tuple(
            GpuSample(index=i, uuid=f"GPU-{i}", pci_bus_id=nvml_bus_id(g)) for i, g in enumerate(gpus) if i != drop
        ),
    )


def network_stage(tree: st.SysfsTree, clock: Clock | None = None) -> NetworkStage:
    return NetworkStage(NicSource(str(tree.sysfs), str(tree.procfs), clock=clock or Clock()))


@pytest.fixture
def closing() -> Iterator[list[NetworkStage]]:
    """Stages to close after the test."""
    stages: list[NetworkStage] = []
    yield stages
    for s in stages:
        s.close()


@pytest.fixture(scope="module")
def p5en(module_tmp_path: Path) -> st.SysfsTree:
    """A p5en tree (no peer-memory module, the proprietary GPU driver) the tests only read."""
    return st.SysfsTree.of(module_tmp_path, st.p5en_layout(), peermem=False, open_kernel_module=False)


def ref(pod: str, container: str = "main", namespace: str = "ml") -> PodRef:
    return PodRef(namespace, pod, container)


def held(pod: str, resource: str, *ids: str, container: str = "main") -> tuple[PodRef, ContainerDevices]:
    return ref(pod, container), ContainerDevices("ml", pod, container, resource, ids)


# --- paths ----------------------------------------------------------------------------------------


def by_pair(paths: tuple[GpuNicPath, ...]) -> dict[tuple[str, str], GpuNicPath]:
    out = {(p.uuid, p.device): p for p in paths}
    assert len(out) == len(paths)
    return out


def test_p5en_paths_nearest_and_readiness(p5en: st.SysfsTree, closing: list[NetworkStage]) -> None:
    """8 GPUs x 32 EFAs: each GPU's own four EFAs are ``PIX``, nearest and ready through the EFA
    driver's p2p provider; the NICs of its NUMA node are ``NODE`` (not ready: ``path_node``), the
    others ``SYS``; the stage reports success."""
    layout, tree = st.p5en_layout(), p5en
    net = network_stage(tree)
    closing.append(net)
    network, result = net.observe(backend_sample(layout.gpus), None)
    assert result is not None and result.stage == STAGE and result.success
    assert network is not None
    assert len(network.nics) == 32
    assert network.holders == ()
    paths = by_pair(network.paths)
    assert len(paths) == 8 * 32
    numa = {n.name: n.function.numa_node for n in layout.nics}
    for i, gpu in enumerate(layout.gpus):
        own = set(layout.nearest[i])
        for nic in layout.nics:
            p = paths[(f"GPU-{i}", nic.name)]
            if nic.name in own:
                assert (p.path, p.nearest, p.gdr_ready, p.gdr_reason) == ("PIX", True, True, "efa_p2p")
            elif numa[nic.name] == gpu.numa_node:
                assert (p.path, p.nearest, p.gdr_ready, p.gdr_reason) == ("NODE", False, False, "path_node")
            else:
                assert (p.path, p.nearest, p.gdr_ready, p.gdr_reason) == ("SYS", False, False, "path_sys")


@pytest.mark.parametrize(
    ("open_module", "reason", "ready"), [(True, "dmabuf", True), (False, "no_peer_memory", False)], ids=str
)
def test_p5en_without_p2p_provider_needs_dmabuf(
    tmp_path: Path, closing: list[NetworkStage], open_module: bool, reason: str, ready: bool
) -> None:
    """EFAs whose driver names no p2p provider (``p2p`` empty) are ready only through DMA-BUF from
    the open GPU kernel module; a loaded peer-memory module does not help EFA."""
    layout = st.p5en_layout(p2p="")
    tree = st.SysfsTree.of(tmp_path, layout, peermem=True, open_kernel_module=open_module)
    net = network_stage(tree)
    closing.append(net)
    network, _ = net.observe(backend_sample(layout.gpus), None)
    assert network is not None
    pix = [p for p in network.paths if p.path == "PIX"]
    assert len(pix) == 32
    assert {(p.gdr_ready, p.gdr_reason) for p in pix} == {(ready, reason)}


def test_dgx_infiniband_with_peermem(tmp_path: Path, closing: list[NetworkStage]) -> None:
    """A DGX-like node: one ConnectX per GPU switch, InfiniBand, ready through ``nvidia_peermem``."""
    layout = st.dgx_layout()
    tree = st.SysfsTree.of(tmp_path, layout, peermem=True, open_kernel_module=False)
    net = network_stage(tree)
    closing.append(net)
    network, _ = net.observe(backend_sample(layout.gpus), None)
    assert network is not None
    assert {n.kind for n in network.nics} == {"infiniband"}
    near = {(p.uuid, p.device) for p in network.paths if p.nearest}
    assert near == {(f"GPU-{i}", f"mlx5_{i}") for i in range(8)}
    assert {p.gdr_reason for p in network.paths if p.nearest} == {"peermem"}


def test_paths_are_computed_once_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, closing: list[NetworkStage]
) -> None:
    """The paths (a few realpath calls per device) are computed at the first cycle and reused while
    the GPUs, the NICs and the host's GPUDirect facts stay the same (counters moving change
    nothing); a GPU leaving the sample, or the host gaining a peer-memory module (seen at the next
    rediscovery), recomputes them."""
    layout = st.p5en_layout()
    tree = st.SysfsTree.of(tmp_path, layout, peermem=False, open_kernel_module=False)
    calls: list[int] = []
    real = stage.compute_paths

    def counting(
        sysfs: str, gpus: tuple[tuple[str, str], ...], nics: tuple[NicSample, ...], host: HostGdr | None
    ) -> tuple[GpuNicPath, ...]:
        calls.append(len(gpus))
        return real(sysfs, gpus, nics, host)

    monkeypatch.setattr(stage, "compute_paths", counting)
    clock = Clock()
    net = network_stage(tree, clock)
    closing.append(net)
    sample = backend_sample(layout.gpus)
    first, _ = net.observe(sample, None)
    assert first is not None
    for t in range(1, 6):
        clock.now += 1.0
        tree.set_counter(layout.nics[0].name, 1, "tx_bytes", 1000 * t)
        again, _ = net.observe(sample, None)
        assert again is not None and again.paths is first.paths
    assert calls == [8]
    fewer, _ = net.observe(backend_sample(layout.gpus, drop=3), None)
    assert fewer is not None
    assert calls == [8, 7]
    assert not any(p.uuid == "GPU-3" for p in fewer.paths)
    peermem = tree.sysfs / "kernel" / "mm" / "memory_peers" / "nv_mem" / "version"
    peermem.parent.mkdir(parents=True)
    peermem.write_text("1.3\n")
    clock.now += 30.0  # before the rediscovery: the host facts are the ones read at discovery
    net.observe(backend_sample(layout.gpus, drop=3), None)
    assert calls == [8, 7]
    clock.now += 60.0
    net.observe(backend_sample(layout.gpus, drop=3), None)
    assert calls == [8, 7, 7]


def test_gpus_without_a_place_have_no_paths(p5en: st.SysfsTree, closing: list[NetworkStage]) -> None:
    """A GPU without a bus ID, or whose bus ID is not in the tree (a passthrough VM's odd view),
    has no path; the others have theirs."""
    layout = st.p5en_layout()
    net = network_stage(p5en)
    closing.append(net)
    sample = BackendSample(
        up=True,
        gpus=(
            GpuSample(index=0, uuid="GPU-0", pci_bus_id=nvml_bus_id(layout.gpus[0])),
            GpuSample(index=1, uuid="GPU-1", pci_bus_id=None),
            GpuSample(index=2, uuid="GPU-2", pci_bus_id="00000000:EE:00.0"),
        ),
    )
    network, _ = net.observe(sample, None)
    assert network is not None
    assert {p.uuid for p in network.paths} == {"GPU-0"}
    assert len(network.paths) == 32


def test_reading_in_the_callers_thread_uses_the_callers_clock(tmp_path: Path) -> None:
    """A source that was not started reads in the sampler's thread at the sampler's ``now``: the
    rates are over the sampler's seconds, whatever the source's own clock says (the simulator's
    runs are deterministic so)."""
    layout = st.p5en_layout()
    tree = st.SysfsTree.of(tmp_path, layout)
    name = layout.nics[0].name
    frozen = Clock(5.0)  # never moves
    net = network_stage(tree, frozen)
    try:
        sample = backend_sample(layout.gpus)
        net.observe(sample, None, now=100.0)
        tree.set_counter(name, 1, "tx_bytes", 4_000_000_000)
        network, result = net.observe(sample, None, now=102.0)
        assert network is not None and result is not None and result.success
        (port,) = next(n for n in network.nics if n.device == name).ports
        assert port.tx_bytes_per_second == 2e9
    finally:
        net.close()


# --- holders --------------------------------------------------------------------------------------


def sriov_tree(root: Path) -> tuple[st.Layout, st.SysfsTree]:
    """A DGX-like node whose first ConnectX also has an SR-IOV VF (``mlx5_8`` at function 1 of the
    PF's device): each VF is an RDMA device of its own, and SR-IOV plugins name it by address."""
    layout = st.dgx_layout(link_layer="Ethernet")
    pf = layout.nics[0].function
    vf = st.PciFunction(pf.bdf[:-1] + "1", pf.root, pf.bridges, pf.numa_node, st.MELLANOX_VENDOR)
    nics = (*layout.nics, st.mlx5_roce_nic("mlx5_8", vf))
    return layout, st.SysfsTree(root, nics, layout.gpus)


def test_holders_from_the_kubelets_other_devices(tmp_path: Path, closing: list[NetworkStage]) -> None:
    """EFA plugin IDs are RDMA device names; SR-IOV plugin IDs PCI addresses (any case, with or
    without the domain); a shared ``rdma/`` pool's IDs name nothing (``device=""``); a resource
    that is no NIC and names no NIC is left out, one that names a NIC's address is kept."""
    layout, tree = sriov_tree(tmp_path)
    vf_bdf = layout.nics[0].function.bdf[:-1] + "1"
    net = network_stage(tree)
    closing.append(net)
    attribution = Attribution(
        other_devices=(
            held("a", "nvidia.com/sriov_roce", vf_bdf),
            held("b", "nvidia.com/sriov_roce", vf_bdf[5:].upper()),  # 17:00.1
            held("c", "rdma/hca_shared_devices_a", "hca_shared_devices_a-3", "hca_shared_devices_a-7"),
            held("d", "xilinx.com/fpga-xilinx_u250", "fpga0"),
            held("e", "intel.com/sriov_netdevice", layout.nics[1].function.bdf),
            held("f", "example.com/nic", "mlx5_2"),  # names an RDMA device: a holder of it
        )
    )
    network, _ = net.observe(backend_sample(layout.gpus), attribution)
    assert network is not None
    assert set(network.holders) == {
        NicHolder(ref("a"), "nvidia.com/sriov_roce", "mlx5_8"),
        NicHolder(ref("b"), "nvidia.com/sriov_roce", "mlx5_8"),
        NicHolder(ref("c"), "rdma/hca_shared_devices_a", ""),
        NicHolder(ref("e"), "intel.com/sriov_netdevice", "mlx5_1"),
        NicHolder(ref("f"), "example.com/nic", "mlx5_2"),
    }
    assert network.pods_holding("mlx5_8") == 2
    assert network.pods_holding("mlx5_0") == 0
    assert network.pods_holding("") == 1


def test_efa_holders_and_pods_holding(p5en: st.SysfsTree, closing: list[NetworkStage]) -> None:
    """``vpc.amazonaws.com/efa`` IDs are the EFA names: each named EFA is held; two containers of
    one pod holding the same EFA count one pod; two pods sharing an EFA count two."""
    layout = st.p5en_layout()
    net = network_stage(p5en)
    closing.append(net)
    own, other = layout.nearest[0], layout.nearest[1]
    attribution = Attribution(
        other_devices=(
            held("train-0", "vpc.amazonaws.com/efa", *own),
            held("train-0", "vpc.amazonaws.com/efa", own[0], container="sidecar"),
            held("train-1", "vpc.amazonaws.com/efa", own[0], *other),
            held("train-2", "vpc.amazonaws.com/efa", "rdmap999s0"),  # names none: the pool
        )
    )
    network, _ = net.observe(backend_sample(layout.gpus), attribution)
    assert network is not None
    assert len(network.holders) == 4 + 1 + 5 + 1
    assert network.pods_holding(own[0]) == 2
    assert network.pods_holding(own[1]) == 1
    assert network.pods_holding(other[3]) == 1
    assert network.pods_holding(layout.nearest[7][0]) == 0
    assert NicHolder(ref("train-2"), "vpc.amazonaws.com/efa", "") in network.holders


def test_holders_are_bounded() -> None:
    """More (container, resource, NIC) triples than ``MAX_HOLDERS``: the first ``MAX_HOLDERS`` in the
    kubelet's order."""
    nics = (NicSample("rdmap79s0", "efa", "efa", "0000:4f:00.0"),)
    devices = [held(f"p{i}", "vpc.amazonaws.com/efa", "rdmap79s0") for i in range(MAX_HOLDERS + 500)]
    holders = nic_holders(nics, devices)
    assert len(holders) == MAX_HOLDERS
    assert holders[0].pod.pod == "p0" and holders[-1].pod.pod == f"p{MAX_HOLDERS - 1}"
    assert pods.is_nic_resource("rdma/anything") and not pods.is_nic_resource("nvidia.com/gpu")


def test_no_attribution_no_holders(p5en: st.SysfsTree, closing: list[NetworkStage]) -> None:
    """Without attribution (no kubelet socket) the NICs and paths are there and nobody holds them."""
    layout = st.p5en_layout()
    net = network_stage(p5en)
    closing.append(net)
    network, _ = net.observe(backend_sample(layout.gpus), None)
    assert network is not None and network.holders == () and len(network.paths) == 256
    assert NetworkSample().pods_holding("x") == 0


# --- the source -----------------------------------------------------------------------------------


def no_nic_tree(root: Path) -> st.SysfsTree:
    return st.SysfsTree(root, gpus=st.p5en_layout().gpus)


def test_no_device_no_stage_and_one_info_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, closing: list[NetworkStage]
) -> None:
    """A node without RDMA devices: no network sample, no ``nic`` stage (not a failure), one INFO
    line over many reads and rediscoveries, no warning."""
    tree = no_nic_tree(tmp_path)
    clock = Clock()
    net = network_stage(tree, clock)
    closing.append(net)
    caplog.set_level(logging.DEBUG, logger="exporter.network")
    sample = backend_sample(st.p5en_layout().gpus)
    for _ in range(50):
        assert net.observe(sample, None) == (None, None)
        clock.now += 7.0  # 350 s: six rediscoveries
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1
    assert "no RDMA device" in infos[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_driver_loaded_later_is_picked_up_at_rediscovery(tmp_path: Path, closing: list[NetworkStage]) -> None:
    """``class/infiniband`` appearing later (the driver loaded after the exporter) gives NICs and
    a ``nic`` stage at the first rediscovery after it, not before."""
    layout = st.p5en_layout()
    tree = st.SysfsTree.of(tmp_path, layout)
    classes = tree.sysfs / "class" / "infiniband"
    hidden = tmp_path / "hidden"
    shutil.move(classes, hidden)
    clock = Clock()
    net = network_stage(tree, clock)
    closing.append(net)
    sample = backend_sample(layout.gpus)
    assert net.observe(sample, None) == (None, None)
    shutil.move(hidden, classes)
    clock.now += 30.0
    assert net.observe(sample, None) == (None, None)
    clock.now += 31.0
    network, result = net.observe(sample, None)
    assert network is not None and len(network.nics) == 32
    assert result is not None and result.success


def test_skipped_entries_are_warned_about_once_until_they_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, closing: list[NetworkStage]
) -> None:
    """A ``class/infiniband`` entry the reader skips (a link out of the tree) gives one WARNING,
    not one per rediscovery (every minute); a change in what is skipped is warned about again."""
    efa = st.PciFunction("0000:4f:00.0", "pci0000:48", ("0000:48:01.0",), 0)
    tree = st.SysfsTree(tmp_path / "node", [st.efa_nic("rdmap79s0", efa)])
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    links = tree.sysfs / "class" / "infiniband"
    (links / "evil0").symlink_to(outside)
    clock = Clock()
    net = network_stage(tree, clock)
    closing.append(net)
    caplog.set_level(logging.INFO, logger="exporter.network")
    sample = backend_sample(())

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    for _ in range(10):
        network, _ = net.observe(sample, None)
        assert network is not None and [n.device for n in network.nics] == ["rdmap79s0"]
        clock.now += 61.0
    assert warnings() == [
        f"RDMA devices under {tree.sysfs}/class/infiniband: left out 1 device(s) outside the sysfs tree or not "
        "a directory"
    ]
    (links / "evil1").symlink_to(outside)
    for _ in range(3):
        net.observe(sample, None)
        clock.now += 61.0
    assert len(warnings()) == 2 and "left out 2 device(s) outside" in warnings()[1]


def fake_entries(tree: st.SysfsTree, n: int) -> None:
    """``n`` entries under ``class/infiniband`` named to sort before every real device: nine in ten
    empty directories, one in ten links to a directory of the tree that is no PCI function's."""
    links = tree.sysfs / "class" / "infiniband"
    virtual = tree.sysfs / "devices" / "virtual" / "infiniband"
    for i in range(n):
        if i % 10:
            (links / f"a{i:05d}").mkdir()
        else:
            (virtual / f"a{i:05d}").mkdir(parents=True)
            (links / f"a{i:05d}").symlink_to(virtual / f"a{i:05d}")


def test_10032_entries_keep_the_32_real_efas_and_say_how_many_were_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, closing: list[NetworkStage]
) -> None:
    """Issue 51, defect 7: 10,000 fake entries beside the 32 EFA devices of a p5en, named to come
    first.  Before, the first 257 in directory order were read: 31 of the 32 EFAs were displaced and
    the warning said "skipped 1".  Now every EFA is kept (a PCI function and an active port come
    first), the rest fill the ceiling by name, and the page and the log give the true count."""
    layout = st.p5en_layout()
    tree = st.SysfsTree.of(tmp_path, layout)
    fake_entries(tree, 10_000)
    net = network_stage(tree)
    closing.append(net)
    caplog.set_level(logging.INFO, logger="exporter.network")
    network, result = net.observe(backend_sample(layout.gpus), None)
    assert result is not None and result.success and network is not None
    names = [n.device for n in network.nics]
    efas = sorted(n.name for n in layout.nics)
    assert sorted(set(names) & set(efas)) == efas
    assert len(names) == rdma.MAX_DEVICES
    assert names == sorted(names)
    assert dict(network.dropped) == {("device", "over_limit"): 10_032 - rdma.MAX_DEVICES}
    assert len(network.paths) == 8 * 32  # every GPU with every EFA
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"left out {10_032 - rdma.MAX_DEVICES} device(s) over --collect.nic.max-devices=64" in warning


def test_dropped_items_are_on_the_page(tmp_path: Path) -> None:
    """``gpulens_nic_items_dropped`` carries what the last discovery left out, on a scrape of the
    rendered page; nothing when nothing was."""
    layout = st.p5en_layout()
    tree = st.SysfsTree.of(tmp_path, layout)

    def page() -> str:
        source = NicSource(str(tree.sysfs), str(tree.procfs), max_devices=30, max_counters=1_000)
        sampler = Sampler(ScriptedBackend(lambda _n: backend_sample(layout.gpus)), network=NetworkStage(source))
        try:
            sampler.run_once()
            registry = CollectorRegistry()
            registry.register(SnapshotCollector(sampler.latest, backend="sim"))
            return generate_latest(registry).decode()
        finally:
            sampler.stop()

    text = page()
    # 2 of the 32 EFAs over the device ceiling; of the 30 kept, 30 x 4 traffic counters, and 1,000 -
    # 120 = 880 of the 30 x 30 others (22 - 4 of the port, 12 of the device) shared fairly.
    assert 'gpulens_nic_items_dropped{kind="device",reason="over_limit"} 2.0' in text
    assert 'gpulens_nic_items_dropped{kind="counter",reason="over_limit"} 20.0' in text
    assert text.count("gpulens_nic_info{") == 30
    stats = text.count("gpulens_nic_stat_total{") + text.count("gpulens_nic_port_stat_total{")
    assert stats == 880


def test_stale_reads_fail_the_stage(p5en: st.SysfsTree) -> None:
    """The sampler renders the latest read; once it is older than ``stale_seconds`` (a read that
    hangs in the source's thread) the stage fails and the NICs drop, until a read comes back."""
    clock = Clock()
    source = NicSource(str(p5en.sysfs), str(p5en.procfs), interval_seconds=1.0, clock=clock)
    try:
        assert source.stale_seconds == 5.0
        source.read_once()
        fresh = source.latest()
        assert fresh.stage is not None and fresh.stage.success and fresh.nics is not None
        assert fresh.host == HostGdr(peermem=False, dmabuf=False)
        clock.now += 5.0
        assert source.latest().nics is not None
        clock.now += 0.5
        stale = source.latest()
        assert stale.stage is not None and not stale.stage.success
        assert stale.nics is None
        source.read_once()
        back = source.latest()
        assert back.stage is not None and back.stage.success and back.nics is not None
    finally:
        source.close()


def test_a_read_that_raises_fails_the_stage_and_recovers(
    p5en: st.SysfsTree, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A read that raises (a driver answering something unexpected) never escapes ``read_once``:
    the stage fails, the NICs drop, the error is logged; the next good read recovers.  A
    discovery that raises does the same."""
    clock = Clock()
    source = NicSource(str(p5en.sysfs), str(p5en.procfs), clock=clock)
    net = NetworkStage(source)
    sample = backend_sample(st.p5en_layout().gpus)
    try:
        network, result = net.observe(sample, None)
        assert network is not None and result is not None and result.success
        reader = source._reader
        real_read = reader.read

        def broken(now: float) -> tuple[NicSample, ...]:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(reader, "read", broken)
        clock.now += 1.0
        network, result = net.observe(sample, None)
        assert network is None and result is not None and not result.success
        assert any(r.levelno == logging.ERROR and r.exc_info for r in caplog.records)
        monkeypatch.setattr(reader, "read", real_read)
        clock.now += 1.0
        network, result = net.observe(sample, None)
        assert network is not None and result is not None and result.success

        def broken_discovery() -> int:
            raise RuntimeError("sysfs went away")

        monkeypatch.setattr(reader, "discover", broken_discovery)
        clock.now += 61.0
        network, result = net.observe(sample, None)
        assert network is None and result is not None and not result.success
        monkeypatch.undo()
        clock.now += 1.0
        network, result = net.observe(sample, None)  # rediscovery not due yet: reads the old table
        assert network is not None and result is not None and result.success
    finally:
        net.close()


def test_source_thread_reads_and_close_is_idempotent(p5en: st.SysfsTree) -> None:
    """``start()`` reads in a daemon thread (the stage then only takes the latest); ``close()``
    stops it, closes the kept files, and may be called again."""
    before = len(os.listdir("/proc/self/fd"))
    read = threading.Event()
    source = NicSource(str(p5en.sysfs), str(p5en.procfs), interval_seconds=0.01)
    real_read_once: Callable[[float | None], None] = source.read_once

    def read_once(now: float | None = None) -> None:
        real_read_once(now)
        read.set()

    source.read_once = read_once  # type: ignore[method-assign]
    net = NetworkStage(source)
    net.start()
    net.start()  # idempotent
    assert source.started
    assert read.wait(30.0)
    network, result = net.observe(backend_sample(st.p5en_layout().gpus), None)
    assert network is not None and result is not None and result.success
    thread = source._thread
    assert thread is not None and thread.name == "gpulens-nic" and thread.daemon
    net.close()
    assert not thread.is_alive()
    assert len(os.listdir("/proc/self/fd")) == before
    net.close()
    source.close()
    assert len(os.listdir("/proc/self/fd")) == before
