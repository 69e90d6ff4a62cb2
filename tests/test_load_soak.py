"""Reduced load and soak runs (full counts: bench/load_soak.py, figures in docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.load_soak import SoakResult, load, sim_exporter
from tests.support.net import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]


def test_concurrent_scrapers_get_no_errors() -> None:
    port = free_port()
    with sim_exporter(port):
        result = load("127.0.0.1", port, concurrency=20, seconds=5)
    assert result.requests > 100
    assert result.errors == 0


def test_soak_with_churning_pods_and_a_flapping_gpu_keeps_memory_and_fds_flat() -> None:
    # A fresh interpreter: the RSS measured is the exporter's, not whatever earlier tests left
    # growing in the pytest process (threads of AppTest runtimes, caches).
    code = (
        "import dataclasses, json; from tests.support.load_soak import soak; "
        "print(json.dumps(dataclasses.asdict(soak(scrapes=2000, warmup=3000))))"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    result = SoakResult(**json.loads(run.stdout.strip().splitlines()[-1]))
    assert result.errors == 0
    assert result.rss_end_mb - result.rss_start_mb < 5.0, result
    assert result.fds_end <= result.fds_start + 2, result
