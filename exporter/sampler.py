"""The sampler: one immutable Snapshot per ``--collect.interval``, built off the scrape path.

Pipeline per cycle: backend read (under a deadline) -> attribution -> analysis (boundness,
counters) -> probe scheduling -> publish.  A scrape only renders the newest Snapshot, so a hung
NVML call delays nothing but the snapshot's age.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Protocol

from exporter.analysis.boundness import busy_signal
from exporter.analysis.communication import CommunicationRefiner
from exporter.analysis.counters import ActivityIntegrator, EventCounter, LinkIntegrator, MonotonicCounter
from exporter.analysis.pod_class import pod_boundness
from exporter.analysis.sharing import sharing_mode
from exporter.backends.base import GpuBackend
from exporter.heap import HeapTrimmer
from exporter.model import (
    SIGNALS_GPM,
    SIGNALS_NVML,
    SIGNALS_PROCESSES,
    Attribution,
    BackendSample,
    GpmSample,
    GpuSample,
    LeafAnalysis,
    LeafSample,
    NetworkSample,
    PodBoundness,
    ProbeResult,
    Snapshot,
    StageResult,
    transfer_ratio,
)

log = logging.getLogger(__name__)

BACKEND_STAGE = "nvml"
"""Stage name of the GPU read (the simulator simulates NVML, so it reports the same stage)."""


class Attributor(Protocol):
    """Maps devices and processes to pods (exporter/attribution); must return in milliseconds."""

    def attribute(self, sample: BackendSample, now: float) -> tuple[Attribution, tuple[StageResult, ...]]: ...

    def close(self) -> None: ...


class Classifier(Protocol):
    """Boundness classifier (exporter/analysis/boundness.py)."""

    def observe(
        self,
        leaf_id: str,
        gpm: GpmSample | None,
        utilization_ratio: float | None,
        has_processes: bool,
        now: float,
        transfer: float | None = None,
        *,
        signals: str = SIGNALS_GPM,
        memory_utilization_ratio: float | None = None,
        power_ratio: float | None = None,
    ) -> str | None: ...

    def forget(self, keep: set[str]) -> None: ...


class NetworkSource(Protocol):
    """The node's RDMA NICs (exporter/network/stage.py): never blocks on I/O."""

    def observe(
        self, sample: BackendSample, attribution: Attribution | None, now: float | None = None
    ) -> tuple[NetworkSample | None, StageResult | None]: ...

    def start(self) -> None: ...

    def close(self) -> None: ...


class ProbeScheduler(Protocol):
    """Runs probes in child processes on its own schedule (exporter/probe_scheduler.py)."""

    def observe(self, snapshot: Snapshot) -> None: ...

    def results(self) -> tuple[tuple[ProbeResult, ...], Mapping[tuple[str, str], int]]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class SamplerOptions:
    """Timing of the sampling loop (seconds)."""

    interval_seconds: float = 1.0
    deadline_seconds: float = 5.0
    """How long one backend read may take before the cycle gives up on it."""


class Sampler:
    """Builds Snapshots in a background thread; ``latest()`` is what scrapes render."""

    def __init__(
        self,
        backend: GpuBackend,
        options: SamplerOptions | None = None,
        attributor: Attributor | None = None,
        classifier: Classifier | None = None,
        probes: ProbeScheduler | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        network: NetworkSource | None = None,
    ) -> None:
        self._backend = backend
        self._options = options or SamplerOptions()
        self._attributor = attributor
        self._classifier = classifier
        self._probes = probes
        self._network = network
        self._communication = CommunicationRefiner()
        self._clock = clock
        self._wall = wall
        self._latest: Snapshot | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # One daemon worker reads the backend; while a call hangs, no second one is started, and
        # a call hung inside the driver cannot hold up process exit.
        self._jobs: queue.SimpleQueue[Future[BackendSample] | None] = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._work, name="gpulens-backend", daemon=True)
        self._worker.start()
        self._pending: Future[BackendSample] | None = None
        self._integrals = ActivityIntegrator()
        self._analysed_at: float | None = None
        """``now`` of the last cycle that read the GPUs: a leaf without GPM integrates its busy ratio
        over the time since."""
        self._link_bytes = LinkIntegrator()
        self._energy = MonotonicCounter()
        self._xid: EventCounter[tuple[str, int]] = EventCounter()
        self._xid_last: dict[str, int] = {}
        self._nvml_errors: EventCounter[str] = EventCounter()
        self.heap = HeapTrimmer()
        self.after_publish: Callable[[Snapshot], None] | None = None
        """Called in the sampling thread with each new Snapshot once it is published (the
        exposition encodes it there, off the scrape path); an exception is logged, not raised."""
        self._died = False
        """Set by the sampling thread as an exception ends it (before ``on_exit``)."""
        self.on_exit: Callable[[], None] | None = None
        """Called in the sampling thread as it ends, stopped or dead (the process' main thread
        waits on it instead of polling ``running()``)."""

    # --- public -----------------------------------------------------------------------
    def latest(self) -> Snapshot | None:
        """The newest complete Snapshot, or ``None`` before the first cycle finished."""
        return self._latest

    def running(self) -> bool:
        """True while the sampling thread lives (False before ``start()``, after ``stop()``, and
        if the thread died: the process should then exit so that it is restarted)."""
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set() and not self._died

    def start(self) -> None:
        """Run cycles in a daemon thread until ``stop()``."""
        if self._thread is not None:
            return
        if self._network is not None:
            self._network.start()
        self._thread = threading.Thread(target=self._loop, name="gpulens-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 3.0) -> None:
        """Stop the loop and release the backend, attributor and probe children."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        for closer in (self._probes, self._attributor, self._network):
            if closer is not None:
                try:
                    closer.close()
                except Exception:
                    log.exception("close failed")
        self._jobs.put(None)
        if self._pending is None or self._pending.done():
            self._backend.close()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if not job.set_running_or_notify_cancel():
                continue
            try:
                job.set_result(self._backend.sample())
            except BaseException as exc:
                job.set_exception(exc)

    def run_once(self) -> Snapshot:
        """Run one whole cycle synchronously and publish its Snapshot (tests use this directly)."""
        stages: list[StageResult] = []
        sample = self._read_backend(stages)
        now = self._clock()

        attribution: Attribution | None = None
        if self._attributor is not None and sample.up:
            t0 = time.perf_counter()
            try:
                attribution, attr_stages = self._attributor.attribute(sample, now)
                stages.extend(attr_stages)
            except Exception:
                log.exception("attribution failed")
                stages.append(StageResult("attribution", False, time.perf_counter() - t0))

        network: NetworkSample | None = None
        if self._network is not None and sample.up:
            t0 = time.perf_counter()
            try:
                network, net_stage = self._network.observe(sample, attribution, now)
                if net_stage is not None:
                    stages.append(net_stage)
            except Exception:
                log.exception("network stage failed")
                stages.append(StageResult("nic", False, time.perf_counter() - t0))

        t0 = time.perf_counter()
        analysis: Mapping[str, LeafAnalysis] = MappingProxyType({})
        pod_classes: tuple[PodBoundness, ...] = ()
        try:
            leaves = self._analyse(sample, now, attribution)
            if self._classifier is not None:
                leaves = self._communication.refine(leaves, sample, attribution, network, now)
            analysis = MappingProxyType(leaves)
            pod_classes = pod_boundness(attribution, analysis)
            stages.append(StageResult("analysis", True, time.perf_counter() - t0))
        except Exception:
            log.exception("analysis failed")
            stages.append(StageResult("analysis", False, time.perf_counter() - t0))

        snapshot = Snapshot(
            timestamp=self._wall(),
            backend=sample,
            stages=tuple(stages),
            analysis=analysis,
            attribution=attribution,
            pod_boundness=pod_classes,
            xid_totals=MappingProxyType(self._xid.totals()),
            xid_last=MappingProxyType(dict(self._xid_last)),
            nvml_errors=MappingProxyType(self._nvml_errors.totals()),
            network=network,
        )
        snapshot = self._with_probes(snapshot)
        self._latest = snapshot
        return snapshot

    # --- stages -----------------------------------------------------------------------
    def _read_backend(self, stages: list[StageResult]) -> BackendSample:
        t0 = time.perf_counter()
        if self._pending is not None and not self._pending.done():
            # The previous call still hangs: do not pile up another one behind it.
            stages.append(StageResult(BACKEND_STAGE, False, time.perf_counter() - t0))
            return BackendSample(up=False, error="a backend call is still hanging")
        self._pending = Future()
        self._jobs.put(self._pending)
        try:
            sample = self._pending.result(timeout=self._options.deadline_seconds)
        except FutureTimeout:
            log.warning("backend read exceeded the %.1fs deadline", self._options.deadline_seconds)
            stages.append(StageResult(BACKEND_STAGE, False, time.perf_counter() - t0))
            return BackendSample(up=False, error="backend read exceeded the deadline")
        except Exception as exc:  # a backend bug must not kill the loop
            log.exception("backend read failed")
            stages.append(StageResult(BACKEND_STAGE, False, time.perf_counter() - t0))
            return BackendSample(up=False, error=f"backend raised {type(exc).__name__}")
        stages.append(StageResult(BACKEND_STAGE, sample.up, time.perf_counter() - t0))
        self._nvml_errors.add_all(sample.errors)
        return sample

    def _analyse(self, sample: BackendSample, now: float, attribution: Attribution | None) -> dict[str, LeafAnalysis]:
        out: dict[str, LeafAnalysis] = {}
        live_leaves: set[str] = set()
        live_gpus: set[str] = set()
        last = self._analysed_at
        cycle_seconds = now - last if last is not None and now > last else 0.0
        for gpu in sample.gpus:
            for xid in gpu.xid_events:
                self._xid.add((gpu.uuid, xid))
                self._xid_last[gpu.uuid] = xid
            if not gpu.up:
                continue
            live_gpus.add(gpu.uuid)
            energy = self._energy.update(gpu.uuid, gpu.energy_joules)
            for leaf in gpu.leaves:
                leaf_id = leaf.leaf_id
                live_leaves.add(leaf_id)
                gpm = leaf.gpm
                util = leaf.utilization_ratio
                if util is None and leaf.mig is None:
                    util = gpu.utilization_ratio
                transfer = transfer_ratio(leaf.links)
                signals = leaf_signals(leaf, sample.gpm_supported)
                # A GPM leaf without a window this cycle (its first, a failed read) has no busy ratio.
                busy = busy_signal(gpm, util, transfer) if gpm is not None or signals != SIGNALS_GPM else None
                sm = tensor = dram = busy_s = None
                if gpm is not None:
                    sm, tensor, dram, busy_s = self._integrals.add(
                        leaf_id, gpm.window_seconds, gpm.sm_active, gpm.tensor_active, gpm.dram_active, busy
                    )
                elif busy is not None:
                    # No GPM window: the busy ratio stands for the time since the previous cycle.
                    busy_s = self._integrals.add(leaf_id, cycle_seconds, None, None, None, busy)[3]
                boundness: str | None = None
                if self._classifier is not None:
                    whole = leaf.mig is None
                    boundness = self._classifier.observe(
                        leaf_id,
                        gpm,
                        util,
                        bool(leaf.processes),
                        now,
                        transfer,
                        signals=signals,
                        memory_utilization_ratio=gpu.memory_utilization_ratio if whole else None,
                        power_ratio=power_ratio(gpu) if whole else None,
                    )
                out[leaf_id] = LeafAnalysis(
                    leaf_id=leaf_id,
                    boundness=boundness,
                    signals=signals,
                    busy_ratio=busy,
                    busy_seconds=busy_s,
                    sharing_mode=sharing_mode(leaf, attribution),
                    sm_active_seconds=sm,
                    tensor_active_seconds=tensor,
                    dram_active_seconds=dram,
                    energy_joules=energy if leaf.mig is None else None,
                    link_bytes=self._link_bytes.add(leaf_id, leaf.links),
                    transfer_ratio=transfer,
                )
            if gpu.mig_mode == "enabled":
                # Physical energy still needs a home when every leaf is a MIG instance.
                out.setdefault(gpu.uuid, LeafAnalysis(leaf_id=gpu.uuid, energy_joules=energy))
        if sample.up:
            self._analysed_at = now
            self._integrals.forget(live_leaves)
            self._link_bytes.forget(live_leaves)
            self._energy.forget(live_gpus | {g.uuid for g in sample.gpus})
            if self._classifier is not None:
                self._classifier.forget(live_leaves)
        return out

    def _with_probes(self, snapshot: Snapshot) -> Snapshot:
        if self._probes is None:
            return snapshot
        t0 = time.perf_counter()
        try:
            self._probes.observe(snapshot)
            results, runs = self._probes.results()
        except Exception:
            log.exception("probe scheduling failed")
            stage = StageResult("probes", False, time.perf_counter() - t0)
            return replace(snapshot, stages=(*snapshot.stages, stage))
        stage = StageResult("probes", True, time.perf_counter() - t0)
        return replace(
            snapshot,
            stages=(*snapshot.stages, stage),
            probe_results=results,
            probe_runs=MappingProxyType(dict(runs)),
        )

    # --- loop -------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            self._cycle_forever()
        except BaseException:
            self._died = True
            log.critical("the sampling thread died; no new snapshots will be taken", exc_info=True)
            raise
        finally:
            if self.on_exit is not None:
                self.on_exit()

    def _cycle_forever(self) -> None:
        interval = self._options.interval_seconds
        next_at = self._clock()
        while not self._stop.is_set():
            try:
                snapshot = self.run_once()
                if self.after_publish is not None:
                    self.after_publish(snapshot)
            except Exception:
                log.exception("sampling cycle failed")
            self.heap.due(self._clock())  # after the first cycle, then every few minutes
            next_at += interval
            delay = next_at - self._clock()
            if delay < 0:
                # Fell behind (slow or hung backend): restart the grid instead of bursting.
                next_at = self._clock()
                delay = 0.0
            self._stop.wait(delay)


def leaf_signals(leaf: LeafSample, gpm_supported: bool | None) -> str:
    """The source a leaf's analysis has (``gpulens_gpu_analysis_info{signals}``): ``gpm`` when it has
    a GPM window or the backend says its GPUs give them (a cycle without one is a gap, not a
    change of source); otherwise ``nvml`` for a whole GPU and ``processes`` for a MIG instance."""
    if leaf.gpm is not None or gpm_supported is True:
        return SIGNALS_GPM
    return SIGNALS_NVML if leaf.mig is None else SIGNALS_PROCESSES


def power_ratio(gpu: GpuSample) -> float | None:
    """The GPU's power draw over its enforced power limit (0..1), ``None`` where either is unknown."""
    if gpu.power_watts is None or not gpu.power_limit_watts or gpu.power_limit_watts <= 0.0:
        return None
    return min(1.0, max(0.0, gpu.power_watts / gpu.power_limit_watts))
