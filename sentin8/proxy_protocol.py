"""The PROXY protocol, version 2 (HAProxy's spec): parse a header from bytes, encode one. Sans-IO.

A balancer in front of the edge (``listen.proxy_protocol_from``) starts each connection with a binary header
that says who the client really is; the edge in turn may start an L4 pipe with one (an instance's
``proxy_protocol = "v2"``) so the backend learns the same. Both directions are here, and nothing else.

``parse(buf)`` is called with whatever has arrived so far and answers one of:

- ``NeedMore(missing)``: a prefix of a header; at least ``missing`` more bytes are needed. The length field
  is read as soon as the 16 fixed bytes are in, so ``missing`` is exact from then on.
- a ``ProxyHeader`` whose ``length`` is how many bytes of ``buf`` it takes; what follows (a ClientHello) is
  the caller's.
- ``ProxyProtocolError(reason)`` (the only exception it raises, whatever the bytes): ``reason`` is one of
  ``REASONS``. Version 1 (text, ``"PROXY "``) is refused on purpose: only v2 is spoken.

Invariants: a header longer than ``max_bytes`` is refused from its length field, before its bytes arrive; a
LOCAL header (the balancer's own health check) is accepted whatever its address block says and carries no
address (the spec: the receiver uses the connection's real endpoints and discards the block); a CRC32C TLV,
when present, is checked and a mismatch refused.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from dataclasses import dataclass

SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"  # 12 bytes
V1_SIGNATURE = b"PROXY "
FIXED = 16  # signature, version/command, family/transport, length
MAX_BYTES = 4096  # default cap of a whole header: addresses + TLVs of any real balancer fit in a tenth of it

# version/command byte: high nibble version (2), low nibble command
LOCAL = 0x0
PROXY = 0x1
# family/transport byte: high nibble address family, low nibble transport
AF_UNSPEC = 0x0
AF_INET = 0x1
AF_INET6 = 0x2
AF_UNIX = 0x3
UNSPEC = 0x0
STREAM = 0x1
DGRAM = 0x2
ADDRESS_BYTES = {AF_UNSPEC: 0, AF_INET: 12, AF_INET6: 36, AF_UNIX: 216}
_UNIX_PATH = 108

# TLV types
TLV_ALPN = 0x01
TLV_AUTHORITY = 0x02
TLV_CRC32C = 0x03
TLV_NOOP = 0x04
TLV_UNIQUE_ID = 0x05
TLV_SSL = 0x20
TLV_NETNS = 0x30
UNIQUE_ID_MAX = 128

REASONS = (
    "not_proxy",  # the bytes are no PROXY header (on a connection that must start with one)
    "v1",  # a version 1 (text) header: refused
    "version",  # the v2 signature with a version other than 2
    "command",  # neither LOCAL nor PROXY
    "family",  # an address family / transport pair the spec does not define
    "length",  # the length field is shorter than the family's addresses
    "oversize",  # the length field announces more than the cap
    "tlv",  # a TLV that overruns the header, or a known TLV of the wrong size
    "crc32c",  # the CRC32C TLV does not match the header
)


class ProxyProtocolError(ValueError):
    """A header that is refused; ``reason`` (one of ``REASONS``) says why in one word."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class NeedMore:
    missing: int  # at least this many more bytes


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """One parsed header. Addresses are IP literals (AF_INET/AF_INET6), socket paths (AF_UNIX, decoded with
    surrogateescape so any bytes round-trip) or "" (AF_UNSPEC, and every LOCAL header)."""

    command: int
    family: int
    transport: int
    src_addr: str = ""
    dst_addr: str = ""
    src_port: int = 0
    dst_port: int = 0
    tlvs: tuple[tuple[int, bytes], ...] = ()  # in wire order, NOOP and unknown types included
    length: int = FIXED  # bytes of the buffer the header took

    def client(self) -> tuple[str, int] | None:
        """The client to act for: the source of a PROXY header over TCP (IPv4 or IPv6). None means the
        connection's own peer (the balancer): a LOCAL header, or a family that carries no IP stream address
        (UNSPEC, UNIX, datagrams), as HAProxy does."""
        if self.command == PROXY and self.transport == STREAM and self.family in (AF_INET, AF_INET6):
            return (self.src_addr, self.src_port)
        return None

    def destination(self) -> tuple[str, int] | None:
        """The address the client connected to, when ``client()`` is not None."""
        if self.client() is None:
            return None
        return (self.dst_addr, self.dst_port)

    def tlv(self, kind: int) -> bytes | None:
        """The value of the first TLV of type ``kind``, None when absent."""
        for t, v in self.tlvs:
            if t == kind:
                return v
        return None


def signature_prefix(buf: bytes) -> bool:
    """True when ``buf`` (non-empty) is a strict prefix of a v1 or v2 signature: wait for more before judging
    whether a PROXY header is coming."""
    n = len(buf)
    return 0 < n < len(SIGNATURE) and (SIGNATURE.startswith(buf) or (n < 6 and V1_SIGNATURE.startswith(buf)))


def has_signature(buf: bytes) -> bool:
    """True when ``buf`` starts with a whole v1 or v2 signature (whatever follows)."""
    return buf.startswith(SIGNATURE) or buf.startswith(V1_SIGNATURE)


def parse(buf: bytes | bytearray | memoryview, max_bytes: int = MAX_BYTES) -> ProxyHeader | NeedMore:
    """One v2 header from the start of ``buf``; see the module docstring for the three outcomes."""
    data = bytes(buf[:FIXED])
    n = len(data)
    if not SIGNATURE.startswith(data[:12]):
        if V1_SIGNATURE.startswith(data[:6]):
            if n < 6:
                return NeedMore(6 - n)
            raise ProxyProtocolError("v1", "version 1 headers are not accepted")
        raise ProxyProtocolError("not_proxy", "no PROXY v2 signature")
    if n < FIXED:
        return NeedMore(FIXED - n)
    version, command = data[12] >> 4, data[12] & 0x0F
    if version != 2:
        raise ProxyProtocolError("version", f"version {version}")
    if command not in (LOCAL, PROXY):
        raise ProxyProtocolError("command", f"command {command:#x}")
    body = int.from_bytes(data[14:16], "big")
    total = FIXED + body
    if total > max_bytes:
        raise ProxyProtocolError("oversize", f"{total} bytes over the {max_bytes}-byte cap")
    family, transport = data[13] >> 4, data[13] & 0x0F
    if command == PROXY:  # a LOCAL header's block is discarded unread, whatever its family says
        if not (data[13] == 0x00 or (family in (AF_INET, AF_INET6, AF_UNIX) and transport in (STREAM, DGRAM))):
            raise ProxyProtocolError("family", f"family/transport {data[13]:#04x}")
        if body < ADDRESS_BYTES[family]:
            raise ProxyProtocolError("length", f"{body} bytes cannot hold the addresses of family {family}")
    if len(buf) < total:
        return NeedMore(total - len(buf))
    if command == LOCAL:
        return ProxyHeader(LOCAL, family, transport, length=total)
    header = bytes(buf[:total])
    src, dst, sport, dport = _addresses(header, family)
    tlvs = _tlvs(header, FIXED + ADDRESS_BYTES[family])
    return ProxyHeader(PROXY, family, transport, src, dst, sport, dport, tlvs, total)


def _addresses(header: bytes, family: int) -> tuple[str, str, int, int]:
    a = FIXED
    if family == AF_INET:
        src = socket.inet_ntop(socket.AF_INET, header[a : a + 4])
        dst = socket.inet_ntop(socket.AF_INET, header[a + 4 : a + 8])
        return src, dst, int.from_bytes(header[a + 8 : a + 10], "big"), int.from_bytes(header[a + 10 : a + 12], "big")
    if family == AF_INET6:
        src = socket.inet_ntop(socket.AF_INET6, header[a : a + 16])
        dst = socket.inet_ntop(socket.AF_INET6, header[a + 16 : a + 32])
        return src, dst, int.from_bytes(header[a + 32 : a + 34], "big"), int.from_bytes(header[a + 34 : a + 36], "big")
    if family == AF_UNIX:
        return _unix_path(header[a : a + _UNIX_PATH]), _unix_path(header[a + _UNIX_PATH : a + 2 * _UNIX_PATH]), 0, 0
    return "", "", 0, 0


def _unix_path(raw: bytes) -> str:
    return raw.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")


def _tlvs(header: bytes, start: int) -> tuple[tuple[int, bytes], ...]:
    out: list[tuple[int, bytes]] = []
    end = len(header)
    i = start
    crc_at = -1
    while i < end:
        if end - i < 3:
            raise ProxyProtocolError("tlv", f"{end - i} trailing bytes are no TLV")
        kind = header[i]
        size = int.from_bytes(header[i + 1 : i + 3], "big")
        if i + 3 + size > end:
            raise ProxyProtocolError("tlv", f"TLV {kind:#04x} of {size} bytes overruns the header")
        value = header[i + 3 : i + 3 + size]
        if kind == TLV_CRC32C:
            if size != 4 or crc_at >= 0:
                raise ProxyProtocolError("tlv", "a CRC32C TLV is one 4-byte value")
            crc_at = i + 3
        elif kind == TLV_UNIQUE_ID and size > UNIQUE_ID_MAX:
            raise ProxyProtocolError("tlv", f"a unique id of {size} bytes (at most {UNIQUE_ID_MAX})")
        out.append((kind, value))
        i += 3 + size
    if crc_at >= 0:
        sent = int.from_bytes(header[crc_at : crc_at + 4], "big")
        if crc32c(header[:crc_at] + b"\x00\x00\x00\x00" + header[crc_at + 4 :]) != sent:
            raise ProxyProtocolError("crc32c", "checksum mismatch")
    return tuple(out)


# ---- encoding (the out direction) ---------------------------------------------------------------------------


def encode_proxy(
    src: tuple[str, int], dst: tuple[str, int], tlvs: Iterable[tuple[int, bytes]] = (), *, checksum: bool = False
) -> bytes:
    """A PROXY header for a TCP connection from ``src`` to ``dst`` (IP literals). Both addresses must share a
    family: when one is IPv6 and the other IPv4, the IPv4 one is written IPv4-mapped; IPv4-mapped IPv6 on
    both sides (a dual-stack listener's view of an IPv4 client) is written as IPv4. ``checksum`` appends a
    CRC32C TLV over the whole header."""
    s, d = _packed(src[0]), _packed(dst[0])
    if len(s) == len(d) == 16 and s.startswith(_V4_MAPPED) and d.startswith(_V4_MAPPED):
        s, d = s[12:], d[12:]
    if len(s) == len(d) == 4:
        family, block = AF_INET, s + d
    else:
        family = AF_INET6
        block = _as_v6(s) + _as_v6(d)
    block += src[1].to_bytes(2, "big") + dst[1].to_bytes(2, "big")
    return _frame(PROXY, family << 4 | STREAM, block, tlvs, checksum)


def encode_local(tlvs: Iterable[tuple[int, bytes]] = (), *, checksum: bool = False) -> bytes:
    """A LOCAL header (no addresses: the sender speaking for itself, e.g. a health check)."""
    return _frame(LOCAL, 0x00, b"", tlvs, checksum)


_V4_MAPPED = b"\x00" * 10 + b"\xff\xff"


def _packed(ip: str) -> bytes:
    """An IP literal's 4 or 16 bytes (an IPv6 zone, ``%eth0``, dropped); ValueError for anything else."""
    try:
        return socket.inet_pton(socket.AF_INET, ip)
    except OSError:
        pass
    try:
        return socket.inet_pton(socket.AF_INET6, ip.split("%", 1)[0])
    except OSError:
        raise ValueError(f"{ip!r} is not an IP address") from None


def _as_v6(packed: bytes) -> bytes:
    return packed if len(packed) == 16 else _V4_MAPPED + packed


def _frame(command: int, fam: int, block: bytes, tlvs: Iterable[tuple[int, bytes]], checksum: bool) -> bytes:
    body = bytearray(block)
    for kind, value in tlvs:
        body += bytes((kind,)) + len(value).to_bytes(2, "big") + value
    if checksum:
        body += bytes((TLV_CRC32C, 0, 4)) + b"\x00\x00\x00\x00"  # zero while the checksum is computed
    if len(body) > 0xFFFF:
        raise ValueError(f"a PROXY header body of {len(body)} bytes does not fit its length field")
    out = bytearray(SIGNATURE + bytes((0x20 | command, fam)) + len(body).to_bytes(2, "big") + body)
    if checksum:
        out[-4:] = crc32c(bytes(out)).to_bytes(4, "big")
    return bytes(out)


# ---- CRC32C (Castagnoli), for the TLV: reflected polynomial 0x82F63B78 -------------------------------------


def _table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_CRC_TABLE = _table()


def crc32c(data: bytes) -> int:
    """CRC32C of ``data`` (a header is at most a few hundred bytes: a table loop is enough)."""
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
