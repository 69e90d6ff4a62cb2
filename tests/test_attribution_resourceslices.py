"""This node's DRA devices from its ResourceSlices, through the exporter's own API client
(kube_http) against the loopback API emulator: the list + watch, the attributes read from each
device, a pool's newest generation, the bounds, and a view that stays the same object while
nothing changed."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from exporter.attribution.kube_watch import ApiBounds
from exporter.attribution.resourceslices import (
    MAX_SLICE_DEVICES,
    SLICE_PAGE_LIMIT,
    SLICES_PATH,
    ResourceSliceSource,
    device_of,
    newest_devices,
    published_slice,
)
from exporter.attribution.slices import SliceDirectory
from exporter.model import SliceDevice
from tests.fakes.kube_api_server import KubeApiEmulator, make_pod, make_resource_slice, nvidia_gpu, nvidia_mig
from tests.support.kube import client_factory, wait_for

pytestmark = pytest.mark.integration

NODE = "gpu-node-1"
OTHER = "gpu-node-2"
DRIVER = "gpu.nvidia.com"
G0 = "GPU-00000000-1111-2222-3333-444444444444"
G1 = "GPU-11111111-1111-2222-3333-444444444444"
G2 = "GPU-22222222-1111-2222-3333-444444444444"
M0 = "MIG-00000000-aaaa-bbbb-cccc-dddddddddddd"
KiB = 1024
LOGGER = "exporter.attribution.resourceslices"
SLICE = f"{NODE}-{DRIVER}-{NODE}-1"
"""The name ``make_resource_slice`` gives the node's first slice of NVIDIA's driver."""


@pytest.fixture
def api() -> Iterator[KubeApiEmulator]:
    with KubeApiEmulator() as emulator:
        yield emulator


def watcher(api: KubeApiEmulator, **kw: Any) -> ResourceSliceSource:
    kw.setdefault("backoff_initial_seconds", 0.05)
    kw.setdefault("backoff_max_seconds", 0.2)
    return ResourceSliceSource(client_factory(api.url), NODE, **kw)


@contextmanager
def watching(api: KubeApiEmulator, **kw: Any) -> Iterator[ResourceSliceSource]:
    """``watcher(api, **kw)``, closed after."""
    source = watcher(api, **kw)
    try:
        yield source
    finally:
        source.close()


def parsed(raw: dict[str, Any], driver: str = DRIVER, pool: str = "p") -> SliceDevice:
    """``device_of`` a device entry that has a name."""
    device = device_of(driver, pool, raw)
    assert device is not None
    return device


def gpus(source: ResourceSliceSource) -> dict[str, str | None] | None:
    """Device name -> UUID of what ``latest()`` gives now; ``None`` while the stage fails."""
    directory, _ = source.latest()
    return None if directory is None else {key[2]: d.uuid for key, d in directory.devices.items()}


def node_slice(devices: list[dict[str, Any]], generation: int = 1, **kw: Any) -> dict[str, Any]:
    return make_resource_slice(NODE, DRIVER, NODE, devices, generation=generation, **kw)


# --- list + watch -----------------------------------------------------------------------------------


def test_the_list_is_node_scoped_and_gives_each_device_by_driver_pool_and_name(api: KubeApiEmulator) -> None:
    api.put_slice(node_slice([nvidia_gpu("gpu-0", G0, "0000:18:00.0"), nvidia_gpu("gpu-1", G1, "0000:2a:00.0")]))
    api.put_slice(make_resource_slice(OTHER, DRIVER, OTHER, [nvidia_gpu("gpu-0", G2)]))
    source = watcher(api)
    try:
        assert wait_for(lambda: source.latest()[1].success)
        directory, result = source.latest()
        assert directory is not None and result.stage == "resourceslices"
        assert directory.get(DRIVER, NODE, "gpu-0") == SliceDevice(
            DRIVER, NODE, "gpu-0", kind="gpu", uuid=G0, pci_bus_id="0000:18:00.0"
        )
        assert set(directory.devices) == {(DRIVER, NODE, "gpu-0"), (DRIVER, NODE, "gpu-1")}, "no other node's"
        assert directory.get(DRIVER, OTHER, "gpu-0") is None
        queries = [q for p, q in api.requests if p == SLICES_PATH]
        assert queries and all(q["fieldSelector"] == f"spec.nodeName={NODE}" for q in queries)
        assert queries[0]["limit"] == str(SLICE_PAGE_LIMIT)
        assert [p for p, _ in api.requests] == [SLICES_PATH] * len(api.requests), "nothing but its slices"
    finally:
        source.close()


def test_the_watch_follows_added_modified_and_deleted_devices(api: KubeApiEmulator) -> None:
    api.put_slice(node_slice([nvidia_gpu("gpu-0", G0)]))
    source = watcher(api)
    try:
        assert wait_for(lambda: api.watch_count(SLICES_PATH) == 1)
        assert gpus(source) == {"gpu-0": G0}
        api.put_slice(node_slice([nvidia_gpu("gpu-0", G0), nvidia_gpu("gpu-1", G1)]))
        assert wait_for(lambda: gpus(source) == {"gpu-0": G0, "gpu-1": G1}), "a device added"
        api.put_slice(node_slice([nvidia_gpu("gpu-0", G0), nvidia_gpu("gpu-1", G2)]))
        assert wait_for(lambda: gpus(source) == {"gpu-0": G0, "gpu-1": G2}), "a device modified"
        api.put_slice(node_slice([nvidia_gpu("gpu-1", G2)]))
        assert wait_for(lambda: gpus(source) == {"gpu-1": G2}), "a device removed from its slice"
        mig = node_slice([nvidia_mig("gpu-0-mig-1g18gb-0", M0, G0)], name="mig-slice")
        api.put_slice(mig)
        assert wait_for(lambda: gpus(source) == {"gpu-1": G2, "gpu-0-mig-1g18gb-0": M0}), "a slice added"
        api.delete_slice(SLICE)
        assert wait_for(lambda: gpus(source) == {"gpu-0-mig-1g18gb-0": M0}), "a slice deleted"
        api.put_slice(make_resource_slice(OTHER, DRIVER, OTHER, [nvidia_gpu("gpu-9", G0)]))
        api.put_slice(node_slice([nvidia_gpu("gpu-2", G2)], name="last"))  # in order: the other came first
        assert wait_for(lambda: "gpu-2" in (gpus(source) or {}))
        assert gpus(source) == {"gpu-0-mig-1g18gb-0": M0, "gpu-2": G2}, "another node's events are not seen"
        assert api.list_count(SLICES_PATH) == 1, "one list, then the watch carries every change"
        assert source.lists == 1 and source.watches == 1
    finally:
        source.close()


def test_a_new_pool_generation_replaces_the_old_one(api: KubeApiEmulator) -> None:
    api.put_slice(node_slice([nvidia_gpu("gpu-0", G0), nvidia_gpu("gpu-1", G1)], generation=1, name="old"))
    other_driver = make_resource_slice(NODE, "nic.example.com", NODE, [{"name": "gpu-0"}], generation=1)
    api.put_slice(other_driver)  # the same pool name under another driver: its own generations
    source = watcher(api)
    try:
        assert wait_for(lambda: gpus(source) is not None)
        assert gpus(source) == {"gpu-0": G0, "gpu-1": G1}
        api.put_slice(node_slice([nvidia_gpu("gpu-0", G2)], generation=2, name="new"))
        assert wait_for(lambda: gpus(source) == {"gpu-0": G2}), "only the newest generation counts"
        directory, _ = source.latest()
        assert directory is not None and directory.get("nic.example.com", NODE, "gpu-0") is not None
        api.delete_slice("new")
        assert wait_for(lambda: gpus(source) == {"gpu-0": G0, "gpu-1": G1}), "the older one counts again"
        api.put_slice(node_slice([nvidia_gpu("gpu-0", G2)], generation=3, name="newer"))
        api.delete_slice("old")
        assert wait_for(lambda: gpus(source) == {"gpu-0": G2})
    finally:
        source.close()


def test_a_dropped_watch_resumes_and_an_expired_one_lists_again(api: KubeApiEmulator) -> None:
    api.put_slice(node_slice([nvidia_gpu("gpu-0", G0)]))
    source = watcher(api)
    try:
        assert wait_for(lambda: api.watch_count(SLICES_PATH) == 1)
        rv = api.bookmark()
        assert wait_for(lambda: source.resource_version == str(rv)), "bookmarks move the resume point"
        api.drop_watches()
        assert wait_for(lambda: api.watch_count(SLICES_PATH) == 2)
        resumed = [q for p, q in api.requests if p == SLICES_PATH and q.get("watch") == "true"][-1]
        assert resumed["resourceVersion"] == str(rv) and resumed["allowWatchBookmarks"] == "true"
        assert api.list_count(SLICES_PATH) == 1
        api.expire_watches = True
        api.drop_watches()
        assert wait_for(lambda: api.list_starts(SLICES_PATH) >= 2), "410 Gone: list again"
        api.expire_watches = False
        api.put_slice(node_slice([nvidia_gpu("gpu-1", G1)], name="second"))
        assert wait_for(lambda: gpus(source) == {"gpu-0": G0, "gpu-1": G1})
        assert source.last_error is None
    finally:
        source.close()


def fence(api: KubeApiEmulator, source: ResourceSliceSource) -> None:
    """Wait until the source applied every event sent so far: a bookmark after them has been read
    (events are read in order, each applied before the next line is)."""
    rv = api.bookmark()
    assert wait_for(lambda: source.resource_version == str(rv))


def test_latest_is_the_same_object_while_nothing_a_device_is_read_from_changed(api: KubeApiEmulator) -> None:
    api.put_slice(node_slice([nvidia_gpu("gpu-0", G0)]))
    source = watcher(api)
    try:
        assert wait_for(lambda: api.watch_count(SLICES_PATH) == 1)
        first, _ = source.latest()
        assert first is not None and source.latest()[0] is first
        fence(api, source)
        assert source.latest()[0] is first, "a bookmark changes nothing"
        api.put_slice(node_slice([nvidia_gpu("gpu-0", G0)], generation=2, name="next"))
        assert wait_for(lambda: source.latest()[0] is not first), "a new pool generation is a change"
        changed, _ = source.latest()
        assert changed is not None and source.latest()[0] is changed
        api.expire_watches = True
        api.drop_watches()
        assert wait_for(lambda: api.list_starts(SLICES_PATH) >= 2)
        api.expire_watches = False
        assert wait_for(lambda: source.lists >= 2)
        assert source.latest()[0] is changed, "a list that found the same slices keeps the view"
    finally:
        source.close()


def test_an_event_that_changes_no_device_keeps_the_view(api: KubeApiEmulator) -> None:
    api.put_slice(node_slice([nvidia_gpu("gpu-0", G0)]))
    source = watcher(api)
    try:
        assert wait_for(lambda: api.watch_count(SLICES_PATH) == 1)
        first, _ = source.latest()
        touched = node_slice([nvidia_gpu("gpu-0", G0)])
        touched["metadata"]["annotations"] = {"example.com/note": "x"}
        touched["spec"]["devices"][0]["attributes"]["productName"] = {"string": "NVIDIA H200 NVL"}
        stored = api.put_slice(touched)  # MODIFIED: a new resource version, an annotation, an attribute not kept
        assert stored["metadata"]["generation"] == 2, "the emulator moved the object's generation"
        fence(api, source)
        assert source.latest()[0] is first
        api.put_slice(node_slice([nvidia_gpu("gpu-0", G1)]))
        fence(api, source)
        assert gpus(source) == {"gpu-0": G1}, "a kept attribute is a change"
    finally:
        source.close()


def test_list_now_lists_on_the_calling_thread(api: KubeApiEmulator) -> None:
    api.put_slice(node_slice([nvidia_gpu(f"gpu-{i}", f"GPU-{i}") for i in range(8)]))
    api.put_slice(node_slice([nvidia_mig("gpu-0-mig-0", M0, "GPU-0")], name="mig"))
    source = ResourceSliceSource(client_factory(api.url), NODE, start=False)
    try:
        assert source.list_now() == 9
        directory, result = source.latest()
        assert result.success and isinstance(directory, SliceDirectory) and len(directory.devices) == 9
        assert api.watch_count() == 0 and source.lists == 1
    finally:
        source.close()


# --- failures ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "hint"),
    [
        (403, "resource.k8s.io resourceslices list+watch"),
        (404, "resource.k8s.io/v1 is not served"),
        (500, ""),
    ],
)
def test_api_errors_fail_the_stage_with_one_line_then_recover(
    api: KubeApiEmulator, status: int, hint: str, caplog: pytest.LogCaptureFixture
) -> None:
    api.put_slice(node_slice([nvidia_gpu("gpu-0", G0)]))
    api.fail_status, api.fail_path = status, SLICES_PATH
    with caplog.at_level(logging.INFO, logger=LOGGER):
        source = watcher(api)
        try:
            assert wait_for(lambda: api.list_count(SLICES_PATH) >= 3), "retries with backoff"
            directory, result = source.latest()
            assert directory is None and not result.success and result.stage == "resourceslices"
            warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == LOGGER]
            assert len(warnings) == 1, "one log line per condition, not one per retry"
            assert warnings[0].startswith(f"Kubernetes API ResourceSlice watch failed: HTTP {status}")
            assert hint in warnings[0] and ("RBAC" in warnings[0]) == (status == 403)
            api.fail_status = None
            assert wait_for(lambda: gpus(source) == {"gpu-0": G0})
            # told just after the table is in place: wait for the line, not only for the table
            assert wait_for(lambda: any(r.levelno == logging.INFO and r.name == LOGGER for r in caplog.records))
            infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and r.name == LOGGER]
            assert infos == [f"Kubernetes API ResourceSlice watch recovered (1 devices in 1 ResourceSlices on {NODE})"]
        finally:
            source.close()


def test_too_many_devices_fail_the_stage_and_the_source_recovers(api: KubeApiEmulator) -> None:
    api.put_slice(node_slice([nvidia_gpu(f"gpu-{i}", f"GPU-{i}") for i in range(3)], name="a"))
    source = watcher(api, max_devices=4)
    try:
        assert wait_for(lambda: api.watch_count(SLICES_PATH) == 1)
        assert gpus(source) == {f"gpu-{i}": f"GPU-{i}" for i in range(3)}
        api.put_slice(node_slice([nvidia_mig(f"gpu-0-mig-{i}", f"MIG-{i}", "GPU-0") for i in range(2)], name="b"))
        assert wait_for(lambda: "cap of 4 devices" in (source.last_error or "")), source.last_error
        assert source.last_error == (
            f"BoundExceeded: the ResourceSlices of node {NODE} hold more than the cap of 4 devices (5 with slice 'b')"
        )
        directory, result = source.latest()
        assert directory is None and not result.success
        assert wait_for(lambda: api.list_starts(SLICES_PATH) >= 3), "the list fails too while the node is over"
        assert source.latest()[0] is None
        api.put_slice(node_slice([nvidia_mig("gpu-0-mig-0", "MIG-0", "GPU-0")], name="b"))
        assert wait_for(lambda: gpus(source) is not None), "recovers once the node is under the cap"
        assert gpus(source) == {"gpu-0": "GPU-0", "gpu-1": "GPU-1", "gpu-2": "GPU-2", "gpu-0-mig-0": "MIG-0"}
        assert source.last_error is None
    finally:
        source.close()


def test_the_device_cap_is_a_few_thousand() -> None:
    assert MAX_SLICE_DEVICES == 8192
    source = ResourceSliceSource(client_factory("http://127.0.0.1:1"), NODE, start=False)
    assert source.max_devices == MAX_SLICE_DEVICES
    assert source.bounds == ApiBounds(page_limit=SLICE_PAGE_LIMIT), "every shared bound, fewer slices a page"


def test_an_oversized_event_line_fails_the_stage_and_the_source_recovers(
    api: KubeApiEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    api.put_slice(node_slice([nvidia_gpu("gpu-0", G0)]))
    many = [nvidia_gpu(f"gpu-{i}", f"GPU-{i:036d}", f"0000:{i:02x}:00.0") for i in range(128)]
    assert len(json.dumps(node_slice(many))) > 64 * KiB
    bounds = ApiBounds(max_event_bytes=32 * KiB, max_page_bytes=64 * KiB)
    with (
        caplog.at_level(logging.WARNING, logger=LOGGER),
        watching(api, bounds=bounds) as source,
    ):

        def told() -> list[str]:
            """This source's warnings: one line per condition."""
            return [r.getMessage() for r in caplog.records if r.name == LOGGER]

        assert wait_for(lambda: api.watch_count(SLICES_PATH) == 1)
        api.put_slice(node_slice(many))  # one event past the event cap, and a list page past the page cap
        assert wait_for(lambda: len(told()) >= 2)
        assert source.latest()[0] is None
        first, then = told()[:2]
        assert "BoundExceeded: watch event line longer than the cap of 32768 bytes" in first, first
        assert "BoundExceeded: ResourceSlice list page" in then and "exceeds the cap of 65536 bytes" in then, then
        api.put_slice(node_slice(many[:10]))
        assert wait_for(lambda: gpus(source) is not None), "recovers once the slice is smaller"
        assert len(gpus(source) or {}) == 10


def test_an_endless_event_line_and_an_endless_list_are_refused(api: KubeApiEmulator) -> None:
    api.put_slice(node_slice([nvidia_gpu("gpu-0", G0)]))
    api.hostile = "endless-line"
    api.endless_line_bytes = 4 * 1024 * KiB
    with watching(api, bounds=ApiBounds(max_event_bytes=256 * KiB)) as source:
        assert wait_for(lambda: "cap of 262144 bytes" in (source.last_error or "")), source.last_error
        assert not source.latest()[1].success
    api.hostile = "huge-list"
    api.huge_list_bytes = 40_000_000
    with watching(api) as source:
        assert wait_for(lambda: source.last_error is not None)
        error = source.last_error or ""
        assert "ResourceSlice list page of" in error and "(Content-Length) exceeds the cap of 4194304" in error, error


def test_a_list_that_pages_on_and_on_is_refused(api: KubeApiEmulator) -> None:
    for i in range(3):
        api.put_slice(node_slice([nvidia_gpu("gpu-0", G0)], name=f"s{i}"))
    with watching(api, bounds=ApiBounds(page_limit=1, max_pages=2)) as source:
        assert wait_for(lambda: "the ResourceSlice list runs past 2 pages of 1" in (source.last_error or ""))
        assert not source.latest()[1].success
    with watching(api, bounds=ApiBounds(page_limit=1, max_pages=3)) as source:
        assert wait_for(lambda: gpus(source) is not None), "three pages of one are allowed"
        pages = [q for p, q in api.requests if p == SLICES_PATH and q.get("watch") != "true"][-3:]
        assert [bool(q.get("continue")) for q in pages] == [False, True, True]


def test_a_trickled_event_line_fails_the_stage_while_it_is_arriving(api: KubeApiEmulator) -> None:
    api.put_slice(node_slice([nvidia_gpu("gpu-0", G0)]))
    api.hostile = "trickle-line"
    api.trickle_interval = 60.0
    with watching(api, bounds=ApiBounds(line_stall_seconds=0.5)) as source:
        assert wait_for(lambda: api.watch_bytes_sent > 0)
        assert wait_for(lambda: not source.latest()[1].success)
        assert source.latest()[0] is None


def test_close_stops_the_watch_thread_promptly(api: KubeApiEmulator) -> None:
    source = watcher(api, watch_timeout_seconds=300)
    assert wait_for(lambda: api.watch_count(SLICES_PATH) == 1)
    thread = source._thread
    assert thread is not None and thread.name == "gpulens-resourceslices"
    start = time.monotonic()
    source.close()
    # a hang check, not a performance figure: the open watch would otherwise block for 300 s
    assert time.monotonic() - start < 4.0
    assert not thread.is_alive()
    source.close()  # idempotent


# --- attributes -------------------------------------------------------------------------------------


def test_unqualified_and_driver_qualified_names_are_the_drivers_own() -> None:
    raw = {
        "name": "gpu-3",
        "attributes": {
            "gpu.nvidia.com/type": {"string": "gpu"},
            "uuid": {"string": G0},
            "gpu.nvidia.com/productName": {"string": "NVIDIA H200"},
            "driverVersion": {"version": "570.124.6"},
            "pciBusID": {"string": "0000:99:00.0"},
        },
    }
    assert parsed(raw) == SliceDevice(DRIVER, "p", "gpu-3", "gpu", G0, pci_bus_id="0000:99:00.0")


def test_a_name_qualified_with_another_domain_is_not_the_drivers() -> None:
    raw = {
        "name": "d",
        "attributes": {
            "other.example.com/uuid": {"string": G1},
            "other.example.com/type": {"string": "gpu"},
            "other.example.com/pciBusID": {"string": "0000:01:00.0"},
            "gpu.nvidia.com.evil/profile": {"string": "7g.141gb"},
        },
    }
    assert parsed(raw) == SliceDevice(DRIVER, "p", "d")


def test_the_standard_pci_bus_id_wins_over_the_drivers_own() -> None:
    attributes = {
        "resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"},
        "gpu.nvidia.com/pciBusID": {"string": "0000:ff:00.0"},
    }
    assert parsed({"name": "d", "attributes": attributes}).pci_bus_id == "0000:18:00.0"
    del attributes["resource.kubernetes.io/pciBusID"]
    assert parsed({"name": "d", "attributes": attributes}).pci_bus_id == "0000:ff:00.0"
    assert parsed({"name": "d", "attributes": attributes}, driver="other.example.com").pci_bus_id is None


@pytest.mark.parametrize("value", [{"int": 7}, {"bool": True}, {"version": "1.0.0"}, {}, "GPU-x", None])
def test_fields_are_read_from_string_values_only(value: Any) -> None:
    raw = {"name": "d", "attributes": {"uuid": value, "type": {"string": "gpu"}}}
    assert parsed(raw) == SliceDevice(DRIVER, "p", "d", kind="gpu")


def test_a_mig_device_names_its_gpu_and_profile() -> None:
    device = parsed(nvidia_mig("gpu-0-mig-1g18gb-0", M0, G0, "1g.18gb"), pool=NODE)
    assert device == SliceDevice(DRIVER, NODE, "gpu-0-mig-1g18gb-0", "mig", M0, parent_uuid=G0, profile="1g.18gb")


def test_the_v1beta1_shape_nests_attributes_under_basic() -> None:
    gpu = nvidia_gpu("gpu-0", G0, "0000:18:00.0")
    beta = {"name": "gpu-0", "basic": {"attributes": gpu["attributes"], "capacity": gpu["capacity"]}}
    assert device_of(DRIVER, NODE, beta) == device_of(DRIVER, NODE, gpu)
    assert device_of(DRIVER, NODE, beta) == SliceDevice(DRIVER, NODE, "gpu-0", "gpu", G0, pci_bus_id="0000:18:00.0")


def test_missing_attributes_leave_fields_empty_and_nameless_devices_out() -> None:
    devices: list[Any] = [{"name": "bare"}, {"name": "empty", "attributes": {}}, {"attributes": {"uuid": G0}}, "junk"]
    published = published_slice(make_resource_slice(NODE, DRIVER, NODE, devices))
    assert published.devices == (SliceDevice(DRIVER, NODE, "bare"), SliceDevice(DRIVER, NODE, "empty"))
    assert (published.driver, published.pool, published.generation) == (DRIVER, NODE, 1)
    counters_only = {
        "metadata": {"name": "c"},
        "spec": {"driver": DRIVER, "pool": {"name": NODE}, "sharedCounters": []},
    }
    assert published_slice(counters_only).devices == () and published_slice(counters_only).generation == 0


def test_only_each_pools_newest_generation_counts_in_slice_name_order() -> None:
    def slice_of(driver: str, pool: str, generation: int, *names: str) -> Any:
        return published_slice(make_resource_slice(NODE, driver, pool, [{"name": n} for n in names], generation))

    slices = {
        "b-new": slice_of(DRIVER, "p", 2, "x"),
        "a-new": slice_of(DRIVER, "p", 2, "w"),
        "c-old": slice_of(DRIVER, "p", 1, "y", "z"),
        "d-other-pool": slice_of(DRIVER, "q", 1, "y"),
        "e-other-driver": slice_of("nic.example.com", "p", 1, "y"),
    }
    assert [(d.driver, d.pool, d.device) for d in newest_devices(slices)] == [
        (DRIVER, "p", "w"),
        (DRIVER, "p", "x"),
        (DRIVER, "q", "y"),
        ("nic.example.com", "p", "y"),
    ]


# --- the emulator -----------------------------------------------------------------------------------


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        body: dict[str, Any] = json.load(resp)
        return body


def test_the_emulator_selects_slices_by_node_and_driver_and_refuses_other_fields(api: KubeApiEmulator) -> None:
    api.put_slice(node_slice([nvidia_gpu("gpu-0", G0)]))
    api.put_slice(make_resource_slice(NODE, "nic.example.com", NODE, [{"name": "vf-0"}]))
    api.put_slice(make_resource_slice(OTHER, DRIVER, OTHER, [nvidia_gpu("gpu-0", G1)]))

    def names(selector: str) -> list[str]:
        query = urllib.parse.urlencode({"fieldSelector": selector})
        return [s["metadata"]["name"] for s in _get(f"{api.url}{SLICES_PATH}?{query}")["items"]]

    assert len(names("")) == 3
    assert names(f"spec.nodeName={NODE},spec.driver={DRIVER}") == [f"{NODE}-{DRIVER}-{NODE}-1"]
    assert names(f"spec.nodeName=={NODE},spec.driver!={DRIVER}") == [f"{NODE}-nic.example.com-{NODE}-1"]
    with pytest.raises(urllib.error.HTTPError) as refused:
        _get(f"{api.url}{SLICES_PATH}?fieldSelector=spec.pool.name%3Dx")
    assert refused.value.code == 400 and "field label not supported: spec.pool.name" in refused.value.read().decode()
    one = _get(f"{api.url}{SLICES_PATH}/{NODE}-{DRIVER}-{NODE}-1")
    assert one["kind"] == "ResourceSlice" and one["spec"]["devices"][0]["name"] == "gpu-0"
    resources = _get(f"{api.url}/apis/resource.k8s.io/v1")["resources"]
    assert {"name": "resourceslices", "singularName": "resourceslice", "namespaced": False}.items() <= next(
        r for r in resources if r["name"] == "resourceslices"
    ).items()
    assert "resourceslices/status" not in {r["name"] for r in resources}


def test_the_official_client_lists_and_watches_the_emulators_slices(api: KubeApiEmulator) -> None:
    """The emulator answers what the official client expects of ResourceSlices (its models, its
    paging fields, its watch decoder), so the source is tested against a faithful API server."""
    pytest.importorskip("kubernetes", reason="a test dependency (the dev extra)")
    from kubernetes import client, watch

    api.put_slice(node_slice([nvidia_gpu("gpu-0", G0, "0000:18:00.0")], name="a"))
    api.put_slice(node_slice([nvidia_mig("gpu-0-mig-0", M0, G0)], name="b"))
    api.put_slice(make_resource_slice(OTHER, DRIVER, OTHER, [nvidia_gpu("gpu-0", G1)], name="c"))
    cfg = client.Configuration()
    cfg.host = api.url
    cfg.retries = False
    selector = f"spec.nodeName={NODE}"
    with client.ApiClient(cfg) as api_client:
        resource = client.ResourceV1Api(api_client)
        first = resource.list_resource_slice(field_selector=selector, limit=1)
        assert isinstance(first, client.V1ResourceSliceList) and first.metadata is not None
        [a] = [s.to_dict() for s in first.items]  # the models, as the client decoded them
        assert (a["spec"]["driver"], a["spec"]["pool"]["generation"], a["spec"]["node_name"]) == (DRIVER, 1, NODE)
        attributes = a["spec"]["devices"][0]["attributes"]
        assert attributes["uuid"]["string"] == G0
        assert attributes["resource.kubernetes.io/pciBusID"]["string"] == "0000:18:00.0"
        assert attributes["driverVersion"]["version"] == "570.124.6" and attributes["index"]["int"] == 0
        token = first.metadata._continue
        assert token, "a limited list names its next page"
        rest = resource.list_resource_slice(field_selector=selector, limit=1, _continue=token)
        assert rest.metadata is not None and rest.metadata._continue is None
        [b] = [s.to_dict() for s in rest.items]
        assert b["metadata"]["name"] == "b" and b["spec"]["devices"][0]["attributes"]["parentUUID"]["string"] == G0

        api.put_slice(node_slice([nvidia_mig("gpu-0-mig-1", M0, G0)], name="b"))
        api.delete_slice("a")
        api.put_slice(make_resource_slice(OTHER, DRIVER, OTHER, [nvidia_gpu("gpu-1", G1)], name="c"))
        mark = api.bookmark()
        seen: list[tuple[str, str | None]] = []
        stream = watch.Watch()
        for event in stream.stream(
            resource.list_resource_slice,
            field_selector=selector,
            resource_version=first.metadata.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=10,
        ):
            if event["type"] == "BOOKMARK":
                seen.append(("BOOKMARK", None))
                stream.stop()
            else:
                obj = event["object"]
                assert isinstance(obj, client.V1ResourceSlice) and obj.metadata is not None
                seen.append((event["type"], obj.metadata.name))
        assert seen == [("MODIFIED", "b"), ("DELETED", "a"), ("BOOKMARK", None)]
        assert stream.resource_version == str(mark)
        c = resource.read_resource_slice("c")
        assert isinstance(c, client.V1ResourceSlice) and c.to_dict()["spec"]["devices"][0]["name"] == "gpu-1"


def test_pods_and_slices_share_one_resource_version_and_keep_their_own_events(api: KubeApiEmulator) -> None:
    api.put(make_pod("a"))
    stored = api.put_slice(node_slice([nvidia_gpu("gpu-0", G0)]))
    assert stored["metadata"]["resourceVersion"] == "102"
    assert [k for _, k, _ in api.events] == ["ADDED"] and [k for _, k, _ in api.slice_events] == ["ADDED"]
    pods = _get(f"{api.url}/api/v1/pods")
    assert [p["metadata"]["name"] for p in pods["items"]] == ["a"] and pods["metadata"]["resourceVersion"] == "102"
    url = f"{api.url}{SLICES_PATH}?watch=true&resourceVersion=100&timeoutSeconds=1"
    with urllib.request.urlopen(url, timeout=10) as resp:
        events = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
    assert [(e["type"], e["object"]["kind"]) for e in events] == [("ADDED", "ResourceSlice")]
