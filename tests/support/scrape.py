"""Reading a running exporter in end-to-end tests: its scrape as samples by family, its stages,
waiting for a condition, and the environment that points it at the API emulator."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.kube_api_server import KubeApiEmulator
from tests.support.net import get

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(base: str) -> Samples:
    status, body = get(base + "/metrics")
    assert status == 200
    out: Samples = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def stage(samples: Samples, name: str) -> float | None:
    for labels, value in samples.get("gpulens_stage_success", []):
        if labels["stage"] == name:
            return value
    return None


def eventually(base: str, predicate: Callable[[Samples], bool], timeout: float = 20.0) -> Samples:
    deadline = time.monotonic() + timeout
    samples = scrape(base)
    while not predicate(samples):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.2)
        samples = scrape(base)
    return samples


def gpu_uuids(samples: Samples) -> list[str]:
    return sorted(lab["uuid"] for lab, _ in samples["gpulens_gpu_info"])


NO_API_ENV = {"NODE_NAME": "", "GPULENS_KUBERNETES_NODE_NAME": "", "KUBERNETES_SERVICE_HOST": ""}


def api_env(api: KubeApiEmulator, tmp_path: Path) -> dict[str, str]:
    """The exporter's environment with a kubeconfig naming the emulator (and no in-cluster API)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: e, cluster: {{server: '{api.url}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: e, user: u}}]\n"
        "current-context: c\n"
    )
    return {**NO_API_ENV, "KUBECONFIG": str(kubeconfig)}
