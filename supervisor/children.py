"""The supervisor's children: what it knows of each one, and how one is forked.

A child is forked, never exec'd: it starts from the supervisor's memory (the config, the shared memory
mapping, the imported modules) and leaves only by ``os._exit``, so nothing of pytest's or the CLI's
``atexit`` runs in it and an exception is one traceback on stderr, never a second supervisor.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import setproctitle

from sentin8.eventlog import set_role

PR_SET_PDEATHSIG = 1


@dataclass
class Child:
    role: str  # "resolver" | "worker" | "mgmt"
    index: int
    pid: int
    slot: int = -1
    started: float = field(default_factory=time.monotonic)
    listening: bool = False
    retiring: bool = False  # told to drain because a replacement took over
    kill_at: float | None = None  # a retiree (or a replacement) still alive then is SIGKILLed
    rss: int = 0


def fork(
    role: str,
    title: str,
    target: Callable[[], int],
    *,
    signals: Iterable[signal.Signals],
    close_fds: Iterable[int],
    cpu: int | None = None,
    before: Callable[[], None] | None = None,
) -> int:
    """Fork a child that runs ``target`` and exits with its return value; returns the child's pid.

    In the child: the supervisor's ``signals`` go back to their defaults (SIGUSR1 ignored: it asks the
    supervisor for stats), ``close_fds`` are closed (the supervisor's pipes' other ends, its status memfd),
    the child dies with the supervisor even if that one is SIGKILLed, and ``before`` runs first (to drop
    what only some roles may keep)."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in signals:
            signal.signal(sig, signal.SIG_IGN if sig == signal.SIGUSR1 else signal.SIG_DFL)
        for fd in close_fds:
            if fd >= 0:
                os.close(fd)
        if before is not None:
            before()
        try:  # die with the supervisor even if it is SIGKILLed
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        setproctitle.setproctitle(title)
        set_role(role)
        code = target()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise AssertionError("unreachable")
