"""Real peers for integration tests: TLS backends that terminate their own TLS, and a running fleet."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import resource
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from supervisor.demo import write_demo_cert

REPO = Path(__file__).resolve().parent.parent


def one_web_service(port: int, hostname: str = "shop.apps.test") -> str:
    """Fleet config body: one instance of service "web" on ``port``, reached as ``hostname``."""
    return f"""
[[instances]]
service = "web"
id = "web-1"
host = "127.0.0.1"
port = {port}
[[domains]]
hostname = "{hostname}"
service = "web"
"""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def refusing_port(host: str = "127.0.0.1") -> socket.socket:
    """A socket bound to a port and never listening: connects there are refused for as long as it is open, and
    no other test can take the port meanwhile (a ``free_port()`` is let go at once, and another test's server may
    bind it). The port is ``getsockname()[1]``."""
    s = socket.socket()
    s.bind((host, 0))
    return s


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02, what: str = ""):
    """Poll with a deadline: for conditions that have no event to wait on (another process's state)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


class TLSBackend:
    """A backend service that terminates its own TLS (classical, stdlib ssl) and answers every chunk it
    receives with ``<name>:<chunk>``. Records its connection count."""

    def __init__(self, name: str, hostname: str, workdir: str) -> None:
        self.name = name
        self.cert_path, self.key_path = write_demo_cert(tempfile.mkdtemp(dir=workdir), hostname)
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(self.cert_path, self.key_path)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(512)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with self.ctx.wrap_socket(conn, server_side=True) as tls:
                while True:
                    data = tls.recv(65536)
                    if not data:
                        return
                    tls.sendall(self.name.encode() + b":" + data)
        except (OSError, ssl.SSLError):
            pass

    def close(self) -> None:
        self.sock.close()

    @property
    def cert_der(self) -> bytes:
        return ssl.PEM_cert_to_DER_cert(Path(self.cert_path).read_text())


class HTTPBackend:
    """A plain-HTTP backend ("offload" mode): answers every request with a JSON echo of what it received
    (method, path, headers as a list of pairs, body length) and records each request."""

    def __init__(self, name: str, tls: tuple[str, str] | None = None, client_ca: str | None = None) -> None:
        """``tls`` = (cert, key): serve HTTPS ("bridge" mode); ``client_ca``: require a client certificate."""
        import http.server
        import json as _json

        self.name = name
        self.requests: list[dict] = []
        self.unframed: list[bytes] = []  # what arrived where a request line should have: never anything
        self.sni_seen: list[str | None] = []  # with ``tls``: the server name each handshake asked for
        self.slow_started = threading.Event()
        self.release_slow = threading.Event()
        backend = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                if self.headers.get("Upgrade", "").lower() == "websocket":
                    return self._websocket()
                if self.path.startswith("/big/"):
                    return self._big(int(self.path.split("/")[2]))
                if self.path == "/die":
                    return self._die()
                if self.path.startswith("/slow/"):
                    backend.slow_started.set()
                    backend.release_slow.wait(30)  # held until the test lets it answer
                body = self._body()
                if body is None:  # the proxy gave up on the request mid-body (its client went): no answer
                    self.close_connection = True
                    return
                seen = {
                    "backend": backend.name,
                    "method": self.command,
                    "path": self.path,
                    "headers": [[k, v] for k, v in self.headers.items()],
                    "body_len": len(body),
                    "body_sha256": hashlib.sha256(body).hexdigest(),
                    "client_cert": bool(getattr(self.connection, "getpeercert", lambda: None)()),
                }
                backend.requests.append(seen)
                out = _json.dumps(seen).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def _body(self) -> bytes | None:
                """The whole request body, as framed: a chunked one too (a streamed body the proxy forwards).
                Answering before reading it would leave its chunks to be parsed as the next request. None when
                the connection ends before the last chunk."""
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    out = bytearray()
                    while True:
                        line = self.rfile.readline(65537)
                        if not line:
                            return None
                        size = int(line.split(b";")[0], 16)
                        if size == 0:
                            while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return bytes(out)
                        out += self.rfile.read(size)
                        self.rfile.readline(65537)  # the chunk's CRLF
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def parse_request(self) -> bool:
                ok = super().parse_request()
                if not ok:  # not a request: bytes outside a well-framed one (close() reports them)
                    backend.unframed.append(bytes(self.raw_requestline[:200]))
                return ok

            def _big(self, n: int) -> None:
                """n pseudo-random bytes, deterministic so the client can check them."""
                self.send_response(200)
                self.send_header("Content-Length", str(n))
                self.end_headers()
                for off in range(0, n, 65536):
                    self.wfile.write(pattern(off, min(65536, n - off)))

            def _die(self) -> None:
                """Promise a megabyte, send a little, then vanish (RST)."""
                self.send_response(200)
                self.send_header("Content-Length", "1000000")
                self.end_headers()
                self.wfile.write(b"x" * 1000)
                self.wfile.flush()
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                self.close_connection = True

            def _websocket(self) -> None:
                """101, then echo raw bytes until EOF (framing is the client's business)."""
                self.send_response(101)
                self.send_header("Upgrade", "websocket")
                self.send_header("Connection", "Upgrade")
                key = self.headers.get("Sec-WebSocket-Key", "").encode()
                accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
                self.send_header("Sec-WebSocket-Accept", accept.decode())
                self.end_headers()
                self.wfile.flush()
                while True:
                    data = self.connection.recv(65536)
                    if not data:
                        break
                    self.connection.sendall(data)
                self.close_connection = True

            def log_message(self, *args) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            # socketserver's listen backlog is 5: a burst of cold upstream connections (100 h2 streams at
            # once) overflowed it, and the dropped handshakes came back after the kernel's 1, 3, 7 s retries
            request_queue_size = 1024

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            ctx.sni_callback = lambda _sock, name, _ctx: self.sni_seen.append(name)
            if client_ca:
                ctx.verify_mode = ssl.CERT_REQUIRED
                ctx.load_verify_locations(client_ca)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        """Stop serving; fails when the proxy ever sent bytes outside a well-framed request (smuggling-class)."""
        self.server.shutdown()
        self.server.server_close()
        assert not self.unframed, f"{self.name}: bytes outside a well-framed request: {self.unframed}"


def pattern(offset: int, n: int) -> bytes:
    """Deterministic bytes for offset..offset+n of a large body (cheap to produce and to check)."""
    block = hashlib.sha256(b"%d" % (offset // 65536)).digest() * 2048
    start = offset % 65536
    return block[start : start + n]


def tls_client(port: int, sni: str, host: str = "127.0.0.1", timeout: float = 5.0) -> ssl.SSLSocket:
    """An internal client (loopback): classical TLS straight through to the backend's own certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    raw = socket.create_connection((host, port), timeout=timeout)
    return ctx.wrap_socket(raw, server_hostname=sni)


def roundtrip(port: int, sni: str, payload: bytes = b"ping") -> bytes:
    with tls_client(port, sni) as s:
        s.sendall(payload)
        return s.recv(65536)


def connection_closed(sock: socket.socket, timeout: float = 5.0) -> bool:
    """True when the peer closed (EOF or reset) within ``timeout``."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


class Fleet:
    """``sentin8-proxy run`` as a real subprocess on free ports."""

    def __init__(
        self,
        workdir: str,
        body: str,
        workers: int = 2,
        extra: str = "",
        host: str = "127.0.0.1",
        http: str = "",
        limits: str = "",
        nofile: int | None = None,
        mgmt: bool | int = False,
        listen_extra: str = "",
        fleet: str = "",
        port: int | None = None,
        args: tuple[str, ...] = (),
        launcher: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        """``mgmt``: run the management API on a loopback port (``mgmt_url``; an int: that port) with a fresh secret
        (``secret``); otherwise ``listen.mgmt = ""``. ``fleet``: more keys of the [fleet] section; ``port``: share
        another fleet's port (with ``args=("--beside-running-fleet",)``); ``launcher``: a command that execs the
        rest (``unshare …``), so that the supervisor keeps the process's pid; ``env``: more environment
        variables."""
        self.workdir = workdir
        self.secret = secrets.token_urlsafe(36)
        # mgmt=True: port 0, the bound port is read from the fleet's mgmt_listening event (no free-port race)
        self.mgmt_port = 0 if mgmt is True else int(mgmt)
        self.mgmt_url = ""
        mgmt_listen = f"127.0.0.1:{self.mgmt_port}" if mgmt else ""
        self.config = os.path.join(workdir, "proxy.toml")
        for attempt in range(3):  # a free port another test binds before the fleet does: another port
            self.port = port or free_port(host)
            Path(self.config).write_text(
                f"""
[listen]
https = "{host}:{self.port}"
http = "{http}"
mgmt = "{mgmt_listen}"
{listen_extra}
[fleet]
workers = {workers}
{fleet or "drain_timeout_s = 10"}
[limits]
peek_timeout_s = 2
{limits}
[tls]
cert_dir = "{workdir}/certs"
state_dir = "{workdir}/state"
{extra}
{body}
"""
            )
            self.log_path = os.path.join(workdir, "proxy.log")
            self.log = open(self.log_path, "w+")  # noqa: SIM115 - lives as long as the process
            self.proc = subprocess.Popen(
                [*launcher, sys.executable, "-m", "supervisor.cli", "run", "--config", self.config, *args],
                cwd=REPO,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "SENTIN8_MGMT_JWT_SECRET": self.secret, **(env or {})},
                preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))) if nofile else None,
            )
            try:
                # generous: on a loaded 2-core machine a fleet's start (imports, shared memory, a PQ certificate
                # per worker) has taken over 20 s; a passing start returns as soon as "ready" is logged
                wait_until(lambda: self.saw("ready") or self.proc.poll() is not None, 45, what="fleet ready")
            except AssertionError as exc:
                self.stop()  # no orphaned fleet outliving the test that could not use it
                raise AssertionError(f"{exc}; the fleet's log so far:\n{self.output()[-4000:]}") from None
            if port is not None or attempt == 2 or self.proc.poll() is None or "already in use" not in self.output():
                break
            self.log.close()
        if self.proc.poll() is not None:
            raise AssertionError(f"fleet exited {self.proc.returncode}:\n{self.output()}")
        if mgmt:
            if mgmt is True:
                self.mgmt_port = int(self.events("mgmt_listening")[0]["listen"].rsplit(":", 1)[1])
            self.mgmt_url = f"http://127.0.0.1:{self.mgmt_port}"

    def output(self) -> str:
        return Path(self.log_path).read_text()

    def events(self, name: str | None = None) -> list[dict]:
        """The fleet's JSON event lines (``sentin8.eventlog``), optionally only those named ``name``."""
        out = []
        for line in self.output().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    ev = json.loads(line)
                    if name is None or ev.get("event") == name:
                        out.append(ev)
        return out

    def saw(self, name: str) -> bool:
        return bool(self.events(name))

    def children(self) -> dict[int, str]:
        out = {}
        for pid in subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split():
            with contextlib.suppress(OSError):
                out[int(pid)] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        return out

    def workers(self) -> dict[int, str]:
        return {pid: title for pid, title in self.children().items() if re.search(r": worker \d+", title)}

    def stats(self) -> dict:
        """Fleet counter totals, via the supervisor's SIGUSR1 dump."""
        seen = self.output().count("\nstats ")
        self.proc.send_signal(signal.SIGUSR1)
        wait_until(lambda: self.output().count("\nstats ") > seen, 5, what="stats line")
        line = [ln for ln in self.output().splitlines() if ln.startswith("stats ")][-1]
        return json.loads(line[len("stats ") :])["counters"]

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        return self.proc.returncode
