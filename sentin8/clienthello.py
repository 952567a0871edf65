"""Sans-IO TLS ClientHello reader: bytes in, server name out. Never consumes anything.

The caller peeks (MSG_PEEK) the socket and calls ``parse`` with everything peeked so far. A post-quantum
ClientHello is ~1.5 KB and may span TCP segments and TLS records, so ``parse`` answers ``Incomplete`` with a
lower bound of the bytes still missing (used for SO_RCVLOWAT) until the whole handshake message is there.
"""

from __future__ import annotations

from dataclasses import dataclass

RECORD_HEADER = 5
CONTENT_HANDSHAKE = 0x16
HANDSHAKE_CLIENT_HELLO = 0x01
EXT_SERVER_NAME = 0x0000
EXT_ALPN = 0x0010
MAX_RECORD_PAYLOAD = 16384 + 256  # RFC 8446 §5.1 plaintext limit, with slack for old stacks


class ClientHelloError(ValueError):
    """The bytes are not a well-formed TLS ClientHello."""


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
            _check_record_prefix(buf[pos:])
            return bytes(payload), pos, RECORD_HEADER - (n - pos)
        ctype, major, length = buf[pos], buf[pos + 1], int.from_bytes(buf[pos + 3 : pos + 5], "big")
        if ctype != CONTENT_HANDSHAKE:
            raise ClientHelloError(f"record type {ctype:#x} before the ClientHello was complete")
        if major != 3:
            raise ClientHelloError("not a TLS record (bad version)")
        if length == 0 or length > MAX_RECORD_PAYLOAD:
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


def _check_record_prefix(prefix: bytes) -> None:
    if prefix and prefix[0] != CONTENT_HANDSHAKE:
        raise ClientHelloError(f"record type {prefix[0]:#x}: not a TLS handshake")
    if len(prefix) > 1 and prefix[1] != 3:
        raise ClientHelloError("not a TLS record (bad version)")


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
        # the rest of this record, and at least one more record header if the message goes past it
        more = missing_in_record if missing_in_record else RECORD_HEADER + 1
        return Incomplete(max(1, more))
    return _parse_body(memoryview(payload)[4 : 4 + hs_len], consumed)


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if end > len(self.data):
            raise ClientHelloError("field runs past the end of the ClientHello")
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self.take(2), "big")

    def vec8(self) -> memoryview:
        return self.take(self.u8())

    def vec16(self) -> memoryview:
        return self.take(self.u16())

    def done(self) -> bool:
        return self.pos == len(self.data)


def _parse_body(body: memoryview, size: int) -> ClientHello:
    r = _Reader(body)
    if r.take(1)[0] != 3:
        raise ClientHelloError("bad legacy_version")
    r.take(1 + 32)  # minor version, random
    if len(r.vec8()) > 32:
        raise ClientHelloError("session id longer than 32 bytes")
    suites = r.vec16()
    if len(suites) < 2 or len(suites) % 2:
        raise ClientHelloError("bad cipher_suites length")
    if len(r.vec8()) < 1:
        raise ClientHelloError("no compression methods")
    sni: str | None = None
    alpn: tuple[str, ...] = ()
    if r.done():
        return ClientHello(None, (), size)  # no extensions at all (pre-TLS 1.2 style)
    ext = _Reader(r.vec16())
    if not r.done():
        raise ClientHelloError("trailing bytes after extensions")
    seen: set[int] = set()
    while not ext.done():
        etype = ext.u16()
        data = ext.vec16()
        if etype in seen:
            raise ClientHelloError(f"duplicate extension {etype:#x}")
        seen.add(etype)
        if etype == EXT_SERVER_NAME:
            sni = _server_name(data)
        elif etype == EXT_ALPN:
            alpn = _alpn(data)
    return ClientHello(sni, alpn, size)


def _server_name(data: memoryview) -> str | None:
    r = _Reader(data)
    names = _Reader(r.vec16())
    if not r.done():
        raise ClientHelloError("trailing bytes in server_name")
    host: str | None = None
    while not names.done():
        kind = names.u8()
        name = bytes(names.vec16())
        if kind != 0:
            continue  # unknown name types are skipped (RFC 6066 §3)
        if host is not None:
            raise ClientHelloError("more than one host_name")
        host = _hostname(name)
    return host


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
    for label in name.split("."):
        if not label or len(label) > 63 or not all(c.isalnum() or c in "-_" for c in label):
            raise ClientHelloError("server name is not a DNS hostname")
    return name


def _alpn(data: memoryview) -> tuple[str, ...]:
    r = _Reader(data)
    protos = _Reader(r.vec16())
    out = []
    while not protos.done():
        p = protos.vec8()
        if not p:
            raise ClientHelloError("empty ALPN protocol")
        out.append(bytes(p).decode("latin-1"))
    return tuple(out)
