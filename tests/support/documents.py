"""YAML documents the tests read (the rules file, its tests, the chart), parsed with libyaml's
loader and each file once per process: the rules file alone took ~0.13 s per parse with the pure
Python loader, and the rule checks read it once per rule."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML was built with it (its wheels are), else the Python one."""


def parse_yaml(text: str) -> Any:
    """One YAML document, as ``yaml.safe_load`` reads it."""
    return yaml.load(text, Loader=_LOADER)


@functools.cache
def _parsed(path: Path, mtime_ns: int) -> Any:
    return parse_yaml(path.read_text())


def yaml_file(path: Path) -> Any:
    """The YAML document in ``path``, parsed once per process (again if the file changed); each
    caller gets its own copy to change."""
    return copy.deepcopy(_parsed(path, path.stat().st_mtime_ns))
