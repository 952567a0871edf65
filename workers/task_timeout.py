"""``asyncio.timeout``'s contract for the data path, without its price.

``async with asyncio.timeout(s)`` runs two Python-level coroutines (``__aenter__``, ``__aexit__``) around the
block: ~15k of the ~100k user-space instructions of a new upstream connection (callgrind,
``bench.profile.keepalive --h2 100 --pool 16``; bench/README.md). ``TaskTimeout`` is a plain context manager doing the
same thing with one loop timer: past the delay it cancels the task running the block, and the block's
``CancelledError`` leaves it as ``TimeoutError``. A cancel from elsewhere in the meantime (the exchange given
up, a worker stopping) still leaves as ``CancelledError``: the task's cancel count (``Task.cancelling`` /
``uncancel``) tells the two apart, exactly as ``asyncio.timeout`` does.

    with TaskTimeout(loop, seconds):   # in a task; a sync ``with`` may span awaits
        await something()

The timer can only fire while the task waits inside the block: leaving it cancels the timer in the same step.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class TaskTimeout:
    __slots__ = ("_cancelling", "_delay", "_expired", "_handle", "_loop", "_task")

    def __init__(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        self._loop = loop
        self._delay = delay
        self._expired = False
        self._task: asyncio.Task | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._cancelling = 0

    def __enter__(self) -> TaskTimeout:
        task = asyncio.current_task(self._loop)
        if task is None:
            raise RuntimeError("TaskTimeout must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._handle = self._loop.call_later(self._delay, self._expire)
        return self

    def _expire(self) -> None:
        self._expired = True
        assert self._task is not None
        self._task.cancel()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.cancel()
        if self._expired:
            task = self._task
            assert task is not None
            # ours was the cancel (no other came since the block began) and it is what ended the block
            if task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc
