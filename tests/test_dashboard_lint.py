"""Lint: no module under dashboard/ has an expression statement that Streamlit "magic" would render.

Streamlit rewrites every expression statement of a page script whose value is not a call, a
docstring, ``yield`` or ``await`` into ``st.write(value)``: ``st.success(...) if ok else
ui.no_data(...)`` written as a statement draws ``None`` or a DeltaGenerator's help text under the
panel. The check runs Streamlit's own transformer (``magic.add_magic``) over the scripts Streamlit
executes (app.py and every page under views/), so it flags exactly what the running app would draw.
Modules the scripts import are not transformed by Streamlit, but a future page could inline their
code, so they may hold no expression statements either beyond docstrings and ``...``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from streamlit.runtime.scriptrunner import magic

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "dashboard"
SCRIPTS = sorted([DASHBOARD / "app.py", *(DASHBOARD / "views").glob("*.py")])
MODULES = sorted(set(DASHBOARD.rglob("*.py")) - set(SCRIPTS))


def rendered_expressions(code: str, path: str) -> list[int]:
    """Line numbers of the statements Streamlit magic would turn into ``st.write`` calls."""
    tree = magic.add_magic(code, path)
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == magic.MAGIC_MODULE_NAME
    )


def test_the_check_finds_a_conditional_expression_statement() -> None:
    bad = "import streamlit as st\ndef body(ok):\n    st.success('x') if ok else st.info('y')\n"
    assert rendered_expressions(bad, "bad.py") == [3]
    good = 'import streamlit as st\ndef body(ok):\n    """Doc."""\n    st.success("x")\n'
    assert rendered_expressions(good, "good.py") == []


def _quiet_constant(value: object) -> bool:
    return isinstance(value, str) or value is ...


def bare_expressions(code: str) -> list[int]:
    """Line numbers of expression statements other than calls, awaits, yields, string constants
    (docstrings, attribute docstrings) and ``...`` (Protocol bodies)."""
    allowed = (ast.Call, ast.Await, ast.Yield, ast.YieldFrom)
    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.Expr)
        and not isinstance(node.value, allowed)
        and not (isinstance(node.value, ast.Constant) and _quiet_constant(node.value.value))
    )


def test_every_page_script_is_checked() -> None:
    # app.py runs the app on import: read its PAGES table from the source instead
    tree = ast.parse((DASHBOARD / "app.py").read_text())
    table = next(
        n.value
        for n in tree.body
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PAGES" for t in n.targets)
    )
    pages = {DASHBOARD / path for path, *_ in ast.literal_eval(table)}
    assert pages and pages <= set(SCRIPTS)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_page_script_has_an_expression_streamlit_would_render(path: Path) -> None:
    lines = rendered_expressions(path.read_text(), str(path))
    assert not lines, f"{path.relative_to(REPO)}: expression statements rendered by Streamlit magic at lines {lines}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_dashboard_module_has_a_bare_expression_statement(path: Path) -> None:
    lines = bare_expressions(path.read_text())
    assert not lines, f"{path.relative_to(REPO)}: bare expression statements at lines {lines}"
