"""Loopback helpers: free ports and waiting for HTTP endpoints."""

from __future__ import annotations

import socket
import ssl
import time
import urllib.error
import urllib.request


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
