"""bench/hostile.py without running an attack: the registry, the tables, the helpers it measures
with, and the one ClientHello the ffdhe attacks replay."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import asdict

from bench.hostile import (
    COLUMNS,
    CONTAINER_COLUMNS,
    Outcome,
    ScraperConfig,
    container_markdown,
    list_attacks,
    markdown,
    percentile,
    podman_limits,
    socket_queue_bytes,
)
from bench.hostile_attacks import OTHER_CLIENT, AttackSpec, Budget, ffdhe8192_client_hello, registry

ROUND_1 = ("slow", "headers", "accept", "password")
ROUND_2 = (
    "unread",
    "unread-mig",
    "unread-healthz-auth",
    "tls-ffdhe-8",
    "tls-ffdhe-48",
    "tls-ffdhe-mtls",
    "tls-plaintext-churn",
    "login-queue",
    "login-queue-same-addr",
    "keepalive-at-cap",
)


def test_registry_holds_every_attack_with_its_setup() -> None:
    attacks, peers_missing = registry()
    assert set(ROUND_1 + ROUND_2) <= set(attacks)
    assert all(name == spec.name for name, spec in attacks.items())
    assert [n for n, s in attacks.items() if s.container] == ["unread", "tls-ffdhe-48", "tls-plaintext-churn"]
    assert attacks["unread-mig"].scenario == "mig7x8" and attacks["unread"].scenario == "h200x8"
    assert attacks["tls-ffdhe-mtls"].tls == "mtls" and attacks["tls-plaintext-churn"].rss_after_seconds == 10
    login, same = attacks["login-queue"], attacks["login-queue-same-addr"]
    assert login.source == OTHER_CLIENT and same.source == "127.0.0.1"
    assert not login.warm_up and login.auth and login.scraper_lag_s > 0
    assert attacks["keepalive-at-cap"].keepalive_scraper
    peers = [s for s in attacks.values() if s.peer]
    assert bool(peers) != bool(peers_missing)  # either the peer attacks, or why there are none
    listing = list_attacks(attacks, peers_missing)
    assert all(name in listing for name in attacks)


def _row_cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_markdown_rows_have_every_column_and_name_the_misses() -> None:
    good = Outcome("gpulens", "slow", 30.0, 31.0, None, 0.2, 5, 5, 7, 9, 10, 10, 5.0, 9.0, 500)
    bad = Outcome("gpulens", "unread", 30.0, 90.0, 95.0, 150.0, 5, 6, 7, 608, 10, 4, 20.0, 900.0, 600)
    peer = Outcome("node_exporter", "kubelet-big", not_applicable="no kubelet or API client")
    table = markdown([good, bad, peer])
    header, rule, *rows = [line for line in table.splitlines() if line.startswith("|")]
    width = len(COLUMNS) + 2
    assert all(len(_row_cells(line)) == width for line in (header, rule, *rows))
    assert _row_cells(rows[0])[-2] == "–"
    assert _row_cells(rows[1])[-2] == "RSS, fds, p99, lost scrapes"
    assert _row_cells(rows[1])[4] == "95.0"  # RSS after
    assert _row_cells(rows[2])[-1] == "no kubelet or API client"
    assert "Goals:" in table
    boxed = container_markdown(
        [Outcome("gpulens (image)", "unread", oom_killed=True, memory_peak_mb=134.2)],
        {
            "memory": "128Mi",
            "cpu": "200m",
        },
    )
    header, _, row = [line for line in boxed.splitlines() if line.startswith("|")]
    assert len(_row_cells(header)) == len(_row_cells(row)) == len(CONTAINER_COLUMNS) + 1
    assert _row_cells(row)[1:3] == ["yes", "134.2"]


def test_helpers() -> None:
    assert podman_limits({"memory": "128Mi", "cpu": "200m"}) == ["--memory=128m", "--memory-swap=128m", "--cpus=0.2"]
    assert percentile([], 99) != percentile([], 99)  # NaN
    assert percentile([5.0], 99) == 5.0
    cfg = ScraperConfig(port=1, auth=True, ca="/ca", keepalive=True)
    assert ScraperConfig(**json.loads(json.dumps(asdict(cfg)))) == cfg
    budget = Budget(60, max_opens=2)
    assert budget.take() and budget.take() and not budget.take() and not budget.running()


def test_socket_queues_count_what_the_server_has_not_read() -> None:
    measured = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                measured.wait(10)  # what the client sends stays unread until it has been counted

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            client.sendall(b"x" * 1000)
            deadline = time.monotonic() + 5
            while socket_queue_bytes(port) != 1000 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert socket_queue_bytes(port) == 1000
            measured.set()
        server.join(5)


def test_ffdhe8192_client_hello_offers_that_group_only() -> None:
    hello = ffdhe8192_client_hello()
    assert hello[0] == 0x16 and hello[5] == 0x01  # a handshake record holding a ClientHello
    assert b"\x00\x0a\x00\x04\x00\x02\x01\x04" in hello  # supported_groups: [ffdhe8192 (0x0104)]
    assert len(hello) > 1024  # its 8192-bit key share is in it


def test_attack_spec_defaults_are_plain_http() -> None:
    spec = AttackSpec("x", lambda target, budget: 0, "nothing")
    assert (spec.auth, spec.tls, spec.peer, spec.warm_up) == (False, "", "", True)
