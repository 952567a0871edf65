"""Real PQ TLS handshakes over loopback: sentin8.tls contexts + workers.tls_layer on uvloop + the cert store.

Each test runs its own uvloop in a thread with a listener on a free port; clients are blocking
``PQClient``s on plain sockets. Waits are condition variables or socket timeouts, never sleeps.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import mldsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from OpenSSL import SSL

from sentin8 import tls, tls_connection
from sentin8.certpair import self_signed_mldsa65, write_pair
from sentin8.certstore import CertStore
from tests.peers import wait_until
from tests.pqclient import PQClient
from workers.timer_queue import TimerQueue
from workers.tls_client import TLSClientProtocol
from workers.tls_layer import TLSHandshakeError, TLSServerProtocol

WAIT = 10.0
INFO_KEYS = ("peername", "sockname", "sni", "tls_group", "tls_version", "peercert", "session_reused")


class Clock:
    """Injected time: tests move it instead of sleeping."""

    def __init__(self) -> None:
        self.wall = time.time()
        self.mono = 1000.0

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono


class EchoApp(asyncio.Protocol):
    """Echoes; pauses its reading while the TLS transport's write buffer is over the high-water mark."""

    def __init__(self, server: ServerThread) -> None:
        self.server = server
        self.pauses = 0
        self.resumes = 0
        self.eofs = 0
        self.eof_written = False
        self.info: dict[str, Any] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.info = {k: transport.get_extra_info(k) for k in INFO_KEYS}
        if self.server.write_high is not None:
            self.transport.set_write_buffer_limits(high=self.server.write_high)
        self.server.notify(lambda s: s.apps.append(self))

    def data_received(self, data: bytes) -> None:
        if data == b"quit":
            self.transport.close()
            return
        if data == b"half":  # half-close: close_notify + FIN, reading goes on
            self.transport.write(b"bye")
            self.transport.write_eof()
            self.eof_written = True
            self.server.notify(lambda s: s.half_closed.append(self.transport.is_closing()))
            return
        if self.eof_written:
            self.server.notify(lambda s: s.late.append(data))
            return
        self.transport.write(data)

    def pause_writing(self) -> None:
        self.pauses += 1
        self.transport.pause_reading()
        self.server.paused.set()

    def resume_writing(self) -> None:
        self.resumes += 1
        self.transport.resume_reading()

    def eof_received(self) -> bool:
        self.eofs += 1
        return False  # close (with close_notify)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.notify(lambda s: setattr(s, "lost", s.lost + 1))


class ServerThread:
    """A uvloop in a thread accepting on 127.0.0.1:<free port>, wrapping each connection in TLSServerProtocol
    the way a worker does: accept, optionally peek (MSG_PEEK), then ``connect_accepted_socket``."""

    def __init__(
        self,
        context: SSL.Context,
        *,
        handshake_timeout: float = WAIT,
        peek: bool = False,
        write_high: int | None = None,
        sndbuf: int | None = None,
        shared_timer: bool = False,
    ) -> None:
        self.context = context
        self.sndbuf = sndbuf
        self.shared_timer = shared_timer  # the worker's way: the handshakes' deadlines in one TimerQueue
        self.timers: TimerQueue | None = None
        self.handshake_timeout = handshake_timeout
        self.peek = peek
        self.write_high = write_high
        self.errors: list[str] = []
        self.done = 0
        self.lost = 0
        self.peeked: list[int] = []
        self.apps: list[EchoApp] = []
        self.half_closed: list[bool] = []
        self.late: list[bytes] = []
        self.protocols: list[TLSServerProtocol] = []
        self.paused = threading.Event()
        self._cond = threading.Condition()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._task = asyncio.run_coroutine_threadsafe(self._accept_loop(), self.loop)

    def notify(self, change: Callable[[ServerThread], object]) -> None:
        with self._cond:
            change(self)
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = WAIT) -> None:
        with self._cond:
            assert self._cond.wait_for(predicate, timeout), "condition not reached before the deadline"

    def run(self, coro: Any, timeout: float = WAIT) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def connect(self, timeout: float = WAIT) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def client(self, sni: str | None, **kw: Any) -> PQClient:
        return PQClient(self.connect(), sni, **kw)

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        timers = self.timers = TimerQueue(loop) if self.shared_timer else None
        while True:
            sock, _ = await loop.sock_accept(self.listener)
            if self.sndbuf is not None:  # small kernel buffer: the transport's own buffer must fill
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.sndbuf)
            if self.peek:
                readable = loop.create_future()
                loop.add_reader(sock.fileno(), lambda f=readable: f.done() or f.set_result(None))
                await readable
                loop.remove_reader(sock.fileno())
                self.peeked.append(len(sock.recv(16384, socket.MSG_PEEK)))
            proto = TLSServerProtocol(
                self.context,
                lambda: EchoApp(self),
                handshake_timeout=self.handshake_timeout,
                on_handshake_error=lambda reason: self.notify(lambda s: s.errors.append(reason)),
                on_handshake_done=lambda conn: self.notify(lambda s: setattr(s, "done", s.done + 1)),
                timers=timers,
            )
            self.protocols.append(proto)
            await loop.connect_accepted_socket(lambda p=proto: p, sock)

    def stop(self) -> None:
        def shutdown() -> None:
            self._task.cancel()
            for p in self.protocols:
                if p.app_transport is not None:
                    p.app_transport.abort()
                elif p._raw is not None:
                    p._raw.abort()
            self.loop.call_soon(self.loop.stop)

        self.loop.call_soon_threadsafe(shutdown)
        self._thread.join(WAIT)
        self.loop.close()
        self.listener.close()


# -- certificates ------------------------------------------------------------------------------------


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def make_ca() -> tuple[x509.Certificate, mldsa.MLDSA65PrivateKey]:
    key = mldsa.MLDSA65PrivateKey.generate()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test internal CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - dt.timedelta(minutes=5))
        .not_valid_after(_now() + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, None)
    )
    return cert, key


def issue(
    ca: tuple[x509.Certificate, mldsa.MLDSA65PrivateKey], cn: str, eku: x509.ObjectIdentifier
) -> tuple[x509.Certificate, mldsa.MLDSA65PrivateKey]:
    key = mldsa.MLDSA65PrivateKey.generate()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - dt.timedelta(minutes=5))
        .not_valid_after(_now() + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(cn)]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([eku]), critical=False)
        .sign(ca[1], None)
    )
    return cert, key


def put_cert(cert_dir: Path, dirname: str, names: list[str]) -> str:
    """Write a fresh self-signed ML-DSA-65 pair into the store; return its fingerprint."""
    cert, key = self_signed_mldsa65(names, time.time() - 60, time.time() + 3600)
    write_pair(cert_dir / dirname, [cert], key)
    return cert.fingerprint(hashes.SHA256()).hex()


def fp(cert: x509.Certificate | None) -> str:
    assert cert is not None
    return cert.fingerprint(hashes.SHA256()).hex()


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: mldsa.MLDSA65PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


# -- fixtures ----------------------------------------------------------------------------------------


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> CertStore:
    return CertStore(tmp_path / "certs", tmp_path / "state", clock=clock.time, monotonic=clock.monotonic)


@pytest.fixture
def serve() -> Iterator[Callable[..., ServerThread]]:
    servers: list[ServerThread] = []

    def start(context: SSL.Context, **kw: Any) -> ServerThread:
        server = ServerThread(context, **kw)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


# -- tests -------------------------------------------------------------------------------------------


def test_pq_handshake_negotiates_mlkem_and_mldsa(store: CertStore, serve: Callable[..., ServerThread]) -> None:
    want = put_cert(Path(store.cert_dir), "shop.example.test", ["shop.example.test"])
    server = serve(tls.SNIContexts(store).front)
    client = server.client("shop.example.test")
    client.handshake()
    assert client.group_name == "X25519MLKEM768"
    assert isinstance(client.peer_cert.public_key(), mldsa.MLDSA65PublicKey)  # type: ignore[union-attr]
    assert fp(client.peer_cert) == want
    client.sendall(b"hello")
    assert client.recv() == b"hello"
    server.wait_for(lambda: len(server.apps) == 1)
    info = server.apps[0].info
    assert info["sni"] == "shop.example.test"
    assert info["tls_group"] == "X25519MLKEM768"
    assert info["tls_version"] == "TLSv1.3"
    assert info["peercert"] is None
    assert info["peername"] == client.sock.getsockname()
    assert info["sockname"] == ("127.0.0.1", server.port)
    assert server.errors == []
    client.close()


@pytest.mark.parametrize(
    ("groups", "sigalgs"),
    [
        (b"X25519", b"ed25519:ecdsa_secp256r1_sha256:rsa_pss_rsae_sha256"),  # classical only
        (b"X25519", b"mldsa65"),  # classical key exchange
        (b"X25519MLKEM768", b"ed25519:ecdsa_secp256r1_sha256:rsa_pss_rsae_sha256"),  # classical signatures
    ],
)
def test_classical_client_refused_and_counted(
    store: CertStore, serve: Callable[..., ServerThread], groups: bytes, sigalgs: bytes
) -> None:
    server = serve(tls.SNIContexts(store).front)
    client = server.client("shop.example.test", groups=groups, sigalgs=sigalgs)
    with pytest.raises((SSL.Error, OSError)):
        client.handshake()
    server.wait_for(lambda: len(server.errors) == 1)
    assert server.errors[0].startswith("tls: ")
    assert server.done == 0
    client.sock.close()


def test_classical_mode_of_test_client_refused(store: CertStore, serve: Callable[..., ServerThread]) -> None:
    server = serve(tls.SNIContexts(store).front)
    client = server.client("shop.example.test", classical=True)
    with pytest.raises((SSL.Error, OSError)):
        client.handshake()
    server.wait_for(lambda: len(server.errors) == 1)
    client.sock.close()


def test_plain_http_on_tls_port_is_a_handshake_error(store: CertStore, serve: Callable[..., ServerThread]) -> None:
    server = serve(tls.SNIContexts(store).front)
    with server.connect() as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        server.wait_for(lambda: len(server.errors) == 1)
        assert server.errors[0].startswith("tls: ")
        try:
            assert sock.recv(100) is not None  # EOF or an alert, then the connection is gone
        except ConnectionResetError:
            pass


@pytest.mark.parametrize("shared_timer", [False, True], ids=["own-timer", "timer-queue"])
def test_handshake_deadline_closes_silent_peer(
    store: CertStore, serve: Callable[..., ServerThread], shared_timer: bool
) -> None:
    server = serve(tls.SNIContexts(store).front, handshake_timeout=0.3, shared_timer=shared_timer)
    start = time.monotonic()
    with server.connect() as sock:
        try:
            assert sock.recv(1) == b""
        except ConnectionResetError:
            pass  # aborted: RST instead of FIN
        server.wait_for(lambda: server.errors == ["timeout"])
    assert time.monotonic() - start >= 0.29  # the loop's clock has millisecond steps: it may fire <1 ms early


def test_a_finished_handshake_leaves_its_queued_deadline_cancelled(
    store: CertStore, serve: Callable[..., ServerThread]
) -> None:
    # in the worker's TimerQueue a completed handshake's deadline stays queued until its time, cancelled: it
    # must neither fire (no "timeout", the connection lives on past it) nor keep the layer alive meanwhile
    put_cert(Path(store.cert_dir), "shop.example.test", ["shop.example.test"])
    server = serve(tls.SNIContexts(store).front, handshake_timeout=0.3, shared_timer=True)
    client = server.client("shop.example.test")
    client.handshake()
    server.wait_for(lambda: server.done == 1)
    proto = server.protocols[0]
    assert proto._timer is None  # cancelled and forgotten by the layer
    assert server.timers is not None and len(server.timers) == 1  # still queued, cancelled, until its time
    wait_until(lambda: len(server.timers) == 0, 5.0, what="the cancelled deadline's time")  # type: ignore[arg-type]
    client.sendall(b"still here")
    assert client.recv() == b"still here"
    assert server.errors == []
    client.close()


def test_handshake_deadline_closes_stalled_client_hello(store: CertStore, serve: Callable[..., ServerThread]) -> None:
    server = serve(tls.SNIContexts(store).front, handshake_timeout=0.3)
    # Capture a real ClientHello from a PQ client on a socketpair, then send only part of it.
    a, b = socket.socketpair()
    with a, b:
        hello_client = PQClient(a, "shop.example.test", timeout=0.5)
        with pytest.raises(OSError):
            hello_client.handshake()  # times out waiting for a server: the ClientHello sits in b
        hello = b.recv(65536)
    assert len(hello) > 1200  # the ML-KEM key share alone is 1,216 bytes
    with server.connect() as sock:
        sock.sendall(hello[:700])
        server.wait_for(lambda: server.errors == ["timeout"])


def test_peeked_client_hello_is_not_lost(store: CertStore, serve: Callable[..., ServerThread]) -> None:
    server = serve(tls.SNIContexts(store).front, peek=True)
    client = server.client("shop.example.test")
    client.handshake()
    client.sendall(b"ping")
    assert client.recv() == b"ping"
    assert server.peeked and server.peeked[0] > 1200
    client.close()


@pytest.mark.parametrize(
    ("sni", "expect"),
    [
        ("a.example.test", "exact"),
        ("A.Example.Test", "exact"),
        ("b.example.test", "wildcard"),
        ("x.b.example.test", "bootstrap"),  # a wildcard covers one label only
        ("other.test", "bootstrap"),
        (None, "bootstrap"),
    ],
)
def test_certificate_chosen_per_sni(
    store: CertStore, serve: Callable[..., ServerThread], sni: str | None, expect: str
) -> None:
    cert_dir = Path(store.cert_dir)
    fps = {
        "exact": put_cert(cert_dir, "a.example.test", ["a.example.test"]),
        "wildcard": put_cert(cert_dir, "_wildcard.example.test", ["*.example.test"]),
        "bootstrap": store.bootstrap().fingerprint,
    }
    contexts = tls.SNIContexts(store)
    server = serve(contexts.front)
    client = server.client(sni)
    client.handshake()
    assert fp(client.peer_cert) == fps[expect]
    assert client.group_name == "X25519MLKEM768"
    client.close()


def test_hot_swap_bootstrap_to_store_certificate(
    store: CertStore, clock: Clock, serve: Callable[..., ServerThread]
) -> None:
    contexts = tls.SNIContexts(store)
    server = serve(contexts.front)
    first = server.client("new.example.test")
    first.handshake()
    assert fp(first.peer_cert) == store.bootstrap().fingerprint

    new_fp = put_cert(Path(store.cert_dir), "new.example.test", ["new.example.test"])
    clock.mono += store.revalidate_s  # the negative answer is at most one revalidation interval old
    second = server.client("new.example.test")
    second.handshake()
    assert fp(second.peer_cert) == new_fp

    # A renewal replaces the files again: new handshakes get it, the open connections keep working.
    renewed_fp = put_cert(Path(store.cert_dir), "new.example.test", ["new.example.test"])
    clock.mono += store.revalidate_s
    third = server.client("new.example.test")
    third.handshake()
    assert fp(third.peer_cert) == renewed_fp
    for c in (first, second, third):
        c.sendall(b"still here")
        assert c.recv() == b"still here"
        c.close()
    assert server.errors == []


def test_one_megabyte_echo_with_flow_control(store: CertStore, serve: Callable[..., ServerThread]) -> None:
    server = serve(tls.SNIContexts(store).front, write_high=16384, sndbuf=8192)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # small, so the server's buffer fills
    sock.settimeout(WAIT)
    sock.connect(("127.0.0.1", server.port))
    client = PQClient(sock, "shop.example.test")
    client.handshake()
    payload = bytes(range(256)) * 4096  # 1 MiB
    echoed = client.duplex(payload, len(payload), read_gate=server.paused)
    assert echoed == payload
    server.wait_for(lambda: len(server.apps) == 1)
    app = server.apps[0]
    assert app.pauses >= 1
    assert app.resumes >= 1
    client.close()


def test_close_notify_both_ways(store: CertStore, serve: Callable[..., ServerThread]) -> None:
    server = serve(tls.SNIContexts(store).front)
    # Client closes: the app sees eof_received, then the server answers with its own close_notify.
    client = server.client("shop.example.test")
    client.handshake()
    client.sendall(b"x")
    assert client.recv() == b"x"
    client.conn.shutdown()
    client._pump_out()
    assert client.recv() == b""
    assert client.peer_closed
    server.wait_for(lambda: len(server.apps) == 1 and server.lost == 1)
    assert server.apps[0].eofs == 1
    client.sock.close()
    # Server app closes first: close_notify precedes the FIN.
    client = server.client("shop.example.test")
    client.handshake()
    client.sendall(b"quit")
    assert client.recv() == b""
    assert client.peer_closed
    client.close()


def test_write_eof_sends_close_notify_and_keeps_reading(store: CertStore, serve: Callable[..., ServerThread]) -> None:
    server = serve(tls.SNIContexts(store).front)
    client = server.client("shop.example.test")
    client.handshake()
    client.sendall(b"half")
    assert client.recv() == b"bye"
    assert client.recv() == b""
    assert client.peer_closed
    server.wait_for(lambda: server.half_closed == [False])
    client.sendall(b"late")  # the server still reads after its write_eof
    server.wait_for(lambda: server.late == [b"late"])
    client.conn.shutdown()
    client._pump_out()
    server.wait_for(lambda: server.lost == 1)
    assert server.apps[0].eofs == 1
    client.sock.close()


def _holding_the_loop(server: ServerThread, during: Callable[[asyncio.Transport], None]) -> threading.Event:
    """Run ``during(app transport)`` in the server's loop, then hold the loop in that same turn until the
    returned event is set: what the test sees meanwhile is what the turn has written so far."""
    resume = threading.Event()
    ran = threading.Event()

    def turn() -> None:
        during(server.apps[0].transport)
        ran.set()
        resume.wait(WAIT)  # the loop is blocked on purpose: the turn has not ended

    server.loop.call_soon_threadsafe(turn)
    assert ran.wait(WAIT)
    return resume


def _nothing_arrived(sock: socket.socket) -> bool:
    """No byte readable right now (a zero-timeout poll: the socket's own timeout would make recv wait)."""
    return not select.select([sock], [], [], 0)[0]


def test_write_soon_leaves_at_the_end_of_the_loop_turn(store: CertStore, serve: Callable[..., ServerThread]) -> None:
    """The h1 writer's responses (TLSAppTransport.write_soon): encrypted at once, written to the socket when the
    turn ends, every write_soon of the turn in that one socket write."""
    server = serve(tls.SNIContexts(store).front)
    client = server.client("shop.example.test")
    client.handshake()
    client.sendall(b"x")
    assert client.recv() == b"x"  # the connection is up, its tickets gone with the echo
    server.wait_for(lambda: len(server.apps) == 1)
    resume = _holding_the_loop(server, lambda t: (t.write_soon(b"one "), t.write_soon(b"two")))
    assert _nothing_arrived(client.sock)  # the turn is not over: nothing has been written
    resume.set()
    got = b""
    while len(got) < 7:
        got += client.recv()
    assert got == b"one two"
    client.close()


def test_write_soon_past_its_bound_and_a_close_write_at_once_in_order(
    store: CertStore, serve: Callable[..., ServerThread]
) -> None:
    from workers.tls_layer import SOON_MAX

    server = serve(tls.SNIContexts(store).front)
    client = server.client("shop.example.test")
    client.handshake()
    client.sendall(b"x")
    assert client.recv() == b"x"
    server.wait_for(lambda: len(server.apps) == 1)
    big = bytes(range(256)) * (SOON_MAX // 256 + 1)
    resume = _holding_the_loop(server, lambda t: (t.write_soon(b"head"), t.write_soon(big)))
    try:
        assert not _nothing_arrived(client.sock)  # past the bound: written within the turn, the head first
    finally:
        resume.set()
    got = b""
    while len(got) < 4 + len(big):
        got += client.recv()
    assert got == b"head" + big
    # queued, then closed in the same turn: the bytes precede close_notify
    resume = _holding_the_loop(server, lambda t: (t.write_soon(b"last"), t.close()))
    resume.set()
    assert client.recv() == b"last"
    assert client.recv() == b""
    assert client.peer_closed
    client.close()


def _pq_client(sni: str | None, offered: list[bytes] | None) -> SSL.Connection:
    """A PQ pyOpenSSL client in connect state, offering ``sni`` and ``offered`` (ALPN) when given."""
    client = SSL.Connection(PQClient.make_context(), None)
    client.set_connect_state()
    if sni is not None:
        client.set_tlsext_host_name(sni.encode())
    if offered is not None:
        client.set_alpn_protos(offered)
    return client


def _in_memory_handshake(server: SSL.Connection, client: SSL.Connection) -> None:
    """Both sides' flights moved by hand until both are done (no sockets: what is compared is the SSL state)."""
    done = {server: False, client: False}
    for _ in range(10):
        for me, peer in ((client, server), (server, client)):
            try:
                me.do_handshake()
                done[me] = True
            except SSL.WantReadError:
                pass
            try:
                peer.bio_write(me.bio_read(65536))
            except SSL.WantReadError:
                pass
        if all(done.values()):
            return
    raise AssertionError("the handshake did not finish")


@pytest.mark.parametrize(
    ("sni", "offered"),
    [("shop.example.test", [b"h2", b"http/1.1"]), ("shop.example.test", [b"http/1.1"]), (None, None)],
)
def test_direct_accessors_answer_as_pyopenssls_getters(
    store: CertStore, sni: str | None, offered: list[bytes] | None
) -> None:
    # tls_connection.servername / protocol_version / peer_certificate_der / alpn_selected read the SSL object through
    # cffi, or C pointers when compiled (pyOpenSSL's getters are interpreted Python, several per connection): the same
    # answers, before and after, from a pyOpenSSL Connection here (a RecordIO below)
    put_cert(Path(store.cert_dir), "shop.example.test", ["shop.example.test"])
    server = SSL.Connection(tls.SNIContexts(store, protocols=tls.H2_PROTOCOLS).front, None)
    server.set_accept_state()
    client = _pq_client(sni, offered)
    assert tls_connection.servername(server) is None and tls_connection.alpn_selected(server) is None
    _in_memory_handshake(server, client)
    assert tls_connection.servername(server) == server.get_servername() == (sni.encode() if sni else None)
    assert tls_connection.protocol_version(server) == server.get_protocol_version_name() == "TLSv1.3"
    assert tls_connection.peer_certificate_der(server) is server.get_peer_certificate() is None
    expected_alpn = (offered or [None])[0]
    assert tls_connection.alpn_selected(server) == (server.get_alpn_proto_negotiated() or None) == expected_alpn
    assert tls_connection.group_name(server) == server.get_group_name() == "X25519MLKEM768"
    assert tls_connection.cipher_name(server) == server.get_cipher_name() is not None
    served = x509.load_der_x509_certificate(tls_connection.peer_certificate_der(client))  # type: ignore[arg-type]
    assert served == client.get_peer_certificate(as_cryptography=True)  # the SNI's own certificate, if one
    names = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ("shop.example.test" in names.get_values_for_type(x509.DNSName)) is (sni is not None)


def _accepting_handshake(server: tls_connection.RecordIO, client: SSL.Connection) -> None:
    """The worker's server side (a ``RecordIO`` that owns its SSL object) against a pyOpenSSL client, in memory."""
    for _ in range(10):
        try:
            client.do_handshake()
        except SSL.WantReadError:
            pass
        try:
            server.feed(client.bio_read(65536))
        except SSL.WantReadError:
            pass
        done = server.handshake()
        client.bio_write(server.drain())
        if done:
            client.do_handshake()
            return
    raise AssertionError("the handshake did not finish")


@pytest.mark.parametrize(
    ("sni", "offered", "chosen"),
    [
        ("shop.example.test", [b"h2", b"http/1.1"], b"h2"),  # the server's order
        ("shop.example.test", [b"http/1.1", b"h2"], b"h2"),
        ("shop.example.test", [b"spdy/3", b"http/1.1", b"http/1.1"], b"http/1.1"),
        ("other.example.test", [b"http/1.1"], b"http/1.1"),  # no such certificate: the bootstrap one
        (None, None, None),
    ],
)
def test_a_server_connection_without_pyopenssl_negotiates_and_answers_like_one(
    store: CertStore, sni: str | None, offered: list[bytes] | None, chosen: bytes | None
) -> None:
    # The worker's server connection is an SSL object of its own (no pyOpenSSL Connection): the servername
    # and ALPN callbacks are C callbacks; what the client sees, and what the getters say, is what it was.
    put_cert(Path(store.cert_dir), "shop.example.test", ["shop.example.test"])
    contexts = tls.SNIContexts(store, protocols=tls.H2_PROTOCOLS)
    server = tls_connection.RecordIO.accepting(contexts.front)
    client = _pq_client(sni, offered)
    _accepting_handshake(server, client)
    assert tls_connection.servername(server) == client.get_servername() == (sni.encode() if sni else None)
    assert tls_connection.alpn_selected(server) == (client.get_alpn_proto_negotiated() or None) == chosen
    assert tls_connection.group_name(server) == client.get_group_name() == "X25519MLKEM768"
    assert tls_connection.cipher_name(server) == client.get_cipher_name()
    assert tls_connection.protocol_version(server) == "TLSv1.3" and tls_connection.peer_certificate_der(server) is None
    names = client.get_peer_certificate(as_cryptography=True).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    ).value.get_values_for_type(x509.DNSName)
    assert ("shop.example.test" in names) is (sni == "shop.example.test")
    assert (contexts.selected_store, contexts.selected_bootstrap) == ((1, 0) if sni == "shop.example.test" else (0, 1))
    # records both ways, then close_notify both ways
    client.send(b"ping")
    server.feed(client.bio_read(65536))
    assert server.read() == b"ping"
    assert server.write(b"pong") == 4
    assert not server.shutdown()  # ours is out; the peer's not read yet
    client.bio_write(server.drain())
    assert client.recv(65536) == b"pong"
    with pytest.raises(SSL.ZeroReturnError):
        client.recv(65536)
    client.shutdown()
    server.feed(client.bio_read(65536))
    assert server.read() == b""
    assert server.shutdown()  # both close_notify now


def test_a_server_connection_without_pyopenssl_refuses_and_fails_as_pyopenssl_would(store: CertStore) -> None:
    front = tls.SNIContexts(store).front
    # no protocol in common: the no_application_protocol alert, and the handshake's reason says so
    server = tls_connection.RecordIO.accepting(front)
    client = _pq_client("x.example.test", [b"h2"])
    with pytest.raises(SSL.Error) as info:
        _accepting_handshake(server, client)
    assert tls_connection.ssl_error_reason(info.value) == tls.NO_APPLICATION_PROTOCOL_REASON
    # bytes that are no TLS at all: the exception pyOpenSSL's Connection raises for them, the same class and
    # arguments
    for garbage in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x16\x03\x01\x00\x05hello", b"\x00" * 64):
        server = tls_connection.RecordIO.accepting(front)
        server.feed(garbage)
        with pytest.raises(SSL.Error) as ours:
            server.handshake()
        reference = SSL.Connection(front, None)
        reference.set_accept_state()
        reference.bio_write(garbage)
        with pytest.raises(SSL.Error) as theirs:
            reference.do_handshake()
        assert (type(ours.value), ours.value.args) == (type(theirs.value), theirs.value.args), garbage
    assert tls_connection.ssl_error_reason(ours.value).startswith("tls: ")


def test_session_resumption(store: CertStore, serve: Callable[..., ServerThread]) -> None:
    put_cert(Path(store.cert_dir), "shop.example.test", ["shop.example.test"])
    server = serve(tls.SNIContexts(store).front)
    first = server.client("shop.example.test")
    first.handshake()
    assert not first.resumed
    first.sendall(b"one")
    assert first.recv() == b"one"  # the tickets arrived before the echo
    session = first.session
    first.sendall(b"quit")  # the server closes first, with close_notify
    assert first.recv() == b""
    assert first.peer_closed
    first.close()

    second = server.client("shop.example.test", session=session, context=first.context)
    second.handshake()
    assert second.resumed
    assert second.group_name == "X25519MLKEM768"
    second.sendall(b"two")
    assert second.recv() == b"two"
    server.wait_for(lambda: len(server.apps) == 2)
    assert [a.info["session_reused"] for a in server.apps] == [False, True]
    second.close()


def test_client_certificate_is_exposed_as_peercert(
    tmp_path: Path, store: CertStore, serve: Callable[..., ServerThread]
) -> None:
    ca = make_ca()
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(pem(ca[0]))
    client_cert, client_key = issue(ca, "client.example.test", ExtendedKeyUsageOID.CLIENT_AUTH)
    server = serve(tls.SNIContexts(store, client_ca_file=str(ca_file)).front)
    client = server.client("shop.example.test", client_cert=(client_cert, key_pem(client_key)))
    client.handshake()
    client.sendall(b"id")
    assert client.recv() == b"id"
    server.wait_for(lambda: len(server.apps) == 1)
    assert server.apps[0].info["peercert"] == client_cert.public_bytes(serialization.Encoding.DER)
    client.close()
    # No client certificate is fine (optional); an untrusted one fails the handshake.
    anonymous = server.client("shop.example.test")
    anonymous.handshake()
    anonymous.sendall(b"anon")
    assert anonymous.recv() == b"anon"
    anonymous.close()
    rogue_cert, rogue_key = issue(make_ca(), "rogue.example.test", ExtendedKeyUsageOID.CLIENT_AUTH)
    rogue = server.client("shop.example.test", client_cert=(rogue_cert, key_pem(rogue_key)))
    with pytest.raises((SSL.Error, OSError)):
        rogue.handshake()
        rogue.sendall(b"x")  # TLS 1.3: the server's verdict on the client cert arrives after Finished
        assert rogue.recv() == b""
    server.wait_for(lambda: len(server.errors) == 1)
    rogue.sock.close()


class _Collect(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = bytearray()
        self.got = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.data += data
        self.got.set()


def test_upstream_bridge_client_with_mtls(tmp_path: Path, store: CertStore, serve: Callable[..., ServerThread]) -> None:
    ca = make_ca()
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(pem(ca[0]))
    backend_cert, backend_key = issue(ca, "backend.internal", ExtendedKeyUsageOID.SERVER_AUTH)
    write_pair(Path(store.cert_dir) / "backend.internal", [backend_cert, ca[0]], backend_key)
    client_cert, client_key = issue(ca, "sentin8-proxy", ExtendedKeyUsageOID.CLIENT_AUTH)
    (tmp_path / "client.pem").write_bytes(pem(client_cert))
    (tmp_path / "client.key").write_bytes(key_pem(client_key))
    server = serve(tls.SNIContexts(store, client_ca_file=str(ca_file)).front)

    async def bridge(ctx: SSL.Context, verify_name: str | None) -> tuple[bytes, dict[str, Any]]:
        loop = asyncio.get_running_loop()
        errors: list[str] = []
        transport, proto = await loop.create_connection(
            lambda: TLSClientProtocol(
                ctx,
                _Collect,
                server_hostname="backend.internal",
                verify_name=verify_name,
                on_handshake_error=errors.append,
            ),
            "127.0.0.1",
            server.port,
        )
        try:
            await proto.handshake_complete
            app = proto.app_transport.get_protocol()  # type: ignore[union-attr]
            proto.app_transport.write(b"over the bridge")  # type: ignore[union-attr]
            await asyncio.wait_for(app.got.wait(), WAIT)
            info = {k: proto.app_transport.get_extra_info(k) for k in INFO_KEYS}  # type: ignore[union-attr]
            proto.app_transport.close()  # type: ignore[union-attr]
            return bytes(app.data), info
        finally:
            transport.close()

    ctx = tls.upstream_context(
        ca_file=str(ca_file), client_cert=str(tmp_path / "client.pem"), client_key=str(tmp_path / "client.key")
    )
    data, info = server.run(bridge(ctx, "backend.internal"))
    assert data == b"over the bridge"
    assert info["tls_version"] == "TLSv1.3"
    assert info["tls_group"] == "X25519MLKEM768"  # OpenSSL 4 prefers the hybrid even when not forced
    assert info["peercert"] == backend_cert.public_bytes(serialization.Encoding.DER)
    server.wait_for(lambda: len(server.apps) == 1)
    assert server.apps[0].info["peercert"] == client_cert.public_bytes(serialization.Encoding.DER)

    # The certificate must name what we asked for.
    with pytest.raises(TLSHandshakeError):
        server.run(bridge(ctx, "other.internal"))
    # Without a CA nothing is verified: even the self-signed bootstrap certificate is accepted.
    pq_ctx = tls.upstream_context(
        client_cert=str(tmp_path / "client.pem"), client_key=str(tmp_path / "client.key"), pq_only=True
    )
    data, _ = server.run(bridge(pq_ctx, None))
    assert data == b"over the bridge"


def test_context_builders_reject_bad_input(tmp_path: Path) -> None:
    ctx = SSL.Context(SSL.TLS_METHOD)
    with pytest.raises(tls.TLSSetupError):
        tls.restrict(ctx, groups=b"NoSuchGroup")
    with pytest.raises(tls.TLSSetupError):
        tls.restrict(ctx, sigalgs=b"nosuchsig")
    with pytest.raises(tls.TLSSetupError):
        tls.upstream_context(ca_file=str(tmp_path / "missing.pem"))
    with pytest.raises(tls.TLSSetupError):
        tls.upstream_context(client_key=str(tmp_path / "k.pem"))
    with pytest.raises(tls.TLSSetupError):
        tls.upstream_context(client_cert=str(tmp_path / "missing.pem"))
