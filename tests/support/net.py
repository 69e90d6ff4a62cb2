"""Loopback helpers: free ports and waiting for HTTP endpoints."""

from __future__ import annotations

import itertools
import os
import socket
import ssl
import time
import urllib.error
import urllib.request

PORTS_FROM = 20000
"""The first port tests hand out: below the kernel's ephemeral range (32768 and up by default), so no
outgoing connection can take a port between its choice and the server's bind."""
PORTS_PER_WORKER = 1000


def _worker() -> int:
    """This pytest-xdist worker's number (``gw3`` -> 3); 0 outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0


_next_port = itertools.count()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, from a block of its own for each xdist
    worker: two workers never pick the same port, and one worker walks its block round-robin, so a
    port a test just closed is not handed out again at once."""
    first = PORTS_FROM + _worker() * PORTS_PER_WORKER
    for _ in range(PORTS_PER_WORKER):
        port = first + next(_next_port) % PORTS_PER_WORKER
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {first}-{first + PORTS_PER_WORKER - 1}")


def wait_http(
    url: str,
    timeout: float = 30.0,
    expect: int = 200,
    *,
    context: ssl.SSLContext | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    """Poll ``url`` until it answers ``expect``; raise TimeoutError with the last error otherwise.
    ``context`` verifies an https server; ``headers`` are sent with each poll (credentials)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            request = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(request, timeout=2, context=context) as resp:
                if resp.status == expect:
                    return
                last = resp.status
        except urllib.error.HTTPError as exc:
            last = exc.code
        except OSError as exc:
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer {expect} within {timeout}s (last: {last})")


def get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    """GET ``url`` -> (status, body), without raising on HTTP errors."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
