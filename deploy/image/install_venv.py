"""Create one image's virtual environment: the single recipe both image routes run.

``python3 install_venv.py VENV LOCK PROJECT...`` makes a venv at VENV from the image's own
``/usr/bin/python3`` (no pip in it), installs exactly the pinned files of LOCK
(``--require-hashes --no-deps``: nothing is resolved at build time), then gpulens itself with
``--no-deps`` (PROJECT: the ``uv pip install`` arguments that name it: a source tree, or
``--find-links DIR gpulens==VERSION``). ``scripts/image.sh`` runs it inside a buildah container and
``deploy/Dockerfile`` in its build stage, so both routes install the same packages at the same
paths. ``$UV`` names the uv binary (default ``uv``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: install_venv.py VENV LOCK PROJECT...", file=sys.stderr)
        return 2
    venv, lock, project = argv[0], argv[1], argv[2:]
    uv = os.environ.get("UV", "uv")
    python = f"{venv}/bin/python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", python, "--require-hashes", "--no-deps", "-r", lock], check=True
    )
    # --no-cache: uv would otherwise reuse a wheel of the same name and version from an older tree.
    subprocess.run([uv, "pip", "install", "-q", "--python", python, "--no-deps", "--no-cache", *project], check=True)
    Path(venv, ".lock").unlink(missing_ok=True)  # uv's lock file, world-writable
    # uv stamps a package built from a local source with the install time (uv_cache.json, for its
    # own cache): dropped, and from RECORD, so the venv depends on its inputs only.
    for stamp in Path(venv).glob("lib/python3*/site-packages/*.dist-info/uv_cache.json"):
        stamp.unlink()
        record = stamp.with_name("RECORD")
        lines = record.read_text().splitlines(keepends=True)
        record.write_text("".join(line for line in lines if not line.startswith(f"{stamp.parent.name}/uv_cache.json,")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
