"""exporter/http/tls_groups.py on every CPython minor the project allows that this machine has.

Below Python 3.15 the module finds OpenSSL's ``SSL_CTX *`` inside CPython's ``SSLContext`` object
through ctypes, so a CPython release that moved it would break the key-exchange limit (or crash).
Each interpreter found (pyenv's versions, then ``python3.X`` on PATH, then the one running pytest)
runs tests/support/tls_groups_check.py as a subprocess with only the standard library and the
repository on its path (``-S``: no site-packages; ``-P``: not tests/support first), and must pass;
the same check with the module sabotaged must fail, so a pass means something.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import trustme
from packaging.specifiers import SpecifierSet

from tests.support.web import write_pair

pytestmark = pytest.mark.integration  # each case starts an interpreter

REPO = Path(__file__).resolve().parents[1]
CHECK = REPO / "tests" / "support" / "tls_groups_check.py"
CHECK_TIMEOUT_S = 120
"""Seconds one check may take (about 1 s of CPU on an idle core; a loaded CI machine is slower)."""
MINORS = range(11, 30)
"""The CPython 3.X minors looked for."""


def _requires_python() -> SpecifierSet:
    return SpecifierSet(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"])


def _candidates() -> list[tuple[str, str]]:
    """(minor, interpreter path) worth trying, best first: pyenv's installs, python3.X on PATH, this
    one. Read from names only, so that collection starts no process and every xdist worker makes
    the same test IDs; each test checks that its interpreter is the CPython its name says."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = []
    for binary in sorted(pyenv.glob("3.*/bin/python3")):
        if m := re.fullmatch(r"(3\.\d+)\.\d+", binary.parts[-3]):
            found.append((m.group(1), str(binary)))
    found += [(f"3.{minor}", path) for minor in MINORS if (path := shutil.which(f"python3.{minor}"))]
    found.append((f"{sys.version_info.major}.{sys.version_info.minor}", sys.executable))
    return found


def _cpython_minor(python: str) -> str | None:
    """``3.X`` if ``python`` runs and is CPython, else None."""
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(sys.implementation.name, *sys.version_info[:3])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return None
    words = out.stdout.split()
    if out.returncode != 0 or len(words) != 4 or words[0] != "cpython":
        return None
    return f"{words[1]}.{words[2]}"


def interpreters() -> dict[str, str]:
    """One interpreter per CPython minor found that requires-python allows: minor -> path."""
    allowed = _requires_python()
    chosen: dict[str, str] = {}
    for minor, python in _candidates():
        if minor not in chosen and f"{minor}.0" in allowed:
            chosen[minor] = python
    return dict(sorted(chosen.items(), key=lambda kv: tuple(map(int, kv[0].split(".")))))


INTERPRETERS = interpreters()


@pytest.fixture(scope="module")
def pems(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """CA, certificate and key files for the check's server (made here: the check has no trustme)."""
    folder = tmp_path_factory.mktemp("tls_groups")
    ca = trustme.CA()
    ca_path = folder / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    cert, key = write_pair(ca, folder)
    return [str(ca_path), str(cert), str(key)]


def run_check(python: str, pems: list[str], *extra: str) -> subprocess.CompletedProcess[str]:
    """tls_groups_check.py under ``python`` with the standard library and the repository only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [python, "-P", "-S", str(CHECK), *pems, *extra],
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT_S,
        env=env,
        check=False,
    )


def _has_native(python: str) -> bool:
    code = "import ssl, sys; sys.exit(0 if hasattr(ssl.SSLContext, 'set_groups') else 1)"
    return subprocess.run([python, "-S", "-c", code], timeout=30, check=False).returncode == 0


def test_the_running_interpreter_is_among_those_checked() -> None:
    """Discovery works at least for the interpreter under pytest (else every case below is missing)."""
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in INTERPRETERS, INTERPRETERS


@pytest.mark.parametrize("minor", list(INTERPRETERS))
def test_groups_are_limited(minor: str, pems: list[str]) -> None:
    """An ffdhe-only client is refused, EC clients are served, a list is kept to, bad names refused."""
    assert _cpython_minor(INTERPRETERS[minor]) == minor, f"{INTERPRETERS[minor]} is not a working CPython {minor}"
    out = run_check(INTERPRETERS[minor], pems)
    assert out.returncode == 0, f"CPython {minor} ({INTERPRETERS[minor]}): rc {out.returncode}\n{out.stderr}"
    assert out.stdout.startswith("ok "), out.stdout


@pytest.mark.parametrize("minor", list(INTERPRETERS))
def test_the_check_fails_when_set_groups_does_nothing(minor: str, pems: list[str]) -> None:
    out = run_check(INTERPRETERS[minor], pems, "--sabotage", "noop")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "expected a refusal, the handshake completed" in out.stderr


@pytest.mark.parametrize("minor", list(INTERPRETERS))
def test_the_check_fails_when_the_layout_read_is_wrong(minor: str, pems: list[str]) -> None:
    """The ``SSL_CTX *`` read one pointer off: the module's guard must refuse it, not go on."""
    if _has_native(INTERPRETERS[minor]):
        pytest.skip(f"CPython {minor} has SSLContext.set_groups: no layout is read")
    out = run_check(INTERPRETERS[minor], pems, "--sabotage", "offset")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "SSLContext layout is not the one expected" in out.stderr
