"""``--web.listen-address`` as text -> (host, port): read by the flags (exporter/config.py) and by
the HTTP front (exporter/http/server.py), so the flags check an address without loading the front.

It imports nothing, so any layer, and the dashboard, may use it.
"""

from __future__ import annotations


def parse_listen_address(value: str) -> tuple[str, int]:
    """``host:port`` / ``:port`` / ``[::1]:port`` -> (host, port); ValueError names what is wrong.

    An empty host (``:port``) means every address of both IP stacks (``exporter.http.server.listen_socket``)."""
    host, sep, port_s = value.rpartition(":")
    if not sep:
        raise ValueError(f"expected HOST:PORT or :PORT, got {value!r}")
    if host.startswith("[") != host.endswith("]"):
        raise ValueError(f"unbalanced brackets in {value!r}")
    if ":" in host and not host.startswith("["):
        raise ValueError(f"an IPv6 address needs brackets, as in [{host}]:{port_s}")
    host = host.strip("[]")
    if not port_s.isascii() or not port_s.isdigit():
        raise ValueError(f"port {port_s!r} is not a number")
    port = int(port_s)
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} is out of range 0..65535")
    return host, port
