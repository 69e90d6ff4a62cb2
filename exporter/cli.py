"""``gpulens-exporter`` / ``python -m exporter``: wires backend -> sampler -> collector -> HTTP."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from types import FrameType
from typing import TYPE_CHECKING

from exporter import __version__, label_values
from exporter.backends.base import GpuBackend
from exporter.config import DEFAULT_PODRESOURCES_SOCKET, ExporterConfig, parse_config
from exporter.http.server import MetricsServer
from exporter.http.webconfig import WebConfigError, load_web_config
from exporter.model import Snapshot
from exporter.node_label import node_label_value
from exporter.render.collector import CachedExposition, SnapshotCollector
from exporter.sampler import Attributor, Classifier, ProbeScheduler, Sampler, SamplerOptions

if TYPE_CHECKING:
    from exporter.network.stage import NetworkStage
    from exporter.sim import Simulation

log = logging.getLogger("gpulens")


class _LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage().replace('"', "'")
        line = (
            f"ts={self.formatTime(record, '%Y-%m-%dT%H:%M:%S')} level={record.levelname.lower()} "
            f'logger={record.name} msg="{msg}"'
        )
        if record.exc_info:
            line += ' exc="' + self.formatException(record.exc_info).replace("\n", " | ") + '"'
        return line


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


STOP_BACKSTOP_SECONDS = 5.0
"""Longest wait of the main thread between checks that the sampling thread lives; a signal or
the thread's end wakes it at once."""


def setup_logging(fmt: str, level: str) -> None:
    """Structured logs on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if fmt == "json" else _LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel({"warn": logging.WARNING}.get(level, getattr(logging, level.upper(), logging.INFO)))


class NoGpuError(RuntimeError):
    """``--backend nvml`` (the default) and NVML cannot be used: the process must not serve."""


def open_gpus(cfg: ExporterConfig) -> tuple[GpuBackend, Simulation | None]:
    """The configured backend, and the simulated node when it is simulated (the one place that
    chooses simulation): ``nvml`` fails loudly without a working driver, ``sim`` is the simulated
    fleet, ``auto`` (demos only) takes NVML when a driver loads, else the simulator."""
    if cfg.backend in ("nvml", "auto"):
        from exporter.backends.nvml.backend import NvmlBackend

        nvml = NvmlBackend(gpm=cfg.collect_gpm)
        probe = nvml.sample()
        if probe.up:
            return nvml, None
        nvml.close()
        if cfg.backend == "nvml":
            # Never serve fake or empty data in production: the kubelet shows the crash loop and
            # restarts the pod, which is the retry once the driver is there.
            raise NoGpuError(
                f"--backend nvml: cannot read the GPUs ({probe.error}); check that the NVIDIA driver "
                "is mounted (NVIDIA runtime, NVIDIA_VISIBLE_DEVICES=all). --backend sim serves a "
                "simulated fleet on purpose."
            )
        log.warning("no NVIDIA driver answered (%s): serving the SIMULATED fleet", probe.error)
    from exporter.sim import Simulation

    simulation = Simulation.create(cfg.sim_scenario, seed=cfg.sim_seed, faults=cfg.sim_faults, gpm=cfg.collect_gpm)
    return simulation.backend, simulation


def make_backend(cfg: ExporterConfig) -> GpuBackend:
    """The configured backend alone (see ``open_gpus``)."""
    return open_gpus(cfg)[0]


def make_classifier(cfg: ExporterConfig) -> Classifier:
    """Boundness classifier over ``--analysis.window``."""
    from exporter.analysis.boundness import BoundnessClassifier

    return BoundnessClassifier(window_seconds=cfg.analysis_window)


def make_attributor(
    cfg: ExporterConfig, simulation: Simulation | None, network: NetworkStage | None = None
) -> Attributor:
    """Pod attribution from the kubelet, the API and /proc; the simulated node's own pods with the
    simulator, unless a kubelet socket other than the default was given.  ``network``'s NICs tell
    claimed NICs from claimed devices left out."""
    socket: str | None = cfg.podresources_socket or None
    nic_ids = network.source.ids if network is not None else None
    if simulation is not None and socket in (None, DEFAULT_PODRESOURCES_SOCKET):
        return simulation.attributor(nic_ids)
    from exporter.attribution.pipeline import AttributionOptions, build_attributor

    options = AttributionOptions(
        podresources_socket=socket,
        node_name=cfg.node_name or None,
        kube_api=cfg.kube_api,
        kube_owner_chain=cfg.kube_owner_chain,
        kube_resource_slices=cfg.kube_resource_slices,
        procfs=cfg.procfs,
        refresh_seconds=cfg.kube_refresh_interval,
        max_pods=cfg.kube_max_pods,
        max_allocations=cfg.kube_max_allocations,
    )
    return build_attributor(options, nic_ids)


def make_probes(cfg: ExporterConfig, simulation: Simulation | None) -> ProbeScheduler | None:
    """Probe scheduler (simulated probe results with the simulator), or None when disabled."""
    if not cfg.probes:
        return None
    from exporter.probe_scheduler import ProbeOptions, ProbeScheduler

    options = ProbeOptions(
        enabled=True,
        interval_seconds=cfg.probes_interval,
        timeout_seconds=cfg.probes_timeout,
        max_utilization_ratio=cfg.probes_max_utilization,
        min_free_memory_bytes=cfg.probes_min_free_memory,
        skip_allocated=cfg.probes_skip_allocated,
    )
    if simulation is None:
        return ProbeScheduler(options)
    options = replace(options, first_delay_seconds=simulation.probe_first_delay_seconds)
    return ProbeScheduler(options, runner=simulation.probe_runner())


def make_network(cfg: ExporterConfig, simulation: Simulation | None) -> NetworkStage | None:
    """The NIC source over ``--path.sysfs`` (the simulated node's own tree with the simulator: a
    simulated node never reads this host's NICs), or None when off or the node has none to show."""
    if not cfg.collect_nic:
        return None
    sysfs, procfs = cfg.sysfs, cfg.procfs
    if simulation is not None:
        roots = simulation.backend.network_roots()
        if roots is None:
            return None
        sysfs, procfs = roots
    from exporter.network.source import NicSource
    from exporter.network.stage import NetworkStage

    return NetworkStage(
        NicSource(
            sysfs,
            procfs,
            interval_seconds=cfg.collect_interval,
            max_devices=cfg.nic_max_devices,
            max_counters=cfg.nic_max_counters,
        )
    )


def build(cfg: ExporterConfig) -> tuple[Sampler, CachedExposition, GpuBackend]:
    """Wire the pipeline without starting threads (tests use this).  Every series is labelled with
    this node's name (``exporter.node_label``): the API watch, if any, reads ``cfg.node_name`` alone."""
    backend, simulation = open_gpus(cfg)
    network = make_network(cfg, simulation)
    sampler = Sampler(
        backend,
        SamplerOptions(interval_seconds=cfg.collect_interval, deadline_seconds=cfg.collect_deadline),
        attributor=make_attributor(cfg, simulation, network),
        classifier=make_classifier(cfg),
        probes=make_probes(cfg, simulation),
        network=network,
    )
    checks: dict[str, Callable[[Snapshot], bool]] = {}
    tails: list[Callable[[Snapshot, bool], bytes]] = []
    node = node_label_value(cfg.node_name, cfg.sim_scenario if simulation is not None else "")
    if cfg.compat_dcgm:
        from exporter.render.compat_dcgm import DcgmCompatRenderer, default_hostname

        compat = DcgmCompatRenderer(default_hostname(cfg.node_name), node)
        checks["compat_dcgm"] = compat.ok
        tails.append(compat.text)
    collector = SnapshotCollector(
        sampler.latest,
        version=__version__,
        backend=backend.name,
        include_age=False,
        render_checks=checks,
        label_rewrites=label_values.rewritten,
        node=node,
    )
    exposition = CachedExposition(collector, sampler.latest, tails=tails)
    sampler.after_publish = exposition.prepare
    return sampler, exposition, backend


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT; exit 2 on a bad flag, 1 if the port cannot be bound or the
    sampling thread dies."""
    cfg = parse_config(argv)
    setup_logging(cfg.log_format, cfg.log_level)
    web_config = None
    if cfg.web_config_file:
        try:
            web_config = load_web_config(cfg.web_config_file)
        except WebConfigError as exc:
            sys.stderr.write(f"gpulens-exporter: error: {exc}\n")
            return 2
    try:
        sampler, exposition, backend = build(cfg)
    except ValueError as exc:  # e.g. unknown scenario or fault spec
        sys.stderr.write(f"gpulens-exporter: error: {exc}\n")
        return 2
    except NoGpuError as exc:
        sys.stderr.write(f"gpulens-exporter: error: {exc}\n")
        return 1
    try:
        server = MetricsServer(
            cfg.listen_address,
            exposition.render_parts,
            ready=lambda: sampler.latest() is not None and sampler.running(),
            degraded=exposition.failed_families,
            web_config=web_config,
            reply=exposition.reply,
        )
    except OSError as exc:
        sys.stderr.write(f"gpulens-exporter: error: --web.listen-address {cfg.listen_address}: {exc}\n")
        backend.close()
        return 1
    stop = threading.Event()

    signalled = threading.Event()

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received signal %d, shutting down", signum)
        signalled.set()
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    sampler.on_exit = stop.set  # a dead sampling thread wakes the wait below
    sampler.start()
    server.start()
    log.info("serving on %s (backend=%s, interval=%.3gs)", cfg.listen_address, backend.name, cfg.collect_interval)
    status = 0
    # Woken by a signal or the sampler's end alone: a timed poll cost CPU every second, idle or not
    # (figure: docs/benchmarks.md, "Figures moved out of docstrings").
    # The timeout is a backstop only (a signal handler runs between the main thread's waits).
    while not stop.wait(STOP_BACKSTOP_SECONDS) and sampler.running():
        pass
    if not sampler.running() and not signalled.is_set():  # /readyz already says 503; exit so the kubelet restarts us
        log.error("the sampling thread is gone: exiting with status 1")
        status = 1
    t0 = time.monotonic()
    server.shutdown()
    sampler.stop(timeout=3.0)
    log.info("stopped in %.2fs", time.monotonic() - t0)
    return status
