"""The HTTP/2 limits of one client connection, engine-free: the adapter (h2_engine) and the budgets (h2_budget)
apply them.

The numbers an operator may change are ``[http2]`` keys (``sentin8.config.Http2``): its defaults are the only
place those numbers are written; ``from_config`` reads a loaded config, ``H2Limits()`` takes the defaults (the
in-memory tests and benches). What is not a key is fixed here, with its reason.
"""

from __future__ import annotations

from sentin8.config import Config, Http2

_D = Http2()  # the defaults of every [http2] key

MAX_CONTINUATIONS = 8  # CONTINUATION frames after one HEADERS (issue 17 §3; a browser never needs one)
RESET_RATE = (1000, 33)  # (burst, per second) of RST_STREAM from the client: nghttp2's default
GLITCH_RATE = (1000, 33)  # (burst, per second) of suspicious frames: nghttp2's own default


class H2Limits:
    """One connection's limits; ``from_config`` binds them to ``[http2]`` and the header caps to ``[policy]``."""

    __slots__ = (
        "connection_window",
        "glitch_rate",
        "header_table",
        "initial_window",
        "max_concurrent_streams",
        "max_continuations",
        "max_frame",
        "max_header_fields",
        "max_header_list_bytes",
        "max_queued_acks",
        "max_streams",
        "reset_min_streams",
        "reset_rate",
        "reset_window_s",
    )

    def __init__(
        self,
        *,
        max_concurrent_streams: int = _D.max_concurrent_streams,
        max_streams: int = _D.max_streams_per_connection,
        initial_window: int = _D.initial_stream_window,
        connection_window: int = _D.connection_window,
        header_table: int = _D.header_table_size,
        max_frame: int = _D.max_frame_size,
        max_queued_acks: int = _D.max_queued_acks,
        reset_min_streams: int = _D.premature_reset_min_streams,
        reset_window_s: float = _D.premature_reset_window_s,
        max_continuations: int = MAX_CONTINUATIONS,
        max_header_list_bytes: int = 65536,
        max_header_fields: int = 200,
        reset_rate: tuple[int, int] = RESET_RATE,
        glitch_rate: tuple[int, int] = GLITCH_RATE,
    ) -> None:
        self.max_concurrent_streams = max_concurrent_streams  # advertised, and the budget's cap
        self.max_streams = max_streams  # streams over the connection's life, then GOAWAY NO_ERROR
        self.initial_window = initial_window  # per stream, what the client may send before we consume
        self.connection_window = connection_window  # all streams together
        self.header_table = header_table  # HPACK dynamic table the client's encoder may use
        self.max_frame = max_frame
        self.max_queued_acks = max_queued_acks  # SETTINGS/PING ACKs (and RSTs) not yet taken by data_to_send
        self.reset_min_streams = reset_min_streams  # the premature-reset budget judges from this many closed
        self.reset_window_s = reset_window_s  # ... a reset sooner than this after opening is premature
        self.max_continuations = max_continuations
        self.max_header_list_bytes = max_header_list_bytes  # decoded, 32 B per field included
        self.max_header_fields = max_header_fields  # decoded fields of one block (pseudo and crumbs included)
        self.reset_rate = reset_rate
        self.glitch_rate = glitch_rate

    @classmethod
    def from_config(cls, cfg: Config) -> H2Limits:
        """``[http2]`` as loaded (and checked: RFC 9113 ranges) plus the header caps of ``[policy]``."""
        h2 = cfg.http2
        limits = cls.from_policy(cfg.policy.max_header_bytes, cfg.policy.max_headers)
        limits.max_concurrent_streams = h2.max_concurrent_streams
        limits.max_streams = h2.max_streams_per_connection
        limits.initial_window = h2.initial_stream_window
        limits.connection_window = h2.connection_window
        limits.header_table = h2.header_table_size
        limits.max_frame = h2.max_frame_size
        limits.max_queued_acks = h2.max_queued_acks
        limits.reset_min_streams = h2.premature_reset_min_streams
        limits.reset_window_s = h2.premature_reset_window_s
        return limits

    @classmethod
    def from_policy(cls, max_header_bytes: int, max_headers: int) -> H2Limits:
        """``policy.max_header_bytes`` bounds the decoded list as HPACK counts it (32 B per field);
        ``policy.max_headers`` is checked on the mapped head (h2_request), so the engine allows twice as many
        decoded fields, as HAProxy does: browsers send each cookie as its own field ("crumbs"), and 2x still
        stops the many-one-byte-references bomb at a few hundred fields."""
        return cls(max_header_list_bytes=max_header_bytes, max_header_fields=2 * max_headers + 4)
