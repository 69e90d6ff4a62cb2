"""The recording rules and dashboard/definitions.py are one definition of idle and wasted GPU-hours:
every rule the module describes reads exactly as the module writes it, with the same thresholds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from dashboard import definitions

REPO = Path(__file__).resolve().parents[1]
RULES_FILE = REPO / "deploy" / "rules" / "gpulens.rules.yml"


def _recorded() -> dict[str, str]:
    doc = yaml.safe_load(RULES_FILE.read_text())
    return {r["record"]: r["expr"] for g in doc["groups"] for r in g["rules"] if "record" in r}


def _squash(expr: str) -> str:
    return re.sub(r"\s+", "", expr)


@pytest.mark.parametrize("name", sorted(definitions.RULES))
def test_rule_reads_as_the_definition_writes_it(name: str) -> None:
    recorded = _recorded()
    assert name in recorded, f"{name} is missing from {RULES_FILE.name}"
    assert _squash(recorded[name]) == _squash(definitions.RULES[name]), name


def test_thresholds_in_the_rule_file_are_the_python_constants() -> None:
    recorded = _recorded()
    idle = recorded["gpulens:gpu_idle:bool"]
    assert re.findall(r"< bool ([0-9.]+)", idle) == [repr(definitions.IDLE_SM_ACTIVE_BELOW)] * 2
    kernels = recorded["gpulens:gpu_kernels_active:bool"]
    assert re.findall(r">= bool ([0-9.]+)", kernels) == [repr(definitions.KERNELS_UTIL_AT_LEAST)]
    assert f"[{definitions.MEAN_WINDOW}]" in recorded["gpulens:gpu_sm_active:ratio_avg5m"]
    assert "[1h:1m]" in recorded["namespace:gpulens_gpu_wasted_hours:sum1h"]
    assert definitions.WASTE_RESOLUTION_SECONDS == 60.0
    # the idle alert uses the same threshold
    alerts = {r["alert"]: r["expr"] for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"]
              if "alert" in r}  # fmt: skip
    assert f"< {definitions.IDLE_SM_ACTIVE_BELOW!r}" in alerts["GPUAllocatedButIdle"]


@pytest.mark.parametrize(
    ("profile", "model", "share"),
    [
        ("", "NVIDIA H200", 1.0),
        ("3g.71gb", "NVIDIA H200", 3 / 7),
        ("1g.18gb", "NVIDIA H200", 1 / 7),
        ("7g.141gb", "NVIDIA H200", 1.0),
        ("1g.6gb", "NVIDIA A30", 1 / 4),
        ("2g.12gb", "NVIDIA A30 24GB", 2 / 4),
        ("1c.3g.71gb", "NVIDIA H200", 1.0),
    ],
)
def test_gpu_share(profile: str, model: str, share: float) -> None:
    assert definitions.gpu_share(profile, model) == pytest.approx(share)
