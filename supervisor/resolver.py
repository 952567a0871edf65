"""The resolver process: runs the configured sources and publishes routing tables into shared memory.

It starts from what the fleet last knew (``sentin8.sources.lastknown``): the table in shared memory, which
outlives it, when it restarts; the cache file in ``tls.state_dir`` when the whole fleet starts. Every complete,
fresh table it publishes from live sources is also written to that cache (``supervisor/routing_cache.py``).
"""

from __future__ import annotations

import asyncio
import signal

import msgspec
import uvloop

from sentin8 import lifecycle, routing
from sentin8.config import Config
from sentin8.eventlog import event
from sentin8.metrics.publisher import MetricsPublisher
from sentin8.routing import RoutingTable
from sentin8.shm.snapshot import SnapshotTooLarge
from sentin8.shm.state import SharedState
from sentin8.sources import SourceRunner, lastknown
from sentin8.sources.files import FileRunner
from sentin8.sources.lastknown import LastKnown

from . import cluster_sync, routing_cache, ticket_sync


def has_live_source(cfg: Config) -> bool:
    return cfg.sources.registry != "file" or cfg.sources.domains != "file"


def make_runner(cfg: Config, config_path: str | None, seed: LastKnown | None = None) -> SourceRunner:
    if not has_live_source(cfg):
        return FileRunner(cfg, config_path)  # the file is its own last-known copy: no seed, no cache
    from sentin8.sources.live import LiveRunner  # only live deployments pay for redis/psycopg imports

    return LiveRunner(cfg, seed=seed)


class Resolver:
    def __init__(
        self,
        cfg: Config,
        shared: SharedState,
        status_fd: int,
        config_path: str | None,
        counter_slot: int | None = None,
        cluster_secret: bytes = b"",
    ) -> None:
        self.cfg = cfg
        self.cluster_secret = cluster_secret  # cluster.secret_env: only this child holds it (the ticket syncer)
        self.shared = shared
        self.writer = shared.snapshot_writer()
        self.service_names = shared.service_names()
        self.status_fd = status_fd
        self.config_path = config_path
        self.published = 0
        # its own counter block (the supervisor folds it into the totals when this process exits)
        self.counters = shared.worker_counters(counter_slot) if counter_slot is not None else None
        self.cache: routing_cache.CacheWriter | None = None  # set in _main for live sources

    def count(self, name: str) -> None:
        if self.counters is not None:
            self.counters.inc(name)

    def last_known(self) -> LastKnown | None:
        """The table the fleet serves (shared memory: this resolver restarted), else the cache on disk (the
        fleet is starting), else None. Read once, before anything is loaded."""
        got = self.shared.snapshot_reader().read()
        if got is not None:
            _, data, published_at = got
            try:
                table = routing.decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:  # crc-checked: a bug, not a torn copy
                event("resolver_last_known_unreadable", "error", reason=str(exc), action="starting without it")
                return None
            seed = lastknown.from_table(table, lastknown.PUBLISHED, published_at)
            self.count("resolver_started_from_published")
        else:
            cached = routing_cache.read(self.cfg.tls.state_dir, self.count)
            if cached is None:
                return None
            table, written_at = cached
            seed = lastknown.from_table(table, lastknown.DISK, written_at)
            self.count("routing_cache_loaded")
        event("resolver_last_known", **seed.describe(), action="sources that cannot load keep this part, stale")
        return seed

    def publish(self, table: RoutingTable) -> None:
        # every service gets its fixed metrics index before workers see it (the ACME service has no route)
        table.with_service_ids(self.service_names.assign, extra=(self.cfg.acme.service,))
        data = routing.encode(table)
        try:
            self.writer.publish(data)
        except SnapshotTooLarge as exc:
            event("snapshot_too_large", "error", reason=str(exc), action="still serving the previous table")
            return
        self.published += 1
        if self.published == 1:
            lifecycle.send(self.status_fd, lifecycle.SNAPSHOT_PUBLISHED)
        if self.cache is not None and not table.stale:
            self.cache.offer(data)  # only a complete, fresh table is worth starting a fleet from

    def run(self) -> int:
        return uvloop.run(self._main())

    async def _main(self) -> int:
        loop = asyncio.get_running_loop()
        src = self.cfg.sources
        event("resolver_start", registry=src.registry, domains=src.domains,
              metrics_channel=self.cfg.metrics.channel if self.cfg.metrics_valkey_url() else None)
        reload = asyncio.Event()
        stop: asyncio.Future[None] = loop.create_future()
        loop.add_signal_handler(signal.SIGHUP, reload.set)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the supervisor decides
        for sig in (signal.SIGTERM, signal.SIGQUIT):
            loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
        seed = None
        if has_live_source(self.cfg):
            seed = self.last_known()
            self.cache = routing_cache.CacheWriter(self.cfg.tls.state_dir, self.count)
            routing_cache.remove_leftovers(self.cfg.tls.state_dir)
        tickets = ticket_sync.make(self.cfg, self.shared, self.cluster_secret)  # cluster mode's ticket keys
        self.cluster_secret = b""  # the syncer holds the key it derived, nothing else needs the secret
        tickets_task = None
        if tickets is not None:
            await tickets.first()  # before routes load, so workers start sealing with the cluster's keys
            tickets_task = loop.create_task(tickets.run(), name="sentin8-cluster-tickets")
        runner = make_runner(self.cfg, self.config_path, seed)
        task = loop.create_task(runner.run(self.publish, reload))
        metrics = self._metrics_task(loop)
        cluster = cluster_sync.start(self.cfg, self.shared, loop)  # cluster mode's limiter syncer, or None
        await asyncio.wait([task, stop], return_when=asyncio.FIRST_COMPLETED)
        for side_task in (metrics, cluster, tickets_task):
            if side_task is not None:
                side_task.cancel()
        if task.done():
            task.result()  # a runner never returns on its own: surface why, the supervisor restarts us
            return 1
        runner.hand_over()  # the successor (a [sources] reload) starts from what is published now
        task.cancel()
        return 0

    def _metrics_task(self, loop: asyncio.AbstractEventLoop) -> asyncio.Task | None:
        """``stat:metrics`` rides along in this process: it already talks to Valkey and is not a worker."""
        target = self.cfg.metrics_valkey()
        if target is None:
            return None
        publisher = MetricsPublisher(
            self.shared.counter_reader(),
            self.service_names,
            target,
            self.cfg.metrics.channel,
            self.cfg.metrics.interval_s,
        )
        return loop.create_task(publisher.run(), name="sentin8-metrics-publisher")
