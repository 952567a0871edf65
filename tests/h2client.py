"""A blocking HTTP/2 test client over post-quantum TLS (tests/pqclient.py, ALPN ``h2``).

It speaks HTTP/2 with python-hyper's ``h2`` (pinned in the [test] extra), a different engine than the proxy's
(nghttp2 through ngh2): a test client must not share the code it tests. The caller makes and connects the
socket (inside a network namespace for external clients, tests/netns.py), as with ``PQClient``.

- ``H2Client``: many concurrent streams, request bodies sent within the server's windows, responses with
  interim heads, trailers and resets; ``exchange`` runs a batch to completion.
- ``RawH2Client``: the same TLS connection with no HTTP/2 state machine, for the attack tests: it sends
  hand-built frames (tests/h2frames.py) and reads back the server's frames, parsed.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from hyperframe.frame import Frame, GoAwayFrame

from tests import h2frames
from tests.pqclient import PQClient

Fields = list[tuple[bytes, bytes]]


@dataclass
class H2Response:
    stream_id: int
    status: int = 0
    headers: Fields = field(default_factory=list)
    body: bytes = b""
    trailers: Fields = field(default_factory=list)
    interim: list[Fields] = field(default_factory=list)
    reset: int | None = None  # the server's RST_STREAM code, if it reset the stream
    complete: bool = False  # END_STREAM (or a reset) seen

    def header(self, name: bytes) -> bytes | None:
        return next((v for n, v in self.headers if n == name), None)


@dataclass
class H2Request:
    method: bytes = b"GET"
    path: bytes = b"/"
    headers: Fields = field(default_factory=list)
    body: bytes = b""
    trailers: Fields | None = None
    authority: bytes | None = None  # None: the client's authority (its SNI by default)
    end_stream_with_headers: bool | None = None  # None: when there is no body and no trailers


def pq_tls(sock: socket.socket, sni: str | None, alpn: tuple[bytes, ...], timeout: float) -> PQClient:
    """A completed PQ TLS handshake offering ``alpn``."""
    ctx = PQClient.make_context()
    ctx.set_alpn_protos(list(alpn))
    tls = PQClient(sock, sni, context=ctx, timeout=timeout)
    tls.handshake()
    return tls


class H2Client:
    def __init__(
        self,
        sock: socket.socket,
        sni: str | None,
        *,
        authority: bytes | None = None,
        alpn: tuple[bytes, ...] = (b"h2",),
        window: int = 1 << 24,
        timeout: float = 10.0,
    ) -> None:
        self.tls = pq_tls(sock, sni, alpn, timeout)
        self.alpn = self.tls.conn.get_alpn_proto_negotiated()
        self.authority = authority or (sni or "").encode()
        self.timeout = timeout
        # outbound checks off: the tests send what a broken or hostile client would; the server's answers are
        # still checked (validate_inbound_headers)
        cfg = h2.config.H2Configuration(
            client_side=True, header_encoding=None, validate_outbound_headers=False, normalize_outbound_headers=False
        )
        self.h2 = h2.connection.H2Connection(cfg)
        self.h2.initiate_connection()
        # reading as fast as it can. Through update_settings: a value set on local_settings before
        # initiate_connection is never sent (the server would keep 65535 while we thought 16 MiB, and stall)
        self.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        if window > 65535:
            self.h2.increment_flow_control_window(window - 65535)
        self.responses: dict[int, H2Response] = {}
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.remote_settings: dict[int, int] = {}
        self._bodies: dict[int, tuple[memoryview, Fields | None]] = {}
        self._flush()

    # -- requests --------------------------------------------------------------------------------------

    def request(self, req: H2Request) -> int:
        """Send the head (and, as windows allow, the body); returns the stream id."""
        sid = self.h2.get_next_available_stream_id()
        fields: Fields = [
            (b":method", req.method),
            (b":scheme", b"https"),
            (b":authority", req.authority if req.authority is not None else self.authority),
            (b":path", req.path),
            *req.headers,
        ]
        end = req.end_stream_with_headers
        if end is None:
            end = not req.body and req.trailers is None
        self.h2.send_headers(sid, fields, end_stream=end)
        self.responses[sid] = H2Response(sid)
        if not end:
            self._bodies[sid] = (memoryview(req.body), req.trailers)
        self._send_bodies()
        self._flush()
        return sid

    def exchange(self, reqs: list[H2Request], *, timeout: float | None = None) -> list[H2Response]:
        """Send all of ``reqs`` concurrently (as many as the server's concurrency allows at a time) and
        wait for every response."""
        deadline = time.monotonic() + (timeout or self.timeout)
        todo = list(reqs)
        sids: list[int] = []
        while todo or any(not self.responses[s].complete for s in sids):
            while todo and self.h2.open_outbound_streams < self.h2.remote_settings.max_concurrent_streams:
                sids.append(self.request(todo.pop(0)))
            self.pump(deadline)
        return [self.responses[s] for s in sids]

    def fetch(self, req: H2Request, *, timeout: float | None = None) -> H2Response:
        return self.exchange([req], timeout=timeout)[0]

    def get(self, path: bytes = b"/", **kw: object) -> H2Response:
        return self.fetch(H2Request(b"GET", path, **kw))  # type: ignore[arg-type]

    def reset(self, stream_id: int, code: int = 0x8) -> None:
        self.h2.reset_stream(stream_id, code)
        self._flush()

    def ping(self, opaque: bytes = b"s8-test!") -> None:
        self.h2.ping(opaque)
        self._flush()

    # -- the connection --------------------------------------------------------------------------------

    def pump(self, deadline: float) -> None:
        """Read once (blocking up to the deadline), handle what came, send what may now go."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            open_ = [s for s, r in self.responses.items() if not r.complete]
            raise TimeoutError(f"h2client: streams still open: {open_[:10]} ({len(open_)})")
        self.tls.sock.settimeout(remaining)
        data = self.tls.recv()
        if not data:
            raise ConnectionError("h2client: the server closed the connection")
        for ev in self.h2.receive_data(data):
            self._on_event(ev)
        self._send_bodies()
        self._flush()

    def _on_event(self, ev: h2.events.Event) -> None:
        sid = getattr(ev, "stream_id", None)
        resp = self.responses.get(sid) if sid is not None else None
        if isinstance(ev, h2.events.ResponseReceived) and resp is not None:
            resp.headers = [(bytes(n), bytes(v)) for n, v in ev.headers]
            resp.status = int(dict(resp.headers)[b":status"])
        elif isinstance(ev, h2.events.InformationalResponseReceived) and resp is not None:
            resp.interim.append([(bytes(n), bytes(v)) for n, v in ev.headers])
        elif isinstance(ev, h2.events.DataReceived):
            if resp is not None:
                resp.body += ev.data
            self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        elif isinstance(ev, h2.events.TrailersReceived) and resp is not None:
            resp.trailers = [(bytes(n), bytes(v)) for n, v in ev.headers]
        elif isinstance(ev, h2.events.StreamEnded) and resp is not None:
            resp.complete = True
        elif isinstance(ev, h2.events.StreamReset) and resp is not None:
            resp.reset = ev.error_code
            resp.complete = True
            self._bodies.pop(ev.stream_id, None)
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self.goaway = ev
        elif isinstance(ev, h2.events.RemoteSettingsChanged):
            self.remote_settings.update({int(k): v.new_value for k, v in ev.changed_settings.items()})

    def _send_bodies(self) -> None:
        for sid in list(self._bodies):
            view, trailers = self._bodies[sid]
            while view:
                room = min(self.h2.local_flow_control_window(sid), self.h2.max_outbound_frame_size, len(view))
                if room <= 0:
                    break
                self.h2.send_data(sid, view[:room].tobytes())
                view = view[room:]
            if view:
                self._bodies[sid] = (view, trailers)
                continue
            del self._bodies[sid]
            try:
                if trailers is not None:
                    self.h2.send_headers(sid, trailers, end_stream=True)
                else:
                    self.h2.end_stream(sid)
            except h2.exceptions.StreamClosedError:
                pass  # the server answered (or reset) first

    def _flush(self) -> None:
        out = self.h2.data_to_send()
        if out:
            self.tls.sendall(out)

    def close(self) -> None:
        try:
            self.h2.close_connection()
            self._flush()
        except (OSError, h2.exceptions.ProtocolError):
            pass
        self.tls.close()


class RawH2Client:
    """PQ TLS with ALPN h2 and no HTTP/2 state machine: frames in, frames out."""

    def __init__(
        self,
        sock: socket.socket,
        sni: str | None,
        *,
        timeout: float = 10.0,
        settings: dict[int, int] | None = None,
        ack: bool = True,
    ) -> None:
        """``ack`` False: the server's SETTINGS are never acknowledged (its limits stay pending for it)."""
        self.tls = pq_tls(sock, sni, (b"h2",), timeout)
        self.alpn = self.tls.conn.get_alpn_proto_negotiated()
        self.frames = h2frames.RawFrames()
        self._buf = b""
        self.eof = False  # reading ended: the server's close_notify, FIN or reset, after all it sent
        self.refused = False  # a write failed (the server closed or reset): what it said before is still readable
        self.send(h2frames.preface(settings, ack=ack))

    def send(self, data: bytes) -> None:
        try:
            self.tls.sendall(data)
        except OSError:
            self.refused = True

    def read_frames(self, until: type | None = GoAwayFrame, *, timeout: float = 10.0) -> list[Frame]:
        """The server's frames until one of type ``until`` arrives (or the connection ends; ``until`` None:
        whatever one read brings)."""
        deadline = time.monotonic() + timeout
        got: list[Frame] = []
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {until.__name__ if until else 'frame'} within {timeout} s; got {got[-5:]}")
            self.tls.sock.settimeout(remaining)
            try:
                data = self.tls.recv()
            except OSError:
                data = b""
            if not data:
                self.eof = True
                return got
            frames, self._buf = h2frames.parse(self._buf + data)
            got += frames
            if until is None or any(isinstance(f, until) for f in frames):
                return got

    def close(self) -> None:
        self.tls.close()
