"""HTTP/2 per-stream and per-block deadlines through the whole fleet: real PQ TLS from a network namespace,
hand-built frames (tests/h2frames.py), the h1 limits (``limits.idle_timeout_s`` for a request body,
``limits.header_timeout_s`` for a head) applied to a stream and to an open header block."""

from __future__ import annotations

import time

import hpack
from hyperframe.frame import DataFrame, GoAwayFrame, HeadersFrame, RstStreamFrame

from sentin8.http import h2_codes
from tests import h2frames
from tests.h2client import RawH2Client
from tests.netns import external_host  # noqa: F401 - fixture
from tests.peers import wait_until
from tests.test_fleet_l7 import l7_fleet

H2_ON = "\n[http2]\nenabled = true\n"
SNI = "shop.apps.test"


def post_fields(length: int) -> list[tuple[bytes, bytes]]:
    return [*h2frames.request_fields(b"/upload", SNI.encode(), b"POST"), (b"content-length", b"%d" % length)]


def answers(frames, decoder: hpack.Decoder) -> dict[int, int]:
    """stream -> :status of its final response head, in the order the frames came."""
    out = {}
    for f in frames:
        if isinstance(f, HeadersFrame):
            fields = dict(decoder.decode(f.data, raw=True))
            if b":status" in fields and int(fields[b":status"]) >= 200:
                out[f.stream_id] = int(fields[b":status"])
    return out


def read_until(c: RawH2Client, done, timeout: float = 10.0) -> list:
    deadline = time.monotonic() + timeout
    frames: list = []
    while not done(frames):
        assert not c.eof, frames
        frames += c.read_frames(None, timeout=max(0.1, deadline - time.monotonic()))
    return frames


def ended(sid: int):
    def check(frames) -> bool:
        return any(
            f.stream_id == sid and (isinstance(f, RstStreamFrame) or "END_STREAM" in getattr(f, "flags", ()))
            for f in frames
        )

    return check


def test_an_idle_request_body_is_408_on_its_stream_and_the_connection_goes_on(
    external_host,  # noqa: F811
    fleet_factory,
    web,
):
    fleet = l7_fleet(fleet_factory, web, extra=H2_ON, limits="idle_timeout_s = 1", workers=1)
    c = RawH2Client(external_host.connect(fleet.port), SNI)
    decoder = hpack.Decoder()
    t0 = time.monotonic()
    c.send(c.frames.headers(1, post_fields(10), end_stream=False) + h2frames.data(1, b"abc"))
    frames = read_until(c, ended(1))
    took = time.monotonic() - t0
    assert answers(frames, decoder) == {1: 408}
    assert 0.8 < took < 6, took
    assert not any(isinstance(f, GoAwayFrame) for f in frames)  # the stream alone ended
    c.send(c.frames.headers(3, h2frames.request_fields(b"/after", SNI.encode())))
    frames = read_until(c, ended(3))
    assert answers(frames, decoder) == {3: 200}
    c.close()
    wait_until(lambda: fleet.stats().get("h2_body_timeout", 0) == 1, 5, what="h2_body_timeout counted")
    assert not any(r["path"] == "/upload" and r["body_len"] == 10 for r in web.requests)


def test_a_slow_body_that_keeps_coming_is_not_idle(external_host, fleet_factory, web):  # noqa: F811
    fleet = l7_fleet(fleet_factory, web, extra=H2_ON, limits="idle_timeout_s = 1", workers=1)
    c = RawH2Client(external_host.connect(fleet.port), SNI)
    c.send(c.frames.headers(1, post_fields(6), end_stream=False))
    for i in range(6):  # 6 bytes over ~2.4 s, each gap under the 1 s idle deadline: pacing, not synchronisation
        time.sleep(0.4)
        c.send(h2frames.data(1, b"x", end_stream=i == 5))
    frames = read_until(c, ended(1))
    assert answers(frames, hpack.Decoder()) == {1: 200}
    assert any(isinstance(f, DataFrame) and b'"body_len": 6' in f.data for f in frames)
    c.close()
    assert fleet.stats().get("h2_body_timeout", 0) == 0


def test_a_header_block_left_open_is_goaway_at_the_header_deadline(external_host, fleet_factory, web):  # noqa: F811
    fleet = l7_fleet(fleet_factory, web, extra=H2_ON, limits="header_timeout_s = 1", workers=1)
    c = RawH2Client(external_host.connect(fleet.port), SNI)
    block = c.frames.block(h2frames.request_fields(b"/never", SNI.encode()))
    t0 = time.monotonic()
    c.send(c.frames.headers(1, block=block[:4], end_headers=False))  # no END_HEADERS, no CONTINUATION
    frames = c.read_frames(GoAwayFrame, timeout=10)
    took = time.monotonic() - t0
    goaway = next(f for f in frames if isinstance(f, GoAwayFrame))
    assert goaway.error_code == h2_codes.ENHANCE_YOUR_CALM and goaway.last_stream_id == 0
    assert 0.8 < took < 6, took
    while not c.eof:
        c.read_frames(None, timeout=10)  # then the close
    c.close()
    wait_until(lambda: fleet.stats().get("h2_header_timeout", 0) == 1, 5, what="h2_header_timeout counted")
    assert not any(r["path"] == "/never" for r in web.requests)
