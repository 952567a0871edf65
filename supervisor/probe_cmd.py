"""``sentin8-proxy probe URL``: the socket shell of the PQ probe (the logic is ``sentin8/probe.py``).

One blocking socket per connection, bounded by ``--timeout`` in the kernel (``SO_RCVTIMEO``/``SO_SNDTIMEO``:
pyOpenSSL on a socket with a Python timeout raises WantRead instead of waiting), pyOpenSSL on the OpenSSL of
the ``cryptography`` wheel (``sentin8.tls.probe_context``), HTTP/2 through the engine's client adapter
(``sentin8.http.h2_engine.ClientConnection``). The report goes to stdout, an error to stderr with its curl
exit code.
"""

from __future__ import annotations

import argparse
import datetime as dt
import errno
import socket
import struct
import sys

from OpenSSL import SSL

from sentin8 import probe as p
from sentin8 import tls
from sentin8.version import version

_CHUNK = 65536


def add_parser(sub: argparse._SubParsersAction) -> None:
    cmd = sub.add_parser(
        "probe",
        help="a PQ TLS client for the edge (curl cannot: X25519MLKEM768 + ML-DSA-65): status, headers, TLS facts",
        description="Request URL over TLS 1.3 offering only X25519MLKEM768 and ML-DSA-65 (what the edge accepts), "
        "on the OpenSSL the proxy runs on. Exit codes as curl's (35 handshake, 60 verification, 3 URL, ...).",
    )
    cmd.add_argument("url", metavar="URL", help="https://host[:port]/path")
    cmd.add_argument(
        "--resolve",
        action="append",
        default=[],
        metavar="HOST:PORT:ADDR",
        help="connect to ADDR for HOST:PORT (SNI and Host stay HOST), as curl's --resolve",
    )
    cmd.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="add or replace a request header ('NAME:' removes a default one)",
    )
    cmd.add_argument("-d", "--data", metavar="BODY", help="POST BODY (@FILE reads it from FILE)")
    cmd.add_argument("--http2", action="store_true", help="offer ALPN h2 first and speak HTTP/2 if chosen")
    trust = cmd.add_mutually_exclusive_group()
    trust.add_argument("-k", "--insecure", action="store_true", help="do not verify the server certificate")
    trust.add_argument("--cafile", metavar="FILE", help="verify against FILE (default: the system trust store)")
    cmd.add_argument(
        "--source",
        "--interface",
        dest="source",
        metavar="ADDR",
        help="connect from this local address (e.g. 127.0.0.2, the demo's external loopback)",
    )
    cmd.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="send the request N times on one connection (reconnecting if the server closes it)",
    )
    cmd.add_argument("-f", "--fail", action="store_true", help="exit 22 when a response has status >= 400")
    cmd.add_argument("--timeout", type=float, default=10.0, metavar="S", help="connect, handshake and each read")


def run(args: argparse.Namespace) -> int:
    try:
        return _Probe(args).run()
    except p.ProbeError as exc:
        print(f"sentin8-proxy probe: {exc}", file=sys.stderr)
        return exc.code


class _Probe:
    def __init__(self, args: argparse.Namespace) -> None:
        self.target = p.parse_url(args.url)
        resolves = [p.parse_resolve(r) for r in args.resolve]
        headers = [p.parse_header(h) for h in args.header]
        if args.repeat < 1:
            raise p.ProbeError(p.EXIT_USAGE, "--repeat: give 1 or more")
        self.request = p.build_request(self.target, headers, _body(args.data), f"sentin8-probe/{version()}")
        self.address = p.pick_address(self.target, resolves) or self._lookup()
        self.args = args
        self.verify = not args.insecure
        alpn = (b"h2", b"http/1.1") if args.http2 else (b"http/1.1",)
        try:
            self.ctx = tls.probe_context(ca_file=None if args.insecure else (args.cafile or ""), alpn=alpn)
        except tls.TLSSetupError as exc:
            raise p.ProbeError(p.EXIT_USAGE, str(exc)) from None

    def _lookup(self) -> str:
        if self.target.is_ip:
            return self.target.host
        try:
            infos = socket.getaddrinfo(self.target.host, self.target.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise p.ProbeError(p.EXIT_RESOLVE, f"cannot resolve {self.target.host}: {exc.strerror}") from None
        return str(infos[0][4][0])

    def run(self) -> int:
        statuses: list[int] = []
        conn: _Connection | None = None
        try:
            for i in range(self.args.repeat):
                if conn is None:
                    conn = self._connect(first=i == 0)
                resp = conn.exchange(self.request)
                statuses.append(resp.status)
                if i == 0:
                    print("\n".join(p.request_lines(self.request, resp.version)))
                    print("\n".join(p.response_lines(resp)), flush=True)
                else:
                    print(f"* request {i + 1}/{self.args.repeat}: {resp.status} {resp.reason}".rstrip(), flush=True)
                if not resp.keep_alive:
                    conn.close()
                    conn = None
        finally:
            if conn is not None:
                conn.close()
        if self.args.repeat > 1:
            print(f"* statuses:   {p.status_summary(statuses)}")
        if self.args.fail and any(s >= 400 for s in statuses):
            return p.EXIT_HTTP_ERROR
        return p.EXIT_OK

    def _connect(self, first: bool) -> _Connection:
        t, timeout = self.target, self.args.timeout
        family = socket.AF_INET6 if ":" in self.address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            if self.args.source:
                sock.bind((self.args.source, 0))
            sock.connect((self.address, t.port))
        except TimeoutError:
            sock.close()
            raise p.ProbeError(
                p.EXIT_TIMEOUT, f"connect to {self.address}:{t.port} timed out after {timeout} s"
            ) from None
        except OSError as exc:
            sock.close()
            raise p.ProbeError(p.EXIT_CONNECT, f"connect to {self.address}:{t.port}: {exc.strerror or exc}") from None
        sock.settimeout(None)
        tv = struct.pack("ll", int(timeout), int((timeout % 1) * 1e6))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
        local, peer = sock.getsockname(), sock.getpeername()
        ssl_conn = SSL.Connection(self.ctx, sock)
        ssl_conn.set_connect_state()
        if not t.is_ip:
            ssl_conn.set_tlsext_host_name(t.host.encode())
        if self.verify:
            tls.verify_peer_name(ssl_conn, t.host)
        try:
            ssl_conn.do_handshake()
        except SSL.Error as exc:
            sock.close()
            raise self._handshake_error(ssl_conn, exc) from None
        alpn = ssl_conn.get_alpn_proto_negotiated().decode() or "(none)"
        if first:
            print(f"* connected:  {peer[0]}:{peer[1]} from {local[0]}:{local[1]}")
            print("\n".join(self._tls_lines(ssl_conn, alpn)), flush=True)
        else:
            print("* reconnected (the server closed the last connection): new handshake", flush=True)
        h2 = alpn == "h2"
        if self.args.http2 and not h2 and first:
            print(f"* HTTP/2:     the server chose {alpn}: falling back to HTTP/1.1", flush=True)
        return _Connection(sock, ssl_conn, h2, self.args.timeout)

    def _tls_lines(self, conn: SSL.Connection, alpn: str) -> list[str]:
        cert = conn.get_peer_certificate(as_cryptography=True)
        if not self.verify:
            verified = "no (--insecure)"
        else:
            verified = f"yes (chain and name, against {self.args.cafile or 'the system trust store'})"
        facts = p.TLSFacts(
            version=conn.get_protocol_version_name(),
            group=conn.get_group_name() or "(unknown)",
            signature=p.signature_scheme(cert) if cert is not None else "(no certificate)",
            alpn=alpn,
            verified=verified,
        )
        lines = p.tls_lines(facts)
        if cert is not None:
            lines += p.certificate_lines(cert, dt.datetime.now(dt.UTC))
        return lines

    def _handshake_error(self, conn: SSL.Connection, exc: SSL.Error) -> p.ProbeError:
        if self.verify and (why := tls.verify_error(conn)):
            hint = "" if self.args.cafile else " (give --cafile FILE, or --insecure to skip verification)"
            return p.ProbeError(p.EXIT_VERIFY, f"certificate verification failed: {why}{hint}")
        if isinstance(exc, SSL.SysCallError) and exc.args and exc.args[0] in (errno.EAGAIN, errno.EWOULDBLOCK):
            return p.ProbeError(p.EXIT_TIMEOUT, f"TLS handshake timed out after {self.args.timeout} s")
        return p.ProbeError(p.EXIT_TLS, f"TLS handshake failed: {_reason(exc)} (offered only TLS 1.3, "
                                        "X25519MLKEM768 and mldsa65, as the edge accepts)")  # fmt: skip


class _Connection:
    """One TLS connection: HTTP/1.1 exchanges one after the other, or HTTP/2 streams one after the other."""

    def __init__(self, sock: socket.socket, conn: SSL.Connection, h2: bool, timeout: float) -> None:
        self.sock, self.conn, self.timeout = sock, conn, timeout
        self.h2 = None
        if h2:
            from sentin8.http.h2_engine import ClientConnection

            self.h2 = ClientConnection()

    def _recv(self) -> bytes:
        try:
            return self.conn.recv(_CHUNK)
        except SSL.ZeroReturnError:
            return b""
        except SSL.SysCallError as exc:
            if exc.args and exc.args[0] in (errno.EAGAIN, errno.EWOULDBLOCK):
                raise p.ProbeError(p.EXIT_TIMEOUT, f"no answer within {self.timeout} s") from None
            return b""  # EOF without close_notify, or reset: the reader decides whether the response is whole
        except SSL.Error as exc:
            raise p.ProbeError(p.EXIT_RECV, f"TLS error while reading: {_reason(exc)}") from None

    def _send(self, data: bytes) -> None:
        try:
            self.conn.sendall(data)
        except (SSL.Error, OSError) as exc:
            raise p.ProbeError(p.EXIT_RECV, f"the server closed the connection while sending: {exc}") from None

    def exchange(self, req: p.Request) -> p.Response:
        if self.h2 is not None:
            return self._exchange_h2(req)
        self._send(p.http1_bytes(req))
        reader = p.Http1Reader()
        while True:
            data = self._recv()
            if not data:
                return reader.finish()
            if reader.feed(data):
                return reader.response  # type: ignore[return-value]

    def _exchange_h2(self, req: p.Request) -> p.Response:
        h2 = self.h2
        assert h2 is not None
        sid = h2.request(p.h2_fields(req), req.body)
        self._send(h2.data_to_send())
        r = h2.responses[sid]
        while not r.done:
            data = self._recv()
            if not data:
                raise p.ProbeError(p.EXIT_RECV, "the server closed the HTTP/2 connection before the response ended")
            h2.receive(data)
            out = h2.data_to_send()
            if out:
                self._send(out)
            if h2.ended is not None and not r.done:
                raise p.ProbeError(p.EXIT_RECV, f"the HTTP/2 connection ended: {h2.ended.reason or 'GOAWAY'}")
        del h2.responses[sid]
        if r.reset is not None and not r.status:
            raise p.ProbeError(p.EXIT_RECV, f"the server reset the stream (error code {r.reset:#x})")
        resp = p.from_h2(r.status, r.fields, bytes(r.body), r.trailers)
        resp.keep_alive = h2.ended is None
        return resp

    def close(self) -> None:
        try:
            self.conn.shutdown()
        except (SSL.Error, OSError):
            pass
        self.sock.close()


def _body(data: str | None) -> bytes | None:
    if data is None:
        return None
    if data.startswith("@"):
        try:
            with open(data[1:], "rb") as fh:
                return fh.read()
        except OSError as exc:
            raise p.ProbeError(p.EXIT_USAGE, f"--data {data}: {exc.strerror}") from None
    return data.encode()


def _reason(exc: SSL.Error) -> str:
    errors = exc.args[0] if exc.args and isinstance(exc.args[0], list) else []
    reasons = [e[-1] for e in errors if isinstance(e, tuple) and e and e[-1]]
    if reasons:
        return "; ".join(dict.fromkeys(reasons))
    if isinstance(exc, SSL.SysCallError):
        return "the server closed the connection during the handshake"
    return str(exc) or type(exc).__name__
