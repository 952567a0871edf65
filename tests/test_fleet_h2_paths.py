"""The HTTP/2 edge's per-stream paths through the whole fleet (PQ TLS from a network namespace): the WAF's 403
with the body inspected before anything goes upstream, ACME challenges, response trailers, HEAD/204/304
without DATA, 100 Continue; each a stream of its own while the connection's other streams carry on.

The backends are the edge tests' scripted ones (tests/test_l7_edge.py's ``EdgeBackend``: ``/raw/<hex>``
answers exactly those bytes).
"""

from __future__ import annotations

import pytest
from hyperframe.frame import DataFrame, HeadersFrame

from tests import h2frames
from tests.crs_dirs import CRS_V3_RULES
from tests.h2client import H2Client, H2Request, RawH2Client
from tests.netns import external_host  # noqa: F401 - fixture
from tests.test_fleet_http_edge import SNI, P, acme_backend, edge_fleet, web  # noqa: F401 - fixtures
from tests.test_http_acme import TOKEN

H2_ON = "\n[http2]\nenabled = true\n"
WAF = f'\n[policy]\nwaf = true\nwaf_crs_dir = "{CRS_V3_RULES}"\n'


def client(host, fleet) -> H2Client:
    return H2Client(host.connect(fleet.port), SNI)


def paths(backend) -> list[str]:
    return [r["target"] for r in backend.requests]


@pytest.mark.skipif(not (CRS_V3_RULES / "REQUEST-901-INITIALIZATION.conf").is_file(), reason="no CRS 3.3")
def test_waf_403_per_stream_with_the_body_inspected_first(external_host, fleet_factory, web, acme_backend):  # noqa: F811
    fleet = edge_fleet(fleet_factory, web, acme_backend, extra=H2_ON + WAF)
    c = client(external_host, fleet)
    form = [(b"content-type", b"application/x-www-form-urlencoded")]
    reqs = [
        H2Request(b"POST", b"/echo", headers=form, body=b"name=O%27Brien&city=Dublin"),
        H2Request(b"POST", b"/login", headers=form, body=b"var=1234 OR 1=1"),  # no content-length: streamed
        H2Request(b"GET", b"/c", headers=[(b"cookie", b"p=<script>alert(1)</script>")]),
        H2Request(b"POST", b"/api", headers=[(b"content-type", b"application/json"), (b"content-length", b"44")],
                  body=b'{"id": "1 UNION SELECT password FROM users"}'),
        H2Request(b"GET", b"/after"),
    ]  # fmt: skip
    rs = c.exchange(reqs, timeout=30)
    assert [r.status for r in rs] == [200, 403, 403, 403, 200], [(r.status, r.reset) for r in rs]
    assert rs[0].body == b"name=O%27Brien&city=Dublin"
    assert all(r.reset is None for r in rs) and c.goaway is None
    assert sorted(paths(web)) == ["/after", "/echo"]  # a blocked body never went upstream, not even its head
    assert c.get(b"/again").status == 200  # the connection goes on
    stats = fleet.stats()
    assert stats["policy_waf"] == 3
    c.close()


def test_acme_challenge_over_h2_goes_to_the_acme_service(external_host, fleet_factory, web, acme_backend):  # noqa: F811
    """A name not routed yet (its certificate is being issued): the challenge goes to acme.service, anything
    else is 421, and the connection's other streams carry on."""
    fleet = edge_fleet(fleet_factory, web, acme_backend, extra=H2_ON)
    c = H2Client(external_host.connect(fleet.port), "new.apps.test")
    rs = c.exchange([H2Request(b"GET", P + TOKEN), H2Request(b"HEAD", P + TOKEN), H2Request(b"GET", b"/web")])
    assert [r.status for r in rs] == [200, 200, 421]
    assert rs[1].body == b""
    assert [(r["method"], r["target"]) for r in acme_backend.requests] == [
        ("GET", (P + TOKEN).decode()),
        ("HEAD", (P + TOKEN).decode()),
    ]
    assert paths(web) == [] and c.goaway is None
    assert not any(k.lower().startswith("x-sentin8-") for k, _ in acme_backend.requests[0]["headers"])
    c.close()


def test_trailers_head_204_304_and_100_continue(external_host, fleet_factory, web, acme_backend):  # noqa: F811
    fleet = edge_fleet(fleet_factory, web, acme_backend, extra=H2_ON, cap=1 << 20)
    c = client(external_host, fleet)
    r204 = b"HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n".hex().encode()
    r304 = b'HTTP/1.1 304 Not Modified\r\nETag: "e"\r\nContent-Length: 5\r\n\r\n'.hex().encode()
    tr = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Sum: 9\r\nConnection: x\r\n\r\n"
    rs = c.exchange(
        [
            H2Request(b"GET", b"/chunked"),
            H2Request(b"GET", b"/raw/" + tr.hex().encode()),
            H2Request(b"HEAD", b"/echo"),
            H2Request(b"GET", b"/raw/" + r204),
            H2Request(b"GET", b"/raw/" + r304),
            H2Request(b"POST", b"/continue", headers=[(b"expect", b"100-continue")], body=b"hello"),
        ],
        timeout=30,
    )
    chunked, raw_tr, head, no_content, not_modified, cont = rs
    assert chunked.status == 200 and chunked.body == b"".join(b"part-%d;" % i for i in range(5))
    assert chunked.trailers == [(b"x-trailer", b"t")]
    assert raw_tr.body == b"abc" and raw_tr.trailers == [(b"x-sum", b"9")]  # hop-by-hop dropped from trailers
    assert head.status == 200 and head.body == b""
    assert no_content.status == 204 and no_content.body == b"" and no_content.header(b"x-a") == b"1"
    assert not_modified.status == 304 and not_modified.body == b""
    assert cont.status == 200 and cont.body == b"hello"
    assert all(r.reset is None for r in rs) and c.goaway is None
    c.close()


def test_no_data_frame_for_head_204_304(external_host, fleet_factory, web, acme_backend):  # noqa: F811
    """On the wire: HEADERS with END_STREAM and no DATA frame at all (an empty DATA would still be one)."""
    fleet = edge_fleet(fleet_factory, web, acme_backend, extra=H2_ON)
    c = RawH2Client(external_host.connect(fleet.port), SNI)
    r204 = b"HTTP/1.1 204 No Content\r\n\r\n".hex().encode()
    r304 = b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n".hex().encode()
    sids = {1: (b"HEAD", b"/echo"), 3: (b"GET", b"/raw/" + r204), 5: (b"GET", b"/raw/" + r304)}
    for sid, (method, path) in sids.items():
        c.send(c.frames.headers(sid, h2frames.request_fields(path, SNI.encode(), method)))
    frames: list = []
    ended: set[int] = set()
    while ended != set(sids):
        got = c.read_frames(None, timeout=10)
        assert got or not c.eof
        frames += got
        ended |= {f.stream_id for f in got if isinstance(f, HeadersFrame) and "END_STREAM" in f.flags}
    assert not [f for f in frames if isinstance(f, DataFrame) and f.stream_id in sids]
    c.close()


@pytest.mark.skipif(not (CRS_V3_RULES / "REQUEST-901-INITIALIZATION.conf").is_file(), reason="no CRS 3.3")
def test_the_proxy_answers_100_continue_when_the_waf_waits_for_the_body(
    external_host,  # noqa: F811
    fleet_factory,
    web,  # noqa: F811
    acme_backend,  # noqa: F811
):
    import hpack

    fleet = edge_fleet(fleet_factory, web, acme_backend, extra=H2_ON + WAF)
    c = RawH2Client(external_host.connect(fleet.port), SNI)
    fields = [*h2frames.request_fields(b"/echo", SNI.encode(), b"POST"), (b"expect", b"100-continue"),
              (b"content-length", b"5"), (b"content-type", b"application/x-www-form-urlencoded")]  # fmt: skip
    c.send(c.frames.headers(1, fields, end_stream=False))
    decoder = hpack.Decoder()
    statuses: list[bytes] = []
    while not statuses:  # the interim head, before any body byte was sent
        for f in c.read_frames(None, timeout=10):
            if isinstance(f, HeadersFrame) and f.stream_id == 1:
                statuses.append(dict(decoder.decode(f.data, raw=True))[b":status"])
    assert statuses == [b"100"] and web.requests == []  # nothing upstream yet: the WAF holds the request
    c.send(h2frames.data(1, b"a=b&c", end_stream=True))
    while len(statuses) < 2:
        for f in c.read_frames(None, timeout=10):
            if isinstance(f, HeadersFrame) and f.stream_id == 1:
                statuses.append(dict(decoder.decode(f.data, raw=True))[b":status"])
    assert statuses[1] == b"200" and paths(web) == ["/echo"]
    c.close()
