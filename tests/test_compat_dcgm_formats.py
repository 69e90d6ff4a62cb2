"""DCGM's counters through a real Prometheus in both exposition formats.

dcgm-exporter writes only the text format, where its counters are ``counter`` families named
without ``_total``.  gpulens writes them so in the text format and as ``unknown`` in OpenMetrics,
where a counter's samples must be named ``<family>_total``.  One simulated exporter is scraped
twice through a small proxy that fixes the ``Accept`` header, once per format (Prometheus 2.42
has no per-job ``scrape_protocols``), and Prometheus must ingest both, type each family as written,
and answer the same values and rates for the same names.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from exporter.render.compat_dcgm import FIELDS
from tests.support.exporter import run_exporter
from tests.support.prometheus import query, run_prometheus, wait_for_query

pytestmark = pytest.mark.integration

FORMATS = {
    "text": "text/plain; version=0.0.4",
    "openmetrics": "application/openmetrics-text; version=1.0.0",
}
"""Proxy path (and Prometheus job) -> the ``Accept`` header the exporter is asked with."""
COUNTERS = (
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
)
"""The fields gpulens provides that dcgm-exporter declares ``counter`` (etc/default-counters.csv)."""
WRITTEN_TYPE = {"text": "counter", "openmetrics": "unknown"}


@contextmanager
def _format_proxy(upstream: str) -> Iterator[str]:
    """``http://host:port`` of a server answering ``GET /<format>`` with the exporter's /metrics
    asked for in that format (status, ``Content-Type`` and body passed through)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            accept = FORMATS.get(self.path.strip("/"))
            if accept is None:
                self.send_error(404)
                return
            req = urllib.request.Request(f"{upstream}/metrics", headers={"Accept": accept})
            with urllib.request.urlopen(req, timeout=10) as resp:
                body, ctype = resp.read(), resp.headers["Content-Type"]
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@dataclass(frozen=True)
class Scraped:
    prom: str
    proxy: str


def _config(proxy: str) -> str:
    target = urllib.parse.urlsplit(proxy).netloc
    jobs = "".join(
        f"  - job_name: {fmt}\n    honor_labels: true\n    metrics_path: /{fmt}\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n"
        for fmt in FORMATS
    )
    return "global:\n  scrape_interval: 1s\nscrape_configs:\n" + jobs


@pytest.fixture(scope="module")
def scraped() -> Iterator[Scraped]:
    with ExitStack() as stack:
        exporter = stack.enter_context(run_exporter("--sim.scenario", "h200x8", "--compat.dcgm"))
        proxy = stack.enter_context(_format_proxy(exporter))
        prom = stack.enter_context(run_prometheus(_config(proxy)))
        wait_for_query(
            prom,
            "count by (job) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1m]))",
            lambda r: {x["metric"]["job"]: x["value"][1] for x in r} == {fmt: "8" for fmt in FORMATS},
        )
        time.sleep(2.5)  # the tests query 2 s in the past, where both jobs have scraped
        yield Scraped(prom, proxy)


def _api(base: str, path: str, **params: str) -> Any:
    with urllib.request.urlopen(f"{base}{path}?" + urllib.parse.urlencode(params), timeout=10) as resp:
        doc = json.load(resp)
    assert doc["status"] == "success", doc
    return doc["data"]


def test_the_proxy_serves_each_format_with_the_types_gpulens_writes(scraped: Scraped) -> None:
    assert {f.name for f in FIELDS if f.type == "counter"} == set(COUNTERS)
    for fmt in FORMATS:
        with urllib.request.urlopen(f"{scraped.proxy}/{fmt}", timeout=10) as resp:
            body = resp.read().decode()
        assert body.endswith("# EOF\n") == (fmt == "openmetrics"), fmt
        for name in COUNTERS:
            assert f"# TYPE {name} {WRITTEN_TYPE[fmt]}\n" in body, (fmt, name)
            assert f"\n{name}{{" in body and f"\n{name}_total" not in body, (fmt, name)


def test_prometheus_ingests_both_formats_without_errors(scraped: Scraped) -> None:
    targets = _api(scraped.prom, "/api/v1/targets")["activeTargets"]
    assert {t["scrapePool"]: (t["health"], t["lastError"]) for t in targets} == {fmt: ("up", "") for fmt in FORMATS}


def test_prometheus_types_dcgms_counters_as_written_in_each_format(scraped: Scraped) -> None:
    for name in (*COUNTERS, "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"):
        meta = _api(scraped.prom, "/api/v1/targets/metadata", metric=name)
        got = {m["target"]["job"]: m["type"] for m in meta}
        expected = {fmt: WRITTEN_TYPE[fmt] for fmt in FORMATS} if name in COUNTERS else dict.fromkeys(FORMATS, "gauge")
        assert got == expected, name


def test_both_formats_give_the_same_names_values_and_rates(scraped: Scraped) -> None:
    at = time.time() - 2
    for name in COUNTERS:
        by_job: dict[str, dict[str, float]] = {}
        for r in query(scraped.prom, name, at=at):
            by_job.setdefault(r["metric"]["job"], {})[r["metric"]["UUID"]] = float(r["value"][1])
        assert set(by_job) == set(FORMATS) and len(by_job["text"]) == 8, name
        if name != "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":  # energy may grow between the two scrapes
            assert by_job["text"] == by_job["openmetrics"], name
        # rate() and increase() read either family as the counter it is
        for fn in ("rate", "increase"):
            got = query(scraped.prom, f"count by (job) ({fn}({name}[1m]) >= 0)", at=at)
            assert {r["metric"]["job"]: r["value"][1] for r in got} == dict.fromkeys(FORMATS, "8"), (fn, name)
