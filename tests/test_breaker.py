"""Circuit breaker and per-client connection counts: the sans-IO state machine and the shared-memory tables."""

from __future__ import annotations

import mmap
import multiprocessing as mp

from sentin8 import breaker
from sentin8.breaker import BreakerRules
from sentin8.shm.breakers import BreakerTable
from sentin8.shm.breakers import region_bytes as breaker_bytes
from sentin8.shm.conncap import ConnectionCounts
from sentin8.shm.conncap import region_bytes as conncap_bytes

RULES = BreakerRules(failures=3, failure_ratio=0.5, min_requests=10, window_s=10, open_s=2, probe_timeout_s=1)
S = 1_000_000  # µs


def fresh() -> list[int]:
    return [0] * breaker.WORDS


def test_consecutive_failures_open_then_one_probe_then_close():
    rec, t = fresh(), 100 * S
    assert breaker.record(rec, False, t, RULES) is None
    assert breaker.record(rec, True, t, RULES) is None  # a success resets the run
    for _ in range(2):
        assert breaker.record(rec, False, t, RULES) is None
    assert breaker.record(rec, False, t, RULES) == breaker.OPEN
    assert breaker.state(rec, t) == breaker.OPEN and not breaker.allow(rec, t + S, RULES)
    assert breaker.retry_after_s(rec, t + S) == 1.0
    # cool-down over: HalfOpen lets exactly one probe through
    t2 = t + 2 * S
    assert breaker.state(rec, t2) == breaker.HALF_OPEN
    assert breaker.allow(rec, t2, RULES) and not breaker.allow(rec, t2, RULES)
    assert breaker.record(rec, True, t2, RULES) == breaker.CLOSED
    assert breaker.state(rec, t2) == breaker.CLOSED and breaker.allow(rec, t2, RULES)


def test_failed_probe_opens_again_and_a_lost_probe_frees_the_next():
    rec, t = fresh(), 100 * S
    for _ in range(3):
        breaker.record(rec, False, t, RULES)
    t += 2 * S
    assert breaker.allow(rec, t, RULES)
    assert breaker.record(rec, False, t, RULES) == breaker.OPEN
    assert not breaker.allow(rec, t + S, RULES)
    t += 2 * S
    assert breaker.allow(rec, t, RULES)  # a probe that never reports ...
    assert not breaker.allow(rec, t + S // 2, RULES)
    assert breaker.allow(rec, t + S + 1, RULES)  # ... frees the next one after probe_timeout_s


def test_failure_ratio_opens_without_a_long_run():
    rec, t = fresh(), 100 * S
    results = [True, False] * 4 + [True]  # never 3 failures in a row; 4 of 9
    for ok in results:
        assert breaker.record(rec, ok, t, RULES) is None
    assert breaker.record(rec, False, t, RULES) == breaker.OPEN  # 5 of 10 = the ratio


def test_the_ratio_window_restarts():
    rec, t = fresh(), 100 * S
    for ok in [True, False] * 4 + [True]:
        breaker.record(rec, ok, t, RULES)
    assert breaker.record(rec, False, t + 11 * S, RULES) is None  # a new window: 1 of 1 is under min_requests


def table(slots: int = 64, clock=None) -> BreakerTable:
    mm = mmap.mmap(-1, breaker_bytes(slots), flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    return BreakerTable(memoryview(mm), slots, RULES, clock or (lambda: 100.0))


def _fail(view_owner_mm, slots, n):
    t = BreakerTable(memoryview(view_owner_mm), slots, RULES, lambda: 100.0)
    for _ in range(n):
        t.record("web-1", False)


def test_shared_table_one_process_opens_it_for_another():
    mm = mmap.mmap(-1, breaker_bytes(64), flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    now = [100.0]
    mine = BreakerTable(memoryview(mm), 64, RULES, lambda: now[0])
    assert mine.allow("web-1") and mine.state("web-1") == breaker.CLOSED
    assert mine.record("web-1", True) is None  # no failure yet: no entry, no write
    p = mp.get_context("fork").Process(target=_fail, args=(mm, 64, 3))
    p.start()
    p.join(10)
    assert mine.state("web-1") == breaker.OPEN and not mine.allow("web-1")
    assert mine.allow("web-2")  # other instances are untouched
    now[0] += 2.5
    assert mine.allow("web-1") and not mine.allow("web-1")  # one probe, fleet-wide
    assert mine.record("web-1", True) == breaker.CLOSED


def test_a_full_table_never_evicts_an_open_breaker():
    t = table(slots=64)
    for _ in range(3):
        t.record("victim", False)
    for i in range(2000):  # a churn of failing ids through the same table
        t.record(f"other-{i}", False)
    assert t.state("victim") == breaker.OPEN


def counts(workers: int = 3, slots: int = 1024) -> tuple[mmap.mmap, list[ConnectionCounts]]:
    mm = mmap.mmap(-1, conncap_bytes(slots, workers), flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    return mm, [ConnectionCounts(memoryview(mm), slots, workers, w) for w in range(workers)]


def test_connection_cap_counts_across_workers_and_releases():
    _, (w0, w1, _w2) = counts()
    assert w0.acquire("198.51.100.7", 3) and w1.acquire("198.51.100.7", 3) and w1.acquire("198.51.100.7", 3)
    assert not w0.acquire("198.51.100.7", 3)  # the fleet holds 3: a fourth is refused, whichever worker
    assert w0.acquire("198.51.100.8", 3)  # another address has its own count
    w1.release("198.51.100.7")
    assert w0.count("198.51.100.7") == 2 and w0.acquire("198.51.100.7", 3)


def test_a_dead_workers_connections_are_forgotten():
    mm, (w0, w1, _w2) = counts()
    for _ in range(3):
        w1.acquire("203.0.113.9", 3)
    assert not w0.acquire("203.0.113.9", 3)
    reader = ConnectionCounts(memoryview(mm), 1024, 3, None)
    reader.zero_column(1)  # the supervisor, when worker slot 1 died
    assert reader.count("203.0.113.9") == 0 and w0.acquire("203.0.113.9", 3)


def test_collisions_only_ever_overcount():
    _, (w0, *_rest) = counts(workers=1, slots=64)
    addresses = [f"10.9.{i >> 8}.{i & 255}" for i in range(500)]
    for a in addresses:
        w0.acquire(a, 10**6)
    assert all(w0.count(a) >= 1 for a in addresses)  # a sketch never under-counts
