"""Each NVLink's state and far end, and the GPU-to-GPU NVLink topology (``NV#``), from NVML.

The fake answers as an HGX board does (18 links a GPU, every one to an NVSwitch) unless a test
gives direct links, a link down, a pair refused peer-to-peer, or a driver that does not say.
"""

from __future__ import annotations

from exporter.backends.nvml.topology import bus_key
from exporter.model import BackendSample, GpuSample
from tests.fakes.fake_pynvml import FakeNvml
from tests.support.nvml_node import Clock, h200, make


def peers(gpu: GpuSample) -> dict[str, int] | None:
    """UUID -> links of ``gpu``'s NVLink peers (each peer's index checked against its UUID)."""
    if gpu.nvlink_peers is None:
        return None
    for p in gpu.nvlink_peers:
        assert p.uuid.startswith(f"GPU-{p.index:08d}-")
    return {p.uuid: p.links for p in gpu.nvlink_peers}


def _gpus(fake: FakeNvml, cycles: int = 1) -> list[GpuSample]:
    clock = Clock()
    backend = make(fake, clock)
    sample: BackendSample | None = None
    for _ in range(cycles):
        sample = backend.sample()
        clock.now += 1.0
    assert sample is not None and sample.up
    return list(sample.gpus)


def test_an_hgx_board_reaches_every_peer_over_all_18_links_through_the_switches() -> None:
    gpus = _gpus(FakeNvml([h200(i, nvlink=True) for i in range(4)]))
    for gpu in gpus:
        assert [x.link for x in gpu.nvlinks] == list(range(18))
        assert all(x.active and x.remote == "switch" for x in gpu.nvlinks)
        assert peers(gpu) == {g.uuid: 18 for g in gpus if g.uuid != gpu.uuid}


def test_a_link_down_is_inactive_and_its_gpu_reaches_peers_over_the_rest() -> None:
    gpus = _gpus(FakeNvml([h200(0, nvlink=True, nvlink_inactive=frozenset({5, 11})), h200(1, nvlink=True)]))
    states = {x.link: x for x in gpus[0].nvlinks}
    assert len(states) == 18 and not states[5].active and not states[11].active
    assert states[5].remote is None and states[5].remote_pci_bus_id is None
    assert sum(x.active for x in gpus[0].nvlinks) == 16
    assert peers(gpus[0]) == {gpus[1].uuid: 16}
    assert peers(gpus[1]) == {gpus[0].uuid: 18}


def test_direct_links_count_per_peer_whatever_the_bus_id_padding() -> None:
    # Two PCIe cards joined by a 4-link bridge, GPU 0 also bridged to GPU 2 over 2 links; NVML
    # writes the far end's bus ID with a short domain here.
    a = h200(0, nvlink=True, nvlink_links=6, nvlink_remote=0,
             nvlink_remote_bus={0: "0000:01:00.0", 1: "0000:01:00.0", 2: "0000:01:00.0", 3: "0000:01:00.0",
                                4: "0000:02:00.0", 5: "0000:02:00.0"})  # fmt: skip
    b = h200(1, nvlink=True, nvlink_links=4, nvlink_remote=0, nvlink_remote_bus=dict.fromkeys(range(4), "0000:00:00.0"))
    c = h200(2, nvlink=True, nvlink_links=2, nvlink_remote=0, nvlink_remote_bus=dict.fromkeys(range(2), "0000:00:00.0"))
    gpus = _gpus(FakeNvml([a, b, c]))
    assert all(x.remote == "gpu" for g in gpus for x in g.nvlinks)
    assert peers(gpus[0]) == {gpus[1].uuid: 4, gpus[2].uuid: 2}
    assert peers(gpus[1]) == {gpus[0].uuid: 4}
    assert peers(gpus[2]) == {gpus[0].uuid: 2}


def test_switch_links_reach_no_one_where_nvml_refuses_peer_to_peer() -> None:
    # A GPU outside the fabric partition the others share: its links train, but no peer-to-peer.
    gpus = _gpus(FakeNvml([h200(0, nvlink=True), h200(1, nvlink=True), h200(2, nvlink=True, nvlink_p2p=False)]))
    assert peers(gpus[0]) == {gpus[1].uuid: 18}
    assert peers(gpus[2]) == {}
    assert all(x.active for x in gpus[2].nvlinks)


def test_a_driver_that_does_not_say_what_a_link_reaches_still_gives_its_state_and_direct_peers() -> None:
    a = h200(
        0,
        nvlink=True,
        nvlink_links=2,
        nvlink_remote=None,
        nvlink_remote_bus=dict.fromkeys(range(2), "00000000:01:00.0"),
    )
    b = h200(
        1,
        nvlink=True,
        nvlink_links=2,
        nvlink_remote=None,
        nvlink_remote_bus=dict.fromkeys(range(2), "00000000:00:00.0"),
    )
    gpus = _gpus(FakeNvml([a, b]))
    assert [(x.active, x.remote) for x in gpus[0].nvlinks] == [(True, None), (True, None)]
    assert peers(gpus[0]) == {gpus[1].uuid: 2}


def test_a_gpu_without_nvlink_has_no_links_and_no_peers() -> None:
    gpus = _gpus(FakeNvml([h200(0), h200(1, nvlink=True)]))
    assert gpus[0].nvlinks == () and peers(gpus[0]) is None
    # Its only NVLink peer has none: it reaches no one.
    assert peers(gpus[1]) == {}


def test_the_topology_is_asked_once_not_every_cycle() -> None:
    fake = FakeNvml([h200(i, nvlink=True) for i in range(3)])
    gpus = _gpus(fake, cycles=30)
    assert peers(gpus[0]) == {gpus[1].uuid: 18, gpus[2].uuid: 18}
    # 3 GPUs, 2 peers each, once: the states are re-read every 60 cycles, not 30.
    assert fake.calls["nvmlDeviceGetP2PStatus"] == 6
    assert fake.calls["nvmlDeviceGetNvLinkRemoteDeviceType"] == 3 * 18


def test_bus_ids_compare_as_devices() -> None:
    assert bus_key("00000000:18:00.0") == bus_key("0000:18:00.0") == bus_key("18:00.0") == (0, 0x18, 0, 0)
    assert bus_key("0000:18:00.1") != bus_key("0000:18:00.0")
    assert bus_key("") is None and bus_key(None) is None and bus_key("not a bus") is None


def test_a_link_that_drops_is_seen_at_the_next_state_read_and_the_peers_follow() -> None:
    fake = FakeNvml([h200(0, nvlink=True), h200(1, nvlink=True)])
    clock = Clock()
    backend = make(fake, clock)
    first = backend.sample().gpus
    assert peers(first[0]) == {first[1].uuid: 18}
    fake.gpus[0].nvlink_inactive = frozenset({3})
    for _ in range(61):
        clock.now += 1.0
        gpus = backend.sample().gpus
    assert [x.link for x in gpus[0].nvlinks if not x.active] == [3]
    assert peers(gpus[0]) == {gpus[1].uuid: 17}
    assert peers(gpus[1]) == {gpus[0].uuid: 18}
