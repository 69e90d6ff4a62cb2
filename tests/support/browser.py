"""Headless Chromium and the running dashboard, for browser tests and the dashboard scale bench."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.net import free_port
from tests.support.process import managed_process

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@contextmanager
def run_dashboard(*args: str) -> Iterator[str]:
    """``python -m dashboard ARGS`` on a free port; yield its URL once Streamlit is healthy.

    Its log is kept in ``artifacts/dashboard-PORT.log``."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    (REPO / "artifacts").mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "dashboard", *args, "--port", str(port), "--address", "127.0.0.1", "--refresh", "0"]
    with managed_process(argv, f"{base}/_stcore/health", log=REPO / "artifacts" / f"dashboard-{port}.log"):
        yield base


@contextmanager
def chromium_page() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            # tall: Streamlit scrolls inside its own container, so a screenshot shows one viewport
            yield browser.new_page(viewport={"width": 1400, "height": 1700})
        finally:
            browser.close()


def load(page: object, url: str, min_charts: int = 0, timeout_s: float = 120.0) -> float:
    """Open ``url`` and wait until the page's last element (the footer) and at least
    ``min_charts`` plotly charts are drawn; return the seconds it took."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    started = time.perf_counter()
    page.goto(url)
    page.get_by_text("rendered in").first.wait_for(timeout=timeout_s * 1000)
    page.wait_for_function(
        """n => {
            const charts = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')];
            return charts.length >= n && charts.every(c => c.querySelector('.main-svg'));
        }""",
        arg=min_charts,
        timeout=timeout_s * 1000,
    )
    return time.perf_counter() - started
