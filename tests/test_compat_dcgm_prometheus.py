"""A real Prometheus scrapes real exporters run with ``--compat.dcgm`` (simulated h200x8, mig and
timeslice nodes) with the shipped recording rules loaded, and answers:

- the queries of NVIDIA's DCGM Grafana dashboard (id 12239) with dcgm-exporter's labels and units;
- per-pod GPU utilisation and memory as cost-allocation tools ask for them;
- ``avg by (namespace, pod)`` GPU utilisation as an autoscaler asks for it;
- on a time-sliced node: one line per GPU, ``sum()`` equal to the devices' totals, and each pod's
  share (``*_POD``) and its GPU's value (a join on ``UUID``) as the docs give the queries.

gpulens's own Grafana dashboards are evaluated on one Prometheus by tests/test_grafana_dashboard.py.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from exporter.cli import build
from exporter.config import parse_config
from exporter.model import Snapshot
from tests.support.exporter import run_exporter
from tests.support.prometheus import query, run_prometheus, wait_for_query

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "deploy" / "rules" / "gpulens.rules.yml"
SCENARIOS = ("h200x8", "mig", "timeslice")
FAULTS = {"h200x8": ("--sim.faults", "nvlink_down=1:7")}
"""NVLink 7 of the h200x8 node's GPU 1 is down (the fault the dcgm-compat link fields report)."""
MIB = 1 << 20


@dataclass(frozen=True)
class Node:
    scenario: str
    instance: str
    node: str
    snapshot: Snapshot
    """What the same simulated node looks like in-process: the expected identities and pods."""


@dataclass(frozen=True)
class Cluster:
    prom: str
    nodes: dict[str, Node]


def _expected(scenario: str) -> Snapshot:
    sampler, _, _ = build(parse_config(["--backend", "sim", "--sim.scenario", scenario, "--no-probes"], env={}))
    sampler.run_once()
    return sampler.run_once()


def _config(nodes: list[Node]) -> str:
    targets = "".join(
        f"      - targets: ['{n.instance}']\n        labels: {{cluster: test, node: {n.node}}}\n" for n in nodes
    )
    return (
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "rule_files: [gpulens.rules.yml]\n"
        "scrape_configs:\n  - job_name: gpulens\n    honor_labels: true\n    static_configs:\n" + targets
    )


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with ExitStack() as stack:
        nodes = []
        for scenario in SCENARIOS:
            name = f"gpu-node-{scenario}"
            base = stack.enter_context(
                run_exporter(
                    "--sim.scenario", scenario, "--compat.dcgm", *FAULTS.get(scenario, ()), env={"NODE_NAME": name}
                )
            )
            nodes.append(Node(scenario, base.removeprefix("http://"), name, _expected(scenario)))
        prom = stack.enter_context(run_prometheus(_config(nodes), rule_files={"gpulens.rules.yml": RULES.read_text()}))
        wait_for_query(prom, 'count(up{job="gpulens"} == 1)', lambda r: r and float(r[0]["value"][1]) == len(nodes))
        wait_for_query(prom, "count(DCGM_FI_DEV_GPU_TEMP)", lambda r: r and float(r[0]["value"][1]) == 24)
        time.sleep(2.5)  # the tests query 2 s in the past, where one scrape holds every series
        yield Cluster(prom, {n.scenario: n for n in nodes})


def _api(base: str, path: str, **params: str) -> Any:
    url = f"{base}{path}?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            doc = json.load(resp)
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{params}: {exc.read().decode()}") from None
    assert doc["status"] == "success", doc
    return doc["data"]


def q(base: str, promql: str, at: float | None = None) -> list[dict[str, Any]]:
    """Instant query at ``at`` (default: 2 s ago, so every series of one scrape is in)."""
    return query(base, promql, at=at or time.time() - 2)


def _values(result: list[dict[str, Any]], *keys: str) -> dict[tuple[str, ...], float]:
    return {tuple(r["metric"].get(k, "") for k in keys): float(r["value"][1]) for r in result}


# --- NVIDIA's DCGM dashboard (12239): its panel queries, $instance set to one node, $gpu to All ----


DCGM_DASHBOARD = {
    # panel: (its query, the native series it must equal, the scale between them)
    "GPU Temperature": (
        'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}',
        "gpulens_gpu_temperature_celsius",
        1,
    ),
    "GPU Power Usage": ('DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}', "gpulens_gpu_power_watts", 1),
    "GPU SM Clocks": (
        'DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000',
        "gpulens_gpu_sm_clock_hertz",
        1,
    ),
    "GPU Utilization": (
        'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}',
        "gpulens_gpu_utilization_ratio",
        100,
    ),
}


def _dcgm(expr: str, node: Node) -> str:
    return expr.replace("$instance", node.instance).replace("$gpu", ".*")


@pytest.mark.parametrize("scenario", ["h200x8", "mig", "timeslice"])
def test_dcgm_dashboard_device_panels_show_every_gpu_in_dcgm_units(cluster: Cluster, scenario: str) -> None:
    node = cluster.nodes[scenario]
    gpus = {str(g.index): g for g in node.snapshot.backend.gpus}
    whole = {i for i, g in gpus.items() if g.mig_mode != "enabled"}
    at = time.time() - 2
    for panel, (expr, native, scale) in DCGM_DASHBOARD.items():
        got = q(cluster.prom, _dcgm(expr, node), at)
        expected = whole if panel == "GPU Utilization" else set(gpus)  # NVML has no GPU-Util under MIG
        assert sorted(r["metric"]["gpu"] for r in got) == sorted(expected), f"{panel}: one line per GPU"
        truth = _values(q(cluster.prom, f'{native}{{instance="{node.instance}"}}', at), "gpu")
        for r in got:
            m = r["metric"]
            g = gpus[m["gpu"]]
            assert m["UUID"] == g.uuid and m["device"] == f"nvidia{g.index}", panel
            assert m["modelName"] == "NVIDIA H200" and m["pci_bus_id"] == g.pci_bus_id, panel
            assert m["Hostname"] == node.node and m["DCGM_FI_DRIVER_VERSION"] == "580.159.04", panel
            assert float(r["value"][1]) == pytest.approx(truth[(m["gpu"],)] * scale, rel=1e-9), panel
    # the stat panels aggregate the same series
    assert q(cluster.prom, _dcgm('avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})', node))
    assert q(cluster.prom, _dcgm('sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})', node))
    # and the dashboard's variables list the node and its GPUs
    labels = _api(
        cluster.prom, "/api/v1/label/gpu/values", **{"match[]": f'DCGM_FI_DEV_GPU_TEMP{{instance="{node.instance}"}}'}
    )
    assert set(labels) == set(gpus)


@pytest.mark.parametrize("scenario", ["h200x8", "mig", "timeslice"])
def test_dcgm_dashboard_framebuffer_and_tensor_panels_cover_every_leaf(cluster: Cluster, scenario: str) -> None:
    node = cluster.nodes[scenario]
    leaves = {
        (str(g.index), str(leaf.mig.gpu_instance_id) if leaf.mig else ""): (g, leaf)
        for g in node.snapshot.backend.gpus
        for leaf in g.leaves
    }
    at = time.time() - 2
    # native leaf series, keyed like the DCGM ones (GPU_I_ID = gpu_instance_id)
    relabel = 'label_replace({}{{instance="' + node.instance + '"}}, "GPU_I_ID", "$1", "gpu_instance_id", "(.*)")'
    fb = q(cluster.prom, _dcgm('DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}', node), at)
    used = _values(q(cluster.prom, relabel.format("gpulens_gpu_memory_used_bytes"), at), "gpu", "GPU_I_ID")
    assert sorted((r["metric"]["gpu"], r["metric"].get("GPU_I_ID", "")) for r in fb) == sorted(leaves)
    for r in fb:
        key = (r["metric"]["gpu"], r["metric"].get("GPU_I_ID", ""))
        _, leaf = leaves[key]
        assert float(r["value"][1]) == pytest.approx(used[key] / MIB), "FB_USED is in MiB"
        if leaf.mig is not None:
            assert r["metric"]["GPU_I_PROFILE"] == leaf.mig.profile
    tensor = q(cluster.prom, _dcgm('DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}', node), at)
    native = _values(q(cluster.prom, relabel.format("gpulens_gpu_tensor_active_ratio"), at), "gpu", "GPU_I_ID")
    got = _values(tensor, "gpu", "GPU_I_ID")
    assert set(got) == set(leaves)
    assert got == pytest.approx(native), "tensor activity stays a 0..1 ratio"
    if scenario == "mig":
        assert any(k[1] for k in got), "MIG instances appear with GPU_I_ID"


# --- cost allocation and autoscaling ---------------------------------------------------------------


def _holders(node: Node, whole_only: bool) -> set[tuple[str, str, str]]:
    attr = node.snapshot.attribution
    assert attr is not None
    return {(a.pod.namespace, a.pod.pod, a.pod.container) for a in attr.allocations if not (whole_only and a.mig_uuid)}


@pytest.mark.parametrize("scenario", ["h200x8", "mig"])
def test_per_pod_gpu_util_and_memory_for_cost_allocation(cluster: Cluster, scenario: str) -> None:
    node = cluster.nodes[scenario]
    inst = f'instance="{node.instance}"'
    # how OpenCost-style tools ask: per container, averaged over the window
    util = q(
        cluster.prom,
        f'avg(avg_over_time(DCGM_FI_DEV_GPU_UTIL{{container!="", {inst}}}[1m])) by (container, pod, namespace)',
    )
    mem = q(
        cluster.prom,
        f'sum(avg_over_time(DCGM_FI_DEV_FB_USED{{container!="", {inst}}}[1m])) by (container, pod, namespace)',
    )
    keys = ("namespace", "pod", "container")
    assert set(_values(util, *keys)) == _holders(node, whole_only=True)  # MIG has no GPU-Util
    assert set(_values(mem, *keys)) == _holders(node, whole_only=False)
    assert all(0 <= v <= 100 for v in _values(util, *keys).values())
    at = time.time() - 2
    dcgm_mem = _values(
        q(cluster.prom, f'sum by (namespace, pod, container) (DCGM_FI_DEV_FB_USED{{container!="", {inst}}})', at), *keys
    )
    native_mem = _values(
        q(cluster.prom, f"sum by (namespace, pod, container) (gpulens_pod_gpu_memory_used_bytes{{{inst}}})", at), *keys
    )
    assert dcgm_mem == pytest.approx({k: v / MIB for k, v in native_mem.items()})


@pytest.mark.parametrize("scenario", ["h200x8", "mig"])
def test_autoscaler_average_gpu_util_per_pod(cluster: Cluster, scenario: str) -> None:
    node = cluster.nodes[scenario]
    at = time.time() - 2
    got = _values(
        q(cluster.prom, f'avg by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{{instance="{node.instance}", pod!=""}})', at),
        "namespace",
        "pod",
    )
    util = _values(q(cluster.prom, f'gpulens_gpu_utilization_ratio{{instance="{node.instance}"}}', at), "uuid")
    attr = node.snapshot.attribution
    assert attr is not None
    per_pod: dict[tuple[str, str], list[float]] = {}
    for a in attr.allocations:
        if not a.mig_uuid:
            per_pod.setdefault((a.pod.namespace, a.pod.pod), []).append(util[(a.uuid,)] * 100)
    assert got == pytest.approx({k: sum(v) / len(v) for k, v in per_pod.items()})
    if scenario == "h200x8":
        assert len(per_pod[("ml-training", "llama3-8b-finetune-fkn48")]) == 2, "a two-GPU pod averages both"


def test_time_sliced_node_sums_to_its_devices_and_keeps_pod_shares_under_their_own_names(cluster: Cluster) -> None:
    node = cluster.nodes["timeslice"]
    inst = f'instance="{node.instance}"'
    at = time.time() - 2
    attr = node.snapshot.attribution
    assert attr is not None
    shared = set(attr.sharing_pods)
    assert len(shared) == 4
    # sum() over the device series is the devices' used memory, in MiB: no pod share is added in
    total = q(cluster.prom, f"sum(DCGM_FI_DEV_FB_USED{{{inst}}})", at)
    native = q(cluster.prom, f"sum(gpulens_gpu_memory_used_bytes{{{inst}}}) / 2^20", at)
    assert float(total[0]["value"][1]) == float(native[0]["value"][1]) == 562544
    for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE"):
        lines = q(cluster.prom, f"count by (Hostname, UUID, gpu) ({name}{{{inst}}}) > 1", at)
        assert lines == [], f"{name}: more than one series for a device"
    for uuid in shared:
        device = q(cluster.prom, f'DCGM_FI_DEV_FB_USED{{{inst}, UUID="{uuid}"}}', at)
        pods = q(cluster.prom, f'DCGM_FI_DEV_FB_USED_POD{{{inst}, UUID="{uuid}"}}', at)
        assert len(device) == 1 and "pod" not in device[0]["metric"] and len(pods) >= 2
        # pods' processes account for the device's memory (the simulator has no other process)
        assert sum(float(r["value"][1]) for r in pods) == pytest.approx(float(device[0]["value"][1]))


def test_time_sliced_node_answers_per_pod_cost_and_autoscaler_queries(cluster: Cluster) -> None:
    """The queries docs/dcgm-compat.md gives: a pod's own share on any GPU (the ``*_POD`` family on
    shared GPUs, the pod-labelled device series on its own GPUs), and its GPU's value by a join."""
    node = cluster.nodes["timeslice"]
    inst = f'instance="{node.instance}"'
    at = time.time() - 2
    keys = ("namespace", "pod", "container")
    mem = q(
        cluster.prom,
        f"sum by (namespace, pod, container) "
        f'(DCGM_FI_DEV_FB_USED_POD{{{inst}}} or DCGM_FI_DEV_FB_USED{{{inst}, container!=""}})',
        at,
    )
    native_mem = q(
        cluster.prom, f"sum by (namespace, pod, container) (gpulens_pod_gpu_memory_used_bytes{{{inst}}})", at
    )
    assert _values(mem, *keys) == pytest.approx({k: v / MIB for k, v in _values(native_mem, *keys).items()})
    assert set(_values(mem, *keys)) == _holders(node, whole_only=False)
    util = q(
        cluster.prom,
        f"avg by (namespace, pod, container) "
        f'(DCGM_FI_DEV_GPU_UTIL_POD{{{inst}}} or DCGM_FI_DEV_GPU_UTIL{{{inst}, container!=""}})',
        at,
    )
    assert set(_values(util, *keys)) == _holders(node, whole_only=True)
    # the GPU's own utilisation for each pod: the device series joined to the pod's series on UUID
    gpu_util = _values(q(cluster.prom, f"gpulens_gpu_utilization_ratio{{{inst}}} * 100", at), "uuid")
    attr = node.snapshot.attribution
    assert attr is not None
    for a in attr.allocations:
        pod = f'{inst}, namespace="{a.pod.namespace}", pod="{a.pod.pod}"'
        by_allocation = (
            f"DCGM_FI_DEV_GPU_UTIL{{{inst}}} and on (UUID) "
            f'label_replace(gpulens_pod_gpu_allocation{{{pod}}}, "UUID", "$1", "uuid", "(.*)")'
        )
        by_compat = (
            f"DCGM_FI_DEV_GPU_UTIL{{{inst}}} and on (Hostname, UUID) "
            f"(DCGM_FI_DEV_FB_USED_POD{{{pod}}} or DCGM_FI_DEV_FB_USED{{{pod}}})"
        )
        for expr in (by_allocation, by_compat):
            got = q(cluster.prom, expr, at)
            assert [r["metric"]["UUID"] for r in got] == [a.uuid], (a.pod, expr)
            assert "pod" not in got[0]["metric"] or a.replica is None, "a shared GPU's series has no pod"
            assert float(got[0]["value"][1]) == pytest.approx(gpu_util[(a.uuid,)]), (a.pod, expr)


# --- the gpulens Grafana dashboard -------------------------------------------------------------
