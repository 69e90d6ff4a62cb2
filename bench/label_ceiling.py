"""The page a node serves when tenants choose 1 MiB names (issue 51, defect 5), and one that does not.

    .venv/bin/python -m bench.label_ceiling

The exporter runs as a process (``--backend sim``, the default scenario) with the API emulator and a
real gRPC kubelet (tests/fakes).  Three pods each hold a GPU: one plain, one whose controller is
named with 1 MiB, one holding its GPU through a DRA ResourceClaim named with 1 MiB (the driver's
device published in a ResourceSlice).  Prints the page's size and its longest line, for the plain
node (the three pods with short names) and the hostile one.  The exporter is this checkout's
(tests/support/process.py runs it from the repository's root): to measure an older one, check out
its ``exporter/`` first (``git checkout <commit> -- exporter``, then ``git checkout HEAD -- exporter``).
"""

from __future__ import annotations

import argparse
import http.client
import tempfile
import time
from pathlib import Path

from tests.fakes.kube_api_server import KubeApiEmulator, make_pod, make_resource_slice, nvidia_gpu
from tests.fakes.kubelet_server import FakeKubelet, pod
from tests.support.exporter import run_exporter
from tests.support.scrape import api_env, gpu_uuids, scrape

MIB = 1024 * 1024
NODE = "gpu-node-1"
DRIVER = "gpu.nvidia.com"


def _page(base: str) -> bytes:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"/metrics answered {resp.status}: {body[:200]!r}")
        return body
    finally:
        conn.close()


def measure(owner: str, claim: str, settle: float) -> tuple[int, int, int]:
    """(page bytes, longest line bytes, allocation series) with these names for the owner and the
    claim, once the three pods are attributed."""
    with KubeApiEmulator() as api, FakeKubelet() as kubelet, tempfile.TemporaryDirectory() as tmp:
        api.put(make_pod("plain-0", "ml", owner=("StatefulSet", "plain")))
        api.put(make_pod("owner-0", "ml", owner=("Job", owner)))
        api.put(make_pod("claim-0", "ml", owner=("StatefulSet", "claim")))
        args = (
            *("--kubernetes.podresources-socket", kubelet.socket_path, "--kubernetes.refresh-interval", "1s"),
            *("--kubernetes.api", "--kubernetes.node-name", NODE, "--no-probes", "--no-kubernetes.owner-chain"),
        )
        with run_exporter(*args, env=api_env(api, Path(tmp))) as base:
            first = scrape(base)
            uuids = gpu_uuids(first)
            bus = {lab["uuid"]: lab["pci_bus_id"] for lab, _ in first["gpulens_gpu_info"]}
            api.put_slice(make_resource_slice(NODE, DRIVER, NODE, [nvidia_gpu("gpu-2", uuids[2], bus[uuids[2]])]))
            kubelet.pods = [
                pod("ml", "plain-0", [("main", [("nvidia.com/gpu", [uuids[0]])])]),
                pod("ml", "owner-0", [("main", [("nvidia.com/gpu", [uuids[1]])])]),
                pod("ml", "claim-0", [("main", [], [("ml", claim, [(DRIVER, NODE, "gpu-2", ["x.com/c=d"])])])]),
            ]
            deadline = time.monotonic() + settle
            while True:  # until the three pods' allocations carry their workloads (or the time is up)
                body = _page(base)
                held = [x for x in body.splitlines() if x.startswith(b"gpulens_pod_gpu_allocation{")]
                if sum(b'workload="",' not in x for x in held) >= 3 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            return len(body), max(len(line) for line in body.splitlines()), len(held)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.label_ceiling")
    parser.add_argument("--settle", type=float, default=60.0, help="most seconds to wait for the pods")
    ns = parser.parse_args()
    print("| names | page bytes | longest line bytes | allocation series |\n|---|---|---|---|")
    for label, owner, claim in (("short", "trainer", "llm-0-gpu"), ("1 MiB owner and claim", "o" * MIB, "c" * MIB)):
        size, line, held = measure(owner, claim, ns.settle)
        print(f"| {label} | {size:,} | {line:,} | {held} |")


if __name__ == "__main__":
    main()
