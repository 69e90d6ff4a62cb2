"""Exporter flags (docs/flags.md), each with a ``GPULENS_*`` environment twin, parsed into a frozen config.

A bad flag or value exits with status 2 and a message naming the flag (or the environment variable).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exporter.listen_address import parse_listen_address
from exporter.quantities import (
    DECIMAL,
    MAX_DURATION_SECONDS,
    check_length,
    exact,
    is_plain,
    is_whole,
    not_a_quantity,
    parse_duration,
    shown_seconds,
    why_not_plain,
)

DEFAULT_PODRESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"

SIM_SCENARIOS: tuple[str, ...] = (
    "h200x8",
    "mig",
    "mig7x8",
    "timeslice",
    "mps",
    "dra",
    "dra-plugin",
    "a100",
    "l40s",
    "a10g",
    "p5en",
    "p5en-nogdr",
    "jobs-0",
    "jobs-1",
    "serving",
)
"""Values ``--sim.scenario`` accepts: the simulator's scenarios (a test checks they are
``exporter.sim.SCENARIOS``; this module does not import the simulator)."""

_SIZE = re.compile(rf"({DECIMAL})(?:e([0-9]{{1,2}}))?(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)?")
_SIZE_UNITS: dict[str | None, int] = {
    None: 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
}  # fmt: skip
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""A Kubernetes node name: an RFC 1123 subdomain (at most 253 characters)."""
_HOST = re.compile(r"\[[0-9A-Za-z:.%]+\]|[0-9A-Za-z.:%-]*")
"""The host part of a listen address: a name, an IPv4 address or an IPv6 one (bracketed or not)."""


MAX_BYTES = 2**60
"""No size flag may exceed 1 EiB."""


def duration_between(low: float, high: float) -> Callable[[str], float]:
    """A duration parser that also enforces ``low <= seconds <= high``."""

    def parse(text: str) -> float:
        seconds = parse_duration(text)
        if not low <= seconds <= high:
            raise ValueError(f"{text!r} is outside {shown_seconds(low)}..{shown_seconds(high)}")
        return seconds

    return parse


def count_between(low: int, high: int) -> Callable[[str], int]:
    """A parser of a whole count in ASCII digits with ``low <= n <= high``."""

    def parse(text: str) -> int:
        check_length(text)
        if not is_whole(text):
            raise ValueError(f"{text!r} {why_not_plain(text)}: expected a whole number in {low}..{high}")
        value = int(text)
        if not low <= value <= high:
            raise ValueError(f"{text!r} is outside {low}..{high}")
        return value

    return parse


MAX_COUNT = 1_000_000
"""No ceiling flag may exceed a million items (a million series is already far past a page)."""


def parse_bool(text: str) -> bool:
    """Environment booleans: true/false, 1/0, yes/no, on/off (any case, nothing around them)."""
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not a boolean (use true or false)")


def parse_bytes(text: str) -> int:
    """``4GiB``, ``512MiB``, ``1e9`` or a plain byte count -> bytes (a whole number, at most 1 EiB).

    ASCII digits only; the exponent of ``1e9`` has at most two digits; no sign, ``_`` or whitespace.
    Computed exactly, so ``1.1GB`` is 1100000000 and ``0.5B`` is refused."""
    check_length(text)
    m = _SIZE.fullmatch(text)
    if not m and re.fullmatch(rf"{DECIMAL}e[0-9]+[A-Za-z]*", text):
        raise ValueError(f"{text!r} has an exponent of more than two digits: expected a size of at most 1 EiB")
    if not m:
        raise not_a_quantity(text, "size", [u for u in _SIZE_UNITS if u], "4GiB, 512MiB")
    numerator, denominator = exact(m.group(1))
    numerator *= 10 ** int(m.group(2) or 0) * _SIZE_UNITS[m.group(3)]
    if numerator > MAX_BYTES * denominator:
        raise ValueError(f"{text!r} is larger than the limit of 1 EiB")
    if numerator % denominator:
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return numerator // denominator


def _listen(text: str) -> str:
    """``--web.listen-address``: ``[HOST]:PORT`` with an ASCII port 0..65535 and an ASCII host.

    ``exporter.listen_address.parse_listen_address`` reads the port with ``int()``, which would
    also take other scripts' digits, a sign, ``_`` and whitespace; they are refused here first."""
    host, sep, port = text.rpartition(":")
    if sep and not is_whole(port):
        raise ValueError(f"port {port[:20]!r} {why_not_plain(port)}: expected 0..65535")
    if len(port) > 5:
        raise ValueError(f"port {port[:20]!r} is out of range 0..65535")
    if sep and not _HOST.fullmatch(host):
        raise ValueError(f"host {host!r}: expected a host name or an IP address in ASCII, without spaces")
    parse_listen_address(text)
    return text


def _node_name(text: str) -> str:
    """``--kubernetes.node-name`` (or ``NODE_NAME``): empty, or a Kubernetes node name."""
    if text and (len(text) > 253 or not _NODE_NAME.fullmatch(text)):
        raise ValueError(f"{text!r} is not a Kubernetes node name (lower-case a-z, 0-9, '-' and '.')")
    return text


def env_name(flag: str) -> str:
    """``--collect.interval`` -> ``GPULENS_COLLECT_INTERVAL``."""
    return "GPULENS_" + re.sub(r"[.\-]", "_", flag.lstrip("-")).upper()


@dataclass(frozen=True)
class ExporterConfig:
    """Everything the exporter was asked to do; durations in seconds, sizes in bytes."""

    listen_address: str
    web_config_file: str
    backend: str
    sim_scenario: str
    sim_seed: int
    sim_faults: str
    collect_interval: float
    collect_deadline: float
    analysis_window: float
    podresources_socket: str
    node_name: str
    kube_api: bool
    kube_refresh_interval: float
    procfs: str
    probes: bool
    probes_interval: float
    probes_timeout: float
    probes_min_free_memory: int
    probes_max_utilization: float
    probes_skip_allocated: bool
    log_format: str
    log_level: str
    compat_dcgm: bool = False
    """Also export dcgm-exporter's series (``--compat.dcgm``)."""
    collect_gpm: bool = True
    """Read GPM where the GPU has it (``--collect.gpm``); off, every leaf gets the coarse classes."""
    collect_nic: bool = True
    """Read the node's RDMA NICs (``--collect.nic``); on by default, silent where none exists."""
    sysfs: str = "/sys"
    """``--path.sysfs``: where the host's sysfs is (RDMA NICs, PCIe paths, peer-memory modules)."""
    kube_owner_chain: bool = True
    """``--[no-]kubernetes.owner-chain``: a pod's workload is the top of its owner chain."""
    kube_resource_slices: bool = True
    """``--[no-]kubernetes.resource-slices``: resolve DRA-claimed devices through ResourceSlices."""
    nic_max_devices: int = 64
    """``--collect.nic.max-devices``: RDMA devices read per node (``exporter.network.rdma.MAX_DEVICES``)."""
    nic_max_counters: int = 8192
    """``--collect.nic.max-counters``: NIC counter files read per node (``exporter.network.rdma.MAX_COUNTERS``)."""
    kube_max_pods: int = 1024
    """``--kubernetes.max-pods``: pods holding a device taken from one kubelet reply."""
    kube_max_allocations: int = 4096
    """``--kubernetes.max-allocations``: allocation series of the node."""


def _ratio(text: str) -> float:
    """A ratio 0..1 written as a plain ASCII decimal (``0.05``, ``1``)."""
    check_length(text)
    if not is_plain(text):
        raise ValueError(f"{text!r} {why_not_plain(text)}: expected a ratio in 0..1 such as 0.05")
    numerator, denominator = exact(text)
    if numerator > denominator:
        raise ValueError(f"{text!r} is not a ratio in 0..1")
    return float(text)


def _seed(text: str) -> int:
    """A seed 0..2^64-1 in ASCII digits."""
    check_length(text)
    if not is_whole(text):
        raise ValueError(f"{text!r} {why_not_plain(text)}: expected a whole number in 0..2^64-1")
    value = int(text)
    if value >= 2**64:
        raise ValueError(f"{text!r} is outside 0..2^64-1")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own error exits 2 with usage
        self.print_usage()
        self.exit(2, f"gpulens-exporter: error: {message}\n")


_FLAGS: list[tuple[str, Callable[[str], Any], Any, str]] = [
    (
        "--web.listen-address",
        _listen,
        ":9445",
        "Address to serve /metrics, /healthz and /readyz on: :PORT is both IP stacks where the host has "
        "IPv6 (else IPv4), 0.0.0.0:PORT IPv4 only, [::]:PORT IPv6 only.",
    ),
    (
        "--web.config.file",
        str,
        "",
        "exporter-toolkit web config (TLS, mTLS, basic auth); empty serves plain HTTP.",
    ),
    (
        "--backend",
        str,
        "nvml",
        "GPU backend: nvml (exits 1 if the GPUs cannot be read), sim (the simulated fleet), or auto "
        "(NVML if a driver loads, else sim; for demos).",
    ),
    (
        "--sim.scenario",
        str,
        SIM_SCENARIOS[0],
        f"Simulated fleet (with --backend sim): {', '.join(SIM_SCENARIOS)}.",
    ),
    ("--sim.seed", _seed, "0", "Seed of the simulated fleet."),
    ("--sim.faults", str, "", "Faults to inject into the simulator, e.g. 'lost=3;hang=30'."),
    ("--collect.interval", duration_between(0.05, 3600), "1s", "Sampling interval (also the GPM window); 50ms..1h."),
    (
        "--collect.deadline",
        duration_between(0.01, 3600),
        "5s",
        "Longest a GPU read may take before the cycle gives up; 10ms..1h.",
    ),
    ("--analysis.window", duration_between(0.1, 3600), "10s", "Window of the boundness classifier; 100ms..1h."),
    (
        "--kubernetes.podresources-socket",
        str,
        DEFAULT_PODRESOURCES_SOCKET,
        "Kubelet PodResources socket; empty disables pod attribution from the kubelet.",
    ),
    (
        "--kubernetes.node-name",
        _node_name,
        "",
        "This node's name (default: $NODE_NAME, which the chart sets from the downward API): the node label "
        "of every series, and the node whose pods and ResourceSlices the API watch selects with "
        "--kubernetes.api (a name alone starts no watch). Empty: series are labelled with the simulated "
        "scenario's name (jobs-0) with --backend sim, else with the host name, and no API watch starts.",
    ),
    (
        "--kubernetes.refresh-interval",
        duration_between(0.1, 86400),
        "10s",
        "How often the kubelet mapping is refreshed (cached between); 100ms..1d.",
    ),
    (
        "--kubernetes.max-pods",
        count_between(1, MAX_COUNT),
        "1024",
        "Most pods holding a device taken from one kubelet PodResources reply (pods holding a GPU first, "
        "then by namespace and name); the rest are counted in gpulens_attribution_items_dropped_total. "
        "Kubernetes runs at most 110 pods on a node by default and about 250 in practice; 1..1000000.",
    ),
    (
        "--kubernetes.max-allocations",
        count_between(1, MAX_COUNT),
        "4096",
        "Most gpulens_pod_gpu_allocation series of the node (by namespace, pod, container and GPU); the "
        "rest are counted in gpulens_attribution_items_dropped_total. 8 GPUs split into 7 MIG instances "
        "make 56, and 8 GPUs of 64 time-slicing replicas 512; 1..1000000.",
    ),
    ("--path.procfs", str, "/proc", "procfs root used to map process IDs to pods (and read the GPU driver's kind)."),
    (
        "--path.sysfs",
        str,
        "/sys",
        "sysfs root the RDMA NICs, their PCIe paths and the peer-memory modules are read from (docs/network.md).",
    ),
    (
        "--collect.nic.max-devices",
        count_between(1, 4096),
        "64",
        "Most RDMA devices read and exported per node (a p5en has 32); past it, those with a PCI function "
        "and an active port are kept first, then by name, and the rest counted in gpulens_nic_items_dropped "
        "(docs/network.md); 1..4096.",
    ),
    (
        "--collect.nic.max-counters",
        count_between(1, 1048576),
        "8192",
        "Most NIC counter files read and exported per node (a p5en has 1,088): every port's traffic counters "
        "first, the others shared fairly among the devices; the rest counted in gpulens_nic_items_dropped; "
        "1..1048576.",
    ),
    (
        "--probes.interval",
        duration_between(1, MAX_DURATION_SECONDS),
        "1h",
        "Interval between bandwidth probes of a GPU; 1s..365d.",
    ),
    ("--probes.timeout", duration_between(1, 3600), "10s", "Wall-clock limit of one probe child process; 1s..1h."),
    ("--probes.min-free-memory", parse_bytes, "4GiB", "Skip probes on a GPU with less free memory."),
    ("--probes.max-utilization", _ratio, "0.05", "Skip probes on a GPU busier than this (0..1)."),
    ("--log.format", str, "logfmt", "Log format: logfmt or json."),
    ("--log.level", str, "info", "Log level: debug, info, warn, error."),
]
_CHOICES = {
    "backend": ("auto", "nvml", "sim"),
    "log_format": ("logfmt", "json"),
    "log_level": ("debug", "info", "warn", "error"),
    "sim_scenario": SIM_SCENARIOS,
}
_BOOLS: list[tuple[str, bool, str]] = [
    (
        "collect.gpm",
        True,
        "Read GPM (Hopper and newer) for the full boundness classes; --no-collect.gpm reads every GPU as "
        "one without GPM (coarse classes from NVML GPU-Util, memory-controller utilisation and power), "
        "to compare the two on one GPU (docs/boundness.md).",
    ),
    (
        "collect.nic",
        True,
        "Read the node's RDMA NICs (EFA, InfiniBand, RoCE) under --path.sysfs: counters, GPU-NIC topology, "
        "GPUDirect RDMA readiness; a node without any exports no NIC series.",
    ),
    ("kubernetes.api", False, "Watch the Kubernetes API for pod owners and phases (needs RBAC)."),
    (
        "kubernetes.owner-chain",
        True,
        "With --kubernetes.api, follow controller references above each pod's own controller through "
        "the API (get on the owners' resources), so its workload is the top of its owner chain: the "
        "JobSet, TrainJob, LeaderWorkerSet, RayJob or CronJob above it (docs/attribution.md). Off: the "
        "pod's own controller (a ReplicaSet named after its Deployment counts as that Deployment).",
    ),
    (
        "kubernetes.resource-slices",
        True,
        "With --kubernetes.api, watch this node's DRA ResourceSlices (resource.k8s.io/v1; get, list and "
        "watch on resourceslices) to tell which GPU, MIG instance or NIC each device a pod holds through a "
        "ResourceClaim is (docs/attribution.md). Off: claimed GPUs of NVIDIA's DRA driver stay unattributed "
        "(counted in gpulens_unmapped_devices_total, reason no_slice).",
    ),
    ("probes", True, "Run gated bandwidth probes in child processes."),
    ("probes.skip-allocated", True, "Never probe a GPU allocated to a pod."),
    (
        "compat.dcgm",
        False,
        "Also export dcgm-exporter's DCGM_FI_* series, units and labels (docs/dcgm-compat.md).",
    ),
]


def _die(message: str) -> Any:
    sys.stderr.write(f"gpulens-exporter: error: {message}\n")
    raise SystemExit(2)


def _typed_from_env(name: str, conv: Callable[[str], Any], env: Mapping[str, str], default: str) -> Any:
    """The environment variable ``name`` read by ``conv``, else ``default`` read by it; exits 2
    naming the variable when it cannot be read."""
    raw = env.get(name)
    if raw is None:
        return conv(default)
    try:
        return conv(raw)
    except (ValueError, OverflowError) as exc:
        _die(f"environment {name}: {exc}")


def _explained(conv: Callable[[str], Any]) -> Callable[[str], Any]:
    """argparse shows only ArgumentTypeError messages; keep ours (they say what is wrong)."""

    def wrapped(text: str) -> Any:
        try:
            return conv(text)
        except (ValueError, OverflowError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return wrapped


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """The argument parser; defaults come from ``env`` twins where set."""
    parser = _Parser(
        prog="gpulens-exporter",
        description="GPU observability exporter: per-GPU, per-MIG and per-pod metrics for Prometheus.",
    )
    for flag, conv, default, help_ in _FLAGS:
        dest = flag.lstrip("-").replace(".", "_").replace("-", "_")
        env_default = _typed_from_env(env_name(flag), conv, env, default)
        if flag == "--kubernetes.node-name" and not env_default:
            env_default = _typed_from_env("NODE_NAME", conv, env, "")
        parser.add_argument(
            flag,
            dest=dest,
            type=_explained(conv),
            default=env_default,
            choices=_CHOICES.get(dest),
            help=f"{help_} (env {env_name(flag)}; default {default!r})",
        )
    for name, default, help_ in _BOOLS:
        dest = name.replace(".", "_").replace("-", "_")
        flag = f"--{name}"
        try:
            env_value = parse_bool(env[env_name(flag)]) if env_name(flag) in env else default
        except (ValueError, OverflowError) as exc:
            _die(f"environment {env_name(flag)}: {exc}")
        parser.add_argument(
            flag,
            dest=dest,
            action=argparse.BooleanOptionalAction,
            default=env_value,
            help=f"{help_} (env {env_name(flag)}; default {default})",
        )
    return parser


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> ExporterConfig:
    """Parse flags (and env twins); exits 2 naming the bad flag or variable."""
    env = os.environ if env is None else env
    parser = build_parser(env)
    ns = parser.parse_args(argv)
    for dest, choices in _CHOICES.items():
        if getattr(ns, dest) not in choices:  # env twins bypass argparse's choices check
            parser.error(f"{env_name('--' + dest.replace('_', '.'))}: invalid choice {getattr(ns, dest)!r}")
    if ns.collect_deadline < ns.collect_interval * 0.5:
        parser.error("--collect.deadline must be at least half of --collect.interval")
    return ExporterConfig(
        listen_address=ns.web_listen_address,
        web_config_file=ns.web_config_file,
        backend=ns.backend,
        sim_scenario=ns.sim_scenario,
        sim_seed=ns.sim_seed,
        sim_faults=ns.sim_faults,
        collect_interval=ns.collect_interval,
        collect_deadline=ns.collect_deadline,
        analysis_window=ns.analysis_window,
        podresources_socket=ns.kubernetes_podresources_socket,
        node_name=ns.kubernetes_node_name,
        kube_api=ns.kubernetes_api,
        kube_refresh_interval=ns.kubernetes_refresh_interval,
        procfs=ns.path_procfs,
        probes=ns.probes,
        probes_interval=ns.probes_interval,
        probes_timeout=ns.probes_timeout,
        probes_min_free_memory=ns.probes_min_free_memory,
        probes_max_utilization=ns.probes_max_utilization,
        probes_skip_allocated=ns.probes_skip_allocated,
        log_format=ns.log_format,
        log_level=ns.log_level,
        compat_dcgm=ns.compat_dcgm,
        collect_gpm=ns.collect_gpm,
        collect_nic=ns.collect_nic,
        sysfs=ns.path_sysfs,
        kube_owner_chain=ns.kubernetes_owner_chain,
        kube_resource_slices=ns.kubernetes_resource_slices,
        nic_max_devices=ns.collect_nic_max_devices,
        nic_max_counters=ns.collect_nic_max_counters,
        kube_max_pods=ns.kubernetes_max_pods,
        kube_max_allocations=ns.kubernetes_max_allocations,
    )


def flags_markdown() -> str:
    """docs/flags.md: every flag with its env twin, default and meaning (generated)."""
    out = [
        "# Exporter flags",
        "",
        "Generated from `exporter/config.py` by `python -m exporter.config > docs/flags.md`; a test",
        "fails when they drift. Every flag has an environment twin; the command line wins. Durations",
        "take `ms`, `s`, `m`, `h`, `d` (at most `365d`, less where a range is given); sizes `KiB`..`TiB`",
        "(at most 1 EiB). A bad flag or value, or one out of range, exits 2 naming it.",
        "",
        "| flag | env | default | meaning |",
        "|---|---|---|---|",
    ]
    for flag, _conv, default, help_ in _FLAGS:
        out.append(f"| `{flag}` | `{env_name(flag)}` | `{default}` | {help_} |")
    for name, default, help_ in _BOOLS:
        out.append(f"| `--[no-]{name}` | `{env_name('--' + name)}` | `{str(default).lower()}` | {help_} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(flags_markdown())
