"""The proxy's own cost of one new L4 connection, in process: accept, peek, route, connect, pipe, close.

    .venv/bin/python -m bench.profile.l4 [--connections 3000] [--rounds 5]
    valgrind --tool=callgrind --trace-children=no --callgrind-out-file=F .venv/bin/python -m bench.profile.l4 \\
        --connections N --rounds 1          # N = 1000 and 3000: the difference / 2000 is per connection

The worker's own ``Door`` (``workers/door.py``) over the worker's backend selection on a fresh ``SharedState``
(the routing snapshot published in it), its ``PollSet``, pipe pool and lingering close, behind a listener with
TCP_DEFER_ACCEPT on loopback (an internal source: the L4 path), and the worker's accept loop (``Acceptor``).
The backend and the client are processes of their own (exec'd: ``valgrind --trace-children=no``
leaves them native), so this process's CPU time is the proxy's alone: the backend answers each connection's
ClientHello with one byte (the bench's ``first_byte``), the client connects, sends a real PQ ClientHello,
reads that byte and closes, one connection at a time (the bench's "L4 new conns" row runs 64 at once).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import time

import uvloop

import sentin8
from bench import backends
from bench.profile.inproc import child, cpu_marks, report
from sentin8 import routing
from sentin8.config import Config
from sentin8.holds import OpenConnections
from sentin8.netclass import Classifier
from sentin8.routing import Instance, Route
from sentin8.shm.state import SharedState
from workers.door import Door
from workers.l4_pipe import PipePool
from workers.listener import HTTPS, Acceptor, bind_reuseport
from workers.poll_set import PollSet
from workers.socket_linger import SocketLinger
from workers.worker import worker_backends

HOST = "rate.bench.test"


class Proxy:
    def __init__(self, backend_port: int) -> None:
        self.loop = loop = uvloop.new_event_loop()
        asyncio.set_event_loop(loop)
        cfg = Config()
        shared = SharedState(cfg, 1)
        instances = [Instance(id="rate-0", service="rate", host="127.0.0.1", port=backend_port)]
        table = routing.build([Route(hostname=HOST, service="rate")], instances, built_at=time.time())
        table.with_service_ids(shared.service_names().assign)
        shared.snapshot_writer().publish(routing.encode(table))
        self.counters = counters = shared.worker_counters(0)
        counters.claim(0)
        self.open = OpenConnections(counters)
        self.door = Door(
            loop,
            cfg,
            counters,
            worker_backends(cfg, shared, counters),
            shared.connection_counts(0),
            PollSet(loop),
            PipePool(),
            SocketLinger(loop),
            self._not_l4,
            0,
            Classifier(cfg.network.internal_cidrs),
        )
        self.listener = bind_reuseport("127.0.0.1:0", "listen.https", defer_accept_s=1)
        self.port = self.listener.getsockname()[1]
        Acceptor(loop, counters, self.open, self.door.enter, self._not_http, 0).watch(self.listener, HTTPS)

    def _not_l4(self, *args: object) -> None:
        raise AssertionError("an L4 profile took the L7 path: is 127.0.0.1 outside network.internal_cidrs?")

    def _not_http(self, *args: object) -> None:
        raise AssertionError("the profile has no :80 listener")

    def measure(self, control: socket.socket) -> list[tuple[float, float]]:
        """CPU times at each of the client's round markers, until it says ``q``."""
        return cpu_marks(self.loop, control)


def _hello() -> bytes:
    from tests.hellos import pq_hello  # real ClientHello bytes from a real PQ TLS stack

    return pq_hello(HOST)


def run_client(port: int, control: socket.socket, connections: int, rounds: int) -> None:
    hello = _hello()

    def one() -> None:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(hello)
            if s.recv(1) != b"x":
                raise AssertionError("no first byte from the backend through the proxy")

    for _ in range(500):  # warm-up: caches, the allocator, the pipe pool
        one()
    for _ in range(rounds):
        control.sendall(b"s")
        for _ in range(connections):
            one()
        control.sendall(b"e")
    control.sendall(b"q")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--connections", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--role", default="proxy", help=argparse.SUPPRESS)
    ap.add_argument("--fd", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role == "backend":
        backends.first_byte(socket.socket(fileno=a.fd), len(_hello()))
        return 0
    if a.role == "client":
        run_client(int(a.rest[0]), socket.socket(fileno=a.fd), a.connections, a.rounds)
        return 0
    srv = socket.create_server(("127.0.0.1", 0), backlog=4096)
    backend_proc = child("bench.profile.l4", "backend", srv.fileno())
    proxy = Proxy(srv.getsockname()[1])
    srv.close()
    mine, theirs = socket.socketpair()
    client_proc = child(
        "bench.profile.l4", "client", theirs.fileno(), "--connections", a.connections, "--rounds", a.rounds, proxy.port
    )
    theirs.close()
    marks = proxy.measure(mine)
    client_proc.wait()
    backend_proc.kill()
    backend_proc.wait()
    report(sentin8.BUILD, "L4 new connection", "connection", marks, a.connections, a.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
