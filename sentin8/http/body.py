"""Request-body bounds, sans-IO: ``limits.max_request_body_bytes`` and chunk sizes that cannot be real.

The cap (0 = none, the default: bodies stream with bounded memory whatever their size, as HAProxy and Envoy
do, and tenant uploads are the backends' to limit) is checked against the declared ``Content-Length`` before a
byte of the body is read, against each chunk's declared size when its size line arrives (the body would pass
the cap if the chunk were sent), and against the bytes actually streamed. Over it: 413 while the response has
not started, else the connection is closed (the response cannot change status any more).

A chunk size above 2^63 - 1 is refused with 400 whatever the cap: no body that large can be sent, llhttp
accepts sizes up to 2^64 - 1, and a backend that reads a size into a signed 64-bit integer would see a
negative length (a framing disagreement between proxy and backend: the smuggling shape). Content-Length is
already held to 18 digits by ``validate_request``.
"""

from __future__ import annotations

MAX_CHUNK_SIZE = (1 << 63) - 1


def chunk_size_acceptable(size: int) -> bool:
    """Whether a declared chunk size could be real (at most 2^63 - 1)."""
    return 0 <= size <= MAX_CHUNK_SIZE


def body_over_limit(total: int | None, cap: int) -> bool:
    """Whether ``total`` body bytes (declared or streamed; None = no body declared) exceed the cap
    (0 = no cap)."""
    return cap > 0 and total is not None and total > cap
