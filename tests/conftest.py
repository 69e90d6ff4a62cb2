"""Shared fixtures: artifacts directory for screenshots and logs."""

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
