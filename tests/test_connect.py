"""workers.connect: a backend host that is a name is resolved off the loop; the loop keeps serving meanwhile."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import uvloop

from sentin8.holds import OpenConnections
from sentin8.shm.counters import CounterReader, WorkerCounters, region_bytes
from workers.connect import connect_tcp, literal_family
from workers.poll_set import PollSet


class GatedDNSLoop(uvloop.Loop):
    """A real uvloop loop whose name lookups (the real ones) wait for the test to open a gate: DNS that
    takes as long as the test wants, so a lookup that blocked the loop would show as a stalled heartbeat."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.lookups: list[str] = []

    async def getaddrinfo(self, host, port, **kw):  # type: ignore[override]
        self.lookups.append(host)
        await self.gate.wait()
        return await super().getaddrinfo(host, port, **kw)


@pytest.fixture
def listener():
    srv = socket.create_server(("127.0.0.1", 0))
    yield srv
    srv.close()


def test_a_name_is_resolved_without_blocking_the_loop(listener):
    port = listener.getsockname()[1]
    loop = GatedDNSLoop()
    poll = PollSet(loop)  # the worker's L4 sockets' epoll set: the connect waits in it

    async def main() -> tuple[int, int]:
        ticks = 0

        async def heartbeat() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        beat = asyncio.ensure_future(heartbeat())
        connecting = asyncio.ensure_future(connect_tcp(poll, "localhost", port, 5.0))
        end = loop.time() + 5.0
        while not loop.lookups:  # the lookup has started (through the loop, not a blocking call)...
            assert loop.time() < end and not connecting.done(), "the name was not resolved through the loop"
            await asyncio.sleep(0.001)
        seen = ticks
        while ticks < seen + 20:  # ...and the loop keeps running other work while it is pending
            await asyncio.sleep(0.001)
        assert not connecting.done()
        loop.gate.set()
        sock = await asyncio.wait_for(connecting, 5.0)
        try:
            assert sock.getpeername()[1] == port
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        finally:
            sock.close()
        beat.cancel()
        return ticks, len(loop.lookups)

    try:
        ticks, lookups = loop.run_until_complete(main())
    finally:
        loop.close()
    assert lookups == 1 and ticks >= 20
    accepted, _ = listener.accept()
    accepted.close()


def test_a_literal_needs_no_lookup_and_a_slow_name_times_out(listener):
    port = listener.getsockname()[1]
    loop = GatedDNSLoop()  # the gate stays shut: a lookup never finishes
    poll = PollSet(loop)  # the worker's L4 sockets' epoll set: the connect waits in it

    async def main() -> None:
        sock = await connect_tcp(poll, "127.0.0.1", port, 2.0)
        sock.close()
        assert loop.lookups == []
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            await connect_tcp(poll, "localhost", port, 0.2)
        assert time.monotonic() - t0 < 2.0

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def test_refused_and_unknown_names_raise_oserror():
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()
    loop = uvloop.new_event_loop()
    poll = PollSet(loop)  # the worker's L4 sockets' epoll set: the connect waits in it
    try:
        with pytest.raises(OSError):
            loop.run_until_complete(connect_tcp(poll, "localhost", port, 2.0))
        with pytest.raises(OSError):
            loop.run_until_complete(connect_tcp(poll, "no-such-host.invalid", port, 5.0))
    finally:
        loop.close()
    assert literal_family("::1") == socket.AF_INET6 and literal_family("localhost") is None


def _counters() -> tuple[WorkerCounters, CounterReader]:
    view = memoryview(bytearray(region_bytes(1, 0)))
    return WorkerCounters(view, 0), CounterReader(view, 1)


def test_a_hold_releases_once_however_often_it_is_released():
    counters, reader = _counters()
    releases = []
    open_ = OpenConnections(counters, lambda: releases.append(open_.count))
    a, b = open_.hold(), open_.hold()
    assert open_.count == 2 and reader.total()["open_connections"] == 2
    a.release()
    a.release()  # e.g. the accept task after a failed hand-off, then connection_lost
    assert a.released and not b.released
    assert open_.count == 1 and reader.total()["open_connections"] == 1 and releases == [1]
    b.release()
    assert open_.count == 0 and reader.total()["open_connections"] == 0
    assert reader.total()["gauge_underflow"] == 0


def test_a_gauge_below_zero_is_counted_not_hidden():
    counters, reader = _counters()
    counters.add_gauge("l4_active", 1)
    counters.add_gauge("l4_active", -1)
    assert reader.total()["gauge_underflow"] == 0
    counters.add_gauge("l4_active", -1)
    total = reader.total()
    assert total["l4_active"] == 0 and total["gauge_underflow"] == 1


def test_what_a_hold_also_holds_is_given_back_once_with_it():
    counters, reader = _counters()
    open_ = OpenConnections(counters)
    given_back: list[str] = []
    hold = open_.hold()
    hold.also(lambda: given_back.append("cap place"))
    hold.release()
    hold.release()
    assert given_back == ["cap place"] and open_.count == 0 and reader.total()["gauge_underflow"] == 0


def test_a_backend_that_never_answers_the_connect_times_out_on_its_deadline():
    # a listener whose accept queue is full drops further SYNs: the connect neither succeeds nor fails
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    port = full.getsockname()[1]
    fillers = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        fillers.append(s)
    loop = uvloop.new_event_loop()
    poll = PollSet(loop)  # its timers hold the connect's deadline (one loop timer for all of them)

    async def main() -> float:
        t0 = loop.time()
        with pytest.raises(TimeoutError):
            await connect_tcp(poll, "127.0.0.1", port, 0.3)
        return loop.time() - t0

    try:
        took = loop.run_until_complete(main())
    finally:
        poll.close()
        loop.close()
        for s in (*fillers, full):
            s.close()
    assert 0.3 - 0.01 <= took < 3.0
    assert len(poll) == 0  # the socket left the set when it was given up
