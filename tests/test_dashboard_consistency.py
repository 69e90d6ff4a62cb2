"""One fleet history, three readers, one answer: the recording rules (evaluated by promtool over the
history, read back through a real Prometheus by the dashboard's Prometheus source), the dashboard's
scrape source (the same history scraped into its own memory) and the advisor (raw series, the same
definition inlined) find the same idle devices and the same wasted GPU-hours.

The history (15 s samples, 45 minutes, one node): GPU a idle; b busy; l launch-bound (SMs ~0 but
GPU-Util 25 % and class ``launch``: in use, not idle); h busy for 20.5 minutes then idle; a 3g.71gb MIG
instance idle (3/7 of a GPU-hour per hour); a 2g.35gb MIG instance moving data (SMs 0, no GPU-Util on
a MIG instance, class ``transfer``: in use, not idle); t time-sliced and idle, 3 replicas held by web/t-0 and
1 by batch/t-1; u idle but unallocated. GPUs without GPM (pre-Hopper: no SM activity, the
activity is the busy ratio, NVML GPU-Util): p an idle L40S, q a busy one; an A100 MIG instance r1
with no compute process (idle) and r2 running one (in use: nothing measures more). Samples sit 7 s
off the minute so no rule evaluation lands on a sample at the edge of its 5 m window (Prometheus 2
closes that edge, the pandas reader opens it).

promtool backfills the recording rules over the history (``tsdb create-blocks-from rules``) and
Prometheus serves the result: the values a live Prometheus would have recorded every minute. The
scrape source and the advisor agree exactly; the rules too for devices that stayed idle or busy, and
within one evaluation (a minute) for the device that turned idle: a reader sees a recorded series as
of the rule's last evaluation.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import requests

from dashboard.advisor.engine import recommend
from dashboard.advisor.query import Window as AdvisorWindow
from dashboard.advisor.query import measure
from dashboard.frames.columns import with_cols
from dashboard.frames.fleet import BOUNDNESS_NOW_LABELS, boundness_now
from dashboard.sources.openmetrics import OpenMetricsHistory, label_text
from dashboard.sources.prometheus import PrometheusSource
from dashboard.sources.scrape import ScrapeSource
from dashboard.sources.source import HISTORY_STEPS, Filters, Window
from exporter.model import BOUNDNESS_CLASSES
from exporter.render.metrics import spec
from tests.support.prometheus import DASHBOARD_RECORDS, backfill_recording_rules, run_prometheus
from tests.support.victoriametrics import import_openmetrics, replay_rules, run_victoriametrics

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
STEP = 60.0
SAMPLE = 15.0
HISTORY = 45 * 60.0
WINDOW = 30 * 60.0
IDLE_FROM = 20 * 60 + 30.0
"""When GPU h turns idle: its last busy sample then lies 30 s from the edge of any rule evaluation's
5 m window (promtool's backfill evaluates a few seconds off the minute it stamps)."""
NODE = "n1:9445"
H200 = "NVIDIA H200"
L40S = "NVIDIA L40S"
A100 = "NVIDIA A100-SXM4-80GB"
CLASSES = BOUNDNESS_CLASSES
STORES = ("prometheus", "victoriametrics")


def _leaves(t: float, t0: float) -> list[dict[str, Any]]:
    """Each leaf's state at time t: labels, SM activity, GPU-Util (whole GPUs), class."""
    late = t - t0 >= IDLE_FROM
    whole = [
        ("GPU-a", 0, 0.0, 0.0, "idle"),
        ("GPU-b", 1, 0.6, 0.9, "compute"),
        ("GPU-l", 2, 0.001, 0.25, "launch"),
        ("GPU-h", 3, 0.0 if late else 0.55, 0.0 if late else 0.8, "idle" if late else "compute"),
        ("GPU-t", 5, 0.0, 0.0, "idle"),
        ("GPU-u", 6, 0.0, 0.0, "idle"),
    ]
    out = [{"gpu": str(g), "uuid": u, "mig_uuid": "", "profile": "", "sm": sm, "util": ut, "cls": c}
           for u, g, sm, ut, c in whole]  # fmt: skip
    out.append({"gpu": "4", "uuid": "GPU-m", "mig_uuid": "MIG-3", "profile": "3g.71gb", "gi": "2", "sm": 0.0,
                "util": 0.0, "cls": "idle"})  # fmt: skip
    out.append({"gpu": "4", "uuid": "GPU-m", "mig_uuid": "MIG-1", "profile": "1g.18gb", "gi": "9", "sm": 0.0,
                "util": 0.0, "cls": "idle"})  # fmt: skip
    out.append({"gpu": "4", "uuid": "GPU-m", "mig_uuid": "MIG-2", "profile": "2g.35gb", "gi": "5", "sm": 0.0,
                "util": 0.0, "cls": "transfer"})  # fmt: skip
    # without GPM: no SM activity; whole GPUs have a busy ratio (GPU-Util), MIG instances processes
    out.append({"gpu": "7", "uuid": "GPU-p", "mig_uuid": "", "profile": "", "sm": None, "util": 0.0, "busy": 0.0,
                "cls": "idle", "model": L40S})  # fmt: skip
    out.append({"gpu": "8", "uuid": "GPU-q", "mig_uuid": "", "profile": "", "sm": None, "util": 0.9, "busy": 0.9,
                "cls": "busy", "model": L40S})  # fmt: skip
    out.append({"gpu": "9", "uuid": "GPU-r", "mig_uuid": "MIG-r1", "profile": "3g.40gb", "gi": "1", "sm": None,
                "util": None, "procs": 0, "cls": "idle", "model": A100})  # fmt: skip
    out.append({"gpu": "9", "uuid": "GPU-r", "mig_uuid": "MIG-r2", "profile": "3g.40gb", "gi": "2", "sm": None,
                "util": None, "procs": 1, "cls": None, "model": A100})  # fmt: skip
    return out


ALLOCATIONS = (  # namespace, pod, uuid, mig_uuid, replicas
    ("ml", "a-0", "GPU-a", "", ("",)),
    ("ml", "b-0", "GPU-b", "", ("",)),
    ("web", "l-0", "GPU-l", "", ("",)),
    ("web", "h-0", "GPU-h", "", ("",)),
    ("ml", "m-0", "GPU-m", "MIG-3", ("",)),
    ("etl", "x-0", "GPU-m", "MIG-2", ("",)),
    ("web", "t-0", "GPU-t", "", ("0", "1", "2")),
    ("batch", "t-1", "GPU-t", "", ("3",)),
    ("ml", "p-0", "GPU-p", "", ("",)),
    ("ml", "q-0", "GPU-q", "", ("",)),
    ("ml", "r-0", "GPU-r", "MIG-r1", ("",)),
    ("ml", "s-0", "GPU-r", "MIG-r2", ("",)),
)


def _samples(t: float, t0: float) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every series of the node at t (without instance/job), by metric name."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}

    def add(name: str, labels: dict[str, str], value: float) -> None:
        out.setdefault(name, []).append((labels, value))

    elapsed = t - t0
    add("gpulens_up", {}, 1.0)  # every exporter sends it, from its first scrape
    seen: set[str] = set()
    for leaf in _leaves(t, t0):
        phys = {"gpu": leaf["gpu"], "uuid": leaf["uuid"]}
        lab = {**phys, "mig_uuid": leaf["mig_uuid"]}
        if leaf["mig_uuid"]:
            lab.update({"gpu_instance_id": leaf["gi"], "compute_instance_id": "0", "mig_profile": leaf["profile"]})
            add("gpulens_mig_instance_info", lab, 1.0)
        if leaf["uuid"] not in seen:
            seen.add(leaf["uuid"])
            mode = "enabled" if leaf["mig_uuid"] else "disabled"
            add("gpulens_gpu_info", {**phys, "name": leaf.get("model", H200), "mig_mode": mode}, 1)
            if leaf["util"] is not None:
                add("gpulens_gpu_utilization_ratio", phys, leaf["util"])
        if leaf["sm"] is not None:
            add("gpulens_gpu_sm_active_ratio", lab, leaf["sm"])
            # the integral counter, as if the leaf had always run at its current level since t0
            add("gpulens_gpu_sm_active_seconds_total", lab, _integral(leaf["uuid"], leaf["mig_uuid"], elapsed))
        if "busy" in leaf:
            add("gpulens_gpu_busy_ratio", lab, leaf["busy"])
            add("gpulens_gpu_busy_seconds_total", lab, leaf["busy"] * elapsed)
        if "procs" in leaf:
            add("gpulens_gpu_compute_processes", lab, leaf["procs"])
        if leaf["cls"] is not None:
            for c in CLASSES:
                add("gpulens_gpu_boundness", {**lab, "class": c}, 1.0 if leaf["cls"] == c else 0.0)
    for ns, pod, uuid, mig, replicas in ALLOCATIONS:
        for r in replicas:
            who = {"namespace": ns, "pod": pod, "container": "main", "workload_kind": "Deployment"}
            labels = {**who, "workload": pod.split("-")[0], "uuid": uuid, "mig_uuid": mig, "replica": r}
            add("gpulens_pod_gpu_allocation", labels, 1.0)
    return out


def _integral(uuid: str, mig: str, elapsed: float) -> float:
    busy = {"GPU-b": 0.6, "GPU-l": 0.001}.get(uuid, 0.0)
    if uuid == "GPU-h":
        return 0.55 * min(elapsed, IDLE_FROM)
    return busy * elapsed


def _exposition(samples: dict[str, list[tuple[dict[str, str], float]]], extra: dict[str, str]) -> str:
    lines = []
    for name, rows in samples.items():
        family = name.removesuffix("_total") if spec(name).type == "counter" else name
        lines.append(f"# TYPE {family} {spec(name).type}")
        lines += [f"{name}{label_text({**labels, **extra})} {value:g}" for labels, value in rows]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ScrapeSource, float, float]:
    """(the OpenMetrics history, a ScrapeSource fed the same scrapes, its start, the evaluation
    time T: a whole minute, the end of the history)."""
    tmp = tmp_path_factory.mktemp("consistency")
    end = math.floor(time.time() / 3600) * 3600 - 3600.0  # an hour in the past, out of the TSDB head's way
    t0 = end - HISTORY
    times = [t0 + 7.0 + SAMPLE * k for k in range(int(HISTORY // SAMPLE))]
    # OpenMetrics for promtool: one family block per metric, samples in time order
    by_series: dict[str, dict[str, tuple[dict[str, str], list[str | None], list[str]]]] = {}
    for t in times:
        for name, rows in _samples(t, t0).items():
            for labels, value in rows:
                full = {**labels, "instance": NODE, "job": "gpulens"}
                _, values, stamps = by_series.setdefault(name, {}).setdefault(label_text(full), (full, [], []))
                values.append(f"{value:g}")
                stamps.append(f"{t:.0f}")
    om = tmp / "history.om"
    with om.open("w") as out:
        history = OpenMetricsHistory(out)
        for name, series in by_series.items():
            for labels, values, stamps in series.values():
                history.series(name, labels, values, stamps)
        history.close()
    # the scrape source, fed the same samples at the same times
    clock = {"t": times[0]}
    pages = {t: _exposition(_samples(t, t0), {}) for t in times}
    src = ScrapeSource([f"http://{NODE}/metrics"], interval_s=SAMPLE, history=len(times) + 1,
                       fetch=lambda _url: pages[clock["t"]], clock=lambda: clock["t"])  # fmt: skip
    for t in times:
        clock["t"] = t
        src.scrape_once()
    clock["t"] = end
    return om, src, t0, end


@pytest.fixture(scope="module", params=STORES)
def history(
    request: pytest.FixtureRequest,
    recorded: tuple[Path, ScrapeSource, float, float],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, ScrapeSource, float]]:
    """(URL of a store with the raw and recorded series, the ScrapeSource, the evaluation time T),
    once on Prometheus (promtool backfills history and rules) and once on VictoriaMetrics (the
    history imported, vmalert replays the rules)."""
    om, src, t0, end = recorded
    tmp_path = tmp_path_factory.mktemp(str(request.param))
    if request.param == "victoriametrics":
        with run_victoriametrics() as base:
            import_openmetrics(base, om)
            replay_rules(base, t0, end, tmp_path, DASHBOARD_RECORDS)
            yield base, src, end
        return
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run the README test command (scripts/test.sh)")
    data = tmp_path / "data"
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    backfill_recording_rules(data, t0, end, tmp_path)
    config = "global: {scrape_interval: 1m}\nscrape_configs: []\n"
    with run_prometheus(config, storage_dir=str(data), extra_args=["--storage.tsdb.retention.time=30d"]) as base:
        yield base, src, end


def test_the_same_history_start(history: tuple[str, ScrapeSource, float]) -> None:
    """How much of a range the history covers (the dashboard's history banner, and the rules'
    coverage against the raw series' on Workloads) reads the same on every store and the scrape
    source: the first sample, to the search's resolution."""
    prom, scrape, end = history
    first = end - HISTORY + 7.0
    for name, src in (("store", PrometheusSource(prom)), ("scrape", scrape)):
        for window in (2 * 3600.0, 24 * 3600.0):  # longer than the history: it begins at its first sample
            step = max(15.0, window / HISTORY_STEPS)
            got = src.history_start(window=Window(window), end=end)
            assert first - 1 <= got <= first + step + 1, (name, window, got - first)
            # the recorded series begin at the rules' first evaluation with data (a minute in; the
            # scrape source computes them from the raw series)
            rules = src.history_start("gpulens:gpu_idle:bool", window=Window(window), end=end)
            assert first - 1 <= rules <= first + STEP + step + 1, (name, window, rules - first)
        got = src.history_start(window=Window(WINDOW), end=end)  # inside the history: the range's start
        assert end - WINDOW - 1 <= got <= end - WINDOW + max(15.0, WINDOW / HISTORY_STEPS) + 1, (name, got)
        assert math.isnan(src.history_start(window=Window(600.0), end=end - HISTORY - 3600)), name
        # seconds after the first scrape, before any step of the search holds it: not "no history"
        young = src.history_start(window=Window(24 * 3600.0), end=first + 5.0)
        assert first - 1 <= young <= first + 5.0, (name, young - first)
        node = src.history_start(filters=Filters(instance="elsewhere"), window=Window(WINDOW), end=end)
        assert math.isnan(node), (name, "the filters apply")


def _by_pod(df: pd.DataFrame) -> dict[tuple[str, str], float]:
    return {(str(r["namespace"]), str(r["pod"])): float(r["wasted_gpu_hours"]) for r in df.to_dict("records")}


def test_the_same_devices_are_idle(history: tuple[str, ScrapeSource, float]) -> None:
    prom, scrape, end = history
    expected = {("GPU-a", ""), ("GPU-h", ""), ("GPU-t", ""), ("GPU-u", ""), ("GPU-m", "MIG-3"), ("GPU-m", "MIG-1"),
                ("GPU-p", ""), ("GPU-r", "MIG-r1")}  # fmt: skip
    for name, src in (("rules", PrometheusSource(prom)), ("scrape", scrape)):
        verdict = src.leaf_idle(end=end)
        idle = {(str(u), str(m)) for u, m, v in zip(verdict["uuid"], verdict["mig_uuid"], verdict["value"],
                                                    strict=True) if v >= 0.5}  # fmt: skip
        busy = {(str(u), str(m)) for u, m, v in zip(verdict["uuid"], verdict["mig_uuid"], verdict["value"],
                                                    strict=True) if v < 0.5}  # fmt: skip
        assert idle == expected, name
        assert busy == {("GPU-b", ""), ("GPU-l", ""), ("GPU-m", "MIG-2"), ("GPU-q", ""), ("GPU-r", "MIG-r2")}, (
            f"{name}: the launch-bound GPU, the instance moving data, the busy L40S and the A100 "
            "instance running a process are in use, not idle"
        )


def test_the_same_wasted_gpu_hours(history: tuple[str, ScrapeSource, float]) -> None:
    prom, scrape, end = history
    expected = {
        ("ml", "a-0"): 0.5,  # 30 minutes of an idle whole GPU
        ("ml", "b-0"): 0.0,
        ("web", "l-0"): 0.0,  # launch-bound: not wasted
        ("etl", "x-0"): 0.0,  # transfer-bound MIG instance: not wasted
        ("web", "h-0"): 20 / 60,  # idle from minute 20.5 + the 5 m mean: minutes 26-45, 20 steps
        ("ml", "m-0"): 0.5 * 3 / 7,  # a 3g.71gb instance weighs 3/7
        ("web", "t-0"): 0.5 * 3 / 4,  # 3 of the 4 replicas of an idle GPU
        ("batch", "t-1"): 0.5 * 1 / 4,
        ("ml", "p-0"): 0.5,  # an idle L40S (no GPM): its GPU-Util says so
        ("ml", "q-0"): 0.0,
        ("ml", "r-0"): 0.5 * 3 / 7,  # an A100 3g.40gb instance with no process
        ("ml", "s-0"): 0.0,
    }
    rules = _by_pod(PrometheusSource(prom).allocation_activity(window=Window(WINDOW), step_s=STEP, end=end))
    pandas = _by_pod(scrape.allocation_activity(window=Window(WINDOW), step_s=STEP, end=end))
    assert set(rules) == set(pandas) == set(expected)
    for pod, hours in expected.items():
        assert pandas[pod] == pytest.approx(hours, abs=1e-9), (pod, pandas[pod])
        # Prometheus evaluates a rule every minute at an offset of its own (the backfill, a few
        # seconds after the minute), and a reader at a whole minute sees the previous evaluation:
        # across a transition the recorded series is at most one evaluation late
        slack = STEP / 3600 if pod == ("web", "h-0") else 0.0
        assert abs(rules[pod] - hours) <= slack + 1e-9, (pod, rules[pod], hours)
    # the advisor, from raw series with the definition inlined, per workload in GPU-hours
    usages = measure(PrometheusSource(prom), AdvisorWindow(window_s=WINDOW, step_s=STEP, end=end))
    advisor = {u.namespace + "/" + u.workload: recommend(u).evidence["gpu_hours_idle"] for u in usages}
    by_workload: dict[str, float] = {}
    for (ns, pod_name), hours in pandas.items():
        key = f"{ns}/{pod_name.split('-')[0]}"
        by_workload[key] = by_workload.get(key, 0.0) + hours
    assert set(advisor) == set(by_workload)
    for key, hours in by_workload.items():
        assert advisor[key] == pytest.approx(hours, abs=1e-9), (key, advisor[key], hours)


def test_the_same_class_now_from_the_state_sets_current_series(history: tuple[str, ScrapeSource, float]) -> None:
    """``current_state`` sends only the series of a state set whose value is 1 (the Efficiency and
    Workloads pages read the class now this way: a sixth of the boundness series), the same on
    the stores and the scrape source, with and without a namespace filter."""
    prom, scrape, end = history
    expected = {(leaf["uuid"], leaf["mig_uuid"]): leaf["cls"] for leaf in _leaves(end, end - WINDOW) if leaf["cls"]}
    for name, src in (("store", PrometheusSource(prom)), ("scrape", scrape)):
        now = src.current_state("gpulens_gpu_boundness", end=end)
        assert set(now["value"]) == {1.0}, name
        assert {(str(u), str(m)): str(c) for u, m, c in zip(now["uuid"], now["mig_uuid"], now["class"],
                                                            strict=True)} == expected, name  # fmt: skip
        web = src.current_state("gpulens_gpu_boundness", Filters(namespace="web"), end=end)
        assert set(web["uuid"]) == {"GPU-l", "GPU-h", "GPU-t"}, name
        # of one class only (the Fleet page's moving data): the store selects that class's series
        moving = src.current_state("gpulens_gpu_boundness", only=("class", "transfer"), end=end)
        assert {(str(u), str(m)) for u, m in zip(moving["uuid"], moving["mig_uuid"], strict=True)} == {
            leaf for leaf, cls in expected.items() if cls == "transfer"
        }, name
        assert set(moving["class"]) == {"transfer"}, name
        idle_web = src.current_state("gpulens_gpu_boundness", Filters(namespace="web"), only=("class", "idle"), end=end)
        assert set(idle_web["uuid"]) == {"GPU-h", "GPU-t"}, (name, idle_web)
        # with only the labels the Efficiency page reads: the same classes, no other label
        kept = src.current_state("gpulens_gpu_boundness", by=BOUNDNESS_NOW_LABELS, end=end)
        assert set(kept.columns) <= {*BOUNDNESS_NOW_LABELS, "value"}, (name, list(kept.columns))
        assert {"node", "cluster", "job"}.isdisjoint(kept.columns), name
        leaves = with_cols(kept, ["mig_uuid"])
        assert {(str(u), str(m)): str(c) for u, m, c in zip(leaves["uuid"], leaves["mig_uuid"], leaves["class"],
                                                            strict=True)} == expected, name  # fmt: skip
        rows = [set(boundness_now(df).astype(str).itertuples(index=False)) for df in (kept, now)]
        assert rows[0] == rows[1], name


def test_the_same_idle_since(history: tuple[str, ScrapeSource, float]) -> None:
    """``idle_since`` (the Fleet page's "idle for") is allocation_activity's first-allocated and
    last-busy steps for exactly the containers whose leaf is idle at the range's end, and the
    store and the scrape source agree on it (to one step: a rule's evaluation lags its minute)."""
    prom, scrape, end = history
    answers = {}
    for name, src in (("store", PrometheusSource(prom)), ("scrape", scrape)):
        since = src.idle_since(window=Window(WINDOW), step_s=STEP, end=end)
        verdict = src.leaf_idle(end=end)
        leaves = zip(verdict["uuid"], verdict["mig_uuid"], verdict["value"], strict=True)
        idle = {(u, m) for u, m, v in leaves if v >= 0.5}
        activity = src.allocation_activity(window=Window(WINDOW), step_s=STEP, end=end)
        expected = activity[[(u, m) in idle for u, m in zip(activity["uuid"], activity["mig_uuid"], strict=True)]]
        keys = ["namespace", "pod", "container", "uuid", "mig_uuid"]
        got = since.set_index(keys)[["first_allocated", "last_busy"]].sort_index()
        want = expected.set_index(keys)[["first_allocated", "last_busy"]].sort_index()
        assert list(got.index) == list(want.index), name
        assert got.equals(want), (name, got, want)
        pods = {pod for _ns, pod, *_ in got.index}
        assert pods == {"a-0", "h-0", "m-0", "t-0", "t-1", "p-0", "r-0"}, (name, "the idle leaves' containers")
        answers[name] = got
    store, pandas = answers["store"], answers["scrape"]
    assert list(store.index) == list(pandas.index)
    assert (store["first_allocated"] - pandas["first_allocated"]).abs().max() <= STEP
    busy_store, busy_pandas = store["last_busy"], pandas["last_busy"]
    assert list(busy_store.isna()) == list(busy_pandas.isna()), "never busy in the range: both sources"
    assert ((busy_store - busy_pandas).abs().dropna() <= STEP).all()
    assert busy_pandas.notna().any(), "the GPU idle since minute 20 was busy before"


class _Sent(requests.Session):
    """A requests session that keeps the text of every query it posts."""

    def __init__(self) -> None:
        super().__init__()
        self.queries: list[str] = []

    def post(self, url: Any, data: Any = None, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        self.queries.append(str((data or {}).get("query", "")))
        return super().post(url, data=data, **kwargs)


def test_idle_since_reads_only_the_idle_gpus_series_in_batches(
    history: tuple[str, ScrapeSource, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's ``idle_since`` asks which GPUs are idle now, then reads the range of only their
    series (issue 54: over every GPU's it cost the Fleet page most of its Prometheus time), a
    batch of GPUs a query: the same answer in batches of one GPU as in one batch."""
    from dashboard.sources import prometheus

    prom, _scrape, end = history
    whole = PrometheusSource(prom).idle_since(window=Window(WINDOW), step_s=STEP, end=end)
    monkeypatch.setattr(prometheus, "MAX_UUIDS_SELECTED", 1)
    sent = _Sent()
    batched = PrometheusSource(prom, session=sent).idle_since(window=Window(WINDOW), step_s=STEP, end=end)
    subqueries = [q for q in sent.queries if re.search(r"\[\d+s:\d+s\]", q)]
    verdict = PrometheusSource(prom).leaf_idle(end=end)
    idle_gpus = set(verdict["uuid"][verdict["value"] >= 0.5])
    assert len(idle_gpus) >= 5, verdict
    assert len(subqueries) == 2 * len(idle_gpus), sent.queries
    assert all('uuid=~"' in q for q in subqueries), subqueries
    keys = ["namespace", "pod", "container", "uuid", "mig_uuid"]
    assert batched.sort_values(keys).reset_index(drop=True).equals(whole.sort_values(keys).reset_index(drop=True))
