"""Whether a client's HTTP/2 header block is open: the bytes between a HEADERS frame's first byte and the
end of the frame (HEADERS or CONTINUATION) that carries END_HEADERS.

The engine (nghttp2) reports a request only once its block is whole, so a client that sends HEADERS without
END_HEADERS and never the CONTINUATION, or trickles a HEADERS frame a byte at a time, produces no event at all:
h2's slowloris. This watch reads only the 9-byte frame headers of what the client sends (payloads are
skipped by length, so a DATA-heavy read costs one step per frame) and tells the connection when a block
opens and closes, for ``limits.header_timeout_s`` to bound it as it bounds an HTTP/1.1 head.

Invariant: ``open`` is True from the first byte of a HEADERS (or PUSH_PROMISE) frame header until the last
payload byte of the frame with END_HEADERS that ends its block. Bytes past a malformed frame are the
engine's to refuse; the watch only ever over-reports an open block, which the engine's GOAWAY then ends.
"""

from __future__ import annotations

PREFACE_LEN = 24  # "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_HEADERS, _PUSH_PROMISE, _CONTINUATION = 0x1, 0x5, 0x9
_END_HEADERS = 0x4


class HeaderBlockWatch:
    __slots__ = ("_ends", "_head", "_skip", "open")

    def __init__(self) -> None:
        self._skip = PREFACE_LEN  # payload bytes (or the preface) still to pass over
        self._head = b""  # a frame header split across reads
        self._ends = False  # the frame being skipped ends the open block
        self.open = False

    def feed(self, data: bytes | bytearray | memoryview) -> bool:
        """Follow ``data`` (the client's bytes, in order); returns ``open`` after them."""
        view = memoryview(data)
        at, n = 0, len(view)
        while at < n:
            if self._skip:
                step = min(self._skip, n - at)
                self._skip -= step
                at += step
                if not self._skip and self._ends:
                    self._ends = False
                    self.open = False
                continue
            need = 9 - len(self._head)
            chunk = bytes(view[at : at + need])
            at += len(chunk)
            if len(chunk) < need:
                self._head += chunk
                if self._head and self._head_type_opens():
                    self.open = True
                break
            head, self._head = self._head + chunk, b""
            length = int.from_bytes(head[:3], "big")
            kind, flags = head[3], head[4]
            if kind in (_HEADERS, _PUSH_PROMISE):
                self.open = True
            if self.open and kind in (_HEADERS, _PUSH_PROMISE, _CONTINUATION) and flags & _END_HEADERS:
                if length:
                    self._ends = True
                else:
                    self.open = False
            self._skip = length
        return self.open

    def _head_type_opens(self) -> bool:
        """A partial frame header whose type byte has arrived and names HEADERS/PUSH_PROMISE."""
        return len(self._head) > 3 and self._head[3] in (_HEADERS, _PUSH_PROMISE)
