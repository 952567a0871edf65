"""The fixed scales shared counters are kept on: status-code slots, latency buckets, handshake-error reasons.

Fixed at import so a worker turns a status or a duration into a slot number with one lookup (no string keys,
no allocation on the request path), and every reader (publisher, Prometheus) names the slots the same way.
"""

from __future__ import annotations

import bisect

# Every status code registered with IANA gets its own slot; anything else is counted under its class
# ("2xx") or "other" (outside 100..599), so an odd backend code is counted, never dropped.
REGISTERED_STATUSES: tuple[int, ...] = (
    100, 101, 102, 103,
    200, 201, 202, 203, 204, 205, 206, 207, 208, 226,
    300, 301, 302, 303, 304, 305, 307, 308,
    400, 401, 402, 403, 404, 405, 406, 407, 408, 409, 410, 411, 412, 413, 414, 415, 416, 417, 418, 421, 422,
    423, 424, 425, 426, 428, 429, 431, 451,
    500, 501, 502, 503, 504, 505, 506, 507, 508, 510, 511,
)  # fmt: skip
STATUS_LABELS: tuple[str, ...] = (
    *(str(s) for s in REGISTERED_STATUSES),
    "1xx",
    "2xx",
    "3xx",
    "4xx",
    "5xx",
    "other",
)
STATUS_SLOTS = len(STATUS_LABELS)
_OTHER_STATUS = STATUS_SLOTS - 1
_CLASS_SLOT = {c: len(REGISTERED_STATUSES) + c - 1 for c in range(1, 6)}
OTHER_STATUS_SLOT = STATUS_SLOTS - 1
# A list indexed by the status code itself: one C-level index per request.
STATUS_SLOT_OF: list[int] = [_OTHER_STATUS] * 600
for _code in range(100, 600):
    STATUS_SLOT_OF[_code] = _CLASS_SLOT[_code // 100]
for _i, _code in enumerate(REGISTERED_STATUSES):
    STATUS_SLOT_OF[_code] = _i


def status_slot(status: int) -> int:
    return STATUS_SLOT_OF[status] if 0 <= status < 600 else _OTHER_STATUS


# Latency: request start -> last response byte. Upper bounds in seconds, log-spaced (1-2-5 per decade,
# factor 2-2.5 between neighbours) from 250 µs to 60 s, then +Inf: p50/p90/p99 land within one bucket
# anywhere from a loopback hit to a stuck upstream.
LATENCY_BOUNDS_S: tuple[float, ...] = (
    0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
LATENCY_BUCKETS = len(LATENCY_BOUNDS_S) + 1  # the last one is +Inf
LATENCY_BOUNDS_US = tuple(int(b * 1e6) for b in LATENCY_BOUNDS_S)


def latency_bucket(us: int) -> int:
    """Index of the first bucket whose upper bound is >= ``us`` microseconds (+Inf for the rest)."""
    return bisect.bisect_left(LATENCY_BOUNDS_US, us)


def quantile_ms(buckets: list[int], q: float) -> float:
    """``q`` of a (non-cumulative) bucket count list, interpolated linearly inside its bucket like
    Prometheus' ``histogram_quantile``; the +Inf bucket answers its lower bound. 0.0 for no observations."""
    total = sum(buckets)
    if total <= 0:
        return 0.0
    rank = q * total
    seen = 0
    for i, n in enumerate(buckets):
        if n and seen + n >= rank:
            lower = LATENCY_BOUNDS_S[i - 1] if i > 0 else 0.0
            if i >= len(LATENCY_BOUNDS_S):
                return round(lower * 1000.0, 3)
            upper = LATENCY_BOUNDS_S[i]
            return round((lower + (upper - lower) * (rank - seen) / n) * 1000.0, 3)
        seen += n
    return round(LATENCY_BOUNDS_S[-1] * 1000.0, 3)


def handshake_reason(text: str) -> str:
    """A stable reason name for a failed client TLS handshake, from the TLS layer's short error text.

    The names are the ``handshake_error_<reason>`` counters of ``sentin8.shm.counters``: a client that only
    offers classical key exchange or signatures (``classical_only``), one that asks for TLS < 1.3
    (``protocol_version``), no acceptable ALPN protocol (``alpn``), the deadline (``timeout``), a peer that
    closed mid-handshake (``eof``), and any other protocol failure (``protocol_error``).
    """
    t = text.lower()
    if t == "timeout":
        return "timeout"
    if "application protocol" in t:
        return "alpn"
    if "key share" in t or "shared group" in t or "signature" in t or "sigalg" in t or "shared cipher" in t:
        return "classical_only"
    if "unsupported protocol" in t or "protocol version" in t:
        return "protocol_version"
    if "eof" in t or "closed" in t or "reset" in t:
        return "eof"
    return "protocol_error"
