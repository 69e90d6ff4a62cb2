"""Serving the exporter's HTTP front with a web config, for the TLS and auth tests."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import trustme
from prometheus_client import CollectorRegistry, Gauge

from exporter.http.limits import Limits
from exporter.http.server import MetricsServer
from exporter.http.webconfig import load_web_config


def write_pair(ca: trustme.CA, folder: Path, name: str = "server") -> tuple[Path, Path]:
    """A certificate for 127.0.0.1/localhost signed by ``ca`` and its key, as files in ``folder``."""
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = folder / f"{name}.crt", folder / f"{name}.key"
    cert.private_key_pem.write_to_path(str(key_path))
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    return cert_path, key_path


@contextmanager
def serving(
    config_path: Path | None, limits: Limits | None = None, address: str = "127.0.0.1:0"
) -> Iterator[MetricsServer]:
    """A started MetricsServer of a one-series registry, with the web config at ``config_path``."""
    reg = CollectorRegistry()
    Gauge("gpulens_test_up", "A series for the TLS and auth tests to fetch.", registry=reg).set(1)
    web_config = load_web_config(str(config_path)) if config_path is not None else None
    server = MetricsServer(address, reg, ready=lambda: True, web_config=web_config, limits=limits)
    server.start()
    try:
        yield server
    finally:
        server.shutdown()


def client_ctx(ca: trustme.CA, client: trustme.LeafCert | None = None, **kw: object) -> ssl.SSLContext:
    """A client context that trusts ``ca`` (and presents ``client``), with attributes from ``kw``."""
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    if client is not None:
        client.configure_cert(ctx)
    for k, v in kw.items():
        setattr(ctx, k, v)
    return ctx
