"""Token bucket arithmetic (sans-IO): integers only, tokens in micro-units, refill by elapsed microseconds."""

from __future__ import annotations

import math

UNIT = 1_000_000  # one token


def capacity(burst: float) -> int:
    """The most µ-units a bucket holds while requests keep coming: ``burst`` whole tokens plus the fraction of
    the next one (``refill`` says when the fraction is kept).

    Capping at exactly ``burst`` throws away the part of a token that matures while the bucket is full. At
    burst 1 under demand above the rate, the token matures between two attempts and each admitted request lost
    the time since it did: a quarter under the configured rate in the tests' clumpy arrivals (event loops answer
    in batches, clients in waves). Keeping the fraction (never a whole extra token) gives the configured rate.
    """
    whole = int(burst * UNIT)
    return whole + UNIT - 1 if whole % UNIT == 0 else whole


def refill(tokens_u: int, last_us: int, now_us: int, rate_per_s: float, burst: float) -> int:
    """Tokens (µ-units) after refilling from ``last_us`` (the bucket's last decision) to ``now_us``.

    Over ``burst`` the fraction of a token is kept (``capacity``) only across a gap shorter than one token
    period (``1 / rate_per_s``): the demand was there, and its token matured between two attempts. A gap of a
    whole period or more is idle time, and the bucket then holds at most exactly ``burst``: kept there, a
    fraction close to a whole token became one within a microsecond, and back-to-back requests after any idle
    time got ``burst + 1``. So, whatever the history, back-to-back requests after an idle gap long enough to
    refill the bucket get exactly ``burst``, then one per period (the plain token bucket's count). A clock that
    went back adds nothing.
    """
    elapsed = now_us - last_us
    if elapsed <= 0:
        return tokens_u
    # rate tokens/s = rate µ-units per µs
    added = int(elapsed * rate_per_s)
    tokens = tokens_u + added
    full = int(burst * UNIT)
    if tokens <= full:
        return tokens
    if added >= UNIT:
        return full  # idle for a whole token period: exactly burst, no fraction carried
    return min(capacity(burst), tokens)


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
