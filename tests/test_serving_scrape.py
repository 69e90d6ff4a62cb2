"""The scrape of docs/serving.md, as written, on a real Prometheus: the simulated engines
(``python -m exporter.sim.engines``, its file_sd list carrying the labels Kubernetes discovery
gives) get namespace, pod and their declared role, and the serving rules read them."""

from __future__ import annotations

import re
import socket
import sys
from pathlib import Path

import pytest
import yaml

from dashboard.serving import engines as table
from exporter.sim import engines, serving
from tests.support.net import free_port
from tests.support.process import managed_process
from tests.support.prometheus import RULES_FILE, run_prometheus, wait_for_query

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]


def _documented_job() -> dict[str, object]:
    """The plain Prometheus job of docs/serving.md."""
    text = (REPO / "docs" / "serving.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "kubernetes_sd_configs" in b)
    (job,) = yaml.safe_load(block)["scrape_configs"]
    return dict(job)


def _ports(n: int) -> int:
    """The first of ``n`` consecutive free ports."""
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


def test_the_documented_relabelling_labels_every_engine_and_the_rules_read_them(tmp_path: Path) -> None:
    n = len(engines.targets())
    first = _ports(n)
    sd = tmp_path / "targets.json"
    argv = [sys.executable, "-m", "exporter.sim.engines", "--port", str(first), "--file-sd", str(sd)]
    with managed_process(argv, f"http://127.0.0.1:{first + n - 1}/metrics", log=tmp_path / "engines.log"):
        job = _documented_job()
        job.pop("kubernetes_sd_configs")
        job |= {"file_sd_configs": [{"files": [str(sd)]}], "scrape_interval": "1s"}
        config = yaml.safe_dump(
            {"global": {"evaluation_interval": "1s"}, "rule_files": ["rules.yml"], "scrape_configs": [job]}
        )
        with run_prometheus(config, rule_files={"rules.yml": RULES_FILE.read_text()}) as prom:
            up = wait_for_query(prom, "up == 1", lambda r: len(r) == n)
            got = {(r["metric"]["namespace"], r["metric"]["pod"]): r["metric"].get("role", "") for r in up}
            want = {}
            for t in engines.targets():
                declared = [t.deployment.pod_labels[k] for k in table.ROLE_POD_LABELS if k in t.deployment.pod_labels]
                want[(t.namespace, t.pod)] = declared[-1] if declared else ""
            assert got == want
            info = wait_for_query(prom, "gpulens:serving_pod_engine:info", lambda r: len(r) == n)
            roles = {r["metric"]["pod"]: r["metric"].get("role", "") for r in info}
            by_workload = {t.pod: t.deployment for t in engines.targets()}
            for pod, role in roles.items():
                d = by_workload[pod]
                # declared roles normalised (Dynamo's worker/prefill/decode, llm-d's and the user's
                # both); the aggregated vLLM declares none (inferred where gpulens' classes exist)
                assert role == ("" if d.workload == serving.AGGREGATED else d.role), (pod, role)
            tokens = wait_for_query(prom, "gpulens:serving_output_tokens:rate5m", lambda r: len(r) >= n - 1)
            engines_seen = {r["metric"]["serving_engine"] for r in tokens}
            assert engines_seen == {"vllm", "sglang", "dynamo-frontend"}
