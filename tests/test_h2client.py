"""The HTTP/2 test client (tests/h2client.py) against a real peer: the loopback server made from sentin8's h2
adapter (tests/h2loopback.py), over PQ TLS, the client in a network namespace as the fleet tests will use it.

These also run the adapter, the request mapping and the budgets over real TLS and sockets.
"""

from __future__ import annotations

import hashlib

import pytest
from hyperframe.frame import GoAwayFrame, RstStreamFrame

from sentin8.http import h2_codes
from tests import h2frames as F
from tests.h2client import H2Client, H2Request, RawH2Client
from tests.h2frames import request_fields
from tests.h2loopback import LoopbackH2Server
from tests.netns import ExternalHost, external_host  # noqa: F401 - fixture

SNI = "loopback.test"


@pytest.fixture
def server(external_host: ExternalHost):  # noqa: F811
    srv = LoopbackH2Server(host=external_host.gateway_ip)
    yield srv
    srv.close()
    assert srv.errors == []


def client(ext: ExternalHost, srv: LoopbackH2Server, **kw) -> H2Client:
    return H2Client(ext.connect(srv.port), SNI, **kw)


@pytest.mark.netns
def test_alpn_h2_and_a_request(external_host, server):  # noqa: F811
    c = client(external_host, server)
    assert c.alpn == b"h2" and c.tls.group_name == "X25519MLKEM768"
    r = c.get(b"/hello?x=1")
    assert (r.status, r.body, r.reset) == (200, b"hello from /hello?x=1\n", None)
    assert r.header(b"x-request-host") == b"loopback.test"
    head = server.heads[-1]
    assert (head.version, head.host, head.target, head.headers[0]) == (
        "2",
        "loopback.test",
        b"/hello?x=1",
        (b"host", b"loopback.test"),
    )
    c.close()


@pytest.mark.netns
def test_h1_only_client_gets_http11_from_the_loopback(external_host, server):  # noqa: F811
    c = client(external_host, server, alpn=(b"http/1.1",))
    assert c.alpn == b"http/1.1"
    c.tls.close()


@pytest.mark.netns
def test_100_concurrent_streams_on_one_connection(external_host, server):  # noqa: F811
    c = client(external_host, server)
    reqs = [H2Request(b"GET", b"/bytes/%d" % (1000 + i)) for i in range(100)]
    c.h2.remote_settings  # noqa: B018 - the server's SETTINGS arrive with the first read
    resps = c.exchange(reqs, timeout=30)
    assert [r.status for r in resps] == [200] * 100
    assert [len(r.body) for r in resps] == [1000 + i for i in range(100)]
    assert c.remote_settings[0x3] == 100  # MAX_CONCURRENT_STREAMS
    c.close()


@pytest.mark.netns
def test_one_mib_up_and_down_with_the_default_64_kib_windows(external_host, server):  # noqa: F811
    c = client(external_host, server, window=65535)  # the client's windows at the RFC default too
    body = bytes(range(256)) * 4096  # 1 MiB
    up = c.fetch(H2Request(b"POST", b"/echo", body=body), timeout=60)
    assert up.status == 200 and hashlib.sha256(up.body).digest() == hashlib.sha256(body).digest()
    down = c.get(b"/bytes/%d" % (1 << 20))
    assert down.status == 200 and len(down.body) == 1 << 20
    c.close()


@pytest.mark.netns
def test_trailers_both_ways_and_interim_heads(external_host, server):  # noqa: F811
    c = client(external_host, server)
    r = c.fetch(H2Request(b"POST", b"/echo", [(b"x-trailers", b"1")], b"abc", trailers=[(b"x-checksum", b"9")]))
    assert r.body == b"abc" and r.trailers == [(b"x-body-length", b"3"), (b"x-request-trailers", b"x-checksum")]
    e = c.get(b"/early-hints")
    assert e.status == 200 and e.interim and e.interim[0][0] == (b":status", b"103")
    c.close()


@pytest.mark.netns
def test_refusals_answer_one_stream_and_keep_the_connection(external_host, server):  # noqa: F811
    c = client(external_host, server)
    bad = c.fetch(H2Request(b"GET", b"/x", [(b"host", b"evil.test")]))
    assert (bad.status, bad.reset) == (400, None)
    scheme = c.fetch(H2Request(b"GET", b"index.html"))
    assert scheme.reset == h2_codes.PROTOCOL_ERROR or scheme.status == 400
    ok = c.get(b"/still-here")
    assert ok.status == 200
    assert "h2_host_mismatch" in server.refusals
    c.close()


@pytest.mark.netns
def test_raw_frames_rapid_reset_gets_enhance_your_calm(external_host, server):  # noqa: F811
    raw = RawH2Client(external_host.connect(server.port), SNI)
    assert raw.alpn == b"h2"
    burst = b"".join(
        raw.frames.headers(s, request_fields(authority=SNI.encode()), end_stream=False) + F.rst(s)
        for s in range(1, 600, 2)
    )
    raw.send(burst)
    frames = raw.read_frames(GoAwayFrame, timeout=20)
    goaway = [f for f in frames if isinstance(f, GoAwayFrame)][-1]
    assert goaway.error_code == h2_codes.ENHANCE_YOUR_CALM
    assert "h2_premature_resets" in server.refusals
    raw.close()
    # the server (and so the adapter) is fine for the next client
    c = client(external_host, server)
    assert c.get(b"/after").status == 200
    c.close()


@pytest.mark.netns
def test_raw_frames_malformed_request_is_a_stream_error(external_host, server):  # noqa: F811
    raw = RawH2Client(external_host.connect(server.port), SNI)
    raw.send(raw.frames.headers(1, [*request_fields(authority=SNI.encode()), (b"Upper", b"x")]))
    frames = raw.read_frames(RstStreamFrame, timeout=10)
    rst = [f for f in frames if isinstance(f, RstStreamFrame)]
    assert [(f.stream_id, f.error_code) for f in rst] == [(1, h2_codes.PROTOCOL_ERROR)]
    raw.close()


def test_client_on_loopback_without_a_namespace():
    """The same client over 127.0.0.1, for machines without ip netns."""
    import socket

    srv = LoopbackH2Server()
    try:
        c = H2Client(socket.create_connection(("127.0.0.1", srv.port), timeout=10), SNI)
        assert c.get(b"/").status == 200
        c.ping()
        c.close()
    finally:
        srv.close()
    assert srv.errors == []
