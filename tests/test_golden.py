"""Golden exposition: a seeded simulated node renders byte-for-byte the checked-in file; the
dashboard's fixtures are scrapes of the same simulator.

Regenerate both only on purpose: ``.venv/bin/python -m pytest tests/test_golden.py --update-golden``,
then review the diff like any contract change.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.sim_exposition import DASHBOARD_FIXTURES, dashboard_fixture, render

GOLDEN = Path(__file__).parent / "golden"
DASHBOARD = Path(__file__).parent / "fixtures" / "dashboard"
NODES = ["h200x8", "mig", "timeslice", "mps", "a100", "l40s", "a10g", "p5en", "p5en-nogdr", "jobs-0", "jobs-1", "dra"]
"""Simulated nodes with a golden exposition: the H200 ones, three without GPM, the two workers of a
multi-node job with RDMA NICs, the two nodes of four multi-node jobs, and a node whose GPUs come
through DRA ResourceClaims."""
PREHOPPER = ("a100", "l40s", "a10g")
_GPM_RATIOS = ("sm_active", "sm_occupancy", "tensor_active", "fp64_active", "fp32_active", "fp16_active", "dram_active")
GPM_FAMILIES = frozenset(f"gpulens_gpu_{name}_ratio" for name in _GPM_RATIOS)
"""Families only GPM fills."""


@pytest.mark.parametrize("scenario", NODES)
def test_exposition_matches_golden(scenario: str, update_golden: bool) -> None:
    text = render(scenario)
    path = GOLDEN / f"{scenario}.prom"
    if update_golden:
        path.write_text(text + "\n")
    assert path.exists(), f"missing {path}: run with --update-golden once, on purpose"
    assert text + "\n" == path.read_text(), f"{scenario} exposition changed; if intended, --update-golden"


@pytest.mark.parametrize("scenario", sorted(DASHBOARD_FIXTURES))
def test_dashboard_fixture_is_a_scrape_of_the_simulator(scenario: str, update_golden: bool) -> None:
    """The dashboard's tests read what the exporter exports today, not an old scrape."""
    text = dashboard_fixture(scenario)
    path = DASHBOARD / f"{scenario}.prom"
    if update_golden:
        path.write_text(text)
    assert text == path.read_text(), f"tests/fixtures/dashboard/{scenario}.prom drifted: --update-golden"


@pytest.mark.integration  # runs another program
@pytest.mark.parametrize("scenario", NODES)
def test_exposition_passes_promtool_check_metrics(scenario: str, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: run the README test command (scripts/test.sh)"
    text = render(scenario, cycles=3).replace("<wallclock>", "1") + "\n"
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "" and proc.stderr.strip() == "", proc.stdout + proc.stderr


def test_exposition_has_no_nan_timestamps_or_negative_values() -> None:
    for line in render("h200x8").splitlines():
        if line.startswith("#") or not line:
            continue
        value = line.rsplit(" ", 1)[1]
        assert value != "NaN" and not value.startswith("-"), line
        assert line.count(" ") == 1 or "}" in line, line  # no timestamp column


@pytest.mark.parametrize("scenario", PREHOPPER)
def test_a_node_without_gpm_exports_no_gpm_series(scenario: str) -> None:
    samples = [x for x in render(scenario, cycles=3).splitlines() if x and not x.startswith("#")]
    gpm = [x for x in samples if x.split("{")[0] in GPM_FAMILIES or 'source="gpm"' in x]
    assert not gpm, gpm[:3]
    assert any('link="pcie"' in x and 'source="sampled"' in x for x in samples)
