"""The exporter loads only what its flags need: the Kubernetes client only with the API watch,
the HTTP/2 client (h2) only with a kubelet socket and never grpcio or protobuf, the probes only
with probes on, and never the dashboard's stack.

Each case builds the exporter as ``python -m exporter`` would (``exporter.cli.build``), runs one
sampling cycle and renders a scrape in a fresh interpreter, then lists the heavy modules loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

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
