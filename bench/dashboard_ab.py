"""First loads of every dashboard page, this tree against an earlier commit, interleaved in one run.

    .venv/bin/python -m bench.dashboard_ab --ref 09807f6 --ref-path /tmp/plotly-site --runs 5

Both dashboards scrape the same simulated exporter (``--sim.scenario``); ``--ref`` is unpacked with
``git archive`` into a temporary directory and run with this tree's virtual environment, plus
``--ref-path`` in front of its ``PYTHONPATH`` for a dependency that this tree dropped (Plotly, for a
commit before the charts moved to Vega-Lite: ``uv pip install --target /tmp/plotly-site plotly``).
Each run opens every page once on each dashboard, alternating, each load in a new browser context
(no cached JavaScript), timed from navigation until the footer and every chart are drawn and
nothing is stale. Interleaving puts both under the same machine load, which on a shared machine
moves more than the difference being measured. Prints the medians, their ratio and the load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from io import BytesIO
from pathlib import Path
from typing import Any

from tests.support.browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.exporter import run_exporter
from tests.support.net import free_port
from tests.support.process import managed_process

REPO = Path(__file__).resolve().parents[1]
PAGES = {"": 1, "efficiency": 2, "workloads": 1, "sharing": 0, "health": 1, "gpu": 3}
"""Every page (url path) and the charts it draws at least for the h200x8 scenario: without a minimum
a page whose chart library is still loading (no chart element yet) would count as drawn."""
DRAWN_JS = """n => {
    const captions = [...document.querySelectorAll('[data-testid="stCaptionContainer"]')];
    if (!captions.some(c => c.innerText.includes('rendered in'))) return false;
    if (document.querySelector('[data-stale="true"]')) return false;
    const charts = [...document.querySelectorAll('[data-testid="stVegaLiteChart"], [data-testid="stPlotlyChart"]')];
    return charts.length >= n && charts.every(c => c.querySelector('.marks, .main-svg'));
}"""
"""Drawn: the footer is there, nothing is stale, and every chart (Vega-Lite or Plotly) has its marks."""


@contextmanager
def dashboard(root: Path, exporter: str, extra_path: str, log: Path) -> Iterator[str]:
    """``python -m dashboard --scrape EXPORTER`` from ``root``; yields its URL once healthy."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), extra_path) if p)}
    argv = [sys.executable, "-m", "dashboard", "--scrape", exporter.removeprefix("http://"), "--port", str(port),
            "--address", "127.0.0.1", "--refresh", "0"]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with managed_process(argv, f"{url}/_stcore/health", log=log, timeout=120, cwd=root, env=env):
        yield url


def unpack(ref: str, into: Path) -> Path:
    """The tree of commit ``ref`` (``git archive``) under ``into``."""
    blob = subprocess.run(["git", "-C", str(REPO), "archive", ref], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")
    return into


def first_load(browser: Any, url: str, charts: int) -> float:
    """Seconds from navigation to a drawn page in a new browser context."""
    context = browser.new_context(viewport={"width": 1400, "height": 6000})
    page = context.new_page()
    started = time.perf_counter()
    page.goto(url)
    page.wait_for_function(DRAWN_JS, arg=charts, timeout=120_000, polling=20)
    took = time.perf_counter() - started
    context.close()
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="dashboard first loads: this tree vs an earlier commit")
    p.add_argument("--ref", required=True, help="the commit to compare with")
    p.add_argument("--ref-path", default="", help="extra PYTHONPATH entry for the commit's own dependencies")
    p.add_argument("--scenario", default="h200x8")
    p.add_argument("--runs", type=int, default=5)
    a = p.parse_args(argv)
    from playwright.sync_api import sync_playwright

    took: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="gpulens-ab-") as tmp_s, ExitStack() as es:
        tmp = Path(tmp_s)
        exporter = es.enter_context(run_exporter("--sim.scenario", a.scenario))
        old = es.enter_context(dashboard(unpack(a.ref, tmp / "ref"), exporter, a.ref_path, tmp / "ref.log"))
        new = es.enter_context(dashboard(REPO, exporter, "", tmp / "new.log"))
        sides = ((a.ref, old), ("this tree", new))
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            for _name, url in sides:  # start each source's scraping and warm the static files; not timed
                first_load(browser, f"{url}/?range=1h", 1)
            time.sleep(10)  # a few scrapes of history
            for _ in range(a.runs):
                for path, charts in PAGES.items():
                    for name, url in sides:
                        took.setdefault((path or "fleet", name), []).append(
                            first_load(browser, f"{url}/{path}?range=1h", charts)
                        )
            browser.close()
    print(f"first load, median of {a.runs} (s): {a.ref} vs this tree, scenario {a.scenario}")
    print(f"{'page':<11} {a.ref:>10} {'this tree':>10} {'ratio':>6}")
    for path in PAGES:
        page = path or "fleet"
        before, after = statistics.median(took[(page, a.ref)]), statistics.median(took[(page, "this tree")])
        print(f"{page:<11} {before:>10.2f} {after:>10.2f} {after / before:>6.2f}")
    print(f"nproc={os.cpu_count()}  load average at the end {[round(x, 2) for x in os.getloadavg()]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
