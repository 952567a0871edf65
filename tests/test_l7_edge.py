"""The HTTP edge over real loopback sockets (issue 16): the ACME bypass only for what a CA sends, WebSocket
handshakes, interim and odd responses, Expect on HTTP/1.0, and request-body bounds. Each test states the exact
answer for the whole class it covers; the same cases through the fleet over PQ TLS are in
tests/test_fleet_http_edge.py, the byte-level decisions in tests/test_http_*.py.
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterator

import pytest

from sentin8.http.response import INTERIM_MAX_BYTES, INTERIM_MAX_COUNT
from tests.test_http_acme import NEAR_MISSES, TOKEN, TRAVERSALS
from tests.test_l7_bridge import (
    WS_KEY,
    Backend,
    Client,
    PlainHTTPListener,
    Proxy,
    acme,  # noqa: F401 - fixture
    get,
    make_cfg,
    make_table,
    proxies,  # noqa: F401 - fixture
    settled,
    start,  # noqa: F401 - fixture
    wait_until,
    websocket_accept,
    with_waf,
)

P = b"/.well-known/acme-challenge/"
HOST = b"Host: shop.example.com\r\n"


class EdgeBackend(Backend):
    """The bridge tests' backend with scripted answers for this module's paths."""

    def _handle(self, conn, f, method, target, headers, lower) -> bool:
        path = target.split("?")[0]
        send = conn.sendall
        if path.startswith("/interim/"):  # /interim/<count>/<header bytes per interim>
            count, size = (int(x) for x in path.split("/")[2:4])
            for _ in range(count):
                send(b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload" + b"x" * size + b"\r\n\r\n")
            send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            return True
        if path.startswith("/raw/"):  # /raw/<hex>: these bytes as the response, then close
            for _ in self._body_chunks(f, lower):
                pass
            send(bytes.fromhex(path[5:]))
            return False
        # /ws-if: a WebSocket server for a real handshake only, else a plain JSON answer
        if path == "/ws-if" and lower.get("upgrade", "").lower() == "websocket":
            accept = websocket_accept(lower.get("sec-websocket-key", "").encode())
            send(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n")
            send(b"Sec-WebSocket-Accept: %s\r\n\r\n" % accept)
            data = f.read1(65536)
            if data:
                send(b"echo:" + data)
            return False
        if path.startswith("/ws-101/"):  # /ws-101/<hex of the Upgrade/Connection lines>: right accept
            accept = websocket_accept(lower.get("sec-websocket-key", "").encode())
            send(b"HTTP/1.1 101 Switching Protocols\r\n" + bytes.fromhex(path[8:]))
            send(b"Sec-WebSocket-Accept: %s\r\n\r\nhello-from-the-tunnel" % accept)
            f.read1(65536)
            return False
        if path == "/stream-echo":  # 200 at once, then each chunk back as it comes, until the proxy cuts it
            send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            try:
                for data in self._body_chunks(f, lower):
                    send(b"%x\r\n%s\r\n" % (len(data), data))
            except ValueError:  # the request was cut mid-body
                return False
            send(b"0\r\n\r\n")
            return True
        if path == "/read-all":  # the whole body first, then 200 with it (a cut request: just closed)
            try:
                body = b"".join(self._body_chunks(f, lower))
            except (ValueError, OSError):
                return False
            send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            return True
        if path == "/sink":  # read the body until the client gives up, answer nothing
            while f.read1(65536):
                pass
            return False
        return super()._handle(conn, f, method, target, headers, lower)


@pytest.fixture
def web() -> Iterator[EdgeBackend]:
    b = EdgeBackend("web")
    yield b
    b.close()


def raw_path(data: bytes) -> str:
    return "/raw/" + data.hex()


def headers_of(r) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for k, v in r.headers:
        out.setdefault(k.lower(), []).append(v)
    return out


# --------------------------------------------------------------------------------------------------------
# 1. The ACME bypass: only what a CA sends
# --------------------------------------------------------------------------------------------------------


def test_acme_challenge_and_head_reach_the_acme_service_on_both_ports(start, web, acme):  # noqa: F811
    for kw in ({}, {"cls": PlainHTTPListener}):  # the :443 bridge, then :80
        proxy = start(make_table([web], acme=acme), **kw)
        for method in (b"GET", b"HEAD"):
            c = proxy.client()
            c.send(b"%s %s HTTP/1.1\r\nHost: not-routed.example.net\r\n\r\n" % (method, P + TOKEN))
            r = c.response(head_only=method == b"HEAD")
            assert r.status == 200, (kw, method)
        assert [(r["method"], r["target"]) for r in acme.requests[-2:]] == [
            ("GET", (P + TOKEN).decode()),
            ("HEAD", (P + TOKEN).decode()),
        ]
        assert proxy.counters["acme_requests"] == 2 and proxy.counters["acme_not_challenge"] == 0
        settled(proxy)
    assert web.requests == []


def test_every_traversal_under_the_prefix_takes_the_normal_path_on_443(start, web, acme):  # noqa: F811
    """Routed by Host to its service, asked of the policy, context injected: never the acme service."""
    proxy = start(make_table([web], acme=acme))
    asked: list[bytes] = []
    proxy.ctx.policy_fn = lambda info: asked.append(info.target) and None
    for name, target in TRAVERSALS.items():
        c = proxy.client()
        r = c.request(b"GET " + target + b" HTTP/1.1\r\n" + HOST + b"\r\n")
        assert r.status == 200 and r.json()["backend"] == "web", name
        got = {k.lower(): v for k, v in r.json()["headers"]}
        assert got["x-sentin8-env-id"] == "env-1", name  # the normal path's injection
        c.close()
    assert asked == list(TRAVERSALS.values())
    assert acme.requests == []
    assert proxy.counters["acme_not_challenge"] == len(TRAVERSALS) and proxy.counters["acme_requests"] == 0
    # with a Host nothing routes, the normal path's answer: 421, and still never the acme service
    r = proxy.client().request(b"GET " + P + b"../../admin HTTP/1.1\r\nHost: not-routed.example.net\r\n\r\n")
    assert r.status == 421 and acme.requests == []
    settled(proxy)


def test_every_non_challenge_gets_404_on_port_80(start, web, acme):  # noqa: F811
    proxy = start(make_table([web], acme=acme), cls=PlainHTTPListener)
    cases = [(b"GET", t) for t in (*TRAVERSALS.values(), *NEAR_MISSES.values())]
    cases += [(m, P + TOKEN) for m in (b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH")]
    cases += [(b"GET", b"https://shop.example.com" + P + TOKEN), (b"GET", b"http://shop.example.com" + P + TOKEN)]
    for method, target in cases:
        c = proxy.client()
        r = c.request(method + b" " + target + b" HTTP/1.1\r\n" + HOST + b"Content-Length: 0\r\n\r\n")
        assert r.status == 404 and c.closed(), (method, target)
    # a body or an upgrade makes a challenge-shaped request no challenge either
    for extra in (b"Content-Length: 1\r\n\r\nx", b"Connection: Upgrade\r\nUpgrade: websocket\r\n"
                  b"Sec-WebSocket-Key: %s\r\n\r\n" % WS_KEY):  # fmt: skip
        c = proxy.client()
        r = c.request(b"GET " + P + TOKEN + b" HTTP/1.1\r\n" + HOST + extra)
        assert r.status == 404 and c.closed(), extra
    assert acme.requests == [] and web.requests == []
    under_prefix = len(TRAVERSALS) + 5 + 2 + 2  # the near misses are not under it
    assert proxy.counters["acme_not_challenge"] == under_prefix
    assert proxy.counters["http_404"] == len(cases) + 2
    settled(proxy)


def test_the_original_report_gets_the_waf_not_the_acme_service(start, web, acme):  # noqa: F811
    proxy = with_waf(start(make_table([web], acme=acme)))
    c = proxy.client()
    r = c.request(b"GET " + P + b"../../admin?q=1%27%20OR%201%3D1-- HTTP/1.1\r\nHost: shop.example.com\r\n\r\n")
    assert r.status == 403 and acme.requests == [] and web.requests == []
    assert proxy.counters["policy_waf"] == 1 and proxy.counters["acme_not_challenge"] == 1
    settled(proxy)


# --------------------------------------------------------------------------------------------------------
# 2. WebSocket: a tunnel only for a real handshake, proven by a real 101
# --------------------------------------------------------------------------------------------------------

UPGRADES = {b"websocket": True, b"WebSocket": True, b"h2c, websocket": True, b"notwebsocket": False,
            b"websocketx": False, b"h2c": False, b"websocket/13": False, None: False}  # fmt: skip
CONNECTIONS = {b"Upgrade": True, b"keep-alive, Upgrade": True, b"keep-alive": False, b"notupgrade": False,
               None: False}  # fmt: skip


def test_every_bad_upgrade_connection_version_combination(start, web):  # noqa: F811
    """Exactly one outcome per combination: a tunnel (101, then bytes both ways), a 400 never forwarded, or a
    plain request whose Upgrade and Connection never reach the backend."""
    proxy = start(make_table([web]))
    seen = {"tunnel": 0, "400": 0, "plain": 0}
    combos = itertools.product(
        (b"1.0", b"1.1"), (b"GET", b"POST"), UPGRADES.items(), CONNECTIONS.items(), (True, False), (False, True)
    )
    for version, method, (up, up_ok), (conn, conn_ok), with_key, with_body in combos:
        raw = method + b" /ws-if HTTP/" + version + b"\r\n" + HOST
        raw += b"Upgrade: %s\r\n" % up if up is not None else b""
        raw += b"Connection: %s\r\n" % conn if conn is not None else b""
        raw += b"Sec-WebSocket-Key: %s\r\n" % WS_KEY if with_key else b""
        raw += b"Content-Length: 2\r\n\r\nhi" if with_body else b"\r\n"
        case = raw.split(b"\r\n\r\n")[0]
        upgrade = conn_ok and up is not None
        handshake = version == b"1.1" and method == b"GET" and up_ok and conn_ok
        before = len(web.requests)
        c = proxy.client()
        c.send(raw)
        r = c.response()
        if upgrade and (with_body or (handshake and not with_key)):
            assert r.status == 400 and c.closed(), case
            assert len(web.requests) == before, case
            seen["400"] += 1
        elif handshake:
            assert r.status == 101 and r.header("upgrade") == "websocket", case
            c.send(b"frame")
            while len(c.buf) < 10:
                assert c._fill(), case
            assert c.buf == b"echo:frame", case
            seen["tunnel"] += 1
        else:
            assert r.status == 200, case
            got = {k.lower() for k, _ in r.json()["headers"]}
            assert not got & {"upgrade", "connection"}, case
            seen["plain"] += 1
        c.close()
    assert seen == {"tunnel": 6, "400": 118, "plain": 516}
    assert proxy.counters["websocket_upgrades"] == 6 and proxy.counters["upgrade_refused"] == 118
    assert proxy.counters["upgrade_ignored"] == 100  # the parser saw an upgrade we did not take, no body
    settled(proxy)


@pytest.mark.parametrize(
    ("lines", "counter"),
    [
        (b"Upgrade: websocket\r\nConnection: Upgrade\r\n", None),
        (b"Upgrade: WebSocket\r\nConnection: keep-alive, upgrade\r\n", None),
        (b"Upgrade: h2c\r\nConnection: Upgrade\r\n", "websocket_bad_upgrade"),
        (b"Upgrade: websocket, h2c\r\nConnection: Upgrade\r\n", "websocket_bad_upgrade"),
        (b"Upgrade: notwebsocket\r\nConnection: Upgrade\r\n", "websocket_bad_upgrade"),
        (b"Connection: Upgrade\r\n", "websocket_bad_upgrade"),
        (b"Upgrade: websocket\r\n", "websocket_bad_upgrade"),
        (b"Upgrade: websocket\r\nConnection: keep-alive\r\n", "websocket_bad_upgrade"),
    ],
    ids=["good", "good-case", "h2c", "websocket-h2c", "notwebsocket", "no-upgrade", "no-connection", "keep-alive"],
)
def test_a_101_must_echo_upgrade_websocket(start, web, lines, counter):  # noqa: F811
    proxy = start(make_table([web]))
    c = proxy.client()
    c.send(b"GET /ws-101/" + lines.hex().encode() + b" HTTP/1.1\r\n" + HOST + b"Connection: Upgrade\r\n"
           b"Upgrade: websocket\r\nSec-WebSocket-Key: " + WS_KEY + b"\r\n\r\n")  # fmt: skip
    r = c.response()
    if counter is None:
        assert r.status == 101 and headers_of(r)["upgrade"] == ["websocket"]
        while b"hello-from-the-tunnel" not in c.buf:
            assert c._fill()
        assert proxy.counters["websocket_upgrades"] == 1
    else:
        assert r.status == 502 and c.closed()
        assert b"hello-from-the-tunnel" not in c.buf  # no tunnel opened
        assert proxy.counters[counter] == 1 and proxy.counters["websocket_upgrades"] == 0
    c.close()
    settled(proxy)


# --------------------------------------------------------------------------------------------------------
# 3. Interim and odd responses
# --------------------------------------------------------------------------------------------------------


def interims_then(c: Client) -> tuple[list, object]:
    """The interim responses the client got, then the final one."""
    got = []
    while True:
        r = c.response()
        if r.status >= 200:
            return got, r
        got.append(r)


@pytest.mark.parametrize(("count", "relayed", "final"), [(1, 1, 200), (8, 8, 200), (9, 8, 502), (1000, 8, 502)])
def test_interim_responses_are_bounded_in_count(start, web, count, relayed, final):  # noqa: F811
    proxy = start(make_table([web]))
    c = proxy.client()
    c.send(get(f"/interim/{count}/0"))
    got, r = interims_then(c)
    assert [g.status for g in got] == [103] * relayed and r.status == final
    assert all(g.header("link") == "</s.css>; rel=preload" for g in got)
    if final == 502:
        assert c.closed() and proxy.counters["upstream_interim_refused"] == 1
    else:
        assert r.body == b"ok"
    settled(proxy)


def test_interim_responses_are_bounded_in_bytes(start, web):  # noqa: F811
    size = 10_000  # each 103: its status line (15 + 11 reason bytes) and one header line of 4 + 4 + 30 + size
    per = 15 + len(b"Early Hints") + 4 + 4 + len(b"</s.css>; rel=preload") + size
    fits = INTERIM_MAX_BYTES // per
    assert fits < INTERIM_MAX_COUNT  # the bytes bound is the one that bites here
    proxy = start(make_table([web]))
    c = proxy.client()
    c.send(get(f"/interim/{fits + 1}/{size}"))
    got, r = interims_then(c)
    assert len(got) == fits and r.status == 502 and c.closed()
    assert proxy.counters["upstream_interim_refused"] == 1
    settled(proxy)


def test_interim_responses_lose_their_framing_headers_and_reserved_names(start, web):  # noqa: F811
    proxy = start(make_table([web]))
    c = proxy.client()
    raw = (
        b"HTTP/1.1 100 Continue\r\nContent-Length: 5\r\nX-Sentin8-Env-Id: leak\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nTransfer-Encoding: chunked\r\nLink: </a>\r\n\r\n"  # (both at once: llhttp's 502)
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    )
    c.send(get(raw_path(raw)))
    want = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
    while len(c.buf) < len(want):
        assert c._fill()
    assert c.buf[: len(want)] == want  # byte for byte: nothing else on either
    c.buf = c.buf[len(want) :]
    r = c.response()
    assert r.status == 200 and r.body == b"ok"
    settled(proxy)


def test_an_http10_client_gets_no_interim_response(start, web):  # noqa: F811
    proxy = start(make_table([web]))
    c = proxy.client()
    c.send(b"GET /interim/3/0 HTTP/1.0\r\n" + HOST + b"\r\n")
    r = c.response()
    assert r.status == 200 and r.body == b"ok"
    settled(proxy)


PARSED_BAD_STATUS = [  # llhttp takes these; status_line_acceptable refuses them (upstream_bad_status)
    b"HTTP/2.0 200 OK",
    b"HTTP/0.9 200 OK",
    b"RTSP/1.0 200 OK",
    b"ICE/1.0 200 OK",
    b"HTTP/1.1 999 Nine",
    b"HTTP/1.1 099 Low",
    b"HTTP/1.1 000 Zero",
    b"HTTP/1.1 600 Six",
    b"HTTP/1.1 700 Seven",
]
BAD_STATUS = [  # and these llhttp refuses itself: a 502 all the same
    *PARSED_BAD_STATUS,
    b"HTTP/2 200 OK",
    b"HTTP/1.2 200 OK",
    b"HTTP/3.0 200 OK",
    b"HTTP/1.1 20 OK",
    b"HTTP/1.1 2000 OK",
]


@pytest.mark.parametrize("line", BAD_STATUS, ids=[b.decode() for b in BAD_STATUS])
@pytest.mark.parametrize("after_interim", [False, True], ids=["first", "after-100"])
def test_a_status_line_that_is_not_http1_with_a_1xx_5xx_code_is_502(start, web, line, after_interim):  # noqa: F811
    proxy = start(make_table([web]))
    c = proxy.client()
    raw = (b"HTTP/1.1 100 Continue\r\n\r\n" if after_interim else b"") + line + b"\r\nContent-Length: 2\r\n\r\nok"
    c.send(get(raw_path(raw)))
    got, r = interims_then(c)
    assert [g.status for g in got] == ([100] if after_interim else []) and r.status == 502 and c.closed()
    assert r.body == b"502 Bad Gateway\n"
    assert proxy.counters["upstream_errors"] == 1
    assert proxy.counters["upstream_bad_status"] == (line in PARSED_BAD_STATUS)
    settled(proxy)


def test_a_1xx_status_that_is_not_http1_is_502_too(start, web):  # noqa: F811
    proxy = start(make_table([web]))
    c = proxy.client()
    c.send(get(raw_path(b"HTTP/2.0 103 Early Hints\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")))
    r = c.response()
    assert r.status == 502 and c.closed() and proxy.counters["upstream_bad_status"] == 1
    settled(proxy)


def test_backend_reserved_headers_never_reach_the_client(start, web):  # noqa: F811
    leak = b"".join(
        b"%s: leak\r\n" % n
        for n in (
            b"X-Sentin8-Env-Id",
            b"x-sentin8-tenant-id",
            b"X-SENTIN8-USER-ID",
            b"X_Sentin8_Scopes",
            b"x-Sentin8-New",
        )
    )
    proxy = start(make_table([web]))
    c = proxy.client()
    raw = b"HTTP/1.1 103 Early Hints\r\n" + leak + b"\r\nHTTP/1.1 200 OK\r\n" + leak + b"Content-Length: 2\r\n\r\nok"
    c.send(get(raw_path(raw)))
    got, r = interims_then(c)
    assert [g.status for g in got] == [103] and r.status == 200 and r.body == b"ok"
    for resp in (*got, r):
        assert not any(v == "leak" for _, v in resp.headers), resp.headers
    c = proxy.client()
    lines = b"Upgrade: websocket\r\nConnection: Upgrade\r\n" + leak
    c.send(b"GET /ws-101/" + lines.hex().encode() + b" HTTP/1.1\r\n" + HOST + b"Connection: Upgrade\r\n"
           b"Upgrade: websocket\r\nSec-WebSocket-Key: " + WS_KEY + b"\r\n\r\n")  # fmt: skip
    r = c.response()
    assert r.status == 101 and not any(v == "leak" for _, v in r.headers)
    c.close()
    settled(proxy)


# --------------------------------------------------------------------------------------------------------
# 4. Expect: 100-continue on HTTP/1.0
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("waf", [False, True], ids=["no-waf", "waf"])
def test_expect_on_http10_is_ignored_and_not_forwarded(start, web, waf):  # noqa: F811
    proxy = start(make_table([web]))
    if waf:
        with_waf(proxy)
    c = proxy.client()
    c.send(b"POST /continue HTTP/1.0\r\n" + HOST + b"Expect: 100-continue\r\nContent-Length: 4\r\n\r\nbody")
    r = c.response()  # no 100 first: not from the backend (it never saw the Expect), not from the proxy
    assert r.status == 200 and r.body == b"body"
    seen = {k.lower(): v for k, v in web.requests[-1]["headers"]}
    assert "expect" not in seen
    # on HTTP/1.1 it is forwarded, and the backend's 100 relayed (test_l7_bridge.test_expect_100_continue_is_relayed)
    c = proxy.client()
    c.send(b"POST /continue HTTP/1.1\r\n" + HOST + b"Expect: 100-continue\r\nContent-Length: 4\r\n\r\n")
    assert c.response().status == 100
    c.send(b"body")
    assert c.response().body == b"body"
    assert {k.lower(): v for k, v in web.requests[-1]["headers"]}["expect"] == "100-continue"
    settled(proxy)


# --------------------------------------------------------------------------------------------------------
# 5. Request bodies: limits.max_request_body_bytes and chunk sizes that cannot be real
# --------------------------------------------------------------------------------------------------------

CAP = 1000


def capped(start, web, cap: int = CAP) -> Proxy:  # noqa: F811
    cfg = make_cfg()
    cfg.limits.max_request_body_bytes = cap
    return start(make_table([web]), cfg=cfg)


def chunked(*sizes: int) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (n, b"x" * n) for n in sizes) + b"0\r\n\r\n"


def test_a_declared_length_over_the_cap_is_413_before_the_body_is_read(start, web):  # noqa: F811
    proxy = capped(start, web)
    c = proxy.client()
    r = c.request(b"POST /echo HTTP/1.1\r\n" + HOST + b"Content-Length: %d\r\n\r\n" % CAP + b"x" * CAP)
    assert r.status == 200 and len(r.body) == CAP  # at the cap is within it
    c = proxy.client()
    c.send(b"POST /echo HTTP/1.1\r\n" + HOST + b"Content-Length: %d\r\n\r\n" % (CAP + 1))  # no body sent
    r = c.response()
    assert r.status == 413 and r.header("connection") == "close" and c.closed()
    assert len(web.requests) == 1 and proxy.counters["body_too_large"] == 1 and proxy.counters["http_413"] == 1
    settled(proxy)


@pytest.mark.parametrize(
    ("sizes", "status"),
    [((600, 400), 200), ((600, 401), 413), ((CAP + 1,), 413), ((100,) * 10, 200), ((100,) * 10 + (1,), 413)],
    ids=["at-cap", "second-chunk-over", "one-chunk-over", "many-at-cap", "many-over"],
)
def test_a_chunked_body_over_the_cap_is_413(start, web, sizes, status):  # noqa: F811
    proxy = capped(start, web)
    c = proxy.client()
    # /read-all reads the whole body before it answers: the response has not started when the cap is passed
    r = c.request(b"POST /read-all HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(*sizes))
    assert r.status == status
    if status == 413:
        assert c.closed() and proxy.counters["body_too_large"] == 1
    else:
        assert r.body == b"x" * sum(sizes)
    settled(proxy)


def test_over_the_cap_after_the_response_started_closes_the_connection(start, web):  # noqa: F811
    proxy = capped(start, web)
    c = proxy.client()
    c.send(
        b"POST /stream-echo HTTP/1.1\r\n"
        + HOST
        + b"Transfer-Encoding: chunked\r\n\r\n"
        + b"258\r\n"
        + b"x" * 600
        + b"\r\n"
    )
    while b"x" * 600 not in c.buf:  # the backend answered (200, chunked) and echoed the first chunk
        assert c._fill()
    assert c.buf.startswith(b"HTTP/1.1 200 OK\r\n")
    c.send(b"1f4\r\n" + b"y" * 500 + b"\r\n0\r\n\r\n")  # 1100 bytes in all: over the cap
    assert c.closed()  # a status cannot change any more: the response is cut, never completed
    assert not c.buf.endswith(b"0\r\n\r\n") and proxy.counters["body_too_large"] == 1
    settled(proxy)


def test_a_pipelined_request_over_the_cap_is_answered_413_in_its_turn(start, web):  # noqa: F811
    proxy = capped(start, web)
    c = proxy.client()
    first = b"POST /hold-echo HTTP/1.1\r\n" + HOST + b"Content-Length: 3\r\n\r\nabc"
    second = b"POST /echo HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\n7d0\r\n" + b"z" * 100
    c.send(first + second)  # one write: the second head and its 2000-byte chunk's size line are parsed at once
    wait_until(lambda: proxy.counters["body_too_large"] == 1, what="the held request refused")
    web.release.set()
    first = c.response()
    assert first.status == 200 and first.body == b"abc"
    assert c.response().status == 413 and c.closed()
    assert [r["target"] for r in web.requests] == ["/hold-echo"]
    settled(proxy)


@pytest.mark.parametrize("cap", [0, CAP], ids=["no-cap", "cap"])
@pytest.mark.parametrize(
    "size", [b"8000000000000000", b"ffffffffffffffff", b"0008000000000000000", b"8000000000000000;ext=1"]
)
def test_a_chunk_size_beyond_2_63_is_400_whatever_the_cap(start, web, cap, size):  # noqa: F811
    proxy = capped(start, web, cap)
    c = proxy.client()
    r = c.request(b"POST /sink HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\n" + size + b"\r\nabc")
    assert r.status == 400 and c.closed()
    assert proxy.counters["chunk_size_invalid"] == 1 and proxy.counters["http_400"] == 1
    assert web.requests == []  # refused before the request went upstream
    settled(proxy)


def test_the_largest_real_chunk_size_is_forwarded(start, web):  # noqa: F811
    proxy = capped(start, web, 0)
    c = proxy.client()
    c.send(b"POST /sink HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\n7fffffffffffffff\r\nabc")
    wait_until(lambda: web.requests, what="forwarded")
    assert proxy.counters["chunk_size_invalid"] == 0
    c.sock.shutdown(socket.SHUT_WR)
    c.close()
    settled(proxy)


def test_without_the_chunk_size_view_the_cap_still_holds_by_the_bytes_streamed(start, web, monkeypatch):  # noqa: F811
    import workers.l7.h1.reader as reader

    monkeypatch.setattr(reader, "chunk_size_view", lambda parser: None)  # another httptools layout
    proxy = capped(start, web)
    c = proxy.client()
    r = c.request(b"POST /read-all HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(CAP + 1))
    assert r.status == 413 and c.closed() and proxy.counters["body_too_large"] == 1
    settled(proxy)
