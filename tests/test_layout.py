"""Who may import whom: production code imports no test, bench or script; tests import no bench and
no other test module; bench and scripts share only the harness (tests/support, tests/fakes).

So there is no cycle between tests, bench and scripts, and a helper two of them need lives in
tests/support, once.

Inside the exporter, a module imports only its own layer and the layers below it
(``EXPORTER_LAYERS``), and nothing under dashboard/ imports the exporter's flags or HTTP front.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PRODUCTION = ("exporter", "dashboard", "probes")
HARNESS = ("tests.support", "tests.fakes")


@functools.cache
def _tree(path: Path) -> ast.Module:
    """The syntax tree of ``path``, parsed once per module run (several checks read every file;
    none changes the tree)."""
    return ast.parse(path.read_text(), str(path))


@functools.cache
def _imports(path: Path) -> list[str]:
    """Absolute imports of ``path``, kept per module run (several checks read every file)."""
    names: list[str] = []
    for node in ast.walk(_tree(path)):
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


# --- the exporter's layers -------------------------------------------------------------------------

EXPORTER_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "foundation",
        (
            "exporter",  # the package itself: __version__
            "exporter.model",
            "exporter.quantities",
            "exporter.listen_address",
            "exporter.fsread",
            "exporter.heap",
            "exporter.tcp",
            "exporter.label_values",
            "exporter.node_label",
        ),
    ),
    ("backends", ("exporter.backends",)),
    ("stages", ("exporter.attribution", "exporter.network", "exporter.analysis")),
    ("sampling", ("exporter.sampler", "exporter.probe_scheduler")),
    ("simulation", ("exporter.sim",)),
    ("render", ("exporter.render",)),
    ("http", ("exporter.http",)),
    ("composition root", ("exporter.config", "exporter.cli", "exporter.__main__")),
)
"""The exporter's layers, lowest first (docs/design.md, "Layout"): a module may
import its own layer and the layers below it, never one above. Snapshot types and the leaf parsers
at the bottom; the hardware seam; the per-cycle stages (attribution, NICs, analysis); the sampler and
the probe scheduler that run them; the simulated node, which stands in for the backend, the
attribution sources, the NIC tree and the probe child (so it sits above all of them); rendering a
snapshot; the HTTP front that serves it; and the flags and wiring, the only composition root."""

DASHBOARD_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "definitions",
        (
            "dashboard",  # the package itself
            "dashboard.promql",
            "dashboard.definitions",
            "dashboard.jobs",
            "dashboard.serving",  # the engine table and the serving rules (definitions of their own)
            "dashboard.inputs",
            "dashboard.sources.source",
            "dashboard.inert_text",
            "dashboard.words",
        ),
    ),
    ("frames", ("dashboard.frames",)),
    ("figures", ("dashboard.figures",)),
    ("sources", ("dashboard.sources",)),
    ("settings", ("dashboard.settings",)),
    ("advisor", ("dashboard.advisor",)),
    ("page parts", ("dashboard.ui", "dashboard.gpu_panels", "dashboard.serving_rows")),
    ("pages", ("dashboard.views", "dashboard.fleet_names")),
    ("composition root", ("dashboard.app", "dashboard.cli", "dashboard.server", "dashboard.__main__")),
)
"""The dashboard's layers, lowest first: the one place each concept is written (definitions, the
job grouping, PromQL helpers, option parsers, the Markdown escape) with the source interface (``sources.source``: what a
page may ask, the ``Window`` it reads over); the tables pages draw from (frames) and the charts
(figures); the two sources that answer the interface (Prometheus, scrapes), which build frames; the
settings; the advisor; the parts every page shares; the pages; and the entry points."""

LAYERS = {"exporter": EXPORTER_LAYERS, "dashboard": DASHBOARD_LAYERS}

DASHBOARD_FORBIDDEN = ("exporter.config", "exporter.http", "exporter.cli", "exporter.__main__")
"""What nothing under dashboard/ may import: the exporter's flags, its HTTP front, and the
composition root that loads both (docs/design.md, "Layout")."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str, layers: tuple[tuple[str, tuple[str, ...]], ...] = EXPORTER_LAYERS) -> int | None:
    """Index in ``layers`` of the layer ``module`` (or the module a name is imported from) belongs
    to: the longest matching prefix; None outside the package."""
    top = layers[0][1][0]
    best: tuple[int, int] | None = None
    for index, (_name, prefixes) in enumerate(layers):
        for prefix in prefixes:
            matches = module == prefix or (prefix != top and module.startswith(prefix + "."))
            if matches and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


def upward_imports(top: str = "exporter") -> list[str]:
    """Every import in ``top``/ of a layer above the importing module's own (lazy and
    ``TYPE_CHECKING`` imports included)."""
    layers = LAYERS[top]
    bad = []
    for path in _files(top):
        module = _module_name(path)
        own = layer_of(module, layers)
        assert own is not None, f"{module} is in no layer of {top}'s layers: place it there"
        flagged: list[str] = []
        for name in _imports(path):
            target = layer_of(name, layers)
            if target is None or target <= own or any(_under(name, f) for f in flagged):
                continue  # (``from m import x`` also lists ``m.x``: one line per import)
            flagged.append(name)
            bad.append(f"{path.relative_to(REPO)}: {module} ({layers[own][0]}) imports {name} ({layers[target][0]})")
    return bad


@pytest.mark.parametrize("top", sorted(LAYERS))
def test_every_layer_names_modules_that_exist(top: str) -> None:
    for _name, prefixes in LAYERS[top]:
        for prefix in prefixes:
            path = REPO.joinpath(*prefix.split("."))
            assert path.is_dir() or path.with_suffix(".py").is_file(), prefix


@pytest.mark.parametrize("top", sorted(LAYERS))
def test_no_module_imports_a_layer_above_its_own(top: str) -> None:
    bad = upward_imports(top)
    assert not bad, "\n".join(bad)


def test_the_dashboard_imports_neither_the_exporters_config_nor_its_http_front() -> None:
    bad = [
        (p.relative_to(REPO), n)
        for p in _files("dashboard")
        for n in _imports(p)
        if any(_under(n, forbidden) for forbidden in DASHBOARD_FORBIDDEN)
    ]
    assert not bad, bad


# --- the integration marker ------------------------------------------------------------------------

STARTERS = (
    "tests.support.prometheus",
    "tests.support.victoriametrics",
    "tests.support.browser",
    "tests.support.exporter",
    "tests.support.process",
    "tests.support.load_soak",
    "tests.support.podman",
    "tests.fakes.kubelet_server",
    "tests.fakes.kube_api_server",
    "playwright",
    "streamlit.testing",
)
"""What starts something outside the test process (a server, a browser, a process, a container,
Streamlit's app runner): a test module that imports one is ``integration``."""


def _declares_integration(path: Path) -> bool:
    """True when the module's ``pytestmark`` names ``pytest.mark.integration``."""
    for node in _tree(path).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return "pytest.mark.integration" in ast.unparse(node.value)
    return False


def test_a_module_that_starts_something_declares_the_integration_marker() -> None:
    """The fast loop (``-m 'not gpu and not integration'``) leaves out every test that starts a
    server, browser or process: the marker is declared in the module, and this keeps it honest."""
    missing = [
        p.name
        for p in (REPO / "tests").glob("test_*.py")
        if any(_under(n, s) for n in _imports(p) for s in STARTERS) and not _declares_integration(p)
    ]
    assert missing == [], f"import a server, browser or process starter without pytestmark = integration: {missing}"


PROGRAM_RUNNERS = frozenset({"subprocess"})
"""Modules whose use in a test runs another program (promtool, git, a second interpreter)."""


def _marked(node: ast.FunctionDef | ast.AsyncFunctionDef, marker: str) -> bool:
    return any(f"pytest.mark.{marker}" in ast.unparse(d) for d in node.decorator_list)


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def unmarked_program_runners(path: Path) -> list[str]:
    """Tests of ``path`` that run another program, directly or through the module's own functions,
    without the ``integration`` marker (on the test or on the module) or ``gpu``."""
    if _declares_integration(path):
        return []
    functions = {n.name: n for n in _tree(path).body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    names = {name: _names(fn) for name, fn in functions.items()}  # each function walked once
    runners = set(PROGRAM_RUNNERS)
    grew = True
    while grew:  # a helper that calls a helper that runs a program runs one too
        grown = {name for name in functions if names[name] & runners}
        grew = not grown <= runners
        runners |= grown
    return [
        f"{path.name}::{name}"
        for name, fn in functions.items()
        if name.startswith("test_") and names[name] & runners and not (_marked(fn, "integration") or _marked(fn, "gpu"))
    ]


def test_a_test_that_runs_another_program_is_integration() -> None:
    """The fast loop runs Python only: a test that runs promtool, git or another interpreter (a
    second of start-up each, and promtool's rule evaluation) is marked ``integration``, on the test
    or on its module."""
    missing = [t for p in sorted((REPO / "tests").glob("test_*.py")) for t in unmarked_program_runners(p)]
    assert missing == [], f"mark these @pytest.mark.integration: {missing}"
