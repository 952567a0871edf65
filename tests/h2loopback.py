"""A small HTTP/2 server over PQ TLS built from sentin8's sans-IO h2 pieces, for testing the test client.

Each connection is one thread driving ``ServerConnection`` (the engine adapter), ``map_request`` and
``StreamBudget`` the way the worker's h2 shell will: it is a real peer for tests/h2client.py until the proxy
serves h2, and it runs the adapter over real TLS. Its TLS context is its own (pyOpenSSL, ML-DSA-65,
X25519MLKEM768), ALPN h2 preferred.

What it answers: ``GET /bytes/N`` N bytes; ``POST /echo`` the request body (after the whole of it); a request
with ``x-trailers`` gets response trailers (the body's length, and the request trailers it saw);
``/early-hints`` a 103 first. Refusals as the proxy will make them: ``H2Refusal`` status or stream error.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
import warnings

from OpenSSL import SSL, crypto

from sentin8.certpair import self_signed_mldsa65
from sentin8.http import h2_codes
from sentin8.http.h2_budget import CLOSE, GOAWAY, REFUSE, StreamBudget
from sentin8.http.h2_engine import (
    FIELDS_CHECKED,
    ConnectionEnded,
    H2Limits,
    RequestData,
    RequestHeaders,
    RequestTrailers,
    ServerConnection,
    StreamRefused,
    StreamReset,
)
from sentin8.http.h2_request import STREAM_ERROR, H2Refusal, check_body_length, map_request


def _context(names: list[str]) -> SSL.Context:
    from cryptography.hazmat.primitives import serialization

    cert, key = self_signed_mldsa65(names, time.time() - 60, time.time() + 3600)
    ctx = SSL.Context(SSL.TLS_METHOD)
    ctx.set_min_proto_version(SSL.TLS1_3_VERSION)
    assert SSL._lib.SSL_CTX_set1_curves_list(ctx._context, b"X25519MLKEM768") == 1
    assert SSL._lib.SSL_CTX_set1_sigalgs_list(ctx._context, b"mldsa65") == 1
    ctx.use_certificate(cert)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.use_privatekey(crypto.load_privatekey(crypto.FILETYPE_PEM, pem))

    def choose(_conn: SSL.Connection, offered: list[bytes]) -> bytes:
        for proto in (b"h2", b"http/1.1"):
            if proto in offered:
                return proto
        raise SSL.Error([("SSL routines", "", "no application protocol")])

    ctx.set_alpn_select_callback(choose)
    return ctx


class _Stream:
    __slots__ = ("body", "head", "trailers")

    def __init__(self, head: object) -> None:
        self.head = head
        self.body = bytearray()
        self.trailers: list[tuple[bytes, bytes]] = []


class LoopbackH2Server:
    def __init__(self, host: str = "127.0.0.1", names: tuple[str, ...] = ("loopback.test",)) -> None:
        self.ctx = _context(list(names))
        self.listener = socket.create_server((host, 0))
        self.host, self.port = host, self.listener.getsockname()[1]
        self.heads: list[object] = []  # every RequestHead served
        self.refusals: list[str] = []  # every refusal's counter (mapping, engine, budget)
        self.ended: list[ConnectionEnded] = []
        self.errors: list[BaseException] = []
        self.disconnects: list[BaseException] = []  # anything a connection thread raised: a test asserts none
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._accept_loop, daemon=True)
        self._accept.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            self._threads.append(t)
            t.start()

    def close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked in its thread (Linux)
        except OSError:
            pass
        self.listener.close()
        self._accept.join(5)
        for t in self._threads:
            t.join(5)

    # -- one connection ------------------------------------------------------------------------------

    def _serve(self, sock: socket.socket) -> None:
        # a blocking socket (pyOpenSSL on a socket with a Python timeout raises WantRead), bounded in the kernel
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 30, 0))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", 30, 0))
        tls = SSL.Connection(self.ctx, sock)
        tls.set_accept_state()
        try:
            tls.do_handshake()
            if tls.get_alpn_proto_negotiated() == b"h2":
                self._h2(tls)
        except (SSL.Error, OSError) as exc:
            self.disconnects.append(exc)  # the client went away (or the handshake failed)
        except BaseException as exc:
            self.errors.append(exc)
            raise
        finally:
            sock.close()

    def _h2(self, tls: SSL.Connection) -> None:
        conn = ServerConnection(H2Limits())
        budget = StreamBudget()
        streams: dict[int, _Stream] = {}
        tls.sendall(conn.data_to_send())
        while conn.ended is None:
            try:
                data = tls.recv(65536)
            except SSL.ZeroReturnError:
                return
            if not data:
                return
            budget.begin_read()
            events = conn.receive(data)
            if conn.events_waiting:
                events = conn.take_events() + events
            for ev in events:
                verdict = self._on_event(conn, budget, streams, ev)
                if verdict is not None and verdict.action == CLOSE:
                    self.refusals.append(verdict.counter)
                    conn.close(verdict.code, verdict.counter)
                    break
            verdict = budget.after_read(conn.received, conn.payload, conn.control)
            if verdict is not None and conn.ended is None:
                self.refusals.append(verdict.counter)
                conn.close(verdict.code, verdict.counter)
            out = conn.data_to_send()
            while conn.events_waiting:
                for ev in conn.take_events():
                    self._on_event(conn, budget, streams, ev)
                out += conn.data_to_send()
            if out:
                tls.sendall(out)
        self.ended.append(conn.ended)

    def _on_event(self, conn: ServerConnection, budget: StreamBudget, streams: dict[int, _Stream], ev: object):
        now = time.monotonic()
        if type(ev) is RequestHeaders:
            sid = ev.stream_id
            verdict = budget.opened(sid, now)
            if verdict is not None and verdict.action in (REFUSE, CLOSE):
                if verdict.action == REFUSE:
                    self.refusals.append(verdict.counter)
                    conn.refuse(sid)
                return verdict
            if verdict is not None and verdict.action == GOAWAY:
                conn.goaway(verdict.code)
            try:
                head = map_request(ev.fields, ev.end_stream, max_headers=100, fields_checked=FIELDS_CHECKED)
            except H2Refusal as exc:
                self.refusals.append(exc.reason)
                if exc.status == STREAM_ERROR:
                    conn.reset(sid, h2_codes.PROTOCOL_ERROR)
                else:
                    conn.send_head(sid, exc.status, [(b"content-length", b"0")], end_stream=True)
                budget.done(sid)
                return None
            self.heads.append(head)
            streams[sid] = _Stream(head)
            if ev.end_stream:
                self._respond(conn, budget, streams, sid)
        elif type(ev) is RequestData:
            st = streams.get(ev.stream_id)
            if st is None:
                return None
            st.body += ev.data
            conn.consume(ev.stream_id, ev.flow)  # an upstream that takes everything at once
            try:
                check_body_length(st.head.content_length, len(st.body), ev.end_stream)
            except H2Refusal as exc:
                self.refusals.append(exc.reason)
                conn.reset(ev.stream_id, h2_codes.PROTOCOL_ERROR)
                del streams[ev.stream_id]
                budget.reset_by_us(ev.stream_id)
                return None
            if ev.end_stream:
                self._respond(conn, budget, streams, ev.stream_id)
        elif type(ev) is RequestTrailers:
            st = streams.get(ev.stream_id)
            if st is not None:
                st.trailers = list(ev.fields)
                self._respond(conn, budget, streams, ev.stream_id)
        elif type(ev) is StreamReset:
            streams.pop(ev.stream_id, None)
            verdict = budget.reset_by_peer(ev.stream_id, now)
            budget.done(ev.stream_id)
            return verdict
        elif type(ev) is StreamRefused:
            self.refusals.append(ev.reason)
            return budget.refused(now)
        return None

    def _respond(self, conn: ServerConnection, budget: StreamBudget, streams: dict[int, _Stream], sid: int) -> None:
        st = streams.pop(sid)
        head = st.head
        path = head.path
        if path.startswith(b"/bytes/"):
            body = b"0123456789abcdef" * (int(path[7:]) // 16) + b"x" * (int(path[7:]) % 16)
        elif path == b"/echo":
            body = bytes(st.body)
        else:
            body = b"hello from %s\n" % head.target
        if path == b"/early-hints":
            conn.send_interim(sid, 103, [(b"link", b"</style.css>; rel=preload")])
        want_trailers = any(n == b"x-trailers" for n, _ in head.headers)
        fields = [(b"content-type", b"application/octet-stream"), (b"x-request-host", head.host.encode())]
        if not want_trailers:
            fields.append((b"content-length", b"%d" % len(body)))
        if head.method == b"HEAD":
            conn.send_head(sid, 200, fields, end_stream=True)
        else:
            conn.send_head(sid, 200, fields)
            conn.send_data(sid, body, end_stream=not want_trailers)
            if want_trailers:
                echoed = b",".join(n for n, _ in st.trailers)
                conn.send_trailers(sid, [(b"x-body-length", b"%d" % len(body)), (b"x-request-trailers", echoed)])
        budget.done(sid)
