"""Nagle's algorithm is off on every connection the exporter and the dashboard accept.

With it on, a reply written as headers then body waits on a kept-alive connection for the
client's delayed acknowledgement (40 ms on Linux): each gzipped scrape of the exporter and each
of the ~60 files of a dashboard first load came 40 ms late (docs/benchmarks.md, "Nagle"). The
checks read the server's own end of the connection (tests/support/sockets.py), not a timing.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import socket
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from dashboard import server as dashboard_server
from exporter.http.server import MetricsServer
from exporter.render.collector import SnapshotCollector
from exporter.sampler import Sampler
from exporter.tcp import as_tcp
from tests.fakes_backend import ScriptedBackend, healthy
from tests.support.net import free_port
from tests.support.process import managed_process
from tests.support.sockets import server_nodelay

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]


def _accepted_nodelay(listener: socket.socket) -> bool:
    """Serve ``listener`` with asyncio, connect once, and read TCP_NODELAY off the accepted end."""

    async def run() -> bool:
        seen: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                seen.set_result(bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
        _r, writer = await asyncio.open_connection(*listener.getsockname()[:2])
        try:
            return await asyncio.wait_for(seen, 5)
        finally:
            writer.close()
            server.close()

    return asyncio.run(run())


def test_asyncio_keeps_nagle_on_a_protocol_0_listener_and_as_tcp_turns_it_off() -> None:
    plain = socket.create_server(("127.0.0.1", 0))
    assert plain.proto == 0
    assert _accepted_nodelay(plain) is False, "the cause: asyncio leaves Nagle on for a protocol-0 listener"
    fixed = as_tcp(socket.create_server(("127.0.0.1", 0)))
    assert fixed.proto == socket.IPPROTO_TCP
    assert _accepted_nodelay(fixed) is True


def test_as_tcp_leaves_other_sockets_as_they_are(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
        assert as_tcp(unix) is unix
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP) as tcp:
        assert as_tcp(tcp) is tcp
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        assert as_tcp(udp) is udp


def test_as_tcp_keeps_the_descriptor_its_blocking_mode_and_inheritance() -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    sock.setblocking(False)
    sock.set_inheritable(True)
    fd, name = sock.fileno(), sock.getsockname()
    out = as_tcp(sock)
    try:
        assert (out.fileno(), out.getsockname(), out.getblocking(), out.get_inheritable()) == (fd, name, False, True)
        assert sock.fileno() == -1, "the old object no longer owns the descriptor"
    finally:
        out.close()


def test_the_exporter_answers_with_nagle_off_on_a_kept_alive_connection() -> None:
    sampler = Sampler(ScriptedBackend(healthy(2)))
    sampler.run_once()
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(sampler.latest))
    server = MetricsServer("127.0.0.1:0", reg, ready=lambda: True)
    server.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        for _ in range(2):  # kept alive: the second reply is the one Nagle would hold
            conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
            assert conn.getresponse().read()
        assert server_nodelay(os.getpid(), conn.sock) is True
        conn.close()
    finally:
        server.shutdown()


def test_install_relabels_streamlits_listening_socket() -> None:
    from streamlit.web.server.starlette import starlette_server

    assert dashboard_server.install() is True
    assert dashboard_server.install() is True, "installing twice wraps once"
    sock = starlette_server._bind_socket("127.0.0.1", 0, 8)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


def test_the_served_dashboard_answers_with_nagle_off() -> None:
    """The real ``python -m dashboard``: its end of a kept-alive browser-like connection."""
    port = free_port()
    argv = [sys.executable, "-m", "dashboard", "--scrape", "127.0.0.1:9", "--port", str(port), "--address",
            "127.0.0.1", "--refresh", "0"]  # fmt: skip
    log = REPO / "artifacts" / f"dashboard-nodelay-{port}.log"
    log.parent.mkdir(exist_ok=True)
    with managed_process(argv, f"http://127.0.0.1:{port}/_stcore/health", log=log) as proc:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for path in ("/", "/_stcore/health"):
            conn.request("GET", path)
            assert conn.getresponse().read()
        assert server_nodelay(proc.pid, conn.sock) is True
        conn.close()
    assert dashboard_server.NOT_APPLIED not in log.read_text()
