"""Token bucket arithmetic (sans-IO): integers only, tokens in micro-units, refill by elapsed microseconds."""

from __future__ import annotations

import math

UNIT = 1_000_000  # one token


def capacity(burst: float) -> int:
    """The most µ-units a bucket holds: ``burst`` whole tokens plus the fraction of the next one.

    Capping at exactly ``burst`` throws away the part of a token that matures while the bucket is full. With a
    small burst and clumpy arrivals (event loops answer in batches, clients in waves) the bucket is full between
    most clumps, and every clump lost the fraction that had accrued: 5-10 % under the configured rate at
    burst 1-10. Keeping the fraction (never a whole extra token) admits no more than ``burst`` requests at one
    instant and keeps the long-run rate at the configured one.
    """
    whole = int(burst * UNIT)
    return whole + UNIT - 1 if whole % UNIT == 0 else whole


def refill(tokens_u: int, last_us: int, now_us: int, rate_per_s: float, burst: float) -> int:
    """Tokens (µ-units) after refilling from ``last_us`` to ``now_us``; a clock that went back adds nothing."""
    elapsed = now_us - last_us
    if elapsed <= 0:
        return tokens_u
    # rate tokens/s = rate µ-units per µs
    return min(capacity(burst), tokens_u + int(elapsed * rate_per_s))


def take(tokens_u: int, cost: int = 1) -> tuple[bool, int]:
    """(admitted, tokens left)."""
    need = cost * UNIT
    if tokens_u >= need:
        return True, tokens_u - need
    return False, tokens_u


def seconds_until(tokens_u: int, rate_per_s: float, cost: int = 1) -> float:
    """How long until ``cost`` tokens are there again, refilling at ``rate_per_s`` (0 when they already are)."""
    missing = cost * UNIT - tokens_u
    return 0.0 if missing <= 0 else missing / (rate_per_s * UNIT)


def retry_after_s(tokens_u: int, rate_per_s: float) -> int:
    """``Retry-After`` in whole seconds (RFC 9110 §10.2.3 delta-seconds): rounded up, at least 1."""
    return max(1, math.ceil(seconds_until(tokens_u, rate_per_s)))
