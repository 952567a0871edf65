"""``sentin8-proxy reload [--wait]``: what ``ExecReload=`` runs. Signals the supervisor and, with ``--wait``,
follows its reload status file (``reload_status``) until the reload that covers this signal has ended.

Exit 0 = done; 1 = refused (bad config: the old one keeps serving), failed, or not finished in time
(stalled); 2 = no running supervisor found. Waiting polls a small local file every 50 ms: this is an
operator command, not the data path.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from sentin8.config import Config

from .reload_status import pid_path, read_status


def _say(msg: str) -> None:
    print(f"sentin8-proxy reload: {msg}", file=sys.stderr, flush=True)


def reload(cfg: Config, pid: int, wait: bool, timeout: float) -> int:
    state_dir = cfg.tls.state_dir
    if not pid:
        try:
            pid = int(pid_path(state_dir).read_text())
        except (OSError, ValueError):
            _say(f"no supervisor pid file in {state_dir}: pass --pid")
            return 2
    before = read_status(state_dir, pid)
    if wait and not before:
        _say(f"pid {pid} left no reload status in {state_dir}: not a running sentin8-proxy supervisor?")
        return 2
    mine = int(before.get("requested", 0)) + 1  # the first SIGHUP count that includes this signal
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        _say(f"pid {pid} is not running")
        return 2
    if not wait:
        return 0
    deadline = time.monotonic() + (timeout or 2 * cfg.fleet.drain_timeout_s + 60)
    while time.monotonic() < deadline:
        status = read_status(state_dir, pid)
        if int(status.get("completed", 0)) >= mine:
            result, reason = status.get("result", ""), status.get("reason", "")
            if result == "done":
                _say(f"reload {status['completed']} done")
                return 0
            _say(f"reload {status['completed']} {result}: {reason}")
            return 1
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _say(f"pid {pid} exited before the reload completed")
            return 1
        time.sleep(0.05)
    _say(f"reload not complete after {timeout or 2 * cfg.fleet.drain_timeout_s + 60:g} s: stalled")
    return 1
