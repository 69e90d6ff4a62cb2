"""Run the exporter as a real subprocess (``python -m exporter``) on a free loopback port."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.net import free_port
from tests.support.process import managed_process


@contextmanager
def run_exporter(*args: str, backend: str = "sim", env: dict[str, str] | None = None) -> Iterator[str]:
    """Start ``python -m exporter --backend sim`` plus ``args``; yield ``http://127.0.0.1:PORT``.

    Waits for ``/readyz``.  With the simulator and no kubelet socket on this machine, the sim's
    own pods are used.  On exit the process gets SIGTERM (and SIGKILL after 10 s).
    """
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "exporter", "--backend", backend, "--web.listen-address", f"127.0.0.1:{port}", *args]
    with managed_process(argv, f"{base}/readyz", timeout=30, env=env):
        yield base
