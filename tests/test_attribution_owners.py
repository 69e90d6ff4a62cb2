"""The top of the owner chain (exporter/attribution/owners.py) through the exporter's own client
(kube_http) against the loopback API emulator: the chains of the job operators, custom kinds
found by discovery, and every way a walk stops (403, 404, depth, loop, bad or huge replies, a slow
API, the rate bound), with the caches' bounds and lifetimes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from exporter.attribution import kubeapi
from exporter.attribution.kube_http import KubeClient, endpoint_for
from exporter.attribution.kubeapi import KubePodSource
from exporter.attribution.owners import (
    CACHE_ENTRIES,
    MAX_DEPTH,
    METADATA_ACCEPT,
    Owner,
    OwnerResolver,
    deployment_shortcut,
    parse_ref,
)
from tests.fakes.kube_api_server import KubeApiEmulator, make_pod, owner_reference, reference_to
from tests.support.kube import client_factory, wait_for

pytestmark = pytest.mark.integration

NODE = "gpu-node-1"
NS = "ml"
JOBSET = "jobset.x-k8s.io/v1alpha2"
TRAINJOB = "trainer.kubeflow.org/v1alpha1"
LWS = "leaderworkerset.x-k8s.io/v1"
KUBEFLOW = "kubeflow.org/v1"
RAY = "ray.io/v1"


class Clock:
    """A monotonic clock the test moves by hand, seconds."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api() -> Iterator[KubeApiEmulator]:
    with KubeApiEmulator() as emulator:
        yield emulator


@pytest.fixture
def client(api: KubeApiEmulator) -> Iterator[KubeClient]:
    c = KubeClient(endpoint_for(api.url))
    yield c
    c.close()


def job(api: KubeApiEmulator, name: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    return api.add_object("batch/v1", "Job", "jobs", NS, name, owner=owner)


def trainjob_chain(api: KubeApiEmulator) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """TrainJob ``tj`` -> JobSet ``tj`` -> Job ``tj-node-0``, as Kubeflow Trainer makes them."""
    tj = api.add_object(TRAINJOB, "TrainJob", "trainjobs", NS, "tj")
    js = api.add_object(JOBSET, "JobSet", "jobsets", NS, "tj", owner=reference_to(tj))
    return tj, js, job(api, "tj-node-0", owner=reference_to(js))


def source(api: KubeApiEmulator, **kw: Any) -> KubePodSource:
    return KubePodSource(client_factory(api.url), NODE, backoff_initial_seconds=0.05, backoff_max_seconds=0.2, **kw)


def workloads(src: KubePodSource) -> dict[str, tuple[str | None, str | None]]:
    directory, _ = src.latest()
    assert directory is not None
    return {p.name: (p.workload_kind, p.workload) for p in directory.by_uid.values()}


# --- the chains of the job operators ------------------------------------------------------------


def test_a_jobset_names_the_pods_of_its_jobs_reading_metadata_only(api: KubeApiEmulator, client: KubeClient) -> None:
    js = api.add_object(JOBSET, "JobSet", "jobsets", NS, "train")
    resolver = OwnerResolver()
    for index in range(2):
        owner = resolver.top(client, NS, reference_to(job(api, f"train-workers-{index}", owner=reference_to(js))))
        assert owner == Owner("JobSet", "train", "resolved") and owner.complete
    reads = api.object_gets()
    assert reads == [
        "/apis/batch/v1/namespaces/ml/jobs/train-workers-0",
        "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets/train",
        "/apis/batch/v1/namespaces/ml/jobs/train-workers-1",
    ], "the JobSet is read once: the second Job's walk ends at its cached answer"
    assert {accept for path, accept in api.accepts if path in reads} == {METADATA_ACCEPT}
    assert all(q == {"resourceVersion": "0"} for p, q in api.requests if p in reads), "served from the API cache"
    assert api.discovery_gets() == ["/apis/batch/v1", "/apis/jobset.x-k8s.io/v1alpha2"]
    assert resolver.stats()["resolved"] == 2


def test_a_trainjob_above_its_jobset_above_its_jobs(api: KubeApiEmulator) -> None:
    trainjob_chain(api)
    api.put(make_pod("tj-node-0-0-abcde", NS, owner=("Job", "tj-node-0"), containers={"trainer": "a" * 64}))
    src = source(api)
    try:
        assert wait_for(lambda: src.latest()[1].success)
        assert workloads(src) == {"tj-node-0-0-abcde": ("TrainJob", "tj")}
    finally:
        src.close()


def test_every_group_of_a_leaderworkerset_is_one_job_through_the_leader_pod_on_another_node(
    api: KubeApiEmulator,
) -> None:
    """LWS: the LeaderWorkerSet owns the leader StatefulSet, which owns each group's leader pod,
    which owns that group's worker StatefulSet, which owns the workers."""
    lws = api.add_object(LWS, "LeaderWorkerSet", "leaderworkersets", NS, "llm")
    leaders = api.add_object("apps/v1", "StatefulSet", "statefulsets", NS, "llm", owner=reference_to(lws))
    for group in range(2):
        leader = make_pod(f"llm-{group}", NS, node="gpu-node-9", owner=reference_to(leaders))
        api.put(leader)
        workers = api.add_object(
            "apps/v1", "StatefulSet", "statefulsets", NS, f"llm-{group}", owner=reference_to(leader)
        )
        api.put(make_pod(f"llm-{group}-1", NS, owner=reference_to(workers)))
    src = source(api)
    try:
        assert wait_for(lambda: src.latest()[1].success)
        assert workloads(src) == {"llm-0-1": ("LeaderWorkerSet", "llm"), "llm-1-1": ("LeaderWorkerSet", "llm")}
        assert "/api/v1/namespaces/ml/pods/llm-0" in api.object_gets("pods"), "the leader pod read by name"
        assert src.owners is not None and src.owners.stats()["resolved"] == 2
    finally:
        src.close()


def test_a_rayjob_above_its_raycluster(api: KubeApiEmulator, client: KubeClient) -> None:
    rayjob = api.add_object(RAY, "RayJob", "rayjobs", NS, "batch-infer")
    cluster = api.add_object(
        RAY, "RayCluster", "rayclusters", NS, "batch-infer-raycluster-x", owner=reference_to(rayjob)
    )
    assert OwnerResolver().top(client, NS, reference_to(cluster)) == Owner("RayJob", "batch-infer", "resolved")


def test_mpijob_launcher_through_its_job_and_workers_directly_name_one_mpijob(
    api: KubeApiEmulator, client: KubeClient
) -> None:
    mpijob = api.add_object(KUBEFLOW, "MPIJob", "mpijobs", NS, "allreduce")
    launcher = job(api, "allreduce-launcher", owner=reference_to(mpijob))
    resolver = OwnerResolver()
    assert resolver.top(client, NS, reference_to(launcher)) == Owner("MPIJob", "allreduce", "resolved")
    assert resolver.top(client, NS, reference_to(mpijob)) == Owner("MPIJob", "allreduce", "resolved")
    pytorchjob = api.add_object(KUBEFLOW, "PyTorchJob", "pytorchjobs", NS, "ddp")
    assert resolver.top(client, NS, reference_to(pytorchjob)) == Owner("PyTorchJob", "ddp", "resolved")


def test_a_deployment_is_named_from_the_replicaset_name_without_reading_replicasets(api: KubeApiEmulator) -> None:
    api.add_object("apps/v1", "Deployment", "deployments", NS, "web")
    api.put(make_pod("web-7d9f8-abcde", NS, owner=("ReplicaSet", "web-7d9f8"), labels={"pod-template-hash": "7d9f8"}))
    api.put(make_pod("gone-5c4b3-xyz", NS, owner=("ReplicaSet", "gone-5c4b3"), labels={"pod-template-hash": "5c4b3"}))
    src = source(api)
    try:
        assert wait_for(lambda: src.latest()[1].success)
        assert workloads(src) == {"web-7d9f8-abcde": ("Deployment", "web"), "gone-5c4b3-xyz": ("Deployment", "gone")}
        assert api.object_gets("replicasets") == []
        assert sorted(api.object_gets("deployments")) == [
            "/apis/apps/v1/namespaces/ml/deployments/gone",
            "/apis/apps/v1/namespaces/ml/deployments/web",
        ], "the walk goes on from the Deployment (one without its object stops there: 404)"
    finally:
        src.close()


def test_the_shortcut_needs_the_whole_template_hash_suffix() -> None:
    ref = owner_reference("ReplicaSet", "web-7d9f8", NS)
    assert deployment_shortcut(ref, {"pod-template-hash": "7d9f8"})["kind"] == "Deployment"
    assert deployment_shortcut(ref, {"pod-template-hash": "9f8"}) is ref
    assert deployment_shortcut(ref, {}) is ref
    assert deployment_shortcut(owner_reference("ReplicaSet", "-7d9f8", NS), {"pod-template-hash": "7d9f8"})["kind"] == (
        "ReplicaSet"
    )


def test_a_custom_kind_is_found_through_discovery(api: KubeApiEmulator, client: KubeClient) -> None:
    run = api.add_object("example.com/v1", "TrainingRun", "trainingruns", NS, "sweep-17")
    resolver = OwnerResolver()
    for index in range(3):
        child = job(api, f"sweep-17-{index}", owner=reference_to(run))
        assert resolver.top(client, NS, reference_to(child)) == Owner("TrainingRun", "sweep-17", "resolved")
    assert api.object_gets("trainingruns") == ["/apis/example.com/v1/namespaces/ml/trainingruns/sweep-17"]
    assert api.discovery_gets().count("/apis/example.com/v1") == 1, "discovery is cached per group-version"


# --- where a walk stops ---------------------------------------------------------------------------


def test_a_forbidden_resource_stops_the_chain_at_the_owner_it_names(api: KubeApiEmulator, client: KubeClient) -> None:
    _, _, first = trainjob_chain(api)
    api.forbidden.add(("jobset.x-k8s.io", "jobsets"))
    js = api.objects[(JOBSET, "jobsets", NS, "tj")]
    sibling = job(api, "tj-node-1", owner=reference_to(js))
    other = job(api, "other-0", owner=reference_to(api.add_object(JOBSET, "JobSet", "jobsets", NS, "other")))
    resolver = OwnerResolver()
    assert resolver.top(client, NS, reference_to(first)) == Owner("JobSet", "tj", "forbidden")
    assert resolver.top(client, NS, reference_to(sibling)) == Owner("JobSet", "tj", "forbidden")
    assert resolver.top(client, NS, reference_to(other)) == Owner("JobSet", "other", "forbidden")
    assert len(api.object_gets("jobsets")) == 1, "a 403 is remembered for its namespace and resource"
    assert api.object_gets("trainjobs") == []
    assert resolver.stats()["forbidden"] == 3


def test_a_missing_owner_or_one_with_another_uid_stops_the_chain(api: KubeApiEmulator, client: KubeClient) -> None:
    api.add_resource(JOBSET, "JobSet", "jobsets")
    orphan = job(api, "orphan-0", owner=owner_reference("JobSet", "deleted", NS))
    resolver = OwnerResolver()
    assert resolver.top(client, NS, reference_to(orphan)) == Owner("JobSet", "deleted", "not_found")
    api.add_object(JOBSET, "JobSet", "jobsets", NS, "recreated")
    stale = dict(owner_reference("JobSet", "recreated", NS), uid="uid-of-the-old-one")
    assert resolver.top(client, NS, stale) == Owner("JobSet", "recreated", "not_found"), "not the old object's chain"
    gone = job(api, "gone-0", owner=owner_reference("Gadget", "g", NS, api_version="nowhere.example/v1"))
    assert resolver.top(client, NS, reference_to(gone)) == Owner("Gadget", "g", "not_found"), "no such group"
    assert resolver.stats()["not_found"] == 3


def test_the_depth_bound_ends_a_long_chain(api: KubeApiEmulator, client: KubeClient) -> None:
    owner: dict[str, Any] | None = None
    chain = []
    for level in range(MAX_DEPTH + 4):
        obj = api.add_object("example.com/v1", "Layer", "layers", NS, f"layer-{level}", owner=owner)
        chain.append(obj)
        owner = reference_to(obj)
    resolver = OwnerResolver()
    answer = resolver.top(client, NS, reference_to(chain[-1]))
    assert answer == Owner("Layer", "layer-3", "error"), "8 read (layer-11 .. layer-4), the 9th named"
    assert len(api.object_gets()) == MAX_DEPTH
    assert resolver.stats()["error"] == 1


def test_an_owner_loop_stops(api: KubeApiEmulator, client: KubeClient) -> None:
    a_ref = owner_reference("Loop", "a", NS, api_version="example.com/v1")
    b = api.add_object("example.com/v1", "Loop", "loops", NS, "b", owner=a_ref)
    api.add_object("example.com/v1", "Loop", "loops", NS, "a", owner=reference_to(b))
    answer = OwnerResolver().top(client, NS, a_ref)
    assert answer == Owner("Loop", "b", "error")
    assert len(api.object_gets()) == 2


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"metadata": {"ownerReferences": [', "cut JSON"),
        (b'["not", "an", "object"]', "not an object"),
        (b'{"kind": "Job"}', "no metadata"),
        (
            b'{"metadata": {"uid": "uid-ml-jobset-js", "ownerReferences": '
            b'[{"controller": true, "apiVersion": "v1", "kind": "X", "name": "../../secrets"}]}}',
            "bad ref",
        ),
        (b'{"metadata": {"annotations": {"a": "' + b"x" * (3 * 1024 * 1024) + b'"}}}', "3 MiB"),
    ],
)
def test_a_malformed_or_huge_owner_reply_ends_the_walk_cleanly(
    api: KubeApiEmulator, client: KubeClient, body: bytes, why: str
) -> None:
    js = api.add_object(JOBSET, "JobSet", "jobsets", NS, "js")
    child = job(api, "js-0", owner=reference_to(js))
    api.raw_bodies["/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets/js"] = body
    resolver = OwnerResolver()
    assert resolver.top(client, NS, reference_to(child)) == Owner("JobSet", "js", "error"), why
    assert resolver.stats()["error"] == 1
    assert OwnerResolver().top(client, NS, reference_to(job(api, "fine"))) == Owner("Job", "fine", "resolved")


def test_an_unusable_reference_is_answered_as_it_is_without_a_request(api: KubeApiEmulator, client: KubeClient) -> None:
    for ref in (
        {"apiVersion": "a/b/c", "kind": "Job", "name": "x"},
        {"apiVersion": "batch/v1", "kind": "Job", "name": "../../../api/v1/secrets"},
        {"apiVersion": "batch/v1", "kind": "Job", "name": ".."},
        {"apiVersion": "batch/v1", "kind": "Job"},
    ):
        assert parse_ref(ref) is None
        assert OwnerResolver().top(client, NS, ref).outcome == "error"
    assert api.requests == []


# --- bounds -------------------------------------------------------------------------------------------


def test_many_distinct_owners_keep_the_cache_at_its_bound(api: KubeApiEmulator, client: KubeClient) -> None:
    resolver = OwnerResolver(cache_entries=16)
    for index in range(60):
        resolver.top(client, NS, reference_to(job(api, f"j-{index}")))
        assert resolver.stats()["cached"] <= 16
    assert resolver.stats()["cached"] == 16
    assert OwnerResolver().stats()["cached"] == 0 and CACHE_ENTRIES == 4096


def test_answers_expire_after_their_ttl_sooner_after_an_error(api: KubeApiEmulator, client: KubeClient) -> None:
    clock = Clock()
    resolver = OwnerResolver(clock=clock, positive_ttl=600, error_ttl=60)
    api.add_resource(JOBSET, "JobSet", "jobsets")
    child = job(api, "late-0", owner=owner_reference("JobSet", "late", NS))
    assert resolver.top(client, NS, reference_to(child)).outcome == "not_found"
    api.add_object(JOBSET, "JobSet", "jobsets", NS, "late")
    clock.now += 59
    assert resolver.top(client, NS, reference_to(child)).outcome == "not_found", "within the error TTL: cached"
    assert len(api.object_gets()) == 2
    clock.now += 2
    assert resolver.top(client, NS, reference_to(child)) == Owner("JobSet", "late", "resolved")
    reads = len(api.object_gets())
    clock.now += 599
    resolver.top(client, NS, reference_to(child))
    assert len(api.object_gets()) == reads, "within the positive TTL: cached"
    clock.now += 2
    resolver.top(client, NS, reference_to(child))
    assert len(api.object_gets()) == reads + 2, "expired: read again (the Job, then the JobSet)"


def test_the_rate_bound_answers_from_the_level_reached_without_waiting(
    api: KubeApiEmulator, client: KubeClient
) -> None:
    clock = Clock()
    js = api.add_object(JOBSET, "JobSet", "jobsets", NS, "js")
    jobs = [job(api, f"js-{index}", owner=reference_to(js)) for index in range(10)]
    resolver = OwnerResolver(clock=clock, requests_per_second=2, request_burst=5)
    start = time.monotonic()
    answers = [resolver.top(client, NS, reference_to(j)) for j in jobs]
    assert time.monotonic() - start < 5, "no waiting for tokens (a hang check)"
    assert len(api.requests) == 5, "the burst, then nothing until tokens come back"
    assert answers[:2] == [Owner("JobSet", "js", "resolved")] * 2  # discovery x2 + 3 reads
    assert answers[2] == Owner("Job", "js-2", "limited") and not answers[2].complete
    assert resolver.stats()["limited"] == 8
    clock.now += 1  # two more tokens
    assert resolver.top(client, NS, reference_to(jobs[2])) == Owner("JobSet", "js", "resolved")


def test_a_slow_api_costs_the_watch_thread_a_bounded_time(api: KubeApiEmulator, client: KubeClient) -> None:
    """Each request gives up after its timeout, and once the time share is spent walks stop at
    once (``limited``), so an API answering in 5 s never holds the caller for long."""
    js = api.add_object(JOBSET, "JobSet", "jobsets", NS, "js")
    jobs = [job(api, f"js-{index}", owner=reference_to(js)) for index in range(20)]
    resolver = OwnerResolver(get_timeout=0.2, walk_seconds=0.5, time_burst=0.5, time_share=0.01)
    api.object_delay = 5.0
    start = time.monotonic()
    answers = [resolver.top(client, NS, reference_to(j)) for j in jobs]
    elapsed = time.monotonic() - start
    assert {a.outcome for a in answers} == {"error", "limited"}
    assert answers[-1] == Owner("Job", "js-19", "limited")
    assert elapsed < 2.0, f"20 walks took {elapsed:.1f} s against a 5 s API"


# --- in the pod source ------------------------------------------------------------------------------


def test_a_walk_that_stopped_short_is_completed_after_a_later_event(
    api: KubeApiEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubeapi, "SETTLE_SECONDS", 0.0)
    trainjob_chain(api)
    api.forbidden.add(("jobset.x-k8s.io", "jobsets"))
    api.put(make_pod("tj-node-0-0", NS, owner=("Job", "tj-node-0")))
    src = source(api, owners=OwnerResolver(error_ttl=0.05))
    try:
        assert wait_for(lambda: src.latest()[1].success)
        assert workloads(src) == {"tj-node-0-0": ("JobSet", "tj")}
        api.forbidden.clear()  # the role is granted get on jobsets
        time.sleep(0.1)
        api.put(make_pod("other", "dev"))  # any event
        assert wait_for(lambda: workloads(src).get("tj-node-0-0") == ("TrainJob", "tj"))
    finally:
        src.close()


def test_with_the_chain_off_only_pods_are_read(api: KubeApiEmulator) -> None:
    api.add_job(NS, "nightly-1", cronjob="nightly")
    api.put(make_pod("nightly-1-q", NS, owner=("Job", "nightly-1")))
    api.put(make_pod("web-abc12-q", NS, owner=("ReplicaSet", "web-abc12"), labels={"pod-template-hash": "abc12"}))
    src = source(api, owner_chain=False)
    try:
        assert wait_for(lambda: src.latest()[1].success)
        assert workloads(src) == {"nightly-1-q": ("Job", "nightly-1"), "web-abc12-q": ("Deployment", "web")}
        assert src.owners is None
        assert {p for p, _ in api.requests} == {"/api/v1/pods"}
    finally:
        src.close()
