"""Who may import whom: production code imports no test, bench or script; tests import no bench and
no other test module; bench and scripts share only the harness (tests/support, tests/fakes).

So there is no cycle between tests, bench and scripts, and a helper two of them need lives in
tests/support, once.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PRODUCTION = ("exporter", "dashboard", "probes")
HARNESS = ("tests.support", "tests.fakes")


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return names


def _files(top: str) -> list[Path]:
    return sorted(p for p in (REPO / top).rglob("*.py") if "_proto" not in p.parts)


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize("top", PRODUCTION)
def test_production_code_imports_no_test_bench_or_script(top: str) -> None:
    bad = [
        (p.relative_to(REPO), n)
        for p in _files(top)
        for n in _imports(p)
        if n.split(".")[0] in ("tests", "bench", "scripts")
    ]
    assert not bad, bad


def test_tests_import_no_bench_script_or_other_test_module() -> None:
    bad = [
        (p.relative_to(REPO), n)
        for p in _files("tests")
        for n in _imports(p)
        if n.split(".")[0] in ("bench", "scripts") or (_under(n, "tests") and n.split(".")[1].startswith("test_"))
    ]
    assert not bad, bad


@pytest.mark.parametrize("top", ["bench", "scripts"])
def test_bench_and_scripts_share_only_the_harness(top: str) -> None:
    bad = [
        (p.relative_to(REPO), n)
        for p in _files(top)
        for n in _imports(p)
        if _under(n, "tests") and not any(_under(n, h) for h in HARNESS) and n != "tests"
    ]
    assert not bad, bad
    other = "scripts" if top == "bench" else "bench"
    assert not [(p, n) for p in _files(top) for n in _imports(p) if n.split(".")[0] == other]


def test_the_harness_imports_only_the_harness() -> None:
    bad = [
        (p.relative_to(REPO), n)
        for h in ("support", "fakes")
        for p in _files(f"tests/{h}")
        for n in _imports(p)
        if n.split(".")[0] in ("bench", "scripts")
        or (_under(n, "tests") and n != "tests" and not any(_under(n, x) for x in HARNESS))
    ]
    assert not bad, bad
