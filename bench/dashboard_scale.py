"""Dashboard render time at fleet scale: 1,000 GPUs on 125 nodes, 24 h of history, in Chromium.

    .venv/bin/python -m bench.dashboard_scale                    # full size (about 2 GB of text)
    .venv/bin/python -m bench.dashboard_scale --gpus 200 --nodes 25 --hours 6

Method: scripts/backfill_fleet.py writes the fleet's history as OpenMetrics (every 120 s), promtool
turns it into TSDB blocks, a Prometheus 2.42 serves them, ``python -m dashboard --prometheus`` runs
on top, and headless Chromium opens Fleet and Workloads with ``?range=24h``. A render is timed from
navigation until the page footer ("rendered in") and every plotly chart are drawn. Three kinds:
``first`` (a browser that never saw the app: Streamlit's JS, a new session, all queries), ``new
session`` (a new tab of a browser that has the static files cached, after the 10 s query cache
expired: all queries again) and ``cached`` (a new tab within the cache TTL). The PromQL the Workloads page sends is
also timed on its own, per call.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dashboard.prometheus_source import PrometheusSource
from dashboard.source import ALLOCATION, SM_ACTIVE
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.net import free_port
from tests.support.process import managed_process

REPO = Path(__file__).resolve().parents[1]
VIEW: dict[str, Any] = {"viewport": {"width": 1400, "height": 1000}}


def _render(context: object, url: str, charts: int, server: list[float] | None = None) -> float:
    """Seconds from navigation to a fully drawn page in a new tab of ``context`` (a new Streamlit
    session); appends the page's own server-side time (its footer) to ``server``."""
    from playwright.sync_api import BrowserContext

    assert isinstance(context, BrowserContext)
    page = context.new_page()
    started = time.perf_counter()
    page.goto(url)
    page.get_by_text("rendered in").first.wait_for(timeout=120_000)
    page.wait_for_function(
        """n => {
            const c = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')];
            return c.length >= n && c.every(x => x.querySelector('.main-svg'));
        }""",
        arg=charts,
        timeout=120_000,
    )
    took = time.perf_counter() - started
    footer = page.get_by_text("rendered in").first.inner_text()
    if server is not None:
        server.append(float(footer.rsplit("rendered in", 1)[1].strip().rstrip("s").strip()))
    if page.get_by_text("no data").count() or page.locator('[data-testid="stAlertContentError"]').count():
        raise RuntimeError(f"{url} rendered without data or with an error banner")
    page.close()
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="dashboard render time on a backfilled Prometheus")
    p.add_argument("--gpus", type=int, default=1000)
    p.add_argument("--nodes", type=int, default=125)
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--interval", type=float, default=120.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", default=str(REPO / "artifacts" / "dashboard" / "scale-bench.json"))
    a = p.parse_args(argv)
    rng = "24h" if a.hours >= 24 else "6h" if a.hours >= 6 else "1h"
    result: dict[str, object] = {"gpus": a.gpus, "nodes": a.nodes, "hours": a.hours, "interval_s": a.interval}
    with tempfile.TemporaryDirectory(prefix="gpulens-scale-") as tmp_s:
        tmp = Path(tmp_s)
        # always fresh: the history must end now, or the pages' instant queries find nothing
        om, data = tmp / "fleet.om", tmp / "data"
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, str(REPO / "scripts" / "backfill_fleet.py"), "--gpus", str(a.gpus), "--nodes",
             str(a.nodes), "--hours", str(a.hours), "--interval", str(a.interval), "--out", str(om)],
            check=True,
        )  # fmt: skip
        om_bytes = om.stat().st_size
        result["generate_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        promtool = shutil.which("promtool") or "promtool"
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        result["promtool_s"] = round(time.perf_counter() - t0, 1)
        om.unlink()
        result["openmetrics_bytes"] = om_bytes
        (tmp / "p.yml").write_text("global: {scrape_interval: 1m}\nscrape_configs: []\n")
        pport, dport = free_port(), free_port()
        prom_url, dash_url = f"http://127.0.0.1:{pport}", f"http://127.0.0.1:{dport}"
        prom = [shutil.which("prometheus") or "prometheus", f"--config.file={tmp / 'p.yml'}",
                f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{pport}"]  # fmt: skip
        dash = [sys.executable, "-m", "dashboard", "--prometheus", prom_url, "--port", str(dport),
                "--address", "127.0.0.1", "--refresh", "0", "--price-per-gpu-hour", "H200=3.5"]  # fmt: skip
        with (
            managed_process(prom, f"{prom_url}/-/ready", log=tmp / "prom.log", timeout=120),
            managed_process(dash, f"{dash_url}/_stcore/health", log=tmp / "dash.log", timeout=120),
        ):
            src = PrometheusSource(prom_url, timeout_s=120)
            calls = {
                "instant gpu_info": lambda: src.instant("gpulens_gpu_info"),
                "instant allocation": lambda: src.instant(ALLOCATION),
                "instant sm_active": lambda: src.instant(SM_ACTIVE),
                f"allocation_activity {rng}": lambda: src.allocation_activity(
                    window_s=a.hours * 3600, step_s=a.hours * 3600 / 80, busy_threshold=0.05
                ),
            }
            query_s = {}
            for name, call in calls.items():
                samples = []
                for _ in range(a.runs):
                    t0 = time.perf_counter()
                    rows = len(call())
                    samples.append(time.perf_counter() - t0)
                query_s[name] = {"median_s": round(statistics.median(samples), 3), "rows": rows}
            result["query"] = query_s
            from playwright.sync_api import sync_playwright

            renders: dict[str, dict[str, float]] = {}
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                for page, path, charts in (("Fleet", "", 1), ("Workloads", "workloads", 1)):
                    url = f"{dash_url}/{path}?range={rng}"
                    server: list[float] = []
                    # a browser that never saw the app: Streamlit's JS is downloaded too
                    first = _render(browser.new_context(**VIEW), url, charts)
                    # a returning user: static files cached, but a new session and new queries
                    returning = browser.new_context(**VIEW)
                    _render(returning, url, charts)
                    cached = [_render(returning, url, charts) for _ in range(a.runs)]
                    fresh = []
                    for _ in range(a.runs):
                        time.sleep(11)  # past the 10 s query cache
                        fresh.append(_render(returning, url, charts, server))
                    renders[page] = {
                        "first_s": round(first, 2),
                        "new_session_median_s": round(statistics.median(fresh), 2),
                        "new_session_max_s": round(max(fresh), 2),
                        "cached_median_s": round(statistics.median(cached), 2),
                        "server_side_median_s": round(statistics.median(server), 2),
                    }
                browser.close()
            result["render"] = renders
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2))
    size_gb = om_bytes / 1e9
    print(f"{a.gpus} GPUs on {a.nodes} nodes, {a.hours:g} h every {a.interval:g} s "
          f"({size_gb:.2f} GB OpenMetrics; generate {result.get('generate_s', '-')} s, "
          f"promtool {result.get('promtool_s', '-')} s)")  # fmt: skip
    print(f"{'page':<10} {'first':>7} {'new session (median/max)':>26} {'cached':>8} {'server side':>12}")
    for page, r in renders.items():
        print(f"{page:<10} {r['first_s']:>6.2f}s {r['new_session_median_s']:>12.2f}s / {r['new_session_max_s']:.2f}s "
              f"{r['cached_median_s']:>10.2f}s {r['server_side_median_s']:>11.2f}s")  # fmt: skip
    for name, q in query_s.items():
        print(f"  query {name:<28} {q['median_s']:.3f} s  ({q['rows']} rows)")
    print(f"nproc={os.cpu_count()}  json: {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
