"""The proxy's own CPU for one keep-alive GET, in one process: pure Python against the compiled build.

    .venv/bin/python -m bench.profile.keepalive [--requests 20000] [--rounds 5] [--plain | --h2 M [--pool N]]
    .venv/bin/python -m bench.profile.keepalive --connections full|resumed --requests 300   # per connection
    .venv/bin/python -m bench.profile.keepalive --connections resumed --door ...   # + accept, peek, door
    SENTIN8_PURE=1 .venv/bin/python -m bench.profile.keepalive ...      the same, on the .py files

The worker's path of a request, on loopback sockets: the PQ TLS layer (``workers.tls_layer``, ML-DSA-65 and
X25519MLKEM768; ``--plain``: the h1 bridge on plain TCP; ``--h2 M``: the h2 bridge on plain TCP, prior knowledge,
``M`` concurrent streams as ``h2load -m M``; ``--door``: connections enter as in a worker, through its accept
loop, the ClientHello peek, the ``Door`` and ``TLSEntry``, not ``loop.create_server``), the h1 bridge, admission,
the exchange and its relay, the pooled upstream connection, and the worker's own ``L7Context``
(``worker_context``: backend selection over shared suspect marks and breakers, the edge policy, the per-request
accounting into real ``WorkerCounters``). The proxy runs alone in this process on uvloop; the client (pyOpenSSL
on a blocking socket, one connection, sequential GETs) and the backend (a blocking socket answering a fixed 200)
are forked children, so the figure is the proxy process's CPU time per request (user + system: the kernel time of
its sends and receives included; the same syscalls in both builds). No peers, no root.
Prints the build, then the median and the best CPU-µs per request over ``--rounds``, and the user-space
part alone (the kernel's loopback work, done in the sender's context, is most of the rest and most of the
noise on a shared machine; ``valgrind --tool=callgrind --trace-children=no`` on this command counts the
user-space instructions, docs/compiled.md). A load test, never a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import uvloop
from cryptography.hazmat.primitives import serialization
from OpenSSL import SSL

import sentin8
from bench import pqtls
from bench.profile.inproc import child as inproc_child
from bench.profile.inproc import cpu_marks, report
from sentin8 import certpair, routing, tls, tls_connection
from sentin8.certpair import FULLCHAIN, PRIVKEY
from sentin8.certstore import CertStore
from sentin8.config import Config, Limits, Network, Upstream
from sentin8.holds import OpenConnections
from sentin8.http.h2_engine import ClientConnection
from sentin8.netclass import Classifier
from sentin8.routing import Instance, Route
from sentin8.session_tickets import TicketSealer
from sentin8.shm.state import SharedState
from workers.door import Door
from workers.l4_pipe import PipePool
from workers.l7 import L7Bridge
from workers.l7.h2.connection import H2Bridge
from workers.l7_context import WorkerL7Context
from workers.listener import HTTPS, Acceptor, bind_reuseport
from workers.poll_set import PollSet
from workers.socket_linger import SocketLinger
from workers.timer_queue import TimerQueue
from workers.tls_entry import Bridges, TLSEntry
from workers.tls_layer import TLSServerProtocol
from workers.worker import worker_backends, worker_policy

HOST = "bench.test"
BODY = b"x" * 612  # nginx's default index page size
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Type: text/html\r\nContent-Length: %d\r\n"
    b"Connection: keep-alive\r\nAccept-Ranges: bytes\r\n\r\n%s" % (len(BODY), BODY)
)
REQUEST = b"GET / HTTP/1.1\r\nHost: %s\r\nUser-Agent: wrk/4.2\r\nAccept: */*\r\n\r\n" % HOST.encode()


def worker_context(
    loop: asyncio.AbstractEventLoop,
    backend_port: int,
    concurrency: int = 1,
    pool: int = 0,
    shared: SharedState | None = None,
) -> WorkerL7Context:
    """The ``L7Context`` a worker gives its bridges, built as a worker builds it (``workers.worker``): the
    routing snapshot published in a fresh ``SharedState``, backend selection over its suspect marks and
    circuit breakers, the edge policy over its rate-limit buckets, and the per-request accounting into real
    ``WorkerCounters``. Everything but the worker's sockets: a request pays here what it pays in a worker."""
    # by default as many idle upstream connections as requests in flight: every request takes a warm one, as in
    # the side-by-side bench at -m10 (its pool, 128 per worker, holds h2load -m10's 80 streams per worker);
    # ``pool`` below the concurrency makes requests connect anew, as -m100's 800 streams per worker do
    idle = pool or max(8, concurrency)
    cfg = Config(limits=Limits(), upstream=Upstream(pool_max_idle_per_instance=idle))
    shared = shared or SharedState(cfg, 1)
    instances = [Instance(id="web-0", service="web", host="127.0.0.1", port=backend_port)]
    table = routing.build([Route(hostname=HOST, service="web")], instances, built_at=time.time())
    table.with_service_ids(shared.service_names().assign)
    shared.snapshot_writer().publish(routing.encode(table))
    counters = shared.worker_counters(0)
    counters.claim(0)
    policy, policy_values = worker_policy(cfg, shared)
    return WorkerL7Context(cfg, loop, counters, worker_backends(cfg, shared, counters), policy, policy_values)


def serve_backend(srv: socket.socket) -> None:
    """A keep-alive backend (a child process, a thread per connection): one fixed response per request head."""

    def serve(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        while True:
            data = conn.recv(65536)
            if not data:
                return
            buf += data
            while b"\r\n\r\n" in buf:
                _, buf = buf.split(b"\r\n\r\n", 1)
                conn.sendall(RESPONSE)

    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def _pem_pair() -> tuple[bytes, bytes]:
    """A self-signed ML-DSA-65 certificate for ``HOST`` and its key, PEM."""
    now = time.time()
    # 90 days: the certificate store warns (cert_expiring, on stderr) about one that ends within 7
    cert, key = certpair.self_signed_mldsa65([HOST], now - 60, now + 90 * 86400)
    pkcs8 = serialization.PrivateFormat.PKCS8
    key_pem = key.private_bytes(serialization.Encoding.PEM, pkcs8, serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def worker_front(shared: SharedState, work: Path) -> tls.SNIContexts:
    """The TLS front a worker builds (``workers.worker``): the certificate chosen per SNI from a ``CertStore``
    holding one for ``HOST``, the session tickets sealed with the fleet's keys from ``shared``. A new connection
    pays here what it pays in a worker: the servername and ticket callbacks included."""
    cert_pem, key_pem = _pem_pair()
    cdir = work / "certs" / HOST
    cdir.mkdir(parents=True)
    (cdir / FULLCHAIN).write_bytes(cert_pem)
    (cdir / PRIVKEY).write_bytes(key_pem)
    store = CertStore(work / "certs", work / "state")
    return tls.SNIContexts(store, tickets=TicketSealer(shared.ticket_keys()))


class Proxy:
    """The proxy in this process's main thread; the backend and the client are child processes, so this
    process's CPU time (``time.process_time``, user + system) is the proxy's alone."""

    def __init__(self, plain: bool, backend_port: int, h2: int = 0, pool: int = 0, door: bool = False) -> None:
        self.loop = uvloop.new_event_loop()
        asyncio.set_event_loop(self.loop)
        cfg = Config()
        shared = SharedState(cfg, 1)
        self.ctx = worker_context(self.loop, backend_port, concurrency=h2, pool=pool, shared=shared)
        self.work = Path(tempfile.mkdtemp(prefix="sentin8-profile-"))
        self.sni = None if plain else worker_front(shared, self.work)
        front = None if self.sni is None else self.sni.front
        if door:
            assert front is not None, "--door takes TLS connections"
            self.port = self._door(shared, front)
            return
        timers = TimerQueue(self.loop)  # the handshakes' deadlines on one loop timer, as workers.tls_entry has them

        def factory() -> asyncio.Protocol:
            if h2:  # prior knowledge on plain TCP: the h2 bridge's own cost (the worker serves h2 by ALPN only)
                return H2Bridge(self.ctx, self.loop, None, "https")  # type: ignore[arg-type]
            if front is None:
                return L7Bridge(self.ctx, self.loop, None, "http")
            return TLSServerProtocol(
                front, lambda: L7Bridge(self.ctx, self.loop, None, "https"), loop=self.loop, timers=timers
            )

        self.server = self.loop.run_until_complete(self.loop.create_server(factory, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]

    def _door(self, shared: SharedState, front: SSL.Context) -> int:
        """The worker's way in (``workers.worker``): its accept loop on a TCP_DEFER_ACCEPT listener, the
        ``Door`` (peek, class, cap; 127.0.0.1 counts as external here) and ``TLSEntry``. Returns the port."""
        cfg = Config(network=Network(internal_cidrs=["10.0.0.0/8"]))
        counters = self.ctx.counters
        entry = TLSEntry(self.loop, counters, self.ctx, front, cfg.limits.handshake_timeout_s, Bridges())
        door = Door(
            self.loop,
            cfg,
            counters,
            worker_backends(cfg, shared, counters),
            shared.connection_counts(0),
            PollSet(self.loop),
            PipePool(),
            SocketLinger(self.loop),
            entry.serve,
            0,
            Classifier(cfg.network.internal_cidrs),
        )
        listener = bind_reuseport("127.0.0.1:0", "listen.https", defer_accept_s=1)
        Acceptor(self.loop, counters, OpenConnections(counters), door.enter, self._no_http, 0).watch(listener, HTTPS)
        return listener.getsockname()[1]

    def _no_http(self, *args: object) -> None:
        raise AssertionError("the profile has no :80 listener")

    def measure(self, control: socket.socket) -> list[tuple[float, float]]:
        """CPU times at each of the client's round markers, until it says ``q``."""
        return cpu_marks(self.loop, control)


def _tcp(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class Client:
    def __init__(self, conn: socket.socket | SSL.Connection) -> None:
        self.conn = conn
        self.buf = b""

    @classmethod
    def connect(cls, port: int, plain: bool) -> Client:
        sock = _tcp(port)
        return cls(sock if plain else pqtls.client(sock, HOST))

    def get(self) -> None:
        self.conn.sendall(REQUEST)
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end >= 0:
                head = self.buf[:end]
                length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
                if len(self.buf) >= end + 4 + length:
                    assert head.startswith(b"HTTP/1.1 200 "), head[:60]
                    self.buf = self.buf[end + 4 + length :]
                    return
            data = self.conn.recv(65536)
            if not data:
                raise EOFError("the proxy closed the connection")
            self.buf += data


class FreshClient:
    """One PQ TLS connection per GET, as ``h2load --h1 -n N -c N`` makes them: connect, handshake (``resumed``:
    offering the ticket of the previous connection, psk_dhe_ke), one keep-alive GET, close_notify, close. The
    figure is then the proxy's CPU per connection: accept, TLS layer, handshake, bridge, one request, teardown."""

    def __init__(self, port: int, resumed: bool) -> None:
        self.port = port
        self.ctx = pqtls.resuming_client_context() if resumed else pqtls.client_context()
        self.resumed = resumed
        self.session: SSL.Session | None = None

    def get(self) -> None:
        sock = _tcp(self.port)
        conn = pqtls.client(sock, HOST, self.ctx, session=self.session)
        if self.session is not None and not tls_connection.session_reused(conn):
            raise AssertionError("the proxy did not resume the session: this would measure full handshakes")
        Client(conn).get()  # the ticket arrives before the response: the session is resumable from here
        if self.resumed:
            self.session = conn.get_session()
        conn.shutdown()
        sock.close()


class H2Client:
    """One h2 connection (prior knowledge, plain TCP), ``streams`` concurrent GETs at a time (h2load -m)."""

    FIELDS = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", HOST.encode()), (b":path", b"/"),
              (b"user-agent", b"h2load/1.64"), (b"accept", b"*/*")]  # fmt: skip

    PER_CONNECTION = 900  # below the proxy's streams-per-connection cap (1000, then GOAWAY): reconnect before

    def __init__(self, port: int, streams: int) -> None:
        self.port = port
        self.streams = streams
        self._connect()

    def _connect(self) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn = ClientConnection()
        self.opened = 0

    def batch(self) -> None:
        if self.opened + self.streams > self.PER_CONNECTION:
            self.sock.close()
            self._connect()
        self.opened += self.streams
        sids = [self.conn.request(self.FIELDS) for _ in range(self.streams)]
        self.sock.sendall(self.conn.data_to_send())
        responses = self.conn.responses
        while not all(responses[sid].done for sid in sids):
            data = self.sock.recv(65536)
            if not data or self.conn.ended is not None:
                raise EOFError(f"the proxy closed the connection ({self.conn.ended})")
            self.conn.receive(data)
            out = self.conn.data_to_send()  # SETTINGS and WINDOW_UPDATE acknowledgements
            if out:
                self.sock.sendall(out)
        for sid in sids:
            r = responses.pop(sid)
            assert r.status == 200 and len(r.body) == len(BODY), (r.status, r.reset)


def run_client(
    port: int, plain: bool, control: socket.socket, requests: int, rounds: int, h2: int = 0, connections: str = ""
) -> None:
    if connections:
        get, per = FreshClient(port, connections == "resumed").get, 1
    elif h2:
        h2c = H2Client(port, h2)
        get, per = h2c.batch, h2  # one call answers ``h2`` requests
    else:
        get, per = Client.connect(port, plain).get, 1
    for _ in range(max(1, 500 // per)):  # warm-up: the pooled upstream connections, caches, the allocator
        get()
    for _ in range(rounds):
        control.sendall(b"s")
        for _ in range(max(1, requests // per)):
            get()
        control.sendall(b"e")
    control.sendall(b"q")


def child(role: str, fd: int, *args: object) -> subprocess.Popen:
    """The backend or the client in a process of its own (``inproc.child``)."""
    return inproc_child("bench.profile.keepalive", role, fd, *args)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--plain", action="store_true", help="plain TCP to the bridge: no TLS layer")
    ap.add_argument(
        "--h2",
        type=int,
        default=0,
        metavar="M",
        help="HTTP/2 (prior knowledge, plain TCP) with M concurrent streams, as h2load -m M",
    )
    ap.add_argument(
        "--pool",
        type=int,
        default=0,
        metavar="N",
        help="idle upstream connections kept (default: as many as requests in flight)",
    )
    ap.add_argument(
        "--connections",
        choices=("full", "resumed"),
        default="",
        help="a new PQ TLS connection per GET (full handshakes, or resuming the previous ticket)",
    )
    ap.add_argument(
        "--door",
        action="store_true",
        help="TLS connections enter through the worker's accept loop, peek and Door (with --connections)",
    )
    ap.add_argument("--role", default="proxy", help=argparse.SUPPRESS)
    ap.add_argument("--fd", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role == "backend":
        serve_backend(socket.socket(fileno=a.fd))
        return 0
    if a.role == "client":
        run_client(int(a.rest[0]), a.plain, socket.socket(fileno=a.fd), a.requests, a.rounds, a.h2, a.connections)
        return 0
    srv = socket.create_server(("127.0.0.1", 0))
    backend_proc = child("backend", srv.fileno())
    if a.h2:
        a.plain = True
        a.requests -= a.requests % a.h2  # whole batches: the figure is per request answered
    proxy = Proxy(a.plain, srv.getsockname()[1], h2=a.h2, pool=a.pool, door=a.door)
    srv.close()
    mine, theirs = socket.socketpair()
    extra = (["--plain"] if a.plain else []) + (["--h2", str(a.h2)] if a.h2 else [])
    extra += ["--connections", a.connections] if a.connections else []
    client_proc = child("client", theirs.fileno(), "--requests", a.requests, "--rounds", a.rounds, *extra, proxy.port)
    theirs.close()
    marks = proxy.measure(mine)
    client_proc.wait()
    backend_proc.kill()
    backend_proc.wait()
    what = f"plain h2 -m{a.h2}" if a.h2 else "plain h1" if a.plain else "PQ TLS h1"
    unit = "keep-alive GET"
    if a.connections:
        what, unit = f"PQ TLS h1, a {a.connections} handshake per GET", "connection"
    report(sentin8.BUILD, what, unit, marks, a.requests, a.rounds)
    shutil.rmtree(proxy.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
