"""Suspect marks: instance id -> suspect-until, written by any worker, read by all.

A fixed open-addressing table of (key, until_µs) pairs. Marks are advisory — the worst a race between two
writers can do is lose or extend one mark by a TTL — so no lock is taken on this path. A full probe window
evicts its earliest-expiring entry: memory stays bounded whatever fails.
"""

from __future__ import annotations

import hashlib

PROBE = 8


def key_of(instance_id: str) -> int:
    k = int.from_bytes(hashlib.blake2b(instance_id.encode(), digest_size=8).digest(), "little")
    return k or 1  # 0 marks an empty slot


class InstanceKeys(dict[str, int]):
    """``key_of`` memoised: the shared tables look an instance up per connection or request, and a hash per
    lookup would cost more than the lookup. ``keys[instance_id]``: a hit is a plain dict lookup (no Python
    call), a miss computes the key. Bounded: a registry that churns ids cannot grow it past 100,000."""

    __slots__ = ()

    def __missing__(self, instance_id: str) -> int:
        if len(self) > 100_000:
            self.clear()
        k = self[instance_id] = key_of(instance_id)
        return k


class SuspectTable:
    def __init__(self, view: memoryview, slots: int) -> None:
        assert slots & (slots - 1) == 0
        self._w = view.cast("Q")
        self._mask = slots - 1
        self._key = InstanceKeys()

    @staticmethod
    def region_bytes(slots: int) -> int:
        return slots * 16

    def mark(self, instance_id: str, until_us: int) -> None:
        w = self._w
        k = self._key[instance_id]
        victim, victim_until = -1, None
        for p in range(PROBE):
            slot = (k + p) & self._mask
            key, until = w[2 * slot], w[2 * slot + 1]
            if key == k:
                victim = slot
                break
            if victim_until is None or until < victim_until:
                victim, victim_until = slot, until
        w[2 * victim + 1] = 0  # never pair the new key with another id's deadline
        w[2 * victim] = k
        w[2 * victim + 1] = until_us

    def clear(self, instance_id: str) -> None:
        w = self._w
        k = self._key[instance_id]
        for p in range(PROBE):
            slot = (k + p) & self._mask
            if w[2 * slot] == k:
                w[2 * slot + 1] = 0

    def suspect_until(self, instance_id: str) -> int:
        w = self._w
        k = self._key[instance_id]
        for p in range(PROBE):
            slot = (k + p) & self._mask
            key = w[2 * slot]
            if key == k:
                return w[2 * slot + 1]
            if key == 0:
                # Keys are never removed and ``mark`` fills the first empty slot of a window before any
                # later one (an empty slot's deadline, 0, is the window's minimum): nothing lies beyond it.
                return 0
        return 0
