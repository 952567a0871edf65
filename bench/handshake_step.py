"""The last server step of a full PQ TLS 1.3 handshake, timed in-process with 0, 1 and 2 session tickets.

``python -m bench.handshake_step [--iterations N]``: client and server are pyOpenSSL connections over memory
BIOs in this process (no sockets, no event loop); the server side is what a worker builds (``SNIContexts`` with
the fleet's ticket sealer, so each ticket runs the ctypes ticket callback), the client a PQ client that counts
the NewSessionTicket messages it receives (message callback). Only the server's final ``do_handshake`` (it
reads the client's Finished and writes the tickets) is timed, wall and CPU (``thread_time_ns``); medians.
Each ticket costs a sealing (callback, AES-CBC, HMAC) and a record.
"""

from __future__ import annotations

import argparse
import mmap
import statistics
import tempfile
import time
from pathlib import Path

from OpenSSL import SSL

from sentin8 import session_tickets, tls, tls_connection
from sentin8.certpair import self_signed_mldsa65, write_pair
from sentin8.certstore import CertStore
from sentin8.ticketkeys import TicketKeyRing

SNI = "bench.example.test"
_NEW_SESSION_TICKET = 4
_HANDSHAKE = 22


class TicketCounter:
    """A client context that counts the NewSessionTicket messages its connections receive."""

    def __init__(self) -> None:
        self.tickets = 0
        ctx = SSL.Context(SSL.TLS_METHOD)
        ctx.set_min_proto_version(SSL.TLS1_3_VERSION)
        tls.restrict(ctx, groups=tls.PQ_GROUPS, sigalgs=tls.PQ_SIGALGS)
        ctx.set_session_cache_mode(SSL.SESS_CACHE_CLIENT)
        ffi = SSL._ffi

        @ffi.callback("void(int, int, int, void *, size_t, SSL *, void *)")
        def on_message(write_p: int, _version: int, content_type: int, buf: object, n: int, _s: object, _a: object):
            if not write_p and content_type == _HANDSHAKE and n and ffi.cast("unsigned char *", buf)[0] == 4:
                self.tickets += 1

        self._cb = on_message  # alive as long as the context
        SSL._lib.SSL_CTX_set_msg_callback(ctx._context, on_message)
        self.context = ctx


def _move(src: SSL.Connection, dst: SSL.Connection) -> None:
    while True:
        try:
            data = src.bio_read(65536)
        except SSL.WantReadError:
            return
        dst.bio_write(data)


def _step(conn: SSL.Connection) -> bool:
    try:
        conn.do_handshake()
    except SSL.WantReadError:
        return False
    return True


def one_handshake(
    front: SSL.Context, client: TicketCounter, session: SSL.Session | None = None
) -> tuple[int, int, SSL.Connection]:
    """(wall ns, CPU ns) of the server's final step; the client connection after it took the tickets."""
    s = SSL.Connection(front, None)
    s.set_accept_state()
    c = SSL.Connection(client.context, None)
    c.set_connect_state()
    c.set_tlsext_host_name(SNI.encode())
    if session is not None:
        c.set_session(session)
    _step(c)  # ClientHello
    _move(c, s)
    assert not _step(s)  # ServerHello … Finished
    _move(s, c)
    assert _step(c)  # the client is done and sends its Finished
    _move(c, s)
    w0, t0 = time.perf_counter_ns(), time.thread_time_ns()
    done = _step(s)
    t1, w1 = time.thread_time_ns(), time.perf_counter_ns()
    assert done
    _move(s, c)
    try:
        c.recv(1)  # processes the tickets
    except SSL.WantReadError:
        pass
    return w1 - w0, t1 - t0, c


def measure(front: SSL.Context, iterations: int) -> dict[str, float]:
    client = TicketCounter()
    walls, cpus = [], []
    for _ in range(iterations // 10):  # warm-up
        one_handshake(front, client)
    client.tickets = 0
    for _ in range(iterations):
        wall, cpu, _c = one_handshake(front, client)
        walls.append(wall)
        cpus.append(cpu)
    return {
        "wall_us": statistics.median(walls) / 1000,
        "cpu_us": statistics.median(cpus) / 1000,
        "tickets_per_handshake": client.tickets / iterations,
    }


def resumption_check(front: SSL.Context) -> tuple[bool, str | None, float]:
    """Resume on a ticket: (reused, the key-exchange group, tickets the resumed handshake issued)."""
    client = TicketCounter()
    _w, _t, first = one_handshake(front, client)
    before = client.tickets
    _w, _t, again = one_handshake(front, client, first.get_session())
    return tls_connection.session_reused(again), again.get_group_name(), client.tickets - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=2000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        now = time.time()
        cert, key = self_signed_mldsa65([SNI], now - 60, now + 3600)
        write_pair(Path(tmp) / "certs" / SNI, [cert], key)
        store = CertStore(Path(tmp) / "certs", Path(tmp) / "state")
        ring = TicketKeyRing(memoryview(mmap.mmap(-1, TicketKeyRing.REGION_BYTES)), 3600.0)
        ring.seed()
        sealer = session_tickets.TicketSealer(ring) if session_tickets.available() else None
        contexts = tls.SNIContexts(store, tickets=sealer)
        for count in (0, 1, 2):
            assert tls.set_num_tickets(contexts.front, count)
            r = measure(contexts.front, args.iterations)
            print(
                f"tickets={count}: last server step median {r['wall_us']:.1f} µs wall, {r['cpu_us']:.1f} µs CPU;"
                f" client received {r['tickets_per_handshake']:.2f} tickets per handshake"
            )
        tls.set_num_tickets(contexts.front)
        reused, group, issued = resumption_check(contexts.front)
        print(f"default ({tls.TICKETS_PER_HANDSHAKE}): resumed={reused} group={group} tickets on resumption={issued}")


if __name__ == "__main__":
    main()
