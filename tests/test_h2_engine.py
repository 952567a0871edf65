"""The HTTP/2 engine adapter, in memory: python-hyper's h2 as the client (a different engine than the proxy's),
hand-built frames (tests/h2frames.py) where a well-behaved client would never send them.

Pins what the adapter promises the shell (events, flow control by hand, windows, two-step GOAWAY) and what the
engine enforces on its own, so an engine upgrade that drops a limit fails here.
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import pytest
from hyperframe.frame import DataFrame, GoAwayFrame, HeadersFrame, PingFrame, SettingsFrame, WindowUpdateFrame

from sentin8.http import h2_codes
from sentin8.http.h2_engine import (
    FIELDS_CHECKED,
    REASONS,
    ConnectionEnded,
    GoAwayReceived,
    GoAwaySent,
    H2Limits,
    RequestData,
    RequestHeaders,
    RequestTrailers,
    ServerConnection,
    StreamRefused,
    StreamReset,
    WindowOpened,
    goaway_frame,
)
from tests import h2frames as F
from tests.h2frames import RawFrames, kinds, parse, request_fields

REQ = [(":method", "GET"), (":authority", "www.example.com"), (":scheme", "https"), (":path", "/")]


def post(path: str = "/up") -> list[tuple[str, str]]:
    return [(":method", "POST"), (":authority", "www.example.com"), (":scheme", "https"), (":path", path)]


class Pair:
    """An h2 client and our server adapter, bytes moved by hand."""

    def __init__(self, limits: H2Limits | None = None, client_window: int = 1 << 24) -> None:
        self.server = ServerConnection(limits or H2Limits())
        cfg = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.client = h2.connection.H2Connection(cfg)
        self.client.local_settings.initial_window_size = client_window
        self.client.initiate_connection()
        self.client.increment_flow_control_window(client_window)
        self.server_events: list[object] = []
        self.client_events: list[h2.events.Event] = []
        self.pump()

    def pump(self) -> None:
        """Move bytes both ways until neither side has any."""
        for _ in range(100):
            up = self.client.data_to_send()
            if up:
                self.server_events += self.server.receive(up)
            down = self.server.data_to_send()
            if self.server.events_waiting:
                self.server_events += self.server.take_events()
            if down:
                self.client_events += self.client.receive_data(down)
            if not up and not down:
                return
        raise AssertionError("pump did not settle")

    def take(self, kind: type) -> list:
        out = [e for e in self.server_events if isinstance(e, kind)]
        self.server_events = [e for e in self.server_events if not isinstance(e, kind)]
        return out

    def client_take(self, kind: type) -> list:
        out = [e for e in self.client_events if isinstance(e, kind)]
        self.client_events = [e for e in self.client_events if not isinstance(e, kind)]
        return out


class Raw:
    """Our server adapter fed hand-built frames; what it writes back, parsed."""

    def __init__(self, limits: H2Limits | None = None, settings: dict[int, int] | None = None) -> None:
        self.server = ServerConnection(limits or H2Limits())
        self.frames = RawFrames()
        self.out = bytearray(self.server.data_to_send())
        self.events = self.feed(F.preface(settings))

    def feed(self, data: bytes) -> list[object]:
        events = self.server.receive(data)
        self.out += self.server.data_to_send()
        if self.server.events_waiting:
            events += self.server.take_events()
        return events

    def written(self) -> list:
        frames, rest = parse(self.out)
        self.out = bytearray(rest)
        return frames


# -- the preface and settings ---------------------------------------------------------------------------


def test_the_server_preface_advertises_the_defaults_and_no_extended_connect():
    conn = ServerConnection(H2Limits.from_policy(max_header_bytes=32768, max_headers=50))
    frames, rest = parse(conn.data_to_send())
    assert not rest
    settings = [f for f in frames if isinstance(f, SettingsFrame)]
    assert len(settings) == 1
    assert settings[0].settings == {
        SettingsFrame.HEADER_TABLE_SIZE: 4096,
        SettingsFrame.MAX_CONCURRENT_STREAMS: 100,
        SettingsFrame.INITIAL_WINDOW_SIZE: 65536,
        SettingsFrame.MAX_FRAME_SIZE: 16384,
        SettingsFrame.MAX_HEADER_LIST_SIZE: 32768,
    }
    assert SettingsFrame.ENABLE_CONNECT_PROTOCOL not in settings[0].settings
    wu = [f for f in frames if isinstance(f, WindowUpdateFrame)]
    assert [(f.stream_id, f.window_increment) for f in wu] == [(0, (1 << 20) - 65535)]  # 1 MiB connection window


def test_limits_from_policy_leave_room_for_cookie_crumbs():
    lim = H2Limits.from_policy(max_header_bytes=65536, max_headers=100)
    assert lim.max_header_list_bytes == 65536 and lim.max_header_fields == 204
    assert (lim.max_concurrent_streams, lim.initial_window, lim.connection_window) == (100, 65536, 1 << 20)
    assert (lim.header_table, lim.max_frame, lim.max_continuations, lim.max_queued_acks) == (4096, 16384, 8, 1000)


def test_settings_and_pings_are_acknowledged_by_the_engine():
    r = Raw()
    assert kinds(r.written())["Settings"] == 2  # ours, and the ACK of the client's
    assert r.feed(F.ping(7)) == []
    (pong,) = r.written()
    assert isinstance(pong, PingFrame) and "ACK" in pong.flags and pong.opaque_data == (7).to_bytes(8, "big")


# -- requests ------------------------------------------------------------------------------------------


def test_request_events_in_order():
    p = Pair()
    sid = p.client.get_next_available_stream_id()
    p.client.send_headers(sid, post(), end_stream=False)
    p.client.send_data(sid, b"hello")
    p.client.send_headers(sid, [("grpc-status", "0")], end_stream=True)
    p.pump()
    (head,) = p.take(RequestHeaders)
    assert head.stream_id == sid and not head.end_stream
    assert head.fields[:4] == tuple((n.encode(), v.encode()) for n, v in post())
    (body,) = p.take(RequestData)
    assert (body.data, body.flow, body.end_stream) == (b"hello", 5, False)
    (trailers,) = p.take(RequestTrailers)
    assert trailers.fields == ((b"grpc-status", b"0"),)
    assert p.server.last_stream_id == sid


def test_a_bodyless_request_ends_with_its_headers():
    p = Pair()
    p.client.send_headers(1, REQ, end_stream=True)
    p.pump()
    (head,) = p.take(RequestHeaders)
    assert head.end_stream


# -- receive-side flow control by hand -----------------------------------------------------------------


def _send_body(p: Pair, sid: int, n: int) -> int:
    """Send as much of ``n`` bytes as the client's view of the windows allows; returns what was sent."""
    sent = 0
    while sent < n:
        room = min(p.client.local_flow_control_window(sid), p.client.max_outbound_frame_size, n - sent)
        if room <= 0:
            break
        p.client.send_data(sid, b"x" * room)
        sent += room
        p.pump()
    return sent


def test_windows_open_only_as_the_shell_consumes():
    p = Pair()
    p.client.send_headers(1, post(), end_stream=False)
    p.pump()
    assert _send_body(p, 1, 200_000) == 65536  # the initial stream window, then nothing without consume()
    assert sum(e.flow for e in p.take(RequestData)) == 65536
    assert p.client.local_flow_control_window(1) == 0
    p.server.consume(1, 40_000)
    p.pump()
    assert p.client.local_flow_control_window(1) == 40_000  # handed back (nghttp2 updates from half a window)
    assert _send_body(p, 1, 200_000) == 40_000


def test_a_stalled_stream_does_not_stall_the_connection():
    """A slow upstream back-pressures one stream: the others keep their own windows."""
    p = Pair()
    p.client.send_headers(1, post(), end_stream=False)
    p.client.send_headers(3, post(), end_stream=False)
    p.pump()
    assert _send_body(p, 1, 100_000) == 65536  # stream 1's upstream takes nothing
    for _ in range(20):  # stream 3's upstream takes everything: 20 x 64 KiB > the 1 MiB connection window
        assert _send_body(p, 3, 65536) == 65536
        for e in p.take(RequestData):
            if e.stream_id == 3:
                p.server.consume(3, e.flow)
        p.pump()
    assert p.client.local_flow_control_window(1) == 0


def test_padding_is_accounted_by_the_engine():
    r = Raw()
    r.feed(r.frames.headers(1, request_fields(method=b"POST"), end_stream=False))
    events = r.feed(F.data(1, b"p" * 16000, pad=200) * 3)
    assert [e.flow for e in events if isinstance(e, RequestData)] == [16000] * 3
    r.written()
    r.server.consume(1, 48000)
    r.feed(b"")
    updates = [f for f in r.written() if isinstance(f, WindowUpdateFrame) and f.stream_id == 1]
    assert sum(f.window_increment for f in updates) == 48000 + 3 * 201  # the padding went back with the data


def test_a_reset_streams_unconsumed_bytes_do_not_leak_the_connection_window():
    """Window repair: 48 streams reset by the client with 64 KiB unconsumed each (3x the connection window),
    then a live stream still moves 4 MiB, its windows reopened by consumption alone."""
    p = Pair()
    for sid in range(1, 97, 2):
        p.client.send_headers(sid, post(), end_stream=False)
        assert _send_body(p, sid, 65536) == 65536
        p.client.reset_stream(sid)
        p.pump()
    assert len(p.take(StreamReset)) == 48
    p.server.consume(1, 65536)  # too late: harmless
    p.client.send_headers(97, post(), end_stream=False)
    p.pump()
    moved = 0
    while moved < 4 << 20:
        step = _send_body(p, 97, 65536)
        assert step > 0, f"stalled after {moved} bytes"
        moved += step
        for e in p.take(RequestData):
            p.server.consume(e.stream_id, e.flow)
        p.pump()


def test_our_resets_and_early_responses_give_their_bytes_back():
    p = Pair()
    for sid in range(1, 49, 2):  # 24 x 64 KiB: more than the connection window, none consumed by a shell
        p.client.send_headers(sid, post(), end_stream=False)
        assert _send_body(p, sid, 65536) == 65536
        if sid % 4 == 1:
            assert p.server.reset(sid, h2_codes.CANCEL)
        else:
            assert p.server.send_head(sid, 413, [], end_stream=True)
        p.pump()
    assert not p.take(StreamReset)


# -- responses -----------------------------------------------------------------------------------------


def test_a_response_with_interim_head_body_and_trailers():
    p = Pair()
    p.client.send_headers(1, REQ, end_stream=True)
    p.pump()
    assert p.server.send_interim(1, 103, [(b"Link", b"</a.css>; rel=preload")])
    assert p.server.send_head(1, 200, [(b"Content-Type", b"text/plain"), (b"X-Up", b"1")])
    assert p.server.send_data(1, b"y" * 100)
    assert p.server.send_trailers(1, [(b"X-Checksum", b"abc")])
    p.pump()
    (interim,) = p.client_take(h2.events.InformationalResponseReceived)
    assert (b":status", b"103") in interim.headers
    (resp,) = p.client_take(h2.events.ResponseReceived)
    assert resp.headers[0] == (b":status", b"200")
    assert (b"content-type", b"text/plain") in resp.headers and (b"x-up", b"1") in resp.headers  # lower-cased
    assert b"".join(e.data for e in p.client_take(h2.events.DataReceived)) == b"y" * 100
    (trailers,) = p.client_take(h2.events.TrailersReceived)
    assert trailers.headers == [(b"x-checksum", b"abc")]
    assert p.client_take(h2.events.StreamEnded)


def test_a_head_only_response():
    p = Pair()
    p.client.send_headers(1, [(":method", "HEAD"), *REQ[1:]], end_stream=True)
    p.pump()
    assert p.server.send_head(1, 204, [], end_stream=True)
    p.pump()
    assert p.client_take(h2.events.ResponseReceived) and p.client_take(h2.events.StreamEnded)


def test_data_leaves_within_the_peers_windows_and_frame_size():
    p = Pair(client_window=65535)
    p.client.send_headers(1, REQ, end_stream=True)
    p.pump()
    p.server.send_head(1, 200, [])
    p.server.send_data(1, b"z" * 200_000, end_stream=True)
    down = p.server.data_to_send()
    frames, _ = parse(down)
    sizes = [len(f.data) for f in frames if isinstance(f, DataFrame)]
    assert max(sizes) <= 16384 and sum(sizes) == 65535  # the client's stream window, no more
    assert p.server.buffered(1) == 200_000 - 65535 and p.server.buffered() == p.server.buffered(1)
    assert p.server.sendable(1) == 0
    p.client_events += p.client.receive_data(down)
    p.client.acknowledge_received_data(65535, 1)
    p.server_events += p.server.receive(p.client.data_to_send())
    assert {e.stream_id for e in p.take(WindowOpened)} == {0, 1}
    p.pump()
    got = sum(e.flow_controlled_length for e in p.client_take(h2.events.DataReceived))
    assert got == 2 * 65535


def test_a_complete_response_ends_an_unfinished_request_with_rst_no_error():
    r = Raw()
    r.feed(r.frames.headers(1, [*request_fields(method=b"POST"), (b"content-length", b"100000")], end_stream=False))
    r.feed(F.data(1, b"x" * 1000))
    r.written()
    r.server.send_head(1, 413, [], end_stream=True)
    r.feed(b"")
    assert kinds(r.written()) == {"Headers": 1, "RstStream(0)": 1}
    # the body the client had already sent is dropped, its window given back
    assert [e for e in r.feed(F.data(1, b"x" * 16384)) if isinstance(e, RequestData)] == []


def test_sending_on_a_gone_stream_says_false():
    p = Pair()
    p.client.send_headers(1, REQ, end_stream=False)
    p.pump()
    p.client.reset_stream(1)
    p.pump()
    assert p.take(StreamReset)[0].remote
    assert not p.server.send_head(1, 200, [])
    assert not p.server.send_data(1, b"x")
    assert not p.server.reset(1)
    assert not p.server.send_head(99, 200, [])


# -- resets and refusals --------------------------------------------------------------------------------


def test_reset_by_the_client():
    p = Pair()
    p.client.send_headers(1, REQ, end_stream=False)
    p.client.reset_stream(1, error_code=h2_codes.CANCEL)
    p.pump()
    (reset,) = p.take(StreamReset)
    assert (reset.stream_id, reset.error_code, reset.remote) == (1, h2_codes.CANCEL, True)


def test_a_stream_rule_broken_after_the_request_is_an_engine_reset():
    """Content-length vs DATA: the request was delivered, then the engine reset it (MadeYouReset's shape)."""
    r = Raw()
    events = r.feed(r.frames.headers(1, [*request_fields(method=b"POST"), (b"content-length", b"3")], end_stream=False))
    assert isinstance(events[0], RequestHeaders)
    events = r.feed(F.data(1, b"toolong", end_stream=True))
    (reset,) = [e for e in events if isinstance(e, StreamReset)]
    assert (reset.remote, reset.error_code) == (False, h2_codes.PROTOCOL_ERROR)
    assert kinds(r.written())["RstStream(1)"] == 1


def test_our_own_reset_makes_no_event():
    p = Pair()
    p.client.send_headers(1, REQ, end_stream=False)
    p.pump()
    assert p.server.reset(1, h2_codes.CANCEL)
    p.pump()
    assert not p.take(StreamReset) and not p.take(StreamRefused)
    assert p.client_take(h2.events.StreamReset)[0].error_code == h2_codes.CANCEL


BAD_NAMES = [b"Accept", b"a b", b"a:b", b"a@b", b"\xc3\xa9", b"a\tb", b'a"b', b"(x)", b"a/b", b""]
BAD_VALUES = [b"a\x00b", b"a\rb", b"a\nb", b" a", b"a ", b"\ta", b"a\t", b"a\x01b", b"a\x1fb", b"a\x7fb"]


@pytest.mark.parametrize(("name", "value"), [(n, b"x") for n in BAD_NAMES] + [(b"x-a", v) for v in BAD_VALUES])
def test_the_engine_refuses_every_field_rfc9113_forbids(name, value):
    """What FIELDS_CHECKED promises h2_request.map_request: these never reach it."""
    assert FIELDS_CHECKED
    r = Raw()
    events = r.feed(r.frames.headers(1, [*request_fields(), (name, value)]))
    assert not [e for e in events if isinstance(e, RequestHeaders)]
    (refused,) = [e for e in events if isinstance(e, StreamRefused)]
    assert (refused.stream_id, refused.reason, refused.error_code) == (1, "h2_malformed", h2_codes.PROTOCOL_ERROR)
    assert kinds(r.written())["RstStream(1)"] == 1
    assert r.feed(r.frames.headers(3)) and not r.server.ended  # the connection goes on


@pytest.mark.parametrize(
    "fields",
    [
        [*request_fields(), (b"connection", b"close")],
        [*request_fields(), (b"te", b"gzip")],
        [(b":method", b"CONNECT"), (b":protocol", b"websocket"), *request_fields()[1:]],  # no ENABLE_CONNECT
        [(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/")],  # no :authority, no host
        [*request_fields()[:3], (b"x", b"1"), (b":path", b"/")],
        [*request_fields(), (b":status", b"200")],
    ],
)
def test_malformed_blocks_are_stream_errors_not_connection_errors(fields):
    r = Raw()
    events = r.feed(r.frames.headers(1, fields))
    assert [type(e) for e in events] == [StreamRefused]
    events = r.feed(r.frames.headers(3))
    assert [type(e) for e in events] == [RequestHeaders] and not r.server.ended


# -- shutdown -------------------------------------------------------------------------------------------


def test_two_step_goaway_serves_every_stream_up_to_the_last():
    r = Raw()
    r.feed(r.frames.headers(1, end_stream=True))
    r.written()
    r.server.drain()
    r.feed(b"")
    first = sorted(r.written(), key=lambda f: type(f).__name__)  # the engine sends the PING first
    assert [(type(f).__name__, getattr(f, "last_stream_id", None)) for f in first] == [
        ("GoAwayFrame", h2_codes.MAX_STREAM_ID),
        ("PingFrame", None),
    ]
    events = r.feed(r.frames.headers(3, end_stream=True))  # raced with the notice: still served
    assert [e.stream_id for e in events if isinstance(e, RequestHeaders)] == [3]
    events = r.feed(F.ping(int.from_bytes(first[1].opaque_data, "big"), ack=True))
    assert [(type(e), e.last_stream_id) for e in events] == [(GoAwaySent, 3)]
    (final,) = r.written()
    assert isinstance(final, GoAwayFrame) and (final.last_stream_id, final.error_code) == (3, 0)
    assert r.feed(r.frames.headers(5)) == []  # above the last id: not processed
    for sid in (1, 3):
        r.server.send_head(sid, 200, [])
        r.server.send_data(sid, b"ok", end_stream=True)
    r.feed(b"")
    assert kinds(r.written()) == {"Headers": 2, "Data": 2}
    assert r.server.ended is not None and r.server.ended.reason == ""  # clean: every stream done


def test_finish_drain_without_the_ping_ack():
    r = Raw()
    r.feed(r.frames.headers(1, end_stream=True))
    r.server.drain()
    assert r.server.finish_drain() == 1
    assert r.server.finish_drain() == 1  # once
    r.feed(b"")
    goaways = [f for f in r.written() if isinstance(f, GoAwayFrame)]
    assert [f.last_stream_id for f in goaways] == [h2_codes.MAX_STREAM_ID, 1]


def test_in_flight_streams_are_served_after_a_final_goaway():
    """python-hyper h2 cannot send on in-flight streams after close_connection() (its #1181); we can."""
    r = Raw()
    r.feed(r.frames.headers(1, end_stream=True) + r.frames.headers(3, end_stream=True))
    r.server.goaway(h2_codes.NO_ERROR)
    assert r.server.send_head(1, 200, []) and r.server.send_data(1, b"a", end_stream=True)
    assert r.server.send_head(3, 200, [], end_stream=True)
    r.feed(b"")
    assert kinds(r.written()) == {"Settings": 2, "WindowUpdate": 1, "GoAway(0)": 1, "Headers": 2, "Data": 1}


def test_close_now_with_a_code():
    r = Raw()
    r.feed(r.frames.headers(1, end_stream=False))
    ended = r.server.close(h2_codes.ENHANCE_YOUR_CALM, "h2_premature_resets")
    assert (ended.reason, ended.error_code) == ("h2_premature_resets", h2_codes.ENHANCE_YOUR_CALM)
    r.feed(b"")
    goaway = [f for f in r.written() if isinstance(f, GoAwayFrame)]
    assert [(f.last_stream_id, f.error_code) for f in goaway] == [(1, h2_codes.ENHANCE_YOUR_CALM)]
    assert r.server.receive(r.frames.headers(3)) == []  # nothing read any more


def test_the_clients_goaway():
    r = Raw()
    r.feed(r.frames.headers(1, end_stream=True))
    events = r.feed(F.goaway(0, 0))
    assert [(type(e), e.last_stream_id) for e in events] == [(GoAwayReceived, 0)]
    r.server.send_head(1, 200, [], end_stream=True)
    r.feed(b"")
    assert r.server.ended is not None and r.server.ended.reason == ""


# -- what the engine enforces on its own, as the adapter reports it ---------------------------------------


def _ended(r: Raw, events: list[object]) -> ConnectionEnded:
    ended = [e for e in events if isinstance(e, ConnectionEnded)]
    assert ended and r.server.ended is ended[0]
    return ended[0]


def _goaway_code(r: Raw) -> int:
    (goaway,) = [f for f in r.written() if isinstance(f, GoAwayFrame)]
    return goaway.error_code


def test_a_bad_preface_is_a_protocol_error_with_a_goaway():
    conn = ServerConnection(H2Limits())
    conn.data_to_send()
    (ended,) = conn.receive(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert ended.reason == "h2_protocol_error"
    frames, _ = parse(conn.data_to_send())
    assert [(type(f), f.error_code) for f in frames] == [(GoAwayFrame, h2_codes.PROTOCOL_ERROR)]
    assert conn.data_to_send() == b""


def test_more_than_8_continuation_frames_end_the_connection():
    r = Raw()
    block = r.frames.block([*request_fields(), (b"x-a", b"y" * 200)])
    frames = r.frames.headers(1, block=block[:10], end_headers=False)
    for i in range(9):
        frames += F.continuation(1, block[10 + i : 11 + i])
    ended = _ended(r, r.feed(frames))
    assert ended.reason == "h2_continuation_flood" and _goaway_code(r) == h2_codes.ENHANCE_YOUR_CALM
    assert len(frames) < 200  # refused within ~100 bytes


def test_eight_continuation_frames_are_fine():
    r = Raw()
    block = r.frames.block([*request_fields(), (b"x-a", b"y" * 200)])
    n = 8
    cut = len(block) // (n + 1)
    frames = r.frames.headers(1, block=block[:cut], end_headers=False)
    for i in range(n):
        part = block[cut * (i + 1) : cut * (i + 2)] if i < n - 1 else block[cut * n :]
        frames += F.continuation(1, part, end_headers=i == n - 1)
    assert [type(e) for e in r.feed(frames)] == [RequestHeaders]


def test_the_decoded_header_list_is_bounded_in_bytes_as_hpack_counts():
    lim = H2Limits.from_policy(max_header_bytes=4096, max_headers=100)
    fits = [*request_fields(), (b"x-a", b"v" * (4096 - 32 * 5 - 150))]
    r = Raw(lim)
    assert [type(e) for e in r.feed(r.frames.headers(1, fits))] == [RequestHeaders]
    r = Raw(lim)
    ended = _ended(r, r.feed(r.frames.headers(1, [*request_fields(), (b"x-a", b"v" * 4096)])))
    assert ended.reason == "h2_header_list_too_large" and _goaway_code(r) == h2_codes.ENHANCE_YOUR_CALM


def test_the_hpack_bomb_of_one_byte_references_is_bounded_in_fields():
    """Many tiny fields pass a byte limit: the field count stops them (the 2026 "HTTP/2 Bomb")."""
    lim = H2Limits.from_policy(max_header_bytes=65536, max_headers=100)
    r = Raw(lim)
    fields = [*request_fields(), *([(b"a", b"")] * (lim.max_header_fields + 1))]
    block = r.frames.block(fields)
    assert len(block) < 300  # one dynamic-table reference per field: tiny on the wire
    ended = _ended(r, r.feed(r.frames.headers(1, block=block)))
    assert ended.reason == "h2_header_fields_too_many"


def test_unsent_acks_are_bounded():
    """A client that sends PINGs and never reads: at most max_queued_acks ACKs wait (CVE-2019-9512/9515)."""
    conn = ServerConnection(H2Limits())
    conn.receive(F.preface())
    ended = None
    for i in range(1100):
        events = conn.receive(F.ping(i))  # data_to_send is never called: our output stays queued
        if events:
            (ended,) = events
            break
    assert ended is not None and ended.reason == "h2_ack_flood" and 990 <= i <= 1001
    frames, _ = parse(conn.data_to_send())
    assert frames[-1].error_code == h2_codes.ENHANCE_YOUR_CALM


@pytest.mark.parametrize("stream_id", [0, 1])
def test_a_zero_window_update_is_a_protocol_error(stream_id):
    r = Raw()
    r.feed(r.frames.headers(1, end_stream=False))
    ended = _ended(r, r.feed(F.window_update(stream_id, 0)))
    assert ended.reason == "h2_protocol_error" and _goaway_code(r) == h2_codes.PROTOCOL_ERROR


def test_rst_on_an_idle_stream_is_a_protocol_error():
    r = Raw()
    ended = _ended(r, r.feed(F.rst(1)))
    assert ended.reason == "h2_protocol_error"


def test_goaway_frame_bytes():
    frames, _ = parse(goaway_frame(7, h2_codes.ENHANCE_YOUR_CALM))
    assert [(type(f), f.last_stream_id, f.error_code) for f in frames] == [(GoAwayFrame, 7, 11)]


def test_reasons_are_counter_names():
    assert len(set(REASONS)) == len(REASONS) and all(r.startswith("h2_") for r in REASONS)


def test_headers_frame_helper_round_trips():
    frames, _ = parse(RawFrames().headers(5, end_stream=False))
    assert isinstance(frames[0], HeadersFrame) and frames[0].stream_id == 5
