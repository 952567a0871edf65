"""workers.task_timeout.TaskTimeout keeps asyncio.timeout's contract on a real uvloop loop: past the delay the
block ends with TimeoutError and the task is left uncancelled; a block that finishes in time is untouched; a
cancel from elsewhere stays a CancelledError, even when it meets the expiry in the same loop turn."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from workers.task_timeout import TaskTimeout


def test_expiry_ends_the_block_with_timeout_error_and_leaves_the_task_uncancelled():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        never = loop.create_future()
        t0 = loop.time()
        with pytest.raises(TimeoutError), TaskTimeout(loop, 0.05):
            await never
        assert loop.time() - t0 >= 0.045  # not before its delay (uvloop's clock and timers have 1 ms steps)
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        await asyncio.sleep(0)  # no cancel left pending for the next await either

    uvloop.run(main())


def test_a_block_done_in_time_is_untouched_and_its_timer_gone():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        loop.call_soon(done.set_result, 7)
        timeout = TaskTimeout(loop, 0.05)
        with timeout:
            assert await done == 7
        await asyncio.sleep(0.1)  # past the delay: a timer left armed would cancel this sleep
        assert not timeout._expired

    uvloop.run(main())


def test_a_cancel_from_elsewhere_stays_a_cancel():
    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def guarded(delay: float) -> None:
            with TaskTimeout(loop, delay):
                await loop.create_future()

        task = loop.create_task(guarded(10.0))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

        # the expiry and an outside cancel in the same turn: the outside one wins
        task = loop.create_task(guarded(0.0))
        await asyncio.sleep(0)  # the task waits inside the block; its timer is due at once
        loop.call_soon(task.cancel)
        with pytest.raises(asyncio.CancelledError):
            await task

    uvloop.run(main())


def test_outside_a_task_it_refuses():
    loop = uvloop.new_event_loop()
    try:
        with pytest.raises(RuntimeError, match="inside a task"), TaskTimeout(loop, 1.0):
            pass
    finally:
        loop.close()
