"""Continuous client load for availability tests: L4 and L7, new connections and keep-alive, every failure
recorded with its reason.

Each kind of client runs in its own thread and loops until ``stop()``. A client counts an error for anything
a real client would see as a failure: a refused or reset connection, a handshake that fails, a timeout, a
response that is not the expected one, a keep-alive connection that ends without answering a request sent
on it. A response carrying ``Connection: close`` followed by the close is the server's right, not an error:
the keep-alive client reconnects, as every HTTP client does.
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

    def l7(self, connect: Callable[[], socket.socket], sni: str, new_conns: int = 1, keepalive: int = 1) -> None:
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
            try:
                client = PQClient(connect(), sni)
                client.handshake()
                check(client.request(request))
                self._ok("l7_new")
            except Exception as exc:  # every failure is the client's failure
                self._error("l7_new", exc)
            finally:
                if client is not None:
                    client.close()

        def kept() -> None:
            client = None
            try:
                client = PQClient(connect(), sni)
                client.handshake()
                while not self._stop.is_set():
                    closing = check(client.request(request))
                    self._ok("l7_keepalive")
                    if closing:
                        self._ok("l7_told_to_close")
                        return  # reconnect, as the server asked
                    time.sleep(0.01)
            except Exception as exc:
                self._error("l7_keepalive", exc)
            finally:
                if client is not None:
                    client.close()

        for i in range(new_conns):
            self._spawn(f"l7-new-{i}", one_shot)
        for i in range(keepalive):
            self._spawn(f"l7-ka-{i}", kept)
