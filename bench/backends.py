"""The bench's Python backends, each a forked process pinned to the backend CPU.

- ``bulk``: after the client's ClientHello, streams zeros until the client goes away (L4 throughput).
- ``first_byte``: after the ClientHello, answers one byte (L4 new connections: peek, route, connect, reply).
- ``sink``: accepts, reads and discards, holds the connection; counts open ones (L4 memory).
- ``ws_echo``: a WebSocket echo server, plain or terminating PQ TLS itself (WebSocket round trips).

The proxies only peek the ClientHello and pipe bytes, so the bulk, first-byte and sink backends never answer
with TLS: what the client receives is whatever the backend sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

from bench import ws
from bench.procs import pin

ZEROS = bytes(1 << 20)


def listener(backlog: int = 4096) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(backlog)
    return s


def _read_hello(conn: socket.socket, want: int) -> bool:
    got = 0
    while got < want:
        data = conn.recv(65536)
        if not data:
            return False
        got += len(data)
    return True


def _bulk(sock: socket.socket, hello_len: int) -> None:
    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            if not _read_hello(conn, hello_len):
                return
            view = memoryview(ZEROS)
            while True:
                conn.send(view)

    while True:
        conn, _ = sock.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def first_byte(sock: socket.socket, hello_len: int) -> None:
    import uvloop

    class Reply(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.got = 0

        def data_received(self, data: bytes) -> None:
            # answer once the whole hello is in, so no unread bytes turn our close into a reset
            before, self.got = self.got, self.got + len(data)
            if before < hello_len <= self.got:
                self.transport.write(b"x")

        def eof_received(self) -> bool:
            return False  # close our side too

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Reply, sock=sock, backlog=4096)
        await server.serve_forever()

    uvloop.run(main())


def _sink(sock: socket.socket, hello_len: int, count) -> None:
    import uvloop

    class Sink(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            with count.get_lock():
                count.value += 1

        def data_received(self, data: bytes) -> None:
            pass

        def connection_lost(self, exc: Exception | None) -> None:
            with count.get_lock():
                count.value -= 1

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Sink, sock=sock, backlog=4096)
        await server.serve_forever()

    uvloop.run(main())


def _ws_echo(sock: socket.socket, cert: str | None, key: str | None) -> None:
    ctx = None
    if cert and key:
        from OpenSSL import SSL

        from bench.pqtls import server_context

        ctx = server_context(cert, key)

    def serve(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stream: ws.Stream = conn
        try:
            if ctx is not None:
                tls = SSL.Connection(ctx, conn)
                tls.set_accept_state()
                tls.do_handshake()
                stream = tls
            reader = ws.Reader(stream)
            ws.server_handshake(stream, reader)
            while True:
                op, payload = ws.read_frame(reader)
                if op == ws.OP_CLOSE:
                    stream.sendall(ws.frame(ws.OP_CLOSE, payload[:2], masked=False))
                    return
                stream.sendall(ws.frame(op, payload, masked=False))
        except Exception:  # a client that goes away mid-frame is normal at the end of a run
            pass
        finally:
            conn.close()

    while True:
        conn, _ = sock.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


@dataclass
class Backend:
    name: str
    port: int
    proc: mp.Process
    count: object = None  # mp.Value of open connections (sink only)

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)
        if self.proc.is_alive():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.join()


def _run_pinned(cpu: int, target: Callable, *args) -> None:
    pin({cpu})
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    target(*args)


def start(name: str, cpu: int, hello_len: int = 0, cert: str | None = None, key: str | None = None) -> Backend:
    ctx = mp.get_context("fork")
    sock = listener()
    port = sock.getsockname()[1]
    count = None
    if name == "bulk":
        args: tuple = (_bulk, sock, hello_len)
    elif name == "first_byte":
        args = (first_byte, sock, hello_len)
    elif name == "sink":
        count = ctx.Value("q", 0)
        args = (_sink, sock, hello_len, count)
    elif name in ("ws_plain", "ws_tls"):
        args = (_ws_echo, sock, cert, key) if name == "ws_tls" else (_ws_echo, sock, None, None)
    else:
        raise ValueError(name)
    proc = ctx.Process(target=_run_pinned, args=(cpu, *args), daemon=True, name=f"bench-{name}")
    proc.start()
    sock.close()  # the child holds it
    return Backend(name, port, proc, count)
