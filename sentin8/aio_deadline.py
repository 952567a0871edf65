"""For the loops that are stopped by cancellation (the resolver's cluster syncers, the management process's policy
syncer): a bounded await that keeps the cancellation (``within``), and a check that honours one a library swallowed
(``honour_cancel``).

Not ``asyncio.wait_for``: on Python 3.11 it returns the call's result instead of raising ``CancelledError`` when
the cancellation arrives just as the call completes (fixed in 3.12), so a syncer being stopped, whose Valkey round
trips never pause, can swallow its cancellation and run on: the task that awaits it (a process's shutdown, a test)
then waits forever. ``asyncio.timeout`` keeps the cancellation and raises ``TimeoutError`` past the deadline, as
``wait_for`` does.

redis-py 8's async commands can also return their reply although the task was cancelled during the call (measured:
a limiter syncer's script call, a few times in ten stops); the task then has ``cancelling()`` set and no
exception. Each loop calls ``honour_cancel`` once per round, so a stop takes effect at the next interval at most.
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


def honour_cancel() -> None:
    """``CancelledError`` if this task was asked to stop and the request got lost on the way (see above)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
