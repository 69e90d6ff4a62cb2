"""The scrape of docs/serving.md, as written, on a real Prometheus: the simulated engines
(``python -m exporter.sim.engines``, its file_sd list carrying the labels Kubernetes discovery
gives) get namespace, pod and their declared role, and the serving rules read them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dashboard.serving import engines as table
from exporter.sim import engines, serving
from tests.support.engines import engines_job, run_engines
from tests.support.prometheus import RULES_FILE, run_prometheus, wait_for_query

pytestmark = pytest.mark.integration


def test_the_documented_relabelling_labels_every_engine_and_the_rules_read_them(tmp_path: Path) -> None:
    n = len(engines.targets())
    with run_engines(tmp_path) as sd:
        job = engines_job(sd)
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
