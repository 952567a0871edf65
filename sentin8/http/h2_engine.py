"""The HTTP/2 engine behind one adapter: the only module that imports it (issue 17 §5), sans-IO.

The engine is ``ngh2`` (libnghttp2 in a wheel; chosen by measurement, bench/README.md "HTTP/2 engine"). Nothing
it names leaves this module: the shell sees ``ServerConnection`` and the event classes below, so the engine
could be replaced by rewriting this file alone.

``ServerConnection`` is one client connection, server side (``ClientConnection``, the client side the probe
uses, is at the end). The I/O shell drives it:

    events = conn.receive(data)     # bytes read from TLS -> our events, in protocol order
    ... act on them (conn.send_head / send_data / reset / consume ...)
    out = conn.data_to_send()       # bytes for the transport; then conn.take_events() if conn.events_waiting
    if conn.ended: close once ``out`` is written

What the engine does on its own (verified in tests/test_h2_engine.py): SETTINGS and PING acknowledgements,
HPACK, frame sizes, the peer's flow-control windows (``send_data`` queues; DATA leaves as the windows allow,
in frames of at most the peer's max frame size), RFC 9113 §8 field syntax (``FIELDS_CHECKED``), and nghttp2's
attack limits: at most ``max_continuations`` CONTINUATION frames, the decoded header list bounded in bytes
(RFC 9113's 32 B per field) and in fields, RST_STREAM and "glitch" token buckets, at most
``max_queued_acks`` unsent ACKs, a zero WINDOW_UPDATE = PROTOCOL_ERROR. What it does not do is in
``sentin8/http/h2_budget.py``.

The receive side is flow-controlled by hand: a DATA payload counts against the windows until the shell says
``consume(stream, n)`` (the upstream accepted the bytes), so a slow upstream stops one stream, not the
connection. Bytes of a stream whose response is complete (or that was reset) are consumed here at once.
"""

from __future__ import annotations

import ngh2

from .h2_codes import (
    ENHANCE_YOUR_CALM,
    INTERNAL_ERROR,
    NO_ERROR,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    error_name,
    goaway_frame,
)
from .h2_events import (
    REASONS,
    ClientResponse,
    ConnectionEnded,
    Event,
    GoAwayReceived,
    GoAwaySent,
    Header,
    RequestData,
    RequestHeaders,
    RequestTrailers,
    StreamRefused,
    StreamReset,
    WindowOpened,
)
from .h2_limits import H2Limits
from .nghttp2_private import release_framebuf

# The engine refuses every field name and value that RFC 9113 §8.2.1 forbids, exactly as
# ``h2_request.map_request`` would (pinned by tests/test_h2_engine.py): the mapping may skip those checks.
FIELDS_CHECKED = True


# An engine-initiated GOAWAY's code -> counter. nghttp2 answers its RST_STREAM rate limit with INTERNAL_ERROR
# and its glitch limit (PRIORITY, empty DATA, malformed-block floods) with ENHANCE_YOUR_CALM.
_GOAWAY_REASON = {
    PROTOCOL_ERROR: "h2_protocol_error",
    INTERNAL_ERROR: "h2_rst_flood",
    0x3: "h2_flow_control_error",
    0x5: "h2_stream_closed_error",
    0x6: "h2_frame_size_error",
    0x9: "h2_compression_error",
    ENHANCE_YOUR_CALM: "h2_glitch_flood",
}
# A fatal DenialOfServiceError, by its message -> counter (the engine then has no session to write a GOAWAY)
_DOS_REASON = (
    ("CONTINUATION", "h2_continuation_flood"),
    ("exceeds configured size", "h2_header_list_too_large"),
    ("exceeds configured count", "h2_header_fields_too_many"),
    ("Flooding", "h2_ack_flood"),
)


def _dos_reason(message: str) -> str:
    """The counter of a fatal DenialOfServiceError (a function: no closure in a cpdef method's body)."""
    for key, reason in _DOS_REASON:
        if key in message:
            return reason
    return "h2_engine_error"


_DRAIN_PING = b"s8-drain"

# Reads are fed to the engine in slices of this size, its output taken between them. The engine counts a
# stream it reset (a malformed block, DATA beyond content-length) against SETTINGS_MAX_CONCURRENT_STREAMS
# until its RST_STREAM is written: fed 16 KiB of such streams at once, it would take the 101st for a client
# over the cap (GOAWAY PROTOCOL_ERROR) before our budget saw one of them. 1 KiB holds fewer than 100 (the
# default ``http2.max_concurrent_streams``) of the smallest (HEADERS + DATA, ~24 B), so the premature-reset
# budget answers MadeYouReset, as it does Rapid Reset; under a cap below ~40 the engine's PROTOCOL_ERROR may
# answer such a burst first, which ends it as surely.
_SLICE = 1024
_STATUS = {s: b"%d" % s for s in (100, 103, 200, 201, 204, 206, 301, 302, 304, 400, 403, 404, 500, 502, 503)}

# per-stream flags
_REQ_DONE = 1  # END_STREAM (or trailers) received
_RESP_DONE = 2  # our END_STREAM queued
_RESET = 4  # reset by either side: the engine's close event is not news

# the engine's event types, bound once (the dispatch in _translate runs per event)
_E_DataReceived, _E_RequestReceived, _E_StreamClosed, _E_StreamReset = (
    ngh2.DataReceived, ngh2.RequestReceived, ngh2.StreamClosed, ngh2.StreamReset)  # fmt: skip
_E_TrailersReceived, _E_WindowUpdated, _E_SettingsReceived, _E_PingReceived = (
    ngh2.TrailersReceived, ngh2.WindowUpdated, ngh2.SettingsReceived, ngh2.PingReceived)  # fmt: skip
_E_PriorityUpdateReceived, _E_PingAcknowledged, _E_GoAwayReceived, _E_ConnectionClosed = (
    ngh2.PriorityUpdateReceived, ngh2.PingAcknowledged, ngh2.GoAwayReceived, ngh2.ConnectionClosed)  # fmt: skip

# the engine's stream-scoped "this stream is gone" errors, and its "the connection is going" ones
_GONE = (ngh2.StreamProtocolError, ngh2.ConnectionStateError, ngh2.ConnectionClosingError)
_GONE_OR_BAD = (ValueError, *_GONE)  # a name, not ``(ValueError, *_GONE)`` inline: Cython takes no star there


class ServerConnection:
    """One HTTP/2 connection, server side, over the engine; see the module docstring for the driving loop."""

    __slots__ = (
        "_c",
        "_conn_window",
        "_dead",
        "_drain",
        "_final",
        "_late",
        "_opened",
        "_peer_goaway",
        "_reduction",
        "_rst_after_flush",
        "_streams",
        "_unconsumed",
        "control",
        "ended",
        "events_waiting",
        "last_stream_id",
        "payload",
        "received",
    )

    def __init__(self, limits: H2Limits) -> None:
        cfg = ngh2.Configuration(
            auto_window_update=False,
            max_outbound_ack=limits.max_queued_acks,
            max_continuations=limits.max_continuations,
            stream_reset_rate_limit=limits.reset_rate,
            glitch_rate_limit=limits.glitch_rate,
            max_inbound_header_list_size=limits.max_header_list_bytes,
            max_inbound_header_count=limits.max_header_fields,
            max_deflate_dynamic_table_size=limits.header_table,
        )
        self._c = ngh2.Connection(ngh2.Role.SERVER, cfg)
        # no SETTINGS_ENABLE_CONNECT_PROTOCOL: RFC 8441 (WebSocket over h2) is not served
        self._c.initiate_connection(
            {
                ngh2.Setting.HEADER_TABLE_SIZE: limits.header_table,
                ngh2.Setting.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
                ngh2.Setting.INITIAL_WINDOW_SIZE: limits.initial_window,
                ngh2.Setting.MAX_FRAME_SIZE: limits.max_frame,
                ngh2.Setting.MAX_HEADER_LIST_SIZE: limits.max_header_list_bytes,
            }
        )
        self._conn_window = max(limits.connection_window, 65535)
        if self._conn_window > 65535:
            self._c.set_local_window_size(self._conn_window)
        self._reduction = 0  # the engine's "recv_reduction" our window repairs have left (see _give_back)
        self._unconsumed: dict[int, int] = {}  # stream -> DATA bytes delivered and not yet consumed
        self._streams: dict[int, int] = {}  # stream id -> flags, from its request until the engine closes it
        self._opened: set[int] = set()  # windows opened during this receive()
        self._rst_after_flush: list[int] = []  # complete responses whose request is not: RST NO_ERROR after
        self._late: list[Event] = []  # events produced while sending, for take_events()
        self._drain = 0  # 0 no, 1 notice sent (awaiting the PING ack), 2 final GOAWAY sent
        self._final = b""  # output taken from the engine early, or our own GOAWAY when it failed
        self._dead = False  # the engine dropped its session (a fatal error): only _final is left to write
        self._peer_goaway: int | None = None  # the error code of the client's GOAWAY
        self.ended: ConnectionEnded | None = None
        self.events_waiting = False
        self.last_stream_id = 0  # the highest stream a request event was given for
        self.received = 0  # bytes fed to receive(), frame headers and all
        self.payload = 0  # DATA bytes received + response body bytes submitted: nginx's "payload"
        self.control = 0  # PING, SETTINGS, WINDOW_UPDATE and PRIORITY_UPDATE frames received

    # -- input -----------------------------------------------------------------------------------------

    def receive(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """Feed bytes read from the client; returns the events they make, in protocol order."""
        if self.ended is not None:
            return []
        self.received += len(data)
        c = self._c
        try:
            if len(data) <= _SLICE:
                c.receive_data(data)
            else:
                view = memoryview(data)
                for at in range(0, len(view), _SLICE):
                    c.receive_data(view[at : at + _SLICE])
                    if c.want_write:  # its own RSTs: out now, so the streams they end no longer count
                        self._final += c.data_to_send()
                    if not c.want_read:
                        break  # the engine is closing (its GOAWAY is in _final): the rest is not read
        except ngh2.DenialOfServiceError as exc:
            return self._fail(_dos_reason(str(exc)), ENHANCE_YOUR_CALM)
        except ngh2.ConnectionStateError:
            return []  # the engine is already closing: what arrives now is not read
        except ngh2.ConnectionProtocolError:
            return self._fail("h2_protocol_error", PROTOCOL_ERROR)
        except ngh2.NGH2Error:
            return self._fail("h2_engine_error", INTERNAL_ERROR)
        events = self._late
        if events:
            self._late = []
            self.events_waiting = False
        else:
            events = []
        self._translate(self._c.events(), events)
        if self._opened:
            for sid in sorted(self._opened):  # a loop, not a generator: Cython takes none in a cpdef method
                events.append(WindowOpened(sid))
            self._opened.clear()
        if self.ended is None and not self._c.want_read:
            # the engine reads no more: it queued its own GOAWAY (a limit, a protocol error), or the client's
            # GOAWAY left no stream open. Take its output now to learn the code (ConnectionClosed)
            self._final += self._c.data_to_send()
            self._translate(self._c.events(), events)
            if self.ended is None:
                self.ended = ConnectionEnded("", NO_ERROR)
                events.append(self.ended)
        return events

    def _fail(self, reason: str, code: int) -> list[Event]:
        """The engine gave up on the connection and kept no session: answer with our own GOAWAY."""
        self._final += goaway_frame(self.last_stream_id, code)
        self._dead = True
        self.ended = ConnectionEnded(reason, code)
        self._streams.clear()
        return [self.ended]

    def _translate(self, raw: list[object], out: list[Event]) -> None:
        streams = self._streams
        for ev in raw:
            t = type(ev)
            if t is _E_DataReceived:
                sid = ev.stream_id  # type: ignore[attr-defined]
                data = ev.data  # type: ignore[attr-defined]
                self.payload += len(data)
                flags = streams.get(sid, _RESET)
                if flags & (_RESP_DONE | _RESET):
                    if data:  # nobody will take these bytes: give the window back now
                        self._ack(sid, len(data))
                    continue
                if ev.end_stream:  # type: ignore[attr-defined]
                    streams[sid] = flags | _REQ_DONE
                if data:
                    self._unconsumed[sid] = self._unconsumed.get(sid, 0) + len(data)
                out.append(RequestData(sid, data, ev.end_stream))  # type: ignore[attr-defined]
            elif t is _E_RequestReceived:
                sid = ev.stream_id  # type: ignore[attr-defined]
                end = ev.end_stream  # type: ignore[attr-defined]
                streams[sid] = _REQ_DONE if end else 0
                if sid > self.last_stream_id:
                    self.last_stream_id = sid
                out.append(RequestHeaders(sid, ev.headers, end))  # type: ignore[attr-defined]
            elif t is _E_StreamClosed:
                sid = ev.stream_id  # type: ignore[attr-defined]
                code = ev.error_code  # type: ignore[attr-defined]
                flags = streams.pop(sid, None)
                left = self._unconsumed.pop(sid, 0) if self._unconsumed else 0
                if left:
                    self._give_back(left)
                if flags is None:
                    if code:
                        out.append(StreamRefused(sid, code, "h2_malformed"))
                elif not flags & _RESET and (code or ev.local_error is not None):  # type: ignore[attr-defined]
                    out.append(StreamReset(sid, code or INTERNAL_ERROR, False))
            elif t is _E_StreamReset:
                sid = ev.stream_id  # type: ignore[attr-defined]
                flags = streams.get(sid)
                if flags is not None and not flags & _RESET:
                    streams[sid] = flags | _RESET
                    out.append(StreamReset(sid, ev.error_code, True))  # type: ignore[attr-defined]
            elif t is _E_TrailersReceived:
                sid = ev.stream_id  # type: ignore[attr-defined]
                flags = streams.get(sid, _RESET)
                if not flags & (_RESP_DONE | _RESET):
                    streams[sid] = flags | _REQ_DONE
                    out.append(RequestTrailers(sid, ev.headers))  # type: ignore[attr-defined]
            elif t is _E_WindowUpdated:
                self.control += 1
                self._opened.add(ev.stream_id)  # type: ignore[attr-defined]
            elif t is _E_SettingsReceived:
                self.control += 1
                if ngh2.Setting.INITIAL_WINDOW_SIZE in ev.settings:  # type: ignore[attr-defined]
                    self._opened.add(0)  # every stream's window moved
            elif t is _E_PingReceived or t is _E_PriorityUpdateReceived:
                self.control += 1
            elif t is _E_PingAcknowledged:
                if self._drain == 1 and ev.opaque_data == _DRAIN_PING:  # type: ignore[attr-defined]
                    out.append(GoAwaySent(self.finish_drain()))
            elif t is _E_GoAwayReceived:
                self._peer_goaway = ev.error_code  # type: ignore[attr-defined]
                out.append(GoAwayReceived(ev.last_stream_id, ev.error_code))  # type: ignore[attr-defined]
            elif t is _E_ConnectionClosed and self.ended is None:
                code = ev.error_code  # type: ignore[attr-defined]
                if code == NO_ERROR:
                    reason = ""
                elif code == self._peer_goaway:
                    reason = "h2_peer_goaway_error"  # the client closed with an error of its own
                else:
                    reason = _GOAWAY_REASON.get(code, "h2_engine_error")
                self.ended = ConnectionEnded(reason, code)
                out.append(self.ended)
            # SettingsAcknowledged, AltSvc, Origin, PushedStream: nothing for a server to do

    # -- flow control (receive side) -------------------------------------------------------------------

    def consume(self, stream_id: int, n: int) -> None:
        """The upstream accepted ``n`` body bytes of ``stream_id``: give them back to both windows."""
        left = self._unconsumed.get(stream_id, 0)
        n = min(n, left)
        if n <= 0:
            return
        if n == left:
            del self._unconsumed[stream_id]
        else:
            self._unconsumed[stream_id] = left - n
        self._ack(stream_id, n)

    def _release(self, stream_id: int) -> None:
        """Nobody will take this stream's delivered bytes (we end or reset it): back to the windows now."""
        left = self._unconsumed.pop(stream_id, 0)
        if left:
            self._ack(stream_id, left)

    def _give_back(self, n: int) -> None:
        """Return ``n`` bytes of a stream the engine has already closed to the connection window.

        The engine counts a stream's unconsumed bytes against the connection window and, once it has closed
        the stream, refuses to consume them, so every reset carrying unconsumed bytes would shrink the window
        for good (16 such resets of 64 KiB stall a 1 MiB connection). Raising the window target by ``n`` sends
        WINDOW_UPDATE(0, n); lowering it back takes the dead bytes out of the engine's account. The engine
        remembers the lowering ("recv_reduction", ``_reduction`` here) and cancels it against the next
        raise, so each raise adds it back. Pinned by tests/test_h2_engine.py (window repair). The total stays far
        below the 2^31-1 window limit: at most max_streams (budget) x the initial stream window per connection.
        """
        try:
            self._c.set_local_window_size(self._conn_window + n + self._reduction)
            self._c.set_local_window_size(self._conn_window)
        except (ValueError, ngh2.NGH2Error):
            return  # the connection is going anyway
        self._reduction += n

    def _ack(self, stream_id: int, n: int) -> None:
        try:
            self._c.acknowledge_received_data(n, stream_id)
        except _GONE_OR_BAD:
            pass  # a closed stream's bytes went back to the connection window with its close

    # -- output ----------------------------------------------------------------------------------------

    def send_interim(self, stream_id: int, status: int, fields: list[Header]) -> bool:
        """A 1xx (100 Continue, 103 Early Hints) before the final head. False: the stream is gone."""
        try:
            self._c.send_informational_response(stream_id, self._head(status, fields))
        except _GONE:
            return False
        return True

    def send_head(self, stream_id: int, status: int, fields: list[Header], end_stream: bool = False) -> bool:
        """The final response head; ``fields`` without hop-by-hop ones (``response_headers`` drops them),
        names in any case. ``end_stream`` for HEAD/204/304 and empty bodies. False: the stream is gone."""
        try:
            self._c.send_response(stream_id, self._head(status, fields), end_stream=end_stream)
        except _GONE:
            return False
        if end_stream:
            self._response_done(stream_id)
        return True

    def send_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> bool:
        """Queue body bytes; they leave within the client's windows and max frame size (``buffered`` says how
        many still wait, ``sendable`` how many the windows take now). False: the stream is gone."""
        try:
            self._c.send_data(stream_id, data, end_stream=end_stream)
        except _GONE:
            return False
        self.payload += len(data)
        if end_stream:
            self._response_done(stream_id)
        return True

    def send_trailers(self, stream_id: int, fields: list[Header]) -> bool:
        """Trailers after the queued body; they end the stream. False: the stream is gone."""
        try:
            self._c.send_trailers(stream_id, [(n.lower(), v) for n, v in fields])
        except _GONE:
            return False
        self._response_done(stream_id)
        return True

    def end_stream(self, stream_id: int) -> bool:
        """End the response after its queued body. False: the stream is gone."""
        try:
            self._c.end_stream(stream_id)
        except _GONE:
            return False
        self._response_done(stream_id)
        return True

    def reset(self, stream_id: int, error_code: int = 0x8) -> bool:
        """RST_STREAM (CANCEL by default; REFUSED_STREAM for a stream never processed, which the client may
        retry). False when the stream was already gone."""
        flags = self._streams.get(stream_id)
        if flags is None or flags & _RESET:
            return False
        self._streams[stream_id] = flags | _RESET
        self._release(stream_id)
        try:
            self._c.reset_stream(stream_id, error_code)
        except _GONE:
            return False
        return True

    def refuse(self, stream_id: int) -> bool:
        """REFUSED_STREAM: the request was not processed at all (over the concurrency cap)."""
        return self.reset(stream_id, REFUSED_STREAM)

    def _head(self, status: int, fields: list[Header]) -> list[Header]:
        statuses = _STATUS  # a local: no bound .get made per response when compiled
        head = [(b":status", statuses.get(status) or b"%d" % status)]
        head += [(n.lower(), v) for n, v in fields]
        return head

    def _response_done(self, stream_id: int) -> None:
        flags = self._streams.get(stream_id)
        if flags is None:
            return
        self._streams[stream_id] = flags | _RESP_DONE
        if not flags & _REQ_DONE:
            self._release(stream_id)  # the exchange is over: what the client sent is not wanted
            # RFC 9113 §8.1: a complete response may end a request that is not; tell the client to stop
            # sending (RST_STREAM NO_ERROR), once the response has left, as nginx does
            self._rst_after_flush.append(stream_id)

    def data_to_send(self) -> bytes:
        """The bytes to write now (b"" when none)."""
        out, self._final = self._final, b""
        if self._dead:
            return out
        try:
            out += self._c.data_to_send()
            if self._rst_after_flush:
                waiting = []
                for sid in self._rst_after_flush:
                    if self._c.queued_body_size(sid):
                        waiting.append(sid)  # its response is still leaving
                    elif sid in self._streams:
                        self.reset(sid, NO_ERROR)
                self._rst_after_flush = waiting
                out += self._c.data_to_send()
        except ngh2.NGH2Error:
            self._dead = True
            if self.ended is None:
                self.ended = ConnectionEnded("h2_engine_error", INTERNAL_ERROR)
                self._late.append(self.ended)
                self.events_waiting = True
            return out
        raw = self._c.events()
        if raw:
            self._translate(raw, self._late)
            self.events_waiting = bool(self._late)
        return out

    def release_idle_memory(self) -> int:
        """Once everything is sent and no stream is open: give the engine's 16 KiB frame buffer back to the
        kernel (``nghttp2_private``); the bytes released. The next frame maps it in again."""
        if self._dead:
            return 0
        return release_framebuf(self._c)

    def take_events(self) -> list[Event]:
        """Events produced while sending (a stream the engine failed, the connection's end)."""
        events, self._late = self._late, []
        self.events_waiting = False
        return events

    # -- the peer's windows ----------------------------------------------------------------------------

    def buffered(self, stream_id: int | None = None) -> int:
        """Body bytes submitted and not yet framed (for one stream, or all)."""
        try:
            return self._c.queued_body_size(stream_id)
        except _GONE:
            return 0

    def sendable(self, stream_id: int) -> int:
        """Body bytes the client's windows would take for ``stream_id`` right now, beyond what is queued."""
        try:
            window = min(self._c.remote_window_size, self._c.stream_remote_window_size(stream_id))
            return max(0, window - self._c.queued_body_size(stream_id))
        except _GONE_OR_BAD:
            return 0

    # -- shutdown --------------------------------------------------------------------------------------

    def drain(self) -> None:
        """Step one of a graceful close: GOAWAY(2^31-1) and a PING. Its ACK (one round trip: every stream the
        client sent before it has arrived) sends the final GOAWAY, reported as ``GoAwaySent``; a shell whose
        deadline passes first calls ``finish_drain`` itself."""
        if self._drain or self.ended is not None:
            return
        self._drain = 1
        try:
            self._c.send_shutdown_notice()
            self._c.ping(_DRAIN_PING)
        except _GONE:
            pass

    def finish_drain(self) -> int:
        """Step two: the final GOAWAY naming the last stream we had a request for; returns that id."""
        if self._drain != 2:
            self._drain = 2
            self.goaway(NO_ERROR)
        return self.last_stream_id

    def goaway(self, error_code: int = NO_ERROR, debug: bytes = b"") -> None:
        """A final GOAWAY now; streams up to ``last_stream_id`` are still served (nginx's keepalive_requests)."""
        try:
            self._c.send_goaway(error_code, last_stream_id=self.last_stream_id, debug_data=debug)
        except _GONE:
            pass

    def close(self, error_code: int, reason: str) -> ConnectionEnded:
        """End the connection now (a budget said so): GOAWAY ``error_code``, no stream served any further."""
        if self.ended is None:
            self.ended = ConnectionEnded(reason, error_code)
            try:
                self._c.terminate_connection(error_code, last_stream_id=self.last_stream_id)
            except ngh2.NGH2Error:
                self._final = goaway_frame(self.last_stream_id, error_code)
                self._dead = True
        return self.ended

    @property
    def streams(self) -> int:
        """Streams the engine still tracks for a request (open, or closing)."""
        return len(self._streams)


class ClientConnection:
    """One HTTP/2 connection, client side: requests out, each response collected whole (``ClientResponse``).

        sid = conn.request(fields, body)   # fields: pseudo-headers first, names lower case
        out = conn.data_to_send()          # write it, then feed what the server sends
        conn.receive(data)                 # until conn.responses[sid].done, or conn.ended

    Receive windows are the engine's own (a response is read as fast as it comes); push is refused by
    SETTINGS_ENABLE_PUSH = 0. A protocol error ends the connection with the engine's reason.
    """

    __slots__ = ("_c", "ended", "responses")

    def __init__(self) -> None:
        self._c = ngh2.Connection(ngh2.Role.CLIENT, ngh2.Configuration())
        self._c.initiate_connection({ngh2.Setting.ENABLE_PUSH: 0})
        self.responses: dict[int, ClientResponse] = {}
        self.ended: ConnectionEnded | None = None

    def request(self, fields: list[Header], body: bytes = b"") -> int:
        sid = self._c.send_request(fields, end_stream=not body)
        if body:
            self._c.send_data(sid, body, end_stream=True)
        self.responses[sid] = ClientResponse(sid)
        return sid

    def receive(self, data: bytes) -> None:
        if self.ended is not None:
            return
        try:
            self._c.receive_data(data)
        except ngh2.NGH2Error as exc:
            self.ended = ConnectionEnded(f"h2: {exc}", PROTOCOL_ERROR)
            return
        for ev in self._c.events():
            r = self.responses.get(getattr(ev, "stream_id", 0))
            t = type(ev)
            if t is _E_ConnectionClosed or (t is _E_GoAwayReceived and ev.error_code):  # type: ignore[attr-defined]
                if self.ended is None:
                    self.ended = ConnectionEnded(error_name(ev.error_code), ev.error_code)  # type: ignore[attr-defined]
            elif r is None or r.done:
                continue
            elif t is ngh2.InformationalResponseReceived:
                r.interim.append(ev.headers)  # type: ignore[attr-defined]
            elif t is ngh2.ResponseReceived:
                r.fields = ev.headers  # type: ignore[attr-defined]
                r.status = int(dict(r.fields).get(b":status", b"0"))
                r.done = ev.end_stream  # type: ignore[attr-defined]
            elif t is _E_DataReceived:
                r.body += ev.data  # type: ignore[attr-defined]
                r.done = ev.end_stream  # type: ignore[attr-defined]
            elif t is _E_TrailersReceived:
                r.trailers, r.done = ev.headers, True  # type: ignore[attr-defined]
            elif t is _E_StreamReset or t is _E_StreamClosed:
                r.reset, r.done = ev.error_code, True  # type: ignore[attr-defined]

    def data_to_send(self) -> bytes:
        return self._c.data_to_send()


# our names, re-exported for the shell: one import
__all__ = [  # noqa: RUF022 - grouped by kind
    "FIELDS_CHECKED", "REASONS", "H2Limits", "ServerConnection", "ClientConnection", "ClientResponse", "Event",
    "RequestHeaders", "RequestData",
    "RequestTrailers", "StreamReset", "StreamRefused", "WindowOpened", "GoAwayReceived", "GoAwaySent",
    "ConnectionEnded", "Header", "error_name", "goaway_frame",
]  # fmt: skip
