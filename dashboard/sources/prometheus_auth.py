"""How the dashboard and the advisor reach a secured Prometheus-compatible API.

Covers what such APIs ask for: a bearer token (OpenShift's Thanos querier, managed services), basic
auth (a Prometheus ``--web.config.file``, Grafana Cloud), TLS with a private CA, a client
certificate (mTLS), and extra headers (``X-Scope-OrgID`` for Mimir / Cortex tenants).

Secrets come from files, never from flags (which any user on the host can read in ``ps``), and
are re-read when the file changes, so a rotated token or password is used without a restart.
``validate()`` runs at start: a missing file, a half-given pair or a CA that does not parse is a
``ValueError`` naming the flag, before the first query.
"""

from __future__ import annotations

import argparse
import os
import re
import ssl
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from requests.auth import AuthBase

HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
"""An HTTP header name (RFC 9110 token)."""

RESERVED_HEADERS = frozenset({"authorization", "content-type", "content-length", "host"})
"""Headers the client sets itself; ``--prometheus-header`` may not override them."""


class FileSecret:
    """A secret kept in a file: read again whenever the file's size or mtime changes.

    Surrounding whitespace (the newline ``echo`` and ``kubectl create secret`` add) is dropped.
    ``value()`` raises ``OSError`` if the file is gone or ``ValueError`` if it is empty.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._value = ""

    def value(self) -> str:
        st = os.stat(self.path)
        stamp = (st.st_mtime_ns, st.st_size)
        with self._lock:
            if stamp != self._stamp:
                text = Path(self.path).read_text().strip()
                if not text:
                    raise ValueError(f"{self.path} is empty")
                self._value, self._stamp = text, stamp
            return self._value


class _BearerToken(AuthBase):
    def __init__(self, token: FileSecret) -> None:
        self.token = token

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        r.headers["Authorization"] = f"Bearer {self.token.value()}"
        return r


class _BasicAuth(AuthBase):
    def __init__(self, username: str, password: FileSecret) -> None:
        self.username = username
        self.password = password

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        return requests.auth.HTTPBasicAuth(self.username, self.password.value())(r)


@dataclass(frozen=True)
class PrometheusAuth:
    """Credentials and TLS settings for the Prometheus API; paths are files on this machine."""

    bearer_token_file: str | None = None
    basic_auth_username: str | None = None
    basic_auth_password_file: str | None = None
    ca_file: str | None = None
    """PEM bundle that signs the server's certificate (default: the system's trust store)."""
    cert_file: str | None = None
    """Client certificate (PEM) for mTLS; needs ``key_file``."""
    key_file: str | None = None
    insecure_skip_verify: bool = False
    """Accept any server certificate. Only for testing: it gives up the protection TLS offers."""
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def configured(self) -> bool:
        """True when anything differs from a plain request."""
        return self != PrometheusAuth()

    def validate(self) -> PrometheusAuth:
        """``self`` if usable; ``ValueError`` naming the flag at fault otherwise."""
        if self.bearer_token_file and (self.basic_auth_username or self.basic_auth_password_file):
            raise ValueError("--prometheus-bearer-token-file and basic auth exclude each other")
        if bool(self.basic_auth_username) != bool(self.basic_auth_password_file):
            raise ValueError("--prometheus-basic-auth-username and --prometheus-basic-auth-password-file go together")
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("--prometheus-cert-file and --prometheus-key-file go together")
        if self.insecure_skip_verify and self.ca_file:
            raise ValueError("--prometheus-ca-file is pointless with --prometheus-insecure-skip-verify")
        for flag, path in (
            ("--prometheus-bearer-token-file", self.bearer_token_file),
            ("--prometheus-basic-auth-password-file", self.basic_auth_password_file),
        ):
            if path:
                try:
                    FileSecret(path).value()
                except (OSError, ValueError) as exc:
                    raise ValueError(f"{flag}: cannot read a secret from {path}: {exc}") from exc
        if self.ca_file:
            try:
                ssl.create_default_context(cafile=self.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"--prometheus-ca-file {self.ca_file}: not a readable PEM CA bundle: {exc}") from exc
        if self.cert_file and self.key_file:
            try:
                ssl.create_default_context().load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(
                    f"--prometheus-cert-file / --prometheus-key-file: not a matching PEM certificate and key: {exc}"
                ) from exc
        for name, _ in self.headers:
            if not HEADER_NAME.match(name):
                raise ValueError(f"--prometheus-header: {name!r} is not a valid header name")
            if name.lower() in RESERVED_HEADERS:
                raise ValueError(
                    f"--prometheus-header: {name} is set by the client; use the bearer-token or basic-auth flags"
                )
        return self

    def session(self) -> requests.Session:
        """A ``requests`` session that sends these credentials and headers (TLS: ``tls_options``)."""
        s = requests.Session()
        if self.bearer_token_file:
            s.auth = _BearerToken(FileSecret(self.bearer_token_file))
        elif self.basic_auth_username and self.basic_auth_password_file:
            s.auth = _BasicAuth(self.basic_auth_username, FileSecret(self.basic_auth_password_file))
        s.headers.update(dict(self.headers))
        return s

    def tls_options(self) -> dict[str, Any]:
        """``verify`` / ``cert`` keyword arguments for each request.

        Per request, not on the session: ``requests`` lets ``REQUESTS_CA_BUNDLE`` and
        ``CURL_CA_BUNDLE`` override a session's ``verify``, and an explicit ``--prometheus-ca-file``
        must win over the environment.  Without either flag the environment / system store applies.
        """
        options: dict[str, Any] = {}
        if self.insecure_skip_verify:
            options["verify"] = False
        elif self.ca_file:
            options["verify"] = self.ca_file
        if self.cert_file and self.key_file:
            options["cert"] = (self.cert_file, self.key_file)
        return options


def parse_headers(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``["X-Scope-OrgID=team-a"]`` -> ``(("X-Scope-OrgID", "team-a"),)``; ValueError names a bad item."""
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--prometheus-header {item!r} is not NAME=VALUE")
        out.append((name.strip(), value.strip()))
    return tuple(out)


ENV_KEYS: Mapping[str, str] = {
    "bearer_token_file": "PROMETHEUS_BEARER_TOKEN_FILE",
    "basic_auth_username": "PROMETHEUS_BASIC_AUTH_USERNAME",
    "basic_auth_password_file": "PROMETHEUS_BASIC_AUTH_PASSWORD_FILE",
    "ca_file": "PROMETHEUS_CA_FILE",
    "cert_file": "PROMETHEUS_CERT_FILE",
    "key_file": "PROMETHEUS_KEY_FILE",
}
"""Field -> environment variable suffix (after the program's prefix, e.g. ``GPULENS_DASHBOARD_``)."""


FLAG_HELP: Mapping[str, str] = {
    "bearer_token_file": "file holding a bearer token, sent as 'Authorization: Bearer'",
    "basic_auth_username": "basic-auth user name",
    "basic_auth_password_file": "file holding the basic-auth password",
    "ca_file": "PEM CA bundle that signs the server certificate",
    "cert_file": "client certificate (PEM) for mutual TLS",
    "key_file": "key of the client certificate (PEM)",
}


def _env_insecure(env: Mapping[str, str], prefix: str) -> bool:
    return env.get(prefix + "PROMETHEUS_INSECURE_SKIP_VERIFY", "").lower() in ("1", "true", "yes")


def _env_headers(env: Mapping[str, str], prefix: str) -> list[str]:
    """``NAME=VALUE`` items of ``{prefix}PROMETHEUS_HEADERS``, one per line (unparsed)."""
    return [h for h in env.get(prefix + "PROMETHEUS_HEADERS", "").splitlines() if h.strip()]


def add_arguments(parser: argparse.ArgumentParser, env_prefix: str) -> None:
    """The ``--prometheus-*`` authentication flags; each defaults to its ``{env_prefix}…`` variable."""
    g = parser.add_argument_group("Prometheus authentication (secrets are read from files)")
    env = os.environ
    for field, suffix in ENV_KEYS.items():
        g.add_argument(
            "--prometheus-" + field.replace("_", "-"),
            dest=f"prometheus_{field}",
            default=env.get(env_prefix + suffix) or None,
            metavar="USER" if field == "basic_auth_username" else "PATH",
            help=f"{FLAG_HELP[field]} (env {env_prefix}{suffix})",
        )
    g.add_argument(
        "--prometheus-insecure-skip-verify",
        action="store_true",
        default=_env_insecure(env, env_prefix),
        help="accept any server certificate (testing only)",
    )
    g.add_argument(
        "--prometheus-header",
        action="append",
        metavar="NAME=VALUE",
        default=_env_headers(env, env_prefix),
        help="extra request header, repeatable (e.g. X-Scope-OrgID=tenant for Mimir)",
    )


def from_args(args: argparse.Namespace) -> PrometheusAuth:
    """The validated settings from ``add_arguments``' flags; ValueError names the problem."""
    return PrometheusAuth(
        **{field: getattr(args, f"prometheus_{field}") for field in ENV_KEYS},
        insecure_skip_verify=args.prometheus_insecure_skip_verify,
        headers=parse_headers(args.prometheus_header or []),
    ).validate()


def from_env(env: Mapping[str, str], prefix: str) -> PrometheusAuth:
    """The settings from ``{prefix}PROMETHEUS_*`` variables (not validated: see ``validate``)."""
    return PrometheusAuth(
        **{field: env.get(prefix + suffix) or None for field, suffix in ENV_KEYS.items()},
        insecure_skip_verify=_env_insecure(env, prefix),
        headers=parse_headers(_env_headers(env, prefix)),
    )


def to_env(auth: PrometheusAuth, prefix: str) -> dict[str, str]:
    """The variables that make ``from_env`` return ``auth``."""
    env = {prefix + suffix: getattr(auth, field) or "" for field, suffix in ENV_KEYS.items()}
    env[prefix + "PROMETHEUS_INSECURE_SKIP_VERIFY"] = "true" if auth.insecure_skip_verify else ""
    env[prefix + "PROMETHEUS_HEADERS"] = "\n".join(f"{k}={v}" for k, v in auth.headers)
    return env
