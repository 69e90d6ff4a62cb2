"""Listening sockets whose connections send at once (TCP_NODELAY), for asyncio servers.

asyncio turns Nagle's algorithm off on a connection it accepts only when the listening socket
says ``IPPROTO_TCP``; ``socket.create_server`` and ``socket.socket(family)`` say protocol 0. With
Nagle on, a reply written as headers then body waits on a kept-alive connection for the client to
acknowledge the headers, which clients delay by up to 40 ms (Linux): every scrape of a small or
gzipped /metrics, and every file and websocket message of the dashboard, came 40 ms late.
"""

from __future__ import annotations

import socket


def as_tcp(sock: socket.socket) -> socket.socket:
    """``sock`` (a bound TCP socket) as the same descriptor labelled ``IPPROTO_TCP``, so that asyncio
    sets TCP_NODELAY on each connection it accepts; any other socket is returned unchanged. The old
    object is detached: use only the returned one."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        return sock
    if sock.proto == socket.IPPROTO_TCP:
        return sock
    blocking, inheritable = sock.getblocking(), sock.get_inheritable()
    out = socket.socket(sock.family, sock.type, socket.IPPROTO_TCP, fileno=sock.detach())
    out.setblocking(blocking)
    out.set_inheritable(inheritable)
    return out
