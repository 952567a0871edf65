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
import select
from collections.abc import Callable

from .timer_queue import TimerQueue

IN = select.EPOLLIN
OUT = select.EPOLLOUT
ONESHOT = select.EPOLLONESHOT
ERR = select.EPOLLERR
HUP = select.EPOLLHUP

_BATCH = 256  # events taken per wakeup; more stay readable and come at the next turn of the loop


class PollSet:
    """fd → (wanted events, handler): the handler gets the events that fired. ``timers``: the deadlines of the
    waits in the set (a backend connect's timeout), on one loop timer."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.timers = TimerQueue(loop)
        self._epoll = select.epoll()
        self._watched: dict[int, Callable[[int], None]] = {}
        self._events: dict[int, int] = {}
        loop.add_reader(self._epoll.fileno(), self._dispatch)

    def watch(self, fd: int, events: int, handler: Callable[[int], None]) -> None:
        """Want ``events`` on ``fd`` (0: nothing, the fd leaves the set). ONESHOT disarms after one event
        until the next ``watch`` of that fd."""
        if not events:
            self.drop(fd)
            return
        if fd not in self._watched:
            self._epoll.register(fd, events)
        elif self._events[fd] != events or events & ONESHOT:
            try:
                self._epoll.modify(fd, events)
            except FileNotFoundError:  # closed without a drop, and the number reused: a new registration
                self._epoll.register(fd, events)
        self._watched[fd] = handler
        self._events[fd] = events

    def drop(self, fd: int) -> None:
        """Leave the set: before the fd is closed, or when it wants nothing."""
        if self._watched.pop(fd, None) is not None:
            del self._events[fd]
            try:
                self._epoll.unregister(fd)
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

    def _dispatch(self) -> None:
        try:
            ready = self._epoll.poll(0, _BATCH)
        except InterruptedError:
            return
        watched = self._watched
        for fd, events in ready:
            handler = watched.get(fd)
            if handler is not None:
                handler(events)

    def close(self) -> None:
        self.timers.close()
        self.loop.remove_reader(self._epoll.fileno())
        self._watched.clear()
        self._events.clear()
        self._epoll.close()
