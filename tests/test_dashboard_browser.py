"""The running dashboard in headless Chromium over four simulated exporters (8 whole H200s, a MIG
node, a time-sliced node, and the MPS node, whose GPU 4 runs a data loader that only copies host
memory to the GPU), once through a real Prometheus scraping them and once scraping them itself:
every page loads with its key elements and without a Streamlit exception, a Python repr or
Streamlit internals in its text, a console error, or a request to any host but the dashboard's,
and without what a person should not read: a raw column name as a table header, a ``None``/``NaN``
cell, a long number without thousands separators, a metric name or a JSON dump
(tests/support/browser.py ``display_problems``).
Screenshots land in artifacts/dashboard/; a dead Prometheus gives a banner, not a dead app."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.support.browser import MIN_CHARTS, PAGES, PageWatch, check_page, chromium_page, load, run_dashboard
from tests.support.exporter import run_exporter
from tests.support.net import free_port
from tests.support.prometheus import demo_scrape_config, run_prometheus, wait_for_query
from tests.support.prometheus import query as prom_query

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "deploy" / "rules" / "gpulens.rules.yml"
MODES = ("prometheus", "scrape")
SCENARIOS = ("h200x8", "mig", "timeslice", "mps")
MOVING_DOCS = ("", "efficiency", "gpu")
"""The pages whose docs screenshot the data-moving GPU's test takes (docs/img/dashboard-PAGE.png)."""
JOBS_DOCS = ("jobs", "job")
"""The pages whose docs screenshot the jobs nodes' test takes."""
HISTORY_DOCS = ("workloads",)
"""The pages whose docs screenshot the backfilled week's test takes (tests/test_dashboard_history.py:
wasted hours need a full idle window of history, which this stack's seconds do not hold)."""
"""The simulated nodes, node-0 to node-3 in Prometheus (the mps node's GPU 4 moves data: class transfer)."""


@pytest.fixture(scope="module")
def stack(artifacts_dir: Path) -> Iterator[tuple[str, str, str]]:
    """Four sim exporters, a Prometheus scraping them every second, a dashboard on it and a
    dashboard scraping the exporters itself: (Prometheus URL, Prometheus-mode URL, scrape-mode URL)."""
    with ExitStack() as es:
        targets = [es.enter_context(run_exporter("--sim.scenario", sc)) for sc in SCENARIOS]
        config = demo_scrape_config(targets, rules=True)
        prom = es.enter_context(run_prometheus(config, {"gpulens.rules.yml": RULES.read_text()}))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if len(prom_query(prom, "gpulens_gpu_info")) >= 32 and prom_query(prom, "gpulens_probe_efficiency_ratio"):
                break
            time.sleep(0.5)
        else:
            pytest.fail("Prometheus never saw the three exporters' GPUs and a probe result")
        time.sleep(5)  # a few seconds of history for the range panels
        dash = es.enter_context(run_dashboard("--prometheus", prom, "--price-per-gpu-hour", "H200=3.5"))
        scrape = es.enter_context(
            run_dashboard("--scrape", ",".join(targets), "--scrape-interval", "1", "--price-per-gpu-hour", "H200=3.5")
        )
        yield prom, dash, scrape


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
            check_page(page, watch, f"{dash}/{path}?range=15m", texts, MIN_CHARTS[path], out / f"{name}.png")
            if (
                mode == "prometheus"
                and path not in ("rightsizing", *MOVING_DOCS, *JOBS_DOCS, *HISTORY_DOCS)
                and os.environ.get("GPULENS_UPDATE_DOCS_IMG")
            ):
                # the docs' screenshots (the right-sizing one comes from the advisor's test, with
                # data; Fleet, Efficiency and GPU from the data-moving GPU's test, with a minute of
                # link rates; Jobs and Job from the jobs nodes' test)
                shutil.copy(out / f"{name}.png", REPO / "docs" / "img" / f"dashboard-{path or 'fleet'}.png")
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
        # 32 GPUs, the MIG node's GPUs counted as their instances: whole GPUs + MIG instances. A
        # page still finishing its run can show a partial count for a moment: wait for it to settle.
        deadline = time.monotonic() + 30.0
        shown = ""
        while time.monotonic() < deadline:
            shown = metric.inner_text().split("\n")[-1].strip()
            if shown == "48":
                break
            time.sleep(0.5)
        assert shown == "48"


def test_dead_prometheus_gives_a_banner_and_navigation_still_works(artifacts_dir: Path) -> None:
    with run_dashboard("--prometheus", f"http://127.0.0.1:{free_port()}") as dash, chromium_page() as page:
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        page.goto(dash)
        page.get_by_text("is unreachable").first.wait_for(timeout=60000)
        page.get_by_role("link", name="Health").click()
        page.get_by_role("heading", name="Health").wait_for(timeout=30000)
        # the banner is drawn again on the new page, after its title
        page.get_by_text("is unreachable").first.wait_for(timeout=30000)
        assert page.get_by_text("Retry").count() > 0
        (artifacts_dir / "dashboard").mkdir(exist_ok=True)
        page.screenshot(path=str(artifacts_dir / "dashboard" / "prometheus-down.png"))


def test_a_scrape_dashboard_keeps_history_from_its_start() -> None:
    """A dashboard scraping exporters starts scraping as it starts, not when a browser first opens a
    page: that page reads the seconds before it. (It read one scrape, and Fleet's verdicts over 5
    minutes then read a moment: the time-sliced node's notebooks GPU, between two bursts, looked busy
    in nvidia-smi with idle SMs.)"""
    with (
        run_exporter("--sim.scenario", "h200x8") as target,
        run_dashboard("--scrape", target, "--scrape-interval", "1") as dash,
        chromium_page() as page,
    ):
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        time.sleep(5)  # the dashboard runs a while before anyone opens it
        load(page, dash, 1)
        source = page.get_by_text("Source: direct scrape").first.inner_text()
        scrapes = re.search(r"(\d+) scrapes", source)
        assert scrapes is not None and int(scrapes.group(1)) >= 3, source


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
    moving data, and 'busy in nvidia-smi but SMs idle (launch-bound or polling)' keeps only the
    launch-bound GPU of the h200x8 node; Efficiency has its link charts and the transfer class; its
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
        shots = {path: out / f"{mode}-moving-{path or 'fleet'}.png" for path in MOVING_DOCS}
        fleet = ["1 GPU moving data: PCIe/NVLink busy, SMs idle", "1 GPU(s) look busy in nvidia-smi but their SMs"]
        check_page(page, watch, f"{dash}/?range=15m", fleet, 1, shots[""])
        assert page.get_by_text("2 GPU(s) look busy in nvidia-smi").count() == 0, "the loader is not launch-bound"
        efficiency = ["Data movement over PCIe and NVLink", "Throughput of the GPUs in view, GB/s"]
        check_page(page, watch, f"{dash}/efficiency?range=15m", efficiency, 4, shots["efficiency"])
        assert page.locator("svg text", has_text="transfer").count() > 0, "the class in the boundness legend"
        assert page.locator("svg text", has_text="NVLink out").count() > 0, "the view's throughput has its lines"
        gpu = ["Links: PCIe and NVLink", "Throughput, GB/s", "Use, % of capacity"]
        check_page(page, watch, f"{dash}/gpu?range=15m&uuid={uuid}", gpu, 5, shots["gpu"])
        for line in ("PCIe in", "PCIe out", "NVLink in"):
            assert page.locator("svg text", has_text=line).count() > 0, line
        if mode == "prometheus" and os.environ.get("GPULENS_UPDATE_DOCS_IMG"):
            for path, shot in shots.items():
                shutil.copy(shot, REPO / "docs" / "img" / f"dashboard-{path or 'fleet'}.png")


NETWORK_SCENARIOS = ("p5en", "p5en-nogdr")
"""Two simulated p5en workers of one PyTorchJob (32 EFAs each): GPUDirect RDMA ready with a
thermally throttled GPU 5 (the straggler), and not ready (no peer-memory module)."""


@pytest.fixture(scope="module")
def network_stack() -> Iterator[tuple[str, str, str]]:
    """The two p5en exporters, a Prometheus with the rules scraping them every second, and a
    dashboard on each source: (Prometheus URL, Prometheus-mode URL, scrape-mode URL)."""
    with ExitStack() as es:
        targets = [es.enter_context(run_exporter("--sim.scenario", sc)) for sc in NETWORK_SCENARIOS]
        prom = es.enter_context(run_prometheus(demo_scrape_config(targets, rules=True),
                                               {"gpulens.rules.yml": RULES.read_text()}))  # fmt: skip
        wait_for_query(prom, "count(gpulens_nic_info) >= 64", timeout=60)
        dash = es.enter_context(run_dashboard("--prometheus", prom))
        scrape = es.enter_context(run_dashboard("--scrape", ",".join(targets), "--scrape-interval", "1"))
        yield prom, dash, scrape


@pytest.mark.parametrize("mode", MODES)
def test_network_page_shows_the_nics_gpudirect_and_the_straggler(
    network_stack: tuple[str, str, str], mode: str, artifacts_dir: Path
) -> None:
    """What a person sees on the Network page of the two p5en nodes: each node's 32 EFAs with their
    throughput in Gb/s against a 100 Gb/s line rate, GPUDirect RDMA ready on one node and not on the
    other with the reason in words, the pod holding the NICs alone with its throughput and its
    communication share, and the straggler named; the GPU page lists a GPU's nearest NICs."""
    prom, prom_dash, scrape_dash = network_stack
    dash = prom_dash if mode == "prometheus" else scrape_dash
    # NIC rates are drawn where a counter is a rate window (a minute) old
    wait_for_query(prom, "count(gpulens_nic_port_data_transmitted_bytes_total offset 70s)", timeout=150)
    uuid = str(prom_query(prom, 'gpulens_gpu_info{gpu="0",node="node-1"}')[0]["metric"]["uuid"])
    out = artifacts_dir / "dashboard"
    out.mkdir(exist_ok=True)
    with chromium_page() as page:
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        if mode == "scrape":
            # the scrape source's history starts with its dashboard, after Prometheus' first scrape:
            # give it a rate window of its own
            load(page, f"{dash}/network?range=15m")
            time.sleep(75)
        watch = PageWatch(page, dash)
        texts = [
            "NICs: throughput now against the line rate",
            "All 64 NICs in view are up",
            "GPUDirect RDMA ready on all 8 GPUs",
            "GPUDirect RDMA not ready on 8 of 8 GPUs: no peer-memory module or DMA-BUF",
            "Pods holding NICs",
            "llama-70b-pretrain-worker-0",
            "Time in communication per GPU",
            "GPU 5 computes",
        ]
        shot = out / f"{mode}-network.png"
        check_page(page, watch, f"{dash}/network?range=15m", texts, 4, shot)
        body = page.locator("body").inner_text()
        # the tables are drawn on a canvas (their cells are checked in test_dashboard_apptest.py)
        assert page.locator("svg text", has_text="Gb/s each way").count() > 0, "the NIC charts' axis"
        assert page.locator("svg text", has_text="communication").count() > 0, "the class in the legend"
        assert "gpulens_" not in body and "path_sys" not in body and "no_peer_memory" not in body
        gpu = ["Nearest NICs", "GPUDirect RDMA is not ready"]
        check_page(page, watch, f"{dash}/gpu?range=15m&uuid={uuid}", gpu, 3, out / f"{mode}-network-gpu.png")
        assert page.get_by_text("no peer-memory module or DMA-BUF").count() > 0
        if mode == "prometheus" and os.environ.get("GPULENS_UPDATE_DOCS_IMG"):
            shutil.copy(shot, REPO / "docs" / "img" / "dashboard-network.png")


JOBS_SCENARIOS = ("jobs-0", "jobs-1")
"""The simulator's two jobs nodes (exporter/sim/scenarios.py ``_jobs``), node-0 and node-1 in Prometheus:
four two-node jobs of four GPUs, node 1's GPU 3 of mixtral-sft thermally throttled to half clock."""
JOB_NAMES = (
    "ml-training/PyTorchJob/gpt-13b-finetune",
    "ml-training/JobSet/mixtral-sft",
    "research/MPIJob/moe-pretrain",
    "research/Job/embedding-train",
)
STRAGGLER_REASON = "GPU 3: compute: SM clock 50 % of max, thermal slowdown"


@dataclass(frozen=True)
class JobsStack:
    """The two jobs exporters (``targets``), a Prometheus with the rules scraping them every second
    (``prom``), a dashboard on each source, and when they started (``time.monotonic()``)."""

    prom: str
    prom_dash: str
    scrape_dash: str
    targets: list[str]
    started: float


@pytest.fixture(scope="module")
def jobs_stack() -> Iterator[JobsStack]:
    started = time.monotonic()
    with ExitStack() as es:
        targets = [es.enter_context(run_exporter("--sim.scenario", sc)) for sc in JOBS_SCENARIOS]
        prom = es.enter_context(run_prometheus(demo_scrape_config(targets, rules=True),
                                               {"gpulens.rules.yml": RULES.read_text()}))  # fmt: skip
        dash = es.enter_context(run_dashboard("--prometheus", prom))
        scrape = es.enter_context(run_dashboard("--scrape", ",".join(targets), "--scrape-interval", "1"))
        yield JobsStack(prom, dash, scrape, targets, started)


def _metric(page: object, label: str) -> str:
    """The value an ``st.metric`` labelled ``label`` shows (its last line)."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    return page.locator('[data-testid="stMetric"]', has_text=label).first.inner_text().split("\n")[-1].strip()


def _until_straggler(page: object, url: str, straggler: str, timeout_s: float = 180.0) -> None:
    """Reload the Jobs page until it names one straggler, ``straggler``: the classes need a few
    cycles of history (and scrape mode's history starts with its dashboard, after Prometheus'); in
    the first of them another job's GPUs may still read as waiting on each other."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    deadline = time.monotonic() + timeout_s
    while True:
        load(page, url, 1)
        if (
            _metric(page, "Jobs with a straggler") == "1"
            and _metric(page, "Communication-bound jobs") != "0"
            and page.get_by_text(straggler, exact=False).count() > 0
        ):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"the Jobs page never named a straggler: {page.locator('body').inner_text()[:2000]}")
        time.sleep(5)


@pytest.mark.timeout(900)  # with GPULENS_UPDATE_DOCS_IMG, the docs' screenshots wait for five minutes of history
@pytest.mark.parametrize("mode", MODES)
def test_jobs_page_names_the_straggler_and_the_communication_bound_job(
    jobs_stack: JobsStack, mode: str, artifacts_dir: Path
) -> None:
    """What a person sees on the Jobs page of the two jobs nodes: four two-node jobs of 4 GPUs,
    mixtral-sft held back by node 1's GPU 3 (computing at half clock under a thermal slowdown) and
    moe-pretrain communication-bound, each named and linked; the straggler's link opens its Job
    page, which says the same and draws its GPUs over time. From both sources."""
    dash = jobs_stack.prom_dash if mode == "prometheus" else jobs_stack.scrape_dash
    # Prometheus names node 1 by its relabelled node; a direct scrape by its exporter
    node1 = "node-1" if mode == "prometheus" else jobs_stack.targets[1].removeprefix("http://")
    out = artifacts_dir / "dashboard"
    out.mkdir(exist_ok=True)
    with chromium_page() as page:
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        if mode == "prometheus":
            wait_for_query(jobs_stack.prom, "count(gpulens:job_leaf:info) >= 16", timeout=60)
        _until_straggler(page, f"{dash}/jobs?range=15m", f"{node1} · {STRAGGLER_REASON}")
        watch = PageWatch(page, dash)
        texts = ["Jobs by GPU-hours", "Class mix per job", f"{node1} · {STRAGGLER_REASON}", *JOB_NAMES]
        check_page(page, watch, f"{dash}/jobs?range=15m", texts, 1, out / f"{mode}-jobs.png")
        assert _metric(page, "Multi-node jobs") == "4"
        assert page.get_by_text("4 GPUs on 2 nodes").count() == 4, "the four jobs, 4 GPUs on 2 nodes each"
        straggling = page.locator('[data-testid="stColumn"]', has_text="Jobs with a straggler")
        assert straggling.get_by_role("link", name=JOB_NAMES[1]).count() == 1
        bound = page.locator('[data-testid="stColumn"]', has_text="Communication-bound jobs")
        assert bound.get_by_role("link", name=JOB_NAMES[2]).count() == 1, "moe-pretrain is communication-bound"
        assert bound.get_by_role("link", name=JOB_NAMES[1]).count() == 0, "a straggler explains mixtral's waiting"
        body = page.locator("body").inner_text()
        assert "gpulens_" not in body and "gpulens:" not in body and "workload_kind" not in body
        assert "None" not in body.split() and "nan" not in body.lower().split()
        # the straggler's link opens its Job page, range and job in the URL
        straggling.get_by_role("link", name=JOB_NAMES[1]).click()
        page.wait_for_url("**/job?**", timeout=30000)
        job_url = page.url
        assert "range=15m" in job_url and "job=ml-training/JobSet/mixtral-sft" in unquote(job_url), job_url
        job = ["mixtral-sft", "JobSet in namespace ml-training", f"Straggler: {node1} · {STRAGGLER_REASON}",
               "Its GPUs over time", "Its GPUs now"]  # fmt: skip
        check_page(page, watch, job_url, job, 1, out / f"{mode}-job.png")
        assert _metric(page, "GPUs") == "4" and _metric(page, "Nodes") == "2" and _metric(page, "Pods") == "2"
        body = page.locator("body").inner_text()
        assert "gpulens_" not in body and "None" not in body.split()
    if mode == "prometheus" and os.environ.get("GPULENS_UPDATE_DOCS_IMG"):
        _docs_screenshots(dash, out, jobs_stack.started)


def _docs_screenshots(dash: str, out: Path, started: float) -> None:
    """docs/img/dashboard-jobs.png and -job.png: the last four minutes (an absolute range, so the
    timelines fill the chart; the stack has run that long by then), in a window wide enough for the
    jobs table's columns."""
    from datetime import UTC, datetime, timedelta

    from playwright.sync_api import Page

    time.sleep(max(0.0, 310.0 - (time.monotonic() - started)))
    to = datetime.now(UTC).replace(second=0, microsecond=0)
    span = f"from={(to - timedelta(minutes=4)).strftime('%Y-%m-%dT%H:%M')}&to={to.strftime('%Y-%m-%dT%H:%M')}"
    with chromium_page(width=1800) as page:
        assert isinstance(page, Page)
        watch = PageWatch(page, dash)
        for path, query in (("jobs", ""), ("job", "job=ml-training/JobSet/mixtral-sft&job_cluster=demo&")):
            shot = out / f"docs-{path}.png"
            check_page(page, watch, f"{dash}/{path}?{query}{span}", [], 1, shot)
            shutil.copy(shot, REPO / "docs" / "img" / f"dashboard-{path}.png")
