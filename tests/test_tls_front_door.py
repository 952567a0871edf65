"""The TLS front door against the reference: every hostile or odd ClientHello in ``tests/tls_reference.py`` gets,
from a real fleet over real sockets, the answer a reference OpenSSL 3.5 ``s_server`` gives (the alert bytes,
then a FIN; never a reset), or the documented difference; hellos the reference completes complete through the
proxy (``legacy_version`` 0xffff with supported_versions, Chrome-shaped hellos with GREASE and GREASE ECH, a
hello in one maximal record).

External clients come from a network namespace (the L7 path: OpenSSL in the proxy answers what the peek
passes); the peek's own refusals are checked from loopback too (the L4 path). The recorded answers are
replayed against a live reference when the bench tree's OpenSSL 3.5 is there.
"""

from __future__ import annotations

import random
import shutil
import socket
import time

import pytest

from tests import tls_reference
from tests.netns import ExternalHost
from tests.openssl_cli import find_openssl35
from tests.peers import Fleet, HTTPBackend, one_web_service
from tests.tls13raw import (
    EXT_ECH,
    KeyShares,
    RawTLS13Client,
    TLSAlert,
    chrome_hello,
    pq_hello,
    u8,
    u16,
    vec16,
)
from tests.tls_reference import SNI, answer

CASES = tls_reference.cases()
PEEK_CASES = [c for c in CASES if c.peek]
REQUEST = f"GET / HTTP/1.1\r\nHost: {SNI}\r\n\r\n".encode()


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    """(fleet, external host): one worker on 0.0.0.0 serving ``SNI`` with the reference's certificate; the
    default limits except ``peek_timeout_s = 2`` (tests/peers.py)."""
    workdir = tmp_path_factory.mktemp("front")
    shutil.copytree(tls_reference.CERT_DIR, workdir / "certs" / SNI)
    web = HTTPBackend("web")
    host = ExternalHost()
    fleet = Fleet(str(workdir), one_web_service(web.port, SNI), workers=1, host="0.0.0.0")
    yield fleet, host
    underflow = fleet.stats().get("gauge_underflow", 0)  # every refusal released its hold exactly once
    fleet.stop()
    host.close()
    web.close()
    assert underflow == 0


def _external(front) -> socket.socket:
    fleet, host = front
    return host.connect(fleet.port)


def _loopback(front) -> socket.socket:
    return socket.create_connection(("127.0.0.1", front[0].port), timeout=10)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_hello_gets_the_reference_answer_on_l7(front, case):
    assert answer(_external(front), case.wire, case.fin) == case.expected, case.why or "the reference's answer"


@pytest.mark.parametrize("case", PEEK_CASES, ids=[c.name for c in PEEK_CASES])
def test_the_peek_answers_the_same_on_l4(front, case):
    assert answer(_loopback(front), case.wire, case.fin) == case.expected, case.why or "the reference's answer"


def test_recorded_answers_are_the_live_reference_answers():
    """The expected values above were recorded from the reference; replay them all against it."""
    tool = find_openssl35()
    if tool is None:
        pytest.skip("no OpenSSL >= 3.5 CLI: neither the host's nor the bench tree's (bench/toolchain.py)")
    with tls_reference.ReferenceServer(tool) as ref:
        got = {case.name: ref.answer(case) for case in tls_reference.cases()}
    assert got == {case.name: case.reference for case in CASES}


def test_chrome_shaped_hellos_complete_against_the_live_reference_too():
    """The hellos below are a fair test: the reference finishes the same handshakes (and answers its -www page)."""
    tool = find_openssl35()
    if tool is None:
        pytest.skip("no OpenSSL >= 3.5 CLI: neither the host's nor the bench tree's (bench/toolchain.py)")
    with tls_reference.ReferenceServer(tool) as ref:
        for seed in range(5):
            shares = KeyShares()
            sock = socket.create_connection(("127.0.0.1", ref.port), timeout=10)
            client = _complete(sock, chrome_hello(SNI, shares, random.Random(seed)), shares)
            assert client.request(b"GET / HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 200"), seed
            sock.close()


def _complete(sock: socket.socket, client_hello, shares: KeyShares, wire: bytes | None = None) -> RawTLS13Client:
    client = RawTLS13Client(sock, shares, client_hello)
    client.handshake(wire)
    return client


def test_legacy_version_ffff_with_supported_versions_completes_tls13(front):
    """RFC 8446 §4.2.1: with supported_versions the server ignores legacy_version; 0xffff included."""
    for version in (0xFFFF, 0x0400, 0x0304, 0x03FF):
        shares = KeyShares()
        client = _complete(_external(front), pq_hello(SNI, shares, legacy_version=version), shares)
        assert client.certificate is not None and client.alpn == b"http/1.1"
        assert client.request(REQUEST).startswith(b"HTTP/1.1 200"), hex(version)
        client.sock.close()


def _h2_status(client) -> int:
    """One GET over h2 on a raw TLS client (hand-built frames): the :status of stream 1's response."""
    import hpack
    from hyperframe.frame import HeadersFrame

    from tests import h2frames

    frames = h2frames.RawFrames()
    client.send(h2frames.preface() + frames.headers(1, h2frames.request_fields(b"/", SNI.encode())))
    decoder, buf = hpack.Decoder(), b""
    while True:
        chunk = client.recv()
        assert chunk, "closed before the response"
        got, buf = h2frames.parse(buf + chunk)
        for f in got:
            if isinstance(f, HeadersFrame) and f.stream_id == 1:
                return int(dict(decoder.decode(f.data, raw=True))[b":status"])


def test_chrome_shaped_hellos_complete_through_the_proxy(front):
    """GREASE cipher, group, key share, version and extensions, a permuted extension list, GREASE ECH (random
    config id, random payload), X25519MLKEM768 + X25519 shares, ALPS, certificate compression: 20 of them,
    each a full handshake (server signature and Finished verified) and a request answered over L7."""
    for seed in range(20):
        rng = random.Random(seed)
        shares = KeyShares()
        hello = chrome_hello(SNI, shares, rng)
        assert any(t == EXT_ECH and len(d) > 40 for t, d in hello.extensions)
        client = _complete(_external(front), hello, shares)
        assert client.group == 0x11EC and client.alpn == b"h2"  # Chrome offers h2: it is on by default
        assert _h2_status(client) == 200, f"seed {seed}"
        client.sock.close()


def test_grease_ech_is_never_refused(front):
    """Every shape a GREASE ECH extension takes across browsers: each HPKE KDF/AEAD pair, any config id, an
    empty or a 32-byte enc, payloads from 1 byte to 1 KiB."""
    rng = random.Random(16)
    shapes = [(kdf, aead, rng.randrange(256), enc, size)
              for kdf in (1, 2, 3) for aead in (1, 2, 3)
              for enc, size in ((32, rng.choice((144, 176, 208, 240))), (0, 1), (32, 1024))]  # fmt: skip
    for kdf, aead, config_id, enc, size in shapes:
        shares = KeyShares()
        hello = pq_hello(SNI, shares)
        ech = b"\x00" + u16(kdf) + u16(aead) + u8(config_id) + vec16(rng.randbytes(enc)) + vec16(rng.randbytes(size))
        hello.extensions.append((EXT_ECH, ech))
        client = _complete(_external(front), hello, shares)
        assert client.request(REQUEST).startswith(b"HTTP/1.1 200"), (kdf, aead, config_id, enc, size)
        client.sock.close()


def test_empty_ech_is_refused_with_illegal_parameter(front):
    """OpenSSL 4.0's answer (3.5 ignored the extension it did not know): kept, and said in docs/traffic.md."""
    shares = KeyShares()
    hello = pq_hello(SNI, shares)
    hello.extensions.append((EXT_ECH, b""))
    with pytest.raises(TLSAlert) as alert:
        _complete(_external(front), hello, shares)
    assert (alert.value.level, alert.value.description) == (2, 47)


def test_a_maximal_record_hello_completes_with_the_default_cap(front):
    """limits.peek_max_bytes at its default: a hello in one 2^14-byte record (16,389 bytes on the wire), and
    the same hello split over two records and over 1,000-byte records, all complete."""
    for size in (16384, 10000, 1000):
        shares = KeyShares()
        hello = pq_hello(SNI, shares)
        room = 16384 - len(hello.message()) - 4
        hello.extensions.append((0x0015, bytes(room)))  # padding (RFC 7685)
        msg = hello.message()
        assert len(msg) == 16384
        wire = tls_reference._records(msg, size)
        if size == 16384:
            assert len(wire) == 16389
        client = _complete(_external(front), hello, shares, wire)
        assert client.request(REQUEST).startswith(b"HTTP/1.1 200"), size
        client.sock.close()


def test_peek_timeout_ends_with_a_fin(front):
    """A hello that stops half-way: closed at limits.peek_timeout_s (2 s here) with a FIN, no alert (the
    reference has no deadline to answer for) and no reset although the peer's bytes were never read."""
    part = tls_reference._partial()[0]
    for sock in (_external(front), _loopback(front)):
        started = time.monotonic()
        assert answer(sock, part, timeout=10) == "fin"
        assert 1.5 < time.monotonic() - started < 8


def test_refusals_are_counted_by_kind(front):
    fleet = front[0]
    before = fleet.stats()
    kinds = {
        "peek_garbage": b"GET / HTTP/1.1\r\n\r\n",
        "peek_bad_version": b"\x16\x04\x00\x00\x05hello",
        "peek_oversize": b"\x16\x03\x01\x00\x04\x01\xff\xff\xff",
    }
    for wire in kinds.values():
        answer(_loopback(front), wire)
    answer(_loopback(front), b"\x16\x03\x01", fin=True)
    kinds["peek_eof"] = b""
    after = fleet.stats()
    for name in kinds:
        assert after.get(name, 0) - before.get(name, 0) == 1, name
