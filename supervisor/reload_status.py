"""Where a reload's outcome is left for ``sentin8-proxy reload --wait``: a small JSON file per supervisor.

The supervisor writes ``<state_dir>/reload-<pid>.json`` (atomically: temp file + rename) when a SIGHUP
arrives (``requested``: the count of SIGHUPs seen) and when a reload ends (``completed``: the highest SIGHUP
count that reload covers, ``result`` done | refused | failed, ``reason``). A waiter reads ``requested``
before it signals; its reload is covered once ``completed`` reaches that number plus one. Coalesced SIGHUPs
are covered by the same reload, which read the config after all of them.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from sentin8.eventlog import event


def status_path(state_dir: str, pid: int) -> Path:
    return Path(state_dir) / f"reload-{pid}.json"


def pid_path(state_dir: str) -> Path:
    return Path(state_dir) / "supervisor.pid"


def read_status(state_dir: str, pid: int) -> dict:
    try:
        return json.loads(status_path(state_dir, pid).read_text())
    except (OSError, ValueError):
        return {}


class ReloadStatus:
    """The supervisor's side: keeps the file current; a write that fails is reported once, never fatal."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.state = {"requested": 0, "completed": 0, "result": "", "reason": ""}
        self._warned = False

    def start(self) -> None:
        """At supervisor start: announce this supervisor (``reload`` without ``--pid`` finds it here)."""
        self._write()
        with contextlib.suppress(OSError):
            tmp = pid_path(self.state_dir).with_suffix(".tmp")
            tmp.write_text(f"{os.getpid()}\n")
            tmp.replace(pid_path(self.state_dir))

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            status_path(self.state_dir, os.getpid()).unlink()
        with contextlib.suppress(OSError, ValueError):
            if int(pid_path(self.state_dir).read_text()) == os.getpid():  # a newer fleet may own it now
                pid_path(self.state_dir).unlink()

    def requested(self, seq: int) -> None:
        self.state["requested"] = seq
        self._write()

    def finished(self, seq: int, result: str, reason: str = "") -> None:
        self.state.update(completed=max(seq, self.state["completed"]), result=result, reason=reason)
        self._write()

    def _write(self) -> None:
        path = status_path(self.state_dir, os.getpid())
        try:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.state))
            tmp.replace(path)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                event("reload_status_unwritable", "warning", path=str(path), reason=exc.strerror)
