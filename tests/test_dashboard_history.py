"""Honest time, in headless Chromium: what the dashboard says when its history is not the range.

One Prometheus holds a backfilled week of raw series (the advisor's workloads on node-a and
node-b: promtool, as after a migration) with the recording rules backfilled over its last day
only (as if loaded a day ago), and scrapes a
simulated exporter that started seconds ago (node-0, whose GPU 3 is lost). A second dashboard
scrapes that exporter itself. Both modes, every page, the checks of the other browser tests
(tests/support/browser.py ``check_page``), and what each case must say:

- the backfilled week: the pages read the whole week without a history banner, and Workloads warns
  that the rules hold only a day of it (and shows that day's waste) while Right-sizing, on the raw
  series, finds the week's;
- the node with no history yet: a banner says how much of the range the figures cover, means say
  what they are over, and no wasted GPU-hours are shown before a full idle window;
- the lost GPU: its page says LOST and since when, never "needs GPM" or "no clock event".
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

import pytest
import requests

from dashboard import definitions
from dashboard.advisor.backfill import write_openmetrics
from tests.support.browser import (
    PAGES,
    PageWatch,
    check_page,
    chromium_page,
    fleet_counts_add_up,
    load,
    run_dashboard,
)
from tests.support.exporter import run_exporter
from tests.support.prometheus import (
    FLEET_RECORDS,
    RULES_FILE,
    backfill_recording_rules,
    demo_scrape_config,
    run_prometheus,
    wait_for_query,
)

pytestmark = [pytest.mark.integration, pytest.mark.long]

REPO = Path(__file__).resolve().parents[1]
LOST_GPU = "3"
YOUNG = "node-0"
"""The simulated exporter's node (its NODE_NAME: the exporter labels every series with it)."""
HISTORY_BANNER = "History covers"
LOST_BANNER = ("GPU(s) lost or unreadable", "Alert GPULost firing")
"""The error banners the lost GPU rightly raises on the pages that list GPUs' health (Fleet's
status summary too, with the GPULost alert once it fires)."""
YOUNG_TEXTS = {
    "": ["SM activity per GPU"],
    "efficiency": ["Boundness over time"],
    "workloads": PAGES["workloads"],
    "sharing": PAGES["sharing"],
    "health": ["Xid errors", "ECC errors"],
}
"""The pages the young node is checked on and what each must show (the sim h200x8 node)."""


class Stores(NamedTuple):
    """The module's dashboards and what the tests check them against."""

    prometheus: str
    """The Prometheus-mode dashboard's URL (the week and the young node)."""
    scrape: str
    """The scrape-mode dashboard's URL (the young node only)."""
    lost_uuid: str
    exporter_started: float
    """Unix time the young node's exporter started (its history in Prometheus begins then)."""
    scrape_started: float
    """Unix time the scrape-mode dashboard started (its history begins then)."""


def _lost_uuid(exporter: str) -> str:
    for line in requests.get(f"{exporter}/metrics", timeout=10).text.splitlines():
        if line.startswith("gpulens_gpu_up{") and f'gpu="{LOST_GPU}"' in line and line.endswith(" 0.0"):
            return line.split('uuid="', 1)[1].split('"', 1)[0]
    raise AssertionError("the exporter does not export its lost GPU with gpu_up 0")


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    """The dashboards, the lost GPU and when each young history began."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run the README test command (scripts/test.sh)")
    tmp = tmp_path_factory.mktemp("week")
    om, data = tmp / "week.om", tmp / "data"
    end = float(int(time.time()))
    with om.open("w") as out:
        write_openmetrics(out, days=7, interval_s=240, end=end)
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=240h", str(om),
                    str(data)], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    # the rules over the last day but ten minutes (out of the live head's way)
    backfill_recording_rules(data, end - 86400.0, end - 600.0, tmp, FLEET_RECORDS)
    with ExitStack() as es:
        exporter_started = time.time()
        exporter = es.enter_context(
            run_exporter("--sim.scenario", "h200x8", "--sim.faults", f"lost={LOST_GPU}", env={"NODE_NAME": YOUNG})
        )
        prom = es.enter_context(
            run_prometheus(
                demo_scrape_config([exporter], rules=True),
                {"gpulens.rules.yml": RULES_FILE.read_text()},
                storage_dir=str(data),
                extra_args=["--storage.tsdb.retention.time=30d"],
            )
        )
        wait_for_query(prom, f'gpulens_gpu_up{{node="{YOUNG}"}}', lambda r: len(r) == 8)
        wait_for_query(prom, "gpulens:pod_gpu_wasted:gpus")
        time.sleep(5)  # a few seconds of the young node's history
        dash = es.enter_context(run_dashboard("--prometheus", prom, "--price-per-gpu-hour", "H200=3.5,H100=2.5"))
        scrape_started = time.time()
        scrape = es.enter_context(run_dashboard("--scrape", exporter, "--scrape-interval", "1"))
        yield Stores(dash, scrape, _lost_uuid(exporter), exporter_started, scrape_started)


def _banner(page: object) -> str:
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    boxes = page.locator('[data-testid="stAlertContentInfo"]')
    return "\n".join(t for t in (boxes.nth(i).inner_text() for i in range(boxes.count())) if HISTORY_BANNER in t)


@pytest.mark.parametrize("mode", ["prometheus", "scrape"])
def test_a_node_with_no_history_yet_says_how_much_the_figures_cover(
    stores: Stores, mode: str, artifacts_dir: Path
) -> None:
    dash = stores.prometheus if mode == "prometheus" else stores.scrape
    started = stores.exporter_started if mode == "prometheus" else stores.scrape_started
    where = f"node={YOUNG}&" if mode == "prometheus" else ""
    out = artifacts_dir / "dashboard"
    out.mkdir(exist_ok=True)
    with chromium_page() as page:
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        watch = PageWatch(page, dash)
        for path, texts in YOUNG_TEXTS.items():
            shot = out / f"young-{mode}-{path or 'fleet'}.png"
            check_page(page, watch, f"{dash}/{path}?{where}range=1h", texts, 0, shot, LOST_BANNER)
            banner = _banner(page)
            assert "of the 1h 00m asked" in banner, (path, banner)
            if path == "":
                assert page.get_by_text("of history in the last 1h 00m").count() > 0
                # the status summary names the lost GPU first, and the counts add up
                lost = page.locator('[data-testid="stAlertContentError"]', has_text="GPU(s) lost or unreadable:")
                assert lost.count() >= 1 and f"GPU {LOST_GPU}" in lost.first.inner_text(), lost.all_inner_texts()
                fleet_counts_add_up(page)
            if path == "workloads":
                # these tests run first, a minute or two into the history: no waste yet (a slow
                # machine past the window checks the other side: the figure is then shown)
                waiting = page.get_by_text("Wasted GPU-hours start once the history holds a full idle window").count()
                shown = page.locator('[data-testid="stMetric"]').filter(has_text="Wasted GPU-hours").count()
                young = time.time() - started < definitions.MEAN_WINDOW_SECONDS - 60
                assert (waiting, shown) == ((1, 0) if young else (0, 1)), time.time() - started


def test_a_backfilled_week_is_read_whole_and_workloads_says_what_the_rules_miss(
    stores: Stores, artifacts_dir: Path
) -> None:
    dash = stores.prometheus
    out = artifacts_dir / "dashboard"
    out.mkdir(exist_ok=True)
    with chromium_page() as page:
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        watch = PageWatch(page, dash)
        for path in ("", "efficiency", "workloads", "sharing", "health", "rightsizing"):
            shot = out / f"week-{path or 'fleet'}.png"
            check_page(page, watch, f"{dash}/{path}?range=7d", [], 0, shot, LOST_BANNER)
            assert _banner(page) == "", (path, _banner(page))
        load(page, f"{dash}/workloads?range=7d", 1)
        if os.environ.get("GPULENS_UPDATE_DOCS_IMG"):
            page.screenshot(path=str(REPO / "docs" / "img" / "dashboard-workloads.png"), full_page=True)
        warning = page.locator('[data-testid="stAlertContentWarning"]').all_inner_texts()
        # the rules' day, to the search's resolution (a 7-day range is searched in 42-minute steps)
        said = re.compile(r"The recording rules hold wasted hours for only (?:2[23]h \d+m|1d 0h) of the 7d 0h")
        assert any(said.search(w) for w in warning), warning
        assert any("Right-sizing reads the raw series" in w for w in warning), warning
        wasted = page.locator('[data-testid="stMetric"]').filter(has_text="Wasted GPU-hours").inner_text()
        day = float(wasted.split("\n")[-1].replace(",", ""))
        assert day > 10, wasted
        # the advisor, on the raw series, finds the week's idle hours the rules do not hold
        load(page, f"{dash}/rightsizing", 0)
        saveable = page.locator('[data-testid="stMetric"]').filter(has_text="GPU-hours saveable").inner_text()
        assert float(saveable.split("\n")[-1].replace(",", "")) > 3 * day, (saveable, day)


@pytest.mark.parametrize("mode", ["prometheus", "scrape"])
def test_a_lost_gpus_page_says_lost(stores: Stores, mode: str, artifacts_dir: Path) -> None:
    dash = stores.prometheus if mode == "prometheus" else stores.scrape
    uuid = stores.lost_uuid
    with chromium_page() as page:
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        watch = PageWatch(page, dash)
        shot = artifacts_dir / "dashboard" / f"lost-{mode}-gpu.png"
        check_page(page, watch, f"{dash}/gpu?uuid={quote(uuid)}&range=15m", [], 0, shot, ("LOST. ",))
        text = page.locator('[data-testid="stMain"]').inner_text()
        assert "LOST" in text, text[:2000]
        for wrong in ("needs GPM", "No clock event", "not exported now"):
            assert wrong not in text, wrong
