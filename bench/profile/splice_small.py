"""The L4 pipe's two calls for one small transfer, splice against copy, on loopback TCP in one process.

    .venv/bin/python -m bench.profile.splice_small [--transfers 20000] [--size 1500] [--rounds 3]

A message arrives on one connection and is moved to another, as ``workers/l4_pipe.py`` moves a ClientHello
or a backend's first bytes: ``splice`` into a kernel pipe and out of it, or ``recv_into`` a buffer and
``send``. Only the two calls are timed (process CPU time), interleaved by round; the reader of the far end and
the writer of the near end run untimed in between. bench/README.md, "s37", has what it said.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import socket
import time

FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK


def _pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        near = socket.create_connection(srv.getsockname())
        far, _ = srv.accept()
    return near, far


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--transfers", type=int, default=20000)
    ap.add_argument("--size", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    writer, src = _pair()  # writer -> src: what the proxy reads
    dst, reader = _pair()  # dst -> reader: what the proxy writes
    src.setblocking(False)
    dst.setblocking(False)
    r, w = os.pipe2(os.O_NONBLOCK)
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
    buf = bytearray(65536)
    view = memoryview(buf)
    msg = b"x" * args.size

    def splice() -> int:
        n = os.splice(src.fileno(), w, 1 << 20, flags=FLAGS)
        os.splice(r, dst.fileno(), n, flags=FLAGS)
        return n

    def copy() -> int:
        n = src.recv_into(buf)
        dst.send(view[:n])
        return n

    for _ in range(args.rounds):
        for name, move in (("splice", splice), ("copy", copy)):
            spent = 0.0
            for _ in range(args.transfers):
                writer.send(msg)
                while True:  # until the message is in (loopback: at once, nearly always)
                    t0 = time.process_time()
                    try:
                        n = move()
                    except BlockingIOError:
                        continue
                    spent += time.process_time() - t0
                    break
                got = 0
                while got < n:
                    got += len(reader.recv(65536))
            print(f"{name:6s} {args.size} B: {spent / args.transfers * 1e6:.2f} µs per transfer")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
