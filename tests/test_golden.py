"""Golden exposition: a seeded simulated node renders byte-for-byte the checked-in file.

Regenerate only on purpose: ``.venv/bin/python -m pytest tests/test_golden.py --update-golden``,
then review the diff like any contract change.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporter.cli import make_attributor, make_classifier
from exporter.collector import SnapshotCollector
from exporter.config import parse_config
from exporter.sampler import Sampler
from exporter.sim import Simulation

GOLDEN = Path(__file__).parent / "golden"
CYCLES = 15
EPOCH = 1_790_000_000.0


def render(scenario: str, cycles: int = CYCLES) -> str:
    """Exposition of ``scenario`` (seed 0) after ``cycles`` cycles on a simulated clock."""
    cfg = parse_config(["--backend", "sim", "--sim.scenario", scenario, "--no-probes"], env={})
    simulation = Simulation.create(scenario, seed=0)
    backend = simulation.backend
    tick = [0.0]
    sampler = Sampler(
        backend,
        attributor=make_attributor(cfg, simulation),
        classifier=make_classifier(cfg),
        clock=lambda: tick[0],
        wall=lambda: EPOCH + tick[0],
    )
    try:
        for _ in range(cycles):
            sampler.run_once()
            tick[0] += 1.0
    finally:
        sampler.stop()
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(sampler.latest, backend="sim", wall=lambda: EPOCH + tick[0]))
    text = generate_latest(reg).decode()
    # Stage durations and refresh timestamps are wall-clock readings: the only non-deterministic values.
    volatile = ("gpulens_stage_duration_seconds{", "gpulens_podresources_last_success_timestamp_seconds ")
    return "\n".join(
        line.rsplit(" ", 1)[0] + " <wallclock>" if line.startswith(volatile) else line for line in text.splitlines()
    )


@pytest.mark.parametrize("scenario", ["h200x8", "mig", "timeslice", "mps"])
def test_exposition_matches_golden(scenario: str, update_golden: bool) -> None:
    text = render(scenario)
    path = GOLDEN / f"{scenario}.prom"
    if update_golden:
        path.write_text(text + "\n")
    assert path.exists(), f"missing {path}: run with --update-golden once, on purpose"
    assert text + "\n" == path.read_text(), f"{scenario} exposition changed; if intended, --update-golden"


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
