"""The benches' full attribution chain looks like a cluster to the exporter: every pod's owner
walk ends ``resolved`` at its top controller (bench/exporter_rss.py, ``owner_objects``).

Before, the API emulator of the chain held no controllers: every walk read 404 and was walked
again each minute, a cost no cluster imposes, and the footprint figures carried it."""

from __future__ import annotations

from pathlib import Path

from bench.exporter_rss import full_chain, shared_gpu_plan
from exporter.attribution.kube_http import KubeClient, endpoint_for
from exporter.attribution.owners import OwnerResolver


def test_every_pod_of_the_chain_resolves_to_its_top_controller(tmp_path: Path) -> None:
    plan = shared_gpu_plan(110, ["GPU-00000000-0000-0000-0000-000000000000"], [4242])
    with full_chain(plan, tmp_path) as chain:
        client = KubeClient(endpoint_for(chain.api.url))
        resolver = OwnerResolver(requests_per_second=1e6, request_burst=1_000_000, time_share=1.0, time_burst=1e6)
        tops: dict[str, set[str]] = {}
        for pod in chain.objects:
            meta = pod["metadata"]
            refs = meta.get("ownerReferences") or []
            if not refs:
                continue
            owner = resolver.top(client, meta["namespace"], refs[0])
            assert owner.outcome == "resolved", (meta["name"], owner)
            tops.setdefault(owner.kind, set()).add(owner.name)
    assert set(tops) >= {"Deployment", "StatefulSet", "DaemonSet", "CronJob"}, tops
    assert "ReplicaSet" not in tops, "a Deployment's pods are named after the Deployment"
    assert "train" in tops["StatefulSet"] and "llm-decode" in tops["Deployment"]
