"""Shared fixtures: the artifacts directory and ``--update-golden``.

A module whose tests start something outside the test process (a real Prometheus, Chromium, the
exporter or the dashboard as a process, a gRPC kubelet or an API emulator, an image build, a soak)
declares ``pytestmark = pytest.mark.integration``, and a test that runs another program (promtool,
git, a second interpreter) carries the marker itself or through its module; tests/test_layout.py
fails on either without it. ``pytest -m "not gpu and not integration"`` is the fast inner loop.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
PYCACHE = REPO / "build" / "pycache"
"""Where the suite keeps bytecode when the environment asks Python not to write it beside the
sources (``PYTHONDONTWRITEBYTECODE``, set on our CI machines)."""


def _keep_bytecode() -> None:
    """Compile each module once, not once per process.  Without bytecode every xdist worker and
    every interpreter a test starts compiles pandas, Streamlit and our modules again, and pytest
    rewrites every test module's asserts again: 8 s of each worker's start-up here.  The caches go
    under ``build/`` (gitignored), not beside the sources, so the tree stays as the setting meant;
    programs the tests start inherit the same two variables."""
    if not sys.dont_write_bytecode:
        return
    sys.pycache_prefix = str(PYCACHE)
    sys.dont_write_bytecode = False
    os.environ["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


_keep_bytecode()


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
def tmp_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh folder for the test.  A unit test's is in memory (``exporter.sim.backend.tree_parent``:
    /dev/shm when it is usable) and removed after it: these tests build sysfs and procfs trees of
    thousands of files, and on a virtual machine's ext4 each file operation costs ~0.1 ms, which made
    the fast loop wait on the disk (a third of its time was the kernel's).  An integration test's is
    pytest's usual numbered folder on disk, kept after the run: image builds and Prometheus data
    reach gigabytes, and their logs are read after a failure."""
    from exporter.sim.backend import tree_parent  # here: after _keep_bytecode, as tests import it

    parent = tree_parent()
    if parent is None or request.node.get_closest_marker("integration"):
        yield tmp_path_factory.mktemp(re.sub(r"\W", "_", request.node.name)[:30], numbered=True)
        return
    path = Path(tempfile.mkdtemp(prefix="gpulens-test-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def module_tmp_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder shared by one module's tests (a tree written once for the module), in memory as
    ``tmp_path`` is for a unit test and removed after the module; for an integration module,
    pytest's numbered folder on disk.  ``tmp_path_factory.mktemp`` would always write to disk and
    leave the files for the next run to delete (on this machine's ext4, each of a sysfs tree's
    thousands of files costs ~0.1 ms to write and again to remove)."""
    from exporter.sim.backend import tree_parent

    parent = tree_parent()
    if parent is None or request.node.get_closest_marker("integration"):
        yield tmp_path_factory.mktemp(re.sub(r"\W", "_", request.node.name)[:30], numbered=True)
        return
    path = Path(tempfile.mkdtemp(prefix="gpulens-module-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture()
def update_golden(request: pytest.FixtureRequest) -> bool:
    """True when the run was asked to regenerate golden files."""
    return bool(request.config.getoption("--update-golden"))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than the cores this process may use.  The unit tests wait as
    well as compute (a server's 1 s deadline, a hung probe killed, a client that never reads: ~10 s
    of the fast loop); with one worker a core, a core idles through every wait."""
    return len(os.sched_getaffinity(0)) + 1 if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1) + 1


def _module_marks(path: Path) -> frozenset[str]:
    """The marker names a test module declares for all its tests (``pytestmark = pytest.mark.x``
    or a list of them), read from its syntax tree without importing it (a module whose text never
    names ``pytestmark`` declares none: not parsed)."""
    source = path.read_bytes()
    if b"pytestmark" not in source:
        return frozenset()
    tree = ast.parse(source, str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            values = node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value]
            return frozenset(
                v.attr
                for v in values
                if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Attribute) and v.value.attr == "mark"
            )
    return frozenset()


@functools.cache
def _expression(markexpr: str) -> Any:
    """``-m``'s expression, compiled once (pytest's own parser)."""
    from _pytest.mark.expression import Expression

    return Expression.compile(markexpr)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave out, without importing it, a test module whose declared markers alone put every one of
    its tests outside ``-m`` (the fast loop's ``not integration`` and the integration modules):
    importing them (Streamlit's test runner, gRPC, the Prometheus and browser harness) was a third
    of each xdist worker's start.  Whatever other markers a test adds, the module's own are on it,
    so the expression is read with each other marker both present and absent: only a module whose
    tests it rejects either way is left out.  Any other module is collected as usual."""
    markexpr = config.getoption("markexpr", "")
    if not markexpr or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    try:
        marks = _module_marks(collection_path)
        if not marks:
            return None
        expression = _expression(markexpr)
        for others in (False, True):

            def matcher(name: str, /, **_kwargs: object) -> bool:
                return name in marks or others  # noqa: B023 (evaluated at once, in this iteration)

            if expression.evaluate(matcher):
                return None
    except Exception:  # an expression or a file this cannot read: collect as usual
        return None
    return True


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
