"""Renders the newest Snapshot into fresh Prometheus metric families at scrape time.

No NVML here: a scrape is O(series).  Each section renders inside its own guard, so a bug in one
drops only that section's series (and flips ``gpulens_stage_success{stage="render_<section>"}``)
instead of turning the scrape into an HTTP 500.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from exporter import metrics as cat
from exporter.model import BOUNDNESS_CLASSES, POD_BOUNDNESS_CLASSES, GpuSample, LeafSample, Snapshot
from exporter.negotiate import exposition_accept

log = logging.getLogger(__name__)

Families = dict[str, Any]


def _family(name: str) -> Any:
    spec = cat.spec(name)
    if spec.type == "counter":
        return CounterMetricFamily(name, spec.help, labels=list(spec.labels))
    return GaugeMetricFamily(name, spec.help, labels=list(spec.labels))


def _ok(value: float | None) -> bool:
    return value is not None and not (isinstance(value, float) and not math.isfinite(value))


class _Families:
    """Lazily created families of one scrape, emitted in catalogue order."""

    def __init__(self) -> None:
        self._by_name: dict[str, Any] = {}

    def add(self, name: str, labels: Iterable[str], value: float | None) -> None:
        if not _ok(value):
            return
        fam = self._by_name.get(name)
        if fam is None:
            fam = self._by_name[name] = _family(name)
        fam.add_metric(list(labels), float(value))  # type: ignore[arg-type]

    def emit(self) -> Iterator[Metric]:
        for spec in cat.CATALOGUE:
            fam = self._by_name.get(spec.name)
            if fam is not None:
                yield fam


def _gpu_labels(gpu: GpuSample) -> tuple[str, str]:
    return (str(gpu.index), gpu.uuid)


def _leaf_labels(gpu: GpuSample, leaf: LeafSample) -> tuple[str, ...]:
    mig = leaf.mig
    if mig is None:
        return (str(gpu.index), gpu.uuid, "", "", "", "")
    return (
        str(gpu.index),
        gpu.uuid,
        mig.mig_uuid,
        str(mig.gpu_instance_id),
        str(mig.compute_instance_id),
        mig.profile,
    )


def _render_self(snap: Snapshot, f: _Families, now: float | None, version: str, backend: str) -> None:
    f.add("gpulens_up", (), 1.0 if snap.backend.up else 0.0)
    f.add("gpulens_build_info", (version, backend), 1.0)
    if now is not None:
        f.add("gpulens_snapshot_age_seconds", (), max(0.0, now - snap.timestamp))
    for code, n in sorted(snap.nvml_errors.items()):
        f.add("gpulens_nvml_errors_total", (str(code),), float(n))


def _render_stages(snap: Snapshot, f: _Families, render_failures: dict[str, bool]) -> None:
    seen: set[str] = set()
    for st in snap.stages:
        if st.stage in seen:
            continue
        seen.add(st.stage)
        f.add("gpulens_stage_success", (st.stage,), 1.0 if st.success else 0.0)
        f.add("gpulens_stage_duration_seconds", (st.stage,), st.duration_seconds)
    for section, failed in sorted(render_failures.items()):
        f.add("gpulens_stage_success", (f"render_{section}",), 0.0 if failed else 1.0)


def _render_devices(snap: Snapshot, f: _Families) -> None:
    driver = snap.backend.driver_version or ""
    for gpu in snap.backend.gpus:
        g = _gpu_labels(gpu)
        f.add("gpulens_gpu_up", g, 1.0 if gpu.up else 0.0)
        if not gpu.up:
            continue
        f.add(
            "gpulens_gpu_info",
            (
                *g,
                gpu.name or "",
                gpu.pci_bus_id or "",
                driver,
                gpu.compute_capability or "",
                gpu.mig_mode or "",
            ),
            1.0,
        )
        f.add("gpulens_gpu_utilization_ratio", g, gpu.utilization_ratio)
        f.add("gpulens_gpu_memory_utilization_ratio", g, gpu.memory_utilization_ratio)
        f.add("gpulens_gpu_power_watts", g, gpu.power_watts)
        f.add("gpulens_gpu_power_limit_watts", g, gpu.power_limit_watts)
        energy = snap.analysis.get(gpu.uuid)
        if energy is not None:
            f.add("gpulens_gpu_energy_joules_total", g, energy.energy_joules)
        f.add("gpulens_gpu_temperature_celsius", g, gpu.temperature_celsius)
        f.add("gpulens_gpu_memory_temperature_celsius", g, gpu.memory_temperature_celsius)
        f.add("gpulens_gpu_fan_speed_ratio", g, gpu.fan_speed_ratio)
        f.add("gpulens_gpu_sm_clock_hertz", g, gpu.sm_clock_hertz)
        f.add("gpulens_gpu_sm_clock_max_hertz", g, gpu.sm_clock_max_hertz)
        f.add("gpulens_gpu_memory_clock_hertz", g, gpu.memory_clock_hertz)
        for reason, active in sorted((gpu.clock_events or {}).items()):
            f.add("gpulens_gpu_clock_event_active", (*g, reason), 1.0 if active else 0.0)
        f.add("gpulens_gpu_pcie_tx_bytes_per_second", g, gpu.pcie_tx_bytes_per_second)
        f.add("gpulens_gpu_pcie_rx_bytes_per_second", g, gpu.pcie_rx_bytes_per_second)
        f.add("gpulens_gpu_pcie_link_generation", g, gpu.pcie_link_generation)
        f.add("gpulens_gpu_pcie_link_width", g, gpu.pcie_link_width)
        f.add("gpulens_gpu_pcie_replay_errors_total", g, gpu.pcie_replay_errors)
        f.add("gpulens_gpu_nvlink_tx_bytes_per_second", g, gpu.nvlink_tx_bytes_per_second)
        f.add("gpulens_gpu_nvlink_rx_bytes_per_second", g, gpu.nvlink_rx_bytes_per_second)
        for severity, n in sorted((gpu.ecc_errors or {}).items()):
            f.add("gpulens_gpu_ecc_errors_total", (*g, severity), n)
        rows = gpu.remapped_rows or {}
        for cause in ("correctable", "uncorrectable"):
            f.add("gpulens_gpu_remapped_rows", (*g, cause), rows.get(cause))
        f.add("gpulens_gpu_row_remap_pending", g, rows.get("pending"))
        f.add("gpulens_gpu_row_remap_failure", g, rows.get("failure"))
        for leaf in gpu.leaves:
            _render_leaf(snap, gpu, leaf, f)
    index_of = {g.uuid: str(g.index) for g in snap.backend.gpus}
    for (uuid, xid), n in sorted(snap.xid_totals.items()):
        f.add("gpulens_gpu_xid_errors_total", (index_of.get(uuid, ""), uuid, str(xid)), float(n))


def _render_leaf(snap: Snapshot, gpu: GpuSample, leaf: LeafSample, f: _Families) -> None:
    lab = _leaf_labels(gpu, leaf)
    if leaf.mig is not None:
        f.add("gpulens_mig_instance_info", lab, 1.0)
    f.add("gpulens_gpu_memory_used_bytes", lab, leaf.memory_used_bytes)
    f.add("gpulens_gpu_memory_total_bytes", lab, leaf.memory_total_bytes)
    f.add("gpulens_gpu_compute_processes", lab, float(len(leaf.tenants)))
    gpm = leaf.gpm
    if gpm is not None:
        f.add("gpulens_gpu_sm_active_ratio", lab, gpm.sm_active)
        f.add("gpulens_gpu_sm_occupancy_ratio", lab, gpm.sm_occupancy)
        f.add("gpulens_gpu_tensor_active_ratio", lab, gpm.tensor_active)
        f.add("gpulens_gpu_fp64_active_ratio", lab, gpm.fp64_active)
        f.add("gpulens_gpu_fp32_active_ratio", lab, gpm.fp32_active)
        f.add("gpulens_gpu_fp16_active_ratio", lab, gpm.fp16_active)
        f.add("gpulens_gpu_dram_active_ratio", lab, gpm.dram_active)
        f.add("gpulens_gpu_pipe_active_max_ratio", lab, gpm.max_pipe_active())
    analysis = snap.analysis.get(leaf.leaf_id)
    if analysis is None:
        return
    f.add("gpulens_gpu_busy_ratio", lab, analysis.busy_ratio)
    f.add("gpulens_gpu_busy_seconds_total", lab, analysis.busy_seconds)
    f.add("gpulens_gpu_sm_active_seconds_total", lab, analysis.sm_active_seconds)
    f.add("gpulens_gpu_tensor_active_seconds_total", lab, analysis.tensor_active_seconds)
    f.add("gpulens_gpu_dram_active_seconds_total", lab, analysis.dram_active_seconds)
    f.add("gpulens_gpu_analysis_info", (*lab, analysis.signals), 1.0)
    if analysis.sharing_mode is not None:
        f.add("gpulens_gpu_sharing_info", (*lab, analysis.sharing_mode), 1.0)
    if analysis.boundness is not None:
        for cls in BOUNDNESS_CLASSES:
            f.add("gpulens_gpu_boundness", (*lab, cls), 1.0 if cls == analysis.boundness else 0.0)


def _render_attribution(snap: Snapshot, f: _Families) -> None:
    attr = snap.attribution
    if attr is None:
        return
    for a in attr.allocations:
        p = a.pod
        f.add(
            "gpulens_pod_gpu_allocation",
            (
                p.namespace,
                p.pod,
                p.container,
                a.uuid,
                a.mig_uuid or "",
                a.replica or "",
                a.resource,
                p.workload_kind or "",
                p.workload or "",
            ),
            1.0,
        )
    for u in attr.usages:
        lab = (u.pod.namespace, u.pod.pod, u.pod.container, u.uuid)
        f.add("gpulens_pod_gpu_memory_used_bytes", lab, u.memory_used_bytes)
        f.add("gpulens_pod_gpu_sm_share_ratio", lab, u.sm_share_ratio)
    for pb in snap.pod_boundness:
        p = pb.pod
        for cls in POD_BOUNDNESS_CLASSES:
            cls_lab = (p.namespace, p.pod, p.container, pb.uuid, pb.mig_uuid or "", cls)
            f.add("gpulens_pod_gpu_boundness", cls_lab, 1.0 if cls == pb.boundness else 0.0)
    for uuid, n in sorted(attr.sharing_replicas.items()):
        f.add("gpulens_gpu_sharing_replicas", (uuid,), float(n))
    for uuid, n in sorted(attr.sharing_pods.items()):
        f.add("gpulens_gpu_sharing_pods", (uuid,), float(n))
    for reason, n in sorted(attr.unmapped_devices.items()):
        f.add("gpulens_unmapped_devices_total", (reason,), float(n))
    f.add("gpulens_pod_gpu_allocation_conflicts", (), float(attr.allocation_conflicts))
    f.add("gpulens_podresources_last_success_timestamp_seconds", (), attr.podresources_last_success_timestamp)


def _render_probes(snap: Snapshot, f: _Families) -> None:
    # Probe results are keyed by the probed leaf's own UUID (the MIG UUID for an instance); the
    # series carry the leaf labels every other leaf series has: gpu, the parent uuid, mig_uuid...
    # A leaf the backend no longer lists keeps its UUID as uuid (its other labels empty).
    leaves: dict[str, tuple[str, ...]] = {}
    for gpu in snap.backend.gpus:
        for leaf in gpu.leaves:
            leaves[leaf.mig.mig_uuid if leaf.mig is not None else gpu.uuid] = _leaf_labels(gpu, leaf)
        leaves.setdefault(gpu.uuid, (str(gpu.index), gpu.uuid, "", "", "", ""))
    for r in snap.probe_results:
        lab = (*leaves.get(r.uuid, ("", r.uuid, "", "", "", "")), r.probe)
        f.add("gpulens_probe_bandwidth_bytes_per_second", lab, r.bandwidth_bytes_per_second)
        f.add("gpulens_probe_efficiency_ratio", lab, r.efficiency_ratio)
        f.add("gpulens_probe_last_success_timestamp_seconds", lab, r.last_success_timestamp)
    for (uuid, result), n in sorted(snap.probe_runs.items()):
        f.add("gpulens_probe_runs_total", (*leaves.get(uuid, ("", uuid, "", "", "", "")), result), float(n))


class SnapshotCollector(Collector):
    """A prometheus_client collector over ``snapshot_source()`` (normally ``Sampler.latest``).

    ``describe()`` lists the catalogue so registering does not trigger a collection; every
    ``collect()`` builds new families (no state leaks between scrapes, gone pods simply vanish).
    Before the first snapshot only ``gpulens_up 0`` is exported.  ``render_checks`` (section ->
    whether that block rendered for the snapshot) report blocks rendered elsewhere, such as the
    DCGM-compatible series, in ``gpulens_stage_success{stage="render_<section>"}``.  With
    ``include_age=False`` the output depends only on the snapshot, so ``CachedExposition`` can
    reuse it between scrapes.
    """

    def __init__(
        self,
        snapshot_source: Callable[[], Snapshot | None],
        version: str = "0.1.0",
        backend: str = "",
        wall: Callable[[], float] = time.time,
        extra_families: Callable[[Snapshot, _Families], None] | None = None,
        include_age: bool = True,
        render_checks: Mapping[str, Callable[[Snapshot], bool]] | None = None,
    ) -> None:
        self._include_age = include_age
        self._render_checks = dict(render_checks or {})
        self._source = snapshot_source
        self._version = version
        self._backend = backend
        self._wall = wall
        self._extra = extra_families

    def describe(self) -> Iterable[Metric]:
        """Empty families named after the catalogue (lets the registry check name clashes)."""
        return [_family(spec.name) for spec in cat.CATALOGUE]

    def collect(self) -> Iterable[Metric]:
        """Render the newest snapshot."""
        snap = self._source()
        f = _Families()
        if snap is None:
            f.add("gpulens_up", (), 0.0)
            f.add("gpulens_build_info", (self._version, self._backend), 1.0)
            return list(f.emit())
        now = self._wall() if self._include_age else None
        failures: dict[str, bool] = {}
        sections: list[tuple[str, Callable[[], None]]] = [
            ("devices", lambda: _render_devices(snap, f)),
            ("attribution", lambda: _render_attribution(snap, f)),
            ("probes", lambda: _render_probes(snap, f)),
        ]
        if self._extra is not None:
            extra = self._extra
            sections.append(("extra", lambda: extra(snap, f)))
        for section, render in sections:
            try:
                render()
            except Exception:
                log.exception("rendering %s failed", section)
                failures[section] = True
        # Blocks rendered outside this collector (``--compat.dcgm``, see CachedExposition) report
        # their health here, like a section.
        for section, check in self._render_checks.items():
            try:
                failures[section] = not check(snap)
            except Exception:
                log.exception("checking %s failed", section)
                failures[section] = True
        _render_self(snap, f, now, self._version, self._backend)
        _render_stages(snap, f, {k: v for k, v in failures.items() if v})
        return list(f.emit())


class CachedExposition:
    """Encodes each snapshot once per format and reuses the bytes until the next snapshot.

    A snapshot is immutable and changes once per interval, while Prometheus (HA pairs, several
    scrapers) may ask many times: only ``gpulens_snapshot_age_seconds`` differs between those
    scrapes, so it is appended per request.  ``registry`` must hold a ``SnapshotCollector`` with
    ``include_age=False``.  ``tails`` add pre-encoded families after the registry's (called with the
    snapshot and whether the format is OpenMetrics), e.g. the DCGM-compatible block.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        snapshot_source: Callable[[], Snapshot | None],
        wall: Callable[[], float] = time.time,
        tails: Sequence[Callable[[Snapshot, bool], bytes]] = (),
    ) -> None:
        self._tails = tuple(tails)
        self._registry = registry
        self._source = snapshot_source
        self._wall = wall
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._bodies: dict[str, bytes] = {}

    def render(self, accept_header: str) -> tuple[bytes, str]:
        """(body, content type) for a scrape with this ``Accept`` header.

        The header is first reduced to one of two canonical formats (exporter/negotiate.py), so
        the cache never holds more than one body per format whatever clients send."""
        encoder, ctype = choose_encoder(exposition_accept(accept_header))
        snap = self._source()
        with self._lock:
            if snap is not self._snapshot or snap is None:
                self._snapshot = snap
                self._bodies = {}
            body = self._bodies.get(ctype)
            if body is None:
                body = self._bodies[ctype] = self._encode(encoder, ctype, snap)
        if snap is None:
            return body, ctype
        return self._with_tail(body, self._age_tail(snap)), ctype

    def _encode(self, encoder: Callable[[CollectorRegistry], bytes], ctype: str, snap: Snapshot | None) -> bytes:
        openmetrics = ctype.startswith("application/openmetrics-text")
        # The tails render first so the registry's gpulens_stage_success sees their health.
        extra = b"".join(tail(snap, openmetrics) for tail in self._tails) if snap is not None else b""
        return self._with_tail(encoder(self._registry), extra)

    @staticmethod
    def _with_tail(body: bytes, tail: bytes) -> bytes:
        eof = b"# EOF\n"
        if body.endswith(eof):
            return body[: -len(eof)] + tail + eof
        return body + tail

    def _age_tail(self, snap: Snapshot) -> bytes:
        spec = cat.spec("gpulens_snapshot_age_seconds")
        age = max(0.0, self._wall() - snap.timestamp)
        return f"# HELP {spec.name} {spec.help}\n# TYPE {spec.name} gauge\n{spec.name} {age!r}\n".encode()
