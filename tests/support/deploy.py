"""The deployment artefacts as tests read them: the chart rendered by scripts/render_manifests.py
(the same code that writes deploy/manifests) and the Dockerfile's stages."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "gpulens"
MANIFESTS = REPO / "deploy" / "manifests"
DOCKERFILE = REPO / "deploy" / "Dockerfile"


def _load_renderer() -> ModuleType:
    # scripts/ is not a package: the tool is loaded from its file, as `python scripts/...` runs it.
    spec = importlib.util.spec_from_file_location("render_manifests", REPO / "scripts" / "render_manifests.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


renderer = _load_renderer()
"""scripts/render_manifests.py, loaded as a module."""


def objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The chart's objects rendered with ``values`` over its defaults."""
    return list(renderer.render_objects(values))


def one(objs: list[dict[str, Any]], kind: str, component: str | None = None) -> dict[str, Any]:
    """The single object of ``kind`` (and ``app.kubernetes.io/component``); fails if not exactly one."""
    found = [
        o
        for o in objs
        if o["kind"] == kind
        and (component is None or o["metadata"]["labels"].get("app.kubernetes.io/component") == component)
    ]
    assert len(found) == 1, f"expected one {kind} {component or ''}, got {len(found)}"
    return found[0]


def dockerfile_stages() -> dict[str, list[str]]:
    """Stage name -> its instructions (one string per instruction, continuations joined)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.IGNORECASE)
        if m:
            current = stages.setdefault(m.group(1), [])
        current.append(line)
    return stages
