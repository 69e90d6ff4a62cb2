"""Golden expositions of the pre-Hopper nodes (a100, l40s, a10g): as tests/test_golden.py does for
the H200 nodes, a seeded simulated node renders byte-for-byte the checked-in file.

Regenerate only on purpose: ``.venv/bin/python -m pytest tests/test_sim_prehopper_golden.py
--update-golden``, then review the diff like any contract change.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from exporter import config
from exporter.sim import SCENARIOS
from tests.support.sim_exposition import render

GOLDEN = Path(__file__).parent / "golden"
PREHOPPER = ("a100", "l40s", "a10g")
_GPM_RATIOS = ("sm_active", "sm_occupancy", "tensor_active", "fp64_active", "fp32_active", "fp16_active", "dram_active")
GPM_FAMILIES = frozenset(f"gpulens_gpu_{name}_ratio" for name in _GPM_RATIOS)
"""Families only GPM fills."""


@pytest.fixture(autouse=True)
def _scenario_flag_takes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--sim.scenario`` takes every simulator scenario.  A no-op once exporter/config.py's
    ``SIM_SCENARIOS`` lists the pre-Hopper nodes (tests/test_defaults_once.py checks it does)."""
    monkeypatch.setitem(config._CHOICES, "sim_scenario", SCENARIOS)


@pytest.mark.parametrize("scenario", PREHOPPER)
def test_exposition_matches_golden(scenario: str, update_golden: bool) -> None:
    text = render(scenario)
    path = GOLDEN / f"{scenario}.prom"
    if update_golden:
        path.write_text(text + "\n")
    assert path.exists(), f"missing {path}: run with --update-golden once, on purpose"
    assert text + "\n" == path.read_text(), f"{scenario} exposition changed; if intended, --update-golden"


@pytest.mark.parametrize("scenario", PREHOPPER)
def test_exposition_has_no_gpm_series_and_passes_promtool(scenario: str) -> None:
    text = render(scenario, cycles=3).replace("<wallclock>", "1") + "\n"
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    gpm = [x for x in samples if x.split("{")[0] in GPM_FAMILIES or 'source="gpm"' in x]
    assert not gpm, gpm[:3]
    assert any('link="pcie"' in x and 'source="sampled"' in x for x in samples)
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: run the README test command (scripts/test.sh)"
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "" and proc.stderr.strip() == "", proc.stdout + proc.stderr
