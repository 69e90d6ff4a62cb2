"""HTTP endpoints: status codes, methods, and that a stalled client cannot block other scrapes."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from exporter.collector import SnapshotCollector
from exporter.sampler import Sampler
from exporter.server import MetricsServer, parse_listen_address
from tests.fakes_backend import ScriptedBackend, healthy


@pytest.fixture()
def served() -> Iterator[tuple[int, Sampler]]:
    sampler = Sampler(ScriptedBackend(healthy(2)))
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(sampler.latest))
    server = MetricsServer("127.0.0.1:0", reg, ready=lambda: sampler.latest() is not None)
    server.start()
    yield server.port, sampler
    server.shutdown()


def _request(port: int, method: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request(method, path, headers=headers or {})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, body, dict(resp.getheaders())


def test_readyz_turns_ready_after_the_first_snapshot(served: tuple[int, Sampler]) -> None:
    port, sampler = served
    assert _request(port, "GET", "/healthz")[0] == 200
    assert _request(port, "GET", "/readyz")[0] == 503
    sampler.run_once()
    assert _request(port, "GET", "/readyz")[0] == 200


def test_metrics_endpoint_serves_text_and_openmetrics(served: tuple[int, Sampler]) -> None:
    port, sampler = served
    sampler.run_once()
    status, body, headers = _request(port, "GET", "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    assert b"gpulens_gpu_up{" in body
    status, body, headers = _request(port, "GET", "/metrics", {"Accept": "application/openmetrics-text"})
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")


def test_gzip_is_honoured(served: tuple[int, Sampler]) -> None:
    import gzip

    port, sampler = served
    sampler.run_once()
    _status, body, headers = _request(port, "GET", "/metrics", {"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip"
    assert b"gpulens_up" in gzip.decompress(body)


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_non_get_methods_are_refused(served: tuple[int, Sampler], method: str) -> None:
    status, _body, headers = _request(served[0], method, "/metrics")
    assert status == 405
    assert "GET" in headers["Allow"]


def test_odd_paths_and_query_strings_are_harmless(served: tuple[int, Sampler]) -> None:
    port, sampler = served
    sampler.run_once()
    assert _request(port, "GET", "/metrics?name[]=x&%ff=%00")[0] == 200
    assert _request(port, "GET", "/" + "a" * 5000)[0] == 404
    assert _request(port, "GET", "/../../etc/passwd")[0] == 404


def test_a_client_that_never_finishes_does_not_block_scrapes(served: tuple[int, Sampler]) -> None:
    port, sampler = served
    sampler.run_once()
    stalled = socket.create_connection(("127.0.0.1", port))
    stalled.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # no final blank line, ever
    try:
        t0 = time.monotonic()
        results: list[int] = []
        threads = [
            threading.Thread(target=lambda: results.append(_request(port, "GET", "/metrics")[0])) for _ in range(5)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
        assert results == [200] * 5
        assert time.monotonic() - t0 < 2.0
    finally:
        stalled.close()


@pytest.mark.parametrize(
    ("text", "expected"),
    [(":9445", ("0.0.0.0", 9445)), ("127.0.0.1:80", ("127.0.0.1", 80)), ("[::1]:9445", ("::1", 9445))],
)
def test_listen_address_forms(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen_address(text) == expected


def test_oversized_headers_are_refused_and_scrapes_go_on(served: tuple[int, Sampler]) -> None:
    port, sampler = served
    sampler.run_once()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n")
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 431") or reply.startswith(b"HTTP/1.0 431"), reply[:80]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        many = b"".join(b"X-H%d: v\r\n" % i for i in range(500))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
        reply = s.recv(4096)
    assert b" 431 " in reply.split(b"\r\n", 1)[0], reply[:80]
    assert _request(port, "GET", "/metrics")[0] == 200
