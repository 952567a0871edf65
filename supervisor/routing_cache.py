"""The routing cache file in ``tls.state_dir``: written by the resolver after every complete, fresh publication,
read at a cold start (no table in shared memory) so a fleet started during a source outage serves the last
complete table, marked stale. The format is ``sentin8.routing_cache``.

Writing never touches routing: it runs off the resolver's loop (a thread), the newest table wins (a table
offered while one is being written replaces any still waiting, never a queue), and a failure (full disk, no
permission) is counted and logged once per run of failures, then retried with the next table. The file is
replaced atomically: a temp file beside it (named by pid: two fleets side by side during a handover never
share one), fsync, rename, fsync of the directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Callable

from sentin8 import routing_cache
from sentin8.eventlog import event
from sentin8.routing import RoutingTable

_TMP = re.compile(r"\." + re.escape(routing_cache.FILE_NAME) + r"\.(\d+)\.tmp")

Count = Callable[[str], None]


def cache_path(state_dir: str) -> str:
    return os.path.join(state_dir, routing_cache.FILE_NAME)


def read(state_dir: str, count: Count) -> tuple[RoutingTable, float] | None:
    """(table, written_at) from the cache file; None if there is none or it is unusable (counted, logged)."""
    path = cache_path(state_dir)
    try:
        with open(path, "rb") as fh:
            blob = fh.read()
    except FileNotFoundError:
        event("routing_cache_absent", path=path, action="a cold start waits for the sources")
        return None
    except OSError as exc:
        count("routing_cache_invalid")
        event(
            "routing_cache_invalid",
            "warning",
            path=path,
            reason=exc.strerror or str(exc),
            action="ignored: starting as without a cache",
        )
        return None
    try:
        got = routing_cache.decode(blob)
    except routing_cache.CacheInvalid as exc:
        count("routing_cache_invalid")
        event(
            "routing_cache_invalid",
            "warning",
            path=path,
            reason=str(exc),
            action="ignored: starting as without a cache",
        )
        return None
    return got


def _write(state_dir: str, blob: bytes) -> None:
    os.makedirs(state_dir, exist_ok=True)
    path = cache_path(state_dir)
    tmp = os.path.join(state_dir, f".{routing_cache.FILE_NAME}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename durable too; not every file system allows it
        dfd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def remove_leftovers(state_dir: str) -> None:
    """Temp files of writers that died mid-write (SIGKILL): theirs only, a live process may still be writing."""
    with contextlib.suppress(OSError):
        for name in os.listdir(state_dir):
            m = _TMP.fullmatch(name)
            if m is None or int(m.group(1)) == os.getpid():
                continue
            try:
                os.kill(int(m.group(1)), 0)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(state_dir, name))
            except OSError:
                pass  # alive under another user: not ours to remove


class CacheWriter:
    """Newest-wins writer of the cache file, off the event loop."""

    def __init__(self, state_dir: str, count: Count) -> None:
        self.state_dir = state_dir
        self.count = count
        self._pending: bytes | None = None
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self.writes = 0
        self.errors = 0

    def offer(self, payload: bytes) -> None:
        """Called on the loop with an encoded complete, fresh table; returns at once."""
        self._pending = routing_cache.encode(payload, time.time())
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain(), name="sentin8-routing-cache")

    async def _drain(self) -> None:
        while self._pending is not None:
            blob, self._pending = self._pending, None
            try:
                await asyncio.to_thread(_write, self.state_dir, blob)
            except OSError as exc:
                self.errors += 1
                self.count("routing_cache_write_errors")
                if not self._failing:  # once per run of failures: a full disk must not flood the log
                    event(
                        "routing_cache_write_failed",
                        "error",
                        path=cache_path(self.state_dir),
                        reason=exc.strerror or str(exc),
                        action="routing unaffected; retried with the next table",
                    )
                self._failing = True
                continue
            self.writes += 1
            self.count("routing_cache_writes")
            if self._failing:
                event("routing_cache_write_recovered", path=cache_path(self.state_dir), failures=self.errors)
            self._failing = False
