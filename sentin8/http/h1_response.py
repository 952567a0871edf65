"""The client half of one HTTP/1.1 response, sans-IO: what bytes the client gets for each response event.

The exchange relays a backend's response as protocol-neutral events (interim, head, body, end, abort) and
answers some requests itself (an error, a local answer, our own ``100 Continue``). ``H1Response`` turns those
into HTTP/1.1 bytes for one request: the client's version decides whether an interim response is relayed at
all (never a 1xx to HTTP/1.0, RFC 9110 §15.2), ``client_framing`` whether the body is chunk-encoded by us and
whether the connection closes after it; an error answer always closes. The h1 connection writes the bytes
and reads ``close`` when the exchange is done. An HTTP/2 stream answers the same events with frames.
"""

from __future__ import annotations

from .framing import Header, RequestHead
from .head_writer import error_response, local_response, response_head
from .response import (
    LAST_CHUNK,
    UpstreamBody,
    client_framing,
    encode_chunks,
    split,
    without_content_length,
)

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class H1Response:
    """One request's response towards an HTTP/1.1 (or 1.0) client. ``head`` None: a request refused before
    its head was accepted (it gets an error answer and nothing else)."""

    __slots__ = ("chunked", "close", "continue_sent", "head_only", "keep_alive", "version", "websocket")

    def __init__(self, head: RequestHead | None, *, head_only: bool) -> None:
        self._take(head)
        self.head_only = head_only
        self.continue_sent = False  # we said 100 Continue: the backend's own is not relayed
        self.chunked = False  # the body goes to the client chunk-encoded by us
        self.close = False  # the client connection closes after this response

    def _take(self, head: RequestHead | None) -> None:
        """The request's version and framing wishes (h1_response.pxd types ``head``: its fields are read as C
        struct members, which ``__init__``, whose arguments a .pxd cannot type, would look up by name)."""
        self.version = head.version if head is not None else "1.1"
        self.keep_alive = head.keep_alive if head is not None else False
        self.websocket = head.websocket if head is not None else False

    def continue_(self) -> bytes:
        self.continue_sent = True
        return CONTINUE

    def interim(self, status: int, reason: bytes, headers: list[Header]) -> bytes | None:
        """A 1xx for the client, or None when it must not see it."""
        if (status == 100 and self.continue_sent) or self.version != "1.1":
            return None
        return response_head(status, reason, headers)

    def head(self, status: int, reason: bytes, headers: list[Header], body: UpstreamBody, *, draining: bool) -> bytes:
        framing = client_framing(
            body, version=self.version, keep_alive=self.keep_alive, websocket=self.websocket, draining=draining
        )
        self.chunked = framing.chunked_out
        if framing.close_client:
            self.close = True
        if framing.drop_content_length:
            headers = without_content_length(headers)
        return response_head(status, reason, headers, framing.extra)

    def body(self, data: bytes, limit: int) -> list[bytes]:
        """Body bytes as pieces of at most ``limit`` bytes each (one TLS record), chunk-encoded if need be."""
        return encode_chunks(data, limit) if self.chunked else split(data, limit)

    def end(self) -> bytes | None:
        return LAST_CHUNK if self.chunked else None

    def abort(self) -> None:
        """The response is cut off (the backend broke it): the client can only learn that from the close."""
        self.close = True

    def error(self, status: int) -> bytes:
        """An error answer: it closes the connection."""
        self.close = True
        return error_response(status, head_only=self.head_only)

    def local(self, status: int, headers: list[Header], *, keep: bool, body: bytes | None) -> bytes:
        """A local answer; ``keep``: the connection stays for the next request."""
        if not keep:
            self.close = True
        return local_response(status, headers, close=not keep, head_only=self.head_only, body=body)
