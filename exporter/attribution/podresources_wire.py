"""Decode the kubelet's PodResources v1 replies from protobuf wire format.

Only the fields attribution uses are read: pod name and namespace, container name, and each
device entry's resource name and device IDs (``List``), and the node's allocatable device IDs
(``GetAllocatableResources``).  Every other field (CPU IDs, memory, topology, dynamic resources,
and fields a newer kubelet adds) is skipped by its wire type, as any protobuf reader skips
unknown fields.  Field numbers are those of ``k8s.io/kubelet/pkg/apis/podresources/v1``
(``_proto/api.proto`` here, from which the test server's stubs are generated).

Lean by design, because a node's ``List`` names every pod on it and most pods hold no device:
the reader walks the buffer by offsets (no slice per field), and a pod is first scanned for a
device entry; a pod without one costs no object that outlives its scan (no string decoded, no
``ContainerDevices``).  Names that repeat from pod to pod (namespace, container, resource) are
decoded once per reply and shared.  A ``deadline`` (``time.monotonic()`` seconds) is checked
every ``DEADLINE_CHECK_PODS`` pods, so a huge reply cannot hold the refresher past its call's
deadline: :class:`DecodeDeadlineError` then.

Malformed input raises :class:`WireError`; it never reads past the buffer or loops.
"""

from __future__ import annotations

import time

from exporter.model import ContainerDevices

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5

DEADLINE_CHECK_PODS = 1024
"""Pods (or allocatable entries) decoded between two looks at the clock: about a millisecond of
work, so the deadline is overrun by at most that."""
SHARED_NAMES = 4096
"""Distinct namespace, container and resource names kept for sharing in one reply; past that,
further names are decoded per use (a hostile reply cannot grow the table)."""

Buffer = bytes | bytearray | memoryview
"""What the decoders read: the reply message as received (``grpc_unary`` hands a memoryview)."""


class WireError(ValueError):
    """The bytes are not a valid protobuf message of the expected shape."""


class DecodeDeadlineError(Exception):
    """Decoding a reply ran past the call's deadline; ``items`` were decoded by then."""

    def __init__(self, items: int) -> None:
        super().__init__(f"decoding ran past the call's deadline after {items} entries")
        self.items = items


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


def _next_field(buf: memoryview, pos: int, end: int) -> tuple[int, int, int]:
    """The field at ``buf[pos]`` of a message ending at ``end``: (field number, start of its value
    if length-delimited else -1, where the field ends and the next one begins)."""
    key = buf[pos]
    if key < 0x80:
        pos += 1
    else:
        key, pos = _varint(buf, pos)
    number, wire = key >> 3, key & 7
    if number == 0:
        raise WireError("field number 0")
    if wire == _LEN:
        if pos >= end:
            raise WireError("truncated length")
        length = buf[pos]
        if length < 0x80:
            pos += 1
        else:
            length, pos = _varint(buf, pos)
        stop = pos + length
        if stop > end:
            raise WireError("length-delimited field runs past the message")
        return number, pos, stop
    if wire == _VARINT:
        _, pos = _varint(buf, pos)
    elif wire in (_I64, _I32):
        pos += 8 if wire == _I64 else 4
    else:
        raise WireError(f"unsupported wire type {wire}")
    if pos > end:
        raise WireError("field runs past the message")
    return number, -1, pos


def _text(buf: memoryview, start: int, end: int) -> str:
    try:
        return str(buf[start:end], "utf-8")
    except UnicodeDecodeError as exc:
        raise WireError(f"string field is not UTF-8: {exc}") from exc


class _Names:
    """Decodes one kind of name that repeats across a reply (namespace, container, resource)
    once, sharing the ``str``; the previous name is compared first (pods come in runs), then a
    table bounded by ``SHARED_NAMES``."""

    def __init__(self, buf: memoryview) -> None:
        self._buf = buf
        self._seen: dict[bytes, str] = {}
        self._last_raw = b""
        self._last = ""

    def get(self, start: int, end: int) -> str:
        """The string at ``buf[start:end]``."""
        view = self._buf[start:end]
        if view == self._last_raw:
            return self._last
        raw = bytes(view)
        text = self._seen.get(raw)
        if text is None:
            text = _text(view, 0, len(view))
            if len(self._seen) < SHARED_NAMES:
                self._seen[raw] = text
        self._last_raw, self._last = raw, text
        return text


class _Shared:
    """A reply's tables of repeating names, one per kind (each kind comes in its own runs)."""

    def __init__(self, buf: memoryview) -> None:
        self.namespaces = _Names(buf)
        self.containers = _Names(buf)
        self.resources = _Names(buf)


def _check(deadline: float | None, items: int) -> None:
    """Raise ``DecodeDeadlineError`` if ``deadline`` passed; looked at every so many items."""
    if deadline is not None and items % DEADLINE_CHECK_PODS == 0 and time.monotonic() > deadline:
        raise DecodeDeadlineError(items)


def _device_entry(buf: memoryview, start: int, end: int, resources: _Names) -> tuple[str, tuple[str, ...]]:
    """ContainerDevices: 1 resource_name, 2 repeated device_ids."""
    resource = ""
    ids: list[str] = []
    pos = start
    while pos < end:
        number, value, pos = _next_field(buf, pos, end)
        if value < 0:
            continue
        if number == 1:
            resource = resources.get(value, pos)
        elif number == 2:
            ids.append(_text(buf, value, pos))
    return resource, tuple(ids)


def _container_entries(buf: memoryview, start: int, end: int) -> tuple[int, int, list[int]] | None:
    """ContainerResources (1 name, 2 repeated ContainerDevices): the name's bounds and the
    device entries' bounds (flattened start, end pairs); ``None`` without a device entry, so a
    container without devices leaves nothing behind."""
    name_start = name_end = 0
    entries: list[int] | None = None
    pos = start
    while pos < end:
        number, value, pos = _next_field(buf, pos, end)
        if number == 1 and value >= 0:
            name_start, name_end = value, pos
        elif number == 2 and value >= 0:
            if entries is None:
                entries = []
            entries += (value, pos)
    return None if entries is None else (name_start, name_end, entries)


def _pod(buf: memoryview, start: int, end: int, shared: _Shared, out: list[ContainerDevices]) -> None:
    """PodResources (1 name, 2 namespace, 3 repeated containers): append one entry per
    (container, device resource); strings are decoded only once a device entry is found."""
    name = namespace = (0, 0)
    found: list[tuple[int, int, list[int]]] | None = None
    pos = start
    while pos < end:
        number, value, pos = _next_field(buf, pos, end)
        if value < 0:
            continue
        if number == 1:
            name = (value, pos)
        elif number == 2:
            namespace = (value, pos)
        elif number == 3:
            container = _container_entries(buf, value, pos)
            if container is not None:
                if found is None:
                    found = []
                found.append(container)
    if found is None:
        return
    pod_name = _text(buf, *name)
    pod_namespace = shared.namespaces.get(*namespace)
    for cstart, cend, entries in found:
        cname = shared.containers.get(cstart, cend)
        for i in range(0, len(entries), 2):
            resource, ids = _device_entry(buf, entries[i], entries[i + 1], shared.resources)
            out.append(ContainerDevices(pod_namespace, pod_name, cname, resource, ids))


def list_reply(payload: Buffer, deadline: float | None = None) -> tuple[ContainerDevices, ...]:
    """ListPodResourcesResponse → one entry per (pod, container, device resource); pods without
    a device entry add nothing.  ``deadline``: see the module docstring."""
    buf = memoryview(payload).cast("B")
    shared = _Shared(buf)
    out: list[ContainerDevices] = []
    pods = 0
    pos, end = 0, len(buf)
    while pos < end:
        number, value, pos = _next_field(buf, pos, end)
        if number == 1 and value >= 0:  # 1: repeated PodResources
            pods += 1
            _check(deadline, pods)
            _pod(buf, value, pos, shared, out)
    return tuple(out)


def allocatable_reply(payload: Buffer, deadline: float | None = None) -> tuple[str, ...]:
    """AllocatableResourcesResponse → every allocatable device ID, all resources."""
    buf = memoryview(payload).cast("B")
    resources = _Names(buf)
    ids: list[str] = []
    entries = 0
    pos, end = 0, len(buf)
    while pos < end:
        number, value, pos = _next_field(buf, pos, end)
        if number == 1 and value >= 0:  # 1: repeated ContainerDevices
            entries += 1
            _check(deadline, entries)
            ids.extend(_device_entry(buf, value, pos, resources)[1])
    return tuple(ids)
