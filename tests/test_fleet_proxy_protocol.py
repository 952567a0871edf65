"""PROXY protocol v2 through a real fleet, both ways, from a network-namespace host (198.18.0.0/15).

Out: an L4 backend whose instance says ``proxy_protocol = "v2"`` receives, before any client byte, a header with
the client's address (the namespace's) and the address it connected to. In: the namespace host is a balancer
listed in ``listen.proxy_protocol_from``; the address its header names (spoofed on purpose) is what
classification, the rate limit, the per-client cap and X-Forwarded-For use; an untrusted PROXY header, a
trusted connection without one, a malformed and a slow one are closed and counted. The headers the tests send
and read are packed by hand here, not by ``sentin8.proxy_protocol``, so a mistake shared by both would show.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import tempfile
import threading
import time

import pytest

from supervisor.demo import write_demo_cert
from tests.netns import external_host  # noqa: F401 - fixture
from tests.peers import connection_closed, free_port, tls_client, wait_until
from tests.pqclient import PQClient
from tests.test_fleet_protection import _client_hello

pytestmark = pytest.mark.netns

SIG = b"\r\n\r\n\x00\r\nQUIT\n"


def v2(src: str, sport: int, dst: str, dport: int) -> bytes:
    """A PROXY v2 header for TCP over IPv4, packed from the spec's layout."""
    block = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!HH", sport, dport)
    return SIG + b"\x21\x11" + struct.pack("!H", len(block)) + block


LOCAL = SIG + b"\x20\x00\x00\x00"


class ProxyV2Backend:
    """An L4 backend that expects a PROXY v2 header (like nginx's ``listen ... proxy_protocol``): reads it,
    records (source, destination), then terminates its own TLS and answers ``<src>:<sport>`` to every chunk."""

    def __init__(self, workdir: str, hostname: str) -> None:
        cert, key = write_demo_cert(tempfile.mkdtemp(dir=workdir), hostname)
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.seen: list[tuple[tuple[str, int], tuple[str, int]]] = []
        self.first_bytes: list[bytes] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _exactly(self, conn: socket.socket, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            got = conn.recv(n - len(buf))
            if not got:
                raise ConnectionError("closed mid-header")
            buf += got
        return buf

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(10)
            fixed = self._exactly(conn, 16)
            self.first_bytes.append(fixed)
            assert fixed[:12] == SIG and fixed[12] == 0x21 and fixed[13] == 0x11, fixed
            block = self._exactly(conn, struct.unpack("!H", fixed[14:16])[0])
            src, dst = socket.inet_ntoa(block[0:4]), socket.inet_ntoa(block[4:8])
            sport, dport = struct.unpack("!HH", block[8:12])
            self.seen.append(((src, sport), (dst, dport)))
            with self.ctx.wrap_socket(conn, server_side=True) as tls:
                while data := tls.recv(65536):
                    tls.sendall(f"{src}:{sport}:".encode() + data)
        except (OSError, ssl.SSLError, AssertionError, ConnectionError):
            conn.close()

    def close(self) -> None:
        self.sock.close()


def test_an_l4_backend_receives_the_namespace_clients_address(external_host, fleet_factory, backend_factory, tmp_path):  # noqa: F811
    pp_backend = ProxyV2Backend(str(tmp_path), "pp.internal.test")
    plain = backend_factory("plain", "plain.internal.test")
    fleet = fleet_factory(
        f"""
[network]
internal_cidrs = ["127.0.0.0/8", "{external_host.client_ip}/32"]
[[instances]]
service = "pp"
id = "pp-1"
host = "127.0.0.1"
port = {pp_backend.port}
proxy_protocol = "v2"
[[instances]]
service = "plain"
id = "plain-1"
host = "127.0.0.1"
port = {plain.port}
[[domains]]
hostname = "pp.internal.test"
service = "pp"
[[domains]]
hostname = "plain.internal.test"
service = "plain"
""",
        host="0.0.0.0",
    )
    try:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        raw = external_host.connect(fleet.port)
        client_port = raw.getsockname()[1]
        with ctx.wrap_socket(raw, server_hostname="pp.internal.test") as s:
            s.sendall(b"ping")
            answer = s.recv(100)
        # the backend's own TLS (never terminated by the proxy) carried its view of the header
        assert answer == f"{external_host.client_ip}:{client_port}:ping".encode()
        assert pp_backend.seen == [((external_host.client_ip, client_port), (external_host.gateway_ip, fleet.port))]
        # an instance without proxy_protocol gets the client's bytes only, as before
        raw = external_host.connect(fleet.port)
        with ctx.wrap_socket(raw, server_hostname="plain.internal.test") as s:
            s.sendall(b"ping")
            assert s.recv(100) == b"plain:ping"
        stats = fleet.stats()
        assert stats.get("proxy_header_sent") == 1 and stats.get("connections_l4") == 2
    finally:
        pp_backend.close()


def _trusted_fleet(fleet_factory, balancer, web, db, pp_backend, internal_l4: int):
    return fleet_factory(
        f"""
[network]
internal_cidrs = ["127.0.0.0/8", "10.0.0.0/8"]
[policy]
rate_limit = true
rate_limit_rps = 0.01
rate_limit_burst = 1
rate_limit_key = "ip"
[[instances]]
service = "web"
id = "web-1"
host = "127.0.0.1"
port = {web.port}
[[instances]]
service = "db"
id = "db-1"
host = "127.0.0.1"
port = {db.port}
[[instances]]
service = "pp"
id = "pp-1"
host = "127.0.0.1"
port = {pp_backend.port}
proxy_protocol = "v2"
[[domains]]
hostname = "shop.apps.test"
service = "web"
[[domains]]
hostname = "other.apps.test"
service = "web"
[[domains]]
hostname = "db.internal.test"
service = "db"
[[domains]]
hostname = "pp.internal.test"
service = "pp"
""",
        host="0.0.0.0",
        listen_extra=(f'proxy_protocol_from = ["{balancer.client_ip}/32"]\ninternal_l4 = "0.0.0.0:{internal_l4}"'),
        limits="max_connections_per_ip = 2",
    )


def _get(host: str) -> bytes:
    return b"GET /x HTTP/1.1\r\nHost: %s\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n" % host.encode()


def _status_and_body(resp: bytes) -> tuple[int, bytes]:
    head, _, body = resp.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def _xff(body: bytes) -> list[str]:
    return [v for k, v in json.loads(body)["headers"] if k.lower() == "x-forwarded-for"]


def test_a_trusted_balancer_names_the_client_for_every_decision(
    external_host,  # noqa: F811
    fleet_factory,
    web,
    backend_factory,
    tmp_path,
):
    db = backend_factory("db", "db.internal.test")
    pp_backend = ProxyV2Backend(str(tmp_path), "pp.internal.test")
    internal_l4 = free_port("0.0.0.0")
    fleet = _trusted_fleet(fleet_factory, external_host, web, db, pp_backend, internal_l4)
    lb = external_host.client_ip
    dst = (external_host.gateway_ip, fleet.port)

    def via_balancer(client: str, sni: str = "shop.apps.test", port: int | None = None) -> PQClient:
        sock = external_host.connect(port or fleet.port)
        sock.sendall(v2(client, 40001, *dst))
        c = PQClient(sock, sni)
        c.handshake()
        return c

    def one(client: str, host: str = "shop.apps.test") -> tuple[int, bytes]:
        c = via_balancer(client, host)
        try:
            return _status_and_body(c.request(_get(host)))
        finally:
            c.close()

    try:
        # X-Forwarded-For is the header's client (the spoofed one), replacing the client's own value
        status, body = one("203.0.113.7")
        assert status == 200 and _xff(body) == ["203.0.113.7"]
        # the rate limit is keyed on it: a second request as .7 is limited, .8 is another client
        assert one("203.0.113.7")[0] == 429
        status, body = one("203.0.113.8")
        assert status == 200 and _xff(body) == ["203.0.113.8"]
        # the per-client connection cap too: two held as .9, the third as .9 is over it, .10 is not
        held = [via_balancer("203.0.113.9", "other.apps.test") for _ in range(2)]
        over = via_balancer("203.0.113.9", "other.apps.test")
        assert _status_and_body(over.request(_get("other.apps.test")))[0] == 503
        for c in [over, *held]:
            c.close()
        assert one("203.0.113.10", "other.apps.test")[0] == 200
        # classification: a header naming an internal client makes the connection internal (SNI-routed L4: the
        # backend's own certificate, never decrypted), from the same external balancer address
        sock = external_host.connect(fleet.port)
        sock.sendall(v2("10.20.30.40", 5000, *dst))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        with ctx.wrap_socket(sock, server_hostname="db.internal.test") as s:
            assert s.getpeercert(binary_form=True) == db.cert_der
            s.sendall(b"ping")
            assert s.recv(100) == b"db:ping"
        # ... and an L4 backend speaking PROXY v2 is told the header's client and destination, not the balancer
        sock = external_host.connect(fleet.port)
        sock.sendall(v2("10.20.30.41", 5001, "192.0.2.80", 443))
        with ctx.wrap_socket(sock, server_hostname="pp.internal.test") as s:
            s.sendall(b"ping")
            assert s.recv(100) == b"10.20.30.41:5001:ping"
        assert pp_backend.seen == [(("10.20.30.41", 5001), ("192.0.2.80", 443))]
        # listen.internal_l4 requires the header too, and judges the source it names
        sock = external_host.connect(internal_l4)
        sock.sendall(v2("10.20.30.42", 5002, external_host.gateway_ip, internal_l4))
        with ctx.wrap_socket(sock, server_hostname="db.internal.test") as s:
            s.sendall(b"ping")
            assert s.recv(100) == b"db:ping"
        sock = external_host.connect(internal_l4)
        sock.sendall(v2("203.0.113.11", 5003, external_host.gateway_ip, internal_l4))  # external: not admitted
        assert connection_closed(sock)
        sock.close()
        # LOCAL (the balancer's health check): served as from the balancer itself (external here: L7, XFF = it)
        sock = external_host.connect(fleet.port)
        sock.sendall(LOCAL)
        c = PQClient(sock, "other.apps.test")
        c.handshake()
        status, body = _status_and_body(c.request(_get("other.apps.test")))
        c.close()
        assert status == 200 and _xff(body) == [lb]
        stats = fleet.stats()
        assert stats.get("proxy_header_ok") == 11 and stats.get("proxy_header_local") == 1
        assert stats.get("policy_rate_limit") == 1 and stats.get("refused_conn_cap_l7") == 1
        assert stats.get("internal_l4_refused") == 1 and stats.get("proxy_header_sent") == 1
        assert stats.get("traffic_internal_connections") == 3  # the three named 10.x clients that were served
    finally:
        pp_backend.close()


def test_refused_headers_are_closed_and_counted(external_host, fleet_factory, web, backend_factory, tmp_path):  # noqa: F811
    db = backend_factory("db", "db.internal.test")
    pp_backend = ProxyV2Backend(str(tmp_path), "pp.internal.test")
    internal_l4 = free_port("0.0.0.0")
    fleet = _trusted_fleet(fleet_factory, external_host, web, db, pp_backend, internal_l4)
    dst = (external_host.gateway_ip, fleet.port)
    hello = _client_hello(b"db.internal.test")
    try:
        # untrusted sources (loopback is not in proxy_protocol_from): a v2 header, a v1 header, refused
        for data in (v2("10.9.9.9", 1, "127.0.0.1", fleet.port), b"PROXY TCP4 10.9.9.9 127.0.0.1 1 443\r\n"):
            sock = socket.create_connection(("127.0.0.1", fleet.port), timeout=5)
            sock.sendall(data + hello)
            assert connection_closed(sock)
            sock.close()
        # the trusted source without a header, with a malformed one (version 3), with an oversized one
        for data in (hello, SIG + b"\x31\x11\x00\x0c" + bytes(12) + hello, SIG + b"\x21\x11\xff\xff"):
            sock = external_host.connect(fleet.port)
            sock.sendall(data)
            assert connection_closed(sock)
            sock.close()
        # a slow header: closed within the peek deadline (limits.peek_timeout_s = 2 in these fleets)
        sock = external_host.connect(fleet.port)
        sock.sendall(v2("203.0.113.7", 1, *dst)[:9])
        started = time.monotonic()
        assert connection_closed(sock, timeout=10)
        waited = time.monotonic() - started
        sock.close()
        assert 1.5 <= waited <= 3.5, waited
        # a truncated one: the balancer's FIN mid-header
        sock = external_host.connect(fleet.port)
        sock.sendall(v2("203.0.113.7", 1, *dst)[:20])
        sock.shutdown(socket.SHUT_WR)
        assert connection_closed(sock)
        sock.close()
        # the fleet still serves (no worker stalled or died): loopback, no header, the plain L4 path
        with tls_client(fleet.port, "db.internal.test") as s:
            s.sendall(b"ping")
            assert s.recv(100) == b"db:ping"

        def counted() -> dict:
            stats = fleet.stats()
            names = (
                "proxy_header_untrusted",
                "policy_block_proxy_source",
                "proxy_header_missing",
                "proxy_header_malformed",
                "proxy_header_oversize",
                "proxy_header_timeout",
                "proxy_header_truncated",
                "proxy_header_ok",
            )
            return {n: stats.get(n, 0) for n in names} | {"open": stats.get("open_connections", 0)}

        want = {
            "proxy_header_untrusted": 2,
            "policy_block_proxy_source": 2,
            "proxy_header_missing": 1,
            "proxy_header_malformed": 1,
            "proxy_header_oversize": 1,
            "proxy_header_timeout": 1,
            "proxy_header_truncated": 1,
            "proxy_header_ok": 0,
            "open": 0,
        }
        wait_until(lambda: counted() == want, 10, 0.1, what=f"the refusals counted: {want}")
    finally:
        pp_backend.close()
