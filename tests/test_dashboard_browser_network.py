"""The Network page in headless Chromium over two simulated p5en workers of one PyTorchJob, through a
real Prometheus with the rules and through the dashboard's own scrapes: NICs against their line rate,
GPUDirect RDMA readiness in words, the pods holding NICs and the straggler. Screenshots land in
artifacts/dashboard/."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.browser import MODES, PageWatch, check_page, chromium_page, fleet_counts_add_up, run_dashboard
from tests.support.exporter import run_exporter
from tests.support.prometheus import RULES_FILE, demo_scrape_config, run_prometheus, wait_for_query
from tests.support.prometheus import query as prom_query

pytestmark = [pytest.mark.integration, pytest.mark.long]

REPO = Path(__file__).resolve().parents[1]
RATE_WINDOW_S = 75.0
"""History a NIC rate needs before it is drawn: a rate window (a minute) and a few scrapes."""


NETWORK_SCENARIOS = ("p5en", "p5en-nogdr")
"""Two simulated p5en workers of one PyTorchJob (32 EFAs each): GPUDirect RDMA ready with a
thermally throttled GPU 5 (the straggler), and not ready (no peer-memory module)."""


@dataclass(frozen=True)
class NetworkStack:
    """The two p5en exporters' Prometheus (``prom``, the rules loaded, scraping every second), a
    dashboard on it and one scraping the exporters itself, and when that one started scraping
    (``time.monotonic()``)."""

    prom: str
    prom_dash: str
    scrape_dash: str
    scrape_started: float


@pytest.fixture(scope="module")
def network_stack() -> Iterator[NetworkStack]:
    with ExitStack() as es:
        targets = [
            es.enter_context(run_exporter("--sim.scenario", sc, env={"NODE_NAME": sc})) for sc in NETWORK_SCENARIOS
        ]
        prom = es.enter_context(run_prometheus(demo_scrape_config(targets, rules=True),
                                               {"gpulens.rules.yml": RULES_FILE.read_text()}))  # fmt: skip
        wait_for_query(prom, "count(gpulens_nic_info) >= 64", timeout=60)
        dash = es.enter_context(run_dashboard("--prometheus", prom))
        started = time.monotonic()
        scrape = es.enter_context(run_dashboard("--scrape", ",".join(targets), "--scrape-interval", "1"))
        yield NetworkStack(prom, dash, scrape, started)


@pytest.mark.parametrize("mode", MODES)
def test_network_page_shows_the_nics_gpudirect_and_the_straggler(
    network_stack: NetworkStack, mode: str, artifacts_dir: Path
) -> None:
    """What a person sees on the Network page of the two p5en nodes: each node's 32 EFAs with their
    throughput in GB/s against a 100 Gb/s (12.5 GB/s) line rate, GPUDirect RDMA ready on one node and not on the
    other with the reason in words, the pod holding the NICs alone with its throughput and its
    communication share, and the straggler named; the GPU page lists a GPU's nearest NICs."""
    prom = network_stack.prom
    dash = network_stack.prom_dash if mode == "prometheus" else network_stack.scrape_dash
    # NIC rates are drawn where a counter is a rate window (a minute) old
    wait_for_query(prom, "count(gpulens_nic_port_data_transmitted_bytes_total offset 70s)", timeout=150)
    uuid = str(prom_query(prom, 'gpulens_gpu_info{gpu="0",node="p5en-nogdr"}')[0]["metric"]["uuid"])
    out = artifacts_dir / "dashboard"
    out.mkdir(exist_ok=True)
    with chromium_page() as page:
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        if mode == "scrape":
            # the scrape source's history starts with its dashboard, after Prometheus' first scrape:
            # a rate window of its own (mostly spent by the Prometheus-mode test before this one)
            time.sleep(max(0.0, RATE_WINDOW_S - (time.monotonic() - network_stack.scrape_started)))
        watch = PageWatch(page, dash)
        texts = [
            "NICs: throughput now against the line rate",
            "All 64 NICs in view are up",
            "GPUDirect RDMA ready on all 8 GPUs",
            "GPUDirect RDMA not ready on 8 of 8 GPUs: no peer-memory module or DMA-BUF",
            "Pods holding NICs",
            "llama-70b-pretrain-worker-0",
            "Time in communication per GPU",
            "GPU 5 computes",
        ]
        shot = out / f"{mode}-network.png"
        check_page(page, watch, f"{dash}/network?range=15m", texts, 4, shot)
        body = page.locator("body").inner_text()
        # the tables are drawn on a canvas (their cells are checked in test_dashboard_apptest.py)
        assert page.locator("svg text", has_text="GB/s each way").count() > 0, "the NIC charts' axis: bytes"
        assert page.locator("svg text", has_text="communication").count() > 0, "the class in the legend"
        assert "gpulens_" not in body and "path_sys" not in body and "no_peer_memory" not in body
        gpu = ["Nearest NICs", "GPUDirect RDMA is not ready"]
        check_page(page, watch, f"{dash}/gpu?range=15m&uuid={uuid}", gpu, 3, out / f"{mode}-network-gpu.png")
        assert page.get_by_text("no peer-memory module or DMA-BUF").count() > 0
        # Fleet opens with it: every GPU of the nogdr node waits on the network with GPUDirect RDMA
        # off (Fleet read 8 of 8 in use and "No GPU ran slow", and nothing on the network)
        gdr = "GPUDirect RDMA not ready on 8 of 8 GPUs (no peer-memory module or DMA-BUF)"
        check_page(page, watch, f"{dash}/?range=15m", [gdr], 1, out / f"{mode}-network-fleet.png",
                   ("GPUDirect RDMA not ready",))  # fmt: skip
        line = page.locator('[data-testid="stAlertContentError"]', has_text=gdr)
        assert line.count() == 1, "one line, for the one node without it"
        assert page.get_by_role("link", name="Explain").count() >= 1, "each line links the page that explains it"
        fleet_counts_add_up(page)
        if mode == "prometheus" and os.environ.get("GPULENS_UPDATE_DOCS_IMG"):
            shutil.copy(shot, REPO / "docs" / "img" / "dashboard-network.png")
