"""The exporter loads only what its flags need: never the official Kubernetes client, the
HTTP/2 client (h2) only with a kubelet socket and never grpcio or protobuf, the probes only with
probes on, and never the dashboard's stack; with attribution on, nothing outside the list in
docs/design.md ("What the exporter may load").

Each case builds the exporter as ``python -m exporter`` would (``exporter.cli.build``), runs
sampling cycles and renders a scrape in a fresh interpreter, then lists the modules loaded.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.kube_api_server import KubeApiEmulator, make_pod
from tests.fakes.kubelet_server import FakeKubelet, pod

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent
DESIGN = REPO / "docs" / "design.md"

HEAVY = (
    "kubernetes",
    "grpc",
    "google.protobuf",
    "h2",
    "hpack",
    "hyperframe",
    "streamlit",
    "plotly",
    "pandas",
    "numpy",
    "dashboard",
    "probes",
)
"""Top-level packages the default start path must not load unless a flag asks for them."""

_PROGRAM = """
import json, sys
from tests.fakes.fake_pynvml import FakeGpu, FakeNvml
sys.modules["pynvml"] = FakeNvml([FakeGpu(uuid="GPU-00000000-0000-0000-0000-000000000000")])
from exporter import cli
from exporter.config import parse_config
sampler, exposition, backend = cli.build(parse_config(sys.argv[1:], env={}))
sampler.run_once()
exposition.render("text/plain")
sampler.stop()
loaded = sorted({m for m in sys.modules if m in HEAVY or m.split(".")[0] in HEAVY})
print(json.dumps(loaded))
"""


def loaded_heavy_modules(*flags: str) -> set[str]:
    """Heavy packages (top-level names, and ``google.protobuf``) loaded after start-up with ``flags``."""
    program = f"HEAVY = {HEAVY!r}\n" + _PROGRAM
    proc = subprocess.run(
        [sys.executable, "-c", program, *flags], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    names = json.loads(proc.stdout.strip().splitlines()[-1])
    return {n for n in HEAVY if n in names or any(m.startswith(n + ".") for m in names)}


NO_SOCKET = ("--kubernetes.podresources-socket", "")
KUBELET_CLIENT = {"h2", "hpack", "hyperframe"}
"""What a kubelet socket adds: the HTTP/2 state machine under the PodResources client."""
MISSING_SOCKET = ("--kubernetes.podresources-socket", "/nonexistent/pod-resources/kubelet.sock")


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (("--backend", "sim", "--no-probes"), set()),
        (("--backend", "nvml", "--no-probes", *NO_SOCKET), set()),
        (("--backend", "sim", "--no-probes", *MISSING_SOCKET), KUBELET_CLIENT),
        (("--backend", "nvml", "--no-probes"), KUBELET_CLIENT),  # the default socket
        (("--backend", "nvml", *NO_SOCKET), {"probes"}),  # probes.expected: the bandwidth table, no CuPy
    ],
    ids=["sim", "nvml-no-kubelet", "sim-kubelet", "nvml-default-socket", "nvml-probes"],
)
def test_only_what_the_flags_need_is_imported(flags: tuple[str, ...], expected: set[str]) -> None:
    assert loaded_heavy_modules(*flags) == expected


# --- the import budget with attribution on ---------------------------------------------------------

_ATTRIBUTION_PROGRAM = """
import json, sys, time
from tests.fakes.fake_pynvml import FakeGpu, FakeNvml
sys.modules["pynvml"] = FakeNvml([FakeGpu(uuid="GPU-00000000-0000-0000-0000-000000000000")])
before = set(sys.modules)
from exporter import cli
from exporter.config import parse_config
sampler, exposition, backend = cli.build(parse_config(sys.argv[1:], env={}))
deadline = time.monotonic() + 60
while True:
    sampler.run_once()
    body, _ = exposition.render("text/plain")
    if all(b'stage="%s"} 1.0' % s in body for s in (b"podresources", b"kube_api")):
        break
    if time.monotonic() > deadline:
        raise SystemExit("the attribution stages did not succeed:\\n" + body.decode())
    time.sleep(0.1)
sampler.stop()
print(json.dumps(sorted({m.split(".")[0] for m in set(sys.modules) - before})))
"""
"""Builds the exporter (the NVML backend on a fake binding) with a kubelet socket and the API
watch, cycles until both stages succeed (the API thread has then read its configuration and
listed), and prints the top-level modules loaded since the exporter was first imported."""


def import_budget() -> list[str]:
    """The top-level packages docs/design.md allows (fnmatch patterns), from its marked list."""
    text = DESIGN.read_text()
    match = re.search(r"<!-- import-budget: begin -->\n(.*?)<!-- import-budget: end -->", text, re.DOTALL)
    assert match, "docs/design.md lost its import-budget list"
    names = [name for line in match.group(1).splitlines() for name in re.findall(r"`([^`]+)`", line.split(":")[0])]
    assert names, "the import-budget list is empty"
    return names


def test_the_budget_list_is_read_from_the_design_notes() -> None:
    budget = import_budget()
    assert {"exporter", "prometheus_client", "h2", "yaml", "_cython_*"} <= set(budget)
    assert not any(fnmatch.fnmatch("kubernetes", pattern) for pattern in budget)


def test_with_attribution_on_only_the_budgeted_packages_are_loaded(tmp_path: Path) -> None:
    uuid = "GPU-00000000-0000-0000-0000-000000000000"
    with KubeApiEmulator() as api, FakeKubelet() as kubelet:
        api.put(make_pod("train-0", "ml", owner=("Job", "nightly-1"), containers={"main": "a" * 64}))
        api.add_job("ml", "nightly-1", cronjob="nightly")
        kubelet.pods = [pod("ml", "train-0", [("main", [("nvidia.com/gpu", [uuid])])])]
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            f"clusters: [{{name: e, cluster: {{server: '{api.url}'}}}}]\n"
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: c, context: {cluster: e, user: u}}]\n"
        )
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "KUBERNETES_SERVICE_HOST": ""}
        flags = [
            "--backend",
            "nvml",
            "--kubernetes.podresources-socket",
            kubelet.socket_path,
            "--kubernetes.api",
            "--kubernetes.node-name",
            "gpu-node-1",
        ]
        proc = subprocess.run(
            [sys.executable, "-c", _ATTRIBUTION_PROGRAM, *flags],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    budget = import_budget()
    outside = [
        name
        for name in loaded
        if name not in sys.stdlib_module_names and not any(fnmatch.fnmatch(name, pattern) for pattern in budget)
    ]
    assert outside == [], f"loaded but not in docs/design.md's import budget: {outside}"
    assert {"exporter", "h2", "yaml"} <= set(loaded), "the kubelet client and the kubeconfig were used"


# --- the dashboard's option parsers load no HTTP front -----------------------------------------------

_INPUTS_PROGRAM = """
import dashboard.inputs, sys
print(sorted(m for m in sys.modules if m.split('.')[0] in ('h11','asyncio','ssl') or m.startswith('exporter.http')))
"""


def test_the_dashboards_option_parsers_load_no_http_front() -> None:
    # They share the exporter's number and duration parser (exporter/quantities.py), a leaf module;
    # through exporter.config they used to load the exporter's HTTP front, asyncio, ssl and h11.
    proc = subprocess.run(
        [sys.executable, "-c", _INPUTS_PROGRAM], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
