"""The exporter's path to the Kubernetes API: configuration, auth and GET on the standard library.

What ``kubeapi.py`` and ``owners.py`` need and nothing more: where the API server is and how to
prove who we are (``load_endpoint``: the pod's service account, else a kubeconfig for
development), a GET of a path with query parameters and an ``Accept`` header that hands back the
response unread (``KubeClient.get``), and ``read_capped``, which reads a body whole under a byte
and a time cap, so the callers decide how much of a response to take.  ``http.client``, ``ssl`` and
``json`` only; ``yaml`` is imported only to read a kubeconfig, never in a pod.

In a pod: ``KUBERNETES_SERVICE_HOST`` / ``KUBERNETES_SERVICE_PORT``, the service-account token
(re-read at most once a minute, since the kubelet rotates projected tokens, and at once after a
401) and its ``ca.crt``.  Otherwise the current context of a kubeconfig: a token, a token file or
a client certificate; ``exec`` and ``auth-provider`` users (credential plugins of kubectl users)
are refused, naming them.  TLS is always verified unless the kubeconfig says
``insecure-skip-tls-verify``.  Every failure is one exception with one line of text: ``ConfigError``
for a configuration that cannot be used, ``ApiError`` for an error status, ``OSError`` /
``http.client.HTTPException`` for the transport.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import http.client
import json
import os
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where the kubelet mounts a pod's service-account token, CA certificate and namespace."""
TOKEN_MAX_AGE_SECONDS = 60.0
"""Longest a token read from a file is used before the file is read again, seconds.  The kubelet
rewrites a projected token once 80 % of its lifetime (1 h at least) has passed, so a minute-old
copy is always still valid; a 401 re-reads the file at once."""
ERROR_BODY_BYTES = 4096
"""Most bytes of an error reply read for its message; the rest is left unread."""
ERROR_MESSAGE_CHARS = 300
"""Longest message kept from an error reply, characters."""
READ_BYTES = 64 * 1024
"""Most bytes taken from the connection per read (a read returns whatever has arrived)."""
USER_AGENT = "gpulens-exporter (python http.client)"
JSON = "application/json"
"""The ``Accept`` header of a request that wants the whole object (or list) as JSON."""

Query = Mapping[str, str | int | bool | None]


class BoundExceeded(Exception):
    """The API server sent more than a caller's bound allows (bytes, seconds, pages)."""


class ConfigError(Exception):
    """The API configuration is missing or cannot be used (the message says which and why)."""


class ApiError(Exception):
    """The API server answered with an error status (kept apart from transport errors)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


# --- credentials ------------------------------------------------------------------------------


class TokenSource(Protocol):
    """A bearer token, possibly one that changes while the exporter runs."""

    def get(self) -> str:
        """The token to send now."""
        ...

    def invalidate(self) -> None:
        """The server refused the token (401): read it afresh before the next ``get``."""
        ...


@dataclass(frozen=True)
class StaticToken:
    """A token written into a kubeconfig: it never changes."""

    value: str

    def get(self) -> str:
        return self.value

    def invalidate(self) -> None:
        pass


class TokenFile:
    """A token read from a file, read again once it is ``max_age_seconds`` old or after a 401.

    ``clock`` is ``time.monotonic`` (seconds) unless a test gives another.
    """

    def __init__(
        self,
        path: Path,
        max_age_seconds: float = TOKEN_MAX_AGE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.max_age_seconds = max_age_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._token = ""
        self._read_at: float | None = None
        self.reads = 0
        """How often the file was read."""

    def get(self) -> str:
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self.max_age_seconds:
                try:
                    token = self.path.read_text(encoding="utf-8").strip()
                except (OSError, UnicodeDecodeError) as exc:
                    raise ConfigError(f"cannot read the token file {self.path}: {exc}") from None
                if not token:
                    raise ConfigError(f"the token file {self.path} is empty")
                self._token, self._read_at = token, now
                self.reads += 1
            return self._token

    def invalidate(self) -> None:
        with self._lock:
            self._read_at = None


# --- where the API server is ------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """An API server and how to reach it: the result of reading a configuration.

    ``host`` has no brackets (an IPv6 address is bracketed only in URLs); ``base_path`` is the
    server URL's path ("" or "/prefix", for servers behind a path-routing proxy); ``tls`` is
    ``None`` for a plain-HTTP server (tests, ``kubectl proxy``); ``server_name`` the name the
    server's certificate is checked against when not ``host`` (kubeconfig ``tls-server-name``).
    """

    host: str
    port: int
    tls: ssl.SSLContext | None
    token: TokenSource | None = None
    base_path: str = ""
    server_name: str | None = None
    origin: str = ""
    """Where this came from, for messages ("in-cluster", "kubeconfig <path>")."""

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls is not None else 'http'}://{host}:{self.port}{self.base_path}"


def endpoint_for(
    server: str, tls: ssl.SSLContext | None = None, token: TokenSource | None = None, origin: str = ""
) -> Endpoint:
    """The endpoint of a server URL (``https://host[:port][/prefix]`` or ``http://…``).  An
    ``https`` server without ``tls`` gets a context that verifies against the system's CAs."""
    try:
        parts = urllib.parse.urlsplit(server)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{origin or 'server'}: invalid server URL {server!r}: {exc}") from None
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ConfigError(f"{origin or 'server'}: server {server!r} is not an http(s)://host URL")
    if parts.scheme == "https" and tls is None:
        tls = ssl.create_default_context()
    return Endpoint(
        host=parts.hostname,
        port=port or (443 if parts.scheme == "https" else 80),
        tls=tls if parts.scheme == "https" else None,
        token=token,
        base_path=parts.path.rstrip("/"),
        origin=origin,
    )


def in_cluster_endpoint(env: Mapping[str, str], folder: Path = SERVICE_ACCOUNT) -> Endpoint:
    """The API server as a pod sees it: the service's address from the environment, the
    service-account token and CA certificate from ``folder``."""
    host = env.get("KUBERNETES_SERVICE_HOST", "").strip().strip("[]")
    port_text = env.get("KUBERNETES_SERVICE_PORT", "").strip()
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"in-cluster: KUBERNETES_SERVICE_HOST/PORT {host!r}:{port_text!r} is not a host and port")
    try:
        tls = ssl.create_default_context(cafile=str(folder / "ca.crt"))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"in-cluster: cannot load the CA certificate {folder / 'ca.crt'}: {exc}") from None
    token = TokenFile(folder / "token")
    token.get()  # fail here, naming the file, rather than at the first request
    return Endpoint(host=host, port=int(port_text), tls=tls, token=token, origin="in-cluster")


def kubeconfig_path(env: Mapping[str, str]) -> Path:
    """``$KUBECONFIG``'s first file (kubectl merges the list; the exporter reads the first), else
    ``~/.kube/config``."""
    first = next((p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p), "")
    if first:
        return Path(first).expanduser()
    home = env.get("HOME") or str(Path.home())
    return Path(home, ".kube", "config")


def load_endpoint(env: Mapping[str, str] | None = None, service_account: Path = SERVICE_ACCOUNT) -> Endpoint:
    """In a pod (service host and port set, token mounted): in-cluster; otherwise the kubeconfig."""
    env = os.environ if env is None else env
    in_pod = bool(env.get("KUBERNETES_SERVICE_HOST") and env.get("KUBERNETES_SERVICE_PORT"))
    if in_pod and (service_account / "token").exists():
        return in_cluster_endpoint(env, service_account)
    path = kubeconfig_path(env)
    if path.exists():
        return kubeconfig_endpoint(path)
    if in_pod:
        raise ConfigError(
            f"in a pod but no service-account token at {service_account / 'token'} "
            f"(automountServiceAccountToken: false?) and no kubeconfig at {path}"
        )
    raise ConfigError(f"no API configuration: not in a pod (KUBERNETES_SERVICE_HOST unset) and no kubeconfig at {path}")


# --- kubeconfig -------------------------------------------------------------------------------

_REFUSED_USERS = {
    "exec": "a credential plugin",
    "auth-provider": "an auth provider plugin",
    "username": "basic auth, removed from Kubernetes in 1.19",
}


def _named(doc: Mapping[str, Any], section: str, name: str, origin: str) -> Mapping[str, Any]:
    """The ``section`` entry (``clusters``, ``users``, ``contexts``) called ``name``."""
    key = section.rstrip("s")
    for entry in doc.get(section) or []:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            body = entry.get(key) or {}
            if not isinstance(body, Mapping):
                raise ConfigError(f"{origin}: {key} {name!r} is not a mapping")
            return body
    raise ConfigError(f"{origin}: no {key} named {name!r}")


def _data(value: Any, field: str, origin: str) -> bytes:
    """A ``*-data`` field: base64 of a PEM (or DER) file."""
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ConfigError(f"{origin}: {field} is not base64: {exc}") from None


def _file(value: Any, base: Path, field: str, origin: str) -> bytes:
    """A file a kubeconfig names (relative paths are relative to the kubeconfig's folder)."""
    path = base / Path(str(value)).expanduser()
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{origin}: {field} {path}: {exc}") from None


def _pem(raw: Mapping[str, Any], field: str, base: Path, origin: str) -> bytes | None:
    """The contents of ``field`` (a path) or ``field-data`` (inline base64); ``None`` if neither."""
    if raw.get(f"{field}-data"):
        return _data(raw[f"{field}-data"], f"{field}-data", origin)
    if raw.get(field):
        return _file(raw[field], base, field, origin)
    return None


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() == "true"


def _no_password() -> bytes:
    """For an encrypted key: an empty password, so loading fails instead of OpenSSL prompting on
    the terminal."""
    return b""


def load_client_certificate(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """Give ``context`` a client certificate and key held in memory.  Python's ``ssl`` loads them
    only from a file: they are written to a private temporary file (mode 0600, created
    exclusively), loaded, and the file removed at once."""
    import tempfile

    fd, name = tempfile.mkstemp(prefix="gpulens-client-", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(cert.rstrip(b"\n") + b"\n" + key)
        context.load_cert_chain(name, password=_no_password)
    finally:
        os.unlink(name)


def kubeconfig_endpoint(path: Path) -> Endpoint:
    """The API server of a kubeconfig's current context, with its user's credentials."""
    import yaml

    origin = f"kubeconfig {path}"
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{origin}: cannot read it: {' '.join(str(exc).split())}") from None
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{origin}: not a kubeconfig (no mapping at the top)")
    context_name = doc.get("current-context")
    if not context_name:
        raise ConfigError(f"{origin}: no current-context")
    context = _named(doc, "contexts", str(context_name), origin)
    cluster = _named(doc, "clusters", str(context.get("cluster")), origin)
    user = _named(doc, "users", str(context.get("user")), origin) if context.get("user") else {}
    origin = f"{origin} (context {context_name!r})"
    for field, what in _REFUSED_USERS.items():
        if user.get(field):
            raise ConfigError(
                f"{origin}: user {context.get('user')!r} authenticates with {field} ({what}), which the exporter "
                "does not support: in a pod it uses its service account; for development use a kubeconfig "
                "with a token, tokenFile or client certificate"
            )
    if cluster.get("proxy-url"):
        raise ConfigError(f"{origin}: cluster proxy-url is not supported")
    server = str(cluster.get("server") or "")
    if not server:
        raise ConfigError(f"{origin}: the cluster has no server")
    base = path.parent
    tls: ssl.SSLContext | None = None
    if server.startswith("https://"):
        tls = _tls_context(cluster, user, base, origin)
    token: TokenSource | None = None
    if user.get("tokenFile"):  # as client-go: a token file wins over an inline token
        token = TokenFile(base / Path(str(user["tokenFile"])).expanduser())
        token.get()
    elif user.get("token"):
        token = StaticToken(str(user["token"]))
    name = cluster.get("tls-server-name")
    return dataclasses.replace(endpoint_for(server, tls, token, origin), server_name=str(name) if name else None)


def _tls_context(cluster: Mapping[str, Any], user: Mapping[str, Any], base: Path, origin: str) -> ssl.SSLContext:
    """Verification as the cluster entry asks (its CA, else the system's; none only with
    ``insecure-skip-tls-verify``) and the user's client certificate, if any."""
    try:
        if _truthy(cluster.get("insecure-skip-tls-verify")):
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            ca = _pem(cluster, "certificate-authority", base, origin)
            if ca is None:
                context = ssl.create_default_context()
            elif b"-----BEGIN" in ca:
                context = ssl.create_default_context(cadata=ca.decode("ascii", errors="replace"))
            else:
                context = ssl.create_default_context(cadata=ca)  # DER
    except ssl.SSLError as exc:
        raise ConfigError(f"{origin}: cannot load the cluster's CA certificate: {exc}") from None
    cert = _pem(user, "client-certificate", base, origin)
    key = _pem(user, "client-key", base, origin)
    if (cert is None) != (key is None):
        raise ConfigError(f"{origin}: a client certificate needs both client-certificate and client-key")
    if cert is not None and key is not None:
        try:
            if user.get("client-certificate-data") or user.get("client-key-data"):
                load_client_certificate(context, cert, key)
            else:  # both are files: loaded where they are
                cert_file, key_file = (
                    str(base / Path(str(user[k])).expanduser()) for k in ("client-certificate", "client-key")
                )
                context.load_cert_chain(cert_file, key_file, password=_no_password)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"{origin}: cannot load the client certificate and key: {exc}") from None
    return context


# --- requests ---------------------------------------------------------------------------------


def read_some(resp: Any, most: int) -> bytes:
    """Up to ``most`` bytes of the body, as soon as any arrived (``b""`` at its end).  A response
    without ``read1`` is read with ``read``: there a read waits for ``most`` bytes, so bytes are
    seen (and a stall noticed) only that many at a time; the caps hold alike."""
    read1 = getattr(resp, "read1", None)
    data = read1(most) if read1 is not None else resp.read(most)
    return bytes(data or b"")


def read_capped(resp: Any, cap: int, seconds: float, what: str) -> bytearray:
    """The whole body of ``resp``, or ``BoundExceeded`` as soon as it is known to pass ``cap``
    bytes (from its Content-Length, before reading, when it has one) or ``seconds``."""
    length = str(resp.headers.get("Content-Length") or "")
    if length.isdigit() and int(length) > cap:
        raise BoundExceeded(f"{what} of {int(length)} bytes (Content-Length) exceeds the cap of {cap} bytes")
    deadline = time.monotonic() + seconds
    body = bytearray()
    while chunk := read_some(resp, READ_BYTES):
        body += chunk
        if len(body) > cap:
            raise BoundExceeded(f"{what} exceeds the cap of {cap} bytes ({len(body)} bytes read without its end)")
        if time.monotonic() > deadline:
            raise BoundExceeded(f"{what} unfinished after {seconds:g} s ({len(body)} bytes read)")
    return body


class _Connection(http.client.HTTPConnection):
    """One HTTP/1.1 connection, TLS when ``tls`` is given (checked against ``server_name``)."""

    def __init__(
        self, host: str, port: int, timeout: float, tls: ssl.SSLContext | None, server_name: str | None
    ) -> None:
        super().__init__(host, port, timeout=timeout)
        self._tls = tls
        self._server_name = server_name or host
        if tls is not None:
            self.default_port = 443

    def connect(self) -> None:
        super().connect()
        if self._tls is not None:
            self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_name)


class ApiResponse:
    """A response whose body is still unread: ``status``, ``headers``, ``read1``/``read``.

    Give it back with ``release(whole)`` once done: the connection is kept for the next request
    only if the body was read to its end (``whole``), else closed.  ``shutdown()`` may be called
    from another thread: it shuts the socket down, so a read blocked on it returns at once.
    """

    def __init__(self, client: KubeClient, conn: _Connection, resp: http.client.HTTPResponse, sock: Any) -> None:
        self._client = client
        self._conn = conn
        self._resp = resp
        self._sock = sock
        self._released = False
        self.status = resp.status
        self.reason = resp.reason
        self.headers = resp.headers

    def read1(self, amt: int) -> bytes:
        """Up to ``amt`` bytes, as soon as any arrived; ``b""`` at the end of the body."""
        return self._resp.read1(amt)

    def read(self, amt: int | None = None) -> bytes:
        return self._resp.read(amt)

    def shutdown(self) -> None:
        """Shut the socket down for both directions (the TLS state is left alone)."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(self._sock, socket.SHUT_RDWR)

    def release(self, whole: bool) -> None:
        """Done with the body: keep the connection if it was read whole and may stay open."""
        if self._released:
            return
        self._released = True
        if whole and self._resp.isclosed() and not self._resp.will_close:
            self._client._keep(self._conn)
        else:
            self._resp.close()
            self._conn.close()

    def close(self) -> None:
        self.release(False)


def _encode(query: Query) -> str:
    """``query`` as a URL query: booleans as ``true``/``false``, ``None`` left out."""
    pairs = [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in query.items() if v is not None]
    return urllib.parse.urlencode(pairs)


def error_message(resp: ApiResponse) -> str:
    """The message of an error reply from its first ``ERROR_BODY_BYTES`` (a ``Status`` object's
    reason and message, else the text), at most ``ERROR_MESSAGE_CHARS`` long."""
    head = bytearray()
    while len(head) < ERROR_BODY_BYTES and (chunk := resp.read1(ERROR_BODY_BYTES - len(head))):
        head += chunk
    text = head.decode("utf-8", errors="replace")
    try:
        status = json.loads(text)
    except ValueError:
        status = None
    if isinstance(status, dict) and status.get("message"):
        text = f"{status.get('reason') or resp.reason}: {status['message']}"
    else:
        text = f"{resp.reason}: {' '.join(text.split())}" if text.strip() else str(resp.reason)
    return text[:ERROR_MESSAGE_CHARS]


class KubeClient:
    """GETs on one API server, one idle connection kept for the next request.

    Used by one thread at a time (the pod source's), except ``ApiResponse.shutdown`` and
    ``close``, which may come from another.
    """

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._lock = threading.Lock()
        self._idle: _Connection | None = None
        self.connections = 0
        """Connections opened so far."""

    def get(
        self,
        path: str,
        query: Query | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 30.0,
        accept: str = JSON,
    ) -> ApiResponse:
        """GET ``path`` (``/api/v1/…``, its parts already quoted) with ``query``; the response
        unread.  ``accept`` is the ``Accept`` header: JSON, or a media type with parameters such
        as ``application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1`` (the owner chain
        asks for metadata only; one header line, no CR or LF).
        Raises ``ApiError`` for a status outside 2xx (its body read only up to
        ``ERROR_BODY_BYTES``), ``ConfigError`` if the token cannot be read, ``OSError`` or
        ``http.client.HTTPException`` for the transport.  After a 401 the token is read afresh
        and the request made once more if it changed."""
        if "\r" in accept or "\n" in accept:
            raise ValueError("an Accept header cannot hold a line break")
        target = self.endpoint.base_path + path + (f"?{_encode(query)}" if query else "")
        source = self.endpoint.token
        token = source.get() if source is not None else None
        resp = self._send(target, token, connect_timeout, read_timeout, accept)
        if resp.status == http.client.UNAUTHORIZED and source is not None:
            message = error_message(resp)
            resp.release(False)
            source.invalidate()
            fresh = source.get()
            if fresh == token:
                raise ApiError(resp.status, message)
            resp = self._send(target, fresh, connect_timeout, read_timeout, accept)
        if not 200 <= resp.status <= 299:
            message = error_message(resp)
            resp.release(False)
            raise ApiError(resp.status, message)
        return resp

    def _send(
        self, target: str, token: str | None, connect_timeout: float, read_timeout: float, accept: str
    ) -> ApiResponse:
        conn = self._take()
        reused = conn is not None
        for attempt in (1, 2):
            if conn is None or conn.sock is None:
                conn = self._open(connect_timeout)
            try:
                conn.sock.settimeout(read_timeout)
                sock = conn.sock
                conn.putrequest("GET", target, skip_accept_encoding=True)
                conn.putheader("Accept", accept)
                conn.putheader("User-Agent", USER_AGENT)
                if token:
                    conn.putheader("Authorization", f"Bearer {token}")
                conn.endheaders()
                return ApiResponse(self, conn, conn.getresponse(), sock)
            except TimeoutError:
                conn.close()
                raise
            except (OSError, http.client.HTTPException):
                conn.close()
                if not reused or attempt == 2:
                    raise
                conn, reused = None, False  # the kept connection was closed by the server: a new one
        raise AssertionError("unreachable")

    def _open(self, connect_timeout: float) -> _Connection:
        e = self.endpoint
        conn = _Connection(e.host, e.port, connect_timeout, e.tls, e.server_name)
        try:
            conn.connect()
        except BaseException:
            conn.close()  # a TLS handshake that failed leaves the TCP socket open
            raise
        self.connections += 1
        return conn

    def _take(self) -> _Connection | None:
        with self._lock:
            conn, self._idle = self._idle, None
            return conn

    def _keep(self, conn: _Connection) -> None:
        with self._lock:
            if self._idle is None:
                self._idle = conn
                return
        conn.close()  # one idle connection is enough

    def close(self) -> None:
        """Close the idle connection (responses still open are closed by their owners)."""
        conn = self._take()
        if conn is not None:
            conn.close()
