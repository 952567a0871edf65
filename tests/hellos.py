"""Real ClientHello bytes from real TLS stacks (no hand-written fixtures), and ways to reshape them."""

from __future__ import annotations

import ssl

from OpenSSL import SSL


def classical_hello(sni: str | None) -> bytes:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=sni)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def pq_hello(sni: str | None) -> bytes:
    """X25519MLKEM768 from cryptography's bundled OpenSSL: ~1.3 KB of key share alone."""
    ctx = SSL.Context(SSL.TLS_METHOD)
    ctx.set_min_proto_version(SSL.TLS1_3_VERSION)
    assert SSL._lib.SSL_CTX_set1_curves_list(ctx._context, b"X25519MLKEM768") == 1
    conn = SSL.Connection(ctx, None)
    conn.set_connect_state()
    if sni:
        conn.set_tlsext_host_name(sni.encode())
    try:
        conn.do_handshake()
    except SSL.WantReadError:
        pass
    return conn.bio_read(65536)


def handshake_message(hello: bytes) -> bytes:
    """The handshake message carried by the records of ``hello``."""
    out, pos = b"", 0
    while pos < len(hello):
        length = int.from_bytes(hello[pos + 3 : pos + 5], "big")
        out += hello[pos + 5 : pos + 5 + length]
        pos += 5 + length
    return out


def reframe(hello: bytes, record_size: int) -> bytes:
    """The same handshake message split over several TLS records of ``record_size`` payload bytes."""
    msg = handshake_message(hello)
    version = hello[1:3]
    out = b""
    for i in range(0, len(msg), record_size):
        part = msg[i : i + record_size]
        out += b"\x16" + version + len(part).to_bytes(2, "big") + part
    return out


def with_extension_first(hello: bytes, ext_type: int, ext_data: bytes) -> bytes:
    """Insert an extension (e.g. GREASE) at the head of the extension list, fixing every length."""
    msg = handshake_message(hello)
    body = msg[4:]
    pos = 2 + 32
    pos += 1 + body[pos]
    pos += 2 + int.from_bytes(body[pos : pos + 2], "big")
    pos += 1 + body[pos]
    ext_len = int.from_bytes(body[pos : pos + 2], "big")
    new_ext = ext_type.to_bytes(2, "big") + len(ext_data).to_bytes(2, "big") + ext_data
    exts = new_ext + body[pos + 2 : pos + 2 + ext_len]
    body = body[:pos] + len(exts).to_bytes(2, "big") + exts
    msg = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16" + hello[1:3] + len(msg).to_bytes(2, "big") + msg
