"""The advisor against a real Prometheus backfilled (promtool tsdb create-blocks-from openmetrics)
with 7 days of simulated workloads whose right answer is known: the CLI, the measurement layer, the
dashboard page (AppTest) and the page in headless Chromium give the expected advice and savings.
No recording rules are loaded: the advisor computes from raw series. The CLI and the measurements
run on a VictoriaMetrics with the same history too (imported; its MetricsQL dialect)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dashboard.advisor import cli
from dashboard.advisor.backfill import write_openmetrics
from dashboard.advisor.engine import recommend
from dashboard.advisor.job_query import measure_jobs
from dashboard.advisor.profiles import H100, H200
from dashboard.advisor.query import Window, measure
from dashboard.sources.prometheus import PrometheusSource
from tests.support.markdown import shown
from tests.support.prometheus import run_prometheus
from tests.support.victoriametrics import import_openmetrics, run_victoriametrics

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30
WEEK = 168.0
STORES = ("prometheus", "victoriametrics")
PRICES = ["--price", "H200=3.5", "--price", "H100=2.5"]
# workload -> (recommendation, target, GPU-hours saved, USD saved); reasoning in the engine tests
EXPECTED = {
    "research/Pod/debug-shell": ("release", "release", WEEK, WEEK * 3.5),
    "inference/Deployment/embedder": ("mig", "1g.18gb", WEEK * 6 / 7, WEEK * 6 / 7 * 3.5),
    "notebooks/StatefulSet/alice": (
        "time-slice",
        "time-slicing or MPS",
        WEEK * (1 - 30 * GIB * 1.2 / 141e9),
        WEEK * (1 - 30 * GIB * 1.2 / 141e9) * 3.5,
    ),
    # two H100s, memory-bound all their busy time: hours shrink by 3.35/4.8, the H200 costs more per hour
    "inference/Deployment/kv-decode": (
        "higher-bandwidth",
        "H200",
        2 * WEEK * (1 - 3.35 / 4.8),
        2 * WEEK * 2.5 - 2 * WEEK * 3.35 / 4.8 * 3.5,
    ),
    # a 3g.71gb slice weighs 3/7 of a GPU-hour per hour (compute slices, dashboard/definitions.py);
    # it takes half the GPU from others, a 1g.18gb one seventh: 1 - (1/7)/(1/2) of its hours are saved
    "inference/Deployment/reranker": (
        "mig",
        "1g.18gb",
        WEEK * 3 / 7 * (1 - (1 / 7) / 0.5),
        WEEK * 3 / 7 * (1 - (1 / 7) / 0.5) * 3.5,
    ),
    "ml-training/Job/llm-pretrain": ("keep", "keep", 0.0, 0.0),
    "research/Job/big-embed": ("keep", "keep", 0.0, 0.0),
    "notebooks/StatefulSet/bob": ("keep", "keep", 0.0, 0.0),
    "notebooks/StatefulSet/carol": ("keep", "keep", 0.0, 0.0),
    # copies host memory over PCIe with its SMs waiting (class transfer): in use, not idle, and no
    # smaller slice or time-slicing, which SM activity alone (light and bursty) would suggest
    "etl/Job/ingest": ("reduce-transfers", "reduce host-device traffic", 0.0, 0.0),
}
TOTAL_SAVED = sum(v[2] for v in EXPECTED.values())
TOTAL_USD = sum(v[3] for v in EXPECTED.values())


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """7 days (and an hour) of the simulated workloads, ending now, as an OpenMetrics file."""
    om = tmp_path_factory.mktemp("advisor") / "advisor.om"
    with om.open("w") as out:
        write_openmetrics(out, days=7, interval_s=240, end=float(int(time.time())))
    return om


@pytest.fixture(scope="module")
def prom(history: Path) -> Iterator[str]:
    """A Prometheus serving the history (promtool backfill)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run the README test command (scripts/test.sh)")
    data = history.parent / "data"
    # one block instead of 85 two-hour blocks: 1 s instead of 20 s
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=240h", str(history),
                    str(data)], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    config = "global: {scrape_interval: 1m}\nscrape_configs: []\n"
    with run_prometheus(config, storage_dir=str(data), extra_args=["--storage.tsdb.retention.time=30d"]) as base:
        yield base


@pytest.fixture(scope="module")
def vm(history: Path) -> Iterator[str]:
    """A VictoriaMetrics serving the same history (imported)."""
    with run_victoriametrics() as base:
        import_openmetrics(base, history)
        yield base


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> str:
    """The URL of either store with the same history: the advisor must say the same on both."""
    return str(request.getfixturevalue("prom" if request.param == "prometheus" else "vm"))


def _approx(actual: float | None, expected: float) -> bool:
    return actual is not None and abs(actual - expected) <= max(0.02 * abs(expected), 0.5)


def test_cli_json_gives_the_expected_advice_and_savings(store: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dashboard.advisor", "--prometheus", store, "--window", "7d", "--format", "json",
         *PRICES],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=True,
    )  # fmt: skip
    doc = json.loads(out.stdout)
    got = {f"{w['namespace']}/{w['workload']}": w for w in doc["workloads"]}
    assert set(got) == set(EXPECTED)
    for name, (action, target, saved, usd) in EXPECTED.items():
        w = got[name]
        assert (w["recommendation"], w["target"]) == (action, target), (name, w["reason"])
        assert _approx(w["gpu_hours_saved"], saved), (name, w["gpu_hours_saved"], saved)
        assert _approx(w["cost_saved_usd"], usd), (name, w["cost_saved_usd"], usd)
        assert w["evidence"]["gpu_hours_held"] > 0 and w["reason"]
    assert _approx(doc["totals"]["gpu_hours_saved"], TOTAL_SAVED)
    assert _approx(doc["totals"]["cost_saved_usd"], TOTAL_USD)
    assert doc["window_seconds"] == 7 * 86400
    # the one job of two GPUs or more: kv-decode's two memory-bound H100s, advised as a whole, with
    # the percentages of the profile tables and the per-workload rule's saving
    [kv] = doc["jobs"]
    assert (kv["job"], kv["recommendation"], kv["target"]) == (
        "inference/Deployment/kv-decode",
        "higher-bandwidth",
        "H200",
    )
    more_bw = H200.bandwidth_bytes_per_second / H100.bandwidth_bytes_per_second - 1
    more_mem = H200.memory_bytes / H100.memory_bytes - 1
    more = f"H200 has {more_bw * 100:.0f} % more bandwidth and {more_mem * 100:.0f} % more memory than H100"
    assert more in kv["reason"]
    assert _approx(kv["gpu_hours_saved"], EXPECTED["inference/Deployment/kv-decode"][2])
    assert _approx(kv["cost_saved_usd"], EXPECTED["inference/Deployment/kv-decode"][3])
    assert kv["wasted_gpu_hours"] == 0.0 and kv["evidence"]["gpus_needed_on_faster_model"] == 2
    assert _approx(doc["covered"]["seconds"], 7 * 86400)


def test_each_jobs_wasted_gpu_hours_are_its_workloads_idle_gpu_hours(store: str) -> None:
    # one waste definition: the job figure beside the advice (definitions.wasted_promql, integrated)
    # is the per-workload advisor's idle GPU-hours (MIG instances weighed by their slices), which the
    # dashboard's wasted GPU-hours equal (tests/test_dashboard_consistency.py)
    src = PrometheusSource(store, timeout_s=30)
    win = Window(end=float(int(time.time())))
    idle: dict[str, float] = {}
    for u in measure(src, win):
        idle[u.name] = idle.get(u.name, 0.0) + float(recommend(u).evidence["gpu_hours_idle"] or 0.0)
    wasted = {u.name: u.wasted_gpu_hours for u in measure_jobs(src, win).usages}
    assert set(wasted) == set(idle) == set(EXPECTED)
    for name, hours in idle.items():
        assert wasted[name] == pytest.approx(hours, abs=1e-6), name
    assert wasted["research/Pod/debug-shell"] == pytest.approx(WEEK, abs=0.2), "an idle bare pod wastes its week"
    assert 0.2 * WEEK < wasted["notebooks/StatefulSet/alice"] < 0.45 * WEEK, "idle about a third of the time"


def test_measurements_follow_workloads_across_pods_slices_and_shared_gpus(store: str) -> None:
    usages = {u.name: u for u in measure(PrometheusSource(store, timeout_s=30), Window())}
    embedder = usages["inference/Deployment/embedder"]
    assert embedder.devices == 1 and embedder.device_hours_held == pytest.approx(WEEK, abs=0.2), (
        "two pods, one workload"
    )
    assert embedder.memory_peak_bytes == 9 * GIB, "the daily peak, not the 80 % plateau"
    assert 0.11 <= (embedder.sm_active_p95 or 0) <= 0.12 and embedder.sm_active_mean == pytest.approx(0.10, abs=0.005)
    assert usages["research/Pod/debug-shell"].device_hours_idle == pytest.approx(WEEK, abs=0.2), "bare pod, idle"
    reranker = usages["inference/Deployment/reranker"]
    assert reranker.mig_profile == "3g.71gb" and reranker.memory_peak_bytes == 10 * GIB
    bob, carol = usages["notebooks/StatefulSet/bob"], usages["notebooks/StatefulSet/carol"]
    assert bob.shared and carol.shared
    assert (bob.memory_peak_bytes, carol.memory_peak_bytes) == (5 * GIB, 7 * GIB), "own memory, not the GPU's 14 GiB"
    assert (bob.sm_active_p95, carol.sm_active_p95) == (0.1, 0.2), "own SM share on a shared GPU"
    assert bob.device_hours_held == pytest.approx(WEEK / 2, abs=0.2), "a shared GPU's hours are split"
    kv = usages["inference/Deployment/kv-decode"]
    assert kv.devices == 2 and kv.boundness["memory"] == pytest.approx(1.0)
    alice = usages["notebooks/StatefulSet/alice"]
    assert alice.boundness["idle"] == pytest.approx(0.32, abs=0.04)
    assert sum(alice.boundness.values()) == pytest.approx(1.0)
    ingest = usages["etl/Job/ingest"]
    assert ingest.device_hours_idle == 0.0, "transfer-bound time is in use by the one idle definition"
    assert ingest.boundness["transfer"] == pytest.approx(0.85, abs=0.03)
    assert ingest.pcie_utilization_p95 == pytest.approx(0.8)
    assert ingest.nvlink_utilization_p95 is None, "not exported in this history"
    assert embedder.pcie_utilization_p95 == 0.0


def test_cli_table_and_csv(prom: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--prometheus", prom, *PRICES]) == 0
    table = capsys.readouterr().out
    assert "1g.18gb" in table and "time-slicing or MPS" in table and "10 workloads over 7 days" in table
    assert f"{TOTAL_SAVED:,.1f}"[:3] in table.splitlines()[-1]
    assert cli.main(["--prometheus", prom, "--format", "csv", "--namespace", "research"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("namespace,workload,")
    assert sorted(line.split(",")[1] for line in lines[1:]) == ["Job/big-embed", "Pod/debug-shell"]
    assert all(line.split(",")[9] == "" for line in lines[1:]), "no --price, no cost"


def test_a_larger_headroom_changes_the_advice(prom: str, capsys: pytest.CaptureFixture[str]) -> None:
    # 9 GiB x 2.0 = 19.3 GB no longer fits the 18 GB slice; 1g.35gb is next
    assert cli.main(["--prometheus", prom, "--format", "json", "--headroom", "2", "--namespace", "inference"]) == 0
    got = {w["workload"]: w for w in json.loads(capsys.readouterr().out)["workloads"]}
    assert got["Deployment/embedder"]["target"] == "1g.35gb"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--window", "7x"], "not a duration"),
        (["--window", "0d"], "not a duration"),
        (["--headroom", "0.8"], "at least 1"),
        (["--price", "H200=cheap"], "not a number"),
        (["--format", "xml"], "invalid choice"),
        (["--timeout", "0"], "positive"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--prometheus", "http://127.0.0.1:1", *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_or_malformed_prometheus_url_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ([], ["--prometheus", "prom:9090"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 2
    assert "http://" in capsys.readouterr().err


def test_unreachable_prometheus_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.net import free_port

    url = f"http://127.0.0.1:{free_port()}"
    assert cli.main(["--prometheus", url, "--timeout", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpulens-advisor: ") and "unreachable" in err and url in err


def test_dashboard_page_shows_the_same_advice(prom: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamlit.testing.v1 import AppTest

    monkeypatch.delenv("GPULENS_DASHBOARD_SCRAPE", raising=False)
    monkeypatch.setenv("GPULENS_DASHBOARD_PROMETHEUS", prom)
    monkeypatch.setenv("GPULENS_DASHBOARD_REFRESH_SECONDS", "0")
    monkeypatch.setenv("GPULENS_DASHBOARD_PRICES", "H200=3.5,H100=2.5")
    at = AppTest.from_file(str(REPO / "dashboard" / "app.py"), default_timeout=60)
    at.run()
    at.switch_page("views/rightsizing.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [shown(e.value) for e in at.error]
    assert shown(at.title[0].value) == "Right-sizing"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Workloads"] == "10"
    assert metrics["GPU-hours saveable"] == f"{TOTAL_SAVED:,.1f}" or _approx(
        float(metrics["GPU-hours saveable"].replace(",", "")), TOTAL_SAVED
    )
    assert _approx(float(metrics["Saving"].lstrip("$").replace(",", "")), TOTAL_USD)
    table = at.dataframe[0].value
    got = {f"{n}/{w}": (r, t) for n, w, r, t in table[["namespace", "workload", "recommendation", "target"]].values}
    assert got == {k: v[:2] for k, v in EXPECTED.items()}
    # the Jobs section: kv-decode's two H100s as one job, for people (no raw names, units, dollars)
    jobs_table = next(d.value for d in at.dataframe if "Job" in d.value.columns)
    [kv] = jobs_table.to_dict("records")
    assert (kv["Job"], kv["Advice"], kv["Target"]) == ("inference/Deployment/kv-decode", "Higher-bandwidth GPU", "H200")
    assert kv["GPUs"] == "2 on 1 node (H100 80GB HBM3)" and kv["Wasted GPU-hours"] == "0.0"
    assert _approx(float(kv["Saving"].lstrip("$").replace(",", "")), EXPECTED["inference/Deployment/kv-decode"][3])
    assert any("of data in the last 7 days" in shown(c.value) for c in at.caption)


def test_dashboard_page_in_chromium(prom: str, artifacts_dir: Path) -> None:
    from tests.support.browser import chromium_page, load, run_dashboard

    shot = artifacts_dir / "dashboard" / "rightsizing.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    with (
        run_dashboard("--prometheus", prom, "--price-per-gpu-hour", "H200=3.5,H100=2.5") as dash,
        chromium_page() as page,
    ):
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        load(page, f"{dash}/rightsizing", 1)
        for text in ("Recommendations", "Where the savings are", "GPU-hours saveable", "Evidence"):
            assert page.get_by_text(text, exact=False).count() > 0, text
        assert page.locator('[data-testid="stException"]').count() == 0
        assert page.locator('[data-testid="stAlertContentError"]').count() == 0
        saving = page.locator('[data-testid="stMetric"]').nth(3).inner_text().split("\n")[-1]
        assert _approx(float(saving.lstrip("$").replace(",", "")), TOTAL_USD), saving
        page.screenshot(path=str(shot), full_page=True)
    if os.environ.get("GPULENS_UPDATE_DOCS_IMG"):
        shutil.copy(shot, REPO / "docs" / "img" / "rightsizing.png")


@pytest.mark.parametrize("step_s", [300, 360, 420, 480, 540, 600, 660, 720, 780, 840])
def test_a_rolling_update_handover_is_not_sharing_at_any_grid_phase(store: str, step_s: int) -> None:
    # The embedder's Deployment replaced its pod once: old and new pod overlap within Prometheus'
    # 5 m lookback at some subquery grid points and not at others, depending on where the grid
    # falls (it is aligned to multiples of the step). Either way the workload held its GPU alone,
    # so the advice must not flip to "already shares its GPU".
    usages = {u.name: u for u in measure(PrometheusSource(store, timeout_s=30), Window(step_s=step_s))}
    assert usages["inference/Deployment/embedder"].shared is False
