"""The connections a worker holds, counted so that drain can wait for zero. Sans-IO.

Each accepted connection gets one ``Hold``; whoever ends the connection releases it. Several parties may
believe they end it (the accept task when a hand-off fails half-way, the transport's ``connection_lost``
later), so ``release`` is idempotent by construction: the hold forgets its owner on the first call and a
second call finds nothing to release. The count can therefore never be decremented twice for one connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Gauge(Protocol):
    def add_gauge(self, name: str, delta: int) -> None: ...


class Hold:
    """One connection's share of ``OpenConnections``, plus whatever else the connection holds until it ends
    (``also``: e.g. its place under the per-client connection cap), all released together, once."""

    __slots__ = ("_also", "_owner")

    def __init__(self, owner: OpenConnections) -> None:
        self._owner: OpenConnections | None = owner
        self._also: Callable[[], None] | None = None

    @property
    def released(self) -> bool:
        return self._owner is None

    def also(self, release: Callable[[], None]) -> None:
        """Run ``release`` when this hold is released (one extra release per hold)."""
        assert self._also is None and self._owner is not None
        self._also = release

    def release(self) -> None:
        owner, self._owner = self._owner, None
        if owner is not None:
            also, self._also = self._also, None
            owner.released_one()
            if also is not None:
                also()


class OpenConnections:
    """How many connections are held (any stage), mirrored into the ``open_connections`` gauge.
    ``on_release``, when set, runs after every release (drain checks for zero there)."""

    def __init__(self, gauges: Gauge, on_release: Callable[[], None] | None = None) -> None:
        self._gauges = gauges
        self._on_release = on_release
        self.count = 0

    def notify_releases(self, on_release: Callable[[], None]) -> None:
        """Run ``on_release`` after every release from now on (a worker that starts draining: until then
        nothing waits for zero, and a release costs no call)."""
        self._on_release = on_release

    def hold(self) -> Hold:
        self.count += 1
        self._gauges.add_gauge("open_connections", 1)
        return Hold(self)

    def released_one(self) -> None:
        """Called by ``Hold.release`` only (once per hold)."""
        self.count -= 1
        self._gauges.add_gauge("open_connections", -1)
        if self._on_release is not None:
            self._on_release()
