"""Just enough RFC 6455 for an echo round trip: the opening handshake and small unfragmented frames.

Works over anything with ``recv(n)`` and ``sendall(data)``: a plain socket or a pyOpenSSL connection.
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct
from typing import Protocol

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_TEXT, OP_BINARY, OP_CLOSE = 0x1, 0x2, 0x8


class Stream(Protocol):
    def recv(self, n: int) -> bytes: ...
    def sendall(self, data: bytes) -> object: ...


class Reader:
    """Buffered exact reads over a Stream (TLS records and TCP segments do not align with frames)."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.buf = bytearray()

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.stream.recv(65536)
            if not chunk:
                raise ConnectionError("peer closed mid-frame")
            self.buf += chunk
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def until(self, marker: bytes, cap: int = 65536) -> bytes:
        while (i := self.buf.find(marker)) < 0:
            if len(self.buf) > cap:
                raise ConnectionError("header block too large")
            chunk = self.stream.recv(65536)
            if not chunk:
                raise ConnectionError("peer closed in the header block")
            self.buf += chunk
        out = bytes(self.buf[: i + len(marker)])
        del self.buf[: i + len(marker)]
        return out


def accept_key(key: bytes) -> bytes:
    return base64.b64encode(hashlib.sha1(key + _GUID).digest())


def client_handshake(stream: Stream, reader: Reader, host: str, path: str = "/ws") -> None:
    key = base64.b64encode(os.urandom(16))
    stream.sendall(
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key.decode()}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = reader.until(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 101"):
        status = head.split(b"\r\n", 1)[0]
        raise ConnectionError(f"no upgrade: {status!r}")
    if accept_key(key) not in head:
        raise ConnectionError("bad Sec-WebSocket-Accept")


def server_handshake(stream: Stream, reader: Reader) -> None:
    head = reader.until(b"\r\n\r\n")
    key = b""
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"sec-websocket-key":
            key = value.strip()
    if not key:
        stream.sendall(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        raise ConnectionError("not a websocket upgrade")
    stream.sendall(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + accept_key(key) + b"\r\n\r\n"
    )


def _xor(data: bytes, mask: bytes) -> bytes:
    # one big-int XOR instead of a per-byte loop
    n = len(data)
    full = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(full, "little")).to_bytes(n, "little")


def frame(opcode: int, payload: bytes, masked: bool) -> bytes:
    n = len(payload)
    head = bytes([0x80 | opcode])
    bit = 0x80 if masked else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 1 << 16:
        head += bytes([bit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", n)
    if masked:
        mask = os.urandom(4)
        return head + mask + _xor(payload, mask)
    return head + payload


def read_frame(reader: Reader) -> tuple[int, bytes]:
    b0, b1 = reader.exact(2)
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack("!H", reader.exact(2))[0]
    elif n == 127:
        n = struct.unpack("!Q", reader.exact(8))[0]
    mask = reader.exact(4) if b1 & 0x80 else b""
    payload = reader.exact(n)
    return b0 & 0x0F, _xor(payload, mask) if mask else payload
