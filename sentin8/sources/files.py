"""File sources: ``[[instances]]`` and ``[[domains]]`` from the config (the embedded default)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

from ..config import Config, ConfigError, load_file
from ..eventlog import event
from ..routing import Instance, Route, RoutingTable, build
from . import Publish


def file_instances(cfg: Config) -> list[Instance]:
    return [Instance(i.id, i.service, i.host, i.port, i.state, None, i.tls, i.proxy_protocol) for i in cfg.instances]


def file_routes(cfg: Config) -> list[Route]:
    return [Route(d.hostname.lower(), d.service, d.env_id, d.app_id, d.org_id) for d in cfg.domains]


def file_table(cfg: Config) -> RoutingTable:
    return build(file_routes(cfg), file_instances(cfg), built_at=time.time())


class FileRunner:
    """Publishes the config file's tables; re-reads the file when it changes (checked every
    ``check_interval_s``, off the data path) or when ``reload`` is set. A broken edit keeps the last good
    table and is reported, never served."""

    def __init__(self, cfg: Config, path: str | None, check_interval_s: float = 1.0) -> None:
        self.cfg = cfg
        self.path = path
        self.check_interval_s = check_interval_s
        self.last_error: str | None = None

    def _stamp(self) -> tuple[int, int, int] | None:
        if not self.path:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def hand_over(self) -> None:
        """Nothing to hand over: the successor reads the file."""

    async def run(self, publish: Publish, reload: asyncio.Event) -> None:
        stamp = self._stamp()
        publish(file_table(self.cfg))
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reload.wait(), self.check_interval_s)
            forced = reload.is_set()
            reload.clear()
            now_stamp = self._stamp()
            if not forced and now_stamp == stamp:
                continue
            stamp = now_stamp
            if not self.path:
                publish(file_table(self.cfg))
                continue
            try:
                self.cfg = load_file(self.path)
            except ConfigError as exc:
                self.last_error = str(exc)
                event("config_reload_failed", "error", reason=str(exc), action="keeping the last table")
                continue
            self.last_error = None
            publish(file_table(self.cfg))
