"""``--compat.dcgm``: dcgm-exporter's names, units and labels from the same snapshot, per-pod labels
where one container holds a device, the shared-GPU behaviour, caching, and failure isolation."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from exporter.cli import build
from exporter.config import parse_config
from exporter.model import (
    Allocation,
    Attribution,
    BackendSample,
    GpmSample,
    GpuSample,
    LeafSample,
    LinkTraffic,
    MigInstance,
    PodRef,
    PodUsage,
    Snapshot,
    StageResult,
)
from exporter.render.collector import CachedExposition, SnapshotCollector
from exporter.render.compat_dcgm import FIELDS, DcgmCompatRenderer, default_hostname, render_lines
from exporter.sampler import Sampler
from tests.fakes_backend import ScriptedBackend, gpu

MIB = 1 << 20
TRAINER = PodRef("ml", "trainer-0", "main")
NOTEBOOK_A = PodRef("nb", "alice-0", "notebook")
NOTEBOOK_B = PodRef("nb", "bob-0", "notebook")


class _Scrape:
    """One scrape of an exporter wired like the CLI: native registry plus the compat block."""

    def __init__(self, snap: Snapshot, hostname: str = "node-a", openmetrics: bool = False) -> None:
        compat = DcgmCompatRenderer(hostname)
        collector = SnapshotCollector(lambda: snap, include_age=False, render_checks={"compat_dcgm": compat.ok})
        accept = "application/openmetrics-text; version=1.0.0" if openmetrics else "text/plain"
        self.text = CachedExposition(collector, lambda: snap, tails=[compat.text]).render(accept)[0].decode()
        parse = openmetrics_families if openmetrics else text_string_to_metric_families
        self.samples = [_wire_name(fam, s) for fam in parse(self.text) for s in fam.samples]

    def get_sample_value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        for s in self.samples:
            if s.name == name and s.labels == (labels or {}):
                return float(s.value)
        return None


def _wire_name(family: Any, sample: Any) -> Any:
    """The sample as written: prometheus_client's text parser appends ``_total`` to every counter
    sample, but DCGM's counters carry their names as they are (``DCGM_FI_DEV_..._CONSUMPTION``)."""
    if family.type == "counter" and family.name.startswith("DCGM_") and sample.name == family.name + "_total":
        return sample._replace(name=family.name)
    return sample


def _registry(snap: Snapshot, hostname: str = "node-a") -> _Scrape:
    return _Scrape(snap, hostname)


def _gpu_labels(g: GpuSample, **extra: str) -> dict[str, str]:
    return {
        "gpu": str(g.index),
        "UUID": g.uuid,
        "pci_bus_id": g.pci_bus_id or "",
        "device": f"nvidia{g.index}",
        "modelName": "NVIDIA H200",
        "Hostname": "node-a",
        "DCGM_FI_DRIVER_VERSION": "580.159.04",
        **extra,
    }


def _whole(index: int, **kw: object) -> GpuSample:
    base = gpu(index, pci_bus_id=f"00000000:{0x18 + index:02X}:00.0", **kw)
    leaf = replace(base.leaves[0], memory_reserved_bytes=512 * MIB, memory_total_bytes=80 << 30)
    return replace(base, leaves=(leaf,))


def _mig_gpu(index: int) -> GpuSample:
    base = gpu(index, pci_bus_id="00000000:9A:00.0", utilization_ratio=None, mig_mode="enabled")
    leaves = tuple(
        LeafSample(
            uuid=base.uuid,
            mig=MigInstance(f"MIG-{index}-{gi}", gi, 0, "3g.71gb"),
            memory_used_bytes=(gi + 1) * MIB * 1024,
            memory_total_bytes=70 << 30,
            gpm=GpmSample(window_seconds=1.0, sm_active=0.1 * gi, tensor_active=0.05 * gi),
        )
        for gi in (1, 2)
    )
    return replace(base, leaves=leaves)


def _snapshot(gpus: tuple[GpuSample, ...], attribution: Attribution | None = None, **kw: object) -> Snapshot:
    backend = BackendSample(up=True, driver_version="580.159.04", gpus=gpus)
    stages = (StageResult("nvml", True, 0.001), StageResult("cgroup", True, 0.001))
    return Snapshot(timestamp=1000.0, backend=backend, stages=stages, attribution=attribution, **kw)  # type: ignore[arg-type]


def test_device_series_carry_dcgm_exporters_names_units_and_identity_labels() -> None:
    g = _whole(0, sm_clock_hertz=1980e6, memory_clock_hertz=3201e6, temperature_celsius=61.0)
    reg = _registry(_snapshot((g,)))
    lab = _gpu_labels(g)
    assert reg.get_sample_value("DCGM_FI_DEV_SM_CLOCK", lab) == 1980  # MHz
    assert reg.get_sample_value("DCGM_FI_DEV_MEM_CLOCK", lab) == 3201
    assert reg.get_sample_value("DCGM_FI_DEV_GPU_TEMP", lab) == 61  # degrees C
    assert reg.get_sample_value("DCGM_FI_DEV_POWER_USAGE", lab) == 300  # W
    assert reg.get_sample_value("DCGM_FI_DEV_GPU_UTIL", lab) == 50  # percent, not a ratio
    assert reg.get_sample_value("DCGM_FI_PROF_SM_ACTIVE", lab) == 0.5  # ratios stay ratios
    assert reg.get_sample_value("DCGM_FI_PROF_DRAM_ACTIVE", lab) == 0.25
    assert reg.get_sample_value("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", lab) == 0.1
    # framebuffer in MiB: total = used + free + reserved (NVML memory info v2)
    assert reg.get_sample_value("DCGM_FI_DEV_FB_USED", lab) == 1024
    assert reg.get_sample_value("DCGM_FI_DEV_FB_RESERVED", lab) == 512
    assert reg.get_sample_value("DCGM_FI_DEV_FB_FREE", lab) == 80 * 1024 - 1024 - 512
    assert reg.get_sample_value("DCGM_FI_DEV_XID_ERRORS", {**lab, "err_code": "0"}) == 0


def test_energy_is_a_millijoule_counter_from_the_monotonic_total() -> None:
    from exporter.model import LeafAnalysis

    g = _whole(0)
    analysis = {g.uuid: LeafAnalysis(leaf_id=g.uuid, energy_joules=12.5)}
    reg = _registry(_snapshot((g,), analysis=analysis))
    assert reg.get_sample_value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", _gpu_labels(g)) == 12500


def test_fb_free_without_the_v2_reserved_figure_is_total_minus_used() -> None:
    g = _whole(0)
    g = replace(g, leaves=(replace(g.leaves[0], memory_reserved_bytes=None),))
    reg = _registry(_snapshot((g,)))
    assert reg.get_sample_value("DCGM_FI_DEV_FB_FREE", _gpu_labels(g)) == 80 * 1024 - 1024
    assert reg.get_sample_value("DCGM_FI_DEV_FB_RESERVED", _gpu_labels(g)) is None


def test_a_gpu_held_by_one_container_labels_all_its_device_series_with_that_pod() -> None:
    g0, g1 = _whole(0), _whole(1)
    attr = Attribution(allocations=(Allocation(TRAINER, "nvidia.com/gpu", g0.uuid),))
    reg = _registry(_snapshot((g0, g1), attr))
    held = _gpu_labels(g0, namespace="ml", pod="trainer-0", container="main")
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_SM_ACTIVE"):
        assert reg.get_sample_value(name, held) is not None, name
        assert reg.get_sample_value(name, _gpu_labels(g0)) is None, f"{name} must not also appear unlabelled"
    assert reg.get_sample_value("DCGM_FI_DEV_GPU_UTIL", _gpu_labels(g1)) == 50


def test_mig_instances_carry_gpu_i_id_and_profile_and_their_own_pod() -> None:
    g = _mig_gpu(4)
    attr = Attribution(
        allocations=(
            Allocation(TRAINER, "nvidia.com/mig-3g.71gb", g.uuid, mig_uuid="MIG-4-1"),
            Allocation(NOTEBOOK_A, "nvidia.com/mig-3g.71gb", g.uuid, mig_uuid="MIG-4-2"),
        )
    )
    reg = _registry(_snapshot((g,), attr))
    base = _gpu_labels(g)
    gi1 = {**base, "GPU_I_PROFILE": "3g.71gb", "GPU_I_ID": "1", "namespace": "ml", "pod": "trainer-0"}
    gi1["container"] = "main"
    gi2 = {**base, "GPU_I_PROFILE": "3g.71gb", "GPU_I_ID": "2", "namespace": "nb", "pod": "alice-0"}
    gi2["container"] = "notebook"
    assert reg.get_sample_value("DCGM_FI_DEV_FB_USED", gi1) == 2048
    assert reg.get_sample_value("DCGM_FI_DEV_FB_USED", gi2) == 3072
    assert reg.get_sample_value("DCGM_FI_PROF_SM_ACTIVE", gi2) == pytest.approx(0.2)
    # Device-wide readings appear once per physical GPU, without instance or pod labels: two pods
    # share the board, and summing power over instances must not count it twice.
    assert reg.get_sample_value("DCGM_FI_DEV_POWER_USAGE", base) == 300
    text = reg.text
    assert text.count("DCGM_FI_DEV_POWER_USAGE{") == 1
    # NVML has no GPU-Util for a MIG-enabled GPU: absent, never 0.
    assert "DCGM_FI_DEV_GPU_UTIL{" not in text


# --- link rates: DCGM_FI_PROF_{PCIE,NVLINK}_{TX,RX}_BYTES ----------------------------------------

GEN5_X16 = 32e9 * 16 * 128 / 130 / 8


def _pcie(tx: float, rx: float, source: str = "counter") -> LinkTraffic:
    return LinkTraffic("pcie", source, 1.0, tx, rx, GEN5_X16)


def _nvlink(each_way: float) -> LinkTraffic:
    return LinkTraffic("nvlink", "gpm", 1.0, each_way, each_way, 18 * 26.5625e9)


LINK_FIELDS = ("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES")
NVLINK_FIELDS = ("DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES")


def test_link_rates_are_the_leafs_link_reads_in_bytes_per_second_as_gauges() -> None:
    # A host-to-device copy at 51.5 GB/s: dcgm-exporter's unit is bytes per second, not MiB/s or KB.
    links = (_pcie(1.03e9, 51.5e9), _nvlink(88e9))
    g = _whole(0, pcie_tx_bytes_per_second=1.03e9, pcie_rx_bytes_per_second=51.5e9, links=links)
    g = replace(g, leaves=(replace(g.leaves[0], links=links),))
    attr = Attribution(allocations=(Allocation(TRAINER, "nvidia.com/gpu", g.uuid),))
    reg = _registry(_snapshot((g,), attr))
    held = _gpu_labels(g, namespace="ml", pod="trainer-0", container="main")
    assert reg.get_sample_value("DCGM_FI_PROF_PCIE_TX_BYTES", held) == 1.03e9
    assert reg.get_sample_value("DCGM_FI_PROF_PCIE_RX_BYTES", held) == 51.5e9
    assert reg.get_sample_value("DCGM_FI_PROF_NVLINK_TX_BYTES", held) == 88e9
    assert reg.get_sample_value("DCGM_FI_PROF_NVLINK_RX_BYTES", held) == 88e9
    for name in LINK_FIELDS + NVLINK_FIELDS:
        assert f"# TYPE {name} gauge" in reg.text
        assert reg.text.count(f"{name}{{") == 1, name
    assert "protocol headers and data payloads, in bytes per second" in reg.text


def test_link_rates_come_from_the_leafs_link_read_not_a_second_reading() -> None:
    # The GPU-wide fields are absent (a failed sampled read); the leaf's counter read still answers.
    g = _whole(0, pcie_tx_bytes_per_second=None, pcie_rx_bytes_per_second=None)
    g = replace(g, leaves=(replace(g.leaves[0], links=(_pcie(2e6, 3e9),)),))
    reg = _registry(_snapshot((g,)))
    assert reg.get_sample_value("DCGM_FI_PROF_PCIE_RX_BYTES", _gpu_labels(g)) == 3e9
    assert reg.get_sample_value("DCGM_FI_PROF_PCIE_TX_BYTES", _gpu_labels(g)) == 2e6
    assert "DCGM_FI_PROF_NVLINK_RX_BYTES{" not in reg.text, "no NVLink read: absent, never 0"


def test_mig_instances_carry_their_own_pcie_share_like_the_other_profiling_fields() -> None:
    g = _mig_gpu(4)
    shares = {1: _pcie(0.5e9, 20e9, "gpm"), 2: _pcie(1e6, 2e6, "gpm")}
    leaves = tuple(replace(leaf, links=(shares[leaf.mig.gpu_instance_id],)) for leaf in g.leaves if leaf.mig)
    g = replace(g, leaves=leaves, pcie_tx_bytes_per_second=0.6e9, pcie_rx_bytes_per_second=20.1e9)
    attr = Attribution(allocations=(Allocation(TRAINER, "nvidia.com/mig-3g.71gb", g.uuid, mig_uuid="MIG-4-1"),))
    reg = _registry(_snapshot((g,), attr))
    base = _gpu_labels(g)
    gi1 = {**base, "GPU_I_PROFILE": "3g.71gb", "GPU_I_ID": "1", "namespace": "ml", "pod": "trainer-0"}
    gi1["container"] = "main"
    gi2 = {**base, "GPU_I_PROFILE": "3g.71gb", "GPU_I_ID": "2"}
    assert reg.get_sample_value("DCGM_FI_PROF_PCIE_RX_BYTES", gi1) == 20e9
    assert reg.get_sample_value("DCGM_FI_PROF_PCIE_TX_BYTES", gi1) == 0.5e9
    assert reg.get_sample_value("DCGM_FI_PROF_PCIE_RX_BYTES", gi2) == 2e6
    # Each instance has its own share: the device's total is not repeated on every instance.
    assert reg.get_sample_value("DCGM_FI_PROF_PCIE_RX_BYTES", base) is None
    assert reg.text.count("DCGM_FI_PROF_PCIE_RX_BYTES{") == 2
    assert "DCGM_FI_PROF_NVLINK_TX_BYTES{" not in reg.text, "MIG instances have no NVLink"


def test_without_per_leaf_link_reads_the_gpus_own_rate_appears_once_per_gpu() -> None:
    # A backend that reads PCIe for the whole device only (no LinkTraffic on its leaves).
    whole = _whole(0, pcie_tx_bytes_per_second=1e6, pcie_rx_bytes_per_second=4e9)
    mig = replace(_mig_gpu(4), pcie_tx_bytes_per_second=2e6, pcie_rx_bytes_per_second=5e9)
    reg = _registry(_snapshot((whole, mig)))
    assert reg.get_sample_value("DCGM_FI_PROF_PCIE_RX_BYTES", _gpu_labels(whole)) == 4e9
    assert reg.get_sample_value("DCGM_FI_PROF_PCIE_RX_BYTES", _gpu_labels(mig)) == 5e9
    assert reg.get_sample_value("DCGM_FI_PROF_PCIE_TX_BYTES", _gpu_labels(mig)) == 2e6
    assert reg.text.count("DCGM_FI_PROF_PCIE_RX_BYTES{") == 2, "once per GPU, no GPU_I_* copies"


def _parsed(body: bytes) -> list[Any]:
    """Every sample of a text-format exposition."""
    return [s for fam in text_string_to_metric_families(body.decode()) for s in fam.samples]


def test_simulated_link_rates_match_the_native_counters_increase_over_the_cycle() -> None:
    """The simulated data loader (mps GPU 4) through the CLI's wiring: the compat rate, the leaf's
    link read and the increase of gpulens_gpu_pcie_rx_bytes_total over the cycle are one number."""
    sampler, exposition, _ = build(
        parse_config(["--backend", "sim", "--sim.scenario", "mps", "--no-probes", "--compat.dcgm"], env={})
    )
    totals: list[float | None] = []
    try:
        for _ in range(3):
            stager = sampler.run_once().backend.gpus[4]
            scrape = _parsed(exposition.render("text/plain")[0])
            rx_total = "gpulens_gpu_pcie_rx_bytes_total"
            native = [s.value for s in scrape if s.name == rx_total and s.labels["uuid"] == stager.uuid]
            totals.append(native[0] if native else None)
    finally:
        sampler.stop()
    link = next(x for x in stager.leaves[0].links if x.link == "pcie")
    assert link.rx_bytes_per_second is not None and link.rx_bytes_per_second > 45e9
    compat = [s for s in scrape if s.name == "DCGM_FI_PROF_PCIE_RX_BYTES" and s.labels["UUID"] == stager.uuid]
    assert len(compat) == 1 and compat[0].labels["pod"].startswith("shard-stager-")
    assert compat[0].value == link.rx_bytes_per_second == stager.pcie_rx_bytes_per_second
    first, second, third = totals
    assert first is None, "the first cycle has no window, so no rate and no bytes yet"
    assert second is not None and third is not None
    assert third - second == pytest.approx(link.rx_bytes_per_second * link.window_seconds)


def _time_sliced(g: GpuSample, *usages: PodUsage) -> Attribution:
    """Alice and Bob each hold one time-slicing replica of ``g``."""
    return Attribution(
        allocations=(
            Allocation(NOTEBOOK_A, "nvidia.com/gpu.shared", g.uuid, replica="0"),
            Allocation(NOTEBOOK_B, "nvidia.com/gpu.shared", g.uuid, replica="1"),
        ),
        usages=usages,
    )


def test_time_sliced_gpu_keeps_one_unlabelled_device_series_and_puts_pod_shares_under_pod_names() -> None:
    g = _whole(0)
    attr = _time_sliced(g, PodUsage(NOTEBOOK_A, g.uuid, memory_used_bytes=3 * 1024 * MIB, kernel_time_ratio=0.3))
    reg = _registry(_snapshot((g,), attr))
    base = _gpu_labels(g)
    alice = {**base, "namespace": "nb", "pod": "alice-0", "container": "notebook"}
    bob = {**base, "namespace": "nb", "pod": "bob-0", "container": "notebook"}
    assert reg.get_sample_value("DCGM_FI_DEV_GPU_UTIL", base) == 50
    assert reg.get_sample_value("DCGM_FI_DEV_FB_USED", base) == 1024
    assert reg.get_sample_value("DCGM_FI_DEV_GPU_UTIL_POD", alice) == pytest.approx(30)
    assert reg.get_sample_value("DCGM_FI_DEV_FB_USED_POD", alice) == 3072
    # bob holds a replica but runs nothing on it (the process table was read): 0, as dcgm-exporter
    assert reg.get_sample_value("DCGM_FI_DEV_GPU_UTIL_POD", bob) == 0
    assert reg.get_sample_value("DCGM_FI_DEV_FB_USED_POD", bob) == 0
    # The device fields appear once, unlabelled by pod: a pod's share under the device's name would
    # add to every sum() over it and draw one more line per pod on per-GPU panels.
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE"):
        assert reg.text.count(f"{name}{{") == 1, name
        assert reg.get_sample_value(name, alice) is None, name
    assert reg.get_sample_value("DCGM_FI_DEV_POWER_USAGE", base) == 300


def test_without_process_mapping_an_idle_looking_pod_is_not_invented() -> None:
    g = _whole(0)
    attr = _time_sliced(g)
    snap = replace(_snapshot((g,), attr), stages=(StageResult("cgroup", False, 0.001),))
    reg = _registry(snap)
    bob = {**_gpu_labels(g), "namespace": "nb", "pod": "bob-0", "container": "notebook"}
    assert reg.get_sample_value("DCGM_FI_DEV_GPU_UTIL_POD", bob) is None
    assert reg.get_sample_value("DCGM_FI_DEV_FB_USED_POD", bob) is None
    assert "_POD{" not in reg.text


def test_last_xid_is_the_value_and_its_code_a_label() -> None:
    backend = ScriptedBackend(lambda n: BackendSample(up=True, gpus=(gpu(0, xid_events=(31,) if n == 0 else (79,)),)))
    sampler = Sampler(backend)
    sampler.run_once()
    snap = sampler.run_once()
    assert snap.xid_last == {gpu(0).uuid: 79}
    text = _registry(snap).text
    assert 'err_code="79"' in text
    assert 'err_code="31"' not in text


def test_lost_gpu_has_no_compat_series() -> None:
    lost = GpuSample(index=0, uuid=gpu(0).uuid, up=False)
    assert render_lines(_snapshot((lost,)), "node-a") == {}


def test_hostname_is_the_node_name_else_the_host_name() -> None:
    import socket

    assert default_hostname("gpu-node-7") == "gpu-node-7"
    assert default_hostname("") == socket.gethostname()


def test_compat_is_off_by_default_and_the_flag_or_its_env_twin_turns_it_on() -> None:
    def body(argv: list[str], env: dict[str, str]) -> str:
        sampler, exposition, _ = build(parse_config(["--backend", "sim", "--no-probes", *argv], env=env))
        sampler.run_once()
        return exposition.render("text/plain")[0].decode()

    assert "DCGM_FI_" not in body([], {})
    on = body(["--compat.dcgm"], {"NODE_NAME": "gpu-node-7"})
    assert 'Hostname="gpu-node-7"' in on
    assert "DCGM_FI_DEV_GPU_UTIL{" in on
    assert "DCGM_FI_DEV_GPU_UTIL{" in body([], {"GPULENS_COMPAT_DCGM": "true"})


def test_bad_env_twin_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config([], env={"GPULENS_COMPAT_DCGM": "maybe"})
    assert exc.value.code == 2
    assert "GPULENS_COMPAT_DCGM" in capsys.readouterr().err


def test_the_block_is_built_once_per_snapshot_and_label_sets_are_encoded_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import exporter.render.compat_dcgm as compat_module

    calls: list[Snapshot] = []
    real = compat_module.render_lines

    def counting(snap: Snapshot, host: str, cache: Any, node: str = "") -> dict[Any, Any]:
        calls.append(snap)
        return real(snap, host, cache, node)

    monkeypatch.setattr(compat_module, "render_lines", counting)
    renderer = DcgmCompatRenderer("node-a")
    first, second = _snapshot((_whole(0),)), _snapshot((_whole(0, power_watts=301.0),))
    a = renderer.text(first, False)
    assert renderer.text(first, False) is a
    assert renderer.ok(first)
    b = renderer.text(second, False)
    assert calls == [first, second]
    assert b"DCGM_FI_DEV_POWER_USAGE{" in b and b" 301.0\n" in b and a != b


def test_openmetrics_scrape_parses_and_keeps_the_dcgm_names() -> None:
    scrape = _Scrape(_snapshot((_whole(0, pcie_replay_errors=2),)), openmetrics=True)
    assert scrape.text.endswith("# EOF\n")
    assert "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER unknown" in scrape.text
    assert scrape.get_sample_value("DCGM_FI_DEV_GPU_UTIL", _gpu_labels(_whole(0))) == 50


def test_label_values_are_escaped() -> None:
    g = replace(_whole(0), name='NVIDIA "H200"\\x')
    scrape = _registry(_snapshot((g,)))
    assert scrape.get_sample_value("DCGM_FI_DEV_GPU_UTIL", {**_gpu_labels(g), "modelName": 'NVIDIA "H200"\\x'}) == 50


def test_a_failing_compat_render_drops_only_the_compat_series(monkeypatch: pytest.MonkeyPatch) -> None:
    import exporter.render.compat_dcgm as compat_module

    def broken(*_args: object) -> dict[Any, Any]:
        raise RuntimeError("boom")

    monkeypatch.setattr(compat_module, "render_lines", broken)
    scrape = _registry(_snapshot((_whole(0),)))
    assert scrape.get_sample_value("gpulens_stage_success", {"stage": "render_compat_dcgm"}) == 0
    assert scrape.get_sample_value("gpulens_gpu_up", {"gpu": "0", "uuid": gpu(0).uuid}) == 1
    assert "DCGM_FI_" not in scrape.text


def test_every_field_has_a_source_dcgm_naming_and_a_row_in_the_mapping_doc() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "dcgm-compat.md").read_text()
    assert len({f.name for f in FIELDS}) == len(FIELDS)
    for f in FIELDS:
        assert f.name.startswith(("DCGM_FI_DEV_", "DCGM_FI_PROF_")), f.name
        assert f.type in ("gauge", "counter")
        assert f.source
        # the doc groups siblings in one row (`DCGM_FI_PROF_PIPE_FP64_ACTIVE`, `_FP32_ACTIVE`, ...)
        parts = f.name.split("_")
        named = f.name in doc or any(f"`_{'_'.join(parts[-k:])}`" in doc for k in (2, 3))
        assert named, f"{f.name} is missing from docs/dcgm-compat.md"


@pytest.mark.integration  # runs another program
@pytest.mark.parametrize("scenario", ["h200x8", "mig", "timeslice"])
def test_promtool_flags_only_dcgm_exporters_own_names(scenario: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run the README test command (scripts/test.sh)")
    sampler, exposition, _ = build(
        parse_config(["--backend", "sim", "--sim.scenario", scenario, "--no-probes", "--compat.dcgm"], env={})
    )
    sampler.run_once()
    sampler.run_once()
    body = exposition.render("text/plain")[0]
    assert b"DCGM_FI_PROF_SM_ACTIVE{" in body
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60)
    problems = [line for line in (result.stdout + result.stderr).decode().splitlines() if line.strip()]
    assert result.returncode in (0, 3), problems  # 3: lint findings only; 1 would be a parse error
    # The findings are dcgm-exporter's own names, which consumers query verbatim: the camelCase
    # modelName label, DCGM_FI_DEV_PCIE_REPLAY_COUNTER's "COUNTER", and DCGM's counters, which have
    # no "_total" suffix. Nothing else may be flagged (the native series stay clean).
    camel = "label names should be written in 'snake_case' not 'camelCase'"
    replay = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'"
    counters = {f'{f.name} counter metrics should have "_total" suffix' for f in FIELDS if f.type == "counter"}
    allowed = counters | {replay}
    assert all((p.startswith("DCGM_FI_") and p.endswith(camel)) or p in allowed for p in problems), problems


def test_graphics_engine_activity_is_the_busy_ratio_else_nvml_gpu_util() -> None:
    from exporter.model import LeafAnalysis

    g0, g1 = _whole(0), _whole(1, utilization_ratio=0.25)
    m = _mig_gpu(2)
    analysis = {
        g0.uuid: LeafAnalysis(leaf_id=g0.uuid, busy_ratio=0.75),
        "MIG-2-1": LeafAnalysis(leaf_id="MIG-2-1", busy_ratio=0.4),
    }
    reg = _registry(_snapshot((g0, g1, m), analysis=analysis))
    assert reg.get_sample_value("DCGM_FI_PROF_GR_ENGINE_ACTIVE", _gpu_labels(g0)) == 0.75
    assert reg.get_sample_value("DCGM_FI_PROF_GR_ENGINE_ACTIVE", _gpu_labels(g1)) == 0.25  # no analysis yet
    gi1 = {**_gpu_labels(m), "GPU_I_PROFILE": "3g.71gb", "GPU_I_ID": "1"}
    assert reg.get_sample_value("DCGM_FI_PROF_GR_ENGINE_ACTIVE", gi1) == 0.4
    gi2 = {**gi1, "GPU_I_ID": "2"}
    assert reg.get_sample_value("DCGM_FI_PROF_GR_ENGINE_ACTIVE", gi2) is None  # MIG: no NVML fallback


def test_every_field_is_rendered_by_the_one_loop_in_some_simulated_scenario() -> None:
    """Each field states its scope and how it is read; the simulator reaches all but the fan."""
    seen: set[str] = set()
    for scenario in ("h200x8", "mig", "timeslice", "mps"):
        sampler, _, _ = build(parse_config(["--backend", "sim", "--sim.scenario", scenario, "--no-probes"], env={}))
        try:
            sampler.run_once()
            sampler.run_once()
            snap = sampler.latest()
        finally:
            sampler.stop()
        assert snap is not None
        seen |= set(render_lines(snap, "node-a"))
    for f in FIELDS:
        assert f.scope in ("gpu", "leaf", "pod") and callable(f.read), f.name
    assert {f.name for f in FIELDS} - seen == {"DCGM_FI_DEV_FAN_SPEED"}  # passively cooled boards
    assert {f.name for f in FIELDS if f.scope == "pod"} == {"DCGM_FI_DEV_GPU_UTIL_POD", "DCGM_FI_DEV_FB_USED_POD"}


# --- shared GPUs: sums and per-GPU legends over the simulated nodes --------------------------------

DCGM_EXPORTER_TYPES = {
    # The type dcgm-exporter declares for each field gpulens provides, where its counter lists
    # (etc/default-counters.csv, etc/dcp-metrics-included.csv) have it; the others are gauges.
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "counter",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "counter",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "counter",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_XID_ERRORS": "gauge",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gauge",
    "DCGM_FI_DEV_GPU_UTIL": "gauge",
    "DCGM_FI_DEV_FB_USED": "gauge",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "gauge",
}
DASHBOARD_12239 = (
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
)
"""The fields NVIDIA's DCGM dashboard (Grafana 12239) draws one line per series of, as ``GPU {{gpu}}``."""
DEVICE_KEY = ("Hostname", "UUID", "gpu", "GPU_I_ID")
"""What tells one device (a GPU or a MIG instance) from another in a compat series."""


def _sim_scrape(scenario: str) -> tuple[Snapshot, str, str]:
    """The simulated node's snapshot and its /metrics in the text and OpenMetrics formats."""
    argv = ["--backend", "sim", "--sim.scenario", scenario, "--no-probes", "--compat.dcgm"]
    sampler, exposition, _ = build(parse_config(argv, env={"NODE_NAME": "gpu-node-7"}))
    try:
        sampler.run_once()
        snap = sampler.run_once()
        text = exposition.render("text/plain")[0].decode()
        om = exposition.render("application/openmetrics-text; version=1.0.0")[0].decode()
    finally:
        sampler.stop()
    return snap, text, om


def _dcgm_samples(body: str, openmetrics: bool) -> list[Any]:
    parse = openmetrics_families if openmetrics else text_string_to_metric_families
    return [_wire_name(fam, s) for fam in parse(body) for s in fam.samples if fam.name.startswith("DCGM_")]


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_timeslice_sum_of_fb_used_is_the_devices_used_memory(openmetrics: bool) -> None:
    snap, text, om = _sim_scrape("timeslice")
    samples = _dcgm_samples(om if openmetrics else text, openmetrics)
    devices_mib = sum(leaf.memory_used_bytes or 0 for g in snap.backend.gpus for leaf in g.leaves) / MIB
    attr = snap.attribution
    assert attr is not None and len(attr.sharing_pods) == 4, "the scenario time-slices four GPUs"
    assert devices_mib == 562544  # 8 x H200, MiB
    fb_used = [s for s in samples if s.name == "DCGM_FI_DEV_FB_USED"]
    assert sum(s.value for s in fb_used) == devices_mib
    assert len(fb_used) == len(snap.backend.gpus)
    # Each container's own memory is under its own name; on each shared GPU the shares add up to
    # the device's (the simulator runs no process outside a pod).
    for uuid in attr.sharing_pods:
        device = next(s.value for s in fb_used if s.labels["UUID"] == uuid)
        shares = [s for s in samples if s.name == "DCGM_FI_DEV_FB_USED_POD" and s.labels["UUID"] == uuid]
        assert len(shares) >= 2 and all(s.labels["pod"] for s in shares)
        assert sum(s.value for s in shares) == pytest.approx(device)


@pytest.mark.parametrize("scenario", ["h200x8", "mig", "timeslice", "mps"])
def test_every_device_field_has_one_series_per_device_whoever_holds_it(scenario: str) -> None:
    """No two series of a device field differ by pod alone: Grafana 12239's per-GPU legend
    (``GPU {{gpu}}`` per node) draws one line per GPU, and a sum counts each device once."""
    snap, text, _ = _sim_scrape(scenario)
    per_device: dict[tuple[str, tuple[str, ...]], list[dict[str, str]]] = {}
    for s in _dcgm_samples(text, openmetrics=False):
        if not s.name.endswith("_POD"):
            per_device.setdefault((s.name, tuple(s.labels.get(k, "") for k in DEVICE_KEY)), []).append(s.labels)
    repeated = {key: len(labels) for key, labels in per_device.items() if len(labels) > 1}
    assert not repeated, repeated
    # 12239's panels: one line per GPU for device-wide fields, per leaf (GPU or MIG instance) for
    # per-leaf ones; NVML has no GPU-Util on a MIG-enabled GPU.
    scope = {f.name: f.scope for f in FIELDS}
    gpus = {(str(g.index), ""): g for g in snap.backend.gpus}
    leaves = {
        (str(g.index), str(leaf.mig.gpu_instance_id) if leaf.mig else "")
        for g in snap.backend.gpus
        for leaf in g.leaves
    }
    for name in DASHBOARD_12239:
        lines = sorted((key[2], key[3]) for n, key in per_device if n == name)
        if name == "DCGM_FI_DEV_GPU_UTIL":
            expected = sorted(k for k, g in gpus.items() if g.mig_mode != "enabled")
        else:
            expected = sorted(gpus if scope[name] == "gpu" else leaves)
        assert lines == expected, name
    if scenario in ("timeslice", "mps"):
        assert "DCGM_FI_DEV_FB_USED_POD{" in text, "the shares are there, under their own name"


def test_counters_are_counters_in_text_and_unknown_in_openmetrics_as_dcgm_exporter_declares() -> None:
    for f in FIELDS:
        assert f.type == DCGM_EXPORTER_TYPES.get(f.name, "gauge"), f.name
    g = _whole(0, pcie_replay_errors=2, ecc_errors={"corrected": 3, "uncorrected": 0})
    from exporter.model import LeafAnalysis

    snap = _snapshot((g,), analysis={g.uuid: LeafAnalysis(leaf_id=g.uuid, energy_joules=12.5)})
    text, om = _Scrape(snap), _Scrape(snap, openmetrics=True)
    counters = [f.name for f in FIELDS if f.type == "counter"]
    seen = 0
    for name in counters:
        if f"\n{name}{{" not in text.text:
            continue  # the scripted GPU has no remapped rows
        seen += 1
        assert f"# TYPE {name} counter\n" in text.text, name
        assert f"# TYPE {name} unknown\n" in om.text, name
        # both formats keep the name queries use, with no _total added on the wire
        assert text.get_sample_value(name, _gpu_labels(g)) == om.get_sample_value(name, _gpu_labels(g)), name
    assert seen >= 4
    assert "untyped" not in text.text
    assert text.get_sample_value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", _gpu_labels(g)) == 12500
    families = {fam.name: fam.type for fam in text_string_to_metric_families(text.text)}
    assert families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
    assert families["DCGM_FI_DEV_GPU_UTIL"] == "gauge"


def test_the_label_sets_of_departed_pods_are_forgotten_after_two_renders() -> None:
    from exporter.render.compat_dcgm import LabelCache, _Builder

    cache = LabelCache()
    for render in range(200):
        cache.next_render()
        builder = _Builder(cache)
        for i in range(10):
            assert builder.add("DCGM_FI_DEV_GPU_UTIL", (("pod", f"r{render}-p{i}"),), 1.0)
        assert len(cache.current) + len(cache.previous) <= 20
    assert builder.lines["DCGM_FI_DEV_GPU_UTIL"][-1] == 'DCGM_FI_DEV_GPU_UTIL{pod="r199-p9"} 1.0\n'
