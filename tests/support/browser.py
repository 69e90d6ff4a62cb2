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
MODES = ("prometheus", "scrape")
"""The dashboard's two sources, as the browser tests name them: a Prometheus, or scraping exporters itself."""
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
    "sharing": ["MIG GPUs and their slices", "Shared GPUs: kernel time per pod"],
    "health": ["Bandwidth probes", "slow probe result(s)", "GPU 7", "Xid errors", "ECC errors", "Throttling (last"],
    "serving": ["Serving"],
    "rightsizing": ["Right-sizing"],
    "network": ["NICs: throughput now against the line rate"],
    "job": ["Its GPUs over time", "Its GPUs now"],
    "gpu": [
        "Pods that held this GPU in the range",
        "What limits it: boundness class over time",
        "Utilisation and activity",
        "Memory",
    ],
}
MIN_CHARTS = {
    "": 1,
    "efficiency": 2,
    "workloads": 0,  # its one chart, the wasted hours, waits for a full idle window of history
    "jobs": 1,
    "sharing": 2,
    "health": 1,
    "serving": 0,
    "rightsizing": 0,
    "network": 0,
    "job": 1,
    "gpu": 3,
}
"""Every dashboard page (url path) and what the browser tests expect on it; ``MIN_CHARTS``: the
charts each draws at least. The main pass's fleet has a serving node (p5en, its EFAs, its inference
engines): the Network page has NICs; the Serving page's own texts differ by source
(:data:`SERVING_TEXTS`)."""
SERVING_TEXTS: dict[str, list[str]] = {
    "prometheus": [
        "Throughput and cost",
        "Latency and load",
        "Output tokens/s",
        "GPUs serving",
        "The advisor's serving advice",
        "Inter-token latency p95",
        "KV transfer",
        "Bytes per second each role's pods moved",
    ],
    "scrape": ["Serving figures need Prometheus"],
}
"""What the Serving page shows over the main pass's serving node, by source: the figures and the
advice through Prometheus; in scrape mode, in words, that they need it."""
CHART = '[data-testid="stVegaLiteChart"]'
"""A chart on a page (dashboard/figures/ specs, drawn by Streamlit's Vega-Lite element)."""
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


SHOT_HEIGHT = 1700
"""A screenshot's height: Streamlit scrolls inside its own container, so a screenshot shows one
viewport; the checks run at :data:`SCREEN`, the screenshot is taken this tall."""


@contextmanager
def chromium_page(width: int = 1440, height: int = 900) -> Iterator[object]:
    """A page of a headless Chromium with a ``width`` x ``height`` viewport (:data:`SCREEN`, a laptop's)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.add_init_script(DRAWN_TEXT_HOOK)
            yield page
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


def empty_panels(page: object) -> list[str]:
    """The texts of the page's empty-panel messages (dashboard.ui.no_data: an info box whose
    sentence starts with "No ..."; successes such as "No Xid errors" are green, not info)."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    boxes = page.locator('[data-testid="stAlertContentInfo"]')
    texts = [boxes.nth(i).inner_text().strip() for i in range(boxes.count())]
    return [t for t in texts if t.startswith("No ")]


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


HEADER_ROW_PX = 36
"""A table's header row: glide-data-grid draws its column titles within this many CSS pixels of
its canvas' top (Streamlit's header height is 35 px)."""

DRAWN_TEXT_HOOK = """
(() => {
  const drawn = new Set();
  window.__gpulensDrawn = drawn;
  // per canvas, where each column title was last drawn: title -> [left, right] in CSS px of the canvas
  const heads = new WeakMap();
  window.__gpulensHeads = heads;
  const fill = CanvasRenderingContext2D.prototype.fillText;
  CanvasRenderingContext2D.prototype.fillText = function (text, x, y, ...rest) {
    const t = String(text);
    if (drawn.size < 50000) drawn.add(t);
    try {
      const c = this.canvas, m = this.getTransform();
      const css = c.clientWidth ? c.clientWidth / c.width : 1;
      if ((m.d * y + m.f) * css < HEADER_ROW_PX) {
        const left = (m.a * x + m.e) * css, w = this.measureText(t).width * m.a * css;
        const align = this.textAlign;
        const l = align === "center" ? left - w / 2 : (align === "right" || align === "end") ? left - w : left;
        if (!heads.has(c)) heads.set(c, new Map());
        heads.get(c).set(t, [l, l + w]);
      }
    } catch (e) {}
    return fill.call(this, text, x, y, ...rest);
  };
})();
""".replace("HEADER_ROW_PX", str(HEADER_ROW_PX))
"""Run in every page before its scripts: records each string drawn on a canvas, and where on its
canvas each table's column titles were drawn. Streamlit draws its tables (glide-data-grid) on
canvases, so their cells as a person sees them (formatted, ``None`` for a missing value) and the
place of their columns are in no DOM; this is how a test reads them."""

SCREEN = (1440, 900)
"""The screen the pages must fit (width, height in CSS px): a laptop's."""

TABLE_KEY = re.compile(r"st-key-gpulens-table-(?P<key>.+)-p(?P<columns>[\d_]*)$")
"""The container of a table with a layout (dashboard/ui.py ``TABLE_CONTAINER``): its key and where
its primary columns are among its drawn ones (0-based, ``_``-separated)."""

PRIMARY_COLUMNS_JS = """
async ([screen, pattern]) => {
  const frame = () => new Promise(r => setTimeout(() => requestAnimationFrame(() => requestAnimationFrame(r)), 350));
  const re = new RegExp(pattern);
  const out = [];
  for (const box of document.querySelectorAll('[class*="st-key-gpulens-table-"]')) {
    const cls = [...box.classList].map(c => c.match(re)).find(m => m);
    const grid = box.querySelector('[data-testid="stDataFrame"]');
    if (!cls || !grid) continue;
    grid.scrollIntoView({block: "center"});
    await frame();
    const primary = cls.groups.columns ? cls.groups.columns.split('_').map(i => Number(i) + 1) : [];
    const titles = new Map();
    grid.querySelectorAll('[role="columnheader"]').forEach(
      h => titles.set(Number(h.getAttribute('aria-colindex')), h.textContent.trim()));
    const canvases = [...grid.querySelectorAll('canvas')];
    const heads = window.__gpulensHeads || new WeakMap();
    const seen = canvases.map(c => [c.getBoundingClientRect(), heads.get(c) || new Map()]);
    const columns = [];
    for (const i of primary) {
      const title = titles.get(i);
      let right = null;
      for (const [rect, heads] of seen) {
        const at = title !== undefined && heads.get(title);
        if (at) right = Math.max(right === null ? -1e9 : right, rect.left + at[1]);
      }
      const edge = Math.min(screen, ...seen.map(([rect]) => rect.right));
      columns.push({index: i, title: title === undefined ? null : title, right, edge});
    }
    out.push({key: cls.groups.key, columns});
  }
  return out;
}
"""
"""JavaScript: for every table with a layout, where each primary column's title ends on the screen
(CSS px from the page's left; null when the grid drew no such title: it lies out of view) and the
edge it must end before (the screen's width, or the table's own right edge if nearer)."""


def primary_column_problems(page: object) -> list[str]:
    """The primary columns (dashboard/ui.py ``TABLES``) of the page's tables that do not show in
    full within the first :data:`SCREEN` width pixels, unscrolled: one line per column, with the
    table's key and where its title ends."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    out = []
    for table in page.evaluate(PRIMARY_COLUMNS_JS, [SCREEN[0], TABLE_KEY.pattern.replace("(?P<", "(?<")]):
        for c in table["columns"]:
            if c["title"] is None or c["right"] is None:
                which = c["title"] or f"number {c['index']}"
                out.append(f"table {table['key']}: primary column {which} is not drawn within the first "
                           f"{SCREEN[0]:,} px (its header is out of view)")  # fmt: skip
            elif c["right"] > c["edge"] + 1:
                out.append(f"table {table['key']}: primary column {c['title']!r} ends at {c['right']:.0f} px, beyond "
                           f"{c['edge']:.0f} px (the first {SCREEN[0]:,} px or the table's edge)")  # fmt: skip
    return out


TABLE_SWEEP_JS = """
async (maxSteps) => {
  // a scroll reaches the grid as an event, then a React render, then a canvas frame
  const frame = () => new Promise(r => setTimeout(() => requestAnimationFrame(() => requestAnimationFrame(r)), 350));
  const out = [];
  for (const grid of document.querySelectorAll('[data-testid="stDataFrame"]')) {
    grid.scrollIntoView({block: "center"});
    await frame();
    const heads = new Map();
    const read = () => grid.querySelectorAll('[role="columnheader"]').forEach(
      h => heads.set(h.getAttribute('aria-colindex') || h.textContent, h.textContent.trim()));
    read();
    const sc = grid.querySelector('.dvn-scroller');
    if (sc) {
      // screens of 90 % (an overlap), the last one flush with the far edge: a table 1.95 screens
      // wide takes three, not two (two left its last column unseen)
      const steps = (total, view) =>
        Math.min(maxSteps, 1 + Math.max(0, Math.ceil((total - view) / Math.max(1, 0.9 * view))));
      const xs = steps(sc.scrollWidth, sc.clientWidth);
      const ys = steps(sc.scrollHeight, sc.clientHeight);
      for (let y = 0; y < ys; y++) {
        for (let x = 0; x < xs; x++) {
          sc.scrollLeft = Math.min(x * sc.clientWidth * 0.9, sc.scrollWidth - sc.clientWidth);
          sc.scrollTop = Math.min(y * sc.clientHeight * 0.9, sc.scrollHeight - sc.clientHeight);
          sc.dispatchEvent(new Event('scroll'));
          await frame();
          read();
        }
      }
      sc.scrollLeft = 0;
      sc.scrollTop = 0;
    }
    const grid_ = grid.querySelector('[role="grid"]');
    out.push({headers: [...heads.values()], columns: Number(grid_ ? grid_.getAttribute('aria-colcount') : 0)});
  }
  await frame();
  return {headers: out, drawn: [...(window.__gpulensDrawn || [])]};
}
"""
"""JavaScript: scroll every table of the page through its columns and rows (``maxSteps`` screens
each way at most; the grid draws only what is in view) and return its column headers (the grid's
accessibility table, ``[role="columnheader"]``: the header as drawn) and every string drawn on a
canvas so far (:data:`DRAWN_TEXT_HOOK`)."""

SNAKE_CASE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)+$")
"""A column name as a program spells it (``gpu_hours``, ``workload_kind``), not a header."""
MISSING_WORDS = ("None", "NULL", "null", "NaN", "nan", "NaT", "<NA>")
"""What a missing value reads as when nobody said why."""
MISSING_IN_TEXT = re.compile(r"(?<![\w<-])(?:None|NULL|null|NaN|nan|NaT|<NA>)(?![\w>-])(?! of\b)")
"""A missing value in page text (``None`` starting a sentence, "None of …", is English)."""
BARE_NUMBER = re.compile(r"(?<![\w.,:/#@%'-])\d{5,}(?![\w:/'-])")
"""A number of 5 or more digits without thousands separators (``10000``; not a port after ``:``,
an ID within letters or a PCI address)."""
UNROUNDED = re.compile(r"(?<![\w.:-])\d+\.\d{6,}(?![\w:-])")
"""A float as Python prints it (``0.5005807999999999``)."""
METRIC_NAME = re.compile(r"\bgpulens(?:_[a-z]|:[a-z])")
"""A metric or recording rule's name (``gpulens_gpu_info``, ``gpulens:job_leaf:info``)."""
JSON_DUMP = re.compile(r'[{\[]\s*"[^"]+"\s*:')
"""A JSON object dumped as text (``{"mig_profile": null``)."""


def text_findings(text: str, where: str) -> list[str]:
    """What a person should not read in ``text`` (page text, or one string drawn in a table):
    a missing value as None/NaN, a 5+ digit number without separators, an unrounded float, a
    metric name or a JSON dump; each finding names ``where`` and quotes its context."""
    out = []
    for pattern, what in (
        (MISSING_IN_TEXT, "a missing value shown as"),
        (BARE_NUMBER, "a number without thousands separators:"),
        (UNROUNDED, "an unrounded number:"),
        (METRIC_NAME, "a metric name:"),
        (JSON_DUMP, "a JSON dump:"),
    ):
        for m in list(pattern.finditer(text))[:3]:
            context = text[max(0, m.start() - 60) : m.end() + 60]
            out.append(f"{where}: {what} {m.group(0)!r} in {context!r}")
    return out


PAGE_TEXTS_JS = """
() => {
  const html = [], svg = [];
  const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    const t = n.textContent.trim();
    if (!t) continue;
    const el = n.parentElement;
    if (!el || el.closest('script, style, noscript, [data-testid^="stIcon"], [aria-hidden="true"]')) continue;
    if (el.closest('svg')) svg.push(t);
    else if (el.checkVisibility ? el.checkVisibility() : true) html.push(t);
  }
  return {html, svg};
}
"""
"""JavaScript: the page's visible text, each text node apart: ``html`` (prose, captions, metrics)
and ``svg`` (the charts' axes, legends and labels)."""

RAW_NAME = re.compile(r"(?<![\w./:=#-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?![\w/.(=-])")
"""A name as a program spells it (``sw_power_cap``, ``hbm_copy``), not words."""
PERCENT = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?%")
"""A percentage as shown."""
ONE_PERCENT_STYLE = re.compile(r"^\d{1,3}(?:,\d{3})* %$")
"""The pages' one percentage style (dashboard/ui.py ``PERCENT_FORMAT``): whole percent, a space."""
DATA_RATE = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?([kMGTP]?)(B|b)/s\b|\b([kMGTP]?)(B|b)/s\b")
"""A throughput with its unit: bytes (``GB/s``) or bits (``Gb/s``) per second."""
LINE_RATE = re.compile(r"line rate|\d\s?[kMGT]?b/s \(\d[\d,.]*\s?[kMGT]?B/s\)", re.IGNORECASE)
"""Where bits per second belong: a NIC's line rate, labelled, or given with its bytes per second."""
SHORT_ID = re.compile(r"^(?:GPU|MIG)-[0-9a-fA-F-]*…$")
"""A UUID shortened on purpose (dashboard/figures/vega.py ``short_uuid``; the tooltip has it whole)."""
ADDRESS = re.compile(r"(?<![/\w.@])(?:\d{1,3}\.){3}\d{1,3}:\d{2,5}\b")
"""An exporter's address (``127.0.0.1:9445``), not within a URL (the footer names the source)."""


def words_problems(page: object, drawn: list[str], *, node_names: bool) -> list[str]:
    """What reads as a program's, not a person's, on the loaded page: a raw driver or probe name
    (snake_case) in its text, charts or tables; a chart's label cut short (Vega's ``…``) but a
    shortened UUID; a percentage in another style than the pages' one
    (:data:`ONE_PERCENT_STYLE`, in text and tables); a data rate in bits per second beside one in
    bytes per second where it is not a labelled line rate (one unit per quantity); a KPI
    (``st.metric``) whose value is an instruction (``set --price-per-gpu-hour``); and where
    ``node_names`` (the exporters export a node name) an exporter's address shown instead of it.
    ``drawn``: the strings drawn in the page's tables (:data:`DRAWN_TEXT_HOOK`)."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    texts = page.evaluate(PAGE_TEXTS_JS)
    html, svg = list(texts["html"]), list(texts["svg"])
    out: list[str] = []
    for where, items in (("page text", html), ("a chart", svg), ("a table cell", drawn)):
        raw = sorted({m.group(0) for t in items for m in RAW_NAME.finditer(t) if not t.startswith("gpulens")})
        if raw:
            out.append(f"{where}: raw names where words belong: {raw[:8]}")
    cut = sorted({t for t in svg if t.endswith("…") and not SHORT_ID.match(t)})
    if cut:
        out.append(f"a chart label cut where it should show in full: {cut[:4]}")
    styles = sorted({m.group(0) for t in (*html, *drawn) for m in PERCENT.finditer(t)})
    other = [p for p in styles if not ONE_PERCENT_STYLE.match(p)]
    if other:
        out.append(f"percentages in more than one style: {other[:6]} beside the pages' '96 %' style")
    rates = [(m, t) for t in (*html, *svg, *drawn) for m in DATA_RATE.finditer(t)]
    in_bytes = sorted({m.group(0) for m, _ in rates if "B/s" in m.group(0)})
    bits = sorted({m.group(0) for m, t in rates if "b/s" in m.group(0) and not LINE_RATE.search(t)})
    if in_bytes and bits:
        out.append(f"one quantity in two units: data rates in bytes per second {in_bytes[:3]} and in bits per "
                   f"second {bits[:3]} (bits only for a labelled line rate)")  # fmt: skip
    values = page.locator('[data-testid="stMetricValue"]').all_inner_texts()
    hints = [v.strip() for v in values if re.search(r"--[a-z]|^set ", v.strip())]
    if hints:
        out.append(f"a KPI whose value is an instruction, not a figure (a hint belongs in a caption): {hints[:3]}")
    if node_names:
        addresses = sorted({m.group(0) for t in (*html, *svg, *drawn) for m in ADDRESS.finditer(t)})
        if addresses:
            out.append(f"an exporter's address where a node name exists: {addresses[:4]}")
    return out


def exports_node_name(target: str) -> bool:
    """Whether the exporter at ``target`` labels its series with a node name (``node="…"``): then a
    page must name nodes, never addresses."""
    from urllib.request import urlopen

    with urlopen(f"{target}/metrics", timeout=10) as r:
        return bool(re.search(r'^gpulens_gpu_info\{[^}]*\bnode="[^"]+"', r.read().decode(), re.M))


def display_problems(page: object, max_steps: int = 12, *, node_names: bool = False) -> list[str]:
    """What a person should not see on the loaded page: a table header that is a raw snake_case
    column name, a table cell reading ``None``/``NaN`` (:data:`MISSING_WORDS`), and in a cell or the
    page's text a 5+ digit number without thousands separators, an unrounded float, a metric name
    (``gpulens_…``) or a JSON dump (text or ``st.json``)."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    out: list[str] = []
    seen = page.evaluate(TABLE_SWEEP_JS, max_steps)
    for i, grid in enumerate(seen["headers"]):
        headers = [h for h in grid["headers"] if h]
        if len(headers) < grid["columns"]:
            out.append(f"table {i + 1}: {grid['columns']} columns but only these headers read: {headers}")
        for h in headers:
            if SNAKE_CASE.match(h):
                out.append(f"table {i + 1}: a raw column name as its header: {h!r}")
    for cell in sorted(set(seen["drawn"])):
        if cell.strip() in MISSING_WORDS:
            out.append(f"a table cell reads {cell.strip()!r} (a missing value without a reason)")
        else:
            out.extend(text_findings(cell, "a table cell"))
    out.extend(text_findings(page.locator("body").inner_text(), "page text"))
    if page.locator('[data-testid="stJson"]').count():
        out.append("a JSON viewer (st.json) on the page")
    out.extend(words_problems(page, seen["drawn"], node_names=node_names))
    return out


REPORT_ONLY: tuple[str, ...] = ()
"""Pages (url paths: "" is Fleet, "gpu" the GPU page) whose :func:`display_problems` are recorded
in ``artifacts/report-only.txt`` instead of failing the test: none (it held the Fleet and GPU
pages while they were redesigned)."""


def _path(url: str) -> str:
    return urlsplit(url).path.strip("/")


def check_page(
    page: object,
    watch: PageWatch,
    url: str,
    texts: list[str],
    min_charts: int,
    shot: Path,
    expected_errors: tuple[str, ...] = (),
    *,
    node_names: bool = False,
) -> None:
    """Open ``url`` and fail unless it renders with ``texts`` and ``min_charts`` charts and without
    an error banner (but those naming one of ``expected_errors``, e.g. a lost GPU's), a text
    problem (:func:`text_problems`), a primary column outside the first 1,440 px
    (:func:`primary_column_problems`), anything a person should not see (:func:`display_problems`:
    raw headers, ``None`` cells, unseparated numbers, metric names, JSON, raw driver and probe
    names, a second percentage style, bits beside bytes per second, and with ``node_names`` an
    exporter's address; only recorded for the :data:`REPORT_ONLY` pages) or anything ``watch``
    collects; the page is saved to ``shot`` (``failed-<name>`` beside it when it does not render)."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    try:
        load(page, url, min_charts)
    except Exception as exc:
        page.screenshot(path=str(shot.with_name(f"failed-{shot.name}")), full_page=True)
        raise AssertionError(f"{url} did not render: {exc}") from exc
    page.wait_for_timeout(300)  # late console errors (favicon, fonts) of this page
    screen = page.viewport_size or {"width": SCREEN[0], "height": SCREEN[1]}
    page.set_viewport_size({"width": screen["width"], "height": SHOT_HEIGHT})
    page.wait_for_timeout(300)
    page.screenshot(path=str(shot), full_page=True)
    page.set_viewport_size(screen)
    page.wait_for_timeout(300)
    hidden = primary_column_problems(page)  # at the screen's size, before the sweep below scrolls the tables
    for text in texts:
        assert page.get_by_text(text, exact=False).count() > 0, (url, text)
    assert page.locator(f"{CHART} .marks").count() >= min_charts, url
    errors = page.locator('[data-testid="stAlertContentError"]').all_inner_texts()
    assert [e for e in errors if not any(x in e for x in expected_errors)] == [], (url, errors)
    assert text_problems(page) == [], url
    shown = hidden + display_problems(page, node_names=node_names)
    if _path(url) in REPORT_ONLY:
        if shown:
            with (REPO / "artifacts" / "report-only.txt").open("a") as log:
                log.writelines(f"{url}\t{p}\n" for p in shown)
    else:
        assert shown == [], f"{url}: what a person should not see:\n" + "\n".join(shown)
    problems = watch.problems()
    assert problems == [], f"{url}: {problems}"


def metrics(page: object) -> dict[str, str]:
    """Every ``st.metric`` on the page: its label -> the value it shows."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    out = {}
    for text in page.locator('[data-testid="stMetric"]').all_inner_texts():
        lines = [x.strip() for x in text.split("\n") if x.strip()]
        if len(lines) >= 2:
            out[lines[0]] = lines[-1]
    return out


def fleet_counts_add_up(page: object) -> dict[str, int]:
    """Fleet's device counts as numbers, failing unless allocated = in use + allocated but idle +
    collecting (every held device in exactly one group: a verdict, or its window still filling)."""
    shown = metrics(page)
    names = ("Allocated", "In use", "Allocated but idle", "Collecting")
    assert all(n in shown for n in names), shown
    got = {n: int(shown[n].replace(",", "")) for n in names}
    assert got["Allocated"] == got["In use"] + got["Allocated but idle"] + got["Collecting"], got
    return got
