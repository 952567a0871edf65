"""``sentin8-proxy reload [--wait]``: what ``ExecReload=`` runs. Signals the supervisor and, with ``--wait``,
follows its reload status (``reload_status``: a memfd found through the supervisor's pid) until the reload
that covers this signal has ended.

The supervisor is found by its pid (``--pid``, what the unit passes as ``$MAINPID``) or, without one, as the
running supervisor whose status names this config file. Nothing is looked up in the directories the file
names now: they may not be the ones the running fleet started with.

Exit 0 = done; 1 = refused (bad config: the old one keeps serving), failed, or not finished in time
(stalled); 2 = no running supervisor found. Waiting polls every 50 ms: this is an operator command, not
the data path.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from .reload_status import read_status, supervisors_for


def _say(msg: str) -> None:
    print(f"sentin8-proxy reload: {msg}", file=sys.stderr, flush=True)


def reload(config_path: str, drain_timeout_s: float, pid: int, wait: bool, timeout: float) -> int:
    if not pid:
        pids = supervisors_for(config_path)
        if len(pids) != 1:
            which = f"several ({', '.join(map(str, pids))})" if pids else "none"
            _say(f"running supervisors for {config_path}: {which}: pass --pid")
            return 2
        pid = pids[0]
    before = read_status(pid)
    if before is None:
        if not os.path.exists(f"/proc/{pid}"):
            _say(f"pid {pid} is not running")
        else:
            _say(f"pid {pid} holds no reload status: not a running sentin8-proxy supervisor (or not this user's)?")
        return 2
    mine = int(before.get("requested", 0)) + 1  # the first SIGHUP count that includes this signal
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        _say(f"pid {pid} is not running")
        return 2
    if not wait:
        return 0
    limit = timeout or 2 * drain_timeout_s + 60
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        status = read_status(pid)
        if status is None:
            _say(f"pid {pid} exited before the reload completed")
            return 1
        if int(status.get("completed", 0)) >= mine:
            result, reason = status.get("result", ""), status.get("reason", "")
            if result == "done":
                _say(f"reload {status['completed']} done")
                return 0
            _say(f"reload {status['completed']} {result}: {reason}")
            return 1
        time.sleep(0.05)
    _say(f"reload not complete after {limit:g} s: stalled")
    return 1
