"""The fleet history's fast path into VictoriaMetrics (``scripts/backfill_fleet.py --format vm-json``
through ``/api/v1/import``) stores exactly what the OpenMetrics path stores (the file promtool
backfills, through ``/api/v1/import/prometheus``): two VictoriaMetrics, one fed each way, hold the
same series with the same samples, and answer the same queries with the same numbers.

The history is small (24 GPUs on 3 nodes in 2 clusters, 3 hours every 240 s) but has every kind of
series the large one has, including allocations that end halfway (no samples after the pod is gone).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from exporter.model import BOUNDNESS_CLASSES
from tests.support.victoriametrics import import_json_stream, import_openmetrics, query, run_victoriametrics

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
END = float(int(time.time()) // 3600 * 3600 - 86400)
"""The last sample: a day ago (inside the store's retention, whole hours)."""
FLEET = ["--gpus", "24", "--nodes", "3", "--clusters", "2", "--hours", "3", "--interval", "240", "--end", f"{END:.0f}"]
METRICS = (
    "gpulens_up",
    "gpulens_gpu_info",
    "gpulens_gpu_sm_active_ratio",
    "gpulens_gpu_utilization_ratio",
    "gpulens_gpu_dram_active_ratio",
    "gpulens_gpu_pipe_active_max_ratio",
    "gpulens_gpu_boundness",
    "gpulens_pod_gpu_allocation",
)


def backfill(tmp: Path, fmt: str) -> tuple[Path, int]:
    """The history in format ``fmt`` and the samples the script reports."""
    out = tmp / f"fleet.{fmt}"
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "backfill_fleet.py"), *FLEET, "--format", fmt, "--out", str(out)],
        check=True,
        capture_output=True,
        text=True,
    )
    return out, int(run.stderr.split()[0])


def export(base: str) -> dict[str, tuple[list[float], list[int]]]:
    """Every sample VictoriaMetrics holds, by series (its labels as sorted JSON)."""
    params = urllib.parse.urlencode({"match[]": '{__name__=~".+"}', "start": "0", "end": f"{END + 3600:.0f}"})
    with urllib.request.urlopen(f"{base}/api/v1/export?{params}", timeout=60) as resp:
        rows = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
    return {json.dumps(r["metric"], sort_keys=True): (r["values"], r["timestamps"]) for r in rows}


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, int, int, int]]:
    """(VictoriaMetrics fed OpenMetrics, VictoriaMetrics fed JSON lines, samples in the OpenMetrics
    file, samples in the JSON file, JSON lines imported)."""
    tmp = tmp_path_factory.mktemp("fleet-import")
    om, om_samples = backfill(tmp, "openmetrics")
    js, js_samples = backfill(tmp, "vm-json")
    with ExitStack() as es:
        slow = es.enter_context(run_victoriametrics(tmp / "om"))
        fast = es.enter_context(run_victoriametrics(tmp / "json"))
        import_openmetrics(slow, om)
        with js.open("rb") as f:
            lines = import_json_stream(fast, f, chunk_bytes=64 << 10)  # several requests
        yield slow, fast, om_samples, js_samples, lines


def test_both_formats_carry_the_same_number_of_samples(stores: tuple[str, str, int, int, int]) -> None:
    _slow, _fast, om_samples, js_samples, lines = stores
    assert om_samples == js_samples > 0
    # 3 nodes' up, 24 GPUs x (info, 4 ratios, a series per class), an allocation per held GPU
    per_gpu = 1 + 4 + len(BOUNDNESS_CLASSES)
    assert 3 + 24 * per_gpu < lines <= 3 + 24 * (per_gpu + 1)


def test_the_fast_import_stores_every_sample_the_openmetrics_import_stores(
    stores: tuple[str, str, int, int, int],
) -> None:
    slow, fast, om_samples, _js, _lines = stores
    a, b = export(slow), export(fast)
    assert sorted(a) == sorted(b)
    assert sum(len(v) for v, _t in a.values()) == om_samples
    for key, series in a.items():
        assert b[key] == series, key
    # the pods that end halfway have fewer samples than the window has steps
    allocations = [len(v) for k, (v, _t) in a.items() if "gpulens_pod_gpu_allocation" in k]
    assert min(allocations) < max(allocations)


def answers(base: str, expr: str) -> dict[str, float]:
    got = {json.dumps(r["metric"], sort_keys=True): float(r["value"][1]) for r in query(base, expr, at=END)}
    assert got, expr
    return got


@pytest.mark.parametrize("metric", METRICS)
def test_both_stores_answer_the_same(stores: tuple[str, str, int, int, int], metric: str) -> None:
    slow, fast, *_ = stores
    # per series: the same samples give the same numbers, to the last bit
    for expr in (f"count({metric})", f"count_over_time({metric}[4h])", f"sum_over_time({metric}[4h])"):
        assert answers(fast, expr) == answers(slow, expr), expr
    # across series: the same up to the order VictoriaMetrics adds the series in (its internal ids
    # follow the order of arrival), a difference in the last bit of a float64
    for expr in (f"sum(sum_over_time({metric}[4h]))", f"sum by (cluster) (avg_over_time({metric}[1h]))"):
        got, want = answers(fast, expr), answers(slow, expr)
        assert got.keys() == want.keys(), expr
        for key, value in want.items():
            assert math.isclose(got[key], value, rel_tol=1e-12), (expr, key)
