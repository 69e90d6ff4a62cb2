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
import re
import ssl
import stat
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.http.tls_groups import CURVE_NAMES, DEFAULT_GROUPS, GroupsError, set_groups

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
_LEGACY_VERSIONS = ("TLS10", "TLS11")
"""Versions OpenSSL 3 refuses at security level 1 and above (Debian's default is 2)."""


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
    groups: tuple[str, ...] = DEFAULT_GROUPS
    """Key-exchange groups offered, OpenSSL names (from ``curve_preferences``; exporter/http/tls_groups.py)."""


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


_MAX_FILE_BYTES = 1 << 20
"""The web config and each certificate, key and CA file must be smaller than this."""

SECURITY_HEADERS: Mapping[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
"""``http_server_config.headers`` may set only these (the same list and values as exporter-toolkit);
an empty tuple means any value free of control characters."""

MIN_BCRYPT_COST = 4
MAX_BCRYPT_COST = 14
"""bcrypt's own floor is 4 and its format allows 31 (exporter-toolkit takes anything bcrypt takes).
Every login with an unknown user or a wrong password pays the full cost, on the one bcrypt thread,
so a cost that takes more than about a second per check (14 on a current core) is refused."""

_BCRYPT_HASH = re.compile(r"^\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}$")


def read_small_file(path: Path, what: str, config_path: Path) -> bytes:
    """A regular file of at most ``_MAX_FILE_BYTES``; WebConfigError names ``what`` and the path."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise _fail(config_path, f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _fail(config_path, f"{what} {path}: not a regular file")
        data = os.read(fd, _MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise _fail(config_path, f"cannot read {what} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > _MAX_FILE_BYTES:
        raise _fail(config_path, f"{what} {path}: larger than {_MAX_FILE_BYTES} bytes")
    return data


def load_web_config(path_text: str) -> WebConfig:
    """Read and validate the file; WebConfigError says exactly what is wrong."""
    import yaml  # lazy: only users of the web config pay for it

    path = Path(path_text)
    raw = read_small_file(path, "the file", path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(path, f"not UTF-8 (byte {exc.start})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise _fail(path, f"invalid YAML: {exc}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise _fail(path, "top level must be a mapping")
    unknown = {str(k) for k in doc} - _TOP_KEYS
    if unknown:
        raise _fail(path, f"unknown key(s) {sorted(unknown)}; expected {sorted(_TOP_KEYS)}")
    tls = _parse_tls(path, doc.get("tls_server_config"))
    users = _parse_users(path, doc.get("basic_auth_users"))
    headers = _parse_http(path, doc.get("http_server_config"))
    config = WebConfig(path=path, tls=tls, basic_auth_users=users, headers=headers)
    if tls is not None:
        TlsContextSource(tls, path)  # load certificates now so a bad one fails at start
    return config


def _typed(path: Path, raw: Mapping[str, Any], section: str, key: str, kind: type, default: Any = None) -> Any:
    """``raw[key]`` if it has type ``kind`` (or is absent: ``default``); else a WebConfigError naming it."""
    value = raw.get(key, default)
    if value is None or isinstance(value, kind):
        if kind is not bool and isinstance(value, bool):
            raise _fail(path, f"{section}.{key} must be a {kind.__name__}, got {value!r}")
        return value
    raise _fail(path, f"{section}.{key} must be a {kind.__name__}, got {type(value).__name__} {value!r}")


def _parse_tls(path: Path, raw: Any) -> TlsSettings | None:
    section = "tls_server_config"
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _fail(path, f"{section} must be a mapping")
    unknown = {str(k) for k in raw} - _TLS_KEYS
    if unknown:
        raise _fail(path, f"{section}: unknown key(s) {sorted(unknown)}")
    for key in ("cipher_suites", "curve_preferences"):
        value = raw.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise _fail(path, f"{section}.{key} must be a list of names")
    _typed(path, raw, section, "prefer_server_cipher_suites", bool)
    for ignored in ("cipher_suites", "prefer_server_cipher_suites"):
        if ignored in raw:
            log.warning("%s.%s is accepted but Python's TLS defaults apply", section, ignored)
    cert = _typed(path, raw, section, "cert_file", str)
    key = _typed(path, raw, section, "key_file", str)
    if not cert or not key:
        raise _fail(path, f"{section} needs both cert_file and key_file")
    auth = _typed(path, raw, section, "client_auth_type", str, "NoClientCert")
    if auth not in CLIENT_AUTH_TYPES:
        raise _fail(path, f"{section}.client_auth_type {auth!r} is not one of {list(CLIENT_AUTH_TYPES)}")
    ca = _typed(path, raw, section, "client_ca_file", str)
    if auth in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert") and not ca:
        raise _fail(path, f"client_auth_type {auth} needs client_ca_file")
    if auth == "RequireAnyClientCert" and not ca:
        raise _fail(
            path,
            "client_auth_type RequireAnyClientCert without client_ca_file cannot work here: Python's TLS "
            "cannot accept a client certificate it does not verify, so every client would be refused. "
            "Set client_ca_file (certificates are then verified against it) or use RequestClientCert",
        )
    if ca and auth == "NoClientCert":
        raise _fail(path, "client_ca_file is set but client_auth_type is NoClientCert (no client is asked)")
    min_v = _typed(path, raw, section, "min_version", str, "TLS12")
    max_v = _typed(path, raw, section, "max_version", str)
    for key_name, value in (("min_version", min_v), ("max_version", max_v)):
        if value is not None and value not in TLS_VERSIONS:
            raise _fail(path, f"{section}.{key_name} {value!r} is not one of {list(TLS_VERSIONS)}")
    if max_v is not None and TLS_VERSIONS[min_v] > TLS_VERSIONS[max_v]:
        raise _fail(path, f"{section}.min_version {min_v} is above max_version {max_v}: no handshake could succeed")
    groups: tuple[str, ...] = DEFAULT_GROUPS
    curves = raw.get("curve_preferences")
    if curves:
        unknown_curves = [c for c in curves if c not in CURVE_NAMES]
        if unknown_curves:
            raise _fail(path, f"{section}.curve_preferences {unknown_curves} not among {list(CURVE_NAMES)}")
        groups = tuple(dict.fromkeys(CURVE_NAMES[c] for c in curves))
    for key_name, value in (("min_version", min_v), ("max_version", max_v)):
        if value in _LEGACY_VERSIONS and ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).security_level >= 1:
            raise _fail(
                path,
                f"{section}.{key_name} {value}: this system's OpenSSL ({ssl.OPENSSL_VERSION}) refuses TLS 1.0 and "
                "1.1 at its security level, so no such handshake could succeed; use TLS12 or TLS13",
            )
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
        groups=groups,
    )


def bcrypt_cost(user: str, hashed: Any, path: Path) -> int:
    """The cost of a usable bcrypt hash; WebConfigError naming the user otherwise."""
    import bcrypt

    where = f"basic_auth_users.{user}"
    if not isinstance(hashed, str):
        raise _fail(path, f"{where}: must be a bcrypt hash string, got {type(hashed).__name__}")
    m = _BCRYPT_HASH.match(hashed)
    if m is None:
        raise _fail(path, f"{where}: not a bcrypt hash (plain-text passwords are refused)")
    cost = int(m.group(1))
    if not MIN_BCRYPT_COST <= cost <= MAX_BCRYPT_COST:
        raise _fail(path, f"{where}: bcrypt cost {cost} is outside {MIN_BCRYPT_COST}..{MAX_BCRYPT_COST}")
    try:  # the same salt and digest at the lowest cost: bcrypt rejects a malformed one in a millisecond
        bcrypt.checkpw(b"", f"{hashed[:4]}04{hashed[6:]}".encode())
    except ValueError as exc:
        raise _fail(path, f"{where}: invalid bcrypt hash ({exc})") from None
    return cost


def _parse_users(path: Path, raw: Any) -> dict[str, bytes]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _fail(path, "basic_auth_users must map user names to bcrypt hashes")
    users: dict[str, bytes] = {}
    for user, hashed in raw.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise _fail(path, f"basic_auth_users: user name {user!r} must be a non-empty string without ':'")
        bcrypt_cost(user, hashed, path)
        users[user] = hashed.encode()
    return users


def _parse_http(path: Path, raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _fail(path, "http_server_config must be a mapping")
    unknown = {str(k) for k in raw} - _HTTP_KEYS
    if unknown:
        raise _fail(path, f"http_server_config: unknown key(s) {sorted(unknown)}")
    _typed(path, raw, "http_server_config", "http2", bool)
    headers = raw.get("headers") or {}
    if not isinstance(headers, dict):
        raise _fail(path, "http_server_config.headers must be a mapping")
    out: dict[str, str] = {}
    for name, value in headers.items():
        where = f"http_server_config.headers.{name}"
        if name not in SECURITY_HEADERS:
            raise _fail(path, f"{where}: only {sorted(SECURITY_HEADERS)} can be set")
        if not isinstance(value, str):
            raise _fail(path, f"{where}: value must be a string, got {type(value).__name__}")
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            raise _fail(path, f"{where}: value contains a control character (CR, LF, ...)")
        allowed = SECURITY_HEADERS[name]
        if allowed and value not in allowed:
            raise _fail(path, f"{where}: value {value!r} is not one of {list(allowed)}")
        out[name] = value
    return out


class TlsContextSource:
    """An ``ssl.SSLContext`` that is rebuilt when the certificate, key or CA file changes.

    A change is any difference in the files' identity or status (device, inode, size, mtime,
    ctime, following symlinks), so a Kubernetes Secret volume's ``..data`` symlink swap is seen
    even when the new files carry the old mtimes.
    """

    def __init__(self, tls: TlsSettings, config_path: Path) -> None:
        self._tls = tls
        self._config_path = config_path
        self._lock = threading.Lock()
        self._stamp = self._files_stamp()
        self._context = self._build()

    def _files(self) -> list[tuple[str, Path]]:
        files = [("cert_file", self._tls.cert_file), ("key_file", self._tls.key_file)]
        if self._tls.client_ca_file is not None:
            files.append(("client_ca_file", self._tls.client_ca_file))
        return files

    def _files_stamp(self) -> tuple[tuple[int, ...], ...]:
        stamp: list[tuple[int, ...]] = []
        for _what, f in self._files():
            try:
                st = os.stat(f)
                stamp.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
            except OSError:
                stamp.append(())
        return tuple(stamp)

    def _build(self) -> ssl.SSLContext:
        tls = self._tls
        # Each file is checked first, so an error names the one that is missing or unreadable.
        for what, f in self._files():
            read_small_file(f, what, self._config_path)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        # A renegotiation would be a second handshake, run on the event loop: refuse it (TLS 1.2).
        ctx.options |= ssl.OP_NO_RENEGOTIATION
        try:
            set_groups(ctx, tls.groups)
        except GroupsError as exc:
            raise _fail(self._config_path, f"cannot limit the key exchange to {list(tls.groups)}: {exc}") from None
        ctx.minimum_version = TLS_VERSIONS[tls.min_version]
        if tls.max_version:
            ctx.maximum_version = TLS_VERSIONS[tls.max_version]
        try:
            ctx.load_cert_chain(str(tls.cert_file), str(tls.key_file))
        except (OSError, ssl.SSLError) as exc:
            raise _fail(
                self._config_path, f"cannot load cert_file {tls.cert_file} with key_file {tls.key_file}: {exc}"
            ) from None
        if tls.client_ca_file is not None:
            try:
                ctx.load_verify_locations(cafile=str(tls.client_ca_file))
            except (OSError, ssl.SSLError) as exc:
                raise _fail(self._config_path, f"cannot load client_ca_file {tls.client_ca_file}: {exc}") from None
        ctx.verify_mode = {
            "NoClientCert": ssl.CERT_NONE,
            "RequestClientCert": ssl.CERT_OPTIONAL if tls.client_ca_file else ssl.CERT_NONE,
            "RequireAnyClientCert": ssl.CERT_REQUIRED,  # verified against client_ca_file (required here)
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


MAX_PASSWORD_BYTES = 72
"""bcrypt reads at most 72 bytes of a password; a longer one is refused (401), never truncated."""


class BasicAuth:
    """Checks ``Authorization: Basic`` against bcrypt hashes, caching successful checks.

    bcrypt is deliberately slow (tens to hundreds of ms); a scraper sends the same credentials
    every few seconds, so a verified (user, password) pair is remembered as a keyed digest and
    later checks cost microseconds (``check_cached``).  Failed attempts are not cached.  An
    unknown user, or a password over 72 bytes, is checked against a dummy hash of the same cost
    as the configured ones, so a wrong user name costs what a wrong password costs and user names
    cannot be told apart by timing.
    """

    def __init__(self, users: Mapping[str, bytes]) -> None:
        import bcrypt

        self._users = dict(users)
        self._key = os.urandom(32)
        self._ok: dict[str, bytes] = {}
        self._lock = threading.Lock()
        costs = [int(h[4:6]) for h in self._users.values()] or [10]
        started = time.perf_counter()
        self._dummy = bcrypt.hashpw(os.urandom(16).hex().encode(), bcrypt.gensalt(rounds=max(costs)))
        self.check_seconds = time.perf_counter() - started
        """What one check at the highest configured cost took here (seconds)."""

    def knows_user(self, header: str | None) -> bool:
        """Whether bcrypt could say yes: Basic credentials of a configured user with a password
        bcrypt reads whole.  Anything else is refused without spending bcrypt on it."""
        parts = self._split(header)
        return parts is not None and parts[0] in self._users and len(parts[1]) <= MAX_PASSWORD_BYTES

    @staticmethod
    def _split(header: str | None) -> tuple[str, bytes] | None:
        if not header:
            return None
        scheme, _, credentials = header.partition(" ")
        if scheme.lower() != "basic":  # the scheme is case-insensitive (RFC 7617, RFC 9110 11.1)
            return None
        try:
            raw = base64.b64decode(credentials.strip(" "), validate=True)
            user_b, sep, password = raw.partition(b":")
            return (user_b.decode("utf-8"), password) if sep else None
        except (ValueError, UnicodeDecodeError):
            return None

    def _digest(self, password: bytes) -> bytes:
        return hmac.new(self._key, password, hashlib.sha256).digest()

    def check_cached(self, header: str | None) -> bool | None:
        """Answer without bcrypt when possible: True for credentials verified before, False for a
        header that is not Basic credentials at all; None when bcrypt must decide (``check``)."""
        parts = self._split(header)
        if parts is None:
            return False
        user, password = parts
        with self._lock:
            cached = self._ok.get(user)
        if cached is not None and hmac.compare_digest(cached, self._digest(password)):
            return True
        return None

    def check(self, header: str | None) -> bool:
        """True if the header carries valid credentials (runs bcrypt unless cached)."""
        import bcrypt

        quick = self.check_cached(header)
        if quick is not None:
            return quick
        user, password = self._split(header) or ("", b"")
        hashed = self._users.get(user)
        usable = hashed is not None and len(password) <= MAX_PASSWORD_BYTES
        try:
            ok = bcrypt.checkpw(password[:MAX_PASSWORD_BYTES], hashed if usable and hashed else self._dummy)
        except ValueError:  # validated at start, so never expected; refuse rather than drop the request
            log.warning("bcrypt refused the check for user %r", user)
            return False
        if not (ok and usable):
            return False
        with self._lock:
            self._ok[user] = self._digest(password)
        return True
