"""exporter/http/tls_groups.py's behaviour, checked with the standard library and that module only, so that
tests/test_tls_groups_versions.py can run it under every CPython minor on the machine (a subprocess
with PYTHONPATH at the repository; no third-party package is importable there).

Usage: python tests/support/tls_groups_check.py CA_PEM CERT_PEM KEY_PEM [--sabotage offset|noop]

The certificate (for ``localhost``) and its CA are made by the caller. Each case is a TLS 1.3
handshake between two ``ssl.SSLObject`` over memory BIOs: no socket, no thread. Exit status 0 and
one line ``ok <path>`` (``native`` where ``SSLContext.set_groups`` exists, else ``ctypes``) when every
case holds; 1 and the failed cases on stderr otherwise (a wrong layout read that crashes the
interpreter shows as a signal exit instead).

``--sabotage`` makes the module wrong on purpose, so the caller can see the check fail:
``offset`` reads the ``SSL_CTX *`` one pointer past its place in the context object (the layout
guard must refuse it); ``noop`` makes ``set_groups`` do nothing (the handshakes must tell).
"""

from __future__ import annotations

import ssl
import struct
import sys
import types

from exporter.http import tls_groups
from exporter.http.tls_groups import DEFAULT_GROUPS, GroupsError, set_groups

FFDHE_GROUPS = ("ffdhe8192", "ffdhe2048")
"""Finite-field groups tried as the hostile client's only offer, dearest first."""
HANDSHAKE_ROUNDS = 10
"""Flights exchanged before a handshake that neither finishes nor fails is called stuck."""


def handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> str | None:
    """None if a client of ``client_ctx`` completes a handshake with a server of ``server_ctx``,
    else the first side's error."""
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname="localhost")
    sides = {"client": client, "server": server}
    done: set[str] = set()
    for _ in range(HANDSHAKE_ROUNDS):
        for name, obj in sides.items():
            if name in done:
                continue
            try:
                obj.do_handshake()
                done.add(name)
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError as exc:
                return f"{name}: {exc}"
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if len(done) == 2:
            return None
    return "stuck"


def server_context(cert: str, key: str, groups: tuple[str, ...] | None) -> ssl.SSLContext:
    """A TLS 1.3 server context; ``groups`` None leaves OpenSSL's default groups."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(cert, key)
    if groups is not None:
        set_groups(ctx, groups)
    return ctx


def client_context(ca: str, groups: tuple[str, ...] | None) -> ssl.SSLContext:
    """A TLS 1.3 client context that trusts ``ca``, offering ``groups`` (None: OpenSSL's default)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_verify_locations(ca)
    if groups is not None:
        set_groups(ctx, groups)
    return ctx


def sabotage(how: str) -> None:
    """Make exporter.http.tls_groups wrong in the way ``how`` names (see the module docstring)."""
    if how == "offset":
        # The module reads ``object.__basicsize__`` through its globals: shift it by one pointer.
        shifted = object.__basicsize__ + struct.calcsize("P")
        tls_groups.object = types.SimpleNamespace(__basicsize__=shifted)  # type: ignore[attr-defined]
    elif how == "noop":
        globals()["set_groups"] = lambda ctx, groups: None
    else:
        raise SystemExit(f"unknown sabotage {how!r}")


def failures(ca: str, cert: str, key: str, notes: list[str]) -> list[str]:
    """Every case that does not hold, in words; empty when the module behaves. A case that cannot
    be run with this OpenSSL is said in ``notes`` instead."""
    bad: list[str] = []

    def expect(ok: bool, server: tuple[str, ...] | None, client: tuple[str, ...] | None) -> None:
        try:
            error = handshake(server_context(cert, key, server), client_context(ca, client))
        except GroupsError as exc:
            bad.append(f"server {server}, client {client}: GroupsError: {exc}")
            return
        if ok and error is not None:
            bad.append(f"server {server}, client {client}: expected a handshake, got {error}")
        if not ok and error is None:
            bad.append(f"server {server}, client {client}: expected a refusal, the handshake completed")

    # The threat needs a finite-field group that OpenSSL's default server accepts (all of them in
    # OpenSSL 3.0; 3.5 keeps ffdhe2048 and ffdhe3072): find it first, else the refusal below
    # proves nothing. Finding it also needs set_groups to work on the client's context.
    ffdhe = None
    for group in FFDHE_GROUPS:
        try:
            if handshake(server_context(cert, key, None), client_context(ca, (group,))) is None:
                ffdhe = (group,)
                break
        except GroupsError as exc:
            bad.append(f"client ({group!r},): GroupsError: {exc}")
            break
    if ffdhe is not None:
        expect(False, DEFAULT_GROUPS, ffdhe)
    elif not bad:
        notes.append(f"no ffdhe group accepted by OpenSSL's defaults (tried {', '.join(FFDHE_GROUPS)})")
    expect(True, DEFAULT_GROUPS, None)
    # A list, not only "no ffdhe": the server keeps to what it was given.
    expect(False, ("P-384",), ("X25519", "P-256"))
    expect(True, ("P-384",), ("P-256", "P-384"))
    # Each verify mode: the ctypes path checks the context it found against it.
    for mode in (ssl.CERT_NONE, ssl.CERT_OPTIONAL, ssl.CERT_REQUIRED):
        ctx = server_context(cert, key, None)
        ctx.load_verify_locations(ca)
        ctx.verify_mode = mode
        try:
            set_groups(ctx, DEFAULT_GROUPS)
        except GroupsError as exc:
            bad.append(f"verify mode {mode.name}: GroupsError: {exc}")
    try:
        set_groups(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), ("no-such-group",))
        bad.append("an unknown group name was accepted")
    except GroupsError:
        pass
    return bad


def main(argv: list[str]) -> int:
    """Run the cases; 0 when all hold."""
    args = argv[1:]
    if "--sabotage" in args:
        at = args.index("--sabotage")
        sabotage(args[at + 1])
        del args[at : at + 2]
    ca, cert, key = args
    notes: list[str] = []
    bad = failures(ca, cert, key, notes)
    version = ".".join(map(str, sys.version_info[:3]))
    if bad:
        print(f"exporter/http/tls_groups.py misbehaves on CPython {version} ({ssl.OPENSSL_VERSION}):", file=sys.stderr)
        for line in bad:
            print(f"  {line}", file=sys.stderr)
        return 1
    path = "native" if hasattr(ssl.SSLContext, "set_groups") else "ctypes"
    print(f"ok {path} CPython {version} {ssl.OPENSSL_VERSION}", *(f"({note})" for note in notes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
