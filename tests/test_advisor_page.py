"""The Right-sizing page degrades the way a user expects: a direct-scrape dashboard says the page
needs Prometheus, an empty Prometheus says there is no data, a failing query becomes a banner."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.fixtures.dashboard.fake_prometheus import serve_exposition
from tests.support.markdown import shown

pytestmark = pytest.mark.integration

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")


@contextmanager
def tiny_prometheus(fail_subqueries: bool) -> Iterator[str]:
    """Answers every query with an empty vector, or HTTP 422 for the advisor's subqueries."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
            query = urllib.parse.parse_qs(body).get("query", [""])[0]
            doc: dict[str, object]
            if fail_subqueries and "_over_time(" in query:
                code, doc = 422, {"status": "error", "errorType": "execution", "error": "query timed out in eval"}
            else:
                code, doc = 200, {"status": "success", "data": {"resultType": "vector", "result": []}}
            data = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture()
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in ("PROMETHEUS", "SCRAPE"):
        monkeypatch.delenv(f"GPULENS_DASHBOARD_{key}", raising=False)
    monkeypatch.setenv("GPULENS_DASHBOARD_REFRESH_SECONDS", "0")
    return monkeypatch


def _page(at: AppTest) -> AppTest:
    at.run()
    at.switch_page("views/rightsizing.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert shown(at.title[0].value) == "Right-sizing"
    return at


def test_direct_scrape_source_explains_that_prometheus_is_needed(env: pytest.MonkeyPatch) -> None:
    with serve_exposition("h200x8.prom") as urls:
        env.setenv("GPULENS_DASHBOARD_SCRAPE", ",".join(urls))
        at = _page(AppTest.from_file(APP, default_timeout=60))
    assert any("--prometheus URL" in shown(i.value) for i in at.info)
    assert not at.error


def test_empty_prometheus_says_no_data(env: pytest.MonkeyPatch) -> None:
    with tiny_prometheus(fail_subqueries=False) as url:
        env.setenv("GPULENS_DASHBOARD_PROMETHEUS", url)
        at = _page(AppTest.from_file(APP, default_timeout=60))
    assert any("No workload held a GPU in the window." in shown(i.value) for i in at.info)
    assert not at.error
    assert "Jobs" not in [shown(h.value) for h in at.subheader], "no workload held a GPU: no job did either"


def test_failing_query_is_a_banner_not_a_traceback(env: pytest.MonkeyPatch) -> None:
    with tiny_prometheus(fail_subqueries=True) as url:
        env.setenv("GPULENS_DASHBOARD_PROMETHEUS", url)
        at = _page(AppTest.from_file(APP, default_timeout=60))
    errors = [shown(e.value) for e in at.error]
    assert [e for e in errors if "Right-sizing" in e and "timed out" in e], errors
    assert not [e for e in errors if e.startswith("Jobs")], "one banner: the jobs' queries are not sent"
    assert shown(at.main.caption[-1].value).startswith("gpulens ·"), "the page ran to its end"
