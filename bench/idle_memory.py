"""KiB per idle keep-alive L7 connection of one sentin8 worker, without the rest of the bench's peers.

    .venv/bin/python -m bench.idle_memory [--connections 200] [--repeat 3] [--h2]

A fresh one-worker fleet (``sentin8-proxy run``, loopback counted as external) in front of a plain HTTP backend;
one PQ TLS (X25519MLKEM768) connection makes a request and closes (the worker has served once), then
``--connections`` PQ TLS keep-alive connections each make one GET and stay open. The figure is the worker's RSS
after minus before, over the connections held. Each repeat is a fresh fleet (an allocator keeps what a
previous round grew). Same method as the full bench's "Memory, idle keep-alive L7 conns" row; with ``--h2``
each connection offers only ALPN h2 and makes its GET on stream 1 (tests/h2client.py), as the "Memory, idle h2
conns" row.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.h2client import H2Client  # noqa: E402
from tests.peers import Fleet, HTTPBackend  # noqa: E402 - the way the tests start the real fleet
from tests.pqclient import PQClient  # noqa: E402

HOST = "idle.bench.test"
GET = f"GET / HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()


def _connect(port: int) -> PQClient:
    c = PQClient(socket.create_connection(("127.0.0.1", port), timeout=10), HOST)
    c.handshake()
    resp = c.request(GET)
    assert resp.startswith(b"HTTP/1.1 200"), resp[:80]
    return c


def _connect_h2(port: int) -> H2Client:
    c = H2Client(socket.create_connection(("127.0.0.1", port), timeout=10), HOST, window=65535)
    resp = c.get(b"/")
    assert resp.status == 200, resp
    return c


def one_round(backend_port: int, n: int, h2: bool = False) -> tuple[float, float, float]:
    """(KiB per connection, worker RSS idle MiB, with the connections MiB) on a fresh fleet."""
    with tempfile.TemporaryDirectory() as tmp:
        body = (
            f'[[instances]]\nservice = "web"\nid = "web-1"\nhost = "127.0.0.1"\nport = {backend_port}\n'
            f'[[domains]]\nhostname = "{HOST}"\nservice = "web"\n'
        )
        fleet = Fleet(tmp, body, workers=1, extra='[network]\ninternal_cidrs = ["10.0.0.0/8"]\n', nofile=4096)
        try:
            (pid,) = fleet.workers()
            worker = psutil.Process(pid)
            connect = _connect_h2 if h2 else _connect
            first = connect(fleet.port)
            first.close()
            time.sleep(1.0)  # let the first connection's teardown settle (a measurement, not a test)
            idle = worker.memory_info().rss
            held = [connect(fleet.port) for _ in range(n)]
            time.sleep(0.5)
            loaded = worker.memory_info().rss
            for c in held:
                c.close()
        finally:
            fleet.stop()
    return (loaded - idle) / n / 1024, idle / 2**20, loaded / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--h2", action="store_true", help="HTTP/2 connections (ALPN h2) instead of HTTP/1.1")
    args = ap.parse_args()
    backend = HTTPBackend("web")
    try:
        rounds = []
        for _ in range(args.repeat):
            kib, idle, loaded = one_round(backend.port, args.connections, args.h2)
            rounds.append(kib)
            print(f"{kib:.1f} KiB/conn ({idle:.1f} → {loaded:.1f} MiB, {args.connections} connections)")
        kind = "h2" if args.h2 else "keep-alive L7"
        print(f"median {statistics.median(rounds):.1f} KiB per idle {kind} connection")
    finally:
        backend.close()


if __name__ == "__main__":
    main()
