"""SendDeadlines (workers/l7/h2/send_deadline.py) on a real event loop, beside a stand-in of the two things it
reads of its connection: the engine's queued bytes per stream and the live streams.

What the fleet tests (test_fleet_h2_deadlines.py) cannot see from outside: a healthy connection keeps no
timer and no finished stream. Arming one per finished stream kept every stream for ``send_timeout_s`` and
made each write walk them all.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from workers.l7.h2.send_deadline import SendDeadlines


@dataclass
class Stream:
    sid: int
    submitted: int = 0
    write_paused: bool = False


class Engine:
    def __init__(self) -> None:
        self.queued: dict[int, int] = {}

    def buffered(self, sid: int | None = None) -> int:
        return self.queued.get(sid, 0) if sid is not None else sum(self.queued.values())


@dataclass
class Bridge:
    engine: Engine = field(default_factory=Engine)
    streams: dict[int, Stream] = field(default_factory=dict)
    cancelled: list[int] = field(default_factory=list)
    counted: list[str] = field(default_factory=list)

    def cancel_stream(self, st: Stream) -> None:
        self.cancelled.append(st.sid)
        self.engine.queued.pop(st.sid, None)

    @property
    def ctx(self) -> Bridge:
        return self

    def count(self, name: str) -> None:
        self.counted.append(name)


def _finish(bridge: Bridge, dl: SendDeadlines, st: Stream, queued: int) -> None:
    """The exchange of ``st`` ends with ``queued`` bytes of its response not yet written."""
    st.submitted += queued
    bridge.engine.queued[st.sid] = queued
    del bridge.streams[st.sid]
    dl.stream_done(st, bridge.engine.buffered(st.sid))


def test_streams_that_end_before_their_write_leave_no_timer() -> None:
    async def main() -> None:
        bridge = Bridge()
        dl = SendDeadlines(bridge, asyncio.get_running_loop(), 60.0)  # type: ignore[arg-type]
        for sid in range(1, 2001, 2):
            st = Stream(sid)
            bridge.streams[sid] = st
            _finish(bridge, dl, st, 100)
            assert dl.stalled  # noted: the next write decides
            bridge.engine.queued.clear()  # the write took every queued byte
            dl.progress()
            assert not dl.stalled
        assert len(asyncio.get_running_loop()._scheduled) == 0  # type: ignore[attr-defined]

    asyncio.run(main())


def test_a_finished_stream_behind_a_shut_window_is_reset_after_the_timeout() -> None:
    async def main() -> None:
        bridge = Bridge()
        dl = SendDeadlines(bridge, asyncio.get_running_loop(), 0.2)  # type: ignore[arg-type]
        st = Stream(1)
        bridge.streams[1] = st
        _finish(bridge, dl, st, 5000)
        dl.progress()  # the write left it queued: window-bound, its deadline starts
        assert dl.stalled
        deadline = asyncio.get_running_loop().time() + 5
        while not bridge.cancelled and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        assert bridge.cancelled == [1]
        assert bridge.counted == ["h2_stream_send_timeout"]
        assert not dl.stalled

    asyncio.run(main())


def test_a_slow_reader_is_not_cut_while_its_bytes_keep_leaving() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        bridge = Bridge()
        dl = SendDeadlines(bridge, loop, 0.3)  # type: ignore[arg-type]
        st = Stream(1)
        bridge.streams[1] = st
        _finish(bridge, dl, st, 10_000)
        dl.progress()
        end = loop.time() + 0.9  # three timeouts, one window's worth of bytes every 0.1 s
        while loop.time() < end:
            await asyncio.sleep(0.1)
            bridge.engine.queued[1] -= 100
            dl.progress()
        assert bridge.cancelled == []
        bridge.engine.queued[1] = 0  # the last byte left
        dl.progress()
        assert not dl.stalled

    asyncio.run(main())


def test_a_live_stream_unpaused_drops_its_deadline() -> None:
    async def main() -> None:
        bridge = Bridge()
        dl = SendDeadlines(bridge, asyncio.get_running_loop(), 60.0)  # type: ignore[arg-type]
        st = Stream(1, write_paused=True)
        bridge.streams[1] = st
        bridge.engine.queued[1] = 70_000
        dl.stream_paused(st)
        assert dl.stalled
        st.write_paused = False  # its windows opened
        dl.progress()
        assert not dl.stalled

    asyncio.run(main())
