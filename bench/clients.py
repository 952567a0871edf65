"""The bench's own load clients, for what wrk and h2load cannot do: raw L4 and WebSocket round trips.

Each returns a ``Sample``: the value, the count it was derived from, and errors seen on the client side.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import multiprocessing as mp
import resource
import selectors
import socket
import statistics
import threading
import time
from dataclasses import dataclass, field

from bench import pqtls, ws


@dataclass
class Sample:
    value: float | None  # None: the cell failed
    count: float = 0  # requests, connections, bytes, round trips: what the CPU time is divided by
    errors: int = 0
    detail: dict = field(default_factory=dict)
    error: str = ""


# ---- L4 bulk ------------------------------------------------------------------------------------------------


def l4_bulk(port: int, hello: bytes, conns: int, duration: float) -> Sample:
    """``conns`` clients send a ClientHello, then read as fast as they can for ``duration`` seconds. GB/s."""
    got = [0] * conns
    errors = [0] * conns
    start_gate = threading.Barrier(conns + 1)
    stop_at = [0.0]

    def one(i: int) -> None:
        buf = bytearray(1 << 20)
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError:
            errors[i] += 1
            start_gate.wait()
            return
        with s:
            start_gate.wait()
            try:
                s.sendall(hello)
                while time.perf_counter() < stop_at[0]:
                    n = s.recv_into(buf)
                    if not n:
                        errors[i] += 1  # the stream must not end before we stop reading
                        return
                    got[i] += n
            except OSError:
                errors[i] += 1

    threads = [threading.Thread(target=one, args=(i,)) for i in range(conns)]
    for t in threads:
        t.start()
    stop_at[0] = time.perf_counter() + duration + 60  # provisional: set for real once all are connected
    start_gate.wait()
    t0 = time.perf_counter()
    stop_at[0] = t0 + duration
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    total = sum(got)
    if total == 0:
        return Sample(None, 0, sum(errors), error="no bytes received")
    return Sample(total / elapsed / 1e9, total, sum(errors), {"seconds": elapsed})


# ---- L4 new connections -------------------------------------------------------------------------------------


def _connrate_proc(port: int, hello: bytes, concurrency: int, t_start: float, t_stop: float, out) -> None:
    import uvloop

    ok = err = 0

    async def loop_one() -> None:
        nonlocal ok, err
        loop = asyncio.get_running_loop()
        while time.time() < t_stop:
            s = socket.socket()
            s.setblocking(False)
            try:
                await loop.sock_connect(s, ("127.0.0.1", port))
                await loop.sock_sendall(s, hello)
                first = await asyncio.wait_for(loop.sock_recv(s, 1), 5)
                if first:
                    ok += 1
                else:
                    err += 1
            except (OSError, TimeoutError):
                err += 1
                await asyncio.sleep(0.001)  # a refusing peer must not turn this into a busy loop
            finally:
                s.close()

    async def main() -> None:
        await asyncio.sleep(max(0.0, t_start - time.time()))
        await asyncio.gather(*(loop_one() for _ in range(concurrency)))

    uvloop.run(main())
    out.send((ok, err))


def l4_connrate(port: int, hello: bytes, duration: float, procs: int = 2, concurrency: int = 32) -> Sample:
    """New connections per second: connect, send a ClientHello, read the backend's first byte, close."""
    ctx = mp.get_context("fork")
    t_start = time.time() + 0.3  # let every process get going before the clock starts
    t_stop = t_start + duration
    pipes, workers = [], []
    for _ in range(procs):
        rx, tx = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_connrate_proc, args=(port, hello, concurrency, t_start, t_stop, tx), daemon=True)
        p.start()
        pipes.append(rx)
        workers.append(p)
    ok = err = 0
    for rx, p in zip(pipes, workers, strict=True):
        if rx.poll(duration + 30):
            a, b = rx.recv()
            ok, err = ok + a, err + b
        else:
            err += 1
        p.join(5)
    if ok == 0:
        return Sample(None, 0, err, error=f"no connection got its first byte ({err} errors)")
    return Sample(ok / duration, ok, err)


# ---- L7 resumed handshakes ---------------------------------------------------------------------------------


RESUMED_REQUEST = "GET / HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n"


def ticket_sessions(port: int, sni: str, n: int) -> tuple:
    """``n`` full PQ handshakes, each with one GET read to its end: (the client context, the TLS 1.3 sessions
    their tickets gave). pyOpenSSL resumes a session only on the context that made it; forked client
    processes inherit both.

    Made before the measurement's CPU window opens (the runner calls this when it builds the cell's
    function), so that inside it every connection is expected to resume."""
    from OpenSSL import SSL

    ctx = pqtls.resuming_client_context()
    out = []
    for _ in range(n):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            conn = pqtls.client(s, sni, ctx, timeout=5)
            conn.sendall(RESUMED_REQUEST.format(sni=sni).encode())
            with contextlib.suppress(Exception):  # to the server's close: the tickets came before the response
                while conn.recv(65536):
                    pass
            conn.set_shutdown(SSL.SENT_SHUTDOWN | SSL.RECEIVED_SHUTDOWN)  # see _resumed_loops' finish()
            sess = conn.get_session()
            if sess is None:
                raise ConnectionError("no TLS session")
            out.append(sess)  # one without a ticket shows as full handshakes, counted as errors
    return ctx, out


def _resumed_proc(port: int, sni: str, tickets: tuple, body: bytes, t_start: float, t_stop: float, out) -> None:
    try:
        out.send(_resumed_loops(port, sni, tickets, body, t_start, t_stop))
    except Exception as exc:  # said in the cell, not lost with the process
        out.send(({"failed": 1}, time.time(), f"{type(exc).__name__}: {exc}"[:160]))


def _resumed_loops(port: int, sni: str, tickets: tuple, body: bytes, t_start: float, t_stop: float) -> tuple:
    """One client process: ``len(sessions)`` connection loops multiplexed on one selector. Each loop connects,
    offers its session (SNI, X25519MLKEM768 only, TLS 1.3: psk_dhe_ke), sends one GET with
    ``Connection: close``, reads the response to the server's close, keeps the fresh ticket the server sent
    for the next connection, and starts again until ``t_stop``; loops in flight then finish and count."""
    from OpenSSL import SSL

    ctx, sessions = tickets
    request = RESUMED_REQUEST.format(sni=sni).encode()
    sel = selectors.DefaultSelector()
    counts = {"resumed": 0, "full": 0, "status": 0, "failed": 0, "other_body": 0}
    state: dict = {}  # fd -> [slot, sock, conn, phase, buffer]
    slots = list(sessions)

    def start(slot: int) -> None:
        s = socket.socket()
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rc = s.connect_ex(("127.0.0.1", port))
        if rc not in (0, errno.EINPROGRESS):
            counts["failed"] += 1
            s.close()
            return
        c = SSL.Connection(ctx, s)
        c.set_tlsext_host_name(sni.encode())
        c.set_session(slots[slot])
        c.set_connect_state()
        state[s.fileno()] = [slot, s, c, "connect", bytearray()]
        sel.register(s, selectors.EVENT_WRITE)

    def finish(fd: int, ok: bool) -> None:
        slot, s, c, _phase, buf = state.pop(fd)
        sel.unregister(s)
        s.close()
        if ok:
            # as s_time does: without SENT_SHUTDOWN, freeing the connection marks its session not resumable
            # (OpenSSL's ssl_clear_bad_session); no close_notify is sent, the server has closed already
            c.set_shutdown(SSL.SENT_SHUTDOWN | SSL.RECEIVED_SHUTDOWN)
        if not ok:
            counts["failed"] += 1
        elif not SSL._lib.SSL_session_reused(c._ssl):  # pyOpenSSL has no wrapper for it
            counts["full"] += 1
        elif not buf.startswith(b"HTTP/1.1 200"):
            counts["status"] += 1
        elif not buf.endswith(body):  # the backend's body: the peer proxied, it did not answer itself
            counts["other_body"] += 1
        else:
            counts["resumed"] += 1
        sess = c.get_session()  # this connection's fresh ticket (or, without one, the session it resumed)
        if sess is not None:
            slots[slot] = sess
        if time.time() < t_stop:
            start(slot)

    def step(fd: int) -> None:
        _slot, s, c, phase, buf = st = state[fd]
        try:
            if phase == "connect":
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    raise ConnectionError("connect failed")
                st[3] = phase = "handshake"
            if phase == "handshake":
                c.do_handshake()
                c.sendall(request)
                st[3] = phase = "response"
            while True:  # to the server's close (Connection: close), decrypted records included
                data = c.recv(65536)
                if not data:
                    break
                buf += data
            finish(fd, True)
            return
        except SSL.WantReadError:
            sel.modify(s, selectors.EVENT_READ)
        except SSL.WantWriteError:
            sel.modify(s, selectors.EVENT_WRITE)
        except SSL.ZeroReturnError:  # the server's close_notify
            finish(fd, True)
        except SSL.SysCallError as exc:  # a close without close_notify ends the response too, if it is whole
            finish(fd, phase == "response" and exc.args[0] in (-1, 0) and bool(buf))
        except Exception:
            finish(fd, False)

    time.sleep(max(0.0, t_start - time.time()))
    for slot in range(len(slots)):
        start(slot)
    hard_stop = t_stop + 10
    while state and time.time() < hard_stop:
        for key, _ in sel.select(1.0):
            if key.fd in state:
                step(key.fd)
    counts["failed"] += len(state)  # stragglers past the hard stop
    sel.close()
    return counts, time.time(), ""


def resumed_handshakes(port: int, sni: str, tickets: tuple, body: bytes, duration: float, procs: int = 2) -> Sample:
    """Resumed PQ handshakes/s: ``procs`` processes share ``tickets`` (``ticket_sessions``: one connection
    loop per session), every
    connection resuming a ticket and making one proxied GET. Only resumed connections with the backend's
    200 and body count; a full handshake, another status or body, or a failure is an error."""
    ctx = mp.get_context("fork")
    t_start = time.time() + 0.3  # let every process get going before the clock starts
    t_stop = t_start + duration
    pipes, workers = [], []
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    for i in range(procs):
        rx, tx = ctx.Pipe(duplex=False)
        share = (tickets[0], tickets[1][i::procs])
        p = ctx.Process(target=_resumed_proc, args=(port, sni, share, body, t_start, t_stop, tx), daemon=True)
        p.start()
        pipes.append(rx)
        workers.append(p)
    total: dict = {}
    ended = t_stop
    why = ""
    for rx, p in zip(pipes, workers, strict=True):
        if rx.poll(duration + 30):
            counts, end, failure = rx.recv()
            ended = max(ended, end)
            why = why or failure
            for k, v in counts.items():
                total[k] = total.get(k, 0) + v
        else:
            total["failed"] = total.get("failed", 0) + 1
        p.join(5)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the joined client processes: not charged to the peer
    client_cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    good = total.get("resumed", 0)
    errors = sum(v for k, v in total.items() if k != "resumed")
    if good == 0:
        return Sample(None, 0, errors, error=why or f"nothing resumed and proxied: {total}")
    detail = {**total, "seconds": ended - t_start, "client_cpu_ms_per_hs": client_cpu / good * 1e3}
    return Sample(good / (ended - t_start), good, errors, detail)


# ---- WebSocket ---------------------------------------------------------------------------------------------


def ws_echo(port: int, sni: str, tls: bool, duration: float, warmup: int = 500, size: int = 32) -> Sample:
    """Closed loop over one connection: send a ``size``-byte message, wait for its echo, repeat.

    Value: median round trip in microseconds; p99 in the detail."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stream: ws.Stream = pqtls.client(sock, sni) if tls else sock
        reader = ws.Reader(stream)
        ws.client_handshake(stream, reader, sni)
        payload = b"x" * size
        for _ in range(warmup):  # warm both ends (and the proxy's buffers) before the clock
            stream.sendall(ws.frame(ws.OP_BINARY, payload, masked=True))
            ws.read_frame(reader)
        rtts: list[float] = []
        end = time.perf_counter() + duration
        while (t0 := time.perf_counter()) < end:
            stream.sendall(ws.frame(ws.OP_BINARY, payload, masked=True))
            _op, echo = ws.read_frame(reader)
            rtts.append(time.perf_counter() - t0)
            if echo != payload:
                raise ConnectionError("echo differs")
        with contextlib.suppress(Exception):
            stream.sendall(ws.frame(ws.OP_CLOSE, b"\x03\xe8", masked=True))
        sock.close()
    except Exception as exc:
        return Sample(None, 0, 1, error=f"{type(exc).__name__}: {exc}"[:120])
    rtts.sort()
    q = statistics.quantiles(rtts, n=1000)
    return Sample(
        statistics.median(rtts) * 1e6,
        len(rtts) + warmup,  # the CPU window covers the warm-up round trips too
        0,
        {"p99_us": q[989] * 1e6, "p999_us": q[998] * 1e6, "per_s": len(rtts) / duration},
    )


# ---- idle connections (memory) -----------------------------------------------------------------------------


def hold_l4(port: int, hello: bytes, n: int) -> tuple[list[socket.socket], int]:
    """``n`` connections that each sent a ClientHello and then stay silent. Returns (sockets, errors)."""
    socks, errors = [], 0
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(hello)
            socks.append(s)
        except OSError:
            errors += 1
    return socks, errors


def hold_l7(
    port: int, sni: str, n: int, window: int = 128, timeout: float = 120.0, h2: bool = False
) -> tuple[list, int]:
    """``n`` PQ TLS connections that each made one keep-alive GET and then stay idle.

    Non-blocking and multiplexed (``window`` handshakes in flight): 10,000 sequential handshakes would take
    the client longer than the server. Every one is a full handshake: resumed connections hold different
    state in some peers, and how many a peer resumes varies. With ``h2`` the connection offers only ALPN ``h2``
    and makes its GET as stream 1 (python-hyper's client, which ACKs the server's SETTINGS as a browser does);
    it is held once that stream has ended. Returns (connections, errors)."""
    from OpenSSL import SSL

    ctx = pqtls.client_context([b"h2"] if h2 else [b"http/1.1"])
    request = f"GET / HTTP/1.1\r\nHost: {sni}\r\n\r\n".encode()
    sel = selectors.DefaultSelector()
    held: list = []
    errors = 0
    started = 0
    state: dict = {}  # fd -> [sock, conn, phase, buffer]

    def start_one() -> None:
        nonlocal started, errors
        started += 1
        s = socket.socket()
        s.setblocking(False)
        rc = s.connect_ex(("127.0.0.1", port))
        if rc not in (0, errno.EINPROGRESS):
            errors += 1
            s.close()
            return
        c = SSL.Connection(ctx, s)
        c.set_tlsext_host_name(sni.encode())
        c.set_connect_state()
        state[s.fileno()] = [s, c, "connect", _H2Get(sni) if h2 else bytearray()]
        sel.register(s, selectors.EVENT_WRITE)

    def step(fd: int) -> None:
        nonlocal errors
        s, c, phase, buf = st = state[fd]
        try:
            if phase == "connect":
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    raise ConnectionError("connect failed")
                st[2] = phase = "handshake"
            if phase == "handshake":
                c.do_handshake()
                if h2 and c.get_alpn_proto_negotiated() != b"h2":
                    raise ConnectionError(f"ALPN {c.get_alpn_proto_negotiated()!r}, not h2")
                c.sendall(buf.start() if h2 else request)
                st[2] = phase = "response"
            if phase == "response" and h2:
                data = c.recv(65536)
                while c.pending():  # records already decrypted: the socket will not wake us for them
                    data += c.recv(65536)
                done, out = buf.feed(data)
                if out:
                    c.sendall(out)
                if done:
                    sel.unregister(s)
                    del state[fd]
                    held.append((s, c))
                    return
            elif phase == "response":
                buf += c.recv(65536)
                head, sep, body = bytes(buf).partition(b"\r\n\r\n")
                if sep:
                    if not head.startswith(b"HTTP/1.1 200"):
                        raise ConnectionError(head.split(b"\r\n", 1)[0].decode(errors="replace"))
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        k, _, v = line.partition(b":")
                        if k.strip().lower() == b"content-length":
                            length = int(v)
                    if len(body) >= length:
                        sel.unregister(s)
                        del state[fd]
                        held.append((s, c))
                        return
            sel.modify(s, selectors.EVENT_READ)
        except SSL.WantReadError:
            sel.modify(s, selectors.EVENT_READ)
        except SSL.WantWriteError:
            sel.modify(s, selectors.EVENT_WRITE)
        except Exception:
            errors += 1
            with contextlib.suppress(KeyError, ValueError):
                sel.unregister(s)
            state.pop(fd, None)
            s.close()

    deadline = time.monotonic() + timeout
    while (started < n or state) and time.monotonic() < deadline:
        while started < n and len(state) < window:
            start_one()
        for key, _ in sel.select(1.0):
            step(key.fd)
    for s, _c, _p, _b in state.values():  # stragglers past the deadline
        errors += 1
        s.close()
    sel.close()
    return held, errors


class _H2Get:
    """One HTTP/2 GET on stream 1 of a client connection: the bytes to send, then whether it has ended."""

    def __init__(self, sni: str) -> None:
        import h2.config
        import h2.connection

        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.sni = sni

    def start(self) -> bytes:
        self.conn.initiate_connection()
        headers = [(":method", "GET"), (":scheme", "https"), (":authority", self.sni), (":path", "/")]
        self.conn.send_headers(1, headers, end_stream=True)
        return self.conn.data_to_send()

    def feed(self, data: bytes) -> tuple[bool, bytes]:
        """(stream 1 ended with a 200, bytes to send back: SETTINGS ACK, WINDOW_UPDATE)"""
        import h2.events

        if not data:
            raise ConnectionError("closed before the response ended")
        ended = False
        for ev in self.conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived) and dict(ev.headers).get(b":status") != b"200":
                raise ConnectionError(f"status {dict(ev.headers).get(b':status')!r}")
            if isinstance(ev, h2.events.DataReceived):
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            if isinstance(ev, (h2.events.StreamReset, h2.events.ConnectionTerminated)):
                raise ConnectionError(type(ev).__name__)
            ended = ended or isinstance(ev, h2.events.StreamEnded)
        return ended, self.conn.data_to_send()


def close_all(held: list) -> None:
    for item in held:
        s = item[0] if isinstance(item, tuple) else item
        with contextlib.suppress(OSError):
            s.close()
