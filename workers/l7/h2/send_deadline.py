"""The response-side deadlines of one HTTP/2 connection: ``limits.send_timeout_s`` (nginx's ``send_timeout``),
the rule HTTP/1.1 connections keep too (``workers/l7/h1/connection.py``).

A client can stop taking a response in two ways, and each holds something of ours:

- **It keeps a window shut** (the stream's or the connection's, e.g. SETTINGS_INITIAL_WINDOW_SIZE = 0 and no
  WINDOW_UPDATE): the response waits in the engine; above ``stream.WRITE_HIGH`` the stream's upstream is no
  longer read (``write_paused``), and the stream keeps its place under the concurrency cap, its upstream
  connection and its queued bytes. A stream paused so that has sent no byte for ``send_timeout_s`` is reset
  with RST_STREAM CANCEL, its exchange aborted (the upstream connection closed, never pooled; counted
  ``client_aborted``) and counted ``h2_stream_send_timeout``. CANCEL, as HAProxy sends when it aborts a
  stream: the stream is no longer wanted. FLOW_CONTROL_ERROR would say the client broke the flow-control
  rules, which a shut window does not (nginx sends PROTOCOL_ERROR here, for the same non-reason). A stream
  whose exchange is over (the upstream sent all, below WRITE_HIGH) but whose response is still queued
  behind the shut window keeps the same deadline: no byte sent for ``send_timeout_s``, RST_STREAM CANCEL,
  so its queued bytes and its place in the engine go too.
- **It stops reading the socket**: the transport's buffer stays above its high-water mark (``pause_writing``
  without ``resume_writing``) for ``send_timeout_s``: GOAWAY NO_ERROR (nginx ends a timed-out connection with
  NO_ERROR too) and the connection is aborted, counted ``h2_send_timeout``. Aborted, not closed: a close
  waits for the buffer to drain, which is what this client never lets happen; the GOAWAY is queued first,
  best effort.

Only the loop's timers, never a poll: one per stalled stream, armed when its upstream is paused, and one per
connection, armed at ``pause_writing`` and cancelled at ``resume_writing``. The deadline runs from the
stream's last byte sent (nginx's rule: between two successive writes, not for the whole response): each
write of the connection (``progress``) notes which stalled streams sent bytes, and a timer that fires early
re-arms for the rest, so a slow reader is not cut and a stopped one is, ``send_timeout_s`` after its last
byte left.

A stream's exchange usually ends with the end of its response still queued: the connection writes once per
loop turn (``H2Bridge.flush_soon``), after the exchange is done. So a finished stream with queued bytes is
only *noted* (``_finishing``, no timer); the write that follows either takes its last bytes (the note goes)
or leaves some behind a shut window (then its deadline starts). Every write also drops the deadlines that
no longer hold anything: a finished stream whose last byte left, a live one no longer paused. So a healthy
connection holds no timer and ``progress`` walks at most the streams of one turn; arming a timer per
finished stream instead kept every stream (and a timer) for ``send_timeout_s`` and made each write walk
them all (issue 18's h2 profile: a quarter of a worker's time).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .connection import H2Bridge
    from .stream import H2Stream


class SendDeadlines:
    """The per-stream and per-connection send deadlines of one ``H2Bridge``."""

    __slots__ = ("_bridge", "_finishing", "_loop", "_socket", "_stalled", "timeout")

    def __init__(self, bridge: H2Bridge, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self._bridge = bridge
        self._loop = loop
        self.timeout = timeout
        # stream id -> [timer, bytes it had sent when last seen moving, when that was, the stream]
        self._stalled: dict[int, list] = {}
        # finished streams whose response was still queued when their exchange ended: judged at the next write
        self._finishing: list[H2Stream] = []
        self._socket: asyncio.TimerHandle | None = None

    # -- streams --------------------------------------------------------------------------------------
    def stream_paused(self, st: H2Stream) -> None:
        """``st``'s response is queued above WRITE_HIGH (its upstream paused): its deadline starts, unless one
        runs already (it judges by the bytes sent since)."""
        if st.sid not in self._stalled:
            self._arm(st)

    def stream_done(self, st: H2Stream, queued: int) -> None:
        """``st``'s exchange is over with ``queued`` bytes of its response not yet framed (the engine's count,
        which the connection has at hand): its deadline goes, unless some are still queued, which keeps a
        running one; otherwise the next write decides (``progress``)."""
        if queued:
            if st.sid not in self._stalled:
                self._finishing.append(st)
            return
        entry = self._stalled.pop(st.sid, None)
        if entry is not None:
            entry[0].cancel()

    @property
    def stalled(self) -> bool:
        """Whether a write has anything to tell this object (``progress``)."""
        return bool(self._stalled) or bool(self._finishing)

    def progress(self) -> None:
        """After a write: a stalled stream whose bytes left moves its deadline (lazily: its timer re-arms); a
        deadline that holds nothing any more goes; a finished stream still queued after it starts one."""
        engine = self._bridge.engine
        streams = self._bridge.streams
        if self._stalled:
            now = self._loop.time()
            for sid, entry in list(self._stalled.items()):
                st = entry[3]
                # live: its windows opened (a new pause starts a new deadline); finished: its last byte left
                gone = not st.write_paused if streams.get(sid) is st else not engine.buffered(sid)
                if gone:
                    del self._stalled[sid]
                    entry[0].cancel()
                    continue
                sent = self._sent(st)
                if sent > entry[1]:
                    entry[1], entry[2] = sent, now
        if self._finishing:
            finishing, self._finishing = self._finishing, []
            if not engine.buffered():
                return  # nothing queued on any stream (the usual write): every finished one has left whole
            for st in finishing:
                if st.sid not in self._stalled and streams.get(st.sid) is not st and engine.buffered(st.sid):
                    self._arm(st)  # behind a shut window: from now on it must move within the timeout

    def _arm(self, st: H2Stream) -> None:
        now = self._loop.time()
        handle = self._loop.call_at(now + self.timeout, self._stream_due, st)
        self._stalled[st.sid] = [handle, self._sent(st), now, st]

    def _sent(self, st: H2Stream) -> int:
        """Body bytes of ``st`` the engine has framed (they left within the windows)."""
        return st.submitted - self._bridge.engine.buffered(st.sid)

    def _stream_due(self, st: H2Stream) -> None:
        entry = self._stalled.pop(st.sid, None)
        bridge = self._bridge
        if entry is None or entry[3] is not st:
            return
        if bridge.streams.get(st.sid) is st:
            if not st.write_paused:
                return  # its windows opened: a new pause starts a new deadline
        elif not bridge.engine.buffered(st.sid):
            return  # its exchange is over and the last of its response has left (or it was reset)
        sent, now = self._sent(st), self._loop.time()
        if sent > entry[1]:
            entry[1], entry[2] = sent, now
        due = entry[2] + self.timeout
        if due > now + 0.001:  # bytes left since it was armed: slow, not stopped; due from the last of them
            entry[0] = self._loop.call_at(due, self._stream_due, st)
            self._stalled[st.sid] = entry
            return
        bridge.ctx.count("h2_stream_send_timeout")
        bridge.cancel_stream(st)

    # -- the socket -----------------------------------------------------------------------------------
    def socket_paused(self) -> None:
        if self._socket is None:
            self._socket = self._loop.call_later(self.timeout, self._socket_due)

    def socket_resumed(self) -> None:
        handle, self._socket = self._socket, None
        if handle is not None:
            handle.cancel()

    def _socket_due(self) -> None:
        self._socket = None
        self._bridge.ctx.count("h2_send_timeout")
        self._bridge.send_stalled()

    def stop(self) -> None:
        """The connection is gone: no timer may keep it (or a stream) alive."""
        self.socket_resumed()
        for entry in self._stalled.values():
            entry[0].cancel()
        self._stalled.clear()
        self._finishing.clear()
