"""The PROXY v2 parser and encoder, byte by byte: every command, family, TLV and length edge, and a fuzzer.

Headers here are built by hand from the spec's layout (``raw``), not by the module's encoder, so a mistake
shared by both would still show; the encoder is then checked against the parser and the same bytes.
"""

from __future__ import annotations

import random
import socket
import struct

import pytest

from sentin8 import proxy_protocol as pp
from sentin8.proxy_protocol import NeedMore, ProxyHeader, ProxyProtocolError, parse

SIG = bytes.fromhex("0d0a0d0a000d0a515549540a")
HELLO = b"\x16\x03\x01\x02\x00\x01"  # what follows a header on :443 (the start of a ClientHello)


def raw(ver_cmd: int, fam: int, body: bytes, length: int | None = None) -> bytes:
    return SIG + bytes((ver_cmd, fam)) + struct.pack("!H", len(body) if length is None else length) + body


def tlv(kind: int, value: bytes) -> bytes:
    return bytes((kind,)) + struct.pack("!H", len(value)) + value


def inet(src="198.18.0.2", dst="10.1.2.3", sport=40000, dport=443) -> bytes:
    return socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!HH", sport, dport)


def inet6(src="2001:db8::1", dst="2001:db8::2", sport=1, dport=65535) -> bytes:
    a, b = socket.inet_pton(socket.AF_INET6, src), socket.inet_pton(socket.AF_INET6, dst)
    return a + b + struct.pack("!HH", sport, dport)


def unix(src=b"/run/lb.sock", dst=b"/run/edge.sock") -> bytes:
    return src.ljust(108, b"\x00") + dst.ljust(108, b"\x00")


def with_crc(header: bytes, at: int) -> bytes:
    """``header`` whose 4 bytes at ``at`` (a zeroed CRC32C value) now hold the checksum."""
    return header[:at] + struct.pack("!I", pp.crc32c(header)) + header[at + 4 :]


def refused(buf: bytes, **kw) -> str:
    with pytest.raises(ProxyProtocolError) as info:
        parse(buf, **kw)
    assert info.value.reason in pp.REASONS
    return info.value.reason


# ---- the fixed part ------------------------------------------------------------------------------------------


def test_the_signature_is_the_specs():
    assert pp.SIGNATURE == SIG and pp.FIXED == 16


def test_nothing_yet_needs_the_fixed_sixteen_bytes():
    assert parse(b"") == NeedMore(16)
    for n in range(1, 16):
        assert parse((SIG + b"\x21\x11\x00\x0c")[:n]) == NeedMore(16 - n), n


def test_inet_over_tcp():
    buf = raw(0x21, 0x11, inet()) + HELLO
    h = parse(buf)
    assert h == ProxyHeader(pp.PROXY, pp.AF_INET, pp.STREAM, "198.18.0.2", "10.1.2.3", 40000, 443, (), 28)
    assert buf[h.length :] == HELLO  # the rest is the caller's, untouched
    assert h.client() == ("198.18.0.2", 40000) and h.destination() == ("10.1.2.3", 443)


def test_inet6_over_tcp():
    h = parse(raw(0x21, 0x21, inet6()))
    assert (h.family, h.src_addr, h.dst_addr, h.src_port, h.dst_port, h.length) == (
        pp.AF_INET6,
        "2001:db8::1",
        "2001:db8::2",
        1,
        65535,
        52,
    )
    assert h.client() == ("2001:db8::1", 1)


def test_port_edges():
    h = parse(raw(0x21, 0x11, inet(sport=0, dport=65535)))
    assert (h.src_port, h.dst_port) == (0, 65535)


def test_unix_addresses_are_paths_and_no_client():
    h = parse(raw(0x21, 0x31, unix()))
    assert (h.family, h.transport, h.src_addr, h.dst_addr, h.length) == (
        pp.AF_UNIX,
        pp.STREAM,
        "/run/lb.sock",
        "/run/edge.sock",
        16 + 216,
    )
    assert h.client() is None and h.destination() is None  # no IP: the connection's own peer
    odd = parse(raw(0x21, 0x32, unix(src=b"\xff\xfe", dst=b"x" * 108)))
    assert odd.src_addr.encode("utf-8", "surrogateescape") == b"\xff\xfe" and odd.dst_addr == "x" * 108


def test_unspec_proxy_carries_no_address():
    h = parse(raw(0x21, 0x00, b""))
    assert (h.command, h.family, h.length, h.client()) == (pp.PROXY, pp.AF_UNSPEC, 16, None)
    h = parse(raw(0x21, 0x00, tlv(pp.TLV_NOOP, b"")))  # its TLVs start right after the fixed part
    assert h.tlvs == ((pp.TLV_NOOP, b""),)


@pytest.mark.parametrize("fam", [0x12, 0x22, 0x32])
def test_datagram_families_parse_but_name_no_client(fam):
    body = {0x12: inet(), 0x22: inet6(), 0x32: unix()}[fam]
    h = parse(raw(0x21, fam, body))
    assert h.transport == pp.DGRAM and h.client() is None


def test_every_family_transport_byte():
    valid = {0x00, 0x11, 0x12, 0x21, 0x22, 0x31, 0x32}
    for fam in range(256):
        buf = raw(0x21, fam, b"\x00" * 216)  # long enough for any family's addresses
        if fam in valid:
            assert isinstance(parse(buf), ProxyHeader), hex(fam)
        else:
            assert refused(buf) == "family", hex(fam)


def test_local_discards_the_block_whatever_it_says():
    assert parse(raw(0x20, 0x00, b"")) == ProxyHeader(pp.LOCAL, 0, 0, length=16)
    for fam in (0x11, 0x21, 0x31, 0x55, 0xFF):  # even a family the spec does not define, or too short a block
        h = parse(raw(0x20, fam, b"\x07" * 5) + HELLO)
        assert (h.command, h.length, h.src_addr, h.tlvs, h.client(), h.destination()) == (
            pp.LOCAL,
            21,
            "",
            (),
            None,
            None,
        )
    h = parse(raw(0x20, 0x11, inet() + tlv(pp.TLV_CRC32C, b"\x00\x00\x00\x00")))  # discarded unread: no CRC check
    assert h.length == 16 + 12 + 7


def test_every_version_but_two_is_refused():
    for version in range(16):
        buf = raw(version << 4 | 0x1, 0x11, inet())
        if version == 2:
            assert isinstance(parse(buf), ProxyHeader)
        else:
            assert refused(buf) == "version", version


def test_every_command_but_local_and_proxy_is_refused():
    for command in range(16):
        buf = raw(0x20 | command, 0x11, inet())
        if command in (pp.LOCAL, pp.PROXY):
            assert isinstance(parse(buf), ProxyHeader)
        else:
            assert refused(buf) == "command", command


# ---- lengths -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fam", "need"), [(0x11, 12), (0x12, 12), (0x21, 36), (0x22, 36), (0x31, 216), (0x32, 216)])
def test_a_length_shorter_than_the_addresses_is_refused_at_once(fam, need):
    assert isinstance(parse(raw(0x21, fam, b"\x00" * need)), ProxyHeader)
    for short in (0, 1, need - 1):
        assert refused(raw(0x21, fam, b"", length=short)) == "length"  # judged from the 16 fixed bytes alone


def test_every_prefix_needs_exactly_what_is_missing():
    headers = [
        raw(0x21, 0x11, inet()),
        raw(0x21, 0x21, inet6() + tlv(pp.TLV_ALPN, b"h2") + tlv(0xE0, b"x" * 40)),
        raw(0x21, 0x31, unix()),
        raw(0x20, 0x00, b""),
        raw(0x20, 0x11, b"\x01" * 300),
        pp.encode_proxy(("198.18.0.9", 9), ("10.0.0.1", 443), [(pp.TLV_AUTHORITY, b"a.test")], checksum=True),
    ]
    for whole in headers:
        for cut in range(len(whole)):
            got = parse(whole[:cut])
            assert got == NeedMore(max(16, len(whole)) - cut if cut >= 16 else 16 - cut), cut
        assert parse(whole).length == len(whole)
        assert parse(whole + HELLO).length == len(whole)


def test_the_cap_is_judged_from_the_length_field():
    body = inet() + tlv(0xE1, b"z" * (pp.MAX_BYTES - 16 - 12 - 3))
    assert len(raw(0x21, 0x11, body)) == pp.MAX_BYTES
    assert parse(raw(0x21, 0x11, body)).length == pp.MAX_BYTES  # exactly at the cap: accepted
    over = raw(0x21, 0x11, body + b"\x04\x00\x00")
    assert refused(over) == "oversize"
    assert refused(over[:16]) == "oversize"  # refused before the rest arrives
    assert refused(raw(0x21, 0x11, b"", length=0xFFFF)) == "oversize"
    assert refused(raw(0x20, 0x00, b"", length=0xFFFF)) == "oversize"  # LOCAL too: its block is not read
    assert refused(raw(0x21, 0x11, inet()), max_bytes=27) == "oversize"
    assert parse(raw(0x21, 0x11, inet()), max_bytes=28).length == 28
    # the largest header the length field can say (its TLVs: 21,841 empty ones of type 0)
    assert parse(raw(0x21, 0x11, b"\x00" * 0xFFFF), max_bytes=16 + 0xFFFF).length == 16 + 0xFFFF


# ---- TLVs ----------------------------------------------------------------------------------------------------


def test_known_and_unknown_tlvs_in_wire_order():
    ssl = b"\x07" + b"\x00\x00\x00\x00" + tlv(0x21, b"TLSv1.3") + tlv(0x22, b"client-cn")
    tlvs = [
        (pp.TLV_ALPN, b"h2"),
        (pp.TLV_AUTHORITY, b"shop.apps.test"),
        (pp.TLV_NOOP, b"\x00" * 9),
        (pp.TLV_UNIQUE_ID, b"u" * 128),
        (pp.TLV_SSL, ssl),
        (pp.TLV_NETNS, b"blue"),
        (0xE0, b"custom"),
        (0xEA, b"\x01vpce-0123"),  # AWS's VPC endpoint id
        (0xF0, b"experimental"),
        (0xF8, b"future"),
        (0xFF, b""),
        (0x06, b""),  # an unassigned type with an empty value
    ]
    h = parse(raw(0x21, 0x11, inet() + b"".join(tlv(k, v) for k, v in tlvs)))
    assert h.tlvs == tuple(tlvs)
    assert h.tlv(pp.TLV_AUTHORITY) == b"shop.apps.test" and h.tlv(0x99) is None
    assert h.client() == ("198.18.0.2", 40000)


def test_a_unique_id_over_128_bytes_is_refused():
    assert refused(raw(0x21, 0x11, inet() + tlv(pp.TLV_UNIQUE_ID, b"u" * 129))) == "tlv"


@pytest.mark.parametrize("tail", [b"\x04", b"\x04\x00", b"\x04\x00\x01", b"\x01\x00\x05abcd", b"\x01\xff\xff"])
def test_truncated_or_overrunning_tlvs_are_refused(tail):
    assert refused(raw(0x21, 0x11, inet() + tail)) == "tlv"
    assert refused(raw(0x21, 0x11, inet() + tlv(pp.TLV_NOOP, b"ok") + tail)) == "tlv"


def test_crc32c_reference_values():
    # RFC 3720 (iSCSI), B.4, and the usual check value
    assert pp.crc32c(b"123456789") == 0xE3069283
    assert pp.crc32c(bytes(32)) == 0x8A9136AA
    assert pp.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert pp.crc32c(bytes(range(32))) == 0x46DD794E
    assert pp.crc32c(bytes(range(31, -1, -1))) == 0x113FDB5C


def test_a_correct_crc32c_is_accepted_and_any_flipped_byte_refused():
    zeroed = raw(0x21, 0x11, inet() + tlv(pp.TLV_ALPN, b"h2") + tlv(pp.TLV_CRC32C, b"\x00" * 4) + tlv(0xE0, b"x"))
    at = 16 + 12 + 5 + 3
    good = with_crc(zeroed, at)
    h = parse(good)
    assert h.tlv(pp.TLV_CRC32C) == good[at : at + 4]
    for i in range(16, len(good)):  # every byte after the fixed part: refused, never accepted altered ...
        if i == at - 3:
            continue  # ... but the CRC TLV's own type: another type is no checksum (the spec cannot protect it)
        bad = good[:i] + bytes((good[i] ^ 0x01,)) + good[i + 1 :]
        assert refused(bad) in ("crc32c", "tlv"), i
    for i in (12, 13):  # the version/command and family bytes are covered too
        bad = good[:i] + bytes((good[i] ^ 0x02,)) + good[i + 1 :]
        assert refused(bad) in ("crc32c", "command", "family", "version"), i


@pytest.mark.parametrize("size", [0, 3, 5])
def test_a_crc32c_tlv_of_the_wrong_size_is_refused(size):
    assert refused(raw(0x21, 0x11, inet() + tlv(pp.TLV_CRC32C, b"\x00" * size))) == "tlv"


def test_two_crc32c_tlvs_are_refused():
    assert refused(raw(0x21, 0x11, inet() + tlv(pp.TLV_CRC32C, b"\x00" * 4) * 2)) == "tlv"


# ---- what is not a v2 header ---------------------------------------------------------------------------------


def test_version_1_is_refused():
    for line in (b"PROXY TCP4 198.18.0.2 10.0.0.1 40000 443\r\n", b"PROXY UNKNOWN\r\n", b"PROXY "):
        assert refused(line) == "v1"
    for n in range(1, 6):
        assert parse(b"PROXY"[:n]) == NeedMore(6 - n)  # could still be one: wait for the sixth byte
    assert refused(b"PROXZ") == "not_proxy"


@pytest.mark.parametrize(
    "start", [HELLO, b"GET / HTTP/1.1\r\n", b"\x00", b"\r\n\r\n\x01", b"\r\x0a\r\x0a\x00\r\nQUIT!"]
)
def test_anything_else_is_not_proxy(start):
    assert refused(start) == "not_proxy"


def test_signature_helpers():
    assert pp.has_signature(SIG) and pp.has_signature(SIG + b"\x21") and pp.has_signature(b"PROXY TCP4")
    assert not pp.has_signature(SIG[:11]) and not pp.has_signature(HELLO) and not pp.has_signature(b"PROXY")
    for n in range(1, 12):
        assert pp.signature_prefix(SIG[:n]), n
    for n in range(1, 6):
        assert pp.signature_prefix(b"PROXY "[:n]), n
    for buf in (b"", SIG, b"PROXY ", HELLO, b"\r\n\r\n\x01"):
        assert not pp.signature_prefix(buf), buf


def test_buffer_kinds():
    h = raw(0x21, 0x11, inet())
    assert parse(bytearray(h)) == parse(memoryview(h)) == parse(h)


# ---- the encoder ---------------------------------------------------------------------------------------------


def test_encode_inet_is_the_hand_built_header():
    assert pp.encode_proxy(("198.18.0.2", 40000), ("10.1.2.3", 443)) == raw(0x21, 0x11, inet())


def test_encode_inet6_and_tlvs():
    got = pp.encode_proxy(("2001:db8::1", 1), ("2001:db8::2", 65535), [(pp.TLV_ALPN, b"h2"), (0xE0, b"")])
    assert got == raw(0x21, 0x21, inet6() + tlv(pp.TLV_ALPN, b"h2") + tlv(0xE0, b""))


def test_encode_dual_stack_views():
    # a dual-stack listener sees an IPv4 client as IPv4-mapped on both ends: written as plain IPv4
    mapped = pp.encode_proxy(("::ffff:198.18.0.2", 40000), ("::ffff:10.1.2.3", 443))
    assert mapped == raw(0x21, 0x11, inet())
    # one IPv4 and one IPv6 end: the IPv4 one is written IPv4-mapped
    mixed = parse(pp.encode_proxy(("198.18.0.2", 7), ("2001:db8::2", 443)))
    assert (mixed.family, mixed.src_addr, mixed.dst_addr) == (pp.AF_INET6, "::ffff:198.18.0.2", "2001:db8::2")
    scoped = parse(pp.encode_proxy(("fe80::1%eth0", 7), ("fe80::2%eth0", 443)))
    assert (scoped.src_addr, scoped.dst_addr) == ("fe80::1", "fe80::2")


def test_encode_checksum_and_local():
    h = pp.encode_proxy(("198.18.0.2", 40000), ("10.1.2.3", 443), [(pp.TLV_NOOP, b"")], checksum=True)
    zeroed = raw(0x21, 0x11, inet() + tlv(pp.TLV_NOOP, b"") + tlv(pp.TLV_CRC32C, b"\x00" * 4))
    assert h == with_crc(zeroed, len(zeroed) - 4)
    assert parse(h).tlv(pp.TLV_CRC32C) == h[-4:]
    assert pp.encode_local() == raw(0x20, 0x00, b"")
    assert parse(pp.encode_local([(pp.TLV_NOOP, b"abc")], checksum=True)).command == pp.LOCAL


def test_encode_refuses_a_body_its_length_cannot_say():
    with pytest.raises(ValueError):
        pp.encode_proxy(("1.2.3.4", 1), ("5.6.7.8", 2), [(0xE0, b"x" * 0xFFFF)])
    for bad in ("nope", "1.2.3", "", "::g"):
        with pytest.raises(ValueError):
            pp.encode_proxy((bad, 1), ("5.6.7.8", 2))


# ---- the fuzzer ----------------------------------------------------------------------------------------------


def _check_outcome(buf: bytes, max_bytes: int = pp.MAX_BYTES) -> object:
    """Parse ``buf``: only the module's error may escape, and a result must be self-consistent."""
    try:
        got = parse(buf, max_bytes)
    except ProxyProtocolError as exc:
        assert exc.reason in pp.REASONS
        return exc.reason
    if isinstance(got, NeedMore):
        assert got.missing >= 1 and len(buf) + got.missing <= max(max_bytes, 16)
        return got
    assert isinstance(got, ProxyHeader)
    assert 16 <= got.length <= min(len(buf), max_bytes)
    assert got.command in (pp.LOCAL, pp.PROXY)
    if got.client() is not None:
        socket.inet_pton(socket.AF_INET6 if got.family == pp.AF_INET6 else socket.AF_INET, got.src_addr)
        assert 0 <= got.src_port <= 65535 and 0 <= got.dst_port <= 65535
    return got


def _seeds() -> list[bytes]:
    crc_zeroed = raw(0x21, 0x11, inet() + tlv(pp.TLV_CRC32C, b"\x00" * 4))
    return [
        raw(0x21, 0x11, inet()),
        raw(0x21, 0x21, inet6() + tlv(pp.TLV_ALPN, b"h2") + tlv(pp.TLV_SSL, b"\x01\x00\x00\x00\x00")),
        raw(0x21, 0x31, unix()),
        raw(0x20, 0x00, b""),
        raw(0x21, 0x00, tlv(pp.TLV_NOOP, b"abc")),
        with_crc(crc_zeroed, len(crc_zeroed) - 4),
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n",
        HELLO,
    ]


def test_fuzz_random_bytes():
    rng = random.Random(20_2020)
    for _ in range(20000):
        n = rng.choice((rng.randrange(0, 20), rng.randrange(0, 300)))
        body = bytes(rng.getrandbits(8) for _ in range(n))
        _check_outcome(body)
        _check_outcome(SIG + body)  # past the signature, where the parsing starts
        _check_outcome(SIG + bytes((0x21,)) + body, max_bytes=rng.choice((16, 28, 100, pp.MAX_BYTES)))


def test_fuzz_mutated_headers():
    rng = random.Random(3_0020)
    seeds = _seeds()
    outcomes: set[str] = set()
    for _ in range(30000):
        buf = bytearray(rng.choice(seeds))
        for _ in range(rng.randrange(1, 4)):
            op = rng.randrange(6)
            at = rng.randrange(len(buf) + 1)
            if op == 0 and buf:  # flip bits
                i = min(at, len(buf) - 1)
                buf[i] ^= 1 << rng.randrange(8)
            elif op == 1:  # truncate
                del buf[at:]
            elif op == 2:  # insert random bytes
                buf[at:at] = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 8)))
            elif op == 3 and len(buf) >= 16:  # rewrite the length field
                buf[14:16] = struct.pack(
                    "!H", rng.choice((0, 1, 11, 12, 35, 36, 215, 216, 4080, 0xFFFF, len(buf) - 16))
                )
            elif op == 4 and len(buf) >= 14:  # another version/command or family byte
                buf[rng.choice((12, 13))] = rng.getrandbits(8)
            elif op == 5:  # append a TLV, possibly lying about its size
                buf += bytes((rng.getrandbits(8),)) + struct.pack("!H", rng.randrange(0, 12)) + b"v" * rng.randrange(12)
        got = _check_outcome(bytes(buf))
        outcomes.add(type(got).__name__ if not isinstance(got, str) else got)
    # the mutations reached every outcome: headers, prefixes and each kind of refusal
    assert outcomes == {"ProxyHeader", "NeedMore", *pp.REASONS}
