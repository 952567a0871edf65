"""Where routing data comes from: the config file (embedded default), Valkey (registry), PostgreSQL (domains).

A source runner owns the loading and watching and calls ``publish(table)`` whenever the routing table it
would serve changes (new data, or the stale flag flips). The resolver process turns that into shared memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from ..routing import RoutingTable

Publish = Callable[[RoutingTable], None]


class SourceRunner(Protocol):
    async def run(self, publish: Publish, reload: asyncio.Event) -> None:
        """Load, publish, then keep the table current until cancelled. ``reload`` is set on SIGHUP."""
        ...

    def hand_over(self) -> None:
        """The process is stopping and a successor will start from the published table: publish what it needs."""
        ...
