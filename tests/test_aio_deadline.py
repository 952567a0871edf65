"""``sentin8.aio_deadline.within``: a cancellation that arrives just as the call completes still cancels (Python
3.11's ``asyncio.wait_for`` returns the result instead, and a syncer being stopped ran on: a resolver test hung)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from sentin8.aio_deadline import within


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
