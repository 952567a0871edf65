"""Where a reload's outcome is left for ``sentin8-proxy reload --wait``: a memfd the supervisor holds open.

The supervisor creates one anonymous memory file (``memfd_create("sentin8-reload-status")``) at start and
rewrites one small record in it when a SIGHUP arrives (``requested``: the count of SIGHUPs seen) and when a
reload ends (``completed``: the highest SIGHUP count that reload covers, ``result`` done | refused | failed,
``reason``). A waiter reads ``requested`` before it signals; its reload is covered once ``completed``
reaches that number plus one. Coalesced SIGHUPs are covered by the same reload, which read the config
after all of them.

Why a memfd, found through ``/proc/<pid>/fd``:
- it takes no disk: a full ``tls.state_dir`` cannot hide a reload that worked (a file there could not be
  written, and ``systemctl reload`` failed on a good reload);
- it is found from the supervisor's pid alone, not from a directory the config file names (which may
  have changed since the fleet started);
- access is the kernel's: only the supervisor's user (or root) may open another process's fds, and it
  vanishes with the supervisor: no stale file is ever read as a live one;
- nothing in the supervisor's loop has to answer (a socket would): the waiter reads while the loop works.
An abstract unix socket was the other candidate: it belongs to a network namespace rather than the process,
anyone in the namespace may connect, and the loop would have to serve it.

The record: ``MAGIC``, the JSON length and its CRC-32, then the JSON; written with one ``pwrite``. A reader
that catches a write half done sees a bad CRC and reads again.
"""

from __future__ import annotations

import json
import os
import struct
import time
import zlib
from pathlib import Path

MEMFD_NAME = "sentin8-reload-status"
MAGIC = b"S8RS"
_HEAD = struct.Struct("<4sII")
RECORD_MAX = 4096  # the reason is cut to fit


def _encode(state: dict) -> bytes:
    body = json.dumps(state).encode()
    if len(body) > RECORD_MAX - _HEAD.size:
        state = {**state, "reason": state.get("reason", "")[:1024]}
        body = json.dumps(state).encode()[: RECORD_MAX - _HEAD.size]
    return _HEAD.pack(MAGIC, len(body), zlib.crc32(body)) + body


def _decode(data: bytes) -> dict | None:
    """The record, ``{}`` for none (yet), None for a torn read (read again)."""
    if len(data) < _HEAD.size:
        return {}
    magic, length, crc = _HEAD.unpack_from(data)
    if magic != MAGIC:
        return {}
    body = data[_HEAD.size : _HEAD.size + length]
    if len(body) != length or zlib.crc32(body) != crc:
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else {}


def status_fd_path(pid: int) -> Path | None:
    """``/proc/<pid>/fd/<n>`` of the supervisor's status memfd, or None (not ours to read, or not a
    supervisor)."""
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        entries = list(fd_dir.iterdir())
    except OSError:
        return None
    for entry in entries:
        try:
            target = os.readlink(entry)
        except OSError:
            continue
        if target.startswith(f"/memfd:{MEMFD_NAME} "):
            return entry
    return None


def read_status(pid: int) -> dict | None:
    """The supervisor's reload record; None when ``pid`` holds no status memfd (not a running supervisor,
    or not readable by this user)."""
    path = status_fd_path(pid)
    if path is None:
        return None
    for _ in range(20):
        try:
            with open(path, "rb") as fh:
                data = fh.read(RECORD_MAX)
        except OSError:
            return None
        record = _decode(data)
        if record is not None:
            return record
        time.sleep(0.005)  # a write in progress: it takes microseconds
    return None


def supervisors_for(config_path: str) -> list[int]:
    """Pids of the running supervisors whose record names this config file (``reload`` without ``--pid``)."""
    wanted = os.path.realpath(config_path)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if not title.startswith(b"sentin8-proxy: supervisor"):
            continue
        record = read_status(int(entry.name))
        if record and record.get("config") == wanted:
            found.append(int(entry.name))
    return sorted(found)


class ReloadStatus:
    """The supervisor's side: creates the memfd and keeps the record current. A memfd write does not touch
    the disk; one that fails anyway (out of memory) is reported once, never fatal."""

    def __init__(self, config_path: str | None) -> None:
        self.state = {
            "requested": 0,
            "completed": 0,
            "result": "",
            "reason": "",
            "config": os.path.realpath(config_path) if config_path else "",
        }
        self.fd = -1
        self._warned = False

    def start(self) -> None:
        """At supervisor start, before any fork (children close it: only the supervisor's fd is looked at)."""
        self.fd = os.memfd_create(MEMFD_NAME, os.MFD_CLOEXEC)
        self._write()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def requested(self, seq: int) -> None:
        self.state["requested"] = max(seq, self.state["requested"])
        self._write()

    def finished(self, seq: int, result: str, reason: str = "") -> None:
        self.state.update(completed=max(seq, self.state["completed"]), result=result, reason=reason)
        self._write()

    def _write(self) -> None:
        if self.fd < 0:
            return
        try:
            os.pwrite(self.fd, _encode(self.state).ljust(RECORD_MAX, b"\0"), 0)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                from sentin8.eventlog import event

                event("reload_status_unwritable", "warning", reason=exc.strerror)
