"""Every refusal path of the fleet, driven for real, then the counters read back (issue 16 item 12).

Policy blocks used to be counted four ways (kind names, a name -> kind map, 431 by the answered status, and a
``policy_blocked`` total that the caps never touched), so the total and the kinds disagreed and the dashboard
tile was wrong. Now ``sentin8.refusals`` decides what each refusal counts as; this test drives each kind, and
refusals that are no policy blocks (a malformed request, an open breaker, a backend's own 431), and checks the
exact counts, and that the total is the sum of the kinds in the counters, ``/stats`` and ``/metrics``.
"""

from __future__ import annotations

import socket
import threading

from sentin8.shm.counters import POLICY_KINDS
from tests import mgmt_client
from tests.netns import external_host  # noqa: F401 - fixture
from tests.peers import connection_closed, free_port, refusing_port, tls_client, wait_until
from tests.pqclient import PQClient
from tests.test_fleet_protection import _client_hello

HOSTS = ("shop", "limited", "waf", "big", "slow", "dead1", "dead2", "h431")


class Raw431Backend:
    """Answers every request with its own 431: relayed, it is the backend's answer, not a policy block."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                buf = b""
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        break
                    buf += data
                conn.sendall(b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n\r\n")

    def close(self) -> None:
        self.sock.close()


def _config(web_port: int, raw_port: int, db_port: int, dead_port: int) -> str:
    services = {"web": web_port, "db": db_port, "dead": dead_port, "raw": raw_port}
    routes = {f"{h}.apps.test": "web" for h in HOSTS[:5]}
    routes |= {"dead1.apps.test": "dead", "dead2.apps.test": "dead", "h431.apps.test": "raw", "db.internal.test": "db"}
    out = []
    for service, port in services.items():
        out.append(f'[[instances]]\nservice = "{service}"\nid = "{service}-1"\nhost = "127.0.0.1"\nport = {port}\n')
    out += [f'[[domains]]\nhostname = "{h}"\nservice = "{s}"\n' for h, s in routes.items()]
    return "".join(out)


POLICY = """
[policy]
rate_limit = true
rate_limit_rps = 0.01
rate_limit_burst = 1
rate_limit_key = "ip+host"
waf = true
waf_body_max = 1024
max_headers = 10
max_header_bytes = 4096
[breaker]
failures = 1
open_s = 300
"""


def _status(resp: bytes) -> int:
    return int(resp.split(b" ", 2)[1])


def test_every_refusal_path_counts_once_and_the_total_is_the_sum_of_the_kinds(
    external_host, fleet_factory, web, backend_factory  # noqa: F811
):
    db = backend_factory("db", "db.internal.test")
    raw = Raw431Backend()
    dead = refusing_port()  # held, never listening: the "dead" service's connect fails
    dead_port = dead.getsockname()[1]
    internal_l4 = free_port("0.0.0.0")
    fleet = fleet_factory(
        _config(web.port, raw.port, db.port, dead_port),
        workers=1,  # the in-flight cap is per worker: two requests in flight on the same one
        extra=POLICY,
        host="0.0.0.0",
        limits="max_connections_per_ip = 3\nmax_inflight_per_worker = 1\nmax_request_body_bytes = 4096",
        listen_extra=f'internal_l4 = "0.0.0.0:{internal_l4}"',
        mgmt=True,
    )

    def client(host: str) -> PQClient:
        c = PQClient(external_host.connect(fleet.port), f"{host}.apps.test")
        c.handshake()
        return c

    def one(host: str, raw_request: bytes) -> int:
        c = client(host)
        try:
            return _status(c.request(raw_request))
        finally:
            c.close()

    def get(host: str, target: bytes = b"/x", extra: bytes = b"") -> bytes:
        return b"GET %s HTTP/1.1\r\nHost: %s.apps.test\r\n%s\r\n" % (target, host.encode(), extra)

    def all_released() -> bool:
        return fleet.stats().get("open_connections", 0) == 0  # the stats line leaves zeros out

    try:
        # conn_cap, L7: three connections held, the fourth answered 503 + close
        held = [client("shop") for _ in range(3)]
        over = client("shop")
        assert _status(over.request(get("shop"))) == 503
        for c in [over, *held]:
            c.close()
        wait_until(all_released, 10, 0.05, what="the capped connections released")
        # conn_cap, L4 (loopback is internal: SNI-routed L4), the same cap for 127.0.0.1
        pipes = [tls_client(fleet.port, "db.internal.test") for _ in range(3)]
        for s in pipes:
            s.sendall(b"ping")
            assert s.recv(100) == b"db:ping"
        sock = socket.create_connection(("127.0.0.1", fleet.port), timeout=5)
        sock.sendall(_client_hello(b"db.internal.test"))
        assert connection_closed(sock)
        sock.close()
        for s in pipes:
            s.close()
        wait_until(all_released, 10, 0.05, what="the L4 connections released")
        # internal_l4_source: listen.internal_l4 from outside network.internal_cidrs, closed before a byte
        outside = external_host.connect(internal_l4)
        assert connection_closed(outside)
        outside.close()
        # rate_limit: one token per host (ip+host, burst 1), the second request 429
        limited = client("limited")
        assert [_status(limited.request(get("limited"))) for _ in range(2)] == [200, 429]
        limited.close()
        # waf: a match (403), and a body too large to inspect (413, refused before it is read)
        assert one("waf", get("waf", b"/?q=1%27%20OR%201=1--")) == 403
        body = b"x" * 2048
        big = b"POST /up HTTP/1.1\r\nHost: big.apps.test\r\nContent-Length: %d\r\n\r\n" % len(body)
        assert one("big", big + body) == 413
        # body_cap: a declared body over limits.max_request_body_bytes (413, refused before it is read)
        over_cap = b"x" * 5000
        post = b"POST /up HTTP/1.1\r\nHost: shop.apps.test\r\nContent-Length: %d\r\n\r\n" % len(over_cap)
        assert one("shop", post + over_cap) == 413
        # header_caps: more header lines than policy.max_headers (431), a target over max_header_bytes (414)
        assert one("shop", get("shop", extra=b"".join(b"X-H%d: v\r\n" % i for i in range(20)))) == 431
        assert one("shop", get("shop", b"/" + b"a" * 5000)) == 414
        # inflight_cap: one request held by the backend, a second one on the same worker gets 503 at once
        web.release_slow.clear()
        first = client("slow")
        first.sendall(get("slow", b"/slow/1"))
        assert web.slow_started.wait(10)
        assert one("slow", get("slow")) == 503
        web.release_slow.set()
        assert _status(first.request(b"")) == 200  # the held one, answered once released
        first.close()
        # not policy blocks: a malformed request (400), an open breaker (503), a backend's own 431
        assert one("shop", b"GET / HTTP/1.1\r\nHost: shop.apps.test\r\nHost: x.test\r\n\r\n") == 400
        assert one("dead1", get("dead1")) == 502  # the connect fails: the breaker (failures = 1) opens
        assert one("dead2", get("dead2")) == 503  # another host (its own bucket), the same dead service
        assert one("h431", get("h431")) == 431

        stats = fleet.stats()
        kinds = {kind: stats.get("policy_block_" + kind, 0) for kind in POLICY_KINDS}
        assert kinds == {
            "rate_limit": 1,
            "waf": 2,
            "header_caps": 2,
            "body_cap": 1,
            "conn_cap": 2,
            "inflight_cap": 1,
            "internal_l4_source": 1,
            "other": 0,
            "proxy_source": 0,
        }
        assert stats["policy_blocked"] == sum(kinds.values()) == 10
        named = (
            "policy_rate_limit", "policy_waf", "waf_body_too_large", "refused_conn_cap_l7", "refused_conn_cap_l4",
            "refused_inflight", "internal_l4_refused", "refused_breaker_open", "body_too_large", "http_431", "http_414",
            "http_400",
        )  # fmt: skip
        assert {n: stats.get(n, 0) for n in named} == dict.fromkeys(named, 1)
        # what the dashboard and Prometheus read: the same numbers, the total equal to the sum
        status, doc = mgmt_client.get_json(fleet.mgmt_url, "/stats", mgmt_client.token(fleet.secret))
        assert status == 200 and doc["policy_blocks"] == kinds and doc["fleet"]["policy_blocked"] == 10
        status, _, text = mgmt_client.call(fleet.mgmt_url, "GET", "/metrics")
        by_kind = {}
        for line in text.decode().splitlines():
            if line.startswith("sentin8_policy_blocks_total{"):
                by_kind[line.split('kind="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
            if line.startswith('sentin8_events_total{name="policy_blocked"}'):
                total = float(line.rsplit(" ", 1)[1])
        assert by_kind == {k: float(n) for k, n in kinds.items()} and total == 10.0
    finally:
        raw.close()
