"""The per-instance circuit breaker (sans-IO): Closed -> Open -> HalfOpen -> Closed, as rsx-gateway does it.

- **Closed**: traffic flows. ``failures`` consecutive failures, or a failure ratio of at least ``failure_ratio``
  over at least ``min_requests`` results in the current ``window_s`` window, open it.
- **Open** for ``open_s``: the instance gets nothing (fail fast instead of queueing on a dead backend).
- **HalfOpen** after that: exactly one request (the probe) is let through; ``probe_timeout_s`` later another
  may be, if the first never reported. A success closes the breaker, a failure opens it again.

A breaker is a record of ``WORDS`` integers (µs timestamps), so the same functions run over a list in tests
and over a slice of shared memory in the fleet. State is implicit: ``opened_until`` 0 = closed, in the future
= open, in the past = half-open.
"""

from __future__ import annotations

from collections.abc import MutableSequence
from dataclasses import dataclass

# record layout
OPENED_UNTIL, CONSECUTIVE, WINDOW_START, WINDOW_TOTAL, WINDOW_FAILED, PROBE_UNTIL = range(6)
WORDS = 6

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass(frozen=True)
class BreakerRules:
    failures: int = 5
    failure_ratio: float = 0.5
    min_requests: int = 20
    window_s: float = 10.0
    open_s: float = 10.0
    probe_timeout_s: float = 10.0


def state(rec: MutableSequence[int], now_us: int) -> str:
    until = rec[OPENED_UNTIL]
    if until == 0:
        return CLOSED
    return OPEN if now_us < until else HALF_OPEN


def allow(rec: MutableSequence[int], now_us: int, rules: BreakerRules) -> bool:
    """May a request go to this instance now? In HalfOpen this claims the one probe."""
    until = rec[OPENED_UNTIL]
    if until == 0:
        return True
    if now_us < until:
        return False
    if rec[PROBE_UNTIL] > now_us:
        return False  # a probe is out
    rec[PROBE_UNTIL] = now_us + int(rules.probe_timeout_s * 1e6)
    return True


def record(rec: MutableSequence[int], ok: bool, now_us: int, rules: BreakerRules) -> str | None:
    """Account one result; returns the transition it caused (``OPEN`` or ``CLOSED``), if any."""
    until = rec[OPENED_UNTIL]
    if until != 0:
        if now_us < until:
            return None  # a request let through before it opened: its result says nothing new
        if ok:  # the probe came back: close, start afresh
            _reset(rec, now_us)
            return CLOSED
        _open(rec, now_us, rules)
        return OPEN
    if now_us - rec[WINDOW_START] > rules.window_s * 1e6:
        rec[WINDOW_START], rec[WINDOW_TOTAL], rec[WINDOW_FAILED] = now_us, 0, 0
    rec[WINDOW_TOTAL] += 1
    if ok:
        if rec[CONSECUTIVE]:
            rec[CONSECUTIVE] = 0
        return None
    rec[CONSECUTIVE] += 1
    rec[WINDOW_FAILED] += 1
    total = rec[WINDOW_TOTAL]
    if rec[CONSECUTIVE] >= rules.failures or (
        total >= rules.min_requests and rec[WINDOW_FAILED] >= rules.failure_ratio * total
    ):
        _open(rec, now_us, rules)
        return OPEN
    return None


def retry_after_s(rec: MutableSequence[int], now_us: int) -> float:
    """Seconds until an open breaker lets a probe through (0 when it is not open)."""
    until = rec[OPENED_UNTIL]
    return max(0.0, (until - now_us) / 1e6) if until else 0.0


def _open(rec: MutableSequence[int], now_us: int, rules: BreakerRules) -> None:
    rec[OPENED_UNTIL] = now_us + max(1, int(rules.open_s * 1e6))
    rec[PROBE_UNTIL] = 0
    rec[CONSECUTIVE] = 0
    rec[WINDOW_START], rec[WINDOW_TOTAL], rec[WINDOW_FAILED] = now_us, 0, 0


def _reset(rec: MutableSequence[int], now_us: int) -> None:
    rec[OPENED_UNTIL] = 0
    rec[PROBE_UNTIL] = 0
    rec[CONSECUTIVE] = 0
    rec[WINDOW_START], rec[WINDOW_TOTAL], rec[WINDOW_FAILED] = now_us, 0, 0
