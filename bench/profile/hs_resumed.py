"""Server-side CPU of one resumed PQ handshake, OpenSSL's own ticket keys against the fleet's (TicketSealer).

    .venv/bin/python -m bench.profile.hs_resumed [N]

In memory (no sockets, no loop), like ``hs_micro``: what the ctypes ticket callback adds to a resumption, and
what a resumption saves against a full handshake. Each connection is ``bench.profile.openssl_ab``'s: the
server's set-up, handshake, one record each way, close and free are timed.
"""

from __future__ import annotations

import mmap
import sys
import tempfile
from pathlib import Path

from OpenSSL import SSL

from bench import certs, pqtls
from bench.profile.openssl_ab import connection
from sentin8 import tls
from sentin8.certstore import CertStore
from sentin8.session_tickets import TicketSealer
from sentin8.ticketkeys import TicketKeyRing


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
        spent = [0.0]
        session, _ = connection(sni.front, client, None, spent)
        full = spent[0]
        times = []
        for _ in range(n):
            spent = [0.0]
            session, resumed = connection(sni.front, client, session, spent)
            if not resumed:
                print(f"{name}: a handshake did not resume", file=sys.stderr)
                return 1
            times.append(spent[0])
        times.sort()
        median = times[n // 2] * 1e3
        print(f"{name:10} server CPU per resumed handshake: median {median:.3f} ms (full: {full * 1e3:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
