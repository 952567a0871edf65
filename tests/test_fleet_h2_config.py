"""The ``[http2]`` limits as operator keys, through the whole fleet: real PQ TLS from a network namespace, one
worker with non-default values. The SETTINGS the server advertises carry them, and the proxy enforces them
(the concurrency cap, streams per connection)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import hpack
from hyperframe.frame import GoAwayFrame, HeadersFrame, RstStreamFrame, SettingsFrame, WindowUpdateFrame

from sentin8.http import h2_codes
from tests import h2frames
from tests.h2client import H2Client, H2Request, RawH2Client
from tests.netns import external_host  # noqa: F401 - fixture
from tests.peers import wait_until
from tests.test_fleet_l7 import l7_fleet

SNI = "shop.apps.test"
LIMITS = """
[http2]
max_concurrent_streams = 5
max_streams_per_connection = 7
initial_stream_window = 131072
connection_window = 4194304
max_frame_size = 32768
header_table_size = 8192
max_queued_acks = 500
"""
# RFC 9113 §6.5.2 identifiers
HEADER_TABLE_SIZE, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 0x1, 0x3, 0x4, 0x5


class Seen:
    """Every frame one connection received, and each stream's :status (one HPACK decoder, in order)."""

    def __init__(self, c: RawH2Client) -> None:
        self.c = c
        self.frames: list = []
        self.status: dict[int, int] = {}
        self._decoder = hpack.Decoder()

    def until(self, done, timeout: float = 15.0) -> Seen:
        deadline = time.monotonic() + timeout
        while not done(self) and not self.c.eof:
            got = self.c.read_frames(None, timeout=max(0.1, deadline - time.monotonic()))
            for f in got:
                if isinstance(f, HeadersFrame):
                    fields = dict(self._decoder.decode(f.data, raw=True))
                    if b":status" in fields:
                        self.status[f.stream_id] = int(fields[b":status"])
            self.frames += got
        return self

    def first(self, kind: type):
        return next((f for f in self.frames if isinstance(f, kind)), None)


def has(kind: type, ack: bool | None = None):
    def check(seen: Seen) -> bool:
        return any(isinstance(f, kind) and (ack is None or ("ACK" in f.flags) == ack) for f in seen.frames)

    return check


def heads(c: RawH2Client, prefix: bytes, sids: tuple[int, ...]) -> bytes:
    return b"".join(c.frames.headers(sid, h2frames.request_fields(prefix + b"%d" % sid, SNI.encode())) for sid in sids)


def test_the_settings_advertised_carry_the_configured_limits(external_host, fleet_factory, web):  # noqa: F811
    fleet = l7_fleet(fleet_factory, web, extra=LIMITS, workers=1)
    c = RawH2Client(external_host.connect(fleet.port), SNI)
    seen = Seen(c).until(has(WindowUpdateFrame))
    settings = next(f for f in seen.frames if isinstance(f, SettingsFrame) and "ACK" not in f.flags).settings
    assert settings[MAX_CONCURRENT_STREAMS] == 5
    assert settings[INITIAL_WINDOW_SIZE] == 131072
    assert settings[MAX_FRAME_SIZE] == 32768
    assert settings[HEADER_TABLE_SIZE] == 8192
    update = seen.first(WindowUpdateFrame)
    assert update.stream_id == 0 and update.window_increment == 4194304 - 65535  # the connection window
    c.close()
    # a client that follows the SETTINGS (python-hyper h2) never has more than 5 open, and all are served
    h2 = H2Client(external_host.connect(fleet.port), SNI)
    deadline = time.monotonic() + 10
    while MAX_CONCURRENT_STREAMS not in h2.remote_settings:
        h2.pump(deadline)  # the SETTINGS first: sent before them, streams past 5 would be refused
    resps = h2.exchange([H2Request(path=b"/c/%d" % i) for i in range(6)])  # 6: above the cap, below 7
    assert [r.status for r in resps] == [200] * 6
    assert h2.remote_settings[MAX_CONCURRENT_STREAMS] == 5
    h2.close()


def test_a_sixth_concurrent_stream_is_refused(external_host, fleet_factory, web):  # noqa: F811
    """Before the client has acknowledged the SETTINGS the cap is pending for it: the 6th stream gets
    RST_STREAM REFUSED_STREAM and the five are served. After, opening a 6th is a violation of what it
    acknowledged: the engine's answer is GOAWAY PROTOCOL_ERROR naming the 5th (nghttp2's, stricter than
    RFC 9113 §5.1.2's stream error). Either way the 6th never reaches the backend."""
    fleet = l7_fleet(fleet_factory, web, extra=LIMITS, workers=1)
    web.release_slow.clear()
    c = RawH2Client(external_host.connect(fleet.port), SNI, ack=False)
    c.send(heads(c, b"/slow/", (1, 3, 5, 7, 9, 11)))
    seen = Seen(c).until(has(RstStreamFrame))
    rst = seen.first(RstStreamFrame)
    assert (rst.stream_id, rst.error_code) == (11, h2_codes.REFUSED_STREAM)
    assert web.slow_started.wait(10)
    web.release_slow.set()
    seen.until(lambda s: len(s.status) >= 5)
    assert seen.status == {1: 200, 3: 200, 5: 200, 7: 200, 9: 200}
    c.close()

    web.release_slow.clear()
    c = RawH2Client(external_host.connect(fleet.port), SNI)  # acknowledges the SETTINGS
    seen = Seen(c).until(has(SettingsFrame, ack=True))
    c.send(heads(c, b"/slow/b", (1, 3, 5, 7, 9, 11)))
    goaway = seen.until(has(GoAwayFrame)).first(GoAwayFrame)
    assert (goaway.error_code, goaway.last_stream_id) == (h2_codes.PROTOCOL_ERROR, 9)
    web.release_slow.set()
    c.close()
    wait_until(lambda: fleet.stats().get("h2_protocol_error", 0) >= 1, 5, what="h2_protocol_error counted")
    assert not any(r["path"] in ("/slow/11", "/slow/b11") for r in web.requests)


def test_the_configured_streams_per_connection_then_goaway_no_error(external_host, fleet_factory, web):  # noqa: F811
    fleet = l7_fleet(fleet_factory, web, extra=LIMITS, workers=1)
    c = RawH2Client(external_host.connect(fleet.port), SNI)
    seen = Seen(c)
    for sid in range(1, 15, 2):  # seven streams, one after the other
        c.send(heads(c, b"/n/", (sid,)))
        seen.until(lambda s, sid=sid: sid in s.status)
    goaway = seen.until(has(GoAwayFrame)).first(GoAwayFrame)
    assert (goaway.error_code, goaway.last_stream_id) == (h2_codes.NO_ERROR, 13)
    assert seen.status == {sid: 200 for sid in range(1, 15, 2)}
    c.close()
    wait_until(lambda: fleet.stats().get("h2_goaway_max_streams", 0) == 1, 5, what="h2_goaway_max_streams")


def test_a_reload_applies_new_limits_to_new_connections_and_refuses_a_bad_one(
    external_host,  # noqa: F811
    fleet_factory,
    web,
):
    """Like every worker key: SIGHUP rolls the workers, and a connection made after the reload gets the new
    workers' SETTINGS (one made before keeps its own until it drains). A bad value is refused with its key,
    and the running limits stay."""
    fleet = l7_fleet(fleet_factory, web, extra=LIMITS, workers=1)
    path = Path(fleet.config)
    good = path.read_text()
    path.write_text(good.replace("max_concurrent_streams = 5", "max_concurrent_streams = 6"))
    fleet.signal(signal.SIGHUP)
    wait_until(lambda: fleet.saw("reload_done"), 30, what="reload done")
    c = RawH2Client(external_host.connect(fleet.port), SNI)
    settings = Seen(c).until(has(SettingsFrame, ack=False)).first(SettingsFrame).settings
    assert settings[MAX_CONCURRENT_STREAMS] == 6
    c.close()
    path.write_text(good.replace("max_frame_size = 32768", "max_frame_size = 1024"))
    fleet.signal(signal.SIGHUP)
    wait_until(lambda: fleet.saw("reload_refused"), 30, what="reload refused")
    assert fleet.events("reload_refused")[-1]["reason"].startswith("http2.max_frame_size:")
    c = RawH2Client(external_host.connect(fleet.port), SNI)
    settings = Seen(c).until(has(SettingsFrame, ack=False)).first(SettingsFrame).settings
    assert (settings[MAX_CONCURRENT_STREAMS], settings[MAX_FRAME_SIZE]) == (6, 32768)
    c.close()
