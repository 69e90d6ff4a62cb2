"""A fake sysfs and procfs tree on disk: the RDMA NICs, the PCIe paths of the GPUs and NICs, the
peer-memory module and the GPU driver's kind, laid out as the Linux kernel lays them out.

The simulated backend writes one for the scenarios with NICs (``p5en``, ``p5en-nogdr``) and keeps
its counters moving; tests build small ones as fixtures.  What is written (relative to ``root``):

- ``sys/devices/<root complex>/<bridge>/.../<bdf>/``: one directory per PCI function below the
  bridges on its path (root port, switch upstream port, switch downstream port, ...), with
  ``numa_node``, ``vendor``, ``device``, ``class`` and a ``driver`` symlink into
  ``sys/bus/pci/drivers/<driver>``; a NIC's function also holds ``p2p`` / ``gdr`` (the EFA driver's
  peer-to-peer attributes) where set, and ``infiniband/<name>/``: the RDMA device (``node_type``,
  ``hw_counters/``, ``ports/<n>/{state,phys_state,rate,link_layer,counters/,hw_counters/}`` and a
  ``device`` symlink back to the function);
- ``sys/class/infiniband/<name>`` and ``sys/bus/pci/devices/<bdf>``: relative symlinks into
  ``sys/devices``, as the kernel makes them;
- ``sys/module/nvidia_peermem/version`` when the peer-memory module is loaded;
- ``proc/driver/nvidia/version``: the GPU driver's banner, open or proprietary kernel module.

Counter files hold a fixed-width decimal (``COUNTER_WIDTH`` digits and a newline) rewritten in
place, so a reader that keeps a file open and re-reads it at offset 0 sees the new value in the
same inode and never an empty file.  Counter names are the kernel drivers' (the EFA driver's
``hw_counters``, the InfiniBand port counters of the kernel's sysfs ABI, mlx5's ``hw_counters``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

# The one spelling of an NVML bus ID in sysfs, re-exported for the fixtures that name GPUs by it.
from exporter.network.topology import sysfs_bdf as sysfs_bdf

COUNTER_WIDTH = 20
"""Digits of a counter file (a 64-bit counter needs at most 20), zero-padded, then a newline."""
LIFESPAN_MILLISECONDS = 10
"""Content of a ``hw_counters/lifespan`` file: how long the kernel caches the counters (ms)."""
DRIVER_VERSION = "580.159.04"
"""The simulated GPU driver (as the simulated NVML answers it)."""
_DRIVER_BUILD = "Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Nov 13 02:04:38 UTC 2025"

# --- counter names, as the kernel drivers name their sysfs files ---------------------------------

EFA_PORT_COUNTERS: tuple[str, ...] = (
    "tx_bytes",
    "tx_pkts",
    "rx_bytes",
    "rx_pkts",
    "rx_drops",
    "send_bytes",
    "send_wrs",
    "recv_bytes",
    "recv_wrs",
    "rdma_read_wrs",
    "rdma_read_bytes",
    "rdma_read_wr_err",
    "rdma_read_resp_bytes",
    "rdma_write_wrs",
    "rdma_write_bytes",
    "rdma_write_wr_err",
    "rdma_write_recv_bytes",
    "retrans_bytes",
    "retrans_pkts",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
)
"""The port statistics of a recent EFA driver (``ports/1/hw_counters``): traffic, work requests by
kind (send/receive, RDMA read, RDMA write) and the SRD transport's health (retransmissions,
timeouts, unresponsive and impaired remotes)."""
EFA_DEVICE_COUNTERS: tuple[str, ...] = (
    "submitted_cmds",
    "completed_cmds",
    "cmds_err",
    "no_completion_cmds",
    "keep_alive_rcvd",
    "alloc_pd_err",
    "create_qp_err",
    "create_cq_err",
    "reg_mr_err",
    "alloc_ucontext_err",
    "create_ah_err",
    "mmap_err",
)
"""The device statistics of a recent EFA driver (``<dev>/hw_counters``): admin-queue commands,
the device's keep-alive events and the verbs' failures."""
EFA_OLD_DRIVER_COUNTERS: tuple[str, ...] = (
    "tx_bytes",
    "tx_pkts",
    "rx_bytes",
    "rx_pkts",
    "rx_drops",
    "submitted_cmds",
    "completed_cmds",
    "no_completion_cmds",
    "keep_alive_rcvd",
    "alloc_pd_err",
    "create_qp_err",
    "reg_mr_err",
    "alloc_ucontext_err",
    "create_ah_err",
)
"""What older EFA drivers (older kernels) expose, all of it in the port's ``hw_counters`` (no
device-level directory)."""
IB_PORT_COUNTERS: tuple[str, ...] = (
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "port_xmit_wait",
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "port_xmit_discards",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    "port_rcv_constraint_errors",
    "port_xmit_constraint_errors",
    "unicast_xmit_packets",
    "unicast_rcv_packets",
    "multicast_xmit_packets",
    "multicast_rcv_packets",
)
"""The InfiniBand port counters of the kernel's sysfs ABI (``ports/<n>/counters``);
``port_xmit_data`` and ``port_rcv_data`` count 4-byte words."""
MLX5_HW_COUNTERS: tuple[str, ...] = (
    "out_of_buffer",
    "out_of_sequence",
    "duplicate_request",
    "rnr_nak_retry_err",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "resp_local_length_error",
    "resp_cqe_error",
    "req_cqe_error",
    "req_remote_invalid_request",
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "resp_cqe_flush_error",
    "req_cqe_flush_error",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rp_cnp_ignored",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
    "np_cnp_sent",
    "rx_icrc_encapsulated",
)
"""The mlx5 driver's port ``hw_counters``: transport errors, RoCE congestion control (CNPs, ECN)."""

# --- PCI identities ---------------------------------------------------------------------------

NVIDIA_VENDOR = "0x10de"
AMAZON_VENDOR = "0x1d0f"
MELLANOX_VENDOR = "0x15b3"
_H200_DEVICE = "0x2335"
_EFA_DEVICE = "0xefa2"
_CONNECTX7_DEVICE = "0x1021"
_CLASS_3D_CONTROLLER = "0x030200"
_CLASS_ETHERNET = "0x020000"
_CLASS_INFINIBAND = "0x020700"
EFA_RATE = "100 Gb/sec (4X EDR)"
"""What an EFA port of a p5 / p5en instance says its rate is (32 x 100 Gb/s a node)."""
NDR_RATE = "400 Gb/sec (4X NDR)"
HDR_RATE = "200 Gb/sec (4X HDR)"


@dataclass(frozen=True)
class PciFunction:
    """A PCI function and its place in the PCIe tree.

    ``bdf`` is the sysfs address (``0000:4f:00.0``, lower-case hex), ``root`` the root complex's
    directory under ``devices`` (``pci0000:48``) and ``bridges`` the PCI bridges from the root
    port down (root port, switch upstream port, switch downstream port, ...).  ``vendor``,
    ``device`` and ``class_code`` are written as the kernel writes them (``0x10de``); ``None``: no
    file.  ``numa_node`` -1: no NUMA affinity.
    """

    bdf: str
    root: str
    bridges: tuple[str, ...] = ()
    numa_node: int = -1
    vendor: str | None = None
    device: str | None = None
    class_code: str | None = None

    @property
    def path(self) -> PurePosixPath:
        """The function's directory relative to the sysfs root (``devices/<root>/.../<bdf>``)."""
        return PurePosixPath("devices", self.root, *self.bridges, self.bdf)

    @property
    def bus(self) -> int:
        """The PCI bus number."""
        return int(self.bdf.split(":")[1], 16)

    @property
    def slot(self) -> int:
        """The PCI device (slot) number."""
        return int(self.bdf.split(":")[2].split(".")[0], 16)


@dataclass(frozen=True)
class PortSpec:
    """One port of an RDMA device: its state files (as the kernel writes them) and counter names.

    ``hw_counters`` go to ``ports/<n>/hw_counters`` (driver statistics), ``ib_counters`` to
    ``ports/<n>/counters`` (the InfiniBand port counters).
    """

    number: int = 1
    state: str = "4: ACTIVE"
    phys_state: str = "5: LinkUp"
    rate: str = EFA_RATE
    link_layer: str = "Unknown"
    """``InfiniBand``, ``Ethernet`` (RoCE) or ``Unknown`` (EFA)."""
    hw_counters: tuple[str, ...] = ()
    ib_counters: tuple[str, ...] = ()


@dataclass(frozen=True)
class NicSpec:
    """An RDMA device: its name, driver, PCI function, ports and device-level counters.

    ``p2p`` / ``gdr`` are the contents of the function's ``p2p`` and ``gdr`` files (the EFA
    driver's peer-to-peer provider, newer drivers; ``1`` when an older one can register GPU
    memory); ``None``: no such file.  ``device_counters`` empty: no device-level ``hw_counters``.
    """

    name: str
    driver: str
    function: PciFunction
    ports: tuple[PortSpec, ...] = (PortSpec(),)
    device_counters: tuple[str, ...] = ()
    p2p: str | None = None
    gdr: str | None = None
    node_type: str = "1: CA"

    def port(self, number: int) -> PortSpec:
        """The port numbered ``number``; KeyError when the device has none."""
        for p in self.ports:
            if p.number == number:
                return p
        raise KeyError(f"{self.name} has no port {number}")


@dataclass(frozen=True)
class Layout:
    """A node's PCIe devices: GPUs by index, NICs, and each GPU's nearest NICs (by name)."""

    gpus: tuple[PciFunction, ...]
    nics: tuple[NicSpec, ...]
    nearest: tuple[tuple[str, ...], ...] = field(default=())
    """Per GPU index: the NICs below the GPU's own PCIe switch."""


def rdma_name(function: PciFunction, prefix: str = "rdma") -> str:
    """The name systemd gives an RDMA device by its PCI slot: ``rdmap<bus>s<slot>`` in decimal
    (bus 0x4f, slot 0 -> ``rdmap79s0``), as EFA devices are named."""
    return f"{prefix}p{function.bus}s{function.slot}"


# --- NIC kinds ------------------------------------------------------------------------------------


def efa_nic(name: str, function: PciFunction, p2p: str = "NVIDIA peermem") -> NicSpec:
    """An EFA device of a recent driver: port statistics in the port's ``hw_counters``, admin
    and error statistics in the device's, and the peer-to-peer provider in ``p2p`` (``""``: none)."""
    port = PortSpec(rate=EFA_RATE, link_layer="Unknown", hw_counters=EFA_PORT_COUNTERS)
    return NicSpec(name, "efa", function, (port,), EFA_DEVICE_COUNTERS, p2p=p2p)


def efa_old_driver_nic(name: str, function: PciFunction, gdr: str | None = "1") -> NicSpec:
    """An EFA device of an older driver: every statistic in the port's ``hw_counters``, no
    device-level directory, ``gdr`` instead of ``p2p``."""
    port = PortSpec(rate=EFA_RATE, link_layer="Unknown", hw_counters=EFA_OLD_DRIVER_COUNTERS)
    return NicSpec(name, "efa", function, (port,), gdr=gdr)


def mlx5_infiniband_nic(name: str, function: PciFunction) -> NicSpec:
    """A ConnectX port in InfiniBand mode (NDR): IB port counters and mlx5's ``hw_counters``."""
    port = PortSpec(rate=NDR_RATE, link_layer="InfiniBand", hw_counters=MLX5_HW_COUNTERS, ib_counters=IB_PORT_COUNTERS)
    return NicSpec(name, "mlx5_core", function, (port,))


def mlx5_roce_nic(name: str, function: PciFunction) -> NicSpec:
    """A ConnectX port in Ethernet mode (RoCE, HDR speed): the same counters, link layer Ethernet."""
    port = PortSpec(rate=HDR_RATE, link_layer="Ethernet", hw_counters=MLX5_HW_COUNTERS, ib_counters=IB_PORT_COUNTERS)
    return NicSpec(name, "mlx5_core", function, (port,))


# --- node layouts ---------------------------------------------------------------------------------

HGX_GPU_BUSES: tuple[int, ...] = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
"""PCI bus of the eight GPUs of an HGX H100/H200 baseboard, by GPU index."""
P4D_GPU_BUSES: tuple[int, ...] = (0x10, 0x20, 0x90, 0xA0)
"""PCI buses of a p4d/p4de instance: two A100s (slots 0x1c, 0x1d) and one EFA (slot 0x1b) on each."""


def _gpu_function(bdf: str, root: str, bridges: tuple[str, ...], numa: int) -> PciFunction:
    return PciFunction(bdf, root, bridges, numa, NVIDIA_VENDOR, _H200_DEVICE, _CLASS_3D_CONTROLLER)


def _switch(gpu_bus: int, numa: int, nics: int) -> tuple[PciFunction, tuple[PciFunction, ...], tuple[str, str, str]]:
    """A root complex with one PCIe switch below it: ``nics`` endpoints on the switch's first
    downstream ports, the GPU on the last, at bus ``gpu_bus``.  Bus numbers follow the order a
    depth-first enumeration gives: root port's bus R, switch upstream port R+1, switch internal
    bus R+2, endpoints R+3 on.  Returns (GPU, NIC functions, (root, root port, upstream port))."""
    r = gpu_bus - 3 - nics
    root, root_port, upstream = f"pci0000:{r:02x}", f"0000:{r:02x}:01.0", f"0000:{r + 1:02x}:00.0"
    functions = []
    for k in range(nics + 1):
        downstream = f"0000:{r + 2:02x}:{k:02x}.0"
        functions.append((f"0000:{r + 3 + k:02x}:00.0", (root_port, upstream, downstream)))
    bdf, bridges = functions[-1]
    gpu = _gpu_function(bdf, root, bridges, numa)
    nic_functions = tuple(
        PciFunction(b, root, br, numa, AMAZON_VENDOR, _EFA_DEVICE, _CLASS_ETHERNET) for b, br in functions[:-1]
    )
    return gpu, nic_functions, (root, root_port, upstream)


def p5en_layout(p2p: str = "NVIDIA peermem") -> Layout:
    """A p5en-like node: 8 H200s at ``HGX_GPU_BUSES``, each below its own PCIe switch (under its own
    root complex) with 4 EFA devices (``rdmap<bus>s0``, recent driver, 100 Gb/s each: 32 x 100 Gb/s),
    so each GPU and its 4 EFAs are ``PIX``; GPUs 0-3 and their NICs on NUMA node 0, 4-7 on 1.
    ``p2p`` is every EFA's peer-to-peer provider (``""``: none)."""
    gpus: list[PciFunction] = []
    nics: list[NicSpec] = []
    nearest: list[tuple[str, ...]] = []
    for index, bus in enumerate(HGX_GPU_BUSES):
        gpu, functions, _ = _switch(bus, 0 if index < 4 else 1, 4)
        gpus.append(gpu)
        own = tuple(efa_nic(rdma_name(f), f, p2p) for f in functions)
        nics.extend(own)
        nearest.append(tuple(n.name for n in own))
    return Layout(tuple(gpus), tuple(nics), tuple(nearest))


def dgx_layout(link_layer: str = "InfiniBand") -> Layout:
    """A DGX-like node: 8 GPUs at ``HGX_GPU_BUSES``, each below its own PCIe switch with one
    ConnectX port (``mlx5_0`` .. ``mlx5_7``), InfiniBand or (``Ethernet``) RoCE; NUMA split 0-3 / 4-7."""
    make = mlx5_infiniband_nic if link_layer == "InfiniBand" else mlx5_roce_nic
    class_code = _CLASS_INFINIBAND if link_layer == "InfiniBand" else _CLASS_ETHERNET
    gpus: list[PciFunction] = []
    nics: list[NicSpec] = []
    for index, bus in enumerate(HGX_GPU_BUSES):
        gpu, (function,), _ = _switch(bus, 0 if index < 4 else 1, 1)
        function = PciFunction(
            function.bdf, function.root, function.bridges, function.numa_node, MELLANOX_VENDOR,
            _CONNECTX7_DEVICE, class_code,
        )  # fmt: skip
        gpus.append(gpu)
        nics.append(make(f"mlx5_{index}", function))
    return Layout(tuple(gpus), tuple(nics), tuple((n.name,) for n in nics))


def p4d_layout() -> Layout:
    """A p4d-like node with an older EFA driver: on each of ``P4D_GPU_BUSES`` (below one PCIe switch
    per root complex) two A100s (slots 0x1c, 0x1d) and one EFA (slot 0x1b, ``rdmap<bus>s27``,
    ``gdr`` 1); buses 0x10, 0x20 on NUMA node 0, 0x90, 0xa0 on 1."""
    gpus: list[PciFunction] = []
    nics: list[NicSpec] = []
    nearest: list[tuple[str, ...]] = []
    for bus in P4D_GPU_BUSES:
        r = bus - 3
        root = f"pci0000:{r:02x}"
        bridges = (f"0000:{r:02x}:01.0", f"0000:{r + 1:02x}:00.0", f"0000:{r + 2:02x}:00.0")
        numa = 0 if bus < 0x80 else 1
        efa = PciFunction(f"0000:{bus:02x}:1b.0", root, bridges, numa, AMAZON_VENDOR, "0xefa0", _CLASS_ETHERNET)
        nic = efa_old_driver_nic(rdma_name(efa), efa)
        nics.append(nic)
        for slot in (0x1C, 0x1D):
            gpus.append(_gpu_function(f"0000:{bus:02x}:{slot:02x}.0", root, bridges, numa))
            nearest.append((nic.name,))
    return Layout(tuple(gpus), tuple(nics), tuple(nearest))


# --- the tree -------------------------------------------------------------------------------------


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _symlink(link: Path, target: Path) -> None:
    """``link`` -> ``target`` as a relative symlink (the kernel's sysfs links are relative)."""
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))


def _counter_text(value: int) -> bytes:
    if not 0 <= value < 10**COUNTER_WIDTH:
        raise ValueError(f"counter value out of range: {value}")
    return f"{value:0{COUNTER_WIDTH}d}\n".encode()


class SysfsTree:
    """Writes a sysfs tree under ``root/sys`` and a procfs tree under ``root/proc`` (see the module
    docstring) and rewrites its counters in place.

    ``peermem``: the ``nvidia_peermem`` module is loaded (its ``version`` file exists);
    ``open_kernel_module``: the GPU driver is NVIDIA's open kernel module (what its
    ``/proc/driver/nvidia/version`` says).  Every counter starts at 0.  The tree does not own
    ``root``: ``close()`` removes nothing (whoever made the directory removes it).
    """

    def __init__(
        self,
        root: Path,
        nics: Sequence[NicSpec] = (),
        gpus: Sequence[PciFunction] = (),
        peermem: bool = False,
        open_kernel_module: bool = True,
        driver_version: str = DRIVER_VERSION,
    ) -> None:
        self._root = Path(root)
        self.nics: tuple[NicSpec, ...] = tuple(nics)
        self.gpus: tuple[PciFunction, ...] = tuple(gpus)
        self._by_name = {n.name: n for n in self.nics}
        if len(self._by_name) != len(self.nics):
            raise ValueError("two NICs share a name")
        self._files: dict[tuple[str, int | None, str], str] = {}
        """(NIC, port or None, counter) -> its file, as written."""
        for gpu in self.gpus:
            self._function(gpu, "nvidia")
        for nic in self.nics:
            self._nic(nic)
        if peermem:
            _write(self.sysfs / "module" / "nvidia_peermem" / "version", f"{driver_version}\n")
        _write(self.procfs / "driver" / "nvidia" / "version", _driver_banner(driver_version, open_kernel_module))

    @classmethod
    def of(cls, root: Path, layout: Layout, peermem: bool = False, open_kernel_module: bool = True) -> SysfsTree:
        """The tree of ``layout``'s GPUs and NICs."""
        return cls(root, layout.nics, layout.gpus, peermem, open_kernel_module)

    @property
    def sysfs(self) -> Path:
        """The sysfs root (what ``--path.sysfs`` would name)."""
        return self._root / "sys"

    @property
    def procfs(self) -> Path:
        """The procfs root (what ``--path.procfs`` would name)."""
        return self._root / "proc"

    def device_dir(self, nic: str) -> Path:
        """The RDMA device's directory (where ``class/infiniband/<nic>`` points)."""
        spec = self._by_name[nic]
        return self.sysfs / spec.function.path / "infiniband" / nic

    def counter_path(self, nic: str, port: int | None, counter: str) -> Path:
        """The file of ``counter``: device-level (``port`` None) or of the port (its
        ``counters/`` for an InfiniBand port counter, else ``hw_counters/``); KeyError if absent."""
        return Path(self._file(nic, port, counter))

    def _file(self, nic: str, port: int | None, counter: str) -> str:
        try:
            return self._files[(nic, port, counter)]
        except KeyError:
            where = "device" if port is None else f"port {port}"
            raise KeyError(f"{nic} has no {where} counter {counter}") from None

    def set_counter(self, nic: str, port: int | None, counter: str, value: int) -> None:
        """Rewrite a counter in place (same inode, same size, one ``pwrite`` at offset 0): a reader
        holding the file open and reading it at offset 0 sees either value, never an empty file.
        ``port`` None: a device-level counter.  IB ``port_xmit_data``/``port_rcv_data`` take words."""
        fd = os.open(self._file(nic, port, counter), os.O_WRONLY)
        try:
            os.pwrite(fd, _counter_text(value), 0)
        finally:
            os.close(fd)

    def counter(self, nic: str, port: int | None, counter: str) -> int:
        """A counter's current value (as a reader would parse it)."""
        return int(self.counter_path(nic, port, counter).read_text())

    def close(self) -> None:
        """Nothing to release; the directory belongs to whoever made it."""

    # --- writing ------------------------------------------------------------------------------

    def _function(self, function: PciFunction, driver: str) -> Path:
        """The function's directory and attribute files, its ``driver`` link and its
        ``bus/pci/devices`` entry."""
        sysfs = self.sysfs
        directory = sysfs / function.path
        directory.mkdir(parents=True, exist_ok=True)
        attributes = {
            "numa_node": str(function.numa_node),
            "vendor": function.vendor,
            "device": function.device,
            "class": function.class_code,
        }
        for name, value in attributes.items():
            if value is not None:
                _write(directory / name, f"{value}\n")
        drivers = sysfs / "bus" / "pci" / "drivers" / driver
        drivers.mkdir(parents=True, exist_ok=True)
        _symlink(directory / "driver", drivers)
        devices = sysfs / "bus" / "pci" / "devices"
        _symlink(devices / function.bdf, directory)
        # The bridges on the way are PCI functions too (each listed once, however many share it).
        for depth, bridge in enumerate(function.bridges):
            if not (devices / bridge).is_symlink():
                _symlink(devices / bridge, sysfs.joinpath("devices", function.root, *function.bridges[: depth + 1]))
        return directory

    def _nic(self, nic: NicSpec) -> None:
        function_dir = self._function(nic.function, nic.driver)
        if nic.p2p is not None:
            _write(function_dir / "p2p", f"{nic.p2p}\n" if nic.p2p else "")
        if nic.gdr is not None:
            _write(function_dir / "gdr", f"{nic.gdr}\n")
        device = function_dir / "infiniband" / nic.name
        _write(device / "node_type", f"{nic.node_type}\n")
        # As the kernel links it: up to the function's parent, then down by its address.
        device_link = device / "device"
        device_link.symlink_to(PurePosixPath("..", "..", "..", nic.function.bdf))
        if nic.device_counters:
            self._counters(device / "hw_counters", (nic.name, None), nic.device_counters, lifespan=True)
        for port in nic.ports:
            port_dir = device / "ports" / str(port.number)
            for name in ("state", "phys_state", "rate", "link_layer"):
                _write(port_dir / name, f"{getattr(port, name)}\n")
            if port.hw_counters:
                self._counters(port_dir / "hw_counters", (nic.name, port.number), port.hw_counters, lifespan=True)
            if port.ib_counters:
                self._counters(port_dir / "counters", (nic.name, port.number), port.ib_counters, lifespan=False)
        _symlink(self.sysfs / "class" / "infiniband" / nic.name, device)

    def _counters(self, directory: Path, owner: tuple[str, int | None], names: Iterable[str], lifespan: bool) -> None:
        """Counter files at 0 in ``directory``, remembered as ``owner``'s (NIC, port or None)."""
        directory.mkdir(parents=True, exist_ok=True)
        for name in names:
            path = directory / name
            path.write_bytes(_counter_text(0))
            self._files[(*owner, name)] = str(path)
        if lifespan:
            (directory / "lifespan").write_text(f"{LIFESPAN_MILLISECONDS}\n")


def _driver_banner(version: str, open_kernel_module: bool) -> str:
    """``/proc/driver/nvidia/version`` of driver ``version``: the open or the proprietary module."""
    kind = "NVIDIA UNIX Open Kernel Module for x86_64" if open_kernel_module else "NVIDIA UNIX x86_64 Kernel Module"
    compiler = "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)"
    return f"NVRM version: {kind}  {version}  {_DRIVER_BUILD}\n{compiler}\n"
