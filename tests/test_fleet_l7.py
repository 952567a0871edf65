"""External clients through the whole fleet: PQ TLS at the edge, the L7 bridge, header hygiene.

Clients live in a network namespace with a non-private address, so the proxy classifies them as external.
"""

from __future__ import annotations

import json

import pytest

from tests.netns import external_host  # noqa: F401 - fixture
from tests.peers import HTTPBackend
from tests.pqclient import PQClient

RESERVED = [
    "Env-Id",
    "App-Id",
    "Service",
    "Hostname",
    "Correlation-Id",
    "Caller-Service",
    "Org-Id",
    "Tenant-Id",
    "User-Id",
    "Scopes",
    "Client-Cert",
]


def l7_fleet(fleet_factory, backend, **kw):
    return fleet_factory(
        f"""
[[instances]]
service = "web"
id = "web-1"
host = "127.0.0.1"
port = {backend.port}
[[domains]]
hostname = "shop.apps.test"
service = "web"
env_id = "env-1"
app_id = "app-1"
""",
        host="0.0.0.0",
        **kw,
    )


def request(host, fleet, sni: str, raw: bytes, **kw) -> tuple[int, dict, bytes]:
    client = PQClient(host.connect(fleet.port), sni, **kw)
    try:
        client.handshake()
        resp = client.request(raw)
    finally:
        client.close()
    head, _, body = resp.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers = {k.strip().lower().decode(): v.strip().decode() for k, v in (ln.split(b":", 1) for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def test_pq_handshake_and_a_request_reach_the_backend(external_host, fleet_factory, web):  # noqa: F811
    fleet = l7_fleet(fleet_factory, web)
    client = PQClient(external_host.connect(fleet.port), "shop.apps.test")
    client.handshake()
    assert client.group_name == "X25519MLKEM768"
    assert client.peer_cert.signature_algorithm_oid.dotted_string == "2.16.840.1.101.3.4.3.18"  # ML-DSA-65
    resp = client.request(b"GET /hello HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n")
    client.close()
    assert resp.startswith(b"HTTP/1.1 200")
    seen = json.loads(resp.partition(b"\r\n\r\n")[2])
    assert seen["path"] == "/hello"


def test_classical_client_is_refused_and_counted(external_host, fleet_factory, web):  # noqa: F811
    fleet = l7_fleet(fleet_factory, web)
    client = PQClient(external_host.connect(fleet.port), "shop.apps.test", classical=True)
    with pytest.raises(Exception):  # noqa: B017 - any TLS failure is the point
        client.handshake()
    client.close()
    from tests.peers import wait_until

    wait_until(lambda: fleet.stats().get("handshake_errors", 0) >= 1, 5, 0.1, what="handshake error counted")
    assert web.requests == []


def test_spoofed_headers_never_reach_the_backend(external_host, fleet_factory, web):  # noqa: F811
    fleet = l7_fleet(fleet_factory, web)
    spoof = b""
    for i, name in enumerate(RESERVED):
        variants = [f"X-Sentin8-{name}", f"x-sentin8-{name.lower()}", f"X-SENTIN8-{name.upper()}"]
        for v in variants:
            spoof += f"{v}: evil-{i}\r\n".encode()
    spoof += b"X-Sentin8-Unknown-Thing: evil\r\nX-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Host: evil\r\n"
    lines = spoof.split(b"\r\n")
    half = b"\r\n".join(lines[: len(lines) // 2]) + b"\r\n"
    rest = b"\r\n".join(lines[len(lines) // 2 :])
    raw = b"GET / HTTP/1.1\r\n" + half + b"Host: shop.apps.test\r\n" + rest
    raw += b"X-Correlation-Id: abc-123\r\n\r\n"
    status, _, body = request(external_host, fleet, "shop.apps.test", raw)
    assert status == 200
    headers = json.loads(body)["headers"]
    assert not any("evil" in v for _, v in headers), headers
    got = {k.lower(): v for k, v in headers}
    assert sum(1 for k, _ in headers if k.lower().startswith("x-sentin8-")) == 6
    assert got["x-sentin8-env-id"] == "env-1"
    assert got["x-sentin8-app-id"] == "app-1"
    assert got["x-sentin8-service"] == "web"
    assert got["x-sentin8-hostname"] == "shop.apps.test"
    assert got["x-sentin8-correlation-id"] == "abc-123"
    assert got["x-sentin8-caller-service"] == "external"
    assert got["x-forwarded-for"] == external_host.client_ip
    assert got["x-forwarded-proto"] == "https"
    assert got["x-forwarded-host"] == "shop.apps.test"


def test_unknown_host_and_sni_mismatch_get_421(external_host, fleet_factory, web):  # noqa: F811
    fleet = l7_fleet(fleet_factory, web)
    # unknown name: the handshake completes with the bootstrap certificate, then 421
    status, _, _ = request(external_host, fleet, "nope.test", b"GET / HTTP/1.1\r\nHost: nope.test\r\n\r\n")
    assert status == 421
    status, _, _ = request(external_host, fleet, "shop.apps.test", b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
    assert status == 421
    assert web.requests == []


def test_too_many_headers_get_431(external_host, fleet_factory, web):  # noqa: F811
    fleet = l7_fleet(fleet_factory, web)
    raw = b"GET / HTTP/1.1\r\nHost: shop.apps.test\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(100)) + b"\r\n"
    status, _, _ = request(external_host, fleet, "shop.apps.test", raw)
    assert status == 431  # 101 header lines, Host included
    assert web.requests == []


def test_acme_on_port_80_and_404_for_the_rest(external_host, fleet_factory, web):  # noqa: F811
    import socket as _s

    from tests.peers import free_port

    http_port = free_port("0.0.0.0")
    fleet = fleet_factory(
        f"""
[[instances]]
service = "acme"
id = "acme-1"
host = "127.0.0.1"
port = {web.port}
""",
        host="0.0.0.0",
        http=f"0.0.0.0:{http_port}",
    )

    def get(path: bytes) -> bytes:
        s = external_host.connect(http_port)
        s.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: whatever.test\r\nX-Sentin8-Service: evil\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data or len(data) < 12:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.shutdown(_s.SHUT_WR)
        s.close()
        return data

    assert get(b"/.well-known/acme-challenge/tok").startswith(b"HTTP/1.1 200")
    assert get(b"/index.html").startswith(b"HTTP/1.1 404")
    seen = web.requests[-1]
    assert seen["path"] == "/.well-known/acme-challenge/tok"
    assert not any(k.lower().startswith("x-sentin8-") for k, _ in seen["headers"])  # no injection, no spoof
    assert fleet.port


def _worker_rss(fleet) -> int:
    import psutil

    return max(psutil.Process(pid).memory_info().rss for pid in fleet.workers())


def test_ten_megabyte_bodies_both_ways_with_bounded_worker_memory(external_host, fleet_factory, web):  # noqa: F811
    import hashlib

    from tests.peers import pattern

    fleet = l7_fleet(fleet_factory, web, workers=1)
    client = PQClient(external_host.connect(fleet.port), "shop.apps.test")
    client.handshake()
    # warm the worker first so the baseline includes its steady state
    client.request(b"GET /warm HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n")
    before = _worker_rss(fleet)
    n = 10 * 1024 * 1024
    body = b"".join(pattern(off, 65536) for off in range(0, n, 65536))
    client.sendall(b"POST /up HTTP/1.1\r\nHost: shop.apps.test\r\nContent-Length: %d\r\n\r\n" % n)
    resp = client.request(body)
    seen = json.loads(resp.partition(b"\r\n\r\n")[2])
    assert seen["body_len"] == n and seen["body_sha256"] == hashlib.sha256(body).hexdigest()
    resp = client.request(b"GET /big/%d HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n" % n)
    got = resp.partition(b"\r\n\r\n")[2]
    assert len(got) == n and got == body
    client.close()
    grown = _worker_rss(fleet) - before
    assert grown < 8 * 1024 * 1024, f"worker grew {grown >> 20} MiB moving 20 MiB"


def test_keep_alive_reuses_pooled_upstream_connections(external_host, fleet_factory, web):  # noqa: F811
    fleet = l7_fleet(fleet_factory, web, workers=1)
    client = PQClient(external_host.connect(fleet.port), "shop.apps.test")
    client.handshake()
    for i in range(5):
        resp = client.request(b"GET /%d HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n" % i)
        assert resp.startswith(b"HTTP/1.1 200")
    client.close()
    from tests.peers import wait_until

    stats = wait_until(lambda: (st := fleet.stats()).get("requests") == 5 and st, 5, 0.1, what="counted")
    assert stats["upstream_cold"] == 1
    assert stats["upstream_warm"] == 4
    assert stats["requests"] == 5


def test_websocket_echo_through_the_proxy(external_host, fleet_factory, web):  # noqa: F811
    fleet = l7_fleet(fleet_factory, web)
    client = PQClient(external_host.connect(fleet.port), "shop.apps.test")
    client.handshake()
    head = client.request(
        b"GET /ws HTTP/1.1\r\nHost: shop.apps.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    assert head.startswith(b"HTTP/1.1 101")
    for i in range(20):
        frame = b"\x81\x05" + b"hi-%02d" % i
        client.sendall(frame)
        got = b""
        while len(got) < len(frame):
            got += client.recv(65536)
        assert got == frame
    client.close()


def test_backend_killed_mid_response_closes_the_client_not_hangs(external_host, fleet_factory, web):  # noqa: F811
    fleet = l7_fleet(fleet_factory, web)
    client = PQClient(external_host.connect(fleet.port), "shop.apps.test", timeout=10)
    client.handshake()
    client.sendall(b"GET /die HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n")
    got = b""
    while True:
        try:
            chunk = client.recv(65536)
        except Exception:
            break
        if not chunk:
            break
        got += chunk
    assert got.startswith(b"HTTP/1.1 200")
    assert len(got.partition(b"\r\n\r\n")[2]) < 1_000_000  # truncated, and the connection ended
    # the proxy is fine afterwards
    status, _, _ = request(external_host, fleet, "shop.apps.test", b"GET / HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n")
    assert status == 200


def test_certificate_hot_swap_from_bootstrap_to_store(external_host, fleet_factory, web, tmp_path):  # noqa: F811
    import time

    from cryptography.hazmat.primitives.asymmetric import mldsa

    from sentin8.certpair import self_signed_mldsa65, write_pair

    fleet = l7_fleet(fleet_factory, web)

    def leaf():
        c = PQClient(external_host.connect(fleet.port), "shop.apps.test")
        c.handshake()
        cert = c.peer_cert
        c.close()
        return cert

    first = leaf()
    assert "localhost" in str(first.subject) or first.issuer == first.subject  # the bootstrap leaf
    now = time.time()
    cert, key = self_signed_mldsa65(["shop.apps.test"], now - 60, now + 30 * 86400)
    assert isinstance(key, mldsa.MLDSA65PrivateKey)
    write_pair(tmp_path / "certs" / "shop.apps.test", [cert], key)
    from tests.peers import wait_until

    wait_until(lambda: leaf() == cert, 10, 0.2, what="store cert served without a restart")
    assert first != cert


def test_slowloris_is_closed_at_the_header_deadline(external_host, fleet_factory, web):  # noqa: F811
    import time

    fleet = l7_fleet(fleet_factory, web, limits="header_timeout_s = 1")
    client = PQClient(external_host.connect(fleet.port), "shop.apps.test", timeout=10)
    client.handshake()
    started = time.monotonic()
    client.sendall(b"GET / HTTP/1.1\r\nHost: shop.apps.test\r\nX-Slow: ")
    while True:  # a 408 or a bare close both end it
        try:
            if not client.recv(65536):
                break
        except Exception:
            break
    assert time.monotonic() - started < 5
    from tests.peers import wait_until

    wait_until(lambda: fleet.stats().get("slowloris_closed", 0) >= 1, 5, 0.1, what="slowloris counted")


def test_smuggling_shapes_are_rejected_not_forwarded(external_host, fleet_factory, web):  # noqa: F811
    fleet = l7_fleet(fleet_factory, web)
    shapes = [
        b"POST / HTTP/1.1\r\nHost: shop.apps.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: shop.apps.test\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcde",
        b"GET / HTTP/1.1\r\nHost: shop.apps.test\r\nX-A: 1\r\n folded\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: shop.apps.test\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    ]
    for raw in shapes:
        status, _, _ = request(external_host, fleet, "shop.apps.test", raw)
        assert status == 400, raw
    assert web.requests == []


def test_sigterm_drains_an_in_flight_l7_request_and_the_gauge_shows_it(external_host, fleet_factory, web):  # noqa: F811
    import signal

    from tests.peers import wait_until

    fleet = l7_fleet(fleet_factory, web)
    client = PQClient(external_host.connect(fleet.port), "shop.apps.test", timeout=20)
    client.handshake()
    client.sendall(b"GET /slow/1 HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n")
    assert web.slow_started.wait(10)
    wait_until(lambda: fleet.stats().get("active_connections") == 1, 5, 0.05, what="in-flight gauge = 1")
    fleet.signal(signal.SIGTERM)
    # the supervisor's "drain" event comes before its SIGTERM reaches the workers: wait for theirs (the title)
    wait_until(lambda: (w := fleet.workers()) and all("[draining]" in t for t in w.values()), 5, 0.02,
               what="every worker draining")
    web.release_slow.set()
    resp = client.request(b"")
    assert resp.startswith(b"HTTP/1.1 200")
    assert b"connection: close" in resp.lower()  # a draining worker ends keep-alive after the response
    client.close()
    assert fleet.proc.wait(15) == 0


def test_bridge_mode_forwards_over_tls_with_a_client_certificate(external_host, fleet_factory, tmp_path):  # noqa: F811
    from supervisor.demo import write_demo_cert

    (tmp_path / "srv").mkdir()
    (tmp_path / "cli").mkdir()
    server_pair = write_demo_cert(str(tmp_path / "srv"), "backend.internal")
    client_cert, client_key = write_demo_cert(str(tmp_path / "cli"), "sentin8-proxy")
    secure = HTTPBackend("secure", tls=server_pair, client_ca=client_cert)
    try:
        fleet = fleet_factory(
            f"""
[upstream]
client_cert = "{client_cert}"
client_key = "{client_key}"
[[instances]]
service = "web"
id = "web-tls"
host = "127.0.0.1"
port = {secure.port}
tls = true
[[domains]]
hostname = "shop.apps.test"
service = "web"
""",
            host="0.0.0.0",
        )
        for i in range(3):  # the second and third reuse the pooled TLS connection
            status, _, body = request(
                external_host, fleet, "shop.apps.test", b"GET /b%d HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n" % i
            )
            assert status == 200
            seen = json.loads(body)
            assert seen["backend"] == "secure" and seen["client_cert"] is True
    finally:
        secure.close()


def test_acme_on_443_bypasses_host_lookup_and_injection(external_host, fleet_factory, web):  # noqa: F811
    fleet = fleet_factory(
        f"""
[[instances]]
service = "acme"
id = "acme-1"
host = "127.0.0.1"
port = {web.port}
""",
        host="0.0.0.0",
    )
    raw = (
        b"GET /.well-known/acme-challenge/xyz HTTP/1.1\r\nHost: not-yet-registered.test\r\n"
        b"X-Sentin8-Env-Id: evil\r\n\r\n"
    )
    status, _, body = request(external_host, fleet, "not-yet-registered.test", raw)
    assert status == 200
    seen = json.loads(body)
    assert seen["path"] == "/.well-known/acme-challenge/xyz"
    assert not any(k.lower().startswith("x-sentin8-") for k, _ in seen["headers"])


def test_a_backend_that_never_answers_gets_504_at_the_response_timeout(external_host, fleet_factory, web):  # noqa: F811
    import time

    fleet = l7_fleet(fleet_factory, web, extra="[upstream]\nresponse_timeout_s = 1\n")
    started = time.monotonic()
    status, _, _ = request(
        external_host, fleet, "shop.apps.test", b"GET /slow/x HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n"
    )
    assert status == 504
    assert 0.9 < time.monotonic() - started < 5
    web.release_slow.set()
    status, _, _ = request(external_host, fleet, "shop.apps.test", b"GET / HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n")
    assert status == 200  # the timed-out connection was not pooled: no late answer leaks into this one


def test_garbage_and_abrupt_peers_never_crash_a_worker_or_leak_a_connection(external_host, fleet_factory, web):  # noqa: F811
    import random
    import socket as _socket

    from tests.hellos import pq_hello
    from tests.peers import wait_until

    fleet = l7_fleet(fleet_factory, web, limits="handshake_timeout_s = 2\nheader_timeout_s = 2")
    workers = set(fleet.workers())
    rnd = random.Random(1234)
    hello = pq_hello("shop.apps.test")
    for i in range(120):
        s = external_host.socket()
        s.settimeout(5)
        s.connect((external_host.gateway_ip, fleet.port))
        kind = i % 4
        if kind == 0:  # random bytes
            s.sendall(rnd.randbytes(rnd.randrange(1, 4000)))
        elif kind == 1:  # a hello cut short, then gone
            s.sendall(hello[: rnd.randrange(1, len(hello))])
        elif kind == 2:  # a whole hello, then garbage where the handshake should continue
            s.sendall(hello + rnd.randbytes(rnd.randrange(1, 2000)))
        else:  # a real handshake, then a broken request, then a reset
            c = PQClient(s, "shop.apps.test")
            c.handshake()
            c.sendall(b"GET /" + rnd.randbytes(50) + b"\r\n\r\n")
        if rnd.random() < 0.5:  # half of them vanish with a reset
            s.setsockopt(_socket.SOL_SOCKET, _socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
    status, _, _ = request(external_host, fleet, "shop.apps.test", b"GET / HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n")
    assert status == 200
    assert set(fleet.workers()) == workers, "a worker died"
    wait_until(lambda: fleet.stats().get("open_connections", 0) == 0, 10, 0.2, what="every connection released")
    assert fleet.stats().get("active_connections", 0) == 0
    assert "Traceback" not in fleet.output()
