"""``--web.config.file``: TLS, mutual TLS and bcrypt basic auth in the exporter-toolkit format.

The same YAML the Go exporters read (``tls_server_config``, ``basic_auth_users``,
``http_server_config.headers``), so one Secret serves every exporter on a node.  An invalid file
is an error at start, never a silent fall back to plain HTTP.  Certificates are re-read when
their files change, so cert-manager rotations need no restart.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CLIENT_AUTH_TYPES = (
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
)
TLS_VERSIONS: Mapping[str, ssl.TLSVersion] = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_TOP_KEYS = {"tls_server_config", "basic_auth_users", "http_server_config"}
_TLS_KEYS = {
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
}
_HTTP_KEYS = {"http2", "headers"}


class WebConfigError(ValueError):
    """The web config file is unusable; the message names the file and the key."""


@dataclass(frozen=True)
class TlsSettings:
    """``tls_server_config`` with paths resolved against the config file's folder."""

    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"
    max_version: str | None = None


@dataclass(frozen=True)
class WebConfig:
    """A parsed, validated web config."""

    path: Path
    tls: TlsSettings | None = None
    basic_auth_users: Mapping[str, bytes] = field(default_factory=dict)
    """User -> bcrypt hash."""
    headers: Mapping[str, str] = field(default_factory=dict)


def _fail(path: Path, message: str) -> WebConfigError:
    return WebConfigError(f"--web.config.file {path}: {message}")


def load_web_config(path_text: str) -> WebConfig:
    """Read and validate the file; WebConfigError says exactly what is wrong."""
    import yaml  # lazy: only users of the web config pay for it

    path = Path(path_text)
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise _fail(path, f"cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise _fail(path, f"invalid YAML: {exc}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise _fail(path, "top level must be a mapping")
    unknown = set(doc) - _TOP_KEYS
    if unknown:
        raise _fail(path, f"unknown key(s) {sorted(unknown)}; expected {sorted(_TOP_KEYS)}")
    tls = _parse_tls(path, doc.get("tls_server_config"))
    users = _parse_users(path, doc.get("basic_auth_users"))
    headers = _parse_http(path, doc.get("http_server_config"))
    config = WebConfig(path=path, tls=tls, basic_auth_users=users, headers=headers)
    if tls is not None:
        TlsContextSource(tls, path)  # load certificates now so a bad one fails at start
    return config


def _parse_tls(path: Path, raw: Any) -> TlsSettings | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _fail(path, "tls_server_config must be a mapping")
    unknown = set(raw) - _TLS_KEYS
    if unknown:
        raise _fail(path, f"tls_server_config: unknown key(s) {sorted(unknown)}")
    for ignored in ("cipher_suites", "prefer_server_cipher_suites", "curve_preferences"):
        if ignored in raw:
            log.warning("tls_server_config.%s is accepted but Python's TLS defaults apply", ignored)
    cert, key = raw.get("cert_file"), raw.get("key_file")
    if not cert or not key:
        raise _fail(path, "tls_server_config needs both cert_file and key_file")
    auth = raw.get("client_auth_type", "NoClientCert")
    if auth not in CLIENT_AUTH_TYPES:
        raise _fail(path, f"tls_server_config.client_auth_type {auth!r} is not one of {list(CLIENT_AUTH_TYPES)}")
    ca = raw.get("client_ca_file")
    if auth in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert") and not ca:
        raise _fail(path, f"client_auth_type {auth} needs client_ca_file")
    min_v = raw.get("min_version", "TLS12")
    max_v = raw.get("max_version")
    for key_name, value in (("min_version", min_v), ("max_version", max_v)):
        if value is not None and value not in TLS_VERSIONS:
            raise _fail(path, f"tls_server_config.{key_name} {value!r} is not one of {list(TLS_VERSIONS)}")
    base = path.parent

    def resolve(p: str) -> Path:
        q = Path(p)
        return q if q.is_absolute() else base / q

    return TlsSettings(
        cert_file=resolve(cert),
        key_file=resolve(key),
        client_auth_type=auth,
        client_ca_file=resolve(ca) if ca else None,
        min_version=min_v,
        max_version=max_v,
    )


def _parse_users(path: Path, raw: Any) -> dict[str, bytes]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _fail(path, "basic_auth_users must map user names to bcrypt hashes")
    users: dict[str, bytes] = {}
    for user, hashed in raw.items():
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")) or len(hashed) != 60:
            raise _fail(path, f"basic_auth_users.{user}: not a bcrypt hash (plain-text passwords are refused)")
        users[str(user)] = hashed.encode()
    return users


def _parse_http(path: Path, raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _fail(path, "http_server_config must be a mapping")
    unknown = set(raw) - _HTTP_KEYS
    if unknown:
        raise _fail(path, f"http_server_config: unknown key(s) {sorted(unknown)}")
    headers = raw.get("headers") or {}
    if not isinstance(headers, dict):
        raise _fail(path, "http_server_config.headers must be a mapping")
    return {str(k): str(v) for k, v in headers.items()}


class TlsContextSource:
    """An ``ssl.SSLContext`` that is rebuilt when the certificate, key or CA file changes."""

    def __init__(self, tls: TlsSettings, config_path: Path) -> None:
        self._tls = tls
        self._config_path = config_path
        self._lock = threading.Lock()
        self._stamp = self._files_stamp()
        self._context = self._build()

    def _files_stamp(self) -> tuple[float, ...]:
        files = [self._tls.cert_file, self._tls.key_file]
        if self._tls.client_ca_file is not None:
            files.append(self._tls.client_ca_file)
        stamp = []
        for f in files:
            try:
                stamp.append(os.stat(f).st_mtime)
            except OSError:
                stamp.append(-1.0)
        return tuple(stamp)

    def _build(self) -> ssl.SSLContext:
        tls = self._tls
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = TLS_VERSIONS[tls.min_version]
        if tls.max_version:
            ctx.maximum_version = TLS_VERSIONS[tls.max_version]
        try:
            ctx.load_cert_chain(str(tls.cert_file), str(tls.key_file))
        except (OSError, ssl.SSLError) as exc:
            raise _fail(self._config_path, f"cannot load cert_file/key_file: {exc}") from None
        if tls.client_ca_file is not None:
            try:
                ctx.load_verify_locations(cafile=str(tls.client_ca_file))
            except (OSError, ssl.SSLError) as exc:
                raise _fail(self._config_path, f"cannot load client_ca_file: {exc}") from None
        ctx.verify_mode = {
            "NoClientCert": ssl.CERT_NONE,
            "RequestClientCert": ssl.CERT_OPTIONAL if tls.client_ca_file else ssl.CERT_NONE,
            "RequireAnyClientCert": ssl.CERT_REQUIRED,
            "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
            "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
        }[tls.client_auth_type]
        return ctx

    def context(self) -> ssl.SSLContext:
        """The current context; reloads (keeping the old one on failure) if a file changed."""
        stamp = self._files_stamp()
        if stamp != self._stamp:
            with self._lock:
                if stamp != self._stamp:
                    try:
                        self._context = self._build()
                        log.info("reloaded TLS certificates from %s", self._tls.cert_file)
                    except WebConfigError as exc:
                        log.error("keeping the previous TLS certificates: %s", exc)
                    self._stamp = stamp
        return self._context


class BasicAuth:
    """Checks ``Authorization: Basic`` against bcrypt hashes, caching successful checks.

    bcrypt is deliberately slow (tens to hundreds of ms); a scraper sends the same credentials
    every few seconds, so a verified (user, password) pair is remembered as a keyed digest and
    later checks cost microseconds.  Failed attempts are not cached.
    """

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self._users = dict(users)
        self._key = os.urandom(32)
        self._ok: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def check(self, header: str | None) -> bool:
        """True if the header carries valid credentials."""
        import bcrypt

        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self._users.get(user)
        if hashed is None:
            return False
        digest = hmac.new(self._key, password.encode(), hashlib.sha256).digest()
        with self._lock:
            cached = self._ok.get(user)
        if cached is not None and hmac.compare_digest(cached, digest):
            return True
        if not bcrypt.checkpw(password.encode(), hashed):
            return False
        with self._lock:
            self._ok[user] = digest
        return True
