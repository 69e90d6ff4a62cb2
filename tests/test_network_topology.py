"""GPU–NIC PCIe paths (exporter/network/topology.py) and GPUDirect RDMA readiness
(exporter/network/gdr.py) on fake sysfs trees written by ``exporter.sim.sysfs_tree``.

The path class comes from the two devices' directories under ``sys/devices``: the switches above
each (one per upstream port), the root complex and the NUMA node.  The p5en layout puts each GPU
and its four EFAs below one switch of their own root complex, GPUs 0-3 on NUMA node 0 and 4-7 on
1; the other shapes (two switches below one root complex, nested switches, a device on a root port)
are built here from ``PciFunction``s.  Readiness is a table of (host, NIC, path) -> reason.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exporter.model import PCIE_PATHS
from exporter.network.gdr import HostGdr, efa_p2p_ready, host_gdr, readiness
from exporter.network.topology import PciPlace, nearest, path_class, place, sysfs_bdf
from exporter.sim import sysfs_tree as st


def placed(tree: st.SysfsTree, function: st.PciFunction) -> PciPlace:
    where = place(str(tree.sysfs), function.bdf)
    assert where is not None, function.bdf
    return where


def gpu_function(bdf: str, root: str, bridges: tuple[str, ...], numa: int = 0) -> st.PciFunction:
    return st.PciFunction(bdf, root, bridges, numa, st.NVIDIA_VENDOR)


# --- sysfs_bdf ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nvml", "sysfs"),
    [
        ("00000000:18:00.0", "0000:18:00.0"),
        ("00000000:9A:00.0", "0000:9a:00.0"),  # NVML writes upper-case hex
        ("0000:1a:00.0", "0000:1a:00.0"),  # already the sysfs spelling
        ("00000001:01:00.0", "0001:01:00.0"),
        ("00010000:E1:00.0", "10000:e1:00.0"),  # a VMD domain: the kernel writes 5 digits
        (" 00000000:18:00.0\n", "0000:18:00.0"),
    ],
)
def test_sysfs_bdf_spells_nvml_bus_ids_as_the_kernel(nvml: str, sysfs: str) -> None:
    """NVML's 8-digit upper-case domain becomes the kernel's ``%04x``."""
    assert sysfs_bdf(nvml) == sysfs
    assert sysfs_bdf(nvml) == st.sysfs_bdf(nvml.strip())


# --- the p5en layout -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def p5en(module_tmp_path: Path) -> tuple[st.Layout, st.SysfsTree]:
    layout = st.p5en_layout()
    return layout, st.SysfsTree.of(module_tmp_path, layout)


def test_p5en_each_gpu_its_four_efas_are_pix_and_nearest(p5en: tuple[st.Layout, st.SysfsTree]) -> None:
    """Every GPU reaches its own four EFAs through one switch (``PIX``), the NICs of the other GPUs
    of its NUMA node through two host bridges (``NODE``), the rest across NUMA nodes (``SYS``); its
    nearest NICs are exactly its own four."""
    layout, tree = p5en
    nic_places = {n.name: placed(tree, n.function) for n in layout.nics}
    numa_of = {n.name: n.function.numa_node for n in layout.nics}
    for index, gpu in enumerate(layout.gpus):
        gpu_place = placed(tree, gpu)
        assert gpu_place.numa_node == (0 if index < 4 else 1)
        assert len(gpu_place.switches) == 1
        classes = {name: path_class(gpu_place, p) for name, p in nic_places.items()}
        own = set(layout.nearest[index])
        assert len(own) == 4
        for name, cls in classes.items():
            if name in own:
                assert cls == "PIX", (index, name)
            elif numa_of[name] == gpu.numa_node:
                assert cls == "NODE", (index, name)
            else:
                assert cls == "SYS", (index, name)
        assert sorted(classes.values()).count("PIX") == 4
        assert list(classes.values()).count("NODE") == 12
        assert list(classes.values()).count("SYS") == 16
        assert nearest(classes) == own


def test_p5en_gpu_to_gpu_paths(p5en: tuple[st.Layout, st.SysfsTree]) -> None:
    """GPUs of one NUMA node are ``NODE`` apart (each below its own root complex), of the two
    nodes ``SYS``; a GPU is ``PIX`` to itself (the relation is symmetric)."""
    layout, tree = p5en
    places = [placed(tree, g) for g in layout.gpus]
    for i, a in enumerate(places):
        for j, b in enumerate(places):
            want = "PIX" if i == j else "NODE" if (i < 4) == (j < 4) else "SYS"
            assert path_class(a, b) == want == path_class(b, a), (i, j)


def test_p4d_old_driver_gpus_and_efa_share_a_switch(tmp_path: Path) -> None:
    """p4d: two A100s and one EFA below each switch: each GPU's nearest NIC is that EFA (``PIX``)."""
    layout = st.p4d_layout()
    tree = st.SysfsTree.of(tmp_path, layout)
    nic_places = {n.name: placed(tree, n.function) for n in layout.nics}
    for index, gpu in enumerate(layout.gpus):
        classes = {name: path_class(placed(tree, gpu), p) for name, p in nic_places.items()}
        assert nearest(classes) == set(layout.nearest[index])
        assert {classes[n] for n in layout.nearest[index]} == {"PIX"}
        assert set(classes.values()) == {"PIX", "NODE", "SYS"}


# --- other shapes ---------------------------------------------------------------------------------

ROOT = "pci0000:10"


def test_two_switches_below_one_root_complex_are_phb(tmp_path: Path) -> None:
    """A GPU below one switch and a NIC below another, both on root ports of the same root
    complex: the path goes through the host bridge (``PHB``)."""
    gpu = gpu_function("0000:14:00.0", ROOT, ("0000:10:01.0", "0000:11:00.0", "0000:12:00.0"))
    nic = st.efa_nic(
        "rdmap24s0", st.PciFunction("0000:18:00.0", ROOT, ("0000:10:02.0", "0000:15:00.0", "0000:16:00.0"), 0)
    )
    tree = st.SysfsTree(tmp_path, [nic], [gpu])
    assert path_class(placed(tree, gpu), placed(tree, nic.function)) == "PHB"


def test_nested_switches_are_pxb_and_the_inner_switch_pix(tmp_path: Path) -> None:
    """A GPU below a switch that hangs below another switch; a NIC on the outer switch is ``PXB``
    (two switches, no host bridge); a NIC on the inner switch ``PIX``; the nearest is the inner one."""
    outer = ("0000:10:01.0", "0000:11:00.0", "0000:12:00.0")  # root port, outer up, outer down 0
    inner = (*outer, "0000:13:00.0", "0000:14:00.0")  # inner up, inner down 0
    gpu = gpu_function("0000:15:00.0", ROOT, inner)
    on_outer = st.efa_nic(
        "rdmap32s0", st.PciFunction("0000:20:00.0", ROOT, (*outer[:2], "0000:12:01.0"), 0)
    )  # outer down 1
    on_inner = st.efa_nic("rdmap22s0", st.PciFunction("0000:16:00.0", ROOT, (*inner[:4], "0000:14:01.0"), 0))
    tree = st.SysfsTree(tmp_path, [on_outer, on_inner], [gpu])
    gpu_place = placed(tree, gpu)
    assert gpu_place.switches == ("0000:13:00.0", "0000:11:00.0")  # nearest first
    classes = {
        "rdmap32s0": path_class(gpu_place, placed(tree, on_outer.function)),
        "rdmap22s0": path_class(gpu_place, placed(tree, on_inner.function)),
    }
    assert classes == {"rdmap32s0": "PXB", "rdmap22s0": "PIX"}
    assert nearest(classes) == {"rdmap22s0"}


def test_device_on_a_root_port_has_no_switch(tmp_path: Path) -> None:
    """A NIC plugged into a root port directly (no switch) and a GPU below a switch of the same
    root complex: ``PHB``; two devices on root ports of one root complex: ``PHB`` too."""
    nic = st.mlx5_roce_nic("mlx5_0", st.PciFunction("0000:11:00.0", ROOT, ("0000:10:01.0",), 0))
    other = st.mlx5_roce_nic("mlx5_1", st.PciFunction("0000:12:00.0", ROOT, ("0000:10:02.0",), 0))
    gpu = gpu_function("0000:16:00.0", ROOT, ("0000:10:03.0", "0000:14:00.0", "0000:15:00.0"))
    tree = st.SysfsTree(tmp_path, [nic, other], [gpu])
    nic_place = placed(tree, nic.function)
    assert nic_place == PciPlace(ROOT, (), 0)
    assert path_class(placed(tree, gpu), nic_place) == "PHB"
    assert path_class(nic_place, placed(tree, other.function)) == "PHB"


def test_hosts_without_numa_are_node_between_root_complexes(tmp_path: Path) -> None:
    """``numa_node`` -1 (no NUMA) is no node: two root complexes of such a host are ``NODE``,
    not ``SYS``."""
    gpu = gpu_function("0000:14:00.0", "pci0000:10", ("0000:10:01.0",), numa=-1)
    nic = st.efa_nic("rdmap36s0", st.PciFunction("0000:24:00.0", "pci0000:20", ("0000:20:01.0",), -1))
    tree = st.SysfsTree(tmp_path, [nic], [gpu])
    gpu_place = placed(tree, gpu)
    assert gpu_place.numa_node is None
    assert path_class(gpu_place, placed(tree, nic.function)) == "NODE"


def test_place_is_none_for_a_bdf_absent_malformed_or_leaving_the_tree(tmp_path: Path) -> None:
    """``place`` answers only for a function whose ``bus/pci/devices`` link resolves below the
    tree's ``devices/pci*``: a missing BDF, a malformed one, a link out of the tree or to a
    non-PCI directory give ``None``."""
    tree = st.SysfsTree(tmp_path / "node", [], [gpu_function("0000:14:00.0", ROOT, ("0000:10:01.0",))])
    sysfs = str(tree.sysfs)
    assert place(sysfs, "0000:14:00.0") is not None
    assert place(sysfs, "0000:99:00.0") is None
    assert place(sysfs, "../../etc") is None
    assert place(sysfs, "00000000:14:00.0x") is None
    outside = tmp_path / "elsewhere" / "devices" / ROOT / "0000:10:01.0" / "0000:15:00.0"
    outside.mkdir(parents=True)
    (outside / "numa_node").write_text("0\n")
    devices = tree.sysfs / "bus" / "pci" / "devices"
    (devices / "0000:15:00.0").symlink_to(outside)
    assert place(sysfs, "0000:15:00.0") is None
    virtual = tree.sysfs / "devices" / "virtual" / "0000:16:00.0"
    virtual.mkdir(parents=True)
    (devices / "0000:16:00.0").symlink_to(os.path.relpath(virtual, devices))
    assert place(sysfs, "0000:16:00.0") is None


def test_nearest_of_nothing_and_of_ties() -> None:
    """``nearest`` is every NIC at the best class present, and nothing of nothing."""
    assert nearest({}) == set()
    assert nearest({"a": "SYS", "b": "SYS"}) == {"a", "b"}
    assert nearest({"a": "PHB", "b": "PXB", "c": "PXB", "d": "NODE"}) == {"b", "c"}
    assert PCIE_PATHS.index("PIX") < PCIE_PATHS.index("SYS")


# --- readiness --------------------------------------------------------------------------------------

NONE = HostGdr(peermem=False, dmabuf=False)
PEERMEM = HostGdr(peermem=True, dmabuf=False)
DMABUF = HostGdr(peermem=False, dmabuf=True)
BOTH = HostGdr(peermem=True, dmabuf=True)


@pytest.mark.parametrize(
    ("host", "kind", "p2p", "path", "want"),
    [
        # InfiniBand / RoCE: a peer-memory module first, else DMA-BUF.
        (PEERMEM, "infiniband", None, "PIX", (True, "peermem")),
        (BOTH, "roce", None, "PXB", (True, "peermem")),
        (DMABUF, "infiniband", None, "PIX", (True, "dmabuf")),
        (NONE, "infiniband", None, "PIX", (False, "no_peer_memory")),
        (NONE, "rdma", None, "PIX", (False, "no_peer_memory")),
        # EFA: its own p2p provider, else DMA-BUF; never ib_core's peer-memory clients.
        (NONE, "efa", "NVIDIA peermem", "PIX", (True, "efa_p2p")),
        (NONE, "efa", "NVIDIA", "PIX", (True, "efa_p2p")),
        (DMABUF, "efa", "NVIDIA peermem", "PIX", (True, "efa_p2p")),
        (DMABUF, "efa", "", "PIX", (True, "dmabuf")),
        (NONE, "efa", "", "PIX", (False, "no_peer_memory")),
        (PEERMEM, "efa", "", "PIX", (False, "no_peer_memory")),
        (NONE, "efa", "NEURON", "PIX", (False, "no_peer_memory")),
        (DMABUF, "efa", None, "PXB", (True, "dmabuf")),
        # An older EFA driver's gdr file.
        (NONE, "efa", "1", "PIX", (True, "efa_p2p")),
        (NONE, "efa", "0", "PIX", (False, "no_peer_memory")),
        # The path: PIX and PXB are close enough for NCCL's default.
        (PEERMEM, "infiniband", None, "PHB", (False, "path_phb")),
        (PEERMEM, "infiniband", None, "NODE", (False, "path_node")),
        (PEERMEM, "roce", None, "SYS", (False, "path_sys")),
        (NONE, "efa", "NVIDIA", "SYS", (False, "path_sys")),
        # The first failing reason: no peer memory is said before the path.
        (NONE, "infiniband", None, "SYS", (False, "no_peer_memory")),
    ],
)
def test_readiness_reasons(host: HostGdr, kind: str, p2p: str | None, path: str, want: tuple[bool, str]) -> None:
    """Every reason ``gpulens_gpu_nic_gdr_ready`` can carry, from the (host, NIC, path) that gives it."""
    assert readiness(host, kind, p2p, path) == want


@pytest.mark.parametrize(
    ("p2p", "ready"),
    [
        ("NVIDIA peermem", True),
        ("NVIDIA", True),
        ("nvidia\n", True),
        ("1", True),
        ("0", False),
        ("", False),
        ("NEURON", False),
        (None, False),
    ],
)
def test_efa_p2p_ready(p2p: str | None, ready: bool) -> None:
    """What the EFA driver's ``p2p`` (or an older one's ``gdr``) says about GPU memory."""
    assert efa_p2p_ready(p2p) is ready


@pytest.mark.parametrize(
    ("peermem", "open_module"), [(True, True), (True, False), (False, True), (False, False)], ids=str
)
def test_host_gdr_reads_peermem_module_and_driver_kind(tmp_path: Path, peermem: bool, open_module: bool) -> None:
    """``module/nvidia_peermem/version`` says a peer-memory module is loaded; the open kernel
    module's ``/proc/driver/nvidia/version`` banner ("Open Kernel Module") says DMA-BUF."""
    tree = st.SysfsTree(tmp_path, peermem=peermem, open_kernel_module=open_module)
    assert host_gdr(str(tree.sysfs), str(tree.procfs)) == HostGdr(peermem=peermem, dmabuf=open_module)


@pytest.mark.parametrize("registered", ["nv_mem", "nv_mem_nc"])
def test_host_gdr_reads_the_older_nv_peer_mem_registration(tmp_path: Path, registered: str) -> None:
    """The older ``nv_peer_mem`` module registers as ``kernel/mm/memory_peers/nv_mem[_nc]``."""
    tree = st.SysfsTree(tmp_path, peermem=False, open_kernel_module=False)
    version = tree.sysfs / "kernel" / "mm" / "memory_peers" / registered / "version"
    version.parent.mkdir(parents=True)
    version.write_text("1.3-0\n")
    assert host_gdr(str(tree.sysfs), str(tree.procfs)) == HostGdr(peermem=True, dmabuf=False)


def test_host_gdr_without_files_or_with_a_fifo_is_neither(tmp_path: Path) -> None:
    """No peer-memory file and no driver banner: neither; a FIFO planted as either reads as
    absent and blocks nothing."""
    sysfs, procfs = tmp_path / "sys", tmp_path / "proc"
    assert host_gdr(str(sysfs), str(procfs)) == NONE
    (sysfs / "module" / "nvidia_peermem").mkdir(parents=True)
    os.mkfifo(sysfs / "module" / "nvidia_peermem" / "version")
    (procfs / "driver" / "nvidia").mkdir(parents=True)
    os.mkfifo(procfs / "driver" / "nvidia" / "version")
    assert host_gdr(str(sysfs), str(procfs)) == NONE
