"""The routing snapshot: one writer (the resolver), many readers (workers, mgmt), a seqlock double buffer.

Layout (8-byte words, then the two data areas)::

    word 0            generation: number of publications; buffer = generation & 1 is the live one
    words 1..4        buffer 0: sequence (odd while being written), length, crc32, publish time (µs)
    words 5..8        buffer 1: same
    [128, 128+cap)    buffer 0 data
    [128+cap, ...)    buffer 1 data

The writer fills the inactive buffer under an odd sequence, makes it even, then bumps the generation.
A reader copies the live buffer and accepts the copy only if the sequence was even and unchanged around the
copy and the crc matches: Python gives no memory-ordering guarantees, so the crc is the final word on a torn
copy, and a torn copy is retried, never used.
"""

from __future__ import annotations

import time
import zlib

HEADER_BYTES = 128
_GEN = 0


class SnapshotTooLarge(Exception):
    pass


def region_bytes(capacity: int) -> int:
    return HEADER_BYTES + 2 * capacity


def _words(buf: int) -> tuple[int, int, int, int]:
    base = 1 + 4 * buf
    return base, base + 1, base + 2, base + 3


class SnapshotWriter:
    def __init__(self, view: memoryview, capacity: int) -> None:
        self._raw = view
        self._w = view[:HEADER_BYTES].cast("Q")
        self.capacity = capacity

    def publish(self, data: bytes) -> int:
        """Publish ``data``; returns the new generation. Too large = error, the live snapshot stays."""
        n = len(data)
        if n > self.capacity:
            raise SnapshotTooLarge(
                f"routing snapshot is {n} bytes, shm.snapshot_bytes is {self.capacity}: raise shm.snapshot_bytes"
            )
        w = self._w
        gen = w[_GEN]
        buf = (gen + 1) & 1
        seq, length, crc, stamp = _words(buf)
        start = HEADER_BYTES + buf * self.capacity
        w[seq] = w[seq] + 1  # odd: readers of this buffer retry
        self._raw[start : start + n] = data
        w[length] = n
        w[crc] = zlib.crc32(data)
        w[stamp] = int(time.time() * 1e6)
        w[seq] = w[seq] + 1  # even: consistent again
        w[_GEN] = gen + 1
        return gen + 1


class SnapshotReader:
    def __init__(self, view: memoryview, capacity: int) -> None:
        self._raw = view
        self._w = view[:HEADER_BYTES].cast("Q")
        self.capacity = capacity
        self.torn_reads = 0  # copies rejected by the sequence or crc check (observability for the stress test)

    def generation(self) -> int:
        return self._w[_GEN]

    def read(self, max_attempts: int = 1000) -> tuple[int, bytes, float] | None:
        """(generation, data, published_at) of a consistent copy, or None if nothing was ever published."""
        w = self._w
        for _ in range(max_attempts):
            gen = w[_GEN]
            if gen == 0:
                return None
            buf = gen & 1
            seq, length, crc, stamp = _words(buf)
            s1 = w[seq]
            if s1 & 1:
                self.torn_reads += 1
                continue
            n = w[length]
            expected = w[crc]
            published = w[stamp] / 1e6
            if n > self.capacity:
                self.torn_reads += 1
                continue
            start = HEADER_BYTES + buf * self.capacity
            data = bytes(self._raw[start : start + n])
            if w[seq] != s1 or zlib.crc32(data) != expected:
                self.torn_reads += 1
                continue
            return gen, data, published
        raise RuntimeError("routing snapshot: no consistent copy after many attempts (writer stuck?)")


class SnapshotCache:
    """A worker's view of the live routing table: checks the generation word per connection (one shared
    read) and decodes only when it moved."""

    def __init__(self, reader: SnapshotReader, decode) -> None:
        self._reader = reader
        self._decode = decode
        self._gen = -1
        self.table = None
        self.published_at = 0.0
        self.decodes = 0

    def current(self):
        if self._reader.generation() != self._gen:
            got = self._reader.read()
            if got is not None:
                gen, data, published = got
                self.table = self._decode(data)
                self._gen = gen
                self.published_at = published
                self.decodes += 1
        return self.table
