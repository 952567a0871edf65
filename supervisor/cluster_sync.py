"""The cluster limiter's syncer: makes this host's shared-memory buckets replicas of one global bucket per key in
Valkey (docs/cluster.md). It runs as a task in the resolver process, never in a worker: workers decide from shared
memory only, and nothing they do waits on this loop or on Valkey.

Every ``cluster.sync_interval_ms`` it pops the slots whose admitted count moved (``BucketTable.pop_moved``, at most
``MAX_BATCHES * MAX_BATCH_KEYS`` per interval, the rest stays queued), keeps those worth a round trip
(``SyncBook.plan``), sends their counts in batches to the ``SYNC`` script, and writes each global level back into
its slot. A heartbeat every half second counts the hosts (H, for the debt floor).

Valkey unreachable (an error or a timeout on any call): the limiter falls back (``cluster.fallback``: the full
limit per host, or its share), retried every ``RETRY_S``; the first heartbeat that succeeds starts a new epoch of
the ledger (counts from the outage are not sent: no 429 storm from outage debt) and the limiter is global again.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from sentin8.aio_deadline import honour_cancel, within
from sentin8.cluster import bucket_merge, limiter_script
from sentin8.cluster.sync_book import SyncBook
from sentin8.config import Config, Policy
from sentin8.eventlog import event
from sentin8.shm.cluster import ClusterStatus
from sentin8.shm.ratelimit import BucketTable
from sentin8.tokenbucket import UNIT

RETRY_S = 0.5  # while Valkey is unreachable: one reconnection attempt per this
LATENCY_WINDOW = 20  # L in the debt floor: the slowest of this many recent round trips


class LimitSyncer:
    def __init__(
        self,
        cfg: Config,
        buckets: BucketTable,
        status: ClusterStatus,
        policy: Callable[[], Policy],
        *,
        client: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        cl = cfg.cluster
        self.target = cfg.cluster_valkey()
        self.cluster_id = cl.cluster_id
        self.node_id = cfg.cluster_node_id()
        self.interval_s = cl.sync_interval_ms / 1000
        self.fallback = cl.fallback
        self.timeout_s = max(0.5, 5 * self.interval_s)
        self.buckets = buckets
        self.status = status
        self.policy = policy
        self.clock = clock
        self.book = SyncBook(buckets.slots)
        self._client = client
        self._own_client = client is None
        self._sync: Any = None
        self._heartbeat: Any = None
        self.hosts = 1
        self.global_ = False
        self.retry_at = 0.0
        self.heartbeat_at = 0.0
        self.last_ok = 0.0
        self.first_stripe = 0
        self.round_trips: deque[float] = deque([0.0], maxlen=LATENCY_WINDOW)

    def _valkey(self) -> Any:
        if self._client is None:
            from sentin8 import valkey_client

            # no client-side retry: a failure shows at once, the limiter falls back, then retries
            self._client = valkey_client.connect(
                self.target, connect_timeout_s=self.timeout_s, timeout_s=self.timeout_s
            )
        if self._sync is None:
            self._sync = self._client.register_script(limiter_script.SYNC)
            self._heartbeat = self._client.register_script(limiter_script.HEARTBEAT)
        return self._client

    async def _drop_client(self) -> None:
        client, self._client, self._sync, self._heartbeat = self._client, None, None, None
        if client is not None and self._own_client:
            from sentin8 import valkey_client

            await valkey_client.close(client)
        elif client is not None:
            self._client = client  # a client handed in (tests) is theirs to close

    async def _call(self, script: Any, keys: list[str], args: list[str]) -> Any:
        return await within(script(keys=keys, args=args), self.timeout_s)

    async def beat(self) -> None:
        """Say this host is alive; H = the hosts seen within ``HOST_TTL_MS``."""
        self._valkey()
        hosts = await self._call(
            self._heartbeat,
            [limiter_script.hosts_key(self.cluster_id)],
            [self.node_id, str(limiter_script.HOST_TTL_MS)],
        )
        self.hosts = max(1, int(hosts))
        self.status.hosts(self.hosts)
        self.heartbeat_at = self.clock() + limiter_script.HEARTBEAT_S

    async def cycle(self) -> None:
        """One sync interval; raises what Valkey raised (``run`` falls back on it)."""
        now = self.clock()
        if not self.global_:
            if now < self.retry_at:
                return
            await self.beat()
            self.global_ = True
            self.book.new_epoch(self.buckets.counts())  # the outage's admissions were judged locally
            self.last_ok = now
            self.status.enter_global()
            event("cluster_limiter", limiter="global", hosts_seen=self.hosts, node_id=self.node_id)
        elif now >= self.heartbeat_at:
            await self.beat()
        pol = self.policy()
        moved = self.buckets.pop_moved(bucket_merge.MAX_BATCHES * bucket_merge.MAX_BATCH_KEYS, self.first_stripe)
        self.first_stripe = (self.first_stripe + 1) % 64
        if not pol.rate_limit:
            self.status.synced(0, 0, 0, len(moved), self.buckets.queued())
            return
        rate, burst = pol.rate_limit_rps, pol.rate_limit_burst
        picks = self.book.plan(moved, now, rate, burst, now - self.last_ok)
        floor_u = bucket_merge.debt_floor_u(self.hosts, rate, burst, self.interval_s, max(self.round_trips))
        full_u = int(burst * UNIT)
        largest = 0
        started = time.monotonic()
        for batch in bucket_merge.batches(picks):
            t0 = time.monotonic()
            keys = [limiter_script.bucket_key(self.cluster_id, p.key_hash) for p in batch]
            args = limiter_script.sync_args(rate, full_u, floor_u, [p.sent * UNIT for p in batch])
            levels = limiter_script.sync_levels(await self._call(self._sync, keys, args))
            self.round_trips.append(time.monotonic() - t0)
            items = [(p.slot, p.key_hash, p.count, level) for p, level in zip(batch, levels, strict=True)]
            self.buckets.write_back(items, self._clock_us)
            self.book.synced(batch, now)
            largest = max(largest, len(batch))
        self.last_ok = now
        rtt_us = int((time.monotonic() - started) * 1e6)
        self.status.synced(len(picks), largest, rtt_us, len(moved) - len(picks), self.buckets.queued())

    def _clock_us(self) -> int:
        return int(self.clock() * 1e6)

    async def lost(self, exc: BaseException) -> None:
        """Valkey failed us: limit locally as configured, retry soon."""
        self.status.failed()
        self.retry_at = self.clock() + RETRY_S
        share = self.hosts if self.fallback == "share" else 0
        if self.global_ or self.status.limiter != "local-fallback":
            self.global_ = False
            self.status.enter_fallback(share)
            event(
                "cluster_limiter",
                "warning",
                limiter="local-fallback",
                fallback=self.fallback,
                hosts_last_seen=self.hosts,
                error=type(exc).__name__,
                detail=str(exc)[:200],
            )
        await self._drop_client()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        event(
            "cluster_sync_start",
            node_id=self.node_id,
            cluster_id=self.cluster_id,
            interval_ms=int(self.interval_s * 1000),
            fallback=self.fallback,
        )
        self.status.enter_fallback(0)  # until Valkey answers: the full limit, nobody known to share it with
        due = loop.time()
        try:
            while True:
                due += self.interval_s
                await asyncio.sleep(max(0.0, due - loop.time()))
                try:
                    await self.cycle()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # Valkey's errors, timeouts, and any bug: each costs one interval
                    await self.lost(exc)
                honour_cancel()
                if loop.time() > due + self.interval_s:  # fell behind: never burst to catch up
                    due = loop.time()
        finally:
            if self._own_client:
                await self._drop_client()


def start(cfg: Config, shared: Any, loop: asyncio.AbstractEventLoop) -> asyncio.Task | None:
    """The syncer task when cluster mode is on (the resolver calls this), else None."""
    if not cfg.cluster.enabled:
        return None
    from sentin8.shm.policy import PolicyCache

    values = PolicyCache(shared.policy_reader(), cfg.policy)  # the runtime overlay too: PUT /policy rates
    syncer = LimitSyncer(cfg, shared.buckets(), shared.cluster_status(), values.current)
    return loop.create_task(syncer.run(), name="sentin8-cluster-sync")
