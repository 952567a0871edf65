"""The HTTP edge through the real fleet (issue 16): PQ TLS from a network namespace to the L7 bridge, and plain
HTTP on :80, each case stating the exact answer. The same classes over loopback sockets, case by case, are in
tests/test_l7_edge.py; the byte-level decisions in tests/test_http_acme.py, test_http_websocket.py,
test_http_response.py, test_http_headers.py and test_http_body.py."""

from __future__ import annotations

import itertools
import json

import pytest

from tests.netns import external_host  # noqa: F401 - fixture
from tests.peers import free_port, wait_until
from tests.pqclient import PQClient
from tests.test_http_acme import NEAR_MISSES, TOKEN, TRAVERSALS
from tests.test_l7_edge import EdgeBackend, raw_path

P = b"/.well-known/acme-challenge/"
SNI = "shop.apps.test"
HOST = b"Host: shop.apps.test\r\n"
WS_KEY = b"dGhlIHNhbXBsZSBub25jZQ=="


@pytest.fixture
def web():
    b = EdgeBackend("web")
    yield b
    b.close()


@pytest.fixture
def acme_backend():
    b = EdgeBackend("acme")
    yield b
    b.close()


def edge_fleet(fleet_factory, web, acme_backend, http_port: int = 0, extra: str = "", cap: int = 1000):
    return fleet_factory(
        f"""
[[instances]]
service = "web"
id = "web-1"
host = "127.0.0.1"
port = {web.port}
[[instances]]
service = "acme"
id = "acme-1"
host = "127.0.0.1"
port = {acme_backend.port}
[[domains]]
hostname = "{SNI}"
service = "web"
env_id = "env-1"
app_id = "app-1"
""",
        workers=1,
        host="0.0.0.0",
        http=f"0.0.0.0:{http_port}" if http_port else "",
        limits=f"max_request_body_bytes = {cap}",
        extra=extra,
    )


class Reader:
    """Responses off a PQ TLS connection as they come: interim heads kept, bodies by Content-Length."""

    def __init__(self, client: PQClient) -> None:
        self.client = client
        self.buf = b""

    def _fill(self) -> bool:
        data = self.client.recv()
        self.buf += data
        return bool(data)

    def head(self) -> bytes:
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                raise ConnectionError(f"closed before a head: {self.buf[:200]!r}")
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        return head + b"\r\n\r\n"

    def response(self) -> tuple[list[bytes], int, dict[str, list[str]], bytes]:
        """(interim heads as received, final status, final headers, body)."""
        interims = []
        while True:
            head = self.head()
            status = int(head.split(b" ", 2)[1])
            if status >= 200 or status == 101:
                break
            interims.append(head)
        headers: dict[str, list[str]] = {}
        for line in head.split(b"\r\n")[1:]:
            if b":" in line:
                k, v = line.split(b":", 1)
                headers.setdefault(k.strip().lower().decode(), []).append(v.strip().decode())
        body = b""
        if "content-length" in headers and status != 101:
            n = int(headers["content-length"][0])
            while len(self.buf) < n:
                if not self._fill():
                    raise ConnectionError("closed mid-body")
            body, self.buf = self.buf[:n], self.buf[n:]
        return interims, status, headers, body

    def closed(self) -> bool:
        try:
            while self._fill():
                pass
        except OSError:
            pass
        return True


def connect(external_host, fleet, sni: str = SNI) -> tuple[PQClient, Reader]:  # noqa: F811
    client = PQClient(external_host.connect(fleet.port), sni)
    client.handshake()
    return client, Reader(client)


def one(external_host, fleet, raw: bytes, sni: str = SNI):  # noqa: F811
    """One request on its own PQ TLS connection: its response."""
    client, reader = connect(external_host, fleet, sni)
    try:
        client.sendall(raw)
        return reader.response()
    finally:
        client.close()


def plain80(external_host, port: int, raw: bytes) -> bytes:  # noqa: F811
    s = external_host.connect(port)
    s.settimeout(10)
    try:
        s.sendall(raw)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        return data
    finally:
        s.close()


# --------------------------------------------------------------------------------------------------------
# 1. The ACME bypass
# --------------------------------------------------------------------------------------------------------


def test_acme_bypass_only_for_what_a_ca_sends(external_host, fleet_factory, web, acme_backend):  # noqa: F811
    http_port = free_port("0.0.0.0")
    fleet = edge_fleet(fleet_factory, web, acme_backend, http_port)
    # What a CA sends, on :443 with a name nothing routes yet and on :80: the acme service, untouched.
    _, status, _, body = one(
        external_host, fleet, b"GET " + P + TOKEN + b" HTTP/1.1\r\nHost: new.test\r\n\r\n", "new.test"
    )
    assert status == 200 and json.loads(body)["backend"] == "acme"
    got = plain80(
        external_host, http_port, b"GET " + P + TOKEN + b" HTTP/1.1\r\nHost: new.test\r\nConnection: close\r\n\r\n"
    )
    assert got.startswith(b"HTTP/1.1 200 ") and b'"backend": "acme"' in got
    assert len(acme_backend.requests) == 2
    # Every traversal form on :443: the normal path (routed by Host to web, context injected), one connection.
    client, reader = connect(external_host, fleet)
    for name, target in TRAVERSALS.items():
        client.sendall(b"GET " + target + b" HTTP/1.1\r\n" + HOST + b"\r\n")
        _, status, _, body = reader.response()
        seen = json.loads(body)
        assert status == 200 and seen["backend"] == "web", name
        assert {k.lower(): v for k, v in seen["headers"]}["x-sentin8-env-id"] == "env-1", name
    client.close()
    # ... and on :80, every one of them and every near miss of the prefix: 404.
    for target in (*TRAVERSALS.values(), *NEAR_MISSES.values()):
        got = plain80(external_host, http_port, b"GET " + target + b" HTTP/1.1\r\n" + HOST + b"\r\n")
        assert got.startswith(b"HTTP/1.1 404 Not Found\r\n"), target
    assert len(acme_backend.requests) == 2
    stats = wait_until(lambda: (s := fleet.stats()).get("acme_not_challenge") == 2 * len(TRAVERSALS) and s, 5, 0.1)
    assert stats["acme_requests"] == 2 and stats["http_404"] == len(TRAVERSALS) + len(NEAR_MISSES)


def test_the_reported_traversal_meets_the_waf(external_host, fleet_factory, web, acme_backend):  # noqa: F811
    fleet = edge_fleet(fleet_factory, web, acme_backend, extra="[policy]\nwaf = true\n")
    sqli = b"?q=1%27%20OR%201%3D1--"
    for target in (P + b"../../admin" + sqli, P + b"%2e%2e/%2e%2e/admin" + sqli, P + TOKEN + sqli):
        _, status, _, _ = one(external_host, fleet, b"GET " + target + b" HTTP/1.1\r\n" + HOST + b"\r\n")
        assert status == 403, target
    assert acme_backend.requests == [] and web.requests == []
    _, status, _, _ = one(external_host, fleet, b"GET " + P + TOKEN + b" HTTP/1.1\r\n" + HOST + b"\r\n")
    assert status == 200 and len(acme_backend.requests) == 1  # the real challenge still skips the WAF


# --------------------------------------------------------------------------------------------------------
# 2. WebSocket
# --------------------------------------------------------------------------------------------------------


def test_websocket_only_for_a_real_handshake_and_a_real_101(external_host, fleet_factory, web, acme_backend):  # noqa: F811
    fleet = edge_fleet(fleet_factory, web, acme_backend)
    key = b"Sec-WebSocket-Key: " + WS_KEY + b"\r\n"
    cases = 0
    for version, up, conn in itertools.product(
        (b"1.0", b"1.1"), (b"websocket", b"notwebsocket", b"h2c", b"websocket/13"), (b"Upgrade", b"keep-alive")
    ):
        raw = b"GET /ws-if HTTP/" + version + b"\r\n" + HOST + b"Upgrade: " + up + b"\r\nConnection: " + conn
        client, reader = connect(external_host, fleet)
        client.sendall(raw + b"\r\n" + key + b"\r\n")
        _, status, headers, body = reader.response()
        case = (version, up, conn)
        if version == b"1.1" and up == b"websocket" and conn == b"Upgrade":
            assert status == 101 and headers["upgrade"] == ["websocket"], case
            client.sendall(b"frame")
            while len(reader.buf) < 10:
                assert reader._fill(), case
            assert reader.buf == b"echo:frame", case
        else:  # notwebsocket, an HTTP/1.0 upgrade, h2c...: a plain request, its Upgrade never forwarded
            assert status == 200, case
            assert not {k.lower() for k, _ in json.loads(body)["headers"]} & {"upgrade", "connection"}, case
        client.close()
        cases += 1
    assert cases == 16
    # A backend 101 with the right Sec-WebSocket-Accept but Upgrade: h2c: 502, and no tunnel.
    lines = b"Upgrade: h2c\r\nConnection: Upgrade\r\n"
    raw = b"GET /ws-101/" + lines.hex().encode() + b" HTTP/1.1\r\n" + HOST + b"Upgrade: websocket\r\n"
    client, reader = connect(external_host, fleet)
    client.sendall(raw + b"Connection: Upgrade\r\n" + key + b"\r\n")
    _, status, _, _ = reader.response()
    assert status == 502 and reader.closed() and b"hello-from-the-tunnel" not in reader.buf
    client.close()
    stats = fleet.stats()
    assert stats["websocket_bad_upgrade"] == 1 and stats["websocket_upgrades"] == 1
    assert stats["upgrade_ignored"] == 7  # the parser saw Connection: upgrade 8 times; one was the tunnel


# --------------------------------------------------------------------------------------------------------
# 3. Interim and odd responses
# --------------------------------------------------------------------------------------------------------


def test_interim_and_odd_responses(external_host, fleet_factory, web, acme_backend):  # noqa: F811
    fleet = edge_fleet(fleet_factory, web, acme_backend)
    # 1,000 x 103: exactly 8 reach the client, then 502.
    interims, status, _, _ = one(external_host, fleet, b"GET /interim/1000/0 HTTP/1.1\r\n" + HOST + b"\r\n")
    assert len(interims) == 8 and all(h.startswith(b"HTTP/1.1 103 Early Hints\r\n") for h in interims)
    assert status == 502
    # 8 are fine: the response follows them.
    interims, status, _, body = one(external_host, fleet, b"GET /interim/8/0 HTTP/1.1\r\n" + HOST + b"\r\n")
    assert len(interims) == 8 and status == 200 and body == b"ok"
    # A 100 with Content-Length, a 103 with Transfer-Encoding and X-Sentin8-*: relayed without them.
    raw = (
        b"HTTP/1.1 100 Continue\r\nContent-Length: 5\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nTransfer-Encoding: chunked\r\nX-Sentin8-Env-Id: leak\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nX-Sentin8-Tenant-Id: leak\r\nx_sentin8_user_id: leak\r\nContent-Length: 2\r\n\r\nok"
    )
    interims, status, headers, body = one(
        external_host, fleet, b"GET " + raw_path(raw).encode() + b" HTTP/1.1\r\n" + HOST + b"\r\n"
    )
    assert interims == [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"]
    assert status == 200 and body == b"ok" and "leak" not in str(headers)
    # Status lines that are not HTTP/1.x with a 1xx-5xx code: 502, never relayed as HTTP/1.1.
    for line in (
        b"HTTP/2.0 200 OK",
        b"HTTP/1.1 999 Nine",
        b"HTTP/1.1 099 Low",
        b"HTTP/1.1 600 Six",
        b"RTSP/1.0 200 OK",
    ):
        target = raw_path(line + b"\r\nContent-Length: 2\r\n\r\nok").encode()
        _, status, _, body = one(external_host, fleet, b"GET " + target + b" HTTP/1.1\r\n" + HOST + b"\r\n")
        assert status == 502 and body == b"502 Bad Gateway\n", line
    stats = fleet.stats()
    assert stats["upstream_interim_refused"] == 1 and stats["upstream_bad_status"] == 5


# --------------------------------------------------------------------------------------------------------
# 4 and 5. Expect on HTTP/1.0; request bodies
# --------------------------------------------------------------------------------------------------------


def test_expect_on_http10_and_request_body_bounds(external_host, fleet_factory, web, acme_backend):  # noqa: F811
    fleet = edge_fleet(fleet_factory, web, acme_backend, cap=1000)
    # Expect: 100-continue on HTTP/1.0 is ignored (no 100) and not forwarded.
    raw = b"POST /continue HTTP/1.0\r\n" + HOST + b"Expect: 100-continue\r\nContent-Length: 4\r\n\r\nbody"
    interims, status, _, body = one(external_host, fleet, raw)
    assert interims == [] and status == 200 and body == b"body"
    assert "expect" not in {k.lower() for k, _ in web.requests[-1]["headers"]}
    # A declared length at the cap passes, one byte over is 413 before the body is sent.
    _, status, _, body = one(
        external_host, fleet, b"POST /echo HTTP/1.1\r\n" + HOST + b"Content-Length: 1000\r\n\r\n" + b"x" * 1000
    )
    assert status == 200 and body == b"x" * 1000
    _, status, headers, _ = one(
        external_host, fleet, b"POST /echo HTTP/1.1\r\n" + HOST + b"Content-Length: 1001\r\n\r\n"
    )
    assert status == 413 and headers["connection"] == ["close"]
    # A chunked body passing the cap: 413 (the backend answers only once it has read the whole body).
    chunks = b"258\r\n" + b"x" * 600 + b"\r\n191\r\n" + b"y" * 401 + b"\r\n0\r\n\r\n"
    _, status, _, _ = one(
        external_host, fleet, b"POST /read-all HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\n" + chunks
    )
    assert status == 413
    # A chunk size beyond 2^63 - 1: 400, cap or not.
    _, status, _, _ = one(
        external_host,
        fleet,
        b"POST /sink HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\n8000000000000000\r\nabc",
    )
    assert status == 400
    stats = fleet.stats()
    assert stats["body_too_large"] == 2 and stats["http_413"] == 2 and stats["chunk_size_invalid"] == 1
