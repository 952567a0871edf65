"""The PQ TLS edge through a real fleet: resumption across workers, ALPN, peek edge cases, broken
certificates reported, and the guaranteed-L4 internal listener.

External clients live in a network namespace with a non-private address (tests/netns.py).
"""

from __future__ import annotations

import re
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest
from OpenSSL import SSL

from tests import hellos
from tests.netns import external_host  # noqa: F401 - fixture
from tests.peers import free_port, one_web_service, wait_until
from tests.pqclient import PQClient

PROTOCOL_VERSION_ALERT = bytes.fromhex("15030300020246")
UNEXPECTED_MESSAGE_ALERT = bytes.fromhex("1503030002020a")



def read_until_closed(sock: socket.socket, timeout: float = 5.0) -> tuple[bytes, str, float]:
    """(bytes received, "fin" | "reset" | "timeout", seconds until the end)."""
    sock.settimeout(timeout)
    start = time.monotonic()
    out = b""
    try:
        while chunk := sock.recv(4096):
            out += chunk
        end = "fin"
    except ConnectionResetError:
        end = "reset"
    except TimeoutError:
        end = "timeout"
    return out, end, time.monotonic() - start


def serving_pid(fleet, client_port: int) -> int:
    """The fleet process holding the server side of the connection from ``client_port`` (from ``ss``)."""
    out = subprocess.run(
        ["ss", "-Htnp", "state", "established", f"( sport = :{fleet.port} and dport = :{client_port} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pids = {int(p) for p in re.findall(r"pid=(\d+)", out)}
    assert len(pids) == 1, out
    return pids.pop()


def test_100_reconnects_resume_across_both_workers(external_host, fleet_factory, web):  # noqa: F811
    """SO_REUSEPORT spreads the reconnects over both workers by 4-tuple (each reconnect has a new source
    port), so about half of them present a ticket the other worker issued: those must resume too."""
    fleet = fleet_factory(one_web_service(web.port), workers=2, host="0.0.0.0")
    workers = set(fleet.workers())
    session = context = None
    resumed = crossed = 0
    issuer = None
    for n in range(101):  # one full handshake, then 100 reconnects with the latest ticket
        client = PQClient(external_host.connect(fleet.port), "shop.apps.test", session=session, context=context)
        client.handshake()
        resp = client.request(b"GET / HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n")  # the tickets come first
        assert resp.startswith(b"HTTP/1.1 200")
        server = serving_pid(fleet, client.sock.getsockname()[1])
        assert server in workers
        if n:
            resumed += client.resumed
            crossed += client.resumed and server != issuer  # a ticket sealed by the other worker
        issuer = server
        session, context = client.session, client.context
        client.close()
    assert resumed >= 99, f"{resumed} of 100 reconnects resumed"
    assert crossed >= 10, f"only {crossed} resumptions crossed workers: the test proves nothing"
    assert fleet.stats()["tls_resumed"] >= 99


def test_alpn_through_the_fleet(external_host, fleet_factory, web):  # noqa: F811
    fleet = fleet_factory(one_web_service(web.port), workers=1, host="0.0.0.0")

    def client(protos: list[bytes]) -> PQClient:
        ctx = PQClient.make_context()
        ctx.set_alpn_protos(protos)
        return PQClient(external_host.connect(fleet.port), "shop.apps.test", context=ctx)

    c = client([b"h2", b"http/1.1"])
    c.handshake()
    assert c.conn.get_alpn_proto_negotiated() == b"h2"  # [http2] enabled by default (docs/http2.md)
    c.close()
    c = client([b"http/1.1"])
    c.handshake()
    assert c.conn.get_alpn_proto_negotiated() == b"http/1.1"
    assert c.request(b"GET / HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n").startswith(b"HTTP/1.1 200")
    c.close()
    c = client([b"spdy/3"])  # nothing we serve: the no_application_protocol alert
    with pytest.raises(SSL.Error, match="no application protocol"):
        c.handshake()
    c.sock.close()
    wait_until(lambda: fleet.stats().get("tls_alpn_refused", 0) == 1, 5, what="alpn refusal counted")


def test_zero_length_record_after_a_partial_hello_is_refused_at_once(fleet_factory, web):
    """A zero-length record in a segment of its own wakes the peek (SO_RCVLOWAT asks for a header, no more)
    and is judged at once. The reference refuses an empty application-data record, and skips empty handshake
    records up to 32 in a row (tests/tls_reference.py): so those, and the 33rd empty one."""
    fleet = fleet_factory(one_web_service(web.port), workers=1, limits="")  # peek_timeout_s = 2 in tests/peers.py
    records = hellos.reframe(hellos.pq_hello("shop.apps.test"), 600)
    first = 5 + int.from_bytes(records[3:5], "big")
    for empty in (b"\x17\x03\x03\x00\x00", b"\x16\x03\x01\x00\x00" * 33):
        sock = socket.create_connection(("127.0.0.1", fleet.port))
        sock.sendall(records[:first])  # a partial ClientHello ...
        time.sleep(0.05)  # ... then, in a separate segment, zero-length records
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(empty)
        got, end, took = read_until_closed(sock)
        sock.close()
        assert took < 1.0, f"held {took:.2f}s"
        assert (got, end) == (UNEXPECTED_MESSAGE_ALERT, "fin")
    assert fleet.stats()["peek_garbage"] == 2


def test_record_version_major_not_3_is_answered_as_openssl_does(fleet_factory, web):
    fleet = fleet_factory(one_web_service(web.port), workers=1)
    hello = hellos.pq_hello("shop.apps.test")
    records = bytearray(hellos.reframe(hello, 600))
    first = 5 + int.from_bytes(records[3:5], "big")
    # In the first record: not TLS at all, as far as OpenSSL is concerned: closed, no alert.
    bad_first = bytearray(hello)
    bad_first[1] = 4
    sock = socket.create_connection(("127.0.0.1", fleet.port))
    sock.sendall(bytes(bad_first))
    assert read_until_closed(sock)[:2] == (b"", "fin")
    sock.close()
    # In a later record of the hello: a TLS peer speaking nonsense: protocol_version alert, then close.
    records[first + 1] = 4
    sock = socket.create_connection(("127.0.0.1", fleet.port))
    sock.sendall(bytes(records))
    got, end, took = read_until_closed(sock)
    sock.close()
    assert (got, end) == (PROTOCOL_VERSION_ALERT, "fin") and took < 1.0
    assert fleet.stats()["peek_bad_version"] == 2


def test_broken_pair_is_reported_and_a_fixed_one_served(external_host, fleet_factory, web, tmp_path):  # noqa: F811
    fleet = fleet_factory(one_web_service(web.port), workers=1, host="0.0.0.0")
    fixtures = Path(__file__).parent / "fixtures" / "openssl35-mldsa65"
    live = Path(fleet.workdir) / "certs" / "shop.apps.test"
    live.mkdir(parents=True)
    shutil.copy(fixtures / "seed-priv" / "fullchain.pem", live / "fullchain.pem")
    shutil.copy(fixtures / "priv-only" / "privkey.pem", live / "privkey.pem")  # another pair's key

    def served() -> bytes:
        c = PQClient(external_host.connect(fleet.port), "shop.apps.test")
        c.handshake()
        cert = c.peer_cert
        c.close()
        return cert.subject.rfc4514_string().encode()

    assert b"bootstrap" in served()
    wait_until(lambda: fleet.saw("cert_rejected"), 5, what="cert_rejected event")
    ev = fleet.events("cert_rejected")[-1]
    assert ev["certificate"] == "shop.apps.test" and "does not match" in ev["reason"] and ev["level"] == "warning"
    assert fleet.stats()["cert_rejected"] == 1
    shutil.copy(fixtures / "seed-priv" / "privkey.pem", live / "privkey.pem")  # fixed: hot swap
    wait_until(lambda: served() == b"CN=seed-priv.openssl.test", 5, what="fixed pair served")


def l4_fleet(fleet_factory, backend, *, any_source: bool):
    port = free_port("0.0.0.0")
    fleet = fleet_factory(
        f"""
[network]
internal_l4_any_source = {"true" if any_source else "false"}
[[instances]]
service = "vault"
id = "vault-1"
host = "127.0.0.1"
port = {backend.port}
tls = true
[[domains]]
hostname = "vault.test"
service = "vault"
""",
        host="0.0.0.0",
        listen_extra=f'internal_l4 = "0.0.0.0:{port}"',
    )
    return fleet, port


def classical_tls(sock: socket.socket, sni: str) -> ssl.SSLSocket:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx.wrap_socket(sock, server_hostname=sni)


@pytest.mark.parametrize("any_source", [False, True])
def test_internal_l4_listener_pipes_external_sources_only_when_allowed(
    external_host,  # noqa: F811
    fleet_factory,
    backend_factory,
    any_source,
):
    vault = backend_factory("vault", "vault.test")
    fleet, port = l4_fleet(fleet_factory, vault, any_source=any_source)
    # An internal client is always piped raw: the backend's own (classical) certificate answers.
    with classical_tls(socket.create_connection(("127.0.0.1", port), timeout=5), "vault.test") as s:
        assert s.getpeercert(binary_form=True) == vault.cert_der
        s.sendall(b"in")
        assert s.recv(100) == b"vault:in"
    raw = external_host.connect(port)
    if not any_source:
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            classical_tls(raw, "vault.test")  # closed before a byte is read: never reaches the backend
        raw.close()
        assert vault.connections == 1
        assert fleet.stats()["internal_l4_refused"] == 1
        return
    with classical_tls(raw, "vault.test") as s:  # never decrypted, though the source is external
        assert s.getpeercert(binary_form=True) == vault.cert_der
        s.sendall(b"out")
        assert s.recv(100) == b"vault:out"
    stats = fleet.stats()
    assert stats["connections_internal_l4"] == 2 and stats.get("connections_l7", 0) == 0
