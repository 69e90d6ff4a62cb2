"""bench/fleet_scale.py's split of the build from the timing, on a tiny fleet: ``--keep DIR`` builds
a VictoriaMetrics store with the history and the recorded rules (one sample per series per minute,
none twice) and writes its figures; ``--reuse DIR`` serves it and times the advisor on it; bad
combinations exit 2 naming the flag."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.prometheus import FLEET_RECORDS

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
DAYS = 0.05
"""72 minutes: long enough for every rule's window, short enough for a test."""


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.fleet_scale", *args], cwd=REPO, capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fleet") / "kept"
    run = bench("--gpus", "16", "--clusters", "2", "--days", f"{DAYS}", "--keep", str(root))
    assert run.returncode == 0, run.stderr[-3000:]
    return root


def test_keep_builds_a_store_with_its_figures(kept: Path) -> None:
    built = json.loads((kept / "build.json").read_text())
    vm = built["victoriametrics"]
    assert (kept / "vm-data").is_dir()
    assert built["gpus"] == 16 and built["samples"] == vm["samples"] > 0
    for key in (
        "import_s",
        "rules_s",
        "disk_raw_bytes",
        "disk_bytes",
        "build_peak_rss_bytes",
        "vmalert_peak_rss_bytes",
    ):
        assert vm[key] > 0, key
    assert vm["disk_bytes"] > vm["disk_raw_bytes"]
    assert set(vm["rules_s_each"]) == set(FLEET_RECORDS)
    assert vm["replay_points_per_query"] == 1000  # vmalert's default for a small fleet
    # every rule evaluated every minute over the whole window, no evaluation written twice
    minutes = int((DAYS * 86400 + built["spare_hours"] * 3600) // 60)
    sm = vm["recorded"]["gpulens:gpu_sm_active:ratio_avg5m"]
    assert sm["series"] == 16
    assert sm["min_per_series"] == sm["max_per_series"] == minutes


def test_reuse_times_the_advisor_on_the_kept_store(kept: Path, tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    run = bench("--reuse", str(kept), "--no-pages", "--runs", "1", "--out", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    vm = result["victoriametrics"]
    assert vm["advisor"]["workloads"] > 0
    assert vm["peak_rss_bytes"] > 0 and "pages" not in vm
    assert vm["disk_bytes"] == json.loads((kept / "build.json").read_text())["victoriametrics"]["disk_bytes"]


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--keep", "{tmp}/a", "--reuse", "{tmp}/a"], "--keep and --reuse"),
        (["--reuse", "{tmp}/missing"], "--reuse"),
        (["--gpus", "8", "--keep", "{tmp}/b", "--store", "prometheus"], "--store"),
        (["--gpus", "8", "--keep", "{tmp}", "--spare-hours", "1"], "--keep"),  # not empty
        (["--gpus", "8", "--spare-hours", "0"], "--spare-hours"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(tmp_path: Path, args: list[str], flag: str) -> None:
    (tmp_path / "something").write_text("x")
    run = bench(*(a.format(tmp=tmp_path) for a in args))
    assert run.returncode == 2
    assert flag in run.stderr
