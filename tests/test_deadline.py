"""``workers.deadline``: the one lazily re-armed deadline of a client connection and of a backend connection
(issue 16 item 13: it was written twice). On a real uvloop loop, seen through a proxy that counts the timers
created, so the timer-reuse property is asserted, not assumed."""

from __future__ import annotations

import asyncio

import uvloop

from workers import deadline
from workers.deadline import Deadline
from workers.upstream import UpstreamConn, UpstreamPool


class CountingLoop:
    """A real loop; ``call_at`` counted (each is a new timer handle)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.timers = 0

    def time(self) -> float:
        return self.loop.time()

    def call_at(self, when, callback, *args):
        self.timers += 1
        return self.loop.call_at(when, callback, *args)

    def create_future(self):
        return self.loop.create_future()


def run(main) -> None:
    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(main(CountingLoop(loop)))
    finally:
        loop.close()


async def _sleep_until(loop: CountingLoop, at: float) -> None:
    await asyncio.sleep(max(0.0, at - loop.time()))


def test_a_later_deadline_reuses_the_handle_and_expires_once_at_its_own_time():
    async def main(loop: CountingLoop) -> None:
        fired: list[tuple[int, float]] = []
        d = Deadline(loop, lambda kind: fired.append((kind, loop.time())))
        t0 = loop.time()
        d.arm(deadline.HEADER, 0.05)
        for _ in range(100):  # every request moves the deadline later: recorded, no new timer
            d.arm(deadline.IDLE, 0.15)
        assert loop.timers == 1
        await _sleep_until(loop, t0 + 0.4)
        assert [k for k, _ in fired] == [deadline.IDLE]
        assert fired[0][1] - t0 >= 0.15 - 0.005  # not at the first handle's time: it re-armed for the rest
        assert loop.timers == 2  # the one re-arm when the first handle fired early

    run(main)


def test_an_earlier_deadline_replaces_the_handle_and_disarm_fires_nothing():
    async def main(loop: CountingLoop) -> None:
        fired: list[int] = []
        d = Deadline(loop, fired.append)
        t0 = loop.time()
        d.arm(deadline.IDLE, 5.0)
        d.arm(deadline.HEADER, 0.05)  # earlier: only a new handle can fire in time
        assert loop.timers == 2
        await _sleep_until(loop, t0 + 0.2)
        assert fired == [deadline.HEADER]
        d.arm(deadline.BODY, 0.05)
        d.disarm_if(deadline.HEADER)  # not the current kind: stays armed
        d.disarm_if(deadline.BODY)
        await _sleep_until(loop, t0 + 0.4)
        assert fired == [deadline.HEADER]
        assert d.kind == deadline.NONE

    run(main)


def test_stop_cancels_the_handle_and_drops_the_callback():
    async def main(loop: CountingLoop) -> None:
        fired: list[int] = []
        d = Deadline(loop, fired.append)
        d.arm(deadline.HEADER, 0.05)
        d.stop()
        await asyncio.sleep(0.15)
        assert fired == [] and d.kind == deadline.NONE

    run(main)


def test_with_a_horizon_no_deadline_ever_cancels_or_creates_a_timer():
    """The backend side: its handle is never further ahead than the shorter timeout, so a deadline set later
    (idle, awaiting a response, idle ...) always falls at or after the armed handle."""

    async def main(loop: CountingLoop) -> None:
        fired: list[int] = []
        d = Deadline(loop, fired.append, horizon=0.1)
        t0 = loop.time()
        d.arm(deadline.RESPONSE, 0.35)  # longer than the horizon: the handle is armed 0.1 ahead
        for _ in range(50):
            d.arm(deadline.POOL_IDLE, 0.1)
            d.arm(deadline.RESPONSE, 0.35)
        assert loop.timers == 1
        await _sleep_until(loop, t0 + 0.6)
        assert fired == [deadline.RESPONSE]
        assert 3 <= loop.timers <= 5  # re-armed every horizon until the deadline: 0.1, 0.2, 0.3, 0.35

    run(main)


def test_an_upstream_connection_uses_it_and_requests_create_no_timer():
    async def main(loop: CountingLoop) -> None:
        pool = UpstreamPool(loop, idle_timeout_s=15.0, response_timeout_s=60.0)  # type: ignore[arg-type]
        conn = UpstreamConn(pool, "b-1")
        for _ in range(1000):  # keep-alive requests: sent, answered, parked, taken again
            conn.expect_response()
            conn.idle()
            conn.in_use()
        assert loop.timers == 1
        conn.close()  # stops it: nothing left armed, nothing to call back
        assert conn.closed

    run(main)

