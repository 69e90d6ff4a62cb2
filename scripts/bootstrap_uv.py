"""Find uv, or fetch it from the package index without pip: the first step of the README's commands.

A stock Debian 12+/Ubuntu 23.04+ Python refuses ``pip install`` into the system (PEP 668,
``externally-managed-environment``), and often has no pip or venv module at all. uv ships as a wheel
whose only content that matters is one static binary, so this script, with the standard library
alone, asks the index for the pinned uv release, picks the wheel for this machine, checks its
SHA-256 against the index, and unpacks the binary into ``.tools/uv-<version>/uv`` inside the
repository. Nothing is written outside the repository, and nothing into the system Python.

Prints the path of the uv to use: ``uv`` on PATH if there is one, else the unpacked binary.
Env: ``GPULENS_UV_VERSION`` (the release to fetch), ``UV_DEFAULT_INDEX`` / ``UV_INDEX_URL`` /
``PIP_INDEX_URL`` (an index mirror: the first set wins; PEP 691 JSON or PEP 503 HTML), and the usual
``https_proxy``. Runs on any CPython 3.8+ (a stock distribution's), so it stays free of newer syntax.
"""

from __future__ import annotations

import hashlib
import html.parser
import io
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

UV_VERSION = "0.13.10"
"""The uv release fetched when none is on PATH (the one the project's commands are run with)."""
DEFAULT_INDEX = "https://pypi.org/simple"
TIMEOUT_S = 120
REPO = Path(__file__).resolve().parents[1]


class BootstrapError(Exception):
    """A step that failed, in words a person can act on."""


def platform_tags() -> list[str]:
    """The wheel platform tags this machine runs, best first (``manylinux_2_17_x86_64`` ...)."""
    system, machine = platform.system(), platform.machine().lower()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    if system == "Linux":
        libc, version = platform.libc_ver()
        if libc == "glibc" and version:
            major, minor = (int(part) for part in version.split(".")[:2])
            return [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 16, -1)] + [f"manylinux2014_{arch}"]
        return [f"musllinux_1_{m}_{arch}" for m in (2, 1)]
    if system == "Darwin":
        mac_arch = "arm64" if arch == "aarch64" else arch
        return [f"macosx_{major}_{minor}_{mac_arch}" for major in range(15, 9, -1) for minor in range(16)]
    raise BootstrapError(f"no uv wheel for {system} {machine}: install uv with your package manager")


class _Anchors(html.parser.HTMLParser):
    """The ``<a href>`` of a PEP 503 simple page, with their text (the file name)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self.links.append((data.strip(), self._href))
            self._href = None


def index_files(index: str) -> list[tuple[str, str, str]]:
    """(file name, absolute URL, sha256) of every uv file the index lists."""
    page = index.rstrip("/") + "/uv/"
    request = urllib.request.Request(page, headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as reply:
            kind = reply.headers.get("Content-Type", "")
            body = reply.read()
    except OSError as exc:
        raise BootstrapError(f"cannot read {page}: {exc} (set UV_DEFAULT_INDEX to a mirror, or install uv)") from exc
    files: list[tuple[str, str, str]] = []
    if "json" in kind:
        for entry in json.loads(body)["files"]:
            digest = entry.get("hashes", {}).get("sha256", "")
            files.append((entry["filename"], urllib.parse.urljoin(page, entry["url"]), digest))
        return files
    anchors = _Anchors()
    anchors.feed(body.decode("utf-8", "replace"))
    for name, href in anchors.links:
        url, _, fragment = urllib.parse.urljoin(page, href).partition("#")
        digest = fragment[len("sha256=") :] if fragment.startswith("sha256=") else ""
        files.append((name, url, digest))
    return files


def pick_wheel(files: list[tuple[str, str, str]], version: str, tags: list[str]) -> tuple[str, str, str]:
    """The wheel of ``version`` whose platform tags include the best of ``tags``."""
    pattern = re.compile(rf"^uv-{re.escape(version)}-py3-none-(?P<plat>[^-]+)\.whl$")
    offered: dict[str, tuple[str, str, str]] = {}
    for entry in files:
        match = pattern.match(entry[0])
        if match:
            for tag in match.group("plat").split("."):
                offered.setdefault(tag, entry)
    for tag in tags:
        if tag in offered:
            return offered[tag]
    raise BootstrapError(f"the index has no uv {version} wheel for {tags[0]}: install uv with your package manager")


def fetch(version: str, dest: Path) -> Path:
    """Download, check and unpack uv ``version`` into ``dest``; the binary's path."""
    index = os.environ.get("UV_DEFAULT_INDEX") or os.environ.get("UV_INDEX_URL") or os.environ.get("PIP_INDEX_URL")
    name, url, digest = pick_wheel(index_files(index or DEFAULT_INDEX), version, platform_tags())
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise BootstrapError(f"the index gave no SHA-256 for {name}: refusing an unchecked binary")
    print(f"fetching {name}", file=sys.stderr)
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as reply:
            data = reply.read()
    except OSError as exc:
        raise BootstrapError(f"cannot download {url}: {exc}") from exc
    if hashlib.sha256(data).hexdigest() != digest:
        raise BootstrapError(f"{name}: SHA-256 differs from the index's: refusing it")
    with zipfile.ZipFile(io.BytesIO(data)) as wheel:
        members = [m for m in wheel.namelist() if re.fullmatch(r"uv-[^/]+\.data/scripts/uv(\.exe)?", m)]
        if not members:
            raise BootstrapError(f"{name} holds no uv binary")
        binary = wheel.read(members[0])
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / "uv"
    part = dest / "uv.part"
    part.write_bytes(binary)
    part.chmod(part.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    part.replace(target)
    return target


def works(uv: Path) -> bool:
    """True when ``uv --version`` runs (a broken shim or a binary for another machine does not)."""
    try:
        return subprocess.run([str(uv), "--version"], capture_output=True, timeout=30).returncode == 0
    except OSError:
        return False


def main() -> int:
    on_path = shutil.which("uv")
    if on_path and works(Path(on_path)):
        print(on_path)
        return 0
    version = os.environ.get("GPULENS_UV_VERSION", UV_VERSION)
    dest = REPO / ".tools" / f"uv-{version}"
    uv = dest / "uv"
    try:
        if not works(uv):
            uv = fetch(version, dest)
        if not works(uv):
            raise BootstrapError(f"{uv} does not run on this machine")
    except BootstrapError as exc:
        print(f"scripts/bootstrap_uv.py: {exc}", file=sys.stderr)
        return 1
    print(uv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
