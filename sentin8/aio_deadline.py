"""One bounded await for the loops that are stopped by cancellation (the resolver's cluster syncers, the management
process's policy syncer): ``within(call, timeout_s)``.

Not ``asyncio.wait_for``: on Python 3.11 it returns the call's result instead of raising ``CancelledError`` when
the cancellation arrives just as the call completes (fixed in 3.12), so a syncer being stopped, whose Valkey round
trips never pause, can swallow its cancellation and run on: the task that awaits it (a process's shutdown, a test)
then waits forever. ``asyncio.timeout`` keeps the cancellation and raises ``TimeoutError`` past the deadline, as
``wait_for`` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(call: Awaitable[T], timeout_s: float) -> T:
    """``await call``, ``TimeoutError`` after ``timeout_s``; a cancellation always propagates."""
    async with asyncio.timeout(timeout_s):
        return await call
