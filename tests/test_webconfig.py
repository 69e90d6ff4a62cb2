"""--web.config.file: TLS, mTLS, basic auth; bad files refuse to start; certificates rotate live."""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
import trustme

from exporter.http.limits import Limits
from exporter.http.webconfig import BasicAuth, WebConfigError, load_web_config
from tests.support.net import free_port
from tests.support.web import client_ctx, serving, write_pair

HASH = "$2b$10$jkQTlPYBfAEbC2HcRJZOHOwjhmjTXR7yH..Boh3EDmUBCP.5hgYKq"
"""bcrypt of ``s3cret`` at cost 10, written out so that test IDs built from it are the same in every
process (pytest-xdist workers must collect identical tests)."""


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def _serve(config_path: Path, limits: Limits | None = None) -> Iterator[int]:
    with serving(config_path, limits) as server:
        yield server.port


_write_pair = write_pair
_client_ctx = client_ctx


def _get(port: int, ctx: ssl.SSLContext | None, path: str = "/metrics", headers: dict[str, str] | None = None) -> int:
    conn: http.client.HTTPConnection
    if ctx is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=ctx)
    try:
        conn.request("GET", path, headers=headers or {})
        return conn.getresponse().status
    finally:
        conn.close()


def test_tls_serves_https_and_refuses_plain_http(tmp_path: Path, ca: trustme.CA) -> None:
    cert, key = _write_pair(ca, tmp_path)
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    for port in _serve(cfg):
        assert _get(port, _client_ctx(ca)) == 200
        # plain HTTP gets no page: a plain-text 400 that says why (as Go's servers answer), then a close
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            assert (resp.status, resp.read()) == (400, b"client sent an HTTP request to an HTTPS server\n")
        finally:
            conn.close()


def test_min_version_refuses_older_tls(tmp_path: Path, ca: trustme.CA) -> None:
    cert, key = _write_pair(ca, tmp_path)
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  min_version: TLS13\n")
    for port in _serve(cfg):
        old = _client_ctx(ca, maximum_version=ssl.TLSVersion.TLSv1_2)
        with pytest.raises((ssl.SSLError, ConnectionError)):
            _get(port, old)
        assert _get(port, _client_ctx(ca)) == 200


# RequireAnyClientCert needs client_ca_file here (Python's TLS verifies every certificate it takes)
@pytest.mark.parametrize("auth_type", ["RequireAndVerifyClientCert", "RequireAnyClientCert"])
def test_mtls_requires_a_client_certificate_from_the_listed_ca(tmp_path: Path, ca: trustme.CA, auth_type: str) -> None:
    cert, key = _write_pair(ca, tmp_path)
    client_ca = trustme.CA()
    client_ca.cert_pem.write_to_path(str(tmp_path / "client-ca.crt"))
    cfg = tmp_path / "web.yml"
    cfg.write_text(
        "tls_server_config:\n"
        f"  cert_file: {cert}\n  key_file: {key}\n"
        f"  client_auth_type: {auth_type}\n  client_ca_file: client-ca.crt\n"
    )
    good = client_ca.issue_cert("prometheus")
    stranger = trustme.CA().issue_cert("prometheus")
    for port in _serve(cfg):
        assert _get(port, _client_ctx(ca, good)) == 200
        for ctx in (_client_ctx(ca), _client_ctx(ca, stranger)):
            with pytest.raises((ssl.SSLError, ConnectionError, http.client.RemoteDisconnected)):
                _get(port, ctx)


def test_basic_auth(tmp_path: Path) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"basic_auth_users:\n  prometheus: '{HASH}'\n")

    def creds(user: str, pw: str) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()}

    for port in _serve(cfg):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        assert resp.status == 401
        assert resp.getheader("WWW-Authenticate", "").startswith("Basic")
        conn.close()
        assert _get(port, None, headers=creds("prometheus", "wrong")) == 401
        assert _get(port, None, headers=creds("nobody", "s3cret")) == 401
        assert _get(port, None, headers=creds("prometheus", "s3cret")) == 200
        assert _get(port, None, "/healthz") == 200, "kubelet probes carry no credentials"


def test_verified_credentials_are_cached() -> None:
    auth = BasicAuth({"p": HASH.encode()})
    header = "Basic " + base64.b64encode(b"p:s3cret").decode()
    t0 = time.perf_counter()
    assert auth.check(header)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(10):
        assert auth.check(header)
    cached = (time.perf_counter() - t0) / 10
    assert cached < first / 10, (first, cached)
    assert not auth.check("Basic " + base64.b64encode(b"p:nope").decode())


def test_certificates_rotate_without_restart(tmp_path: Path, ca: trustme.CA) -> None:
    cert, key = _write_pair(ca, tmp_path)
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    for port in _serve(cfg):
        ctx = _client_ctx(ca)
        assert _get(port, ctx) == 200
        new_ca = trustme.CA()
        _write_pair(new_ca, tmp_path)
        later = time.time() + 5
        for f in (cert, key):
            os.utime(f, (later, later))
        assert _get(port, _client_ctx(new_ca)) == 200
        with pytest.raises(ssl.SSLError):
            _get(port, ctx)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("tls_server_config:\n  cert_file: a.crt\n", "needs both cert_file and key_file"),
        # the error names the missing file's path, not just the key
        (
            "tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n",
            r"cannot read cert_file \S*missing\.crt: No such file",
        ),
        ("basic_auth_users:\n  admin: plaintext\n", "not a bcrypt hash"),
        ("tls_server_confg: {}\n", "unknown key"),
        ("tls_server_config: [\n", "invalid YAML"),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAndVerifyClientCert\n",
            "needs client_ca_file",
        ),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS9\n", "min_version"),
        # wrong types, values that cannot work together, headers, bcrypt hashes (exit 2, not a traceback)
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: [TLS12]\n", r"min_version must be a str"),
        ("tls_server_config:\n  cert_file: 123\n  key_file: b\n", r"cert_file must be a str"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: {x: 1}\n", "client_auth_type must"),
        ("http_server_config:\n  http2: maybe\n", r"http2 must be a bool"),
        ("basic_auth_users:\n  admin: 12\n", r"basic_auth_users\.admin"),
        ("basic_auth_users:\n  123: x\n", r"user name 123"),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS13\n  max_version: TLS12\n",
            "min_version TLS13 is above max_version TLS12",
        ),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAnyClientCert\n",
            "RequireAnyClientCert without client_ca_file",
        ),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_ca_file: ca.crt\n", "NoClientCert"),
        ("http_server_config:\n  headers:\n    Content-Length: '0'\n", r"headers\.Content-Length: only"),
        ("http_server_config:\n  headers:\n    X-Custom: a\n", r"headers\.X-Custom: only"),
        (
            'http_server_config:\n  headers:\n    Content-Security-Policy: "a\\r\\nSet-Cookie: x=1"\n',
            "control character",
        ),
        ("http_server_config:\n  headers:\n    X-Frame-Options: allowall\n", "not one of"),
        # bcrypt: a malformed salt (passed the old length check), and costs beyond the ceiling
        ("basic_auth_users:\n  p: '$2b$10$" + "!" * 53 + "'\n", r"basic_auth_users\.p: not a bcrypt hash"),
        ("basic_auth_users:\n  p: '$2b$10$" + "A" * 22 + "." * 31 + "'\n", r"basic_auth_users\.p: invalid bcrypt"),
        ("basic_auth_users:\n  p: '$2b$31$" + HASH[7:] + "'\n", r"bcrypt cost 31 is outside 4\.\.14"),
        ("basic_auth_users:\n  p: '$2b$03$" + HASH[7:] + "'\n", r"bcrypt cost 3"),
    ],
)
def test_bad_web_config_is_refused_with_a_clear_message(tmp_path: Path, content: str, needle: str) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text(content)
    with pytest.raises(WebConfigError, match=needle):
        load_web_config(str(cfg))


@pytest.mark.integration  # runs another program
def test_bad_web_config_stops_the_exporter_at_start(tmp_path: Path) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text("tls_server_config:\n  cert_file: gone.crt\n  key_file: gone.key\n")
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "--backend", "sim", "--web.listen-address", f"127.0.0.1:{port}",
         "--web.config.file", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--web.config.file" in proc.stderr and "cert_file" in proc.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "exporter", "--web.config.file", str(tmp_path / "nope.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2
    assert "cannot read" in missing.stderr


# --- strict configs, uniform auth (issue: exporter under hostile clients) -----------------------


def _creds(user: str, pw: str | bytes) -> dict[str, str]:
    raw = pw if isinstance(pw, bytes) else pw.encode()
    return {"Authorization": "Basic " + base64.b64encode(user.encode() + b":" + raw).decode()}


def test_a_non_utf8_or_non_regular_file_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_bytes(b"basic_auth_users:\n  \xff\xfe: x\n")
    with pytest.raises(WebConfigError, match="not UTF-8"):
        load_web_config(str(cfg))
    fifo = tmp_path / "fifo.yml"
    os.mkfifo(fifo)
    with pytest.raises(WebConfigError, match="not a regular file"):
        load_web_config(str(fifo))


@pytest.mark.integration  # runs another program
@pytest.mark.parametrize(
    "content",
    [
        "tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: [TLS12]\n",
        "tls_server_config:\n  cert_file: 123\n  key_file: b\n",
        "basic_auth_users:\n  p: '$2b$31$" + HASH[7:] + "'\n",
    ],
)
def test_bad_types_exit_2_from_the_real_command(tmp_path: Path, content: str) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text(content)
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "--backend", "sim", "--web.config.file", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "--web.config.file" in proc.stderr


def test_allowed_security_headers_are_sent(tmp_path: Path) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n    X-Content-Type-Options: nosniff\n")
    for port in _serve(cfg):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        assert resp.getheader("X-Frame-Options") == "deny"
        assert resp.getheader("X-Content-Type-Options") == "nosniff"
        conn.close()


def test_a_password_over_72_bytes_gets_a_clean_401(tmp_path: Path) -> None:
    """bcrypt >= 5 raises on such a password; the old server then dropped the connection."""
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"basic_auth_users:\n  prometheus: '{HASH}'\n")
    for port in _serve(cfg):
        assert _get(port, None, headers=_creds("prometheus", "s3cret" + "x" * 80)) == 401
        assert _get(port, None, headers=_creds("nobody", "y" * 100)) == 401
        assert _get(port, None, headers=_creds("prometheus", b"\xff\xfe")) == 401
        assert _get(port, None, headers=_creds("prometheus", "s3cret")) == 200


def test_unknown_users_cost_a_bcrypt_check_like_known_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unknown user is checked against a dummy hash of the configured cost, so a wrong user
    name and a wrong password take the same time (the old code returned at once: 0.2 vs 63 ms)."""
    auth = BasicAuth({"p": HASH.encode()})
    calls: list[bytes] = []
    real = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        calls.append(hashed)
        return real(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    assert not auth.check(_creds("nobody", "s3cret")["Authorization"])
    assert not auth.check(_creds("p", "wrong")["Authorization"])
    assert len(calls) == 2
    assert calls[0] != HASH.encode() and calls[0][:7] == HASH.encode()[:7], "same scheme and cost as the user's"
    assert calls[1] == HASH.encode()


def test_a_kubernetes_data_symlink_swap_is_picked_up_even_with_equal_mtimes(tmp_path: Path, ca: trustme.CA) -> None:
    """A Secret volume: tls.crt -> ..data/tls.crt, ..data -> ..<timestamp>/.  The kubelet swaps
    ..data atomically; the new files may carry the same mtimes as the old ones."""
    old_dir, new_dir = tmp_path / "..2024_01", tmp_path / "..2024_02"
    old_dir.mkdir()
    new_dir.mkdir()
    old_cert, old_key = _write_pair(ca, old_dir, "tls")
    new_ca = trustme.CA()
    new_cert, new_key = _write_pair(new_ca, new_dir, "tls")
    for old, new in ((old_cert, new_cert), (old_key, new_key)):
        st = os.stat(old)
        os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    (tmp_path / "..data").symlink_to(old_dir.name)
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).symlink_to(f"..data/{name}")
    cfg = tmp_path / "web.yml"
    cfg.write_text("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n")
    for port in _serve(cfg):
        assert _get(port, _client_ctx(ca)) == 200
        tmp_link = tmp_path / "..data_tmp"
        tmp_link.symlink_to(new_dir.name)
        os.replace(tmp_link, tmp_path / "..data")
        assert _get(port, _client_ctx(new_ca)) == 200
        with pytest.raises(ssl.SSLError):
            _get(port, _client_ctx(ca))


def test_a_stalled_tls_handshake_is_closed_at_the_head_deadline(tmp_path: Path, ca: trustme.CA) -> None:
    """The handshake counts against the same single deadline as the request head; while one
    client stalls mid-handshake, others are served."""
    import socket

    cert, key = _write_pair(ca, tmp_path)
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    for port in _serve(cfg, Limits(request_deadline=1.0)):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"\x16\x03\x01\x02\x00")  # the start of a ClientHello, never finished
            assert _get(port, _client_ctx(ca)) == 200
            t0 = time.monotonic()
            with contextlib.suppress(ConnectionResetError):  # closed with a reset: as good
                assert s.recv(1024) == b"", "a stalled handshake was answered"
            assert time.monotonic() - t0 < 3.0
