"""HTTP(S) endpoints: ``/metrics`` (exposition), ``/healthz`` (alive), ``/readyz`` (first snapshot).

A threaded stdlib server: each connection gets its own thread and a socket timeout, so a client
that never finishes its request (or its TLS handshake) cannot block other scrapes.  Only GET and
HEAD are served.  TLS, mTLS and basic auth come from ``--web.config.file`` (exporter/webconfig.py).
"""

from __future__ import annotations

import gzip
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from exporter.webconfig import BasicAuth, TlsContextSource, WebConfig

log = logging.getLogger(__name__)

LANDING = b"""<html><head><title>gpulens exporter</title></head><body>
<h1>gpulens exporter</h1><p><a href="/metrics">Metrics</a> &middot;
<a href="/healthz">healthz</a> &middot; <a href="/readyz">readyz</a></p></body></html>
"""

REQUEST_TIMEOUT_SECONDS = 10.0
"""A client gets this long to send its request line and headers before it is dropped."""


Exposition = Callable[[str], tuple[bytes, str]]
"""``render(accept_header) -> (body, content_type)``: the metrics page."""


UNAUTHENTICATED_PATHS = ("/healthz", "/readyz")
"""Liveness/readiness reveal nothing and kubelet probes cannot send credentials."""


class _Handler(BaseHTTPRequestHandler):
    exposition: Exposition
    ready: Callable[[], bool]
    auth: BasicAuth | None = None
    extra_headers: dict[str, str] = {}  # noqa: RUF012 - set once per server class
    server_version = "gpulens"
    sys_version = ""
    timeout = REQUEST_TIMEOUT_SECONDS
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s - %s", self.address_string(), format % args)

    def _send(self, code: int, body: bytes, ctype: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in {**self.extra_headers, **(extra or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        needs_auth = self.auth is not None and path not in UNAUTHENTICATED_PATHS
        if needs_auth and not self.auth.check(self.headers.get("Authorization")):  # type: ignore[union-attr]
            self._send(
                401,
                b"unauthorized\n",
                "text/plain; charset=utf-8",
                {"WWW-Authenticate": 'Basic realm="gpulens"'},
            )
            return
        if path == "/metrics":
            body, ctype = self.exposition(self.headers.get("Accept", ""))
            extra: dict[str, str] = {}
            if "gzip" in self.headers.get("Accept-Encoding", ""):
                body = gzip.compress(body, compresslevel=1)
                extra["Content-Encoding"] = "gzip"
            self._send(200, body, ctype, extra)
        elif path == "/healthz":
            self._send(200, b"ok\n", "text/plain; charset=utf-8")
        elif path == "/readyz":
            if self.ready():
                self._send(200, b"ready\n", "text/plain; charset=utf-8")
            else:
                self._send(503, b"no snapshot yet\n", "text/plain; charset=utf-8")
        elif path == "/":
            self._send(200, LANDING, "text/html; charset=utf-8")
        else:
            self._send(404, b"not found\n", "text/plain; charset=utf-8")

    def _not_allowed(self) -> None:
        self._send(405, b"method not allowed\n", "text/plain; charset=utf-8", {"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed


def _plain(registry: CollectorRegistry) -> Exposition:
    def render(accept: str) -> tuple[bytes, str]:
        encoder, ctype = choose_encoder(accept)
        return encoder(registry), ctype

    return render


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    tls: TlsContextSource | None = None

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        if self.tls is None:
            return sock, addr
        # The handshake happens in the connection's own thread (finish_request), so a client
        # that stalls mid-handshake cannot block the accept loop.
        return self.tls.context().wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is not None:
            request.settimeout(REQUEST_TIMEOUT_SECONDS)
            try:
                request.do_handshake()
            except (OSError, ssl.SSLError) as exc:
                log.debug("TLS handshake with %s failed: %s", client_address, exc)
                return
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


def parse_listen_address(value: str) -> tuple[str, int]:
    """``host:port`` / ``:port`` / ``[::1]:port`` -> (host, port); ValueError names what is wrong."""
    host, sep, port_s = value.rpartition(":")
    if not sep:
        raise ValueError(f"expected HOST:PORT or :PORT, got {value!r}")
    host = host.strip("[]") or "0.0.0.0"
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"port {port_s!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} is out of range 0..65535")
    return host, port


class MetricsServer:
    """Serves the registry on a background thread until ``shutdown()``."""

    def __init__(
        self,
        address: str,
        exposition: Exposition | CollectorRegistry,
        ready: Callable[[], bool],
        web_config: WebConfig | None = None,
    ) -> None:
        host, port = parse_listen_address(address)
        if isinstance(exposition, CollectorRegistry):
            exposition = _plain(exposition)
        attrs: dict[str, Any] = {"exposition": staticmethod(exposition), "ready": staticmethod(ready)}
        server_attrs: dict[str, Any] = {}
        if web_config is not None:
            attrs["extra_headers"] = dict(web_config.headers)
            if web_config.basic_auth_users:
                attrs["auth"] = BasicAuth(web_config.basic_auth_users)
            if web_config.tls is not None:
                server_attrs["tls"] = TlsContextSource(web_config.tls, web_config.path)
        if ":" in host:
            server_attrs["address_family"] = socket.AF_INET6
        handler = type("Handler", (_Handler,), attrs)
        server_cls = type("Server", (_Server,), server_attrs)
        self._httpd = server_cls((host, port), handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="gpulens-http", daemon=True)

    @property
    def port(self) -> int:
        """The bound port (useful with ``:0``)."""
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        """Start serving."""
        self._thread.start()

    def shutdown(self) -> None:
        """Stop accepting and close the socket."""
        self._httpd.shutdown()
        self._httpd.server_close()
