"""The dashboard and the advisor reach a secured Prometheus: a real Prometheus behind TLS and basic
auth (its ``--web.config.file``) or requiring client certificates, scraping a simulated exporter;
a bearer token and extra headers against a recording HTTP server; bad settings refused at start."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import bcrypt
import pytest
import trustme
from streamlit.testing.v1 import AppTest

from dashboard.cli import build_parser, settings_from_args
from dashboard.settings import ENV_PREFIX, from_env, to_env
from dashboard.sources import prometheus_auth
from dashboard.sources.prometheus import PrometheusSource
from dashboard.sources.prometheus_auth import PrometheusAuth
from dashboard.sources.source import SourceError
from tests.support.exporter import run_exporter
from tests.support.markdown import shown
from tests.support.prometheus import RULES_FILE, run_prometheus, scrape_config

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
APP = str(REPO / "dashboard" / "app.py")
USER = "gpulens"


@dataclass
class Pki:
    """Files of one test PKI: the CA, the server's and a client's certificate and key."""

    ca: trustme.CA
    ca_file: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _pair(cert: trustme.LeafCert, folder: Path, name: str) -> tuple[Path, Path]:
    crt, key = folder / f"{name}.crt", folder / f"{name}.key"
    cert.cert_chain_pems[0].write_to_path(str(crt))
    cert.private_key_pem.write_to_path(str(key))
    return crt, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    ca_file = folder / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server = _pair(ca.issue_cert("127.0.0.1", "localhost"), folder, "server")
    client = _pair(ca.issue_cert("gpulens-dashboard"), folder, "client")
    return Pki(ca, ca_file, *server, *client)


def _web_config(pki: Pki, password: str | None, client_certs: bool = False) -> str:
    lines = [
        "tls_server_config:",
        f"  cert_file: {pki.server_cert}",
        f"  key_file: {pki.server_key}",
    ]
    if client_certs:
        lines += ["  client_auth_type: RequireAndVerifyClientCert", f"  client_ca_file: {pki.ca_file}"]
    if password is not None:
        digest = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
        lines += ["basic_auth_users:", f"  {USER}: {digest}"]
    return "\n".join(lines) + "\n"


def _ready_context(pki: Pki, client: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    if client:
        ctx.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    return ctx


def _basic(password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{USER}:{password}".encode()).decode()}


@dataclass
class Secured:
    """A running TLS + basic-auth Prometheus that scrapes a simulated 8 x H200 exporter."""

    url: str
    web_config: Path
    password_file: Path
    pki: Pki

    def auth(self, **overrides: Any) -> PrometheusAuth:
        base: dict[str, Any] = {
            "ca_file": str(self.pki.ca_file),
            "basic_auth_username": USER,
            "basic_auth_password_file": str(self.password_file),
        }
        return PrometheusAuth(**{**base, **overrides})


@pytest.fixture(scope="module")
def secured(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    folder = tmp_path_factory.mktemp("secured")
    password_file = folder / "password"
    password_file.write_text("first-secret\n")  # the newline kubectl and echo leave is ignored
    web_config = folder / "web-config.yml"
    web_config.write_text(_web_config(pki, "first-secret"))
    with (
        run_exporter("--sim.scenario", "h200x8") as exporter,
        run_prometheus(
            scrape_config([exporter.removeprefix("http://")]) + "rule_files: [gpulens.rules.yml]\n",
            {"gpulens.rules.yml": RULES_FILE.read_text()},
            web_config=web_config,
            ready_context=_ready_context(pki),
            ready_headers=_basic("first-secret"),
        ) as url,
    ):
        ready = Secured(url, web_config, password_file, pki)
        src = PrometheusSource(url, auth=ready.auth())
        _wait(lambda: len(src.label_values("uuid")) == 8 and len(src.query("gpulens:gpu_idle:bool")) == 8)
        yield ready


def _wait(predicate: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except SourceError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.5)


# --- a real Prometheus behind TLS and basic auth -------------------------------------------
def test_ca_and_basic_auth_reach_a_secured_prometheus(secured: Secured) -> None:
    src = PrometheusSource(secured.url, auth=secured.auth().validate())
    assert len(src.label_values("uuid")) == 8
    assert src.query("vector(1)")["value"].tolist() == [1.0]


def test_missing_or_wrong_credentials_are_named_as_such(secured: Secured, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("guess")
    for auth in (PrometheusAuth(ca_file=str(secured.pki.ca_file)), secured.auth(basic_auth_password_file=str(wrong))):
        with pytest.raises(SourceError) as err:
            PrometheusSource(secured.url, auth=auth).query("vector(1)")
        assert "HTTP 401" in str(err.value) and "--prometheus-" in str(err.value)


def test_a_server_certificate_from_an_unknown_ca_is_a_tls_error(secured: Secured) -> None:
    with pytest.raises(SourceError) as err:
        PrometheusSource(secured.url, auth=secured.auth(ca_file=None)).query("vector(1)")
    assert "TLS" in str(err.value) and "certificate verify failed" in str(err.value)
    insecure = secured.auth(ca_file=None, insecure_skip_verify=True)
    with pytest.warns(Warning):  # urllib3 warns about every unverified request, as it should
        assert PrometheusSource(secured.url, auth=insecure).query("vector(1)")["value"].tolist() == [1.0]


def test_a_rotated_password_is_used_without_a_restart(secured: Secured) -> None:
    src = PrometheusSource(secured.url, auth=secured.auth())
    assert src.query("vector(1)")["value"].tolist() == [1.0]
    original = secured.web_config.read_text()
    try:
        # Prometheus reads its web config on every request; the dashboard its password file.
        secured.web_config.write_text(_web_config(secured.pki, "second-secret"))
        secured.password_file.write_text("second-secret")
        assert src.query("vector(2)")["value"].tolist() == [2.0]
    finally:
        secured.web_config.write_text(original)
        secured.password_file.write_text("first-secret\n")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_client_certificates_for_mutual_tls(pki: Pki, tmp_path: Path) -> None:
    with run_prometheus(
        scrape_config([]),
        web_config=_write(tmp_path / "web-config.yml", _web_config(pki, None, client_certs=True)),
        ready_context=_ready_context(pki, client=True),
    ) as url:
        with pytest.raises(SourceError) as err:
            PrometheusSource(url, auth=PrometheusAuth(ca_file=str(pki.ca_file))).query("vector(1)")
        assert "Prometheus at" in str(err.value)
        mtls = PrometheusAuth(ca_file=str(pki.ca_file), cert_file=str(pki.client_cert), key_file=str(pki.client_key))
        assert PrometheusSource(url, auth=mtls.validate()).query("vector(3)")["value"].tolist() == [3.0]


def test_the_dashboard_app_reads_a_secured_prometheus(secured: Secured, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_PREFIX + "SCRAPE", raising=False)
    monkeypatch.setenv(ENV_PREFIX + "REFRESH_SECONDS", "0")
    monkeypatch.setenv(ENV_PREFIX + "PROMETHEUS", secured.url)
    for key, value in prometheus_auth.to_env(secured.auth(), ENV_PREFIX).items():
        monkeypatch.setenv(key, value)
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [shown(e.value) for e in at.error]
    assert {m.label: m.value for m in at.metric}["Devices"] == "8"


def test_the_dashboard_app_names_a_bad_auth_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_PREFIX + "SCRAPE", raising=False)
    monkeypatch.setenv(ENV_PREFIX + "PROMETHEUS", "https://prometheus.invalid:9090")
    monkeypatch.setenv(ENV_PREFIX + "PROMETHEUS_CA_FILE", str(tmp_path / "missing.pem"))
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("--prometheus-ca-file" in shown(e.value) for e in at.error), [shown(e.value) for e in at.error]


# --- bearer token and headers ----------------------------------------------------------------
class _Recorder(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, str]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).seen.append(dict(self.headers))
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def recorder() -> Iterator[tuple[str, list[dict[str, str]]]]:
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _Recorder.seen
    finally:
        server.shutdown()
        server.server_close()


def test_bearer_token_and_headers_are_sent_and_a_rotated_token_is_picked_up(
    recorder: tuple[str, list[dict[str, str]]], tmp_path: Path
) -> None:
    url, seen = recorder
    token = tmp_path / "token"
    token.write_text("tok-1\n")
    auth = PrometheusAuth(bearer_token_file=str(token), headers=(("X-Scope-OrgID", "team-a"),)).validate()
    src = PrometheusSource(url, auth=auth)
    src.query("vector(1)")
    token.write_text("tok-2-longer")
    src.query("vector(1)")
    assert [h["Authorization"] for h in seen] == ["Bearer tok-1", "Bearer tok-2-longer"]
    assert {h["X-Scope-OrgID"] for h in seen} == {"team-a"}
    token.unlink()
    with pytest.raises(SourceError) as err:
        src.query("vector(1)")
    assert "credentials" in str(err.value) and str(token) in str(err.value)


# --- bad settings fail fast ------------------------------------------------------------------
@pytest.fixture()
def files(tmp_path: Path, pki: Pki) -> dict[str, str]:
    (tmp_path / "token").write_text("t")
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "not-a-ca.pem").write_text("hello")
    return {
        "token": str(tmp_path / "token"),
        "empty": str(tmp_path / "empty"),
        "missing": str(tmp_path / "missing"),
        "bad_ca": str(tmp_path / "not-a-ca.pem"),
        "ca": str(pki.ca_file),
        "cert": str(pki.client_cert),
        "key": str(pki.client_key),
        "server_key": str(pki.server_key),
    }


BAD: list[tuple[dict[str, Any], str]] = [
    ({"bearer_token_file": "missing"}, "--prometheus-bearer-token-file"),
    ({"bearer_token_file": "empty"}, "is empty"),
    ({"bearer_token_file": "token", "basic_auth_username": "u", "basic_auth_password_file": "token"}, "exclude"),
    ({"basic_auth_username": "u"}, "go together"),
    ({"basic_auth_password_file": "token"}, "go together"),
    ({"basic_auth_username": "u", "basic_auth_password_file": "missing"}, "--prometheus-basic-auth-password-file"),
    ({"ca_file": "bad_ca"}, "--prometheus-ca-file"),
    ({"ca_file": "missing"}, "--prometheus-ca-file"),
    ({"cert_file": "cert"}, "go together"),
    ({"cert_file": "cert", "key_file": "server_key"}, "matching"),
    ({"ca_file": "ca", "insecure_skip_verify": True}, "pointless"),
    ({"headers": (("X Bad", "v"),)}, "not a valid header name"),
    ({"headers": (("Authorization", "Bearer x"),)}, "bearer-token"),
]


@pytest.mark.parametrize(("fields", "needle"), BAD, ids=[n for _, n in BAD])
def test_bad_settings_are_refused_naming_the_problem(
    files: dict[str, str], fields: dict[str, Any], needle: str
) -> None:
    resolved: dict[str, Any] = {k: files.get(v, v) if isinstance(v, str) else v for k, v in fields.items()}
    with pytest.raises(ValueError) as err:
        PrometheusAuth(**resolved).validate()
    assert needle in str(err.value)


def test_good_settings_validate(files: dict[str, str]) -> None:
    auth = PrometheusAuth(
        basic_auth_username="u",
        basic_auth_password_file=files["token"],
        ca_file=files["ca"],
        cert_file=files["cert"],
        key_file=files["key"],
        headers=(("X-Scope-OrgID", "a"),),
    )
    assert auth.validate() is auth


def test_dashboard_flags_become_settings_and_survive_the_environment(files: dict[str, str]) -> None:
    args = build_parser().parse_args(
        [
            "--prometheus",
            "https://prom:9090",
            "--prometheus-bearer-token-file",
            files["token"],
            "--prometheus-ca-file",
            files["ca"],
            "--prometheus-header",
            "X-Scope-OrgID=team-a",
            "--prometheus-header",
            "X-Extra=a=b",
        ]
    )
    cfg = settings_from_args(args)
    assert cfg.prometheus_auth.headers == (("X-Scope-OrgID", "team-a"), ("X-Extra", "a=b"))
    assert from_env(to_env(cfg)) == cfg
    with pytest.raises(ValueError, match="need --prometheus"):
        settings_from_args(
            build_parser().parse_args(["--scrape", "http://x:9445", "--prometheus-ca-file", files["ca"]])
        )


@pytest.mark.parametrize("module", ["dashboard", "dashboard.advisor"])
def test_both_clis_exit_2_on_a_bad_auth_flag(module: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            module,
            "--prometheus",
            "https://prom:9090",
            "--prometheus-ca-file",
            str(tmp_path / "x"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--prometheus-ca-file" in proc.stderr
