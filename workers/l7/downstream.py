"""The seam between one exchange and the client side of its request (HAProxy's mux, Pingora's downstream
``Session``): the exchange (``exchange.py``) never sees the client's wire protocol, only this.

``ConnectionFacts`` is what a client connection is, decided once when it is made and never changed: admission
(``admission.py``) reads it. ``Downstream`` is what one exchange may ask of the client side of its request:

- the response as events, in order: ``send_interim``* then ``send_head``, ``send_body``*, ``send_end`` (or
  ``send_trailers``: the end, with the backend's trailers, which an HTTP/1.1 client side drops); or
  ``send_abort`` (cut off: the client must not take it for complete); ``flush`` after the events of one upstream
  read (the client side batches them into as few writes as it can);
- an answer of the proxy's own: ``answer_error`` (a status the exchange could not help), ``answer_local`` (a
  refusal that may keep the client side, True when it does), ``send_continue`` (our ``100 Continue``);
- the request body's flow: ``hold_body`` (bytes kept until an upstream connection or the WAF takes them),
  ``hold_limit`` (the WAF's limit instead of the default), ``body_taken`` (the held bytes went upstream),
  ``pause_body`` / ``resume_body`` (the upstream's write buffer is full / has room);
- ``draining``, ``writing_paused`` (an upstream connection attached now starts paused); ``open_tunnel`` after
  a 101 that proves WebSocket (HTTP/1.1 only); ``exchange_done`` when the exchange is over.

The HTTP/1.1 connection (``h1/connection.py``) implements it for the request in flight; an HTTP/2 stream
implements it for its own. Whatever the protocol, the events are the same, so admission, the WAF, hygiene,
the upstream pool, the relay and the accounting are one code path.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from sentin8.http.headers import Header
from sentin8.http.response import UpstreamBody

if TYPE_CHECKING:
    from workers.upstream import UpstreamConn

    from .contract import L7Context
    from .exchange import Exchange
    from .request import Request


class ConnectionFacts:
    """One client connection, as admission and accounting see it; built once when the connection is made and
    never changed. Made for every connection, so a plain class: compiled, a C struct with read-only fields
    (``downstream.pxd``: nothing can write them after ``__init__``) that admission reads as struct members. A
    frozen dataclass's generated ``__init__`` was interpreted Python, ~19k instructions per connection."""

    __slots__ = (
        "acme_only", "client_cert", "client_ip", "external", "protocol", "refuse_status", "scheme", "sni", "tls",
        "tls_version",
    )  # fmt: skip

    def __init__(
        self,
        client_ip: str,
        scheme: str,
        sni: str | None,
        tls: bool,
        tls_version: str | None,
        client_cert: bytes | None,
        external: bool,
        acme_only: bool,
        refuse_status: int,
        protocol: str,
    ) -> None:
        self.client_ip = client_ip
        self.scheme = scheme  # "https" on :443, "http" on :80
        self.sni = sni  # lower-case, without a trailing dot; None: none sent (or not TLS)
        self.tls = tls  # over the TLS layer: SNI is the routing key and must be present
        self.tls_version = tls_version
        self.client_cert = client_cert  # DER, when the client sent one
        self.external = external  # outside network.internal_cidrs
        self.acme_only = acme_only  # the :80 listener: only ACME challenges are served
        self.refuse_status = refuse_status  # answer every request with it and close (over the per-client cap); 0: no
        self.protocol = protocol  # "h1" or "h2"

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in sorted(self.__slots__))
        return f"ConnectionFacts({fields})"

    @classmethod
    def of(
        cls,
        transport: asyncio.BaseTransport,
        client_addr: Any,
        *,
        scheme: str,
        external: bool,
        acme_only: bool,
        refuse_status: int,
        protocol: str,
    ) -> ConnectionFacts:
        """Read from the transport (the TLS layer's extra info, or plain TCP's peername)."""
        addr = client_addr or transport.get_extra_info("peername")
        sni = transport.get_extra_info("sni")
        if isinstance(sni, bytes):
            sni = sni.decode("ascii", "replace")
        version = transport.get_extra_info("tls_version")
        cert = transport.get_extra_info("peercert") if version is not None else None
        return cls(
            str(addr[0]) if addr else "",
            scheme,
            sni.lower().rstrip(".") if sni else None,
            version is not None,
            version,
            bytes(cert) if isinstance(cert, bytes | bytearray) else None,
            external,
            acme_only,
            refuse_status,
            protocol,
        )


# Before a connection is made (and in no test's way): nothing known yet.
NO_FACTS = ConnectionFacts("", "https", None, False, None, None, True, False, 0, "h1")


class Downstream:
    """The client side of one request, as its exchange uses it (the module docstring says what each does).

    A base class rather than a Protocol so that, compiled, it is the ``cdef`` base of both client sides
    (``downstream.pxd``): the h1 connection (through ``ResponseWriter``) and the h2 stream. The exchange holds
    its client typed, so ``ctx``, ``loop`` and ``facts`` are struct members and the calls of every request
    (the head, the body, the end, ``flush``, ``body_taken``, ``exchange_done``) are C calls. A method left as
    it is here raises: each client side implements every one."""

    __slots__ = ()

    ctx: L7Context
    loop: asyncio.AbstractEventLoop
    facts: ConnectionFacts
    # and ``track_buffers``, a class-level bool: tests note the bytes held in buffers (``track``)

    @property
    def draining(self) -> bool:
        raise NotImplementedError

    @property
    def writing_paused(self) -> bool:
        raise NotImplementedError

    # the response, as events
    def send_interim(self, status: int, reason: bytes, headers: list[Header]) -> None:
        raise NotImplementedError

    def send_head(self, status: int, reason: bytes, headers: list[Header], body: UpstreamBody) -> None:
        raise NotImplementedError

    def send_body(self, data: bytes) -> None:
        raise NotImplementedError

    def send_end(self) -> None:
        raise NotImplementedError

    def send_trailers(self, headers: list[Header]) -> None:
        raise NotImplementedError

    def send_abort(self) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        raise NotImplementedError

    # the proxy's own answers
    def send_continue(self) -> None:
        raise NotImplementedError

    def answer_error(self, status: int) -> None:
        raise NotImplementedError

    def answer_local(self, status: int, headers: list[Header], *, keep_alive: bool, body: bytes | None) -> bool:
        raise NotImplementedError

    # the request body
    def hold_body(self, req: Request, data: bytes) -> None:
        raise NotImplementedError

    def hold_limit(self, limit: int, held: int) -> None:
        raise NotImplementedError

    def body_taken(self) -> None:
        raise NotImplementedError

    def pause_body(self) -> None:
        raise NotImplementedError

    def resume_body(self) -> None:
        raise NotImplementedError

    # the end
    def open_tunnel(
        self, ex: Exchange, conn: UpstreamConn, reason: bytes, headers: list[Header], first: bytes
    ) -> None:
        raise NotImplementedError

    def exchange_done(self, ex: Exchange) -> None:
        raise NotImplementedError

    def track(self, held: int) -> None:
        raise NotImplementedError
