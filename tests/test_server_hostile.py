"""The HTTP front under the second round of hostile clients (docs/security.md, "HTTP front").

Each test fails on the front as it was before: unread replies held a page copy each and their
connections were never evicted; idle scrapers were evicted first; ffdhe-only ClientHellos got an
8192-bit key exchange; handshakes ran on the loop; the heap was trimmed only every 5 minutes;
wrong passwords queued in one FIFO; ``:port`` listened on IPv4 only; and four smaller gaps.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bcrypt
import pytest
import trustme

from exporter.http import tls_session
from exporter.http.admission import ConnectionBudget
from exporter.http.clients import KnownClients
from exporter.http.limits import Limits
from exporter.http.login import LoginScheduler, client_lane
from exporter.http.server import MetricsServer
from exporter.http.tls_groups import set_groups
from exporter.http.webconfig import BasicAuth, WebConfigError, load_web_config
from tests.support.web import client_ctx, serving, write_pair

PAGE = b"# a big page\n" + b"gpu_metric 1\n" * 80_000  # ~1 MB, like a MIG node's page
GET = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


@contextlib.contextmanager
def big_page_server(limits: Limits) -> Iterator[MetricsServer]:
    """A front serving PAGE (as parts, like CachedExposition) on loopback."""
    server = MetricsServer(
        "127.0.0.1:0", lambda accept: ((memoryview(PAGE), b"# age\n"), "text/plain"), ready=lambda: True, limits=limits
    )
    server.start()
    try:
        yield server
    finally:
        server.shutdown()


def _on_loop(server: MetricsServer, fn):  # type: ignore[no-untyped-def]
    """Run ``fn()`` on the server's loop thread and return its result (its tables live there)."""

    async def call():  # type: ignore[no-untyped-def]
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), server.loop).result(5)


def _status(conn: http.client.HTTPConnection) -> int:
    """The status of one ``GET /metrics`` on ``conn`` (read whole, then closed)."""
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _scrape(port: int, host: str = "127.0.0.1", timeout: float = 10.0) -> int:
    return _status(http.client.HTTPConnection(host, port, timeout=timeout))


def _unread_clients(port: int, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(GET * 4)
        socks.append(s)
    return socks


# --- unread replies -------------------------------------------------------------------------


def test_unread_replies_hold_a_bounded_number_of_bytes_and_connections() -> None:
    """60 clients pipeline 4 scrapes of a 1 MB page and read nothing.  Before: every connection
    kept about a page in its buffer (~60 MB).  Now at most ``max_stalled`` are kept, each with at
    most one write slice in user space, and a normal scrape is still answered."""
    with big_page_server(Limits(max_stalled=8)) as server:
        socks = _unread_clients(server.port, 60)
        try:
            time.sleep(1.5)
            buffered = _on_loop(
                server, lambda: [c.transport.get_write_buffer_size() for c in server._conns.values() if c.transport]
            )
            assert sum(buffered) <= 8 * 64 * 1024, (len(buffered), sum(buffered))
            assert server.stall_closed >= 40
            assert _scrape(server.port) == 200
        finally:
            for s in socks:
                s.close()


def test_connections_with_unread_replies_are_evicted_at_the_cap() -> None:
    """All 20 connection slots held by clients that never read: before, a new scraper was refused
    (busy connections were never evicted); now the longest-stalled one makes room."""
    with big_page_server(Limits(max_connections=20, max_stalled=100)) as server:
        socks = _unread_clients(server.port, 20)
        try:
            time.sleep(1.0)
            assert server.open_connections() == 20
            assert _scrape(server.port) == 200
            assert server.evicted >= 1 and server.refused == 0
        finally:
            for s in socks:
                s.close()


def test_a_scrapers_kept_alive_connection_outlives_churning_idle_connections_at_the_cap() -> None:
    """At the cap, 60 clients that make one request each and then sit idle: before, the oldest
    idle connection went first, which between scrapes is the scraper's; now connections that have
    delivered many replies go last."""
    with big_page_server(Limits(max_connections=10)) as server:
        scraper = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        for _ in range(20):
            scraper.request("GET", "/healthz")
            scraper.getresponse().read()
        first_sock = scraper.sock
        others = []
        try:
            for _ in range(60):
                c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
                c.request("GET", "/healthz")
                c.getresponse().read()
                others.append(c)
            scraper.request("GET", "/healthz")
            assert scraper.getresponse().read() == b"ok\n"
            assert scraper.sock is first_sock, "the scraper had to reconnect"
            assert server.evicted >= 50
        finally:
            scraper.close()
            for c in others:
                c.close()


# --- TLS -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def _tls_config(folder: Path, ca: trustme.CA, extra: str = "") -> Path:
    cert, key = write_pair(ca, folder)
    path = folder / "web.yml"
    path.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n{extra}")
    return path


def _client_hello(groups: list[str]) -> bytes:
    """The first flight of a TLS client that offers only ``groups``."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    set_groups(ctx, groups)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_side=False)
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def _answer_to(port: int, hello: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(hello)
        got = bytearray()
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                got += chunk
                if got[:1] == b"\x16" and len(got) > 100:  # a ServerHello flight: enough said
                    break
        return bytes(got)


def test_a_client_offering_only_ffdhe8192_gets_an_alert_not_a_key_exchange(tmp_path: Path, ca: trustme.CA) -> None:
    """Before, OpenSSL's default groups included ffdhe8192 and the server computed an 8192-bit
    key share (~120-190 ms of CPU per replayed ClientHello); now only ECDHE groups are offered."""
    with serving(_tls_config(tmp_path, ca)) as server:
        answer = _answer_to(server.port, _client_hello(["ffdhe8192"]))
        assert answer[:1] == b"\x15", answer[:16]  # an alert record, no ServerHello (0x16)
        ok = _answer_to(server.port, _client_hello(["X25519"]))
        assert ok[:1] == b"\x16"


def test_curve_preferences_are_honoured(tmp_path: Path, ca: trustme.CA) -> None:
    """``curve_preferences`` was accepted and ignored; now it is the list of groups offered."""
    cfg = _tls_config(tmp_path, ca, "  curve_preferences: [CurveP256]\n")
    with serving(cfg) as server:
        assert _answer_to(server.port, _client_hello(["X25519"]))[:1] == b"\x15"
        assert _answer_to(server.port, _client_hello(["P-256"]))[:1] == b"\x16"


def test_an_unknown_curve_name_is_refused_at_start(tmp_path: Path, ca: trustme.CA) -> None:
    cfg = _tls_config(tmp_path, ca, "  curve_preferences: [CurveP256, ffdhe8192]\n")
    with pytest.raises(WebConfigError, match="curve_preferences"):
        load_web_config(str(cfg))


@pytest.mark.parametrize("key", ["min_version", "max_version"])
def test_tls10_is_refused_where_openssl_would_refuse_every_such_handshake(
    tmp_path: Path, ca: trustme.CA, key: str
) -> None:
    """``min_version: TLS10`` was accepted, yet OpenSSL 3 at security level 2 completes no TLS 1.0
    handshake; the config now fails at start with the reason."""
    if ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).security_level < 1:
        pytest.skip("this OpenSSL still allows TLS 1.0")
    cfg = _tls_config(tmp_path, ca, f"  {key}: TLS10\n")
    with pytest.raises(WebConfigError, match=f"{key} TLS10"):
        load_web_config(str(cfg))


def test_a_slow_handshake_does_not_hold_up_an_established_tls_scraper(
    tmp_path: Path, ca: trustme.CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handshake step that takes long (an expensive key exchange) runs on the TLS thread: a
    kept-alive TLS scraper is answered meanwhile.  Before, handshakes ran on the loop thread."""
    release = threading.Event()
    real = tls_session.TlsSession.handshake_step
    blocked: list[bool] = []
    slow: list[bool] = []  # set once the scraper is established: every later step is slow

    def slow_step(self: tls_session.TlsSession) -> bool:
        if slow:
            blocked.append(True)
            release.wait(10)
        return real(self)

    monkeypatch.setattr(tls_session.TlsSession, "handshake_step", slow_step)
    with serving(_tls_config(tmp_path, ca)) as server:
        scraper = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=10, context=client_ctx(ca))
        scraper.request("GET", "/healthz")
        assert scraper.getresponse().read() == b"ok\n"

        slow.append(True)
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as victim:
            victim.sendall(_client_hello(["X25519"]))
            deadline = time.monotonic() + 5
            while not blocked and time.monotonic() < deadline:
                time.sleep(0.02)
            assert blocked, "the slow step never started"
            scraper.request("GET", "/healthz")
            assert scraper.getresponse().read() == b"ok\n"
            release.set()
        scraper.close()


def test_plaintext_on_the_tls_port_is_refused_and_bursts_trim_the_heap(tmp_path: Path, ca: trustme.CA) -> None:
    """Clients sending a plaintext head to the TLS port, again and again: each is refused, and
    after the burst the C heap is trimmed (before: only every 5 minutes, so 564 MB stayed)."""
    with serving(_tls_config(tmp_path, ca)) as server:
        for _ in range(150):  # from another address: these use up 127.0.0.2's budget, not the scraper's
            other = ("127.0.0.2", 0)
            # Once that budget is spent a connection may be reset while it connects: no error here.
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", server.port), timeout=5, source_address=other) as s,
            ):
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        deadline = time.monotonic() + 5
        while server.trims == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.trims >= 1
        status = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=10, context=client_ctx(ca))
        status.request("GET", "/healthz")
        assert status.getresponse().status == 200
        status.close()


def test_plaintext_on_the_tls_port_is_answered_in_plain_text_before_any_ssl_object(
    tmp_path: Path, ca: trustme.CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plaintext head on the TLS port, 150 times from one address: before, each admitted
    connection got an SSL object and a handshake step on the TLS thread, and its address was
    charged only once that step had failed, so a client reconnecting at once kept hundreds of SSL
    objects a second in flight (RSS +23-30 MB) and filled the handshake queue (a scraper's
    handshake was shed).  Now the first byte decides: not a TLS handshake record, a plain-text
    400 and a charge at once, and no SSL object.  A connection that sends nothing costs none
    either; a TLS scraper is served as before."""
    from exporter.http import connection

    sessions: list[tls_session.TlsSession] = []

    class Counted(tls_session.TlsSession):
        def __init__(self, context: ssl.SSLContext) -> None:
            sessions.append(self)
            super().__init__(context)

    monkeypatch.setattr(connection, "TlsSession", Counted)
    with serving(_tls_config(tmp_path, ca)) as server:
        answers = []
        started = time.monotonic()
        for _ in range(150):
            got = bytearray()
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", server.port), timeout=10, source_address=("127.0.0.2", 0)) as s,
            ):
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                while chunk := s.recv(4096):
                    got += chunk
            answers.append(bytes(got))
        with socket.create_connection(("127.0.0.1", server.port), timeout=10):
            pass  # connects and closes without a byte
        assert sessions == [], f"{len(sessions)} SSL objects for plaintext clients"
        assert answers[0].startswith(b"HTTP/1.0 400 Bad Request\r\n"), answers[0][:16]
        assert answers[0].endswith(b"client sent an HTTP request to an HTTPS server\n"), answers[0]
        assert server.handshakes_shed == 0
        # each was charged at once: the burst ran dry, less what the budget refilled meanwhile (a
        # loaded machine takes seconds over the 150)
        refilled = server.budget.rate * (time.monotonic() - started)
        assert server.budget.refused >= min(40, 150 - server.budget.burst - refilled - 1)
        scraper = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=10, context=client_ctx(ca))
        scraper.request("GET", "/metrics")
        assert scraper.getresponse().status == 200
        scraper.close()
        assert len(sessions) == 1


def test_one_address_cannot_fill_the_handshake_queue_and_shed_a_scrapers_handshake(
    tmp_path: Path, ca: trustme.CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    """70 connections from 127.0.0.2 each send a ClientHello while the TLS thread is held up.
    Before, all of them queued until the queue (``max_handshakes``, 64) was full, and the
    scraper's handshake from 127.0.0.1 was shed: its connection reset, a lost scrape.  Now one
    address has at most ``max_handshakes_per_client`` steps waiting; the rest of its connections
    are shed and charged to it, and the scraper's handshake waits its turn."""
    release = threading.Event()
    real = tls_session.TlsSession.handshake_step

    def held_step(self: tls_session.TlsSession) -> bool:
        release.wait(10)
        return real(self)

    monkeypatch.setattr(tls_session.TlsSession, "handshake_step", held_step)
    limits = Limits()
    hello = _client_hello(["X25519"])
    with serving(_tls_config(tmp_path, ca), limits=limits) as server:
        attackers = []
        try:
            for _ in range(70):
                s = socket.create_connection(("127.0.0.1", server.port), timeout=10, source_address=("127.0.0.2", 0))
                attackers.append(s)
                with contextlib.suppress(OSError):
                    s.sendall(hello)
            deadline = time.monotonic() + 10
            while (
                time.monotonic() < deadline
                and _on_loop(server, lambda: server._handshakes + server.handshakes_shed) < 70
            ):
                time.sleep(0.05)
            waiting = _on_loop(server, lambda: server._handshakes)
            scraped: list[object] = []

            def scrape() -> None:
                try:
                    scraped.append(_https_status(server.port, ca))
                except OSError as exc:
                    scraped.append(exc)

            scraper = threading.Thread(target=scrape)
            scraper.start()
            # the scraper's ClientHello has come: queued, or shed
            while (
                time.monotonic() < deadline
                and _on_loop(server, lambda: server._handshakes + server.handshakes_shed) < 71
            ):
                time.sleep(0.02)
            release.set()
            scraper.join(15)
            assert scraped == [200], scraped
            assert waiting <= limits.max_handshakes_per_client
            assert server.handshakes_shed >= 70 - limits.max_handshakes_per_client
        finally:
            release.set()
            for s in attackers:
                s.close()


def _https_status(port: int, ca: trustme.CA) -> int:
    return _status(http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=client_ctx(ca)))


# --- new connections per address --------------------------------------------------------------


def _request_from(source: str, port: int, request: bytes) -> bool:
    """Whether a connection from ``source`` sending ``request`` got any HTTP reply."""
    with socket.socket() as s:
        s.bind((source, 0))
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(request)
            return s.recv(64).startswith(b"HTTP/1.1 ")
        except OSError:
            return False


def test_an_address_whose_connections_misbehave_is_reset_while_another_is_served() -> None:
    """Before, every new connection was accepted and read, so a client reconnecting as fast as it
    was dropped kept the loop busy and every scraper's connection queued behind it.  Now each
    connection that ends badly costs its address a token; an address without tokens is reset at
    once.  Connections that end well cost nothing."""
    limits = Limits(bad_endings_per_second=1, bad_endings_burst=10)
    with big_page_server(limits) as server:
        healthz = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        assert all(_request_from("127.0.0.2", server.port, healthz) for _ in range(30)), "good ones are free"
        answered = [_request_from("127.0.0.2", server.port, b"NOT HTTP\r\n\r\n") for _ in range(40)]
        assert answered[:10] == [True] * 10 and not any(answered[12:]), answered
        assert server.budget.refused >= 25
        assert not _request_from("127.0.0.2", server.port, healthz)  # until it earns tokens back
        assert _scrape(server.port) == 200  # 127.0.0.1 has its own budget


def test_the_connection_budget_refills_at_its_rate() -> None:
    from exporter.http.admission import ConnectionBudget

    now = [0.0]
    budget = ConnectionBudget(rate=2.0, burst=3.0, max_addresses=2, clock=lambda: now[0])
    for _ in range(3):
        assert budget.admit("10.0.0.1")
        budget.charge("10.0.0.1")
    assert not budget.admit("10.0.0.1")
    now[0] += 0.5  # one token back
    assert budget.admit("10.0.0.1")
    budget.charge("10.0.0.1")
    assert not budget.admit("10.0.0.1")
    assert budget.admit("::ffff:10.0.0.2")  # another lane, full bucket
    assert budget.admit("10.0.0.3") and budget.admit("10.0.0.1"), "forgotten beyond max_addresses: a full bucket"


# --- logins --------------------------------------------------------------------------------


class _GatedAuth(BasicAuth):
    """A BasicAuth whose checks wait for ``gate`` and record the order they ran in."""

    def __init__(self) -> None:
        super().__init__({"prometheus": bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=4))})
        self.gate = threading.Event()
        self.order: list[str] = []

    def check(self, header: str | None) -> bool:
        self.gate.wait(10)
        self.order.append(base64.b64decode((header or "").split()[1]).decode())
        return super().check(header)


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_a_flood_of_wrong_passwords_from_one_address_does_not_delay_another_address() -> None:
    """Before, every uncached check waited in one FIFO: 200 wrong passwords put the first real
    login after a restart behind 200 checks.  Now lanes are per client address, round-robin, and
    a full lane sheds its excess."""
    auth = _GatedAuth()
    loop = asyncio.new_event_loop()
    pool = ThreadPoolExecutor(1)
    try:
        scheduler = LoginScheduler(auth, pool, loop, lane_depth=4)

        async def scenario() -> tuple[list[bool | None], bool]:
            flood = [scheduler.check("10.0.0.66", _basic("prometheus", f"wrong{i}")) for i in range(200)]
            real = scheduler.check("10.0.0.7", _basic("prometheus", "right"))
            assert real is not None
            auth.gate.set()
            verdict = await real
            rest = [await f if f is not None else None for f in flood]
            return rest, verdict

        rest, verdict = loop.run_until_complete(scenario())
        assert verdict is True
        # after the check already running and at most one more from the flooding lane (its turn)
        assert auth.order.index("prometheus:right") <= 2, auth.order
        assert sum(r is None for r in rest) == 200 - 5  # one running + 4 waiting; the rest shed
        assert scheduler.shed == 195
    finally:
        pool.shutdown()
        loop.close()


def test_unknown_users_cost_no_bcrypt_and_identical_credentials_share_one_check() -> None:
    auth = _GatedAuth()
    auth.gate.set()
    loop = asyncio.new_event_loop()
    pool = ThreadPoolExecutor(1)
    try:
        scheduler = LoginScheduler(auth, pool, loop)

        async def scenario() -> list[bool]:
            a = scheduler.check("10.0.0.1", _basic("nobody", "x"))
            b = scheduler.check("10.0.0.1", _basic("prometheus", "right"))
            c = scheduler.check("10.0.0.2", _basic("prometheus", "right"))
            assert a is not None and b is not None and b is c
            return [await a, await b]

        assert loop.run_until_complete(scenario()) == [False, True]
        assert auth.order == ["prometheus:right"]
    finally:
        pool.shutdown()
        loop.close()


@pytest.mark.parametrize(
    ("peer", "lane"),
    [
        ("10.1.2.3", "10.1.2.3"),
        ("::ffff:10.1.2.3", "10.1.2.3"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("fe80::1%eth0", "fe80::/64"),
    ],
)
def test_client_lanes(peer: str, lane: str) -> None:
    assert client_lane(peer) == lane


# --- a neighbour in the same /64 (issue 51, defect 4) ------------------------------------------

SCRAPER, NEIGHBOUR = "fd00:1::a", "fd00:1::b"
"""Two addresses of one /64: pods of one node often share it."""


def test_a_flood_from_a_neighbour_in_the_same_64_does_not_refuse_the_scraper() -> None:
    """Before, the budget was one bucket per /64: 100 malformed requests a second from fd00:1::b
    spent it, and 35 of 40 scrapes from fd00:1::a were reset.  Now each address has its own
    bucket and the /64's is larger than one address can spend, so only the flooding address is
    refused, even for a scraper never served before (no history after a restart)."""
    now = [0.0]
    budget = ConnectionBudget(clock=lambda: now[0])
    refused_scrapes = 0
    for second in range(40):
        for k in range(100):
            now[0] = second + k / 100
            if budget.admit(NEIGHBOUR):
                budget.charge(NEIGHBOUR)  # malformed: ends badly
        refused_scrapes += not budget.admit(SCRAPER)  # a scrape ends well: no charge
    assert refused_scrapes == 0
    assert not budget.admit(NEIGHBOUR), "the flooding address is refused"


def test_a_known_scraper_keeps_its_budget_while_a_neighbour_cycles_through_the_64() -> None:
    """A neighbour that takes a fresh address of the /64 for each bad connection spends the /64's
    bucket: that shuts out the /64's unknown addresses, never one that has been served well."""
    now = [0.0]
    budget = ConnectionBudget(clock=lambda: now[0])
    budget.known.served_well(SCRAPER)
    for i in range(4000):
        now[0] = i / 100
        cycled = f"fd00:1::1:{i:x}"
        if budget.admit(cycled):
            budget.charge(cycled)
        if i % 100 == 0:
            assert budget.admit(SCRAPER), i
    assert not budget.admit("fd00:1::dead"), "an unknown address of the spent /64 is refused"
    assert budget.admit("fd00:2::1"), "another /64 has its own budget"


def test_the_known_clients_are_bounded_least_recently_served_forgotten_first() -> None:
    """An attacker can cycle through 2^64 addresses of its /64: the table of known-good
    addresses stays at its bound, a lane adds only its grants, and a scraper served on every
    round stays known."""
    now = [0.0]
    known = KnownClients(max_known=16, grants_per_second=1.0, grant_burst=4.0, clock=lambda: now[0])
    for i in range(1000):  # 10 s of a neighbour served well from a new address of its /64 each time
        now[0] = i / 100
        known.served_well("fd00:9::1")  # a scraper in another /64, served all along
        known.served_well(f"fd00:1::{i:x}")
    same_64 = sum(known.knows(f"fd00:1::{i:x}") for i in range(1000))
    assert same_64 <= 4 + 10 + 1, "a lane adds its burst, then one a second"
    for i in range(10_000):  # many IPv4 clients, each a lane of its own
        now[0] = 10 + i / 100
        known.served_well("fd00:9::1")
        known.served_well(f"10.0.{i // 256}.{i % 256}")
        assert len(known) <= 16
    assert known.knows("fd00:9::1")
    assert not known.knows("10.0.0.0") and not known.knows("fd00:1::0"), "the least recently served went first"
    known.forget("fd00:9::1")
    assert not known.knows("fd00:9::1")


def test_the_first_login_after_a_restart_is_not_blocked_by_a_neighbours_wrong_passwords() -> None:
    """Before, login lanes were per /64: 200 distinct wrong passwords from fd00:1::b filled the
    /64's lane and the first real login from fd00:1::a was shed (429), 5 of 5 times.  Now lanes
    are per address, round-robin inside the /64."""
    auth = _GatedAuth()
    loop = asyncio.new_event_loop()
    pool = ThreadPoolExecutor(1)
    try:
        scheduler = LoginScheduler(auth, pool, loop, lane_depth=4)

        async def scenario() -> bool:
            flood = [scheduler.check(NEIGHBOUR, _basic("prometheus", f"wrong{i}")) for i in range(200)]
            real = scheduler.check(SCRAPER, _basic("prometheus", "right"))
            assert real is not None, "the scraper's login was shed"
            auth.gate.set()
            verdict = await real
            for f in flood:
                if f is not None:
                    await f
            return verdict

        assert loop.run_until_complete(scenario()) is True
        assert auth.order.index("prometheus:right") <= 2, auth.order
    finally:
        pool.shutdown()
        loop.close()


def test_a_known_good_address_is_never_queued_behind_its_64s_flood() -> None:
    """A neighbour cycling through the /64 fills every lane the /64 may have; an address served
    well lately (here: new credentials after a rotation) is checked next, and a wrong password
    makes it unknown again."""
    auth = _GatedAuth()
    loop = asyncio.new_event_loop()
    pool = ThreadPoolExecutor(1)
    try:
        known = KnownClients()
        known.served_well(SCRAPER)
        scheduler = LoginScheduler(auth, pool, loop, known=known)

        async def scenario() -> list[bool]:
            flood = [scheduler.check(f"fd00:1::1:{i:x}", _basic("prometheus", f"wrong{i}")) for i in range(200)]
            assert scheduler.check("fd00:1::dead", _basic("prometheus", "other")) is None, "the /64 is full"
            real = scheduler.check(SCRAPER, _basic("prometheus", "right"))
            wrong = scheduler.check(SCRAPER, _basic("prometheus", "stale"))
            assert real is not None and wrong is not None
            auth.gate.set()
            verdicts = [await real, await wrong]
            for f in flood:
                if f is not None:
                    await f
            return verdicts

        assert loop.run_until_complete(scenario()) == [True, False]
        assert auth.order.index("prometheus:right") <= 1, auth.order
        assert not known.knows(SCRAPER), "a wrong password: unknown again"
    finally:
        pool.shutdown()
        loop.close()


def test_a_client_becomes_known_by_a_2xx_with_correct_credentials_only(tmp_path: Path) -> None:
    """Through a real socket: a 401 and an unauthenticated /healthz vouch for nobody; a scrape
    with the right password makes its address known-good."""
    good = base64.b64encode(b"p:s3cret").decode()
    with serving(_auth_config(tmp_path)) as server:
        assert _raw(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").startswith(
            b"HTTP/1.1 200 "
        )
        assert _raw(server.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").startswith(
            b"HTTP/1.1 401 "
        )
        assert not _on_loop(server, lambda: server.known.knows("127.0.0.1"))
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", "/metrics", headers={"Authorization": f"Basic {good}"})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
        conn.request("GET", "/healthz")  # the next request on the connection: the first is out whole
        conn.getresponse().read()
        conn.close()
        assert _on_loop(server, lambda: server.known.knows("127.0.0.1"))


# --- listening -----------------------------------------------------------------------------


def _reaches(family: socket.AddressFamily, host: str, port: int) -> bool:
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect((host, port))
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


@pytest.mark.skipif(not socket.has_dualstack_ipv6(), reason="no IPv6 on this host")
@pytest.mark.parametrize(
    ("address", "v4", "v6"),
    [(":0", True, True), ("0.0.0.0:0", True, False), ("[::]:0", False, True)],
)
def test_the_address_form_chooses_the_stacks(address: str, v4: bool, v6: bool) -> None:
    """``:port`` listens on both stacks, as Go exporters do (before: IPv4 only)."""
    with serving(None, address=address) as server:
        assert _reaches(socket.AF_INET, "127.0.0.1", server.port) is v4
        assert _reaches(socket.AF_INET6, "::1", server.port) is v6


# --- smaller items ---------------------------------------------------------------------------


def _auth_config(folder: Path) -> Path:
    path = folder / "web.yml"
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    path.write_text(f"basic_auth_users:\n  p: '{hashed}'\n")
    return path


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        got = bytearray()
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                got += chunk
        return bytes(got)  # all of it: the server closed the connection


def test_the_basic_scheme_is_case_insensitive(tmp_path: Path) -> None:
    token = base64.b64encode(b"p:s3cret").decode()
    with serving(_auth_config(tmp_path)) as server:
        for scheme in ("basic", "BASIC", "Basic"):
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            conn.request("GET", "/metrics", headers={"Authorization": f"{scheme} {token}"})
            assert conn.getresponse().status == 200, scheme
            conn.close()


def test_two_authorization_headers_are_refused(tmp_path: Path) -> None:
    """Before, the last one counted; proxies may pass on the first.  Now: 400 and close."""
    good = base64.b64encode(b"p:s3cret").decode()
    with serving(_auth_config(tmp_path)) as server:
        got = _raw(
            server.port,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic Zm9vOmJhcg==\r\n"
            + f"Authorization: Basic {good}\r\n\r\n".encode(),
        )
        assert got.startswith(b"HTTP/1.1 400 ")


def test_content_length_with_transfer_encoding_is_refused_and_closed() -> None:
    """Both framings in one request (a smuggling vector) was answered and kept alive; now 400,
    and the connection closes (``_raw`` only returns once it has)."""
    with serving(None) as server:
        got = _raw(
            server.port,
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
            + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        assert got.startswith(b"HTTP/1.1 400 ") and got.count(b"HTTP/1.1") == 1


def test_a_client_pushing_headers_past_the_431_is_not_read_any_more() -> None:
    """After the 431 the connection waits for the client to take the reply; before this fix the
    bytes it kept pushing were still read into h11's buffer meanwhile (+65 MB for 20 clients)."""
    with big_page_server(Limits()) as server:
        line = b"X-Big: " + b"b" * (64 * 1024) + b"\r\n"
        with socket.create_connection(("127.0.0.1", server.port), timeout=2) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            sent = 0
            with contextlib.suppress(OSError):  # the server stops reading: our sends time out
                for _ in range(200):
                    s.sendall(line)
                    sent += len(line)
            buffered = _on_loop(server, lambda: [len(c.h.trailing_data[0]) for c in server._conns.values()])
            assert not buffered or max(buffered) <= 64 * 1024, buffered
            assert sent < 8 << 20, sent  # the kernel's buffers filled; nobody read the rest
