"""The server's end of a TCP connection, read from another process (Linux): is Nagle off on it?"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
from pathlib import Path

SYS_PIDFD_GETFD = 438
"""pidfd_getfd(2), the same number on every Linux architecture (the generic syscall table)."""


def _port_hex(port: int) -> str:
    return f"{port:04X}"


def _inode(pid: int, server_port: int, client_port: int) -> int:
    """The socket inode of ``pid``'s end of the loopback connection server_port <- client_port."""
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            f = line.split()
            local, remote, inode = f[1], f[2], int(f[9])
            if local.endswith(":" + _port_hex(server_port)) and remote.endswith(":" + _port_hex(client_port)):
                return inode
    raise LookupError(f"no connection :{server_port} <- :{client_port} in process {pid}")


def _fd(pid: int, inode: int) -> int:
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if os.readlink(entry) == f"socket:[{inode}]":
                return int(entry.name)
    raise LookupError(f"socket inode {inode} is not open in process {pid}")


def server_nodelay(pid: int, client: socket.socket) -> bool:
    """Whether process ``pid``'s end of the connection ``client`` (to a port ``pid`` serves on
    loopback) has TCP_NODELAY set; the descriptor is copied with pidfd_getfd (Linux 5.6+, as root
    or as the process' parent)."""
    fd = _fd(pid, _inode(pid, client.getpeername()[1], client.getsockname()[1]))
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        copy = libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
        if copy < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"pidfd_getfd on process {pid}: {os.strerror(err)}")
    finally:
        os.close(pidfd)
    with socket.socket(fileno=copy) as theirs:
        return bool(theirs.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
