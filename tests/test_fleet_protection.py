"""Edge protection through the whole fleet (issue 12): rate limit, WAF, caps, breaker; external PQ TLS clients."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from tests.crs_dirs import RULE_SETS
from tests.netns import external_host  # noqa: F401 - fixture
from tests.pqclient import PQClient
from tests.test_fleet_l7 import l7_fleet, request


def _head(resp: bytes) -> tuple[int, dict[str, str]]:
    head = resp.partition(b"\r\n\r\n")[0].split(b"\r\n")
    headers = {k.strip().lower().decode(): v.strip().decode() for k, v in (ln.split(b":", 1) for ln in head[1:])}
    return int(head[0].split()[1]), headers


def test_429_carries_retry_after_and_the_connection_stays_usable(external_host, fleet_factory, web):  # noqa: F811
    fleet = l7_fleet(
        fleet_factory, web, extra="[policy]\nrate_limit = true\nrate_limit_rps = 1\nrate_limit_burst = 2\n"
    )
    client = PQClient(external_host.connect(fleet.port), "shop.apps.test")
    client.handshake()
    get = b"GET /x HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n"
    statuses = []
    for _ in range(3):
        status, headers = _head(client.request(get))
        statuses.append(status)
    assert statuses == [200, 200, 429]
    assert headers["retry-after"] == "1" and "connection" not in headers
    assert headers["ratelimit-policy"] == '"edge";q=1;w=1' and headers["ratelimit"].startswith('"edge";r=0;t=')
    # a second connection (possibly the other worker) shares the bucket
    status, _, _ = request(external_host, fleet, "shop.apps.test", get)
    assert status == 429
    time.sleep(float(headers["retry-after"]))  # what a well-behaved client does with Retry-After
    status, _ = _head(client.request(get))
    assert status == 200  # the same TLS connection: no new handshake was needed
    client.close()
    stats = fleet.stats()
    assert stats["http_429"] == 2 and stats["policy_rate_limit"] == 2 and stats["handshake_ok"] == 2


def test_external_client_without_sni_gets_421(external_host, fleet_factory, web):  # noqa: F811
    fleet = l7_fleet(fleet_factory, web)
    status, _, _ = request(external_host, fleet, None, b"GET / HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n")
    assert status == 421
    assert web.requests == []


WAF = "[policy]\nwaf = true\n"


def _post(path: bytes, body: bytes, ctype: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: shop.apps.test\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n"
        % (path, ctype, len(body), extra)
        + body
    )


_MULTI = b"multipart/form-data; boundary=B0undary"


def _multipart(value: bytes) -> bytes:
    return b'--B0undary\r\nContent-Disposition: form-data; name="note"\r\n\r\n' + value + b"\r\n--B0undary--\r\n"


WAF_ATTACKS = {
    "form-sqli": _post(b"/login", b"var=1234 OR 1=1", b"application/x-www-form-urlencoded"),
    "form-xss": _post(
        b"/c", b"m=%3Cscript%3Ealert(document.cookie)%3C%2Fscript%3E", b"application/x-www-form-urlencoded"
    ),
    "json-sqli": _post(b"/api", b'{"id": "1 UNION SELECT password FROM users"}', b"application/json"),
    "json-xss": _post(b"/api", b'{"bio": "<script>alert(1)</script>"}', b"application/json"),
    "multipart-sqli": _post(b"/up", _multipart(b"1' OR '1'='1"), _MULTI),
    "multipart-xss": _post(b"/up", _multipart(b"<svg onload=alert(1)>"), _MULTI),
    "cookie-sqli": b"GET / HTTP/1.1\r\nHost: shop.apps.test\r\nCookie: sid=1' or '1'='1\r\n\r\n",
    "cookie-xss": b"GET / HTTP/1.1\r\nHost: shop.apps.test\r\nCookie: p=<script>alert(1)</script>\r\n\r\n",
}


@pytest.mark.parametrize("crs_dir", RULE_SETS)
def test_waf_blocks_body_and_cookie_attacks_through_the_fleet(external_host, fleet_factory, web, crs_dir):  # noqa: F811
    fleet = l7_fleet(fleet_factory, web, extra=WAF + f'waf_crs_dir = "{crs_dir}"\n')
    client = PQClient(external_host.connect(fleet.port), "shop.apps.test")
    client.handshake()
    ok = _post(b"/profile", b"name=O%27Brien&city=Dublin", b"application/x-www-form-urlencoded")
    assert _head(client.request(ok))[0] == 200  # a clean body passes (and the connection is reused)
    client.close()
    for name, raw in WAF_ATTACKS.items():
        corr = b"t-" + name.encode()
        raw = raw.replace(b"\r\n\r\n", b"\r\nX-Correlation-Id: " + corr + b"\r\n\r\n", 1)
        status, headers, body = request(external_host, fleet, "shop.apps.test", raw)
        assert status == 403, name
        assert headers["x-correlation-id"] == corr.decode() and body == b"403 Forbidden\nrequest id: %s\n" % corr
    assert [r["path"] for r in web.requests] == ["/profile"]
    stats = fleet.stats()
    assert stats["policy_waf"] == len(WAF_ATTACKS)
    assert stats["waf_rule_sqli"] >= 4 and stats["waf_rule_xss"] >= 4
    blocks = fleet.events("waf_block")
    assert len(blocks) == len(WAF_ATTACKS)
    assert all(949110 in ev["rule_ids"] and ev["service"] == "web" for ev in blocks)
    log = fleet.output()
    assert "UNION SELECT" not in log and "<script>" not in log and "1234 OR" not in log  # never the payload


# ---- caps and fail-fast -------------------------------------------------------------------------------


def test_connection_cap_per_client_address_across_both_workers(external_host, fleet_factory, web):  # noqa: F811
    fleet = l7_fleet(fleet_factory, web, limits="max_connections_per_ip = 3")
    get = b"GET /x HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n"
    held = []
    for _ in range(3):  # SO_REUSEPORT spreads them over both workers; the count is the fleet's
        c = PQClient(external_host.connect(fleet.port), "shop.apps.test")
        c.handshake()
        assert _head(c.request(get))[0] == 200
        held.append(c)
    over = PQClient(external_host.connect(fleet.port), "shop.apps.test")
    over.handshake()
    status, headers = _head(over.request(get))
    assert status == 503 and headers["connection"] == "close"
    over.close()
    held.pop().close()  # one leaves: room for one more, whichever worker gets it
    from tests.peers import wait_until

    def admitted() -> bool:
        c = PQClient(external_host.connect(fleet.port), "shop.apps.test")
        try:
            c.handshake()
            ok = _head(c.request(get))[0] == 200
        finally:
            c.close()
        return ok

    wait_until(admitted, 10, 0.1, what="a connection admitted after one closed")
    for c in held:
        c.close()
    stats = fleet.stats()
    assert stats["refused_conn_cap_l7"] >= 1 and stats["http_503"] >= 1


def test_connection_cap_closes_l4_connections_over_it(backend_factory, fleet_factory):
    from tests.peers import connection_closed, tls_client
    from tests.test_fleet_l4 import two_services

    a, b = backend_factory("a", "alpha.test"), backend_factory("b", "x.beta.test")
    fleet = fleet_factory(two_services(a, b), limits="max_connections_per_ip = 2")
    held = [tls_client(fleet.port, "alpha.test") for _ in range(2)]
    for s in held:
        s.sendall(b"ping")
        assert s.recv(65536)
    raw = socket.create_connection(("127.0.0.1", fleet.port), timeout=5)
    raw.sendall(_client_hello(b"alpha.test"))
    assert connection_closed(raw)  # over the cap: a close, nothing else
    raw.close()
    for s in held:
        s.close()
    assert fleet.stats()["refused_conn_cap_l4"] == 1


def _client_hello(sni: bytes) -> bytes:
    """A ClientHello to get past the peek (the L4 path never answers it: the cap closes first)."""
    import ssl as _ssl

    incoming, outgoing = _ssl.MemoryBIO(), _ssl.MemoryBIO()
    ctx = _ssl.SSLContext(_ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = _ssl.CERT_NONE
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=sni.decode())
    try:
        obj.do_handshake()
    except _ssl.SSLWantReadError:
        pass
    return outgoing.read()


class FlakyBackend:
    """Answers 503 while ``failing``, else 200: a backend going down and coming back."""

    def __init__(self) -> None:
        import http.server

        outer = self
        self.failing = True
        self.hits = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                outer.hits += 1
                status = 503 if outer.failing else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_breaker_opens_fails_fast_probes_and_closes_across_both_workers(external_host, fleet_factory):  # noqa: F811
    flaky = FlakyBackend()
    try:
        fleet = l7_fleet(
            fleet_factory,
            flaky,
            # open_s outlasts the 15 handshakes below on a loaded machine: no half-open probe among them
            extra="[breaker]\nfailures = 3\nopen_s = 8\nprobe_timeout_s = 1\nmin_requests = 1000\n",
        )
        get = b"GET /x HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n"

        def status_on_new_connection() -> int:  # new connections spread over both workers
            return request(external_host, fleet, "shop.apps.test", get)[0]

        statuses = [status_on_new_connection() for _ in range(10)]
        assert statuses == [503] * 10
        hits_when_open = flaky.hits
        assert 3 <= hits_when_open <= 4  # 3 failures open it fleet-wide (a racing worker may add one)
        assert fleet.saw("breaker_open")
        for _ in range(5):  # open: answered at once, the backend is spared
            assert status_on_new_connection() == 503
        assert flaky.hits == hits_when_open
        flaky.failing = False
        from tests.peers import wait_until

        wait_until(lambda: status_on_new_connection() == 200, 30, 0.2, what="the probe closes the breaker")
        assert all(status_on_new_connection() == 200 for _ in range(5))
        stats = fleet.stats()
        assert stats["breaker_opened"] >= 1 and stats["breaker_closed"] >= 1 and stats["refused_breaker_open"] >= 5
        assert fleet.saw("breaker_closed")
    finally:
        flaky.close()


@pytest.mark.parametrize(
    "big",
    [
        b"GET /" + b"/*x" * 21_800 + b" HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n",  # the 65 KB URL
        b"GET / HTTP/1.1\r\nHost: shop.apps.test\r\nX-Filler: " + b"/*x" * 21_800 + b"\r\n\r\n",  # a 64 KiB header
    ],
    ids=["65kb-url", "64kib-header"],
)
def test_quadratic_inputs_through_the_fleet_answered_fast_beside_another_client(
    external_host,  # noqa: F811
    fleet_factory,
    web,
    big,
):
    """The inputs that froze both workers for 10 s: answered within a bounded time (median well under 100 ms on
    an idle machine; the bounds leave room for a busy CI machine), while a second client is served."""
    fleet = l7_fleet(fleet_factory, web, extra=WAF + "max_header_bytes = 131072\n")
    other = PQClient(external_host.connect(fleet.port), "shop.apps.test")
    other.handshake()
    get = b"GET /fine HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n"
    assert _head(other.request(get))[0] == 200
    attacker = PQClient(external_host.connect(fleet.port), "shop.apps.test")
    attacker.handshake()
    answered, latencies = [], []
    for _ in range(8):
        start = time.monotonic()
        attacker.sendall(big)  # in flight: its inspection runs while the other client asks
        t0 = time.monotonic()
        assert _head(other.request(get))[0] == 200
        latencies.append(time.monotonic() - t0)
        status, _ = _head(attacker.request(b""))  # now read the big one's answer
        answered.append(time.monotonic() - start)
        assert status in (200, 403)
        if status == 403:  # blocked requests close the connection
            attacker.close()
            attacker = PQClient(external_host.connect(fleet.port), "shop.apps.test")
            attacker.handshake()
    attacker.close()
    other.close()
    answered.sort()
    latencies.sort()
    assert answered[len(answered) // 2] < 0.25, answered
    assert latencies[len(latencies) // 2] < 0.1, latencies


@pytest.mark.parametrize("burst", [1, 2, 5, 100])
def test_after_idle_the_fleet_admits_exactly_burst_back_to_back_across_both_workers(
    external_host, fleet_factory, web, burst  # noqa: F811
):
    """Issue 16 item 6: after idle time the bucket held ``burst`` plus 0.99 of a token, and a microsecond later
    back-to-back requests got ``burst + 1``. Requests pipelined on 12 connections (both workers) at once."""
    # one token period (1 or 4 s) is far longer than the run below, so no token matures during it
    rate = 1 if burst <= 5 else 0.25
    policy = f"[policy]\nrate_limit = true\nrate_limit_rps = {rate}\nrate_limit_burst = {burst}\n"
    fleet = l7_fleet(fleet_factory, web, extra=policy + "[log]\naccess = true\n")
    get = b"GET /x HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n"
    clients = [PQClient(external_host.connect(fleet.port), "shop.apps.test") for _ in range(12)]
    for c in clients:
        c.handshake()
    assert _head(clients[0].request(get))[0] == 200  # the bucket exists, one token short of full
    time.sleep(2.2 / rate)  # idle: the load shape under test (the old cap was reached after two periods)
    n = burst + 12
    per = [n // len(clients) + (i < n % len(clients)) for i in range(len(clients))]
    started = time.monotonic()
    for c, k in zip(clients, per, strict=True):
        c.sendall(get * k)  # pipelined: every head is there at once, answered in order
    statuses = [_head(c.request(b""))[0] for c, k in zip(clients, per, strict=True) for _ in range(k)]
    took = time.monotonic() - started
    assert took < 1 / rate, f"the run took {took:.2f} s, a whole token period: the count would not hold"
    assert statuses.count(200) == burst and statuses.count(429) == n - burst, statuses
    for c in clients:
        c.close()
    from tests.peers import wait_until

    wait_until(lambda: len(fleet.events("access")) == n + 1, 10, what="every access line written")
    run = fleet.events("access")[1:]
    assert sorted(ev["status"] for ev in run) == sorted(statuses)
    assert {ev["worker"] for ev in run} == {0, 1}, "all 12 connections landed on one worker"
    stats = fleet.stats()
    assert stats["policy_rate_limit"] == n - burst and stats["policy_block_rate_limit"] == n - burst
