"""Series the exporter serves, per GPU, per MIG instance, per pod and per node, for every simulated
scenario: the figures docs/capacity.md builds on.

    .venv/bin/python -m bench.series_count                 # markdown table, every scenario
    .venv/bin/python -m bench.series_count --compat-dcgm   # with the dcgm-exporter series too

Each scenario runs as ``python -m exporter --backend sim --sim.scenario X`` on a loopback port; after
``--settle`` seconds (GPM windows, the first probe results) its /metrics is parsed with
prometheus_client's parser and every sample line counted as one series. A series belongs to a pod
if it has a ``pod`` label; else to a MIG instance if it has a non-empty ``mig_uuid``; else to a GPU
if it has a ``uuid``; else to the node (exporter health, build info, stage success). Per-unit
figures divide by the scenario's GPUs (``gpulens_gpu_info``), MIG instances
(``gpulens_mig_instance_info``) and pods (distinct namespace/pod on ``gpulens_pod_gpu_allocation``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass

from prometheus_client.parser import text_string_to_metric_families

from exporter.sim import SCENARIOS
from tests.support.exporter import run_exporter


@dataclass(frozen=True)
class Count:
    """Series of one simulated node, by what they belong to."""

    scenario: str
    gpus: int
    mig_instances: int
    pods: int
    per_gpu: int
    per_mig: int
    per_pod: int
    per_node: int

    @property
    def total(self) -> int:
        return self.per_gpu + self.per_mig + self.per_pod + self.per_node


def count(exposition: str, scenario: str) -> Count:
    """Classify every sample of ``exposition`` (Prometheus text format)."""
    kinds: Counter[str] = Counter()
    gpus: set[str] = set()
    migs: set[str] = set()
    pods: set[tuple[str, str]] = set()
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            labels = s.labels
            if s.name == "gpulens_gpu_info":
                gpus.add(labels["uuid"])
            elif s.name == "gpulens_mig_instance_info":
                migs.add(labels["mig_uuid"])
            elif s.name == "gpulens_pod_gpu_allocation":
                pods.add((labels.get("namespace", ""), labels["pod"]))
            if "pod" in labels:
                kinds["pod"] += 1
            elif labels.get("mig_uuid"):
                kinds["mig"] += 1
            elif "uuid" in labels:
                kinds["gpu"] += 1
            else:
                kinds["node"] += 1
    return Count(scenario, len(gpus), len(migs), len(pods), kinds["gpu"], kinds["mig"], kinds["pod"], kinds["node"])


def measure(scenario: str, settle_s: float, compat_dcgm: bool) -> Count:
    args = ["--sim.scenario", scenario, *(["--compat.dcgm"] if compat_dcgm else [])]
    with run_exporter(*args) as url:
        time.sleep(settle_s)
        text = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
    return count(text, scenario)


def _per(n: int, d: int) -> str:
    return f"{n / d:.1f}" if d else "–"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="series per GPU, MIG instance, pod and node, per simulated scenario")
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), help="default: every scenario")
    p.add_argument("--settle", type=float, default=8.0, help="seconds to let the exporter run before scraping")
    p.add_argument("--compat-dcgm", action="store_true", help="also serve the dcgm-exporter series")
    p.add_argument("--json", action="store_true", help="JSON instead of a markdown table")
    a = p.parse_args(argv)
    counts = [measure(sc, a.settle, a.compat_dcgm) for sc in (a.scenario or sorted(SCENARIOS))]
    if a.json:
        print(json.dumps([{**asdict(c), "total": c.total} for c in counts], indent=2))
        return 0
    print("| scenario | GPUs | MIG instances | pods | series per node | GPU series per GPU | series per MIG instance "
          "| series per pod | node-level series | series per GPU, all in |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in counts:
        print(f"| {c.scenario} | {c.gpus} | {c.mig_instances} | {c.pods} | {c.total} | {_per(c.per_gpu, c.gpus)} "
              f"| {_per(c.per_mig, c.mig_instances)} | {_per(c.per_pod, c.pods)} | {c.per_node} "
              f"| {_per(c.total, c.gpus)} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
