"""Service names <-> small integer indexes, in shared memory, fixed for the fleet's life.

Workers count per service in slots numbered by these indexes (never a dict keyed by strings on the request
path); readers (publisher, Prometheus) name a slot by reading this table. The resolver is the only writer: it
gives each new service the next free index when it publishes a routing table, and an index is never reused or
renamed, so a count can never move from one service to another. The table lives in shared memory, not in the
resolver, so a respawned resolver continues it.

Index 0 is ``_none`` (a request answered before any service was resolved: 400, 421, ...), index 1 is
``_other`` (services beyond ``shm.metrics_services``, or names too long for a slot): the table is bounded and
an overflow is counted there, never dropped.

Layout: word 0 = number of names in use; then ``capacity`` slots of ``NAME_BYTES`` (2-byte length + UTF-8).
A slot is written completely before the count that publishes it is raised.
"""

from __future__ import annotations

from collections.abc import Iterable

from .region import align

NAME_BYTES = 128
HEADER_BYTES = 64
NONE_INDEX = 0
OTHER_INDEX = 1
RESERVED = ("_none", "_other")


def region_bytes(capacity: int) -> int:
    return align(HEADER_BYTES + capacity * NAME_BYTES)


class ServiceNames:
    def __init__(self, view: memoryview, capacity: int) -> None:
        self._raw = view
        self._w = view[:HEADER_BYTES].cast("Q")
        self.capacity = capacity
        self._known: dict[str, int] = {}  # the writer's cache of the table
        self._cached = 0

    def initialize(self) -> None:
        """Write the reserved names; called once by the supervisor before any fork."""
        if self._w[0] == 0:
            for name in RESERVED:
                self._append(name)

    def count(self) -> int:
        return self._w[0]

    def names(self) -> list[str]:
        """Every name in use, by index."""
        n = min(self._w[0], self.capacity)
        out = []
        for i in range(n):
            start = HEADER_BYTES + i * NAME_BYTES
            length = int.from_bytes(self._raw[start : start + 2], "little")
            out.append(bytes(self._raw[start + 2 : start + 2 + length]).decode("utf-8", "replace"))
        return out

    def _append(self, name: str) -> int:
        i = self._w[0]
        data = name.encode("utf-8")
        start = HEADER_BYTES + i * NAME_BYTES
        self._raw[start : start + 2] = len(data).to_bytes(2, "little")
        self._raw[start + 2 : start + 2 + len(data)] = data
        self._w[0] = i + 1  # publish after the bytes are in place
        return i

    def assign(self, services: Iterable[str]) -> dict[str, int]:
        """Index of each service, giving new ones the next free slot (the resolver only). Overflowing and
        over-long names map to ``_other``."""
        if self._cached != self._w[0]:
            self._known = {name: i for i, name in enumerate(self.names())}
            self._cached = len(self._known)
        out: dict[str, int] = {}
        for name in services:
            i = self._known.get(name)
            if i is None:
                if len(name.encode("utf-8")) > NAME_BYTES - 2 or self._w[0] >= self.capacity or name in RESERVED:
                    out[name] = OTHER_INDEX
                    continue
                i = self._append(name)
                self._known[name] = i
                self._cached = self._w[0]
            out[name] = i
        return out
