"""Pod metadata through the exporter's own API client (kube_http) against a loopback API emulator."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.attribution import kube_http, kubeapi
from exporter.attribution.kubeapi import KubePodSource, owner_of
from exporter.attribution.pipeline import PipelineAttributor
from exporter.attribution.podresources import PodResourcesSource
from exporter.model import BackendSample, GpuSample, LeafSample
from tests.fakes.kube_api_server import KubeApiEmulator, make_pod
from tests.fakes.kubelet_server import FakeKubelet, pod
from tests.support.kube import client_factory, wait_for

pytestmark = pytest.mark.integration

NODE = "gpu-node-1"
U0 = "GPU-00000000-1111-2222-3333-444444444444"


@pytest.fixture
def api() -> Iterator[KubeApiEmulator]:
    with KubeApiEmulator() as emulator:
        yield emulator


def watcher(api: KubeApiEmulator, **kw: Any) -> KubePodSource:
    kw.setdefault("backoff_initial_seconds", 0.05)
    kw.setdefault("backoff_max_seconds", 0.2)
    return KubePodSource(client_factory(api.url), NODE, **kw)


def names(source: KubePodSource) -> dict[str, str | None]:
    directory, _ = source.latest()
    assert directory is not None
    return {p.name: p.phase for p in directory.by_uid.values()}


def test_list_is_node_scoped_and_resolves_owner_workloads(api: KubeApiEmulator) -> None:
    api.put(
        make_pod("web-7d9f8-abcde", "shop", owner=("ReplicaSet", "web-7d9f8"), labels={"pod-template-hash": "7d9f8"})
    )
    api.put(make_pod("db-0", "shop", owner=("StatefulSet", "db")))
    api.put(make_pod("dcgm-x", "monitoring", owner=("DaemonSet", "dcgm")))
    api.put(make_pod("nightly-29000000-q", "batch", owner=("Job", "nightly-29000000")))
    api.put(make_pod("adhoc-q", "batch", owner=("Job", "adhoc")))
    api.put(make_pod("bare", "dev"))
    api.put(make_pod("elsewhere", "shop", node="cpu-node-9"))
    api.add_job("batch", "nightly-29000000", cronjob="nightly")
    api.add_job("batch", "adhoc", cronjob=None)
    source = watcher(api)
    try:
        assert wait_for(lambda: source.latest()[1].success)
        directory, result = source.latest()
        assert directory is not None and result.stage == "kube_api"
        owners = {p.name: (p.workload_kind, p.workload) for p in directory.by_uid.values()}
        assert owners == {
            "web-7d9f8-abcde": ("Deployment", "web"),
            "db-0": ("StatefulSet", "db"),
            "dcgm-x": ("DaemonSet", "dcgm"),
            "nightly-29000000-q": ("CronJob", "nightly"),
            "adhoc-q": ("Job", "adhoc"),
            "bare": (None, None),
        }, "pods of other nodes are not listed"
        pod_queries = [q for p, q in api.requests if p == "/api/v1/pods"]
        assert pod_queries and all(q["fieldSelector"] == f"spec.nodeName={NODE}" for q in pod_queries)
    finally:
        source.close()


def test_replicaset_not_named_by_a_deployment_stays_a_replicaset() -> None:
    raw = make_pod("p", owner=("ReplicaSet", "handmade"), labels={"pod-template-hash": "abc12"})
    assert owner_of(raw) == ("ReplicaSet", "handmade")


def test_without_rbac_for_jobs_the_job_itself_is_the_workload(api: KubeApiEmulator) -> None:
    api.jobs_forbidden = True
    api.put(make_pod("nightly-1-q", "batch", owner=("Job", "nightly-1")))
    api.put(make_pod("nightly-2-q", "batch", owner=("Job", "nightly-2")))
    source = watcher(api)
    try:
        assert wait_for(lambda: source.latest()[1].success)
        directory, _ = source.latest()
        assert directory is not None
        assert {(p.workload_kind, p.workload) for p in directory.by_uid.values()} == {
            ("Job", "nightly-1"),
            ("Job", "nightly-2"),
        }
        job_gets = [p for p, _ in api.requests if "/jobs/" in p]
        assert len(job_gets) == 1, "a 403 is remembered for its namespace and resource (a minute)"
        assert source.owners is not None and source.owners.stats()["forbidden"] == 2
    finally:
        source.close()


def test_watch_follows_adds_phase_changes_and_deletes(api: KubeApiEmulator) -> None:
    api.put(make_pod("a", containers={"main": "c" * 64}))
    source = watcher(api)
    try:
        assert wait_for(lambda: source.latest()[1].success)
        assert wait_for(lambda: api.watch_count() >= 1)
        api.put(make_pod("b"))
        assert wait_for(lambda: names(source) == {"a": "Running", "b": "Running"})
        api.put(make_pod("b", phase="Succeeded"))
        assert wait_for(lambda: names(source) == {"a": "Running", "b": "Succeeded"})
        api.delete("uid-default-a")
        assert wait_for(lambda: names(source) == {"b": "Succeeded"})
        api.put(make_pod("moved", node="other-node"))
        api.put(make_pod("c"))  # events arrive in order: once c is here, "moved" was seen
        assert wait_for(lambda: "c" in names(source))
        assert names(source) == {"b": "Succeeded", "c": "Running"}, "watch events of other nodes are filtered"
        assert api.list_count() == 1, "one list, then the watch carries every change"
        directory, _ = source.latest()
        assert directory is not None
    finally:
        source.close()


def test_an_update_that_changes_nothing_the_table_holds_keeps_the_view(api: KubeApiEmulator) -> None:
    """A restart, a probe or a condition is a MODIFIED event, but the table holds none of it: the
    view stays the same object (the sampler caches the attribution on it), until a field it holds
    changes."""
    api.put(make_pod("a", containers={"main": "c" * 64}))
    source = watcher(api)
    try:
        assert wait_for(lambda: source.latest()[1].success)
        assert wait_for(lambda: api.watch_count() >= 1)
        before, _ = source.latest()
        restarted = make_pod("a", containers={"main": "c" * 64})
        restarted["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
        api.put(restarted)
        rv = str(api.rv)
        assert wait_for(lambda: source.resource_version == rv)
        assert source.latest()[0] is before
        api.put(make_pod("a", phase="Failed", containers={"main": "c" * 64}))
        assert wait_for(lambda: names(source) == {"a": "Failed"})
        assert source.latest()[0] is not before
    finally:
        source.close()


def test_container_ids_from_status_map_to_container_names(api: KubeApiEmulator) -> None:
    api.put(make_pod("a", containers={"trainer": "ab" * 32, "sidecar": "cd" * 32}))
    source = watcher(api)
    try:
        assert wait_for(lambda: source.latest()[1].success)
        directory, _ = source.latest()
        assert directory is not None
        assert dict(directory.by_name[("default", "a")].containers) == {"ab" * 32: "trainer", "cd" * 32: "sidecar"}
    finally:
        source.close()


def test_dropped_watch_is_resumed_from_its_resource_version(api: KubeApiEmulator) -> None:
    api.put(make_pod("a"))
    source = watcher(api)
    try:
        assert wait_for(lambda: api.watch_count() == 1)
        api.drop_watches()
        assert wait_for(lambda: api.watch_count() == 2), "reconnects after the stream is cut"
        api.put(make_pod("b"))
        assert wait_for(lambda: set(names(source)) == {"a", "b"})
        assert api.list_count() == 1, "resumed from the last resource version, no re-list"
        resumed = [q for _, q in api.requests if q.get("watch") == "true"][-1]
        assert int(resumed["resourceVersion"]) >= 101
        assert source.latest()[1].success
    finally:
        source.close()


def test_bookmarks_move_the_resume_point_without_touching_pods(api: KubeApiEmulator) -> None:
    api.put(make_pod("a"))
    source = watcher(api)
    try:
        assert wait_for(lambda: api.watch_count() == 1)
        for _ in range(3):
            rv = api.bookmark()
        assert wait_for(lambda: source.resource_version == str(rv))
        assert names(source) == {"a": "Running"}
        api.drop_watches()
        assert wait_for(lambda: api.watch_count() == 2)
        resumed = [q for _, q in api.requests if q.get("watch") == "true"][-1]
        assert resumed["resourceVersion"] == str(rv)
        assert resumed["allowWatchBookmarks"] == "true"
    finally:
        source.close()


def test_expired_watch_relists(api: KubeApiEmulator) -> None:
    api.put(make_pod("a"))
    api.expire_watches = True
    source = watcher(api)
    try:
        assert wait_for(lambda: api.list_count() >= 3), "410 Gone -> list again"
        assert source.latest()[1].success, "an expired watch is routine, not a failure"
        api.expire_watches = False
        api.put(make_pod("b"))
        assert wait_for(lambda: set(names(source)) == {"a", "b"})
    finally:
        source.close()


@pytest.mark.parametrize("status", [500, 403])
def test_api_errors_fail_the_stage_then_recover_without_restart(
    api: KubeApiEmulator, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    api.put(make_pod("a"))
    api.fail_status = status
    with caplog.at_level(logging.WARNING, logger="exporter.attribution.kubeapi"):
        source = watcher(api)
        try:
            assert wait_for(lambda: api.list_count() >= 3), "retries with backoff"
            directory, result = source.latest()
            assert directory is None and not result.success and result.stage == "kube_api"
            warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
            assert len(warnings) == 1, "one log line per condition, not one per retry"
            assert str(status) in warnings[0].getMessage()
            if status == 403:
                assert "RBAC" in warnings[0].getMessage()
            api.fail_status = None
            assert wait_for(lambda: source.latest()[1].success)
            assert names(source) == {"a": "Running"}
        finally:
            source.close()


def test_backoff_grows_so_a_broken_api_is_not_hammered(api: KubeApiEmulator) -> None:
    api.fail_status = 500
    source = watcher(api, backoff_initial_seconds=0.1, backoff_max_seconds=10)
    try:
        assert wait_for(lambda: api.list_count() >= 1)
        first = api.list_count()
        time.sleep(1.0)
        retries = api.list_count() - first
    finally:
        source.close()
    # waits of 0.1, 0.2, 0.4, 0.8 s (+/- 20 % jitter): at most 4 retries in the first second, not dozens
    assert 1 <= retries <= 4


def test_api_unreachable_leaves_kubelet_allocations_and_recovers(api: KubeApiEmulator) -> None:
    api.put(make_pod("train", "ml", owner=("StatefulSet", "train")))
    api.put(make_pod("old", "ml", phase="Succeeded"))
    api.stop()  # the port now refuses connections
    sample = BackendSample(up=True, gpus=(GpuSample(index=0, uuid=U0, leaves=(LeafSample(uuid=U0),)),))
    with FakeKubelet() as kubelet:
        kubelet.pods = [
            pod("ml", "train", [("main", [("nvidia.com/gpu", [U0])])]),
            pod("ml", "old", [("main", [("nvidia.com/gpu", [U0])])]),
        ]
        kubelet_source = PodResourcesSource(kubelet.socket_path)
        attributor = PipelineAttributor(kubelet_source, watcher(api), None)
        try:
            assert kubelet_source.wait_first_refresh(30)
            attribution, stages = attributor.attribute(sample, time.time())
            assert {s.stage: s.success for s in stages} == {"podresources": True, "kube_api": False}
            assert {(a.pod.pod, a.pod.workload_kind) for a in attribution.allocations} == {
                ("train", None),
                ("old", None),
            }, "device data unaffected; API extras absent; without phases both holders show"

            api.start()  # same port
            assert wait_for(lambda: attributor.attribute(sample, time.time())[1][1].success)
            attribution, _ = attributor.attribute(sample, time.time())
            assert [(a.pod.pod, a.pod.workload_kind, a.pod.workload) for a in attribution.allocations] == [
                ("train", "StatefulSet", "train")
            ], "finished pod dropped once the API says so"
        finally:
            attributor.close()


def test_close_stops_the_watch_thread_promptly(api: KubeApiEmulator) -> None:
    source = watcher(api, watch_timeout_seconds=300)
    assert wait_for(lambda: api.watch_count() == 1)
    start = time.monotonic()
    source.close()
    # a hang check, not a performance figure: the open watch would otherwise block for 300 s
    assert time.monotonic() - start < 4.0


def test_the_official_client_lists_and_watches_the_emulator(api: KubeApiEmulator) -> None:
    """The emulator answers what the official client expects (its models, its paging fields, its
    watch decoder, its 410 and error handling), so the exporter's own client is tested against a
    faithful API server, not one shaped after it."""
    pytest.importorskip("kubernetes", reason="a test dependency (the dev extra)")
    from kubernetes import client, watch

    for name in ("a", "b", "c"):
        api.put(make_pod(name, "ml", owner=("StatefulSet", "train"), containers={"main": name * 64}))
    api.put(make_pod("elsewhere", "ml", node="cpu-node-9"))
    api.add_job("batch", "nightly-1", cronjob="nightly")
    cfg = client.Configuration()
    cfg.host = api.url
    cfg.retries = False
    selector = f"spec.nodeName={NODE}"
    with client.ApiClient(cfg) as api_client:
        core = client.CoreV1Api(api_client)
        first = core.list_pod_for_all_namespaces(field_selector=selector, limit=2)
        assert isinstance(first, client.V1PodList) and first.metadata is not None
        assert [p.metadata and p.metadata.name for p in first.items] == ["a", "b"]
        pod_a = first.items[0]
        assert pod_a.status is not None and pod_a.status.container_statuses is not None
        assert pod_a.status.container_statuses[0].container_id == "containerd://" + "a" * 64
        assert pod_a.metadata is not None and pod_a.metadata.owner_references is not None
        assert pod_a.metadata.owner_references[0].kind == "StatefulSet"
        token = first.metadata._continue
        assert token, "a limited list names its next page"
        rest = core.list_pod_for_all_namespaces(field_selector=selector, limit=2, _continue=token)
        assert rest.metadata is not None
        assert [p.metadata and p.metadata.name for p in rest.items] == ["c"], "the other node's pod is not listed"
        assert rest.metadata._continue is None
        assert rest.metadata.resource_version == first.metadata.resource_version

        api.put(make_pod("d", "ml"))
        api.put(make_pod("moved", "ml", node="cpu-node-9"))
        api.delete("uid-ml-a")
        mark = api.bookmark()
        watcher = watch.Watch()
        seen: list[tuple[str, str | None]] = []
        for event in watcher.stream(
            core.list_pod_for_all_namespaces,
            field_selector=selector,
            resource_version=first.metadata.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=10,
        ):
            obj = event["object"]
            if event["type"] == "BOOKMARK":
                seen.append(("BOOKMARK", None))
                watcher.stop()
            else:
                assert isinstance(obj, client.V1Pod) and obj.metadata is not None
                seen.append((event["type"], obj.metadata.name))
        assert seen == [("ADDED", "d"), ("DELETED", "a"), ("BOOKMARK", None)]
        assert watcher.resource_version == str(mark)
        watch_query = [q for _, q in api.requests if q.get("watch") == "true"][-1]
        assert watch_query["allowWatchBookmarks"] == "true" and watch_query["fieldSelector"] == selector

        api.expire_watches = True
        with pytest.raises(client.ApiException) as expired:
            list(watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version="101", timeout_seconds=5))
        assert expired.value.status == 410

        batch = client.BatchV1Api(api_client)
        job = batch.read_namespaced_job("nightly-1", "batch")
        assert job.metadata is not None and job.metadata.owner_references is not None
        assert [r.kind for r in job.metadata.owner_references] == ["CronJob"]
        cronjob = batch.read_namespaced_cron_job("nightly", "batch")
        assert cronjob.metadata is not None and cronjob.metadata.uid == job.metadata.owner_references[0].uid
        resources = batch.get_api_resources()
        assert isinstance(resources, client.V1APIResourceList) and resources.group_version == "batch/v1"
        assert {(r.name, r.kind, r.namespaced) for r in resources.resources} >= {
            ("jobs", "Job", True),
            ("jobs/status", "Job", True),
            ("cronjobs", "CronJob", True),
        }
        moved = core.read_namespaced_pod("moved", "ml")
        assert moved.spec is not None and moved.spec.node_name == "cpu-node-9", "a pod of any node"
        with pytest.raises(client.ApiException) as missing:
            batch.read_namespaced_job("nightly-2", "batch")
        assert missing.value.status == 404
        api.fail_status = 403
        with pytest.raises(client.ApiException) as forbidden:
            core.list_pod_for_all_namespaces(field_selector=selector)
        assert forbidden.value.status == 403 and "cannot list resource" in str(forbidden.value.body)


def test_the_emulators_objects_carry_every_field_the_official_models_require() -> None:
    pytest.importorskip("kubernetes", reason="a test dependency (the dev extra)")
    from kubernetes import client

    emulator = KubeApiEmulator()
    emulator.add_job("batch", "nightly-1", cronjob="nightly")
    decode = client.ApiClient().deserialize
    decode(json.dumps(make_pod("a", containers={"main": "a" * 64})), "V1Pod", "application/json")
    decode(json.dumps(emulator.jobs[("batch", "nightly-1")]), "V1Job", "application/json")
    decode(json.dumps(emulator.objects[("batch/v1", "cronjobs", "batch", "nightly")]), "V1CronJob", "application/json")


def test_an_exec_kubeconfig_fails_the_stage_with_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A kubectl user's credential plugin is not run: the stage fails, saying why, once."""
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: eks}}]\n"
        "users: [{name: eks, user: {exec: {apiVersion: client.authentication.k8s.io/v1beta1, command: aws}}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    reads: list[int] = []

    def counted_load_endpoint() -> kube_http.Endpoint:
        reads.append(1)
        return kube_http.load_endpoint()

    monkeypatch.setattr(kubeapi, "load_endpoint", counted_load_endpoint)
    with caplog.at_level(logging.WARNING, logger="exporter.attribution.kubeapi"):
        source = KubePodSource.in_cluster(NODE)
        try:
            assert wait_for(lambda: len(reads) >= 2), "the configuration is read again after the backoff"
        finally:
            source.close()
    error = source.last_error or ""
    assert error.startswith("ConfigError: kubeconfig ") and "user 'eks' authenticates with exec" in error, error
    assert not source.latest()[1].success
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].exc_info is None, "one line, no traceback"
