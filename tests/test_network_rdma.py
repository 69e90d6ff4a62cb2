"""The RDMA reader (exporter/network/rdma.py) against fake sysfs trees written by
``exporter.sim.sysfs_tree``: what each kind of NIC's files become, how counters stay monotonic
(32- and 64-bit wraps, resets), what a broken or hostile tree costs (nothing but its own series),
and that kept-open files see in-place updates.

Counter files of the fake tree are rewritten in place (``SysfsTree.set_counter``: same inode, one
``pwrite`` at offset 0), as sysfs regenerates an attribute at each read from offset 0, so a reader
that keeps a file open sees every new value without reopening it.
"""

from __future__ import annotations

import os
import resource
import shutil
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exporter import fsread
from exporter.model import NicPort, NicSample
from exporter.network import rdma
from exporter.network.rdma import (
    MAX_COUNTERS_PER_DIR,
    MAX_DEVICES,
    SLOW_EVERY,
    WRAP_32,
    WRAP_64,
    RdmaReader,
    counter_advance,
    open_budget,
    parse_rate,
    parse_state,
)
from exporter.sim import sysfs_tree as st

EFA = "rdmap79s0"
EFA_FUNCTION = st.PciFunction(
    "0000:4f:00.0", "pci0000:48", ("0000:48:01.0", "0000:49:00.0", "0000:4a:00.0"), 0, st.AMAZON_VENDOR
)
MLX = "mlx5_0"
MLX_FUNCTION = st.PciFunction("0000:17:00.0", "pci0000:14", ("0000:14:01.0",), 1, st.MELLANOX_VENDOR)
EFA_TRAFFIC = {"tx_bytes", "rx_bytes", "tx_pkts", "rx_pkts"}
IB_TRAFFIC = {"port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets"}


def tree_of(root: Path, *nics: st.NicSpec) -> st.SysfsTree:
    return st.SysfsTree(root, nics)


def reader_of(tree: st.SysfsTree, max_open_files: int = rdma.MAX_OPEN_FILES) -> RdmaReader:
    return RdmaReader(str(tree.sysfs), max_open_files=max_open_files)


def one(samples: tuple[NicSample, ...], name: str) -> NicSample:
    (nic,) = [s for s in samples if s.device == name]
    return nic


def port1(samples: tuple[NicSample, ...], name: str) -> NicPort:
    (port,) = one(samples, name).ports
    assert port.port == 1
    return port


def open_fds(under: Path | None = None) -> int:
    """Descriptors this process holds open; with ``under``, only those on files below that folder
    (so a descriptor another part of the process opens meanwhile is not counted)."""
    names = os.listdir("/proc/self/fd")
    if under is None:
        return len(names)
    kept = 0
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed since the listing
        kept += target.startswith(f"{under}/")
    return kept


def within(seconds: float, fn: Callable[[], object]) -> object:
    """``fn()`` in a thread; fails the test if it has not returned after ``seconds`` (a blocked
    read would hang the test otherwise; the thread is a daemon and dies with the process)."""
    out: list[object] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # re-raised in the test's thread
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s"
    if errors:
        raise errors[0]
    return out[0]


@pytest.fixture
def reader_cleanup() -> Iterator[list[RdmaReader]]:
    """Readers to close after the test (their kept-open files)."""
    readers: list[RdmaReader] = []
    yield readers
    for r in readers:
        r.close()


# --- parsing ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("400 Gb/sec (4X NDR)", 50e9),
        ("200 Gb/sec (4X HDR)", 25e9),
        ("100 Gb/sec (4X EDR)", 12.5e9),
        ("2.5 Gb/sec (1X SDR)", 0.3125e9),
        ("  56 Gb/sec (4X FDR)\n", 7e9),
        ("", None),
        (None, None),
        ("Gb/sec", None),
        ("fast", None),
    ],
)
def test_parse_rate_is_bytes_per_second_each_way(text: str | None, want: float | None) -> None:
    """The ``rate`` file is in Gb/s; the series is bytes/s (utilisation divides bytes by it)."""
    assert parse_rate(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [("4: ACTIVE", 4), ("1: DOWN", 1), ("5: LinkUp", 5), ("3: Disabled\n", 3), ("", None), (None, None), ("UP", None)],
)
def test_parse_state_takes_the_number(text: str | None, want: int | None) -> None:
    """``state`` and ``phys_state`` read ``<n>: <NAME>``; the number is the series' value."""
    assert parse_state(None if text is None else text.encode()) == want


@pytest.mark.parametrize(
    ("last", "raw", "bits", "want"),
    [
        (10, 25, 64, 15),
        (7, 7, 64, 0),
        (WRAP_32 - 100, 50, 32, 150),  # 32-bit wrap
        (WRAP_32 - 1, 0, 32, 1),
        (WRAP_64 - 1000, 500, 64, 500),  # a 64-bit counter never wraps: a reset
        (WRAP_64 - 1000, 500, 32, 500),  # nor does a "32-bit" one seen past 2**32
        (10**6, 7, 64, 7),  # reset (driver reload): the new value counts
        (2**31, 5, 32, 5),  # below the top quarter of 32 bits: a reset, not a wrap
        (WRAP_32 + 10, 3, 64, 3),  # a 64-bit counter just past 2**32 that drops: a reset
        (WRAP_64 - 10, WRAP_64 - 11, 64, None),  # issue 51: one back near the top is jitter, held
        (WRAP_32 - 10, WRAP_32 - 11, 32, None),  # and no 32-bit wrap either
        (1_000, 600, 64, None),  # kept more than half: not a reset (a reset goes to near zero)
        (1_000, 400, 64, 400),  # fell nearer zero than it kept: a reset
        (3, 1, 64, 1),
    ],
)
def test_counter_advance(last: int, raw: int, bits: int, want: int | None) -> None:
    """How much a counter grew: a 32-bit wrap adds the distance to the wrap, a reset counts the new
    value, a step back that keeps more than half is jitter (``None``: held at the last value)."""
    assert counter_advance(last, raw, bits) == want


# --- EFA ----------------------------------------------------------------------------------------


def test_efa_new_driver_counters_named_and_by_file(tmp_path: Path, reader_cleanup: list[RdmaReader]) -> None:
    """A recent EFA driver: traffic from the port's ``hw_counters`` (tx/rx bytes and packets), every
    other port counter (RDMA write, SRD health) by file name, the device-level ``hw_counters`` apart,
    ``lifespan`` never a counter; identity from the PCI function."""
    tree = tree_of(tmp_path, st.efa_nic(EFA, EFA_FUNCTION, p2p="NVIDIA peermem"))
    reader = reader_of(tree)
    reader_cleanup.append(reader)
    assert reader.discover() == 1
    assert reader.device_names == (EFA,)
    values = {name: 1000 + i for i, name in enumerate(st.EFA_PORT_COUNTERS)}
    for name, value in values.items():
        tree.set_counter(EFA, 1, name, value)
    devices = {name: 50 + i for i, name in enumerate(st.EFA_DEVICE_COUNTERS)}
    for name, value in devices.items():
        tree.set_counter(EFA, None, name, value)
    samples = reader.read(0.0)
    nic = one(samples, EFA)
    assert (nic.kind, nic.driver, nic.pci_bus_id, nic.numa_node, nic.p2p) == (
        "efa",
        "efa",
        "0000:4f:00.0",
        0,
        "NVIDIA peermem",
    )
    assert nic.link_layer == "Unknown"
    port = port1(samples, EFA)
    assert (port.state_id, port.physical_state_id, port.rate_bytes_per_second) == (4, 5, 12.5e9)
    assert (port.tx_bytes, port.rx_bytes, port.tx_packets, port.rx_packets) == (
        values["tx_bytes"],
        values["rx_bytes"],
        values["tx_pkts"],
        values["rx_pkts"],
    )
    others = set(st.EFA_PORT_COUNTERS) - EFA_TRAFFIC
    assert dict(port.counters) == {name: float(values[name]) for name in others}
    assert {"rdma_write_bytes", "rdma_write_wrs", "retrans_pkts", "unresponsive_remote_events"} <= set(port.counters)
    assert dict(nic.counters) == {name: float(v) for name, v in devices.items()}
    assert "lifespan" not in port.counters and "lifespan" not in nic.counters
    assert (tree.device_dir(EFA) / "hw_counters" / "lifespan").is_file()  # it is there, and not read


def test_efa_port_counters_every_read_device_counters_every_slow_read(
    tmp_path: Path, reader_cleanup: list[RdmaReader]
) -> None:
    """The ports' traffic moves at every read; the other port counters and the device-level ones
    (admin queue) at the device's slow reads, every ``SLOW_EVERY``, keeping their last totals
    between; ``everything=True`` reads them all at once."""
    tree = tree_of(tmp_path, st.efa_nic(EFA, EFA_FUNCTION))
    reader = reader_of(tree)
    reader_cleanup.append(reader)
    reader.discover()
    reader.read(0.0)
    tree.set_counter(EFA, 1, "tx_bytes", 8192)
    tree.set_counter(EFA, 1, "rdma_write_bytes", 4096)
    tree.set_counter(EFA, None, "submitted_cmds", 9)
    second = reader.read(1.0)
    assert port1(second, EFA).tx_bytes == 8192
    assert port1(second, EFA).counters["rdma_write_bytes"] == 0  # not a slow read: the last total
    assert one(second, EFA).counters["submitted_cmds"] == 0
    for i in range(2, SLOW_EVERY + 1):
        last = reader.read(float(i))
    assert port1(last, EFA).counters["rdma_write_bytes"] == 4096
    assert one(last, EFA).counters["submitted_cmds"] == 9
    tree.set_counter(EFA, 1, "rdma_write_bytes", 5000)
    assert port1(reader.read(20.5, everything=True), EFA).counters["rdma_write_bytes"] == 5000


def test_efa_old_driver_everything_in_the_port_and_gdr_file(tmp_path: Path, reader_cleanup: list[RdmaReader]) -> None:
    """An older EFA driver: every statistic (admin queue too) in the port's ``hw_counters``, no
    device-level directory, ``gdr`` instead of ``p2p``: ``1`` is exported as the p2p value."""
    tree = tree_of(tmp_path, st.efa_old_driver_nic(EFA, EFA_FUNCTION, gdr="1"))
    reader = reader_of(tree)
    reader_cleanup.append(reader)
    reader.discover()
    tree.set_counter(EFA, 1, "tx_bytes", 123)
    tree.set_counter(EFA, 1, "submitted_cmds", 7)
    samples = reader.read(0.0)
    nic = one(samples, EFA)
    assert (nic.kind, nic.driver, nic.p2p) == ("efa", "efa", "1")
    assert dict(nic.counters) == {}
    port = port1(samples, EFA)
    assert port.tx_bytes == 123
    assert set(port.counters) == set(st.EFA_OLD_DRIVER_COUNTERS) - EFA_TRAFFIC
    assert port.counters["submitted_cmds"] == 7
    assert "lifespan" not in port.counters


def test_efa_without_peer_to_peer_provider_reads_empty_not_gdr(tmp_path: Path) -> None:
    """A ``p2p`` file that is empty (no provider) is ``""``, told apart from no file at all
    (``None``, an old driver without ``gdr`` either)."""
    tree = tree_of(
        tmp_path,
        st.efa_nic("rdmap79s0", EFA_FUNCTION, p2p=""),
        st.efa_old_driver_nic("rdmap80s0", st.PciFunction("0000:50:00.0", "pci0000:48", ("0000:48:02.0",), 0), None),
    )
    reader = reader_of(tree, max_open_files=0)
    reader.discover()
    samples = reader.read(0.0)
    assert one(samples, "rdmap79s0").p2p == ""
    assert one(samples, "rdmap80s0").p2p is None


# --- mlx5 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "kind", "rate"),
    [(st.mlx5_infiniband_nic, "infiniband", 50e9), (st.mlx5_roce_nic, "roce", 25e9)],
    ids=["infiniband", "roce"],
)
def test_mlx5_words_become_bytes_and_kind_follows_the_link_layer(
    tmp_path: Path,
    reader_cleanup: list[RdmaReader],
    make: Callable[[str, st.PciFunction], st.NicSpec],
    kind: str,
    rate: float,
) -> None:
    """``port_xmit_data``/``port_rcv_data`` count 4-byte words: bytes are 4x.  Packets are not
    scaled, nor is any other counter.  InfiniBand vs RoCE is the link layer (``400 Gb/sec`` is 50e9
    bytes/s, ``200 Gb/sec`` 25e9)."""
    tree = tree_of(tmp_path, make(MLX, MLX_FUNCTION))
    reader = reader_of(tree)
    reader_cleanup.append(reader)
    reader.discover()
    tree.set_counter(MLX, 1, "port_xmit_data", 1000)
    tree.set_counter(MLX, 1, "port_rcv_data", 250)
    tree.set_counter(MLX, 1, "port_xmit_packets", 11)
    tree.set_counter(MLX, 1, "port_rcv_packets", 12)
    tree.set_counter(MLX, 1, "port_xmit_wait", 13)
    tree.set_counter(MLX, 1, "np_cnp_sent", 14)
    first = reader.read(10.0)
    nic = one(first, MLX)
    assert (nic.kind, nic.driver, nic.pci_bus_id, nic.numa_node, nic.p2p) == (
        kind,
        "mlx5_core",
        "0000:17:00.0",
        1,
        None,
    )
    port = port1(first, MLX)
    assert (port.tx_bytes, port.rx_bytes, port.tx_packets, port.rx_packets) == (4000, 1000, 11, 12)
    assert (port.state_id, port.physical_state_id, port.rate_bytes_per_second) == (4, 5, rate)
    assert port.counters["port_xmit_wait"] == 13
    assert port.counters["np_cnp_sent"] == 14
    assert set(port.counters) == (set(st.IB_PORT_COUNTERS) - IB_TRAFFIC) | set(st.MLX5_HW_COUNTERS)
    tree.set_counter(MLX, 1, "port_xmit_data", 1000 + 500_000_000)
    tree.set_counter(MLX, 1, "port_rcv_data", 250 + 250_000_000)
    port = port1(reader.read(12.0), MLX)
    assert port.tx_bytes_per_second == 1e9  # 2e9 bytes over 2 s
    assert port.rx_bytes_per_second == 0.5e9
    assert port.utilization_ratio() == pytest.approx(1e9 / rate)


def test_port_state_files_read_every_cycle(tmp_path: Path, reader_cleanup: list[RdmaReader]) -> None:
    """A port going down shows at the next read: ``state`` and ``phys_state`` are kept open and
    re-read, whatever text length the kernel writes."""
    tree = tree_of(tmp_path, st.mlx5_infiniband_nic(MLX, MLX_FUNCTION))
    reader = reader_of(tree)
    reader_cleanup.append(reader)
    reader.discover()
    assert port1(reader.read(0.0), MLX).state_id == 4
    port_dir = tree.device_dir(MLX) / "ports" / "1"
    for name, text in (("state", "1: DOWN\n"), ("phys_state", "3: Disabled\n")):
        with open(port_dir / name, "r+") as f:  # in place, as sysfs would regenerate it
            f.write(text)
            f.truncate()
    port = port1(reader.read(1.0), MLX)
    assert (port.state_id, port.physical_state_id) == (1, 3)


# --- wraps, resets, rates --------------------------------------------------------------------------


LEGACY_IB_COUNTERS = tuple(n for n in st.IB_PORT_COUNTERS if not n.startswith(("unicast_", "multicast_")))
"""A port's ``counters/`` where the adapter lacks the extended set: the kernel shows the data and
packet counters 32 bits wide."""


def legacy_ib_nic(name: str, function: st.PciFunction) -> st.NicSpec:
    port = st.PortSpec(rate=st.HDR_RATE, link_layer="InfiniBand", ib_counters=LEGACY_IB_COUNTERS)
    return st.NicSpec(name, "mlx4_core", function, (port,))


def test_32_bit_counters_wrap_and_only_they(tmp_path: Path, reader_cleanup: list[RdmaReader]) -> None:
    """The kernel's 32-bit port counters (a port without the extended set: data, packets,
    ``port_xmit_wait``) that fall from near 2**32 toward zero wrapped: exactly the distance to the
    wrap plus the new value (the total counts from the first read, so it is small and exact)."""
    tree = tree_of(tmp_path, legacy_ib_nic(MLX, MLX_FUNCTION))
    for name in ("port_xmit_data", "port_xmit_wait", "symbol_error"):
        tree.set_counter(MLX, 1, name, WRAP_32 - 100)
    reader = reader_of(tree)
    reader_cleanup.append(reader)
    reader.discover()
    first = port1(reader.read(0.0, everything=True), MLX)
    assert (first.tx_bytes, first.counters["port_xmit_wait"]) == (0, 0)
    for name in ("port_xmit_data", "port_xmit_wait", "symbol_error"):
        tree.set_counter(MLX, 1, name, 50)
    port = port1(reader.read(1.0, everything=True), MLX)
    assert port.tx_bytes == 150 * 4  # words
    assert port.counters["port_xmit_wait"] == 150
    assert port.counters["symbol_error"] == 50  # not one of the 32-bit files: a reset
    assert port.tx_bytes_per_second == 600


@pytest.mark.parametrize("make", [st.efa_nic, st.mlx5_infiniband_nic], ids=["efa-hw-counters", "ib-extended-counters"])
def test_64_bit_counters_never_wrap(
    tmp_path: Path, reader_cleanup: list[RdmaReader], make: Callable[[str, st.PciFunction], st.NicSpec]
) -> None:
    """A 64-bit counter (EFA's, and the kernel's extended InfiniBand ones) that falls toward zero
    from near 2**64 or 2**32 was reset: the new value counts, never a wrap's distance."""
    name, function = (EFA, EFA_FUNCTION) if make is st.efa_nic else (MLX, MLX_FUNCTION)
    traffic = "tx_bytes" if make is st.efa_nic else "port_xmit_packets"
    tree = tree_of(tmp_path, make(name, function))
    tree.set_counter(name, 1, traffic, WRAP_64 - 1000)
    reader = reader_of(tree)
    reader_cleanup.append(reader)
    reader.discover()
    reader.read(0.0)
    tree.set_counter(name, 1, traffic, 500)
    port = port1(reader.read(1.0), name)
    assert (port.tx_bytes if make is st.efa_nic else port.tx_packets) == 500
    tree.set_counter(name, 1, traffic, WRAP_32 - 10)
    reader.read(2.0)
    tree.set_counter(name, 1, traffic, 7)
    port = port1(reader.read(3.0), name)
    assert (port.tx_bytes if make is st.efa_nic else port.tx_packets) == WRAP_32 - 10 + 7


def test_jitter_back_by_one_near_the_top_counts_nothing(tmp_path: Path, reader_cleanup: list[RdmaReader]) -> None:
    """Issue 51, defect 8: ``tx_pkts`` and ``tx_bytes`` near the top of 64 bits step back by one and
    forward again for 20 s (one read a second).  Before, each step back was a 64-bit wrap: +1.1e20
    packets and +5e12 bytes; the true change is +-1.  Now a step back is held at the last value."""
    tree = tree_of(tmp_path, st.efa_nic(EFA, EFA_FUNCTION))
    top = WRAP_64 - 16
    for name in ("tx_pkts", "tx_bytes", "rdma_write_bytes"):
        tree.set_counter(EFA, 1, name, top)
    reader = reader_of(tree)
    reader_cleanup.append(reader)
    reader.discover()
    for t in range(21):
        for name in ("tx_pkts", "tx_bytes", "rdma_write_bytes"):
            tree.set_counter(EFA, 1, name, top - (t % 2))
        port = port1(reader.read(float(t), everything=True), EFA)
        assert port.tx_packets == 0 and port.tx_bytes == 0, f"at {t} s: {port.tx_packets} packets, {port.tx_bytes} B"
        assert port.counters["rdma_write_bytes"] == 0
        assert port.tx_bytes_per_second in (None, 0.0)
    tree.set_counter(EFA, 1, "tx_bytes", top + 3)  # moving on from the held value counts from there
    assert port1(reader.read(21.0), EFA).tx_bytes == 3


def test_counter_reset_counts_the_new_value_and_never_goes_down(
    tmp_path: Path, reader_cleanup: list[RdmaReader]
) -> None:
    """A driver reload resets counters to small values: the total keeps what it had and adds the
    new value (what was counted since the reset), so the exported total never decreases."""
    tree = tree_of(tmp_path, st.efa_nic(EFA, EFA_FUNCTION))
    reader = reader_of(tree)
    reader_cleanup.append(reader)
    reader.discover()
    totals: list[float] = []
    for t, value in enumerate((0, 10_000_000, 20_000_000, 5, 10, 10, 3_000)):
        tree.set_counter(EFA, 1, "rx_bytes", value)
        total = port1(reader.read(float(t)), EFA).rx_bytes
        assert total is not None
        totals.append(total)
    assert totals == [0, 10_000_000, 20_000_000, 20_000_005, 20_000_010, 20_000_010, 20_000_010 + 3_000 - 10]
    assert totals == sorted(totals)


def test_rates_are_per_second_between_two_reads(tmp_path: Path, reader_cleanup: list[RdmaReader]) -> None:
    """tx/rx bytes per second over the time between the two reads' ``now``; none on the first
    read; utilisation is the busier direction over the line rate."""
    tree = tree_of(tmp_path, st.efa_nic(EFA, EFA_FUNCTION))
    reader = reader_of(tree)
    reader_cleanup.append(reader)
    reader.discover()
    tree.set_counter(EFA, 1, "tx_bytes", 1_000)
    first = port1(reader.read(100.0), EFA)
    assert (first.tx_bytes_per_second, first.rx_bytes_per_second, first.utilization_ratio()) == (None, None, None)
    tree.set_counter(EFA, 1, "tx_bytes", 1_000 + 5_000_000_000)
    tree.set_counter(EFA, 1, "rx_bytes", 2_500_000_000)
    port = port1(reader.read(102.0), EFA)
    assert (port.tx_bytes_per_second, port.rx_bytes_per_second) == (2.5e9, 1.25e9)
    assert port.utilization_ratio() == 0.2  # 2.5e9 of 12.5e9
    same_time = port1(reader.read(102.0), EFA)
    assert same_time.tx_bytes_per_second is None  # no time passed: no rate, not a division by 0


# --- broken files ---------------------------------------------------------------------------------


def test_missing_and_directory_counter_files_at_discovery_are_left_out(
    tmp_path: Path, reader_cleanup: list[RdmaReader]
) -> None:
    """A counter file that is missing, or a directory where a file should be (what an unreadable
    file does as root, where chmod stops no read), is not a counter; every other one is."""
    tree = tree_of(tmp_path, st.efa_nic(EFA, EFA_FUNCTION))
    tree.counter_path(EFA, 1, "rdma_write_bytes").unlink()
    odd = tree.counter_path(EFA, 1, "retrans_pkts")
    odd.unlink()
    odd.mkdir()
    tree.counter_path(EFA, 1, "rx_bytes").unlink()
    reader = reader_of(tree)
    reader_cleanup.append(reader)
    reader.discover()
    port = port1(reader.read(0.0), EFA)
    assert set(port.counters) == set(st.EFA_PORT_COUNTERS) - EFA_TRAFFIC - {"rdma_write_bytes", "retrans_pkts"}
    assert port.rx_bytes is None and port.tx_bytes == 0


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a chmod 000 file anyway")
def test_unreadable_counter_file_is_left_out(tmp_path: Path, reader_cleanup: list[RdmaReader]) -> None:
    """A counter file without read permission is not a counter; the others are."""
    tree = tree_of(tmp_path, st.efa_nic(EFA, EFA_FUNCTION))
    tree.counter_path(EFA, 1, "rdma_read_bytes").chmod(0)
    reader = reader_of(tree)
    reader_cleanup.append(reader)
    reader.discover()
    port = port1(reader.read(0.0), EFA)
    assert set(port.counters) == set(st.EFA_PORT_COUNTERS) - EFA_TRAFFIC - {"rdma_read_bytes"}


def test_counter_file_removed_after_discovery_drops_only_its_series(tmp_path: Path) -> None:
    """Reading with open-read-close (no file kept): a counter file that disappears drops its
    series at the next read, the rest of the port stays."""
    tree = tree_of(tmp_path, st.efa_nic(EFA, EFA_FUNCTION))
    reader = reader_of(tree, max_open_files=0)
    reader.discover()
    assert "rdma_write_bytes" in port1(reader.read(0.0, everything=True), EFA).counters
    tree.set_counter(EFA, 1, "rdma_read_bytes", 77)
    tree.counter_path(EFA, 1, "rdma_write_bytes").unlink()
    port = port1(reader.read(1.0, everything=True), EFA)
    assert "rdma_write_bytes" not in port.counters
    assert port.counters["rdma_read_bytes"] == 77
    assert len(port.counters) == len(st.EFA_PORT_COUNTERS) - len(EFA_TRAFFIC) - 1


@pytest.mark.parametrize("max_open_files", [rdma.MAX_OPEN_FILES, 0], ids=["kept-open", "open-read-close"])
def test_counter_that_stops_parsing_drops_only_its_series_and_comes_back(
    tmp_path: Path, reader_cleanup: list[RdmaReader], max_open_files: int
) -> None:
    """A counter whose text stops being a number (EINVAL text, garbage) drops its own series for
    as long as it lasts; the others stay; when it parses again its total goes on."""
    tree = tree_of(tmp_path, st.efa_nic(EFA, EFA_FUNCTION))
    reader = reader_of(tree, max_open_files)
    reader_cleanup.append(reader)
    reader.discover()
    tree.set_counter(EFA, 1, "tx_bytes", 100)
    tree.set_counter(EFA, 1, "send_bytes", 100)
    reader.read(0.0, everything=True)
    for name in ("tx_bytes", "send_bytes"):
        fd = os.open(tree.counter_path(EFA, 1, name), os.O_WRONLY)
        os.pwrite(fd, b"not a number here!!\n", 0)  # the same 21 bytes, in place
        os.close(fd)
    tree.set_counter(EFA, 1, "rx_bytes", 40)
    port = port1(reader.read(1.0, everything=True), EFA)
    assert port.tx_bytes is None and port.tx_bytes_per_second is None
    assert port.rx_bytes == 40
    assert "send_bytes" not in port.counters
    assert len(port.counters) == len(st.EFA_PORT_COUNTERS) - len(EFA_TRAFFIC) - 1
    tree.set_counter(EFA, 1, "tx_bytes", 160)
    tree.set_counter(EFA, 1, "send_bytes", 160)
    port = port1(reader.read(2.0, everything=True), EFA)
    assert (port.tx_bytes, port.counters["send_bytes"]) == (160, 160)


def test_device_without_ports_directory_keeps_its_identity_and_device_counters(
    tmp_path: Path, reader_cleanup: list[RdmaReader]
) -> None:
    """A device whose ``ports`` directory is missing has no ports, and keeps its kind (from the
    driver), identity and device-level counters; the other devices are unaffected."""
    other = st.efa_nic("rdmap80s0", st.PciFunction("0000:50:00.0", "pci0000:48", ("0000:48:02.0",), 0))
    tree = tree_of(tmp_path, st.efa_nic(EFA, EFA_FUNCTION), other)
    shutil.rmtree(tree.device_dir(EFA) / "ports")
    reader = reader_of(tree)
    reader_cleanup.append(reader)
    assert reader.discover() == 2
    tree.set_counter(EFA, None, "keep_alive_rcvd", 3)
    samples = reader.read(0.0)
    nic = one(samples, EFA)
    assert (nic.kind, nic.pci_bus_id, nic.ports, nic.link_layer) == ("efa", "0000:4f:00.0", (), "")
    assert nic.counters["keep_alive_rcvd"] == 3
    assert len(one(samples, "rdmap80s0").ports) == 1


# --- hostile trees --------------------------------------------------------------------------------


def test_fifos_anywhere_block_nothing(tmp_path: Path) -> None:
    """FIFOs planted as a counter, as ``state``, ``rate``, ``link_layer``, ``numa_node`` and ``p2p``:
    discovery and reads return (non-blocking opens, regular files only where text is read), the
    FIFO counter is no counter, and the other counters are read."""
    tree = tree_of(tmp_path, st.efa_nic(EFA, EFA_FUNCTION))
    port_dir = tree.device_dir(EFA) / "ports" / "1"
    function_dir = tree.sysfs / EFA_FUNCTION.path
    os.mkfifo(port_dir / "hw_counters" / "evil")
    for path in (port_dir / "state", port_dir / "rate", port_dir / "link_layer"):
        path.unlink()
        os.mkfifo(path)
    for path in (function_dir / "numa_node", function_dir / "p2p"):
        path.unlink()
        os.mkfifo(path)
    reader = reader_of(tree)
    try:
        assert within(10.0, reader.discover) == 1
        samples = within(10.0, lambda: reader.read(0.0))
        assert isinstance(samples, tuple)
        nic = one(samples, EFA)
        assert (nic.numa_node, nic.p2p, nic.kind) == (None, None, "efa")
        port = port1(samples, EFA)
        assert (port.state_id, port.physical_state_id, port.rate_bytes_per_second, port.link_layer) == (
            None,
            5,
            None,
            None,
        )
        assert "evil" not in port.counters
        assert len(port.counters) == len(st.EFA_PORT_COUNTERS) - len(EFA_TRAFFIC)
    finally:
        reader.close()


def test_counter_replaced_by_fifo_after_discovery_does_not_block(tmp_path: Path) -> None:
    """Reading with open-read-close, a counter swapped for a FIFO after discovery opens at once
    (``O_NONBLOCK``), reads empty, and drops only its own series."""
    tree = tree_of(tmp_path, st.efa_nic(EFA, EFA_FUNCTION))
    reader = reader_of(tree, max_open_files=0)
    reader.discover()
    reader.read(0.0, everything=True)
    path = tree.counter_path(EFA, 1, "retrans_bytes")
    path.unlink()
    os.mkfifo(path)
    samples = within(10.0, lambda: reader.read(1.0, everything=True))
    assert isinstance(samples, tuple)
    port = port1(samples, EFA)
    assert "retrans_bytes" not in port.counters
    assert "retrans_pkts" in port.counters


def test_huge_files_cost_at_most_the_bound(tmp_path: Path) -> None:
    """10 MiB of digits as a counter, as ``rate`` and as ``p2p``: nothing of it is kept (a counter
    reads at most 64 bytes, which is no number of 24 digits or fewer), and the reader's memory
    does not grow by the file's size."""
    tree = tree_of(tmp_path, st.efa_nic(EFA, EFA_FUNCTION))
    huge = b"7" * (10 * 1024 * 1024)
    port_dir = tree.device_dir(EFA) / "ports" / "1"
    (port_dir / "hw_counters" / "huge").write_bytes(huge)
    (port_dir / "rate").write_bytes(huge)
    (tree.sysfs / EFA_FUNCTION.path / "p2p").write_bytes(huge)
    reader = reader_of(tree)
    tracemalloc.start()
    try:
        reader.discover()
        samples = reader.read(0.0)
        samples = reader.read(1.0)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        reader.close()
    assert peak < 512 * 1024, peak
    port = port1(samples, EFA)
    assert "huge" not in port.counters
    assert port.rate_bytes_per_second is None
    p2p = one(samples, EFA).p2p
    assert p2p is not None and len(p2p) <= 256


def test_device_link_out_of_the_tree_is_skipped(tmp_path: Path, reader_cleanup: list[RdmaReader]) -> None:
    """A ``class/infiniband`` entry that resolves outside the sysfs root (a planted symlink) is not
    read, and counts as skipped; the real devices are read."""
    tree = tree_of(tmp_path / "node", st.efa_nic(EFA, EFA_FUNCTION))
    outside = tree_of(tmp_path / "elsewhere", st.efa_nic("rdmap1s0", st.PciFunction("0000:01:00.0", "pci0000:00")))
    (tree.sysfs / "class" / "infiniband" / "evil").symlink_to(outside.device_dir("rdmap1s0"))
    reader = reader_of(tree)
    reader_cleanup.append(reader)
    assert reader.discover() == 1
    assert reader.device_names == (EFA,)
    assert reader.skipped == 1
    assert [s.device for s in reader.read(0.0)] == [EFA]


def test_more_than_max_devices_is_bounded(tmp_path: Path) -> None:
    """More entries under ``class/infiniband`` than ``MAX_DEVICES``: each read returns the ceiling,
    the rest are counted, all of them."""
    root = tmp_path / "sys" / "class" / "infiniband"
    root.mkdir(parents=True)
    for i in range(MAX_DEVICES + 40):
        (root / f"dev{i:04d}").mkdir()
    reader = RdmaReader(str(tmp_path / "sys"), max_open_files=0)
    assert reader.discover() == MAX_DEVICES
    assert dict(reader.dropped) == {("device", "over_limit"): 40}
    assert reader.device_names == tuple(f"dev{i:04d}" for i in range(MAX_DEVICES))
    samples = reader.read(0.0)
    assert len(samples) == MAX_DEVICES
    assert all(s.kind == "rdma" and s.pci_bus_id == "" and s.ports == () for s in samples)


def efa_at(bus: int, state: str = "4: ACTIVE", extra: tuple[str, ...] = ()) -> st.NicSpec:
    """An EFA device on PCI bus ``bus`` (``rdmap<bus>s0``), its port in ``state``, with ``extra``
    port counters beside the driver's."""
    function = st.PciFunction(f"0000:{bus:02x}:00.0", "pci0000:00", (), 0, st.AMAZON_VENDOR)
    spec = st.efa_nic(st.rdma_name(function), function)
    port = st.PortSpec(state=state, rate=st.EFA_RATE, link_layer="Unknown", hw_counters=st.EFA_PORT_COUNTERS + extra)
    return st.NicSpec(spec.name, spec.driver, function, (port,), spec.device_counters, p2p=spec.p2p)


def test_past_the_device_ceiling_pci_functions_and_active_ports_come_first(
    tmp_path: Path, reader_cleanup: list[RdmaReader]
) -> None:
    """Past ``max_devices`` the kept devices are those with a PCI function, of them first those with
    an active port, then by name; whatever sorts first by name or comes first in the directory."""
    active = [efa_at(bus) for bus in (0x50, 0x51, 0x52)]
    down = [efa_at(bus, state="1: DOWN") for bus in (0x10, 0x11)]
    tree = tree_of(tmp_path, *active, *down)
    links = tree.sysfs / "class" / "infiniband"
    for i in range(50):
        (links / f"a{i:02d}").mkdir()  # no PCI function: named to sort first
    names = [n.name for n in active]
    for ceiling, want in ((3, names), (4, [down[0].name, *names]), (6, ["a00", *[d.name for d in down], *names])):
        reader = RdmaReader(str(tree.sysfs), max_devices=ceiling)
        reader_cleanup.append(reader)
        assert reader.discover() == ceiling
        assert list(reader.device_names) == sorted(want)
        assert dict(reader.dropped) == {("device", "over_limit"): 55 - ceiling}
        reader.discover()
        assert list(reader.device_names) == sorted(want)  # the same tree, the same choice


def counters_of(nic: NicSample) -> int:
    """Counter files a sample carries: device-level, and each port's traffic and others."""
    traffic = sum(v is not None for p in nic.ports for v in (p.tx_bytes, p.rx_bytes, p.tx_packets, p.rx_packets))
    return len(nic.counters) + sum(len(p.counters) for p in nic.ports) + traffic


def test_counters_past_the_node_ceiling_keep_traffic_and_share_the_rest(
    tmp_path: Path, reader_cleanup: list[RdmaReader]
) -> None:
    """Issue 51, defect 6 (NIC): devices of many counters each, inside every per-directory bound.
    The node keeps ``max_devices`` devices and ``max_counters`` counter files: every port's traffic
    first, the others shared evenly (no device starved because it sorts last), each directory's by
    name; the rest are counted."""
    extra = tuple(f"x_{i:03d}" for i in range(200))
    tree = tree_of(tmp_path, *(efa_at(bus, extra=extra) for bus in range(1, 71)))
    reader = reader_of(tree)
    reader_cleanup.append(reader)
    assert reader.discover() == MAX_DEVICES
    samples = reader.read(0.0, everything=True)
    per_device = [counters_of(nic) for nic in samples]
    assert sum(per_device) == rdma.MAX_COUNTERS
    assert max(per_device) - min(per_device) <= 1
    for nic in samples:
        port = port1(samples, nic.device)
        assert None not in (port.tx_bytes, port.rx_bytes, port.tx_packets, port.rx_packets)
        assert set(nic.counters) == set(st.EFA_DEVICE_COUNTERS)  # the device's own come first
    each = len(st.EFA_PORT_COUNTERS) + len(extra) + len(st.EFA_DEVICE_COUNTERS)
    assert dict(reader.dropped) == {
        ("device", "over_limit"): 70 - MAX_DEVICES,
        ("counter", "over_limit"): MAX_DEVICES * each - rdma.MAX_COUNTERS,
    }
    assert open_fds(under=tmp_path.resolve()) <= rdma.MAX_COUNTERS + 3 * MAX_DEVICES


def test_fair_shares() -> None:
    assert rdma.fair_shares([10, 10, 10], 25) == [9, 8, 8]
    assert rdma.fair_shares([2, 100, 100], 50) == [2, 24, 24]
    assert rdma.fair_shares([5, 5], 100) == [5, 5]
    assert rdma.fair_shares([], 10) == []
    assert rdma.fair_shares([3], 0) == [0]


def test_counter_directory_of_thousands_of_files_is_bounded(tmp_path: Path, reader_cleanup: list[RdmaReader]) -> None:
    """A counter directory of 3,000 files: at most ``MAX_COUNTERS_PER_DIR`` are looked at (and kept
    open), the excess counts as skipped."""
    tree = tree_of(tmp_path, st.efa_nic(EFA, EFA_FUNCTION))
    directory = tree.device_dir(EFA) / "hw_counters"
    for i in range(3000):
        (directory / f"c{i:05d}").write_bytes(b"1\n")
    reader = reader_of(tree)
    reader_cleanup.append(reader)
    reader.discover()
    # every counter file is counted: the 3,000 and the driver's 12 (not lifespan), less the bound kept
    assert dict(reader.dropped) == {("counter", "over_bound"): 3000 + 12 - MAX_COUNTERS_PER_DIR}
    kept = open_fds(under=tmp_path.resolve())
    # the bound in the device's counter folder, the port's counters, and its state, phys_state and
    # rate (which 512 of the 3,013 names are listed depends on the file system: on tmpfs all 512
    # are counters, on ext4 a setting such as lifespan may be among them)
    assert kept <= MAX_COUNTERS_PER_DIR + len(st.EFA_PORT_COUNTERS) + 3
    samples = reader.read(0.0)
    assert len(one(samples, EFA).counters) <= MAX_COUNTERS_PER_DIR
    assert len(port1(samples, EFA).counters) == len(st.EFA_PORT_COUNTERS) - len(EFA_TRAFFIC)


# --- rediscovery, kept-open files, open-file budget ------------------------------------------------


def test_rediscovery_keeps_totals_rates_and_device_counters(tmp_path: Path, reader_cleanup: list[RdmaReader]) -> None:
    """``discover()`` again (the source does it every minute): a counter's total goes on from where
    it was, the first rate after it is computed against the read before it, and the device-level
    counters are there at once (not only from the next slow read)."""
    tree = tree_of(tmp_path, st.efa_nic(EFA, EFA_FUNCTION))
    reader = reader_of(tree)
    reader_cleanup.append(reader)
    reader.discover()
    tree.set_counter(EFA, None, "completed_cmds", 4)
    tree.set_counter(EFA, 1, "tx_bytes", 1_000)
    for t in range(3):
        reader.read(float(t))
    tree.set_counter(EFA, 1, "tx_bytes", 5)  # a reset (to near zero) the rediscovery reads
    tree.set_counter(EFA, None, "completed_cmds", 6)
    assert reader.discover() == 1
    tree.set_counter(EFA, 1, "tx_bytes", 2_500)
    samples = reader.read(3.0)  # the 4th read: not a slow one
    port = port1(samples, EFA)
    assert port.tx_bytes == 1_000 + 2_500
    assert port.tx_bytes_per_second == 2_500
    assert one(samples, EFA).counters["completed_cmds"] == 4 + 2
    assert set(one(samples, EFA).counters) == set(st.EFA_DEVICE_COUNTERS)


def test_rediscovery_drops_a_device_that_is_gone(tmp_path: Path, reader_cleanup: list[RdmaReader]) -> None:
    """A device removed from ``class/infiniband`` (driver unbound) is not read after the next
    discovery, and its files are closed."""
    other = st.efa_nic("rdmap80s0", st.PciFunction("0000:50:00.0", "pci0000:48", ("0000:48:02.0",), 0))
    tree = tree_of(tmp_path, st.efa_nic(EFA, EFA_FUNCTION), other)
    before = open_fds()
    reader = reader_of(tree)
    reader_cleanup.append(reader)
    reader.discover()
    both = open_fds() - before
    (tree.sysfs / "class" / "infiniband" / "rdmap80s0").unlink()
    assert reader.discover() == 1
    assert [s.device for s in reader.read(0.0)] == [EFA]
    assert open_fds() - before == both // 2


def test_kept_open_files_see_in_place_updates_without_reopening(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reader_cleanup: list[RdmaReader]
) -> None:
    """After discovery, a read opens nothing (counters, states and the line rate: one ``pread``
    each) and sees every ``set_counter``."""
    tree = tree_of(tmp_path, st.efa_nic(EFA, EFA_FUNCTION))
    reader = reader_of(tree)
    reader_cleanup.append(reader)
    before = open_fds()
    reader.discover()
    assert open_fds() - before == len(st.EFA_PORT_COUNTERS) + len(st.EFA_DEVICE_COUNTERS) + 3
    reader.read(0.0, everything=True)  # the slow read
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: str, flags: int, *args: int, **kwargs: int) -> int:
        if flags == fsread.OPEN_FLAGS:  # the reader's opens, not set_counter's O_WRONLY
            opened.append(str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    for t in range(1, SLOW_EVERY):
        tree.set_counter(EFA, 1, "rdma_write_bytes", 1000 * t)
        tree.set_counter(EFA, 1, "tx_bytes", 2000 * t)
        port = port1(reader.read(float(t), everything=True), EFA)
        assert (port.counters["rdma_write_bytes"], port.tx_bytes) == (1000 * t, 2000 * t)
    monkeypatch.undo()
    assert opened == []


def test_without_kept_files_reads_still_work(tmp_path: Path) -> None:
    """``max_open_files=0``: nothing stays open after discovery, and every read opens, reads and
    closes each file, with the same values as the kept-open path."""
    tree = tree_of(tmp_path, st.efa_nic(EFA, EFA_FUNCTION), st.mlx5_infiniband_nic(MLX, MLX_FUNCTION))
    before = open_fds()
    reader = reader_of(tree, max_open_files=0)
    reader.discover()
    assert open_fds() == before
    reader.read(0.0, everything=True)
    tree.set_counter(EFA, 1, "tx_bytes", 300)
    tree.set_counter(EFA, 1, "rdma_write_bytes", 30)
    tree.set_counter(MLX, 1, "port_rcv_data", 10)
    samples = reader.read(1.0, everything=True)
    assert open_fds() == before
    assert port1(samples, EFA).tx_bytes == 300
    assert port1(samples, EFA).counters["rdma_write_bytes"] == 30
    assert port1(samples, MLX).rx_bytes == 40
    assert port1(samples, MLX).state_id == 4
    assert len(port1(samples, EFA).counters) == len(st.EFA_PORT_COUNTERS) - len(EFA_TRAFFIC)


def test_close_releases_every_kept_file(tmp_path: Path) -> None:
    """``close()`` closes what discovery kept open; the reader can discover again."""
    tree = tree_of(tmp_path, st.efa_nic(EFA, EFA_FUNCTION))
    before = open_fds()
    reader = reader_of(tree)
    reader.discover()
    assert open_fds() > before
    reader.close()
    assert open_fds() == before
    reader.close()  # twice is fine
    assert reader.discover() == 1
    reader.close()
    assert open_fds() == before


def test_open_budget_is_a_quarter_of_the_open_files_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kept-open files never take more than a quarter of the soft open-files limit."""
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (1024, 524288))
    assert open_budget(4096) == 256
    assert open_budget(100) == 100
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert open_budget(4096) == 4096


def test_p5en_under_a_small_open_files_limit_reads_every_counter(tmp_path: Path) -> None:
    """32 EFA devices (1,184 counter, state and rate files) under a soft limit 512 descriptors above
    what the process holds (a container's limit before the server raises it): discovery keeps at
    most a quarter of the limit open, the process keeps descriptors to spare, and every counter is
    still read (the rest by open-read-close)."""
    tree = st.SysfsTree.of(tmp_path, st.p5en_layout())
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = open_fds()
    limit = before + 512
    assert limit <= soft
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    reader = RdmaReader(str(tree.sysfs))
    try:
        assert reader.discover() == 32
        kept = open_fds() - before
        samples = reader.read(0.0)
        spare = os.open(os.devnull, os.O_RDONLY)  # the process can still open a file
        os.close(spare)
    finally:
        reader.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert kept <= limit // 4
    assert len(samples) == 32
    for nic in samples:
        assert set(nic.counters) == set(st.EFA_DEVICE_COUNTERS)
        (port,) = nic.ports
        assert port.tx_bytes == 0 and port.rx_packets == 0 and port.state_id == 4
        assert len(port.counters) == len(st.EFA_PORT_COUNTERS) - len(EFA_TRAFFIC)


def test_the_ceiling_flags_default_to_the_readers_ceilings() -> None:
    """``--collect.nic.max-devices`` / ``--collect.nic.max-counters`` and the reader agree (the flags
    module does not import the reader, so the numbers are written twice and checked here)."""
    from exporter.config import ExporterConfig, parse_config

    config = parse_config([], env={})
    assert (config.nic_max_devices, config.nic_max_counters) == (MAX_DEVICES, rdma.MAX_COUNTERS)
    fields = ExporterConfig.__dataclass_fields__
    assert (fields["nic_max_devices"].default, fields["nic_max_counters"].default) == (MAX_DEVICES, rdma.MAX_COUNTERS)


def test_ports_past_the_bound_keep_the_lowest_numbers_and_are_counted(
    tmp_path: Path, reader_cleanup: list[RdmaReader]
) -> None:
    """A device of 10 ports: ports 1..8 are read (by number: 10 does not sort before 2), the two
    others are counted, and a file among the ports is neither."""
    spec = st.efa_nic(EFA, EFA_FUNCTION)
    ports = tuple(st.PortSpec(number=n, hw_counters=("tx_bytes",)) for n in range(1, 11))
    tree = tree_of(tmp_path, st.NicSpec(EFA, "efa", EFA_FUNCTION, ports, spec.device_counters))
    (tree.device_dir(EFA) / "ports" / "README").write_text("not a port\n")
    reader = reader_of(tree)
    reader_cleanup.append(reader)
    reader.discover()
    assert [p.port for p in one(reader.read(0.0), EFA).ports] == list(range(1, 9))
    assert dict(reader.dropped) == {("port", "over_bound"): 2}
