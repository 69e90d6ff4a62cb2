"""Each default and constant is written once: the version in pyproject.toml (read back from the
package metadata; the chart's appVersion must match), the attribution defaults in the flags, and
the probe names, boundness classes and PodResources socket path in one module each."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.metadata
import os
import tomllib
from collections.abc import Iterator
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import pytest
import yaml

import exporter
from exporter.attribution import stages
from exporter.attribution.pipeline import AttributionOptions
from exporter.config import DEFAULT_PODRESOURCES_SOCKET, parse_config
from exporter.model import BOUNDNESS_CLASSES
from probes.expected import PROBES

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "deploy" / "helm" / "gpulens" / "Chart.yaml"
MANIFEST = REPO / "deploy" / "manifests" / "gpulens.yaml"
SOURCES = ("exporter", "dashboard", "probes", "scripts", "bench")
"""Where production code, the dashboard and the render/bench scripts live (tests may restate
expected values on purpose)."""


# --- the version ----------------------------------------------------------------------------------


def test_the_version_is_the_installed_distributions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.8.7" if name == "gpulens" else "")
    try:
        assert importlib.reload(exporter).__version__ == "9.8.7"
    finally:
        monkeypatch.undo()
        importlib.reload(exporter)


def test_pyproject_metadata_and_chart_app_version_agree() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load(CHART.read_text())
    assert exporter.__version__ == importlib.metadata.version("gpulens") == pyproject
    assert chart["appVersion"] == pyproject, "bump deploy/helm/gpulens/Chart.yaml appVersion with pyproject.toml"


# --- attribution defaults -------------------------------------------------------------------------


def test_attribution_options_take_every_value_from_the_flags() -> None:
    # --kubernetes.api defaulted to false while AttributionOptions.kube_api defaulted to true.
    defaults = [
        f.name for f in fields(AttributionOptions) if f.default is not MISSING or f.default_factory is not MISSING
    ]
    assert defaults == []


def test_the_api_watch_is_off_unless_asked_for() -> None:
    assert parse_config([], env={}).kube_api is False
    assert parse_config(["--kubernetes.api"], env={}).kube_api is True


def _exporter_container(manifest: Path) -> dict[str, Any]:
    for doc in yaml.safe_load_all(manifest.read_text()):
        if doc and doc.get("kind") == "DaemonSet":
            return next(c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == "exporter")
    raise AssertionError(f"no exporter DaemonSet in {manifest}")


def test_the_chart_mounts_the_kubelet_socket_where_the_exporter_looks_by_default() -> None:
    container = _exporter_container(MANIFEST)
    assert f"--kubernetes.podresources-socket={DEFAULT_PODRESOURCES_SOCKET}" in container["args"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["pod-resources"] == os.path.dirname(DEFAULT_PODRESOURCES_SOCKET)


# --- constants ------------------------------------------------------------------------------------


@functools.cache
def _text(path: Path) -> str:
    return path.read_text()


def _may_hold(path: Path, values: tuple[str, ...]) -> bool:
    """False where ``path``'s text lacks one of ``values``: no literal of the file can hold them all
    (a string written with escapes or split over implicit concatenation would be missed), so its
    syntax tree need not be built."""
    text = _text(path)
    return all(v in text for v in values)


@functools.cache
def _nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of ``path``'s syntax tree, kept per module run (each check walks every file)."""
    return tuple(ast.walk(ast.parse(_text(path))))


@functools.cache
def _constants(path: Path) -> tuple[ast.Constant, ...]:
    """The constants among ``_nodes(path)``, kept per module run (two checks look for values)."""
    return tuple(node for node in _nodes(path) if isinstance(node, ast.Constant))


def _python_files() -> Iterator[Path]:
    for top in SOURCES:
        for path in sorted((REPO / top).rglob("*.py")):
            if "_proto" not in path.parts:
                yield path


@functools.cache
def _string_collections(path: Path) -> tuple[tuple[int, frozenset[str]], ...]:
    """Every literal tuple, list or set of ``path`` made only of strings, with its line; kept per
    module run (three checks look for sets of names)."""
    return tuple(
        (node.lineno, frozenset(str(e.value) for e in node.elts if isinstance(e, ast.Constant)))
        for node in _nodes(path)
        if isinstance(node, ast.Tuple | ast.List | ast.Set)
        and node.elts
        and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)
    )


def _restatements(members: tuple[str, ...]) -> list[str]:
    found = []
    for path in _python_files():
        if not _may_hold(path, members):
            continue
        for line, values in _string_collections(path):
            if set(members) <= values:
                found.append(f"{path.relative_to(REPO)}:{line}")
    return found


@pytest.mark.parametrize(
    ("members", "home"),
    [(BOUNDNESS_CLASSES, "exporter/model.py"), (PROBES, "probes/expected.py")],
    ids=["boundness classes", "probes"],
)
def test_each_set_of_names_is_written_once(members: tuple[str, ...], home: str) -> None:
    assert [p.split(":")[0] for p in _restatements(members)] == [home], _restatements(members)


def test_the_podresources_socket_path_is_written_once() -> None:
    found = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for path in _python_files()
        if _may_hold(path, (DEFAULT_PODRESOURCES_SOCKET,))
        for node in _constants(path)
        if node.value == DEFAULT_PODRESOURCES_SOCKET
    ]
    assert [p.split(":")[0] for p in found] == ["exporter/config.py"], found


def test_the_attribution_stage_names_are_written_once() -> None:
    # The real sources and the pipeline's simulated ones each spelled them (podresources.STAGE and
    # pipeline.STAGE_PODRESOURCES, ...).
    names = {stages.PODRESOURCES, stages.KUBE_API}
    found = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for path in _python_files()
        if any(_may_hold(path, (name,)) for name in names)
        for node in _constants(path)
        if isinstance(node.value, str) and node.value in names
    ]
    assert {p.split(":")[0] for p in found} == {"exporter/attribution/stages.py"}, found


def test_library_defaults_are_the_flag_defaults() -> None:
    # Components keep defaults of their own for tests and embedding; a user only ever gets the
    # flags' (exporter.config). Where both exist they must say the same thing.
    import inspect

    from exporter.analysis.boundness import BoundnessClassifier
    from exporter.probe_scheduler import ProbeOptions
    from exporter.sampler import SamplerOptions

    cfg = parse_config([], env={})
    probes = ProbeOptions(enabled=True)
    sampler = SamplerOptions()
    window = inspect.signature(BoundnessClassifier).parameters["window_seconds"].default
    assert (sampler.interval_seconds, sampler.deadline_seconds) == (cfg.collect_interval, cfg.collect_deadline)
    assert window == cfg.analysis_window
    assert (
        probes.interval_seconds,
        probes.timeout_seconds,
        probes.max_utilization_ratio,
        probes.min_free_memory_bytes,
        probes.skip_allocated,
    ) == (
        cfg.probes_interval,
        cfg.probes_timeout,
        cfg.probes_max_utilization,
        cfg.probes_min_free_memory,
        cfg.probes_skip_allocated,
    )


def test_the_scenario_flag_accepts_exactly_the_simulators_scenarios() -> None:
    from exporter.config import SIM_SCENARIOS
    from exporter.sim import SCENARIOS

    assert SIM_SCENARIOS == SCENARIOS
    assert [p.split(":")[0] for p in _restatements(SCENARIOS)] == ["exporter/config.py"], _restatements(SCENARIOS)
