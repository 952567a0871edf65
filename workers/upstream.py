"""Upstream connections for the L7 bridge: one asyncio Protocol per backend connection, pooled per instance.

A connection has at most one owner (the request exchange using it) and forwards its transport events to it.
Idle connections wait in a per-instance LIFO stack (the most recently used one is the likeliest still open),
bounded by ``pool_max_idle_per_instance``, each closed after ``idle_timeout_s``. An idle connection the
backend closes, or that receives unsolicited bytes, leaves the pool at once.

Plain TCP ("offload") is built in. TLS ("bridge") goes through ``tls``, whatever ``L7Context.upstream_tls``
returns for the instance: an ``ssl.SSLContext`` (stdlib TLS), or a callable ``wrap(inner) -> protocol``
that must call ``inner.connection_made(tls_transport)`` once the handshake is done and forward plaintext to
``inner``. If that protocol has a ``handshake_complete`` future, a failed handshake fails the connect at once
(instead of at ``connect_timeout_s``). With ``workers.tls_client``::

    lambda inner: TLSClientProtocol(client_ctx, lambda: inner, server_hostname=..., verify_name=...)
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Protocol

from sentin8.routing import Instance

from .deadline import NONE, POOL_IDLE, RESPONSE, Deadline
from .task_timeout import TaskTimeout
from .unread import UnreadWatch

WRITE_HIGH_WATER = 64 * 1024
# bytes a connection queues until the end of the loop turn (UpstreamConn.send); more go at once (a request
# head is well within it, a body's read is not)
SEND_SOON_MAX = 16 * 1024


class UpstreamOwner(Protocol):
    """What an exchange implements to receive its upstream connection's events."""

    def upstream_data(self, data: bytes) -> None: ...
    def upstream_lost(self, conn: UpstreamConn, exc: Exception | None) -> None: ...
    def upstream_pause_writing(self) -> None: ...
    def upstream_resume_writing(self) -> None: ...
    def upstream_timeout(self) -> None: ...  # the request was sent and no response byte came in time


class UpstreamConn:  # an asyncio.Protocol by its methods: no base, as a cdef class (upstream.pxd) takes none
    """One backend connection. It has one deadline at a time (``workers.deadline``, the one the client bridge
    uses too): idle in the pool (``idle_timeout_s``, then closed) or awaiting a response
    (``response_timeout_s``, then the owner's ``upstream_timeout``). Its horizon is ``pool.min_deadline_s``,
    so a request never cancels or creates a timer. Every connection ends in ``close`` or ``connection_lost``
    (a failed connect too), which stops the deadline: its callback never keeps the connection alive.
    """

    __slots__ = (
        "_deadline",
        "_out",
        "_out_bytes",
        "closed",
        "instance_id",
        "owner",
        "pool",
        "read_paused",
        "ready",
        "response_parser",
        "transport",
        "unread",
        "uses",
    )

    def __init__(self, pool: UpstreamPool, instance_id: str) -> None:
        self.pool = pool
        self.instance_id = instance_id
        self.transport: asyncio.Transport | None = None
        self.owner: UpstreamOwner | None = None
        self.uses = 0  # requests sent on it; > 1 means it came from the pool
        self.closed = False
        self.read_paused = False
        self.ready: asyncio.Future[None] = pool.loop.create_future()
        self._deadline = Deadline(pool.loop, self._deadline_passed, pool.min_deadline_s)
        # is anything unread in its socket: built at the first reuse (``acquire``), so a connection never taken
        # from the pool (closed over the idle cap, as most are at h2load -m100) never makes one
        self.unread: UnreadWatch | None = None
        # the L7 layer's parser of this connection's responses, kept across the requests it carries (made by
        # the first exchange that owns it: workers/l7/relay.py, ``ResponseParser``); this module never reads it
        self.response_parser: object | None = None
        self._out: list[bytes] | None = None  # bytes queued this loop turn (``send``), None when nothing is
        self._out_bytes = 0

    # -- asyncio.Protocol ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        try:
            transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)  # type: ignore[attr-defined]
        except (AttributeError, NotImplementedError):
            pass
        if not self.ready.done():
            self.ready.set_result(None)

    def data_received(self, data: bytes) -> None:
        self._deadline.kind = NONE  # a response started (or an idle one closes)
        owner = self.owner
        if owner is not None:
            owner.upstream_data(data)
        else:
            # Bytes on an idle connection (a late 408, garbage): it can no longer carry a request.
            self.close()

    def eof_received(self) -> bool:
        return False  # close; connection_lost tells the owner (a close-delimited body ends there)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        if not self.ready.done():
            self.ready.set_exception(exc or ConnectionResetError("upstream closed during connect"))
            self.ready.exception()  # retrieved: an abandoned connect must not log "never retrieved"
        owner, self.owner = self.owner, None
        if owner is not None:
            owner.upstream_lost(self, exc)
        else:
            self.pool.forget(self)

    def pause_writing(self) -> None:
        if self.owner is not None:
            self.owner.upstream_pause_writing()

    def resume_writing(self) -> None:
        if self.owner is not None:
            self.owner.upstream_resume_writing()

    # -- writes --------------------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        """Queue ``data`` for the backend: it leaves at the end of this loop turn, in order, with every other
        connection's (``UpstreamPool.write_soon``). The requests one read brings (an h2 client's streams, the
        keep-alive clients a poll wakes together) then reach the backend in one burst of writes, and it wakes
        once for all of them instead of once per request (bench/README.md, "2026-12-06"). Past ``SEND_SOON_MAX``
        queued bytes they go at once: a body must meet the transport's flow control (``pause_writing``) while
        the client's bytes are still being read, or one turn of reads (libuv reads a socket up to 32 times)
        would pile up here unchecked."""
        out = self._out
        if out is None:
            self._out = [data]
            self.pool.write_soon(self)
        else:
            out.append(data)
        self._out_bytes += len(data)  # 0 while nothing is queued (write_out)
        if self._out_bytes > SEND_SOON_MAX:
            self.write_out()

    def send_lines(self, parts: list[bytes] | tuple[bytes, ...]) -> None:
        """``send`` for several pieces (one vectored write at the end of the turn)."""
        out = self._out
        if out is None:
            self._out = list(parts)
            self.pool.write_soon(self)
        else:
            out.extend(parts)
        for part in parts:
            self._out_bytes += len(part)
        if self._out_bytes > SEND_SOON_MAX:
            self.write_out()

    def write_out(self) -> None:
        """What ``send`` queued, to the transport now (the pool calls it at the end of the turn; ``send`` past
        its bound). A connection closed meanwhile drops it, as ``close`` drops unsent bytes."""
        out, self._out = self._out, None
        self._out_bytes = 0
        if not out or self.closed or self.transport is None:
            return
        if len(out) == 1:
            self.transport.write(out[0])
        else:
            self.transport.writelines(out)  # one vectored write on uvloop

    # -- helpers -------------------------------------------------------------------------------------
    def pause_reading(self) -> None:
        if not self.read_paused and not self.closed and self.transport is not None:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            if not self.closed and self.transport is not None:
                self.transport.resume_reading()

    def expect_response(self) -> None:
        """The request is all sent: the backend has ``response_timeout_s`` to start answering."""
        self._deadline.arm(RESPONSE, self.pool.response_timeout_s)

    def idle(self) -> None:
        """Parked in the pool: closed after ``idle_timeout_s`` unless taken again."""
        self._deadline.arm(POOL_IDLE, self.pool.idle_timeout_s)

    def in_use(self) -> None:
        """Taken from the pool: no deadline until the next request is sent."""
        self._deadline.kind = NONE

    def _deadline_passed(self, kind: int) -> None:
        if kind == POOL_IDLE:
            self.close()
        elif self.owner is not None:
            self.owner.upstream_timeout()

    def _stop_timer(self) -> None:
        self._deadline.stop()  # a closed connection: no handle, nor the callback, may keep it alive

    def close(self) -> None:
        """Close, dropping unsent bytes: a connection we give up on carries nothing more worth sending."""
        self.owner = None
        self._stop_timer()
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()
        self.pool.forget(self)


class UpstreamPool:
    """Per-worker pool of idle keep-alive connections, keyed by instance id."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        max_idle_per_instance: int = 32,
        connect_timeout_s: float = 3.0,
        idle_timeout_s: float = 15.0,
        response_timeout_s: float = 60.0,
    ) -> None:
        self.loop = loop
        self.max_idle = max_idle_per_instance
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.response_timeout_s = response_timeout_s
        self.min_deadline_s = min(idle_timeout_s, response_timeout_s)
        self._idle: dict[str, list[UpstreamConn]] = {}
        self._closed = False
        self._writers: list[UpstreamConn] = []  # connections with bytes queued this turn (UpstreamConn.send)
        self._write_scheduled = False

    @classmethod
    def from_config(cls, loop: asyncio.AbstractEventLoop, cfg) -> UpstreamPool:  # cfg: sentin8.config.Config
        return cls(
            loop,
            max_idle_per_instance=cfg.upstream.pool_max_idle_per_instance,
            connect_timeout_s=cfg.upstream.connect_timeout_s,
            response_timeout_s=cfg.upstream.response_timeout_s,
        )

    def acquire(self, instance_id: str) -> UpstreamConn | None:
        """A live idle connection to ``instance_id`` (most recently used first), or None.

        Live as the kernel knows it now, not only as the loop last saw it: a backend that closed an idle
        connection (its keep-alive timeout) may have had its FIN arrive after the loop's last poll, and a
        request sent on it fails, a non-idempotent one (or one whose body was already handed over) with a 502
        since it cannot be replayed. ``UnreadWatch`` looks at the socket first; what remains is the backend
        closing while the request is on its way, which only a backend keep-alive longer than
        ``idle_timeout_s`` avoids."""
        stack = self._idle.get(instance_id)
        while stack:
            conn = stack.pop()
            conn.in_use()
            transport = conn.transport
            if conn.closed or transport is None or transport.is_closing():
                continue
            watch = conn.unread
            if watch is None:
                watch = conn.unread = UnreadWatch(transport)
            if watch.spoke():
                conn.close()  # a FIN, a reset or unsolicited bytes: it can no longer carry a request
                continue
            conn.uses += 1
            return conn
        return None

    def write_soon(self, conn: UpstreamConn) -> None:
        """``conn`` has bytes queued: write them, with every other connection's, at the end of this turn."""
        self._writers.append(conn)
        if not self._write_scheduled:
            self._write_scheduled = True
            self.loop.call_soon(self._write_now)

    def _write_now(self) -> None:
        self._write_scheduled = False
        writers, self._writers = self._writers, []
        for conn in writers:
            conn.write_out()

    def release(self, conn: UpstreamConn) -> None:
        """Return a connection whose exchange ended cleanly; it waits idle or is closed when over the cap."""
        conn.owner = None
        conn.resume_reading()  # an idle connection must read, or a backend close would go unseen
        transport = conn.transport
        if self._closed or conn.closed or transport is None or transport.is_closing() or self.max_idle <= 0:
            conn.close()
            return
        stack = self._idle.setdefault(conn.instance_id, [])
        stack.append(conn)
        conn.idle()
        if len(stack) > self.max_idle:
            oldest = stack.pop(0)
            oldest.close()

    def forget(self, conn: UpstreamConn) -> None:
        """``conn`` closed: it leaves the idle stack if it was parked there."""
        stack = self._idle.get(conn.instance_id)
        if stack and conn in stack:
            stack.remove(conn)

    async def connect(self, instance: Instance, tls: object | None = None) -> UpstreamConn:
        """A new connection (the handshake done, for TLS) within ``connect_timeout_s``; raises OSError/TimeoutError."""
        conn = UpstreamConn(self, instance.id)
        conn.uses = 1
        factory: Callable[[], asyncio.Protocol]
        ssl_ctx: ssl.SSLContext | None = None
        server_hostname: str | None = None
        if tls is None:
            factory = lambda: conn  # noqa: E731
        elif isinstance(tls, ssl.SSLContext):
            ssl_ctx, server_hostname = tls, instance.host
            factory = lambda: conn  # noqa: E731
        elif callable(tls):
            # BRIDGE HOOK: the TLS helper's client protocol wraps `conn` and reports the handshake through it.
            wrap = tls
            factory = lambda: wrap(conn)  # noqa: E731
        else:
            raise TypeError(f"upstream_tls returned {type(tls).__name__}, not an SSLContext or a callable")

        # TaskTimeout (asyncio.timeout's contract at a fraction of its cost), not wait_for: wait_for runs the
        # connect as a task of its own (one more task per connect); the steps inline, not a nested coroutine
        try:
            with TaskTimeout(self.loop, self.connect_timeout_s):
                transport, proto = await self.loop.create_connection(
                    factory, instance.host, instance.port, ssl=ssl_ctx, server_hostname=server_hostname
                )
                try:
                    handshake = getattr(proto, "handshake_complete", None) if proto is not conn else None
                    if isinstance(handshake, asyncio.Future):
                        await handshake  # raises when the handshake fails
                    await conn.ready
                except BaseException:
                    transport.abort()
                    raise
        except BaseException:
            conn.close()  # never connected, or not usable: it ends here like any other connection
            raise
        return conn

    def close_idle(self) -> None:
        """Close every idle connection (drain, shutdown)."""
        stacks, self._idle = self._idle, {}
        for stack in stacks.values():
            for conn in stack:
                conn.close()

    def close(self) -> None:
        self._closed = True
        self.close_idle()

    def idle_count(self, instance_id: str | None = None) -> int:
        if instance_id is not None:
            return len(self._idle.get(instance_id, ()))
        return sum(len(s) for s in self._idle.values())
