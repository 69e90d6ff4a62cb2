"""The simulator's fault spec (``--sim.faults``) and ``SimFaults`` refuse non-finite, negative,
non-ASCII and absurd values by key, and the exporter's command line exits 2 on them."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from exporter.sim import SimFaults


@pytest.mark.parametrize(
    ("spec", "key"),
    [
        ("hang=nan", "hang"),
        ("hang=inf", "hang"),
        ("hang=-0", "hang"),
        ("hang=1e9", "hang"),
        ("hang=1_0", "hang"),
        ("hang=\u0661", "hang"),  # ARABIC-INDIC DIGIT ONE
        ("hang=86401", "hang"),
        ("hang=1;hang=2", "hang"),
        ("transient=power_watts:-5", "transient"),
        ("transient=power_watts:0", "transient"),
        ("transient=power_watts:1_0", "transient"),
        ("transient=power_watts:\uff13", "transient"),  # FULLWIDTH DIGIT THREE
        ("transient=power_watts:1000001", "transient"),
        ("lost=\u0663", "lost"),
        ("lost=+3", "lost"),
        ("lost= 3 5", "lost"),
        ("lost=256", "lost"),
        ("xid=2:0", "xid"),
        ("xid=2:-79", "xid"),
        ("xid=\u0662:79", "xid"),
        ("xid=256:79", "xid"),
        ("xid=2:1000", "xid"),
        ("unsupported=", "unsupported"),
        ("unsupported= , ", "unsupported"),
        ("unavailable;unavailable=false", "unavailable"),
        ("pcie_link=2:6:16", "pcie_link"),
        ("pcie_link=2:0:16", "pcie_link"),
        ("pcie_link=2:4:17", "pcie_link"),
        ("pcie_link=256:4:16", "pcie_link"),
        ("pcie_link=2:4", "pcie_link"),
        ("pcie_link=2:4:8:1", "pcie_link"),
        ("nvlink_errors=1:crc:5", "nvlink_errors"),
        ("nvlink_errors=1:replay:0", "nvlink_errors"),
        ("nvlink_errors=1:replay:1000001", "nvlink_errors"),
        ("nvlink_errors=1:replay", "nvlink_errors"),
        ("nvlink_errors=\u0661:replay:1", "nvlink_errors"),
        ("nvlink_down=1", "nvlink_down"),
        ("nvlink_down=1:18", "nvlink_down"),
        ("nvlink_down=256:0", "nvlink_down"),
        ("nvlink_down=1:-1", "nvlink_down"),
        ("nvlink_down=", "nvlink_down"),
    ],
)
def test_bad_fault_values_are_refused_naming_the_flag_and_the_key(spec: str, key: str) -> None:
    with pytest.raises(ValueError) as err:
        SimFaults.parse(spec)
    message = str(err.value)
    assert message.startswith("--sim.faults: ")
    assert key in message.partition("': ")[2], message  # the reason names the key, not only the quoted part


def test_hang_takes_seconds_or_milliseconds() -> None:
    assert SimFaults.parse("hang=500ms").hang_seconds == 0.5
    assert SimFaults.parse("hang=1.5s").hang_seconds == 1.5


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -1.0, 1e30])
def test_hang_set_at_run_time_must_be_finite_and_bounded(seconds: float) -> None:
    faults = SimFaults()
    with pytest.raises(ValueError, match="hang"):
        faults.hang_seconds = seconds
    assert faults.hang_seconds == 0.0
    with pytest.raises(ValueError, match="hang"):
        SimFaults(hang_seconds=seconds)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"lost": {-1}}, "lost"),
        ({"transient": {"power_watts": 0}}, "transient"),
        ({"transient": {"power_watts": -5}}, "transient"),
        ({"xid": {0: [0]}}, "xid"),
        ({"xid": {-1: [79]}}, "xid"),
        ({"pcie_link": {0: (6, 16)}}, "pcie_link"),
        ({"pcie_link": {0: (5, 0)}}, "pcie_link"),
        ({"nvlink_errors": {(0, "bogus"): 1}}, "nvlink_errors"),
        ({"nvlink_errors": {(0, "replay"): 0}}, "nvlink_errors"),
        ({"nvlink_down": {(0, 18)}}, "nvlink_down"),
        ({"nvlink_down": {(-1, 0)}}, "nvlink_down"),
    ],
)
def test_faults_built_in_code_are_checked_like_the_spec(kwargs: dict[str, object], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        SimFaults(**kwargs)  # type: ignore[arg-type]


@pytest.mark.integration  # runs another program
@pytest.mark.parametrize(
    ("spec", "key"),
    [("hang=nan", "hang"), ("transient=power_watts:-5", "transient"), ("lost=\u0663", "lost")],
)
def test_bad_fault_spec_exits_2_from_the_real_command(spec: str, key: str) -> None:
    argv = ["--backend", "sim", "--sim.faults", spec, "--web.listen-address", "127.0.0.1:0", "--no-probes"]
    proc = subprocess.run([sys.executable, "-m", "exporter", *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--sim.faults" in proc.stderr
    assert key in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.integration  # runs another program
def test_bad_fault_spec_in_the_environment_twin_exits_2() -> None:
    env = {"GPULENS_BACKEND": "sim", "GPULENS_SIM_FAULTS": "hang=-0", "GPULENS_WEB_LISTEN_ADDRESS": "127.0.0.1:0"}
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "--no-probes"], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 2
    assert "--sim.faults" in proc.stderr and "hang" in proc.stderr
    assert "Traceback" not in proc.stderr
