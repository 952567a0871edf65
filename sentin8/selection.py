"""Backend selection (sans-IO): a snapshot's instances, a clock and suspect marks in, an order out."""

from __future__ import annotations

import math
from typing import Protocol

from .routing import Instance


class SuspectMarks(Protocol):
    def suspect_until(self, instance_id: str) -> int: ...  # µs since the epoch; 0 = not suspect

    def mark(self, instance_id: str, until_us: int) -> None: ...


def eligible(instances: list[Instance], now: float, health_fresh_s: float) -> list[Instance]:
    """Active and fresh: judged now, at pick time, not when the snapshot was built."""
    return [i for i in instances if i.state == "Active" and (i.health_ts is None or now - i.health_ts < health_fresh_s)]


def _fresh_until(pool: list[Instance], health_fresh_s: float) -> float:
    """When the first heartbeat of ``pool`` goes stale (inf: none of them has one)."""
    return min((i.health_ts + health_fresh_s for i in pool if i.health_ts is not None), default=math.inf)


class Selector:
    """Round-robin over eligible instances; suspects go last, so when every instance is suspect the order
    is plain round-robin (ARCHITECTURE.md §3 step 5: failing over beats failing)."""

    def __init__(self, marks: SuspectMarks, health_fresh_s: float, suspect_ttl_s: float) -> None:
        self.marks = marks
        self.health_fresh_s = health_fresh_s
        self.suspect_ttl_us = int(suspect_ttl_s * 1e6)
        self._next: dict[str, int] = {}
        # service -> (the snapshot's instance list, eligible until, eligible instances): freshness only
        # decays, so the eligible set of one list holds until its first member's heartbeat goes stale
        self._eligible: dict[str, tuple[list[Instance], float, list[Instance]]] = {}

    def _eligible_now(self, service: str, instances: list[Instance], now: float) -> list[Instance]:
        hit = self._eligible.get(service)
        if hit is not None and hit[0] is instances and now < hit[1]:
            return hit[2]
        pool = eligible(instances, now, self.health_fresh_s)
        until = _fresh_until(pool, self.health_fresh_s)
        if len(self._eligible) > 100_000:
            self._eligible.clear()
        self._eligible[service] = (instances, until, pool)
        return pool

    def order(
        self, service: str, instances: list[Instance], now: float, health_now: float | None = None
    ) -> tuple[list[Instance], bool]:
        """(candidates in the order to try, whether every candidate is suspect). ``health_now`` is the clock
        heartbeats are judged against (``RoutingTable.health_clock``: it stands still while the registry is
        unreadable); suspect marks are always judged at ``now``. The list may be shared with later calls:
        read it, never mutate it."""
        pool = self._eligible_now(service, instances, now if health_now is None else health_now)
        n = len(pool)
        now_us = int(now * 1e6)
        suspect_until = self.marks.suspect_until
        if n <= 1:  # the common shape (one instance per service): no rotation, no new list
            return pool, n == 1 and suspect_until(pool[0].id) > now_us
        start = self._next.get(service, 0) % n
        self._next[service] = start + 1
        rotated = pool[start:] + pool[:start]
        suspect = [suspect_until(i.id) > now_us for i in rotated]
        if not any(suspect):
            return rotated, False
        healthy = [i for i, s in zip(rotated, suspect, strict=True) if not s]
        return healthy + [i for i, s in zip(rotated, suspect, strict=True) if s], not healthy

    def mark_suspect(self, instance_id: str, now: float) -> None:
        self.marks.mark(instance_id, int(now * 1e6) + self.suspect_ttl_us)
