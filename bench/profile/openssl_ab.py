"""The resumed PQ handshake in OpenSSL alone: the OpenSSL sentin8 runs (cryptography's bundled one) against the
OpenSSL nginx and HAProxy run in the bench (Debian 13's, in the toolchain's tree).

    .venv/bin/python -m bench.profile.openssl_ab [--handshakes 3000] [--rounds 3]

The same script, run by each side's Python and pyOpenSSL (this tool adds ``python3-openssl``, which links
Debian's libssl, to the tree): in memory (no sockets, no loop), a server and a client context restricted as
the bench's (TLS 1.3, X25519MLKEM768, ML-DSA-65, the library's own ticket keys and ticket count), then
``--handshakes`` resumed handshakes, each with one request record, one response record and both
close_notify. Only the server's calls are timed (``process_time``): making its connection, the handshake
steps, the two records, its shutdown and the free. What a resumed connection costs sentin8 beyond this is
its own path (accept, peek, the TLS layer, the HTTP bridge, the proxying, the close), which the bench's
resumed row then shows against nginx's. Needs root (the chroot), like ``python -m bench``; a load test,
never a timed test.

Run as ``python openssl_ab.py --measure DIR N`` it is the measurement itself: stdlib and pyOpenSSL only, so
the tree's Python runs it as it is.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from OpenSSL import SSL
from OpenSSL._util import lib

GROUPS = b"X25519MLKEM768"
SIGALGS = b"mldsa65"


def _set_groups(ctx: SSL.Context) -> int:
    """``SSL_CTX_set1_groups_list``: through cryptography's bindings where they have it (the wheel's), else
    ``SSL_CTX_ctrl`` in the libssl those bindings link (Debian's cryptography 43 leaves it out)."""
    if hasattr(lib, "SSL_CTX_set1_curves_list"):
        return lib.SSL_CTX_set1_curves_list(ctx._context, GROUPS)
    import ctypes

    from OpenSSL._util import ffi

    libssl = ctypes.CDLL("libssl.so.3")
    libssl.SSL_CTX_ctrl.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_char_p)
    libssl.SSL_CTX_ctrl.restype = ctypes.c_long
    set_groups_list = 92  # SSL_CTRL_SET_GROUPS_LIST
    return libssl.SSL_CTX_ctrl(int(ffi.cast("uintptr_t", ctx._context)), set_groups_list, 0, GROUPS)


def _context(server: bool, directory: str) -> SSL.Context:
    ctx = SSL.Context(SSL.TLS_METHOD)
    ctx.set_min_proto_version(SSL.TLS1_3_VERSION)
    ctx.set_max_proto_version(SSL.TLS1_3_VERSION)
    if _set_groups(ctx) != 1 or lib.SSL_CTX_set1_sigalgs_list(ctx._context, SIGALGS) != 1:
        raise SystemExit("this OpenSSL lacks X25519MLKEM768 or ML-DSA-65")
    if server:
        ctx.use_certificate_chain_file(f"{directory}/cert.pem")
        ctx.use_privatekey_file(f"{directory}/key.pem")
    else:
        ctx.set_verify(SSL.VERIFY_NONE, lambda *a: True)
        ctx.set_session_cache_mode(SSL.SESS_CACHE_CLIENT)
    return ctx


def move(src: SSL.Connection, dst: SSL.Connection) -> bool:
    try:
        data = src.bio_read(65536)
    except SSL.WantReadError:
        return False
    dst.bio_write(data)
    return True


def connection(server_ctx: SSL.Context, client_ctx: SSL.Context, session, spent: list[float]):
    """One connection in memory (resumed when ``session`` is offered and accepted): the server's CPU (making
    its connection, the handshake steps, a record each way, its shutdown, the free) added to ``spent[0]``.
    Returns (the client's new session, resumed?). Also ``bench.profile.hs_resumed``'s."""
    t0 = time.process_time()
    s = SSL.Connection(server_ctx, None)
    s.set_accept_state()
    spent[0] += time.process_time() - t0
    c = SSL.Connection(client_ctx, None)
    c.set_connect_state()
    c.set_tlsext_host_name(b"bench.test")
    if session is not None:
        c.set_session(session)
    server_done = False
    while not server_done:
        try:
            c.do_handshake()
        except SSL.WantReadError:
            pass
        move(c, s)
        t0 = time.process_time()
        try:
            s.do_handshake()
            server_done = True
        except SSL.WantReadError:
            pass
        spent[0] += time.process_time() - t0
        move(s, c)
    c.do_handshake()
    c.send(b"GET / HTTP/1.1\r\n\r\n")
    move(c, s)
    t0 = time.process_time()
    s.recv(1024)
    s.send(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    s.shutdown()
    spent[0] += time.process_time() - t0
    move(s, c)
    c.recv(1024)  # the tickets, then the response
    resumed = bool(lib.SSL_session_reused(c._ssl))
    new_session = c.get_session()
    c.shutdown()  # or OpenSSL marks the session not resumable when the connection is freed
    move(c, s)
    t0 = time.process_time()
    try:
        s.recv(1024)  # the client's close_notify
    except SSL.ZeroReturnError:
        pass
    del s
    spent[0] += time.process_time() - t0
    return new_session, resumed


def measure(directory: str, n: int) -> float:
    """Server CPU-µs per resumed handshake (and its records and close), the median of 5 batches."""
    server_ctx, client_ctx = _context(True, directory), _context(False, directory)
    session, _ = connection(server_ctx, client_ctx, None, [0.0])  # the full handshake that gives a ticket
    batches = []
    for _ in range(5):
        spent = [0.0]
        for _ in range(n // 5):
            session, resumed = connection(server_ctx, client_ctx, session, spent)
            if not resumed:
                raise SystemExit("a handshake did not resume")
        batches.append(spent[0] / (n // 5) * 1e6)
    return statistics.median(batches)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--handshakes", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--measure", nargs=2, metavar=("DIR", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        from cryptography.hazmat.backends.openssl import backend

        us = measure(args.measure[0], int(args.measure[1]))
        print(f"{us:.1f} {backend.openssl_version_text()}")
        return 0

    from bench import certs, toolchain

    work = Path(tempfile.mkdtemp(prefix="openssl-ab-"))
    try:
        tc = toolchain.ensure(work, log=sys.stderr)
        if tc.root is None:
            print("the host's own tools are PQ-capable: nothing to compare against", file=sys.stderr)
            return 1
        # pyOpenSSL on Debian's libssl, in the tree only for this comparison
        toolchain.add_packages(
            tc.root, (("usr/lib/python3/dist-packages/OpenSSL/SSL.py", "python3-openssl"),), sys.stderr
        )
        certs.write_mldsa65(work, ["bench.test"])
        script = work / "openssl_ab.py"
        shutil.copy(__file__, script)
        sides = {
            "sentin8 (cryptography's OpenSSL)": [sys.executable, str(script)],
            "nginx / HAProxy (Debian 13's)": tc.argv(["python3", str(script)]),
        }
        results: dict[str, list[float]] = {name: [] for name in sides}
        versions: dict[str, str] = {}
        for _ in range(args.rounds):  # interleaved: a load spike hits both alike
            for name, argv in sides.items():
                out = subprocess.run(
                    [*argv, "--measure", str(work), str(args.handshakes)],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout.split(maxsplit=1)
                results[name].append(float(out[0]))
                versions[name] = out[1].strip()
        for name, values in results.items():
            rounds = ", ".join(f"{v:.1f}" for v in values)
            median = statistics.median(values)
            print(f"{name:34} {versions[name]:28} server CPU per resumed handshake: median {median:6.1f} µs ({rounds})")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
