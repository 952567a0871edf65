"""Rate-limit buckets shared by every worker: a fixed open-addressing table under 64 striped locks.

No lock-free scheme is exact in pure Python (unlocked read-modify-write over-grants), so each key's stripe is
locked with ``fcntl.lockf`` on a byte range of a memfd: one syscall pair per decision, and the kernel releases
the range if the holder dies, so a SIGKILLed worker can never wedge a stripe.

Layout: ``slots`` entries of four words (key hash, tokens in µ-units (signed: a cluster replica may be in debt),
last decision µs, admitted count), split into 64 stripes of ``slots / 64`` entries; a key lives in one stripe and
probes at most ``PROBE`` entries there. A full probe window evicts its stalest entry, so a rotating-address flood
cannot grow memory.

Cluster mode (``moved`` region given) also keeps what the syncer (``supervisor/cluster_sync.py``) needs, with no
reset and no race, all under the same stripe locks: the fourth word counts the requests the key admitted (only
ever growing; a newly installed key starts at zero), and its top bit ``QUEUED`` says the slot waits in its
stripe's *moved queue*, a ring of ``slots / 64`` entries. A worker that admits through a slot not queued appends
it; the syncer pops slots, clearing the bit. A slot is in its ring at most once (the bit), so a ring can never
overflow, and the syncer reads only the keys that moved, never the whole table.

The clock is read **after** the stripe lock is taken (``decide`` is handed the clock, not a time). Read before
it, two workers could apply their timestamps in the opposite order from the one they read them in; the later
timestamp then refills a bucket that is still full (capped at ``burst``) before the earlier request takes its
token, and that refill is lost. Small buckets under clumpy arrivals lost ~5% of the configured rate that way.
Under the lock, timestamps reach a bucket in increasing order and the table grants exactly what one sequential
bucket would.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Callable

from .. import tokenbucket
from ..cluster import bucket_merge
from ..cluster.bucket_merge import Moved

STRIPES = 64
PROBE = 8
WORDS = 4


QUEUED = 1 << 63
COUNT = QUEUED - 1


def region_bytes(slots: int) -> int:
    return slots * WORDS * 8


def moved_region_bytes(slots: int) -> int:
    """Per stripe two words (pushed, popped: monotonic) and a ring of ``slots / 64`` slot numbers."""
    return (STRIPES * 2 + slots) * 8


def key_hash(key: str) -> int:
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    return h or 1


class BucketTable:
    def __init__(self, view: memoryview, slots: int, lock_fd: int, moved: memoryview | None = None) -> None:
        assert slots % STRIPES == 0 and slots >= STRIPES * PROBE
        self._w = view.cast("Q")
        self._s = view.cast("q")  # the same words, signed: the tokens word
        self.slots = slots
        self.per_stripe = slots // STRIPES
        self.lock_fd = lock_fd
        self._q = moved.cast("Q") if moved is not None else None

    @staticmethod
    def make_lock_fd() -> int:
        """A memfd whose byte ranges are the stripe locks; inherited by every forked child."""
        fd = os.memfd_create("sentin8-ratelimit-locks", 0)
        os.ftruncate(fd, STRIPES)
        return fd

    def admit(self, key: str, now_us: int, rate_per_s: float, burst: float) -> bool:
        """One request at a given time (tests and replays); the data path uses ``decide`` with a clock."""
        return self.decide(key, lambda: now_us, rate_per_s, burst)[0]

    def decide(self, key: str, clock_us: Callable[[], int], rate_per_s: float, burst: float) -> tuple[bool, int, int]:
        """(admitted, tokens left in µ-units, the time it was decided at in µs); ``clock_us`` is read under the lock."""
        h = key_hash(key)
        stripe = h % STRIPES
        base = stripe * self.per_stripe
        start = (h >> 6) % self.per_stripe
        w = self._w
        s = self._s
        fcntl.lockf(self.lock_fd, fcntl.LOCK_EX, 1, stripe)
        try:
            now_us = clock_us()
            victim = -1
            victim_last = None
            for p in range(PROBE):
                slot = base + (start + p) % self.per_stripe
                i = slot * WORDS
                k = w[i]
                if k == h:
                    tokens = tokenbucket.refill(s[i + 1], w[i + 2], now_us, rate_per_s, burst)
                    ok, tokens = tokenbucket.take(tokens)
                    s[i + 1] = tokens
                    w[i + 2] = max(now_us, w[i + 2])
                    if ok and self._q is not None:
                        self._count(stripe, slot, w[i + 3] + 1)
                    return ok, tokens, now_us
                last = 0 if k == 0 else w[i + 2]
                if victim_last is None or last < victim_last:
                    victim, victim_last = slot, last
            # new key (or an evicted stalest one): a full bucket minus this request
            i = victim * WORDS
            ok, tokens = tokenbucket.take(int(burst * tokenbucket.UNIT))
            w[i] = h
            s[i + 1] = tokens
            w[i + 2] = now_us
            if self._q is not None:
                w[i + 3] &= QUEUED  # the count restarts with the key; a slot still queued stays queued once
                if ok:
                    self._count(stripe, victim, w[i + 3] + 1)
            return ok, tokens, now_us
        finally:
            fcntl.lockf(self.lock_fd, fcntl.LOCK_UN, 1, stripe)

    def _count(self, stripe: int, slot: int, word: int) -> None:
        """Store a slot's new admitted word, queuing the slot if it is not queued (stripe lock held)."""
        q = self._q
        assert q is not None
        if not word & QUEUED:
            pushed = 2 * stripe
            q[STRIPES * 2 + stripe * self.per_stripe + q[pushed] % self.per_stripe] = slot
            q[pushed] += 1
            word |= QUEUED
        self._w[slot * WORDS + 3] = word

    # ---- the cluster syncer's side ---------------------------------------------------------------------

    def queued(self) -> int:
        """Slots waiting in the moved queues (a gauge: at most ``slots``)."""
        q = self._q
        if q is None:
            return 0
        return sum(q[2 * st] - q[2 * st + 1] for st in range(STRIPES))

    def counts(self) -> list[Moved]:
        """Every occupied slot with its admitted count (queued or not, left as it is): the syncer's baselines at
        the start of an epoch. One pass over the table, one lock per stripe."""
        out: list[Moved] = []
        w, s, per = self._w, self._s, self.per_stripe
        for stripe in range(STRIPES):
            fcntl.lockf(self.lock_fd, fcntl.LOCK_EX, 1, stripe)
            try:
                for slot in range(stripe * per, (stripe + 1) * per):
                    i = slot * WORDS
                    if w[i]:
                        out.append(Moved(slot, w[i], s[i + 1], w[i + 3] & COUNT))
            finally:
                fcntl.lockf(self.lock_fd, fcntl.LOCK_UN, 1, stripe)
        return out

    def pop_moved(self, limit: int, first_stripe: int = 0) -> list[Moved]:
        """Up to ``limit`` slots that admitted since they were last popped, stripes taken in turn from
        ``first_stripe`` (rotate it: a flood in one stripe must not starve the others); what is left stays
        queued for the next call."""
        q = self._q
        assert q is not None
        out: list[Moved] = []
        w, s, per = self._w, self._s, self.per_stripe
        for n in range(STRIPES):
            if len(out) >= limit:
                break
            stripe = (first_stripe + n) % STRIPES
            if q[2 * stripe] == q[2 * stripe + 1]:
                continue  # empty: no lock taken
            fcntl.lockf(self.lock_fd, fcntl.LOCK_EX, 1, stripe)
            try:
                popped = q[2 * stripe + 1]
                end = min(q[2 * stripe], popped + limit - len(out))
                ring = STRIPES * 2 + stripe * per
                for k in range(popped, end):
                    slot = q[ring + k % per]
                    i = slot * WORDS
                    word = w[i + 3]
                    w[i + 3] = word & COUNT
                    out.append(Moved(slot, w[i], s[i + 1], word & COUNT))
                q[2 * stripe + 1] = end
            finally:
                fcntl.lockf(self.lock_fd, fcntl.LOCK_UN, 1, stripe)
        return out

    def write_back(self, items: list[tuple[int, int, int, int]], clock_us: Callable[[], int]) -> int:
        """Make slots replicas of the global level again. Each item is (slot, key hash, the count read with it,
        global level µ-units): the slot's tokens become the global level less what it admitted after its count
        was read. One lock per stripe touched; a slot another key took meanwhile is left alone. Returns the
        slots written."""
        by_stripe: dict[int, list[tuple[int, int, int, int]]] = {}
        for item in items:
            by_stripe.setdefault(item[0] // self.per_stripe, []).append(item)
        w, s = self._w, self._s
        written = 0
        for stripe, group in by_stripe.items():
            fcntl.lockf(self.lock_fd, fcntl.LOCK_EX, 1, stripe)
            try:
                now_us = clock_us()  # read under the lock, as ``decide`` does
                for slot, key_hash_, count, global_u in group:
                    i = slot * WORDS
                    if w[i] != key_hash_:
                        continue
                    s[i + 1] = bucket_merge.write_back(global_u, max(0, (w[i + 3] & COUNT) - count))
                    w[i + 2] = max(now_us, w[i + 2])
                    written += 1
            finally:
                fcntl.lockf(self.lock_fd, fcntl.LOCK_UN, 1, stripe)
        return written
