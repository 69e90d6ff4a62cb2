"""A neighbour in the scraper's IPv6 /64, through real sockets (issue 51, defect 4).

Loopback has one IPv6 address, so the scenario runs in a network namespace of its own
(``unshare --net``, root only) whose loopback also holds fd00:1::1 (the server), fd00:1::a (the
scraper) and fd00:1::b (the neighbour): ``inside()`` runs there and prints what it saw as JSON.
The unit-level tests of the same rules are in tests/test_server_hostile.py.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import bcrypt
import pytest

SERVER, SCRAPER, NEIGHBOUR = "fd00:1::1", "fd00:1::a", "fd00:1::b"
REPO = Path(__file__).resolve().parents[1]


def _connect(source: str, port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.settimeout(10)
    s.bind((source, 0))
    s.connect((SERVER, port))
    return s


def _malformed(port: int) -> None:
    """One connection from the neighbour that sends a line that is not HTTP (it ends badly)."""
    with contextlib.suppress(OSError), _connect(NEIGHBOUR, port) as s:
        s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        while s.recv(4096):
            pass


class _FromSource(http.client.HTTPConnection):
    def __init__(self, source: str, port: int) -> None:
        super().__init__(SERVER, port, timeout=30, source_address=(source, 0))


def _get(source: str, port: int, headers: dict[str, str] | None = None) -> int | str:
    """The status of one GET /metrics from ``source``, or the error's name (a reset)."""
    conn = _FromSource(source, port)
    try:
        conn.request("GET", "/metrics", headers=headers or {})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (OSError, http.client.HTTPException) as exc:
        return type(exc).__name__
    finally:
        conn.close()


def _basic(password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"p:{password}".encode()).decode()}


def inside() -> None:
    """The scenario, in the namespace: prints {"scrapes": [...], "login": ..., "neighbour": ...}."""
    from tests.support.web import serving

    out: dict[str, object] = {}
    with serving(None, address=f"[{SERVER}]:0") as server:
        scrapes = []
        for _ in range(8):  # 8 rounds of 50 malformed requests from the neighbour, then a scrape
            for _ in range(50):
                _malformed(server.port)
            scrapes.append(_get(SCRAPER, server.port))
        out["scrapes"] = scrapes
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "web.yml"
        hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=12)).decode()  # ~0.2 s a check
        config.write_text(f"basic_auth_users:\n  p: '{hashed}'\n")
        with serving(config, address=f"[{SERVER}]:0") as server:  # just started: no credentials cached, no history
            flood = []
            for i in range(20):  # distinct wrong passwords, replies not read yet
                s = _connect(NEIGHBOUR, server.port)
                password = base64.b64encode(f"p:wrong{i}".encode()).decode()
                s.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {password}\r\n\r\n".encode())
                flood.append(s)
            # once one more is shed, the neighbour's checks are all queued (or shed)
            out["neighbour"] = _get(NEIGHBOUR, server.port, _basic("one-more"))
            out["login"] = _get(SCRAPER, server.port, _basic("right"))
            for s in flood:
                s.close()
    sys.stdout.write(json.dumps(out))


def _can_unshare() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None and shutil.which("ip") is not None


@pytest.mark.integration
@pytest.mark.skipif(not _can_unshare(), reason="needs root, unshare and ip (a network namespace)")
def test_a_neighbour_in_the_same_64_starves_neither_scrapes_nor_the_first_login() -> None:
    """Before, budgets and login lanes were per /64: the neighbour's malformed requests spent the
    /64's budget and the scraper's connections were reset; its wrong passwords filled the /64's
    login lane and the first real login after a restart was shed with a 429."""
    addresses = " && ".join(f"ip -6 addr add {a}/128 dev lo nodad" for a in (SERVER, SCRAPER, NEIGHBOUR))
    code = "from tests.test_server_same_64 import inside; inside()"
    script = f"ip link set lo up && {addresses} && exec {sys.executable} -c '{code}'"
    done = subprocess.run(
        ["unshare", "--net", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert seen["scrapes"] == [200] * 8, seen
    assert seen["neighbour"] == 429, seen  # the neighbour's own lane is full
    assert seen["login"] == 200, seen
