"""TLS over an asyncio/uvloop transport, through pyOpenSSL memory BIOs.

The same idea as stdlib asyncio's ``sslproto`` (which needs the stdlib ``ssl`` module and so cannot speak
post-quantum TLS): a protocol sits on the raw TCP transport, feeds ciphertext into the connection's incoming
memory BIO, drains its outgoing BIO into the raw transport, and presents the plaintext to an application
protocol through ``TLSAppTransport``, which behaves like any asyncio transport. Nothing here blocks: memory BIOs
never wait (``WantReadError`` means "feed me more ciphertext"); timeouts are ``loop.call_later`` timers.

An accepted socket is handed over after the worker peeked its ClientHello (``MSG_PEEK`` consumes nothing):
the transport's first reads deliver those bytes as if they arrived later, so "initial data" is no special case.

Session tickets (server side): OpenSSL writes them when the handshake completes; they stay in the outgoing
BIO until the first response, close_notify or an alert, and leave in that same socket write. A full handshake
then costs one socket write (and one client wake-up) less, and a client that reads a response has them.

Flow control: plaintext is encrypted at once, and the raw transport's write buffer is the only buffer (but
``write_soon``'s bytes, at most ``SOON_MAX``, which wait in the outgoing BIO for the end of the loop turn); its
``pause_writing``/``resume_writing`` reach the application unchanged. ``pause_reading`` pauses the raw
transport and stops handing over plaintext already decrypted or buffered, until ``resume_reading``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from OpenSSL import SSL

from sentin8 import tls_connection

from .timer_queue import TimerEntry, TimerQueue
from .tls_transport import TLS_KEYS, TLSAppTransport, TLSHandshakeError, tls_info

log = logging.getLogger(__name__)

_DELIVER_MAX = 262144  # coalesce decrypted records up to this many bytes per data_received
SOON_MAX = 16 * 1024  # write_soon's bytes held for the end of the loop turn; more go at once


class TLSLayer:  # an asyncio.Protocol by its methods: no base, as a cdef class (tls_layer.pxd) takes none
    """Shared machinery of the server and client sides; see the module docstring."""

    _server_side = True

    def __init__(
        self,
        context: SSL.Context,
        app_factory: Callable[[], asyncio.Protocol],
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        handshake_timeout: float | None = 10.0,
        on_handshake_error: Callable[[str], None] | None = None,
        on_handshake_done: Callable[[SSL.Connection | tls_connection.RecordIO], None] | None = None,
        timers: TimerQueue | None = None,
    ) -> None:
        self._context = context
        self._app_factory = app_factory
        self._handshake_timeout = handshake_timeout
        # the worker's handshake deadlines share one loop timer (their length is one setting); else a timer each
        self._timers = timers
        self._on_handshake_error = on_handshake_error
        self._on_handshake_done = on_handshake_done

        self._conn: SSL.Connection | tls_connection.RecordIO | None = None  # the connection (see ``connection``)
        self._io: tls_connection.RecordIO | None = None  # the per-record calls (reads, writes, BIO) of _conn
        self._raw: asyncio.Transport | None = None
        self._app: asyncio.Protocol | None = None
        self._app_transport: TLSAppTransport | None = None
        # given by a caller that has it: Python 3.11's get_running_loop() costs a getpid() per call
        self._loop: asyncio.AbstractEventLoop | None = loop
        self._timer: asyncio.TimerHandle | TimerEntry | None = None
        self._hs_future: asyncio.Future[None] | None = None

        self._handshake_done = False
        self._handshake_failed = False
        self._fail_reason = ""
        self._closing = False  # close/abort asked, or the connection is gone
        self._lost = False
        self._shutdown_sent = False  # our close_notify is out
        self._write_eof_called = False
        self._eof_delivered = False
        self._raw_eof = False
        self._app_paused = False  # the app paused reading
        self._raw_paused_writing = False
        self._deliver_scheduled = False
        self._fatal_exc: BaseException | None = None
        self._pending: list[bytes] = []  # plaintext OpenSSL could not take yet (WantRead mid-write)
        self._peercert_der: bytes | None = None
        # The server's session tickets, written by the handshake's last step, wait in the outgoing BIO until
        # the first response (or close_notify) carries them: one socket write per handshake instead of two.
        self._tickets_held = False
        self._flush_scheduled = False  # write_soon's socket write is due at the end of this loop turn
        self._soon_bytes = 0  # plaintext taken by write_soon since the last socket write

    # -- public ------------------------------------------------------------------------------------

    @property
    def connection(self) -> SSL.Connection | tls_connection.RecordIO | None:
        """The connection's SSL object: server side the ``RecordIO`` that owns it, client side pyOpenSSL's
        ``Connection`` (None before ``connection_made`` and after the connection is gone)."""
        return self._conn

    @property
    def handshake_complete(self) -> asyncio.Future[None]:
        """A future resolved when the handshake succeeds, failed with ``TLSHandshakeError`` otherwise.
        Created on first access (so nobody pays for it or leaves an unretrieved exception by default)."""
        if self._hs_future is None:
            self._hs_future = (self._loop or asyncio.get_running_loop()).create_future()
            if self._handshake_done:
                self._hs_future.set_result(None)
            elif self._handshake_failed:
                self._hs_future.set_exception(TLSHandshakeError(self._fail_reason))
        return self._hs_future

    @property
    def app_transport(self) -> TLSAppTransport | None:
        return self._app_transport

    # What TLSAppTransport (tls_transport.py) asks of its layer.
    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def reading_paused(self) -> bool:
        """The app paused reading (``pause_reading``)."""
        return self._app_paused

    @property
    def app(self) -> asyncio.Protocol | None:
        return self._app

    def set_app(self, protocol: asyncio.Protocol) -> None:
        """``TLSAppTransport.set_protocol``: plaintext goes to ``protocol`` from now on."""
        self._app = protocol

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if self._raw is not None:
            self._raw.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._raw.get_write_buffer_limits() if self._raw is not None else (0, 0)

    def write_buffer_size(self) -> int:
        """Ciphertext not yet sent plus plaintext OpenSSL could not take yet."""
        size = self._raw.get_write_buffer_size() if self._raw is not None else 0
        return size + sum(len(b) for b in self._pending)

    # -- raw transport callbacks -------------------------------------------------------------------

    def _open(self) -> tuple[SSL.Connection | tls_connection.RecordIO, tls_connection.RecordIO]:
        """The connection and its record calls. Server side one object: an SSL object of the front context in
        accept state, without pyOpenSSL's ``Connection`` (``RecordIO.accepting``)."""
        io = tls_connection.RecordIO.accepting(self._context)
        return io, io

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._raw = transport  # type: ignore[assignment]
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        try:
            self._conn, self._io = self._open()
        except Exception as exc:  # e.g. a bad client-side verify name: nothing was sent yet
            self._fail_handshake(f"setup: {exc}")
            return
        if self._handshake_timeout is not None:
            if self._timers is not None:
                when = self._loop.time() + self._handshake_timeout
                self._timer = self._timers.at(when, self._on_handshake_timeout)
            else:
                self._timer = self._loop.call_later(self._handshake_timeout, self._on_handshake_timeout)
        if not self._server_side:
            self._do_handshake()  # emit the ClientHello

    def data_received(self, data: bytes) -> None:
        io = self._io
        if self._conn is None or io is None or self._handshake_failed:
            return
        try:
            io.feed(data)
        except SSL.Error as exc:
            self._fatal(exc)
            return
        if not self._handshake_done:
            self._do_handshake()
            if not self._handshake_done:
                return
        if self._pending:
            self._retry_pending()
        self._deliver()

    def eof_received(self) -> bool:
        self._raw_eof = True
        if not self._handshake_done:
            self._fail_handshake("eof during handshake")
            return True  # we closed it already
        # A FIN without close_notify: tell the app anyway (HTTP framing detects truncation). If the app
        # is paused with plaintext still buffered, the EOF waits behind that data.
        self._deliver()
        return True  # closing is ours to do (close_notify first), never the raw transport's

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._closing = True
        self._cancel_timer()
        if not self._handshake_done and not self._handshake_failed:
            self._fail_handshake("connection lost during handshake")
        app = self._app
        self._app = None
        self._app_transport = None  # it points back at us: the pair would wait for the cyclic GC
        if app is not None:
            try:
                app.connection_lost(exc or self._fatal_exc)  # type: ignore[arg-type]
            finally:
                self._conn = None
        else:
            self._conn = None
        self._raw = None
        self._io = None

    def pause_writing(self) -> None:
        self._raw_paused_writing = True
        if self._app is not None:
            self._app.pause_writing()

    def resume_writing(self) -> None:
        self._raw_paused_writing = False
        if self._app is not None:
            self._app.resume_writing()

    # -- handshake ---------------------------------------------------------------------------------

    def _do_handshake(self) -> None:
        io = self._io
        assert io is not None
        try:
            if not io.handshake():  # OpenSSL wants the peer's next flight
                self._flush()
                return
        except SSL.Error as exc:
            self._flush()  # the alert, so the peer learns why
            self._fail_handshake(tls_connection.ssl_error_reason(exc))
            return
        if self._server_side:
            self._tickets_held = True  # all the server wrote now is its tickets: they go with the first write
        else:
            self._flush()  # the client's last flight
        self._complete_handshake()

    def _complete_handshake(self) -> None:
        self._handshake_done = True
        self._cancel_timer()
        conn = self._conn
        assert conn is not None
        if self._on_handshake_done is not None:
            try:
                self._on_handshake_done(conn)
            except Exception:
                log.exception("TLS: on_handshake_done failed; dropping the connection")
                self.abort()
        if self._hs_future is not None and not self._hs_future.done():
            self._hs_future.set_result(None)
        if self._closing:  # the callback closed us (e.g. policy)
            return
        self._app = self._app_factory()
        self._app_transport = TLSAppTransport(self)
        self._app.connection_made(self._app_transport)
        if self._raw_paused_writing and self._app is not None:
            self._app.pause_writing()

    def _on_handshake_timeout(self) -> None:
        self._timer = None
        if not self._handshake_done:
            self._fail_handshake("timeout")

    def _fail_handshake(self, reason: str) -> None:
        if self._handshake_failed:
            return
        self._handshake_failed = True
        self._fail_reason = reason
        self._closing = True
        self._cancel_timer()
        if self._on_handshake_error is not None:
            self._on_handshake_error(reason)
        if self._hs_future is not None and not self._hs_future.done():
            self._hs_future.set_exception(TLSHandshakeError(reason))
        if self._raw is not None and not self._lost:
            self._raw.abort()  # a failed peer gets no graceful close: its alert (if any) is already written

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- data path ---------------------------------------------------------------------------------

    def _flush(self) -> None:
        """Move everything OpenSSL produced into the raw transport: one write, whatever the records. Nothing
        while the session tickets are held: the first write, close_notify or an alert lets them go."""
        io = self._io
        if io is None or self._tickets_held:
            return
        self._soon_bytes = 0
        out = io.drain()
        raw = self._raw
        if out and raw is not None and not raw.is_closing():
            raw.write(out)

    def _deliver(self) -> None:
        """Hand decrypted plaintext to the app until OpenSSL wants more ciphertext or the app pauses."""
        io = self._io
        while io is not None and not self._app_paused and not self._closing and self._app is not None:
            chunks: list[bytes] = []
            size = 0
            want_more = False
            zero_return = False
            while size < _DELIVER_MAX:
                try:
                    data = io.read()
                except SSL.Error as exc:
                    if chunks:
                        self._app.data_received(b"".join(chunks))
                    self._tickets_held = False  # the alert must go out
                    self._flush()
                    self._fatal(exc)
                    return
                if data is None:  # OpenSSL needs more ciphertext
                    want_more = True
                    break
                if not data:  # the peer's close_notify
                    zero_return = True
                    break
                chunks.append(data)
                size += len(data)
            if chunks:
                self._app.data_received(chunks[0] if len(chunks) == 1 else b"".join(chunks))
            if zero_return:
                self._deliver_eof()
                break
            if want_more:
                if self._raw_eof:
                    self._deliver_eof()
                break
            io = self._io
        # Reads can produce output (key update replies): before the first response that waits with the tickets,
        # which RFC 8446 §4.6.3 allows (our KeyUpdate must precede our next application data, nothing more).
        self._flush()

    def _deliver_eof(self) -> None:
        if self._eof_delivered or self._app is None or self._closing:
            return
        self._eof_delivered = True
        keep_open = self._app.eof_received()
        if not keep_open:
            self.close()

    def pause_reading(self) -> None:
        if self._app_paused:
            return
        self._app_paused = True
        raw = self._raw
        if raw is not None and not raw.is_closing():
            raw.pause_reading()

    def resume_reading(self) -> None:
        if not self._app_paused:
            return
        self._app_paused = False
        raw = self._raw
        if raw is not None and not raw.is_closing():
            raw.resume_reading()
        # Plaintext may already sit decrypted in OpenSSL: deliver it from the loop, not from inside the
        # app's own call stack.
        if not self._deliver_scheduled and self._loop is not None:
            self._deliver_scheduled = True
            self._loop.call_soon(self._scheduled_deliver)

    def _scheduled_deliver(self) -> None:
        self._deliver_scheduled = False
        if self._handshake_done:
            self._deliver()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._take(data):
            self._flush()

    def write_soon(self, data: bytes | bytearray | memoryview) -> None:
        """``write``, its socket write at the end of the loop turn, so the responses a turn relays to many
        clients leave in one burst and each client wakes once (bench/README.md, "2026-12-06"); past
        ``SOON_MAX`` bytes at once, to meet ``pause_writing`` while the backend is read. Any other write, close
        or alert drains the BIO first: the order on the wire is the order of the calls."""
        if not self._take(data):
            return
        self._soon_bytes += len(data)
        if self._soon_bytes > SOON_MAX or self._loop is None:
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_due)

    def _flush_due(self) -> None:
        self._flush_scheduled = False
        if self._soon_bytes:
            self._flush()

    def _take(self, data: bytes | bytearray | memoryview) -> bool:
        """Plaintext into the outgoing BIO; False when dropped (after close, like asyncio transports) or kept
        in ``_pending`` behind a post-handshake message."""
        if self._write_eof_called:
            raise RuntimeError("write() after write_eof()")
        if self._closing or self._conn is None or not data:
            return False
        self._tickets_held = False  # they leave in the same socket write as this
        if self._pending:
            self._pending.append(bytes(data))
            return False
        self._encrypt(data)
        return True

    def _encrypt(self, data: bytes | bytearray | memoryview) -> None:
        io = self._io
        assert io is not None
        view: memoryview | None = None
        try:
            n = io.write(data)
            if n < len(data):  # partial writes are on in pyOpenSSL contexts; a memory BIO rarely needs one
                view = memoryview(data)[n:]
                while view:
                    n = io.write(view)
                    view = view[n:]
        except SSL.WantReadError:
            # Mid post-handshake message (key update): keep the rest until the peer's bytes arrive.
            self._pending.append(bytes(data if view is None else view))
        except SSL.Error as exc:
            self._fatal(exc)

    def _retry_pending(self) -> None:
        pending, self._pending = self._pending, []
        for i, data in enumerate(pending):
            self._encrypt(data)
            if self._pending:
                self._pending.extend(pending[i + 1 :])
                break
        self._flush()

    def _send_close_notify(self) -> None:
        io = self._io
        if io is None or self._shutdown_sent or not self._handshake_done:
            return
        self._shutdown_sent = True
        self._tickets_held = False  # before close_notify, so a client closed idle still gets them
        if self._pending:
            self._retry_pending()
        try:  # not contextlib.suppress: an interpreted context manager on every connection's close
            io.shutdown()  # writes close_notify; we do not wait for the peer's (like every server)
        except SSL.Error:
            pass
        self._flush()

    def write_eof(self) -> None:
        if self._write_eof_called or self._closing:
            return
        self._write_eof_called = True
        self._send_close_notify()
        raw = self._raw
        if raw is not None and not raw.is_closing() and raw.can_write_eof():
            try:
                raw.write_eof()
            except (OSError, RuntimeError):
                pass

    def close(self) -> None:
        """Graceful: pending plaintext, then close_notify (keeps the session resumable), then FIN."""
        if self._closing:
            return
        self._closing = True
        self._cancel_timer()
        self._send_close_notify()
        raw = self._raw
        if raw is not None:
            raw.close()

    def abort(self) -> None:
        self._closing = True
        self._cancel_timer()
        raw = self._raw
        if raw is not None:
            raw.abort()

    def _fatal(self, exc: BaseException) -> None:
        log.debug("TLS connection error: %s", exc)
        self._fatal_exc = ConnectionError(tls_connection.ssl_error_reason(exc))
        if not self._handshake_done:
            self._fail_handshake(tls_connection.ssl_error_reason(exc))
            return
        self.abort()

    # -- extra info --------------------------------------------------------------------------------

    def extra_info(self, name: str, default: Any) -> Any:
        conn = self._conn
        if name in TLS_KEYS:
            if conn is None:
                return default
            if name == "peercert":  # asked once per request by the bridge: converted once per connection
                if self._peercert_der is None:
                    self._peercert_der = tls_info(conn, name, None)
                return self._peercert_der if self._peercert_der is not None else default
            return tls_info(conn, name, default)
        raw = self._raw
        return raw.get_extra_info(name, default) if raw is not None else default


class TLSServerProtocol(TLSLayer):
    """Server side of TLS on an accepted connection.

    ``context`` is the server context (``SNIContexts.front`` for per-SNI certificates). ``app_factory`` is
    called once the handshake succeeds; the app then gets ``TLSAppTransport`` with the extra-info keys
    ``peername``, ``sockname``, ``sni``, ``tls_group``, ``tls_version``, ``tls_cipher``, ``peercert`` (client
    certificate, DER, or None), ``tls_session``, ``session_reused``, ``ssl_object``.
    ``on_handshake_error(reason)`` is called once for a failed handshake (OpenSSL error, ``"timeout"``
    after ``handshake_timeout`` seconds, EOF or loss mid-handshake); the raw transport is then aborted.
    ``on_handshake_done(conn)`` (``conn``: the layer's ``connection``, a ``RecordIO``) runs before the app is
    created; it may close the connection.
    """

    _server_side = True
