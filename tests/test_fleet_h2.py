"""HTTP/2 at the edge through the whole fleet: real PQ TLS from a network namespace (an external client),
python-hyper's h2 as the client (tests/h2client.py), the same backend as the HTTP/1.1 tests.

Every stream takes the HTTP/1.1 path's admission, hygiene and upstream pool (workers/l7/h2/ behind the
downstream seam); these tests hold it to the same answers as the h1 ones, per stream.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from sentin8.http import h2_codes
from tests.h2client import H2Client, H2Request
from tests.netns import external_host  # noqa: F401 - fixture
from tests.peers import pattern, wait_until
from tests.pqclient import PQClient
from tests.test_fleet_l7 import RESERVED, l7_fleet, request

H2_ON = "\n[http2]\nenabled = true\n"  # the default, said out loud: these tests are about h2
SNI = "shop.apps.test"


def h2_fleet(fleet_factory, backend, **kw):
    return l7_fleet(fleet_factory, backend, extra=H2_ON + kw.pop("extra", ""), **kw)


def client(host, fleet, **kw) -> H2Client:
    return H2Client(host.connect(fleet.port), kw.pop("sni", SNI), **kw)


def test_alpn_prefers_h2_falls_back_to_h1_and_is_off_when_disabled(external_host, fleet_factory, web):  # noqa: F811
    fleet = h2_fleet(fleet_factory, web)
    for offered, chosen in (((b"h2", b"http/1.1"), b"h2"), ((b"http/1.1", b"h2"), b"h2"), ((b"http/1.1",), None)):
        ctx = PQClient.make_context()
        ctx.set_alpn_protos(list(offered))
        c = PQClient(external_host.connect(fleet.port), SNI, context=ctx)
        c.handshake()
        assert c.conn.get_alpn_proto_negotiated() == (chosen or b"http/1.1"), offered
        if chosen is None:  # h1 still served on an h2-enabled fleet
            assert c.request(b"GET / HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n").startswith(b"HTTP/1.1 200")
        c.close()
    status, _, _ = request(external_host, fleet, SNI, b"GET / HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n")
    assert status == 200  # no ALPN at all: HTTP/1.1 as before
    stats = fleet.stats()
    assert stats.get("l7_connections_h2", 0) >= 2 and stats.get("l7_connections_h1", 0) >= 2


def test_h2_is_on_by_default_and_enabled_false_turns_it_off(external_host, fleet_factory, web):  # noqa: F811
    on = l7_fleet(fleet_factory, web)
    c = H2Client(external_host.connect(on.port), SNI)
    assert c.alpn == b"h2" and c.get(b"/default").status == 200
    c.close()
    on.stop()  # one fleet per workdir at a time (fleet_factory's tmp_path)
    fleet = l7_fleet(fleet_factory, web, extra="\n[http2]\nenabled = false\n")
    ctx = PQClient.make_context()
    ctx.set_alpn_protos([b"h2", b"http/1.1"])
    c = PQClient(external_host.connect(fleet.port), SNI, context=ctx)
    c.handshake()
    assert c.conn.get_alpn_proto_negotiated() == b"http/1.1"
    c.close()
    with pytest.raises(Exception):  # noqa: B017 - only h2 offered: no_application_protocol, as before
        H2Client(external_host.connect(fleet.port), SNI)


def test_a_stream_reaches_the_backend_with_the_injected_set_once_and_no_spoof(
    external_host,  # noqa: F811
    fleet_factory,
    web,
):
    fleet = h2_fleet(fleet_factory, web)
    c = client(external_host, fleet)
    assert c.alpn == b"h2"
    spoof = []
    for i, name in enumerate(RESERVED):
        for v in (f"x-sentin8-{name.lower()}", f"x-sentin8-{name.lower().replace('-', '_')}"):
            spoof.append((v.encode(), b"evil-%d" % i))
    spoof += [(b"x-forwarded-for", b"6.6.6.6"), (b"x-forwarded-host", b"evil"), (b"cookie", b"a=1"),
              (b"cookie", b"b=2")]  # fmt: skip
    r = c.fetch(H2Request(b"GET", b"/hello?q=1", headers=spoof))
    assert r.status == 200, r
    seen = json.loads(r.body)
    assert seen["path"] == "/hello?q=1" and seen["method"] == "GET"
    headers = seen["headers"]
    assert not any("evil" in v or "6.6.6.6" in v for _, v in headers), headers
    got = {k.lower(): v for k, v in headers}
    assert sum(1 for k, _ in headers if k.lower().startswith("x-sentin8-")) == 6
    assert got["x-sentin8-service"] == "web" and got["x-sentin8-hostname"] == SNI
    assert got["x-sentin8-caller-service"] == "external"
    assert got["x-forwarded-for"] == external_host.client_ip and got["x-forwarded-proto"] == "https"
    assert got["host"] == SNI
    assert got["cookie"] == "a=1; b=2"  # crumbs joined before hygiene, as RFC 9113 §8.2.3 says
    assert r.header(b"x-sentin8-service") is None
    c.close()


def test_a_hundred_concurrent_streams_on_one_connection_are_all_answered(
    external_host,  # noqa: F811
    fleet_factory,
    web,
):
    fleet = h2_fleet(fleet_factory, web)
    c = client(external_host, fleet)
    rs = c.exchange([H2Request(b"GET", b"/s/%d" % i) for i in range(100)], timeout=30)
    assert [r.status for r in rs] == [200] * 100
    assert sorted(json.loads(r.body)["path"] for r in rs) == sorted(f"/s/{i}" for i in range(100))
    assert c.remote_settings.get(0x3) == 100  # SETTINGS_MAX_CONCURRENT_STREAMS
    c.close()


def test_a_mebibyte_up_and_down_with_the_default_windows(external_host, fleet_factory, web):  # noqa: F811
    fleet = h2_fleet(fleet_factory, web)
    c = client(external_host, fleet)
    n = 1 << 20
    down = c.fetch(H2Request(b"GET", b"/big/%d" % n), timeout=30)
    want = b"".join(pattern(off, 65536) for off in range(0, n, 65536))  # as the backend writes it
    assert down.status == 200 and len(down.body) == n and down.body == want
    up = bytes(range(256)) * (n // 256)
    r = c.fetch(H2Request(b"POST", b"/echo", headers=[(b"content-length", b"%d" % n)], body=up), timeout=30)
    assert r.status == 200
    seen = json.loads(r.body)
    assert seen["body_len"] == n and seen["body_sha256"] == hashlib.sha256(up).hexdigest()
    # no content-length: forwarded chunked, as h1 does for a streamed body
    r = c.fetch(H2Request(b"POST", b"/echo", body=up[: 300 * 1024]), timeout=30)
    assert r.status == 200, r
    seen = json.loads(r.body)  # the backend read the whole chunked body before it answered
    assert ("Transfer-Encoding", "chunked") in [tuple(h) for h in seen["headers"]]
    assert seen["body_len"] == 300 * 1024 and seen["body_sha256"] == hashlib.sha256(up[: 300 * 1024]).hexdigest()
    c.close()


def test_authority_other_than_the_sni_is_421_and_the_connection_goes_on(
    external_host,  # noqa: F811
    fleet_factory,
    web,
):
    fleet = h2_fleet(fleet_factory, web)
    c = client(external_host, fleet)
    rs = c.exchange([H2Request(b"GET", b"/a", authority=b"other.apps.test"), H2Request(b"GET", b"/b")])
    assert [r.status for r in rs] == [421, 200]
    assert c.get(b"/after").status == 200 and c.goaway is None
    assert [q["path"] for q in web.requests] == ["/b", "/after"]
    c.close()


@pytest.mark.parametrize(
    "headers",
    [[(b"connection", b"keep-alive")], [(b"transfer-encoding", b"chunked")], [(b"te", b"gzip")],
     [(b"upgrade", b"websocket")], [(b"host", b"other.apps.test")]],
    ids=["connection", "transfer-encoding", "te", "upgrade", "host-mismatch"],
)  # fmt: skip
def test_a_malformed_request_is_a_stream_error_never_forwarded(external_host, fleet_factory, web, headers):  # noqa: F811
    fleet = h2_fleet(fleet_factory, web)
    c = client(external_host, fleet)
    rs = c.exchange([H2Request(b"GET", b"/bad", headers=headers), H2Request(b"GET", b"/good")])
    bad, good = rs
    assert bad.reset == h2_codes.PROTOCOL_ERROR or bad.status == 400, bad
    assert good.status == 200 and c.goaway is None
    assert [q["path"] for q in web.requests] == ["/good"]
    wait_until(lambda: fleet.stats().get("h2_stream_errors", 0) + fleet.stats().get("http_400", 0) >= 1, 15, 0.2)
    c.close()


def test_a_content_length_that_disagrees_with_the_data_is_a_stream_error(
    external_host,  # noqa: F811
    fleet_factory,
    web,
):
    fleet = h2_fleet(fleet_factory, web)
    c = client(external_host, fleet)
    r = c.fetch(H2Request(b"POST", b"/echo", headers=[(b"content-length", b"10")], body=b"x" * 20))
    assert r.reset == h2_codes.PROTOCOL_ERROR, r
    assert c.get(b"/next").status == 200
    wait_until(lambda: fleet.stats().get("h2_stream_errors", 0) >= 1, 15, 0.2)  # the engine's check or ours
    c.close()


def test_rate_limit_429_per_stream_keeps_the_other_streams(external_host, fleet_factory, web):  # noqa: F811
    fleet = h2_fleet(
        fleet_factory, web, extra="\n[policy]\nrate_limit = true\nrate_limit_rps = 1\nrate_limit_burst = 2\n"
    )
    c = client(external_host, fleet)
    rs = c.exchange([H2Request(b"GET", b"/r/%d" % i) for i in range(6)])
    statuses = [r.status for r in rs]
    assert statuses.count(200) == 2 and statuses.count(429) == 4, statuses
    assert all(r.reset is None for r in rs) and c.goaway is None
    assert all(r.header(b"retry-after") for r in rs if r.status == 429)
    assert len(web.requests) == 2
    c.close()


def test_a_reload_drains_with_two_goaways_and_serves_the_stream_in_flight(
    external_host,  # noqa: F811
    fleet_factory,
    web,
):
    """SIGHUP: the old worker drains (SIGTERM to it) while its replacement listens. Raw frames: python-hyper's
    h2 takes the first GOAWAY as the end of the connection, which it is not."""
    import signal

    from hyperframe.frame import DataFrame, GoAwayFrame, HeadersFrame, PingFrame

    from tests import h2frames
    from tests.h2client import RawH2Client

    fleet = h2_fleet(fleet_factory, web, workers=1)
    c = RawH2Client(external_host.connect(fleet.port), SNI)
    c.send(c.frames.headers(1, h2frames.request_fields(b"/slow/1", SNI.encode())))
    assert web.slow_started.wait(10)
    fleet.signal(signal.SIGHUP)
    got = c.read_frames(GoAwayFrame, timeout=10)
    first = next(f for f in got if isinstance(f, GoAwayFrame))
    assert first.last_stream_id == (1 << 31) - 1 and first.error_code == 0  # step one: "stop opening streams"
    assert any(isinstance(f, PingFrame) for f in got)
    ping = next(f for f in got if isinstance(f, PingFrame) and "ACK" not in f.flags)
    c.send(h2frames.ping(int.from_bytes(ping.opaque_data, "big"), ack=True))
    web.release_slow.set()
    frames = []
    while not c.eof:
        frames += c.read_frames(None, timeout=10)
    finals = [f for f in frames if isinstance(f, GoAwayFrame)]
    assert finals and finals[-1].last_stream_id == 1 and finals[-1].error_code == 0  # step two: the real last id
    assert any(isinstance(f, HeadersFrame) and f.stream_id == 1 for f in frames)
    assert any(isinstance(f, DataFrame) and f.stream_id == 1 and "END_STREAM" in f.flags for f in frames)
