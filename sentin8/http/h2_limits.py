"""The HTTP/2 limits of one client connection (issue 17 §3 defaults), engine-free: the adapter applies them."""

from __future__ import annotations


class H2Limits:
    """The §3 defaults of issue 17; ``from_policy`` binds the header caps to ``[policy]``."""

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
        "reset_rate",
    )

    def __init__(
        self,
        *,
        max_concurrent_streams: int = 100,
        initial_window: int = 65536,
        connection_window: int = 1 << 20,
        header_table: int = 4096,
        max_frame: int = 16384,
        max_continuations: int = 8,
        max_header_list_bytes: int = 65536,
        max_header_fields: int = 200,
        max_queued_acks: int = 1000,
        reset_rate: tuple[int, int] = (1000, 33),
        glitch_rate: tuple[int, int] = (1000, 33),
    ) -> None:
        self.max_concurrent_streams = max_concurrent_streams
        self.initial_window = initial_window  # per stream, what the client may send before we consume
        self.connection_window = connection_window  # all streams together
        self.header_table = header_table  # HPACK dynamic table the client's encoder may use
        self.max_frame = max_frame
        self.max_continuations = max_continuations
        self.max_header_list_bytes = max_header_list_bytes  # decoded, 32 B per field included
        self.max_header_fields = max_header_fields  # decoded fields of one block (pseudo and crumbs included)
        self.max_queued_acks = max_queued_acks  # SETTINGS/PING ACKs (and RSTs) not yet taken by data_to_send
        self.reset_rate = reset_rate  # (burst, per second) of RST_STREAM from the client: nghttp2's default
        self.glitch_rate = glitch_rate  # (burst, per second) of suspicious frames: nghttp2's own default

    @classmethod
    def from_policy(cls, max_header_bytes: int, max_headers: int) -> H2Limits:
        """``policy.max_header_bytes`` bounds the decoded list as HPACK counts it (32 B per field);
        ``policy.max_headers`` is checked on the mapped head (h2_request), so the engine allows twice as many
        decoded fields, as HAProxy does: browsers send each cookie as its own field ("crumbs"), and 2x still
        stops the many-one-byte-references bomb at a few hundred fields."""
        return cls(max_header_list_bytes=max_header_bytes, max_header_fields=2 * max_headers + 4)
