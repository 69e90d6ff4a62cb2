"""The dashboard's start in headless Chromium: a dead Prometheus gives a banner and navigation still
works; a dashboard scraping exporters keeps history from its own start, not from the first page a
browser opens. Screenshots land in artifacts/dashboard/."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.support.browser import chromium_page, load, run_dashboard
from tests.support.exporter import run_exporter
from tests.support.net import free_port

pytestmark = pytest.mark.integration


def test_dead_prometheus_gives_a_banner_and_navigation_still_works(artifacts_dir: Path) -> None:
    with run_dashboard("--prometheus", f"http://127.0.0.1:{free_port()}") as dash, chromium_page() as page:
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        page.goto(dash)
        page.get_by_text("is unreachable").first.wait_for(timeout=60000)
        page.get_by_role("link", name="Health").click()
        page.get_by_role("heading", name="Health").wait_for(timeout=30000)
        # the banner is drawn again on the new page, after its title
        page.get_by_text("is unreachable").first.wait_for(timeout=30000)
        assert page.get_by_text("Retry").count() > 0
        (artifacts_dir / "dashboard").mkdir(exist_ok=True)
        page.screenshot(path=str(artifacts_dir / "dashboard" / "prometheus-down.png"))


def test_a_scrape_dashboard_keeps_history_from_its_start() -> None:
    """A dashboard scraping exporters starts scraping as it starts, not when a browser first opens a
    page: that page reads the seconds before it. (It read one scrape, and Fleet's verdicts over 5
    minutes then read a moment: the time-sliced node's notebooks GPU, between two bursts, looked busy
    in nvidia-smi with idle SMs.)"""
    with (
        run_exporter("--sim.scenario", "h200x8") as target,
        run_dashboard("--scrape", target, "--scrape-interval", "1") as dash,
        chromium_page() as page,
    ):
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        # the dashboard runs a while before anyone opens it: 10 s, so that even a machine busy
        # enough to delay its scraper's first seconds (the suite's start, 4 workers on 2 cores)
        # has scraped 3 times; one page load then, since a scraper started by the page would
        # show only the scrapes since the load
        time.sleep(10)
        load(page, dash, 1)
        source = page.get_by_text("Source: direct scrape").first.inner_text()
        scrapes = re.search(r"(\d+) scrapes", source)
        assert scrapes is not None and int(scrapes.group(1)) >= 3, source
