"""The container images: built by scripts/image.sh (buildah, no daemon, no registry), reproducible,
within their size budget, holding exactly the locked packages, and running under podman the way the
chart runs them (its uid, no capabilities, no new privileges, read-only root, a tmpfs only where the
chart mounts an emptyDir).

The build (the exporter, its -cuda12 variant with CuPy, the dashboard) runs once per session: about
25 s here with a warm cache, 70 s from a clean clone. The reproducibility test builds the exporter
and the dashboard a second time into another folder, from empty storage and without the cached root
filesystem, and compares digests. Needs root, mmdebstrap, buildah, podman, runc and slirp4netns:
scripts/test.sh installs them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from tests.support.deploy import DOCKERFILE, dockerfile_stages, objects, one
from tests.support.net import free_port, get, wait_http
from tests.support.podman import Podman

REPO = Path(__file__).resolve().parents[1]
IMAGE_CONF = REPO / "deploy" / "image"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
REGISTRY = "ghcr.io/gpulens"
EXPORTER_BUDGET_BYTES = 120 * 1000 * 1000  # uncompressed, without CuPy (docs/deploy.md)
STOP_WITHIN_S = 5.0
CUDA_RUNTIME_VERSION = "from cupy_backends.cuda.api import runtime; print(runtime.runtimeGetVersion())"

pytestmark = [pytest.mark.integration, pytest.mark.long, pytest.mark.timeout(1200)]


def build(out: Path, *targets: str, env: dict[str, str] | None = None) -> dict[str, Path]:
    """Run scripts/image.sh into ``out``: archive name (``<image>`` or ``<image>-cuda12``) -> path."""
    for tool in ("mmdebstrap", "buildah", "uv"):
        assert shutil.which(tool), f"{tool} missing: run the README test command (scripts/test.sh)"
    assert os.geteuid() == 0, "scripts/image.sh needs root (mmdebstrap --mode=root, rootful buildah)"
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "image.sh"), *targets],
        env={**os.environ, "GPULENS_IMAGE_OUT": str(out), **(env or {})},
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    built = {name: out / f"{name}-{VERSION}.oci.tar" for name in ("gpulens-exporter", "gpulens-dashboard")}
    if "exporter-cuda12" in targets:
        built["gpulens-exporter-cuda12"] = out / f"gpulens-exporter-{VERSION}-cuda12.oci.tar"
    return built


@pytest.fixture(scope="session")
def archives() -> dict[str, Path]:
    """Both images and the exporter with CuPy (the chart's exporter while probes are on)."""
    return build(REPO / "build" / "images", "all", "exporter-cuda12")


# ---- reading an OCI archive -----------------------------------------------------------------------


@dataclass(frozen=True)
class OciImage:
    """One image of an OCI archive: its manifest digest, config and layers (raw tar blobs)."""

    ref: str
    digest: str
    config: dict[str, Any]
    layers: list[tuple[str, int]]  # (digest, size in bytes, uncompressed)
    archive: Path

    def layer_members(self, index: int) -> list[tarfile.TarInfo]:
        with tarfile.open(self.archive) as outer:
            blob = outer.extractfile(f"./blobs/sha256/{self.layers[index][0].split(':')[1]}")
            assert blob is not None
            with tarfile.open(fileobj=blob) as layer:
                return layer.getmembers()

    def read(self, index: int, path: str) -> bytes:
        """The content of ``path`` (no leading slash) in layer ``index``."""
        with tarfile.open(self.archive) as outer:
            blob = outer.extractfile(f"./blobs/sha256/{self.layers[index][0].split(':')[1]}")
            assert blob is not None
            with tarfile.open(fileobj=blob) as layer:
                f = layer.extractfile(path)
                assert f is not None, path
                return f.read()

    @property
    def size(self) -> int:
        return sum(size for _, size in self.layers)


def read_oci(archive: Path) -> OciImage:
    with tarfile.open(archive) as tar:

        def blob(name: str) -> Any:
            f = tar.extractfile(name)
            assert f is not None, name
            return json.load(f)

        index = blob("./index.json")
        [entry] = index["manifests"]
        manifest = blob(f"./blobs/sha256/{entry['digest'].split(':')[1]}")
        config = blob(f"./blobs/sha256/{manifest['config']['digest'].split(':')[1]}")
        for layer in manifest["layers"]:
            assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar", layer
        return OciImage(
            ref=entry["annotations"]["org.opencontainers.image.ref.name"],
            digest=entry["digest"],
            config=config,
            layers=[(layer["digest"], int(layer["size"])) for layer in manifest["layers"]],
            archive=archive,
        )


def installed_packages(image: OciImage, venv: str) -> dict[str, str]:
    """Normalised distribution name -> version, from the dist-info folders of the image's venv."""
    pattern = re.compile(rf"^{venv.strip('/')}/lib/python3\.11/site-packages/([^/]+)-([^-/]+)\.dist-info$")
    found: dict[str, str] = {}
    for i in range(len(image.layers)):
        for member in image.layer_members(i):
            m = pattern.match(member.name.removeprefix("./"))
            if m and member.isdir():
                found[normalise(m.group(1))] = m.group(2)
    return found


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(lock: Path) -> dict[str, str]:
    """Name -> version pinned in a uv-compiled requirements file."""
    pins = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", lock.read_text(), flags=re.MULTILINE)
    return {normalise(n): v for n, v in pins}


# ---- the build ------------------------------------------------------------------------------------


def test_archives_are_named_and_tagged_from_the_package_version(archives: dict[str, Path]) -> None:
    for name, path in archives.items():
        image = read_oci(path)
        repository = name.removesuffix("-cuda12")
        tag = VERSION + ("-cuda12" if "cuda12" in name else "")
        assert image.ref == f"{REGISTRY}/{repository}:{tag}"
        assert image.config["config"]["Labels"]["org.opencontainers.image.version"] == VERSION
        assert (path.parent / f"{repository}-{tag}.digest").read_text().strip() == image.digest


def test_exporter_image_is_within_its_size_budget(archives: dict[str, Path]) -> None:
    image = read_oci(archives["gpulens-exporter"])
    assert image.size <= EXPORTER_BUDGET_BYTES, f"exporter image {image.size / 1e6:.1f} MB > 120 MB"
    assert len(image.layers) == 2  # the Debian root filesystem, the venv


def test_images_share_the_base_layer(archives: dict[str, Path]) -> None:
    images = [read_oci(p) for p in archives.values()]
    assert len({image.layers[0] for image in images}) == 1
    assert len({image.layers[1] for image in images}) == len(images)


def test_two_builds_from_empty_storage_give_the_same_digests(
    archives: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A second build into another folder (fresh buildah storage, fresh uv cache, the root
    filesystem rebuilt by mmdebstrap) yields byte-identical archives."""
    again = build(tmp_path_factory.mktemp("images-again"), "all", env={"GPULENS_IMAGE_CACHE": "0"})
    for name, path in archives.items():
        if name not in again:
            continue  # the CuPy exporter: built once, to keep the test command short
        assert read_oci(again[name]).digest == read_oci(path).digest, name
        assert again[name].read_bytes() == path.read_bytes(), name


@pytest.mark.parametrize(
    ("lock", "extras"),
    [
        ("requirements-exporter.txt", ["nvml", "k8s"]),
        ("requirements-exporter-cuda12.txt", ["nvml", "k8s", "probes", "cuda12"]),
        ("requirements-dashboard.txt", ["dashboard"]),
    ],
)
def test_locks_are_compiled_from_pyproject(lock: str, extras: list[str]) -> None:
    """Every requirement of pyproject.toml (and of deploy/image/constraints.txt) for the image's
    extras is pinned in its lock at a version it allows: a changed dependency needs a new lock."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *(r for extra in extras for r in project["optional-dependencies"][extra])]
    constraints = [
        line.split("#")[0].strip()
        for line in (IMAGE_CONF / "constraints.txt").read_text().splitlines()
        if line.split("#")[0].strip()
    ]
    pins = locked(IMAGE_CONF / lock)
    for text in wanted:
        req = Requirement(text)
        assert normalise(req.name) in pins, f"{lock} lacks {req.name}: recompile it (command in its header)"
        assert req.specifier.contains(pins[normalise(req.name)], prereleases=True), (lock, text)
    for text in constraints:
        req = Requirement(text)
        if normalise(req.name) in pins:
            assert req.specifier.contains(pins[normalise(req.name)], prereleases=True), (lock, text)
    header = (IMAGE_CONF / lock).read_text().splitlines()[1]
    assert [e for e in re.findall(r"--extra (\S+)", header)] == extras


def test_images_hold_exactly_the_locked_packages(archives: dict[str, Path]) -> None:
    for name, venv, lock in (
        ("gpulens-exporter", "/opt/exporter", "requirements-exporter.txt"),
        ("gpulens-exporter-cuda12", "/opt/exporter", "requirements-exporter-cuda12.txt"),
        ("gpulens-dashboard", "/opt/dashboard", "requirements-dashboard.txt"),
    ):
        want = {**locked(IMAGE_CONF / lock), "gpulens": VERSION}
        assert installed_packages(read_oci(archives[name]), venv) == want, name


def test_images_hold_the_working_tree_code(archives: dict[str, Path]) -> None:
    """The gpulens package in each image is the working tree's, not a cached older build."""
    site = "lib/python3.11/site-packages"
    for name, venv in (("gpulens-exporter", "opt/exporter"), ("gpulens-dashboard", "opt/dashboard")):
        image = read_oci(archives[name])
        for source in ("exporter/cli.py", "exporter/render/metrics.py", "dashboard/cli.py", "probes/cli.py"):
            assert image.read(1, f"{venv}/{site}/{source}") == (REPO / source).read_bytes(), (name, source)
        metadata = image.read(1, f"{venv}/{site}/gpulens-{VERSION}.dist-info/METADATA").decode()
        assert (REPO / "README.md").read_text() in metadata, f"{name}: README (long description) is stale"


def test_exporter_image_has_no_cupy_and_no_compiled_bytecode(archives: dict[str, Path]) -> None:
    image = read_oci(archives["gpulens-exporter"])
    names = [m.name for m in image.layer_members(1)]
    assert not [n for n in names if "/cupy" in n]
    assert not [n for n in names if n.endswith(".pyc")]
    assert not [n for n in names if n.startswith(("tmp/", "./tmp/"))], "build mounts left in the image"


# ---- the Docker route yields the same image -------------------------------------------------------


def dockerfile_env(body: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction in body:
        if instruction.startswith("ENV "):
            env.update(dict(re.findall(r"(\w+)=(\S+)", instruction)))
    return env


@pytest.mark.parametrize(
    ("name", "target", "venv", "lock"),
    [
        ("gpulens-exporter", "exporter", "/opt/exporter", "requirements-exporter.txt"),
        ("gpulens-dashboard", "dashboard", "/opt/dashboard", "requirements-dashboard.txt"),
    ],
)
def test_dockerfile_target_matches_the_built_image(
    archives: dict[str, Path], name: str, target: str, venv: str, lock: str
) -> None:
    """deploy/Dockerfile installs the same lock with the same recipe into the same venv, and its
    target sets the same user, entrypoint, port and environment as the image scripts/image.sh built."""
    stages = dockerfile_stages()
    image = read_oci(archives[name])
    config = image.config["config"]
    # Python: Debian bookworm's python3 in both routes.
    text = DOCKERFILE.read_text()
    assert "debian:bookworm-slim" in text
    assert any("python3=3.11.2-" in i for i in stages["python"])
    assert re.search(
        r"python3\.11 ", "".join(m.name + " " for m in image.layer_members(0) if "bin/python3.11" in m.name)
    )
    # Packages: the recipe with the lock image.sh used, into the same path.
    build_run = " ".join(i for i in stages["build"] if i.startswith("RUN"))
    [(exporter_lock)] = re.findall(r"^ARG EXPORTER_LOCK=(\S+)$", text, flags=re.MULTILINE)
    build_run = build_run.replace("${EXPORTER_LOCK}", exporter_lock).replace('"', "")
    assert f"deploy/image/install_venv.py {venv} deploy/image/{lock} /src" in build_run
    assert installed_packages(image, venv) == {**locked(IMAGE_CONF / lock), "gpulens": VERSION}
    # Runtime settings.
    body = stages[target]
    assert f"COPY --from=build {venv} {venv}" in body
    [user] = [i.split()[1] for i in body if i.startswith("USER")]
    assert config["User"] == user
    [entry] = [json.loads(i.split(None, 1)[1]) for i in body if i.startswith("ENTRYPOINT")]
    assert config["Entrypoint"] == entry
    [port] = [i.split()[1] for i in body if i.startswith("EXPOSE")]
    assert set(config["ExposedPorts"]) == {f"{port}/tcp"}
    image_env = dict(e.split("=", 1) for e in config["Env"])
    assert image_env == dockerfile_env(body)


# ---- running the images as the chart runs them ----------------------------------------------------


@pytest.fixture(scope="module")
def podman(archives: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    p = Podman(tmp_path_factory.mktemp("podman"))
    for path in archives.values():
        p("load", "-q", "-i", str(path), timeout=300)
    yield p
    p("rm", "-a", "-f", check=False)


@dataclass(frozen=True)
class ChartRun:
    """How the chart runs one container, translated to podman flags."""

    uid: int
    port: int
    args: list[str]
    flags: list[str]
    mount_points: frozenset[str]
    """Paths of bind mounts, which the runtime creates (with their parents) before the process starts."""


def chart_run(pod: dict[str, Any], host_port: int, tmp: Path) -> ChartRun:
    """The pod spec's uid, security context, volumes and env as ``podman run`` flags: emptyDirs
    become tmpfs mounts (size from sizeLimit), hostPaths become read-only binds of empty folders."""
    [container] = pod["containers"]
    ctx = {**pod.get("securityContext", {}), **container["securityContext"]}
    uid = int(ctx["runAsUser"])
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"]["drop"] == ["ALL"] and "add" not in ctx["capabilities"]
    flags = [
        f"--user={uid}:{int(ctx.get('runAsGroup', uid))}",
        "--cap-drop=all",
        "--security-opt=no-new-privileges",
        "--read-only",
        "--read-only-tmpfs=false",  # podman's own /tmp, /var/tmp, /run tmpfs: the chart has none
        "--network=slirp4netns:port_handler=slirp4netns",
        f"--publish=127.0.0.1:{host_port}:{container['ports'][0]['containerPort']}",
    ]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mount_points: set[str] = set()
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "emptyDir" in volume:
            size = volume["emptyDir"].get("sizeLimit", "64Mi").replace("Mi", "m")
            flags.append(f"--tmpfs={mount['mountPath']}:rw,size={size},mode=1777")
        elif "hostPath" in volume:
            empty = tmp / mount["name"]
            empty.mkdir()
            flags.append(f"--volume={empty}:{mount['mountPath']}:ro")
            path = Path(mount["mountPath"])
            mount_points.update(str(p) for p in (path, *path.parents) if str(p) != "/")
        else:
            raise AssertionError(f"no podman equivalent for volume {volume}")
    for var in container.get("env", []):
        value = var.get("value", "test-node" if "valueFrom" in var else "")
        flags.append(f"--env={var['name']}={value}")
    return ChartRun(
        uid=uid,
        port=container["ports"][0]["containerPort"],
        args=list(container["args"]),
        flags=flags,
        mount_points=frozenset(mount_points),
    )


def proc_status(podman: Podman, name: str) -> dict[str, str]:
    pid = podman("inspect", "-f", "{{.State.Pid}}", name).stdout.strip()
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def stop_within(podman: Podman, name: str) -> int:
    """SIGTERM, then the exit code; fails if the container is still running after STOP_WITHIN_S."""
    podman("kill", "--signal", "TERM", name)
    deadline = time.monotonic() + STOP_WITHIN_S
    while time.monotonic() < deadline:
        state = podman("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", name).stdout.split()
        if state[0] in ("exited", "stopped"):
            return int(state[1])
        time.sleep(0.1)
    raise AssertionError(f"{name} still running {STOP_WITHIN_S} s after SIGTERM")


def assert_runs_hardened(podman: Podman, name: str, run: ChartRun) -> None:
    status = proc_status(podman, name)
    assert status["Uid"].split() == [str(run.uid)] * 4, status["Uid"]
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0
    assert status["NoNewPrivs"] == "1"
    assert written(podman, name, run) == [], "written outside the tmpfs"


def written(podman: Podman, name: str, run: ChartRun) -> list[str]:
    """``podman diff`` less the bind mount points the runtime itself made (read-only mounts)."""
    changes = podman("diff", name).stdout.splitlines()
    return [c for c in changes if c.split(maxsplit=1)[1] not in run.mount_points]


@pytest.mark.parametrize(
    ("probes", "archive"), [(False, "gpulens-exporter"), (True, "gpulens-exporter-cuda12")], ids=["plain", "cuda12"]
)
def test_exporter_image_runs_as_the_chart_runs_it(
    podman: Podman, archives: dict[str, Path], tmp_path: Path, probes: bool, archive: str
) -> None:
    """Probes off: the plain image; probes on (off by default): the -cuda12 image."""
    pod = one(objects({"exporter": {"probes": {"enabled": probes}}}), "DaemonSet")["spec"]["template"]["spec"]
    port = free_port()
    run = chart_run(pod, port, tmp_path)
    assert "--backend=nvml" in run.args
    args = [a if a != "--backend=nvml" else "--backend=sim" for a in run.args]
    image = pod["containers"][0]["image"]
    assert image == f"{REGISTRY}/gpulens-exporter:{VERSION}" + ("-cuda12" if probes else "")
    assert read_oci(archives[archive]).ref == image
    podman("run", "-d", "--name=exporter", *run.flags, image, *args)
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz", timeout=90)
        status, body = get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and 'gpulens_build_info{backend="sim"' in body
        promtool = shutil.which("promtool")
        assert promtool, "promtool missing: run the README test command (scripts/test.sh)"
        check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=60)
        assert check.returncode == 0 and not check.stdout.strip() and not check.stderr.strip(), (
            check.stdout + check.stderr
        )
        assert_runs_hardened(podman, "exporter", run)
        if probes:  # CuPy and its CUDA runtime load under the same restrictions (no driver here)
            version = podman("exec", "exporter", "python", "-c", CUDA_RUNTIME_VERSION).stdout.strip()
            assert version.isdigit() and int(version) >= 12000, version
            assert written(podman, "exporter", run) == []
        assert stop_within(podman, "exporter") == 0
        assert written(podman, "exporter", run) == []
    finally:
        logs = podman("logs", "exporter", check=False)
        podman("rm", "-f", "exporter", check=False)
    assert "Traceback" not in logs.stdout + logs.stderr, logs.stderr[-3000:]


def test_dashboard_image_runs_as_the_chart_runs_it(podman: Podman, tmp_path: Path) -> None:
    pod = one(objects(), "Deployment", "dashboard")["spec"]["template"]["spec"]
    port = free_port()
    run = chart_run(pod, port, tmp_path)
    image = pod["containers"][0]["image"]
    assert image == f"{REGISTRY}/gpulens-dashboard:{VERSION}"
    assert run.uid != 0
    podman("run", "-d", "--name=dashboard", *run.flags, image, *run.args)
    try:
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", timeout=120)
        assert_runs_hardened(podman, "dashboard", run)
        # The entrypoint execs Streamlit (through dashboard.server, which turns Nagle off on its
        # connections), so PID 1 is Streamlit's Python and SIGTERM reaches it.
        pid = podman("inspect", "-f", "{{.State.Pid}}", "dashboard").stdout.strip()
        assert Path(f"/proc/{pid}/cmdline").read_text().split("\0")[1:4] == ["-m", "dashboard.server", "run"]
        assert stop_within(podman, "dashboard") == 0
        assert written(podman, "dashboard", run) == []
    finally:
        podman("rm", "-f", "dashboard", check=False)


def test_podman_diff_does_see_a_write(podman: Podman) -> None:
    """The 'nothing written' check can fail: a writable container that writes shows in the diff."""
    image = f"{REGISTRY}/gpulens-exporter:{VERSION}"
    podman(
        "run",
        "--name=writer",
        "--network=none",
        "--user=0:0",
        "--entrypoint=/usr/bin/python3",
        image,
        "-c",
        "open('/opt/written', 'w').write('x')",
    )
    try:
        assert "A /opt/written" in podman("diff", "writer").stdout
    finally:
        podman("rm", "-f", "writer", check=False)


# ---- the chart refers to the images built here ----------------------------------------------------


def test_chart_app_version_is_the_package_version() -> None:
    chart = (REPO / "deploy" / "helm" / "gpulens" / "Chart.yaml").read_text()
    assert re.search(rf'^appVersion: "{re.escape(VERSION)}"$', chart, flags=re.MULTILINE)


def test_chart_image_tags_follow_the_built_tags() -> None:
    def exporter_image(values: dict[str, Any]) -> str:
        return str(one(objects(values), "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"])

    assert exporter_image({}) == f"{REGISTRY}/gpulens-exporter:{VERSION}"  # probes off by default
    with_probes = {"exporter": {"probes": {"enabled": True}}}
    assert exporter_image(with_probes) == f"{REGISTRY}/gpulens-exporter:{VERSION}-cuda12"
    pinned = {"exporter": {"image": {"repository": "registry.example.com/gl/exporter", "tag": "1.2.3"}}}
    assert exporter_image(pinned) == "registry.example.com/gl/exporter:1.2.3"
    dashboard = one(objects(), "Deployment", "dashboard")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert dashboard == f"{REGISTRY}/gpulens-dashboard:{VERSION}"
    rendered = (REPO / "deploy" / "manifests" / "gpulens.yaml").read_text()
    assert f'image: "{REGISTRY}/gpulens-exporter:{VERSION}"' in rendered
    assert f'image: "{REGISTRY}/gpulens-dashboard:{VERSION}"' in rendered
