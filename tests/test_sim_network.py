"""The simulator's network side: the fake sysfs/procfs tree (kernel layouts of EFA and mlx5 NICs,
PCIe paths, peer-memory module, driver kind) and the two p5en nodes of a multi-node training job
whose NIC counters follow the GPUs' all-reduce traffic."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporter.analysis.boundness import BoundnessClassifier
from exporter.attribution.merge import PodMeta
from exporter.model import GpuSample
from exporter.sim import SCENARIOS, SimulatedBackend, scenarios
from exporter.sim import sysfs_tree as st
from exporter.sim.workloads import AllReduceTraining

NETWORK = ("p5en", "p5en-nogdr")
CYCLES = 100
GB = 1e9


def walk_symlinks(root: Path) -> Iterator[Path]:
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory, name)
            if path.is_symlink():
                yield path


def read(path: Path) -> str:
    return path.read_text()


# --- the tree -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def p5en_tree(module_tmp_path: Path) -> st.SysfsTree:
    """One tree for the module (writing 1,500 files takes a while); tests that set counters use
    their own NIC."""
    return st.SysfsTree.of(module_tmp_path, st.p5en_layout(), peermem=True, open_kernel_module=True)


def test_every_symlink_is_relative_and_resolves_inside_the_tree(p5en_tree: st.SysfsTree) -> None:
    top = p5en_tree.sysfs.parent
    links = list(walk_symlinks(top))
    assert len(links) > 100
    root = top.resolve()
    for link in links:
        target = os.readlink(link)
        assert not os.path.isabs(target), (link, target)
        resolved = link.resolve()
        assert resolved.is_relative_to(root) and resolved.exists(), (link, target)


def test_class_infiniband_lists_the_rdma_devices_as_the_kernel_links_them(p5en_tree: st.SysfsTree) -> None:
    entries = sorted((p5en_tree.sysfs / "class" / "infiniband").iterdir())
    assert len(entries) == 32
    for entry in entries:
        assert re.fullmatch(r"rdmap\d+s0", entry.name)
        assert os.readlink(entry).startswith("../../devices/pci0000:")
        assert os.readlink(entry).endswith(f"/infiniband/{entry.name}")
        assert read(entry / "node_type") == "1: CA\n"
        function = (entry / "device").resolve()
        assert function.parent.name != "infiniband" and function == (entry / ".." / "..").resolve()
        assert int(entry.name[5:-2]) == int(function.name.split(":")[1], 16)  # rdmap<bus in decimal>s0
        assert (entry / "device" / "driver").resolve().name == "efa"
        assert read(entry / "ports" / "1" / "state") == "4: ACTIVE\n"
        assert read(entry / "ports" / "1" / "phys_state") == "5: LinkUp\n"
        assert read(entry / "ports" / "1" / "rate") == "100 Gb/sec (4X EDR)\n"
        assert read(entry / "ports" / "1" / "link_layer") == "Unknown\n"


def test_bus_pci_devices_lists_every_gpu_and_nic_and_their_bridges(p5en_tree: st.SysfsTree) -> None:
    devices = p5en_tree.sysfs / "bus" / "pci" / "devices"
    for bus_id in scenarios.build("p5en").gpus:
        gpu = devices / st.sysfs_bdf(bus_id.pci_bus_id)
        assert os.readlink(gpu).startswith("../../../devices/pci0000:")
        assert read(gpu / "vendor") == "0x10de\n" and read(gpu / "class") == "0x030200\n"
        assert (gpu / "driver").resolve().name == "nvidia"
    for nic in p5en_tree.nics:
        entry = devices / nic.function.bdf
        assert entry.resolve() == (p5en_tree.sysfs / "class" / "infiniband" / nic.name / "device").resolve()
        for bridge in nic.function.bridges:
            assert (devices / bridge).resolve().is_dir()


def test_counter_files_are_fixed_width_and_lifespan_is_a_setting(p5en_tree: st.SysfsTree) -> None:
    device = p5en_tree.device_dir("rdmap20s0")
    for directory in (device / "hw_counters", device / "ports" / "1" / "hw_counters"):
        for path in directory.iterdir():
            text = read(path)
            if path.name == "lifespan":
                assert text == "10\n"
            else:
                assert text == "0" * 20 + "\n", path
    p5en_tree.set_counter("rdmap39s0", 1, "tx_bytes", 123456789)
    path = p5en_tree.device_dir("rdmap39s0") / "ports" / "1" / "hw_counters" / "tx_bytes"
    assert read(path) == "00000000000123456789\n"
    assert p5en_tree.counter("rdmap39s0", 1, "tx_bytes") == 123456789
    with pytest.raises(KeyError):
        p5en_tree.set_counter("rdmap39s0", 1, "no_such_counter", 1)
    with pytest.raises(KeyError):
        p5en_tree.set_counter("rdmap39s0", None, "tx_bytes", 1)  # a port counter, not the device's
    with pytest.raises(ValueError):
        p5en_tree.set_counter("rdmap39s0", 1, "tx_bytes", -1)


def test_set_counter_rewrites_in_place_for_a_reader_holding_the_file_open(p5en_tree: st.SysfsTree) -> None:
    path = p5en_tree.counter_path("rdmap40s0", None, "keep_alive_rcvd")
    inode = path.stat().st_ino
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert int(os.pread(fd, 64, 0)) == 0
        p5en_tree.set_counter("rdmap40s0", None, "keep_alive_rcvd", 42)
        assert path.stat().st_ino == inode
        assert os.pread(fd, 64, 0) == b"00000000000000000042\n"

        # A writer rewriting it while the reader reads: never an empty or short read.
        def write() -> None:
            for value in range(43, 2043):
                p5en_tree.set_counter("rdmap40s0", None, "keep_alive_rcvd", value)

        writer = threading.Thread(target=write)
        seen = []
        writer.start()
        while writer.is_alive():
            seen.append(os.pread(fd, 64, 0))
        writer.join()
        seen.append(os.pread(fd, 64, 0))
        assert all(len(x) == 21 and x.endswith(b"\n") for x in seen)
        values = [int(x) for x in seen]
        assert values == sorted(values) and values[-1] == 2042
    finally:
        os.close(fd)
    assert path.stat().st_ino == inode


def test_peer_memory_module_and_driver_kind(p5en_tree: st.SysfsTree, tmp_path: Path) -> None:
    gdr = p5en_tree
    assert read(gdr.sysfs / "module" / "nvidia_peermem" / "version") == "580.159.04\n"
    banner = read(gdr.procfs / "driver" / "nvidia" / "version").splitlines()[0]
    assert banner == (
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Thu Nov 13 02:04:38 UTC 2025"
    )
    plain = st.SysfsTree.of(tmp_path, st.p5en_layout(""), peermem=False, open_kernel_module=False)
    assert not (plain.sysfs / "module").exists()
    banner = read(plain.procfs / "driver" / "nvidia" / "version").splitlines()[0]
    assert banner.startswith("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Release Build")
    function = plain.device_dir("rdmap20s0") / "device"
    assert read(function / "p2p") == "" and not (function / "gdr").exists()
    assert read(gdr.device_dir("rdmap20s0") / "device" / "p2p") == "NVIDIA peermem\n"


# --- the four driver layouts -----------------------------------------------------------------------


def names_in(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


def test_efa_recent_driver_layout(p5en_tree: st.SysfsTree) -> None:
    device = p5en_tree.device_dir("rdmap20s0")
    port = names_in(device / "ports" / "1" / "hw_counters")
    assert port == {*st.EFA_PORT_COUNTERS, "lifespan"} and len(st.EFA_PORT_COUNTERS) == 22
    assert {"rdma_write_bytes", "rdma_write_wrs", "rdma_write_recv_bytes", "rdma_write_wr_err"} <= port
    srd = {"retrans_bytes", "retrans_pkts", "retrans_timeout_events", "unresponsive_remote_events"}
    assert srd | {"impaired_remote_conn_events"} <= port
    assert names_in(device / "hw_counters") == {*st.EFA_DEVICE_COUNTERS, "lifespan"}
    assert len(st.EFA_DEVICE_COUNTERS) == 12
    assert not (device / "ports" / "1" / "counters").exists()


def test_efa_older_driver_layout(tmp_path: Path) -> None:
    layout = st.p4d_layout()
    tree = st.SysfsTree.of(tmp_path, layout)
    assert [n.name for n in layout.nics] == ["rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27"]
    device = tree.device_dir("rdmap16s27")
    assert names_in(device / "ports" / "1" / "hw_counters") == {*st.EFA_OLD_DRIVER_COUNTERS, "lifespan"}
    assert not (device / "hw_counters").exists()
    assert read(device / "device" / "gdr") == "1\n" and not (device / "device" / "p2p").exists()
    # Two A100s and the EFA on one bus below one switch; NVML's addresses of the a100 scenario.
    a100 = [st.sysfs_bdf(g.pci_bus_id) for g in scenarios.build("a100").gpus]
    assert [g.bdf for g in layout.gpus] == a100
    assert (tree.sysfs / "bus" / "pci" / "devices" / a100[0]).resolve().parent == (device / "device").resolve().parent
    tree.set_counter("rdmap16s27", 1, "keep_alive_rcvd", 7)  # a port counter on these drivers
    assert tree.counter("rdmap16s27", 1, "keep_alive_rcvd") == 7


@pytest.mark.parametrize(
    ("link_layer", "rate", "class_code"),
    [("InfiniBand", "400 Gb/sec (4X NDR)", "0x020700"), ("Ethernet", "200 Gb/sec (4X HDR)", "0x020000")],
)
def test_mlx5_layouts(tmp_path: Path, link_layer: str, rate: str, class_code: str) -> None:
    layout = st.dgx_layout(link_layer)
    tree = st.SysfsTree.of(tmp_path, layout)
    assert [n.name for n in layout.nics] == [f"mlx5_{i}" for i in range(8)]
    device = tree.device_dir("mlx5_3")
    port = device / "ports" / "1"
    assert names_in(port / "counters") == set(st.IB_PORT_COUNTERS)  # no lifespan among the IB counters
    assert names_in(port / "hw_counters") == {*st.MLX5_HW_COUNTERS, "lifespan"}
    assert not (device / "hw_counters").exists()
    assert read(port / "link_layer") == f"{link_layer}\n" and read(port / "rate") == f"{rate}\n"
    assert (device / "device" / "driver").resolve().name == "mlx5_core"
    assert read(device / "device" / "class") == f"{class_code}\n"
    assert read(device / "device" / "vendor") == "0x15b3\n"
    tree.set_counter("mlx5_3", 1, "port_xmit_data", 1000)  # words
    assert read(port / "counters" / "port_xmit_data") == "00000000000000001000\n"
    tree.set_counter("mlx5_3", 1, "np_cnp_sent", 5)
    assert read(port / "hw_counters" / "np_cnp_sent") == "00000000000000000005\n"


# --- the p5en topology ---------------------------------------------------------------------------


def test_p5en_topology_each_gpu_shares_a_switch_with_its_four_efas(p5en_tree: st.SysfsTree) -> None:
    layout = st.p5en_layout()
    devices = p5en_tree.sysfs / "bus" / "pci" / "devices"
    gpu_ids = [st.sysfs_bdf(g.pci_bus_id) for g in scenarios.build("p5en").gpus]
    assert [g.bdf for g in layout.gpus] == gpu_ids
    assert sorted(n for names in layout.nearest for n in names) == sorted(n.name for n in layout.nics)
    roots = set()
    for index, (gpu_id, nearest) in enumerate(zip(gpu_ids, layout.nearest, strict=True)):
        gpu = (devices / gpu_id).resolve()
        assert len(nearest) == 4
        upstream = gpu.parent.parent  # the switch's upstream port (the downstream port is gpu.parent)
        for name in nearest:
            nic = (p5en_tree.sysfs / "class" / "infiniband" / name / "device").resolve()
            assert nic.parent != gpu.parent and nic.parent.parent == upstream  # PIX: one switch
        roots.add(gpu.parents[3].name)
        numa = "0\n" if index < 4 else "1\n"
        assert read(gpu / "numa_node") == numa
        assert all(read(p5en_tree.device_dir(n) / "device" / "numa_node") == numa for n in nearest)
        # No other GPU's NIC sits below this switch.
        others = {n for i, names in enumerate(layout.nearest) if i != index for n in names}
        for name in others:
            nic = (p5en_tree.sysfs / "class" / "infiniband" / name / "device").resolve()
            assert not nic.is_relative_to(upstream)
    assert len(roots) == 8 and all(r.startswith("pci0000:") for r in roots)


def test_rdma_names_follow_the_pci_bus() -> None:
    function = st.PciFunction("0000:4f:00.0", "pci0000:48", ("0000:48:01.0", "0000:49:00.0", "0000:4a:02.0"), 0)
    assert st.rdma_name(function) == "rdmap79s0"
    assert st.sysfs_bdf("00000000:9A:00.0") == "0000:9a:00.0"


# --- the scenarios ----------------------------------------------------------------------------------


@dataclass
class Run:
    """A played node: its samples after the first, and every NIC counter after each sample."""

    samples: list[list[GpuSample]]
    counters: list[dict[tuple[str, str], int]]
    nearest: tuple[tuple[str, ...], ...]
    pods: tuple[PodMeta, ...]


WATCHED = ("rdmap20s0", "rdmap21s0", "rdmap22s0", "rdmap23s0", "rdmap215s0", "rdmap216s0", "rdmap217s0", "rdmap218s0")
"""NICs whose every counter is read after each sample (GPU 0's and GPU 7's); of the others, the bytes."""


def counter_files(sysfs: Path) -> list[tuple[tuple[str, str], str]]:
    """(NIC, counter) and its file for every counter ``counters_now`` reads (the tree's files do
    not change while it is played: listed once)."""
    out = []
    for nic in (sysfs / "class" / "infiniband").iterdir():
        port = nic / "ports" / "1" / "hw_counters"
        if nic.name in WATCHED:
            paths = [*(nic / "hw_counters").iterdir(), *port.iterdir()]
        else:
            paths = [port / "tx_bytes", port / "rx_bytes"]
        out += [((nic.name, path.name), str(path)) for path in paths if path.name != "lifespan"]
    return out


def counters_now(files: list[tuple[tuple[str, str], str]]) -> dict[tuple[str, str], int]:
    """Every counter of ``files`` as a reader parses it now."""
    out = {}
    for key, path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            out[key] = int(os.read(fd, 64))
        finally:
            os.close(fd)
    return out


SEED = 3


def play(scenario: str, cycles: int = CYCLES) -> Run:
    backend = SimulatedBackend(scenario, seed=SEED)
    roots = backend.network_roots()
    assert roots is not None
    network = scenarios.build(scenario).network
    assert network is not None
    try:
        backend.sample()
        files = counter_files(Path(roots[0]))
        samples, counters = [], [counters_now(files)]
        for _ in range(cycles):
            samples.append(list(backend.sample().gpus))
            counters.append(counters_now(files))
    finally:
        backend.close()
    return Run(samples, counters, network.layout.nearest, backend.pods())


@pytest.fixture(scope="module")
def runs() -> dict[str, Run]:
    return {scenario: play(scenario) for scenario in NETWORK}


WITH_NICS = (*NETWORK, "jobs-0", "jobs-1", "serving")
"""The scenarios whose nodes have RDMA NICs (the serving node is a p5en too)."""


def test_the_network_nodes_are_scenarios_after_the_others() -> None:
    assert SCENARIOS[-len(WITH_NICS) :] == WITH_NICS
    assert SCENARIOS.index("a10g") == len(SCENARIOS) - len(WITH_NICS) - 1


@pytest.mark.parametrize(("scenario", "worker"), [("p5en", 0), ("p5en-nogdr", 1)])
def test_one_pytorchjob_worker_holds_every_gpu_and_efa(runs: dict[str, Run], scenario: str, worker: int) -> None:
    backend = SimulatedBackend(scenario)  # seed 0; the runs' seed 3 gives the same identities
    try:
        roots = backend.network_roots()
        assert roots is not None
        rdma = sorted(p.name for p in (Path(roots[0]) / "class" / "infiniband").iterdir())
        (pod,) = backend.pods()
        assert (pod.namespace, pod.name) == ("ml-training", f"llama-70b-pretrain-worker-{worker}")
        assert (pod.workload_kind, pod.workload) == ("PyTorchJob", "llama-70b-pretrain")
        held = {d.resource: d.device_ids for d in backend.pod_devices()}
        assert set(held) == {"nvidia.com/gpu", "vpc.amazonaws.com/efa"}
        assert sorted(held["vpc.amazonaws.com/efa"]) == rdma and len(rdma) == 32
        gpus = backend.sample().gpus
        assert sorted(held["nvidia.com/gpu"]) == sorted(g.uuid for g in gpus)
        assert all(len(g.leaves[0].processes) == 1 for g in gpus)
        owners = backend.pid_owners()
        assert {owners[p.pid].pod_uid for g in gpus for p in g.leaves[0].processes} == {pod.uid}
        assert [g.uuid for g in gpus] == [g.uuid for g in runs[scenario].samples[0]]
        assert backend.pods() == runs[scenario].pods
    finally:
        backend.close()


def test_the_counters_depend_on_the_seed_and_the_samples_taken_only(runs: dict[str, Run]) -> None:
    again = SimulatedBackend("p5en", seed=SEED)
    try:
        for _ in range(9):
            again.sample()
        roots = again.network_roots()
        assert roots is not None
        assert counters_now(counter_files(Path(roots[0]))) == runs["p5en"].counters[8]
    finally:
        again.close()


def nic_delta(run: Run, n: int, gpu: int, counter: str) -> int:
    """Bytes GPU ``gpu``'s nearest NICs counted in sample ``n`` (1 s)."""
    before, after = run.counters[n], run.counters[n + 1]
    return sum(after[(nic, counter)] - before[(nic, counter)] for nic in run.nearest[gpu])


@pytest.mark.parametrize("scenario", NETWORK)
def test_gpu_pcie_bytes_match_nic_bytes_in_the_all_reduce(runs: dict[str, Run], scenario: str) -> None:
    run = runs[scenario]
    checked = 0
    for n, gpus in enumerate(run.samples):
        for gpu in gpus:
            tx, rx = gpu.pcie_tx_bytes_per_second, gpu.pcie_rx_bytes_per_second
            assert tx is not None and rx is not None
            sent, received = nic_delta(run, n, gpu.index, "tx_bytes"), nic_delta(run, n, gpu.index, "rx_bytes")
            # The NICs read what they send from GPU memory over the GPU's link, and write what they
            # receive into it (beside: the driver's few KB/s, and the next batch while computing).
            assert abs(tx - sent) <= 1e-3 * sent + 1e4
            assert 0 <= rx - received < 0.06 * GB
            checked += sent > 1e9  # all-reducing
    assert checked > 8 * CYCLES // 4


@pytest.mark.parametrize("scenario", NETWORK)
def test_counters_only_grow(runs: dict[str, Run], scenario: str) -> None:
    run = runs[scenario]
    for before, after in zip(run.counters, run.counters[1:], strict=False):
        assert after.keys() == before.keys()
        assert all(after[k] >= before[k] for k in before)
    first, last = run.counters[0], run.counters[-1]
    assert len(last) == 8 * 34 + 24 * 2
    for nic in WATCHED:
        assert last[(nic, "keep_alive_rcvd")] - first[(nic, "keep_alive_rcvd")] == CYCLES
        sent = last[(nic, "tx_pkts")] - first[(nic, "tx_pkts")]
        assert sent > 0 and last[(nic, "rx_bytes")] > first[(nic, "rx_bytes")]
        assert last[(nic, "rdma_write_bytes")] > first[(nic, "rdma_write_bytes")]
        # The SRD transport retransmits rarely: a few packets in a million.
        assert 0 < last[(nic, "retrans_pkts")] - first[(nic, "retrans_pkts")] < 1e-5 * sent
        for error in ("rdma_write_wr_err", "rdma_read_wr_err", "unresponsive_remote_events", "cmds_err"):
            assert last[(nic, error)] == first[(nic, error)] == 0


def all_reduce_seconds(run: Run, gpu: int) -> float:
    return sum(1.0 for n in range(len(run.samples)) if nic_delta(run, n, gpu, "tx_bytes") > 0)


def node_rate(run: Run) -> float:
    """The node's NIC bytes/s each way in the seconds every GPU spent all-reducing."""
    rates = []
    for n in range(len(run.samples)):
        sent = [nic_delta(run, n, g, "tx_bytes") for g in range(8)]
        nvlink = [g.nvlink_tx_bytes_per_second or 0.0 for g in run.samples[n]]
        if min(sent) > 0 and all(x > 0 for x in nvlink):
            rates.append(sum(sent))
    return sorted(rates)[len(rates) // 2]


def test_without_gpudirect_the_all_reduce_is_slower_and_longer(runs: dict[str, Run]) -> None:
    gdr, bounce = runs["p5en"], runs["p5en-nogdr"]
    assert node_rate(gdr) == pytest.approx(93 * GB, rel=0.03)
    assert node_rate(bounce) == pytest.approx(33 * GB, rel=0.03)
    # Each step moves the same bytes: ~2.8x the time, and a larger share of it.
    steps = {name: AllReduceTraining(nic_bytes_per_second=rate / 8) for name, rate in (("gdr", 93e9), ("b", 33e9))}
    assert steps["b"].allreduce_seconds / steps["gdr"].allreduce_seconds == pytest.approx(2.82, abs=0.01)
    for gpu in range(8):
        assert all_reduce_seconds(bounce, gpu) > 2.0 * all_reduce_seconds(gdr, gpu)


def test_the_straggler_is_thermally_throttled_and_its_peers_are_not(runs: dict[str, Run]) -> None:
    def slowed(gpu: GpuSample) -> bool:
        return bool(gpu.clock_events and gpu.clock_events["hw_thermal_slowdown"])

    for gpus in runs["p5en"].samples[10:]:
        straggler = gpus[scenarios.P5EN_STRAGGLER]
        assert straggler.sm_clock_max_hertz is not None and straggler.sm_clock_hertz is not None
        assert straggler.sm_clock_hertz <= 0.5 * straggler.sm_clock_max_hertz
        assert slowed(straggler)
        assert straggler.temperature_celsius is not None and straggler.temperature_celsius >= 88
        for peer in gpus:
            if peer.index != straggler.index:
                assert peer.sm_clock_hertz is not None and peer.sm_clock_hertz > 1.5 * straggler.sm_clock_hertz
                assert not slowed(peer)
    for gpus in runs["p5en-nogdr"].samples:
        assert not any(slowed(g) for g in gpus)


def classes(run: Run) -> dict[int, list[str | None]]:
    """Each GPU's class through the GPM classifier, as tests/test_boundness.py's classify_sim."""
    clf = BoundnessClassifier()
    out: dict[int, list[str | None]] = {}
    for n, gpus in enumerate(run.samples):
        for gpu in gpus:
            leaf = gpu.leaves[0]
            cls = clf.observe(leaf.leaf_id, leaf.gpm, gpu.utilization_ratio, True, float(n + 1))
            out.setdefault(gpu.index, []).append(cls)
    return out


def test_the_peers_wait_in_nccl_and_the_straggler_computes(runs: dict[str, Run]) -> None:
    for gpu, seq in classes(runs["p5en"]).items():
        expected = "compute" if gpu == scenarios.P5EN_STRAGGLER else "latency"
        assert set(seq[15:]) == {expected}, (gpu, seq)


def test_without_gpudirect_every_gpu_waits_on_the_network_most_of_the_time(runs: dict[str, Run]) -> None:
    for gpu, seq in classes(runs["p5en-nogdr"]).items():
        assert set(seq[15:]) == {"latency"}, (gpu, seq)


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s not in WITH_NICS])
def test_nodes_without_nics_have_no_tree(scenario: str) -> None:
    backend = SimulatedBackend(scenario)
    assert backend.network_roots() is None
    backend.close()


def test_close_removes_the_tree_once() -> None:
    backend = SimulatedBackend("p5en-nogdr")
    roots = backend.network_roots()
    assert roots is not None
    top = Path(roots[0]).parent
    assert top.is_dir() and Path(roots[1], "driver", "nvidia", "version").is_file()
    backend.close()
    assert not top.exists()
    backend.close()
