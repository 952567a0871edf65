"""HTTP/2 per-stream and per-block deadlines through the whole fleet: real PQ TLS from a network namespace,
hand-built frames (tests/h2frames.py), the h1 limits (``limits.idle_timeout_s`` for a request body,
``limits.header_timeout_s`` for a head) applied to a stream and to an open header block, and the response
side's ``limits.send_timeout_s`` for a client that stops taking a response (over h2 and HTTP/1.1)."""

from __future__ import annotations

import time

import hpack
import pytest
from hyperframe.frame import DataFrame, GoAwayFrame, HeadersFrame, RstStreamFrame

from sentin8.http import h2_codes
from tests import h2frames
from tests.h2client import H2Client, RawH2Client
from tests.netns import external_host  # noqa: F401 - fixture
from tests.peers import wait_until
from tests.pqclient import PQClient
from tests.test_fleet_l7 import l7_fleet

INITIAL_WINDOW_SIZE = 0x4
SEND_TIMEOUT = "send_timeout_s = 1"

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


@pytest.mark.parametrize(
    "settings",
    [{INITIAL_WINDOW_SIZE: 0}, {}],
    ids=["stream window 0", "connection window spent after 64 KiB"],
)
def test_a_response_held_by_a_shut_window_is_cancelled_at_the_send_deadline(
    external_host,  # noqa: F811
    fleet_factory,
    web,
    settings,
):
    fleet = l7_fleet(fleet_factory, web, extra=H2_ON, limits=SEND_TIMEOUT, workers=1)
    (pid,) = fleet.workers()
    c = RawH2Client(external_host.connect(fleet.port), SNI, settings=settings)  # and never a WINDOW_UPDATE
    decoder = hpack.Decoder()
    t0 = time.monotonic()
    c.send(c.frames.headers(1, h2frames.request_fields(b"/big/50000000", SNI.encode())))
    other = H2Client(external_host.connect(fleet.port), SNI)  # the same worker, meanwhile
    assert other.get(b"/meanwhile").status == 200
    served_at = time.monotonic() - t0
    frames = read_until(c, lambda fs: any(isinstance(f, RstStreamFrame) for f in fs))
    took = time.monotonic() - t0
    rst = next(f for f in frames if isinstance(f, RstStreamFrame))
    assert (rst.stream_id, rst.error_code) == (1, h2_codes.CANCEL)
    # one deadline after its last byte left (none, or the connection window's 64 KiB): the slack is the
    # machine's, shared and small
    assert 0.9 < took < 1 + 3, took
    assert served_at < took  # the other client did not wait for it
    assert answers(frames, decoder) == {1: 200}
    sent = sum(len(f.data) for f in frames if isinstance(f, DataFrame) and f.stream_id == 1)
    assert sent == (0 if settings else 65535)
    assert not any(isinstance(f, GoAwayFrame) for f in frames)  # the stream alone ended
    c.send(c.frames.headers(3, h2frames.request_fields(b"/after", SNI.encode())))
    heads: dict[int, int] = {}
    t1 = time.monotonic()
    while 3 not in heads:  # its head (HEADERS are not flow-controlled): the connection is still served
        heads.update(answers(c.read_frames(None, timeout=10), decoder))
    assert heads == {3: 200}
    # its small body is all queued, its exchange over, and the window still shut: the same deadline ends it,
    # so what it holds (the queued bytes, its place in the engine) goes too
    frames = read_until(c, lambda fs: any(isinstance(f, RstStreamFrame) and f.stream_id == 3 for f in fs))
    assert next(f for f in frames if isinstance(f, RstStreamFrame)).error_code == h2_codes.CANCEL
    assert time.monotonic() - t1 < 1 + 3
    assert not any(isinstance(f, DataFrame) and f.stream_id == 3 for f in frames)  # either window shut: none
    c.close()
    assert other.get(b"/after-too").status == 200
    other.close()
    wait_until(lambda: fleet.stats().get("h2_stream_send_timeout", 0) == 2, 5, what="h2_stream_send_timeout")
    stats = fleet.stats()
    assert stats.get("client_aborted", 0) >= 1  # the first one's upstream exchange aborted
    assert stats.get("h2_send_timeout", 0) == 0
    assert list(fleet.workers()) == [pid]


def test_an_h2_client_that_stops_reading_the_socket_is_closed_at_the_send_deadline(
    external_host,  # noqa: F811
    fleet_factory,
    web,
):
    fleet = l7_fleet(fleet_factory, web, extra=H2_ON, limits=SEND_TIMEOUT, workers=1)
    (pid,) = fleet.workers()
    big = (1 << 31) - 1
    c = RawH2Client(external_host.connect(fleet.port), SNI, settings={INITIAL_WINDOW_SIZE: big})
    c.send(h2frames.window_update(0, big - 65535))  # every window wide open: only the socket can stop it
    c.send(c.frames.headers(1, h2frames.request_fields(b"/big/200000000", SNI.encode())))
    t0 = time.monotonic()
    # the kernel's buffers fill in a moment, then the server's output stays unwritable: nothing is read here
    other = H2Client(external_host.connect(fleet.port), SNI)
    assert other.get(b"/meanwhile").status == 200
    wait_until(lambda: fleet.stats().get("h2_send_timeout", 0) == 1, 15, what="h2_send_timeout")
    assert time.monotonic() - t0 > 0.9
    assert other.get(b"/after").status == 200
    other.close()
    got = 0
    while not c.eof and got < 300_000_000:  # what was buffered, then the end (the connection was aborted)
        got += sum(len(f.data) for f in c.read_frames(None, timeout=10) if isinstance(f, DataFrame))
    assert c.eof and got < 200_000_000
    c.close()
    assert fleet.stats().get("client_aborted", 0) >= 1
    assert list(fleet.workers()) == [pid]


def test_an_h1_client_that_stops_reading_is_closed_at_the_send_deadline(
    external_host,  # noqa: F811
    fleet_factory,
    web,
):
    fleet = l7_fleet(fleet_factory, web, limits=SEND_TIMEOUT, workers=1)
    (pid,) = fleet.workers()
    client = PQClient(external_host.connect(fleet.port), SNI)
    client.handshake()
    client.sendall(b"GET /big/200000000 HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n")
    t0 = time.monotonic()
    other = H2Client(external_host.connect(fleet.port), SNI)
    assert other.get(b"/meanwhile").status == 200
    other.close()
    wait_until(lambda: fleet.stats().get("send_timeout", 0) == 1, 15, what="send_timeout")
    assert time.monotonic() - t0 > 0.9
    client.close()
    assert fleet.stats().get("client_aborted", 0) >= 1
    assert list(fleet.workers()) == [pid]


def test_a_slow_reader_is_not_cut_and_is_once_it_stops(external_host, fleet_factory, web):  # noqa: F811
    """The deadline runs between two writes (nginx's send_timeout), not over the whole response: a window
    opened by 16 KiB every 0.4 s for 3 s (three deadlines) keeps the stream; one deadline after the last
    bytes left, it is reset."""
    fleet = l7_fleet(fleet_factory, web, extra=H2_ON, limits=SEND_TIMEOUT, workers=1)
    c = RawH2Client(external_host.connect(fleet.port), SNI, settings={INITIAL_WINDOW_SIZE: 0})
    c.send(c.frames.headers(1, h2frames.request_fields(b"/big/50000000", SNI.encode())))
    frames: list = []
    for _ in range(8):  # pacing, not synchronisation: each gap well under the 1 s deadline
        time.sleep(0.4)
        c.send(h2frames.window_update(1, 16384) + h2frames.window_update(0, 16384))
        frames += c.read_frames(None, timeout=5)
    assert not any(isinstance(f, RstStreamFrame) for f in frames), "a reader that keeps reading was cut"
    stopped = time.monotonic()
    frames += read_until(c, lambda fs: any(isinstance(f, RstStreamFrame) for f in fs))
    took = time.monotonic() - stopped
    assert next(f for f in frames if isinstance(f, RstStreamFrame)).error_code == h2_codes.CANCEL
    assert 0.5 < took < 1 + 3, took
    assert sum(len(f.data) for f in frames if isinstance(f, DataFrame)) == 8 * 16384
    c.close()
    wait_until(lambda: fleet.stats().get("h2_stream_send_timeout", 0) == 1, 5, what="h2_stream_send_timeout")


def test_a_client_gone_while_its_stream_waits_on_a_shut_window_frees_it_at_once(
    external_host,  # noqa: F811
    fleet_factory,
    web,
):
    """The deadline's timers go with the connection: the stream's exchange is aborted when the client
    leaves, not at the deadline, and nothing is left armed."""
    fleet = l7_fleet(fleet_factory, web, extra=H2_ON, limits="send_timeout_s = 30", workers=1)
    (pid,) = fleet.workers()
    c = RawH2Client(external_host.connect(fleet.port), SNI, settings={INITIAL_WINDOW_SIZE: 0})
    c.send(c.frames.headers(1, h2frames.request_fields(b"/big/50000000", SNI.encode())))
    read_until(c, lambda fs: any(isinstance(f, HeadersFrame) for f in fs))
    wait_until(lambda: fleet.stats().get("backpressure_upstream_paused", 0) >= 1, 10, what="its upstream paused")
    c.close()
    wait_until(lambda: fleet.stats().get("client_aborted", 0) == 1, 10, what="its exchange aborted")
    stats = fleet.stats()
    assert stats.get("h2_stream_send_timeout", 0) == 0 and stats.get("bridge_errors", 0) == 0
    assert "Traceback" not in fleet.output()
    assert list(fleet.workers()) == [pid]
