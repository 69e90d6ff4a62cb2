"""The running dashboard in headless Chromium over five simulated exporters (8 whole H200s, a MIG
node, a time-sliced node, the MPS node, whose GPU 4 runs a data loader that only copies host
memory to the GPU, and the serving node with its inference engines' own pages), once through a
real Prometheus scraping them and once scraping them itself: every page loads with its key
elements and without a Streamlit exception, a Python repr or Streamlit internals in its text, a
console error, or a request to any host but the dashboard's, and without what a person should not
read: a raw column name as a table header, a ``None``/``NaN`` cell, a long number without
thousands separators, a metric name or a JSON dump (tests/support/browser.py ``display_problems``).
Screenshots land in artifacts/dashboard/; a dead Prometheus gives a banner, not a dead app."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml

from tests.support.browser import (
    MIN_CHARTS,
    PAGES,
    SERVING_TEXTS,
    PageWatch,
    check_page,
    chromium_page,
    exports_node_name,
    fleet_counts_add_up,
    load,
    run_dashboard,
)
from tests.support.engines import engines_job, run_engines
from tests.support.exporter import run_exporter
from tests.support.prometheus import demo_scrape_config, run_prometheus, wait_for_query
from tests.support.prometheus import query as prom_query

pytestmark = [pytest.mark.integration, pytest.mark.long]

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "deploy" / "rules" / "gpulens.rules.yml"
MODES = ("prometheus", "scrape")
SCENARIOS = ("h200x8", "mig", "timeslice", "mps", "serving")
MOVING_DOCS = ("efficiency", "gpu")
"""The pages whose docs screenshot the data-moving GPU's test takes (docs/img/dashboard-PAGE.png)."""
JOBS_DOCS = ("", "jobs", "job")
"""The pages whose docs screenshot the jobs nodes' test takes (Fleet too: its verdicts need the
five minutes of history that test waits for; this stack's are still collecting)."""
HISTORY_DOCS = ("workloads",)
"""The pages whose docs screenshot the backfilled week's test takes (tests/test_dashboard_history.py:
wasted hours need a full idle window of history, which this stack's seconds do not hold)."""
"""The simulated nodes, named by their scenario (the exporters' NODE_NAME); the mps node's GPU 4
moves data (class transfer)."""


@pytest.fixture(scope="module")
def stack(artifacts_dir: Path) -> Iterator[tuple[str, str, str]]:
    """Four sim exporters, a Prometheus scraping them every second, a dashboard on it and a
    dashboard scraping the exporters itself: (Prometheus URL, Prometheus-mode URL, scrape-mode URL)."""
    with ExitStack() as es:
        targets = [es.enter_context(run_exporter("--sim.scenario", sc, env={"NODE_NAME": sc})) for sc in SCENARIOS]
        # the serving node's inference engines, scraped by docs/serving.md's job (Prometheus only:
        # the exporters, and so the scrape source, never read application pods)
        sd = es.enter_context(run_engines(artifacts_dir))
        config = yaml.safe_load(demo_scrape_config(targets, rules=True))
        config["scrape_configs"].append(engines_job(sd, cluster="demo"))
        config = yaml.safe_dump(config)
        prom = es.enter_context(run_prometheus(config, {"gpulens.rules.yml": RULES.read_text()}))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (
                len(prom_query(prom, "gpulens_gpu_info")) >= 40
                and prom_query(prom, "gpulens_probe_efficiency_ratio")
                and prom_query(prom, "gpulens:serving_model_gpus:sum")
            ):
                break
            time.sleep(0.5)
        else:
            pytest.fail("Prometheus never saw the exporters' GPUs, a probe result and a served model's GPUs")
        time.sleep(5)  # a few seconds of history for the range panels
        dash = es.enter_context(
            run_dashboard("--prometheus", prom, "--price-per-gpu-hour", "H200=3.5", *SERVING_TARGETS)
        )
        scrape = es.enter_context(
            run_dashboard("--scrape", ",".join(targets), "--scrape-interval", "1", "--price-per-gpu-hour", "H200=3.5")
        )
        NODE_NAMES[:] = [exports_node_name(targets[0])]
        yield prom, dash, scrape


ITL_TARGETS = "Qwen/Qwen2.5-32B-Instruct=40ms,meta-llama/Llama-3.1-70B-Instruct=50ms"
"""The Prometheus dashboard's latency targets: the aggregated Qwen 32 B decodes at about 49 ms a token
(exporter/sim/serving.py: missed), the Llama 70 B decode worker at about 32 ms (met); the other
models are held against today's p95 + 25 %."""
TTFT_TARGETS = "Qwen/Qwen2.5-32B-Instruct=100ms"
"""The Prometheus dashboard's one TTFT target: the aggregated Qwen 32 B's first token takes about
160 ms (a 900-token prompt's prefill and two decode steps, exporter/sim/serving.py): missed; the
other models have no TTFT target."""
SERVING_TARGETS = ("--itl-target", ITL_TARGETS, "--ttft-target", TTFT_TARGETS)
"""The Prometheus dashboard's latency target flags."""
SERVING_JOB = "inference/DynamoGraphDeployment/llama-70b-disagg"
"""The serving node's disaggregated job: a prefill and a decode pod, roles declared (and a frontend
that holds no GPU, so is not among the job's pods)."""
SERVING_ROW = "Each pod here that serves a model"
"""The start of the Serving row's caption on the job and GPU pages (dashboard/serving_rows.py)."""
SERVING_ROW_SCRAPE = "Serving: the tokens, latency and KV cache of the pods that serve models here need Prometheus"
"""What the job and GPU pages say in its place in scrape mode."""


def _drawn(page: object) -> set[str]:
    """Every string drawn in the loaded page's tables (tests/support/browser.py DRAWN_TEXT_HOOK)."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    return {str(t).strip() for t in page.evaluate("() => [...(window.__gpulensDrawn || [])]")}


def _table_cells(page: object, key: str, shot: Path) -> set[str]:
    """The strings drawn once the page's one table of layout ``key`` is scrolled into view
    (Streamlit draws a table's cells on a canvas, only where seen), with a screenshot there."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    table = page.locator(f'[class*="st-key-gpulens-table-{key}-"]')
    assert table.count() == 1, page.locator("body").inner_text()[-1500:]
    table.scroll_into_view_if_needed()
    page.wait_for_timeout(1000)
    page.screenshot(path=str(shot))
    return _drawn(page)


def _serving_gpu(prom: str) -> str:
    """The UUID of a GPU the aggregated Qwen 32 B Deployment holds (its role inferred: decode)."""
    rows = prom_query(prom, 'gpulens_pod_gpu_allocation{workload="qwen-32b-vllm"}')
    assert rows, "the serving node's qwen-32b-vllm pods hold no GPU"
    return str(rows[0]["metric"]["uuid"])


NODE_NAMES: list[bool] = []
"""Whether the stack's exporters name their node (``node`` label, from NODE_NAME): then the pages
must show node names, never an exporter's address."""


@pytest.mark.parametrize("mode", MODES)
def test_every_page_loads_clean_with_its_key_elements(
    stack: tuple[str, str, str], mode: str, artifacts_dir: Path
) -> None:
    _prom, prom_dash, scrape_dash = stack
    dash = prom_dash if mode == "prometheus" else scrape_dash
    out = artifacts_dir / "dashboard"
    out.mkdir(exist_ok=True)
    with chromium_page() as page:
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        watch = PageWatch(page, dash)
        for path, texts in PAGES.items():
            name = f"{mode}-{path or 'fleet'}"
            # 15 minutes: a 4 s step, so the few seconds of history already give range points
            charts = MIN_CHARTS[path]
            if path == "serving":
                texts = [*texts, *SERVING_TEXTS[mode]]
                charts = 2 if mode == "prometheus" else 0  # tokens/s and ITL p95 over time
            check_page(page, watch, f"{dash}/{path}?range=15m", texts, charts, out / f"{name}.png",
                       node_names=all(NODE_NAMES))  # fmt: skip
            if path == "":
                # every held device in one group: in use, idle, or its 5-minute window still filling
                fleet_counts_add_up(page)
            if path == "serving" and mode == "prometheus":
                # each model's ITL p95 over the window against its target: given, or today's p95 + 25 %
                cells = _table_cells(page, "serving_advice", out / f"{name}-advice.png")
                assert {"met", "missed"} <= cells, sorted(cells)
                # and its TTFT p95 against the one TTFT target given (Qwen 32 B's 100 ms: missed)
                assert {"TTFT p95 target", "TTFT against target", "100 ms", "no target"} <= cells, sorted(cells)
                # where each ITL target comes from, and the TTFT p95 over the window: in the expander
                page.get_by_text("More columns: ITL target from, TTFT p95 (window)").click()
                page.wait_for_timeout(1000)
                page.screenshot(path=str(out / f"{name}-advice-more.png"))
                cells = _drawn(page)
                assert {"given", "today's p95 + 25 %", "ITL target from", "TTFT p95 (window)"} <= cells, sorted(cells)
                # the disaggregated pair's KV transfer: NVLink and EFA bytes by role, and their share
                cells = _table_cells(page, "serving_links", out / f"{name}-kv.png")
                rates = {c for c in cells if re.fullmatch(r"[\d.]+ [MGT]B/s", c)}
                assert len(rates) >= 2 and {"prefill", "decode"} <= cells, sorted(cells)
            if path == "gpu":
                # the first GPU of the picker (the h200x8 node's GPU 0) serves nothing: no Serving row
                assert page.get_by_text(SERVING_ROW).count() == 0, "a Serving row where no pod serves"
            if (
                mode == "prometheus"
                and path not in ("rightsizing", "network", *MOVING_DOCS, *JOBS_DOCS, *HISTORY_DOCS)
                and os.environ.get("GPULENS_UPDATE_DOCS_IMG")
            ):
                # the docs' screenshots (the right-sizing one comes from the advisor's test, with
                # data; Efficiency and GPU from the data-moving GPU's test, with a minute of link
                # rates; Fleet, Jobs and Job from the jobs nodes' test, past the verdicts' window;
                # Network from the network test's two p5en nodes)
                shutil.copy(out / f"{name}.png", REPO / "docs" / "img" / f"dashboard-{path or 'fleet'}.png")
        # the Serving row of the job and GPU pages where a pod serves: the disaggregated job's two
        # pods (roles declared), a Qwen 32 B replica's GPU (role inferred); in scrape mode, in words
        # that it needs Prometheus
        cluster = "&job_cluster=demo" if mode == "prometheus" else ""
        serving = {
            "job": (f"job={SERVING_JOB}{cluster}", {"prefill", "decode", "meta-llama/Llama-3.1-70B-Instruct"}),
            "gpu": (f"uuid={_serving_gpu(_prom)}", {"decode (inferred)", "Qwen/Qwen2.5-32B-Instruct"}),
        }
        for path, (params, cells) in serving.items():
            texts = [*PAGES[path], SERVING_ROW if mode == "prometheus" else SERVING_ROW_SCRAPE]
            check_page(page, watch, f"{dash}/{path}?range=15m&{params}", texts, MIN_CHARTS[path],
                       out / f"{mode}-serving-{path}.png", node_names=all(NODE_NAMES))  # fmt: skip
            if mode == "prometheus":
                assert cells <= _drawn(page), (path, sorted(_drawn(page)))
            else:
                assert page.get_by_text(SERVING_ROW).count() == 0
        if mode == "prometheus":
            # filters: the relabelled cluster and node labels become sidebar filters
            assert page.get_by_text("Cluster", exact=True).count() > 0
            assert page.get_by_text("Node", exact=True).count() > 0


def test_fleet_page_counts_the_three_nodes(stack: tuple[str, str, str]) -> None:
    _prom, dash, _scrape = stack
    with chromium_page() as page:
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        load(page, dash, 1)
        metric = page.locator('[data-testid="stMetric"]').first
        # 40 GPUs, the MIG node's GPUs counted as their instances: whole GPUs + MIG instances. A
        # page still finishing its run can show a partial count for a moment: wait for it to settle.
        deadline = time.monotonic() + 30.0
        shown = ""
        while time.monotonic() < deadline:
            shown = metric.inner_text().split("\n")[-1].strip()
            if shown == "56":
                break
            time.sleep(0.5)
        assert shown == "56"


@pytest.mark.parametrize(
    ("path", "mark"), [("efficiency", "g.mark-symbol.role-mark path"), ("", "g.mark-rect.role-mark path")]
)
def test_a_click_on_a_gpu_in_a_chart_opens_its_page(stack: tuple[str, str, str], path: str, mark: str) -> None:
    """Roofline points and heatmap cells are GPUs: clicking one opens the GPU page for that GPU,
    keeping the view's range."""
    _prom, _dash, scrape = stack
    with chromium_page() as page:
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        load(page, f"{scrape}/{path}?range=15m", 1)
        # the last mark is drawn on top: points of the three simulated nodes overlap
        target = page.locator(f'[data-testid="stVegaLiteChart"] svg.marks {mark}').last
        target.click()
        page.wait_for_url("**/gpu?**", timeout=30000)
        page.get_by_text("Pods that held this GPU in the range").first.wait_for(timeout=30000)
        url = page.url
        assert "range=15m" in url and "uuid=GPU-" in url, url
        picked = url.split("uuid=")[1].split("&")[0]
        # the GPU page shows the GPU that was clicked (its selectbox names the UUID)
        chosen = page.locator('[data-testid="stMain"] [data-testid="stSelectbox"] input').first.input_value()
        assert chosen.endswith(picked), chosen


def test_fleet_scale_charts_draw_clean(stack: tuple[str, str, str], artifacts_dir: Path) -> None:
    """With fewer marks allowed than the fleet has GPUs (``--max-marks 4`` over 24 GPUs: what a
    fleet of more than 4,000 GPUs gets by default), Fleet draws its SM histogram and Efficiency its
    roofline density, without a console error or a text problem; the node-then-GPU chooser is there."""
    prom, _dash, _scrape = stack
    out = artifacts_dir / "dashboard"
    out.mkdir(exist_ok=True)
    with run_dashboard("--prometheus", prom, "--max-marks", "4") as dash, chromium_page() as page:
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        watch = PageWatch(page, dash)
        check_page(page, watch, f"{dash}/?range=15m", ["GPUs, more than a cell each (4 at most)"], 1,
                   out / "fleet-scale-fleet.png")  # fmt: skip
        assert page.locator("g.mark-rect.role-mark path").count() > 0, "the histogram's bars"
        assert page.get_by_text("Open a GPU's page: node").count() > 0
        check_page(page, watch, f"{dash}/efficiency?range=15m", ["more than a point each (4 at most)"], 2,
                   out / "fleet-scale-efficiency.png")  # fmt: skip
        assert page.locator("g.mark-symbol.role-mark path").count() > 0, "the density's circles"


def _mover(prom: str) -> str:
    """The UUID of the GPU whose class is transfer now (the mps node's data loader), once the
    classifier has called it so."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        rows = prom_query(prom, 'gpulens_gpu_boundness{class="transfer"} == 1')
        if rows:
            return str(rows[0]["metric"]["uuid"])
        time.sleep(1)
    pytest.fail("no GPU of the mps node reached class transfer")


@pytest.mark.parametrize("mode", MODES)
def test_a_gpu_moving_data_is_shown_as_moving_data_with_its_links(
    stack: tuple[str, str, str], mode: str, artifacts_dir: Path
) -> None:
    """The data loader's GPU (NVML GPU-Util 1.0, SM activity 0, PCIe 0.8 busy): Fleet lists it as
    moving data (its class now), never as launch-bound ('busy in nvidia-smi but SMs idle' is a
    5-minute verdict: collecting in this young stack, then the h200x8 node's launcher alone), and
    the counts add up; Efficiency has its link charts and the transfer class; its
    GPU page a links panel with throughput each way and use."""
    prom, prom_dash, scrape_dash = stack
    dash = prom_dash if mode == "prometheus" else scrape_dash
    uuid = _mover(prom)
    # link rates are drawn where a counter is a rate window (a minute) old: wait for that much history
    wait_for_query(prom, "count(gpulens_gpu_pcie_rx_bytes_total offset 70s)", timeout=120)
    out = artifacts_dir / "dashboard"
    out.mkdir(exist_ok=True)
    with chromium_page() as page:
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        watch = PageWatch(page, dash)
        shots = {path: out / f"{mode}-moving-{path or 'fleet'}.png" for path in ("", *MOVING_DOCS)}
        # the class now is instant; "SMs idle over 5 m" (launch-bound or polling) waits for its
        # window, and then names the launch-bound GPU only
        fleet = ["1 GPU moving data: PCIe/NVLink busy, SMs idle"]
        check_page(page, watch, f"{dash}/?range=15m", fleet, 1, shots[""])
        assert page.get_by_text("2 GPU(s) look busy in nvidia-smi").count() == 0, "the loader is not launch-bound"
        fleet_counts_add_up(page)
        efficiency = ["Data movement over PCIe and NVLink", "Throughput of the GPUs in view, GB/s"]
        check_page(page, watch, f"{dash}/efficiency?range=15m", efficiency, 4, shots["efficiency"])
        assert page.locator("svg text", has_text="transfer").count() > 0, "the class in the boundness legend"
        assert page.locator("svg text", has_text="NVLink out").count() > 0, "the view's throughput has its lines"
        gpu = ["Links: PCIe and NVLink", "Throughput, GB/s", "Use, % of capacity"]
        check_page(page, watch, f"{dash}/gpu?range=15m&uuid={uuid}", gpu, 5, shots["gpu"])
        for line in ("PCIe in", "PCIe out", "NVLink in"):
            assert page.locator("svg text", has_text=line).count() > 0, line
        if mode == "prometheus" and os.environ.get("GPULENS_UPDATE_DOCS_IMG"):
            for path in MOVING_DOCS:
                shutil.copy(shots[path], REPO / "docs" / "img" / f"dashboard-{path or 'fleet'}.png")
