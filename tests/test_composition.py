"""Simulation is chosen once, at the composition root: no production module names the simulator,
and the exporter imports nothing from the dashboard."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXPORTER = REPO / "exporter"
SIM = EXPORTER / "sim"
COMPOSITION_ROOT = EXPORTER / "cli.py"


def production_modules() -> Iterator[Path]:
    """Every exporter module outside the simulation package."""
    for path in sorted(EXPORTER.rglob("*.py")):
        if SIM not in path.parents:
            yield path


def imported_modules(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def _is_sim_name_check(node: ast.Compare) -> bool:
    """``<x>.name == "sim"`` (either side, any comparison)."""
    sides = [node.left, *node.comparators]
    has_name = any(isinstance(s, ast.Attribute) and s.attr == "name" for s in sides)
    has_sim = any(isinstance(s, ast.Constant) and s.value == "sim" for s in sides)
    return has_name and has_sim


def test_only_the_composition_root_imports_the_simulator() -> None:
    offenders = [
        f"{path.relative_to(REPO)} imports {module}"
        for path in production_modules()
        if path != COMPOSITION_ROOT
        for module in imported_modules(ast.parse(path.read_text()))
        if module == "exporter.sim" or module.startswith("exporter.sim.")
    ]
    assert offenders == []


def test_no_production_module_defines_simulated_parts() -> None:
    offenders = [
        f"{path.relative_to(REPO)}: {node.name}"
        for path in production_modules()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef | ast.FunctionDef) and "simulat" in node.name.lower()
    ]
    assert offenders == []


def test_nothing_branches_on_the_backend_being_the_simulator() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for path in production_modules()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Compare) and _is_sim_name_check(node)
    ]
    assert offenders == []


def test_the_exporter_imports_nothing_from_the_dashboard() -> None:
    offenders = [
        f"{path.relative_to(REPO)} imports {module}"
        for path in sorted(EXPORTER.rglob("*.py"))
        for module in imported_modules(ast.parse(path.read_text()))
        if module.split(".")[0] == "dashboard"
    ]
    assert offenders == []
