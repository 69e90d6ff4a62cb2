"""Headless Chromium and the running dashboard, for browser tests and the dashboard scale bench."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

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


PAGES: dict[str, list[str]] = {
    # url path -> texts that must be on the page once it has rendered (with the simulated demo fleet)
    "": ["GPUs", "Allocated", "SM activity per GPU", "Models"],
    "efficiency": ["Roofline: DRAM bandwidth vs busiest pipe", "Boundness over time"],
    "workloads": ["Allocated but idle now", "Wasted GPU-hours by namespace", "Pods holding GPUs"],
    "jobs": ["Multi-node jobs", "Jobs with a straggler", "Communication-bound jobs", "Jobs by GPU-hours"],
    "sharing": ["MIG GPUs and their slices", "Shared GPUs: share of SM time per pod"],
    "health": ["Bandwidth probes", "slow probe result(s)", "GPU 7", "Xid errors", "ECC errors", "Throttling (last"],
    "rightsizing": ["Right-sizing"],
    "network": ["No RDMA NIC in view"],
    "job": ["Its GPUs over time", "Its GPUs now"],
    "gpu": ["Pods that held this GPU in the range", "Boundness class over time", "Utilisation (NVML)"],
}
MIN_CHARTS = {
    "": 1,
    "efficiency": 2,
    "workloads": 1,
    "jobs": 1,
    "sharing": 2,
    "health": 1,
    "rightsizing": 0,
    "network": 0,
    "job": 1,
    "gpu": 3,
}
"""Every dashboard page (url path) and what the browser tests expect on it; ``MIN_CHARTS``: the
charts each draws at least."""
CHART = '[data-testid="stVegaLiteChart"]'
"""A chart on a page (dashboard/figures.py specs, drawn by Streamlit's Vega-Lite element)."""
CHARTS_DRAWN_JS = (
    "n => { const charts = [...document.querySelectorAll('" + CHART + "')];"
    " return charts.length >= n && charts.every(c => c.querySelector('.marks')); }"
)
"""JavaScript predicate: at least ``n`` charts on the page and every one drawn (Vega's ``.marks``
svg or canvas exists once the view has rendered)."""


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
def chromium_page(width: int = 1400) -> Iterator[object]:
    """A page of a headless Chromium, ``width`` pixels wide (wide tables need more than 1400)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            # tall: Streamlit scrolls inside its own container, so a screenshot shows one viewport
            yield browser.new_page(viewport={"width": width, "height": 1700})
        finally:
            browser.close()


def load(page: object, url: str, min_charts: int = 0, timeout_s: float = 120.0) -> float:
    """Open ``url`` and wait until the page's last element (the footer) and at least
    ``min_charts`` charts are drawn; return the seconds it took."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    started = time.perf_counter()
    page.goto(url)
    page.get_by_text("rendered in").first.wait_for(timeout=timeout_s * 1000)
    page.wait_for_function(
        CHARTS_DRAWN_JS,
        arg=min_charts,
        timeout=timeout_s * 1000,
    )
    return time.perf_counter() - started


REPR_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"DeltaGenerator", "a Streamlit DeltaGenerator"),
    (r"<[\w.]+ object at 0x[0-9a-fA-F]+>|object at 0x[0-9a-fA-F]+", "a Python object repr"),
    (r"Traceback \(most recent call last\)", "a traceback"),
    (r"streamlit\.(?:delta_generator|runtime|elements)\.", "a Streamlit module path"),
    (r"\b(?:Timestamp|Series|DataFrame)\(", "a pandas repr"),
    (r"\bdtype: (?:object|float64|int64)\b", "a pandas Series repr"),
)


# Streamlit's frontend finds its server by probing the page's own path first: a deep link to
# /health asks /health/_stcore/health (404), then /_stcore/health. Those two probes are the only
# failed loads a browser test lets through; any other 404 or console error fails it.
BASE_PROBE = re.compile(r"^https?://[^/]+/[A-Za-z0-9_-]+/_stcore/(?:health|host-config)$")


class PageWatch:
    """Collects what a browser test must fail on while pages load: console errors, uncaught page
    errors and every request to a host other than the dashboard's own."""

    def __init__(self, page: object, base_url: str) -> None:
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        self.host = urlsplit(base_url).netloc
        self.console_errors: list[str] = []
        self.page_errors: list[str] = []
        self.foreign_requests: list[str] = []
        self.failed_responses: list[str] = []
        page.on("response", self._response)
        page.on("console", self._console)
        page.on("pageerror", lambda e: self.page_errors.append(str(e)))
        page.on("request", self._request)

    def _response(self, response: object) -> None:
        status, url = int(getattr(response, "status", 0)), str(getattr(response, "url", ""))
        if status >= 400 and not (status == 404 and BASE_PROBE.match(url)):
            self.failed_responses.append(f"{status} {url}")

    def _console(self, message: object) -> None:
        if getattr(message, "type", "") != "error":
            return
        where = str((getattr(message, "location", None) or {}).get("url", ""))
        if "status of 404" in str(getattr(message, "text", "")) and BASE_PROBE.match(where):
            return
        self.console_errors.append(f"{getattr(message, 'text', '')} ({where})")

    def _request(self, request: object) -> None:
        url = str(getattr(request, "url", ""))
        parts = urlsplit(url)
        if parts.scheme in ("data", "blob", "about") or not parts.netloc:
            return
        if parts.netloc != self.host:
            self.foreign_requests.append(url)

    def problems(self) -> list[str]:
        """Everything seen so far that a page must not do; empty when clean."""
        return (
            [f"console error: {m}" for m in self.console_errors]
            + [f"page error: {m}" for m in self.page_errors]
            + [f"request to another host: {u}" for u in self.foreign_requests]
            + [f"HTTP error: {r}" for r in self.failed_responses]
        )


def text_problems(page: object) -> list[str]:
    """Streamlit exceptions, Python reprs, Streamlit internals and stray ``None`` blocks on the page."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    out: list[str] = []
    exceptions = page.locator('[data-testid="stException"]')
    for i in range(exceptions.count()):
        out.append(f"Streamlit exception: {exceptions.nth(i).inner_text()[:300]}")
    text = page.locator("body").inner_text()
    for pattern, what in REPR_PATTERNS:
        m = re.search(pattern, text)
        if m:
            out.append(f"{what} in the page text: {text[max(0, m.start() - 80) : m.end() + 80]!r}")
    # a block whose whole text is a bare Python constant is what magic draws for a None/True value
    blocks = page.locator(
        '[data-testid="stMarkdownContainer"], [data-testid="stText"], [data-testid="stJson"], '
        '[data-testid="stCode"], [data-testid="stElementContainer"]'
    )
    for value in blocks.all_inner_texts():
        if value.strip() in ("None", "True", "False", "nan", "NaN", "[]", "{}"):
            out.append(f"a block showing only {value.strip()!r}")
    return out


def check_page(page: object, watch: PageWatch, url: str, texts: list[str], min_charts: int, shot: Path) -> None:
    """Open ``url`` and fail unless it renders with ``texts`` and ``min_charts`` charts and without
    an error banner, a text problem (:func:`text_problems`) or anything ``watch`` collects; the page
    is saved to ``shot`` (``failed-<name>`` beside it when it does not render)."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    try:
        load(page, url, min_charts)
    except Exception as exc:
        page.screenshot(path=str(shot.with_name(f"failed-{shot.name}")), full_page=True)
        raise AssertionError(f"{url} did not render: {exc}") from exc
    page.wait_for_timeout(300)  # late console errors (favicon, fonts) of this page
    page.screenshot(path=str(shot), full_page=True)
    for text in texts:
        assert page.get_by_text(text, exact=False).count() > 0, (url, text)
    assert page.locator(f"{CHART} .marks").count() >= min_charts, url
    assert page.locator('[data-testid="stAlertContentError"]').count() == 0, url
    assert text_problems(page) == [], url
    problems = watch.problems()
    assert problems == [], f"{url}: {problems}"
