"""A small blocking post-quantum TLS test client on a socket the caller provides.

The caller creates and connects the socket (so tests can make it inside a network namespace); the client
does its own socket I/O through pyOpenSSL memory BIOs, so the socket's timeout applies to every wait.
It configures pyOpenSSL itself rather than through ``sentin8.tls``: a test client must not share the
configuration it is testing.

``PQClient(sock, sni)`` offers X25519MLKEM768 and ML-DSA-65 only; ``PQClient(sock, sni, classical=True)``
offers only classical algorithms and is expected to be refused by the proxy.
"""

from __future__ import annotations

import select
import selectors
import socket
import struct
import threading
import time
import warnings

from cryptography import x509
from OpenSSL import SSL, crypto

PQ_GROUPS = b"X25519MLKEM768"
PQ_SIGALGS = b"mldsa65"
CLASSICAL_GROUPS = b"X25519"
CLASSICAL_SIGALGS = b"ed25519:ecdsa_secp256r1_sha256:rsa_pss_rsae_sha256"

_CHUNK = 65536
# Linux's SO_TIMESTAMPNS (asm-generic, 64-bit time): the kernel's CLOCK_REALTIME arrival time of received bytes,
# as a struct timespec in an SCM_TIMESTAMPNS control message (Python's socket module has no name for it)
_SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("qq")


class PQClient:
    def __init__(
        self,
        sock: socket.socket,
        sni: str | None,
        groups: bytes = PQ_GROUPS,
        sigalgs: bytes = PQ_SIGALGS,
        *,
        classical: bool = False,
        session: SSL.Session | None = None,
        ca_file: str | None = None,
        client_cert: tuple[x509.Certificate, bytes] | None = None,
        context: SSL.Context | None = None,
        timeout: float | None = 10.0,
    ) -> None:
        self.sock = sock
        if timeout is not None:
            sock.settimeout(timeout)
        # pyOpenSSL resumes a session only on a connection of the context that made it: pass
        # ``context=first.context`` together with ``session=first.session``.
        self.context = context or self.make_context(
            groups, sigalgs, classical=classical, ca_file=ca_file, client_cert=client_cert
        )
        self.conn = SSL.Connection(self.context, None)
        self.conn.set_connect_state()
        if sni:
            self.conn.set_tlsext_host_name(sni.encode("idna"))
        if session is not None:
            self.conn.set_session(session)
        self.peer_closed = False  # the server's close_notify was received
        self.eof = False  # the TCP connection ended (with or without close_notify)
        self._buf = bytearray()  # decrypted bytes not yet returned (request() parsing)
        self._stamping = False
        self.last_arrival = 0.0  # stamp_arrivals(): when the kernel received the bytes read last (wall clock)

    @staticmethod
    def make_context(
        groups: bytes = PQ_GROUPS,
        sigalgs: bytes = PQ_SIGALGS,
        *,
        classical: bool = False,
        ca_file: str | None = None,
        client_cert: tuple[x509.Certificate, bytes] | None = None,
    ) -> SSL.Context:
        if classical:
            groups, sigalgs = CLASSICAL_GROUPS, CLASSICAL_SIGALGS
        ctx = SSL.Context(SSL.TLS_METHOD)
        ctx.set_min_proto_version(SSL.TLS1_3_VERSION)
        ctx.set_max_proto_version(SSL.TLS1_3_VERSION)
        assert SSL._lib.SSL_CTX_set1_curves_list(ctx._context, groups) == 1, groups
        assert SSL._lib.SSL_CTX_set1_sigalgs_list(ctx._context, sigalgs) == 1, sigalgs
        ctx.set_session_cache_mode(SSL.SESS_CACHE_CLIENT)
        if ca_file:
            ctx.load_verify_locations(ca_file)
            ctx.set_verify(SSL.VERIFY_PEER)
        if client_cert is not None:
            cert, key_pem = client_cert
            ctx.use_certificate(cert)
            with warnings.catch_warnings():  # ML-DSA keys only load as PKey (deprecated type)
                warnings.simplefilter("ignore", DeprecationWarning)
                ctx.use_privatekey(crypto.load_privatekey(crypto.FILETYPE_PEM, key_pem))
        return ctx

    # -- socket pumping ----------------------------------------------------------------------------

    def _pump_out(self) -> None:
        while True:
            try:
                data = self.conn.bio_read(_CHUNK)
            except SSL.WantReadError:
                return
            self.sock.sendall(data)

    def stamp_arrivals(self) -> None:
        """Record in ``last_arrival`` when the kernel received the bytes read last, not when this thread got
        round to reading them: a loaded test process reads late, and a time between two server events
        (a response, then a close) measured on its own clock would shrink by that lateness."""
        self.sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        self._stamping = True

    def _pump_in(self) -> bool:
        if self._stamping:
            data, ancillary, _, _ = self.sock.recvmsg(_CHUNK, socket.CMSG_SPACE(_TIMESPEC.size))
            arrival = time.time()  # a bare FIN carries no stamp: now, the latest it can have come
            for level, kind, value in ancillary:
                if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS:
                    seconds, nanoseconds = _TIMESPEC.unpack(value[: _TIMESPEC.size])
                    arrival = seconds + nanoseconds / 1e9
            self.last_arrival = arrival
        else:
            data = self.sock.recv(_CHUNK)
        if not data:
            self.eof = True
            return False
        self.conn.bio_write(data)
        return True

    # -- API ---------------------------------------------------------------------------------------

    def handshake(self) -> None:
        """Complete the handshake; raises ``SSL.Error`` (alert) or ``ConnectionError``/``OSError``."""
        while True:
            try:
                self.conn.do_handshake()
            except SSL.WantReadError:
                self._pump_out()
                if not self._pump_in():
                    raise ConnectionError("server closed the connection during the handshake") from None
                continue
            except SSL.Error:
                try:
                    self._pump_out()
                except OSError:
                    pass
                raise
            self._pump_out()
            return

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = self.conn.send(view[:_CHUNK])
            view = view[n:]
            self._pump_out()

    def recv(self, n: int = _CHUNK) -> bytes:
        """Up to ``n`` plaintext bytes; b"" when the server sent close_notify or the connection ended."""
        if self._buf:
            data = bytes(self._buf[:n])
            del self._buf[:n]
            return data
        return self._recv_tls(n)

    def _recv_tls(self, n: int = _CHUNK) -> bytes:
        while True:
            try:
                return self.conn.recv(n)
            except SSL.WantReadError:
                self._pump_out()
                if not self._pump_in():
                    return b""
            except SSL.ZeroReturnError:
                self.peer_closed = True
                return b""

    def _fill(self) -> bool:
        data = self._recv_tls()  # never from _buf: that would shuffle the buffer forever
        if not data:
            return False
        self._buf += data
        return True

    def _read_until(self, marker: bytes) -> bytes:
        while (i := self._buf.find(marker)) < 0:
            if not self._fill():
                raise ConnectionError(f"connection ended before {marker!r}")
        out = bytes(self._buf[: i + len(marker)])
        del self._buf[: i + len(marker)]
        return out

    def _read_exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            if not self._fill():
                raise ConnectionError(f"connection ended {n - len(self._buf)} bytes short")
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    @property
    def holds_unread(self) -> bool:
        """Decrypted bytes are buffered that no call returned yet (part of a response, say)."""
        return bool(self._buf)

    def closed_while_idle(self) -> bool:
        """Before a kept-alive connection carries another request: whether the server closed it meanwhile,
        as every HTTP client checks before reusing one (urllib3's ``is_connection_dropped``, Go's idle
        connection reader). Nothing is owed on an idle connection, so anything readable must be that close
        (close_notify, FIN, reset); bytes of any other kind raise."""
        if self._buf:
            raise AssertionError(f"bytes after the last response: {bytes(self._buf[:60])!r}")
        if not select.select([self.sock], [], [], 0)[0]:
            return False
        try:
            data = self._recv_tls()
        except ConnectionResetError:
            return True
        if data:
            raise AssertionError(f"unsolicited bytes on an idle connection: {data[:60]!r}")
        return True

    def request(self, raw: bytes, *, head: bool = False) -> bytes:
        """Send a raw HTTP/1.1 request and return the complete raw response (head and body as framed:
        Content-Length, chunked, or until the connection ends). Interim 1xx responses are skipped."""
        self.sendall(raw)
        while True:
            resp_head = self._read_until(b"\r\n\r\n")
            status = int(resp_head.split(b" ", 2)[1])
            if 100 <= status < 200 and status != 101:
                continue
            break
        headers = {}
        for line in resp_head.split(b"\r\n")[1:]:
            if b":" in line:
                k, v = line.split(b":", 1)
                headers[k.strip().lower()] = v.strip()
        if head or status in (101, 204, 304):
            return resp_head
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            body = bytearray()
            while True:
                size_line = self._read_until(b"\r\n")
                body += size_line
                size = int(size_line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while True:  # trailers up to the empty line
                        line = self._read_until(b"\r\n")
                        body += line
                        if line == b"\r\n":
                            return resp_head + bytes(body)
                body += self._read_exact(size + 2)
        if b"content-length" in headers:
            return resp_head + self._read_exact(int(headers[b"content-length"]))
        while self._fill():
            pass
        out = resp_head + bytes(self._buf)
        self._buf.clear()
        return out

    def duplex(
        self, payload: bytes, expect: int, *, read_gate: threading.Event | None = None, timeout: float = 60.0
    ) -> bytes:
        """Send ``payload`` while receiving until ``expect`` plaintext bytes came back (an echo), without
        deadlocking on full socket buffers. With ``read_gate`` nothing is read until the event is set, so a
        test can make the server's buffers fill up first."""
        deadline = time.monotonic() + timeout
        out = bytearray()
        view = memoryview(payload)
        while view:  # encrypt everything up front into our own buffer; the socket takes it as it can
            n = self.conn.send(view[:_CHUNK])
            view = view[n:]
        while True:
            try:
                out += self.conn.bio_read(_CHUNK)
            except SSL.WantReadError:
                break
        received = bytearray()
        saved_timeout = self.sock.gettimeout()
        self.sock.setblocking(False)
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
        try:
            while len(received) < expect:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"duplex: {len(received)}/{expect} bytes back, {len(out)} unsent")
                may_read = read_gate is None or read_gate.is_set()
                events = (selectors.EVENT_READ if may_read else 0) | (selectors.EVENT_WRITE if out else 0)
                if not events:  # waiting for the gate with nothing to send: poll it with a deadline
                    read_gate.wait(min(remaining, 0.05))  # type: ignore[union-attr]
                    continue
                sel.modify(self.sock, events)
                wait = remaining if may_read else min(remaining, 0.05)
                for _key, ev in sel.select(wait):
                    if ev & selectors.EVENT_WRITE and out:
                        try:
                            sent = self.sock.send(out[:_CHUNK])
                        except BlockingIOError:
                            sent = 0
                        del out[:sent]
                    if ev & selectors.EVENT_READ:
                        try:
                            data = self.sock.recv(_CHUNK)
                        except BlockingIOError:
                            continue
                        if not data:
                            raise ConnectionError(f"duplex: EOF after {len(received)}/{expect} bytes")
                        self.conn.bio_write(data)
                        while True:
                            try:
                                received += self.conn.recv(_CHUNK)
                            except SSL.WantReadError:
                                break
        finally:
            sel.close()
            self.sock.settimeout(saved_timeout)
        return bytes(received)

    # -- state -------------------------------------------------------------------------------------

    @property
    def group_name(self) -> str | None:
        return self.conn.get_group_name()

    @property
    def peer_cert(self) -> x509.Certificate | None:
        return self.conn.get_peer_certificate(as_cryptography=True)

    @property
    def session(self) -> SSL.Session | None:
        return self.conn.get_session()

    @property
    def resumed(self) -> bool:
        return bool(SSL._lib.SSL_session_reused(self.conn._ssl))

    def close(self) -> None:
        """Send close_notify (so the session stays resumable) and close the socket."""
        try:
            self.conn.shutdown()
            self._pump_out()
        except (SSL.Error, OSError):
            pass
        self.sock.close()
