"""The resolver process: runs the configured sources and publishes routing tables into shared memory."""

from __future__ import annotations

import asyncio
import signal

import uvloop

from sentin8 import lifecycle, routing
from sentin8.config import Config
from sentin8.eventlog import event
from sentin8.metrics.publisher import MetricsPublisher
from sentin8.routing import RoutingTable
from sentin8.shm.snapshot import SnapshotTooLarge
from sentin8.shm.state import SharedState
from sentin8.sources import SourceRunner
from sentin8.sources.files import FileRunner

from . import cluster_sync


def make_runner(cfg: Config, config_path: str | None) -> SourceRunner:
    if cfg.sources.registry == "file" and cfg.sources.domains == "file":
        return FileRunner(cfg, config_path)
    from sentin8.sources.live import LiveRunner  # only live deployments pay for redis/psycopg imports

    return LiveRunner(cfg)


class Resolver:
    def __init__(self, cfg: Config, shared: SharedState, status_fd: int, config_path: str | None) -> None:
        self.cfg = cfg
        self.shared = shared
        self.writer = shared.snapshot_writer()
        self.service_names = shared.service_names()
        self.status_fd = status_fd
        self.config_path = config_path
        self.published = 0

    def publish(self, table: RoutingTable) -> None:
        # every service gets its fixed metrics index before workers see it (the ACME service has no route)
        table.with_service_ids(self.service_names.assign, extra=(self.cfg.acme.service,))
        try:
            self.writer.publish(routing.encode(table))
        except SnapshotTooLarge as exc:
            event("snapshot_too_large", "error", reason=str(exc), action="still serving the previous table")
            return
        self.published += 1
        if self.published == 1:
            lifecycle.send(self.status_fd, lifecycle.SNAPSHOT_PUBLISHED)

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
        task = loop.create_task(make_runner(self.cfg, self.config_path).run(self.publish, reload))
        metrics = self._metrics_task(loop)
        cluster = cluster_sync.start(self.cfg, self.shared, loop)  # cluster mode's limiter syncer, or None
        await asyncio.wait([task, stop], return_when=asyncio.FIRST_COMPLETED)
        for side_task in (metrics, cluster):
            if side_task is not None:
                side_task.cancel()
        if task.done():
            task.result()  # a runner never returns on its own: surface why, the supervisor restarts us
            return 1
        task.cancel()
        return 0

    def _metrics_task(self, loop: asyncio.AbstractEventLoop) -> asyncio.Task | None:
        """``stat:metrics`` rides along in this process: it already talks to Valkey and is not a worker."""
        url = self.cfg.metrics_valkey_url()
        if not url:
            return None
        publisher = MetricsPublisher(
            self.shared.counter_reader(),
            self.service_names,
            url,
            self.cfg.metrics.channel,
            self.cfg.metrics.interval_s,
        )
        return loop.create_task(publisher.run(), name="sentin8-metrics-publisher")
