"""Used management-token ``jti`` values in shared memory: a replay stays refused after the management
process is killed and respawned.

A ring of ``capacity`` (hash, expiry) pairs after one count word; the oldest entry is overwritten first (the
bounded FIFO of the JWT rules). One writer at a time: the management process, of which the supervisor runs
exactly one. It rebuilds a local hash -> position index from the ring when it starts, so a lookup is a dict hit.
"""

from __future__ import annotations

import hashlib

CAPACITY = 16_384
_COUNT = 0
_HEADER_WORDS = 8


def region_bytes(capacity: int = CAPACITY) -> int:
    return (_HEADER_WORDS + 2 * capacity) * 8


def jti_hash(jti: str) -> int:
    h = int.from_bytes(hashlib.blake2b(jti.encode(), digest_size=8).digest(), "little")
    return h or 1  # 0 marks an empty entry


class SharedJtiTracker:
    """Same contract as ``sentin8.mgmt.auth.JtiTracker``: ``use`` is False for a jti seen before."""

    def __init__(self, view: memoryview, capacity: int = CAPACITY) -> None:
        self._w = view.cast("Q")
        self.capacity = capacity
        self._index: dict[int, int] = {}
        for pos in range(capacity):
            h = self._w[_HEADER_WORDS + 2 * pos]
            if h:
                self._index[h] = pos

    def __len__(self) -> int:
        return len(self._index)

    def use(self, jti: str, exp: float, now: float) -> bool:
        h = jti_hash(jti)
        if h in self._index:
            return False
        w = self._w
        count = w[_COUNT]
        pos = count % self.capacity
        slot = _HEADER_WORDS + 2 * pos
        old = w[slot]
        if old and self._index.get(old) == pos:
            del self._index[old]
        w[slot + 1] = max(0, int(exp))
        w[slot] = h
        w[_COUNT] = count + 1
        self._index[h] = pos
        return True
