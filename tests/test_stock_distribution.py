"""The README's first command on stock distributions: a fresh Debian root filesystem (mmdebstrap:
bookworm with Python 3.11, trixie with Python 3.13) holding only Debian's python3, its pip and the CA
certificates, run under podman as an ordinary user, runs ``bash scripts/demo.sh`` from a copy of this
tree; the exporter's ``/readyz`` and the dashboard answer, and nothing outside the copy and the user's
home was written.

The rootfs is what a person's machine has: the system Python refuses ``pip install`` (PEP 668,
checked first, so the test cannot pass on a rootfs where the old ``python3 -m pip install uv`` would
have worked), there is no uv and no venv module. The packages come from the index and Debian's
mirror, so this needs the network the README's command needs. The root filesystem is cached under
build/stock/ by its inputs and the mirror's current index; uv's download cache is kept there too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.net import free_port, get
from tests.support.podman import Podman

REPO = Path(__file__).resolve().parents[1]
MIRROR = os.environ.get("GPULENS_DEBIAN_MIRROR", "http://deb.debian.org/debian")
CACHE = REPO / "build" / "stock"
SUITES = ("bookworm", "trixie")
PACKAGES = ("python3", "python3-pip", "ca-certificates")
USER_ID = 1000
READY_WITHIN_S = 540.0
"""The whole first run: uv fetched, the venv built and filled from the index, both servers up."""

pytestmark = [pytest.mark.integration, pytest.mark.long, pytest.mark.timeout(900)]


def _mmdebstrap_args(suite: str) -> list[str]:
    """A minimal Debian with apt, Python and certificates, and one ordinary user, ``demo``."""
    user = (
        f'echo "demo:x:{USER_ID}:{USER_ID}::/home/demo:/bin/bash" >>"$1/etc/passwd"; '
        f'echo "demo:x:{USER_ID}:" >>"$1/etc/group"; '
        f'mkdir -p "$1/home/demo"; chown {USER_ID}:{USER_ID} "$1/home/demo"'
    )
    return ["--variant=apt", f"--include={','.join(PACKAGES)}", "--mode=root", "--format=tar",
            f"--customize-hook={user}", suite]  # fmt: skip


def rootfs(suite: str) -> Path:
    """The root filesystem tar of ``suite``, built with mmdebstrap or taken from the cache when its
    recipe and the mirror's index (InRelease) are unchanged."""
    assert shutil.which("mmdebstrap"), "mmdebstrap missing: run the README test command (scripts/test.sh)"
    with urllib.request.urlopen(f"{MIRROR}/dists/{suite}/InRelease", timeout=60) as reply:
        release = reply.read()
    key = hashlib.sha256("\n".join(_mmdebstrap_args(suite)).encode() + release).hexdigest()[:16]
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"{suite}-{key}.tar"
    if not path.exists():
        for old in CACHE.glob(f"{suite}-*.tar"):
            old.unlink()
        part = path.with_suffix(".part")
        proc = subprocess.run(["mmdebstrap", "-q", *_mmdebstrap_args(suite), str(part), MIRROR],
                              capture_output=True, text=True, timeout=900)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-4000:]
        part.rename(path)
    return path


def tree_copy(dest: Path) -> Path:
    """The tracked and untracked-but-not-ignored files of this tree (what a clone holds), owned by
    the container's user."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, check=True).stdout.split(b"\0")  # fmt: skip
    dest.mkdir()
    with tarfile.open(dest / "src.tar", "w") as tar:
        for name in filter(None, files):
            path = REPO / name.decode()
            if path.exists():
                tar.add(path, arcname=name.decode(), recursive=False)
    with tarfile.open(dest / "src.tar") as tar:
        tar.extractall(dest / "src", filter="tar")
    (dest / "src.tar").unlink()
    for path in [dest, *(dest / "src").rglob("*")]:
        os.chown(path, USER_ID, USER_ID, follow_symlinks=False)
    os.chown(dest / "src", USER_ID, USER_ID)
    return dest / "src"


def _answers(url: str) -> bool:
    try:
        return get(url, timeout=2)[0] == 200
    except OSError:
        return False


@pytest.mark.parametrize("suite", SUITES)
def test_the_demo_runs_on_a_stock_debian(suite: str, tmp_path: Path) -> None:
    podman = Podman(tmp_path / "podman")
    image = f"localhost/gpulens-stock-{suite}"
    podman("import", "-q", str(rootfs(suite)), image, timeout=300)
    src = tree_copy(tmp_path / "work")
    uv_cache = CACHE / "uv-cache"
    uv_cache.mkdir(parents=True, exist_ok=True)
    os.chown(uv_cache, USER_ID, USER_ID)
    run = ["--network=host", f"--user={USER_ID}:{USER_ID}", "--env=HOME=/home/demo", "--workdir=/src",
           f"--volume={src}:/src", f"--volume={uv_cache}:/home/demo/.cache/uv"]  # fmt: skip
    if os.environ.get("SSL_CERT_FILE"):
        # This machine's trust store (a proxy's CA, say), as a person's machine on its network holds it.
        run += [
            f"--volume={os.environ['SSL_CERT_FILE']}:/etc/ssl/host-ca.crt:ro",
            "--env=SSL_CERT_FILE=/etc/ssl/host-ca.crt",
        ]

    exporter, dashboard = free_port(), free_port()
    demo = [f"--env=GPULENS_EXPORTER_PORT={exporter}", f"--env=GPULENS_DASHBOARD_PORT={dashboard}"]
    # In the same container (one copy of the rootfs under vfs storage), before the demo: the system
    # Python refuses installs (PEP 668), as Debian 12+ and Ubuntu 23.04+ do, and there is no uv.
    before = (
        "python3 -m pip install --dry-run uv >/tmp/pip.txt 2>&1; echo $? >/tmp/pip.rc; "
        "command -v uv >/tmp/uv.txt; exec bash scripts/demo.sh"
    )
    podman("run", "-d", "--name=demo", *run, *demo, image, "bash", "-c", before)
    try:
        deadline = time.monotonic() + READY_WITHIN_S
        ready = {"exporter": False, "dashboard": False}
        while time.monotonic() < deadline and not all(ready.values()):
            state = podman("inspect", "-f", "{{.State.Status}}", "demo").stdout.strip()
            assert state == "running", podman("logs", "demo").stdout[-4000:] + podman("logs", "demo").stderr[-4000:]
            ready["exporter"] = ready["exporter"] or _answers(f"http://127.0.0.1:{exporter}/readyz")
            ready["dashboard"] = ready["dashboard"] or _answers(f"http://127.0.0.1:{dashboard}/_stcore/health")
            time.sleep(2)
        logs = podman("logs", "demo")
        assert all(ready.values()), f"{ready}: {logs.stdout[-4000:]}{logs.stderr[-4000:]}"
        refused = podman("exec", "demo", "cat", "/tmp/pip.rc", "/tmp/pip.txt").stdout
        assert not refused.startswith("0\n") and "externally-managed-environment" in refused, refused
        assert podman("exec", "demo", "cat", "/tmp/uv.txt").stdout == "", "uv was there before the demo"
        status, body = get(f"http://127.0.0.1:{exporter}/metrics")
        assert status == 200 and "gpulens_gpu_info{" in body
        # Written: the copy (its .venv and .tools), the user's home (uv's cache) and /tmp, nothing
        # else (a folder above one of those reads as changed, and so does a mount point).
        allowed = ("/src", "/home/demo", "/tmp", "/etc/ssl/host-ca.crt")
        changed = [line.split(None, 1)[1] for line in podman("diff", "demo").stdout.splitlines()]
        outside = [
            p for p in changed if not any(p == a or p.startswith(a + "/") or a.startswith(p + "/") for a in allowed)
        ]
        assert outside == [], outside
    finally:
        podman("rm", "-f", "demo", check=False)
        podman("rmi", "-f", image, check=False)
