"""Load and soak of the exporter's HTTP path: the harness bench/load_soak.py runs at full counts
and tests/test_load_soak.py at reduced ones.

Load: N client threads scrape a separate exporter process (8 GPUs x 7 MIG, ~200 processes) as
fast as they can for S seconds; reports errors and latency percentiles.  Soak: one process runs
the sampler, the HTTP server and a scraper; every cycle new pods appear and old ones go, one GPU
flaps lost/found, and the exporter is scraped; reports RSS and open-FD growth after a warm-up of
3,000 scrapes (RSS rises ~5 MB over the first ~2,500 while glibc caches the stacks of the
per-connection threads, then stays flat: measured every 2,500 scrapes up to 15,000).
"""

from __future__ import annotations

import http.client
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from exporter.attribution import stages
from exporter.model import Allocation, Attribution, BackendSample, PodRef, PodUsage, StageResult
from tests.support.process import managed_process
from tests.support.procstat import open_fds, rss_bytes


@dataclass
class LoadResult:
    """Outcome of a load run."""

    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    per_second: float


def _scrape(conn: http.client.HTTPConnection) -> int:
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    resp.read()
    return resp.status


def load(host: str, port: int, concurrency: int, seconds: float) -> LoadResult:
    """``concurrency`` keep-alive clients scraping for ``seconds``."""
    stop = time.monotonic() + seconds
    lat: list[float] = []
    errors = [0]
    lock = threading.Lock()

    def client() -> None:
        conn = http.client.HTTPConnection(host, port, timeout=10)
        mine: list[float] = []
        bad = 0
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            try:
                if _scrape(conn) != 200:
                    bad += 1
            except (OSError, http.client.HTTPException):
                bad += 1
                conn.close()
                conn = http.client.HTTPConnection(host, port, timeout=10)
                continue
            mine.append(time.perf_counter() - t0)
        conn.close()
        with lock:
            lat.extend(mine)
            errors[0] += bad

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
    elapsed = time.monotonic() - t0
    lat.sort()
    if not lat:
        return LoadResult(0, errors[0], 0, 0, 0, 0)
    return LoadResult(
        requests=len(lat),
        errors=errors[0],
        p50_ms=statistics.median(lat) * 1e3,
        p99_ms=lat[max(0, int(len(lat) * 0.99) - 1)] * 1e3,
        max_ms=lat[-1] * 1e3,
        per_second=len(lat) / elapsed,
    )


@contextmanager
def sim_exporter(port: int, scenario: str = "mig7x8") -> Iterator[subprocess.Popen[bytes]]:
    """A sim exporter process on 127.0.0.1:port for the ``with`` block, ready."""
    argv = [sys.executable, "-m", "exporter", "--backend", "sim", "--sim.scenario", scenario,
            "--web.listen-address", f"127.0.0.1:{port}"]  # fmt: skip
    with managed_process(argv, f"http://127.0.0.1:{port}/readyz", timeout=30) as proc:
        yield proc


class ChurningAttributor:
    """Every cycle a new generation of pods holds the GPUs; the previous generation is gone."""

    def __init__(self) -> None:
        self.generation = 0

    def attribute(self, sample: BackendSample, now: float) -> tuple[Attribution, tuple[StageResult, ...]]:
        self.generation += 1
        allocations = []
        usages = []
        for gpu in sample.gpus:
            pod = PodRef("soak", f"job-{self.generation}-{gpu.index}", "main", workload_kind="Job", workload="soak")
            allocations.append(Allocation(pod=pod, resource="nvidia.com/gpu", uuid=gpu.uuid))
            usages.append(PodUsage(pod=pod, uuid=gpu.uuid, memory_used_bytes=1 << 30, kernel_time_ratio=0.5))
        return Attribution(allocations=tuple(allocations), usages=tuple(usages)), (
            StageResult(stages.PODRESOURCES, True, 0.0),
        )

    def close(self) -> None:
        """Nothing to release."""


@dataclass
class SoakResult:
    """RSS and FD figures of a soak."""

    scrapes: int
    rss_start_mb: float
    rss_end_mb: float
    fds_start: int
    fds_end: int
    errors: int


def soak(scrapes: int, warmup: int = 3000) -> SoakResult:
    """In one process: sampler + HTTP server + scraper; pods churn every cycle and GPU 3 flaps."""
    import os

    from exporter.cli import make_classifier
    from exporter.config import parse_config
    from exporter.http.server import MetricsServer
    from exporter.render.collector import CachedExposition, SnapshotCollector
    from exporter.sampler import Sampler
    from exporter.sim import SimFaults, SimulatedBackend

    faults = SimFaults()
    cfg = parse_config(["--backend", "sim"], env={})
    sampler = Sampler(
        SimulatedBackend("mig7x8", seed=1, faults=faults),
        attributor=ChurningAttributor(),
        classifier=make_classifier(cfg),
    )
    collector = SnapshotCollector(sampler.latest, include_age=False)
    server = MetricsServer("127.0.0.1:0", CachedExposition(collector, sampler.latest).render, ready=lambda: True)
    server.start()
    pid = os.getpid()
    errors = 0
    rss0 = fds0 = 0
    try:
        for i in range(warmup + scrapes):
            if i == warmup:
                rss0, fds0 = rss_bytes(pid), open_fds(pid)
            if i % 2 == 0:
                faults.lost = {3} if (i // 50) % 2 else set()
                sampler.run_once()
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            try:
                if _scrape(conn) != 200:
                    errors += 1
            except (OSError, http.client.HTTPException):
                errors += 1
            finally:
                conn.close()
        return SoakResult(scrapes, rss0 / 2**20, rss_bytes(pid) / 2**20, fds0, open_fds(pid), errors)
    finally:
        server.shutdown()
        sampler.stop()
