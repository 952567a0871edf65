"""Continuous client load for availability tests: L4 and L7, new connections and keep-alive, every failure
recorded with its reason.

Each kind of client runs in its own thread and loops until ``stop()``. A client counts an error for anything
a real client would see as a failure: a refused or reset connection, a handshake that fails, a timeout, a
response that is not the expected one, a keep-alive connection that ends without answering a request sent
on it. A response carrying ``Connection: close`` followed by the close is the server's right, not an error:
the keep-alive client reconnects, as every HTTP client does. So is closing a connection idle for a while: a
client checks for that close before it reuses the connection (``PQClient.closed_while_idle``) and reconnects.
A close after the request went out remains an error.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable

from tests.peers import tls_client

L4_KEEPALIVE_EXCHANGES = 20  # an L4 keep-alive client reconnects after this many round trips


class Load:
    def __init__(self) -> None:
        self.ok = Counter()
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ---- bookkeeping ---------------------------------------------------------------------------------

    def _ok(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self.ok[kind] += n

    def _error(self, kind: str, exc: BaseException | str) -> None:
        with self._lock:
            self.errors.append(f"{time.strftime('%H:%M:%S')} {kind}: {exc!r}")
        time.sleep(0.05)  # a broken fleet must not turn the test into a busy loop

    def _spawn(self, name: str, body: Callable[[], None]) -> None:
        def run() -> None:
            while not self._stop.is_set():
                body()

        t = threading.Thread(target=run, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def total(self) -> int:
        with self._lock:
            return sum(self.ok.values())

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    # ---- L4 (internal clients, loopback) -------------------------------------------------------------

    def l4(self, port: int, sni: str, expect_prefix: bytes, new_conns: int = 1, keepalive: int = 1) -> None:
        def one_shot() -> None:
            try:
                with tls_client(port, sni) as s:
                    s.sendall(b"ping")
                    got = s.recv(65536)
                if not got.startswith(expect_prefix):
                    raise AssertionError(f"unexpected answer {got[:60]!r}")
                self._ok("l4_new")
            except (OSError, ssl.SSLError, AssertionError) as exc:
                self._error("l4_new", exc)

        def kept() -> None:
            try:
                with tls_client(port, sni) as s:
                    for i in range(L4_KEEPALIVE_EXCHANGES):
                        if self._stop.is_set():
                            return
                        payload = b"ka%d" % i
                        s.sendall(payload)
                        got = s.recv(65536)
                        if not got.startswith(expect_prefix) or not got.endswith(payload):
                            raise AssertionError(f"unexpected answer {got[:60]!r}")
                        self._ok("l4_keepalive")
                        time.sleep(0.01)
            except (OSError, ssl.SSLError, AssertionError) as exc:
                self._error("l4_keepalive", exc)

        for i in range(new_conns):
            self._spawn(f"l4-new-{i}", one_shot)
        for i in range(keepalive):
            self._spawn(f"l4-ka-{i}", kept)

    # ---- L7 (external clients, PQ TLS) ---------------------------------------------------------------

    def l7(
        self,
        connect: Callable[[], socket.socket],
        sni: str,
        new_conns: int = 1,
        keepalive: int = 1,
        idle_close_after: float | None = None,
        pause: float = 0.01,
    ) -> None:
        """``idle_close_after``: the server may close a keep-alive connection idle this long (a draining
        worker's ``fleet.drain_idle_grace_s``); None: never. A close sooner than that is an error.
        ``pause``: a keep-alive client's think time between a response and its next request."""
        from tests.pqclient import PQClient

        request = f"GET /load HTTP/1.1\r\nHost: {sni}\r\n\r\n".encode()

        def check(resp: bytes) -> bool:
            """True when the server asked to close the connection after this (good) response."""
            head = resp.partition(b"\r\n\r\n")[0].lower()
            if not head.startswith(b"http/1.1 200"):
                raise AssertionError(f"unexpected response {resp[:80]!r}")
            return b"\r\nconnection: close" in head

        def one_shot() -> None:
            client = None
            phase, t0 = "connect", time.monotonic()
            try:
                client = PQClient(connect(), sni)
                phase = "handshake"
                client.handshake()
                phase = "request"
                check(client.request(request))
                self._ok("l7_new")
            except Exception as exc:  # every failure is the client's failure
                self._error("l7_new", f"{exc!r} in {phase} after {time.monotonic() - t0:.3f} s")
            finally:
                if client is not None:
                    client.close()

        def idle_close(idle: float, what: str) -> None:
            """The server closed this connection ``idle`` seconds (its kernel arrival times) after its last
            response: fine after a whole ``idle_close_after``, less some slack for timer granularity."""
            if idle_close_after is None or idle < 0.8 * idle_close_after:
                raise AssertionError(f"keep-alive connection closed after only {idle:.3f} s idle ({what})")

        def kept() -> None:
            client = None
            try:
                client = PQClient(connect(), sni)
                client.stamp_arrivals()
                client.handshake()
                answered_at = None  # when the last response reached this host: the connection is idle since
                while not self._stop.is_set():
                    if answered_at is not None and client.closed_while_idle():
                        # closed idle before this client sent anything more (a drain's grace ran out while
                        # this thread was descheduled): reconnect, as every client does before reuse. Both
                        # times are the kernel's arrival times, so a thread that read late does not count.
                        idle_close(client.last_arrival - answered_at, "before the next request")
                        self._ok("l7_closed_idle")
                        return
                    try:
                        closing = check(client.request(request))
                    except ConnectionError:
                        if answered_at is None or client.holds_unread:
                            raise
                        # The idle close crossed this request on the wire (sent before its close_notify
                        # arrived): not a byte of a response, so RFC 9112 §9.3.1 lets a client retry it, and
                        # a server closes only a connection with nothing unread, so it was never processed.
                        idle_close(client.last_arrival - answered_at, "crossing the next request")
                        self._ok("l7_closed_idle_crossed")
                        return
                    answered_at = client.last_arrival
                    self._ok("l7_keepalive")
                    if closing:
                        self._ok("l7_told_to_close")
                        return  # reconnect, as the server asked
                    time.sleep(pause)
            except Exception as exc:
                self._error("l7_keepalive", exc)
            finally:
                if client is not None:
                    client.close()

        for i in range(new_conns):
            self._spawn(f"l7-new-{i}", one_shot)
        for i in range(keepalive):
            self._spawn(f"l7-ka-{i}", kept)

    # ---- HTTP/2 (external clients, PQ TLS, ALPN h2) ---------------------------------------------------

    def h2(self, connect: Callable[[], socket.socket], sni: str, clients: int = 1, streams: int = 4) -> None:
        """``clients`` connections, each sending batches of ``streams`` concurrent GETs until told to stop
        (GOAWAY) or closed, then reconnecting. Only a stream above a final GOAWAY's last-stream-id may be
        retried (RFC 9113 §6.8: never processed): counted ``h2_retried``. Anything else is an error: a reset,
        a status other than 200, a connection that ends with a stream up to the last id unanswered."""
        for i in range(clients):
            self._spawn(f"h2-{i}", lambda: self._h2_connection(connect, sni, streams))

    def _h2_connection(self, connect: Callable[[], socket.socket], sni: str, streams: int) -> None:
        c = None
        try:
            c = H2LoadConnection(connect, sni)
            self._ok("h2_connections")
            while not self._stop.is_set() and not c.goaway_seen:
                retry = c.batch(streams)
                self._ok("h2_streams", c.answered)
                if c.goaway_seen:
                    self._ok("h2_told_to_go")
                if retry:
                    self._ok("h2_retried", retry)
                time.sleep(0.01)
        except Exception as exc:  # every failure is the client's failure
            self._error("h2", exc)
        finally:
            if c is not None:
                c.close()


class H2LoadConnection:
    """A raw-frame h2 client (tests/h2frames.py): python-hyper's h2 takes the drain's first GOAWAY
    (last-stream-id 2^31-1) as the end of the connection, which it is not; this client reads on to the final one."""

    def __init__(self, connect: Callable[[], socket.socket], sni: str) -> None:
        import hpack

        from tests import h2frames
        from tests.h2client import RawH2Client

        self.frames_mod = h2frames
        self.raw = RawH2Client(connect(), sni, settings={0x4: 1 << 24})
        self.raw.send(h2frames.window_update(0, (1 << 24) - 65535))
        self.decoder = hpack.Decoder()
        self.authority = sni.encode()
        self.next_sid = 1
        self.goaway_seen = False
        self.last_sid = (1 << 31) - 1
        self.answered = 0
        self._buf = b""
        self._block: dict[int, bytes] = {}

    def batch(self, n: int, path: bytes = b"/load") -> int:
        """Send ``n`` streams, read until each is answered; returns how many may be retried (above the final
        GOAWAY's last-stream-id). Raises on anything a client would see as a failure."""
        from hyperframe.frame import ContinuationFrame, DataFrame, GoAwayFrame, HeadersFrame, PingFrame, RstStreamFrame

        h2f = self.frames_mod
        sids = []
        for _ in range(n):
            sid = self.next_sid
            self.next_sid += 2
            sids.append(sid)
            self.raw.send(self.raw.frames.headers(sid, h2f.request_fields(path, self.authority)))
        status: dict[int, int] = {}
        pending = set(sids)
        self.answered = 0
        deadline = time.monotonic() + 30
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"h2: streams {sorted(pending)} unanswered")
            self.raw.tls.sock.settimeout(remaining)
            try:
                data = self.raw.tls.recv()
            except OSError:
                data = b""
            if not data:
                lost = [s for s in pending if s <= self.last_sid]
                if lost or not self.goaway_seen:
                    raise ConnectionError(f"h2: closed with streams {sorted(pending)} open, last id {self.last_sid}")
                return len(pending)  # above the final last-stream-id: never processed, retried elsewhere
            frames, self._buf = h2f.parse(self._buf + data)
            for f in frames:
                if isinstance(f, HeadersFrame | ContinuationFrame):
                    block = self._block.pop(f.stream_id, b"") + f.data
                    if "END_HEADERS" not in f.flags:
                        self._block[f.stream_id] = block
                        continue
                    fields = dict(self.decoder.decode(block, raw=True))
                    if b":status" in fields and int(fields[b":status"]) >= 200:
                        status[f.stream_id] = int(fields[b":status"])
                elif isinstance(f, DataFrame) and f.data:
                    self.raw.send(h2f.window_update(0, len(f.data)))
                elif isinstance(f, RstStreamFrame):
                    raise AssertionError(f"h2: stream {f.stream_id} reset ({f.error_code})")
                elif isinstance(f, PingFrame) and "ACK" not in f.flags:
                    self.raw.send(h2f.ping(int.from_bytes(f.opaque_data, "big"), ack=True))
                elif isinstance(f, GoAwayFrame):
                    if f.error_code:
                        raise AssertionError(f"h2: GOAWAY error {f.error_code}")
                    self.goaway_seen = True
                    self.last_sid = min(self.last_sid, f.last_stream_id)
                if "END_STREAM" in getattr(f, "flags", ()) and f.stream_id in pending:
                    if status.get(f.stream_id) != 200:
                        raise AssertionError(f"h2: stream {f.stream_id} status {status.get(f.stream_id)}")
                    pending.discard(f.stream_id)
                    self.answered += 1
            if self.goaway_seen and self.last_sid < (1 << 31) - 1:
                above = [s for s in pending if s > self.last_sid]
                if above and len(above) == len(pending):
                    return len(above)
        return 0

    def close(self) -> None:
        self.raw.close()
