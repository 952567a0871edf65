"""The sans-IO SNI extractor against real ClientHellos, reshaped every way a network can reshape them."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sentin8 import clienthello
from sentin8.clienthello import RECORD_HEADER, ClientHello, ClientHelloError, Incomplete, parse
from tests import tls13raw, tls_reference
from tests.hellos import classical_hello, pq_hello, reframe, with_extension_first

PQ = pq_hello("shop.apps.example.com")
CLASSICAL = classical_hello("shop.apps.example.com")


def test_real_hellos_give_the_sni():
    for hello in (PQ, CLASSICAL):
        result = clienthello.parse(hello)
        assert isinstance(result, ClientHello)
        assert result.sni == "shop.apps.example.com"
        assert result.size == len(hello)


def test_pq_hello_is_large_enough_to_span_segments():
    assert len(PQ) > 1400  # bigger than one typical TCP segment's payload


@pytest.mark.parametrize(
    "hello",
    [PQ, CLASSICAL, reframe(PQ, 100), reframe(CLASSICAL, 1)],
    ids=["pq", "classical", "pq-100b-records", "classical-1b-records"],
)
def test_every_prefix_is_incomplete_and_the_whole_parses(hello):
    for cut in range(len(hello)):
        result = clienthello.parse(hello[:cut])
        assert isinstance(result, Incomplete), cut
        assert result.missing >= 1
        assert cut + result.missing <= len(hello), f"asked for more than needed at {cut}"
    assert clienthello.parse(hello).sni == "shop.apps.example.com"


def test_bytes_after_the_hello_are_ignored():
    assert clienthello.parse(PQ + b"\x14\x03\x03\x00\x01\x01").sni == "shop.apps.example.com"


def test_split_across_records_gives_the_same_answer():
    for size in (1, 2, 5, 64, 512, 1000):
        assert clienthello.parse(reframe(PQ, size)).sni == "shop.apps.example.com"


def test_grease_extension_is_skipped():
    greased = with_extension_first(PQ, 0x0A0A, b"")
    assert clienthello.parse(greased).sni == "shop.apps.example.com"
    greased = with_extension_first(CLASSICAL, 0xFAFA, b"\x00")
    assert clienthello.parse(greased).sni == "shop.apps.example.com"


def test_no_sni():
    assert clienthello.parse(pq_hello(None)).sni is None
    assert clienthello.parse(classical_hello(None)).sni is None


def test_sni_is_normalised():
    assert clienthello.parse(classical_hello("Shop.Example.COM")).sni == "shop.example.com"


# What a routable server name is, said once as a regular expression: labels of 1-63 letters, digits, "_" or
# "-" joined by single dots, one trailing dot allowed, at most 253 characters (the parser checks it in one pass
# over the bytes: it runs for every connection).
_HOSTNAME = re.compile(rb"[a-z0-9_-]{1,63}(?:\.[a-z0-9_-]{1,63})*")


def _hostname_by_the_definition(raw: bytes) -> str | None:
    if len(raw) > 255 or b"\x00" in raw or not raw.isascii():
        return None
    name = raw.lower().removesuffix(b".")
    return name.decode() if len(name) <= 253 and _HOSTNAME.fullmatch(name) else None


@settings(max_examples=3000, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=300),
        st.lists(st.sampled_from([b"a", b"Z", b"9", b"_", b"-", b".", b"\xe9", b" ", b"a" * 63]), max_size=12).map(
            b"".join
        ),
        st.lists(st.integers(0, 70).map(lambda n: b"x" * n), min_size=1, max_size=6).map(b".".join),
    )
)
def test_a_server_name_is_served_exactly_when_it_is_a_dns_hostname(raw):
    try:
        # read in place, between bytes that would each be refused: nothing outside start:end is looked at
        got = clienthello._hostname(b"\x00\xff." + raw + b".\x00", 3, 3 + len(raw))
    except ClientHelloError as exc:
        assert exc.alert == clienthello.ALERT_UNRECOGNIZED_NAME
        got = None
    assert got == _hostname_by_the_definition(raw)


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\n\r\n",
        b"\x16\x02\x00",  # SSLv2-ish version
        b"\x17\x03\x03\x00\x05hello",  # application data first
        b"\x17\x03\x03\x00\x00",  # an empty record of any type but handshake (and CCS): see below for those
        b"\x16\x03\x01\x50\x00",  # record longer than TLS allows
        b"\x16\x03\x01\x00\x04\x02\x00\x00\x00",  # ServerHello, not ClientHello
    ],
)
def test_garbage_is_rejected_early(data):
    with pytest.raises(ClientHelloError):
        clienthello.parse(data)


def test_duplicate_extension_rejected():
    dup = with_extension_first(PQ, 0x0000, b"\x00\x05\x00\x00\x02ab")  # a second server_name
    with pytest.raises(ClientHelloError):
        clienthello.parse(dup)


def test_oversized_hello_stays_incomplete_so_the_byte_cap_decides():
    huge = with_extension_first(PQ, 0x5A5A, b"\x00" * 40000)  # one 40 KB handshake message
    framed = reframe(huge, 16384)
    result = clienthello.parse(framed[:16384])
    assert isinstance(result, Incomplete)  # the worker's peek_max_bytes closes it


def test_truncated_inner_lengths_rejected():
    msg = bytearray(PQ)
    msg[5 + 4 + 2 + 32] = 200  # session id length past the end of the message
    with pytest.raises(ClientHelloError):
        clienthello.parse(bytes(msg))


@settings(max_examples=3000, deadline=None)
@given(st.binary(max_size=3000))
def test_fuzz_random_bytes_only_raise_the_parsers_error(data):
    try:
        clienthello.parse(data)
    except ClientHelloError:
        pass


@settings(max_examples=3000, deadline=None)
@given(st.integers(0, len(PQ) - 1), st.integers(0, 255), st.integers(0, len(PQ)))
def test_fuzz_mutated_real_hello(pos, value, cut):
    data = bytearray(PQ)
    data[pos] = value
    try:
        result = clienthello.parse(bytes(data[:cut]) if cut else bytes(data))
    except ClientHelloError:
        return
    assert isinstance(result, ClientHello | Incomplete)


def test_after_a_complete_record_the_next_header_is_enough_to_judge():
    records = reframe(pq_hello("a.test"), 600)
    first = 5 + int.from_bytes(records[3:5], "big")
    # Asking for more than a record header would hold a zero-length record (all header) until the deadline.
    assert parse(records[:first]) == Incomplete(RECORD_HEADER)
    with pytest.raises(ClientHelloError) as info:
        parse(records[:first] + b"\x17\x03\x03\x00\x00")
    assert info.value.alert == clienthello.ALERT_UNEXPECTED_MESSAGE


def test_empty_handshake_records_are_skipped_as_the_reference_skips_them():
    """OpenSSL 3.5 and 4.0 skip empty handshake records (and empty CCS records until the handshake header is
    complete), up to 32 in a row; the 33rd is unexpected_message. Issue 16 (7): refusing the first one at
    once, as this parser did, answered where the reference completes the handshake."""
    hello = pq_hello("a.test")
    records = reframe(hello, 600)
    first = 5 + int.from_bytes(records[3:5], "big")
    empty_hs, empty_ccs = b"\x16\x03\x01\x00\x00", b"\x14\x03\x03\x00\x00"
    assert parse(empty_hs) == Incomplete(RECORD_HEADER)
    assert parse(records[:first] + empty_hs) == Incomplete(RECORD_HEADER)
    assert parse(empty_ccs * 16 + empty_hs * 16 + hello).sni == "a.test"
    assert parse(records[:first] + empty_hs * 32 + records[first:]).sni == "a.test"
    for too_many in (empty_hs * 33 + hello, records[:first] + empty_hs * 33):
        with pytest.raises(ClientHelloError) as info:
            parse(too_many)
        assert info.value.alert_bytes() == bytes.fromhex("1503030002020a")
    # an empty CCS once the 4-byte handshake header is in: unexpected_message
    ones = reframe(hello, 1)
    assert parse(ones[:18] + empty_ccs + ones[18:]).sni == "a.test"
    with pytest.raises(ClientHelloError):
        parse(ones[:24] + empty_ccs)


def test_bad_record_version_gets_an_alert_only_after_the_first_record():
    hello = bytearray(pq_hello("a.test"))
    hello[1] = 4
    with pytest.raises(clienthello.BadRecordVersion) as info:
        parse(bytes(hello))
    assert info.value.alert is None  # OpenSSL: "wrong version number", closed without an alert
    with pytest.raises(clienthello.BadRecordVersion):
        parse(b"\x16\x02")  # judged from the first two bytes already
    records = bytearray(reframe(pq_hello("a.test"), 600))
    first = 5 + int.from_bytes(records[3:5], "big")
    records[first + 1] = 2
    for end in (first + 2, len(records)):
        with pytest.raises(clienthello.BadRecordVersion) as info:
            parse(bytes(records[:end]))
        assert info.value.alert == clienthello.ALERT_PROTOCOL_VERSION
    assert clienthello.alert_record(70) == bytes.fromhex("15030300020246")


# -- every answer of tests/tls_reference.py, sans IO ----------------------------------------------------


@pytest.mark.parametrize("case", tls_reference.cases(), ids=lambda c: c.name)
def test_parse_gives_the_reference_answer(case):
    """The peek's cases are refused with the recorded alert (and record version); the others pass to the TLS
    server that terminates the connection, which answers them itself."""
    limit = 32768  # the default limits.peek_max_bytes
    if not case.peek:
        assert isinstance(parse(case.wire, limit), ClientHello), case.name
        return
    try:
        result = parse(case.wire, limit)
    except ClientHelloError as exc:
        sent = exc.alert_bytes()
    else:
        assert case.fin and isinstance(result, Incomplete), case.name
        sent = clienthello.truncated().alert_bytes()
    assert (f"{sent.hex()} fin" if sent else "fin") == case.expected


def test_a_hello_in_one_maximal_record_fits_exactly_16389_bytes():
    msg = tls_reference.padded_message(16384)
    wire = b"\x16\x03\x01\x40\x00" + msg
    assert len(wire) == 16389
    assert parse(wire, 16389).sni == tls_reference.SNI
    with pytest.raises(clienthello.HelloTooLarge):
        parse(wire[:16388], 16388)  # one byte short of the record, and the buffer is full


def test_a_hello_over_the_limit_is_refused_as_soon_as_that_is_known():
    msg = tls_reference.padded_message(40000)
    wire = tls_reference._records(msg)
    # from the handshake header in the first record: 40,000 bytes need three records
    with pytest.raises(clienthello.HelloTooLarge) as info:
        parse(wire[: 5 + 16384], 32768)
    assert info.value.alert_bytes() == bytes.fromhex("1503030002022f")
    assert parse(wire, 40000 + 15).sni == tls_reference.SNI  # exactly its size
    # split so finely that the records no longer fit: refused when the buffer is full
    ones = reframe(pq_hello("a.test"), 1)
    with pytest.raises(clienthello.HelloTooLarge):
        parse(ones[:2000], 2000)
    assert parse(ones, len(ones)).sni == "a.test"


def test_legacy_version_is_left_to_the_tls_server():
    for version in (0x0000, 0x0200, 0x0300, 0x0400, 0xFFFF):
        hello = tls13raw.pq_hello("a.test", tls13raw.KeyShares(), legacy_version=version)
        assert parse(hello.record()).sni == "a.test"
