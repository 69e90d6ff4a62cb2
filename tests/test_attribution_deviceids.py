"""Every device-ID shape the device plugins use resolves to the right GPU or MIG instance."""

from __future__ import annotations

import pytest

from exporter.attribution.deviceids import UNMAPPED_REASONS, DeviceIndex, DeviceRef
from exporter.model import BackendSample, GpuSample, LeafSample, MigInstance

G0 = "GPU-0a0a0a0a-1b1b-2c2c-3d3d-4e4e4e4e4e4e"
G1 = "GPU-5f5f5f5f-6a6a-7b7b-8c8c-9d9d9d9d9d9d"
M1 = "MIG-11111111-2222-3333-4444-555555555555"
M2 = "MIG-66666666-7777-8888-9999-000000000000"
M3 = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"

INDEX = DeviceIndex(
    BackendSample(
        up=True,
        gpus=(
            GpuSample(index=0, uuid=G0, leaves=(LeafSample(uuid=G0),)),
            GpuSample(
                index=1,
                uuid=G1,
                leaves=(
                    LeafSample(uuid=G1, mig=MigInstance(M1, 1, 0, "4g.71gb")),
                    LeafSample(uuid=G1, mig=MigInstance(M2, 5, 0, "1g.18gb")),
                    LeafSample(uuid=G1, mig=MigInstance(M3, 5, 1, "1c.1g.18gb")),
                ),
            ),
        ),
    )
)


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        (G0, DeviceRef(G0)),
        (G0 + "::3", DeviceRef(G0, None, "3")),
        (G0.upper().replace("GPU-", "GPU-"), DeviceRef(G0)),
        (G0.removeprefix("GPU-"), DeviceRef(G0)),
        (M1, DeviceRef(G1, M1)),
        (M2 + "::7", DeviceRef(G1, M2, "7")),
        (M2.removeprefix("MIG-"), DeviceRef(G1, M2)),
        (f"MIG-{G1}/5/1", DeviceRef(G1, M3)),
        ("nvidia0", DeviceRef(G0)),
        ("nvidia0/vgpu2", DeviceRef(G0, None, "2")),
        ("nvidia1/gi1", DeviceRef(G1, M1)),
        ("nvidia1/gi5/vgpu0", DeviceRef(G1, M2, "0")),
        ("", "empty_id"),
        ("GPU-12345678-1234-1234-1234-123456789012", "unknown_gpu"),
        ("MIG-12345678-1234-1234-1234-123456789012", "unknown_mig"),
        ("nvidia7", "unknown_gpu"),
        ("nvidia1/gi9", "unknown_mig"),
        (f"MIG-{G1}/9/0", "unknown_mig"),
        ("GPU-xyz", "unknown_shape"),
        ("0000:3b:00.2", "unknown_shape"),
        ("\x00" * 10_000, "unknown_shape"),
    ],
)
def test_device_id_resolves(device_id: str, expected: DeviceRef | str) -> None:
    got = INDEX.resolve(device_id)
    assert got == expected
    if isinstance(got, str):
        assert got in UNMAPPED_REASONS


def test_index_key_changes_when_mig_is_reconfigured() -> None:
    other = DeviceIndex(
        BackendSample(
            up=True, gpus=(GpuSample(index=0, uuid=G0), GpuSample(index=1, uuid=G1, leaves=(LeafSample(uuid=G1),)))
        )
    )
    assert other.key != INDEX.key
    assert other.resolve(M1) == "unknown_mig"
