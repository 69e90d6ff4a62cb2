"""One set of dependency bounds: every bound the image locks are compiled under
(deploy/image/constraints.txt) is also in pyproject.toml, so ``pip install 'gpulens[...]'`` and the
image run the same range of versions of each package.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
CONSTRAINTS = REPO / "deploy" / "image" / "constraints.txt"


def requirement_lines(text: str) -> list[Requirement]:
    """The requirements of a pip requirements/constraints file (comments and blank lines skipped)."""
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [Requirement(line) for line in lines if line]


def project_requirements(project: Mapping[str, Any]) -> Iterable[tuple[str, Requirement]]:
    """(where, requirement) for the dependencies and every extra of pyproject.toml's ``[project]``,
    the project's references to its own extras left out."""
    own = canonicalize_name(project["name"])
    for text in project.get("dependencies", []):
        yield "dependencies", Requirement(text)
    for extra, texts in project.get("optional-dependencies", {}).items():
        for text in texts:
            req = Requirement(text)
            if canonicalize_name(req.name) != own:
                yield f"extra {extra}", req


def missing_bounds(constraints_text: str, project: Mapping[str, Any]) -> list[str]:
    """Each bound of ``constraints_text`` that pyproject.toml lacks: the package must be required
    there, and every requirement of it must carry each of the constraint's clauses."""
    problems = []
    declared = list(project_requirements(project))
    for constraint in requirement_lines(constraints_text):
        name = canonicalize_name(constraint.name)
        holders = [(where, req) for where, req in declared if canonicalize_name(req.name) == name]
        if not holders:
            problems.append(f"{constraint}: {constraint.name} is in no dependency list of pyproject.toml")
        for where, req in holders:
            lacking = {str(s) for s in constraint.specifier} - {str(s) for s in req.specifier}
            if lacking:
                problems.append(
                    f"{constraint}: pyproject.toml's {where} has {req}, without {','.join(sorted(lacking))}"
                )
    return problems


def test_every_image_bound_is_in_pyproject() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert missing_bounds(CONSTRAINTS.read_text(), project) == []


def test_a_bound_only_the_image_has_is_found() -> None:
    """The case this test was written for: the image pinned ``kubernetes<36`` while the k8s extra
    allowed any version from 29, so a pip user ran a client the image never did."""
    extras = {"k8s": ["kubernetes>=29"], "dev": ["gpulens[k8s]", "kubernetes>=29,<36"]}
    project = {"name": "gpulens", "dependencies": ["pyyaml>=6"], "optional-dependencies": extras}
    assert missing_bounds("# why\nkubernetes<36  # aio\n", project) == [
        "kubernetes<36: pyproject.toml's extra k8s has kubernetes>=29, without <36"
    ]
    assert missing_bounds("PyYAML>=6\n", project) == [], "names compare as pip compares them"
    assert missing_bounds("h2<5\n", project) == ["h2<5: h2 is in no dependency list of pyproject.toml"]
    extras["k8s"] = ["kubernetes<36,>=29"]
    assert missing_bounds("kubernetes<36\n", project) == []
