"""workers.poll_set on real sockets, on both builds (the compiled one calls epoll_ctl and epoll_wait itself, the
pure one select.epoll): events reach the fd's handler with the mask that fired, ONESHOT disarms, a number
reused after a close without a drop is registered anew, an fd a handler dropped earlier in the same batch gets
nothing, and a failing epoll_ctl is the OSError subclass its errno names."""

from __future__ import annotations

import asyncio
import errno
import socket

import pytest
import uvloop

from workers.poll_set import IN, ONESHOT, OUT, PollSet


def _run(main) -> None:
    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(main(loop), 10))
    finally:
        loop.close()


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    return a, b


def test_a_readable_fd_reaches_its_handler_with_the_events_that_fired_then_leaves_the_set():
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        poll = PollSet(loop)
        a, b = _pair()
        got = loop.create_future()
        poll.watch(a.fileno(), IN, lambda events: got.done() or got.set_result(events))
        b.send(b"x")
        assert await got == IN
        assert len(poll) == 1
        poll.drop(a.fileno())
        assert len(poll) == 0
        poll.watch(a.fileno(), IN | OUT, lambda events: None)  # added again after a drop: no EEXIST
        poll.watch(a.fileno(), 0, lambda events: None)  # nothing wanted: out of the set
        assert len(poll) == 0
        poll.close()
        a.close()
        b.close()

    _run(main)


def test_oneshot_disarms_after_one_event_until_the_next_watch():
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        poll = PollSet(loop)
        a, b = _pair()
        calls: list[int] = []
        first = loop.create_future()

        def handler(events: int) -> None:
            calls.append(events)
            if not first.done():
                first.set_result(None)

        poll.watch(a.fileno(), IN | ONESHOT, handler)
        b.send(b"x")  # stays unread: level-triggered, it would fire on every turn without ONESHOT
        await first
        for _ in range(20):
            await asyncio.sleep(0)
        assert calls == [IN]
        again = loop.create_future()
        poll.watch(a.fileno(), IN | ONESHOT, lambda events: again.done() or again.set_result(events))
        assert await again == IN  # re-armed by the watch (a MOD of the same mask, because of ONESHOT)
        poll.close()
        a.close()
        b.close()

    _run(main)


def test_a_number_reused_after_a_close_without_a_drop_is_registered_anew():
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        poll = PollSet(loop)
        a, b = _pair()
        fd = a.fileno()
        poll.watch(fd, OUT, lambda events: None)
        a.close()  # the kernel took it out of the epoll set; the PollSet still has it
        c, d = _pair()
        if c.fileno() != fd:  # the lowest free number is reused, so c has it unless another thread took it
            for s in (b, c, d):
                s.close()
            pytest.skip("the closed number was not reused")
        got = loop.create_future()
        # another mask, so a MOD: ENOENT, FileNotFoundError, then an ADD (watch's recovery; the same mask would
        # be taken as already registered, which is why callers drop before they close)
        poll.watch(fd, IN, lambda events: got.done() or got.set_result(events))
        d.send(b"y")
        assert await got == IN
        poll.drop(fd)
        poll.close()
        for s in (b, c, d):
            s.close()

    _run(main)


def test_an_fd_dropped_by_a_handler_earlier_in_the_same_batch_gets_nothing():
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        poll = PollSet(loop)
        pairs = [_pair() for _ in range(2)]
        fds = [a.fileno() for a, _ in pairs]
        seen: list[int] = []
        done = loop.create_future()

        def handler(fd: int):
            def on_events(events: int) -> None:
                seen.append(fd)
                for each in fds:  # itself (level-triggered: it would fire again) and the other one
                    poll.drop(each)
                loop.call_soon(lambda: done.done() or done.set_result(None))

            return on_events

        for fd in fds:
            poll.watch(fd, IN, handler(fd))
        for _, b in pairs:
            b.send(b"z")  # both readable before the loop next polls the set: one batch holds both
        await done
        assert len(seen) == 1
        poll.close()
        for a, b in pairs:
            a.close()
            b.close()

    _run(main)


def test_a_failing_epoll_ctl_is_the_oserror_its_errno_names():
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        poll = PollSet(loop)
        a, b = _pair()
        fd = a.fileno()
        a.close()
        b.close()
        with pytest.raises(OSError) as raised:
            poll.watch(fd, IN, lambda events: None)
        assert raised.value.errno == errno.EBADF and raised.value.strerror  # not an open descriptor
        assert len(poll) == 0
        poll.drop(fd)  # never watched: nothing to do, nothing raised
        poll.close()

    _run(main)
