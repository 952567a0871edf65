"""Token bucket arithmetic (sans-IO): integers only, tokens in micro-units, refill by elapsed microseconds."""

from __future__ import annotations

UNIT = 1_000_000  # one token


def refill(tokens_u: int, last_us: int, now_us: int, rate_per_s: float, burst: float) -> int:
    """Tokens (µ-units) after refilling from ``last_us`` to ``now_us``; a clock that went back adds nothing."""
    elapsed = now_us - last_us
    if elapsed <= 0:
        return tokens_u
    # rate tokens/s = rate µ-units per µs
    return min(int(burst * UNIT), tokens_u + int(elapsed * rate_per_s))


def take(tokens_u: int, cost: int = 1) -> tuple[bool, int]:
    """(admitted, tokens left)."""
    need = cost * UNIT
    if tokens_u >= need:
        return True, tokens_u - need
    return False, tokens_u
