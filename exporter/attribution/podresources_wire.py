"""Decode the kubelet's PodResources v1 replies from protobuf wire format.

Only the fields attribution uses are read: pod name and namespace, container name, and each
device entry's resource name and device IDs (``List``), and the node's allocatable device IDs
(``GetAllocatableResources``).  Every other field (CPU IDs, memory, topology, dynamic resources,
and fields a newer kubelet adds) is skipped by its wire type, as any protobuf reader skips
unknown fields.  Field numbers are those of ``k8s.io/kubelet/pkg/apis/podresources/v1``
(``_proto/api.proto`` here, from which the test server's stubs are generated).

Malformed input raises :class:`WireError`; it never reads past the buffer or loops.
"""

from __future__ import annotations

from collections.abc import Iterator

from exporter.model import ContainerDevices

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


class WireError(ValueError):
    """The bytes are not a valid protobuf message of the expected shape."""


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than 10 bytes")


def _fields(buf: memoryview) -> Iterator[tuple[int, memoryview | None]]:
    """(field number, bytes of a length-delimited field or None for other wire types)."""
    pos = 0
    end = len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if wire == _VARINT:
            _, pos = _varint(buf, pos)
            yield number, None
        elif wire == _LEN:
            length, pos = _varint(buf, pos)
            if pos + length > end:
                raise WireError("length-delimited field runs past the message")
            yield number, buf[pos : pos + length]
            pos += length
        elif wire in (_I64, _I32):
            pos += 8 if wire == _I64 else 4
            if pos > end:
                raise WireError("fixed-width field runs past the message")
            yield number, None
        else:
            raise WireError(f"unsupported wire type {wire}")


def _text(data: memoryview) -> str:
    try:
        return str(data, "utf-8")
    except UnicodeDecodeError as exc:
        raise WireError(f"string field is not UTF-8: {exc}") from exc


def _device_entry(buf: memoryview) -> tuple[str, tuple[str, ...]]:
    """ContainerDevices: 1 resource_name, 2 repeated device_ids."""
    resource = ""
    ids: list[str] = []
    for number, data in _fields(buf):
        if data is None:
            continue
        if number == 1:
            resource = _text(data)
        elif number == 2:
            ids.append(_text(data))
    return resource, tuple(ids)


def list_reply(payload: bytes) -> tuple[ContainerDevices, ...]:
    """ListPodResourcesResponse → one entry per (pod, container, device resource)."""
    out: list[ContainerDevices] = []
    for number, pod in _fields(memoryview(payload)):
        if number != 1 or pod is None:  # 1: repeated PodResources
            continue
        name = namespace = ""
        containers: list[memoryview] = []
        for field, data in _fields(pod):
            if data is None:
                continue
            if field == 1:
                name = _text(data)
            elif field == 2:
                namespace = _text(data)
            elif field == 3:
                containers.append(data)
        for container in containers:
            cname = ""
            entries: list[tuple[str, tuple[str, ...]]] = []
            for field, data in _fields(container):
                if data is None:
                    continue
                if field == 1:
                    cname = _text(data)
                elif field == 2:
                    entries.append(_device_entry(data))
            out.extend(
                ContainerDevices(namespace=namespace, pod=name, container=cname, resource=resource, device_ids=ids)
                for resource, ids in entries
            )
    return tuple(out)


def allocatable_reply(payload: bytes) -> tuple[str, ...]:
    """AllocatableResourcesResponse → every allocatable device ID, all resources."""
    ids: list[str] = []
    for number, data in _fields(memoryview(payload)):
        if number == 1 and data is not None:  # 1: repeated ContainerDevices
            ids.extend(_device_entry(data)[1])
    return tuple(ids)
