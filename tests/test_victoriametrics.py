"""The dashboard on VictoriaMetrics, as a user with a scale-out store runs it: VictoriaMetrics
scrapes three simulated exporters (8 whole H200s, a MIG node, a time-sliced node) itself, vmalert
evaluates deploy/rules/gpulens.rules.yml against it and writes the recorded series back, and the
dashboard's Prometheus mode reads it. Every page renders with data in headless Chromium, with the
same checks as on Prometheus (tests/test_dashboard_browser*.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.support.browser import (
    MIN_CHARTS,
    PAGES,
    PageWatch,
    check_page,
    chromium_page,
    empty_panels,
    load,
    run_dashboard,
)
from tests.support.exporter import run_exporter
from tests.support.prometheus import demo_scrape_config
from tests.support.victoriametrics import RULES_FILE, query, run_victoriametrics, run_vmalert

pytestmark = [pytest.mark.integration, pytest.mark.long]


@pytest.fixture(scope="module")
def vm_dashboard() -> Iterator[tuple[str, str]]:
    """(VictoriaMetrics URL, the dashboard's URL on it) once the rules have recorded a few seconds."""
    with ExitStack() as es:
        targets = [es.enter_context(run_exporter("--sim.scenario", sc)) for sc in ("h200x8", "mig", "timeslice")]
        config = demo_scrape_config(targets, rules=False)
        vm = es.enter_context(run_victoriametrics(scrape_config=config))
        es.enter_context(run_vmalert(vm, RULES_FILE.read_text(), interval="1s"))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if (
                len(query(vm, "gpulens_gpu_info")) >= 24
                and query(vm, "gpulens_probe_efficiency_ratio")
                and len(query(vm, "gpulens:gpu_idle:bool")) >= 40
                and query(vm, "gpulens:pod_gpu_wasted:gpus")
            ):
                break
            time.sleep(0.5)
        else:
            pytest.fail("VictoriaMetrics never saw the three exporters' GPUs, a probe result and the recorded rules")
        time.sleep(5)  # a few seconds of history for the range panels
        dash = es.enter_context(run_dashboard("--prometheus", vm, "--price-per-gpu-hour", "H200=3.5"))
        yield vm, dash


def test_every_page_renders_with_data_on_victoriametrics(vm_dashboard: tuple[str, str], artifacts_dir: Path) -> None:
    _vm, dash = vm_dashboard
    out = artifacts_dir / "dashboard"
    out.mkdir(exist_ok=True)
    with chromium_page() as page:
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        watch = PageWatch(page, dash)
        # this fleet has no node with RDMA NICs (the main pass's serving node has EFAs): Network says so
        for path, texts in {**PAGES, "network": ["No RDMA NIC in view"]}.items():
            shot = out / f"victoriametrics-{path or 'fleet'}.png"
            check_page(page, watch, f"{dash}/{path}?range=15m", texts, MIN_CHARTS[path], shot)
            if path != "rightsizing":  # its week-long window's 10-minute grid has no point yet, on any store
                # an empty panel the page is expected to show (Network's "No RDMA NIC in view") is content
                assert not [t for t in empty_panels(page) if not any(x in t for x in texts)], path


def test_fleet_page_counts_every_device_on_victoriametrics(vm_dashboard: tuple[str, str]) -> None:
    vm, dash = vm_dashboard
    with chromium_page() as page:
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        load(page, dash, 1)
        metric = page.locator('[data-testid="stMetric"]').first
        # 24 GPUs, the MIG node's GPUs counted as their instances: whole GPUs + MIG instances
        assert metric.inner_text().split("\n")[-1].strip() == "40"
    # the idle verdict the pages read was recorded by vmalert for every device
    assert len(query(vm, "gpulens:gpu_idle:bool")) == 40
