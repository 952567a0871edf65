"""The resolver process: runs the configured sources and publishes routing tables into shared memory."""

from __future__ import annotations

import asyncio
import signal
import sys

import uvloop

from sentin8 import lifecycle, routing
from sentin8.config import Config
from sentin8.routing import RoutingTable
from sentin8.shm.snapshot import SnapshotTooLarge
from sentin8.shm.state import SharedState
from sentin8.sources import SourceRunner
from sentin8.sources.files import FileRunner


def make_runner(cfg: Config, config_path: str | None) -> SourceRunner:
    if cfg.sources.registry == "file" and cfg.sources.domains == "file":
        return FileRunner(cfg, config_path)
    from sentin8.sources.live import LiveRunner  # only live deployments pay for redis/psycopg imports

    return LiveRunner(cfg)


class Resolver:
    def __init__(self, cfg: Config, shared: SharedState, status_fd: int, config_path: str | None) -> None:
        self.cfg = cfg
        self.writer = shared.snapshot_writer()
        self.status_fd = status_fd
        self.config_path = config_path
        self.published = 0

    def publish(self, table: RoutingTable) -> None:
        try:
            self.writer.publish(routing.encode(table))
        except SnapshotTooLarge as exc:
            print(f"sentin8-proxy: resolver: {exc}; still serving the previous table", file=sys.stderr, flush=True)
            return
        self.published += 1
        if self.published == 1:
            lifecycle.send(self.status_fd, lifecycle.SNAPSHOT_PUBLISHED)

    def run(self) -> int:
        return uvloop.run(self._main())

    async def _main(self) -> int:
        loop = asyncio.get_running_loop()
        reload = asyncio.Event()
        stop: asyncio.Future[None] = loop.create_future()
        loop.add_signal_handler(signal.SIGHUP, reload.set)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the supervisor decides
        for sig in (signal.SIGTERM, signal.SIGQUIT):
            loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
        task = loop.create_task(make_runner(self.cfg, self.config_path).run(self.publish, reload))
        await asyncio.wait([task, stop], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # a runner never returns on its own: surface why, the supervisor restarts us
            return 1
        task.cancel()
        return 0
