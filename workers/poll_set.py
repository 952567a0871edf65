"""One epoll set for the L4 path's raw sockets, registered with the loop once, so a piped connection costs a
handful of ``epoll_ctl`` calls instead of a libuv poll handle per socket per phase.

Why not ``loop.add_reader``: uvloop gives every fd it watches a libuv poll handle, and libuv checks a new
one (``epoll_ctl`` ADD and DEL, ``ioctl(FIONBIO)``, one more DEL) and tears it down with three DELs when the
fd's last watch is removed. An L4 connection watches its backend while connecting, then both sockets while
piping, then neither: ``strace`` counted 18 ``epoll_ctl``, 2 batched ADDs and 5 ``ioctl`` per connection,
against HAProxy's 3 ``epoll_ctl``. Here: ADD on the first watch, MOD when the wanted events change, DEL when
none is wanted any more (level-triggered HUP and ERR cannot be masked, so an fd that wants nothing leaves the
set rather than wake it forever).

Invariants: a handler is called only for an fd that is in the set at the moment its event is dispatched (an
fd that a handler earlier in the same batch dropped gets nothing); a caller drops its fd before closing it
(``drop``), so a number the kernel reuses never meets a stale registration; every wait is an epoll event,
never a timeout.
"""

from __future__ import annotations

import asyncio
import os
import select
from collections.abc import Callable

try:
    import cython  # the compiled build calls epoll_ctl and epoll_wait itself (Cython decides it at compile time)
except ImportError:  # a pure install without Cython: select.epoll's methods

    class cython:  # type: ignore[no-redef]
        compiled = False


from .timer_queue import TimerQueue

IN = select.EPOLLIN
OUT = select.EPOLLOUT
ONESHOT = select.EPOLLONESHOT
ERR = select.EPOLLERR
HUP = select.EPOLLHUP

_BATCH = 256  # events taken per wakeup (the compiled _dispatch's array too); more come at the next turn
_ADD, _MOD, _DEL = 1, 3, 2  # epoll_ctl's operations (EPOLL_CTL_ADD, _MOD, _DEL: the kernel's ABI)


class PollSet:
    """fd → (wanted events, handler): the handler gets the events that fired. ``timers``: the deadlines of the
    waits in the set (a backend connect's timeout), on one loop timer."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.timers = TimerQueue(loop)
        self._epoll = select.epoll()
        self._epfd = self._epoll.fileno()
        self._watched: dict[int, Callable[[int], None]] = {}
        self._events: dict[int, int] = {}
        loop.add_reader(self._epfd, self._dispatch)

    def watch(self, fd: int, events: int, handler: Callable[[int], None]) -> None:
        """Want ``events`` on ``fd`` (0: nothing, the fd leaves the set). ONESHOT disarms after one event
        until the next ``watch`` of that fd."""
        if not events:
            self.drop(fd)
            return
        if fd not in self._watched:
            self._ctl(_ADD, fd, events)
        elif self._events[fd] != events or events & ONESHOT:
            try:
                self._ctl(_MOD, fd, events)
            except FileNotFoundError:  # closed without a drop, and the number reused: a new registration
                self._ctl(_ADD, fd, events)
        self._watched[fd] = handler
        self._events[fd] = events

    def drop(self, fd: int) -> None:
        """Leave the set: before the fd is closed, or when it wants nothing."""
        if self._watched.pop(fd, None) is not None:
            del self._events[fd]
            try:
                self._ctl(_DEL, fd, 0)
            except OSError:
                pass  # closed by someone who did not drop it first: the kernel removed it already

    def forget(self, fd: int) -> None:
        """Leave the set without a syscall, for an fd its only owner closes right after: closing a socket's last
        descriptor takes it out of every epoll set, so a DEL first would be one more ``epoll_ctl`` per L4
        connection."""
        if self._watched.pop(fd, None) is not None:
            del self._events[fd]

    def __len__(self) -> int:
        """The fds in the set."""
        return len(self._watched)

    def _ctl(self, op: int, fd: int, events: int) -> None:
        """One ``epoll_ctl``; a failure is the OSError select.epoll raises (FileNotFoundError for ENOENT...).
        Compiled, the C call: select.epoll's methods parse their arguments and are found by name, ~4 calls
        per L4 connection."""
        if cython.compiled:
            change = cython.declare(epoll_event)  # noqa: F821 (poll_set.pxd)
            change.events = events
            change.data.fd = fd  # what select.epoll stores, and what _dispatch reads
            if epoll_ctl(self._epfd, op, fd, cython.address(change)) < 0:  # noqa: F821 (poll_set.pxd)
                err = c_errno  # noqa: F821 (poll_set.pxd)
                raise OSError(err, os.strerror(err))
        elif op == _ADD:
            self._epoll.register(fd, events)
        elif op == _MOD:
            self._epoll.modify(fd, events)
        else:
            self._epoll.unregister(fd)

    def _dispatch(self) -> None:
        watched = self._watched
        if cython.compiled:
            # epoll_wait into a C array: no list of tuples per wakeup as select.epoll.poll builds
            ready = cython.declare(epoll_event[256])  # noqa: F821 (poll_set.pxd; 256: _BATCH)
            n = epoll_wait(self._epfd, ready, 256, 0)  # noqa: F821 (poll_set.pxd)
            if n < 0:
                err = c_errno  # noqa: F821 (poll_set.pxd)
                if err == c_EINTR:  # noqa: F821 (poll_set.pxd)
                    return
                raise OSError(err, os.strerror(err))
            for i in range(n):
                handler = watched.get(ready[i].data.fd)
                if handler is not None:
                    handler(ready[i].events)
        else:
            try:
                got = self._epoll.poll(0, _BATCH)
            except InterruptedError:
                return
            for fd, events in got:
                handler = watched.get(fd)
                if handler is not None:
                    handler(events)

    def close(self) -> None:
        self.timers.close()
        self.loop.remove_reader(self._epoll.fileno())
        self._watched.clear()
        self._events.clear()
        self._epoll.close()
