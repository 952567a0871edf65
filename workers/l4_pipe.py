"""The L4 path's raw pipe: bytes both ways between two sockets, zero copy through kernel pipes (splice(2)).

Each direction moves socket -> pipe -> socket with splice, driven by readiness events from the worker's
``PollSet`` (no timeouts, no polling: a pipe may stay idle for days — SSE, WebSocket). When the destination
cannot take more, the direction stops reading its source until the destination is writable again: that is
the backpressure.
Half-close: an EOF in one direction becomes shutdown(SHUT_WR) on the other side; the pipe closes both
sockets once both directions have ended, or at once on an error.

A direction holds a kernel pipe only while bytes are in flight: it takes one from the worker's pool when its
source is readable and gives it back as soon as the pipe is empty again. An idle connection (the common case
for long-lived SSE/WebSocket pipes) costs its two sockets and nothing else, so file descriptors scale with
the connections that are moving data, not with the connections that exist.
"""

from __future__ import annotations

import _socket
import fcntl
import os
import socket
from collections.abc import Callable
from os import splice  # bound once: a module attribute is a lookup per call, twice per read

try:
    import cython  # the compiled build calls splice(2) itself (Cython decides it at compile time)
except ImportError:  # a pure install without Cython: os.splice

    class cython:  # type: ignore[no-redef]
        compiled = False


from sentin8.eventlog import event

from .poll_set import ERR, HUP, IN, OUT, PollSet

SPLICE_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
PIPE_SIZE = 1 << 20
CHUNK = 1 << 20
_close = _socket.socket.close  # also for the accepted socket.socket: nothing here made a file of it (makefile)


class PipePool:
    """Kernel pipe pairs, reused: creating and sizing a pipe costs more than the splice calls of a short
    connection. Only empty pipes come back to the pool."""

    def __init__(self, keep: int = 256) -> None:
        self._free: list[tuple[int, int]] = []
        self.keep = keep

    def get(self) -> tuple[int, int]:
        if self._free:
            return self._free.pop()
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:
            pass  # above pipe-max-size for this user: the default size still works
        return r, w

    def put(self, pair: tuple[int, int], empty: bool) -> None:
        if empty and len(self._free) < self.keep:
            self._free.append(pair)
        else:
            os.close(pair[0])
            os.close(pair[1])

    def close(self) -> None:
        while self._free:
            r, w = self._free.pop()
            os.close(r)
            os.close(w)


def _splice(src: int, dst: int, size: int) -> int:
    """Up to ``size`` bytes from ``src`` to ``dst`` (one of them a kernel pipe), never blocking: the bytes moved
    (0: the source's EOF), -1 when it would block (or a signal cut it short), the OSError otherwise. Compiled,
    splice(2) itself (``l4_pipe.pxd``): ``os.splice`` parses its keyword argument on every call (~1.5k
    instructions, six calls per L4 connection) and raises where this returns -1."""
    if cython.compiled:
        while True:
            n = c_splice(src, cython.NULL, dst, cython.NULL, size, c_SPLICE_F_MOVE | c_SPLICE_F_NONBLOCK)  # noqa: F821
            if n >= 0:
                return n
            err = c_errno  # noqa: F821 (l4_pipe.pxd)
            if err == c_EINTR:  # noqa: F821 (retried, as os.splice does: PEP 475)
                continue
            if err == c_EAGAIN:  # noqa: F821
                return -1
            raise OSError(err, os.strerror(err))
    try:
        return splice(src, dst, size, flags=SPLICE_FLAGS)
    except (BlockingIOError, InterruptedError):
        return -1


class _Direction:
    """One way of the pipe: ``src`` → kernel pipe → ``dst``. Its readiness comes from the owning pipe, which
    holds the one watch each socket has in the ``PollSet`` (a socket is the source of one direction and the
    destination of the other, so its wanted events are the union of both)."""

    __slots__ = (
        "bytes",
        "dst",
        "dst_fd",
        "ended",
        "owner",
        "pending",
        "pipe",
        "pool",
        "reading",
        "src",
        "src_fd",
        "writing",
    )

    def __init__(
        self, owner: SplicePipe, src: _socket.socket, dst: _socket.socket, src_fd: int, dst_fd: int, pool: PipePool
    ) -> None:
        self.owner = owner
        self.src, self.dst = src, dst
        self.src_fd, self.dst_fd = src_fd, dst_fd  # the pipe's: fileno() is a method found by name, per call
        self.pool = pool
        self.pipe: tuple[int, int] | None = None  # held only while bytes are in flight
        self.pending = 0  # bytes sitting in the kernel pipe
        self.ended = False
        self.reading = False  # wants the source readable
        self.writing = False  # wants the destination writable (it was full)
        self.bytes = 0

    def start(self) -> None:
        self.reading = True
        self.owner.rewatch(self.src_fd)

    def on_readable(self) -> None:
        pipe = self.pipe
        if pipe is None:
            pipe = self.pipe = self.pool.get()
        try:
            n = _splice(self.src_fd, pipe[1], CHUNK)
        except OSError:
            self.owner.abort()
            return
        if n < 0:  # nothing to read after all
            self._release_if_empty()
            return
        if n == 0:
            self._release_if_empty()
            self.ended = True
            self.reading = False
            if self.pending == 0:
                self.owner.direction_done(self)  # the pipe closes, or its source is rewatched and the EOF passed on
            else:
                self.owner.rewatch(self.src_fd)
            return
        self.pending += n
        self.bytes += n
        self.flush()

    def flush(self) -> None:
        while self.pending:
            try:
                m = _splice(self.pipe[0], self.dst_fd, self.pending)  # type: ignore[index]
            except OSError:
                self.owner.abort()
                return
            if m < 0:
                # destination full: stop reading the source until it drains
                self.reading = False
                self.writing = True
                self.owner.rewatch(self.src_fd)
                self.owner.rewatch(self.dst_fd)
                return
            self.pending -= m
        self._release_if_empty()

    def _release_if_empty(self) -> None:
        if self.pipe is not None and self.pending == 0:
            self.pool.put(self.pipe, empty=True)
            self.pipe = None

    def release(self) -> None:
        """At close: an empty pipe goes back to the pool, one still holding bytes is closed."""
        if self.pipe is not None:
            self.pool.put(self.pipe, empty=self.pending == 0)
            self.pipe = None

    def on_writable(self) -> None:
        self.writing = False
        self.owner.rewatch(self.dst_fd)
        self.flush()
        if self.pending or self.owner.closed:
            return
        if self.ended:
            self.owner.direction_done(self)
        elif not self.reading:
            self.start()


class SplicePipe:
    """Both directions of one L4 connection. Each socket has one watch in the worker's ``PollSet``: its events
    go to the direction it feeds (readable) and to the one that feeds it (writable)."""

    def __init__(
        self,
        poll: PollSet,
        client: _socket.socket,
        backend: _socket.socket,
        pipes: PipePool,
        on_close: Callable[[SplicePipe], None],
    ) -> None:
        self.poll = poll
        self.client, self.backend = client, backend
        self.pipes = pipes
        self.on_close = on_close
        self.closed = False
        self._client_fd, self._backend_fd = client_fd, backend_fd = client.fileno(), backend.fileno()
        self.upstream = _Direction(self, client, backend, client_fd, backend_fd, pipes)
        self.downstream = _Direction(self, backend, client, backend_fd, client_fd, pipes)

    def start(self, preface: bytes = b"") -> None:
        """Start both directions. ``preface`` (a PROXY v2 header) reaches the backend before any client byte:
        written at once, since a freshly connected socket's send buffer is empty and a header is a few dozen
        bytes; a backend that cannot take it whole (reset already) aborts the pipe, never a blocking write."""
        if preface:
            try:
                sent = self.backend.send(preface)
            except OSError:
                sent = -1
            if sent != len(preface):
                self.abort()
                return
        self.upstream.start()
        self.downstream.start()

    def rewatch(self, fd: int) -> None:
        """Bring ``fd``'s watch in line with what the two directions want of it now."""
        if self.closed:
            return
        if fd == self._client_fd:
            reader, writer, handler = self.upstream, self.downstream, self._client_events
        else:
            reader, writer, handler = self.downstream, self.upstream, self._backend_events
        self.poll.watch(fd, (IN if reader.reading else 0) | (OUT if writer.writing else 0), handler)

    def _client_events(self, events: int) -> None:
        self._events(events, self.upstream, self.downstream)

    def _backend_events(self, events: int) -> None:
        self._events(events, self.downstream, self.upstream)

    def _events(self, events: int, reader: _Direction, writer: _Direction) -> None:
        if self.closed:
            return  # a closed pipe has let go of its directions (``_close``): nothing is left to run
        # ERR and HUP go to whichever direction watches the socket: its next splice meets the condition
        try:
            if events & (IN | ERR | HUP) and reader.reading:
                reader.on_readable()
            if events & (OUT | ERR | HUP) and writer.writing and not self.closed:
                writer.on_writable()
        except Exception as exc:  # a bug costs this connection, never the worker or its other pipes
            event("connection_error", "error", error=type(exc).__name__, where="l4_pipe")
            self.abort()

    def direction_done(self, d: _Direction) -> None:
        """``d`` read its source's EOF and wrote all it read. Both directions done: the pipe closes, and their
        sockets leave the set with the close, not one ``epoll_ctl`` each before it."""
        if self.closed:
            return
        if self.upstream.ended and self.downstream.ended and not self.upstream.pending and not self.downstream.pending:
            self._close()  # both sides said EOF: close() sends our FIN, a separate shutdown would be wasted
            return
        self.rewatch(d.src_fd)  # reading no more: the source leaves the set unless the other direction writes to it
        try:
            d.dst.shutdown(socket.SHUT_WR)  # half-close: pass the EOF on, keep the other direction flowing
        except OSError:
            pass

    def abort(self) -> None:
        if not self.closed:
            for s in (self.client, self.backend):
                try:  # RST, so the peer that is still talking learns at once
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                except OSError:
                    pass
            self._close()

    def _close(self) -> None:
        self.closed = True
        self.poll.forget(self._client_fd)  # both closed below, by their only descriptors
        self.poll.forget(self._backend_fd)
        for d in (self.upstream, self.downstream):
            d.release()
        _close(self.client)  # the C close: socket.py's close and _real_close are interpreted, per connection
        _close(self.backend)
        self.on_close(self)
        # Each direction points back at the pipe. Letting go of them here frees the connection's objects by
        # refcount as soon as the poll set forgets its handlers; a cycle left in place waits for the collector,
        # which walked and cleared ~9k instructions' worth per L4 connection (bench.profile.l4, callgrind).
        self.upstream = self.downstream = None  # type: ignore[assignment]
