"""Shared fixtures (artifacts directory, ``--update-golden``) and the ``integration`` marker.

A test is ``integration`` when its module starts something outside the test process: a real
Prometheus, Chromium, the exporter or the dashboard as a process, a gRPC kubelet or an API
emulator, an image build, a soak. The marker is applied here from what the module uses, so a new
test file needs no bookkeeping: ``pytest -m "not integration"`` is the fast inner loop.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """``artifacts/`` at the repo root (gitignored): screenshots and logs tests leave behind."""
    path = REPO / "artifacts"
    path.mkdir(exist_ok=True)
    return path


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--update-golden``: rewrite golden files instead of comparing (only on purpose)."""
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="regenerate tests/golden/* from the current code instead of comparing",
    )


@pytest.fixture()
def update_golden(request: pytest.FixtureRequest) -> bool:
    """True when the run was asked to regenerate golden files."""
    return bool(request.config.getoption("--update-golden"))


_STARTS_SOMETHING = (
    "tests.support.prometheus",
    "tests.support.victoriametrics",
    "tests.support.browser",
    "tests.support.exporter",
    "tests.support.process",
    "kubelet_server",
    "kube_api_server",
    "playwright",
    "AppTest",
    "scripts/image.sh",
    "tests.support.load_soak",
)


@cache
def _starts_something(path: str) -> bool:
    text = Path(path).read_text()
    return any(marker in text for marker in _STARTS_SOMETHING)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of a module that starts servers, browsers or processes ``integration``."""
    for item in items:
        if _starts_something(str(item.path)):
            item.add_marker(pytest.mark.integration)
