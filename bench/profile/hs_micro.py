"""Server-side CPU of one full PQ handshake through sentin8.tls contexts, in memory (no sockets, no loop).

    .venv/bin/python -m bench.profile.hs_micro [N]

Compares the SNIContexts front context (servername callback, context swap) against a plain context holding
the certificate, to see what we add beyond OpenSSL's own work.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from OpenSSL import SSL

from bench import certs, pqtls
from sentin8 import tls
from sentin8.certstore import CertStore


def handshake(server_ctx: SSL.Context, client_ctx: SSL.Context) -> float:
    s = SSL.Connection(server_ctx, None)
    s.set_accept_state()
    c = SSL.Connection(client_ctx, None)
    c.set_connect_state()
    c.set_tlsext_host_name(b"bench.test")
    spent = 0.0
    done_s = done_c = False
    while not (done_s and done_c):
        if not done_c:
            try:
                c.do_handshake()
                done_c = True
            except SSL.WantReadError:
                pass
        try:
            data = c.bio_read(65536)
            t0 = time.process_time()
            s.bio_write(data)
            spent += time.process_time() - t0
        except SSL.WantReadError:
            pass
        t0 = time.process_time()
        try:
            s.do_handshake()
            done_s = True
        except SSL.WantReadError:
            pass
        try:
            out = s.bio_read(65536)
        except SSL.WantReadError:
            out = b""
        spent += time.process_time() - t0
        if out:
            c.bio_write(out)
    return spent


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    work = Path(tempfile.mkdtemp())
    cf = certs.write_mldsa65(work / "c", ["bench.test"])
    cdir = work / "certs" / "bench.test"
    cdir.mkdir(parents=True)
    (cdir / "fullchain.pem").write_bytes(cf.cert.read_bytes())
    (cdir / "privkey.pem").write_bytes(cf.key.read_bytes())
    store = CertStore(work / "certs", work / "state")
    sni = SNIContexts = tls.SNIContexts(store)
    plain = pqtls.server_context(str(cf.cert), str(cf.key))
    client = pqtls.client_context()
    for name, ctx in (("plain", plain), ("sni-front", sni.front), ("plain", plain), ("sni-front", sni.front)):
        handshake(ctx, client)
        t = sorted(handshake(ctx, client) for _ in range(n))
        print(f"{name:10} server CPU per handshake: median {t[n // 2] * 1e3:.3f} ms, mean {sum(t) / n * 1e3:.3f} ms")
    del SNIContexts
    return 0


if __name__ == "__main__":
    sys.exit(main())
