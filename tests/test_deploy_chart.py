"""The Helm chart and the plain manifests: they lint, validate against every supported Kubernetes
version, stay in sync, and deploy a hardened, least-privilege exporter."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.deploy import CHART, MANIFESTS, REPO, objects, one, renderer

pytestmark = pytest.mark.integration

SUPPORTED_KUBERNETES = [f"1.{minor}.0" for minor in range(28, 38)]


def exporter_pod(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return dict(one(objects(values), "DaemonSet")["spec"]["template"]["spec"])


def exporter_container(values: dict[str, Any] | None = None) -> dict[str, Any]:
    containers = exporter_pod(values)["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def validator() -> str:
    path = shutil.which("kubernetes-validate") or str(Path(sys.executable).parent / "kubernetes-validate")
    if not Path(path).exists():
        pytest.fail("kubernetes-validate is not installed: uv pip install -e '.[dev]'")
    return path


# --- chart hygiene ------------------------------------------------------------------------------


@pytest.mark.parametrize("kube_version", ["v1.28.0", "v1.37.0"])
def test_chart_passes_helm_lint_strict(kube_version: str) -> None:
    import helm_python

    report = helm_python.lint(str(CHART), strict=True, kube_version=kube_version)
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert not problems, problems


def test_checked_in_manifests_match_the_chart() -> None:
    assert renderer.main(["--check"]) == 0, "run: python scripts/render_manifests.py"


@pytest.mark.parametrize("version", SUPPORTED_KUBERNETES)
def test_plain_manifests_pass_kubernetes_validate_strict(version: str) -> None:
    result = subprocess.run(
        [validator(), "--strict", "--quiet", "-k", version, str(MANIFESTS / "gpulens.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


VARIANTS: dict[str, dict[str, Any]] = {
    "non-root": {"exporter": {"runAsNonRoot": True}},
    "no-pod-resources-restricted-namespace": {
        "namespace": {"create": True},
        "exporter": {"podResources": {"enabled": False}},
    },
    "probes-and-namespace": {"namespace": {"create": True}, "exporter": {"probes": {"enabled": True}}},
    "host-pid-and-runtime-class": {"exporter": {"hostPID": True, "runtimeClassName": "nvidia"}},
    "no-probes-no-api": {"exporter": {"probes": {"enabled": False}, "kubernetesApi": False}},
    "web-config": {
        "webConfig": {
            "enabled": True,
            "content": "tls_server_config:\n  cert_file: /etc/gpulens/tls/tls.crt\n",
            "tlsSecretName": "gpulens-tls",
        }
    },
    "dashboard-prometheus-auth": {
        "dashboard": {
            "prometheusUrl": "https://thanos-querier.openshift-monitoring.svc:9091",
            "prometheusAuth": {
                "secretName": "prometheus-reader",
                "bearerTokenKey": "token",
                "caKey": "ca.crt",
                "headers": {"X-Scope-OrgID": "team-a"},
            },
        }
    },
    "dcgm-compat-and-grafana-dashboard": {
        "exporter": {"compatDcgm": True},
        "grafanaDashboard": {"enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "GPUs"}},
    },
    "minimal": {
        "dashboard": {"enabled": False},
        "networkPolicy": {"enabled": False},
        "priorityClass": {"create": False},
        "serviceMonitor": {"enabled": False},
        "prometheusRule": {"enabled": False},
    },
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("version", [SUPPORTED_KUBERNETES[0], SUPPORTED_KUBERNETES[-1]])
def test_chart_variants_pass_kubernetes_validate_strict(variant: str, version: str) -> None:
    import kubernetes_validate

    for obj in objects(VARIANTS[variant]):
        if obj["kind"] in renderer.OPERATOR_KINDS:
            continue  # CRDs: no schema in kubernetes-validate; checked field by field below
        kubernetes_validate.validate(obj, version, strict=True)


# --- the exporter DaemonSet ---------------------------------------------------------------------


def test_exporter_container_is_locked_down() -> None:
    for values in ({}, VARIANTS["non-root"], VARIANTS["host-pid-and-runtime-class"]):
        pod = exporter_pod(values)
        sc = pod["containers"][0]["securityContext"]
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["privileged"] is False
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["hostNetwork"] is False and pod["hostIPC"] is False


def test_exporter_runs_as_root_without_capabilities_by_default_and_non_root_on_request() -> None:
    default = exporter_container()["securityContext"]
    assert default["runAsUser"] == 0 and default["runAsNonRoot"] is False
    non_root = exporter_container(VARIANTS["non-root"])["securityContext"]
    assert non_root["runAsNonRoot"] is True
    assert non_root["runAsUser"] == 65534 and non_root["runAsGroup"] == 65534


@pytest.mark.parametrize(
    ("values", "uid"),
    [
        ({}, 0),  # pod attribution on: the kubelet's root-owned socket needs uid 0
        ({"exporter": {"podResources": {"enabled": False}}}, 65534),  # nothing else needs root
        ({"exporter": {"podResources": {"enabled": False}, "hostPID": True}}, 65534),  # /proc/<pid>/cgroup is 0444
        ({"exporter": {"runAsNonRoot": True, "supplementalGroups": [994]}}, 65534),  # a socket group's nodes
        ({"exporter": {"podResources": {"enabled": False}, "runAsNonRoot": False}}, 0),
    ],
    ids=["default", "no-pod-resources", "host-pid-only", "forced-non-root-with-group", "forced-root"],
)
def test_exporter_is_root_only_while_it_opens_the_kubelet_socket(values: dict[str, Any], uid: int) -> None:
    pod = exporter_pod(values)
    for ctx in (pod["securityContext"], pod["containers"][0]["securityContext"]):
        assert (ctx["runAsUser"], ctx["runAsGroup"], ctx["runAsNonRoot"]) == (uid, uid, uid != 0)
    socket_arg = next(a for a in pod["containers"][0]["args"] if a.startswith("--kubernetes.podresources-socket="))
    mounted = any("hostPath" in v for v in pod["volumes"])
    assert mounted == values.get("exporter", {}).get("podResources", {}).get("enabled", True)
    assert socket_arg.endswith("kubelet.sock") == mounted, "no socket flag without its mount (empty disables)"
    assert pod["securityContext"].get("supplementalGroups") == values.get("exporter", {}).get("supplementalGroups")


def test_run_as_non_root_takes_only_auto_true_or_false() -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError, match="runAsNonRoot"):
        objects({"exporter": {"runAsNonRoot": "yes"}})


def test_exporter_sees_all_gpus_without_requesting_one() -> None:
    container = exporter_container()
    env = {e["name"]: e for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    for section in ("requests", "limits"):
        assert not [r for r in container["resources"][section] if "gpu" in r], container["resources"]
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "--backend=nvml" in container["args"], "a cluster must never fall back to simulated GPUs"


def test_pod_resources_socket_is_the_only_host_path_and_is_read_only() -> None:
    pod = exporter_pod()
    host_paths = [v for v in pod["volumes"] if "hostPath" in v]
    assert [v["hostPath"]["path"] for v in host_paths] == ["/var/lib/kubelet/pod-resources"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == host_paths[0]["name"])
    assert mount["readOnly"] is True
    assert (
        "--kubernetes.podresources-socket=/var/lib/kubelet/pod-resources/kubelet.sock" in (pod["containers"][0]["args"])
    )


def test_host_pid_is_opt_in() -> None:
    assert exporter_pod()["hostPID"] is False
    assert exporter_pod(VARIANTS["host-pid-and-runtime-class"])["hostPID"] is True


# --- Pod Security Admission --------------------------------------------------------------------

PSA_LEVELS = ["restricted", "baseline", "privileged"]
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def psa_violations(pod: dict[str, Any], level: str) -> list[str]:
    """What the Pod Security Standard ``level`` (Kubernetes' "latest" policy) refuses in a pod spec:
    the checks of the baseline and restricted levels for the fields a pod of this chart can set."""
    if level == "privileged":
        return []
    found: list[str] = []
    pod_ctx = pod.get("securityContext", {})
    containers = pod.get("initContainers", []) + pod["containers"]
    # baseline
    found += [f"host namespace {k}" for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k)]
    found += [f"hostPath volume {v['name']}" for v in pod.get("volumes", []) if "hostPath" in v]
    for c in containers:
        ctx = c.get("securityContext", {})
        if ctx.get("privileged"):
            found.append(f"{c['name']}: privileged")
        added = set(ctx.get("capabilities", {}).get("add", []))
        if added - BASELINE_CAPABILITIES:
            found.append(f"{c['name']}: capabilities {sorted(added - BASELINE_CAPABILITIES)}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            found.append(f"{c['name']}: hostPort")
        if ctx.get("procMount", "Default") != "Default":
            found.append(f"{c['name']}: procMount")
    for ctx in [pod_ctx] + [c.get("securityContext", {}) for c in containers]:
        if ctx.get("seccompProfile", {}).get("type") == "Unconfined":
            found.append("seccomp Unconfined")
    if pod_ctx.get("sysctls"):
        found.append("sysctls")
    if level == "baseline":
        return found
    # restricted
    found += [
        f"volume type of {v['name']}" for v in pod.get("volumes", []) if not set(v) - {"name"} <= RESTRICTED_VOLUMES
    ]
    if pod_ctx.get("runAsUser") == 0:
        found.append("pod runAsUser 0")
    for c in containers:
        ctx = c.get("securityContext", {})
        if ctx.get("allowPrivilegeEscalation") is not False:
            found.append(f"{c['name']}: allowPrivilegeEscalation")
        if ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")) is not True:
            found.append(f"{c['name']}: runAsNonRoot")
        if ctx.get("runAsUser") == 0:
            found.append(f"{c['name']}: runAsUser 0")
        seccomp = ctx.get("seccompProfile", pod_ctx.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{c['name']}: seccomp {seccomp}")
        caps = ctx.get("capabilities", {})
        if "ALL" not in caps.get("drop", []) or set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{c['name']}: capabilities")
    return found


def pod_specs(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o["spec"]["template"]["spec"] for o in objs if o["kind"] in ("DaemonSet", "Deployment")]


def lowest_admitting_level(objs: list[dict[str, Any]]) -> str:
    return next(level for level in PSA_LEVELS if not any(psa_violations(p, level) for p in pod_specs(objs)))


def namespace_level(objs: list[dict[str, Any]]) -> str:
    return str(one(objs, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"])


def test_psa_check_sees_what_each_level_refuses() -> None:
    """The checker itself: the chart's default exporter pod fails baseline for its hostPath, a
    non-root exporter without it passes restricted, and uid 0 fails restricted only."""
    assert psa_violations(exporter_pod(), "baseline") == ["hostPath volume pod-resources"]
    assert psa_violations(exporter_pod({"exporter": {"podResources": {"enabled": False}}}), "restricted") == []
    root = exporter_pod({"exporter": {"podResources": {"enabled": False}, "runAsNonRoot": False}})
    assert psa_violations(root, "baseline") == [] and "pod runAsUser 0" in psa_violations(root, "restricted")
    assert psa_violations(exporter_pod({"exporter": {"hostPID": True}}), "baseline")[0] == "host namespace hostPID"


@pytest.mark.parametrize(
    ("values", "level"),
    [
        ({}, "privileged"),  # the PodResources hostPath: pod attribution out of the box
        ({"exporter": {"podResources": {"enabled": False}}}, "restricted"),
        ({"exporter": {"podResources": {"enabled": False}, "runAsNonRoot": False}}, "baseline"),
        ({"exporter": {"podResources": {"enabled": False}, "hostPID": True}}, "privileged"),
        (
            {"exporter": {"podResources": {"enabled": False}}, "webConfig": VARIANTS["web-config"]["webConfig"]},
            "restricted",
        ),
    ],
    ids=["default", "no-pod-resources", "no-pod-resources-root", "host-pid", "web-config-secrets"],
)
def test_namespace_pod_security_level_is_the_lowest_that_admits_the_pods(values: dict[str, Any], level: str) -> None:
    """The Namespace's enforce label follows the values: strong enough for every pod rendered, and
    no stronger than they need."""
    objs = objects({**values, "namespace": {"create": True}})
    assert lowest_admitting_level(objs) == level
    assert namespace_level(objs) == level
    ns = one(objs, "Namespace")
    assert ns["metadata"]["name"] == "gpulens"
    assert ns["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep", "uninstall must not delete the namespace"


def test_namespace_is_opt_in_and_the_plain_manifests_carry_the_default_level() -> None:
    """``helm install --create-namespace`` makes the namespace itself, so the chart's is opt-in; the
    plain manifests add their own, which must carry the level the defaults need."""
    assert not [o for o in objects() if o["kind"] == "Namespace"]
    plain = [d for d in yaml.safe_load_all((MANIFESTS / "gpulens.yaml").read_text()) if d]
    assert namespace_level(plain) == namespace_level(objects({"namespace": {"create": True}}))
    assert namespace_level(plain) == lowest_admitting_level(plain)


def test_runtime_class_is_configurable() -> None:
    assert "runtimeClassName" not in exporter_pod()
    assert exporter_pod(VARIANTS["host-pid-and-runtime-class"])["runtimeClassName"] == "nvidia"


def test_exporter_lands_on_gpu_nodes_only_and_tolerates_their_taint() -> None:
    pod = exporter_pod()
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {e["key"] for t in terms for e in t["matchExpressions"]}
    assert "nvidia.com/gpu.present" in keys
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_health_probes_use_healthz_and_readyz() -> None:
    container = exporter_container()
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["port"] == "metrics"


def test_requests_and_limits_follow_the_sizing_and_grow_for_probes() -> None:
    without = exporter_container(VARIANTS["no-probes-no-api"])["resources"]
    assert without == {
        "requests": {"cpu": "50m", "memory": "96Mi"},
        "limits": {"cpu": "200m", "memory": "256Mi"},
    }
    assert "--no-probes" in exporter_container(VARIANTS["no-probes-no-api"])["args"]
    with_probes = exporter_container(PROBES_ON)["resources"]
    assert with_probes["requests"] == {"cpu": "50m", "memory": "96Mi"}
    assert with_probes["limits"] == {"cpu": "1", "memory": "1Gi"}


PROBES_ON: dict[str, Any] = {"exporter": {"probes": {"enabled": True}}}


def test_probes_are_off_by_default_with_the_plain_image_and_the_small_limits() -> None:
    """A probe takes a CUDA context and ~1.9 GiB on a GPU the kubelet showed unallocated, which the
    scheduler may hand out meanwhile: off unless asked for. The image, the driver capabilities and
    the limits follow the switch."""
    default = exporter_container()
    assert "--no-probes" in default["args"] and not any(a.startswith("--probes.") for a in default["args"])
    assert default["image"] == "ghcr.io/gpulens/gpulens-exporter:0.1.0", "no CuPy image while probes are off"
    assert default["resources"]["limits"] == {"cpu": "200m", "memory": "256Mi"}
    env = {e["name"]: e.get("value") for e in default["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility", "no CUDA compute without probes"
    on = exporter_container(PROBES_ON)
    assert "--probes" in on["args"] and "--probes.interval=1h" in on["args"]
    assert on["image"] == "ghcr.io/gpulens/gpulens-exporter:0.1.0-cuda12"
    assert on["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
    assert {e["name"]: e.get("value") for e in on["env"]}["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    # the plain manifests are the defaults
    plain = next(
        d for d in yaml.safe_load_all((MANIFESTS / "gpulens.yaml").read_text()) if d and d["kind"] == "DaemonSet"
    )
    assert "--no-probes" in plain["spec"]["template"]["spec"]["containers"][0]["args"]


def test_probes_need_the_kubelet_allocation_gate() -> None:
    """Without the PodResources socket no GPU is known to be allocated, so probes would run on
    tenants' GPUs: the chart refuses the combination."""
    import helm_python

    with pytest.raises(
        helm_python.HelmError, match=re.escape("exporter.probes.enabled needs exporter.podResources.enabled")
    ):
        objects({"exporter": {"probes": {"enabled": True}, "podResources": {"enabled": False}}})


def test_exporter_has_its_priority_class() -> None:
    objs = objects()
    pc = one(objs, "PriorityClass")
    assert isinstance(pc["value"], int) and pc["value"] > 0
    assert pc["globalDefault"] is False
    # Never preempt a tenant's pod (and its GPUs) to get onto a full node; wait for room instead.
    assert pc["preemptionPolicy"] == "Never"
    assert one(objs, "DaemonSet")["spec"]["template"]["spec"]["priorityClassName"] == pc["metadata"]["name"]
    custom = exporter_pod({"exporter": {"priorityClassName": "system-node-critical"}})
    assert custom["priorityClassName"] == "system-node-critical"


# --- RBAC ---------------------------------------------------------------------------------------


OWNER_RESOURCES: set[tuple[str, str]] = {
    ("", "pods"),
    ("apps", "replicasets"),
    ("apps", "deployments"),
    ("apps", "statefulsets"),
    ("batch", "jobs"),
    ("batch", "cronjobs"),
    ("jobset.x-k8s.io", "jobsets"),
    ("leaderworkerset.x-k8s.io", "leaderworkersets"),
    *(("kubeflow.org", r) for r in ("pytorchjobs", "mpijobs", "tfjobs", "xgboostjobs", "paddlejobs", "jaxjobs")),
    ("trainer.kubeflow.org", "trainjobs"),
    *(("ray.io", r) for r in ("rayclusters", "rayjobs", "rayservices")),
}
"""(API group, resource) of the owners the chart grants ``get`` on for the owner chain."""
POD_WATCH = {("", "pods", "list"), ("", "pods", "watch")}
"""What the pod source itself needs: the node-scoped list and watch."""
POD_RULE = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}
SLICE_RULE = {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["get", "list", "watch"]}
"""The one rule on DRA's API group: read DRA ResourceSlices (the ResourceSlice source lists and
watches this node's), nothing else of resource.k8s.io (no claims, no write)."""
SLICE_READ = {("resource.k8s.io", "resourceslices", verb) for verb in ("get", "list", "watch")}
SLICE_WATCH = {("resource.k8s.io", "resourceslices", "list"), ("resource.k8s.io", "resourceslices", "watch")}
"""What the ResourceSlice source needs: the node-scoped list and watch."""
GRANTED_UNUSED = {("resource.k8s.io", "resourceslices", "get")}
"""Grants no request of the exporter uses, each on purpose: ``get`` on ResourceSlices comes with
their ``list`` and ``watch`` as the resource's read-only verbs (what ``--kubernetes.resource-slices``
documents), adding nothing a list does not already show."""


def test_cluster_role_lists_and_watches_pods_and_only_gets_their_owners() -> None:
    objs = objects()
    role = one(objs, "ClusterRole")
    owners = {(group, resource, "get") for group, resource in OWNER_RESOURCES}
    assert role_grants(role) == POD_WATCH | SLICE_READ | owners
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, "no resourceNames or nonResourceURLs"
        assert rule["verbs"] == ["get"] or rule in (POD_RULE, SLICE_RULE)
        assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"]
        assert not any("/" in resource for resource in rule["resources"]), "no subresources"
    binding = one(objs, "ClusterRoleBinding")
    sa = one(objs, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "gpulens"}]
    assert exporter_pod()["serviceAccountName"] == sa["metadata"]["name"]
    assert "--kubernetes.owner-chain" in exporter_container()["args"]


def test_with_the_owner_chain_off_the_role_only_lists_and_watches_pods() -> None:
    values = {
        "exporter": {"kubernetesOwnerChain": False},
        "rbac": {"extraOwnerResources": [{"apiGroups": ["example.com"], "resources": ["trainingruns"]}]},
    }
    role = one(objects(values), "ClusterRole")
    assert role["rules"] == [POD_RULE, SLICE_RULE]
    assert "--no-kubernetes.owner-chain" in exporter_container(values)["args"]


@pytest.mark.parametrize("owner_chain", [True, False])
def test_the_role_reads_resourceslices_and_nothing_else_of_dra(owner_chain: bool) -> None:
    """One rule on resource.k8s.io: get, list and watch on resourceslices; no claims, no device
    classes, no write verbs, whatever the owner chain; and no rule but the pods', the slices' and
    get-only owner rules (a new verb on another resource fails here too)."""
    values = {"exporter": {"kubernetesOwnerChain": owner_chain}}
    role = one(objects(values), "ClusterRole")
    dra = [rule for rule in role["rules"] if "resource.k8s.io" in rule["apiGroups"]]
    assert dra == [SLICE_RULE]
    dra_grants = {grant for grant in role_grants(role) if grant[0] == "resource.k8s.io"}
    assert dra_grants <= {("resource.k8s.io", "resourceslices", v) for v in ("get", "list", "watch")}
    assert dra_grants >= SLICE_WATCH, "what the ResourceSlice source sends"
    assert [rule for rule in role["rules"] if rule["verbs"] != ["get"]] == [POD_RULE, SLICE_RULE]
    shipped = [d for d in yaml.safe_load_all((MANIFESTS / "gpulens.yaml").read_text()) if d]
    if owner_chain:
        assert one(shipped, "ClusterRole")["rules"] == role["rules"], "the plain manifests grant the same"


def test_extra_owner_resources_are_granted_get_only() -> None:
    extra = [
        {"apiGroups": ["example.com"], "resources": ["trainingruns", "sweeps"]},
        {"apiGroups": ["batch.volcano.sh"], "resources": ["jobs"]},
    ]
    role = one(objects({"rbac": {"extraOwnerResources": extra}}), "ClusterRole")
    assert role_grants(role) - role_grants(one(objects(), "ClusterRole")) == {
        ("example.com", "trainingruns", "get"),
        ("example.com", "sweeps", "get"),
        ("batch.volcano.sh", "jobs", "get"),
    }


@pytest.mark.parametrize(
    "extra",
    [
        [{"apiGroups": ["*"], "resources": ["trainingruns"]}],
        [{"apiGroups": ["example.com"], "resources": ["*"]}],
        [{"apiGroups": ["example.com"], "resources": ["trainingruns/status"]}],
        [{"apiGroups": ["example.com"], "resources": ["trainingruns"], "verbs": ["list"]}],
        [{"apiGroups": ["example.com"], "resources": []}],
        [{"apiGroups": ["example.com"]}],
    ],
    ids=["group wildcard", "resource wildcard", "subresource", "verbs", "no resource", "resources missing"],
)
def test_extra_owner_resources_that_would_grant_more_than_get_on_named_resources_are_refused(
    extra: list[dict[str, Any]],
) -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError, match="extraOwnerResources"):
        objects({"rbac": {"extraOwnerResources": extra}})


def test_the_removed_cronjob_value_is_refused_with_its_replacement() -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError, match=r"rbac.cronJobNames was removed: the owner chain"):
        objects({"rbac": {"cronJobNames": True}})


def api_path_templates() -> set[str]:
    """Every Kubernetes API path written in the exporter's source: string literals (and f-strings,
    each replacement as ``{}``) starting ``/api/`` or ``/apis/``, wherever they are and whatever
    the function sending them is called."""
    templates: set[str] = set()
    for file in (REPO / "exporter").rglob("*.py"):
        pieces: set[int] = set()  # the literal pieces of f-strings, read with their f-string
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            text: str | None = None
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in pieces:
                text = node.value
            elif isinstance(node, ast.JoinedStr):
                pieces.update(id(v) for v in node.values)
                parts = (v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
                text = "".join(str(part) for part in parts)
            if text is not None and text.startswith(("/api/", "/apis/")):
                templates.add(text)
    return templates


def matches_template(path: str, template: str) -> bool:
    """Whether a request path is ``template`` with each ``{...}`` filled by one path segment."""
    pattern = "".join(
        "[^/]+" if re.fullmatch(r"\{[^}]*\}", piece) else re.escape(piece)
        for piece in re.split(r"(\{[^}]*\})", template)
    )
    return re.fullmatch(pattern, path) is not None


def request_attributes(path: str, query: dict[str, str]) -> tuple[str, str, str]:
    """(API group, resource, verb) that RBAC checks for a GET of ``path``, as the API server
    derives them (k8s.io/apiserver request info): ``/api/v1/...`` is the core group "",
    ``/apis/<group>/<version>/...`` a named group; ``namespaces/<ns>/`` is skipped; a name makes
    it ``get``, none ``list``, or ``watch`` with ``watch=true`` (or the legacy ``watch/`` prefix);
    a subresource is ``<resource>/<subresource>``.  Discovery (``/api/<version>``,
    ``/apis/<group>/<version>``) is not a resource request: ``("", "", "discovery")``, which
    ``system:discovery`` grants every account."""
    parts = path.strip("/").split("/")
    if len(parts) == (2 if parts[0] == "api" else 3):
        return "", "", "discovery"
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    watch = query.get("watch") in ("true", "1")
    if rest[:1] == ["watch"]:
        watch, rest = True, rest[1:]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource = "/".join(rest[0:1] + rest[2:3])
    verb = "get" if len(rest) > 1 else "watch" if watch else "list"
    return group, resource, verb


def role_grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    """The (API group, resource, verb) triples a ClusterRole's rules grant (no wildcards expected)."""
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def exporter_requests() -> list[tuple[str, dict[str, str]]]:
    """The requests (path, query) the exporter's API sources send to an API server: the pod
    source while it lists a node with a pod under each kind of owner the chart grants (walking
    each owner chain to its top) and watches, and the ResourceSlice source while it lists and
    watches the node's slices."""
    from exporter.attribution.kube_http import KubeClient, endpoint_for
    from exporter.attribution.kubeapi import KubePodSource
    from exporter.attribution.resourceslices import ResourceSliceSource
    from tests.fakes.kube_api_server import (
        PODS_PATH,
        SLICES_PATH,
        KubeApiEmulator,
        make_pod,
        make_resource_slice,
        nvidia_gpu,
        nvidia_mig,
        reference_to,
    )

    with KubeApiEmulator() as api:
        ns = "ml"

        def owned(version: str, kind: str, plural: str, name: str, owner: dict[str, Any] | None = None) -> Any:
            return reference_to(api.add_object(version, kind, plural, ns, name, owner=owner))

        api.put(make_pod("nightly-1-q", ns, owner=("Job", "nightly-1")))
        api.add_job(ns, "nightly-1", cronjob="nightly")
        api.add_object("apps/v1", "Deployment", "deployments", ns, "web")
        api.put(make_pod("web-abc12-q", ns, owner=("ReplicaSet", "web-abc12"), labels={"pod-template-hash": "abc12"}))
        api.put(make_pod("hand-q", ns, owner=owned("apps/v1", "ReplicaSet", "replicasets", "hand")))
        trainjob = owned("trainer.kubeflow.org/v1alpha1", "TrainJob", "trainjobs", "tj")
        jobset = owned("jobset.x-k8s.io/v1alpha2", "JobSet", "jobsets", "tj", trainjob)
        api.put(make_pod("tj-0-q", ns, owner=owned("batch/v1", "Job", "jobs", "tj-0", jobset)))
        lws = owned("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets", "llm")
        leader = make_pod(
            "llm-0", ns, node="gpu-node-9", owner=owned("apps/v1", "StatefulSet", "statefulsets", "llm", lws)
        )
        api.put(leader)
        api.put(
            make_pod(
                "llm-0-1", ns, owner=owned("apps/v1", "StatefulSet", "statefulsets", "llm-0", reference_to(leader))
            )
        )
        for kind in ("PyTorchJob", "MPIJob", "TFJob", "XGBoostJob", "PaddleJob", "JAXJob"):
            api.put(make_pod(f"{kind.lower()}-0", ns, owner=owned("kubeflow.org/v1", kind, f"{kind.lower()}s", "j")))
        for kind, plural in (("RayJob", "rayjobs"), ("RayService", "rayservices")):
            cluster = owned(
                "ray.io/v1", "RayCluster", "rayclusters", f"{plural}-c", owned("ray.io/v1", kind, plural, "r")
            )
            api.put(make_pod(f"{plural}-head", ns, owner=cluster))
        gpu = "GPU-00000000-1111-2222-3333-444444444444"
        devices = [nvidia_gpu("gpu-0", gpu, "0000:18:00.0"), nvidia_mig("gpu-0-mig-0", "MIG-0", gpu)]
        api.put_slice(make_resource_slice("gpu-node-1", "gpu.nvidia.com", "gpu-node-1", devices))
        source = KubePodSource(lambda: KubeClient(endpoint_for(api.url)), "gpu-node-1")
        slices = ResourceSliceSource(lambda: KubeClient(endpoint_for(api.url)), "gpu-node-1")
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not (api.watch_count(PODS_PATH) and api.watch_count(SLICES_PATH)):
                time.sleep(0.02)
            directory, _ = source.latest()
            published, _ = slices.latest()
        finally:
            source.close()
            slices.close()
        assert directory is not None
        tops = {(p.workload_kind, p.workload) for p in directory.by_uid.values()}
        assert {("TrainJob", "tj"), ("LeaderWorkerSet", "llm"), ("CronJob", "nightly"), ("RayService", "r")} <= tops
        assert published is not None and len(published.devices) == 2
        return list(api.requests)


def test_the_role_grants_what_the_exporter_calls() -> None:
    """The grants follow the requests: every request the exporter sends is allowed by the role
    (the default one, with the owner chain) and every grant is used by one, so a new API call
    without its RBAC, or a grant nothing uses, fails here.  Each API path in the exporter's source
    must be among the requests sent, so a call the scenario does not reach fails too.  Discovery
    requests are allowed to every account (``system:discovery``), not by the role."""
    requests = exporter_requests()
    templates = api_path_templates()
    assert templates, "no API paths found in exporter/: has the client moved?"
    unmatched = sorted({path for path, _ in requests if not any(matches_template(path, t) for t in templates)})
    assert not unmatched, f"requests to paths not written in exporter/ (built where this test cannot see): {unmatched}"
    unsent = sorted(t for t in templates if not any(matches_template(path, t) for path, _ in requests))
    assert not unsent, f"API paths in exporter/ that exporter_requests() never sent (extend it): {unsent}"
    used = {request_attributes(path, query) for path, query in requests} - {("", "", "discovery")}
    granted = role_grants(one(objects(), "ClusterRole"))
    assert used <= granted, f"requests the role does not allow: {sorted(used - granted)}"
    assert granted - GRANTED_UNUSED <= used, f"grants no request uses: {sorted(granted - GRANTED_UNUSED - used)}"
    assert not GRANTED_UNUSED & used, "a grant listed as unused is used now: take it off GRANTED_UNUSED"
    assert used >= POD_WATCH | SLICE_WATCH
    discovery = {path for path, query in requests if request_attributes(path, query)[2] == "discovery"}
    assert "/api/v1" in discovery and "/apis/jobset.x-k8s.io/v1alpha2" in discovery


def test_without_the_api_watch_there_is_no_role_and_no_token() -> None:
    objs = objects(VARIANTS["no-probes-no-api"])
    kinds = {o["kind"] for o in objs}
    assert "ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds
    assert one(objs, "DaemonSet")["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert "--no-kubernetes.api" in exporter_container(VARIANTS["no-probes-no-api"])["args"]


# --- scraping -----------------------------------------------------------------------------------


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_the_exporter_listens_and_is_served_on_both_ip_stacks() -> None:
    """``:<port>`` is dual-stack in the exporter (both stacks where the node has IPv6), and the
    headless Service prefers dual-stack, so an IPv6-only or dual-stack cluster's Prometheus
    reaches every pod."""
    objs = objects()
    assert "--web.listen-address=:9445" in exporter_container()["args"]
    assert one(objs, "Service", "exporter")["spec"]["ipFamilyPolicy"] == "PreferDualStack"
    pinned = objects({"service": {"ipFamilyPolicy": "SingleStack"}})
    assert one(pinned, "Service", "exporter")["spec"]["ipFamilyPolicy"] == "SingleStack"


def test_service_monitor_scrapes_the_exporter_with_honor_labels() -> None:
    objs = objects()
    service = one(objs, "Service", "exporter")
    monitor = one(objs, "ServiceMonitor")
    assert _selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    pod_labels = one(objs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert _selects(service["spec"]["selector"], pod_labels)
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    assert endpoint["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    # job="gpulens", which GPUExporterDown selects
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "gpulens"
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in endpoint["relabelings"]


SERVING_SELECTOR = {"matchLabels": {"app.kubernetes.io/component": "vllm"}}


def test_the_serving_pod_monitor_is_off_by_default() -> None:
    assert not [o for o in objects() if o["kind"] == "PodMonitor"]


def test_the_serving_pod_monitor_scrapes_the_selected_pods_with_their_role() -> None:
    """namespace and pod come with every PodMonitor target (the operator adds them); role is copied
    from the pod labels the engine table names, in its order (a later one present wins), the user's
    label last, whatever it is called."""
    from dashboard.serving.engines import ROLE_POD_LABELS, USER_ROLE_LABEL, meta_label

    values = {"servingMonitor": {"enabled": True, "selector": SERVING_SELECTOR, "port": "http", "path": "/metrics"}}
    monitor = one(objects(values), "PodMonitor", "serving-monitor")
    assert monitor["spec"]["selector"] == SERVING_SELECTOR
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == ("http", "/metrics", "15s")
    assert "honorLabels" not in endpoint, "the engines' series have no namespace or pod of their own"
    roles = [(r["sourceLabels"], r["regex"], r["targetLabel"]) for r in endpoint["relabelings"]]
    assert roles == [([meta_label(label)], "(.+)", "role") for label in ROLE_POD_LABELS]
    assert ROLE_POD_LABELS[-1] == USER_ROLE_LABEL
    values["servingMonitor"] |= {"roleLabel": "example.com/tier", "namespaces": ["inference", "llm"]}
    monitor = one(objects(values), "PodMonitor", "serving-monitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["inference", "llm"]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["relabelings"][-1]["sourceLabels"] == ["__meta_kubernetes_pod_label_example_com_tier"]


def test_the_serving_pod_monitor_needs_a_selector() -> None:
    """An empty selector would scrape every pod's port of that name in every namespace."""
    import helm_python

    with pytest.raises(helm_python.HelmError, match=r"servingMonitor\.selector is empty"):
        objects({"servingMonitor": {"enabled": True}})
    with pytest.raises(helm_python.HelmError, match=re.escape("at '/servingMonitor/path'")):
        objects({"servingMonitor": {"enabled": True, "selector": SERVING_SELECTOR, "path": "metrics"}})


def test_network_policy_peers_come_from_values() -> None:
    peers = [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "openshift-monitoring"}}},
        {
            "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["sre"]}]},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "vmagent"}},
        },
        {"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.1.0/24"]}},
        {"ipBlock": {"cidr": "fd00::/8"}},
    ]
    (rule,) = one(objects({"networkPolicy": {"from": peers}}), "NetworkPolicy")["spec"]["ingress"]
    assert rule["from"] == peers
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert not [o for o in objects({"networkPolicy": {"enabled": False}}) if o["kind"] == "NetworkPolicy"]


@pytest.mark.parametrize(
    ("peers", "needle"),
    [
        (
            [{"namespaceSelctor": {}}],
            "at '/networkPolicy/from/0': additional properties 'namespaceSelctor' not allowed",
        ),
        ([{}], "at '/networkPolicy/from/0': minProperties"),
        ([], "at '/networkPolicy/from': minItems"),
        (None, "networkPolicy.from is empty: a NetworkPolicy rule without peers admits every source"),
        ([{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}], "at '/networkPolicy/from/0': maxProperties"),
        ([{"ipBlock": {"cidr": "10.0.0.0"}}], "at '/networkPolicy/from/0/ipBlock/cidr'"),
        ([{"ipBlock": {"except": ["10.0.0.0/24"]}}], "at '/networkPolicy/from/0/ipBlock': missing property 'cidr'"),
        ([{"podSelector": {"matchLabels": {"app": 1}}}], "at '/networkPolicy/from/0/podSelector/matchLabels/app'"),
        ([{"podSelector": {"matchExpressions": [{"key": "a", "operator": "in"}]}}], "operator"),
        ({"podSelector": {}}, "at '/networkPolicy/from': got object, want array"),
    ],
    ids=[
        "misspelt",
        "empty-peer",
        "no-peers",
        "null",
        "ip-block-and-selector",
        "cidr",
        "no-cidr",
        "label-type",
        "operator",
        "not-a-list",
    ],
)
def test_bad_network_policy_peers_are_refused_with_their_place(peers: Any, needle: str) -> None:
    """A peer the API server would refuse, or one that would silently admit everything (an empty
    list, an empty peer), stops the render and says where."""
    import helm_python

    with pytest.raises(helm_python.HelmError, match=re.escape(needle)):
        objects({"networkPolicy": {"from": peers}})


def test_the_old_single_peer_value_is_refused_with_its_replacement() -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError, match=r"networkPolicy.prometheus was replaced by networkPolicy.from"):
        objects({"networkPolicy": {"prometheus": {"podSelector": {}}}})


def test_service_monitor_and_prometheus_rule_carry_the_labels_prometheus_selects() -> None:
    """kube-prometheus-stack's Prometheus selects monitors and rules by ``release: <its release>``."""
    release = {"release": "kube-prometheus-stack"}
    objs = objects({"serviceMonitor": {"additionalLabels": release}, "prometheusRule": {"additionalLabels": release}})
    for kind in ("ServiceMonitor", "PrometheusRule"):
        labels = one(objs, kind)["metadata"]["labels"]
        assert labels["release"] == "kube-prometheus-stack"
        assert labels["app.kubernetes.io/name"] == "gpulens", "the chart's own labels stay"
        assert "release" not in one(objects(), kind)["metadata"]["labels"]
    # each monitor gets only its own
    only_rule = objects({"prometheusRule": {"additionalLabels": {"role": "alert-rules"}}})
    assert one(only_rule, "PrometheusRule")["metadata"]["labels"]["role"] == "alert-rules"
    assert "role" not in one(only_rule, "ServiceMonitor")["metadata"]["labels"]


@pytest.mark.parametrize("section", ["serviceMonitor", "prometheusRule"])
def test_monitor_labels_must_be_valid_label_values(section: str) -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError, match=f"at '/{section}/additionalLabels/release'"):
        objects({section: {"additionalLabels": {"release": "kube prometheus stack"}}})


def test_network_policy_admits_only_prometheus_on_the_metrics_port() -> None:
    objs = objects()
    policy = one(objs, "NetworkPolicy")
    pod_labels = one(objs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert _selects(policy["spec"]["podSelector"]["matchLabels"], pod_labels)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    (peer,) = rule["from"]
    assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    assert "namespaceSelector" in peer


def test_prometheus_rule_embeds_the_rules_file() -> None:
    rule = one(objects(), "PrometheusRule")
    canonical = yaml.safe_load((REPO / "deploy" / "rules" / "gpulens.rules.yml").read_text())
    assert rule["spec"] == canonical


def test_runbook_base_url_is_configurable() -> None:
    rule = one(objects({"prometheusRule": {"runbookBaseUrl": "https://wiki.example/gpu"}}), "PrometheusRule")
    urls = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert urls and all(u.startswith("https://wiki.example/gpu#") for u in urls)


def test_prometheus_rule_from_the_chart_passes_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run the README test command (scripts/test.sh)")
    rule = one(objects(), "PrometheusRule")
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# --- web config ---------------------------------------------------------------------------------


def test_web_config_is_mounted_from_a_secret_and_passed_to_the_exporter() -> None:
    objs = objects(VARIANTS["web-config"])
    secret = one(objs, "Secret")
    assert secret["stringData"]["web-config.yml"].startswith("tls_server_config:")
    pod = one(objs, "DaemonSet")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert "--web.config.file=/etc/gpulens/web-config/web-config.yml" in container["args"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["web-config"]["secret"]["secretName"] == secret["metadata"]["name"]
    assert volumes["tls"]["secret"]["secretName"] == "gpulens-tls"
    # the kubelet cannot authenticate: health falls back to TCP checks
    assert "tcpSocket" in container["livenessProbe"] and "tcpSocket" in container["readinessProbe"]


def test_web_config_without_content_or_secret_is_refused() -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError, match="webConfig"):
        objects({"webConfig": {"enabled": True}})


# --- dashboard ----------------------------------------------------------------------------------


def test_dashboard_runs_non_root_read_only_and_is_reachable_through_its_service() -> None:
    objs = objects()
    deployment = one(objs, "Deployment", "dashboard")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["automountServiceAccountToken"] is False
    assert any(a.startswith("--prometheus=http") for a in container["args"])
    service = one(objs, "Service", "dashboard")
    assert _selects(service["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    assert not _selects(service["spec"]["selector"], one(objs, "DaemonSet")["spec"]["template"]["metadata"]["labels"])


def test_dashboard_reads_prometheus_credentials_from_a_mounted_secret() -> None:
    pod = one(objects(VARIANTS["dashboard-prometheus-auth"]), "Deployment", "dashboard")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert "--prometheus-bearer-token-file=/etc/gpulens/prometheus/token" in args
    assert "--prometheus-ca-file=/etc/gpulens/prometheus/ca.crt" in args
    assert "--prometheus-header=X-Scope-OrgID=team-a" in args
    assert not any("basic-auth" in a or "insecure" in a for a in args)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["prometheus-auth"] == {
        "name": "prometheus-auth",
        "mountPath": "/etc/gpulens/prometheus",
        "readOnly": True,
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["prometheus-auth"]["secret"]["secretName"] == "prometheus-reader"
    # the flags the chart writes are the ones the dashboard accepts
    from dashboard.cli import build_parser

    parsed = build_parser().parse_args(args)
    assert parsed.prometheus_bearer_token_file == "/etc/gpulens/prometheus/token"
    assert parsed.prometheus_header == ["X-Scope-OrgID=team-a"]


@pytest.mark.parametrize(
    ("key", "flag", "attr", "long"),
    [
        ("servingItlTargets", "--itl-target", "itl_targets_seconds", "2m"),
        ("servingTtftTargets", "--ttft-target", "ttft_targets_seconds", "11m"),
    ],
)
def test_dashboard_takes_each_served_models_latency_target_from_values(
    key: str, flag: str, attr: str, long: str
) -> None:
    """``dashboard.servingItlTargets`` and ``dashboard.servingTtftTargets`` each become one flag the
    dashboard reads (the models in name order), and only their own; none by default; a name with a
    comma or a value that is no duration is refused by the schema, one over the flag's range by the
    dashboard (naming the flag)."""
    import helm_python

    from dashboard.cli import build_parser, settings_from_args

    def args(values: dict[str, Any] | None = None) -> list[str]:
        pod = one(objects(values), "Deployment", "dashboard")["spec"]["template"]["spec"]
        return list(pod["containers"][0]["args"])

    assert not any(a.startswith(("--itl-target", "--ttft-target")) for a in args())
    targets = {"meta-llama/Llama-3.1-8B-Instruct": "50ms", "Qwen/Qwen2.5-7B-Instruct": 0.04}
    rendered = args({"dashboard": {key: targets}})
    got = [a for a in rendered if a.startswith(("--itl-target", "--ttft-target"))]
    assert got == [f"{flag}=Qwen/Qwen2.5-7B-Instruct=0.04,meta-llama/Llama-3.1-8B-Instruct=50ms"]
    settings = settings_from_args(build_parser().parse_args(["--prometheus", "http://prom:9090", *got]), env={})
    assert getattr(settings, attr) == {"Qwen/Qwen2.5-7B-Instruct": 0.04, "meta-llama/Llama-3.1-8B-Instruct": 0.05}
    other = "ttft_targets_seconds" if attr == "itl_targets_seconds" else "itl_targets_seconds"
    assert getattr(settings, other) == {}
    for bad, needle in (({"a,b": "50ms"}, "a,b"), ({"a": "fast"}, "fast")):
        with pytest.raises(helm_python.HelmError, match=needle):
            objects({"dashboard": {key: bad}})
    over = [a for a in args({"dashboard": {key: {"a": long}}}) if a.startswith(flag)]
    with pytest.raises(ValueError, match=f"^{flag} 'a={long}'"):
        settings_from_args(build_parser().parse_args(["--prometheus", "http://prom:9090", *over]), env={})


def test_dashboard_takes_both_latency_targets_from_values_together() -> None:
    """Both maps set: two flags, ITL then TTFT, each with its own models."""
    values = {"servingItlTargets": {"a": "40ms"}, "servingTtftTargets": {"a": "2s", "b": 1}}
    pod = one(objects({"dashboard": values}), "Deployment", "dashboard")["spec"]["template"]["spec"]
    got = [a for a in pod["containers"][0]["args"] if a.startswith(("--itl-target", "--ttft-target"))]
    assert got == ["--itl-target=a=40ms", "--ttft-target=a=2s,b=1"]


@pytest.mark.parametrize(
    ("auth", "needle"),
    [
        ({"caKey": "ca.crt"}, "secretName"),
        ({"secretName": "s", "basicAuthUsername": "u"}, "basicAuthPasswordKey"),
        ({"secretName": "s", "certKey": "tls.crt"}, "keyKey"),
    ],
)
def test_incomplete_prometheus_auth_values_are_refused(auth: dict[str, str], needle: str) -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError, match=needle):
        objects({"dashboard": {"prometheusAuth": auth}})


def test_optional_parts_can_be_switched_off() -> None:
    kinds = {o["kind"] for o in objects(VARIANTS["minimal"])}
    assert kinds == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "DaemonSet"}
    assert exporter_pod(VARIANTS["minimal"]).get("priorityClassName") is None


def test_misspelt_or_mistyped_values_are_refused_by_the_schema() -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError, match="hostPid"):
        objects({"exporter": {"hostPid": True}})
    with pytest.raises(helm_python.HelmError, match="collectInterval"):
        objects({"exporter": {"collectInterval": "fast"}})


# --- dcgm-exporter compatibility and the Grafana dashboard ----------------------------------------


def test_dcgm_compat_is_off_by_default_and_one_value_turns_it_on() -> None:
    assert not any("compat.dcgm" in a for a in exporter_container()["args"])
    assert "--compat.dcgm" in exporter_container({"exporter": {"compatDcgm": True}})["args"]


def test_nic_reading_is_on_by_default_and_one_value_turns_it_off() -> None:
    assert "--collect.nic" in exporter_container()["args"]
    assert "--no-collect.nic" in exporter_container({"exporter": {"nic": {"enabled": False}}})["args"]


def test_nic_ceilings_are_the_flags_defaults_and_values_set_them() -> None:
    from exporter.config import parse_config

    args = exporter_container()["args"]
    config = parse_config([a for a in args if a.startswith("--collect.nic.")], env={})
    defaults = parse_config([], env={})
    assert (config.nic_max_devices, config.nic_max_counters) == (defaults.nic_max_devices, defaults.nic_max_counters)
    args = exporter_container({"exporter": {"nic": {"maxDevices": 8, "maxCounters": 100000}}})["args"]
    assert {"--collect.nic.max-devices=8", "--collect.nic.max-counters=100000"} <= set(args)


def test_grafana_dashboards_are_opt_in_one_config_map_each_labelled_for_the_sidecar() -> None:
    assert not [o for o in objects() if o["kind"] == "ConfigMap"]
    cms = [o for o in objects(VARIANTS["dcgm-compat-and-grafana-dashboard"]) if o["kind"] == "ConfigMap"]
    shipped = {p.name: p.read_text() for p in (REPO / "deploy" / "grafana").glob("*.json")}
    assert len(shipped) == 9  # fleet, workloads, jobs, network, links, sharing, health, gpu, serving
    assert {name for cm in cms for name in cm["data"]} == set(shipped), "every dashboard of deploy/grafana/"
    for cm in cms:
        ((name, text),) = cm["data"].items()
        assert cm["metadata"]["name"] == "gpulens-grafana-" + name.removeprefix("gpulens-").removesuffix(".json")
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["namespace"] == "monitoring"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "GPUs"}
        assert text == shipped[name].rstrip("\n")
        assert "{{" in text, "legend templates ({{node}} ...) pass through Helm verbatim"
