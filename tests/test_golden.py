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


@pytest.mark.parametrize("scenario", ["h200x8", "mig", "timeslice", "mps"])
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


@pytest.mark.parametrize("scenario", ["h200x8", "mig", "timeslice", "mps"])
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
