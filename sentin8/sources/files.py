"""File sources: ``[[instances]]`` and ``[[domains]]`` from the config (the embedded default)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

from ..config import Config, ConfigError, load_bytes
from ..eventlog import event
from ..routing import Instance, Route, RoutingTable, build
from . import Publish

Stamp = tuple[int, int, int]  # (mtime_ns, size, inode): what identifies one version of the file


def file_instances(cfg: Config) -> list[Instance]:
    return [Instance(i.id, i.service, i.host, i.port, i.state, None, i.tls, i.proxy_protocol) for i in cfg.instances]


def file_routes(cfg: Config) -> list[Route]:
    return [Route(d.hostname.lower(), d.service, d.env_id, d.app_id, d.org_id) for d in cfg.domains]


def file_table(cfg: Config) -> RoutingTable:
    return build(file_routes(cfg), file_instances(cfg), built_at=time.time())


def _stamp_of(st: os.stat_result) -> Stamp:
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class FileRunner:
    """Publishes the config file's tables; re-reads the file when it changes (checked every
    ``check_interval_s``, off the data path) or when ``reload`` is set. A broken edit keeps the last good
    table and is reported, never served.

    Only a whole file is read. A writer that rewrites the file in place (``Path.write_text``, ``>`` in a
    shell, many editors) truncates it first: for a moment the file is empty, or holds its first part, and
    an empty file is valid TOML whose tables are empty. Served, that table would close every SNI as unknown
    on every worker (a reset for each L4 client, whose ClientHello is still unread) until the next check.
    So a change seen by the periodic check is read only once the file's (mtime, size, inode) stood still for
    one whole check; the bytes read must still be that version (``fstat`` after the read); and an empty
    file is never a table. A SIGHUP (``reload``) reads at once: the supervisor has just checked that file
    whole."""

    def __init__(self, cfg: Config, path: str | None, check_interval_s: float = 1.0) -> None:
        self.cfg = cfg
        self.path = path
        self.check_interval_s = check_interval_s
        self.last_error: str | None = None
        self._stamp_read = self._stamp()  # the version the published table came from (or the last one judged)
        self._seen: Stamp | None = None  # a changed version seen once: read if still there at the next check

    def _stamp(self) -> Stamp | None:
        if not self.path:
            return None
        try:
            return _stamp_of(os.stat(self.path))
        except OSError:
            return None

    def hand_over(self) -> None:
        """Nothing to hand over: the successor reads the file."""

    async def run(self, publish: Publish, reload: asyncio.Event) -> None:
        publish(file_table(self.cfg))
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reload.wait(), self.check_interval_s)
            forced = reload.is_set()
            reload.clear()
            self.check(publish, forced)

    def check(self, publish: Publish, forced: bool = False) -> None:
        """One periodic check (``forced``: a SIGHUP's, which reads at once)."""
        now_stamp = self._stamp()
        if not forced:
            if now_stamp == self._stamp_read:
                self._seen = None
                return
            if now_stamp != self._seen:
                self._seen = now_stamp  # changing, or just changed: a writer may be half-way
                return
        self._seen = None
        if not self.path:
            publish(file_table(self.cfg))
            return
        self._stamp_read = self._reread(publish, now_stamp, self._stamp_read)

    def _reread(self, publish: Publish, expected: Stamp | None, previous: Stamp | None) -> Stamp | None:
        """Read, check and publish the file if it is still version ``expected``; returns the version the
        next check compares with (``previous`` when the file moved under the read: it is judged again)."""
        try:
            with open(self.path, "rb") as fh:  # type: ignore[arg-type]
                data = fh.read()
                got = _stamp_of(os.fstat(fh.fileno()))
        except OSError as exc:
            self._failed(f"{self.path}: cannot read ({exc.strerror})")
            return expected
        if got != expected:
            return previous  # written while we read: the next checks read it once it stands still
        if not data.strip():
            self._failed(f"{self.path}: empty (a writer between truncating and writing it?)")
            return got
        try:
            self.cfg = load_bytes(data, self.path)  # type: ignore[arg-type]
        except ConfigError as exc:
            self._failed(str(exc))
            return got
        self.last_error = None
        publish(file_table(self.cfg))
        return got

    def _failed(self, reason: str) -> None:
        self.last_error = reason
        event("config_reload_failed", "error", reason=reason, action="keeping the last table")
