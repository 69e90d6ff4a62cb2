"""Reduced load and soak runs (full counts: bench/load_soak.py, figures in docs/benchmarks.md)."""

from __future__ import annotations

from tests.support.load_soak import load, sim_exporter, soak
from tests.support.net import free_port


def test_concurrent_scrapers_get_no_errors() -> None:
    port = free_port()
    with sim_exporter(port):
        result = load("127.0.0.1", port, concurrency=20, seconds=5)
    assert result.requests > 100
    assert result.errors == 0


def test_soak_with_churning_pods_and_a_flapping_gpu_keeps_memory_and_fds_flat() -> None:
    result = soak(scrapes=2000, warmup=3000)
    assert result.errors == 0
    assert result.rss_end_mb - result.rss_start_mb < 5.0, result
    assert result.fds_end <= result.fds_start + 2, result
