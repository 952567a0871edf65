"""A non-blocking TCP connect to a registry host, which may be a name: the loop never waits on DNS.

``socket.connect_ex((name, port))`` resolves the name with a blocking ``getaddrinfo`` on the calling thread,
which for a worker means every connection it holds stalls for as long as DNS takes. Here an IP literal (the
common case, recognised once per host string) is connected directly; a name is resolved with
``loop.getaddrinfo`` (uvloop runs it in libuv's thread pool) and its addresses are tried in order, all within
one deadline.

The common case runs without a Task (a Task, its coroutine frames and futures cost more than the connect's
own Python): ``BackendConnect`` tries the route's instances one ``ConnectAttempt`` at a time, each a pair of
callbacks. The wait for the connect is a ONESHOT watch in the worker's ``PollSet``, and a connected socket
stays in the set, disarmed, so the pipe that takes it over re-arms it with one ``epoll_ctl`` MOD: whoever
closes it instead drops it from the set first.
"""

from __future__ import annotations

import _socket
import asyncio
import errno
import functools
import ipaddress
import os
import socket
from collections.abc import Callable
from errno import EAGAIN, EINPROGRESS
from socket import IPPROTO_TCP, TCP_NODELAY

from sentin8.backends import Backends
from sentin8.routing import Instance

from .poll_set import ERR, HUP, ONESHOT, OUT, PollSet
from .timer_queue import TimerEntry

_STREAM_NONBLOCK = int(socket.SOCK_STREAM | socket.SOCK_NONBLOCK)  # once, not per connect


@functools.lru_cache(maxsize=4096)
def literal_family(host: str) -> int | None:
    """AF_INET / AF_INET6 for an IP literal, None for a name (which needs a lookup)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    return socket.AF_INET6 if ip.version == 6 else socket.AF_INET


class ConnectAttempt:
    """One non-blocking connect of a fresh socket to a resolved address, by ``deadline`` (loop time), without
    a Task: one ONESHOT watch in the ``PollSet`` and one deadline in its ``timers`` (which may run the timeout
    up to ``timer_queue.BATCH`` late). ``on_done(sock, None)`` once connected (TCP_NODELAY set, still in the
    set, disarmed), ``on_done(None, error)`` else (the socket dropped from the set and closed). Exactly one
    call, never from ``start`` itself: a caller's state is settled by then."""

    __slots__ = ("addr", "deadline", "family", "on_done", "poll", "sock", "timer")

    def __init__(
        self,
        poll: PollSet,
        family: int,
        addr: tuple,
        deadline: float,
        on_done: Callable[[_socket.socket | None, OSError | None], None],
    ) -> None:
        self.poll = poll
        self.family = family
        self.addr = addr
        self.deadline = deadline
        self.on_done = on_done
        self.sock: _socket.socket | None = None
        self.timer: TimerEntry | asyncio.TimerHandle | None = None

    def start(self) -> None:
        loop = self.poll.loop
        try:
            # the C socket type: socket.py's subclass adds nothing the pipe uses, and its __init__ and close are
            # interpreted calls, per L4 connection (a backend socket never goes to uvloop, which wants socket.socket)
            sock = self.sock = _socket.socket(self.family, _STREAM_NONBLOCK)
            err = sock.connect_ex(self.addr)
        except OSError as exc:
            loop.call_soon(self._failed, exc)
            return
        if err == 0 or err in (EINPROGRESS, EAGAIN):
            # even an instant connect waits for its writable event: on_done never runs inside start
            self.poll.watch(sock.fileno(), OUT | ONESHOT, self._writable)
            self.timer = self.poll.timers.at(self.deadline, self._expired)
        else:
            loop.call_soon(self._failed, OSError(err, os.strerror(err)))

    def _writable(self, events: int) -> None:
        if self.timer is not None:
            self.timer.cancel()
        sock = self.sock
        assert sock is not None
        try:
            # epoll flags a failed connect ERR (and HUP), a made one OUT alone: the error is read only then
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) if events & (ERR | HUP) else 0
            if err:
                raise OSError(err, os.strerror(err))
            sock.setsockopt(IPPROTO_TCP, TCP_NODELAY, 1)
        except OSError as exc:
            self._failed(exc)
            return
        self.on_done(sock, None)

    def _expired(self) -> None:
        self._failed(TimeoutError())

    def _failed(self, exc: OSError) -> None:
        sock = self.sock
        if sock is not None:
            self.poll.drop(sock.fileno())
            sock.close()
            self.sock = None
        self.on_done(None, exc)


class BackendConnect:
    """Connect to the first instance of ``order`` that accepts a TCP connection: ``on_done(inst, sock)`` once,
    ``(None, None)`` when none answers. Each instance that fails is reported to ``backends`` (suspect for every
    worker, counted, a failure for its breaker), the one that answers as a success. An IP literal (the common
    case) needs no Task: a ``ConnectAttempt`` per instance. A host name is resolved first, in a Task
    (``connect_tcp``)."""

    __slots__ = ("backends", "next_index", "on_done", "order", "poll", "timeout", "trying")

    def __init__(
        self,
        poll: PollSet,
        backends: Backends,
        order: list[Instance],
        timeout: float,
        on_done: Callable[[Instance | None, _socket.socket | None], None],
    ) -> None:
        self.poll = poll
        self.backends = backends
        self.order = order
        self.timeout = timeout
        self.on_done = on_done
        self.next_index = 0
        self.trying: Instance | None = None

    def start(self) -> None:
        """Try the next instance (the first, at the start); ``on_done(None, None)`` when there is none."""
        if self.next_index >= len(self.order):
            self.on_done(None, None)
            return
        inst = self.trying = self.order[self.next_index]
        self.next_index += 1
        loop = self.poll.loop
        family = literal_family(inst.host)
        if family is None:
            loop.create_task(self._by_name(inst))
            return
        ConnectAttempt(self.poll, family, (inst.host, inst.port), loop.time() + self.timeout, self._attempted).start()

    async def _by_name(self, inst: Instance) -> None:
        try:
            sock = await connect_tcp(self.poll, inst.host, inst.port, self.timeout)
        except OSError as exc:  # TimeoutError included
            self._attempted(None, exc)
            return
        self._attempted(sock, None)

    def _attempted(self, sock: _socket.socket | None, error: OSError | None) -> None:
        inst = self.trying
        assert inst is not None
        if sock is None:
            self.backends.failed(inst)
            self.start()
            return
        self.backends.result(inst.id, True)
        self.on_done(inst, sock)


async def connect_first(
    poll: PollSet, backends: Backends, order: list[Instance], timeout: float
) -> tuple[Instance, _socket.socket] | None:
    """``BackendConnect`` awaited: the first instance that answers with its socket, None when none does."""
    done: asyncio.Future[tuple[Instance, _socket.socket] | None] = poll.loop.create_future()

    def finished(inst: Instance | None, sock: _socket.socket | None) -> None:
        if done.cancelled():
            if sock is not None:
                poll.drop(sock.fileno())
                sock.close()
            return
        done.set_result((inst, sock) if inst is not None and sock is not None else None)

    BackendConnect(poll, backends, order, timeout, finished).start()
    return await done


async def connect_tcp(poll: PollSet, host: str, port: int, timeout: float) -> _socket.socket:
    """A connected non-blocking socket with TCP_NODELAY, still in ``poll`` (disarmed); raises OSError or
    TimeoutError (after ``timeout`` seconds in all, the lookup included)."""
    loop = poll.loop
    deadline = loop.time() + timeout
    family = literal_family(host)
    if family is not None:
        return await _connect_addr(poll, family, (host, port), deadline)
    async with asyncio.timeout_at(deadline):
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    if not infos:
        raise OSError(errno.EHOSTUNREACH, f"{host}: no address")
    last: OSError | None = None
    for fam, _type, _proto, _name, addr in infos:
        try:
            return await _connect_addr(poll, fam, addr, deadline)
        except OSError as exc:  # the next address may answer (localhost: ::1 refused, 127.0.0.1 listening)
            last = exc
    assert last is not None
    raise last


async def _connect_addr(poll: PollSet, family: int, addr: tuple, deadline: float) -> _socket.socket:
    """``ConnectAttempt`` awaited."""
    done: asyncio.Future[_socket.socket] = poll.loop.create_future()

    def finished(sock: _socket.socket | None, error: OSError | None) -> None:
        if done.cancelled():  # the lookup's deadline or the caller gave up: the socket is nobody's
            if sock is not None:
                poll.drop(sock.fileno())
                sock.close()
        elif sock is not None:
            done.set_result(sock)
        else:
            done.set_exception(error or OSError(errno.ECONNABORTED, "connect failed"))

    ConnectAttempt(poll, family, addr, deadline, finished).start()
    return await done
