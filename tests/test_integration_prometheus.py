"""A real Prometheus scrapes the real exporter process (simulated fleet) and sees every leaf."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from exporter.sim import SimulatedBackend
from tests.support.exporter import run_exporter
from tests.support.net import free_port, get, wait_http
from tests.support.prometheus import run_prometheus, scrape_config, wait_for_query

pytestmark = pytest.mark.integration


def _leaf_ids(scenario: str) -> set[str]:
    backend = SimulatedBackend(scenario, seed=0)
    sample = backend.sample()
    return {leaf.leaf_id for gpu in sample.gpus for leaf in gpu.leaves}


@pytest.mark.parametrize("scenario", ["h200x8", "mig"])
def test_prometheus_sees_sm_activity_for_every_simulated_leaf(scenario: str) -> None:
    expected = _leaf_ids(scenario)
    with run_exporter("--sim.scenario", scenario) as exporter:
        target = exporter.removeprefix("http://")
        with run_prometheus(scrape_config([target])) as prom:
            result = wait_for_query(
                prom,
                "gpulens_gpu_sm_active_ratio",
                lambda r: len(r) >= len(expected),
                timeout=60,
            )
    seen = {r["metric"].get("mig_uuid") or r["metric"]["uuid"] for r in result}
    assert seen == expected
    for r in result:
        assert 0.0 <= float(r["value"][1]) <= 1.0
        # the exporter's own node label (a simulated node's scenario), kept as it is under honor_labels
        assert r["metric"]["node"] == scenario and "exported_node" not in r["metric"]


def test_prometheus_gets_pods_and_the_up_series() -> None:
    with (
        run_exporter("--sim.scenario", "h200x8") as exporter,
        run_prometheus(scrape_config([exporter.removeprefix("http://")])) as prom,
    ):
        up = wait_for_query(prom, "gpulens_up == 1")
        alloc = wait_for_query(prom, "gpulens_pod_gpu_allocation")
    assert len(up) == 1
    assert {r["metric"]["namespace"] for r in alloc}, "the simulated fleet carries pods"


def test_sigterm_mid_scrape_exits_cleanly_within_5s() -> None:
    import socket

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--backend", "sim", "--web.listen-address", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz", timeout=30)
        assert get(f"http://127.0.0.1:{port}/metrics")[0] == 200
        # A scrape in flight: the request is half sent when the signal arrives.
        stalled = socket.create_connection(("127.0.0.1", port))
        stalled.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(10)
        stalled.close()
        assert rc == 0
        assert time.monotonic() - t0 < 5.0
    finally:
        if proc.poll() is None:
            proc.kill()
