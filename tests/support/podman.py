"""podman for the tests: its own storage under a temporary folder and the repository's
containers.conf (deploy/image/), so no test reads or writes the machine's container settings."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGE_CONF = REPO / "deploy" / "image"


def container_env() -> dict[str, str]:
    """buildah and podman read their settings from deploy/image/ only."""
    return {
        **os.environ,
        "CONTAINERS_CONF": str(IMAGE_CONF / "containers.conf"),
        "CONTAINERS_REGISTRIES_CONF": str(IMAGE_CONF / "registries.conf"),
    }


class Podman:
    """podman with its own storage under ``root``; a call asserts success unless ``check=False``.
    Its run folder is a short one of its own under /tmp: podman refuses a runroot path longer than
    50 characters, which a pytest-xdist worker's temporary folders are."""

    def __init__(self, root: Path) -> None:
        assert shutil.which("podman"), "podman missing: run the README test command (scripts/test.sh)"
        run = tempfile.mkdtemp(prefix="podman-", dir="/tmp")
        self.base = ["podman", "--root", str(root / "root"), "--runroot", run, "--storage-driver", "vfs"]

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([*self.base, *args], env=container_env(), capture_output=True, text=True, timeout=timeout)
        if check:
            assert proc.returncode == 0, f"podman {' '.join(args)}: {proc.stdout}{proc.stderr}"
        return proc
