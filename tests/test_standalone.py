"""The repository stands alone: no reference to notes outside it, and the licence it declares."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Spelled in pieces so that this file does not match itself.
OUTSIDE = re.compile(
    "|".join(
        (
            r"\.\./" + "shared",
            "DESIGN" + " §",
            r"DESIGN\.md",
            "RELIABILITY" + " [0-9]",
            r"RELIABILITY\.md",
            "FACTS-" + "H200",
            r"STYLE\.md",
        )
    )
)


@pytest.mark.integration  # runs another program
def test_no_file_points_at_documents_outside_the_repository() -> None:
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    offenders = []
    for name in files:
        path = REPO / name
        if not path.is_file() or path.suffix in {".png", ".svg", ".jsonl"}:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        offenders += [f"{name}:{i}" for i, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)]
    assert not offenders, offenders


def test_the_licence_file_matches_the_package_metadata() -> None:
    assert "Apache License" in (REPO / "LICENSE").read_text()
    assert 'license = { text = "Apache-2.0" }' in (REPO / "pyproject.toml").read_text()
