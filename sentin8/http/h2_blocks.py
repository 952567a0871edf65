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
_OPENS = frozenset((_HEADERS, _PUSH_PROMISE))  # frame types that begin a header block
_BLOCK = frozenset((_HEADERS, _PUSH_PROMISE, _CONTINUATION))  # ... and that may end one


class HeaderBlockWatch:
    __slots__ = ("_ends", "_head", "_skip", "open")

    def __init__(self) -> None:
        self._skip = PREFACE_LEN  # payload bytes (or the preface) still to pass over
        self._head = b""  # a frame header split across reads
        self._ends = False  # the frame being skipped ends the open block
        self.open = False

    def feed(self, data: bytes | bytearray | memoryview) -> bool:
        """Follow ``data`` (the client's bytes, in order); returns ``open`` after them. One step per frame
        header: a payload is passed over by its length, never looked at."""
        d = data if isinstance(data, bytes | bytearray) else bytes(data)
        n = len(d)
        at = 0
        if self._skip or self._head:
            at = self._resume(d, n)
            if at < 0:
                return self.open
        opened = self.open
        while at + 9 <= n:
            length = (d[at] << 16) | (d[at + 1] << 8) | d[at + 2]
            kind = d[at + 3]
            if kind in _OPENS:
                opened = True
            if opened and d[at + 4] & _END_HEADERS and kind in _BLOCK:
                if at + 9 + length <= n:
                    opened = False
                else:
                    self._ends = True
            at += 9 + length
        self.open = opened
        if at > n:
            self._skip = at - n
        elif at < n:
            self._head = bytes(d[at:])
            if self._head_type_opens():
                self.open = True
        return self.open

    def _resume(self, d: bytes | bytearray, n: int) -> int:
        """Finish the payload being skipped, or the frame header split across reads; returns where the next
        frame header starts in ``d``, or -1 when ``d`` ends first."""
        at = 0
        if self._skip:
            if self._skip >= n:
                self._skip -= n
                if not self._skip:
                    self._end_skipped()
                return -1
            at, self._skip = self._skip, 0
            self._end_skipped()
            if not self._head:
                return at
        need = 9 - len(self._head)
        if n - at < need:
            self._head += bytes(d[at:])
            if self._head_type_opens():
                self.open = True
            return -1
        head, self._head = self._head + bytes(d[at : at + need]), b""
        self._step(head)
        at += need
        if self._skip:
            if self._skip > n - at:
                self._skip -= n - at
                return -1
            at += self._skip
            self._skip = 0
            self._end_skipped()
        return at

    def _end_skipped(self) -> None:
        if self._ends:
            self._ends = False
            self.open = False

    def _step(self, head: bytes) -> None:
        """One whole frame header (its payload not yet passed)."""
        length = int.from_bytes(head[:3], "big")
        kind, flags = head[3], head[4]
        if kind in _OPENS:
            self.open = True
        if self.open and kind in _BLOCK and flags & _END_HEADERS:
            if length:
                self._ends = True
            else:
                self.open = False
        self._skip = length

    def _head_type_opens(self) -> bool:
        """A partial frame header whose type byte has arrived and names HEADERS/PUSH_PROMISE."""
        return len(self._head) > 3 and self._head[3] in _OPENS
