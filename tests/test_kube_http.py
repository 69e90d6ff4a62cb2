"""The exporter's own path to the API (exporter/attribution/kube_http.py): in-cluster and
kubeconfig configuration, TLS always verified, tokens that rotate, client certificates, error
replies read only up to a cap, and a blocked read that another thread can interrupt.

TLS cases run against a small HTTPS server here (certificates from ``trustme``); the API's own
behaviour (list, watch, paging) is tested against the emulator in test_attribution_kubeapi.py.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trustme

from exporter.attribution import kube_http
from exporter.attribution.kube_http import (
    ApiError,
    ConfigError,
    KubeClient,
    StaticToken,
    TokenFile,
    endpoint_for,
    error_message,
    in_cluster_endpoint,
    kubeconfig_endpoint,
    load_endpoint,
)
from tests.fakes.kube_api_server import KubeApiEmulator, make_pod

pytestmark = pytest.mark.integration


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class TlsApi:
    """An HTTPS server on loopback that answers every GET with an empty PodList, checking the
    bearer token against ``tokens`` (any token when ``None``) and, with ``client_ca``, requiring a
    client certificate from that CA.  ``seen`` holds (Authorization, client certificate's common
    name) per request.  ``GET /error`` answers 500 with a body announced at 10 MB of which 8 KiB
    is sent, ``GET /watch`` a chunked line; both then hold the connection until ``release`` is
    set.  ``GET /hang-up`` answers, then closes the connection without saying so in advance.
    """

    def __init__(self, cert: trustme.LeafCert, client_ca: trustme.CA | None = None, host: str = "127.0.0.1") -> None:
        self.tokens: set[str] | None = None
        self.seen: list[tuple[str | None, str | None]] = []
        self.release = threading.Event()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(context)
        if client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            client_ca.configure_trust(context)
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                api._handle(self)

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._server = type("Server", (_Server,), {"address_family": family})((host, 0), Handler)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.host = host
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        peer = h.connection.getpeercert() if isinstance(h.connection, ssl.SSLSocket) else None
        subject: Any = (peer or {}).get("subject", ())
        names = [str(value) for rdn in subject for key, value in rdn if key == "commonName"]
        auth = h.headers.get("Authorization")
        self.seen.append((auth, names[0] if names else None))
        if self.tokens is not None and auth not in {f"Bearer {t}" for t in self.tokens}:
            self._send(h, 401, {"kind": "Status", "code": 401, "reason": "Unauthorized", "message": "Unauthorized"})
        elif h.path.startswith("/error"):
            head = json.dumps({"kind": "Status", "reason": "InternalError", "message": "etcd: " + "x" * 9000}).encode()
            h.send_response(500)
            h.send_header("Content-Length", str(10_000_000))
            h.end_headers()
            h.wfile.write(head[:8192])
            h.wfile.flush()
            self.release.wait(60)
            h.close_connection = True
        elif h.path.startswith("/watch"):
            h.send_response(200)
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            line = b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"7"}}}\n'
            h.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            h.wfile.flush()
            self.release.wait(60)
            h.close_connection = True
        else:
            self._send(h, 200, {"kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": []})
            h.close_connection = h.path.startswith("/hang-up")

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}"

    def close(self) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def server(ca: trustme.CA) -> Iterator[TlsApi]:
    api = TlsApi(ca.issue_cert("127.0.0.1", "kube.example"))
    yield api
    api.close()


def list_pods(client: KubeClient) -> dict[str, Any]:
    resp = client.get("/api/v1/pods", {"limit": 1})
    try:
        body: dict[str, Any] = json.loads(resp.read())
    finally:
        resp.release(True)
    return body


def service_account(folder: Path, ca: trustme.CA, token: str = "sa-token") -> Path:
    """A service-account mount as the kubelet writes it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "token").write_text(token)
    ca.cert_pem.write_to_path(str(folder / "ca.crt"))
    (folder / "namespace").write_text("gpulens")
    return folder


def write_kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "dev",
        "clusters": [{"name": "k", "cluster": cluster}],
        "users": [{"name": "me", "user": user}],
        "contexts": [{"name": "dev", "context": {"cluster": "k", "user": "me"}}],
    }
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# --- in-cluster ------------------------------------------------------------------------------------


def test_in_cluster_sends_the_service_account_token_over_verified_tls(
    server: TlsApi, ca: trustme.CA, tmp_path: Path
) -> None:
    folder = service_account(tmp_path / "sa", ca)
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(server.port)}
    endpoint = load_endpoint(env, service_account=folder)
    assert endpoint.origin == "in-cluster" and endpoint.url == server.url
    assert list_pods(KubeClient(endpoint))["kind"] == "PodList"
    assert server.seen == [("Bearer sa-token", None)]


def test_an_ipv6_service_host_is_bracketed_in_urls_and_reached(ca: trustme.CA, tmp_path: Path) -> None:
    folder = service_account(tmp_path / "sa", ca)
    endpoint = in_cluster_endpoint({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}, folder)
    assert endpoint.url == "https://[fd00::1]:443" and endpoint.host == "fd00::1"
    try:
        server = TlsApi(ca.issue_cert("::1"), host="::1")
    except OSError:
        pytest.skip("no IPv6 loopback here")
    try:
        env = {"KUBERNETES_SERVICE_HOST": "::1", "KUBERNETES_SERVICE_PORT": str(server.port)}
        assert list_pods(KubeClient(in_cluster_endpoint(env, folder)))["kind"] == "PodList"
    finally:
        server.close()


def test_a_server_certificate_from_another_ca_is_refused(server: TlsApi, tmp_path: Path) -> None:
    folder = service_account(tmp_path / "sa", trustme.CA())
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(server.port)}
    client = KubeClient(load_endpoint(env, service_account=folder))
    with pytest.raises(ssl.SSLCertVerificationError):
        client.get("/api/v1/pods")
    assert server.seen == []


def test_the_token_file_is_read_again_once_a_minute_old_not_before(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    now = [1000.0]
    token = TokenFile(path, clock=lambda: now[0])
    assert token.get() == "first"
    path.write_text("second")
    now[0] += 59.0
    assert token.get() == "first" and token.reads == 1, "the kubelet's rotation is not chased per request"
    now[0] += 1.0
    assert token.get() == "second" and token.reads == 2


def test_after_a_401_a_rotated_token_is_read_at_once_and_the_request_made_again(
    server: TlsApi, ca: trustme.CA, tmp_path: Path
) -> None:
    folder = service_account(tmp_path / "sa", ca, token="old")
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(server.port)}
    client = KubeClient(load_endpoint(env, service_account=folder))
    list_pods(client)
    (folder / "token").write_text("new")  # the kubelet rotated it; the old one is now refused
    server.tokens = {"new"}
    assert list_pods(client)["kind"] == "PodList"
    assert [auth for auth, _ in server.seen] == ["Bearer old", "Bearer old", "Bearer new"]


def test_a_refused_token_that_did_not_change_is_an_api_error_asked_once(
    server: TlsApi, ca: trustme.CA, tmp_path: Path
) -> None:
    folder = service_account(tmp_path / "sa", ca, token="revoked")
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(server.port)}
    server.tokens = {"other"}
    with pytest.raises(ApiError) as info:
        KubeClient(load_endpoint(env, service_account=folder)).get("/api/v1/pods")
    assert info.value.status == 401 and str(info.value) == "HTTP 401: Unauthorized: Unauthorized"
    assert len(server.seen) == 1


def test_where_the_configuration_comes_from(ca: trustme.CA, tmp_path: Path) -> None:
    folder = service_account(tmp_path / "sa", ca)
    kubeconfig = write_kubeconfig(tmp_path / "config", {"server": "http://127.0.0.1:8001"}, {})
    in_pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", "KUBECONFIG": str(kubeconfig)}
    assert load_endpoint(in_pod, service_account=folder).origin == "in-cluster", "the pod's identity first"
    outside = {**in_pod, "KUBERNETES_SERVICE_HOST": ""}
    assert load_endpoint(outside, folder).origin == f"kubeconfig {kubeconfig} (context 'dev')"
    listed = {"KUBECONFIG": os.pathsep.join([str(kubeconfig), str(tmp_path / "other")])}
    assert load_endpoint(listed, folder).url == "http://127.0.0.1:8001", "the first file of $KUBECONFIG"
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    kubeconfig.rename(home / ".kube" / "config")
    assert load_endpoint({"HOME": str(home)}, folder).url == "http://127.0.0.1:8001", "else ~/.kube/config"

    with pytest.raises(ConfigError, match=r"not in a pod \(KUBERNETES_SERVICE_HOST unset\) and no kubeconfig at"):
        load_endpoint({"HOME": str(tmp_path)}, folder)
    with pytest.raises(ConfigError, match=r"no service-account token at .* \(automountServiceAccountToken: false\?\)"):
        load_endpoint({**in_pod, "KUBECONFIG": str(tmp_path / "none")}, tmp_path / "unmounted")
    (folder / "ca.crt").unlink()
    with pytest.raises(ConfigError, match=r"^in-cluster: cannot load the CA certificate .*ca\.crt"):
        load_endpoint(in_pod, folder)


# --- kubeconfig ------------------------------------------------------------------------------------


def test_kubeconfig_ca_file_relative_to_the_kubeconfig_and_a_token(
    server: TlsApi, ca: trustme.CA, tmp_path: Path
) -> None:
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    path = write_kubeconfig(
        tmp_path / "config", {"server": server.url, "certificate-authority": "ca.pem"}, {"token": "dev-token"}
    )
    list_pods(KubeClient(kubeconfig_endpoint(path)))
    assert server.seen == [("Bearer dev-token", None)]


def test_kubeconfig_ca_data_and_a_token_file_that_wins_over_a_token(
    server: TlsApi, ca: trustme.CA, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text("from-file")
    cluster = {"server": server.url, "certificate-authority-data": b64(ca.cert_pem.bytes())}
    path = write_kubeconfig(tmp_path / "config", cluster, {"token": "inline", "tokenFile": "token"})
    list_pods(KubeClient(kubeconfig_endpoint(path)))
    assert server.seen == [("Bearer from-file", None)]


def test_kubeconfig_client_certificate_data_is_loaded_through_a_private_file_then_removed(
    ca: trustme.CA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = TlsApi(ca.issue_cert("127.0.0.1"), client_ca=ca)
    client_cert = ca.issue_cert("gpulens-dev@example.com", common_name="gpulens-dev")
    loaded: list[tuple[str, int]] = []
    real = ssl.SSLContext.load_cert_chain

    def spy(context: ssl.SSLContext, certfile: Any, *args: Any, **kwargs: Any) -> None:
        loaded.append((str(certfile), stat.S_IMODE(os.stat(certfile).st_mode)))
        real(context, certfile, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", spy)
    try:
        user = {
            "client-certificate-data": b64(b"".join(p.bytes() for p in client_cert.cert_chain_pems)),
            "client-key-data": b64(client_cert.private_key_pem.bytes()),
        }
        cluster = {"server": server.url, "certificate-authority-data": b64(ca.cert_pem.bytes())}
        list_pods(KubeClient(kubeconfig_endpoint(write_kubeconfig(tmp_path / "config", cluster, user))))
        assert server.seen == [(None, "gpulens-dev")], "the server saw our certificate"
        [(name, mode)] = loaded
        assert mode == 0o600, oct(mode)
        assert not os.path.exists(name), "the key is not left on disk"
    finally:
        server.close()


def test_kubeconfig_client_certificate_files(ca: trustme.CA, tmp_path: Path) -> None:
    server = TlsApi(ca.issue_cert("127.0.0.1"), client_ca=ca)
    client_cert = ca.issue_cert("gpulens-dev@example.com", common_name="gpulens-dev")
    client_cert.cert_chain_pems[0].write_to_path(str(tmp_path / "client.crt"))
    client_cert.private_key_pem.write_to_path(str(tmp_path / "client.key"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    try:
        user = {"client-certificate": str(tmp_path / "client.crt"), "client-key": "client.key"}
        cluster = {"server": server.url, "certificate-authority": "ca.pem"}
        list_pods(KubeClient(kubeconfig_endpoint(write_kubeconfig(tmp_path / "config", cluster, user))))
        assert server.seen == [(None, "gpulens-dev")], "the server saw our certificate"
    finally:
        server.close()


def test_an_encrypted_client_key_is_an_error_not_a_password_prompt(ca: trustme.CA, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    client_cert = ca.issue_cert("gpulens-dev@example.com")
    key = serialization.load_pem_private_key(client_cert.private_key_pem.bytes(), None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    (tmp_path / "client.key").write_bytes(encrypted)
    client_cert.cert_chain_pems[0].write_to_path(str(tmp_path / "client.crt"))
    cluster = {"server": "https://127.0.0.1:6443"}
    for user in (
        {"client-certificate": "client.crt", "client-key": "client.key"},
        {"client-certificate": "client.crt", "client-key-data": b64(encrypted)},
    ):
        with pytest.raises(ConfigError, match="cannot load the client certificate and key"):
            kubeconfig_endpoint(write_kubeconfig(tmp_path / "config", cluster, user))


def test_verification_is_skipped_only_when_the_kubeconfig_says_so(server: TlsApi, tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "config", {"server": server.url}, {})
    with pytest.raises(ssl.SSLCertVerificationError):
        KubeClient(kubeconfig_endpoint(path)).get("/api/v1/pods")  # the system's CAs do not know trustme's
    path = write_kubeconfig(tmp_path / "config", {"server": server.url, "insecure-skip-tls-verify": True}, {})
    assert list_pods(KubeClient(kubeconfig_endpoint(path)))["kind"] == "PodList"


def test_tls_server_name_is_the_name_checked(server: TlsApi, ca: trustme.CA, tmp_path: Path) -> None:
    cluster = {"certificate-authority-data": b64(ca.cert_pem.bytes()), "server": f"https://localhost:{server.port}"}
    with pytest.raises(ssl.SSLCertVerificationError):  # the certificate names 127.0.0.1 and kube.example
        KubeClient(kubeconfig_endpoint(write_kubeconfig(tmp_path / "config", cluster, {}))).get("/api/v1/pods")
    cluster["tls-server-name"] = "kube.example"
    assert list_pods(KubeClient(kubeconfig_endpoint(write_kubeconfig(tmp_path / "config", cluster, {}))))


@pytest.mark.parametrize(
    ("user", "named"),
    [
        ({"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "gke-gcloud-auth-plugin"}}, "exec"),
        ({"auth-provider": {"name": "oidc", "config": {}}}, "auth-provider"),
        ({"username": "admin", "password": "secret"}, "username"),
    ],
)
def test_credential_plugins_are_refused_naming_them(user: dict[str, Any], named: str, tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "config", {"server": "https://10.0.0.1"}, user)
    with pytest.raises(ConfigError) as info:
        kubeconfig_endpoint(path)
    message = str(info.value)
    assert f"user 'me' authenticates with {named} " in message and "in a pod it uses its service account" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("clusters: [unclosed", "cannot read it: while parsing"),
        ("- a list", "not a kubeconfig"),
        ("clusters: []", "no current-context"),
        ("current-context: gone\ncontexts: []", "no context named 'gone'"),
        (
            "current-context: c\ncontexts: [{name: c, context: {cluster: k}}]\nclusters: [{name: k, cluster: {}}]",
            "the cluster has no server",
        ),
        (
            "current-context: c\ncontexts: [{name: c, context: {cluster: k}}]\n"
            "clusters: [{name: k, cluster: {server: 'ftp://x'}}]",
            "is not an http(s)://host URL",
        ),
        (
            "current-context: c\ncontexts: [{name: c, context: {cluster: k}}]\n"
            "clusters: [{name: k, cluster: {server: 'https://x', certificate-authority-data: '%%%'}}]",
            "certificate-authority-data is not base64",
        ),
        (
            "current-context: c\ncontexts: [{name: c, context: {cluster: k}}]\n"
            "clusters: [{name: k, cluster: {server: 'https://x', certificate-authority: missing.pem}}]",
            "certificate-authority " + "{dir}/missing.pem",
        ),
        (
            "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
            "clusters: [{name: k, cluster: {server: 'https://x'}}]\n"
            "users: [{name: u, user: {client-certificate-data: 'AAAA'}}]",
            "needs both client-certificate and client-key",
        ),
    ],
    ids=[
        "yaml",
        "not-mapping",
        "no-context",
        "unknown-context",
        "no-server",
        "scheme",
        "base64",
        "ca-file",
        "half-cert",
    ],
)
def test_a_broken_kubeconfig_is_one_clear_error(text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        kubeconfig_endpoint(path)
    assert str(info.value).startswith(f"kubeconfig {path}")
    assert message.format(dir=tmp_path) in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


# --- requests ---------------------------------------------------------------------------------------


class _CountingBody:
    """An error response whose body is endless; counts the bytes taken from it."""

    status, reason = 500, "Internal Server Error"

    def __init__(self) -> None:
        self.taken = 0

    def read1(self, amt: int) -> bytes:
        self.taken += min(amt, 1000)
        return b"y" * min(amt, 1000)


def test_an_error_body_is_read_only_up_to_its_cap() -> None:
    body = _CountingBody()
    message = error_message(body)  # type: ignore[arg-type]
    assert body.taken == kube_http.ERROR_BODY_BYTES
    assert message.startswith("Internal Server Error: yyy") and len(message) == kube_http.ERROR_MESSAGE_CHARS


def test_an_error_reply_is_an_api_error_without_waiting_for_the_rest_of_its_body(
    server: TlsApi, ca: trustme.CA
) -> None:
    """The server announced 10 MB, sent 8 KiB and holds the rest: the error is raised from the
    first 4 KiB (the official client read the whole body, here until its read timeout)."""
    context = ssl.create_default_context(cadata=ca.cert_pem.bytes().decode())
    client = KubeClient(endpoint_for(server.url, context, StaticToken("t")))
    with pytest.raises(ApiError) as info:
        client.get("/error", read_timeout=20)
    assert info.value.status == 500
    assert str(info.value).startswith("HTTP 500: Internal Server Error: {")
    assert not server.release.is_set(), "raised while the server still held the rest of the body"


def test_shutdown_interrupts_a_read_blocked_on_a_tls_watch(server: TlsApi, ca: trustme.CA) -> None:
    context = ssl.create_default_context(cadata=ca.cert_pem.bytes().decode())
    resp = KubeClient(endpoint_for(server.url, context)).get("/watch", {"watch": True}, read_timeout=120)
    assert resp.read1(65536).startswith(b'{"type":"BOOKMARK"')
    ended: list[BaseException | bytes] = []

    def read() -> None:
        try:
            ended.append(resp.read1(65536))  # blocks: the server sends nothing more
        except Exception as exc:  # an incomplete chunked body
            ended.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(0.3)
    assert reader.is_alive() and not ended
    resp.shutdown()
    reader.join(10)  # a hang check: without the shutdown the read waits 120 s
    assert not reader.is_alive() and ended
    resp.release(False)


def test_one_connection_serves_consecutive_requests() -> None:
    with KubeApiEmulator() as api:
        api.put(make_pod("a"))
        client = KubeClient(endpoint_for(api.url))
        for _ in range(3):
            assert [p["metadata"]["name"] for p in list_pods(client)["items"]] == ["a"]
        assert client.connections == 1, "kept alive between requests"
        client.close()


def test_a_kept_connection_the_server_closed_is_replaced_without_an_error(server: TlsApi, ca: trustme.CA) -> None:
    context = ssl.create_default_context(cadata=ca.cert_pem.bytes().decode())
    client = KubeClient(endpoint_for(server.url, context))
    resp = client.get("/hang-up")
    resp.read()
    resp.release(True)  # kept: the reply did not say the connection would close
    assert list_pods(client)["kind"] == "PodList"
    assert client.connections == 2 and len(server.seen) == 2


def test_query_values_are_encoded_as_the_api_server_reads_them() -> None:
    with KubeApiEmulator() as api:
        client = KubeClient(endpoint_for(api.url + "/"))
        resp = client.get("/api/v1/pods", {"fieldSelector": "spec.nodeName=n 1", "limit": 5, "continue": None})
        resp.release(False)
        resp = client.get("/api/v1/pods", {"watch": True, "allowWatchBookmarks": False, "timeoutSeconds": 1})
        resp.read()
        resp.release(True)
    assert [q for _, q in api.requests] == [
        {"fieldSelector": "spec.nodeName=n 1", "limit": "5"},
        {"watch": "true", "allowWatchBookmarks": "false", "timeoutSeconds": "1"},
    ]


def test_a_server_url_with_a_path_prefixes_every_request(tmp_path: Path) -> None:
    endpoint = endpoint_for("https://rancher.example/k8s/clusters/c-1/")
    assert endpoint.base_path == "/k8s/clusters/c-1" and endpoint.port == 443 and endpoint.tls is not None
    assert endpoint.url == "https://rancher.example:443/k8s/clusters/c-1"


def test_the_accept_header_is_json_unless_the_caller_asks_for_another() -> None:
    metadata_only = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
    with KubeApiEmulator() as api:
        api.put(make_pod("a", "ml"))
        client = KubeClient(endpoint_for(api.url))
        resp = client.get("/api/v1/namespaces/ml/pods/a")
        assert json.loads(resp.read())["kind"] == "Pod"
        resp.release(True)
        resp = client.get("/api/v1/namespaces/ml/pods/a", accept=metadata_only)
        assert json.loads(resp.read())["kind"] == "PartialObjectMetadata"
        resp.release(True)
        with pytest.raises(ValueError, match="line break"):
            client.get("/api/v1/namespaces/ml/pods/a", accept="application/json\r\nX-Injected: 1")
        client.close()
    assert [accept for _, accept in api.accepts] == ["application/json", metadata_only]
