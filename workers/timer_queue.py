"""Many deadlines on one loop timer: the L4 path's connect timeouts without a uvloop timer each.

A uvloop ``call_at`` builds a TimerHandle and a libuv timer, and its ``cancel`` tears them down again: with the
bound method and the rounding of the delay, ~16k instructions of the ~166k a new L4 connection cost the worker
(``bench.profile.l4``). Nearly every such deadline is cancelled (a backend answers a connect in microseconds),
so here a deadline is an entry in a queue and its cancel a flag. The timeouts are one configured length, so
deadlines arrive in time order and the queue is a FIFO. One loop timer is armed for the head; when it fires it
runs what is due, drops what was cancelled, and re-arms for the next head but no sooner than ``BATCH`` later
(re-arming at each head would be one loop timer per connection again, one timeout later). A deadline earlier
than the last one queued (a connect whose budget a name lookup already used) gets a loop timer of its own: order
is never assumed where it does not hold. A cancelled entry leaves the queue when its time comes, so the queue
holds at most one timeout's worth of deadlines.

Invariant: a callback runs at most once, never after its entry's ``cancel``, never more than ``EARLY`` (the loop
timer's millisecond resolution) before its time, and at most ``BATCH`` after it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

EARLY = 0.001  # libuv's timers count milliseconds: one may fire up to this much before the asked loop time
BATCH = 0.05  # the most a deadline runs late: a connect timeout is seconds, its lateness 50 ms at most


class TimerEntry:
    """One queued deadline; ``cancel`` before it is due and its callback never runs."""

    __slots__ = ("callback", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback: Callable[[], None] | None = callback

    def cancel(self) -> None:
        self.callback = None


class TimerQueue:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._queue: deque[TimerEntry] = deque()
        self._timer: asyncio.TimerHandle | None = None  # armed while the queue holds anything

    def at(self, when: float, callback: Callable[[], None]) -> TimerEntry | asyncio.TimerHandle:
        """Call ``callback`` at loop time ``when`` unless the returned handle is cancelled first."""
        queue = self._queue
        if queue and when < queue[-1].when:
            return self.loop.call_at(when, callback)  # out of order: never queued behind a later deadline
        entry = TimerEntry(when, callback)
        queue.append(entry)
        if self._timer is None:
            self._timer = self.loop.call_at(when, self._fire)
        return entry

    def __len__(self) -> int:
        """Deadlines queued, cancelled ones included until their time."""
        return len(self._queue)

    def _fire(self) -> None:
        self._timer = None
        queue = self._queue
        due = self.loop.time() + EARLY
        try:
            while queue and queue[0].when <= due:
                entry = queue.popleft()
                callback = entry.callback
                if callback is not None:
                    entry.callback = None
                    callback()
        finally:  # a callback that raised leaves the rest queued and the timer armed for them
            if queue and self._timer is None:
                self._timer = self.loop.call_at(max(queue[0].when, due + BATCH), self._fire)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._queue.clear()
