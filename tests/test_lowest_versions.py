"""The version promises of pyproject.toml, kept: scripts/lowest_versions.sh installs every direct
dependency at its floor (``uv pip install --resolution lowest-direct``) into its own venv and runs the
fast loop there. A floor that no longer installs, or under which a test fails, fails this test with
the script's last lines; raise the floor in pyproject.toml and say why beside it.

Part of the full suite, so CI runs it; it starts an installer and a second pytest, hence
``integration``, and takes minutes, hence ``long``."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.long, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[1]


def test_the_fast_loop_passes_on_the_lowest_allowed_versions() -> None:
    uv = shutil.which("uv")
    assert uv, "uv missing: run the README test command (scripts/test.sh puts it on PATH)"
    # One process inside this worker's slot: the suite's other workers run beside it.
    env = {**os.environ, "UV": uv, "GPULENS_LOWEST_WORKERS": "0"}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "lowest_versions.sh")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1700)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout, proc.stdout[-2000:]
