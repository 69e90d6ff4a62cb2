"""A page's queries go to Prometheus at once, not one after another: a counting proxy in front of a
real Prometheus sees several of the Fleet page's queries in flight together, and each query of
the page exactly once (the panels read the prefetched answers from the cache)."""

from __future__ import annotations

import math
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.support.markdown import shown
from tests.support.prometheus import run_prometheus

pytestmark = pytest.mark.integration

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")
HOLD_S = 0.3
"""Each proxied query is held this long, so queries sent together are seen together."""


class CountingProxy:
    """Forwards GETs and POSTs to ``upstream``; counts queries and the most in flight at once."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.queries: Counter[str] = Counter()

    def forward(self, handler: BaseHTTPRequestHandler, body: bytes | None) -> None:
        key = handler.path.split("?", 1)[0] + "?" + (body.decode() if body else handler.path.partition("?")[2])
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.queries[key] += 1
        try:
            time.sleep(HOLD_S)
            headers = {"Content-Type": handler.headers.get("Content-Type", "application/x-www-form-urlencoded")}
            req = urllib.request.Request(self.upstream + handler.path, data=body, headers=headers)
            with urllib.request.urlopen(req, timeout=30) as resp:
                status, payload = resp.status, resp.read()
        finally:
            with self.lock:
                self.in_flight -= 1
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)


@pytest.fixture
def proxy() -> Iterator[tuple[CountingProxy, str]]:
    with run_prometheus("global: {scrape_interval: 1m}\nscrape_configs: []\n") as prom:
        counting = CountingProxy(prom)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                counting.forward(self, None)

            def do_POST(self) -> None:
                counting.forward(self, self.rfile.read(int(self.headers.get("Content-Length", "0"))))

            def log_message(self, *args: object) -> None:
                return

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield counting, f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()


def test_the_fleet_page_sends_its_queries_together_and_each_once(
    proxy: tuple[CountingProxy, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    counting, url = proxy
    monkeypatch.delenv("GPULENS_DASHBOARD_SCRAPE", raising=False)
    monkeypatch.setenv("GPULENS_DASHBOARD_PROMETHEUS", url)
    monkeypatch.setenv("GPULENS_DASHBOARD_REFRESH_SECONDS", "0")
    at = AppTest.from_file(APP, default_timeout=120).run()
    assert not at.exception, [e.value for e in at.exception]
    assert shown(at.title[0].value) == "Fleet"
    queries = {k: n for k, n in counting.queries.items() if "/api/v1/query" in k}
    assert len(queries) >= 8, queries  # the page's nine panels' queries (fewer if two are the same)
    assert counting.max_in_flight >= 4, "the page's queries were sent one after another"
    assert max(queries.values()) == 1, {k: n for k, n in queries.items() if n > 1}


def test_a_range_answer_is_cached_by_its_step_aligned_end(
    proxy: tuple[CountingProxy, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Workloads page's allocation activity over 24 h is evaluated at the range's step-aligned
    end (18 min steps): once that instant is a minute old, every session asking within the step
    gets the one answer, after the 10 s cache of the rest expired (issue 54); the next step asks
    Prometheus again."""
    from dashboard import ui
    from dashboard.settings import DashboardSettings
    from dashboard.sources.prometheus import PrometheusSource
    from dashboard.sources.source import Filters, Window

    counting, url = proxy
    ctx = ui.PageContext(DashboardSettings(prometheus_url=url), PrometheusSource(url), Filters(), 86400.0, 360.0, None)
    step = 1080.0
    aligned = math.floor(time.time() / step) * step - step  # a step that has ended: its samples are in
    kwargs = {"window": Window(86400.0), "step_s": step}
    sent = []
    for now in (aligned + 100.0, aligned + 700.0, aligned + step + 100.0):
        monkeypatch.setattr(ui, "clock", lambda now=now: now)
        ui._cached.clear()  # the 10 s cache of everything else has expired
        ui._call(ctx, "allocation_activity", (Filters(),), dict(kwargs))
        sent.append(sum(n for k, n in counting.queries.items() if "/api/v1/query" in k))
    assert sent[0] >= 4, counting.queries  # its four queries
    assert sent[1] == sent[0], "asked again within the same step"
    assert sent[2] == 2 * sent[0], "the next step is a new answer"


def test_the_efficiency_page_asks_the_class_now_for_the_labels_it_reads_only(
    proxy: tuple[CountingProxy, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Efficiency page's class now (the boundness state set's current series, one per leaf)
    comes with only the labels the page reads (``max by``), not every label of every series: at
    10,000 GPUs an answer of 10,000 series the page decodes and frames (issue 54)."""
    from urllib.parse import parse_qs

    from dashboard.frames.fleet import BOUNDNESS_NOW_LABELS

    counting, url = proxy
    monkeypatch.delenv("GPULENS_DASHBOARD_SCRAPE", raising=False)
    monkeypatch.setenv("GPULENS_DASHBOARD_PROMETHEUS", url)
    monkeypatch.setenv("GPULENS_DASHBOARD_REFRESH_SECONDS", "0")
    at = AppTest.from_file(APP, default_timeout=120)
    at.switch_page("views/efficiency.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert shown(at.title[0].value) == "Efficiency"
    sent = [q for k in counting.queries for q in parse_qs(k.partition("?")[2]).get("query", [])]
    now = [q for q in sent if "gpulens_gpu_boundness" in q and "== 1" in q]
    assert now == [f"max by ({','.join(BOUNDNESS_NOW_LABELS)}) (gpulens_gpu_boundness == 1)"], sent
