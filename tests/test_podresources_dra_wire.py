"""DRA devices in the kubelet's PodResources ``List`` reply (``dynamic_resources``), decoded by the
exporter's own wire reader.

Replies are encoded by the official protobuf runtime (the stubs generated from the kubelet's
``api.proto``); hostile variants are built from its encodings by appending raw fields, which a
protobuf reader must skip (or, for a repeated field, merge), and by cutting and corrupting bytes.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from exporter.attribution._proto import api_pb2
from exporter.attribution.podresources import PodResourcesClient, PodResourcesSource
from exporter.attribution.podresources_wire import Listed, WireError, list_reply
from exporter.model import ClaimedDevice, ClaimRef, ContainerDevices
from tests.fakes.kubelet_server import FakeKubelet, official_listing, pod
from tests.support.decoding import count_decoded_strings

pytestmark = pytest.mark.integration

DRIVER = "gpu.nvidia.com"
NIC_DRIVER = "sriov.example.com"
POOL = "node-1"


def _cdi(claim_uid: str, device: str) -> str:
    return f"k8s.{DRIVER}/claim={claim_uid}-{device}"


def _reply() -> api_pb2.ListPodResourcesResponse:
    """A node's ``List``: device plugin devices and DRA claims mixed, several claims per
    container, several devices per claim, CDI names, and pods that hold nothing to report."""
    return api_pb2.ListPodResourcesResponse(
        pod_resources=[
            pod(
                "ml",
                "train-0",
                [
                    (
                        "main",
                        [("nvidia.com/gpu", ["GPU-a"])],
                        [
                            (
                                "ml",
                                "train-0-gpus",
                                [
                                    (DRIVER, POOL, "gpu-0", [_cdi("u1", "gpu-0")]),
                                    (DRIVER, POOL, "gpu-1", [_cdi("u1", "gpu-1"), "k8s.gpu.nvidia.com/claim=all"]),
                                ],
                            ),
                            ("ml", "train-0-nic", [(NIC_DRIVER, "node-1-nics", "vf-3", [])]),
                        ],
                    ),
                    ("sidecar", [], []),
                ],
            ),
            pod("web", "nginx", [("nginx", [])]),  # nothing: no entry
            pod("ml", "infer", [("server", [], [("shared", "one-gpu", [(DRIVER, POOL, "gpu-2", [])])])]),
            pod("ml", "empty-claim", [("c", [], [("ml", "no-devices", [])])]),  # a claim without device: nothing
            pod("dev", "plugin-only", [("c", [("example.com/nic", ["n0", "n1"])])]),
        ]
    )


EXPECTED = Listed(
    devices=(
        ContainerDevices("ml", "train-0", "main", "nvidia.com/gpu", ("GPU-a",)),
        ContainerDevices("dev", "plugin-only", "c", "example.com/nic", ("n0", "n1")),
    ),
    claimed=(
        ClaimedDevice(
            "ml", "train-0", "main", ClaimRef("ml", "train-0-gpus", DRIVER, POOL, "gpu-0"), (_cdi("u1", "gpu-0"),)
        ),
        ClaimedDevice(
            "ml",
            "train-0",
            "main",
            ClaimRef("ml", "train-0-gpus", DRIVER, POOL, "gpu-1"),
            (_cdi("u1", "gpu-1"), "k8s.gpu.nvidia.com/claim=all"),
        ),
        ClaimedDevice("ml", "train-0", "main", ClaimRef("ml", "train-0-nic", NIC_DRIVER, "node-1-nics", "vf-3")),
        ClaimedDevice("ml", "infer", "server", ClaimRef("shared", "one-gpu", DRIVER, POOL, "gpu-2")),
    ),
)


def test_claims_and_plugin_devices_decode_from_the_official_encoding() -> None:
    assert list_reply(_reply().SerializeToString()) == EXPECTED


def test_a_claim_only_pod_is_decoded_and_a_pod_without_either_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    decoded = count_decoded_strings(monkeypatch)
    nothing = api_pb2.ListPodResourcesResponse(
        pod_resources=[
            pod("web", f"nginx-{i}", [("nginx", [], [("web", f"claim-{i}", [])]), ("log", [])]) for i in range(200)
        ]
    )
    assert list_reply(nothing.SerializeToString()) == Listed((), ())
    assert decoded == [], "no string of a pod whose claims hold no device is decoded"
    only = api_pb2.ListPodResourcesResponse(
        pod_resources=[pod("ml", "infer", [("server", [], [("ml", "c", [(DRIVER, POOL, "gpu-0", [])])])])]
    )
    assert list_reply(only.SerializeToString()) == Listed(
        (), (ClaimedDevice("ml", "infer", "server", ClaimRef("ml", "c", DRIVER, POOL, "gpu-0")),)
    )


# --- fields the decoder does not know ----------------------------------------------------------------


def _key(number: int, wire: int) -> bytes:
    return _varint((number << 3) | wire)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _key(number, 2) + _varint(len(payload)) + payload


UNKNOWN = (
    _key(90, 0) + _varint(300)  # varint
    + _key(91, 1) + b"\x01\x02\x03\x04\x05\x06\x07\x08"  # i64
    + _len_field(92, b"\x0a\x03abc")  # len, holding what looks like a message
    + _key(93, 5) + b"\xff\xfe\xfd\xfc"  # i32
    + _key(2047, 0) + _varint(2**63)  # a two-byte key and a ten-byte varint
    + _len_field(94, b"")  # an empty length-delimited field
)  # fmt: skip
"""One unknown field of every wire type, field numbers no message of the v1 API uses."""

LEVELS = ("response", "pod", "container", "claim", "claim_resource", "cdi")


def _hostile(extra: dict[str, bytes]) -> bytes:
    """The ``List`` reply of one pod with a device plugin entry and a claim of two devices,
    built from official encodings with ``extra[level]`` appended to the message at that level."""

    def more(level: str) -> bytes:
        return extra.get(level, b"")

    def cdi(name: str) -> bytes:
        return api_pb2.CDIDevice(name=name).SerializeToString() + more("cdi")

    def claim_resource(device: str, cdi_names: list[str]) -> bytes:
        body = api_pb2.ClaimResource(driver_name=DRIVER, pool_name=POOL, device_name=device).SerializeToString()
        return body + b"".join(_len_field(1, cdi(n)) for n in cdi_names) + more("claim_resource")

    dynamic = (
        api_pb2.DynamicResource(claim_name="gpus", claim_namespace="ml").SerializeToString()
        + _len_field(4, claim_resource("gpu-0", ["cdi/a=0"]))
        + more("claim")
        + _len_field(4, claim_resource("gpu-1", ["cdi/a=1", "cdi/b=1"]))
    )
    container = (
        api_pb2.ContainerResources(
            name="main", devices=[api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-a"])]
        ).SerializeToString()
        + more("container")
        + _len_field(5, dynamic)
    )
    pod_bytes = api_pb2.PodResources(name="train", namespace="ml").SerializeToString() + _len_field(3, container)
    return more("response") + _len_field(1, pod_bytes + more("pod")) + more("response")


HOSTILE_EXPECTED = Listed(
    (ContainerDevices("ml", "train", "main", "nvidia.com/gpu", ("GPU-a",)),),
    (
        ClaimedDevice("ml", "train", "main", ClaimRef("ml", "gpus", DRIVER, POOL, "gpu-0"), ("cdi/a=0",)),
        ClaimedDevice("ml", "train", "main", ClaimRef("ml", "gpus", DRIVER, POOL, "gpu-1"), ("cdi/a=1", "cdi/b=1")),
    ),
)


def _official(payload: bytes) -> Listed:
    """What the official runtime reads from ``payload`` (it must parse, or the test input is wrong)."""
    return official_listing(api_pb2.ListPodResourcesResponse.FromString(payload))


def test_the_hostile_builder_without_extras_is_the_plain_reply() -> None:
    assert _official(_hostile({})) == HOSTILE_EXPECTED
    assert list_reply(_hostile({})) == HOSTILE_EXPECTED


@pytest.mark.parametrize("level", [*LEVELS, "all"])
def test_unknown_fields_of_every_wire_type_at_every_level_are_skipped(level: str) -> None:
    extra = dict.fromkeys(LEVELS, UNKNOWN) if level == "all" else {level: UNKNOWN}
    payload = _hostile(extra)
    assert _official(payload) == HOSTILE_EXPECTED, "the runtime reads the same: the input is valid protobuf"
    assert list_reply(payload) == HOSTILE_EXPECTED


def test_the_removed_class_name_and_newer_fields_are_skipped() -> None:
    """DynamicResource field 1 (``class_name``, removed in Kubernetes 1.31) as an old kubelet sent
    it; ClaimResource field 5 (``share_id``, added in 1.35) as a newer kubelet sends it."""
    payload = _hostile({"claim": _len_field(1, b"gpu.nvidia.com"), "claim_resource": _len_field(5, b"share-7")})
    assert list_reply(payload) == HOSTILE_EXPECTED


def test_a_repeated_singular_string_keeps_the_last_value_as_protobuf_does() -> None:
    payload = _hostile({"claim_resource": _len_field(4, b"gpu-9"), "cdi": _len_field(1, b"cdi/z=9")})
    assert list_reply(payload) == _official(payload)
    assert {c.claim.device for c in list_reply(payload).claimed} == {"gpu-9"}


# --- malformed replies ---------------------------------------------------------------------------


@pytest.mark.parametrize("payload", [_reply().SerializeToString(), _hostile(dict.fromkeys(LEVELS, UNKNOWN))])
def test_every_truncation_gives_a_result_or_a_wire_error(payload: bytes) -> None:
    errors = 0
    for cut in range(len(payload)):
        try:
            result = list_reply(payload[:cut])
        except WireError:
            errors += 1
        else:
            assert isinstance(result, Listed)
    assert errors > len(payload) // 2, "most cuts fall inside a message"
    assert list_reply(payload) == _official(payload)


def test_corrupt_bytes_give_a_result_or_a_wire_error() -> None:
    rng = random.Random(20250901)
    payload = _reply().SerializeToString()
    errors = 0
    for _ in range(3000):
        corrupt = bytearray(payload)
        for _ in range(rng.randint(1, 4)):
            corrupt[rng.randrange(len(corrupt))] = rng.randrange(256)
        try:
            list_reply(memoryview(corrupt))
        except WireError:
            errors += 1
    assert errors > 0


def test_a_claim_string_that_is_not_utf8_is_a_wire_error() -> None:
    bad = _len_field(4, _len_field(2, b"\xff\xfe"))  # a ClaimResource whose driver is not UTF-8
    container = _len_field(1, b"main") + _len_field(5, _len_field(2, b"c") + bad)
    payload = _len_field(1, _len_field(1, b"p") + _len_field(3, container))
    with pytest.raises(WireError):
        list_reply(payload)


# --- through the real gRPC kubelet ---------------------------------------------------------------


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    with FakeKubelet() as k:
        yield k


def test_the_source_sees_claimed_devices_served_by_a_grpc_kubelet(kubelet: FakeKubelet) -> None:
    kubelet.pods = list(_reply().pod_resources)
    assert PodResourcesClient(kubelet.socket_path, timeout_seconds=5).list() == EXPECTED
    source = PodResourcesSource(kubelet.socket_path, timeout_seconds=5, start=False)
    try:
        assert source.refresh(), source.last_error
        view, result, _ = source.latest()
        assert result.success and view is not None
        assert view.devices == EXPECTED.devices and view.claimed == EXPECTED.claimed
        # a claim added later shows at the next refresh
        kubelet.pods = [pod("ml", "late", [("c", [], [("ml", "late-gpu", [(DRIVER, POOL, "gpu-7", [])])])])]
        assert source.refresh()
        view, _, _ = source.latest()
        assert view is not None and view.devices == ()
        assert view.claimed == (ClaimedDevice("ml", "late", "c", ClaimRef("ml", "late-gpu", DRIVER, POOL, "gpu-7")),)
    finally:
        source.close()
