"""Concurrent connections per client address, across every worker: the per-client-IP connection cap.

Each worker slot owns one column of counters and is its only writer, so no lock is taken and a killed worker
cannot leave a count behind: the supervisor zeroes the dead slot's column (as it zeroes its gauges). A reader
sums one counter across the columns. Addresses are not stored: each is hashed into ``DEPTH`` rows of
``slots`` counters (a count-min sketch), and the smallest of its row sums is its count. A collision can only
make a count too high, never too low, and needs two addresses to collide in every row at once (rare with
``slots`` well above the number of concurrent clients). Two workers accepting the same address in the same
microsecond may both see room for one: the cap can be exceeded by at most the number of workers, briefly.
"""

from __future__ import annotations

import hashlib

DEPTH = 2


def region_bytes(slots: int, workers: int) -> int:
    return DEPTH * slots * workers * 2  # 16-bit counters


def _rows(ip: str, slots: int) -> tuple[int, ...]:
    h = hashlib.blake2b(ip.encode(), digest_size=8).digest()
    return tuple(int.from_bytes(h[4 * d : 4 * d + 4], "little") % slots for d in range(DEPTH))


class ConnectionCounts:
    """One worker's handle: ``acquire``/``release`` write its own column, ``count`` reads all of them."""

    def __init__(self, view: memoryview, slots: int, workers: int, slot: int | None) -> None:
        assert slots & (slots - 1) == 0
        self._w = view.cast("H")
        self.slots = slots
        self.workers = workers
        self.column = DEPTH * slots  # counters per worker
        self._own = None if slot is None else slot * self.column

    def count(self, ip: str) -> int:
        w, column = self._w, self.column
        best = None
        for d, index in enumerate(_rows(ip, self.slots)):
            at = d * self.slots + index
            total = 0
            for k in range(self.workers):
                total += w[k * column + at]
            if best is None or total < best:
                best = total
        return best or 0

    def acquire(self, ip: str, cap: int) -> bool:
        """Count one more connection from ``ip`` unless it already holds ``cap`` (the caller then refuses it)."""
        if self.count(ip) >= cap:
            return False
        self._add(ip, 1)
        return True

    def release(self, ip: str) -> None:
        self._add(ip, -1)

    def _add(self, ip: str, delta: int) -> None:
        assert self._own is not None, "a reader cannot write"
        w = self._w
        for d, index in enumerate(_rows(ip, self.slots)):
            i = self._own + d * self.slots + index
            w[i] = min(0xFFFF, max(0, w[i] + delta))

    def zero_column(self, slot: int) -> None:
        """The supervisor, when the worker in ``slot`` died: its connections died with it."""
        start = slot * self.column
        self._w[start : start + self.column] = memoryview(bytes(self.column * 2)).cast("H")
