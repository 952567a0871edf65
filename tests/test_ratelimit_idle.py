"""A bucket after idle time admits exactly ``burst`` back-to-back, then one per period (issue 16 item 6).

The bug: a bucket kept "the fraction of the next token" even after a long idle time, i.e. ``burst`` tokens plus
999,999 µ-units; a microsecond of refill made that a whole token, and back-to-back requests got ``burst + 1``
(burst 1: two, burst 5: six). Checked here on the sans-IO arithmetic, on the shared table in one process and
across processes, for every kind of history before the idle time; the fleet test is in
``test_fleet_protection.py``. The long-run rate (why the fraction is kept at all) is checked in
``test_policy.py``.
"""

from __future__ import annotations

import math
import mmap
import multiprocessing as mp
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sentin8 import tokenbucket
from sentin8.shm.ratelimit import BucketTable, region_bytes

SLOTS = 1024
BURSTS = [1, 2, 5, 100]
T0 = 1_000_000_000  # µs: where every history starts
Admit = Callable[[int], bool]  # one request at a time in µs -> admitted


def table() -> tuple[mmap.mmap, BucketTable]:
    mm = mmap.mmap(-1, region_bytes(SLOTS), flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    return mm, BucketTable(memoryview(mm), SLOTS, BucketTable.make_lock_fd())


class Sequential:
    """One bucket driven by the sans-IO functions alone, the way the table drives each of its entries."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens: int | None = None  # None: never seen (the table's new key: a full bucket)
        self.last = 0

    def __call__(self, now_us: int) -> bool:
        if self.tokens is None:
            self.tokens, self.last = int(self.burst * tokenbucket.UNIT), now_us
        else:
            self.tokens = tokenbucket.refill(self.tokens, self.last, now_us, self.rate, self.burst)
            self.last = max(self.last, now_us)
        ok, self.tokens = tokenbucket.take(self.tokens)
        return ok


def on_table(rate: float, burst: float, key: str = "idle-key") -> Admit:
    _, t = table()
    return lambda now_us: t.admit(key, now_us, rate, burst)


def period_us(rate: float) -> int:
    return math.ceil(1e6 / rate)


# ---- histories: what the bucket lived through before the idle time; each returns its last request's time ----


def new_key(admit: Admit, rate: float, burst: float) -> int:
    return T0


def one_request(admit: Admit, rate: float, burst: float) -> int:
    admit(T0)
    return T0


def drained(admit: Admit, rate: float, burst: float) -> int:
    for i in range(int(burst) + 3):
        admit(T0 + i)
    return T0 + int(burst) + 2


def hammered(admit: Admit, rate: float, burst: float) -> int:
    """Demand above the rate: an attempt every seventh of a period for 50 periods (refusals, kept fractions)."""
    step = period_us(rate) // 7
    now = T0
    for _ in range(350):
        admit(now)
        now += step
    return now - step


def refused_just_before_a_token(admit: Admit, rate: float, burst: float) -> int:
    """The worst case for a kept fraction: drained, then refused a microsecond before its token matured."""
    last = drained(admit, rate, burst)
    now = last + period_us(rate) - 1
    admit(now)
    return now


def clumpy(admit: Admit, rate: float, burst: float) -> int:
    """Clumps of 1-4 requests with gaps shorter than a period, as event loops answer them."""
    import random

    rnd = random.Random(16)
    now = T0
    for _ in range(300):
        now += int(rnd.uniform(0.2, 0.95) * period_us(rate))
        for _ in range(rnd.randint(1, 4)):
            admit(now)
    return now


def sparse(admit: Admit, rate: float, burst: float) -> int:
    """Under the rate: one request every 0.99 of a period (the bucket stays full, never idle for a period)."""
    now = T0
    for _ in range(200):
        admit(now)
        now += int(0.99 * period_us(rate))
    return now - int(0.99 * period_us(rate))


HISTORIES = [new_key, one_request, drained, hammered, refused_just_before_a_token, clumpy, sparse]


def idle_gaps(rate: float, burst: float) -> list[int]:
    """Idle times that refill any bucket to ``burst``: exactly that long (never shorter than one period), longer
    by half a period, twice as long plus one, and an hour."""
    fill = max(1.0, burst) * 1e6 / rate
    return [math.ceil(fill), math.ceil(fill + 0.5e6 / rate), math.ceil(2 * fill + 1e6 / rate), 3600 * 1_000_000]


def back_to_back_then_next(admit: Admit, start: int, rate: float, burst: float) -> tuple[int, int]:
    """``burst + 10`` requests a microsecond apart from ``start``, then one every 1/50 of a period until one is
    admitted: (admitted back-to-back, when the next one was admitted, in µs after ``start``)."""
    n = int(burst) + 10
    got = sum(admit(start + i) for i in range(n))
    step = period_us(rate) // 50
    now = start + n
    while not admit(now):
        now += step
    return got, now - start


@pytest.mark.parametrize("burst", BURSTS)
@pytest.mark.parametrize("rate", [1.0, 10.0, 200.0])
@pytest.mark.parametrize("history", HISTORIES, ids=lambda h: h.__name__)
@pytest.mark.parametrize("where", ["sans-io", "shm-table"])
def test_after_any_idle_time_back_to_back_requests_get_exactly_burst(where, history, rate, burst):
    for gap in idle_gaps(rate, burst):
        admit = Sequential(rate, burst) if where == "sans-io" else on_table(rate, burst)
        last = history(admit, rate, burst)
        got, next_after = back_to_back_then_next(admit, last + gap, rate, burst)
        assert got == burst, (history.__name__, gap, got)
        # then one per period, as a plain token bucket would: not a microsecond earlier, at most one step late
        period = 1e6 / rate
        assert period - 1 <= next_after <= period + period_us(rate) // 50 + int(burst) + 10, (gap, next_after)


@pytest.mark.parametrize("burst", [1.5, 2.5, 7.25])
def test_a_fractional_burst_admits_its_whole_part_after_idle(burst):
    for history in HISTORIES:
        admit = on_table(10.0, burst)
        last = history(admit, 10.0, burst)
        got, _ = back_to_back_then_next(admit, last + 3600 * 1_000_000, 10.0, burst)
        assert got == int(burst), (history.__name__, got)


@settings(max_examples=300, deadline=None)
@given(
    burst=st.sampled_from([1, 2, 3, 5, 10, 100, 2.5]),
    rate=st.sampled_from([1.0, 10.0, 200.0, 1000.0]),
    gaps=st.lists(st.floats(0.0, 3.0), min_size=1, max_size=60),  # in periods, before each request
    idle=st.floats(1.0, 500.0),  # in "fill times" (max(1, burst) periods)
)
def test_any_history_then_idle_gives_burst_back_to_back_on_the_table_and_in_replay(burst, rate, gaps, idle):
    """Whatever came before (random gaps: above, at and below the rate), an idle gap long enough to refill the
    bucket gives exactly the whole part of ``burst`` back-to-back, and the shared table decides exactly what the
    sans-IO replay decides."""
    replay, shared = Sequential(rate, burst), on_table(rate, burst)
    now = T0
    for g in gaps:
        now += int(g * 1e6 / rate)
        assert replay(now) == shared(now)
    start = now + math.ceil(idle * max(1.0, burst) * 1e6 / rate)
    run = [start + i for i in range(int(burst) + 5)]
    decided = [(replay(t), shared(t)) for t in run]
    assert all(a == b for a, b in decided)
    assert sum(a for a, _ in decided) == int(burst)


def _run_after_idle(mm, lock_fd, rate, burst, n, barrier, out):
    t = BucketTable(memoryview(mm), SLOTS, lock_fd)
    clock = lambda: int(time.time() * 1e6)  # noqa: E731
    barrier.wait(10)
    out.put([t.decide("fleet-key", clock, rate, burst)[::2] for _ in range(n)])


@pytest.mark.parametrize("burst", BURSTS)
@pytest.mark.parametrize("history", [one_request, drained, hammered, refused_just_before_a_token, clumpy])
def test_across_processes_the_table_admits_exactly_burst_after_idle(history, burst):
    """Four processes, released together, send requests back-to-back on one key whose bucket has been idle: the
    fleet admits ``burst`` in all, not ``burst + 1`` (nor four times it)."""
    ctx = mp.get_context("fork")
    mm, t = table()
    rate = 0.5  # a period of 2 s: the run below takes milliseconds, so no token matures during it
    # the history happened an hour ago (on the real clock the processes use): idle since
    offset = int(time.time() * 1e6) - 3600 * 1_000_000 - T0
    history(lambda now_us: t.admit("fleet-key", now_us + offset, rate, burst), rate, burst)
    procs_n, per_proc = 4, int(burst) // 4 + 5
    barrier, out = ctx.Barrier(procs_n), ctx.Queue()
    procs = [
        ctx.Process(target=_run_after_idle, args=(mm, t.lock_fd, rate, burst, per_proc, barrier, out))
        for _ in range(procs_n)
    ]
    for p in procs:
        p.start()
    decisions = [d for _ in procs for d in out.get(timeout=30)]
    for p in procs:
        p.join(10)
    times = sorted(at for _, at in decisions)
    assert times[-1] - times[0] < 1e6 / rate, "the run took a whole token period: the count below would not hold"
    assert sum(ok for ok, _ in decisions) == burst
