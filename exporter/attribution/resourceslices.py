"""This node's DRA devices from the Kubernetes API: a node-scoped list + watch of ResourceSlices.

A DRA driver publishes its devices in ResourceSlices (``resource.k8s.io/v1``, cluster-scoped);
the kubelet names each device a pod holds through a ResourceClaim by driver, pool and device, and
the slice that publishes it says what it is.  This source keeps, for every device of this node's
slices (``fieldSelector=spec.nodeName=<node>``), the attributes gpulens reads (``SliceDevice``):
``type`` (``gpu``, ``mig`` for NVIDIA's ``gpu.nvidia.com``), ``uuid``, ``parentUUID`` and
``profile`` of a MIG device, and the PCI bus ID (``resource.kubernetes.io/pciBusID``, else the
driver's own ``pciBusID``).  Least privilege: ``resourceslices`` list + watch.

Attribute names are unqualified (the driver's domain implied: ``uuid``) or qualified
(``gpu.nvidia.com/uuid``); a qualified name counts as the driver's own only when its domain is the
slice's driver.  Fields are read from string values only (an ``int``, ``bool`` or ``version``
under one of these names is not what the driver means by it).  The older ``v1beta1`` shape, which
nests a device's attributes under ``basic``, is read too.  When a pool has slices of several
generations (a driver republishing), only the newest generation's devices count; the slices of a
generation are used as they arrive, before the pool's ``resourceSliceCount`` are all there.

The list + watch loop, its backoff and its bounds are ``kube_watch.NodeWatch``'s (every
``ApiBounds`` bound applies); on top of them the devices kept are capped (``MAX_SLICE_DEVICES``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from exporter.attribution import stages
from exporter.attribution.kube_http import ApiResponse, BoundExceeded, KubeClient, Query, load_endpoint
from exporter.attribution.kube_watch import ApiBounds, NodeWatch
from exporter.attribution.slices import SliceDirectory
from exporter.label_values import label_value
from exporter.model import SliceDevice

log = logging.getLogger(__name__)

STAGE = stages.RESOURCE_SLICES
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
"""The standard attribute of a PCI device's bus ID (``0000:18:00.0``)."""

MAX_SLICE_DEVICES = 8192
"""Most devices the source keeps for one node, over all its slices (and all their generations).
A ResourceSlice holds at most 128 devices (64 when they consume counters), so this is 64 full
slices.  A node publishes far fewer: NVIDIA's driver publishes each whole GPU and, with MIG, at
most one device per placement of each profile (a few dozen per GPU when every placement is
published), so 8 GPUs come to about 200 devices; a NIC driver publishing SR-IOV virtual functions
adds up to a few hundred per NIC.  8,192 leaves room for ten times a fully partitioned 8-GPU node
with a thousand virtual functions next to it, and costs at most about 4 MiB (some 460 bytes a
device kept, with its strings; twice that while a new list replaces the table).  A slice that
would take the node past it fails the stage, and the source lists again after its backoff."""
SLICE_PAGE_LIMIT = 4
"""ResourceSlices asked per list page (``limit``).  A GPU as NVIDIA's driver publishes it is
about 600 bytes of JSON, so a node's slices (one to a few, a few KiB each) list in one page.  At
the API's own limits (32 attributes and capacities a device, names of at most 63 + 1 + 32
characters, strings of at most 64) a full slice of 128 devices is about 0.75 MiB, and 4 of them
stay under the 4 MiB page cap (``kube_watch.MAX_LIST_PAGE_BYTES``); 8,192 devices take 16 pages
of the 100 allowed."""
SLICE_BOUNDS = ApiBounds(page_limit=SLICE_PAGE_LIMIT)
"""The bounds a ResourceSlice source has unless given others: the shared defaults, with
``SLICE_PAGE_LIMIT`` slices a page."""


@dataclass(frozen=True)
class PublishedSlice:
    """What the source keeps of one ResourceSlice: its pool, generation and devices."""

    driver: str
    pool: str
    generation: int
    devices: tuple[SliceDevice, ...]


def _text(attributes: Mapping[str, Any], *names: str) -> str | None:
    """The string value of the first of ``names`` that ``attributes`` has (``{"string": ...}``);
    ``None`` if none has one."""
    for name in names:
        value = attributes.get(name)
        if isinstance(value, Mapping):
            text = value.get("string")
            if isinstance(text, str):
                return text
    return None


def device_of(driver: str, pool: str, raw: Mapping[str, Any]) -> SliceDevice | None:
    """The ``SliceDevice`` of one entry of a slice's ``devices``; ``None`` for one without a
    name.  Attributes come from ``attributes`` (``v1``, ``v1beta2``) or ``basic.attributes``
    (``v1beta1``); each field from its unqualified name, else the name qualified with the
    slice's driver (``gpu.nvidia.com/uuid``)."""
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        return None
    name = label_value(name)  # as the kubelet's claimed device name is, so the two still join
    attributes = raw.get("attributes")
    if attributes is None:
        basic = raw.get("basic")
        attributes = basic.get("attributes") if isinstance(basic, Mapping) else None
    if not isinstance(attributes, Mapping) or not attributes:
        return SliceDevice(driver, pool, name)
    prefix = f"{driver}/"

    def own(local: str) -> str | None:
        return _text(attributes, local, prefix + local)

    return SliceDevice(
        driver=driver,
        pool=pool,
        device=name,
        kind=own("type"),
        uuid=own("uuid"),
        parent_uuid=own("parentUUID"),
        profile=own("profile"),
        pci_bus_id=_text(attributes, PCI_BUS_ID) or own("pciBusID"),
    )


def published_slice(obj: Mapping[str, Any]) -> PublishedSlice:
    """What is kept of one ResourceSlice object: driver, pool, generation and its devices (those
    without a name left out)."""
    spec = obj.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    pool = spec.get("pool")
    pool = pool if isinstance(pool, Mapping) else {}
    driver = label_value(str(spec.get("driver") or ""))
    pool_name = label_value(str(pool.get("name") or ""))
    generation = pool.get("generation")
    raw_devices = spec.get("devices")
    devices = (
        tuple(
            d
            for d in (device_of(driver, pool_name, raw) for raw in raw_devices if isinstance(raw, Mapping))
            if d is not None
        )
        if isinstance(raw_devices, list)
        else ()
    )
    return PublishedSlice(
        driver=driver,
        pool=pool_name,
        generation=generation if isinstance(generation, int) and not isinstance(generation, bool) else 0,
        devices=devices,
    )


def newest_devices(slices: Mapping[str, PublishedSlice]) -> list[SliceDevice]:
    """The devices of ``slices`` (by name) that count: those of each pool's newest generation,
    in the order of the slices' names."""
    newest: dict[tuple[str, str], int] = {}
    for s in slices.values():
        key = (s.driver, s.pool)
        newest[key] = max(newest.get(key, s.generation), s.generation)
    devices: list[SliceDevice] = []
    for name in sorted(slices):
        s = slices[name]
        if s.generation == newest[(s.driver, s.pool)]:
            devices.extend(s.devices)
    return devices


@dataclass
class _SliceBatch:
    """What a list collects: the slices by name and how many devices they hold."""

    slices: dict[str, PublishedSlice] = field(default_factory=dict)
    devices: int = 0


class ResourceSliceSource(NodeWatch[SliceDirectory, _SliceBatch]):
    """Keeps this node's ResourceSlices up to date from a list + watch loop in a daemon thread;
    ``latest()`` hands out the devices that count as a ``SliceDirectory``, the same object while
    nothing a device is read from changed (an event that changes only other fields of a slice
    keeps it)."""

    noun: ClassVar[str] = "ResourceSlice"
    stage: ClassVar[str] = STAGE
    thread_name: ClassVar[str] = "gpulens-resourceslices"
    rbac_hint: ClassVar[str] = "RBAC: the service account needs resource.k8s.io resourceslices list+watch"
    log: ClassVar[logging.Logger] = log

    def __init__(
        self,
        api_client_factory: Callable[[], KubeClient],
        node_name: str,
        watch_timeout_seconds: int = 300,
        backoff_initial_seconds: float = 1.0,
        backoff_max_seconds: float = 60.0,
        start: bool = True,
        bounds: ApiBounds | None = None,
        max_devices: int = MAX_SLICE_DEVICES,
    ) -> None:
        super().__init__(
            api_client_factory,
            node_name,
            watch_timeout_seconds,
            backoff_initial_seconds,
            backoff_max_seconds,
            bounds or SLICE_BOUNDS,
        )
        self.max_devices = max_devices
        """Most devices kept over all of the node's slices (``MAX_SLICE_DEVICES``)."""
        self._slices: dict[str, PublishedSlice] = {}
        """The node's slices by name (every generation: an older one counts again if the newer
        ones go)."""
        self._devices = 0
        """Devices held in ``_slices``: what ``max_devices`` bounds."""
        if start:
            self.start()

    @classmethod
    def in_cluster(cls, node_name: str) -> ResourceSliceSource:
        """Service-account credentials in a pod, else the local kubeconfig (for development); the
        configuration is read again after each failure (a configuration error fails the stage)."""
        return cls(lambda: KubeClient(load_endpoint()), node_name)

    def list_resource_slice(self, api: KubeClient, query: Query, read_timeout: float = 30) -> ApiResponse:
        """GET the node's ResourceSlices with ``query`` (a list page, or a watch with ``watch``),
        the body unread.  Named after the API operation it calls, which is what the RBAC role
        must allow (resource.k8s.io ``resourceslices`` ``list`` and ``watch``;
        tests/test_deploy_chart.py checks the requests sent against the role)."""
        selector = {"fieldSelector": f"spec.nodeName={self.node_name}"}
        return api.get(SLICES_PATH, {**selector, **query}, read_timeout=read_timeout)

    def _hint(self, error: str) -> str:
        if error.startswith("HTTP 404"):
            return " (resource.k8s.io/v1 is not served: Kubernetes before 1.34, or the DRA API turned off)"
        return super()._hint(error)

    # --- the table (NodeWatch's hooks) ---------------------------------------------------------

    def _request(self, api: KubeClient, query: Query, read_timeout: float) -> ApiResponse:
        return self.list_resource_slice(api, query, read_timeout)

    def _ours(self, obj: Mapping[str, Any]) -> str | None:
        """The name of a slice of this node, ``None`` for one without a name or of another node
        (which a server honouring the field selector never sends)."""
        meta = obj.get("metadata")
        spec = obj.get("spec")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        node = spec.get("nodeName") if isinstance(spec, Mapping) else None
        return name if isinstance(name, str) and name and node == self.node_name else None

    def _check(self, total: int, name: str) -> None:
        if total > self.max_devices:
            raise BoundExceeded(
                f"the ResourceSlices of node {self.node_name} hold more than the cap of {self.max_devices} devices "
                f"({total} with slice {name!r})"
            )

    def _new_batch(self) -> _SliceBatch:
        return _SliceBatch()

    def _add_to_batch(self, api: KubeClient, batch: _SliceBatch, item: Mapping[str, Any]) -> None:
        name = self._ours(item)
        if name is None:
            return
        published = published_slice(item)
        old = batch.slices.get(name)
        total = batch.devices - (len(old.devices) if old else 0) + len(published.devices)
        self._check(total, name)
        batch.slices[name] = published
        batch.devices = total

    def _install(self, batch: _SliceBatch) -> bool:
        changed = batch.slices != self._slices
        self._slices, self._devices = batch.slices, batch.devices
        return changed

    def _apply(self, api: KubeClient, kind: str, obj: Mapping[str, Any]) -> None:
        name = self._ours(obj)
        if name is None:
            return
        old = self._slices.get(name)
        if kind == "DELETED":
            if old is not None:
                with self._lock:
                    del self._slices[name]
                    self._devices -= len(old.devices)
                    self._version += 1
            return
        published = published_slice(obj)
        if published == old:
            return  # only fields not kept changed: the view stays the same object
        total = self._devices - (len(old.devices) if old else 0) + len(published.devices)
        self._check(total, name)
        with self._lock:
            self._slices[name] = published
            self._devices = total
            self._version += 1

    def _view(self) -> SliceDirectory:
        return SliceDirectory.of(newest_devices(self._slices))

    def _summary(self) -> str:
        return f"{self._devices} devices in {len(self._slices)} ResourceSlices"

    def _size(self) -> int:
        """Devices held over all the node's slices (every generation)."""
        return self._devices
