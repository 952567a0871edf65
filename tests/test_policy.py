"""Rate limiting across processes through the shared bucket table, and the edge policy object."""

from __future__ import annotations

import fcntl
import mmap
import multiprocessing as mp
import os
import signal
import time

import pytest

from sentin8 import tokenbucket
from sentin8.config import Policy
from sentin8.policy import EdgePolicy, rate_limit_headers, rate_limit_key
from sentin8.shm.ratelimit import STRIPES, BucketTable, key_hash, region_bytes
from tests.peers import wait_until

SLOTS = 1024


def table() -> tuple[mmap.mmap, BucketTable]:
    mm = mmap.mmap(-1, region_bytes(SLOTS), flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    return mm, BucketTable(memoryview(mm), SLOTS, BucketTable.make_lock_fd())


def test_token_bucket_arithmetic():
    full = 10 * tokenbucket.UNIT
    assert tokenbucket.refill(0, 0, 1_000_000, rate_per_s=5, burst=10) == 5 * tokenbucket.UNIT
    # idle for a whole token period (0.2 s here) or more: exactly burst, no fraction carried (issue 16 item 6)
    assert tokenbucket.refill(0, 0, 10_000_000, rate_per_s=5, burst=10) == full
    assert tokenbucket.refill(full - 1, 0, 200_000, rate_per_s=5, burst=10) == full
    # across a shorter gap: burst whole tokens plus the fraction of the next one (never a whole extra token)
    half = tokenbucket.UNIT // 2
    assert tokenbucket.refill(half, 0, 150_000, rate_per_s=5, burst=1) == tokenbucket.UNIT + half // 2
    assert tokenbucket.refill(full - 1, 0, 199_999, rate_per_s=5, burst=10) == full + 999_994  # 1 µs short
    assert tokenbucket.refill(0, 0, 10_000_000, rate_per_s=5, burst=2.5) == int(2.5 * tokenbucket.UNIT)
    assert tokenbucket.refill(7, 100, 50, rate_per_s=5, burst=10) == 7  # clock went back: nothing added
    assert tokenbucket.take(tokenbucket.UNIT) == (True, 0)
    assert tokenbucket.take(tokenbucket.UNIT - 1) == (False, tokenbucket.UNIT - 1)


def test_burst_then_refill_with_a_fake_clock():
    _, t = table()
    now = 1_000_000_000
    admitted = sum(t.admit("1.2.3.4", now, 10, 5) for _ in range(20))
    assert admitted == 5
    assert t.admit("1.2.3.4", now + 100_000, 10, 5)  # 0.1 s at 10/s = one token
    assert not t.admit("1.2.3.4", now + 100_000, 10, 5)
    assert t.admit("5.6.7.8", now, 10, 5)  # other keys have their own bucket


def test_rotating_address_flood_stays_bounded_and_keeps_recent_keys():
    mm, t = table()
    now = 1_000_000_000
    for i in range(50_000):
        t.admit(f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}", now + i, 1, 1)
    assert len(mm) == region_bytes(SLOTS)  # fixed memory whatever the key count
    # the most recent key is still tracked: its bucket is empty now
    assert not t.admit(f"10.0.{(49_999 >> 8) & 255}.{49_999 & 255}", now + 50_000, 1, 1)


def _hammer(mm, lock_fd, until, rate, burst, out):
    t = BucketTable(memoryview(mm), SLOTS, lock_fd)
    n = 0
    while time.time() < until:
        n += t.admit("shared-key", int(time.time() * 1e6), rate, burst)
    out.put(n)


def test_admitted_rate_across_processes_is_the_configured_rate_not_n_times_it():
    ctx = mp.get_context("fork")
    mm, t = table()
    rate, burst, duration = 200.0, 50.0, 1.5
    until = time.time() + duration
    out = ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(mm, t.lock_fd, until, rate, burst, out)) for _ in range(4)]
    start = time.time()
    for p in procs:
        p.start()
    total = sum(out.get(timeout=20) for _ in procs)
    elapsed = time.time() - start
    for p in procs:
        p.join(5)
    expected_max = burst + rate * elapsed
    assert total <= expected_max + 2, (total, expected_max)
    assert total >= burst + rate * (duration - 0.3), (total, duration)


def _hold_stripe_and_wait(lock_fd, stripe, ready):
    fcntl.lockf(lock_fd, fcntl.LOCK_EX, 1, stripe)
    ready.set()
    time.sleep(60)  # killed while holding the stripe


def test_a_worker_killed_holding_a_stripe_does_not_wedge_it():
    ctx = mp.get_context("fork")
    _mm, t = table()
    stripe = key_hash("victim-key") % STRIPES
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_stripe_and_wait, args=(t.lock_fd, stripe, ready))
    holder.start()
    assert ready.wait(10)
    # while held, a non-blocking attempt fails: the lock is real
    probe = ctx.Process(target=_try_lock, args=(t.lock_fd, stripe))
    probe.start()
    probe.join(10)
    assert probe.exitcode == 1
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    # the kernel released the range: admission on that stripe works again
    wait_until(lambda: t.admit("victim-key", int(time.time() * 1e6), 10, 10), 5, what="stripe released")


def _try_lock(lock_fd, stripe):
    try:
        fcntl.lockf(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, stripe)
    except OSError:
        os._exit(1)
    os._exit(0)


def test_sigkill_under_load_leaves_the_others_running():
    ctx = mp.get_context("fork")
    mm, t = table()
    until = time.time() + 1.5
    out = ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(mm, t.lock_fd, until, 1e6, 1e6, out)) for _ in range(3)]
    for p in procs:
        p.start()
    time.sleep(0.3)  # let them contend first: load shape, not synchronisation
    os.kill(procs[0].pid, signal.SIGKILL)
    counts = [out.get(timeout=20) for _ in procs[1:]]
    assert all(c > 100 for c in counts)
    for p in procs:
        p.join(5)


def test_edge_policy_rate_limit_verdict_and_off_by_default():
    _, t = table()
    now = [1000.0]
    pol = EdgePolicy(Policy(rate_limit=True, rate_limit_rps=1, rate_limit_burst=1), t, lambda: now[0])
    assert pol.check("9.9.9.9", "a.test", b"/") is None
    v = pol.check("9.9.9.9", "a.test", b"/")
    assert (v.status, v.counter, v.keep_alive) == (429, "policy_rate_limit", True)
    assert EdgePolicy(Policy(), t).check("9.9.9.9", "a.test", b"/") is None  # off by default
    assert EdgePolicy(Policy(), t).waf_engine() is None


def test_retry_after_and_ratelimit_headers():
    assert tokenbucket.retry_after_s(0, 200) == 1  # 5 ms to the next token: at least one whole second
    assert tokenbucket.retry_after_s(0, 0.1) == 10
    assert tokenbucket.retry_after_s(tokenbucket.UNIT // 2, 0.1) == 5
    headers = dict(rate_limit_headers(0.5, 0))
    assert headers == {b"Retry-After": b"2", b"RateLimit-Policy": b'"edge";q=1;w=1', b"RateLimit": b'"edge";r=0;t=2'}


def test_rate_limit_keys():
    assert rate_limit_key("ip", "1.2.3.4", "a.test") == "1.2.3.4"
    assert rate_limit_key("ip+host", "1.2.3.4", "a.test") == "1.2.3.4|a.test"
    assert rate_limit_key("host", "1.2.3.4", "a.test") == rate_limit_key("host", "5.6.7.8", "a.test") == "|a.test"
    _, t = table()
    now = [1000.0]
    pol = EdgePolicy(
        Policy(rate_limit=True, rate_limit_rps=1, rate_limit_burst=1, rate_limit_key="host"), t, lambda: now[0]
    )
    assert pol.rate_limit("1.1.1.1", "a.test") is None
    assert pol.rate_limit("2.2.2.2", "a.test").status == 429  # one domain, one bucket, whoever asks
    assert pol.rate_limit("2.2.2.2", "b.test") is None


def _clumpy_sequence(rate: float, clumps: int) -> list[int]:
    """Arrival times (µs) in clumps of 1-4 requests with gaps shorter than one token's period, as event loops
    that answer in batches produce them: the demand always exceeds the rate."""
    import random

    rnd = random.Random(7)
    period = 1e6 / rate
    t, out = 1_000_000_000, []
    for _ in range(clumps):
        t += int(rnd.uniform(0.2, 0.95) * period)
        out.extend([t] * rnd.randint(1, 4))
    return out


@pytest.mark.parametrize("burst", [1, 2, 5, 10, 100])
def test_small_buckets_grant_the_configured_rate_under_clumpy_arrivals(burst):
    """The under-grant of issue 12: a cap of exactly ``burst`` lost the fraction of a token that matured while
    the bucket was full; clumps arriving just after it lost it every time (-10 % at burst 1 here)."""
    rate = 200.0
    arrivals = _clumpy_sequence(rate, 5000)
    _, t = table()
    granted = sum(t.admit("clumpy", now, rate, burst) for now in arrivals)
    expected = burst + rate * (arrivals[-1] - arrivals[0]) / 1e6
    assert abs(granted - expected) <= 0.02 * expected, (granted, expected)
    assert granted <= expected + 1  # the kept fraction never adds a whole token


def _clumpy_hammer(mm, lock_fd, until, rate, burst, seed, out):
    import random

    rnd = random.Random(seed)
    t = BucketTable(memoryview(mm), SLOTS, lock_fd)
    clock = lambda: int(time.time() * 1e6)  # noqa: E731
    got = []
    while time.time() < until:
        for _ in range(rnd.randint(1, 20)):
            ok, _, at = t.decide("shared-key", clock, rate, burst)
            got.append((at, ok))
        time.sleep(rnd.random() * 0.003)  # clumps: the load shape under test, not synchronisation
    out.put(got)


@pytest.mark.parametrize("burst", [1, 10])
def test_clumpy_arrivals_across_processes_get_the_configured_rate(burst):
    ctx = mp.get_context("fork")
    mm, t = table()
    rate = 200.0
    until = time.time() + 2.0
    out = ctx.Queue()
    procs = [ctx.Process(target=_clumpy_hammer, args=(mm, t.lock_fd, until, rate, burst, i, out)) for i in range(3)]
    for p in procs:
        p.start()
    decisions = sorted(d for _ in procs for d in out.get(timeout=20))
    for p in procs:
        p.join(5)
    granted = sum(ok for _, ok in decisions)
    # what one sequential bucket grants for the same decision times: shared, the table loses and adds nothing
    unit, full = tokenbucket.UNIT, int(burst * tokenbucket.UNIT)
    tokens, last, replay = full, decisions[0][0], 0
    # A gap of a whole token period or more (the machine stalled every process) is idle time: nobody asked, and
    # a bucket then holds what it held plus the refill, at most exactly burst (issue 16 item 6: the fraction of
    # a token is never carried across idle time). Between such gaps the demand exceeded the rate, and there the
    # bucket must grant what it held at the stretch's start plus the rate over the stretch, minus what it holds
    # at its end: nothing may be capped away (the kept fraction). Judged by that rule, not by the cap's code.
    period_us = 1e6 / rate
    expected_u, stretch_start = full, decisions[0][0]
    for at, _ in decisions:
        if at - last >= period_us:
            expected_u += int(rate * (last - stretch_start)) - tokens  # the stretch that ended at ``last``
            tokens = min(full, tokens + int((at - last) * rate))  # the idle gap, by the rule above
            expected_u += tokens
            stretch_start = last = at
        tokens = tokenbucket.refill(tokens, last, at, rate, burst)
        last = max(last, at)
        ok, tokens = tokenbucket.take(tokens)
        replay += ok
    assert granted == replay
    expected = (expected_u + int(rate * (last - stretch_start))) / unit  # the last stretch runs to the end
    assert 0.98 * expected <= granted <= expected + 1, (granted, expected)
