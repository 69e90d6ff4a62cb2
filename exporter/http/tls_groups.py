"""Choose the key-exchange groups an ``ssl.SSLContext`` offers (OpenSSL ``SSL_CTX_set1_groups_list``).

Why: OpenSSL 3 offers the finite-field groups ffdhe2048 to ffdhe8192 in TLS 1.3 by default, and a
client may ask for nothing else.  An ffdhe8192 key exchange costs the server orders of magnitude
more CPU than an X25519 one (docs/benchmarks.md, "Figures moved out of docstrings"), so a client
replaying a ClientHello that offers only ffdhe8192 makes every handshake that much dearer.  Go's
crypto/tls (and with it node_exporter and every exporter-toolkit exporter) offers elliptic-curve
groups only; gpulens does the same by default (``DEFAULT_GROUPS``) and honours the web config's
``curve_preferences``.

CPython 3.15 adds ``SSLContext.set_groups`` (python/cpython#136306), used where present.  Before
it (3.11 to 3.14) the call goes to the C library the ``ssl`` module is linked against, through
ctypes.  CPython's context object holds its ``SSL_CTX *`` right after the object header; that
pointer is checked against the context's verify mode before it is used, and GroupsError says so
if it does not match.  tests/test_tls_groups_versions.py runs the behaviour check under each
CPython minor the machine has (3.11 to 3.13 so far; 3.14 untested: no interpreter here).
"""

from __future__ import annotations

import ctypes
import ssl
import sys
from collections.abc import Mapping, Sequence

DEFAULT_GROUPS = ("X25519", "P-256", "P-384", "P-521")
"""What Go's crypto/tls offers (less its post-quantum hybrid, which OpenSSL 3.0 lacks), best first."""

CURVE_NAMES: Mapping[str, str] = {
    "X25519": "X25519",
    "CurveP256": "P-256",
    "CurveP384": "P-384",
    "CurveP521": "P-521",
}
"""exporter-toolkit's ``curve_preferences`` names -> OpenSSL group names."""

_SSL_CTRL_SET_GROUPS_LIST = 92
"""``SSL_CTRL_SET_GROUPS_LIST`` in OpenSSL's ssl.h (behind the ``SSL_CTX_set1_groups_list`` macro)."""
_VERIFY_BITS = {ssl.CERT_NONE: 0, ssl.CERT_OPTIONAL: 1, ssl.CERT_REQUIRED: 3}
"""Python's verify modes as OpenSSL's SSL_VERIFY_* bits (PEER = 1, FAIL_IF_NO_PEER_CERT = 2)."""


class GroupsError(RuntimeError):
    """The groups could not be set (unknown name, or no way to reach OpenSSL)."""


def _libssl() -> ctypes.CDLL:
    import _ssl

    lib = ctypes.CDLL(_ssl.__file__)  # symbol lookup also searches its dependency libssl
    lib.SSL_CTX_ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_char_p]
    lib.SSL_CTX_ctrl.restype = ctypes.c_long
    lib.SSL_CTX_get_verify_mode.argtypes = [ctypes.c_void_p]
    lib.SSL_CTX_get_verify_mode.restype = ctypes.c_int
    return lib


def _ctx_pointer(ctx: ssl.SSLContext, lib: ctypes.CDLL) -> int:
    if sys.implementation.name != "cpython":
        raise GroupsError(f"cannot reach OpenSSL's context from {sys.implementation.name}")
    pointer = ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value
    if not pointer or lib.SSL_CTX_get_verify_mode(pointer) != _VERIFY_BITS[ctx.verify_mode]:
        raise GroupsError("this Python's SSLContext layout is not the one expected")
    return int(pointer)


def set_groups(ctx: ssl.SSLContext, groups: Sequence[str]) -> None:
    """Offer and accept only ``groups`` (OpenSSL names, best first) on ``ctx``; GroupsError if
    OpenSSL refuses a name or cannot be reached."""
    spec = ":".join(groups)
    native = getattr(ctx, "set_groups", None)
    if native is not None:  # Python releases that have it
        try:
            native(spec)
        except ssl.SSLError as exc:
            raise GroupsError(f"OpenSSL refused the groups {spec!r}: {exc}") from None
        return
    try:
        lib = _libssl()
    except (OSError, AttributeError) as exc:
        raise GroupsError(f"cannot load OpenSSL's functions: {exc}") from None
    if lib.SSL_CTX_ctrl(_ctx_pointer(ctx, lib), _SSL_CTRL_SET_GROUPS_LIST, 0, spec.encode()) != 1:
        raise GroupsError(f"OpenSSL refused the groups {spec!r}")
