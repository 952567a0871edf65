"""workers.timer_queue: many deadlines on one loop timer (the L4 connects' timeouts), on a real uvloop loop."""

from __future__ import annotations

import asyncio

import uvloop

from workers.timer_queue import BATCH, EARLY, TimerQueue


def _run(main) -> None:
    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(main(loop))
    finally:
        loop.close()


def test_deadlines_run_in_order_never_early_and_a_cancelled_one_never():
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        timers = TimerQueue(loop)
        ran: list[tuple[str, float]] = []
        last = loop.create_future()
        t0 = loop.time()
        whens = {"a": t0 + 0.05, "b": t0 + 0.06, "c": t0 + 0.12}
        timers.at(whens["a"], lambda: ran.append(("a", loop.time())))
        timers.at(whens["b"], lambda: ran.append(("b", loop.time()))).cancel()
        timers.at(whens["c"], lambda: (ran.append(("c", loop.time())), last.set_result(None)))
        await asyncio.wait_for(last, 5)
        assert [name for name, _ in ran] == ["a", "c"]
        for name, at in ran:
            assert at >= whens[name] - EARLY
            assert at <= whens[name] + BATCH + 1.0  # late by at most the batch (and this machine's scheduling)
        assert len(timers) == 0  # the cancelled entry left with its time
        timers.close()

    _run(main)


def test_a_deadline_earlier_than_the_queued_ones_is_not_held_behind_them():
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        timers = TimerQueue(loop)
        early = loop.create_future()
        t0 = loop.time()
        late = timers.at(t0 + 30.0, lambda: None)
        timers.at(t0 + 0.05, lambda: early.set_result(loop.time()))  # a name lookup used part of its budget
        at = await asyncio.wait_for(early, 5)
        assert t0 + 0.05 - EARLY <= at < t0 + 5
        late.cancel()
        timers.close()

    _run(main)


def test_a_callback_that_raises_leaves_the_others_to_run():
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        errors: list[BaseException] = []
        loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx.get("exception")))
        timers = TimerQueue(loop)
        after = loop.create_future()
        t0 = loop.time()

        def bug() -> None:
            raise RuntimeError("a bug")

        timers.at(t0 + 0.02, bug)
        timers.at(t0 + 0.021, lambda: after.set_result(None))
        await asyncio.wait_for(after, 5)
        assert len(errors) == 1 and isinstance(errors[0], RuntimeError)
        timers.close()

    _run(main)


def test_close_drops_every_deadline():
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        timers = TimerQueue(loop)
        ran: list[int] = []
        t0 = loop.time()
        for i in range(3):
            timers.at(t0 + 0.01 * (i + 1), lambda i=i: ran.append(i))
        timers.close()
        done = loop.create_future()
        loop.call_at(t0 + 0.1, done.set_result, None)  # past every deadline: a plain loop timer as the clock
        await asyncio.wait_for(done, 5)
        assert ran == [] and len(timers) == 0

    _run(main)
