"""Sans-IO TLS ClientHello reader: bytes in, server name (or the alert to answer) out. Never consumes anything.

The caller peeks (MSG_PEEK) the socket and calls ``parse`` with everything peeked so far. A post-quantum
ClientHello is ~1.5 KB and may span TCP segments and TLS records, so ``parse`` answers ``Incomplete`` with a
lower bound of the bytes still missing (used for SO_RCVLOWAT) until the whole handshake message is there.

Bytes that cannot be a ClientHello raise ``ClientHelloError`` carrying the fatal alert a reference OpenSSL 3.5
``s_server`` (TLS 1.3 only) sends for the same bytes, and the record version it frames that alert with, so the
proxy answers hostile input exactly as the reference does (the table is in ``tests/tls_reference.py``, which
also replays it against a live reference). The rules, in the reference's order:

- record layer, per record: a version major other than 3 is "not TLS" in the first record (closed without an
  alert) and ``protocol_version`` later; a length over 2^14 is ``record_overflow``, judged on the header;
  zero-length handshake records are skipped (and a zero-length change_cipher_spec until the handshake header
  is complete), up to 32 in a row; any other record before the hello is complete is ``unexpected_message``;
- handshake layer: a message that is not a ClientHello is ``unexpected_message``, one longer than the
  reference's 131,396 bytes (or than the caller's byte limit) ``illegal_parameter``, on its 4-byte header;
- the hello itself: framing errors are ``decode_error``; a second server_name or ALPN extension
  ``illegal_parameter``; server_name and ALPN contents are checked as the reference checks them.

``legacy_version`` and the other extensions are not judged here: the TLS server that terminates the
connection (OpenSSL at L7, the backend at L4) answers them as it would without a proxy in front.
"""

from __future__ import annotations

from dataclasses import dataclass

RECORD_HEADER = 5
CONTENT_CHANGE_CIPHER_SPEC = 0x14
CONTENT_HANDSHAKE = 0x16
HANDSHAKE_CLIENT_HELLO = 0x01
EXT_SERVER_NAME = 0x0000
EXT_ALPN = 0x0010
MAX_RECORD_PAYLOAD = 16384  # RFC 8446 §5.1: 2^14 bytes of plaintext; the reference refuses 2^14 + 1 on the header
MAX_EMPTY_RECORDS = 32  # OpenSSL's MAX_EMPTY_RECORDS: the 33rd empty record in a row is unexpected_message
MAX_CLIENT_HELLO = 131396  # OpenSSL's CLIENT_HELLO_MAX_LENGTH (message body bytes)
MAX_HOST_NAME = 255  # OpenSSL's TLSEXT_MAXLEN_host_name
TLS12 = 0x0303  # the record version the reference frames its alerts with, unless it echoes the client's

ALERT_UNEXPECTED_MESSAGE = 10
ALERT_RECORD_OVERFLOW = 22
ALERT_ILLEGAL_PARAMETER = 47
ALERT_DECODE_ERROR = 50
ALERT_PROTOCOL_VERSION = 70
ALERT_UNRECOGNIZED_NAME = 112


class ClientHelloError(ValueError):
    """The bytes are not a well-formed TLS ClientHello. ``alert`` is the fatal alert the reference sends for
    the same bytes before closing (None: it closes without one); ``version`` the record version of that
    alert record."""

    def __init__(self, message: str, alert: int | None = None, version: int = TLS12) -> None:
        super().__init__(message)
        self.alert = alert
        self.version = version

    def alert_bytes(self) -> bytes:
        """The alert record to send before closing; b"" when the reference sends none."""
        return b"" if self.alert is None else alert_record(self.alert, self.version)


class BadRecordVersion(ClientHelloError):
    """A record whose legacy version major is not 3."""


class HelloTooLarge(ClientHelloError):
    """A ClientHello longer than the caller buffers (or than the reference accepts)."""


def alert_record(description: int, version: int = TLS12) -> bytes:
    """A plaintext fatal alert record, framed as OpenSSL frames it before version negotiation ends."""
    return bytes((0x15, version >> 8, version & 0xFF, 0, 2, 2, description))


def truncated() -> ClientHelloError:
    """The peer ended the connection (FIN) before its ClientHello was complete, however much it had sent
    (nothing at all included): the reference answers ``decode_error`` ("unexpected eof while reading")."""
    return ClientHelloError("connection ended before the ClientHello was complete", ALERT_DECODE_ERROR)


@dataclass(frozen=True, slots=True)
class Incomplete:
    missing: int  # at least this many more bytes are needed


class ClientHello:
    """What a router needs of a ClientHello. Made once per connection, so a plain class: compiled, a C struct
    with read-only fields (``clienthello.pxd``); a frozen dataclass's generated ``__init__`` cost more than
    the parse of a PQ hello's extensions."""

    __slots__ = ("alpn", "size", "sni")

    def __init__(self, sni: str | None, alpn: tuple[str, ...], size: int) -> None:
        self.sni = sni  # lower case, no trailing dot; None when the client sent no server_name
        self.alpn = alpn
        self.size = size  # bytes of records that carried the handshake message

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ClientHello):
            return NotImplemented
        return (self.sni, self.alpn, self.size) == (other.sni, other.alpn, other.size)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ClientHello(sni={self.sni!r}, alpn={self.alpn!r}, size={self.size!r})"


def _min_wire(body_len: int) -> int:
    """The fewest bytes a handshake message of ``body_len`` takes on the wire: in maximal records."""
    msg = 4 + body_len
    return msg + RECORD_HEADER * ((msg + MAX_RECORD_PAYLOAD - 1) // MAX_RECORD_PAYLOAD)


def parse(buf: bytes, limit: int = 1 << 20) -> ClientHello | Incomplete:
    """Parse the ClientHello at the start of ``buf``; ``Incomplete`` if more bytes are needed.

    ``limit``: the most bytes the caller will ever hand over (its peek buffer). A hello that cannot be complete
    within it is refused with ``HelloTooLarge`` as soon as that is known: from the message's length when its
    header arrives, else when ``buf`` reaches ``limit`` without the hello's end."""
    n = len(buf)
    pos = 0
    empty = 0  # empty records in a row
    msg = b""
    while True:
        if n - pos < RECORD_HEADER:
            # judge what we have of the header early: garbage (an HTTP request, a scanner) should not wait
            if n - pos > 1 and buf[pos + 1] != 3:
                raise _bad_version(buf, pos)
            return _incomplete(n, limit, RECORD_HEADER - (n - pos))
        ctype = buf[pos]
        if buf[pos + 1] != 3:
            raise _bad_version(buf, pos)
        length = (buf[pos + 3] << 8) | buf[pos + 4]
        if length > MAX_RECORD_PAYLOAD:
            raise ClientHelloError(f"record length {length} over 2^14", ALERT_RECORD_OVERFLOW)
        end = pos + RECORD_HEADER + length
        if end > n:
            return _incomplete(n, limit, end - n)  # a record is judged once it is whole, as the reference does
        if length == 0 and (
            ctype == CONTENT_HANDSHAKE or (ctype == CONTENT_CHANGE_CIPHER_SPEC and len(msg) < 4)
        ):
            empty += 1
            if empty > MAX_EMPTY_RECORDS:
                raise ClientHelloError("too many empty records", ALERT_UNEXPECTED_MESSAGE)
            pos = end
            continue
        if ctype != CONTENT_HANDSHAKE:
            # the reference frames this one alert with the offending record's version, except for a CCS
            version = TLS12 if ctype == CONTENT_CHANGE_CIPHER_SPEC else (buf[pos + 1] << 8) | buf[pos + 2]
            raise ClientHelloError(f"record type {ctype:#x} before the ClientHello", ALERT_UNEXPECTED_MESSAGE, version)
        empty = 0
        at = pos + RECORD_HEADER
        if not msg and end - at >= 4:
            # the usual case, a message header in the first record: read the body where it lies, no copy
            body_len = _message_length(buf, at, limit)
            if end - at >= 4 + body_len:
                return _parse_body(buf, at + 4, at + 4 + body_len, end)
        msg += buf[at:end]
        pos = end
        if len(msg) >= 4:
            body_len = _message_length(msg, 0, limit)
            if len(msg) >= 4 + body_len:
                return _parse_body(msg, 4, 4 + body_len, pos)


def _message_length(data: bytes, at: int, limit: int) -> int:
    """The body length in the handshake header at ``data[at:at + 4]``, once the type and size are judged."""
    if data[at] != HANDSHAKE_CLIENT_HELLO:
        raise ClientHelloError(f"handshake type {data[at]} is not ClientHello", ALERT_UNEXPECTED_MESSAGE)
    body_len = (data[at + 1] << 16) | (data[at + 2] << 8) | data[at + 3]
    if body_len > MAX_CLIENT_HELLO:
        raise HelloTooLarge(f"ClientHello of {body_len} bytes", ALERT_ILLEGAL_PARAMETER)
    if _min_wire(body_len) > limit:
        raise HelloTooLarge(f"ClientHello of {body_len} bytes over the limit", ALERT_ILLEGAL_PARAMETER)
    return body_len


def _incomplete(have: int, limit: int, missing: int) -> Incomplete:
    if have >= limit:
        # the hello is split into so many records that it does not fit the caller's buffer
        raise HelloTooLarge(f"ClientHello not complete within {limit} bytes", ALERT_ILLEGAL_PARAMETER)
    return Incomplete(missing)


def _bad_version(buf: bytes, pos: int) -> ClientHelloError:
    # As OpenSSL's record layer: the first record with a foreign version does not look like TLS at all (an
    # HTTP request, a scanner, an SSLv2-format hello) and is closed without an alert; a later record of a
    # hello is a TLS peer speaking nonsense and gets protocol_version. Counted as a bad version when the
    # record says handshake, as garbage otherwise.
    if pos > 0:
        return BadRecordVersion("record version major is not 3", ALERT_PROTOCOL_VERSION)
    if buf[0] == CONTENT_HANDSHAKE:
        return BadRecordVersion("handshake record with a version major other than 3")
    return ClientHelloError("not a TLS record")


def _decode_error(what: str) -> ClientHelloError:
    return ClientHelloError(what, ALERT_DECODE_ERROR)


def _vec(buf: bytes, pos: int, width: int, limit: int) -> tuple[int, int]:
    """(start, end) of the ``width``-byte length-prefixed vector at ``pos``, within ``buf[:limit]``."""
    start = pos + width
    if start > limit:
        raise _decode_error("field runs past the end of the ClientHello")
    end = start + (buf[pos] if width == 1 else (buf[pos] << 8) | buf[pos + 1])
    if end > limit:
        raise _decode_error("field runs past the end of the ClientHello")
    return start, end


def _parse_body(data: bytes, first: int, n: int, size: int) -> ClientHello:
    # The body is data[first:n], read by offset (no slice is copied). Plain index arithmetic over bytes: this
    # runs for every connection, and a reader object with a method call per field cost more than the rest of
    # the routing decision.
    # legacy_version (2) and random (32) are not judged: with supported_versions the version is ignored
    # (RFC 8446 §4.2.1), without it the terminating TLS server refuses it as it would without the proxy
    start, end = _vec(data, first + 34, 1, n)  # session id
    if end - start > 32:
        raise _decode_error("session id longer than 32 bytes")
    start, end = _vec(data, end, 2, n)  # cipher suites
    if end - start < 2 or (end - start) % 2:
        raise _decode_error("bad cipher_suites length")
    start, end = _vec(data, end, 1, n)  # compression methods
    if end == start:
        raise _decode_error("no compression methods")
    if end == n:
        return ClientHello(None, (), size)  # no extensions at all (pre-TLS 1.2 style)
    pos, ext_end = _vec(data, end, 2, n)
    if ext_end != n:
        raise _decode_error("trailing bytes after extensions")
    # The whole list is framed (and duplicates found) before any content is judged, as the reference does.
    sni_at = alpn_at = -1
    sni_end = alpn_end = 0
    while pos < ext_end:
        # type (2) and length (2), then the data: _vec's framing written out, as it runs for each extension
        start = pos + 4
        if start > ext_end:
            raise _decode_error("field runs past the end of the ClientHello")
        etype = (data[pos] << 8) | data[pos + 1]
        pos = start + ((data[pos + 2] << 8) | data[pos + 3])
        if pos > ext_end:
            raise _decode_error("field runs past the end of the ClientHello")
        if etype == EXT_SERVER_NAME:
            if sni_at >= 0:
                raise ClientHelloError("duplicate server_name extension", ALERT_ILLEGAL_PARAMETER)
            sni_at, sni_end = start, pos
        elif etype == EXT_ALPN:
            if alpn_at >= 0:
                raise ClientHelloError("duplicate ALPN extension", ALERT_ILLEGAL_PARAMETER)
            alpn_at, alpn_end = start, pos
    sni = _server_name(data, sni_at, sni_end) if sni_at >= 0 else None
    alpn = _alpn(data, alpn_at, alpn_end) if alpn_at >= 0 else ()
    return ClientHello(sni, alpn, size)


def _server_name(data: bytes, first: int, last: int) -> str:
    # The extension is data[first:last]. As the reference: exactly one entry, of type host_name, and nothing
    # after it (RFC 6066 allows other name types, but none was ever defined and OpenSSL refuses them).
    pos, end = _vec(data, first, 2, last)
    if end != last or pos == end:
        raise _decode_error("bad server_name list")
    if data[pos] != 0:
        raise _decode_error("server name type is not host_name")
    start, pos = _vec(data, pos + 1, 2, end)
    if pos != end:
        raise _decode_error("more than one server name")
    return _hostname(data, start, end)


def _hostname(data: bytes, start: int, end: int) -> str:
    """The name in data[start:end], lower case and without its trailing dot, or the alert for it.

    Over 255 bytes or with a NUL the reference answers unrecognized_name; it serves any other bytes (it has no
    names to choose between). A router does: a name that cannot be a DNS hostname (labels of 1 to 63 letters,
    digits, "_" or "-", joined by single dots) gets the same alert. One pass over the bytes, which the
    compiled build runs as a C loop: this runs for every connection."""
    if end - start > MAX_HOST_NAME:
        raise ClientHelloError("server name too long or with a NUL", ALERT_UNRECOGNIZED_NAME)
    if end > start and data[end - 1] == 0x2E:  # one trailing dot (a NUL or a non-ASCII byte is never one)
        end -= 1
    nul = non_ascii = False
    dns = 0 < end - start <= 253
    label = 0
    after_dot = True  # at the start, a dot would open an empty label
    for i in range(start, end):
        c = data[i]
        if c == 0x2E:
            if after_dot:
                dns = False  # a leading dot, or two in a row
            after_dot = True
            label = 0
            continue
        after_dot = False
        label += 1
        if label > 63:
            dns = False
        if 0x61 <= c <= 0x7A or 0x41 <= c <= 0x5A or 0x30 <= c <= 0x39 or c == 0x5F or c == 0x2D:
            continue
        dns = False
        if c == 0:
            nul = True
        elif c > 0x7F:
            non_ascii = True
    if after_dot:
        dns = False  # empty, or a second trailing dot
    if nul:
        raise ClientHelloError("server name too long or with a NUL", ALERT_UNRECOGNIZED_NAME)
    if non_ascii:
        raise ClientHelloError("server name is not ASCII", ALERT_UNRECOGNIZED_NAME)
    if not dns:
        raise ClientHelloError("server name is not a DNS hostname", ALERT_UNRECOGNIZED_NAME)
    return data[start:end].decode("ascii").lower()


def _alpn(data: bytes, first: int, last: int) -> tuple[str, ...]:
    # The extension is data[first:last].
    pos, end = _vec(data, first, 2, last)
    if end != last or pos == end:
        raise _decode_error("bad ALPN list")
    out = []
    while pos < end:
        start, pos = _vec(data, pos, 1, end)
        if start == pos:
            raise _decode_error("empty ALPN protocol")
        out.append(data[start:pos].decode("latin-1"))
    return tuple(out)
