"""Server-side CPU of one resumed PQ handshake, OpenSSL's own ticket keys against the fleet's (TicketSealer).

    .venv/bin/python -m bench.profile.hs_resumed [N]

In memory (no sockets, no loop), like ``hs_micro``: what the ctypes ticket callback adds to a resumption, and
what a resumption saves against a full handshake.
"""

from __future__ import annotations

import mmap
import sys
import tempfile
import time
from pathlib import Path

from OpenSSL import SSL

from bench import certs, pqtls
from sentin8 import tls
from sentin8.certstore import CertStore
from sentin8.session_tickets import TicketSealer
from sentin8.ticketkeys import TicketKeyRing


def _move(src: SSL.Connection, dst: SSL.Connection) -> bool:
    try:
        data = src.bio_read(65536)
    except SSL.WantReadError:
        return False
    dst.bio_write(data)
    return True


def handshake(server_ctx: SSL.Context, client_ctx: SSL.Context, session: SSL.Session | None):
    """(server CPU seconds, resumed?, the client's new session)."""
    s = SSL.Connection(server_ctx, None)
    s.set_accept_state()
    c = SSL.Connection(client_ctx, None)
    c.set_connect_state()
    c.set_tlsext_host_name(b"bench.test")
    if session is not None:
        c.set_session(session)
    spent = 0.0
    done_s = False
    while not done_s:
        try:
            c.do_handshake()
        except SSL.WantReadError:
            pass
        _move(c, s)
        t0 = time.process_time()
        try:
            s.do_handshake()
            done_s = True
        except SSL.WantReadError:
            pass
        spent += time.process_time() - t0
        _move(s, c)  # the last flight carries the tickets
    c.do_handshake()
    t0 = time.process_time()
    s.send(b"x")  # one record after the tickets, so the client reads them
    spent += time.process_time() - t0
    _move(s, c)
    c.recv(16)
    resumed, session = bool(SSL._lib.SSL_session_reused(c._ssl)), c.get_session()
    c.shutdown()  # close_notify, or OpenSSL marks the session non-resumable when the connection is freed
    t0 = time.process_time()
    _move(c, s)
    s.shutdown()
    spent += time.process_time() - t0
    return spent, resumed, session


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    work = Path(tempfile.mkdtemp())
    cf = certs.write_mldsa65(work / "c", ["bench.test"])
    cdir = work / "certs" / "bench.test"
    cdir.mkdir(parents=True)
    (cdir / "fullchain.pem").write_bytes(cf.cert.read_bytes())
    (cdir / "privkey.pem").write_bytes(cf.key.read_bytes())
    store = CertStore(work / "certs", work / "state")
    region = memoryview(mmap.mmap(-1, TicketKeyRing.REGION_BYTES))
    TicketKeyRing(region, 3600).seed()
    own = tls.SNIContexts(store)
    fleet = tls.SNIContexts(store, tickets=TicketSealer(TicketKeyRing(region, 3600)))
    client = pqtls._restrict(SSL.Context(SSL.TLS_METHOD))  # pqtls.client_context() turns tickets off
    client.set_verify(SSL.VERIFY_NONE, lambda *a: True)
    client.set_session_cache_mode(SSL.SESS_CACHE_CLIENT)
    for name, sni in (("own keys", own), ("fleet keys", fleet), ("own keys", own), ("fleet keys", fleet)):
        full, _, session = handshake(sni.front, client, None)
        times = []
        for _ in range(n):
            spent, resumed, session = handshake(sni.front, client, session)
            if not resumed:
                print(f"{name}: a handshake did not resume", file=sys.stderr)
                return 1
            times.append(spent)
        times.sort()
        median = times[n // 2] * 1e3
        print(f"{name:10} server CPU per resumed handshake: median {median:.3f} ms (full: {full * 1e3:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
