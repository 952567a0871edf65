"""Post-quantum TLS for the bench's Python clients and backends, through pyOpenSSL.

The stdlib ``ssl`` links the host's OpenSSL 3.0; pyOpenSSL drives the OpenSSL bundled with ``cryptography``,
which has X25519MLKEM768 and ML-DSA-65. Configured here, not through ``sentin8.tls``: the bench must not share
the configuration it measures.
"""

from __future__ import annotations

import socket
import struct

from OpenSSL import SSL

GROUPS = b"X25519MLKEM768"
SIGALGS = b"mldsa65"


def _restrict(ctx: SSL.Context) -> SSL.Context:
    ctx.set_min_proto_version(SSL.TLS1_3_VERSION)
    ctx.set_max_proto_version(SSL.TLS1_3_VERSION)
    # pyOpenSSL has no public setter for groups or signature algorithms
    if SSL._lib.SSL_CTX_set1_curves_list(ctx._context, GROUPS) != 1:
        raise RuntimeError("this OpenSSL has no X25519MLKEM768")
    if SSL._lib.SSL_CTX_set1_sigalgs_list(ctx._context, SIGALGS) != 1:
        raise RuntimeError("this OpenSSL has no ML-DSA-65")
    return ctx


def client_context(alpn: list[bytes] | None = None) -> SSL.Context:
    ctx = _restrict(SSL.Context(SSL.TLS_METHOD))
    ctx.set_verify(SSL.VERIFY_NONE, lambda *a: True)  # a self-signed bench cert
    # no session cache: every connection is a full handshake
    ctx.set_session_cache_mode(SSL.SESS_CACHE_OFF)
    ctx.set_options(SSL.OP_NO_TICKET)
    if alpn:
        ctx.set_alpn_protos(alpn)
    return ctx


def resuming_client_context() -> SSL.Context:
    """A client context that keeps what a server's TLS 1.3 NewSessionTicket gives it, for the caller to offer
    again with ``Connection.set_session`` (psk_dhe_ke: the resumed handshake still runs X25519MLKEM768)."""
    ctx = _restrict(SSL.Context(SSL.TLS_METHOD))
    ctx.set_verify(SSL.VERIFY_NONE, lambda *a: True)  # a self-signed bench cert
    ctx.set_session_cache_mode(SSL.SESS_CACHE_CLIENT)
    return ctx


def server_context(cert: str, key: str) -> SSL.Context:
    ctx = _restrict(SSL.Context(SSL.TLS_METHOD))
    ctx.use_certificate_chain_file(cert)
    ctx.use_privatekey_file(key)
    ctx.check_privatekey()
    return ctx


def kernel_timeouts(sock: socket.socket, seconds: float) -> None:
    """A blocking socket whose waits end after ``seconds`` (EAGAIN, which pyOpenSSL raises as WantReadError).

    ``settimeout`` would make the socket non-blocking underneath, and pyOpenSSL does not wait on those."""
    sock.settimeout(None)
    tv = struct.pack("ll", int(seconds), int((seconds % 1) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def client(
    sock: socket.socket,
    sni: str,
    ctx: SSL.Context | None = None,
    timeout: float = 10.0,
    session: SSL.Session | None = None,
) -> SSL.Connection:
    """A PQ TLS client connection on a connected socket, handshake done; waits end after ``timeout``.
    ``session`` (from ``get_session`` on a ``resuming_client_context`` connection) is offered for resumption."""
    kernel_timeouts(sock, timeout)
    conn = SSL.Connection(ctx or client_context(), sock)
    conn.set_tlsext_host_name(sni.encode())
    conn.set_connect_state()
    if session is not None:
        conn.set_session(session)
    conn.do_handshake()
    return conn


def negotiated_group(conn: SSL.Connection) -> str:
    """The key exchange group of a finished handshake, e.g. ``X25519MLKEM768``."""
    ssl = conn._ssl
    lib, ffi = SSL._lib, SSL._ffi
    if hasattr(lib, "SSL_get0_group_name"):
        name = lib.SSL_get0_group_name(ssl)
        return ffi.string(name).decode() if name != ffi.NULL else "?"
    return "?"
