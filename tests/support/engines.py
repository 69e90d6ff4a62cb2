"""The simulated inference engines (``python -m exporter.sim.engines``) for tests that need serving
data on a real Prometheus: consecutive free ports, the process, and the scrape job of docs/serving.md
as written (its relabelling, with a file_sd list in place of Kubernetes discovery)."""

from __future__ import annotations

import re
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from exporter.sim import engines
from tests.support.net import free_port
from tests.support.process import managed_process

REPO = Path(__file__).resolve().parents[2]


def free_ports(n: int) -> int:
    """The first of ``n`` consecutive ports on 127.0.0.1 that were free a moment ago."""
    for _ in range(50):
        first = free_port()
        try:
            for port in range(first, first + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise RuntimeError(f"no {n} consecutive free ports")


def documented_job() -> dict[str, Any]:
    """The plain Prometheus job of docs/serving.md, as written."""
    text = (REPO / "docs" / "serving.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "kubernetes_sd_configs" in b)
    (job,) = yaml.safe_load(block)["scrape_configs"]
    return dict(job)


def engines_job(sd: Path, cluster: str = "", interval: str = "1s") -> dict[str, Any]:
    """docs/serving.md's job reading the simulator's file_sd list ``sd``; ``cluster``: a ``cluster``
    label set on every engine series (as the exporters' targets carry it), none if empty."""
    job = documented_job()
    job.pop("kubernetes_sd_configs")
    job |= {"file_sd_configs": [{"files": [str(sd)]}], "scrape_interval": interval}
    if cluster:
        job["relabel_configs"] = [*job["relabel_configs"], {"target_label": "cluster", "replacement": cluster}]
    return job


@contextmanager
def run_engines(workdir: Path) -> Iterator[Path]:
    """Serve every simulated engine pod on consecutive ports; yield the file_sd list's path."""
    n = len(engines.targets())
    first = free_ports(n)
    sd = workdir / "engine-targets.json"
    argv = [sys.executable, "-m", "exporter.sim.engines", "--port", str(first), "--file-sd", str(sd)]
    with managed_process(argv, f"http://127.0.0.1:{first + n - 1}/metrics", log=workdir / "engines.log"):
        yield sd
