"""Run the exporter as a real subprocess (``python -m exporter``) on a free loopback port."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.net import free_port, wait_http

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def run_exporter(*args: str, backend: str = "sim", env: dict[str, str] | None = None) -> Iterator[str]:
    """Start ``python -m exporter --backend sim`` plus ``args``; yield ``http://127.0.0.1:PORT``.

    Waits for ``/readyz``.  The kubelet socket is disabled unless ``args`` set it, so the sim's own
    pods are used.  On exit the process gets SIGTERM (and SIGKILL after 10 s).
    """
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "exporter",
        "--backend",
        backend,
        "--web.listen-address",
        f"127.0.0.1:{port}",
        *args,
    ]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            argv,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        base = f"http://127.0.0.1:{port}"
        try:
            try:
                wait_http(f"{base}/readyz", timeout=30)
            except TimeoutError:
                proc.kill()
                proc.wait()
                log.seek(0)
                raise RuntimeError("exporter did not become ready:\n" + log.read().decode()[-4000:]) from None
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
