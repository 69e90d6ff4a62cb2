"""Renders the newest Snapshot into fresh Prometheus metric families at scrape time.

No NVML here: a scrape is O(series).  One generic loop renders every catalogue entry
(exporter/render/metrics.py) inside its own guard, so a bug in one entry (a read that raises, label values
that do not match its label names) drops only that family (and flips
``gpulens_stage_success{stage="render_<family>"}``) instead of a whole section or an HTTP 500.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter import __version__
from exporter.model import Snapshot
from exporter.node_label import NODE_LABEL
from exporter.render import metrics as cat
from exporter.render.exposition import Encoder, Family, LabelSets
from exporter.render.gzip_stream import GzipHead, gzip_parts
from exporter.render.negotiate import OPENMETRICS_ACCEPT, OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, exposition_accept
from exporter.render.scopes import EXPORTER, Frame, LabelValues

log = logging.getLogger(__name__)


class LabelMismatch(ValueError):
    """A catalogue entry produced a sample whose label values do not match its label names."""


def _family(spec: cat.MetricSpec, constant: LabelValues = ()) -> GaugeMetricFamily | CounterMetricFamily:
    """An empty prometheus_client family of ``spec``, with the ``constant`` label names last."""
    if spec.type == "counter":
        return CounterMetricFamily(spec.name, spec.help, labels=[*spec.labels, *constant])
    return GaugeMetricFamily(spec.name, spec.help, labels=[*spec.labels, *constant])


def family_samples(
    spec: cat.MetricSpec, instances: Sequence[tuple[LabelValues, Any]]
) -> list[tuple[LabelValues, float]]:
    """The samples of ``spec`` over its scope's instances: full label values and the reading.

    Missing readings (``None``, NaN, infinities) are left out. Every sample's label values are
    checked against the entry's label names: prometheus_client would silently drop or truncate a
    mismatched sample, so a mismatch raises ``LabelMismatch`` naming the family (the caller drops
    that family alone)."""
    out: list[tuple[LabelValues, float]] = []
    width = len(spec.labels)
    if isinstance(spec.read, cat.OneSample):  # one sample per instance, no label: no tuple per sample
        one = spec.read.value
        for scope_values, view in instances:
            value = one(view)
            if value is None or (isinstance(value, float) and not math.isfinite(value)):
                continue
            if len(scope_values) != width:
                raise LabelMismatch(f"{spec.name}: label values {scope_values} do not match labels {spec.labels}")
            out.append((scope_values, float(value)))
        return out
    for scope_values, view in instances:
        for own_values, value in spec.read(view):
            if value is None or (isinstance(value, float) and not math.isfinite(value)):
                continue
            values = (*scope_values, *own_values) if own_values else scope_values
            if len(values) != width:
                raise LabelMismatch(f"{spec.name}: label values {values} do not match labels {spec.labels}")
            out.append((values, float(value)))
    return out


def render_family(spec: cat.MetricSpec, instances: Sequence[tuple[LabelValues, Any]]) -> Metric | None:
    """The prometheus_client family of ``spec`` over its scope's instances, or ``None`` when it
    has no sample (see ``family_samples``)."""
    return _as_family(spec, family_samples(spec, instances))


def _as_family(
    spec: cat.MetricSpec, samples: Sequence[tuple[LabelValues, float]], constant: Sequence[tuple[str, str]] = ()
) -> Metric | None:
    if not samples:
        return None
    names = tuple(name for name, _value in constant)
    values = tuple(value for _name, value in constant)
    fam = _family(spec, names)
    for own, value in samples:
        fam.add_metric((*own, *values), value)
    return fam


class RenderErrors:
    """Renders each family (or block) failed in, counted once per snapshot however many times that
    snapshot is rendered (both formats, several scrapes), and the failures of the latest snapshot
    rendered (what ``/readyz`` names).  Keys are catalogue names and render checks: bounded."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: dict[str, int] = {}
        self._snapshot: Snapshot | None = None
        self._counted: set[str] = set()

    def record(self, snap: Snapshot | None, failed: Sequence[str]) -> Mapping[str, int]:
        """Count ``failed`` for ``snap`` (each name once per snapshot); the totals so far."""
        with self._lock:
            if snap is not self._snapshot:
                self._snapshot, self._counted = snap, set()
            for name in failed:
                if name not in self._counted:
                    self._counted.add(name)
                    self._totals[name] = self._totals.get(name, 0) + 1
            return dict(self._totals)

    def latest(self) -> tuple[str, ...]:
        """The families (and blocks) that failed in the latest snapshot rendered, sorted."""
        with self._lock:
            return tuple(sorted(self._counted))


Check = Callable[[cat.MetricSpec, list[tuple[LabelValues, float]]], None]
"""Called with an entry and its samples inside the entry's guard (the encoder writing its text):
a check that raises drops that family as a failed read does."""


def collect_samples(
    catalogue: Sequence[cat.MetricSpec],
    frame: Frame,
    check: Check | None = None,
    errors: RenderErrors | None = None,
) -> list[tuple[cat.MetricSpec, list[tuple[LabelValues, float]]]]:
    """Every entry of ``catalogue`` with samples in ``frame``, in catalogue order, with its samples.

    One loop for every entry: its scope is walked (once per scope, shared by its entries) and the
    entry reads its samples from each instance, then ``check`` (when given) sees them.  An entry
    that raises in either drops only its own family, is logged, shows as
    ``gpulens_stage_success{stage="render_<name>"} 0`` and is counted in ``errors``
    (``gpulens_render_errors_total``); the exporter's own series are read last so they can report
    it."""
    found: dict[str, list[tuple[LabelValues, float]]] = {}
    walked: dict[str, list[tuple[LabelValues, Any]]] = {}
    failed: list[str] = []

    def one(spec: cat.MetricSpec, frame: Frame) -> None:
        try:
            instances = walked.get(spec.scope.name)
            if instances is None:
                instances = walked[spec.scope.name] = list(spec.scope.walk(frame))
            samples = family_samples(spec, instances)
            if samples and check is not None:
                check(spec, samples)
        except Exception:
            log.exception("rendering %s failed; only this family is dropped", spec.name)
            failed.append(spec.name)
            return
        if samples:
            found[spec.name] = samples

    for spec in catalogue:
        if spec.scope is not EXPORTER:
            one(spec, frame)
    failed_renders = (*frame.failed_renders, *failed)
    totals = errors.record(frame.snapshot, failed_renders) if errors is not None else frame.render_errors
    frame = replace(frame, failed_renders=failed_renders, render_errors=totals)
    before = len(failed)
    for spec in catalogue:
        if spec.scope is EXPORTER:
            one(spec, frame)
    if errors is not None and len(failed) > before:  # one of the exporter's own: counted for the next page
        errors.record(frame.snapshot, failed[before:])
    return [(spec, found[spec.name]) for spec in catalogue if spec.name in found]


class SnapshotCollector(Collector):
    """A prometheus_client collector over ``snapshot_source()`` (normally ``Sampler.latest``).

    ``describe()`` lists the catalogue so registering does not trigger a collection; every
    ``collect()`` builds new families (no state leaks between scrapes, gone pods simply vanish).
    Before the first snapshot only ``gpulens_up 0`` and the build info are exported.  Every family
    is an entry of ``catalogue`` (exporter/render/metrics.py), read by ``collect_samples``.  ``render_checks``
    (section -> whether that block rendered for the snapshot) report blocks rendered elsewhere,
    such as the DCGM-compatible series, in ``gpulens_stage_success{stage="render_<section>"}``.  With
    ``include_age=False`` the output depends only on the snapshot, so ``CachedExposition`` can
    reuse it between scrapes.  ``node`` (``exporter.node_label``), when not empty, is the ``node``
    label of every series.
    """

    def __init__(
        self,
        snapshot_source: Callable[[], Snapshot | None],
        version: str = __version__,
        backend: str = "",
        wall: Callable[[], float] = time.time,
        include_age: bool = True,
        render_checks: Mapping[str, Callable[[Snapshot], bool]] | None = None,
        catalogue: Sequence[cat.MetricSpec] = cat.CATALOGUE,
        label_rewrites: Callable[[], Mapping[str, int]] | None = None,
        node: str = "",
    ) -> None:
        self.constant_labels: tuple[tuple[str, str], ...] = ((NODE_LABEL, node),) if node else ()
        """Labels of every series this collector exports, after each family's own: the ``node``."""
        self._label_rewrites = label_rewrites
        self.render_errors = RenderErrors()
        """What failed to render, per family (``gpulens_render_errors_total``, ``/readyz``)."""
        self._include_age = include_age
        self._render_checks = dict(render_checks or {})
        self._source = snapshot_source
        self._version = version
        self._backend = backend
        self._wall = wall
        self._catalogue = tuple(catalogue)
        self._families = {spec.name: Family(spec.name, spec.type, spec.help, spec.labels) for spec in self._catalogue}
        self._encoder = Encoder(constant=self.constant_labels)

    def describe(self) -> Iterable[Metric]:
        """Empty families named after the catalogue (lets the registry check name clashes)."""
        names = tuple(name for name, _value in self.constant_labels)
        return [_family(spec, names) for spec in self._catalogue]

    def collect(self) -> Iterable[Metric]:
        """Render the newest snapshot as prometheus_client families."""
        constant = self.constant_labels
        return [fam for spec, samples in self._samples() if (fam := _as_family(spec, samples, constant)) is not None]

    def exposition(self, openmetrics: bool) -> str:
        """The newest snapshot as exposition text (what ``generate_latest`` writes for ``collect()``,
        without its per-sample label checks; see exporter/render/exposition.py).

        Each family is written inside its own guard (``collect_samples``' ``check``): one whose
        text cannot be written (a label value that is not valid UTF-8 got past
        exporter/label_values.py) is left out and reported like a family whose read failed,
        never the whole page."""
        encoder = self._encoder
        encoder.start(openmetrics)

        def write(spec: cat.MetricSpec, samples: list[tuple[LabelValues, float]]) -> None:
            encoder.add(self._families[spec.name], samples)

        found = self._samples(write)
        return encoder.finish(spec.name for spec, _samples in found)

    def _samples(self, check: Check | None = None) -> list[tuple[cat.MetricSpec, list[tuple[LabelValues, float]]]]:
        snap = self._source()
        rewrites = self._label_rewrites() if self._label_rewrites is not None else None
        frame = Frame(snap, self._version, self._backend, label_rewrites=rewrites)
        if snap is None:
            return collect_samples(self._catalogue, frame, check, self.render_errors)
        # Blocks rendered outside this collector (``--compat.dcgm``, see CachedExposition) report
        # their health here, like a family of the catalogue.
        failed: list[str] = []
        for section, rendered in self._render_checks.items():
            try:
                ok = rendered(snap)
            except Exception:
                log.exception("checking %s failed", section)
                ok = False
            if not ok:
                failed.append(section)
        now = self._wall() if self._include_age else None
        return collect_samples(
            self._catalogue, replace(frame, now=now, failed_renders=tuple(failed)), check, self.render_errors
        )


class CachedExposition:
    """Encodes each snapshot once per format and reuses the bytes until the next snapshot.

    A snapshot is immutable and changes once per interval, while Prometheus (HA pairs, several
    scrapers) may ask many times: only ``gpulens_snapshot_age_seconds`` differs between those
    scrapes, so it is appended per request.  ``collector`` must be built with
    ``include_age=False``.  ``tails`` add pre-encoded families after the collector's (called with
    the snapshot and whether the format is OpenMetrics), e.g. the DCGM-compatible block.
    """

    def __init__(
        self,
        collector: SnapshotCollector,
        snapshot_source: Callable[[], Snapshot | None],
        wall: Callable[[], float] = time.time,
        tails: Sequence[Callable[[Snapshot, bool], bytes]] = (),
    ) -> None:
        self._tails = tuple(tails)
        self._collector = collector
        self._constant_text = LabelSets(constant=collector.constant_labels).encode((), ())
        """The collector's constant labels (the ``node``) as the age line carries them."""
        self._source = snapshot_source
        self._wall = wall
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._bodies: dict[str, bytes] = {}
        self._gzipped: dict[str, GzipHead] = {}
        """Per format: the cached body's gzip stream up to the per-request tail."""
        self._asked: set[tuple[str, bool]] = set()
        """(format, gzip) pairs scrapes asked the current snapshot in (``prepare`` encodes the next
        in those)."""

    def failed_families(self) -> tuple[str, ...]:
        """The families (and blocks) left out of the latest snapshot's page because they failed to
        render (what ``/readyz`` names)."""
        return self._collector.render_errors.latest()

    def render(self, accept_header: str) -> tuple[bytes, str]:
        """(body, content type) for a scrape with this ``Accept`` header, as one bytes object."""
        parts, ctype = self.render_parts(accept_header)
        return b"".join(parts), ctype

    def render_parts(self, accept_header: str) -> tuple[tuple[bytes | memoryview, ...], str]:
        """(body in parts, content type) for a scrape with this ``Accept`` header.

        The header is first reduced to one of two canonical formats (exporter/render/negotiate.py), so
        the cache never holds more than one body per format whatever clients send.  The first
        part is a view of the cached body, shared by every reply in flight; only the few bytes of
        the age line are new per request (the HTTP front sends the parts without joining them, so
        a thousand unread replies do not hold a thousand copies of the page)."""
        reply = self.reply(accept_header, gzip=False, encode=True)
        assert reply is not None
        return reply

    def reply(self, accept_header: str, gzip: bool, encode: bool) -> tuple[tuple[bytes | memoryview, ...], str] | None:
        """``render_parts``, gzipped when ``gzip`` (one gzip stream: the cached head of the page's,
        finished per request with the age line); with ``encode`` False, ``None`` where the current
        snapshot is not yet encoded (and compressed) in that format, so that the caller can answer
        at once when it is and hand the work to another thread when not: then nothing is encoded,
        and the cache is taken as it is under one hold of its lock."""
        openmetrics = exposition_accept(accept_header) == OPENMETRICS_ACCEPT
        snap = self._source()
        ctype = OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE
        gz: GzipHead | None = None
        if encode:
            body, ctype = self._body(snap, openmetrics, asked=True, gzip=gzip)
            with self._lock:
                gz = self._gzipped.get(ctype) if gzip and snap is self._snapshot else None
        else:
            with self._lock:
                if snap is None or snap is not self._snapshot:
                    return None
                cached, gz = self._bodies.get(ctype), self._gzipped.get(ctype)
                if cached is None or (gzip and gz is None):
                    return None
                self._asked.add((ctype, gzip))
                body = cached
        if snap is None:
            return ((gzip_parts((body,)),) if gzip else (body,)), ctype
        head, tail = self._split_tail(body, self._age_tail(snap))
        if not gzip:
            return (head, tail), ctype
        if gz is None:  # the snapshot changed meanwhile: compress this one's page for this request
            gz = GzipHead(head)
        return (gz.head, gz.finish(tail)), ctype

    def prepare(self, snap: Snapshot) -> None:
        """Encode ``snap`` ahead of the scrapes, in the formats the previous snapshot was asked in.

        The sampler calls this right after it published ``snap`` (its thread, off the scrape path).
        Where a scraper asks at least once per interval, each snapshot is encoded once either way
        and scrapes never wait for an encoding; where scrapes are rarer (every 15-60 s), only the
        snapshot after each scrape is encoded ahead, once, and the scrape itself encodes its own."""
        with self._lock:
            if snap is self._snapshot:
                return
            wanted = sorted(self._asked)
        for ctype, gzip in wanted:
            self._body(snap, ctype == OPENMETRICS_CONTENT_TYPE, asked=False, gzip=gzip)

    def _body(self, snap: Snapshot | None, openmetrics: bool, asked: bool, gzip: bool = False) -> tuple[bytes, str]:
        """The cached body of ``snap`` in one format, encoded now if needed, and with ``gzip`` its
        compressed head too; ``asked``: for a scrape (what ``prepare`` goes by), not ahead of one."""
        ctype = OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE
        with self._lock:
            if snap is not self._snapshot or snap is None:
                self._snapshot = snap
                self._bodies = {}
                self._gzipped = {}
                self._asked = set()
            if asked:
                self._asked.add((ctype, gzip))
            body = self._bodies.get(ctype)
            if body is None:
                body = self._bodies[ctype] = self._encode(openmetrics, snap)
            if gzip and snap is not None and ctype not in self._gzipped:
                self._gzipped[ctype] = GzipHead(self._split_tail(body, b"")[0])
        return body, ctype

    def _encode(self, openmetrics: bool, snap: Snapshot | None) -> bytes:
        # The tails render first so the collector's gpulens_stage_success sees their health.
        extra = b"".join(tail(snap, openmetrics) for tail in self._tails) if snap is not None else b""
        return self._with_tail(self._collector.exposition(openmetrics).encode(), extra)

    @staticmethod
    def _with_tail(body: bytes, tail: bytes) -> bytes:
        eof = b"# EOF\n"
        if body.endswith(eof):
            return body[: -len(eof)] + tail + eof
        return body + tail

    @staticmethod
    def _split_tail(body: bytes, tail: bytes) -> tuple[bytes | memoryview, bytes]:
        """``_with_tail(body, tail)`` as parts, without copying ``body``."""
        eof = b"# EOF\n"
        if body.endswith(eof):
            return memoryview(body)[: -len(eof)], tail + eof
        return body, tail

    def _age_tail(self, snap: Snapshot) -> bytes:
        spec = cat.spec("gpulens_snapshot_age_seconds")
        age = max(0.0, self._wall() - snap.timestamp)
        labels = self._constant_text
        return f"# HELP {spec.name} {spec.help}\n# TYPE {spec.name} gauge\n{spec.name}{labels} {age!r}\n".encode()
