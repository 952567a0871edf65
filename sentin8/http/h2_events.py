"""The events the HTTP/2 adapter (sentin8/http/h2_engine.py) gives its shell: ours, not the engine's.

The shell dispatches on ``type(ev) is ...``; every one is a small ``__slots__`` object.
"""

from __future__ import annotations

Header = tuple[bytes, bytes]


class RequestHeaders:
    """A request's header block (decoded, in order; pseudo-headers first). ``end_stream``: no body follows."""

    __slots__ = ("end_stream", "fields", "stream_id")

    def __init__(self, stream_id: int, fields: tuple[Header, ...], end_stream: bool) -> None:
        self.stream_id = stream_id
        self.fields = fields
        self.end_stream = end_stream


class RequestData:
    """Request body bytes. They hold ``flow`` bytes of the windows until ``consume(stream_id, flow)``."""

    __slots__ = ("data", "end_stream", "flow", "stream_id")

    def __init__(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        self.stream_id = stream_id
        self.data = data
        self.end_stream = end_stream
        self.flow = len(data)  # padding is accounted for by the engine; consume exactly this


class RequestTrailers:
    """The request's trailer block; the request is complete."""

    __slots__ = ("fields", "stream_id")

    def __init__(self, stream_id: int, fields: tuple[Header, ...]) -> None:
        self.stream_id = stream_id
        self.fields = fields


class StreamReset:
    """A stream that had a request ended abnormally. ``remote``: the client sent RST_STREAM; otherwise the
    engine reset it because the client broke a stream rule (content-length vs DATA, flow control...)."""

    __slots__ = ("error_code", "remote", "stream_id")

    def __init__(self, stream_id: int, error_code: int, remote: bool) -> None:
        self.stream_id = stream_id
        self.error_code = error_code
        self.remote = remote


class StreamRefused:
    """A stream the engine refused before any request event (a malformed header block): counted, no more."""

    __slots__ = ("error_code", "reason", "stream_id")

    def __init__(self, stream_id: int, error_code: int, reason: str) -> None:
        self.stream_id = stream_id
        self.error_code = error_code
        self.reason = reason


class WindowOpened:
    """The client opened a send window: ``stream_id`` 0 means the connection's (every stream may go on).
    At most one per stream per ``receive`` call."""

    __slots__ = ("stream_id",)

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id


class GoAwayReceived:
    """The client will open no stream above ``last_stream_id`` (ours: it processes nothing of ours)."""

    __slots__ = ("error_code", "last_stream_id")

    def __init__(self, last_stream_id: int, error_code: int) -> None:
        self.last_stream_id = last_stream_id
        self.error_code = error_code


class GoAwaySent:
    """The final GOAWAY of a drain went out: streams up to ``last_stream_id`` are served to the end."""

    __slots__ = ("last_stream_id",)

    def __init__(self, last_stream_id: int) -> None:
        self.last_stream_id = last_stream_id


class ConnectionEnded:
    """The connection reads nothing more: write ``data_to_send()`` and close. ``reason`` is "" for a clean
    end (GOAWAY exchanged, every stream done), else the counter of what ended it; ``error_code`` the GOAWAY's."""

    __slots__ = ("error_code", "reason")

    def __init__(self, reason: str, error_code: int) -> None:
        self.reason = reason
        self.error_code = error_code


Event = (
    RequestHeaders
    | RequestData
    | RequestTrailers
    | StreamReset
    | StreamRefused
    | WindowOpened
    | GoAwayReceived
    | GoAwaySent
    | ConnectionEnded
)

# Every counter the adapter names (ConnectionEnded.reason, StreamRefused.reason).
REASONS: tuple[str, ...] = (
    "h2_malformed",
    "h2_continuation_flood",
    "h2_header_list_too_large",
    "h2_header_fields_too_many",
    "h2_ack_flood",
    "h2_rst_flood",
    "h2_glitch_flood",
    "h2_protocol_error",
    "h2_flow_control_error",
    "h2_frame_size_error",
    "h2_compression_error",
    "h2_stream_closed_error",
    "h2_engine_error",
    "h2_peer_goaway_error",
)


class ClientResponse:
    """The client side's result for one stream (``ClientConnection``): collected whole, for the probe.

    ``done`` once the stream ended: by END_STREAM (``reset`` None) or abnormally (``reset`` = the error code).
    ``fields`` is the final head, ``:status`` included; ``interim`` the 1xx heads before it."""

    __slots__ = ("body", "done", "fields", "interim", "reset", "status", "stream_id", "trailers")

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id
        self.status = 0
        self.fields: tuple[Header, ...] = ()
        self.interim: list[tuple[Header, ...]] = []
        self.body = bytearray()
        self.trailers: tuple[Header, ...] = ()
        self.done = False
        self.reset: int | None = None
