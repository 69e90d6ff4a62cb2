"""The dashboard's start in headless Chromium: a dead Prometheus gives a banner and navigation still
works; a dashboard scraping exporters keeps history from its own start, not from the first page a
browser opens. Screenshots land in artifacts/dashboard/."""

from __future__ import annotations

import contextlib
import re
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import chromium_page, fleet_counts_add_up, load, run_dashboard
from tests.support.exporter import run_exporter
from tests.support.kube import wait_for
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


@contextlib.contextmanager
def counting_proxy(target: str) -> Iterator[tuple[str, list[int]]]:
    """An HTTP server that answers each GET with ``target``'s reply to the same path; yields its
    base URL and a one-item list holding how many requests it has answered (the dashboard's
    scrapes, seen from outside it)."""
    answered = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with urllib.request.urlopen(target + self.path, timeout=10) as reply:
                body, ctype = reply.read(), reply.headers.get("Content-Type", "text/plain")
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            answered[0] += 1

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", answered
    finally:
        server.shutdown()
        server.server_close()


def test_a_scrape_dashboard_keeps_history_from_its_start() -> None:
    """A dashboard scraping exporters starts scraping as it starts, not when a browser first opens a
    page: that page reads the seconds before it. (It read one scrape, and Fleet's verdicts over 5
    minutes then read a moment: the time-sliced node's notebooks GPU, between two bursts, looked busy
    in nvidia-smi with idle SMs.)"""
    with (
        run_exporter("--sim.scenario", "h200x8", env={"NODE_NAME": "h200x8"}) as exporter,
        counting_proxy(exporter) as (target, scrapes_seen),
        run_dashboard("--scrape", target, "--scrape-interval", "1") as dash,
        chromium_page() as page,
    ):
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        # the dashboard runs a while before anyone opens it: until it has scraped 3 times, seen
        # from the exporter's side (no page is open, so a scraper started by a page could not
        # have done it); one page load then
        assert wait_for(lambda: scrapes_seen[0] >= 3, timeout=60), f"{scrapes_seen[0]} scrapes before any page"
        load(page, dash, 1)
        source = page.get_by_text("Source: direct scrape").first.inner_text()
        scrapes = re.search(r"(\d+) scrapes", source)
        assert scrapes is not None and int(scrapes.group(1)) >= 3, source
        # seconds of history: no verdict over 5 minutes yet. Every held device is collecting, the
        # counts add up, and no device is named idle or launch-bound (Fleet read 7 allocated, 6 in
        # use, 1 idle from its first scrapes)
        counts = fleet_counts_add_up(page)
        assert counts["Collecting"] == counts["Allocated"] == 7, counts
        assert page.get_by_text(re.compile(r"the youngest: collecting \(\d+ s of 5 m\)")).count() > 0
        assert page.get_by_text("look busy in nvidia-smi").count() == 0, "a 5-minute verdict from seconds"
