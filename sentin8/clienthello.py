"""Sans-IO TLS ClientHello reader: bytes in, server name out. Never consumes anything.

The caller peeks (MSG_PEEK) the socket and calls ``parse`` with everything peeked so far. A post-quantum
ClientHello is ~1.5 KB and may span TCP segments and TLS records, so ``parse`` answers ``Incomplete`` with a
lower bound of the bytes still missing (used for SO_RCVLOWAT) until the whole handshake message is there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

RECORD_HEADER = 5
CONTENT_HANDSHAKE = 0x16
HANDSHAKE_CLIENT_HELLO = 0x01
EXT_SERVER_NAME = 0x0000
EXT_ALPN = 0x0010
MAX_RECORD_PAYLOAD = 16384 + 256  # RFC 8446 §5.1 plaintext limit, with slack for old stacks


ALERT_UNEXPECTED_MESSAGE = 10
ALERT_PROTOCOL_VERSION = 70


class ClientHelloError(ValueError):
    """The bytes are not a well-formed TLS ClientHello. ``alert`` is the fatal alert a reference OpenSSL
    server sends for the same bytes before closing, or None when it closes without one."""

    def __init__(self, message: str, alert: int | None = None) -> None:
        super().__init__(message)
        self.alert = alert


class BadRecordVersion(ClientHelloError):
    """A record whose legacy version major is not 3."""


def alert_record(description: int) -> bytes:
    """A plaintext fatal alert record, framed as OpenSSL frames it before version negotiation ends."""
    return bytes((0x15, 3, 3, 0, 2, 2, description))


@dataclass(frozen=True, slots=True)
class Incomplete:
    missing: int  # at least this many more bytes are needed


@dataclass(frozen=True, slots=True)
class ClientHello:
    sni: str | None  # lower case, no trailing dot; None when the client sent no server_name
    alpn: tuple[str, ...]
    size: int  # bytes of records that carried the handshake message


def _handshake_bytes(buf: bytes) -> tuple[bytes, int, int]:
    """Concatenate handshake-record payloads. Returns (payload, bytes consumed, missing-in-current-record)."""
    payload = bytearray()
    pos = 0
    n = len(buf)
    while pos < n:
        if n - pos < RECORD_HEADER:
            # judge what we have of the header early: garbage should not wait for a deadline
            _check_record_prefix(buf[pos:], pos)
            return bytes(payload), pos, RECORD_HEADER - (n - pos)
        ctype, major, length = buf[pos], buf[pos + 1], int.from_bytes(buf[pos + 3 : pos + 5], "big")
        if ctype != CONTENT_HANDSHAKE:
            raise ClientHelloError(f"record type {ctype:#x} before the ClientHello was complete")
        if major != 3:
            raise _bad_version(pos)
        if length == 0:
            # RFC 8446 §5.1: no zero-length handshake fragments. OpenSSL's TLS 1.3 record layer answers
            # unexpected_message; here it is refused at once rather than waited on until the deadline.
            raise ClientHelloError("zero-length handshake record", ALERT_UNEXPECTED_MESSAGE)
        if length > MAX_RECORD_PAYLOAD:
            raise ClientHelloError(f"bad record length {length}")
        end = pos + RECORD_HEADER + length
        if end > n:
            payload += buf[pos + RECORD_HEADER :]
            return bytes(payload), n, end - n
        payload += buf[pos + RECORD_HEADER : end]
        pos = end
        if len(payload) >= 4:
            hs_len = int.from_bytes(payload[1:4], "big")
            if len(payload) >= 4 + hs_len:
                return bytes(payload), pos, 0
    return bytes(payload), pos, 0


def _check_record_prefix(prefix: bytes, pos: int) -> None:
    if prefix and prefix[0] != CONTENT_HANDSHAKE:
        raise ClientHelloError(f"record type {prefix[0]:#x}: not a TLS handshake")
    if len(prefix) > 1 and prefix[1] != 3:
        raise _bad_version(pos)


def _bad_version(pos: int) -> BadRecordVersion:
    # As OpenSSL's record layer: the first record with a foreign version does not look like TLS at all (an
    # HTTP request, a scanner) and is closed without an alert; a later record of a hello is a TLS peer
    # speaking nonsense and gets protocol_version.
    if pos == 0:
        return BadRecordVersion("not a TLS record (bad version)")
    return BadRecordVersion("record version major is not 3", ALERT_PROTOCOL_VERSION)


def parse(buf: bytes) -> ClientHello | Incomplete:
    """Parse the ClientHello at the start of ``buf``; ``Incomplete`` if more bytes are needed."""
    payload, consumed, missing_in_record = _handshake_bytes(buf)
    if payload and payload[0] != HANDSHAKE_CLIENT_HELLO:
        raise ClientHelloError(f"handshake type {payload[0]} is not ClientHello")
    if len(payload) < 4:
        return Incomplete(max(1, missing_in_record or RECORD_HEADER))
    hs_len = int.from_bytes(payload[1:4], "big")
    if hs_len < 38:
        raise ClientHelloError("ClientHello too short")
    have = len(payload) - 4
    if have < hs_len:
        # the rest of this record, or else the next record's header: only the header, since a zero-length
        # record is all header and must be judged (refused) as soon as it is there
        more = missing_in_record if missing_in_record else RECORD_HEADER
        return Incomplete(max(1, more))
    return _parse_body(payload[4 : 4 + hs_len], consumed)


def _vec(buf: bytes, pos: int, width: int, limit: int) -> tuple[int, int]:
    """(start, end) of the ``width``-byte length-prefixed vector at ``pos``, within ``buf[:limit]``."""
    start = pos + width
    if start > limit:
        raise ClientHelloError("field runs past the end of the ClientHello")
    end = start + (buf[pos] if width == 1 else (buf[pos] << 8) | buf[pos + 1])
    if end > limit:
        raise ClientHelloError("field runs past the end of the ClientHello")
    return start, end


def _parse_body(body: bytes, size: int) -> ClientHello:
    # Plain index arithmetic over bytes: this runs for every connection, and a reader object with a method
    # call per field cost more than the rest of the routing decision.
    n = len(body)
    if n < 35 or body[0] != 3:
        raise ClientHelloError("bad legacy_version")
    start, end = _vec(body, 34, 1, n)  # after version (2) and random (32): the session id
    if end - start > 32:
        raise ClientHelloError("session id longer than 32 bytes")
    start, end = _vec(body, end, 2, n)  # cipher suites
    if end - start < 2 or (end - start) % 2:
        raise ClientHelloError("bad cipher_suites length")
    start, end = _vec(body, end, 1, n)  # compression methods
    if end == start:
        raise ClientHelloError("no compression methods")
    if end == n:
        return ClientHello(None, (), size)  # no extensions at all (pre-TLS 1.2 style)
    pos, ext_end = _vec(body, end, 2, n)
    if ext_end != n:
        raise ClientHelloError("trailing bytes after extensions")
    sni: str | None = None
    alpn: tuple[str, ...] = ()
    seen: set[int] = set()
    while pos < ext_end:
        if pos + 2 > ext_end:
            raise ClientHelloError("field runs past the end of the ClientHello")
        etype = (body[pos] << 8) | body[pos + 1]
        start, pos = _vec(body, pos + 2, 2, ext_end)
        if etype in seen:
            raise ClientHelloError(f"duplicate extension {etype:#x}")
        seen.add(etype)
        if etype == EXT_SERVER_NAME:
            sni = _server_name(body[start:pos])
        elif etype == EXT_ALPN:
            alpn = _alpn(body[start:pos])
    return ClientHello(sni, alpn, size)


def _server_name(data: bytes) -> str | None:
    pos, end = _vec(data, 0, 2, len(data))
    if end != len(data):
        raise ClientHelloError("trailing bytes in server_name")
    host: str | None = None
    while pos < end:
        kind = data[pos]
        start, pos = _vec(data, pos + 1, 2, end)
        if kind != 0:
            continue  # unknown name types are skipped (RFC 6066 §3)
        if host is not None:
            raise ClientHelloError("more than one host_name")
        host = _hostname(data[start:pos])
    return host


_LABELS = re.compile(r"[a-z0-9_-]{1,63}(?:\.[a-z0-9_-]{1,63})*")


def _hostname(raw: bytes) -> str:
    if not raw or len(raw) > 254:
        raise ClientHelloError("bad server name length")
    try:
        name = raw.decode("ascii")
    except UnicodeDecodeError:
        raise ClientHelloError("server name is not ASCII") from None
    name = name.lower().removesuffix(".")
    if not name or len(name) > 253:
        raise ClientHelloError("bad server name length")
    if not _LABELS.fullmatch(name):
        raise ClientHelloError("server name is not a DNS hostname")
    return name


def _alpn(data: bytes) -> tuple[str, ...]:
    pos, end = _vec(data, 0, 2, len(data))
    out = []
    while pos < end:
        start, pos = _vec(data, pos, 1, end)
        if start == pos:
            raise ClientHelloError("empty ALPN protocol")
        out.append(data[start:pos].decode("latin-1"))
    return tuple(out)
