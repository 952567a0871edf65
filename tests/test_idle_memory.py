"""What an idle connection gives back (bench/README.md, "idle memory"): the handshake's key shares and its
incoming BIO (sentin8/tls.py), the HTTP/2 engine's frame buffer (sentin8/http/nghttp2_private.py). Each is
checked to be released on the real objects and the connection to work on exactly as before."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from OpenSSL import SSL

from sentin8 import key_shares, openssl_private, tls, tls_connection
from sentin8.certpair import self_signed_mldsa65, write_pair
from sentin8.certstore import CertStore
from sentin8.http import nghttp2_private
from sentin8.http.h2_engine import ClientConnection, H2Limits, RequestHeaders, ServerConnection

SNI = "idle.example.test"
_CLIENT = tls.client_context()  # one context: a resumption needs the context that took the session


@pytest.fixture
def front(tmp_path: Path) -> SSL.Context:
    now = time.time()
    cert, key = self_signed_mldsa65([SNI], now - 60, now + 3600)
    write_pair(tmp_path / "certs" / SNI, [cert], key)
    return tls.SNIContexts(CertStore(tmp_path / "certs", tmp_path / "state"), protocols=tls.H2_PROTOCOLS).front


def _move(src: SSL.Connection, dst: tls_connection.RecordIO) -> None:
    while True:
        try:
            dst.feed(src.bio_read(65536))
        except SSL.WantReadError:
            return


def _recv(c: SSL.Connection, server: tls_connection.RecordIO) -> bytes:
    c.bio_write(server.drain())
    got = b""
    while True:
        try:
            got += c.recv(65536)
        except SSL.WantReadError:
            return got


def _handshake(
    front: SSL.Context, session: SSL.Session | None = None, owner: SSL.Connection | None = None
) -> tuple[SSL.Connection, tls_connection.RecordIO]:
    """A PQ client and a server ``RecordIO`` over memory BIOs, as the worker's TLS layer drives it (or, with
    ``owner``, the records of that pyOpenSSL connection, as the client side's layer runs them)."""
    io = tls_connection.RecordIO.accepting(front) if owner is None else tls_connection.RecordIO(owner)
    c = SSL.Connection(_CLIENT, None)
    c.set_connect_state()
    c.set_tlsext_host_name(SNI.encode())
    if session is not None:
        c.set_session(session)
    with pytest.raises(SSL.WantReadError):
        c.do_handshake()
    _move(c, io)
    assert not io.handshake()
    c.bio_write(io.drain())
    c.do_handshake()
    _move(c, io)
    flights = io._into
    assert io.handshake()
    assert io._into != flights  # the ClientHello's buffer went with its BIO (it was empty: renewed)
    return c, io


def _peer_key(io: tls_connection.RecordIO) -> int | None:
    shares = key_shares.process_shares()
    ffi = openssl_private.ffi
    key = ffi.new("void **")
    if shares.ctrl(openssl_private.pointer(io._ssl), 109, 0, key) != 1 or key[0] == ffi.NULL:
        return None
    shares.free(key[0])
    return int(ffi.cast("uintptr_t", key[0]))


def test_the_handshake_key_shares_are_freed_and_the_connection_works_on(front: SSL.Context) -> None:
    c, io = _handshake(front)
    assert key_shares.process_shares().usable
    assert key_shares.process_shares().slots[109] is not None  # the slot was proven on this build
    assert _peer_key(io) is None  # the client's X25519MLKEM768 share is gone
    assert tls_connection.group_name(io) == c.get_group_name() == "X25519MLKEM768"  # the group is still known
    assert key_shares.release_at(openssl_private.pointer_of(io._ssl)) == 0  # a second call: nothing left to free
    c.send(b"ping")
    _move(c, io)
    assert io.read() == b"ping"
    io.write(b"pong")
    assert _recv(c, io) == b"pong"  # the session tickets and the reply

    # a resumption (psk_dhe_ke: a key exchange again) frees its shares the same way, and works
    again, io2 = _handshake(front, c.get_session())
    assert tls_connection.session_reused(io2)
    assert _peer_key(io2) is None
    again.send(b"two")
    _move(again, io2)
    assert io2.read() == b"two"
    assert io2.read() is None  # nothing more yet
    again.shutdown()  # close_notify: read says so with b"", as recv() says EOF, not with an exception
    _move(again, io2)
    assert io2.read() == b""


def test_the_incoming_bio_is_renewed_after_the_handshake_and_after_a_large_feed(front: SSL.Context) -> None:
    c, io = _handshake(front)  # which checks the renewal after the handshake
    into_before = io._into
    c.sendall(b"x" * 20000)  # two records, fed in one piece above the renewal threshold
    _move(c, io)
    got = b""
    while (data := io.read()) is not None:
        got += data
    assert got == b"x" * 20000
    assert io._into != into_before  # emptied after a big feed: a fresh BIO
    c.send(b"after")
    _move(c, io)
    assert io.read() == b"after"


def test_the_records_of_a_pyopenssl_connection_keep_its_bio_references_in_step(front: SSL.Context) -> None:
    # The client side runs the records of a pyOpenSSL Connection, which owns the SSL object: each BIO renewed
    # under it is the owner's too, so its own calls never reach a freed one.
    s = SSL.Connection(front, None)
    s.set_accept_state()
    c, io = _handshake(front, owner=s)  # renews the incoming BIO after the handshake
    assert s._into_ssl == io._into and s._from_ssl == io._from
    c.sendall(b"y" * 20000)
    _move(c, io)
    while io.read() is not None:
        pass
    io.write(b"z" * 6000)  # a drain above the threshold renews the outgoing BIO
    assert _recv(c, io) == b"z" * 6000
    assert s._into_ssl == io._into and s._from_ssl == io._from
    assert s.get_group_name() == tls_connection.group_name(io) == "X25519MLKEM768"


def test_records_of_every_buffer_type_and_a_drain_above_the_scratch_buffer(front: SSL.Context) -> None:
    # The compiled build calls OpenSSL directly for bytes and through cffi for a bytearray or a memoryview: each
    # goes in and comes out the same. A drain of more than one scratch buffer (64 KiB) comes out whole, in
    # order, and the renewed outgoing BIO serves on.
    c, io = _handshake(front)
    big = bytes(range(256)) * 600  # 150 KiB of plaintext: ten records, well over one scratch buffer of ciphertext
    rest = big
    while rest:  # a record per write (partial writes are on), as the TLS layer loops
        rest = rest[io.write(rest) :]
    assert _recv(c, io) == big
    for kind in (bytes, bytearray, memoryview):
        label = kind.__name__.encode()
        assert io.write(kind(b"out " + label)) == 4 + len(label)
        assert _recv(c, io) == b"out " + label
        c.send(b"in " + label)
        io.feed(kind(c.bio_read(65536)))
        assert io.read() == b"in " + label
        assert io.read() is None


FIELDS = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", SNI.encode()), (b":path", b"/")]


def _exchange(s: ServerConnection, c: ClientConnection, body: bytes) -> bytes:
    sid = c.request(FIELDS)
    events = s.receive(c.data_to_send())
    (head,) = [e for e in events if type(e) is RequestHeaders]
    s.send_head(head.stream_id, 200, [(b"content-length", b"%d" % len(body))])
    s.send_data(head.stream_id, body, end_stream=True)
    c.receive(s.data_to_send())
    s.receive(c.data_to_send())
    s.data_to_send()
    assert c.responses[sid].done and c.responses[sid].status == 200
    return c.responses[sid].body


def test_an_idle_h2_engine_gives_its_frame_buffer_back_and_serves_on() -> None:
    assert nghttp2_private.framebufs_offset() is not None  # the layout is proven on the pinned ngh2
    s, c = ServerConnection(H2Limits()), ClientConnection()
    s.receive(c.data_to_send())
    c.receive(s.data_to_send())
    body = bytes(range(256)) * 60  # 15 KiB: a DATA frame fills the buffer
    assert _exchange(s, c, body) == body
    assert s.release_idle_memory() >= 8192  # the buffer's interior pages
    assert _exchange(s, c, body) == body  # packed again into pages mapped in afresh
    assert s.release_idle_memory() >= 8192
    assert s.streams == 0


def test_a_non_engine_object_is_never_read() -> None:
    assert nghttp2_private.release_framebuf(object()) == 0
