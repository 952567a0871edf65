"""L4 bulk throughput through the proxy's SNI routing, as a ratio of the direct path.

    .venv/bin/python -m bench.l4 [--gib 1] [--workers 2]

A backend streams bytes to each client after reading its ClientHello; clients read them as fast as they can,
once straight from the backend and once through the proxy (1 and 32 connections). Client, proxy and backend
share this machine's cores, so the proxy's CPU seconds per GB (its workers' utime + stime, from /proc) are
printed beside the rates. A number to improve, not a test.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import threading
import time

from tests.hellos import pq_hello
from tests.peers import Fleet

CHUNK = bytes(1 << 20)
HELLO = pq_hello("bench.test")


def _backend(listener: socket.socket, per_conn: int) -> None:
    def serve(conn: socket.socket) -> None:
        got = 0
        while got < len(HELLO):
            data = conn.recv(65536)
            if not data:
                return
            got += len(data)
        left = per_conn
        while left > 0:
            n = conn.send(memoryview(CHUNK)[: min(left, len(CHUNK))])
            left -= n
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)
        conn.close()

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def _client(port: int, per_conn: int, out: list[float]) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(HELLO)
    buf = bytearray(1 << 20)
    got = 0
    while True:
        n = s.recv_into(buf)
        if not n:
            break
        got += n
    s.close()
    assert got == per_conn, (got, per_conn)
    out.append(got)


def run(port: int, conns: int, per_conn: int) -> float:
    out: list[float] = []
    threads = [threading.Thread(target=_client, args=(port, per_conn, out)) for _ in range(conns)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    assert len(out) == conns, "a connection failed"
    return elapsed


def cpu_seconds(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0, help="bytes per run, in GiB")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    total = int(args.gib * (1 << 30))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)
    rows = []
    workdir = tempfile.mkdtemp(prefix="sentin8-bench-")
    for conns in (1, 32):
        per_conn = total // conns
        backend = mp.get_context("fork").Process(target=_backend, args=(listener, per_conn), daemon=True)
        backend.start()
        fleet = Fleet(
            workdir,
            f"""
[[instances]]
service = "bench"
id = "bench-1"
host = "127.0.0.1"
port = {listener.getsockname()[1]}
[[domains]]
hostname = "bench.test"
service = "bench"
""",
            workers=args.workers,
        )
        try:
            direct = run(listener.getsockname()[1], conns, per_conn)
            pids = list(fleet.workers())
            cpu0 = cpu_seconds(pids)
            proxied = run(fleet.port, conns, per_conn)
            cpu = cpu_seconds(pids) - cpu0
        finally:
            fleet.stop()
            backend.terminate()
        gb = total / 1e9
        rows.append((conns, gb / direct, gb / proxied, cpu / gb))
    print(f"L4 bulk throughput, {os.cpu_count()} CPUs, {args.workers} workers, {args.gib:g} GiB per run")
    print(f"{'conns':>5} {'direct GB/s':>12} {'proxied GB/s':>13} {'ratio':>6} {'proxy CPU-s/GB':>15}")
    for conns, d, p, c in rows:
        print(f"{conns:>5} {d:>12.2f} {p:>13.2f} {p / d:>6.2f} {c:>15.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
