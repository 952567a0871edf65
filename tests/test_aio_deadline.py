"""``sentin8.aio_deadline``: a cancellation that arrives just as the call completes still cancels (Python 3.11's
``asyncio.wait_for`` returns the result instead), and one a library swallowed is honoured at the loop's next round
(redis-py's async script calls did: a stopped limiter syncer ran on and a test hung)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from sentin8.aio_deadline import honour_cancel, within


async def _cancel_as_it_completes(bounded) -> str:
    loop = asyncio.get_running_loop()
    call = loop.create_future()
    task = asyncio.create_task(bounded(call, 5.0))
    await asyncio.sleep(0)  # the task now waits on the call
    call.set_result("answer")
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return "cancelled"
    return "swallowed"


def test_a_cancellation_as_the_call_completes_is_kept():
    assert asyncio.run(_cancel_as_it_completes(within)) == "cancelled"


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="asyncio.wait_for keeps it from 3.12 on")
def test_wait_for_on_3_11_swallows_it():  # why within exists
    assert asyncio.run(_cancel_as_it_completes(asyncio.wait_for)) == "swallowed"


def test_the_deadline_raises_timeout_error():
    async def main() -> None:
        await within(asyncio.sleep(5), 0.01)

    with pytest.raises(TimeoutError):
        asyncio.run(main())


def test_a_swallowed_cancellation_is_honoured():
    async def loop_round() -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            pass  # what a library did
        honour_cancel()
        return "ran on"

    async def main() -> str:
        task = asyncio.create_task(loop_round())
        await asyncio.sleep(0)
        task.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            return "stopped"

    assert asyncio.run(main()) == "stopped"

    async def not_cancelled() -> None:
        honour_cancel()  # nothing asked: nothing raised

    asyncio.run(not_cancelled())
