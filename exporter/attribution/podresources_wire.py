"""Decode the kubelet's PodResources v1 replies from protobuf wire format.

Only the fields attribution uses are read: pod name and namespace, container name, each device
plugin entry's resource name and device IDs, and each DRA claim's devices (``dynamic_resources``:
claim name and namespace, each allocated device's driver, pool, device name and CDI device
names) from ``List``; the node's allocatable device IDs from ``GetAllocatableResources`` (which
names device plugin devices only).  Every other field (CPU IDs, memory, topology, the removed
``class_name`` of a claim, and fields a newer kubelet adds) is skipped by its wire type, as any
protobuf reader skips unknown fields.  Field numbers are those of
``k8s.io/kubelet/pkg/apis/podresources/v1`` (``_proto/api.proto`` here, from which the test
server's stubs are generated).

Lean by design, because a node's ``List`` names every pod on it and most pods hold no device:
the reader walks the buffer by offsets (no slice per field), and a pod is first scanned for a
device entry or a claim with a device; a pod without either costs no object that outlives its
scan (no string decoded, no ``ContainerDevices`` or ``ClaimedDevice``).  Names that repeat from
pod to pod (namespace, container, resource, driver, pool, device) are decoded once per reply and
shared.  A ``deadline`` (``time.monotonic()`` seconds) is checked every ``DEADLINE_CHECK_PODS``
pods, whatever they hold, so a huge reply cannot hold the refresher past its call's deadline:
:class:`DecodeDeadlineError` then.

Bounded by ``max_pods`` (``--kubernetes.max-pods``): a first pass finds the pods that hold
something and keeps only their offsets (two integers each, in one ``array``); only the pods kept
are decoded into objects, so a reply of 50,000 device-holding pods costs the objects of
``max_pods`` pods, not of 50,000.  Past the ceiling the pods kept are the first by
:func:`pod_rank` (pods holding a GPU first, then by namespace and name): the kubelet lists pods in
no stable order, so keeping the first ones listed would change the series at every refresh.  The
rest are counted (``Listed.dropped_pods``).  Every pass is linear in the reply's bytes (the
ranking is ``O(n log max_pods)``).

Malformed input raises :class:`WireError` (a string that is not UTF-8 among it, as protobuf's own
decoder does); it never reads past the buffer or loops.  Names (pod, namespace, container,
resource, claim, driver, pool, device) are label values as ``exporter.label_values.label_value``
makes them: a name over 253 characters is cut with a hash, the same way the API's names are, so
the two still join.
"""

from __future__ import annotations

import heapq
import time
from array import array
from collections.abc import Iterator
from typing import NamedTuple

from exporter.attribution.merge import GPU_RESOURCE_PREFIX
from exporter.label_values import label_value
from exporter.model import ClaimedDevice, ClaimRef, ContainerDevices

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5

DEADLINE_CHECK_PODS = 1024
"""Pods (or allocatable entries) decoded between two looks at the clock: about a millisecond of
work, so the deadline is overrun by at most that."""
SHARED_NAMES = 4096
"""Distinct names of one kind (namespace, container, resource, driver, pool, device) kept for
sharing in one reply; past that, further names are decoded per use (a hostile reply cannot grow
the table)."""

Buffer = bytes | bytearray | memoryview
"""What the decoders read: the reply message as received (``grpc_unary`` hands a memoryview)."""


class Listed(NamedTuple):
    """A decoded ``List`` reply: what containers hold through device plugins and through DRA."""

    devices: tuple[ContainerDevices, ...]
    """One entry per (pod, container, device plugin resource)."""
    claimed: tuple[ClaimedDevice, ...]
    """One entry per (pod, container, claim, allocated device of the claim)."""
    dropped_pods: int = 0
    """Pods holding a device that were left out, past ``max_pods`` (0 under the ceiling)."""


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
    """Decodes one kind of name that repeats across a reply (namespace, container, resource...)
    once, sharing the ``str``; the previous name is compared first (pods come in runs), then a
    table bounded by ``SHARED_NAMES``."""

    def __init__(self, buf: memoryview) -> None:
        self._buf = buf
        self._seen: dict[bytes, str] = {}
        self._last_raw = b""
        self._last = ""

    def get(self, start: int, end: int) -> str:
        """The string at ``buf[start:end]``, as a label value (exporter/label_values.py: a name
        longer than a Kubernetes name is cut, once per distinct name)."""
        view = self._buf[start:end]
        if view == self._last_raw:
            return self._last
        raw = bytes(view)
        text = self._seen.get(raw)
        if text is None:
            text = label_value(_text(view, 0, len(view)))
            if len(self._seen) < SHARED_NAMES:
                self._seen[raw] = text
        self._last_raw, self._last = raw, text
        return text


class _Shared:
    """A reply's tables of repeating names, one per kind (each kind comes in its own runs).  A
    claim's namespace is its pod's in practice, so both share one table (and one ``str``)."""

    def __init__(self, buf: memoryview) -> None:
        self.namespaces = _Names(buf)
        self.containers = _Names(buf)
        self.resources = _Names(buf)
        self.drivers = _Names(buf)
        self.pools = _Names(buf)
        self.devices = _Names(buf)


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


_Claim = tuple[int, int, int, int, list[int]]
"""A scanned DynamicResource: its claim namespace's bounds, its claim name's bounds, and its
ClaimResource entries' bounds (flattened start, end pairs; never empty)."""


def _claim_scan(buf: memoryview, start: int, end: int) -> _Claim | None:
    """DynamicResource (2 claim_name, 3 claim_namespace, 4 repeated ClaimResource; 1 was
    ``class_name``, removed in Kubernetes 1.31, skipped like any unknown field): bounds only;
    ``None`` without a ClaimResource, so such a claim adds nothing."""
    name_start = name_end = namespace_start = namespace_end = 0
    resources: list[int] | None = None
    pos = start
    while pos < end:
        number, value, pos = _next_field(buf, pos, end)
        if value < 0:
            continue
        if number == 2:
            name_start, name_end = value, pos
        elif number == 3:
            namespace_start, namespace_end = value, pos
        elif number == 4:
            if resources is None:
                resources = []
            resources += (value, pos)
    return None if resources is None else (namespace_start, namespace_end, name_start, name_end, resources)


_Container = tuple[int, int, list[int] | None, list[_Claim] | None]
"""A scanned ContainerResources: its name's bounds, its device entries' bounds (flattened start,
end pairs) or ``None``, its claims with a device or ``None``; never both ``None``."""


def _container_scan(buf: memoryview, start: int, end: int) -> _Container | None:
    """ContainerResources (1 name, 2 repeated ContainerDevices, 5 repeated DynamicResource):
    bounds only; ``None`` without a device entry or a claim with a device, so a container holding
    neither leaves nothing behind."""
    name_start = name_end = 0
    entries: list[int] | None = None
    claims: list[_Claim] | None = None
    pos = start
    while pos < end:
        number, value, pos = _next_field(buf, pos, end)
        if value < 0:
            continue
        if number == 1:
            name_start, name_end = value, pos
        elif number == 2:
            if entries is None:
                entries = []
            entries += (value, pos)
        elif number == 5:
            claim = _claim_scan(buf, value, pos)
            if claim is not None:
                if claims is None:
                    claims = []
                claims.append(claim)
    if entries is None and claims is None:
        return None
    return name_start, name_end, entries, claims


def _cdi_name(buf: memoryview, start: int, end: int) -> str:
    """CDIDevice: 1 name (a fully qualified CDI device name, ``vendor.com/class=device``)."""
    name = ""
    pos = start
    while pos < end:
        number, value, pos = _next_field(buf, pos, end)
        if number == 1 and value >= 0:
            name = _text(buf, value, pos)
    return name


def _claim_resource(buf: memoryview, start: int, end: int, shared: _Shared) -> tuple[str, str, str, tuple[str, ...]]:
    """ClaimResource (1 repeated CDIDevice, 2 driver_name, 3 pool_name, 4 device_name): (driver,
    pool, device, CDI device names)."""
    driver = pool = device = ""
    cdi: list[str] = []
    pos = start
    while pos < end:
        number, value, pos = _next_field(buf, pos, end)
        if value < 0:
            continue
        if number == 1:
            cdi.append(_cdi_name(buf, value, pos))
        elif number == 2:
            driver = shared.drivers.get(value, pos)
        elif number == 3:
            pool = shared.pools.get(value, pos)
        elif number == 4:
            device = shared.devices.get(value, pos)
    return driver, pool, device, tuple(cdi)


def _pod(
    buf: memoryview,
    start: int,
    end: int,
    shared: _Shared,
    out: list[ContainerDevices],
    claimed: list[ClaimedDevice],
) -> None:
    """PodResources (1 name, 2 namespace, 3 repeated containers): append one entry to ``out`` per
    (container, device resource) and one to ``claimed`` per (container, claim, claimed device);
    strings are decoded only once the scan found either."""
    name = namespace = (0, 0)
    found: list[_Container] | None = None
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
            container = _container_scan(buf, value, pos)
            if container is not None:
                if found is None:
                    found = []
                found.append(container)
    if found is None:
        return
    pod_name = label_value(_text(buf, *name))
    pod_namespace = shared.namespaces.get(*namespace)
    for cstart, cend, entries, claims in found:
        cname = shared.containers.get(cstart, cend)
        if entries is not None:
            for i in range(0, len(entries), 2):
                resource, ids = _device_entry(buf, entries[i], entries[i + 1], shared.resources)
                out.append(ContainerDevices(pod_namespace, pod_name, cname, resource, ids))
        if claims is None:
            continue
        for ns_start, ns_end, claim_start, claim_end, resources in claims:
            claim_namespace = shared.namespaces.get(ns_start, ns_end)
            claim_name = label_value(_text(buf, claim_start, claim_end))
            for i in range(0, len(resources), 2):
                driver, pool, device, cdi = _claim_resource(buf, resources[i], resources[i + 1], shared)
                ref = ClaimRef(claim_namespace, claim_name, driver, pool, device)
                claimed.append(ClaimedDevice(pod_namespace, pod_name, cname, ref, cdi))


def _holds(buf: memoryview, start: int, end: int) -> bool:
    """Whether the PodResources at ``buf[start:end]`` holds a device entry or a claimed device."""
    pos = start
    while pos < end:
        number, value, pos = _next_field(buf, pos, end)
        if number == 3 and value >= 0 and _container_scan(buf, value, pos) is not None:
            return True
    return False


_GPU_PREFIX = GPU_RESOURCE_PREFIX.encode()


def _holds_gpu(buf: memoryview, start: int, end: int) -> bool:
    """Whether the ContainerResources at ``buf[start:end]`` holds a device of a GPU resource
    (``nvidia.com/…``) or a device through a DRA claim (the kind a GPU driver allocates)."""
    pos = start
    while pos < end:
        number, value, pos = _next_field(buf, pos, end)
        if value < 0:
            continue
        if number == 2:
            entry = value
            while entry < pos:
                field, at, entry = _next_field(buf, entry, pos)
                if field == 1 and at >= 0 and buf[at : at + len(_GPU_PREFIX)] == _GPU_PREFIX:
                    return True
        elif number == 5 and _claim_scan(buf, value, pos) is not None:
            return True
    return False


PodKey = tuple[int, bytes, bytes, int, int]
"""How pods rank for the ceiling: (0 for a pod holding a GPU else 1, namespace, name, and the
pod's start and end in the reply)."""


def pod_rank(buf: memoryview, start: int, end: int) -> PodKey:
    """The key of the PodResources at ``buf[start:end]`` (which holds something): pods holding a
    GPU (a ``nvidia.com/`` device or a claimed device) before pods holding only other devices
    (NICs), then by namespace and name as bytes (UTF-8 bytes sort as their code points), then by
    where the pod is in the reply (a hostile kubelet may list one name twice)."""
    name = namespace = b""
    gpu = False
    pos = start
    while pos < end:
        number, value, pos = _next_field(buf, pos, end)
        if value < 0:
            continue
        if number == 1:
            name = bytes(buf[value:pos])
        elif number == 2:
            namespace = bytes(buf[value:pos])
        elif number == 3 and not gpu:
            gpu = _holds_gpu(buf, value, pos)
    return (0 if gpu else 1, namespace, name, start, end)


def _ranked(buf: memoryview, held: array[int], deadline: float | None) -> Iterator[PodKey]:
    for i in range(0, len(held), 2):
        _check(deadline, i // 2 + 1)
        yield pod_rank(buf, held[i], held[i + 1])


def list_reply(payload: Buffer, deadline: float | None = None, max_pods: int | None = None) -> Listed:
    """ListPodResourcesResponse → device plugin entries, one per (pod, container, resource), and
    claimed devices, one per (pod, container, claim, device); pods holding neither add nothing.
    At most ``max_pods`` pods holding something are decoded (``None``: all), the first by
    ``pod_rank``, in the order the kubelet listed them; ``deadline``: see the module docstring."""
    buf = memoryview(payload).cast("B")
    held = array("q")  # start, end of each pod holding something: 16 bytes a pod, no object
    pods = 0
    pos, end = 0, len(buf)
    while pos < end:
        number, value, pos = _next_field(buf, pos, end)
        if number == 1 and value >= 0:  # 1: repeated PodResources
            pods += 1
            _check(deadline, pods)
            if _holds(buf, value, pos):
                held.append(value)
                held.append(pos)
    dropped = 0
    if max_pods is not None and len(held) // 2 > max_pods:
        kept = heapq.nsmallest(max_pods, _ranked(buf, held, deadline))
        dropped = len(held) // 2 - len(kept)
        held = array("q", (x for key in sorted(kept, key=lambda k: k[3]) for x in key[3:]))
    shared = _Shared(buf)
    out: list[ContainerDevices] = []
    claimed: list[ClaimedDevice] = []
    for i in range(0, len(held), 2):
        _check(deadline, i // 2 + 1)
        _pod(buf, held[i], held[i + 1], shared, out, claimed)
    return Listed(tuple(out), tuple(claimed), dropped)


def allocatable_reply(payload: Buffer, deadline: float | None = None) -> tuple[str, ...]:
    """AllocatableResourcesResponse → every allocatable device ID, all device plugin resources
    (the reply has no DRA devices: a driver publishes those in ResourceSlices)."""
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
