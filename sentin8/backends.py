"""A worker's view of its backends, for the L4 pipe and the L7 bridge alike. Sans-IO.

Both paths do the same things: resolve a name against the current routing snapshot, ask for the instances of
a service in the order to try them, report an instance that could not be reached, and report each result to
the instance's circuit breaker. The rules live here once (and are counted once, under the same names for
both paths); the connects themselves are I/O and stay in ``workers/`` (``workers.connect`` for L4,
``workers.upstream`` for L7).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from . import refusals
from .breaker import CLOSED, OPEN
from .eventlog import event
from .refusals import Refusal
from .routing import Instance, Route, RoutingTable
from .selection import Selector


class RoutesSource(Protocol):
    def current(self) -> RoutingTable | None: ...  # None until the first snapshot


class Counters(Protocol):
    def inc(self, name: str, n: int = 1) -> None: ...
    def refused(self, refusal: Refusal) -> None: ...


class Breakers(Protocol):
    """Per-instance circuit breakers (``sentin8.shm.breakers.BreakerTable``)."""

    def allow(self, instance_id: str) -> bool: ...
    def record(self, instance_id: str, ok: bool) -> str | None: ...  # the state it moved to, if it moved


class Backends:
    """Routing lookups, candidate order and failure marks over one routing source and one selector.

    Counters: ``all_suspect_fallback`` (every eligible instance is suspect: they are tried anyway, failing
    over beats failing), ``backend_connect_errors`` (one per instance that could not be reached, TCP or TLS,
    either path). A failure marks the instance suspect in shared memory, so every worker tries it last for
    ``sources.suspect_ttl_s``. With ``breakers`` (``[breaker] enabled``), an instance whose breaker is open is
    left out of the candidates (``breaker_skipped``; all of them: ``refused_breaker_open``, fail fast), and
    every result feeds its breaker (``breaker_opened`` / ``breaker_closed`` and their events).
    """

    def __init__(
        self,
        routes: RoutesSource,
        selector: Selector,
        counters: Counters,
        clock: Callable[[], float] = time.time,
        breakers: Breakers | None = None,
        breaker_open_s: float = 0.0,
    ) -> None:
        self._routes = routes
        self._selector = selector
        self._counters = counters
        self._clock = clock
        self._breakers = breakers
        self._breaker_open_s = breaker_open_s

    def table(self) -> RoutingTable | None:
        """The current routing snapshot (decoded only when the resolver published a new one)."""
        return self._routes.current()

    def resolve(self, hostname: str) -> Route | None:
        table = self._routes.current()
        return table.resolve(hostname) if table is not None else None

    def candidates(self, service: str, table: RoutingTable | None = None) -> list[Instance]:
        """The instances of ``service`` to try, in order: round-robin over the eligible ones, suspects last.
        ``table`` pins the snapshot a route was resolved in; by default the current one."""
        table = table or self._routes.current()
        if table is None:
            return []
        now = self._clock()
        # heartbeats are judged on the table's health clock (it stands still while the registry is unreadable)
        order, all_suspect = self._selector.order(service, table.instances(service), now, table.health_clock(now))
        if all_suspect:
            self._counters.inc("all_suspect_fallback")
        breakers = self._breakers
        if order and breakers is not None:
            if len(order) == 1:  # the common shape: no list built when its breaker lets it through
                if breakers.allow(order[0].id):
                    return order
                allowed = []
            else:
                allowed = [inst for inst in order if breakers.allow(inst.id)]
            if len(allowed) != len(order):
                self._counters.inc("breaker_skipped", len(order) - len(allowed))
                if not allowed:
                    self._counters.refused(refusals.BREAKER_OPEN)  # fail fast: every instance's breaker is open
                order = allowed
        return order

    def failed(self, instance: Instance) -> None:
        """``instance`` could not be reached (connect refused or timed out, TLS handshake failed)."""
        self._counters.inc("backend_connect_errors")
        self._selector.mark_suspect(instance.id, self._clock())
        self.result(instance.id, False)

    def result(self, instance_id: str, ok: bool) -> None:
        """One result from an instance for its circuit breaker: an L4 connect, an L7 connect or response."""
        breakers = self._breakers
        if breakers is None:
            return
        change = breakers.record(instance_id, ok)
        if change == OPEN:
            self._counters.inc("breaker_opened")
            event("breaker_open", "warning", instance=instance_id, open_s=self._breaker_open_s)
        elif change == CLOSED:
            self._counters.inc("breaker_closed")
            event("breaker_closed", instance=instance_id)
