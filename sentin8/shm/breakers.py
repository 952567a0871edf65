"""Circuit breakers shared by every worker, beside the suspect marks: instance id -> breaker record.

A fixed open-addressing table of ``ENTRY`` words (the key hash, then ``sentin8.breaker``'s record), so one
worker's failures open the breaker for all of them and the half-open probe is one request fleet-wide, not one
per worker. Like the suspect marks it is advisory and takes no lock: two workers recording at the same instant
may lose one increment or both send a probe; neither can wedge an instance (every open state times out). An
instance with no failure has no entry (its successes cost one lookup and no write); a full probe window
evicts its closed, stalest entry.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .. import breaker
from ..breaker import BreakerRules
from .suspects import InstanceKeys

PROBE = 8
ENTRY = 8  # key + breaker.WORDS, padded


def region_bytes(slots: int) -> int:
    return slots * ENTRY * 8


class BreakerTable:
    def __init__(
        self, view: memoryview, slots: int, rules: BreakerRules, clock: Callable[[], float] = time.time
    ) -> None:
        assert slots & (slots - 1) == 0 and breaker.WORDS < ENTRY
        self._w = view.cast("Q")
        self._mask = slots - 1
        self.rules = rules
        self.clock = clock
        self._key = InstanceKeys()

    def _find(self, k: int) -> int:
        w = self._w
        for p in range(PROBE):
            slot = (k + p) & self._mask
            key = w[slot * ENTRY]
            if key == k:
                return slot
            if key == 0:
                return -1  # inserts take the first empty slot and nothing empties one: it is not further on
        return -1

    def _record_view(self, slot: int) -> memoryview:
        base = slot * ENTRY + 1
        return self._w[base : base + breaker.WORDS]

    def _insert(self, k: int, now_us: int) -> int:
        w = self._w
        victim, victim_age = -1, None
        for p in range(PROBE):
            slot = (k + p) & self._mask
            key = w[slot * ENTRY]
            if key == 0:
                victim = slot
                break
            rec = self._record_view(slot)
            if breaker.state(rec, now_us) != breaker.CLOSED:
                continue  # never forget an open breaker for a closed one
            age = rec[breaker.WINDOW_START]
            if victim_age is None or age < victim_age:
                victim, victim_age = slot, age
        if victim < 0:
            victim = k & self._mask  # every entry is open: overwrite (they all time out anyway)
        base = victim * ENTRY
        w[base] = 0  # never pair the new key with another id's record
        for i in range(1, ENTRY):
            w[base + i] = 0
        w[base + 1 + breaker.WINDOW_START] = now_us
        w[base] = k
        return victim

    def allow(self, instance_id: str) -> bool:
        slot = self._find(self._key[instance_id])
        if slot < 0:
            return True
        return breaker.allow(self._record_view(slot), int(self.clock() * 1e6), self.rules)

    def record(self, instance_id: str, ok: bool) -> str | None:
        """One result from the instance; the transition it caused (``breaker.OPEN`` / ``CLOSED``), if any."""
        k = self._key[instance_id]
        slot = self._find(k)
        if slot < 0:
            if ok:
                return None
            slot = self._insert(k, int(self.clock() * 1e6))
        return breaker.record(self._record_view(slot), ok, int(self.clock() * 1e6), self.rules)

    def state(self, instance_id: str) -> str:
        slot = self._find(self._key[instance_id])
        if slot < 0:
            return breaker.CLOSED
        return breaker.state(self._record_view(slot), int(self.clock() * 1e6))
