"""Every series the exporter exports carries ``node``: this node's name (``--kubernetes.node-name`` /
``NODE_NAME``), else a simulated node's scenario, else the host name; a name alone starts no API
watch.  Read through the public seam: the page ``exporter.cli.build`` serves."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

import exporter.cli as cli
from exporter.attribution.pipeline import AttributionOptions, build_attributor
from exporter.config import parse_config
from exporter.label_values import label_value
from exporter.model import BackendSample
from exporter.node_label import node_label_value
from tests.fakes_backend import ScriptedBackend, gpu

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def _pages(argv: Sequence[str], env: dict[str, str]) -> Iterator[tuple[str, bool]]:
    """The page of a built exporter after two cycles, in the text format and in OpenMetrics."""
    sampler, exposition, _ = cli.build(parse_config(["--no-probes", *argv], env=env))
    try:
        sampler.run_once()
        sampler.run_once()
        yield exposition.render("text/plain")[0].decode(), False
        yield exposition.render(OPENMETRICS)[0].decode(), True
    finally:
        sampler.stop()


def _nodes(page: str, openmetrics: bool) -> dict[str, set[str]]:
    """Family -> the ``node`` values of its samples (``""`` for a sample without one)."""
    parse = openmetrics_families if openmetrics else text_string_to_metric_families
    out: dict[str, set[str]] = {}
    for family in parse(page):
        for sample in family.samples:
            out.setdefault(sample.name, set()).add(sample.labels.get("node", ""))
    return out


def test_every_series_carries_the_node_name_given_dcgm_series_and_the_age_line_included() -> None:
    argv = ["--backend", "sim", "--sim.scenario", "mig", "--compat.dcgm"]
    for page, openmetrics in _pages(argv, {"NODE_NAME": "gpu-node-7"}):
        nodes = _nodes(page, openmetrics)
        assert len(nodes) > 100 and "gpulens_snapshot_age_seconds" in nodes and "DCGM_FI_DEV_GPU_UTIL" in nodes
        wrong = {name: values for name, values in nodes.items() if values != {"gpu-node-7"}}
        assert not wrong, f"series without node, or with another: {sorted(wrong)[:5]}"
        assert 'Hostname="gpu-node-7"' in page, "dcgm-exporter's Hostname stays as it was"


def test_the_flag_wins_over_its_env_twin_and_over_node_name() -> None:
    env = {"NODE_NAME": "from-downward-api", "GPULENS_KUBERNETES_NODE_NAME": "from-twin"}
    page, openmetrics = next(_pages(["--backend", "sim", "--kubernetes.node-name", "from-flag"], env))
    assert set().union(*_nodes(page, openmetrics).values()) == {"from-flag"}
    page, openmetrics = next(_pages(["--backend", "sim"], env))
    assert set().union(*_nodes(page, openmetrics).values()) == {"from-twin"}


@pytest.mark.parametrize("scenario", ["jobs-0", "jobs-1", "h200x8"])
def test_a_simulated_node_without_a_name_is_labelled_with_its_scenario_not_this_host(scenario: str) -> None:
    env = {"NODE_NAME": "", "GPULENS_KUBERNETES_NODE_NAME": ""}
    for page, openmetrics in _pages(["--backend", "sim", "--sim.scenario", scenario], env):
        assert set().union(*_nodes(page, openmetrics).values()) == {scenario}


def test_real_gpus_without_a_name_are_labelled_with_the_host_name_as_a_valid_label_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The NVML path (``open_gpus`` gives no simulation): the host name, escaped where it is not UTF-8."""
    backend = ScriptedBackend(lambda _n: BackendSample(up=True, driver_version="580.1", gpus=(gpu(0), gpu(1))))
    monkeypatch.setattr(cli, "open_gpus", lambda _cfg: (backend, None))
    host = "gpu-host-\udcff"  # a byte that is not UTF-8, as os.fsdecode gives it
    monkeypatch.setattr("socket.gethostname", lambda: host)
    argv = ["--kubernetes.podresources-socket", "", "--no-collect.nic"]
    for page, openmetrics in _pages(argv, {"NODE_NAME": ""}):
        assert set().union(*_nodes(page, openmetrics).values()) == {"gpu-host-\\xff"} == {label_value(host)}


def test_the_value_is_the_name_else_the_scenario_else_the_host_and_empty_only_without_any() -> None:
    assert node_label_value("gpu-node-7", "jobs-0", lambda: "host") == "gpu-node-7"
    assert node_label_value("", "jobs-0", lambda: "host") == "jobs-0"
    assert node_label_value("", "", lambda: "host.example.com") == "host.example.com"
    assert node_label_value("", "", lambda: "") == ""

    def broken() -> str:
        raise OSError("no host name")

    assert node_label_value("", "", broken) == ""


def _options(node_name: str | None, kube_api: bool) -> AttributionOptions:
    return AttributionOptions(
        podresources_socket=None,
        node_name=node_name,
        kube_api=kube_api,
        kube_owner_chain=True,
        kube_resource_slices=True,
        procfs="/proc",
        refresh_seconds=10.0,
        max_pods=1024,
        max_allocations=4096,
    )


def test_a_node_name_alone_starts_no_api_watch_and_the_host_name_never_does() -> None:
    """NODE_NAME is set on every chart pod; the watch needs --kubernetes.api too, and a name given
    (the host name that labels the series is no node name the API knows)."""
    assert parse_config([], env={"NODE_NAME": "gpu-node-7"}).kube_api is False
    for node_name, kube_api in (("gpu-node-7", False), (None, True)):
        attributor = build_attributor(_options(node_name, kube_api))
        try:
            assert attributor._pods is None and attributor._slices is None and attributor._pids is None
        finally:
            attributor.close()
