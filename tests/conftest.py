"""Shared fixtures: the artifacts directory and ``--update-golden``.

A module whose tests start something outside the test process (a real Prometheus, Chromium, the
exporter or the dashboard as a process, a gRPC kubelet or an API emulator, an image build, a soak)
declares ``pytestmark = pytest.mark.integration``; tests/test_layout.py fails on one that starts
something without it. ``pytest -m "not gpu and not integration"`` is the fast inner loop.
"""

from __future__ import annotations

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


def _cost_rank(item: pytest.Item) -> int:
    """0 for a ``long`` module, 1 for another ``integration`` one, 2 for the rest."""
    if item.get_closest_marker("long"):
        return 0
    return 1 if item.get_closest_marker("integration") else 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules of minutes first, then the other integration modules, then the unit tests, each
    module's tests kept together and in file order: with ``--dist loadfile --no-loadscope-reorder``
    (scripts/test.sh) the parallel workers start the long modules at once and the short ones fill
    in behind them, instead of one long module starting last."""
    items.sort(key=_cost_rank)
