"""Every dashboard page renders headlessly (streamlit AppTest) from both data sources, and a
Prometheus that is down, slow or erroring gives a banner instead of a traceback."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboard.frames.links import LINK_SOURCE_NAMES
from tests.fixtures.dashboard.fake_prometheus import fake_prometheus, serve_exposition
from tests.support.markdown import shown
from tests.support.net import free_port

pytestmark = pytest.mark.integration

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")
PAGES = [
    "views/efficiency.py",
    "views/workloads.py",
    "views/jobs.py",
    "views/sharing.py",
    "views/health.py",
    "views/network.py",
    "views/serving.py",
    "views/job.py",
    "views/gpu.py",
]


@pytest.fixture()
def dashboard_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for key in ("PROMETHEUS", "SCRAPE"):
        monkeypatch.delenv(f"GPULENS_DASHBOARD_{key}", raising=False)
    monkeypatch.setenv("GPULENS_DASHBOARD_REFRESH_SECONDS", "0")
    monkeypatch.setenv("GPULENS_DASHBOARD_PRICES", "H200=3.5")
    yield monkeypatch


def _texts(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption]
    parts += [e.value for e in at.error] + [w.value for w in at.warning] + [i.value for i in at.info]
    parts += [s.value for s in at.success] + [s.value for s in at.subheader] + [t.value for t in at.title]
    return "\n".join(shown(p) for p in parts)


def _render_all(at: AppTest) -> dict[str, str]:
    """Run the default page (Fleet) then switch to every other page; fail on any exception or
    error banner (panels turn their own exceptions into banners)."""
    seen = {}
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [shown(e.value) for e in at.error]
    seen["fleet"] = _texts(at)
    for page in PAGES:
        at.switch_page(page).run()
        assert not at.exception, (page, [e.value for e in at.exception])
        assert not at.error, (page, [shown(e.value) for e in at.error])
        assert shown(at.title[0].value).lower().replace("-", "") == Path(page).stem
        assert shown(at.main.caption[-1].value).startswith("gpulens ·"), "the page ran to its end"
        seen[Path(page).stem] = _texts(at)
    return seen


def test_every_page_renders_from_prometheus(dashboard_env: pytest.MonkeyPatch) -> None:
    with fake_prometheus("h200x8.prom", "mig.prom", "timeslice.prom") as (url, state):
        dashboard_env.setenv("GPULENS_DASHBOARD_PROMETHEUS", url)
        at = AppTest.from_file(APP, default_timeout=60)
        texts = _render_all(at)
    assert any(q.startswith("sum by (class)") for q in state.queries), "boundness over time is aggregated server-side"
    assert "Xid errors" in texts["health"]
    assert "Wasted GPU-hours by namespace" in texts["workloads"]


def test_fleet_counts_from_prometheus(dashboard_env: pytest.MonkeyPatch) -> None:
    with fake_prometheus("h200x8.prom") as (url, _state):
        dashboard_env.setenv("GPULENS_DASHBOARD_PROMETHEUS", url)
        at = AppTest.from_file(APP, default_timeout=60).run()
    metrics = {m.label: m.value for m in at.metric}
    # h200x8 fixture: 8 GPUs, 7 with a pod; in use (not idle by the rules' definition): GPUs 0-3
    # (SMs busy), 4 (launch-bound) and 6 (SMs 4.7 % active); allocated and idle: GPU 5
    assert metrics["Devices"] == "8"
    assert metrics["Allocated"] == "7"
    assert metrics["In use"] == "6"
    assert metrics["Allocated but idle"] == "1"


def test_every_page_renders_from_direct_scrape(dashboard_env: pytest.MonkeyPatch) -> None:
    with serve_exposition("h200x8.prom", "mig.prom", "timeslice.prom") as urls:
        dashboard_env.setenv("GPULENS_DASHBOARD_SCRAPE", ",".join(urls))
        at = AppTest.from_file(APP, default_timeout=60)
        texts = _render_all(at)
        metrics = {m.label: m.value for m in AppTest.from_file(APP, default_timeout=60).run().metric}
    assert "direct scrape of 3 exporter(s)" in texts["fleet"]
    assert metrics["Devices"] == "40", "whole GPUs plus MIG instances, a GPU in MIG mode counted as its instances"
    assert "No GPU in view is split into MIG instances." not in texts["sharing"]
    assert "No GPU in view is shared by time-slicing or MPS." not in texts["sharing"]


def test_prometheus_down_shows_a_banner_and_keeps_navigation(dashboard_env: pytest.MonkeyPatch) -> None:
    dashboard_env.setenv("GPULENS_DASHBOARD_PROMETHEUS", f"http://127.0.0.1:{free_port()}")
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception
    assert any("unreachable" in shown(e.value) for e in at.error), [shown(e.value) for e in at.error]
    at.switch_page("views/health.py").run()
    assert not at.exception
    assert shown(at.title[0].value) == "Health"
    assert at.error, "the banner stays on every page"
    assert at.sidebar.button, "a Retry button is offered"


def test_slow_prometheus_times_out_into_a_banner(dashboard_env: pytest.MonkeyPatch) -> None:
    with fake_prometheus("h200x8.prom") as (url, state):
        state.mode, state.delay_s = "slow", 3.0
        dashboard_env.setenv("GPULENS_DASHBOARD_PROMETHEUS", url)
        dashboard_env.setenv("GPULENS_DASHBOARD_TIMEOUT_SECONDS", "0.5")
        at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    assert any("did not answer within 0.5 s" in shown(e.value) for e in at.error), [shown(e.value) for e in at.error]


def test_query_errors_and_empty_results_are_reported_not_raised(dashboard_env: pytest.MonkeyPatch) -> None:
    with fake_prometheus("h200x8.prom") as (url, state):
        dashboard_env.setenv("GPULENS_DASHBOARD_PROMETHEUS", url)
        state.mode = "empty"
        at = AppTest.from_file(APP, default_timeout=60).run()
        assert not at.exception
        assert "No GPU in view: no exporter has reported one" in _texts(at)
        state.mode = "error"
        at.switch_page("views/efficiency.py").run()
    assert not at.exception
    assert any("parse error" in shown(e.value) for e in at.error), [shown(e.value) for e in at.error]


def test_namespace_filter_is_escaped_in_every_query(dashboard_env: pytest.MonkeyPatch) -> None:
    with fake_prometheus("h200x8.prom") as (url, state):
        evil = 'ml"} or vector(1) or {x="'
        state.series["gpulens_pod_gpu_allocation"][0]["namespace"] = evil
        dashboard_env.setenv("GPULENS_DASHBOARD_PROMETHEUS", url)
        at = AppTest.from_file(APP, default_timeout=60).run()
        at.sidebar.selectbox(key="f_ns").select(evil).run()
        assert not at.exception
        state.queries.clear()
        at.switch_page("views/workloads.py").run()
    assert not at.exception
    filtered = [q for q in state.queries if "namespace=" in q]
    assert filtered, state.queries
    for q in filtered:
        assert 'namespace="ml\\"} or vector(1) or {x=\\""' in q
        assert 'namespace="ml"}' not in q


def test_mps_pods_show_why_their_kernel_time_is_missing_instead_of_a_blank(dashboard_env: pytest.MonkeyPatch) -> None:
    # tests/fixtures/dashboard/mps.prom is a scrape of the simulator's mps node (generated by
    # tests/support/sim_exposition.py): two MPS clients on GPU 0, one on GPU 1, no per-pod SM
    # share on either (NVML reports the MPS server's utilisation only).
    with serve_exposition("mps.prom") as urls:
        dashboard_env.setenv("GPULENS_DASHBOARD_SCRAPE", ",".join(urls))
        at = AppTest.from_file(APP, default_timeout=60).run()
        at.switch_page("views/sharing.py").run()
        assert not at.exception and not at.error
        sharing = _texts(at)
        at.switch_page("views/workloads.py").run()
        assert not at.exception and not at.error
        workloads = _texts(at)
        tables = [t.value for t in at.dataframe]
    note = "per-pod kernel time is not reported by the driver under MPS"
    assert note in sharing
    assert note in workloads
    pods = next(t for t in tables if "kernel_time" in t.columns and "pod" in t.columns)
    mps_rows = pods[pods["pod"].str.contains("-mps-")]
    assert len(mps_rows) == 3 and set(mps_rows["kernel_time"]) == {"MPS: not split"}
    assert set(pods[pods["pod"].str.startswith("llm-decode-mps")]["class"]) == {"shared"}


def _chart_marks(at: AppTest) -> list[str]:
    """The mark types of the page's Vega-Lite charts (a layered chart: its last layer's)."""
    import json

    marks = []
    for el in at.get("vega_lite_chart"):
        spec = json.loads(el.proto.spec)
        mark = (spec.get("layer") or [spec])[-1]["mark"]
        marks.append(mark["type"] if isinstance(mark, dict) else mark)
    return marks


def test_above_the_mark_limit_pages_draw_distributions(dashboard_env: pytest.MonkeyPatch) -> None:
    """Over --max-marks GPUs the Fleet heatmap becomes a histogram, the roofline a density, and the
    GPU chooser asks for a node first; at or under it, a mark per GPU as before."""
    with fake_prometheus("h200x8.prom") as (url, state):
        dashboard_env.setenv("GPULENS_DASHBOARD_PROMETHEUS", url)
        dashboard_env.setenv("GPULENS_DASHBOARD_MAX_MARKS", "8")
        at = AppTest.from_file(APP, default_timeout=60).run()
        assert "rect" in _chart_marks(at), "8 GPUs: a cell each"
        assert [s.label for s in at.selectbox if s.key == "fleet_gpu"] == ["Open a GPU's page"]
        dashboard_env.setenv("GPULENS_DASHBOARD_MAX_MARKS", "7")
        at.run()
        assert not at.exception and not at.error
        assert "bar" in _chart_marks(at) and "rect" not in _chart_marks(at)
        assert any("8 GPUs, more than a cell each (7 at most)" in shown(c.value) for c in at.caption)
        node = next(s for s in at.selectbox if s.key == "fleet_gpu_node")
        assert node.options == ["h200x8"], node.options
        node.select("h200x8").run()
        gpu = next(s for s in at.selectbox if s.key == "fleet_gpu")
        assert len(gpu.options) == 8
        state.queries.clear()
        at.switch_page("views/efficiency.py").run()
        assert not at.exception and not at.error
        assert "circle" in _chart_marks(at) and "point" not in _chart_marks(at)
        assert any("GPUs and slices, more than a point each" in shown(c.value) for c in at.caption)
        # every device's link counters over the range would cost the store more than the rest of the page
        assert any("more than 7: filter by cluster or node for their links" in shown(c.value) for c in at.caption)
        assert not [q for q in state.queries if "_bytes_total" in q or "_utilization_ratio" in q], state.queries


MPS = (Path(__file__).parent / "fixtures" / "dashboard" / "mps.prom").read_text()
MOVER = "GPU-4aecb4d1-13f8-58f3-955e-8fea11c88f57"
"""GPU 4 of the simulated mps node (tests/fixtures/dashboard/mps.prom): a data loader copying pinned
host memory to the GPU, no kernel: NVML GPU-Util ~1.0, SM activity 0, class transfer."""
LAUNCHER = "GPU-efd810cf-b282-585b-9c09-5d265c2321d8"
"""GPU 4 of the simulated h200x8 node: launch-bound (tiny kernels back to back)."""


def _table_with(at: AppTest, column: str) -> pd.DataFrame:
    """The page's one table that has ``column``."""
    tables = [t.value for t in at.dataframe if column in t.value.columns]
    assert len(tables) == 1, [list(t.value.columns) for t in at.dataframe]
    frame: pd.DataFrame = tables[0]
    return frame


@pytest.mark.parametrize("source", ["prometheus", "scrape"])
def test_fleet_shows_a_gpu_moving_data_as_such_not_as_launch_bound(
    dashboard_env: pytest.MonkeyPatch, source: str
) -> None:
    """The transfer-bound GPU (GPU-Util high, SMs idle, PCIe busy) is listed as moving data with its
    link use; the launch-bound GPU stays in the 'launch-bound or polling' list, alone."""
    with ExitStack() as es:
        if source == "prometheus":
            url, _state = es.enter_context(fake_prometheus("h200x8.prom", "mps.prom"))
            dashboard_env.setenv("GPULENS_DASHBOARD_PROMETHEUS", url)
        else:
            urls = es.enter_context(serve_exposition("h200x8.prom", "mps.prom"))
            dashboard_env.setenv("GPULENS_DASHBOARD_SCRAPE", ",".join(urls))
        at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception and not at.error, [shown(e.value) for e in [*at.exception, *at.error]]
    moving = [shown(i.value) for i in at.info if "moving data" in shown(i.value)]
    assert moving and moving[0].startswith("1 GPU moving data: PCIe/NVLink busy, SMs idle"), moving
    table = _table_with(at, "pcie")
    assert table["uuid"].tolist() == [MOVER]
    assert table["pcie"].iloc[0] > 50, "PCIe use in percent: the loader fills 0.8 of the link"
    if "pcie_in_bytes_per_second" in table.columns:  # a rate needs two scrapes: one static scrape has none
        assert table["pcie_in_bytes_per_second"].iloc[0].endswith("B/s"), "throughput as text in its unit"
    launch = [shown(w.value) for w in at.warning if "launch-bound or polling" in shown(w.value)]
    if source == "scrape":
        # a dashboard scraping for a second or two: "SM idle over 5 m" is a verdict still collecting
        assert launch == [], "no verdict over 5 minutes from a second of history"
        return
    assert launch and launch[0].startswith("1 GPU(s)"), launch
    table = _table_with(at, "gpu_util")
    assert table["uuid"].tolist() == [LAUNCHER]
    # the launch-bound GPU's row names its pod and owner (it named neither)
    assert table["pods"].tolist() == ["inference/fraud-scoring-wr6pb9g769-mmrt7"], table.to_dict("records")
    assert table["owners"].tolist() == ["Deployment/fraud-scoring"]


def test_fleet_verdicts_wait_for_their_window_and_the_counts_add_up(dashboard_env: pytest.MonkeyPatch) -> None:
    """A dashboard that has scraped for a second or two: no device is called idle or in use over
    5 minutes yet; each allocated device is counted as collecting, so allocated = in use + idle +
    collecting. (It read 7 allocated, 6 in use, 1 idle from its first scrape.)"""
    with serve_exposition("h200x8.prom") as urls:
        dashboard_env.setenv("GPULENS_DASHBOARD_SCRAPE", ",".join(urls))
        at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception and not at.error, [shown(e.value) for e in [*at.exception, *at.error]]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Allocated"] == "7"
    assert (metrics["In use"], metrics["Allocated but idle"]) == ("0", "0"), metrics
    assert metrics.get("Collecting") == "7", metrics
    texts = _texts(at)
    assert re.search(r"the youngest: collecting \(\d+ s of 5 m\)", texts), texts[:3000]


def test_gpu_page_shows_the_links_in_words(dashboard_env: pytest.MonkeyPatch) -> None:
    """The GPU page of the data-moving GPU has its links' panel: capacity each way and where the
    bytes come from in words, throughput and use charts; no raw metric name in its texts. (Scrape
    mode: the fake Prometheus does not answer the page's one regex query; the browser test reads
    the links from a real one.)"""
    with serve_exposition("mps.prom") as urls:
        dashboard_env.setenv("GPULENS_DASHBOARD_SCRAPE", ",".join(urls))
        at = AppTest.from_file(APP, default_timeout=60).run()
        at.query_params["uuid"] = MOVER
        at.switch_page("views/gpu.py").run()
    assert not at.exception and not at.error, [shown(e.value) for e in [*at.exception, *at.error]]
    texts = _texts(at)
    assert "Links: PCIe and NVLink" in texts
    links = _table_with(at, "capacity_bytes_per_second").set_index("link")
    assert links.loc["PCIe", "capacity_bytes_per_second"] == "63.0 GB/s"
    # where the exporter read the bytes, in words (gpulens_gpu_link_info{source} of the fixture)
    sources = {
        m.group(1): m.group(2)
        for m in re.finditer(r'gpulens_gpu_link_info\{[^}]*link="(\w+)"[^}]*source="(\w+)"[^}]*' + MOVER, MPS)
    }
    assert links.loc["PCIe", "measured_by"] == LINK_SOURCE_NAMES[sources["pcie"]]
    assert links.loc["NVLink", "measured_by"] == LINK_SOURCE_NAMES[sources["nvlink"]]
    assert 50 < links.loc["PCIe", "mean_utilization"] <= 100
    assert "gpulens_" not in texts


def _network_texts(at: AppTest) -> str:
    at.switch_page("views/network.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [shown(e.value) for e in at.error]
    assert shown(at.main.caption[-1].value).startswith("gpulens ·"), "the page ran to its end"
    return _texts(at)


@pytest.mark.parametrize("mode", ["prometheus", "scrape"])
def test_network_page_shows_nics_gpudirect_and_holders_of_the_p5en_nodes(
    dashboard_env: pytest.MonkeyPatch, mode: str
) -> None:
    """The simulated p5en nodes (tests/fixtures/dashboard/p5en*.prom): 32 EFAs each, GPUDirect RDMA
    ready on p5en (the EFA driver's peer-to-peer) and not on p5en-nogdr (no peer-memory module),
    one pod holding all 32 NICs alone; from both sources."""
    files = ("p5en.prom", "p5en-nogdr.prom")
    with ExitStack() as es:
        if mode == "prometheus":
            url, _state = es.enter_context(fake_prometheus(*files))
            dashboard_env.setenv("GPULENS_DASHBOARD_PROMETHEUS", url)
        else:
            urls = es.enter_context(serve_exposition(*files))
            dashboard_env.setenv("GPULENS_DASHBOARD_SCRAPE", ",".join(urls))
        at = AppTest.from_file(APP, default_timeout=60)
        at.run()
        texts = _network_texts(at)
        frames_shown = [d.value for d in at.dataframe]
    assert "GPUDirect RDMA ready on all 8 GPUs" in texts
    assert "GPUDirect RDMA not ready on 8 of 8 GPUs: no peer-memory module or DMA-BUF" in texts
    assert "All 64 NICs in view are up" in texts
    nics = next(df for df in frames_shown if "line_rate" in df.columns)
    assert len(nics) == 64 and set(nics["kind"]) == {"EFA"}
    assert set(nics["line_rate"]) == {"100 Gb/s (12.5 GB/s)"}, "a line rate as rated, and in bytes per second"
    # a static scrape has no rate yet: blank, never a raw number
    assert all(str(v).endswith("B/s") or v == "" for v in nics["tx"]), set(nics["tx"])  # bytes, as all data
    pods = next(df for df in frames_shown if "nics" in df.columns)
    assert sorted(pods["nics"]) == [32, 32] and set(pods["shared"]) == {"none"}


def test_network_page_says_so_on_nodes_without_nics(dashboard_env: pytest.MonkeyPatch) -> None:
    with serve_exposition("h200x8.prom") as urls:
        dashboard_env.setenv("GPULENS_DASHBOARD_SCRAPE", ",".join(urls))
        at = AppTest.from_file(APP, default_timeout=60)
        at.run()
        texts = _network_texts(at)
    assert "No RDMA NIC in view" in texts
    assert not at.vega_lite_chart if hasattr(at, "vega_lite_chart") else True


def test_gpu_page_lists_its_nearest_nics_and_workloads_the_communication_share(
    dashboard_env: pytest.MonkeyPatch,
) -> None:
    """GPU 0 of p5en-nogdr: its nearest EFAs, their PCIe path in words and GPUDirect RDMA not ready
    with the reason; the Workloads page's pods carry their devices' communication share."""
    info = (Path(__file__).parent / "fixtures" / "dashboard" / "p5en-nogdr.prom").read_text()
    uuid = re.search(r'gpulens_gpu_info\{[^}]*gpu="0"[^}]*uuid="([^"]+)"', info)
    assert uuid
    with fake_prometheus("p5en-nogdr.prom") as (url, _state):
        dashboard_env.setenv("GPULENS_DASHBOARD_PROMETHEUS", url)
        at = AppTest.from_file(APP, default_timeout=60)
        at.run()
        at.switch_page("views/workloads.py").run()
        assert not at.exception and not at.error, [shown(e.value) for e in at.error]
        pods = next(d.value for d in at.dataframe if "class" in d.value.columns and "pod" in d.value.columns)
        at.query_params["uuid"] = uuid.group(1)
        at.switch_page("views/gpu.py").run()
        assert not at.exception and not at.error, [shown(e.value) for e in at.error]
        texts = _texts(at)
        nics = next(d.value for d in at.dataframe if "gdr_ready" in d.value.columns)
    assert "communication" in pods.columns and pods["communication"].max() > 50, pods
    assert "Nearest NICs" in texts and "GPUDirect RDMA is not ready" in texts
    assert len(nics) == 4 and set(nics["gdr_ready"]) == {"not ready"}
    assert set(nics["reason"]) == {"no peer-memory module or DMA-BUF"}
    assert all(p.startswith("PIX") or p.startswith("PXB") for p in nics["path"]), set(nics["path"])


def test_jobs_pages_show_the_jobs_nodes_in_words(dashboard_env: pytest.MonkeyPatch) -> None:
    """The two jobs nodes (tests/fixtures/dashboard/jobs-*.prom, scraped directly for a second or
    two): the Jobs page's table has a row per job with human headers, 4 GPUs on 2 nodes each and no
    missing value left blank; no job has a straggler or communication-bound verdict yet (each
    says ``collecting (N s of 5 m)``: the window is seconds old); the Job page of mixtral-sft lists
    its 4 GPUs and says its straggler verdict is collecting. (The verdicts once the window is full:
    tests/test_dashboard_jobs.py and the browser test.)"""
    with serve_exposition("jobs-0.prom", "jobs-1.prom") as urls:
        dashboard_env.setenv("GPULENS_DASHBOARD_SCRAPE", ",".join(urls))
        at = AppTest.from_file(APP, default_timeout=60).run()
        at.switch_page("views/jobs.py").run()
        assert not at.exception and not at.error, [shown(e.value) for e in [*at.exception, *at.error]]
        texts = _texts(at)
        table = _table_with(at, "straggler")
        metrics = {m.label: m.value for m in at.metric}
        at.query_params["job"] = "ml-training/JobSet/mixtral-sft"
        at.switch_page("views/job.py").run()
        assert not at.exception and not at.error, [shown(e.value) for e in [*at.exception, *at.error]]
        job_texts = _texts(at)
        gpus = _table_with(at, "straggler")
    assert [c for c in table.columns if "_" in c or c != c.strip()] == [], "human headers"
    assert sorted(table["job"].str.split("job=").str[1].str.split("&").str[0]) == [
        "ml-training/JobSet/mixtral-sft",
        "ml-training/PyTorchJob/gpt-13b-finetune",
        "research/Job/embedding-train",
        "research/MPIJob/moe-pretrain",
    ]
    assert set(table["GPUs"]) == {4} and set(table["nodes"]) == {2}
    collecting = re.compile(r"^collecting \(\d+ s of 5 m\)$")
    assert all(collecting.match(x) for x in table["straggler"]), set(table["straggler"])
    assert all(collecting.match(x) for x in table["communication"]), set(table["communication"])
    assert (metrics["Jobs with a straggler"], metrics["Communication-bound jobs"]) == ("0", "0"), metrics
    assert "4 job(s) still collecting their 5m window" in texts
    for col in table.columns:
        if table[col].dtype == object:
            assert not table[col].isin(["", "nan", "None"]).any(), col
        else:
            assert not table[col].isna().any(), col
    assert re.search(r"Straggler: collecting \(\d+ s of 5 m\)", job_texts), job_texts[:2000]
    assert len(gpus) == 4 and list(gpus["GPU"]) == ["2", "3", "2", "3"]
    assert all(collecting.match(x) for x in gpus["straggler"]), list(gpus["straggler"])
    assert "gpulens_" not in texts + job_texts


def test_fleet_opens_with_gpudirect_rdma_not_ready(dashboard_env: pytest.MonkeyPatch) -> None:
    """The p5en-nogdr node: every GPU waits on the network and GPUDirect RDMA is off. Fleet's status
    summary says so first, naming the node and why, with a link to the Network page (Fleet read
    8 of 8 in use and "No GPU ran slow", and nothing on the network)."""
    with serve_exposition("p5en-nogdr.prom") as urls:
        dashboard_env.setenv("GPULENS_DASHBOARD_SCRAPE", ",".join(urls))
        at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    errors = [shown(e.value) for e in at.error]
    gdr = [e for e in errors if "GPUDirect RDMA not ready on 8 of 8 GPUs" in e]
    assert gdr, errors
    assert "no peer-memory module or DMA-BUF" in gdr[0]
    assert not any("All clear" in shown(s.value) for s in at.success)


def test_fleet_says_all_clear_when_nothing_is_wrong(dashboard_env: pytest.MonkeyPatch) -> None:
    with serve_exposition("p5en.prom") as urls:
        dashboard_env.setenv("GPULENS_DASHBOARD_SCRAPE", ",".join(urls))
        at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception and not at.error, [shown(e.value) for e in [*at.exception, *at.error]]
    assert any(shown(s.value).startswith("All clear") for s in at.success), [shown(s.value) for s in at.success]
